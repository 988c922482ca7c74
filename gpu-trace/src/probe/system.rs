//! Facts about the running system that decide whether and how gpu-trace can attach:
//! privileges, tracefs, device numbers, driver versions.

use std::{fs, io, path::Path};

use thiserror::Error;

/// Linux capability numbers (`include/uapi/linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, Error)]
pub enum SystemError {
    #[error(
        "gpu-trace needs root, or the capabilities CAP_BPF and CAP_PERFMON (missing: {missing}). \
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
    #[error("{path} is not a character device; --watch-device needs one (e.g. /dev/null)")]
    NotACharDevice { path: String },
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

/// The kernel `dev_t` (`major << 20 | minor`) of a character device node.
pub fn char_device_kernel_dev(path: &Path) -> Result<u32, SystemError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = fs::metadata(path).map_err(|source| SystemError::Read {
        path: path.display().to_string(),
        source,
    })?;
    if !meta.file_type().is_char_device() {
        return Err(SystemError::NotACharDevice {
            path: path.display().to_string(),
        });
    }
    let rdev = meta.rdev();
    Ok(gpu_trace_common::kernel_dev(
        libc::major(rdev),
        libc::minor(rdev),
    ))
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

/// The thread-group id (process id) of a task id, if it exists.
pub fn thread_group_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `uname -r`.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The loaded NVIDIA kernel module's version and flavour ("open" or "proprietary"), if any.
pub fn nvidia_driver() -> Option<String> {
    let version = fs::read_to_string("/sys/module/nvidia/version").ok()?;
    let flavour = match fs::read_to_string("/proc/driver/nvidia/version") {
        Ok(v) if v.contains("Open Kernel Module") => "open",
        Ok(_) => "proprietary",
        Err(_) => "unknown flavour",
    };
    Some(format!("nvidia {} ({flavour})", version.trim()))
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
        // The thread has exited: it no longer resolves.
        assert_eq!(thread_group_of(tid), None);
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

    #[test]
    fn dev_null_is_char_device_1_3() {
        let dev = char_device_kernel_dev(Path::new("/dev/null")).unwrap();
        assert_eq!(dev, gpu_trace_common::kernel_dev(1, 3));
        assert!(char_device_kernel_dev(Path::new("/proc/self/status")).is_err());
    }
}
