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
    let dir = std::env::temp_dir().join(format!("gpu-trace-hardening-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[allow(dead_code)] // used by later sections
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
    std::thread::sleep(Duration::from_millis(300));
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
