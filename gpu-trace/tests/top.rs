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

/// The two tests that make schedules from this process (one pid for every test of this file)
/// hold it while they run, so that neither counts the other's.
static SCHEDULES_FROM_THIS_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn top_shows_a_process_s_refused_schedules_sorts_and_quits_cleanly() {
    let test = "top_shows_a_process_s_refused_schedules_sorts_and_quits_cleanly";
    if skip_unless_root(test) {
        return;
    }
    if tmux_missing(test) {
        return;
    }
    let _serial = SCHEDULES_FROM_THIS_PROCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let session = format!("gt-top-{}", std::process::id());
    let exit_file = common::scratch().join("top.exit");
    let _ = std::fs::remove_file(&exit_file);
    // Only this process: the other tests of this file make schedules on the same device at
    // the same time, and 40 short jobs sorted above this row pushed it off the screen.
    let cmd = format!(
        "NO_COLOR=1 {} top --watch-device {WATCHED} --pid {}; echo EXIT=$? > {}; sleep 60",
        gpu_trace_bin().display(),
        std::process::id(),
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
    // NO_COLOR: its REFUSED/s (above 0 in the frame of its last call) is bold, not red.
    let escaped = tmux(&["capture-pane", "-e", "-p", "-t", &session]);
    let line = escaped
        .lines()
        .find(|l| l.contains(&format!("{me} ")))
        .unwrap_or_default();
    assert!(
        line.contains("\x1b[1m") && !line.contains("\x1b[38;5;1m"),
        "{test}: NO_COLOR:\n{line:?}"
    );
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
        Self::start_sized(name, cmd, 200, 40)
    }

    fn start_sized(name: &str, cmd: &str, columns: u16, lines: u16) -> Self {
        // Tests start sessions at the same time: one whose tmux server was starting may not
        // come up (an empty screen for the whole wait); it is started again.
        for _ in 0..5 {
            tmux(&[
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                &columns.to_string(),
                "-y",
                &lines.to_string(),
                cmd,
            ]);
            let up = Command::new("tmux")
                .args(["has-session", "-t", name])
                .status()
                .is_ok_and(|s| s.success());
            if up {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Self(name.to_string())
    }

    /// A key by tmux's name (`q`, `End`, `Escape`, ...).
    fn keys(&self, keys: &str) {
        tmux(&["send-keys", "-t", &self.0, keys]);
    }

    /// Text typed as it is.
    fn keys_literal(&self, text: &str) {
        tmux(&["send-keys", "-t", &self.0, "-l", text]);
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
            // Rows start with a pid (not the status line under the table).
            (f.len() >= 10 && f[0].parse::<u32>().is_ok())
                .then(|| (f[0].to_string(), f[f.len() - 5].parse().unwrap()))
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

/// A short job: names itself `gt-short`, makes 3 refused schedules on the watched device and
/// exits (a child of [`top_marks_exited_processes_scrolls_filters_and_expires_them`]); with
/// `TOP_JOB_MS`, 3 more every 100 ms for that long (the long job of docs/events.md's capture).
#[test]
#[ignore = "child process body for the top tests"]
fn top_short_job_child() {
    set_comm("gt-short");
    let dev = watched();
    let sched = Schedule::new(0xC1D0_7071, 0x5C00_7071);
    let until = Instant::now() + Duration::from_millis(env_num("TOP_JOB_MS", 0));
    loop {
        for _ in 0..3 {
            assert_eq!(sched.issue(&dev), -ENOTTY);
        }
        if Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The whitespace-separated fields of the row of `pid`.
fn row_of(screen: &str, pid: u32) -> Option<Vec<String>> {
    let pid = pid.to_string();
    screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pid.as_str()))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
}

/// Issue 30: after short jobs, `top` filled with dead pids, unmarked, with no way to see the
/// rest. Now: 40 short jobs (each gone before the next frame) in a 30-line terminal show as
/// exited (`x` in the S column), "+N more" says how many rows are below, End/Home scroll,
/// `/` filters (by comm and by pid), `?` shows the keys, and `--expire 3` drops the exited
/// rows after 3 s (counted as expired) while the live process (this test) stays; refusals are
/// red.
#[test]
fn top_marks_exited_processes_scrolls_filters_and_expires_them() {
    let test = "top_marks_exited_processes_scrolls_filters_and_expires_them";
    if skip_unless_root(test) || tmux_missing(test) {
        return;
    }
    let session = format!("gt-top-x-{}", std::process::id());
    let exit_file = common::scratch().join("top-x.exit");
    let _ = std::fs::remove_file(&exit_file);
    let cmd = format!(
        "{} top --watch-device {WATCHED} --comm gt-short --comm gt-top-alive --expire 3; echo EXIT=$? > {}; sleep 60",
        gpu_trace_bin().display(),
        exit_file.display()
    );
    let view = Session::start_sized(&session, &cmd, 100, 30);
    let s = view.screen_until(|s| s.contains("gpu-trace top"));
    assert!(s.contains("gpu-trace top"), "{test}: no view:\n{s}");
    // Only the jobs and this test's thread are traced (other tests' calls on the shared
    // device would add rows).
    let _serial = SCHEDULES_FROM_THIS_PROCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    set_comm("gt-top-alive");
    let me = std::process::id();
    let dev = watched();
    let sched = Schedule::new(0xC1D0_7072, 0x5C00_7072);
    assert_eq!(sched.issue(&dev), -ENOTTY);
    const JOBS: usize = 40;
    let mut jobs = Vec::new();
    for _ in 0..JOBS {
        let mut c = child("top_short_job_child").spawn().unwrap();
        jobs.push(c.id());
        assert!(c.wait().unwrap().success());
    }
    // All 41 rows: more than the table has room for.
    let s = view.screen_until(|s| s.contains("of 41") && s.contains(&format!("x exited: {JOBS}")));
    assert!(s.contains("rows 1-") && s.contains("of 41"), "{test}:\n{s}");
    assert!(s.contains("more (Down/PgDn)"), "{test}: no +N more:\n{s}");
    // A row whose REFUSED/s is above 0 (sorted first) is red. The jobs' second may be over by
    // the time a frame is captured (it was, once, under load): this process goes on refusing
    // while the view is looked at, until a refusing row is drawn red (a state, bounded).
    let red = |c: &str| {
        c.lines().any(|l| {
            (l.contains("gt-short") || l.contains("gt-top-alive")) && l.contains("\x1b[38;5;1m")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let coloured = loop {
        assert_eq!(sched.issue(&dev), -ENOTTY);
        let c = tmux(&["capture-pane", "-e", "-p", "-t", &session]);
        if red(&c) || Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(red(&coloured), "{test}: no red REFUSED/s:\n{coloured:?}");
    let shown: Vec<u32> = jobs
        .iter()
        .copied()
        .filter(|&p| row_of(&s, p).is_some())
        .collect();
    assert!(!shown.is_empty() && shown.len() < JOBS, "{test}:\n{s}");
    for &pid in &shown {
        let r = row_of(&s, pid).unwrap();
        assert_eq!(
            (r[1].as_str(), r[2].as_str()),
            ("x", "gt-short"),
            "{test}:\n{s}"
        );
    }
    // The end of the table, then its start again.
    view.keys("End");
    let s = view.screen_until(|s| s.contains("of 41") && !s.contains("more (Down/PgDn)"));
    assert!(
        s.contains("-41 of 41") && s.contains("above (Up/PgUp)"),
        "{test}: End:\n{s}"
    );
    view.keys("Home");
    let s = view.screen_until(|s| s.contains("rows 1-"));
    assert!(s.contains("more (Down/PgDn)"), "{test}: Home:\n{s}");
    // Filter by comm: the 40 jobs, not this process; by pid: this process, alive.
    view.keys("/");
    view.keys_literal("gt-short");
    view.keys("Enter");
    let s = view.screen_until(|s| s.contains("filter: gt-short (Esc clears)"));
    assert!(
        s.contains(&format!("of {JOBS}")),
        "{test}: comm filter:\n{s}"
    );
    assert!(row_of(&s, me).is_none(), "{test}:\n{s}");
    // The next key once the filter is gone from the screen (a key right behind Escape would
    // arrive as Alt+key).
    view.keys("Escape");
    view.screen_until(|s| !s.contains("filter: "));
    view.keys("/");
    view.keys_literal(&me.to_string());
    view.keys("Enter");
    let s = view.screen_until(|s| s.contains("rows 1-1 of 1") && row_of(s, me).is_some());
    let r = row_of(&s, me).unwrap_or_else(|| panic!("{test}: pid filter:\n{s}"));
    assert_eq!(
        r[1], "gt-top-alive",
        "{test}: the live process is not marked:\n{s}"
    );
    view.keys("Escape");
    view.screen_until(|s| !s.contains("filter: "));
    // The help, closed by any key.
    view.keys("?");
    // The whole overlay, not its first line: a capture can fall between two writes of a frame.
    let s = view.screen_until(|s| {
        s.contains("help (any key closes it)") && s.contains("PgUp/PgDn") && s.contains("S = x")
    });
    assert!(
        s.contains("PgUp/PgDn") && s.contains("S = x"),
        "{test}: help:\n{s}"
    );
    view.keys("j");
    let s = view.screen_until(|s| !s.contains("help (any key closes it)"));
    assert!(!s.contains("help (any key closes it)"), "{test}:\n{s}");
    // --expire 3: the jobs' rows go, counted; this process's stays.
    let s = view.screen_until(|s| s.contains(&format!("{JOBS} expired")));
    assert!(
        s.contains(&format!("{JOBS} expired")),
        "{test}: no expiry:\n{s}"
    );
    assert!(
        s.contains("rows 1-1 of 1") && row_of(&s, me).is_some(),
        "{test}:\n{s}"
    );
    view.keys("q");
    let exit = exit_status(&exit_file);
    assert_eq!(exit.trim(), "EXIT=0", "{test}: q did not end it cleanly");
}

/// Live tasks by engine, per pid.
type LiveByEngine = std::collections::BTreeMap<u64, std::collections::BTreeMap<String, i64>>;

/// From the JSON replay of `file`: the pids with a `process_exit`, and each pid's TASK_INITs
/// less its TASK_DESTROYs by engine.
fn exits_and_live(file: &std::path::Path) -> (std::collections::BTreeSet<u64>, LiveByEngine) {
    let out = Command::new(gpu_trace_bin())
        .args(["replay", file.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    let mut exited = std::collections::BTreeSet::new();
    let mut engine_of = std::collections::BTreeMap::new();
    let mut live = LiveByEngine::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let pid = v["pid"].as_u64().unwrap_or(0);
        match v["event"].as_str() {
            Some("TASK_INIT") => {
                let e = v["engine"].as_str().unwrap().to_string();
                engine_of.insert(v["key"].to_string(), e.clone());
                *live.entry(pid).or_default().entry(e).or_default() += 1;
            }
            Some("TASK_DESTROY") => {
                if v["cause"] == "process_exit" {
                    exited.insert(pid);
                }
                if let Some(e) = engine_of.get(&v["key"].to_string()) {
                    *live.entry(pid).or_default().entry(e.clone()).or_default() -= 1;
                }
            }
            _ => {}
        }
    }
    (exited, live)
}

/// Issue 30: an MPS client that exited still showed `LIVE ?:2` (its channels on the MPS
/// server's TSG: the server owns the TSG, so no TASK_DESTROY ends them). The H100 MPS
/// recording, stepped to its end at 80 columns: the pids the JSON replay shows exiting
/// (`TASK_DESTROY` with cause `process_exit`: the two clients) are marked `x` with LIVE 0; the
/// server keeps its TASK_INITs less its TASK_DESTROYs by engine (COPY 3, GRAPHICS 1, cut to
/// fit); every header whole.
#[test]
fn replay_top_shows_exited_mps_clients_without_live_tasks_at_80_columns() {
    let test = "replay_top_shows_exited_mps_clients_without_live_tasks_at_80_columns";
    if tmux_missing(test) {
        return;
    }
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/h100_late_mps/mps.gtrace");
    let (exited, live) = exits_and_live(&file);
    assert_eq!(exited.iter().copied().collect::<Vec<_>>(), [500, 501]);
    let server = live.get(&538).cloned().unwrap_or_default();
    let cut: Vec<String> = server
        .iter()
        .map(|(e, n)| format!("{}:{n}", &e[..3]))
        .collect();
    let exit_file = common::scratch().join("replay-top-mps.exit");
    let _ = std::fs::remove_file(&exit_file);
    let s = Session::start_sized(
        &format!("gt-rtopm-{}", std::process::id()),
        &format!(
            "{} replay {} --top 2>&1; echo EXIT=$? > {}; sleep 60",
            gpu_trace_bin().display(),
            file.display(),
            exit_file.display()
        ),
        80,
        30,
    );
    let mut end = String::new();
    for _ in 0..60 {
        end = s.screen_until(|x| x.contains("gpu-trace top"));
        if end.contains("end of the recording") {
            break;
        }
        s.keys("n");
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(end.contains("end of the recording"), "{test}:\n{end}");
    for pid in &exited {
        let r = row_of(&end, *pid as u32).unwrap_or_else(|| panic!("{test}: {pid}:\n{end}"));
        assert_eq!(
            (r[1].as_str(), r[3].as_str()),
            ("x", "0"),
            "{test}: {pid}:\n{end}"
        );
    }
    let r = row_of(&end, 538).unwrap_or_else(|| panic!("{test}: the server:\n{end}"));
    assert_eq!(r[2..2 + cut.len()], cut[..], "{test}: the server:\n{end}");
    let header = |first: &str| -> Vec<String> {
        end.lines()
            .find(|l| l.starts_with(first))
            .unwrap_or_else(|| panic!("{test}: no {first} header:\n{end}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        header("PID "),
        [
            "PID",
            "S",
            "COMM",
            "LIVE",
            "SCHED/s",
            "REFUSED/s",
            "SCHEDULES",
            "REFUSED",
            "GPU%"
        ],
        "{test}:\n{end}"
    );
    assert_eq!(
        header("GPU "),
        ["GPU", "UUID", "LIVE", "MAX_LIVE", "SHARE%"],
        "{test}:\n{end}"
    );
    // The view keys work in the replay too: the filter, and the sort.
    s.keys("/");
    s.keys_literal("501");
    s.keys("Enter");
    let f = s.screen_until(|x| x.contains("rows 1-1 of 1"));
    assert!(
        row_of(&f, 501).is_some() && row_of(&f, 500).is_none(),
        "{test}:\n{f}"
    );
    s.keys("s");
    let f = s.screen_until(|x| x.contains("s: SCHED/s [LIVE] PID"));
    assert!(f.contains("sorted by LIVE"), "{test}:\n{f}");
    s.keys("q");
    let exit = exit_status(&exit_file);
    assert_eq!(exit.trim(), "EXIT=0", "{test}: q did not end it cleanly");
}

/// `gpu-trace top` on a machine without the NVIDIA driver (issue 41 item 6) says so on the
/// screen, in its first frame (the capture that first shows the title shows the warning: both
/// are drawn at once), wrapped at 80 columns, not only on stderr after quitting; `q` still ends
/// it cleanly. Whether the driver is here is read from /proc and /sys, not from gpu-trace.
#[test]
fn top_without_the_driver_says_so_on_screen_in_its_first_frame() {
    let test = "top_without_the_driver_says_so_on_screen_in_its_first_frame";
    if skip_unless_root(test) || tmux_missing(test) {
        return;
    }
    let driver = ["/proc/driver/nvidia/version", "/sys/module/nvidia"];
    if driver.iter().any(|p| std::path::Path::new(p).exists()) {
        common::skipped(test, "the NVIDIA driver is loaded on this machine");
        return;
    }
    let exit_file = common::scratch().join("top-no-driver.exit");
    let _ = std::fs::remove_file(&exit_file);
    let s = Session::start_sized(
        &format!("gt-topnd-{}", std::process::id()),
        &format!(
            "NO_COLOR=1 {} top --vendor nvidia; echo EXIT=$? > {}; sleep 60",
            gpu_trace_bin().display(),
            exit_file.display()
        ),
        80,
        24,
    );
    let screen = s.screen_until(|x| x.contains("gpu-trace top"));
    // The lines between the key line and the GPUs table, joined: the warning, wrapped.
    let notice: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.starts_with("q: quit"))
        .skip(1)
        .take_while(|l| !l.starts_with("GPUs"))
        .map(str::trim)
        .collect();
    let notice = notice.join(" ");
    assert!(
        notice.starts_with("warning: the NVIDIA driver is not loaded")
            && notice.contains("sudo modprobe nvidia"),
        "{test}:\n{screen}"
    );
    s.keys("q");
    assert_eq!(exit_status(&exit_file).trim(), "EXIT=0", "{test}");
}
