//! Small things that cost trust (issue 30, item 7):
//!
//! - `--duration` is counted from attach: `-d 1` traces one second, not one second minus the
//!   start-up.
//! - The start-up inventory honours `--pid` and `--comm` in text (stderr) and in the JSON
//!   `INVENTORY` line, and `--quiet` (warnings only) leaves the text list out, command lines
//!   and all.
//! - A recording without its trailer (a SIGKILLed run) replays what it holds, says so on
//!   stderr, exits 4 (counts incomplete), and shows the kernel counters as unknown (`?` in
//!   text, `null` in JSON), never as `dropped 0`.
//! - JSON names a failed call's errno beside its number (`"errno":-25,"errno_name":"ENOTTY"`).
//! - `doctor` prints its verdict before the table, and both `doctor` and a trace start warn in
//!   one line when the driver is not loaded (checked against the file system here).
//!
//! Kernel tests need root; without it they print `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use rel_support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn duration_is_counted_from_attach() {
    let _serial = serial();
    let test = "duration_is_counted_from_attach";
    if skip_unless_root(test) {
        return;
    }
    let traced = Traced::start(&["--watch-device", WATCHED, "--format", "json", "-d", "1"])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let f = traced.wait(Duration::from_secs(30));
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let traced_s = json_stats(&f.stdout)["duration_s"].as_f64().unwrap();
    // The STATS duration is the time traced (from attach to the end of the drain).
    assert!(
        (1.0..1.5).contains(&traced_s),
        "-d 1 traced {traced_s} s: {}",
        f.stderr
    );
}

/// A bash holding the watched device open on fd 7 until its stdin closes; its command line
/// carries `secret` (as `$0`). Returns once it holds the device.
fn holder(secret: &str) -> Child {
    let script = format!("exec 7<{WATCHED}; echo ready; read a");
    let mut child = Command::new("bash")
        .args(["-c", &script, secret])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the holder opened {WATCHED}");
    child
}

/// Runs gpu-trace with `extra` for a moment and returns what it printed.
fn short_run(test: &str, extra: &[&str]) -> Finished {
    let mut args = vec!["--watch-device", WATCHED, "-d", "0.2"];
    args.extend_from_slice(extra);
    let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
    let f = traced.wait(Duration::from_secs(30));
    assert_eq!(f.status.code(), Some(0), "{test} {extra:?}: {}", f.stderr);
    f
}

/// The pids of the JSON `INVENTORY` line.
fn inventory_pids(stdout: &str) -> Vec<u64> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("{\"event\":\"INVENTORY\""))
        .unwrap_or_else(|| panic!("no INVENTORY line:\n{}", tail(stdout)));
    let inv: serde_json::Value = serde_json::from_str(line).unwrap();
    inv["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}

#[test]
fn the_inventory_honours_the_filters_and_quiet_hides_command_lines() {
    let _serial = serial();
    let test = "the_inventory_honours_the_filters_and_quiet_hides_command_lines";
    if skip_unless_root(test) {
        return;
    }
    let secret = "holder-secret-token-4711";
    let mut held = holder(secret);
    let pid = held.id();
    let listed = |f: &Finished| {
        f.stderr
            .lines()
            .any(|l| l.contains(&format!("PID {pid} bash")))
    };

    // Unfiltered: listed in both forms, with its command line.
    let f = short_run(test, &["--format", "json"]);
    assert!(listed(&f), "{}", f.stderr);
    assert!(f.stderr.contains(secret), "{}", f.stderr);
    assert!(inventory_pids(&f.stdout).contains(&(pid as u64)));

    // --comm naming another process: in neither form.
    let f = short_run(test, &["--format", "json", "--comm", "not-the-holder"]);
    assert!(!listed(&f), "--comm: {}", f.stderr);
    assert!(
        !inventory_pids(&f.stdout).contains(&(pid as u64)),
        "--comm: {}",
        f.stdout
    );
    // --comm naming it: listed.
    let f = short_run(test, &["--format", "json", "--comm", "bash"]);
    assert!(listed(&f), "--comm bash: {}", f.stderr);
    assert!(inventory_pids(&f.stdout).contains(&(pid as u64)));

    // --pid of another process (this test): in neither form.
    let me = std::process::id().to_string();
    let f = short_run(test, &["--format", "json", "--pid", &me]);
    assert!(!listed(&f), "--pid: {}", f.stderr);
    assert!(
        !inventory_pids(&f.stdout).contains(&(pid as u64)),
        "--pid: {}",
        f.stdout
    );

    // --quiet: warnings only, so not listed at all, nor its command line.
    let f = short_run(test, &["--quiet"]);
    assert!(!listed(&f), "--quiet: {}", f.stderr);
    assert!(!f.stderr.contains(secret), "--quiet: {}", f.stderr);

    drop(held.stdin.take());
    let _ = held.wait();
}

/// The fixture recording without its trailer, as a SIGKILLed run leaves it: the trailer is the
/// last frame, a u32 0 marker, its u32 length and that many bytes of JSON.
fn cut_recording() -> std::path::PathBuf {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/two_streams.gtrace"
    );
    let bytes = std::fs::read(fixture).unwrap();
    let cut = (0..bytes.len().saturating_sub(8))
        .rev()
        .find(|&i| {
            let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            word(i) == 0 && i + 8 + word(i + 4) as usize == bytes.len()
        })
        .expect("the fixture ends with its trailer");
    let path = common::scratch().join("cut.gtrace");
    std::fs::write(&path, &bytes[..cut]).unwrap();
    path
}

#[test]
fn a_recording_without_its_trailer_says_so_and_exits_4() {
    let rec = cut_recording();
    let replay = |format: &str| {
        let out = Command::new(gpu_trace_bin())
            .args(["replay", "--format", format])
            .arg(&rec)
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(4), "{format}: {stderr}");
        assert!(
            stderr.contains("ends without its trailer") && stderr.contains("unknown"),
            "{format}: {stderr}"
        );
        stdout
    };

    let text = replay("text");
    // What it holds is replayed.
    assert!(text.lines().any(|l| l.contains("TASK_INIT")), "{text}");
    let dropped: Vec<&str> = text.lines().filter(|l| l.starts_with("dropped ")).collect();
    assert_eq!(dropped.len(), 1, "{text}");
    let value = dropped[0].split_whitespace().nth(1);
    assert_eq!(value, Some("?"), "unknown, not 0: {}", dropped[0]);

    let json = replay("json");
    let stats = json_stats(&json);
    assert!(stats["kernel"].is_null(), "{stats}");
    assert!(stats["task_init"].as_u64().unwrap() > 0, "{stats}");
}

#[test]
fn json_names_the_errno_beside_its_number() {
    let _serial = serial();
    let test = "json_names_the_errno_beside_its_number";
    if skip_unless_root(test) {
        return;
    }
    let traced = Traced::start(&["--watch-device", WATCHED, "--format", "json"])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    // The watched device has no ioctls: the schedule fails with ENOTTY.
    let dev = watched();
    let s = Schedule::new(0x5EED_0030, 0x5EED_0E00);
    assert_eq!(s.issue(&dev), -ENOTTY);
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let me = std::process::id();
    let line = f
        .stdout
        .lines()
        .find(|l| l.starts_with("{\"event\":\"SCHEDULE\"") && l.contains(&format!("\"pid\":{me},")))
        .unwrap_or_else(|| panic!("no SCHEDULE of {me}:\n{}", tail(&f.stdout)));
    // The name right after the number, which stays as it was.
    assert!(
        line.contains(r#""errno":-25,"errno_name":"ENOTTY","#),
        "{line}"
    );
}

#[test]
fn doctor_verdict_first_and_a_missing_driver_is_warned_about() {
    let _serial = serial();
    let test = "doctor_verdict_first_and_a_missing_driver_is_warned_about";
    if skip_unless_root(test) {
        return;
    }
    // Ground truth from the file system, as docs/cli.md defines it.
    let exists = |p: &str| std::path::Path::new(p).exists();
    let nvidia = exists("/proc/driver/nvidia/version") || exists("/sys/module/nvidia");
    let kfd = exists("/dev/kfd");

    let out = Command::new(gpu_trace_bin())
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let at = |prefix: &str| text.lines().position(|l| l.starts_with(prefix));
    let table = at("VENDOR").unwrap_or_else(|| panic!("no table:\n{text}"));
    let verdict = at("tracing ").unwrap_or_else(|| panic!("no verdict:\n{text}"));
    assert!(verdict < table, "the verdict comes first:\n{text}");
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("WARNING: no GPU driver is loaded"))
        .collect();
    if nvidia || kfd {
        assert!(warnings.is_empty(), "a driver is loaded:\n{text}");
    } else {
        assert_eq!(warnings.len(), 1, "no driver here:\n{text}");
        assert!(at("WARNING").unwrap() < table, "{text}");
    }

    // A trace of NVIDIA warns in one line when its driver is not loaded.
    let f = short_run(test, &[]);
    let lines = f
        .stderr
        .lines()
        .filter(|l| l.contains("warning: the NVIDIA driver is not loaded"))
        .count();
    assert_eq!(lines, usize::from(!nvidia), "{}", f.stderr);
}
