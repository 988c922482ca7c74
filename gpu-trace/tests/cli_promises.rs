//! Promises of docs/cli.md that no other test held the binary to:
//! - `--pid` excludes every other process: in the kernel (exactly one `--pid`: the other
//!   process's calls are never even counted) and in userspace (two `--pid`s: the kernel sends
//!   everything, the pipeline drops the rest); through the library and through the binary, with
//!   two (three) real processes calling on the same watched device;
//! - `--vendor auto` picks the driver that is present, or stops with exit 3 when none is;
//! - the exit codes 1 (runtime error), 2 (bad usage), 3 (`--deny-pid` where the BPF LSM cannot
//!   run); exit 4 (records dropped, live and in the replay of that run's recording) is checked
//!   by `tests/stress.rs` (`cli_reports_drops_in_json_and_exits_4_and_keeps_up_after_the_storm`).
//!
//! The calls go to `/dev/full` (see `rel_support`): refused `GPFIFO_SCHEDULE`s, each still a
//! SCHEDULE event. Tests that load programs need root; without it they print `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    io::Write as _,
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard},
};

use gpu_trace::{
    loader::{LoadError, LoadOptions, Tracer},
    wire::{self, RawRecord},
};
use rel_support::*;
use serde_json::Value;

/// One tracer at a time in this binary.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The client handle of every call of the filter children (to tell them from other tests').
const CLIENT: u32 = 0xF17E_0001;

/// Child body: waits for a line on stdin, then issues `REL_CALLS` refused schedules of TSG
/// `REL_OBJECT` (client [`CLIENT`]) on the watched device.
#[test]
#[ignore = "child process body for the --pid tests"]
fn filter_child() {
    let calls = env_num("REL_CALLS", 1);
    let object = env_num("REL_OBJECT", 0) as u32;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let dev = watched();
    let s = Schedule::new(CLIENT, object);
    for _ in 0..calls {
        assert_eq!(s.issue(&dev), -ENOTTY);
    }
}

/// A filter child, started and waiting for [`release`].
fn waiting_child(object: u32, calls: u64) -> Child {
    child("filter_child")
        .env("REL_CALLS", calls.to_string())
        .env("REL_OBJECT", object.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawning a child")
}

/// Lets the children issue their calls, and waits for them to finish.
fn release(children: Vec<Child>) {
    let mut children = children;
    for c in &mut children {
        c.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child failed");
    }
}

/// SCHEDULE events of `pid` in a JSON run's output.
fn schedules_of(events: &[Value], pid: u32) -> usize {
    events
        .iter()
        .filter(|e| e["event"] == "SCHEDULE" && e["pid"] == pid)
        .count()
}

// ---------------------------------------------------------------------------------------------
// --pid

#[test]
fn kernel_pid_filter_sends_and_counts_only_that_process() {
    let _serial = serial();
    let test = "kernel_pid_filter_sends_and_counts_only_that_process";
    let (a, b) = (waiting_child(0xF17E_00A0, 5), waiting_child(0xF17E_00B0, 7));
    let (pa, pb) = (a.id(), b.id());
    let options = LoadOptions {
        extra_device: Some(watched_dev()),
        filter_tgid: Some(pa),
        ..Default::default()
    };
    let mut tracer = match Tracer::load(&options) {
        Ok(t) => t,
        Err(e @ (LoadError::System(_) | LoadError::NoHook { .. })) => {
            skipped(test, e);
            release(vec![a, b]);
            return;
        }
        Err(e) => panic!("{test}: loading failed: {e}"),
    };
    let mut ring = tracer.take_ring_buffer().unwrap();
    let before = tracer.counters().unwrap();
    release(vec![a, b]);
    let items = drain_until(&mut ring, |items| {
        items
            .iter()
            .filter(|b| matches!(wire::parse_record(b), Ok(RawRecord::NvIoctl(_))))
            .count()
            >= 5
    });
    let after = tracer.counters().unwrap();
    let tgids: Vec<u32> = items
        .iter()
        .filter_map(|b| match wire::parse_record(b).unwrap() {
            RawRecord::NvIoctl(n) => Some(n.hdr.tgid),
            _ => None,
        })
        .collect();
    // Every ioctl record of this tracer is A's: the kernel dropped B's (and any other
    // process's) calls before reading them.
    assert_eq!(tgids, vec![pa; 5], "A is {pa}, B is {pb}");
    // Every record kind counts in `emitted`: A's cgroup record (sent before its first record),
    // its 5 ioctls, its close() of the watched device (A is a tracked NVIDIA user by then) and
    // its exit notice; nothing of B's.
    assert_eq!(after.emitted - before.emitted, 8, "{before:?} → {after:?}");
    assert_eq!(
        after.ignored, before.ignored,
        "B's calls are not even counted"
    );
    assert_eq!(after.dropped, before.dropped);
}

#[test]
fn pid_filters_of_the_binary_exclude_the_other_process() {
    let _serial = serial();
    let test = "pid_filters_of_the_binary_exclude_the_other_process";
    if skip_unless_root(test) {
        return;
    }
    // Exactly one --pid: the kernel filters. Then two: only the userspace filter, with a third
    // process C that is selected too.
    for two in [false, true] {
        let a = waiting_child(0xF17E_00A0, 5);
        let b = waiting_child(0xF17E_00B0, 7);
        let c = waiting_child(0xF17E_00C0, 3);
        let (pa, pb, pc) = (a.id(), b.id(), c.id());
        let (spa, spc) = (pa.to_string(), pc.to_string());
        let mut args = vec!["--watch-device", WATCHED, "--format", "json", "--pid", &spa];
        if two {
            args.extend(["--pid", &spc]);
        }
        let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
        release(vec![a, b, c]);
        let f = traced.interrupt();
        assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
        let events = json_events(&f.stdout);
        let stats = json_stats(&f.stdout);
        let want_c = if two { 3 } else { 0 };
        assert_eq!(
            (
                schedules_of(&events, pa),
                schedules_of(&events, pb),
                schedules_of(&events, pc)
            ),
            (5, 0, want_c),
            "two --pid: {two}; A {pa}, B {pb}, C {pc}"
        );
        assert!(json_process(&stats, pb).is_none(), "no row for B");
        assert_eq!(stats["schedule"], 5 + want_c as u64, "{stats}");
        let emitted = stats["kernel"]["emitted"].as_u64().unwrap();
        if two {
            // The kernel sent B's calls too (and any other process's on /dev/full).
            assert!(emitted >= 5 + 7 + 3, "{}", stats["kernel"]);
        } else {
            // A's cgroup record, its 5 calls, its close() of the device and its exit notice.
            assert_eq!(
                emitted, 8,
                "only A's records left the kernel: {}",
                stats["kernel"]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// --bpf-stats

/// `gpu-trace: program NAME: N runs, M ns/run` lines of a run's stderr: name → runs.
fn program_runs(stderr: &str) -> std::collections::BTreeMap<String, u64> {
    stderr
        .lines()
        .filter_map(|l| {
            let (name, tail) = l.strip_prefix("gpu-trace: program ")?.split_once(": ")?;
            let (runs, per_run) = tail.split_once(" runs, ")?;
            per_run.strip_suffix(" ns/run")?.parse::<u64>().ok()?;
            Some((name.to_string(), runs.parse().ok()?))
        })
        .collect()
}

/// `--bpf-stats` prints the kernel's run count of each loaded program, on each syscall-layer
/// path this kernel attaches. Here (`--watch-device`: the syscall layer serves) the default path
/// (`sys_exit_*`: tp_btf or raw_tp, one program for every syscall exit) must have run at least
/// once for each of this test's unrelated system calls and refused schedules; the classic
/// tracepoint path (`--syscall-hook tracepoint`) must have run its entry program
/// (`tp_ioctl_enter`, `syscalls:sys_enter_ioctl`) and its exit program (`tp_ioctl_exit`) for each
/// refused schedule and, being per-syscall, far fewer times than the unrelated calls. The
/// drivers' entry-point programs, not loaded here (no NVIDIA module on this machine: the lab's
/// stand-in serves them, docs/lab.md `z.nv_entry`, which checks that no program runs for
/// unrelated calls), are not listed.
#[test]
fn bpf_stats_counts_every_run_of_the_syscall_layer() {
    let _serial = serial();
    let test = "bpf_stats_counts_every_run_of_the_syscall_layer";
    if skip_unless_root(test) {
        return;
    }
    const UNRELATED: u64 = 20_000;
    const SCHEDULES: u64 = 5;
    let run = |extra: &[&str]| {
        let mut args = vec!["--watch-device", WATCHED, "--format", "json", "--bpf-stats"];
        args.extend_from_slice(extra);
        let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test} {extra:?}: {e}"));
        for _ in 0..UNRELATED {
            // SAFETY: a system call without arguments.
            unsafe { libc::syscall(libc::SYS_getppid) };
        }
        let dev = watched();
        let s = Schedule::new(CLIENT, 0xF17E_00D0);
        for _ in 0..SCHEDULES {
            assert_eq!(s.issue(&dev), -ENOTTY);
        }
        let f = traced.interrupt();
        assert_eq!(f.status.code(), Some(0), "{extra:?}: {}", f.stderr);
        assert!(
            !program_runs(&f.stderr)
                .keys()
                .any(|k| k.starts_with("nv_ioctl") || k.starts_with("nv_close")),
            "entry points listed though --watch-device leaves them out: {}",
            f.stderr
        );
        assert!(
            f.stderr
                .contains("(not used: NVIDIA driver entry points: --watch-device"),
            "{}",
            f.stderr
        );
        assert_eq!(
            schedules_of(&json_events(&f.stdout), std::process::id()) as u64,
            SCHEDULES,
            "the trace itself is unchanged ({extra:?})"
        );
        f
    };

    // The default path: one program for every syscall exit.
    let f = run(&[]);
    let runs = program_runs(&f.stderr);
    let (name, n) = runs
        .iter()
        .find(|(name, _)| name.starts_with("sys_exit_"))
        .unwrap_or_else(|| panic!("no sys_exit_* program among {runs:?}:\n{}", f.stderr));
    assert!(
        *n >= UNRELATED + SCHEDULES,
        "{name} ran {n} times: {runs:?}"
    );

    // The classic tracepoints: entry and exit of ioctl only.
    let tracefs = gpu_trace::probe::system::ensure_tracefs();
    if !tracefs.as_ref().is_ok_and(|dir| {
        std::path::Path::new(dir)
            .join("events/syscalls/sys_enter_ioctl")
            .is_dir()
    }) {
        skipped(
            &format!("{test} (tracepoint path)"),
            format!(
                "no syscalls:sys_enter_ioctl tracepoint here (tracefs: {tracefs:?}; a kernel \
                 without CONFIG_FTRACE_SYSCALLS)"
            ),
        );
        return;
    }
    let f = run(&["--syscall-hook", "tracepoint"]);
    let runs = program_runs(&f.stderr);
    for program in ["tp_ioctl_enter", "tp_ioctl_exit"] {
        let n = *runs
            .get(program)
            .unwrap_or_else(|| panic!("{program} not listed: {runs:?}:\n{}", f.stderr));
        assert!(
            (SCHEDULES..UNRELATED).contains(&n),
            "{program} ran {n} times: want one run per ioctl of the machine, at least the \
             {SCHEDULES} refused schedules, and none for the {UNRELATED} getppid calls: {runs:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// --vendor auto

#[test]
fn vendor_auto_picks_the_driver_present_or_exits_3() {
    let _serial = serial();
    let test = "vendor_auto_picks_the_driver_present_or_exits_3";
    if skip_unless_root(test) {
        return;
    }
    // What is present, from the file system (docs/cli.md: the nvidia module or /dev/nvidiactl
    // means NVIDIA, else /dev/kfd means AMD).
    let exists = |p: &str| std::path::Path::new(p).exists();
    let nvidia = exists("/sys/module/nvidia") || exists("/dev/nvidiactl");
    let amd = exists("/dev/kfd");
    let out = Command::new(gpu_trace_bin())
        .args(["--vendor", "auto", "--duration", "0.3"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match (nvidia, amd) {
        (true, _) => {
            assert!(stderr.contains("tracing NVIDIA RM calls"), "{stderr}");
            assert!(out.status.code() == Some(0), "{}: {stderr}", out.status);
        }
        (false, true) => {
            assert!(stderr.contains("tracing AMD KFD"), "{stderr}");
            assert!(out.status.code() == Some(0), "{}: {stderr}", out.status);
        }
        (false, false) => {
            assert_eq!(out.status.code(), Some(3), "{stderr}");
            assert!(
                stderr.contains("--vendor auto found no GPU driver") && !stderr.contains("tracing"),
                "says why, and traces nothing: {stderr}"
            );
        }
    }
}

/// `--vendor amd` where amdgpu registered no KFD device number: no KFD call could be seen, so
/// it stops with exit 3 and says how to fix it, instead of tracing nothing; a stand-in device
/// (`--watch-device`) still runs.
#[test]
fn vendor_amd_without_kfd_exits_3_unless_a_device_stands_in() {
    let _serial = serial();
    let test = "vendor_amd_without_kfd_exits_3_unless_a_device_stands_in";
    if skip_unless_root(test) {
        return;
    }
    // Read here, not through gpu-trace: a "kfd" line in /proc/devices.
    let kfd_registered = std::fs::read_to_string("/proc/devices")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("kfd"));
    if kfd_registered {
        common::skipped(
            test,
            "amdgpu registered KFD here: the refusal cannot be seen",
        );
        return;
    }
    let (code, stderr) = run(&["--vendor", "amd", "--duration", "0.3"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("AMD KFD is not loaded") && stderr.contains("modprobe amdgpu"),
        "{stderr}"
    );
    assert!(!stderr.contains("hooks:"), "nothing attached: {stderr}");
    let (code, stderr) = run(&[
        "--vendor",
        "amd",
        "--watch-device",
        "/dev/null",
        "--duration",
        "0.3",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: AMD KFD is not loaded"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// Exit codes

/// The binary's exit status and stderr for `args`.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(gpu_trace_bin()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn bad_usage_exits_2() {
    for args in [
        &["--no-such-option"][..],
        &["--format", "xml"],
        &["--vendor", "intel"],
        &["--duration", "soon"],
        &["replay"],
        &["replay", "a", "b"],
        &["doctor", "--no-such-option"],
        &["no-such-command"],
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains("--help"),
            "the parser's message, with where to read more: {args:?}: {stderr}"
        );
    }
}

#[test]
fn runtime_errors_exit_1() {
    let dir = common::scratch().join("exit1");
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.gtrace");
    std::fs::write(&junk, b"not a recording at all, just text\n").unwrap();
    let truncated = dir.join("header-cut.gtrace");
    let real = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two_streams.gtrace"),
    )
    .unwrap();
    std::fs::write(&truncated, &real[..10]).unwrap();
    for (file, says) in [
        (dir.join("absent.gtrace"), "No such file"),
        (junk, "not a gpu-trace recording"),
        (truncated, ""),
    ] {
        let (code, stderr) = run(&["replay", file.to_str().unwrap()]);
        assert_eq!(code, Some(1), "{}: {stderr}", file.display());
        assert!(
            stderr.starts_with("gpu-trace: ") && stderr.contains(says),
            "{stderr}"
        );
    }
    // A recording that is a directory: an I/O error at run time, with the OS's words.
    let (code, stderr) = run(&["replay", dir.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Is a directory"), "{stderr}");
    // -o into a directory that does not exist is refused before anything runs: a usage error
    // (exit 2) that names the path.
    let (code, stderr) = run(&[
        "replay",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/two_streams.gtrace"
        ),
        "-o",
        dir.join("no/such/dir/out.txt").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no/such/dir"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn deny_pid_where_the_bpf_lsm_cannot_run_exits_3() {
    let _serial = serial();
    let test = "deny_pid_where_the_bpf_lsm_cannot_run_exits_3";
    if skip_unless_root(test) {
        return;
    }
    // Whether the BPF LSM can run, decided independently of gpu-trace: aya's own feature probe
    // and the kernel's list of active LSMs.
    let lsm_listed = std::fs::read_to_string("/sys/kernel/security/lsm")
        .is_ok_and(|l| l.trim().split(',').any(|m| m == "bpf"));
    let lsm_loads = matches!(
        aya::sys::is_program_supported(aya::programs::ProgramType::Lsm(
            aya::programs::LsmAttachType::Mac
        )),
        Ok(true)
    );
    if lsm_listed && lsm_loads {
        skipped(
            test,
            "this kernel runs BPF LSM programs: --deny-pid works here (tests/kernel.rs \
             deny_pid_refuses_schedules_of_the_denied_process_only checks it)",
        );
        return;
    }
    let me = std::process::id().to_string();
    let out = Command::new(gpu_trace_bin())
        .args([
            "--deny-pid",
            &me,
            "--watch-device",
            WATCHED,
            "--duration",
            "5",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("--deny-pid/--deny-cgroup/--deny-container cannot work")
            && stderr.contains("doctor"),
        "says why and what to run: {stderr}"
    );
    assert!(out.stdout.is_empty(), "it never started tracing");
}
