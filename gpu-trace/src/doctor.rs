//! `gpu-trace doctor`: what this machine allows, per vendor and per hook, and why not where it
//! does not — each "no" names the fix — then whether tracing and `--deny-pid` can work.
//!
//! Two halves:
//! - [`Facts::gather`] reads the system (privileges, BTF, tracefs, LSMs, lockdown, kprobes,
//!   kallsyms, ftrace's function list, driver versions and device nodes), tries each hook for
//!   real with a trivial program ([`crate::probe::trial`]), and loads gpu-trace's own programs
//!   the way `gpu-trace` would;
//! - [`evaluate`] turns those facts into the table and the two verdicts. It is pure, and tested
//!   on text captured on the CI machine and on the GPU host.
//!
//! Exit status ([`Report::exit_code`]): 0 when tracing and `--deny-pid` can both work, 5 when
//! tracing can but `--deny-pid` cannot, 3 when tracing cannot.

use std::{collections::BTreeMap, fmt::Write as _, fs, os::fd::AsRawFd, path::Path};

use serde::Serialize;

use crate::{
    loader::{LoadOptions, Tracer},
    probe::{
        btf, system,
        trial::{self, Refusal, Stage, TrialHook},
    },
};

/// Exit status of `gpu-trace doctor`.
pub mod exit {
    /// Tracing and `--deny-pid` can both work.
    pub const READY: u8 = 0;
    /// Tracing cannot work (the same code `gpu-trace` exits with when the system cannot support
    /// it).
    pub const UNSUPPORTED: u8 = 3;
    /// Tracing can work; `--deny-pid` cannot.
    pub const NO_DENY: u8 = 5;
}

/// The vmlinux function the kprobe and trampoline trials attach to: present and traceable on
/// every kernel, and harmless to probe for a moment.
pub const PROBE_FUNCTION: &str = "vfs_read";
/// The LSM hook `--deny-pid` uses.
pub const LSM_HOOK: &str = "file_ioctl";

/// The ioctl entry point of the NVIDIA kernel module (its only traceable function with BTF).
pub const NVIDIA_ENTRY: &str = "nvidia_unlocked_ioctl";
/// The RM core's ioctl handler: in kallsyms, never in BTF.
pub const NVIDIA_RM_CORE: &str = "rm_ioctl";
/// KFD's ioctl entry point.
pub const KFD_ENTRY: &str = "kfd_ioctl";
/// KFD functions gpu-trace's deep hooks use (one of each group: handlers, the device queue
/// manager, teardown, MQD builders); `init_mqd` exists once per GFX generation.
pub const KFD_DEEP: [&str; 4] = [
    "kfd_ioctl_create_queue",
    "create_queue_cpsch",
    "pqm_uninit",
    "init_mqd",
];

/// Every symbol doctor looks up in kallsyms and ftrace's function list.
pub fn symbols_of_interest() -> Vec<&'static str> {
    let mut v = vec![
        PROBE_FUNCTION,
        "bpf_lsm_file_ioctl",
        NVIDIA_ENTRY,
        NVIDIA_RM_CORE,
        KFD_ENTRY,
        GPU_EXT_HOOK,
    ];
    v.extend(KFD_DEEP);
    v
}

/// The first of gpu_ext's scheduling hooks (a patched NVIDIA driver defines it).
pub const GPU_EXT_HOOK: &str = gpu_trace_common::nvidia::gpu_ext::FUNCTIONS[0];

/// NVIDIA's character-device major (`/proc/devices`: `nvidia`, `nvidiactl` on the 580 open module).
pub const NV_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NV_CTL_MINOR: u32 = 255;

// ---------------------------------------------------------------------------------------------
// Facts
// ---------------------------------------------------------------------------------------------

/// A device node and its numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DevNode {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// What doctor found in a module's BTF (`/sys/kernel/btf/<module>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleBtf {
    pub present: bool,
    /// Names looked for, and whether the module's BTF strings hold them.
    pub names: BTreeMap<String, bool>,
}

/// How gpu-trace's own programs fared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TracerLoad {
    /// Loaded and attached: one line per hook (`ioctl+close → raw_tp/sys_exit`).
    Attached(Vec<String>),
    /// Refused, with gpu-trace's own error message (which says what to do).
    Failed(String),
    /// Not tried (why).
    NotTried(String),
}

/// Everything doctor observed. Filled by [`Facts::gather`]; tests build it from captured text.
#[derive(Clone, Debug)]
pub struct Facts {
    pub kernel: String,
    pub arch: String,
    pub euid: u32,
    /// CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN ([`system::check_privileges`]).
    pub privileged: bool,
    /// vmlinux BTF: its size in bytes, or why it cannot be read.
    pub vmlinux_btf: Result<u64, String>,
    /// Whether the task/file offsets gpu-trace needs resolve in that BTF.
    pub offsets: Result<(), String>,
    pub nvidia_btf: ModuleBtf,
    pub amdgpu_btf: ModuleBtf,
    /// `/proc/mounts` as read before doctor mounted anything.
    pub mounts: String,
    /// Where tracefs is usable after doctor made sure it is mounted (as gpu-trace does).
    pub tracefs: Result<String, String>,
    /// `/sys/kernel/security/lsm`.
    pub lsm: Result<String, String>,
    /// `/sys/kernel/security/lockdown`.
    pub lockdown: Result<String, String>,
    /// The kprobe PMU's perf type.
    pub kprobe_pmu: Option<u32>,
    /// tracefs `kprobe_events` exists.
    pub kprobe_events: bool,
    /// Copies of each symbol of interest in `/proc/kallsyms` (the module name, or `None` for
    /// vmlinux), or why kallsyms could not be read.
    pub kallsyms: Result<BTreeMap<String, Vec<Option<String>>>, String>,
    /// Which symbols of interest ftrace lists in `available_filter_functions`, or why it could
    /// not be read (typically EPERM).
    pub filter_functions: Result<BTreeMap<String, bool>, String>,
    /// `/proc/devices`.
    pub proc_devices: String,
    pub nvidia_module: bool,
    /// `/proc/driver/nvidia/version`.
    pub nvidia_version: Option<String>,
    /// `/dev/nvidiactl` and `/dev/nvidia<N>`.
    pub nvidia_nodes: Vec<DevNode>,
    pub amdgpu_module: bool,
    pub kfd_node: Option<DevNode>,
    /// `AMDKFD_IOC_GET_VERSION` on `/dev/kfd` (major, minor), when the node exists.
    pub kfd_version: Option<Result<(u32, u32), String>>,
    /// GPU nodes in the KFD topology (`/sys/class/kfd/kfd/topology/nodes/*/gpu_id` ≠ 0).
    pub kfd_gpus: Option<usize>,
    /// The trial of each hook.
    pub trials: Vec<(TrialHook, Result<(), Refusal>)>,
    /// gpu-trace's own programs, loaded as `gpu-trace` would.
    pub tracer: TracerLoad,
    /// gpu-trace's programs with `--deny-pid` (of doctor itself): `None` when not tried.
    pub deny_load: Option<Result<(), String>>,
}

fn read_trimmed(path: &str) -> Result<String, String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("cannot read {path}: {e}"))
}

fn dev_node(path: &str) -> Option<DevNode> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = fs::metadata(path).ok()?;
    if !meta.file_type().is_char_device() {
        return None;
    }
    let rdev = meta.rdev();
    Some(DevNode {
        path: path.into(),
        major: libc::major(rdev),
        minor: libc::minor(rdev),
    })
}

fn module_btf(module: &str, names: &[&str]) -> ModuleBtf {
    match fs::read(format!("/sys/kernel/btf/{module}")) {
        Ok(bytes) => ModuleBtf {
            present: true,
            names: names
                .iter()
                .map(|n| (n.to_string(), btf_strings_contain(&bytes, n)))
                .collect(),
        },
        Err(_) => ModuleBtf {
            present: false,
            names: BTreeMap::new(),
        },
    }
}

/// Whether a BTF blob's bytes hold `name` as a whole NUL-terminated string (a split module BTF
/// stores the names of the module's own functions in its string section).
pub fn btf_strings_contain(bytes: &[u8], name: &str) -> bool {
    let mut needle = Vec::with_capacity(name.len() + 2);
    needle.push(0);
    needle.extend_from_slice(name.as_bytes());
    needle.push(0);
    bytes.windows(needle.len()).any(|w| w == needle.as_slice())
}

fn kfd_version(node: &DevNode) -> Result<(u32, u32), String> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&node.path)
        .map_err(|e| format!("opening {}: {e}", node.path))?;
    let mut args = [0u32; 2];
    // SAFETY: AMDKFD_IOC_GET_VERSION writes two u32 (major, minor) into `args`.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            gpu_trace_common::amd::cmd::GET_VERSION as libc::Ioctl,
            args.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(format!(
            "AMDKFD_IOC_GET_VERSION: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((args[0], args[1]))
}

fn kfd_gpus() -> Option<usize> {
    let nodes = fs::read_dir("/sys/class/kfd/kfd/topology/nodes").ok()?;
    Some(
        nodes
            .flatten()
            .filter(|n| {
                fs::read_to_string(n.path().join("gpu_id"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .is_some_and(|id| id != 0)
            })
            .count(),
    )
}

/// The trials doctor runs, in table order. Kprobe trials on driver functions are added by
/// [`Facts::gather`] when the driver is loaded.
pub fn base_trials() -> Vec<TrialHook> {
    vec![
        TrialHook::RawTracepoint("sys_exit"),
        TrialHook::BtfTracepoint("sys_exit"),
        TrialHook::Tracepoint {
            category: "syscalls",
            name: "sys_exit_ioctl",
        },
        TrialHook::RawTracepoint("sched_process_exit"),
        TrialHook::Kprobe(PROBE_FUNCTION),
        TrialHook::Fentry(PROBE_FUNCTION),
        TrialHook::Fexit(PROBE_FUNCTION),
        TrialHook::Lsm(LSM_HOOK),
    ]
}

impl Facts {
    /// Reads the system and tries every hook. Needs root for most answers; without it, the
    /// answers say so. Mounts tracefs and securityfs when they are not mounted, as gpu-trace
    /// itself does.
    pub fn gather() -> Facts {
        let privileged = system::check_privileges().is_ok();
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();

        let vmlinux_btf = fs::metadata(btf::VMLINUX_BTF_PATH)
            .map(|m| m.len())
            .map_err(|e| format!("{}: {e}", btf::VMLINUX_BTF_PATH));
        let offsets = btf::load_kernel_offsets()
            .map(drop)
            .map_err(|e| e.to_string());
        let kernel_btf = aya::Btf::from_sys_fs().ok();

        let tracefs = system::ensure_tracefs()
            .map(str::to_string)
            .map_err(|e| e.to_string());
        // Mounts securityfs when it is not mounted (as --deny-pid does), so lockdown is readable too.
        let lsm = system::active_lsms().map_err(|e| e.to_string());
        let lockdown = read_trimmed("/sys/kernel/security/lockdown");
        let tracefs_dir = tracefs.as_ref().ok().cloned();

        let names = symbols_of_interest();
        let kallsyms = fs::read_to_string("/proc/kallsyms")
            .map(|text| count_symbols(&text, &names))
            .map_err(|e| format!("cannot read /proc/kallsyms: {e}"));
        let filter_functions = match &tracefs_dir {
            Some(dir) => {
                let path = format!("{dir}/available_filter_functions");
                fs::read_to_string(&path)
                    .map(|text| listed_functions(&text, &names))
                    .map_err(|e| format!("cannot read {path}: {}", describe_io(&e)))
            }
            None => Err("tracefs is not mounted".into()),
        };
        let kprobe_events = tracefs_dir
            .as_ref()
            .is_some_and(|dir| Path::new(&format!("{dir}/kprobe_events")).exists());

        let nvidia_nodes: Vec<DevNode> = std::iter::once("/dev/nvidiactl".to_string())
            .chain((0..64).map(|i| format!("/dev/nvidia{i}")))
            .filter_map(|p| dev_node(&p))
            .collect();
        let kfd_node = dev_node("/dev/kfd");
        let kfd_version = kfd_node.as_ref().map(kfd_version);

        let mut hooks = base_trials();
        let syms = kallsyms.as_ref().ok();
        let loaded = |name: &str| syms.is_some_and(|s| s.get(name).is_some_and(|c| !c.is_empty()));
        if loaded(NVIDIA_ENTRY) {
            hooks.push(TrialHook::Kprobe(NVIDIA_ENTRY));
        }
        if loaded(KFD_ENTRY) {
            hooks.push(TrialHook::Kprobe(KFD_ENTRY));
        }
        let trials = hooks
            .into_iter()
            .map(|h| {
                (
                    h,
                    trial::try_hook(h, kernel_btf.as_ref(), tracefs_dir.as_deref()),
                )
            })
            .collect::<Vec<_>>();

        let tracer = if privileged {
            match Tracer::load(&LoadOptions::default()) {
                Ok(t) => TracerLoad::Attached(t.hooks.iter().map(ToString::to_string).collect()),
                Err(e) => TracerLoad::Failed(e.to_string()),
            }
        } else {
            TracerLoad::NotTried("needs root (or CAP_BPF and CAP_PERFMON)".into())
        };
        let lsm_trial_ok = trials
            .iter()
            .any(|(h, r)| matches!(h, TrialHook::Lsm(_)) && r.is_ok());
        let deny_load = (matches!(tracer, TracerLoad::Attached(_)) && lsm_trial_ok).then(|| {
            let options = LoadOptions {
                deny_pids: vec![std::process::id()],
                ..LoadOptions::default()
            };
            Tracer::load(&options).map(drop).map_err(|e| e.to_string())
        });

        Facts {
            kernel: system::kernel_release(),
            arch: std::env::consts::ARCH.to_string(),
            euid,
            privileged,
            vmlinux_btf,
            offsets,
            nvidia_btf: module_btf("nvidia", &[NVIDIA_ENTRY]),
            amdgpu_btf: module_btf(
                "amdgpu",
                &[
                    KFD_ENTRY,
                    "kfd_ioctl_create_queue",
                    "create_queue_cpsch",
                    "pqm_uninit",
                ],
            ),
            mounts,
            tracefs,
            lsm,
            lockdown,
            kprobe_pmu: trial::kprobe_pmu_type(),
            kprobe_events,
            kallsyms,
            filter_functions,
            proc_devices: fs::read_to_string("/proc/devices").unwrap_or_default(),
            nvidia_module: Path::new("/sys/module/nvidia").exists(),
            nvidia_version: fs::read_to_string("/proc/driver/nvidia/version").ok(),
            nvidia_nodes,
            amdgpu_module: Path::new("/sys/module/amdgpu").exists(),
            kfd_node,
            kfd_version,
            kfd_gpus: kfd_gpus(),
            trials,
            tracer,
            deny_load,
        }
    }
}

fn describe_io(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(errno) => format!("{} ({e})", trial::errno_name(errno)),
        None => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing (pure)
// ---------------------------------------------------------------------------------------------

/// Character devices of `/proc/devices`: (major, name), in file order.
pub fn char_devices(proc_devices: &str) -> Vec<(u32, String)> {
    proc_devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Block devices"))
        .filter_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            Some((major.parse().ok()?, name.trim().to_string()))
        })
        .collect()
}

/// The LSMs of `/sys/kernel/security/lsm` (comma-separated, maybe with a trailing comma).
pub fn lsm_list(text: &str) -> Vec<String> {
    text.trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The selected lockdown level of `/sys/kernel/security/lockdown` (`none [integrity]
/// confidentiality` → `integrity`).
pub fn lockdown_level(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_string())
}

/// Mount points of tracefs in a `/proc/mounts` text.
pub fn tracefs_mounts(mounts: &str) -> Vec<String> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "tracefs").then(|| dir.to_string())
        })
        .collect()
}

/// For each name, the copies `/proc/kallsyms` lists (module name, `None` for vmlinux).
pub fn count_symbols(kallsyms: &str, names: &[&str]) -> BTreeMap<String, Vec<Option<String>>> {
    let mut out: BTreeMap<String, Vec<Option<String>>> =
        names.iter().map(|n| (n.to_string(), Vec::new())).collect();
    for line in kallsyms.lines() {
        let mut f = line.split_whitespace();
        let (Some(_addr), Some(kind), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        // Only code: t/T (text); skip data symbols that share a name.
        if !matches!(kind, "t" | "T") {
            continue;
        }
        if let Some(copies) = out.get_mut(name) {
            let module = f
                .next()
                .map(|m| m.trim_matches(|c| c == '[' || c == ']').to_string());
            copies.push(module);
        }
    }
    out
}

/// For each name, whether ftrace's `available_filter_functions` lists it (lines are `name` or
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

/// `open` or `proprietary`, and the version, from `/proc/driver/nvidia/version`.
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

// ---------------------------------------------------------------------------------------------
// Evaluation (pure)
// ---------------------------------------------------------------------------------------------

/// Which part of the machine a row is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Scope {
    #[serde(rename = "system")]
    System,
    #[serde(rename = "NVIDIA")]
    Nvidia,
    #[serde(rename = "AMD")]
    Amd,
}

impl Scope {
    fn label(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Nvidia => "NVIDIA",
            Self::Amd => "AMD",
        }
    }
}

/// The answer of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Yes,
    No,
    /// A fact, neither good nor bad (kernel version, LSM list).
    Info,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Yes => "yes",
            Self::No => "no",
            Self::Info => "-",
        }
    }
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    pub scope: Scope,
    pub check: String,
    pub status: Status,
    pub why: String,
    /// What to do about a "no" (always set for [`Status::No`]).
    pub fix: Option<String>,
}

/// Whether something can work, why, and what to do when it cannot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub ok: bool,
    pub why: String,
    pub fix: Option<String>,
}

/// The table and the verdicts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub kernel: String,
    pub arch: String,
    pub rows: Vec<Row>,
    pub tracing: Verdict,
    pub deny: Verdict,
    pub exit_code: u8,
}

/// Names of the hook rows, per vendor, in table order.
pub mod hook {
    pub const RAW_TP: &str = "raw_tp sys_exit";
    pub const TP_BTF: &str = "tp_btf sys_exit";
    pub const SYSCALL_TPS: &str = "syscalls tracepoints";
    pub const PROCESS_EXIT: &str = "sched_process_exit";
    pub const KPROBE: &str = "kprobe";
    pub const FENTRY: &str = "fentry/fexit";
    pub const LSM: &str = "BPF LSM";
}

fn yes(scope: Scope, check: &str, why: impl Into<String>) -> Row {
    Row {
        scope,
        check: check.into(),
        status: Status::Yes,
        why: why.into(),
        fix: None,
    }
}

fn no(scope: Scope, check: &str, why: impl Into<String>, fix: impl Into<String>) -> Row {
    Row {
        scope,
        check: check.into(),
        status: Status::No,
        why: why.into(),
        fix: Some(fix.into()),
    }
}

fn info(scope: Scope, check: &str, why: impl Into<String>) -> Row {
    Row {
        scope,
        check: check.into(),
        status: Status::Info,
        why: why.into(),
        fix: None,
    }
}

struct Ctx<'a> {
    facts: &'a Facts,
    privileged: bool,
    /// The syscall hook gpu-trace chose (`raw_tp/sys_exit` …), when its programs loaded.
    chosen: Vec<String>,
}

impl Ctx<'_> {
    fn trial(&self, hook: TrialHook) -> Option<&Result<(), Refusal>> {
        self.facts
            .trials
            .iter()
            .find(|(h, _)| *h == hook)
            .map(|(_, r)| r)
    }

    fn symbol_copies(&self, name: &str) -> Option<&Vec<Option<String>>> {
        self.facts.kallsyms.as_ref().ok().and_then(|m| m.get(name))
    }

    fn lsm_active(&self) -> Option<bool> {
        self.facts
            .lsm
            .as_ref()
            .ok()
            .map(|l| lsm_list(l).iter().any(|m| m == "bpf"))
    }
}

/// The fix for a refused trial.
fn trial_fix(ctx: &Ctx<'_>, hook: TrialHook, r: &Refusal) -> String {
    let kind = match hook {
        TrialHook::RawTracepoint(_) => "raw tracepoint",
        TrialHook::BtfTracepoint(_) => "BTF tracepoint",
        TrialHook::Tracepoint { .. } => "tracepoint",
        TrialHook::Kprobe(_) => "kprobe",
        TrialHook::Fentry(_) | TrialHook::Fexit(_) => "fentry/fexit (trampoline)",
        TrialHook::Lsm(_) => "BPF LSM",
    };
    if !ctx.privileged && r.errno == Some(libc::EPERM) {
        return "run as root (sudo gpu-trace doctor)".into();
    }
    match (r.stage, r.errno) {
        (Stage::Prepare, _) if r.detail.contains("kernel BTF") || r.detail.contains("not in the kernel's BTF") => {
            match hook {
                TrialHook::Lsm(_) => "a kernel built with CONFIG_BPF_LSM=y and CONFIG_DEBUG_INFO_BTF=y".into(),
                _ => "a kernel built with CONFIG_DEBUG_INFO_BTF=y".into(),
            }
        }
        (Stage::Prepare, _) if r.detail.contains("kprobe PMU") => {
            "a kernel built with CONFIG_KPROBES=y and CONFIG_KPROBE_EVENTS=y; only the deep driver \
             hooks use it (AMD KFD functions, gpu_ext hooks): without it gpu-trace stays on the \
             ioctl layer"
                .into()
        }
        (Stage::Prepare, _) if r.detail.contains("tracefs is not mounted") => {
            "sudo mount -t tracefs none /sys/kernel/tracing".into()
        }
        (Stage::Prepare, _) => match hook {
            TrialHook::Tracepoint { category: "syscalls", .. } => {
                "a kernel built with CONFIG_FTRACE_SYSCALLS=y (syscall tracepoints)".into()
            }
            _ => format!("a kernel that has this {kind}"),
        },
        (Stage::Load, Some(libc::EPERM)) => format!(
            "a kernel that lets root load {kind} programs (this one refuses them before verification: \
             a policy of the kernel or its sandbox){}",
            match hook {
                TrialHook::Lsm(_) => "; stock kernels with CONFIG_BPF_LSM=y do; only --deny-pid needs it",
                TrialHook::Fentry(_) | TrialHook::Fexit(_) | TrialHook::Kprobe(_) => {
                    "; stock distribution kernels do; only the deep driver hooks use it: without it gpu-trace stays on the ioctl layer"
                }
                _ => "",
            }
        ),
        (Stage::Load, Some(libc::EINVAL)) if matches!(hook, TrialHook::Lsm(_)) => {
            "a kernel built with CONFIG_BPF_LSM=y".into()
        }
        (Stage::Load, Some(libc::EINVAL)) => format!("a newer kernel: this one does not know {kind} programs"),
        (Stage::Attach, Some(trial::ENOTSUPP)) => {
            "a kernel/architecture that can build BPF trampolines (x86-64 from 5.5, arm64 from 6.4, \
             CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS=y)"
                .into()
        }
        (Stage::Attach, Some(libc::ENOENT)) | (Stage::Attach, Some(libc::EINVAL))
            if matches!(hook, TrialHook::Kprobe(_)) =>
        {
            "the function is not probe-able on this kernel (inlined, notrace or blacklisted)".into()
        }
        (_, _) if lockdown_blocks(ctx) => {
            "lockdown=confidentiality blocks BPF tracing; boot with lockdown=integrity (or none)".into()
        }
        _ => format!("the kernel refused the {kind} ({r}); see docs/troubleshooting.md"),
    }
}

fn lockdown_blocks(ctx: &Ctx<'_>) -> bool {
    ctx.facts
        .lockdown
        .as_ref()
        .ok()
        .and_then(|l| lockdown_level(l))
        .is_some_and(|l| l == "confidentiality")
}

fn trial_row(ctx: &Ctx<'_>, scope: Scope, check: &str, hook: TrialHook, used_for: &str) -> Row {
    match ctx.trial(hook) {
        Some(Ok(())) => {
            let chosen = ctx.chosen.iter().any(|c| c.contains(&hook.to_string()));
            let mut why = format!("{hook}: a test program loaded and attached");
            if chosen {
                let _ = write!(why, "; gpu-trace uses it for {used_for}");
            }
            yes(scope, check, why)
        }
        Some(Err(r)) => no(
            scope,
            check,
            format!("{hook} refused, {r}"),
            trial_fix(ctx, hook, r),
        ),
        None => no(
            scope,
            check,
            format!("{hook} was not tried"),
            "run gpu-trace doctor as root",
        ),
    }
}

fn system_rows(ctx: &Ctx<'_>) -> Vec<Row> {
    let f = ctx.facts;
    let s = Scope::System;
    let mut rows = Vec::new();
    rows.push(info(s, "kernel", format!("{} ({})", f.kernel, f.arch)));
    rows.push(if ctx.privileged {
        let who = if f.euid == 0 { "root" } else { "not root, but" };
        yes(s, "privileges", format!("{who} with CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN"))
    } else {
        no(
            s,
            "privileges",
            format!("uid {} without CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN: most answers below are refusals for that reason", f.euid),
            "run as root: sudo gpu-trace doctor (or grant: sudo setcap cap_bpf,cap_perfmon+ep $(which gpu-trace))",
        )
    });
    rows.push(match (&f.vmlinux_btf, &f.offsets) {
        (Ok(bytes), Ok(())) => yes(
            s,
            "vmlinux BTF",
            format!(
                "{} ({} KiB); the task/file offsets gpu-trace needs resolve",
                btf::VMLINUX_BTF_PATH,
                bytes / 1024
            ),
        ),
        (Ok(_), Err(e)) => no(
            s,
            "vmlinux BTF",
            format!("present, but {e}"),
            "report it with `uname -r` (docs/troubleshooting.md)",
        ),
        (Err(e), _) => no(
            s,
            "vmlinux BTF",
            e.clone(),
            "a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distribution kernels since 5.x)",
        ),
    });
    for (module, mb) in [("nvidia", &f.nvidia_btf), ("amdgpu", &f.amdgpu_btf)] {
        let check = format!("module BTF {module}");
        let loaded = if module == "nvidia" {
            f.nvidia_module
        } else {
            f.amdgpu_module
        };
        rows.push(if mb.present {
            let named: Vec<&str> = mb.names.iter().filter(|(_, v)| **v).map(|(k, _)| k.as_str()).collect();
            yes(s, &check, format!("/sys/kernel/btf/{module}; names {}", if named.is_empty() { "none of the hook targets".to_string() } else { named.join(", ") }))
        } else if !loaded {
            info(s, &check, format!("module {module} not loaded"))
        } else {
            no(
                s,
                &check,
                format!("module {module} is loaded but /sys/kernel/btf/{module} is missing"),
                "a kernel built with CONFIG_DEBUG_INFO_BTF_MODULES=y and a module built with BTF (only fentry needs it)",
            )
        });
    }
    let before = tracefs_mounts(&f.mounts);
    rows.push(match (&f.tracefs, before.is_empty()) {
        (Ok(dir), false) => yes(s, "tracefs", format!("mounted at {dir}")),
        (Ok(dir), true) => yes(
            s,
            "tracefs",
            format!(
                "was not mounted; mounted it at {dir} (gpu-trace does the same when it needs it)"
            ),
        ),
        (Err(e), _) => no(
            s,
            "tracefs",
            e.clone(),
            "sudo mount -t tracefs none /sys/kernel/tracing",
        ),
    });
    rows.push(match &f.lsm {
        Ok(list) => {
            if lsm_list(list).iter().any(|m| m == "bpf") {
                yes(s, "active LSMs", format!("{list} (bpf is active)"))
            } else {
                no(
                    s,
                    "active LSMs",
                    format!("{list}: bpf is not among them, BPF LSM programs would never run"),
                    format!(
                        "boot with lsm={},bpf (only --deny-pid needs it)",
                        list.trim_end_matches(',')
                    ),
                )
            }
        }
        Err(e) => no(
            s,
            "active LSMs",
            e.clone(),
            "sudo mount -t securityfs none /sys/kernel/security; a kernel with CONFIG_SECURITY=y",
        ),
    });
    rows.push(match f.lockdown.as_ref().map(|l| lockdown_level(l)) {
        Ok(Some(level)) if level == "confidentiality" => no(
            s,
            "lockdown",
            "confidentiality: BPF may not read kernel memory, kprobes and tracefs are off",
            "boot with lockdown=integrity (or none), or turn Secure Boot's lockdown off",
        ),
        Ok(Some(level)) => yes(s, "lockdown", format!("{level}: BPF tracing allowed")),
        Ok(None) | Err(_) => info(s, "lockdown", "no lockdown LSM (nothing to block)"),
    });
    let pmu = f.kprobe_pmu.map(|t| format!("kprobe PMU (perf type {t})"));
    let events = f.kprobe_events.then(|| "tracefs kprobe_events".to_string());
    rows.push(match (pmu, events) {
        (None, None) => no(
            s,
            "kprobes",
            "no kprobe PMU (/sys/bus/event_source/devices/kprobe) and no tracefs kprobe_events",
            "a kernel built with CONFIG_KPROBES=y and CONFIG_KPROBE_EVENTS=y (only the deep driver hooks need it)",
        ),
        (p, e) => yes(s, "kprobes", [p, e].into_iter().flatten().collect::<Vec<_>>().join(", ")),
    });
    rows.push(trampoline_row(ctx));
    rows.push(match &f.kallsyms {
        Ok(m) => {
            let found: Vec<String> = m
                .iter()
                .filter(|(_, c)| !c.is_empty())
                .map(|(n, c)| {
                    if c.len() > 1 {
                        format!("{n} ×{}", c.len())
                    } else {
                        n.clone()
                    }
                })
                .collect();
            yes(
                s,
                "kallsyms",
                format!(
                    "readable; {}",
                    if found.is_empty() {
                        "none of the targets".into()
                    } else {
                        found.join(", ")
                    }
                ),
            )
        }
        Err(e) => no(
            s,
            "kallsyms",
            e.clone(),
            "run as root; a kernel built with CONFIG_KALLSYMS=y",
        ),
    });
    rows.push(match &f.filter_functions {
        Ok(m) => {
            let listed: Vec<&str> = m.iter().filter(|(_, v)| **v).map(|(k, _)| k.as_str()).collect();
            yes(s, "ftrace function list", format!("available_filter_functions readable; lists {}", if listed.is_empty() { "none of the targets".into() } else { listed.join(", ") }))
        }
        Err(e) => no(
            s,
            "ftrace function list",
            format!("{e}: which functions fentry/kprobes can attach to cannot be listed (trials still tell)"),
            if e.contains("EPERM") {
                "none needed for tracing (the trials below answer instead); reading it needs a kernel \
                 that does not restrict tracefs, as this one does even for root"
            } else {
                "a kernel built with CONFIG_DYNAMIC_FTRACE=y, with tracefs mounted"
            },
        ),
    });
    rows
}

fn trampoline_row(ctx: &Ctx<'_>) -> Row {
    let s = Scope::System;
    let entry = TrialHook::Fentry(PROBE_FUNCTION);
    let exit = TrialHook::Fexit(PROBE_FUNCTION);
    match (ctx.trial(entry), ctx.trial(exit)) {
        (Some(Ok(())), Some(Ok(()))) => yes(
            s,
            "trampolines",
            format!("{entry} and {exit} loaded and attached"),
        ),
        (Some(Err(r)), _) => no(
            s,
            "trampolines",
            format!("{entry} refused, {r}"),
            trial_fix(ctx, entry, r),
        ),
        (_, Some(Err(r))) => no(
            s,
            "trampolines",
            format!("{exit} refused, {r}"),
            trial_fix(ctx, exit, r),
        ),
        _ => no(
            s,
            "trampolines",
            "not tried",
            "run gpu-trace doctor as root",
        ),
    }
}

fn nvidia_rows(ctx: &Ctx<'_>) -> Vec<Row> {
    let f = ctx.facts;
    let s = Scope::Nvidia;
    let mut rows = Vec::new();
    rows.push(match (&f.nvidia_version, f.nvidia_module) {
        (Some(text), _) => {
            let (flavour, version) = nvidia_flavour(text);
            yes(
                s,
                "driver",
                format!(
                    "nvidia {} ({} kernel module)",
                    version.as_deref().unwrap_or("?"),
                    flavour.unwrap_or("unknown flavour")
                ),
            )
        }
        (None, true) => yes(s, "driver", "module nvidia loaded (no /proc/driver/nvidia/version)"),
        (None, false) => no(
            s,
            "driver",
            "the nvidia module is not loaded",
            "install and load the NVIDIA driver (sudo modprobe nvidia); tracing can start before and sees processes that start after",
        ),
    });
    let majors = char_devices(&f.proc_devices);
    let nv_major: Vec<String> = majors
        .iter()
        .filter(|(m, _)| *m == NV_MAJOR)
        .map(|(m, n)| format!("{m} {n}"))
        .collect();
    let ctl = f.nvidia_nodes.iter().find(|n| n.path == "/dev/nvidiactl");
    let gpus = f
        .nvidia_nodes
        .iter()
        .filter(|n| n.path != "/dev/nvidiactl")
        .count();
    rows.push(match (nv_major.is_empty(), ctl) {
        (false, Some(c)) if c.major == NV_MAJOR => yes(
            s,
            "device nodes",
            format!(
                "/proc/devices: {}; /dev/nvidiactl {}:{}; {gpus} × /dev/nvidiaN",
                nv_major.join(", "),
                c.major,
                c.minor
            ),
        ),
        (false, Some(c)) => no(
            s,
            "device nodes",
            format!(
                "/dev/nvidiactl is {}:{}, not major {NV_MAJOR}",
                c.major, c.minor
            ),
            "recreate the node: sudo rm /dev/nvidiactl && sudo nvidia-modprobe -c 0",
        ),
        (false, None) => no(
            s,
            "device nodes",
            format!(
                "/proc/devices has {} but /dev/nvidiactl is missing",
                nv_major.join(", ")
            ),
            "create the nodes: sudo nvidia-modprobe -c 0 (or run nvidia-smi once as root)",
        ),
        (true, _) => no(
            s,
            "device nodes",
            format!("no character major {NV_MAJOR} in /proc/devices"),
            "load the NVIDIA driver (sudo modprobe nvidia)",
        ),
    });
    ioctl_layer_rows(ctx, s, &mut rows);
    rows.push(match ctx.symbol_copies(GPU_EXT_HOOK) {
        Some(copies) if !copies.is_empty() => yes(
            s,
            "gpu_ext hooks",
            format!(
                "{GPU_EXT_HOOK} is defined by {}: gpu-trace attaches to the four nv_gpu_sched_* \
                 hooks (fentry, else kprobe, as the rows below allow)",
                copies
                    .iter()
                    .flatten()
                    .next()
                    .map_or("the kernel", String::as_str)
            ),
        ),
        _ => info(
            s,
            "gpu_ext hooks",
            format!(
                "none ({GPU_EXT_HOOK} is not in kallsyms: the stock driver has no gpu_ext \
                 scheduling hooks); the ioctl layer serves every event"
            ),
        ),
    });
    rows.push(kprobe_row(ctx, s, NVIDIA_ENTRY, f.nvidia_module, "nvidia"));
    rows.push(fentry_row(
        ctx,
        s,
        NVIDIA_ENTRY,
        &f.nvidia_btf,
        "nvidia",
        f.nvidia_module,
    ));
    rows.push(lsm_row(ctx, s));
    rows
}

fn amd_rows(ctx: &Ctx<'_>) -> Vec<Row> {
    let f = ctx.facts;
    let s = Scope::Amd;
    let mut rows = Vec::new();
    rows.push(match (f.amdgpu_module, &f.kfd_version) {
        (_, Some(Ok((major, minor)))) => yes(
            s,
            "driver",
            format!(
                "KFD {major}.{minor} (AMDKFD_IOC_GET_VERSION){}",
                f.kfd_gpus
                    .map(|n| format!("; {n} GPU node(s) in the KFD topology"))
                    .unwrap_or_default()
            ),
        ),
        (_, Some(Err(e))) => no(
            s,
            "driver",
            format!("/dev/kfd exists but {e}"),
            "run as root; check dmesg for amdgpu/kfd errors",
        ),
        (true, None) => no(
            s,
            "driver",
            "amdgpu is loaded but /dev/kfd is missing",
            "a kernel with CONFIG_HSA_AMD=y (KFD); check dmesg",
        ),
        (false, None) => no(
            s,
            "driver",
            "the amdgpu module (KFD) is not loaded",
            "load it: sudo modprobe amdgpu (needs CONFIG_HSA_AMD=y)",
        ),
    });
    let majors = char_devices(&f.proc_devices);
    let kfd_major = majors.iter().find(|(_, n)| n == "kfd").map(|(m, _)| *m);
    rows.push(match (kfd_major, &f.kfd_node) {
        (Some(m), Some(n)) if n.major == m => yes(
            s,
            "device nodes",
            format!(
                "/proc/devices: {m} kfd (dynamic major); /dev/kfd {}:{}",
                n.major, n.minor
            ),
        ),
        (Some(m), Some(n)) => no(
            s,
            "device nodes",
            format!(
                "/dev/kfd is {}:{} but /proc/devices says kfd is major {m}",
                n.major, n.minor
            ),
            "recreate the node (udev: sudo udevadm trigger), or reboot",
        ),
        (Some(m), None) => no(
            s,
            "device nodes",
            format!("/proc/devices has {m} kfd but /dev/kfd is missing"),
            format!("create it: sudo mknod -m 666 /dev/kfd c {m} 0 (or let udev do it)"),
        ),
        (None, _) => no(
            s,
            "device nodes",
            "no kfd in /proc/devices",
            "load amdgpu with KFD (sudo modprobe amdgpu)",
        ),
    });
    ioctl_layer_rows(ctx, s, &mut rows);
    let mut kprobe = kprobe_row(ctx, s, KFD_ENTRY, f.amdgpu_module, "amdgpu");
    if let Some(copies) = ctx.symbol_copies("init_mqd").filter(|c| c.len() > 1) {
        let _ = write!(
            kprobe.why,
            "; init_mqd has {} copies: attach by address, not by name (EADDRNOTAVAIL)",
            copies.len()
        );
    }
    rows.push(kprobe);
    rows.push(fentry_row(
        ctx,
        s,
        KFD_ENTRY,
        &f.amdgpu_btf,
        "amdgpu",
        f.amdgpu_module,
    ));
    rows.push(lsm_row(ctx, s));
    rows
}

/// The four ioctl-layer hooks: the same kernel facility serves both vendors.
fn ioctl_layer_rows(ctx: &Ctx<'_>, s: Scope, rows: &mut Vec<Row>) {
    rows.push(trial_row(
        ctx,
        s,
        hook::RAW_TP,
        TrialHook::RawTracepoint("sys_exit"),
        "ioctl+close",
    ));
    rows.push(trial_row(
        ctx,
        s,
        hook::TP_BTF,
        TrialHook::BtfTracepoint("sys_exit"),
        "ioctl+close",
    ));
    let mut tps = trial_row(
        ctx,
        s,
        hook::SYSCALL_TPS,
        TrialHook::Tracepoint {
            category: "syscalls",
            name: "sys_exit_ioctl",
        },
        "ioctl+close",
    );
    if ctx.chosen.iter().any(|c| c.contains("tracepoint/syscalls")) && tps.status == Status::Yes {
        tps.why.push_str("; gpu-trace uses them for ioctl+close");
    }
    rows.push(tps);
    rows.push(trial_row(
        ctx,
        s,
        hook::PROCESS_EXIT,
        TrialHook::RawTracepoint("sched_process_exit"),
        "process exit",
    ));
}

fn kprobe_row(ctx: &Ctx<'_>, s: Scope, target: &'static str, loaded: bool, module: &str) -> Row {
    let generic = TrialHook::Kprobe(PROBE_FUNCTION);
    match ctx.trial(generic) {
        Some(Err(r)) => {
            return no(
                s,
                hook::KPROBE,
                format!("{generic} refused, {r}"),
                trial_fix(ctx, generic, r),
            );
        }
        None => return no(s, hook::KPROBE, "not tried", "run gpu-trace doctor as root"),
        Some(Ok(())) => {}
    }
    match ctx.trial(TrialHook::Kprobe(target)) {
        Some(Ok(())) => {
            let copies = ctx.symbol_copies(target).map_or(0, Vec::len);
            yes(
                s,
                hook::KPROBE,
                format!(
                    "kprobe/{target} loaded and attached ({copies} cop{} in kallsyms)",
                    if copies == 1 { "y" } else { "ies" }
                ),
            )
        }
        Some(Err(r)) => no(
            s,
            hook::KPROBE,
            format!("kprobe/{target} refused, {r}"),
            trial_fix(ctx, TrialHook::Kprobe(target), r),
        ),
        None if !loaded => no(
            s,
            hook::KPROBE,
            format!(
                "kprobes work ({generic}), but {module} is not loaded: {target} is not in kallsyms"
            ),
            format!("load the {module} module"),
        ),
        None => no(
            s,
            hook::KPROBE,
            format!("kprobes work ({generic}), but {target} is not in kallsyms"),
            format!("a {module} build that exports {target} to kallsyms"),
        ),
    }
}

fn fentry_row(
    ctx: &Ctx<'_>,
    s: Scope,
    target: &str,
    mb: &ModuleBtf,
    module: &str,
    loaded: bool,
) -> Row {
    let trampolines = trampoline_row(ctx);
    if trampolines.status != Status::Yes {
        return Row {
            scope: s,
            check: hook::FENTRY.into(),
            ..trampolines
        };
    }
    if !loaded {
        return no(
            s,
            hook::FENTRY,
            format!("trampolines work, but {module} is not loaded"),
            format!("load the {module} module"),
        );
    }
    if !mb.present {
        return no(
            s,
            hook::FENTRY,
            format!(
                "trampolines work, but /sys/kernel/btf/{module} is missing: fentry on module functions needs module BTF"
            ),
            "a kernel with CONFIG_DEBUG_INFO_BTF_MODULES=y and the module built with it",
        );
    }
    if !mb.names.get(target).copied().unwrap_or(false) {
        return no(
            s,
            hook::FENTRY,
            format!("trampolines work, but {target} is not in the {module} module's BTF"),
            format!("a {module} build whose BTF describes {target}"),
        );
    }
    if let Ok(listed) = &ctx.facts.filter_functions
        && listed.get(target) == Some(&false)
    {
        return no(
            s,
            hook::FENTRY,
            format!("{target} has BTF but ftrace does not list it (notrace or inlined)"),
            format!("a {module} build where {target} is traceable"),
        );
    }
    yes(
        s,
        hook::FENTRY,
        format!("trampolines work and {target} is in the {module} module's BTF"),
    )
}

fn lsm_row(ctx: &Ctx<'_>, s: Scope) -> Row {
    let h = TrialHook::Lsm(LSM_HOOK);
    match (ctx.trial(h), ctx.lsm_active()) {
        (Some(Ok(())), Some(true)) => yes(
            s,
            hook::LSM,
            format!("{h} loaded and attached; bpf is an active LSM (--deny-pid uses it)"),
        ),
        (Some(Ok(())), Some(false)) => no(
            s,
            hook::LSM,
            format!("{h} loads, but bpf is not an active LSM: it would never run"),
            format!(
                "boot with lsm={},bpf",
                ctx.facts
                    .lsm
                    .as_deref()
                    .unwrap_or("…")
                    .trim_end_matches(',')
            ),
        ),
        (Some(Ok(())), None) => no(
            s,
            hook::LSM,
            format!("{h} loads; the active LSM list is unreadable"),
            "sudo mount -t securityfs none /sys/kernel/security",
        ),
        (Some(Err(r)), _) => no(
            s,
            hook::LSM,
            format!("{h} refused, {r}"),
            trial_fix(ctx, h, r),
        ),
        (None, _) => no(s, hook::LSM, "not tried", "run gpu-trace doctor as root"),
    }
}

fn tracing_verdict(ctx: &Ctx<'_>) -> Verdict {
    match &ctx.facts.tracer {
        TracerLoad::Attached(hooks) => Verdict {
            ok: true,
            why: format!(
                "gpu-trace loaded its programs and attached {}",
                hooks.join("; ")
            ),
            fix: None,
        },
        TracerLoad::Failed(e) => Verdict {
            ok: false,
            why: format!("gpu-trace's programs did not load: {e}"),
            fix: Some("see the \"no\" rows above and docs/troubleshooting.md".into()),
        },
        TracerLoad::NotTried(why) => Verdict {
            ok: false,
            why: format!("not tried: {why}"),
            fix: Some("run as root: sudo gpu-trace doctor".into()),
        },
    }
}

fn deny_verdict(ctx: &Ctx<'_>, tracing: &Verdict, lsm: &Row) -> Verdict {
    if !tracing.ok {
        return Verdict {
            ok: false,
            why: "tracing itself cannot work (--deny-pid runs inside a trace)".into(),
            fix: tracing.fix.clone(),
        };
    }
    if lsm.status != Status::Yes {
        return Verdict {
            ok: false,
            why: format!("BPF LSM: {}", lsm.why),
            fix: lsm.fix.clone(),
        };
    }
    match &ctx.facts.deny_load {
        Some(Ok(())) => Verdict {
            ok: true,
            why: "gpu-trace loaded and attached its LSM programs (lsm/file_ioctl, lsm/file_ioctl_compat)".into(),
            fix: None,
        },
        Some(Err(e)) => Verdict { ok: false, why: e.clone(), fix: Some("see docs/troubleshooting.md".into()) },
        None => Verdict {
            ok: false,
            why: "gpu-trace's LSM programs were not tried".into(),
            fix: Some("run as root: sudo gpu-trace doctor".into()),
        },
    }
}

/// The table and verdicts for `facts`.
pub fn evaluate(facts: &Facts) -> Report {
    let chosen = match &facts.tracer {
        TracerLoad::Attached(h) => h.clone(),
        _ => Vec::new(),
    };
    let ctx = Ctx {
        facts,
        privileged: facts.privileged,
        chosen,
    };
    let mut rows = system_rows(&ctx);
    rows.extend(nvidia_rows(&ctx));
    rows.extend(amd_rows(&ctx));
    let tracing = tracing_verdict(&ctx);
    let lsm = lsm_row(&ctx, Scope::System);
    let deny = deny_verdict(&ctx, &tracing, &lsm);
    let exit_code = match (tracing.ok, deny.ok) {
        (false, _) => exit::UNSUPPORTED,
        (true, false) => exit::NO_DENY,
        (true, true) => exit::READY,
    };
    Report {
        kernel: facts.kernel.clone(),
        arch: facts.arch.clone(),
        rows,
        tracing,
        deny,
        exit_code,
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

impl Report {
    /// The table, the verdicts and what the exit status means, as text.
    pub fn render_text(&self) -> String {
        let check_w = self
            .rows
            .iter()
            .map(|r| r.check.chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "gpu-trace doctor: what this machine allows (kernel {}, {})",
            self.kernel, self.arch
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<6}  {:<check_w$}  {:<3}  WHY",
            "VENDOR", "CHECK", "OK"
        );
        let indent = 6 + 2 + check_w + 2 + 3 + 2;
        let mut last_scope = None;
        for r in &self.rows {
            if last_scope.is_some_and(|s| s != r.scope) {
                let _ = writeln!(out);
            }
            last_scope = Some(r.scope);
            let _ = writeln!(
                out,
                "{:<6}  {:<check_w$}  {:<3}  {}",
                r.scope.label(),
                r.check,
                r.status.label(),
                r.why
            );
            if let Some(fix) = &r.fix {
                let _ = writeln!(out, "{:indent$}fix: {fix}", "");
            }
        }
        let _ = writeln!(out);
        for (name, v) in [("tracing", &self.tracing), ("--deny-pid", &self.deny)] {
            let _ = writeln!(
                out,
                "{name:<10}  {}  {}",
                if v.ok { "yes" } else { "no " },
                v.why
            );
            if let Some(fix) = &v.fix {
                let _ = writeln!(out, "{:13}fix: {fix}", "");
            }
        }
        let meaning = match self.exit_code {
            exit::READY => "tracing and --deny-pid can both work",
            exit::NO_DENY => "tracing can work, --deny-pid cannot",
            _ => "tracing cannot work",
        };
        let _ = writeln!(out, "\nexit status {}: {meaning}", self.exit_code);
        out
    }

    /// The report as one JSON object (for scripts and tests).
    pub fn render_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the report serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/devices` of the CI machine (6.18.44, no GPU driver), captured 2026-11-22.
    const CI_PROC_DEVICES: &str = include_str!("../tests/fixtures/doctor/ci_proc_devices.txt");
    /// `/proc/devices` as read on the GPU host (examples/gpu-host-run.sh, doctor_facts.txt).
    const GPU_PROC_DEVICES: &str =
        include_str!("../tests/fixtures/doctor/gpu_host_proc_devices.txt");
    /// `/proc/mounts` lines of the CI machine for tracefs and securityfs.
    const CI_MOUNTS: &str = "tracefs /sys/kernel/tracing tracefs rw,relatime 0 0\n\
                             securityfs /sys/kernel/security securityfs rw,relatime 0 0\n";
    /// Excerpt of the CI machine's `/proc/kallsyms` (the symbols of interest and some others).
    const CI_KALLSYMS: &str = include_str!("../tests/fixtures/doctor/ci_kallsyms_excerpt.txt");
    /// `/sys/kernel/security/lsm` on the CI machine and on the GPU host (platforms.md).
    const LSM_LIST: &str = "lockdown,capability,landlock,bpf";
    /// `/sys/kernel/security/lockdown` on both.
    const LOCKDOWN: &str = "none [integrity] confidentiality\n";
    /// `/proc/driver/nvidia/version` on the GPU host (tests/fixtures/host.txt).
    const GPU_NV_VERSION: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";

    fn eperm(stage: Stage) -> Result<(), Refusal> {
        Err(Refusal {
            stage,
            errno: Some(libc::EPERM),
            detail: String::new(),
        })
    }

    /// The CI machine as measured (platforms.md): raw_tp/tp_btf/tracepoints work, no kprobes,
    /// fentry and LSM refused with EPERM at load, root.
    fn ci_facts() -> Facts {
        let names = symbols_of_interest();
        Facts {
            kernel: "6.18.44-fc-v669".into(),
            arch: "x86_64".into(),
            euid: 0,
            privileged: true,
            vmlinux_btf: Ok(6_000_000),
            offsets: Ok(()),
            nvidia_btf: ModuleBtf::default(),
            amdgpu_btf: ModuleBtf::default(),
            mounts: CI_MOUNTS.into(),
            tracefs: Ok("/sys/kernel/tracing".into()),
            lsm: Ok(LSM_LIST.into()),
            lockdown: Ok(LOCKDOWN.into()),
            kprobe_pmu: None,
            kprobe_events: false,
            kallsyms: Ok(count_symbols(CI_KALLSYMS, &names)),
            filter_functions: Err("cannot read /sys/kernel/tracing/available_filter_functions: EPERM (Operation not permitted (os error 1))".into()),
            proc_devices: CI_PROC_DEVICES.into(),
            nvidia_module: false,
            nvidia_version: None,
            nvidia_nodes: vec![],
            amdgpu_module: false,
            kfd_node: None,
            kfd_version: None,
            kfd_gpus: None,
            trials: vec![
                (TrialHook::RawTracepoint("sys_exit"), Ok(())),
                (TrialHook::BtfTracepoint("sys_exit"), Ok(())),
                (TrialHook::Tracepoint { category: "syscalls", name: "sys_exit_ioctl" }, Ok(())),
                (TrialHook::RawTracepoint("sched_process_exit"), Ok(())),
                (
                    TrialHook::Kprobe(PROBE_FUNCTION),
                    Err(Refusal {
                        stage: Stage::Prepare,
                        errno: None,
                        detail: "no kprobe PMU (/sys/bus/event_source/devices/kprobe/type is missing)".into(),
                    }),
                ),
                (TrialHook::Fentry(PROBE_FUNCTION), eperm(Stage::Load)),
                (TrialHook::Fexit(PROBE_FUNCTION), eperm(Stage::Load)),
                (TrialHook::Lsm(LSM_HOOK), eperm(Stage::Load)),
            ],
            tracer: TracerLoad::Attached(vec![
                "ioctl+close → raw_tp/sys_exit".into(),
                "process exit → raw_tp/sched_process_exit".into(),
            ]),
            deny_load: None,
        }
    }

    /// The GPU host (platforms.md, host.txt): the CI kernel's answers plus the NVIDIA open
    /// module 580.159.04 with module BTF for its glue layer.
    fn gpu_host_facts() -> Facts {
        let mut f = ci_facts();
        f.kernel = "6.18.44-fc-v657-gpu".into();
        f.nvidia_module = true;
        f.nvidia_version = Some(GPU_NV_VERSION.into());
        f.proc_devices = GPU_PROC_DEVICES.into();
        f.nvidia_nodes = vec![
            DevNode {
                path: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
            },
            DevNode {
                path: "/dev/nvidia0".into(),
                major: 195,
                minor: 0,
            },
        ];
        f.nvidia_btf = ModuleBtf {
            present: true,
            names: [(NVIDIA_ENTRY.to_string(), true)].into(),
        };
        f
    }

    /// The CI machine seen by a user without privileges: every load refused with EPERM.
    fn unprivileged_facts() -> Facts {
        let mut f = ci_facts();
        f.euid = 1000;
        f.privileged = false;
        f.tracer = TracerLoad::NotTried("needs root (or CAP_BPF and CAP_PERFMON)".into());
        f.trials
            .iter_mut()
            .for_each(|(_, r)| *r = eperm(Stage::Load));
        f
    }

    fn row<'a>(r: &'a Report, scope: Scope, check: &str) -> &'a Row {
        r.rows
            .iter()
            .find(|x| x.scope == scope && x.check == check)
            .unwrap_or_else(|| panic!("no row {scope:?} {check}"))
    }

    #[test]
    fn proc_devices_of_the_ci_machine_parse() {
        let devs = char_devices(CI_PROC_DEVICES);
        assert_eq!(devs.first(), Some(&(1, "mem".to_string())));
        assert!(devs.contains(&(136, "pts".to_string())));
        // Block devices are not character devices.
        assert!(!devs.iter().any(|(_, n)| n == "virtblk" || n == "loop"));
        assert!(!devs.iter().any(|(m, _)| *m == NV_MAJOR));
    }

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
    fn kallsyms_counts_copies_and_modules() {
        let m = count_symbols(CI_KALLSYMS, &symbols_of_interest());
        assert_eq!(m["vfs_read"], [None]);
        assert_eq!(m["bpf_lsm_file_ioctl"], [None]);
        assert!(m["nvidia_unlocked_ioctl"].is_empty());
        // Module symbols and duplicates (static functions of the same name in several files).
        let text = "ffffffffc1000000 t init_mqd\t[amdgpu]\nffffffffc1000100 t init_mqd\t[amdgpu]\n\
                    ffffffffc1000200 t init_mqd\t[amdgpu]\nffffffffc1000300 d init_mqd\t[amdgpu]\n\
                    ffffffffc2000000 t nvidia_unlocked_ioctl\t[nvidia]\n0000000000000000 t nvidia_unlocked_ioctl.cold\t[nvidia]\n";
        let m = count_symbols(text, &symbols_of_interest());
        assert_eq!(m["init_mqd"].len(), 3, "data symbols are not code copies");
        assert_eq!(m["nvidia_unlocked_ioctl"], [Some("nvidia".to_string())]);
    }

    #[test]
    fn filter_function_lists_parse() {
        let text = "vfs_read\nkfd_ioctl [amdgpu]\nffffffff81000000 init_mqd [amdgpu]\n";
        let m = listed_functions(text, &symbols_of_interest());
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
    fn module_btf_strings_are_matched_whole() {
        let blob = b"\x9f\xeb\x01\0...\0nvidia_unlocked_ioctl\0nvidia_open\0";
        assert!(btf_strings_contain(blob, "nvidia_unlocked_ioctl"));
        assert!(btf_strings_contain(blob, "nvidia_open"));
        assert!(!btf_strings_contain(blob, "nvidia_unlocked"));
        assert!(!btf_strings_contain(blob, "ioctl"));
    }

    #[test]
    fn ci_machine_tracing_yes_deny_no_exit_5() {
        let r = evaluate(&ci_facts());
        assert!(r.tracing.ok, "{:?}", r.tracing);
        assert!(!r.deny.ok);
        assert!(r.deny.why.contains("EPERM"), "{}", r.deny.why);
        assert_eq!(r.exit_code, exit::NO_DENY);
        for scope in [Scope::Nvidia, Scope::Amd] {
            assert_eq!(row(&r, scope, hook::RAW_TP).status, Status::Yes);
            assert!(
                row(&r, scope, hook::RAW_TP)
                    .why
                    .contains("gpu-trace uses it")
            );
            assert!(
                !row(&r, scope, hook::TP_BTF)
                    .why
                    .contains("gpu-trace uses it")
            );
            assert_eq!(row(&r, scope, hook::PROCESS_EXIT).status, Status::Yes);
            assert_eq!(row(&r, scope, hook::KPROBE).status, Status::No);
            assert!(
                row(&r, scope, hook::KPROBE)
                    .fix
                    .as_deref()
                    .unwrap()
                    .contains("CONFIG_KPROBES")
            );
            assert_eq!(row(&r, scope, hook::FENTRY).status, Status::No);
            assert_eq!(row(&r, scope, hook::LSM).status, Status::No);
            assert_eq!(row(&r, scope, "driver").status, Status::No);
        }
        assert_eq!(row(&r, Scope::System, "kprobes").status, Status::No);
        assert_eq!(row(&r, Scope::System, "lockdown").status, Status::Yes);
        assert_eq!(row(&r, Scope::System, "active LSMs").status, Status::Yes);
    }

    #[test]
    fn gpu_host_shows_the_open_driver_and_its_nodes() {
        let r = evaluate(&gpu_host_facts());
        let driver = row(&r, Scope::Nvidia, "driver");
        assert_eq!(driver.status, Status::Yes);
        assert!(
            driver.why.contains("580.159.04") && driver.why.contains("open"),
            "{}",
            driver.why
        );
        let nodes = row(&r, Scope::Nvidia, "device nodes");
        assert_eq!(nodes.status, Status::Yes, "{}", nodes.why);
        assert!(
            nodes.why.contains("195 nvidia") && nodes.why.contains("195:255"),
            "{}",
            nodes.why
        );
        // Module BTF is there, trampolines are not: fentry still "no", for the trampolines.
        let fentry = row(&r, Scope::Nvidia, hook::FENTRY);
        assert_eq!(fentry.status, Status::No);
        assert!(fentry.why.contains("EPERM"), "{}", fentry.why);
        assert_eq!(r.exit_code, exit::NO_DENY);
    }

    #[test]
    fn every_no_names_a_fix() {
        let unprivileged = unprivileged_facts();
        let mut bare = ci_facts();
        bare.vmlinux_btf = Err("/sys/kernel/btf/vmlinux: No such file or directory".into());
        bare.offsets = Err("kernel BTF not found".into());
        bare.tracefs = Err("tracefs is not mounted".into());
        bare.lsm = Ok("capability,selinux".into());
        bare.lockdown = Ok("none integrity [confidentiality]".into());
        bare.kallsyms = Err("cannot read /proc/kallsyms".into());
        bare.amdgpu_module = true;
        bare.nvidia_module = true;
        bare.tracer = TracerLoad::Failed("the kernel refused every hook".into());
        for facts in [ci_facts(), gpu_host_facts(), unprivileged, bare] {
            let r = evaluate(&facts);
            for row in &r.rows {
                if row.status == Status::No {
                    assert!(
                        row.fix.as_ref().is_some_and(|f| !f.is_empty()),
                        "no fix: {row:?}"
                    );
                }
            }
            for v in [&r.tracing, &r.deny] {
                assert!(v.ok || v.fix.is_some(), "verdict without a fix: {v:?}");
            }
        }
    }

    #[test]
    fn unprivileged_is_unsupported_and_says_sudo() {
        let f = unprivileged_facts();
        let r = evaluate(&f);
        assert_eq!(r.exit_code, exit::UNSUPPORTED);
        assert!(r.tracing.fix.as_deref().unwrap().contains("sudo"));
        assert!(
            row(&r, Scope::Nvidia, hook::RAW_TP)
                .fix
                .as_deref()
                .unwrap()
                .contains("sudo")
        );
        assert_eq!(row(&r, Scope::System, "privileges").status, Status::No);
    }

    #[test]
    fn a_live_bpf_lsm_and_a_working_deny_load_give_exit_0() {
        // The QEMU lab kernel (platforms.md): everything works, bpf is active.
        let mut f = ci_facts();
        f.kprobe_pmu = Some(6);
        f.kprobe_events = true;
        f.lockdown = Ok("[none] integrity confidentiality".into());
        f.trials.iter_mut().for_each(|(_, r)| *r = Ok(()));
        f.deny_load = Some(Ok(()));
        let r = evaluate(&f);
        assert_eq!(r.exit_code, exit::READY, "{}", r.render_text());
        assert_eq!(row(&r, Scope::Amd, hook::LSM).status, Status::Yes);
        // Without the driver, kprobe and fentry on its functions are still "no", with the fix.
        assert_eq!(row(&r, Scope::Amd, hook::KPROBE).status, Status::No);
        assert!(
            row(&r, Scope::Amd, hook::KPROBE)
                .fix
                .as_deref()
                .unwrap()
                .contains("amdgpu")
        );
        // The same, with bpf missing from the LSM list: the LSM loads but would never run.
        f.lsm = Ok("lockdown,capability,landlock".into());
        let r = evaluate(&f);
        assert_eq!(r.exit_code, exit::NO_DENY);
        assert!(
            row(&r, Scope::Nvidia, hook::LSM)
                .fix
                .as_deref()
                .unwrap()
                .contains("lsm=lockdown,capability,landlock,bpf")
        );
    }

    #[test]
    fn amd_driver_with_duplicate_init_mqd_is_reported() {
        let mut f = ci_facts();
        f.amdgpu_module = true;
        f.proc_devices = CI_PROC_DEVICES.replacen("245 hidraw", "236 kfd\n245 hidraw", 1);
        f.kfd_node = Some(DevNode {
            path: "/dev/kfd".into(),
            major: 236,
            minor: 0,
        });
        f.kfd_version = Some(Ok((1, 17)));
        f.kfd_gpus = Some(0);
        f.kprobe_pmu = Some(6);
        let kallsyms = "ffffffffc1000000 t init_mqd\t[amdgpu]\nffffffffc1000100 t init_mqd\t[amdgpu]\n\
                        ffffffffc1000200 t kfd_ioctl\t[amdgpu]\n";
        f.kallsyms = Ok(count_symbols(kallsyms, &symbols_of_interest()));
        f.trials.push((TrialHook::Kprobe(KFD_ENTRY), Ok(())));
        for (h, r) in f.trials.iter_mut() {
            if *h == TrialHook::Kprobe(PROBE_FUNCTION) {
                *r = Ok(());
            }
        }
        let r = evaluate(&f);
        assert_eq!(
            row(&r, Scope::Amd, "driver").why,
            "KFD 1.17 (AMDKFD_IOC_GET_VERSION); 0 GPU node(s) in the KFD topology"
        );
        assert_eq!(row(&r, Scope::Amd, "device nodes").status, Status::Yes);
        let kprobe = row(&r, Scope::Amd, hook::KPROBE);
        assert_eq!(kprobe.status, Status::Yes);
        assert!(
            kprobe.why.contains("init_mqd has 2 copies"),
            "{}",
            kprobe.why
        );
    }

    #[test]
    fn text_and_json_renderings_carry_the_rows_and_the_exit_status() {
        let r = evaluate(&ci_facts());
        let text = r.render_text();
        assert!(text.contains("exit status 5: tracing can work, --deny-pid cannot"));
        assert!(text.lines().any(|l| l.starts_with("NVIDIA")
            && l.contains("raw_tp sys_exit")
            && l.contains(" yes ")));
        let json: serde_json::Value = serde_json::from_str(&r.render_json()).unwrap();
        assert_eq!(json["exit_code"], 5);
        assert_eq!(json["rows"].as_array().unwrap().len(), r.rows.len());
        assert_eq!(json["rows"][0]["scope"], "system");
    }
}
