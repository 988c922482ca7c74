//! Facts about the running system that decide whether and how gpu-trace can attach:
//! privileges, tracefs and ftrace's function list, LSMs and lockdown, kernel and driver
//! versions.

use std::{collections::BTreeMap, fs, io, path::Path};

use serde::Serialize;
use thiserror::Error;

/// Linux capability numbers (`include/uapi/linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, Error)]
pub enum SystemError {
    #[error(
        "tracing needs root, or the capabilities CAP_BPF and CAP_PERFMON (missing: {missing}). \
         Run it with sudo, or grant them: sudo setcap cap_bpf,cap_perfmon+ep $(which gpu-trace)"
    )]
    NotPrivileged { missing: String },
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error(
        "tracefs is not mounted and mounting it at /sys/kernel/tracing failed ({source}); \
         mount it by hand: sudo mount -t tracefs none /sys/kernel/tracing"
    )]
    TracefsMount { source: io::Error },
    #[error("tracefs is mounted at {path} but this user cannot read it; run as root (sudo)")]
    TracefsUnreadable { path: String },
    #[error("{path} is not a character device; --watch-device needs one (e.g. /dev/null)")]
    NotACharDevice { path: String },
    #[error("{path}: no such file; --watch-device needs a character device (e.g. /dev/null)")]
    NoSuchDevice { path: String },
}

/// Effective capability mask of this process (`CapEff` in /proc/self/status).
pub fn effective_capabilities() -> Result<u64, SystemError> {
    let path = "/proc/self/status";
    let status = fs::read_to_string(path).map_err(|source| SystemError::Read {
        path: path.into(),
        source,
    })?;
    Ok(parse_cap_eff(&status).unwrap_or(0))
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// Checks that this process may load and attach tracing programs: CAP_BPF and CAP_PERFMON, or
/// CAP_SYS_ADMIN (which covers both on every kernel).
pub fn check_privileges() -> Result<(), SystemError> {
    missing_privileges(effective_capabilities()?)
}

fn missing_privileges(cap_eff: u64) -> Result<(), SystemError> {
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(cap, _)| !has(*cap))
        .map(|(_, name)| name)
        .collect();
    Err(SystemError::NotPrivileged {
        missing: missing.join(", "),
    })
}

/// Where tracefs is mounted, mounting it at /sys/kernel/tracing when it is not.
/// Returns the directory that holds `events/`.
pub fn ensure_tracefs() -> Result<&'static str, SystemError> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(dir);
        }
    }
    // Mounted, but hidden from this user (tracefs is root-only): say that, not "not mounted".
    if let Some(path) = tracefs_mounts(&mounts()).into_iter().next() {
        return Err(SystemError::TracefsUnreadable { path });
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: plain mount(2) call with NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(SystemError::TracefsMount {
            source: io::Error::last_os_error(),
        });
    }
    Ok("/sys/kernel/tracing")
}

/// A character device node and its numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DevNode {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// The node at `path`, when it is a character device.
pub fn char_device(path: &Path) -> Result<DevNode, SystemError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = fs::metadata(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => SystemError::NoSuchDevice {
            path: path.display().to_string(),
        },
        _ => SystemError::Read {
            path: path.display().to_string(),
            source,
        },
    })?;
    if !meta.file_type().is_char_device() {
        return Err(SystemError::NotACharDevice {
            path: path.display().to_string(),
        });
    }
    let rdev = meta.rdev();
    Ok(DevNode {
        path: path.display().to_string(),
        major: libc::major(rdev),
        minor: libc::minor(rdev),
    })
}

/// The kernel `dev_t` (`major << 20 | minor`) of a character device node.
pub fn char_device_kernel_dev(path: &Path) -> Result<u32, SystemError> {
    let node = char_device(path)?;
    Ok(gpu_trace_common::kernel_dev(node.major, node.minor))
}

/// The active LSM list (`/sys/kernel/security/lsm`), mounting securityfs when needed.
pub fn active_lsms() -> Result<String, SystemError> {
    let path = "/sys/kernel/security/lsm";
    if !Path::new(path).exists() {
        // SAFETY: plain mount(2) call with NUL-terminated strings; failure is reported below.
        unsafe {
            libc::mount(
                c"securityfs".as_ptr(),
                c"/sys/kernel/security".as_ptr(),
                c"securityfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
    fs::read_to_string(path)
        .map(|s| s.trim().trim_end_matches(',').to_string())
        .map_err(|source| SystemError::Read {
            path: path.into(),
            source,
        })
}

/// The LSMs of a `/sys/kernel/security/lsm` text (comma-separated, maybe with a trailing
/// comma).
pub fn lsm_list(text: &str) -> Vec<String> {
    text.trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `/sys/kernel/security/lockdown` (e.g. `none [integrity] confidentiality`), trimmed.
pub fn lockdown() -> Result<String, SystemError> {
    let path = "/sys/kernel/security/lockdown";
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| SystemError::Read {
            path: path.into(),
            source,
        })
}

/// The selected level of a `/sys/kernel/security/lockdown` text (`none [integrity]
/// confidentiality` → `integrity`).
pub fn lockdown_level(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_string())
}

/// `/proc/mounts` (empty when unreadable).
pub fn mounts() -> String {
    fs::read_to_string("/proc/mounts").unwrap_or_default()
}

/// Mount points of tracefs in a `/proc/mounts` text.
pub fn tracefs_mounts(mounts: &str) -> Vec<String> {
    mounts_of_type(mounts, "tracefs")
}

/// Mount points of file systems of type `fstype` in a `/proc/mounts` text, with the octal
/// escapes of that file (`\040` for a space, …) decoded.
pub fn mounts_of_type(mounts: &str, fstype: &str) -> Vec<String> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, ty) = (f.next()?, f.next()?, f.next()?);
            (ty == fstype).then(|| unescape_mount_field(dir))
        })
        .collect()
}

/// `/proc/mounts` escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = u32::from(bytes[i + 1] - b'0') * 64
                + u32::from(bytes[i + 2] - b'0') * 8
                + u32::from(bytes[i + 3] - b'0');
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether tracefs (mounted at `tracefs`) has `kprobe_events`.
pub fn kprobe_events(tracefs: &str) -> bool {
    Path::new(tracefs).join("kprobe_events").exists()
}

/// ftrace's `available_filter_functions` under `tracefs`, or why it cannot be read (the errno
/// by name: typically EPERM).
pub fn filter_functions(tracefs: &str) -> Result<String, String> {
    let path = format!("{tracefs}/available_filter_functions");
    fs::read_to_string(&path).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(errno) => format!("{} ({e})", super::trial::errno_name(errno)),
            None => e.to_string(),
        };
        format!("cannot read {path}: {why}")
    })
}

/// For each name, whether an `available_filter_functions` text lists it (lines are `name` or
/// `name [module]`, some kernels prefix an address).
pub fn listed_functions(text: &str, names: &[&str]) -> BTreeMap<String, bool> {
    let mut out: BTreeMap<String, bool> = names.iter().map(|n| (n.to_string(), false)).collect();
    for line in text.lines() {
        for word in line.split_whitespace().take(2) {
            if let Some(v) = out.get_mut(word) {
                *v = true;
            }
        }
    }
    out
}

/// The thread-group id (process id) of a task id, if it exists.
pub fn thread_group_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A process's PID in its own (innermost) PID namespace, when that namespace is not the host's
/// (`NSpid` in /proc/PID/status has more than one entry). `None` otherwise or when gone.
pub fn namespaced_pid(pid: u32) -> Option<u32> {
    parse_ns_pid(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn parse_ns_pid(status: &str) -> Option<u32> {
    let ids: Vec<&str> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .collect();
    match ids.as_slice() {
        [_host, .., inner] => inner.parse().ok(),
        _ => None,
    }
}

/// `uname -r`.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether kernel module `module` is loaded (`/sys/module/<module>`).
pub fn module_loaded(module: &str) -> bool {
    Path::new("/sys/module").join(module).exists()
}

/// The version of loaded kernel module `module` (`/sys/module/<module>/version`), trimmed.
pub fn module_version(module: &str) -> Option<String> {
    fs::read_to_string(Path::new("/sys/module").join(module).join("version"))
        .ok()
        .map(|v| v.trim().to_string())
}

/// The warning for a trace of NVIDIA when its driver is not loaded (no
/// `/proc/driver/nvidia/version` and no nvidia module): the trace starts, but sees nothing
/// until the driver is loaded.
pub fn nvidia_not_loaded_warning() -> Option<String> {
    (nvidia_version_text().is_none() && !module_loaded(crate::targets::NVIDIA_MODULE)).then(|| {
        "the NVIDIA driver is not loaded (no /proc/driver/nvidia/version, no nvidia module): \
         nothing is traced until it is (sudo modprobe nvidia); processes that open a GPU after \
         that are traced"
            .to_string()
    })
}

/// `/proc/driver/nvidia/version`, when the NVIDIA driver is loaded.
pub fn nvidia_version_text() -> Option<String> {
    fs::read_to_string("/proc/driver/nvidia/version").ok()
}

/// `open` or `proprietary`, and the version, from a `/proc/driver/nvidia/version` text.
pub fn nvidia_flavour(version_text: &str) -> (Option<&'static str>, Option<String>) {
    let first = version_text.lines().next().unwrap_or_default();
    let flavour = if first.contains("Open Kernel Module") {
        Some("open")
    } else if first.contains("Kernel Module") {
        Some("proprietary")
    } else {
        None
    };
    // The version is the first word made of digits and dots with at least one dot.
    let version = first
        .split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_string);
    (flavour, version)
}

/// The loaded NVIDIA kernel module's version and flavour ("open" or "proprietary"), if any.
pub fn nvidia_driver() -> Option<String> {
    let version = module_version(crate::targets::NVIDIA_MODULE)?;
    let flavour = match nvidia_version_text() {
        // A version text that names no flavour is the proprietary module's older wording.
        Some(v) => nvidia_flavour(&v).0.unwrap_or("proprietary"),
        None => "unknown flavour",
    };
    Some(format!("nvidia {version} ({flavour})"))
}

/// Host name, for recording headers.
pub fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_pid_is_the_innermost_namespace_s_only_when_nested() {
        // /proc/PID/status of a process in a podman container (host pid 41234, pid 1 inside)
        // and of a host process.
        let nested = "Name:\tsleep\nTgid:\t41234\nNSpid:\t41234\t1\nNSpgid:\t41234\t1\n";
        assert_eq!(parse_ns_pid(nested), Some(1));
        let twice = "NSpid:\t900\t77\t5\n";
        assert_eq!(parse_ns_pid(twice), Some(5));
        assert_eq!(parse_ns_pid("Name:\tbash\nNSpid:\t1234\n"), None);
        assert_eq!(parse_ns_pid("Name:\tbash\n"), None);
        // This test's own process is in the host's namespace on CI (no container around it).
        let own = std::process::id();
        if std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("NSpid:") && l.split_whitespace().count() == 2)
        }) {
            assert_eq!(namespaced_pid(own), None);
        }
    }

    #[test]
    fn cap_eff_is_parsed_from_status_text() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\nCapBnd:\t0\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
    }

    #[test]
    fn privileges_need_bpf_and_perfmon_or_sys_admin() {
        assert!(missing_privileges(1 << CAP_SYS_ADMIN).is_ok());
        assert!(missing_privileges((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_ok());
        let err = missing_privileges(1 << CAP_BPF).unwrap_err().to_string();
        assert!(
            err.contains("CAP_PERFMON") && !err.contains("CAP_BPF,"),
            "{err}"
        );
        let err = missing_privileges(0).unwrap_err().to_string();
        assert!(
            err.contains("CAP_BPF, CAP_PERFMON") && err.contains("sudo"),
            "{err}"
        );
    }

    #[test]
    fn thread_group_of_resolves_threads_to_their_process() {
        let me = std::process::id();
        assert_eq!(thread_group_of(me), Some(me));
        let tid = std::thread::spawn(|| unsafe { libc::gettid() } as u32)
            .join()
            .unwrap();
        // The thread has exited: it no longer resolves, once the kernel has reaped it (join()
        // returns when the thread cleared its tid, a moment before that), unless the id went
        // to another live thread of this test process meanwhile (tests run in parallel), which
        // then rightly resolves to this process.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while thread_group_of(tid).is_some()
            && !std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let reused = std::path::Path::new(&format!("/proc/self/task/{tid}")).exists();
        assert_eq!(thread_group_of(tid), if reused { Some(me) } else { None });
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            done_rx.recv().unwrap();
        });
        let live_tid = rx.recv().unwrap();
        assert_ne!(live_tid, me);
        assert_eq!(thread_group_of(live_tid), Some(me));
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }

    /// `/proc/mounts` lines of the CI machine for tracefs and securityfs.
    const CI_MOUNTS: &str = "tracefs /sys/kernel/tracing tracefs rw,relatime 0 0\n\
                             securityfs /sys/kernel/security securityfs rw,relatime 0 0\n";
    /// `/sys/kernel/security/lockdown` on the CI machine and on the GPU host.
    const LOCKDOWN: &str = "none [integrity] confidentiality\n";
    /// `/proc/driver/nvidia/version` on the GPU host (tests/fixtures/host.txt).
    const GPU_NV_VERSION: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";

    #[test]
    fn lsm_lockdown_and_mounts_parse() {
        assert_eq!(
            lsm_list("lockdown,capability,landlock,bpf\n"),
            ["lockdown", "capability", "landlock", "bpf"]
        );
        assert_eq!(lsm_list("capability,selinux,"), ["capability", "selinux"]);
        assert_eq!(lockdown_level(LOCKDOWN).as_deref(), Some("integrity"));
        assert_eq!(
            lockdown_level("[none] integrity confidentiality").as_deref(),
            Some("none")
        );
        assert_eq!(lockdown_level("garbage"), None);
        assert_eq!(tracefs_mounts(CI_MOUNTS), ["/sys/kernel/tracing"]);
        assert!(tracefs_mounts("proc /proc proc rw 0 0\n").is_empty());
    }

    #[test]
    fn filter_function_lists_parse() {
        let text = "vfs_read\nkfd_ioctl [amdgpu]\nffffffff81000000 init_mqd [amdgpu]\n";
        let m = listed_functions(
            text,
            &["vfs_read", "kfd_ioctl", "init_mqd", "nvidia_unlocked_ioctl"],
        );
        assert!(m["vfs_read"] && m["kfd_ioctl"] && m["init_mqd"]);
        assert!(!m["nvidia_unlocked_ioctl"]);
    }

    #[test]
    fn nvidia_version_text_gives_flavour_and_version() {
        assert_eq!(
            nvidia_flavour(GPU_NV_VERSION),
            (Some("open"), Some("580.159.04".into()))
        );
        let prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n";
        assert_eq!(
            nvidia_flavour(prop),
            (Some("proprietary"), Some("550.54.14".into()))
        );
    }

    #[test]
    fn dev_null_is_char_device_1_3() {
        let dev = char_device_kernel_dev(Path::new("/dev/null")).unwrap();
        assert_eq!(dev, gpu_trace_common::kernel_dev(1, 3));
        assert!(char_device_kernel_dev(Path::new("/proc/self/status")).is_err());
        let node = char_device(Path::new("/dev/null")).unwrap();
        assert_eq!((node.major, node.minor), (1, 3));
    }
}
