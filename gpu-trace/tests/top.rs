//! `gpu-trace top` in a real terminal (tmux): the view shows what the test did, sorts on `s`,
//! and `q` ends it with exit 0 and the terminal given back. Needs root and tmux; without them it
//! prints `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use rel_support::*;

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("run tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The screen, polled until `ready` holds (at most 20 s).
fn screen_until(session: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = tmux(&["capture-pane", "-p", "-t", session]);
        if ready(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn top_shows_a_process_s_refused_schedules_sorts_and_quits_cleanly() {
    let test = "top_shows_a_process_s_refused_schedules_sorts_and_quits_cleanly";
    if skip_unless_root(test) {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        common::skipped(test, "tmux is not installed (scripts/setup.sh installs it)");
        return;
    }
    let session = format!("gt-top-{}", std::process::id());
    let exit_file = common::scratch().join("top.exit");
    let _ = std::fs::remove_file(&exit_file);
    let cmd = format!(
        "{} top --watch-device {WATCHED}; echo EXIT=$? > {}; sleep 60",
        gpu_trace_bin().display(),
        exit_file.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "200",
        "-y",
        "40",
        &cmd,
    ]);
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["kill-session", "-t", &self.0])
                .output();
        }
    }
    let _kill = Kill(session.clone());
    let s = screen_until(&session, |s| s.contains("gpu-trace top"));
    assert!(s.contains("gpu-trace top"), "{test}: no view:\n{s}");

    // 25 schedules on the watched device (refused: ENOTTY), from this process.
    const N: usize = 25;
    let dev = watched();
    let sched = Schedule::new(0xC1D0_7070, 0x5C00_7070);
    for _ in 0..N {
        assert_eq!(sched.issue(&dev), -ENOTTY);
    }
    let me = std::process::id().to_string();
    // The row of this process: PID, name, container, live, three rates, then the totals.
    let row = |s: &str| -> Option<Vec<String>> {
        s.lines()
            .find(|l| l.split_whitespace().next() == Some(me.as_str()))
            .map(|l| l.split_whitespace().map(str::to_string).collect())
    };
    let s = screen_until(&session, |s| {
        row(s).is_some_and(|r| r.len() >= 9 && r[7] == N.to_string())
    });
    let r = row(&s).unwrap_or_else(|| panic!("{test}: no row for pid {me}:\n{s}"));
    // SCHEDULES and REFUSED: every one of the calls, every one refused.
    assert_eq!((r[7].as_str(), r[8].as_str()), ("25", "25"), "{test}:\n{s}");
    assert!(s.contains("sorted by SCHED/s"), "{s}");
    tmux(&["send-keys", "-t", &session, "s"]);
    let s = screen_until(&session, |s| s.contains("sorted by LIVE"));
    assert!(s.contains("sorted by LIVE"), "{test}: s did not sort:\n{s}");

    tmux(&["send-keys", "-t", &session, "q"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !exit_file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let exit = std::fs::read_to_string(&exit_file).unwrap_or_default();
    assert_eq!(exit.trim(), "EXIT=0", "{test}: q did not end it cleanly");
    // The terminal is back: the normal screen shows the start-up report again, not the view.
    let s = tmux(&["capture-pane", "-p", "-t", &session]);
    assert!(
        s.contains("gpu-trace: tracing") && !s.contains("sorted by"),
        "{test}: the terminal was not given back:\n{s}"
    );
}
