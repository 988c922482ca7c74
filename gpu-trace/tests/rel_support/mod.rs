//! Helpers shared by the reliability tests (`stress.rs`, `lifecycle.rs`, `fuzz_*.rs`): RM-shaped
//! parameter blocks, raw ioctls, records built as the kernel programs fill them, the re-exec
//! pattern for child processes, the `gpu-trace` binary as a child, and BPF object ids.
//!
//! The kernel tests watch `/dev/full` (char 1:7) rather than `/dev/null`: it has no ioctls either
//! (every call returns -ENOTTY after the programs have read the parameters), and no other test
//! uses it, so that a storm here never reaches the tracers of `tests/kernel.rs` running at the same
//! time on the same machine, and their calls never reach ours.
#![allow(dead_code)]

use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use gpu_trace::{
    cli::{Format, Timestamps},
    loader::{LoadError, LoadOptions, Tracer},
    output::clock::Clock,
    pipeline::PipelineConfig,
};
use gpu_trace_common::{
    NvIoctlRecord, RecordHeader, TaskRecord, nv_flags,
    nvidia::{self, escape},
};

/// The device the kernel tests watch (see the module documentation).
pub const WATCHED: &str = "/dev/full";

pub const ENOTTY: i64 = 25;

// Loud skips come from the integration tests' shared module (each test crate that uses this
// module declares `mod common;` too).
pub use crate::common::skipped;

pub fn gettid() -> u32 {
    // SAFETY: no arguments.
    unsafe { libc::gettid() as u32 }
}

/// One raw ioctl: the return value, or the negative errno.
pub fn ioctl(fd: i32, cmd: u32, arg: *const std::ffi::c_void) -> i64 {
    // SAFETY: the devices these tests use (/dev/full, /dev/null) have no ioctls and never touch
    // `arg`; the VFS-level ioctls (FIOCLEX, FIFREEZE, ...) are never issued (see `safe_cmd`).
    let rc = unsafe { libc::ioctl(fd, cmd as libc::Ioctl, arg) };
    if rc < 0 {
        -(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as i64)
    } else {
        rc as i64
    }
}

pub const ALLOC64: u32 = 0xC030_462B;
pub const ALLOC21: u32 = 0xC020_462B;
pub const CONTROL: u32 = 0xC020_462A;
pub const FREE: u32 = 0xC010_4629;
pub const XFER: u32 = 0xC010_46D3;

/// NVOS64 (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos64 {
    pub h_root: u32,
    pub h_parent: u32,
    pub h_new: u32,
    pub h_class: u32,
    pub p_alloc: u64,
    pub p_rights: u64,
    pub params_size: u32,
    pub flags: u32,
    pub status: u32,
    pub _pad: u32,
}

/// NVOS54 (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos54 {
    pub h_client: u32,
    pub h_object: u32,
    pub cmd: u32,
    pub flags: u32,
    pub params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// NVOS00 (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos00 {
    pub h_root: u32,
    pub h_parent: u32,
    pub h_old: u32,
    pub status: u32,
}

/// `nv_ioctl_xfer_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Xfer {
    pub cmd: u32,
    pub size: u32,
    pub ptr: u64,
}

/// Whether a random ioctl command is safe to issue on a device file: the VFS handles some
/// commands itself before the driver (`do_vfs_ioctl`: FIOCLEX/FIONBIO of type 'T', FIFREEZE and
/// FICLONE of type 'X', FS_IOC_* of type 'f', FIGETBSZ of type 0, ...), and some of those act on
/// the file system. Only NVIDIA's type 'F' (0x46) is used, which the VFS does not handle.
pub fn safe_cmd(cmd: u32) -> bool {
    (cmd >> 8) & 0xff == 0x46
}

/// The watched device, opened.
pub fn watched() -> File {
    File::options()
        .read(true)
        .write(true)
        .open(WATCHED)
        .expect("open the watched device")
}

/// The kernel `dev_t` of [`WATCHED`].
pub fn watched_dev() -> u32 {
    gpu_trace::probe::system::char_device_kernel_dev(WATCHED.as_ref()).expect("watched device")
}

/// A `GPFIFO_SCHEDULE` (bEnable=1) control on TSG `object`: produces a SCHEDULE event even when it
/// fails (refused schedules are reported), so the CLI's counts can be checked on a device
/// without ioctls.
pub struct Schedule {
    pub params: Box<[u8; 3]>,
    pub block: Box<Nvos54>,
}

impl Schedule {
    pub fn new(client: u32, object: u32) -> Self {
        let params = Box::new([1u8, 0, 0]);
        let block = Box::new(Nvos54 {
            h_client: client,
            h_object: object,
            cmd: nvidia::cmd::TSG_GPFIFO_SCHEDULE,
            flags: 0,
            params: params.as_ptr() as u64,
            params_size: 3,
            status: 0,
        });
        Self { params, block }
    }

    pub fn issue(&self, fd: &File) -> i64 {
        ioctl(fd.as_raw_fd(), CONTROL, (&raw const *self.block).cast())
    }
}

/// An RM_FREE of `object`: a record, never an event on a device without ioctls.
pub fn free(fd: &File, client: u32, object: u32) -> i64 {
    let b = Nvos00 {
        h_root: client,
        h_parent: client,
        h_old: object,
        status: 0,
    };
    ioctl(fd.as_raw_fd(), FREE, (&raw const b).cast())
}

/// Sets the calling thread's name (`comm`).
pub fn set_comm(name: &str) {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: PR_SET_NAME with a NUL-terminated string (the kernel truncates it to 15 bytes).
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

// ---------------------------------------------------------------------------------------------
// Records as the kernel programs fill them (for the model tests and the fuzzers).

// The record builders are the core's (one set for unit and integration tests; the `testing`
// feature of the dev-dependency): `header`, and `nv_record` for any parameter block. The NVOS
// blocks below are the caller's side of the ABI, also used for real ioctls.
#[allow(unused_imports)] // each test binary uses its own part of this module
pub use gpu_trace_core::source::nvidia::decode::testrec::{header, raw as nv_record};

pub fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: the RM blocks above are #[repr(C)] plain integers without padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// A successful (ret 0, status NV_OK) NVOS64 alloc record.
pub fn alloc_rec(
    hdr: RecordHeader,
    fd: i32,
    client: u32,
    parent: u32,
    handle: u32,
    class: u32,
    sub: Option<&[u8]>,
) -> NvIoctlRecord {
    let b = Nvos64 {
        h_root: client,
        h_parent: parent,
        h_new: handle,
        h_class: class,
        p_alloc: 0x7fff_0000,
        ..Default::default()
    };
    let mut r = nv_record(hdr, ALLOC64, &bytes_of(&b), sub, 0);
    r.fd = fd;
    r
}

/// A control record with status `status` and captured params `sub`.
pub fn control_rec(
    hdr: RecordHeader,
    client: u32,
    object: u32,
    cmd: u32,
    status: u32,
    sub: &[u8],
    ret: i64,
) -> NvIoctlRecord {
    let b = Nvos54 {
        h_client: client,
        h_object: object,
        cmd,
        flags: 0,
        params: 0x7fff_0000,
        params_size: sub.len() as u32,
        status,
    };
    nv_record(hdr, CONTROL, &bytes_of(&b), Some(sub), ret)
}

/// A successful free record.
pub fn free_rec(hdr: RecordHeader, client: u32, object: u32) -> NvIoctlRecord {
    let b = Nvos00 {
        h_root: client,
        h_parent: client,
        h_old: object,
        status: 0,
    };
    nv_record(hdr, FREE, &bytes_of(&b), None, 0)
}

pub fn task_rec(hdr: RecordHeader, value: i32) -> TaskRecord {
    TaskRecord {
        hdr,
        value,
        _pad: 0,
    }
}

/// Escape numbers and flags the fuzzers draw from (the interesting ones plus anything).
pub const ESCAPES: [u32; 5] = [
    escape::RM_FREE,
    escape::RM_CONTROL,
    escape::RM_ALLOC,
    escape::IOCTL_XFER_CMD,
    0,
];
pub const ALL_FLAGS: u32 = nv_flags::XFER
    | nv_flags::XFER_READ_FAILED
    | nv_flags::XFER_OVERSIZE
    | nv_flags::PARAMS_READ_FAILED
    | nv_flags::SUB_READ_FAILED
    | nv_flags::BAD_SIZE
    | nv_flags::SUB_TRUNCATED;

// ---------------------------------------------------------------------------------------------
// Child processes: the test binary re-executes one of its own #[ignore]d tests.

/// A command that runs the #[ignore]d test `name` of this test binary as a child process.
pub fn child(name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        name,
        "--test-threads",
        "1",
        "--nocapture",
        "-q",
    ]);
    c.stdout(Stdio::null());
    c
}

/// A number from the environment (child parameters).
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// The gpu-trace binary as a child.

pub fn gpu_trace_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpu-trace"))
}

/// A running `gpu-trace`: stdout and stderr are collected by threads.
pub struct Traced {
    pub child: Child,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr_lines: mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
}

/// What a finished `gpu-trace` left.
#[derive(Debug)]
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Traced {
    /// Starts `gpu-trace ARGS` and waits until it reports its hooks (attached), or returns why it
    /// could not start (its stderr) after it exited or 30 s passed.
    pub fn start(args: &[&str]) -> Result<Self, String> {
        Self::start_with(Command::new(gpu_trace_bin()), args)
    }

    pub fn start_with(mut cmd: Command, args: &[&str]) -> Result<Self, String> {
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawning gpu-trace: {e}"))?;
        let mut out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut t = Traced {
            child,
            stdout: Some(stdout),
            stderr_lines: rx,
            stderr_seen: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match t.stderr_lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let attached = line.contains("hooks:");
                    t.stderr_seen.push(line);
                    if attached {
                        return Ok(t);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let f = t.wait(Duration::from_secs(5));
                    return Err(format!(
                        "gpu-trace exited before attaching ({:?}): {}",
                        f.status, f.stderr
                    ));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() > deadline {
                let _ = t.child.kill();
                let f = t.wait(Duration::from_secs(5));
                return Err(format!(
                    "gpu-trace did not attach within 30 s: {}",
                    f.stderr
                ));
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The stderr lines read so far (up to the one that said the hooks attached, and those
    /// [`Self::wait_stderr`] read).
    pub fn stderr_so_far(&self) -> &[String] {
        &self.stderr_seen
    }

    /// Reads stderr until `done` holds of the lines read so far, at most `within` (a bound on
    /// a hang, never a measurement); returns whether it held.
    #[allow(dead_code)] // not every test binary that includes this module waits on stderr
    pub fn wait_stderr(&mut self, done: impl Fn(&[String]) -> bool, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !done(&self.stderr_seen) {
            if Instant::now() > deadline {
                return false;
            }
            match self.stderr_lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => self.stderr_seen.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return done(&self.stderr_seen),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        true
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the exit (killing it after `timeout`) and collects the output.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                eprintln!("gpu-trace did not exit within {timeout:?}: killing it");
                let _ = self.child.kill();
                break self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stdout = self.stdout.take().unwrap().join().unwrap();
        while let Ok(line) = self.stderr_lines.recv_timeout(Duration::from_millis(500)) {
            self.stderr_seen.push(line);
        }
        Finished {
            status,
            stdout,
            stderr: self.stderr_seen.join("\n"),
        }
    }

    /// Stops it with SIGINT and collects the output.
    pub fn interrupt(self) -> Finished {
        self.signal(libc::SIGINT);
        self.wait(Duration::from_secs(60))
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if self.stdout.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `STATS` line of a JSON run.
pub fn json_stats(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"event\":\"STATS\""))
        .unwrap_or_else(|| panic!("no STATS line in the output:\n{}", tail(stdout)));
    serde_json::from_str(line).expect("STATS is JSON")
}

/// The JSON event lines of a run (not STATS).
pub fn json_events(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        // Event lines only: not the statistics, not the start-up inventory (late attach).
        .filter(|l| {
            l.starts_with('{')
                && !l.starts_with("{\"event\":\"STATS\"")
                && !l.starts_with("{\"event\":\"INVENTORY\"")
        })
        .map(|l| serde_json::from_str(l).expect("event lines are JSON"))
        .collect()
}

/// One process's row of the STATS line.
pub fn json_process(stats: &serde_json::Value, pid: u32) -> Option<serde_json::Value> {
    stats["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
}

/// The kernel's records in a recording (not the `ATTRIBUTION` records userspace adds after each
/// cgroup record), and its trailer (`None`: the run did not end cleanly).
pub fn kernel_records_of(
    path: &std::path::Path,
) -> (u64, Option<gpu_trace::record::RecordingTrailer>) {
    let file = std::fs::File::open(path).unwrap();
    let mut r = gpu_trace::record::RecordReader::new(std::io::BufReader::new(file)).unwrap();
    let mut records = 0u64;
    while let Some(bytes) = r.next_record().unwrap() {
        if !matches!(
            gpu_trace::wire::parse_record(&bytes),
            Ok(gpu_trace::wire::RawRecord::Attribution(_))
        ) {
            records += 1;
        }
    }
    (records, r.trailer)
}

pub fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Why a kernel test cannot run here, if it cannot (not root).
pub fn cannot_trace() -> Option<String> {
    match gpu_trace::probe::system::check_privileges() {
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Whether test `test` must stop here because it cannot trace (not root); if so it has said so
/// loudly (`SKIPPED: ...`).
pub fn skip_unless_root(test: &str) -> bool {
    if let Some(why) = cannot_trace() {
        skipped(test, why);
        return true;
    }
    false
}

// ---------------------------------------------------------------------------------------------
// BPF objects held by a process, and whether they still exist.

/// The BPF objects a process holds open, from `/proc/PID/fdinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BpfIds {
    pub progs: Vec<u32>,
    pub maps: Vec<u32>,
    pub links: Vec<u32>,
}

pub fn bpf_ids_of(pid: u32) -> BpfIds {
    let mut ids = BpfIds::default();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for entry in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        if let Some(id) = field("link_id:") {
            ids.links.push(id);
        } else if let Some(id) = field("prog_id:") {
            ids.progs.push(id);
        } else if let Some(id) = field("map_id:") {
            ids.maps.push(id);
        }
    }
    for v in [&mut ids.progs, &mut ids.maps, &mut ids.links] {
        v.sort_unstable();
        v.dedup();
    }
    ids
}

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;

/// Opens a BPF object by id: `Ok(fd)`, or the errno (ENOENT: the object no longer exists).
fn bpf_get_fd_by_id(command: libc::c_long, id: u32) -> Result<i32, i32> {
    let mut attr = [0u8; 128];
    attr[..4].copy_from_slice(&id.to_le_bytes());
    // SAFETY: bpf(2) with an attribute buffer larger than the kernel reads; zero tail.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_mut_ptr(), attr.len() as u32) };
    if fd < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(fd as i32)
    }
}

/// Whether the program / map / link with this id still exists in the kernel.
pub fn bpf_exists(kind: &str, id: u32) -> bool {
    let command = match kind {
        "prog" => BPF_PROG_GET_FD_BY_ID,
        "map" => BPF_MAP_GET_FD_BY_ID,
        _ => BPF_LINK_GET_FD_BY_ID,
    };
    match bpf_get_fd_by_id(command, id) {
        Ok(fd) => {
            // SAFETY: our own fd.
            unsafe { libc::close(fd) };
            true
        }
        Err(e) => {
            assert_eq!(e, libc::ENOENT, "bpf get-fd-by-id {kind} {id}: errno {e}");
            false
        }
    }
}

/// The name of the program with this id (`bpf_prog_info.name`), if it exists.
pub fn bpf_prog_name(id: u32) -> Option<String> {
    let fd = bpf_get_fd_by_id(BPF_PROG_GET_FD_BY_ID, id).ok()?;
    let mut info = [0u8; 256];
    let mut attr = [0u8; 128];
    attr[..4].copy_from_slice(&(fd as u32).to_le_bytes());
    attr[4..8].copy_from_slice(&(info.len() as u32).to_le_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_le_bytes());
    // SAFETY: BPF_OBJ_GET_INFO_BY_FD writes at most `info_len` bytes into `info`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            attr.as_mut_ptr(),
            attr.len() as u32,
        )
    };
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return None;
    }
    // struct bpf_prog_info: char name[16] at offset 64.
    let name = &info[64..80];
    let end = name.iter().position(|&b| b == 0).unwrap_or(16);
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Waits up to 3 s for every object in `ids` to be gone; returns those still there.
pub fn bpf_leftovers(ids: &BpfIds) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<String> = [
            ("prog", &ids.progs),
            ("map", &ids.maps),
            ("link", &ids.links),
        ]
        .into_iter()
        .flat_map(|(kind, list)| {
            list.iter()
                .filter(move |&&id| bpf_exists(kind, id))
                .map(move |id| format!("{kind} {id}"))
        })
        .collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Everything under the BPF file system (pins), recursively.
pub fn bpffs_entries() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.clone());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/sys/fs/bpf"), &mut out);
    out.sort();
    out
}

/// `bpftool` when installed (scripts/setup.sh installs it): cross-checks the bpf(2) answers.
pub fn bpftool() -> Option<PathBuf> {
    [
        "/usr/sbin/bpftool",
        "/usr/bin/bpftool",
        "/usr/local/sbin/bpftool",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

// ---------------------------------------------------------------------------------------------
// The library: a tracer watching [`WATCHED`], its ring buffer, the pipeline.

/// Loads the tracer watching [`WATCHED`] with a ring of `ring_bytes`, or says loudly why the test
/// cannot run (`SKIPPED: ...`).
pub fn load(test: &str, ring_bytes: u32) -> Option<(Tracer, RingBuf<MapData>)> {
    let options = LoadOptions {
        extra_device: Some(watched_dev()),
        ring_bytes,
        ..Default::default()
    };
    match Tracer::load(&options) {
        Ok(mut t) => {
            let ring = t.take_ring_buffer().expect("ring buffer");
            Some((t, ring))
        }
        Err(e @ (LoadError::System(_) | LoadError::NoHook { .. })) => {
            skipped(test, e);
            None
        }
        Err(e) => panic!("{test}: loading failed: {e}"),
    }
}

/// Reads the ring until `done()` says so and the ring stayed empty for 100 ms, or 10 s passed.
pub fn drain_until(
    ring: &mut RingBuf<MapData>,
    mut done: impl FnMut(&[Vec<u8>]) -> bool,
) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut quiet_since = Instant::now();
    loop {
        let mut got = false;
        while let Some(item) = ring.next() {
            out.push(item.to_vec());
            got = true;
        }
        if got {
            quiet_since = Instant::now();
        }
        if (done(&out) && quiet_since.elapsed() > Duration::from_millis(100))
            || Instant::now() > deadline
        {
            return out;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What the CLI's defaults give, with WORK_SUBMIT shown and relative times.
pub fn pipeline_config(format: Format) -> PipelineConfig {
    PipelineConfig {
        show_container: false,
        verbose: true,
        pids: Vec::new(),
        comms: Vec::new(),
        format,
        timestamps: Timestamps::Relative,
        stats: true,
        clock: Clock::new(0),
    }
}

/// Proptest settings of the fuzzers: `base` cases times `GPU_TRACE_FUZZ_SCALE`; failures are
/// shrunk and saved in `tests/corpus/<corpus>.txt`, replayed first by every later run.
pub fn fuzz_config(base: u32, corpus: &'static str) -> proptest::test_runner::Config {
    let scale = env_num("GPU_TRACE_FUZZ_SCALE", 1).max(1) as u32;
    proptest::test_runner::Config {
        cases: base.saturating_mul(scale),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(corpus),
        )),
        max_shrink_iters: 4096,
        ..proptest::test_runner::Config::default()
    }
}

/// A free loopback port for `--metrics` (bound and released: the tracer binds it next).
#[allow(unused_imports)] // not every test crate that includes this module needs it
pub use crate::common::prometheus::free_port;

/// `GET /metrics` of a local endpoint: the value of the sample `name` (no labels), if served.
pub fn scrape(port: u16, name: &str) -> Option<f64> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until the sample `name` of the tracer's `--metrics` endpoint on `port` satisfies
/// `done`: a state, not a time. Bounded by a minute so that a tracer that never gets there
/// fails the test (naming `what` and the last value) instead of hanging it. Returns how many
/// scrapes it made (each a socket this process opened and closed: a traced process's closes
/// are records).
pub fn wait_scraped(port: u16, name: &str, done: impl Fn(f64) -> bool, what: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut scrapes = 0;
    loop {
        let v = scrape(port, name);
        scrapes += 1;
        if v.is_some_and(&done) {
            return scrapes;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within a minute ({name} = {v:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the tracer has read everything the ring buffer holds (its fill gauge at 0);
/// returns the scrapes made.
pub fn wait_ring_read(port: u16) -> u64 {
    wait_scraped(
        port,
        "gpu_trace_ring_buffer_used_bytes",
        |v| v == 0.0,
        "the ring buffer read to its end",
    )
}
