//! Lifecycle and safety of the tracer, and of the processes it traces.
//!
//! - The `gpu-trace` binary as a child: SIGINT and SIGTERM print the statistics and detach;
//!   after SIGKILL no program, map or link of it is left in the kernel (checked by id with
//!   bpf(2), and with `bpftool` when installed) and its cut-short recording still replays
//!   (exit 4, kernel counters unknown); two tracers at once both see every call; without
//!   privileges it refuses clearly (exit code 3).
//! - The kernel object: no `bpf_probe_write_user` call anywhere; nothing is pinned.
//! - Traced processes that fork, exec, crash or exit mid-trace, threads with their own names
//!   (real kernel), and PID reuse in the model.
//!
//! Calls go to `/dev/full` (see `rel_support`). Kernel tests need root; without it they print
//! `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    os::unix::process::ExitStatusExt,
    process::Command,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use gpu_trace::{
    cli::Format,
    event::{DestroyCause, EventKind, TaskId},
    pipeline::{Pipeline, PipelineConfig},
    source::{
        Sources,
        nvidia::decode::{self, RmCall},
    },
    wire::{self, RawRecord},
};
use gpu_trace_common::{
    nvidia::{class, cmd},
    record_kind,
};
use rel_support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `bpftool prog/map/link show id N` fails for every id (cross-check of bpf(2)).
fn bpftool_agrees_gone(ids: &BpfIds) {
    let Some(tool) = bpftool() else {
        skipped(
            "bpftool cross-check",
            "bpftool not installed: ids checked with bpf(2) only; scripts/setup.sh installs it",
        );
        return;
    };
    for (kind, list) in [
        ("prog", &ids.progs),
        ("map", &ids.maps),
        ("link", &ids.links),
    ] {
        for id in list {
            let out = Command::new(&tool)
                .args([kind, "show", "id", &id.to_string()])
                .output()
                .unwrap();
            assert!(
                !out.status.success(),
                "bpftool still shows {kind} {id}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}

/// The BPF objects of a running gpu-trace, checked to be its own programs (by name).
fn objects_of(traced: &Traced) -> BpfIds {
    let ids = bpf_ids_of(traced.pid());
    let names: Vec<String> = ids
        .progs
        .iter()
        .filter_map(|&id| bpf_prog_name(id))
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("sys_exit") || n.starts_with("tp_ioctl")),
        "gpu-trace's syscall program is among its fds: {names:?}"
    );
    assert!(
        names.iter().any(|n| n.contains("process_exit")),
        "{names:?}"
    );
    assert!(!ids.maps.is_empty(), "{ids:?}");
    if let Some(tool) = bpftool() {
        let out = Command::new(tool)
            .args(["prog", "show", "id", &ids.progs[0].to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "bpftool sees the running program");
    }
    ids
}

// ---------------------------------------------------------------------------------------------
// 5. Signals, detaching, concurrent tracers.

#[test]
fn sigint_and_sigterm_print_statistics_and_detach() {
    let _serial = serial();
    let test = "sigint_and_sigterm_print_statistics_and_detach";
    if skip_unless_root(test) {
        return;
    }
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let pins = bpffs_entries();
        let traced =
            Traced::start(&["--watch-device", WATCHED]).unwrap_or_else(|e| panic!("{test}: {e}"));
        let ids = objects_of(&traced);
        assert_eq!(bpffs_entries(), pins, "{name}: gpu-trace pins nothing");
        let dev = watched();
        Schedule::new(0x5EED_0002, 0x5EED_0E00 + sig as u32).issue(&dev);
        std::thread::sleep(Duration::from_millis(300));
        traced.signal(sig);
        let f = traced.wait(Duration::from_secs(20));
        eprintln!(
            "{test}: {name}: {:?}, {} ids: {ids:?}",
            f.status,
            ids.progs.len() + ids.maps.len() + ids.links.len()
        );
        assert_eq!(f.status.code(), Some(0), "{name}: clean exit: {}", f.stderr);
        assert!(
            f.stdout.contains("--- gpu-trace statistics"),
            "{name}: statistics printed:\n{}",
            f.stdout
        );
        let me = std::process::id().to_string();
        assert!(
            f.stdout
                .contains(&format!("TSG=0x{:08x}", 0x5EED_0E00 + sig as u32)),
            "{name}: the event before the signal was printed:\n{}",
            f.stdout
        );
        assert!(
            f.stdout.lines().any(|l| l.starts_with(&me)),
            "{name}: per-process row:\n{}",
            f.stdout
        );
        let left = bpf_leftovers(&ids);
        assert!(
            left.is_empty(),
            "{name}: still in the kernel after exit: {left:?}"
        );
        bpftool_agrees_gone(&ids);
        assert_eq!(bpffs_entries(), pins);
    }
}

/// This process's RM calls among the records a recording being written holds so far (read up
/// to its first incomplete record).
fn own_calls_recorded(rec: &std::path::Path) -> usize {
    let Ok(file) = std::fs::File::open(rec) else {
        return 0;
    };
    let Ok(mut r) = gpu_trace::record::RecordReader::new(std::io::BufReader::new(file)) else {
        return 0;
    };
    let mut n = 0;
    while let Ok(Some(bytes)) = r.next_record() {
        if let Ok(gpu_trace::wire::RawRecord::NvIoctl(c)) = gpu_trace::wire::parse_record(&bytes)
            && c.hdr.tgid == std::process::id()
        {
            n += 1;
        }
    }
    n
}

#[test]
fn sigkill_leaves_nothing_in_the_kernel_and_the_cut_recording_replays() {
    let _serial = serial();
    let test = "sigkill_leaves_nothing_in_the_kernel_and_the_cut_recording_replays";
    if skip_unless_root(test) {
        return;
    }
    let dir = common::scratch().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    let rec = dir.join("killed.gtrace");
    let pins = bpffs_entries();
    let traced = Traced::start(&["--watch-device", WATCHED, "--record", rec.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let ids = objects_of(&traced);
    let dev = watched();
    let s = Schedule::new(0x5EED_0003, 0x5EED_0D00);
    for _ in 0..100 {
        s.issue(&dev);
    }
    // Killed once part of the calls reached the recording's file (the state the test needs:
    // a cut recording with records in it), read from the file as it grows.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while own_calls_recorded(&rec) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{test}: none of the 100 calls reached the recording within a minute"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    traced.signal(libc::SIGKILL);
    let f = traced.wait(Duration::from_secs(10));
    assert_eq!(f.status.signal(), Some(libc::SIGKILL));
    let left = bpf_leftovers(&ids);
    assert!(
        left.is_empty(),
        "after SIGKILL still in the kernel: {left:?}"
    );
    bpftool_agrees_gone(&ids);
    assert_eq!(bpffs_entries(), pins, "nothing pinned survives");

    // The recording was cut wherever its buffer last reached the file: it replays what it holds.
    let size = std::fs::metadata(&rec).unwrap().len();
    let out = Command::new(gpu_trace_bin())
        .args(["replay", rec.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{test}: recording of {size} bytes after SIGKILL; replay: {:?} {stderr}",
        out.status
    );
    // It replays, but says it was cut short: exit 4 (counts incomplete), kernel counters
    // unknown (null), not `dropped 0`.
    assert_eq!(
        out.status.code(),
        Some(4),
        "a cut-short recording replays, and says so: {stderr}"
    );
    assert!(stderr.contains("without its trailer"), "{stderr}");
    let stats = json_stats(&stdout);
    assert!(stats["kernel"].is_null(), "{stats}");
    let row = json_process(&stats, std::process::id()).expect("our calls are in the recording");
    let n = row["schedule"].as_u64().unwrap();
    assert!((1..=100).contains(&n), "{n} of the 100 calls replayed");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_concurrent_tracers_both_see_every_call() {
    let _serial = serial();
    let test = "two_concurrent_tracers_both_see_every_call";
    if skip_unless_root(test) {
        return;
    }
    let args = ["--watch-device", WATCHED, "--format", "json"];
    let a = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: first: {e}"));
    let b = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: second: {e}"));
    let dev = watched();
    let s = Schedule::new(0x5EED_0004, 0x5EED_0C00);
    for _ in 0..5 {
        s.issue(&dev);
    }
    for (name, t) in [("first", a), ("second", b)] {
        let f = t.interrupt();
        assert_eq!(f.status.code(), Some(0), "{name}: {}", f.stderr);
        let n = json_events(&f.stdout)
            .iter()
            .filter(|e| {
                e["event"] == "SCHEDULE"
                    && e["pid"] == std::process::id()
                    && e["task"]["value"] == 0x5EED_0C00u32
            })
            .count();
        assert_eq!(n, 5, "{name} tracer sees all 5 calls");
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Privileges and safety.

fn setpriv() -> Option<&'static str> {
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

#[test]
fn refuses_clearly_without_privileges() {
    let test = "refuses_clearly_without_privileges";
    if skip_unless_root(test) {
        return;
    }
    let Some(setpriv) = setpriv() else {
        skipped(test, "setpriv (util-linux) is not installed");
        return;
    };
    let bin = gpu_trace_bin();
    let bin = bin.to_str().unwrap();
    let run = |pre: &[&str]| {
        let out = Command::new(setpriv)
            .args(pre)
            .args(["--", bin, "--watch-device", WATCHED, "--duration", "1"])
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Root without any capability, and CAP_BPF alone.
    for (pre, missing) in [
        (
            &["--bounding-set=-all", "--inh-caps=-all"][..],
            "missing: CAP_BPF, CAP_PERFMON",
        ),
        (
            &["--bounding-set=-all,+bpf", "--inh-caps=-all"][..],
            "missing: CAP_PERFMON",
        ),
    ] {
        let (status, stdout, stderr) = run(pre);
        eprintln!("{test}: setpriv {pre:?}: {status:?}: {stderr}");
        assert_eq!(
            status.code(),
            Some(3),
            "exit code 3 (cannot trace here): {stderr}"
        );
        assert!(
            stderr.contains(missing) && stderr.contains("sudo"),
            "names what is missing and what to do: {stderr}"
        );
        assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
    }
    // An unprivileged user.
    let (status, _, stderr) = run(&[
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ]);
    // The one skip: setpriv could not execute the binary as nobody; a crash or any other exit
    // is judged.
    if common::setpriv_could_not_exec(status, &stderr) {
        skipped(
            &format!("{test} (as nobody)"),
            format!("the binary is not executable by nobody here: {stderr}"),
        );
    } else {
        assert_eq!(status.code(), Some(3), "as nobody: {stderr}");
        assert!(stderr.contains("needs root"), "{stderr}");
    }
    // CAP_BPF and CAP_PERFMON are enough, as the message says.
    let (status, _, stderr) = run(&["--bounding-set=-all,+bpf,+perfmon", "--inh-caps=-all"]);
    assert_eq!(
        status.code(),
        Some(0),
        "with CAP_BPF+CAP_PERFMON only: {stderr}"
    );
}

/// BPF instructions (8 bytes): a helper call is `BPF_JMP|BPF_CALL` (0x85) with src_reg 0 and the
/// helper id in `imm`; `lddw` (0x18) takes two slots.
fn helper_calls(code: &[u8]) -> Vec<i32> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 8 <= code.len() {
        let op = code[i];
        let src = code[i + 1] >> 4;
        let imm = i32::from_le_bytes(code[i + 4..i + 8].try_into().unwrap());
        if op == 0x85 && src == 0 {
            out.push(imm);
        }
        i += if op == 0x18 { 16 } else { 8 };
    }
    out
}

#[test]
fn kernel_programs_never_write_user_memory() {
    use object::{Object, ObjectSection, SectionKind};
    static PROGRAMS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpu-trace-ebpf"));
    const BPF_FUNC_PROBE_WRITE_USER: i32 = 36;
    let elf = object::File::parse(PROGRAMS).expect("the kernel object is ELF");
    let mut helpers = std::collections::BTreeMap::<i32, Vec<String>>::new();
    let mut sections = Vec::new();
    for s in elf.sections() {
        if s.kind() != SectionKind::Text || s.size() == 0 {
            continue;
        }
        let name = s.name().unwrap_or("?").to_string();
        for h in helper_calls(s.data().unwrap()) {
            helpers.entry(h).or_default().push(name.clone());
        }
        sections.push(name);
    }
    eprintln!(
        "kernel_programs_never_write_user_memory: sections {sections:?}; helpers used {:?}",
        helpers.keys().collect::<Vec<_>>()
    );
    // The scan finds what the programs are known to call (the test can see helpers at all).
    for (id, what) in [
        (112, "probe_read_user"),
        (113, "probe_read_kernel"),
        (131, "ringbuf_reserve"),
        (14, "get_current_pid_tgid"),
    ] {
        assert!(
            helpers.contains_key(&id),
            "bpf_{what} ({id}) not found: the scan is broken"
        );
    }
    assert!(
        !helpers.contains_key(&BPF_FUNC_PROBE_WRITE_USER),
        "bpf_probe_write_user is called in {:?}",
        helpers[&BPF_FUNC_PROBE_WRITE_USER]
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Traced processes that fork, exec, crash, exit; threads with their own names.

/// Child body; `REL_SCENARIO` picks what it does (see `processes_that_fork_exec_crash_are_followed`).
#[test]
#[ignore = "child process body for the lifecycle tests"]
fn lifecycle_child() {
    let dev = watched();
    match std::env::var("REL_SCENARIO").as_deref() {
        Ok("fork") => {
            set_comm("forker");
            free(&dev, 0xF0, 0xF0);
            // SAFETY: the child only issues raw syscalls (ioctl, _exit) before exiting.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                free(&dev, 0xF0, 0xF1);
                free(&dev, 0xF0, 0xF1);
                // SAFETY: leaves the forked child at once.
                unsafe { libc::_exit(0) };
            }
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            free(&dev, 0xF0, 0xF2);
            let dev = std::sync::Arc::new(dev);
            for (name, obj) in [("worker-alpha", 0xF3), ("worker-beta", 0xF4)] {
                let dev = dev.clone();
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || free(&dev, 0xF0, obj))
                    .unwrap()
                    .join()
                    .unwrap();
            }
        }
        Ok("crash") => {
            set_comm("crasher");
            free(&dev, 0xC0, 0xC0);
            free(&dev, 0xC0, 0xC0);
            std::process::abort();
        }
        Ok("exec") => {
            set_comm("pre-exec");
            free(&dev, 0xE0, 0xE0);
            use std::os::unix::process::CommandExt;
            let err = child("exec_target").exec();
            panic!("exec failed: {err}");
        }
        other => panic!("unknown scenario {other:?}"),
    }
}

/// What the `exec` scenario becomes after execve: same pid, new image.
#[test]
#[ignore = "child process body for the lifecycle tests"]
fn exec_target() {
    let dev = watched();
    free(&dev, 0xE0, 0xE1);
    free(&dev, 0xE0, 0xE1);
    std::process::exit(7);
}

#[test]
fn processes_that_fork_exec_crash_are_followed() {
    let _serial = serial();
    let test = "processes_that_fork_exec_crash_are_followed";
    let Some((tracer, mut ring)) = load(test, gpu_trace::loader::DEFAULT_RING_BYTES) else {
        return;
    };
    let run = |scenario: &str| {
        let mut c = child("lifecycle_child")
            .env("REL_SCENARIO", scenario)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = c.id();
        (pid, c.wait().unwrap())
    };
    let (fork_pid, fork_status) = run("fork");
    let (crash_pid, crash_status) = run("crash");
    let (exec_pid, exec_status) = run("exec");
    assert!(fork_status.success());
    assert_eq!(crash_status.signal(), Some(libc::SIGABRT));
    assert_eq!(exec_status.code(), Some(7));

    // Four exits (the forked child's too); then whatever else comes in 100 ms.
    let exits = |items: &[Vec<u8>]| {
        items
            .iter()
            .filter(|b| matches!(wire::parse_record(b), Ok(RawRecord::ProcessExit(_))))
            .count()
    };
    let all: Vec<RawRecord> = drain_until(&mut ring, |items| exits(items) >= 4)
        .iter()
        .map(|b| wire::parse_record(b).unwrap())
        .collect();
    assert_eq!(tracer.counters().unwrap().dropped, 0);
    // (object, comm) of each call of a process, in order; and its exit notices.
    let calls = |pid: u32| -> Vec<(u32, String)> {
        all.iter()
            .filter_map(|r| match r {
                RawRecord::NvIoctl(n) if n.hdr.tgid == pid => match decode::decode(n) {
                    RmCall::Free { object, .. } => {
                        Some((object, wire::comm_to_string(&n.hdr.comm)))
                    }
                    c => panic!("{c:?}"),
                },
                _ => None,
            })
            .collect()
    };
    let exits = |pid: u32| -> Vec<u64> {
        all.iter()
            .filter_map(|r| match r {
                RawRecord::ProcessExit(t) if t.hdr.tgid == pid => Some(t.hdr.ts_ns),
                _ => None,
            })
            .collect()
    };
    let last_call = |pid: u32| {
        all.iter()
            .filter_map(|r| match r {
                RawRecord::NvIoctl(n) if n.hdr.tgid == pid => Some(n.hdr.ts_ns),
                _ => None,
            })
            .max()
            .unwrap()
    };

    // Fork: the parent's calls, its threads under their own names; the forked child is a process
    // of its own (its own pid and exit), not the parent's.
    let s = |x: &str| x.to_string();
    assert_eq!(
        calls(fork_pid),
        vec![
            (0xF0, s("forker")),
            (0xF2, s("forker")),
            (0xF3, s("worker-alpha")),
            (0xF4, s("worker-beta"))
        ]
    );
    let grandchild = all
        .iter()
        .find_map(|r| match r {
            RawRecord::NvIoctl(n)
                if matches!(decode::decode(n), RmCall::Free { object: 0xF1, .. }) =>
            {
                Some(n.hdr.tgid)
            }
            _ => None,
        })
        .expect("the forked child's calls were captured");
    assert_ne!(grandchild, fork_pid);
    assert_eq!(
        calls(grandchild),
        vec![(0xF1, s("forker")), (0xF1, s("forker"))]
    );
    for pid in [fork_pid, grandchild, crash_pid, exec_pid] {
        let e = exits(pid);
        assert_eq!(e.len(), 1, "pid {pid}: one PROCESS_EXIT");
        assert!(
            e[0] > last_call(pid),
            "pid {pid}: the exit comes after its last call"
        );
    }
    // Crash: its calls, then its exit.
    assert_eq!(
        calls(crash_pid),
        vec![(0xC0, s("crasher")), (0xC0, s("crasher"))]
    );
    // Exec: one process before and after, under the new image's name after.
    let e = calls(exec_pid);
    assert_eq!(e.len(), 3, "{e:?}");
    assert_eq!(e[0], (0xE0, s("pre-exec")));
    assert!(
        e[1..].iter().all(|(o, c)| *o == 0xE1 && c != "pre-exec"),
        "{e:?}"
    );
    eprintln!(
        "{test}: fork {fork_pid} (child {grandchild}), crash {crash_pid}, exec {exec_pid}: {} records",
        all.len()
    );
}

// PID reuse and thread names in the model (pure).

const CLIENT: u32 = 0xC1D0_0001;
const DEVICE: u32 = 0xCAF0_0001;
const TSG: u32 = 0x5C00_0010;
const CHANNEL: u32 = 0x5C00_0011;

fn hdr(ts: u64, pid: u32, tid: u32, comm: &str) -> gpu_trace_common::RecordHeader {
    header(record_kind::NV_IOCTL, ts, pid, tid, comm)
}

/// A client, device, TSG and channel of process `pid`, as CUDA creates them.
fn setup(pid: u32, comm: &str, ts: u64) -> Vec<RawRecord> {
    let mut tsg_params = vec![0u8; 20];
    tsg_params[12] = 1; // engineType GR0
    let mut ch_params = vec![0u8; 136];
    ch_params[128] = 1;
    vec![
        RawRecord::NvIoctl(alloc_rec(
            hdr(ts, pid, pid, comm),
            5,
            CLIENT,
            0,
            CLIENT,
            class::NV01_ROOT_CLIENT,
            None,
        )),
        RawRecord::NvIoctl(alloc_rec(
            hdr(ts + 1, pid, pid, comm),
            5,
            CLIENT,
            CLIENT,
            DEVICE,
            class::NV01_DEVICE_0,
            Some(&[0, 0, 0, 0]),
        )),
        RawRecord::NvIoctl(alloc_rec(
            hdr(ts + 2, pid, pid, comm),
            5,
            CLIENT,
            DEVICE,
            TSG,
            class::KEPLER_CHANNEL_GROUP_A,
            Some(&tsg_params),
        )),
        RawRecord::NvIoctl(alloc_rec(
            hdr(ts + 3, pid, pid, comm),
            5,
            CLIENT,
            TSG,
            CHANNEL,
            class::HOPPER_CHANNEL_GPFIFO_A,
            Some(&ch_params),
        )),
    ]
}

fn observe(t: &mut Sources, recs: &[RawRecord]) -> Vec<gpu_trace::event::Event> {
    recs.iter().flat_map(|r| t.events_of(r)).collect()
}

#[test]
fn a_reused_pid_does_not_inherit_the_old_process_objects() {
    let pid = 4242;
    let mut t = Sources::new();
    let evs = observe(&mut t, &setup(pid, "old", 100));
    assert_eq!(
        evs.iter().map(|e| e.kind.name()).collect::<Vec<_>>(),
        ["TASK_INIT"]
    );
    // The old process exits: its TSG ends.
    let exit = RawRecord::ProcessExit(task_rec(
        header(record_kind::PROCESS_EXIT, 200, pid, pid, "old"),
        -1,
    ));
    let evs = observe(&mut t, &[exit]);
    assert!(
        matches!(evs[..], [ref e] if matches!(e.kind, EventKind::TaskDestroy { cause: DestroyCause::ProcessExit, .. }))
    );
    assert_eq!(t.live_tasks(), 0);
    assert!(t.nvidia().task(pid, CLIENT, TSG).is_none());

    // A new process with the same pid uses the old handles: nothing of the old one is found.
    let h = |ts| hdr(ts, pid, pid, "new");
    let sched = RawRecord::NvIoctl(control_rec(
        h(300),
        CLIENT,
        TSG,
        cmd::TSG_GPFIFO_SCHEDULE,
        0,
        &[1, 0, 0],
        0,
    ));
    let token = RawRecord::NvIoctl(control_rec(
        h(301),
        CLIENT,
        CHANNEL,
        cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
        0,
        &5u32.to_le_bytes(),
        0,
    ));
    let free = RawRecord::NvIoctl(free_rec(h(302), CLIENT, TSG));
    let evs = observe(&mut t, &[sched, token, free]);
    assert_eq!(evs.len(), 2, "{evs:#?}");
    match &evs[0].kind {
        EventKind::Schedule {
            task,
            channels,
            timeslice_us,
            ..
        } => {
            // The new process never allocated CLIENT while traced: its objects predate
            // tracing as far as the tracer knows.
            assert_eq!(
                (*task, *channels, *timeslice_us),
                (TaskId::PreTrace(TSG), None, None),
                "not the old TSG's values"
            );
        }
        k => panic!("{k:?}"),
    }
    match &evs[1].kind {
        EventKind::WorkSubmit { task, .. } => assert_eq!(
            *task,
            TaskId::PreTrace(CHANNEL),
            "not attributed to the old TSG"
        ),
        k => panic!("{k:?}"),
    }
    assert_eq!(evs[0].origin.comm, "new");
    assert_eq!(
        t.nvidia().counters().untracked_frees,
        1,
        "the free of the old handle destroys nothing"
    );
    // The new process builds the same objects: a fresh TSG, nothing replaced.
    let evs = observe(&mut t, &setup(pid, "new", 400));
    assert_eq!(evs.len(), 1);
    assert_eq!(t.nvidia().counters().replaced_handles, 0);
    assert_eq!(
        t.nvidia().task(pid, CLIENT, TSG).unwrap().channels,
        vec![CHANNEL]
    );
}

#[test]
fn events_carry_the_calling_thread_name_and_comm_filter_keeps_the_process() {
    let pid = 777;
    let mut recs = setup(pid, "python3", 100);
    // A schedule from another thread of the process, with its own name.
    recs.push(RawRecord::NvIoctl(control_rec(
        hdr(200, pid, pid + 3, "cuda-worker"),
        CLIENT,
        TSG,
        cmd::TSG_GPFIFO_SCHEDULE,
        0,
        &[1, 0, 0],
        0,
    )));
    // Another process, filtered out by --comm.
    recs.extend(setup(888, "other", 300));
    recs.push(RawRecord::ProcessExit(task_rec(
        header(
            record_kind::PROCESS_EXIT,
            400,
            pid,
            pid + 4,
            "cuda-EvtHandlr",
        ),
        -1,
    )));
    let mut out = Vec::new();
    let config = PipelineConfig {
        show_container: false,
        comms: vec!["python3".into()],
        stats: false,
        ..pipeline_config(Format::Json)
    };
    let mut p = Pipeline::new(config, &mut out);
    for r in &recs {
        p.feed(r.as_bytes()).unwrap();
    }
    p.finish(Default::default(), Duration::ZERO).unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got: Vec<(String, u64, String)> = lines
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_string(),
                e["tid"].as_u64().unwrap(),
                e["comm"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("TASK_INIT".into(), 777, "python3".into()),
            ("SCHEDULE".into(), 780, "cuda-worker".into()),
            ("TASK_DESTROY".into(), 781, "cuda-EvtHandlr".into()),
        ]
    );
}
