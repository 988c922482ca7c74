//! NVML with a deadline (issue 36, item 6): a `libnvidia-ml.so.1` that never answers, or
//! answers nonsense, costs one line on stderr and never the start, the signals or the exit.
//!
//! Stand-in libraries are built here with the system C compiler (`cc`) into a scratch
//! directory and found through `LD_LIBRARY_PATH` (gpu-trace opens the library by name):
//!
//! - `init`: `nvmlInit_v2` never returns (`pause()` in a loop);
//! - `count`: `nvmlDeviceGetCount_v2` reports 2^31 GPUs;
//! - `sample`: one GPU, whose `nvmlDeviceGetProcessUtilization` never returns.
//!
//! The real binary traces `/dev/full` (no GPU or driver needed). The time bounds asserted are
//! liveness bounds (the run ends at all), not measurements of the feature; the figures
//! measured are printed. Without root or without `cc` the tests print `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use rel_support::{Finished, Traced, WATCHED, gpu_trace_bin, skip_unless_root, tail};

static SERIAL: Mutex<()> = Mutex::new(());

/// How long a stopped run may take to end before the test calls it stuck (and kills it).
const LIVENESS: Duration = Duration::from_secs(10);

const COMMON: &str = r#"
#include <unistd.h>
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev) {
    *dev = (void *)(unsigned long)(i + 1);
    return 0;
}
"#;

const INIT_NEVER_RETURNS: &str = r#"
int nvmlInit_v2(void) { for (;;) pause(); return 0; }
"#;

const COUNT_ABSURD: &str = r#"
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1u << 31; return 0; }
"#;

const SAMPLE_NEVER_RETURNS: &str = r#"
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetProcessUtilization(void *dev, void *samples, unsigned int *count,
                                    unsigned long long last_seen) {
    for (;;) pause();
    return 0;
}
"#;

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds the stand-in `body` as `<scratch>/<name>/libnvidia-ml.so.1`; returns its directory,
/// or `None` (said as SKIPPED) where there is no C compiler.
fn stand_in(test: &str, name: &str, body: &str) -> Option<PathBuf> {
    let dir = common::scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("nvml.c");
    std::fs::write(&src, format!("{COMMON}{body}")).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libnvidia-ml.so.1"))
        .arg(&src)
        .output();
    match built {
        Ok(out) if out.status.success() => Some(dir),
        Ok(out) => panic!(
            "cc failed on the stand-in: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            common::skipped(test, format!("no C compiler to build the stand-in ({e})"));
            None
        }
    }
}

/// The test's preconditions: root (BPF) and the stand-in built.
fn prepare(test: &str, name: &str, body: &str) -> Option<PathBuf> {
    if skip_unless_root(test) {
        return None;
    }
    stand_in(test, name, body)
}

fn command(lib_dir: &Path) -> Command {
    let mut cmd = Command::new(gpu_trace_bin());
    cmd.env("LD_LIBRARY_PATH", lib_dir)
        .env_remove("GPU_TRACE_TEST_SHARE_REPLAY");
    cmd
}

/// Starts gpu-trace on the stand-in and waits until it has attached ("hooks:" on stderr).
fn started(lib_dir: &Path, extra: &[&str]) -> (Traced, Duration) {
    let mut args = vec!["--watch-device", WATCHED, "--format", "json"];
    args.extend_from_slice(extra);
    let begun = Instant::now();
    let traced = Traced::start_with(command(lib_dir), &args)
        .unwrap_or_else(|why| panic!("gpu-trace did not start: {why}"));
    (traced, begun.elapsed())
}

/// Exit 0 (a clean stop), the last line `STATS`, and exactly one stderr line containing `said`.
fn assert_clean_with_one_line(test: &str, f: &Finished, said: &str) {
    assert_eq!(f.status.code(), Some(0), "{test}: {}", tail(&f.stderr));
    let lines: Vec<&str> = f.stderr.lines().filter(|l| l.contains(said)).collect();
    assert_eq!(lines.len(), 1, "{test}: {said:?} once in:\n{}", f.stderr);
    assert!(lines[0].starts_with("gpu-trace: "), "{}", lines[0]);
    let last = f.stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("{\"event\":\"STATS\""), "{test}: {last}");
}

const INIT_LINE: &str = "gpu-trace: NVML (libnvidia-ml.so.1) did not answer nvmlInit_v2 \
                         within 2 s: GPU shares and UUIDs are not sampled this run";

#[test]
fn init_that_never_returns_costs_a_line_and_sigint_still_stops() {
    let test = "init_that_never_returns_costs_a_line_and_sigint_still_stops";
    let _serial = serial();
    let Some(lib) = prepare(test, "init", INIT_NEVER_RETURNS) else {
        return;
    };
    let (traced, start) = started(&lib, &[]);
    let asked = Instant::now();
    traced.signal(libc::SIGINT);
    let f = traced.wait(LIVENESS);
    let took = asked.elapsed();
    eprintln!("{test}: attached after {start:?}; exited {took:?} after SIGINT");
    assert!(took < LIVENESS, "{test}: {took:?}");
    assert_clean_with_one_line(test, &f, INIT_LINE);
    // The one line: no second one from the share sampler.
    assert!(!f.stderr.contains("GPU share not sampled"), "{}", f.stderr);
}

#[test]
fn init_that_never_returns_does_not_hold_duration_or_no_share() {
    let test = "init_that_never_returns_does_not_hold_duration_or_no_share";
    let _serial = serial();
    let Some(lib) = prepare(test, "init", INIT_NEVER_RETURNS) else {
        return;
    };
    // With --no-share too: the inventory still asks NVML, and the wait is said.
    for extra in [&["--duration", "2"][..], &["--duration", "2", "--no-share"]] {
        let begun = Instant::now();
        let (traced, start) = started(&lib, extra);
        // Killed (no exit status code) past the bound.
        let f = traced.wait(Duration::from_secs(2) + LIVENESS);
        let took = begun.elapsed();
        eprintln!("{test}: {extra:?}: attached after {start:?}, ended after {took:?}");
        assert_clean_with_one_line(test, &f, INIT_LINE);
    }
}

#[test]
fn an_absurd_device_count_is_a_broken_library_not_2_31_calls() {
    let test = "an_absurd_device_count_is_a_broken_library_not_2_31_calls";
    let _serial = serial();
    let Some(lib) = prepare(test, "count", COUNT_ABSURD) else {
        return;
    };
    let (traced, start) = started(&lib, &[]);
    let asked = Instant::now();
    traced.signal(libc::SIGTERM);
    let f = traced.wait(LIVENESS);
    let took = asked.elapsed();
    eprintln!("{test}: attached after {start:?}; exited {took:?} after SIGTERM");
    assert!(took < LIVENESS, "{test}: {took:?}");
    assert_clean_with_one_line(
        test,
        &f,
        "gpu-trace: NVML (libnvidia-ml.so.1) reports 2147483648 GPUs, more than 64: a broken \
         library: GPU shares and UUIDs are not sampled this run",
    );
    assert!(!f.stderr.contains("GPU share not sampled"), "{}", f.stderr);
}

#[test]
fn a_sample_that_never_returns_stops_sampling_not_the_run() {
    let test = "a_sample_that_never_returns_stops_sampling_not_the_run";
    let _serial = serial();
    let Some(lib) = prepare(test, "sample", SAMPLE_NEVER_RETURNS) else {
        return;
    };
    let begun = Instant::now();
    let (traced, start) = started(&lib, &["--duration", "4", "--share-interval", "0.1"]);
    let f = traced.wait(Duration::from_secs(4) + LIVENESS);
    eprintln!(
        "{test}: attached after {start:?}, ended after {:?}",
        begun.elapsed()
    );
    assert_clean_with_one_line(
        test,
        &f,
        "gpu-trace: GPU share sampling stopped: NVML (libnvidia-ml.so.1) did not answer a \
         sample within 2 s; tracing goes on",
    );
    assert!(!f.stderr.contains("within 2 s: GPU shares"), "{}", f.stderr);
}
