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
    if tmux_missing(test) {
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
    let view = Session::start(&session, &cmd);
    let s = view.screen_until(|s| s.contains("gpu-trace top"));
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
    let s = view.screen_until(|s| row(s).is_some_and(|r| r.len() >= 9 && r[7] == N.to_string()));
    let r = row(&s).unwrap_or_else(|| panic!("{test}: no row for pid {me}:\n{s}"));
    // SCHEDULES and REFUSED: every one of the calls, every one refused.
    assert_eq!((r[7].as_str(), r[8].as_str()), ("25", "25"), "{test}:\n{s}");
    assert!(s.contains("sorted by SCHED/s"), "{s}");
    view.keys("s");
    let s = view.screen_until(|s| s.contains("sorted by LIVE"));
    assert!(s.contains("sorted by LIVE"), "{test}: s did not sort:\n{s}");

    view.keys("q");
    let exit = exit_status(&exit_file);
    assert_eq!(exit.trim(), "EXIT=0", "{test}: q did not end it cleanly");
    // The terminal is back: the normal screen shows the start-up report again, not the view.
    let s = tmux(&["capture-pane", "-p", "-t", &session]);
    assert!(
        s.contains("gpu-trace: tracing") && !s.contains("sorted by"),
        "{test}: the terminal was not given back:\n{s}"
    );
}

/// What the shell wrote to `exit_file` once the command ended (waits up to 20 s).
fn exit_status(exit_file: &std::path::Path) -> String {
    // The shell creates the file before it writes the line: wait for the whole line, not for
    // the file (an empty read here made a clean exit look like a failure under load).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(exit_file).unwrap_or_default();
        if text.ends_with('\n') || Instant::now() >= deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A tmux session that is killed when the test ends, however it ends.
struct Session(String);

impl Session {
    fn start(name: &str, cmd: &str) -> Self {
        tmux(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "200",
            "-y",
            "40",
            cmd,
        ]);
        Self(name.to_string())
    }

    fn keys(&self, keys: &str) {
        tmux(&["send-keys", "-t", &self.0, keys]);
    }

    fn screen_until(&self, ready: impl Fn(&str) -> bool) -> String {
        screen_until(&self.0, ready)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

fn tmux_missing(test: &str) -> bool {
    if Command::new("tmux").arg("-V").output().is_err() {
        common::skipped(test, "tmux is not installed (scripts/setup.sh installs it)");
        return true;
    }
    false
}

/// A real recording of the 2×H200 host: a NCCL all-reduce, one process per GPU.
fn allreduce() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/h200x2_gpu_ids/allreduce.gtrace")
}

/// The `SCHEDULE`s per pid of the recording, from its JSON replay.
fn schedules_per_pid(file: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    let out = Command::new(gpu_trace_bin())
        .args(["replay", file.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    let mut per_pid = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["event"] == "SCHEDULE" {
            *per_pid.entry(v["pid"].to_string()).or_default() += 1;
        }
    }
    per_pid
}

/// The SCHEDULES column of each process row: (pid, total).
fn schedule_totals(screen: &str) -> std::collections::BTreeMap<String, u64> {
    screen
        .lines()
        .skip_while(|l| !l.starts_with("PID "))
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // PID COMM CONTAINER LIVE(one word per engine) SCHED/s REFUSED/s UPD/s SCHEDULES
            // REFUSED GPU% TIMESLICE INIT→SCHED: the totals are the fifth and fourth from the
            // end.
            (f.len() >= 10).then(|| (f[0].to_string(), f[f.len() - 5].parse().unwrap()))
        })
        .collect()
}

#[test]
fn replay_top_steps_through_a_recording_second_by_second() {
    let test = "replay_top_steps_through_a_recording_second_by_second";
    if tmux_missing(test) {
        return;
    }
    let file = allreduce();
    let want = schedules_per_pid(&file);
    assert_eq!(want.len(), 2, "two ranks schedule: {want:?}");
    let exit_file = common::scratch().join("replay-top.exit");
    let _ = std::fs::remove_file(&exit_file);
    let s = Session::start(
        &format!("gt-rtop-{}", std::process::id()),
        &format!(
            "{} replay {} --top 2>&1; echo EXIT=$? > {}; sleep 60",
            gpu_trace_bin().display(),
            file.display(),
            exit_file.display()
        ),
    );
    // One frame per second of the recording: 1 s first, then a later second per `n` (a run of
    // seconds without records is one step); the totals never go down; after the last record
    // the view says so and keeps the final frame.
    let seconds_of = |screen: &str| -> Option<u64> {
        let line = screen.lines().find(|l| l.starts_with("gpu-trace top"))?;
        let (_, after) = line.split_once(" s, ")?.0.rsplit_once("— ")?;
        after.parse().ok()
    };
    let mut seen = 0;
    let mut steps = 0;
    let mut last = std::collections::BTreeMap::new();
    let end = loop {
        let screen = s.screen_until(|x| {
            seconds_of(x).is_some_and(|n| n > seen) || x.contains("end of the recording")
        });
        if screen.contains("end of the recording") {
            break screen;
        }
        let now_s = seconds_of(&screen).unwrap_or_else(|| panic!("{test}: no time:\n{screen}"));
        assert!(now_s > seen, "{test}: {now_s} s after {seen} s:\n{screen}");
        if seen == 0 {
            assert_eq!(now_s, 1, "{test}: the first frame is at 1 s:\n{screen}");
        }
        seen = now_s;
        let now = schedule_totals(&screen);
        for (pid, n) in &last {
            assert!(
                now.get(pid).is_some_and(|m| m >= n),
                "{test}: {pid} went down:\n{screen}"
            );
        }
        last = now;
        steps += 1;
        assert!(steps < 60, "{test}: no end after 60 steps");
        s.keys(if steps % 2 == 0 { "n" } else { "Space" });
    };
    // The final frame: each rank's schedules, as many as the JSON replay's events; both GPUs.
    assert_eq!(schedule_totals(&end), want, "{test}:\n{end}");
    assert!(
        end.contains("GPU-bc3cd54f") && end.contains("GPU-82a9b34a"),
        "{end}"
    );
    s.keys("s");
    let sorted = s.screen_until(|x| x.contains("sorted by LIVE"));
    assert!(
        sorted.contains("sorted by LIVE"),
        "{test}: s did not sort:\n{sorted}"
    );
    assert_eq!(
        schedule_totals(&sorted),
        want,
        "the sort changes the order only"
    );
    s.keys("q");
    let exit = exit_status(&exit_file);
    assert_eq!(exit.trim(), "EXIT=0", "{test}: q did not end it cleanly");
    let back = tmux(&["capture-pane", "-p", "-t", &s.0]);
    assert!(
        !back.contains("sorted by"),
        "{test}: the terminal was not given back:\n{back}"
    );
}

#[test]
fn replay_top_quit_midway_is_a_clean_end() {
    let test = "replay_top_quit_midway_is_a_clean_end";
    if tmux_missing(test) {
        return;
    }
    let exit_file = common::scratch().join("replay-top-quit.exit");
    let _ = std::fs::remove_file(&exit_file);
    let s = Session::start(
        &format!("gt-rtopq-{}", std::process::id()),
        &format!(
            "{} replay {} --top 2>&1; echo EXIT=$? > {}; sleep 60",
            gpu_trace_bin().display(),
            allreduce().display(),
            exit_file.display()
        ),
    );
    let first = s.screen_until(|x| x.contains("— 1 s,"));
    assert!(first.contains("n/space: next second"), "{test}:\n{first}");
    s.keys("q");
    let exit = exit_status(&exit_file);
    assert_eq!(exit.trim(), "EXIT=0", "{test}");
    // Stopping early is not a recording cut short.
    let back = tmux(&["capture-pane", "-p", "-t", &s.0]);
    assert!(!back.contains("without its trailer"), "{test}:\n{back}");
}

#[test]
fn the_views_without_a_terminal_are_a_usage_error_before_anything_starts() {
    let file = allreduce();
    let file = file.to_str().unwrap();
    for args in [
        vec!["replay", file, "--top"],
        vec!["top", "--duration", "1"],
    ] {
        let out = Command::new(gpu_trace_bin())
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("draws in a terminal"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// `top` shows each process's GPU share (issue 29): the test-only stand-in replays the committed
/// H100 capture; once it is in, the share over the last 5 s of samples (python over the jsonl,
/// samples with ts ≥ newest + 1 − 5 s: 25 points; Σ sm 531: 446, 532: 198, 568: 1612 →
/// 17.8 %, 7.9 %, 64.5 %) shows in the GPU% column of rows the capture's pids get even without
/// a traced call.
#[test]
fn top_shows_each_process_s_gpu_share() {
    let test = "top_shows_each_process_s_gpu_share";
    if skip_unless_root(test) || tmux_missing(test) {
        return;
    }
    let session = format!("gt-top-share-{}", std::process::id());
    let capture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/outputs/nvml-share-h100/share_fast/nvml.jsonl");
    let cmd = format!(
        "GPU_TRACE_TEST_SHARE_REPLAY={} {} top --watch-device {WATCHED} --share-interval 0.02 --duration 30; sleep 60",
        capture.display(),
        gpu_trace_bin().display(),
    );
    let view = Session::start(&session, &cmd);
    let share = |s: &str, pid: &str| -> Option<String> {
        let l = s
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pid))?;
        let f: Vec<&str> = l.split_whitespace().collect();
        Some(f.get(f.len().checked_sub(3)?)?.to_string())
    };
    let s = view.screen_until(|s| share(s, "568").as_deref() == Some("64.5"));
    for (pid, want) in [("531", "17.8"), ("532", "7.9"), ("568", "64.5")] {
        assert_eq!(
            share(&s, pid).as_deref(),
            Some(want),
            "{test}: pid {pid}:\n{s}"
        );
    }
    assert!(s.contains("GPU%"), "{s}");
    view.keys("q");
}
