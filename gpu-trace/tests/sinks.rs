//! Each sink's failure is told apart by its kind (issue 27: `sink::SinkError`, `RunError::Perfetto`),
//! not by the words of its message: a broken Perfetto timeline is reported as the timeline, with
//! its path, while the event lines so far and their statistics still come.

use std::{path::PathBuf, process::Command};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A timeline into /dev/full: the run fails (exit 1) naming the timeline and its path once,
/// and the text output still gets the event lines so far and the statistics.
#[test]
fn a_broken_timeline_is_reported_as_the_timeline_and_the_output_is_complete() {
    let input = fixture("two_streams.gtrace");
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args([
            "replay",
            input.to_str().unwrap(),
            "-v",
            "--perfetto",
            "/dev/full",
        ])
        .env("TZ", "UTC")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("Perfetto")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].ends_with(": writing the Perfetto timeline /dev/full: No space left on device"),
        "{stderr}"
    );
    // The run stops at the failure: the event lines so far are those of a run without the
    // timeline, then the statistics of what was traced.
    let plain = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["replay", input.to_str().unwrap(), "-v"])
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(plain.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (events, stats) = stdout
        .split_once("--- gpu-trace statistics")
        .expect("the statistics are printed");
    assert!(!events.is_empty() && !stats.is_empty());
    assert!(
        String::from_utf8(plain.stdout).unwrap().starts_with(events),
        "{stdout}"
    );
}
