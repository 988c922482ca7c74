//! `cargo xtask bench --quick` runs end to end. Nothing about speed is asserted (timings stay
//! out of tests): only that every part ran and printed its table, that the kernel's counters
//! account for every call the knee generator issued (emitted + dropped = issued), and that
//! gpu-trace's default hook is of the cheapest class the kernel allows (a sys_exit program, not
//! the classic tracepoints, where raw_tp or tp_btf attach).
//!
//! Needs root (it loads BPF programs) and the gpu-trace binary that the workspace's `cargo test`
//! builds beside the xtask binary; without them it prints `SKIPPED: why`.

use std::{path::Path, process::Command};

/// Says loudly that the test could not run, past libtest's output capture (the workspace's one
/// way: gpu_trace_core::skip); `.ci/run` judges these lines.
fn skipped(why: impl std::fmt::Display) {
    gpu_trace_core::skip::skipped("bench_quick_runs_end_to_end", why);
}

#[test]
fn bench_quick_runs_end_to_end() {
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        skipped("needs root (loads BPF programs)");
        return;
    }
    let xtask = Path::new(env!("CARGO_BIN_EXE_xtask"));
    let gpu_trace = xtask.with_file_name("gpu-trace");
    if !gpu_trace.exists() {
        skipped(format_args!(
            "{} is not built (the workspace's `cargo test` builds it; or run `cargo build -p \
             gpu-trace` first)",
            gpu_trace.display()
        ));
        return;
    }
    let out = Command::new(xtask)
        .args(["bench", "--quick", "--gpu-trace"])
        .arg(&gpu_trace)
        .output()
        .expect("running xtask");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "xtask bench --quick failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for heading in [
        "## 1. Unrelated syscalls while tracing",
        "## 2. RM-shaped ioctls on a watched device",
        "## 3. The kernel programs",
        "## 4. Userspace: decode + model + output",
        "## 5. Sustained event rate",
        "## 6. The API layer: a library call under uprobes",
        "## 6b. The API layer: attaching and removing 200 probes",
    ] {
        assert!(
            stdout.contains(heading),
            "missing {heading:?} in:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("| getppid() | gpu-trace (default hook) |"),
        "gpu-trace was measured on getppid:\n{stdout}"
    );
    // The API part fails the run when gpu-trace api miscounts; here its table is there.
    assert!(
        stdout.contains("| gpu-trace api |") && stdout.contains("bare uprobe + uretprobe's hit"),
        "the API layer's cost against the bare uprobe pair:\n{stdout}"
    );
    assert!(
        !stdout.contains("MISMATCH"),
        "every issued call is counted as emitted or dropped:\n{stdout}"
    );
    assert!(
        stdout.contains("→ chosen by default: yes"),
        "gpu-trace picks a hook of the cheapest class the kernel allows:\n{stdout}"
    );
}
