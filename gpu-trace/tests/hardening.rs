//! Hardening (issue 11): what a hostile traced process or an unlucky operator can do.
//!
//! - Thread names with escape sequences, CR/LF, quotes, OSC and bytes that are not UTF-8 are
//!   escaped in text output (event lines and the per-process table, live and replay) and kept
//!   exactly in JSON (`comm_bytes`). The kernel test renames a real thread with
//!   `prctl(PR_SET_NAME)` and issues calls on the watched device.
//! - Inputs and outputs: an output that is the input or another output is refused (exit 2)
//!   before anything is attached or written.
//! - The command line: values that make no sense are usage errors (exit 2) before attaching.
//!
//! Kernel tests need root; without it they print `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use gpu_trace::{cli::Format, pipeline::Pipeline, wire::RawRecord};
use gpu_trace_common::{RecordHeader, nvidia::cmd, record_kind};
use rel_support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn tmp(name: &str) -> PathBuf {
    common::scratch().join(name)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Runs the built binary to completion.
fn run(args: &[&str]) -> std::process::Output {
    Command::new(gpu_trace_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run gpu-trace")
}

// ---------------------------------------------------------------------------------------------
// 1. Untrusted thread names.

/// Thread names a hostile process can set (each ≤ 15 bytes, as PR_SET_NAME keeps), and how the
/// text output must show them: written by hand from the escaping table of docs/reliability.md
/// (`\\`, `\n`, `\r`, `\t`, every other control byte or byte that is not UTF-8 as `\xNN`).
const HOSTILE: &[(&[u8], &str)] = &[
    (b"\x1b[31mEVIL", "\\x1b[31mEVIL"),
    (b"\rforged\nline", "\\rforged\\nline"),
    (b"q\"'\\", "q\"'\\\\"),
    (b"\x1b]0;pwn\x07", "\\x1b]0;pwn\\x07"),
    (b"a\xffb\xc3", "a\\xffb\\xc3"),
    (b"\xc2\x9b31m", "\\xc2\\x9b31m"),
];

/// No control character at all except the line feeds that end lines.
fn assert_inert(what: &str, out: &[u8]) {
    let text = std::str::from_utf8(out).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect();
    assert!(bad.is_empty(), "{what}: raw control characters {bad:?}");
}

fn hdr_bytes(ts: u64, pid: u32, tid: u32, comm: &[u8]) -> RecordHeader {
    let mut c = [0u8; 16];
    c[..comm.len()].copy_from_slice(comm);
    RecordHeader {
        kind: record_kind::NV_IOCTL,
        cpu: 0,
        ts_ns: ts,
        tgid: pid,
        tid,
        comm: c,
    }
}

/// A refused GPFIFO_SCHEDULE from each hostile name: one SCHEDULE event each.
fn hostile_records(pid: u32) -> Vec<RawRecord> {
    HOSTILE
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            RawRecord::NvIoctl(control_rec(
                hdr_bytes(1000 + i as u64, pid, pid + i as u32, name),
                0xC1D0_0001,
                0x5C00_0000 | i as u32,
                cmd::TSG_GPFIFO_SCHEDULE,
                0,
                &[1, 0, 0],
                -ENOTTY,
            ))
        })
        .collect()
}

fn pipeline_output(format: Format, records: &[RawRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut p = Pipeline::new(pipeline_config(format), &mut out);
    for r in records {
        p.feed(r.as_bytes()).unwrap();
    }
    p.finish(Default::default(), Duration::ZERO).unwrap();
    out
}

#[test]
fn hostile_names_are_escaped_in_text_lines_and_the_process_table() {
    let pid = 4321;
    let out = pipeline_output(Format::Text, &hostile_records(pid));
    assert_inert("text output", &out);
    let text = String::from_utf8(out).unwrap();
    for (i, (_, shown)) in HOSTILE.iter().enumerate() {
        let want = format!("PID={pid:<6} {shown:<16} TSG=0x5c00000{i}");
        assert!(
            text.lines()
                .any(|l| l.contains("SCHEDULE") && l.contains(&want)),
            "no SCHEDULE line with {want:?} in:\n{text}"
        );
    }
    // The table shows the process under its first name.
    let row = format!("{pid:<8} {:<16} ", HOSTILE[0].1);
    assert!(
        text.lines().any(|l| l.starts_with(&row)),
        "no table row {row:?} in:\n{text}"
    );
}

#[test]
fn json_keeps_the_exact_bytes_of_every_name() {
    let pid = 4321;
    let out = pipeline_output(Format::Json, &hostile_records(pid));
    assert_inert("JSON output", &out);
    let text = String::from_utf8(out).unwrap();
    let events = json_events(&text);
    assert_eq!(events.len(), HOSTILE.len());
    for (ev, (raw, _)) in events.iter().zip(HOSTILE) {
        let bytes: Vec<u8> = match std::str::from_utf8(raw) {
            Ok(s) => {
                assert_eq!(ev["comm"], *s, "valid UTF-8 is the string itself");
                assert!(ev.get("comm_bytes").is_none(), "{ev}");
                s.as_bytes().to_vec()
            }
            Err(_) => ev["comm_bytes"]
                .as_array()
                .unwrap_or_else(|| panic!("no comm_bytes in {ev}"))
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect(),
        };
        assert_eq!(bytes, *raw, "{ev}");
    }
    let stats = json_stats(&text);
    let row = json_process(&stats, pid).unwrap();
    assert_eq!(row["comm"], "\u{1b}[31mEVIL");
}

/// Child body: each thread renames itself to one hostile name and issues one schedule.
#[test]
#[ignore = "child process body for the hardening tests"]
fn hostile_names_child() {
    let dev = std::sync::Arc::new(watched());
    for (i, (name, _)) in HOSTILE.iter().enumerate() {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let c = std::ffi::CString::new(*name).unwrap();
            // SAFETY: PR_SET_NAME with a NUL-terminated string of at most 15 bytes.
            let rc =
                unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
            assert_eq!(rc, 0);
            let s = Schedule::new(0xC1D0_0001, 0x5C00_0000 | i as u32);
            assert_eq!(s.issue(&dev), -ENOTTY);
        })
        .join()
        .unwrap();
    }
}

#[test]
fn a_real_thread_with_a_hostile_name_cannot_reach_the_terminal() {
    let _serial = serial();
    let test = "a_real_thread_with_a_hostile_name_cannot_reach_the_terminal";
    if let Some(why) = cannot_trace() {
        skipped(test, why);
        return;
    }
    let rec = tmp("hostile.gtrace");
    let rec_s = rec.to_str().unwrap();
    let traced = Traced::start(&["--watch-device", WATCHED, "--record", rec_s])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let mut c = child("hostile_names_child").spawn().unwrap();
    let pid = c.id();
    assert!(c.wait().unwrap().success(), "child failed");
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let check_text = |what: &str, out: &[u8]| {
        assert_inert(what, out);
        let text = String::from_utf8_lossy(out);
        for (_, shown) in HOSTILE {
            let want = format!("PID={pid:<6} {shown:<16} ");
            assert!(
                text.lines()
                    .any(|l| l.contains("SCHEDULE") && l.contains(&want)),
                "{what}: no SCHEDULE line with {want:?} in:\n{}",
                tail(&text)
            );
        }
    };
    check_text("live text", f.stdout.as_bytes());
    let replay = run(&["replay", rec_s]);
    assert!(replay.status.success());
    check_text("replayed text", &replay.stdout);
    let replay = run(&[
        "replay",
        rec_s,
        "--format",
        "json",
        "--pid",
        &pid.to_string(),
    ]);
    assert_inert("replayed JSON", &replay.stdout);
    let events = json_events(&String::from_utf8(replay.stdout).unwrap());
    let mut names: Vec<Vec<u8>> = events
        .iter()
        .map(|e| match e.get("comm_bytes") {
            Some(b) => b
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect(),
            None => e["comm"].as_str().unwrap().as_bytes().to_vec(),
        })
        .collect();
    names.dedup();
    let want: Vec<Vec<u8>> = HOSTILE.iter().map(|(raw, _)| raw.to_vec()).collect();
    assert_eq!(names, want, "each thread's exact name, in order");
}

// ---------------------------------------------------------------------------------------------
// 2. Inputs never destroyed; outputs left valid.

fn copy_fixture(name: &str) -> PathBuf {
    let to = tmp(name);
    std::fs::copy(fixture(name), &to).unwrap();
    to
}

#[test]
fn an_output_that_is_the_input_or_another_output_is_refused_with_exit_2() {
    let input = copy_fixture("two_streams.gtrace");
    let original = std::fs::read(&input).unwrap();
    let i = input.to_str().unwrap();
    let hard = tmp("hard.gtrace");
    let _ = std::fs::remove_file(&hard);
    std::fs::hard_link(&input, &hard).unwrap();
    let dotted = format!("{}/./../{}/two_streams.gtrace", tmp("").display(), {
        tmp("").file_name().unwrap().to_str().unwrap().to_string()
    });
    let fresh = tmp("fresh.out");
    let _ = std::fs::remove_file(&fresh);
    let f = fresh.to_str().unwrap();
    for args in [
        vec!["replay", i, "-o", i],
        vec!["replay", i, "--perfetto", i],
        vec!["replay", i, "--perfetto", hard.to_str().unwrap()],
        vec!["replay", i, "-o", &dotted],
        vec!["replay", i, "-o", f, "--perfetto", f],
        // Live: refused before anything is loaded (so without root too).
        vec!["--record", f, "-o", f],
        vec!["--record", f, "--perfetto", f],
    ] {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("is the same file as"), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("hooks:"),
            "{args:?}: nothing attached: {stderr}"
        );
        assert_eq!(
            std::fs::read(&input).unwrap(),
            original,
            "{args:?}: input intact"
        );
        assert!(!fresh.exists(), "{args:?}: no output created");
    }
}

/// The text of a Perfetto file parses as one JSON document with a `traceEvents` array.
fn assert_valid_timeline(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
    v["traceEvents"].as_array().expect("traceEvents").len()
}

#[test]
fn a_failing_output_leaves_a_complete_timeline_and_the_statistics_on_stderr() {
    let input = fixture("two_streams.gtrace");
    let timeline = tmp("full.json");
    let out = run(&[
        "replay",
        input.to_str().unwrap(),
        "-o",
        "/dev/full",
        "--perfetto",
        timeline.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(
        stderr.contains("--- gpu-trace statistics"),
        "statistics on stderr: {stderr}"
    );
    assert!(assert_valid_timeline(&timeline) > 0);
}

#[test]
fn a_failing_timeline_keeps_the_old_file_and_the_output_gets_its_statistics() {
    let input = fixture("two_streams.gtrace");
    // A timeline into /dev/full: the output and its statistics still come, exit 1.
    let out = run(&["replay", input.to_str().unwrap(), "--perfetto", "/dev/full"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Perfetto"), "{stderr}");
    assert!(stdout.contains("--- gpu-trace statistics"), "{stdout}");
    // A complete replay over an existing timeline replaces it only at the end, whole.
    let timeline = tmp("replaced.json");
    std::fs::write(&timeline, b"old").unwrap();
    let out = run(&[
        "replay",
        input.to_str().unwrap(),
        "-o",
        "/dev/null",
        "--perfetto",
        timeline.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(assert_valid_timeline(&timeline) > 0);
    let leftovers: Vec<_> = std::fs::read_dir(timeline.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

// ---------------------------------------------------------------------------------------------
// 5. A reader that goes away (`| head -1`) is a quiet, successful end.

#[test]
fn a_closed_stdout_ends_replay_quietly_with_a_complete_timeline() {
    use std::io::BufRead as _;
    let input = fixture("two_streams.gtrace");
    let timeline = tmp("head.json");
    let mut child = Command::new(gpu_trace_bin())
        .args([
            "replay",
            input.to_str().unwrap(),
            "-v",
            "--perfetto",
            timeline.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is gone (dropped above), as after `| head -1`.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(first.contains("TASK_INIT"), "{first}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    assert!(assert_valid_timeline(&timeline) > 0);
}

// ---------------------------------------------------------------------------------------------
// 6. Command-line values: usage errors (exit 2) before anything is attached.

#[test]
fn senseless_values_are_usage_errors_before_attaching() {
    for args in [
        ["--duration=-1", ""],
        ["--duration", "nan"],
        ["--duration", "inf"],
        ["--duration", "1e30"],
        ["--duration", "0"],
        ["--pid", "0"],
        ["--deny-pid", "0"],
        ["--ring-size", "0"],
        ["--ring-size", "3"],
        ["--ring-size", "4097"],
    ] {
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let option = args[0].split('=').next().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(option),
            "{args:?} names the option: {stderr}"
        );
        assert!(!stderr.contains("hooks:"), "{args:?}: {stderr}");
    }
    let out = run(&["--pid", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a process id"));
    let out = run(&["replay", "x.gtrace", "--pid", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn replay_names_the_os_error_and_a_bad_trailer_as_a_trailer() {
    let dir = tmp("a-directory");
    let _ = std::fs::create_dir(&dir);
    let out = run(&["replay", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Is a directory"), "{stderr}");
    assert!(!stderr.contains("magic"), "{stderr}");

    // A recording whose trailer (after the u32 0 marker) is not JSON; built by hand.
    let mut bytes = std::fs::read(fixture("two_streams.gtrace")).unwrap();
    let hdr_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    bytes.truncate(16 + hdr_len);
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&5u32.to_le_bytes());
    bytes.extend_from_slice(b"{oops");
    let bad = tmp("bad-trailer.gtrace");
    std::fs::write(&bad, bytes).unwrap();
    let out = run(&["replay", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("trailer"), "{stderr}");
    assert!(!stderr.contains("header"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// 3 and 4. Storms stopped at random moments; stalled readers; FIFOs; early signals.

/// Child body: `REL_THREADS` threads issue `REL_CALLS` refused schedules each.
#[test]
#[ignore = "child process body for the hardening tests"]
fn schedule_storm_child() {
    let threads = env_num("REL_THREADS", 1);
    let calls = env_num("REL_CALLS", 1);
    let path = std::env::var("REL_DEV").unwrap_or_else(|_| WATCHED.into());
    let dev = std::sync::Arc::new(
        std::fs::File::options()
            .read(true)
            .write(true)
            .open(path)
            .expect("open the watched device"),
    );
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let s = Schedule::new(0xC1D0_0002, 0x5C00_0100 | t as u32);
                for _ in 0..calls {
                    assert_eq!(s.issue(&dev), -ENOTTY);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Exact kernel-wide counts need a device no other test watches or calls: `/dev/kmsg` (char
/// 1:11) has no ioctls either (-ENOTTY), and no other test uses it.
const EXACT_DEV: &str = "/dev/kmsg";

fn schedule_storm(procs: u64, threads: u64, calls: u64) -> Vec<std::process::Child> {
    schedule_storm_on(WATCHED, procs, threads, calls)
}

fn schedule_storm_on(dev: &str, procs: u64, threads: u64, calls: u64) -> Vec<std::process::Child> {
    (0..procs)
        .map(|_| {
            child("schedule_storm_child")
                .env("REL_DEV", dev)
                .env("REL_THREADS", threads.to_string())
                .env("REL_CALLS", calls.to_string())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn wait_children(children: Vec<std::process::Child>) {
    for mut c in children {
        assert!(c.wait().unwrap().success(), "storm child failed");
    }
}

#[test]
fn a_storm_stopped_at_random_moments_reads_exactly_what_the_kernel_sent() {
    let _serial = serial();
    let test = "a_storm_stopped_at_random_moments_reads_exactly_what_the_kernel_sent";
    if let Some(why) = cannot_trace() {
        skipped(test, why);
        return;
    }
    let runs = env_num("GPU_TRACE_STOP_RUNS", 8);
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut totals = (0u64, 0u64);
    for run_ix in 0..runs {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let rec = tmp(&format!("stop-{run_ix}.gtrace"));
        // Odd runs: a 4 KiB ring, so that records are dropped too.
        let ring = if run_ix % 2 == 1 { "4096" } else { "16777216" };
        let traced = Traced::start(&[
            "--watch-device",
            EXACT_DEV,
            "--ring-size",
            ring,
            "--record",
            rec.to_str().unwrap(),
            "-o",
            "/dev/null",
        ])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
        // Long enough (about a second) that most stops land while the storm still runs.
        let (procs, threads, calls) = (2u64, 2u64, 100_000u64);
        let mut children = schedule_storm_on(EXACT_DEV, procs, threads, calls);
        let stop_ms = seed % 800;
        std::thread::sleep(Duration::from_millis(stop_ms));
        // Whether the whole storm ran while attached (then every call is accounted for).
        let whole = children.iter_mut().all(|c| c.try_wait().unwrap().is_some());
        let f = traced.interrupt();
        wait_children(children);
        assert!(
            matches!(f.status.code(), Some(0 | 4)),
            "run {run_ix}: {:?} {}",
            f.status,
            f.stderr
        );
        // Kernel records only: not the ATTRIBUTION records userspace adds after each cgroup
        // record.
        let (records, trailer) = kernel_records_of(&rec);
        let trailer = trailer.expect("the run ended cleanly: a trailer");
        let k = trailer.kernel_counters;
        eprintln!(
            "{test}: run {run_ix} (ring {ring}, stop after {stop_ms} ms, whole storm: {whole}): \
             read {records}, kernel emitted {} dropped {}",
            k.emitted, k.dropped
        );
        assert_eq!(trailer.recording_lost, 0);
        assert_eq!(
            records, k.emitted,
            "run {run_ix}: every record the kernel counted as sent was read and recorded"
        );
        if whole {
            // Every call, each process's cgroup record (tried once, before its first record),
            // plus a close and an exit notice per process that had a record sent (with nothing
            // dropped: every process), was either sent or counted as dropped.
            let issued = procs * threads * calls;
            let sent_or_dropped = k.emitted + k.dropped;
            if k.dropped == 0 {
                assert_eq!(sent_or_dropped, issued + 3 * procs, "run {run_ix}");
            } else {
                assert!(
                    (issued + procs..=issued + 3 * procs).contains(&sent_or_dropped),
                    "run {run_ix}: {sent_or_dropped} for {issued} calls"
                );
            }
        }
        totals.0 += records;
        totals.1 += k.dropped;
    }
    eprintln!(
        "{test}: {runs} runs, {} records read, {} dropped",
        totals.0, totals.1
    );
}

/// Starts gpu-trace with stdout a pipe nobody reads; returns it with its stderr lines.
fn start_unread(
    args: &[&str],
) -> (
    std::process::Child,
    std::process::ChildStdout,
    std::sync::mpsc::Receiver<String>,
) {
    use std::io::BufRead as _;
    let mut child = Command::new(gpu_trace_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, stdout, rx)
}

/// The stderr lines still to come once the process exited: up to the end of its stderr (the
/// reading thread forwards the last lines after the exit; `try_iter` could miss them).
fn rest_of(rx: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(10)) {
        lines.push(line);
    }
    lines
}

/// Waits (at most `limit`: a hang detector, not a timing check) for the exit.
fn exit_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn lines_until(rx: &std::sync::mpsc::Receiver<String>, want: &str, limit: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + limit;
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            let done = line.contains(want);
            seen.push(line);
            if done {
                break;
            }
        }
    }
    seen
}

#[test]
fn a_stalled_reader_does_not_hold_off_sigint_or_the_duration() {
    let _serial = serial();
    let test = "a_stalled_reader_does_not_hold_off_sigint_or_the_duration";
    if let Some(why) = cannot_trace() {
        skipped(test, why);
        return;
    }
    for mode in ["sigint", "duration"] {
        let mut args = vec!["--watch-device", WATCHED, "-v"];
        if mode == "duration" {
            args.extend(["--duration", "4"]);
        }
        let (mut child, stdout, rx) = start_unread(&args);
        let seen = lines_until(&rx, "hooks:", Duration::from_secs(30));
        assert!(
            seen.iter().any(|l| l.contains("hooks:")),
            "{mode}: not attached: {seen:?}"
        );
        // ~4000 SCHEDULE lines, far more than a pipe holds (64 KiB): the reader stalls.
        wait_children(schedule_storm(2, 2, 2000));
        if mode == "sigint" {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        }
        let status = exit_within(&mut child, Duration::from_secs(60));
        let stderr = rest_of(&rx).join("\n");
        drop(stdout);
        let status = status.unwrap_or_else(|| panic!("{mode}: still running after 60 s: {stderr}"));
        assert_eq!(status.code(), Some(1), "{mode}: {stderr}");
        assert!(
            stderr.contains("reader stopped taking data"),
            "{mode}: {stderr}"
        );
        assert!(
            stderr.contains("--- gpu-trace statistics"),
            "{mode}: the statistics on stderr: {stderr}"
        );
    }
}

#[test]
fn a_fifo_nobody_reads_is_waited_for_only_until_the_duration_ends() {
    // Outputs are opened before anything is attached: no root needed.
    for option in ["-o", "--record", "--perfetto"] {
        let fifo = tmp(&format!("noreader-{}", option.trim_start_matches('-')));
        common::mkfifo(&fifo, 0o600);
        let (mut child, _stdout, rx) =
            start_unread(&[option, fifo.to_str().unwrap(), "--duration", "1"]);
        let status = exit_within(&mut child, Duration::from_secs(30));
        let stderr = rest_of(&rx).join("\n");
        let status = status.unwrap_or_else(|| panic!("{option} FIFO: hangs: {stderr}"));
        assert_eq!(status.code(), Some(1), "{option}: {stderr}");
        assert!(
            stderr.contains("waiting for a reader"),
            "{option}: {stderr}"
        );
        assert!(stderr.contains("nothing was traced"), "{option}: {stderr}");
        assert!(
            !stderr.contains("hooks:"),
            "{option}: nothing attached: {stderr}"
        );
    }
}

#[test]
fn a_sigint_during_start_up_is_not_lost() {
    let _serial = serial();
    let test = "a_sigint_during_start_up_is_not_lost";
    if let Some(why) = cannot_trace() {
        skipped(test, why);
        return;
    }
    let (mut child, mut stdout, rx) = start_unread(&["--watch-device", WATCHED]);
    // The handler is in place before anything is attached (/proc/PID/status: SigCgt holds
    // SIGINT before the start-up report).
    let caught = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (libc::SIGINT - 1)) != 0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !caught(child.id()) && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    let early: Vec<String> = rx.try_iter().collect();
    assert!(caught(child.id()), "no SIGINT handler within 10 s");
    assert!(
        !early.iter().any(|l| l.contains("hooks:")),
        "the SIGINT handler came only after attaching: {early:?}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = exit_within(&mut child, Duration::from_secs(60));
    let mut out = String::new();
    let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
    let stderr = rest_of(&rx).join("\n");
    let status = status.unwrap_or_else(|| panic!("a SIGINT during start-up was lost: {stderr}"));
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(out.contains("--- gpu-trace statistics"), "{out}\n{stderr}");
}

#[test]
fn replay_of_a_fifo_says_it_waits_for_a_writer_then_replays() {
    let fifo = tmp("replay-fifo");
    common::mkfifo(&fifo, 0o600);
    let (mut child, mut stdout, rx) = start_unread(&["replay", fifo.to_str().unwrap()]);
    let seen = lines_until(&rx, "waiting for a writer", Duration::from_secs(30));
    assert!(
        seen.iter().any(|l| l.contains("waiting for a writer")),
        "replay of a FIFO waits silently: {seen:?}"
    );
    let bytes = std::fs::read(fixture("two_streams.gtrace")).unwrap();
    let writer = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::write(fifo, bytes).unwrap()
    });
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
    writer.join().unwrap();
    let status = exit_within(&mut child, Duration::from_secs(30)).expect("replay ends");
    assert!(status.success());
    let want = run(&["replay", fixture("two_streams.gtrace").to_str().unwrap()]);
    assert_eq!(out, String::from_utf8(want.stdout).unwrap());
}

#[test]
fn a_closed_stdout_ends_a_live_run_quietly() {
    use std::io::BufRead as _;
    let _serial = serial();
    let test = "a_closed_stdout_ends_a_live_run_quietly";
    if let Some(why) = cannot_trace() {
        skipped(test, why);
        return;
    }
    let (mut child, stdout, rx) = start_unread(&["--watch-device", WATCHED, "-v"]);
    let seen = lines_until(&rx, "hooks:", Duration::from_secs(30));
    assert!(seen.iter().any(|l| l.contains("hooks:")), "{seen:?}");
    wait_children(schedule_storm(1, 1, 200));
    let mut first = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("SCHEDULE"), "{first}");
    // The reader is gone (as after `| head -1`); more events make the next write fail.
    wait_children(schedule_storm(1, 1, 200));
    let status = exit_within(&mut child, Duration::from_secs(60));
    let stderr = rest_of(&rx).join("\n");
    let status = status.unwrap_or_else(|| panic!("still running after its reader left: {stderr}"));
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}
