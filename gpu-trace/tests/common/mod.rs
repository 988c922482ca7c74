//! Helpers shared by the integration tests.

#[allow(dead_code)] // only the tests with Kubernetes pods use it
pub mod pods;
#[allow(dead_code)] // only the tests that scrape use it
pub mod prometheus;

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// Says loudly that a test could not run (or could only partly run), and why: the workspace's
/// one way, past libtest's output capture (gpu_trace_core::skip says how; `.ci/run` judges
/// these lines).
pub use gpu_trace_core::skip::skipped;

/// This test binary's scratch directory, `target/tmp/<test crate>`: emptied the first time it is
/// asked for in the process, so what a run leaves behind stays inside `target/` and is replaced
/// by the next run instead of piling up in /tmp.
#[allow(dead_code)]
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(env!("CARGO_CRATE_NAME"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        dir
    })
}

/// A FIFO at `path` (an older file there removed first), with `mode`.
#[allow(dead_code)] // only the tests that use a FIFO
pub fn mkfifo(path: &Path, mode: libc::mode_t) {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), mode) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// Whether setpriv (util-linux) switched user but could not execute the program: its errexec
/// exits 126 (127: not found) with `setpriv: failed to execute PATH: WHY` as its only output.
/// The one reason a test that runs a binary as another user may skip; a crash, a signal or any
/// other exit of the program is the program's own outcome, to be judged (a crash is never a
/// skip).
#[allow(dead_code)]
pub fn setpriv_could_not_exec(status: std::process::ExitStatus, stderr: &str) -> bool {
    matches!(status.code(), Some(126 | 127)) && stderr.starts_with("setpriv: failed to execute ")
}

/// The calling thread's id.
#[allow(dead_code)] // not every test crate that includes this module uses every helper
pub fn gettid() -> u32 {
    // SAFETY: no arguments.
    unsafe { libc::gettid() as u32 }
}

/// `ioctl(fd, cmd, arg)`: the return value, or the negative errno.
#[allow(dead_code)]
pub fn ioctl(fd: i32, cmd: u32, arg: *const std::ffi::c_void) -> i64 {
    // SAFETY: callers pass fds of devices without ioctls (/dev/null, /dev/zero), which do not
    // touch `arg`.
    let rc = unsafe { libc::ioctl(fd, cmd as libc::Ioctl, arg) };
    if rc < 0 {
        -(std::io::Error::last_os_error().raw_os_error().unwrap() as i64)
    } else {
        rc as i64
    }
}

/// Every record the ring buffer delivers during `wait`.
#[allow(dead_code)]
pub fn records_for(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    wait: std::time::Duration,
) -> Vec<gpu_trace::wire::RawRecord> {
    let deadline = std::time::Instant::now() + wait;
    let mut all = Vec::new();
    while std::time::Instant::now() < deadline {
        while let Some(item) = ring.next() {
            all.push(gpu_trace::wire::parse_record(&item).expect("records parse"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    all
}

/// The records that `keep` accepts, read until `done` says enough arrived or 2 s passed; then
/// 50 ms more, so that "nothing else" checks mean something.
#[allow(dead_code)]
pub fn collect_until(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    keep: impl Fn(&gpu_trace::wire::RawRecord) -> bool,
    done: impl Fn(&[gpu_trace::wire::RawRecord]) -> bool,
) -> Vec<gpu_trace::wire::RawRecord> {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut out = Vec::new();
    let mut drain = |out: &mut Vec<gpu_trace::wire::RawRecord>| {
        while let Some(item) = ring.next() {
            let rec = gpu_trace::wire::parse_record(&item).expect("records parse");
            if keep(&rec) {
                out.push(rec);
            }
        }
    };
    while Instant::now() < deadline {
        drain(&mut out);
        if done(&out) {
            std::thread::sleep(Duration::from_millis(50));
            drain(&mut out);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    out
}

/// The two records a live run writes when it first sees process `first.tgid` in the cgroup at
/// `path` (id `cgroup_id`): the kernel's `TASK_CGROUP` and userspace's `ATTRIBUTION`, with
/// `first`'s time, CPU and names; to put before a recording's records as if that process ran
/// there.
#[allow(dead_code)]
pub fn cgroup_records(
    first: &gpu_trace_common::RecordHeader,
    cgroup_id: u64,
    path: &str,
    ns_pid: Option<u32>,
) -> [Vec<u8>; 2] {
    use gpu_trace::wire::{Attribution, RawRecord};
    let cgroup = gpu_trace_common::TaskCgroupRecord {
        hdr: gpu_trace_common::RecordHeader {
            kind: gpu_trace_common::record_kind::TASK_CGROUP,
            ..*first
        },
        cgroup_id,
        ns_pid: 0,
        _pad: 0,
    };
    let attribution = Attribution::new(&cgroup, Some(path), ns_pid);
    [
        RawRecord::TaskCgroup(cgroup).as_bytes().to_vec(),
        RawRecord::Attribution(attribution).as_bytes().to_vec(),
    ]
}

/// Waits for `child` to end, at most `bound` (a bound on a hang, never a measurement); past
/// it, kills it and fails with `what`.
#[allow(dead_code)]
pub fn wait_live(
    child: &mut std::process::Child,
    bound: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} within {bound:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
