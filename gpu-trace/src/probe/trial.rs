//! Trial loads: does this kernel let a program of a given attach type load and attach?
//!
//! Each trial loads the smallest valid program (`r0 = 0; exit`) of one program type through
//! `bpf(2)` directly, attaches it the way a tracer would (raw tracepoint open, perf event +
//! `PERF_EVENT_IOC_SET_BPF`, or a BPF link for trampolines and LSM), and detaches it at once by
//! closing the file descriptors. Nothing is pinned; nothing stays attached after the call.
//!
//! These are independent of gpu-trace's own programs on purpose: `gpu-trace doctor` uses them to
//! tell *which* kernel facility is refused and with which errno, where a failed load of the real
//! programs would only say that something was.

use std::{
    ffi::CString,
    fmt, fs, io, mem,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use aya::Btf;
use aya_obj::{
    btf::BtfKind,
    generated::{
        PERF_EVENT_IOC_SET_BPF, PERF_FLAG_FD_CLOEXEC, bpf_attach_type, bpf_attr, bpf_cmd,
        bpf_prog_type, perf_event_attr, perf_type_id,
    },
};

/// `ENOTSUPP` (kernel-internal, 524): what trampoline attach returns where the architecture or
/// kernel cannot build one.
pub const ENOTSUPP: i32 = 524;

/// Where the kprobe PMU publishes its perf event type.
pub const KPROBE_PMU_TYPE: &str = "/sys/bus/event_source/devices/kprobe/type";

/// A hook to try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrialHook {
    /// `raw_tp/<tracepoint>` (BPF_PROG_TYPE_RAW_TRACEPOINT).
    RawTracepoint(&'static str),
    /// `tp_btf/<tracepoint>` (BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP; needs vmlinux BTF).
    BtfTracepoint(&'static str),
    /// Classic tracepoint `<category>:<name>` (perf event; needs tracefs).
    Tracepoint {
        category: &'static str,
        name: &'static str,
    },
    /// `kprobe/<symbol>` through the kprobe PMU.
    Kprobe(&'static str),
    /// `fentry/<function>` of vmlinux (a BPF trampoline).
    Fentry(&'static str),
    /// `fexit/<function>` of vmlinux (a BPF trampoline).
    Fexit(&'static str),
    /// `lsm/<hook>` (BPF LSM; a trampoline on `bpf_lsm_<hook>`).
    Lsm(&'static str),
}

impl fmt::Display for TrialHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RawTracepoint(tp) => write!(f, "raw_tp/{tp}"),
            Self::BtfTracepoint(tp) => write!(f, "tp_btf/{tp}"),
            Self::Tracepoint { category, name } => write!(f, "tracepoint/{category}:{name}"),
            Self::Kprobe(sym) => write!(f, "kprobe/{sym}"),
            Self::Fentry(func) => write!(f, "fentry/{func}"),
            Self::Fexit(func) => write!(f, "fexit/{func}"),
            Self::Lsm(hook) => write!(f, "lsm/{hook}"),
        }
    }
}

/// How far a trial got before it was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Before any `bpf(2)` call: a BTF id, a tracefs event id or the kprobe PMU was missing.
    Prepare,
    /// `BPF_PROG_LOAD` refused the program.
    Load,
    /// The program loaded; attaching it was refused.
    Attach,
}

/// Why a trial failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub stage: Stage,
    /// The errno of the refused call (none for [`Stage::Prepare`] failures that are not calls).
    pub errno: Option<i32>,
    /// What was missing or refused, in words (the verifier's first line when it wrote one).
    pub detail: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match self.stage {
            Stage::Prepare => "before loading",
            Stage::Load => "loading",
            Stage::Attach => "attaching",
        };
        write!(f, "{stage}: ")?;
        if let Some(errno) = self.errno {
            write!(f, "{}", errno_name(errno))?;
            if !self.detail.is_empty() {
                write!(f, " ({})", self.detail)?;
            }
            Ok(())
        } else {
            write!(f, "{}", self.detail)
        }
    }
}

/// The symbolic name of an errno value as the kernel returns it (`EPERM`, `ENOTSUPP` …).
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EBADF => "EBADF",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::E2BIG => "E2BIG",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        ENOTSUPP => "ENOTSUPP",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

fn refused(stage: Stage, err: &io::Error, detail: impl Into<String>) -> Refusal {
    Refusal {
        stage,
        errno: err.raw_os_error(),
        detail: detail.into(),
    }
}

fn missing(detail: impl Into<String>) -> Refusal {
    Refusal {
        stage: Stage::Prepare,
        errno: None,
        detail: detail.into(),
    }
}

/// `r0 = 0; exit`: valid for every program type tried here (LSM and tracing programs must
/// return 0, which also means "allow" for an LSM hook).
const RETURN_ZERO: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];

const LOG_SIZE: usize = 4096;

/// `bpf(cmd, attr)`: the command's return value (a new fd, or 0), or the errno. `attr` must be
/// a valid, zero-initialised `bpf_attr` with the command's member filled in.
pub(crate) fn bpf_syscall(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<i64> {
    // SAFETY: `attr` is a valid bpf_attr of the size passed; the kernel reads (and for some
    // commands writes) only the command's member.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_int,
            attr as *mut bpf_attr,
            mem::size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// `bpf(cmd, attr)` for a command that returns a new file descriptor (PROG_LOAD,
/// RAW_TRACEPOINT_OPEN, BTF_GET_FD_BY_ID, ...).
pub(crate) fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    let fd = bpf_syscall(cmd, attr)?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

struct LoadSpec {
    prog_type: bpf_prog_type,
    attach_type: Option<bpf_attach_type>,
    attach_btf_id: u32,
}

fn load(spec: &LoadSpec) -> Result<OwnedFd, Refusal> {
    let license = c"GPL";
    let mut log = vec![0u8; LOG_SIZE];
    // SAFETY: all-zero is a valid bpf_attr.
    let mut attr: bpf_attr = unsafe { mem::zeroed() };
    // SAFETY: writing the PROG_LOAD member of the union, which is what BPF_PROG_LOAD reads.
    let u = unsafe { &mut attr.__bindgen_anon_3 };
    u.prog_type = spec.prog_type as u32;
    u.insn_cnt = RETURN_ZERO.len() as u32;
    u.insns = RETURN_ZERO.as_ptr() as u64;
    u.license = license.as_ptr() as u64;
    u.log_level = 1;
    u.log_size = LOG_SIZE as u32;
    u.log_buf = log.as_mut_ptr() as u64;
    for (dst, src) in u.prog_name.iter_mut().zip(b"gt_doctor") {
        *dst = *src as libc::c_char;
    }
    if let Some(attach) = spec.attach_type {
        u.expected_attach_type = attach as u32;
    }
    u.attach_btf_id = spec.attach_btf_id;
    sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr).map_err(|e| {
        let text = String::from_utf8_lossy(&log);
        let first = text
            .split('\0')
            .next()
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default();
        refused(Stage::Load, &e, first.trim())
    })
}

fn raw_tracepoint_open(prog: &OwnedFd, name: Option<&CString>) -> Result<OwnedFd, Refusal> {
    // SAFETY: all-zero is a valid bpf_attr.
    let mut attr: bpf_attr = unsafe { mem::zeroed() };
    attr.raw_tracepoint.name = name.map_or(0, |n| n.as_ptr() as u64);
    attr.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
    sys_bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr).map_err(|e| refused(Stage::Attach, &e, ""))
}

/// Opens a perf event (`type_`, `config`, and `config1` for the kprobe PMU's symbol name) on
/// CPU 0 for every process, and attaches `prog` to it.
fn perf_attach(
    prog: &OwnedFd,
    type_: u32,
    config: u64,
    symbol: Option<&CString>,
) -> Result<OwnedFd, Refusal> {
    // SAFETY: all-zero is a valid perf_event_attr.
    let mut attr: perf_event_attr = unsafe { mem::zeroed() };
    attr.type_ = type_;
    attr.size = mem::size_of::<perf_event_attr>() as u32;
    attr.config = config;
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_2.wakeup_events = 1;
    if let Some(sym) = symbol {
        attr.__bindgen_anon_3.config1 = sym.as_ptr() as u64;
    }
    // SAFETY: a valid perf_event_attr; pid -1 / cpu 0 / no group.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const perf_event_attr,
            -1,
            0,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(refused(Stage::Attach, &e, "perf_event_open"));
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    let event = unsafe { OwnedFd::from_raw_fd(rc as i32) };
    // SAFETY: PERF_EVENT_IOC_SET_BPF takes the program fd as its argument.
    let rc = unsafe {
        libc::ioctl(
            event.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF as _,
            prog.as_raw_fd(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(refused(Stage::Attach, &e, "PERF_EVENT_IOC_SET_BPF"));
    }
    Ok(event)
}

fn btf_id(btf: Option<&Btf>, name: &str, kind: BtfKind) -> Result<u32, Refusal> {
    let btf = btf.ok_or_else(|| missing("no kernel BTF (/sys/kernel/btf/vmlinux)"))?;
    btf.id_by_type_name_kind(name, kind)
        .map_err(|_| missing(format!("{name} is not in the kernel's BTF")))
}

/// Where the classic tracepoint's id is, under a tracefs mount point.
fn tracepoint_id(tracefs: Option<&str>, category: &str, name: &str) -> Result<u64, Refusal> {
    let dir = tracefs.ok_or_else(|| missing("tracefs is not mounted"))?;
    let path = format!("{dir}/events/{category}/{name}/id");
    let text = fs::read_to_string(&path)
        .map_err(|e| refused(Stage::Prepare, &e, format!("reading {path}")))?;
    text.trim()
        .parse()
        .map_err(|_| missing(format!("{path} does not hold a number")))
}

/// The kprobe PMU's perf event type, if the kernel has one.
pub fn kprobe_pmu_type() -> Option<u32> {
    fs::read_to_string(KPROBE_PMU_TYPE)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Loads and attaches a trivial program on `hook`, then detaches it. `btf` is the kernel's BTF
/// (needed by tp_btf, fentry/fexit and LSM); `tracefs` the tracefs mount point (classic
/// tracepoints).
pub fn try_hook(hook: TrialHook, btf: Option<&Btf>, tracefs: Option<&str>) -> Result<(), Refusal> {
    use bpf_attach_type::*;
    use bpf_prog_type::*;
    let cstr = |s: &str| CString::new(s).expect("hook names have no NUL");
    match hook {
        TrialHook::RawTracepoint(tp) => {
            let prog = load(&LoadSpec {
                prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
                attach_type: None,
                attach_btf_id: 0,
            })?;
            raw_tracepoint_open(&prog, Some(&cstr(tp))).map(drop)
        }
        TrialHook::BtfTracepoint(tp) => btf_attached(
            btf,
            &format!("btf_trace_{tp}"),
            BtfKind::Typedef,
            BPF_PROG_TYPE_TRACING,
            BPF_TRACE_RAW_TP,
        ),
        TrialHook::Tracepoint { category, name } => {
            let id = tracepoint_id(tracefs, category, name)?;
            let prog = load(&LoadSpec {
                prog_type: BPF_PROG_TYPE_TRACEPOINT,
                attach_type: None,
                attach_btf_id: 0,
            })?;
            perf_attach(&prog, perf_type_id::PERF_TYPE_TRACEPOINT as u32, id, None).map(drop)
        }
        TrialHook::Kprobe(symbol) => {
            let pmu = kprobe_pmu_type()
                .ok_or_else(|| missing(format!("no kprobe PMU ({KPROBE_PMU_TYPE} is missing)")))?;
            let prog = load(&LoadSpec {
                prog_type: BPF_PROG_TYPE_KPROBE,
                attach_type: None,
                attach_btf_id: 0,
            })?;
            perf_attach(&prog, pmu, 0, Some(&cstr(symbol))).map(drop)
        }
        TrialHook::Fentry(func) => btf_attached(
            btf,
            func,
            BtfKind::Func,
            BPF_PROG_TYPE_TRACING,
            BPF_TRACE_FENTRY,
        ),
        TrialHook::Fexit(func) => btf_attached(
            btf,
            func,
            BtfKind::Func,
            BPF_PROG_TYPE_TRACING,
            BPF_TRACE_FEXIT,
        ),
        TrialHook::Lsm(hook) => btf_attached(
            btf,
            &format!("bpf_lsm_{hook}"),
            BtfKind::Func,
            BPF_PROG_TYPE_LSM,
            BPF_LSM_MAC,
        ),
    }
}

/// Loads a program typed by the BTF type `name` (a BPF trampoline, BTF tracepoint or LSM hook)
/// and attaches it through a BPF link.
fn btf_attached(
    btf: Option<&Btf>,
    name: &str,
    kind: BtfKind,
    prog_type: bpf_prog_type,
    attach_type: bpf_attach_type,
) -> Result<(), Refusal> {
    let id = btf_id(btf, name, kind)?;
    let prog = load(&LoadSpec {
        prog_type,
        attach_type: Some(attach_type),
        attach_btf_id: id,
    })?;
    raw_tracepoint_open(&prog, None).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_stage_and_the_errno() {
        let r = Refusal {
            stage: Stage::Load,
            errno: Some(libc::EPERM),
            detail: String::new(),
        };
        assert_eq!(r.to_string(), "loading: EPERM");
        let r = Refusal {
            stage: Stage::Attach,
            errno: Some(ENOTSUPP),
            detail: "x".into(),
        };
        assert_eq!(r.to_string(), "attaching: ENOTSUPP (x)");
        let r = missing("no kprobe PMU");
        assert_eq!(r.to_string(), "before loading: no kprobe PMU");
        assert_eq!(errno_name(12345), "errno 12345");
    }

    #[test]
    fn the_trial_program_is_r0_0_exit() {
        // BPF_ALU64 | BPF_MOV | BPF_K (0xb7), dst r0, imm 0; then BPF_JMP | BPF_EXIT (0x95).
        let bytes: Vec<u8> = RETURN_ZERO.iter().flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(
            bytes,
            [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn missing_btf_is_refused_before_any_call() {
        let r = try_hook(TrialHook::Lsm("file_ioctl"), None, None).unwrap_err();
        assert_eq!(r.stage, Stage::Prepare);
        let r = try_hook(
            TrialHook::Tracepoint {
                category: "syscalls",
                name: "sys_exit_ioctl",
            },
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(
            (r.stage, r.detail.as_str()),
            (Stage::Prepare, "tracefs is not mounted")
        );
    }
}
