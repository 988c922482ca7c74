//! The table and the two verdicts, from [`Facts`] alone: pure, and tested on text captured on
//! the CI machine and on the GPU host.

use std::fmt::Write as _;

use gpu_trace_common::nvidia::NV_MAJOR;
use serde::Serialize;

use super::facts::{
    Facts, GPU_EXT_HOOK, LSM_HOOK, ModuleBtf, PROBE_FUNCTION, SYSCALL_TRACEPOINT, TracerLoad,
};
use crate::{
    probe::{
        btf, devices,
        system::{lockdown_level, lsm_list, nvidia_flavour, tracefs_mounts},
        trial::{self, Refusal, Stage, TrialHook},
    },
    targets::{self, KFD_ENTRY, MQD_INIT, NVIDIA_ENTRY},
};

/// `gpu-trace doctor`'s exit codes (defined beside the command line that documents them).
pub use crate::cli::doctor_exit as exit;

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
    pub(super) fn label(self) -> &'static str {
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
    pub(super) fn label(self) -> &'static str {
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
    /// One line each, shown with the verdicts: what the verdicts do not say (no GPU driver
    /// loaded: tracing can start but sees nothing).
    pub warnings: Vec<String>,
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

/// Row name of the kernel-features summary; each feature the release predates gets a row
/// `before Linux X.Y` of its own.
pub const KERNEL_FEATURES: &str = "kernel features";

/// What the kernel's release says about the features gpu-trace uses (`probe::kernel`): one row
/// per feature it predates (a "no" for a hard requirement, else what gpu-trace does instead),
/// or one "yes" when it has them all. Nothing for a release that does not parse.
fn kernel_feature_rows(release: &str) -> Vec<Row> {
    use crate::probe::kernel::{self, KernelVersion};
    let s = Scope::System;
    let Some(v) = KernelVersion::parse(release) else {
        return Vec::new();
    };
    let missing = kernel::missing(v);
    if missing.is_empty() {
        return vec![yes(
            s,
            KERNEL_FEATURES,
            format!(
                "Linux {v} has every kernel feature gpu-trace uses ({} of them; docs/kernels.md)",
                kernel::FEATURES.len()
            ),
        )];
    }
    missing
        .into_iter()
        .map(|f| {
            let check = format!("before Linux {}", f.since);
            let why = format!("{} ({}): not in Linux {v}", f.name, f.used_for);
            match f.without {
                Some(instead) => info(s, &check, format!("{why}; instead: {instead}")),
                None => no(
                    s,
                    &check,
                    format!("{why}; gpu-trace cannot trace without it"),
                    format!(
                        "a kernel of Linux {} or later (or one with the feature backported)",
                        kernel::minimum()
                    ),
                ),
            }
        })
        .collect()
}

fn system_rows(ctx: &Ctx<'_>) -> Vec<Row> {
    let f = ctx.facts;
    let mut rows = vec![info(
        Scope::System,
        "kernel",
        format!("{} ({})", f.kernel, f.arch),
    )];
    rows.extend(kernel_feature_rows(&f.kernel));
    rows.push(privileges_row(ctx));
    rows.push(vmlinux_btf_row(f));
    rows.extend(module_btf_rows(f));
    rows.push(tracefs_row(f));
    rows.push(active_lsms_row(f));
    rows.push(lockdown_row(f));
    rows.push(kprobe_support_row(f));
    rows.push(trampoline_row(ctx));
    rows.push(kallsyms_row(f));
    rows.push(filter_functions_row(f));
    rows.push(api_attach_row(f));
    rows
}

/// Row name of how the API layer's uprobes go on.
pub const API_ATTACH: &str = "API layer uprobes";

/// How `gpu-trace api` and `--api` would attach here: batched links, or one perf-event uprobe
/// per symbol and why (docs/api.md).
fn api_attach_row(f: &Facts) -> Row {
    use crate::api::attach::AttachMethod;
    let s = Scope::System;
    match &f.api_attach {
        Ok(AttachMethod::Batched) => yes(
            s,
            API_ATTACH,
            "batched uprobe links: one per process, library and direction, attached and removed \
             in milliseconds",
        ),
        Ok(m @ AttachMethod::PerProbe(_)) => info(
            s,
            API_ATTACH,
            format!(
                "{m}: each probe takes a grace period to remove (seconds for a runtime's 200 \
                 symbols; docs/api.md)"
            ),
        ),
        Err(why) => info(s, API_ATTACH, format!("not tried: {why}")),
    }
}

/// Whether this process may load and attach BPF programs.
fn privileges_row(ctx: &Ctx<'_>) -> Row {
    let f = ctx.facts;
    let s = Scope::System;
    if ctx.privileged {
        let who = if f.euid == 0 { "root" } else { "not root, but" };
        yes(
            s,
            "privileges",
            format!("{who} with CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN"),
        )
    } else {
        no(
            s,
            "privileges",
            format!(
                "uid {} without CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN: most answers below are refusals for that reason",
                f.euid
            ),
            "run as root: sudo gpu-trace doctor (or grant: sudo setcap cap_bpf,cap_perfmon+ep $(which gpu-trace))",
        )
    }
}

/// vmlinux's BTF, and whether the offsets gpu-trace needs resolve in it.
fn vmlinux_btf_row(f: &Facts) -> Row {
    let s = Scope::System;
    match (&f.vmlinux_btf, &f.offsets) {
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
    }
}

/// The BTF of the NVIDIA and AMD modules (only fentry on the driver needs it).
fn module_btf_rows(f: &Facts) -> Vec<Row> {
    let s = Scope::System;
    let mut rows = Vec::new();
    for (module, mb, loaded) in [
        (targets::NVIDIA_MODULE, &f.nvidia_btf, f.nvidia_module),
        (targets::AMD_MODULE, &f.amdgpu_btf, f.amdgpu_module),
    ] {
        let check = format!("module BTF {module}");
        rows.push(if mb.present {
            let named: Vec<&str> = mb.names.iter().filter(|(_, v)| **v).map(|(k, _)| k.as_str()).collect();
            yes(s, &check, format!("{}; names {}", btf::module_btf_path(module), names_or(&named, "none of the hook targets")))
        } else if !loaded {
            info(s, &check, format!("module {module} not loaded"))
        } else {
            no(
                s,
                &check,
                format!("module {module} is loaded but {} is missing", btf::module_btf_path(module)),
                "a kernel built with CONFIG_DEBUG_INFO_BTF_MODULES=y and a module built with BTF (only fentry needs it)",
            )
        });
    }
    rows
}

/// tracefs, mounted (by doctor if it was not).
fn tracefs_row(f: &Facts) -> Row {
    let s = Scope::System;
    let before = tracefs_mounts(&f.mounts);
    match (&f.tracefs, before.is_empty()) {
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
            if e.contains("cannot read it") {
                "run gpu-trace doctor as root (sudo gpu-trace doctor)"
            } else {
                "sudo mount -t tracefs none /sys/kernel/tracing"
            },
        ),
    }
}

/// The active LSMs: BPF LSM programs run only where bpf is among them.
fn active_lsms_row(f: &Facts) -> Row {
    let s = Scope::System;
    match &f.lsm {
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
    }
}

/// The lockdown LSM's level.
fn lockdown_row(f: &Facts) -> Row {
    let s = Scope::System;
    match f.lockdown.as_ref().map(|l| lockdown_level(l)) {
        Ok(Some(level)) if level == "confidentiality" => no(
            s,
            "lockdown",
            "confidentiality: BPF may not read kernel memory, kprobes and tracefs are off",
            "boot with lockdown=integrity (or none), or turn Secure Boot's lockdown off",
        ),
        Ok(Some(level)) => yes(s, "lockdown", format!("{level}: BPF tracing allowed")),
        Ok(None) | Err(_) => info(s, "lockdown", "no lockdown LSM (nothing to block)"),
    }
}

/// Whether kprobes can be made (the kprobe PMU, tracefs' kprobe_events).
fn kprobe_support_row(f: &Facts) -> Row {
    let s = Scope::System;
    let pmu = f.kprobe_pmu.map(|t| format!("kprobe PMU (perf type {t})"));
    let events = f.kprobe_events.then(|| "tracefs kprobe_events".to_string());
    match (pmu, events) {
        (None, None) => no(
            s,
            "kprobes",
            "no kprobe PMU (/sys/bus/event_source/devices/kprobe) and no tracefs kprobe_events",
            "a kernel built with CONFIG_KPROBES=y and CONFIG_KPROBE_EVENTS=y (only the deep driver hooks need it)",
        ),
        (p, e) => yes(
            s,
            "kprobes",
            [p, e].into_iter().flatten().collect::<Vec<_>>().join(", "),
        ),
    }
}

/// kallsyms, and which of the hook targets it names.
fn kallsyms_row(f: &Facts) -> Row {
    let s = Scope::System;
    match &f.kallsyms {
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
                format!("readable; {}", names_or(&found, "none of the targets")),
            )
        }
        Err(e) => no(
            s,
            "kallsyms",
            e.clone(),
            "run as root; a kernel built with CONFIG_KALLSYMS=y",
        ),
    }
}

/// ftrace's list of the functions fentry and kprobes can attach to.
fn filter_functions_row(f: &Facts) -> Row {
    let s = Scope::System;
    match &f.filter_functions {
        Ok(m) => {
            let listed: Vec<&str> = m
                .iter()
                .filter(|(_, v)| **v)
                .map(|(k, _)| k.as_str())
                .collect();
            yes(
                s,
                "ftrace function list",
                format!(
                    "available_filter_functions readable; lists {}",
                    names_or(&listed, "none of the targets")
                ),
            )
        }
        Err(e) => no(
            s,
            "ftrace function list",
            format!(
                "{e}: which functions fentry/kprobes can attach to cannot be listed (trials still tell)"
            ),
            if e.contains("EPERM") {
                "none needed for tracing (the trials below answer instead); reading it needs a kernel \
                 that does not restrict tracefs, as this one does even for root"
            } else {
                "a kernel built with CONFIG_DYNAMIC_FTRACE=y, with tracefs mounted"
            },
        ),
    }
}

/// `names` joined by commas, or `none` when there are none.
fn names_or<S: std::borrow::Borrow<str>>(names: &[S], none: &str) -> String {
    if names.is_empty() {
        none.to_string()
    } else {
        names.join(", ")
    }
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
    let mut rows = vec![nvidia_driver_row(f), nvidia_nodes_row(f)];
    ioctl_layer_rows(ctx, s, &mut rows);
    rows.push(gpu_ext_row(ctx));
    let driver = Driver {
        module: targets::NVIDIA_MODULE,
        entry: NVIDIA_ENTRY,
        loaded: f.nvidia_module,
        btf: &f.nvidia_btf,
    };
    let kprobes = kprobe_row(ctx, s, &driver);
    let fentry = fentry_row(ctx, s, &driver);
    let entry = nvidia_entry_row(&fentry, &kprobes);
    rows.push(kprobes);
    rows.push(fentry);
    rows.push(entry);
    rows.push(lsm_row(ctx, s));
    rows
}

/// The NVIDIA driver: its version and the flavour of its kernel module.
fn nvidia_driver_row(f: &Facts) -> Row {
    let s = Scope::Nvidia;
    match (&f.nvidia_version, f.nvidia_module) {
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
        (None, true) => yes(
            s,
            "driver",
            "module nvidia loaded (no /proc/driver/nvidia/version)",
        ),
        (None, false) => no(
            s,
            "driver",
            "the nvidia module is not loaded",
            "install and load the NVIDIA driver (sudo modprobe nvidia); tracing can start before and sees processes that start after",
        ),
    }
}

/// NVIDIA's character major in /proc/devices and the /dev/nvidia* nodes.
fn nvidia_nodes_row(f: &Facts) -> Row {
    let s = Scope::Nvidia;
    let majors = devices::char_devices(&f.proc_devices);
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
    match (nv_major.is_empty(), ctl) {
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
    }
}

/// The scheduling hooks of a gpu_ext-patched driver, where one is loaded.
fn gpu_ext_row(ctx: &Ctx<'_>) -> Row {
    let s = Scope::Nvidia;
    match ctx.symbol_copies(GPU_EXT_HOOK) {
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
    }
}

/// What `gpu-trace` itself does with the driver's entry points (loader/nv_entry.rs), from the
/// kprobe and fentry rows.
fn nvidia_entry_row(fentry: &Row, kprobes: &Row) -> Row {
    let s = Scope::Nvidia;
    match (fentry.status == Status::Yes, kprobes.status == Status::Yes) {
        (false, false) => info(
            s,
            "driver entry points",
            "not hookable here (the two rows above): the syscall layer serves ioctl and close, \
             with a program at the exit of every system call on the machine",
        ),
        (by_fentry, _) => yes(
            s,
            "driver entry points",
            format!(
                "gpu-trace hooks {NVIDIA_ENTRY} and {} ({}): no program runs for other \
                 system calls",
                targets::NVIDIA_RELEASE,
                if by_fentry { "fexit/fentry" } else { "kprobes" }
            ),
        ),
    }
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
        // Linux 7.0 on, KFD refuses every process while no GPU is initialised ("drm/amdkfd:
        // kfd driver supports hot unplug/replug amdgpu devices"; dmesg: "no gpu node!").
        (_, Some(Err(e))) if e.contains("os error 22") && f.kfd_gpus.unwrap_or(0) == 0 => no(
            s,
            "driver",
            format!("/dev/kfd exists but {e}, and the KFD topology has no GPU node"),
            "Linux 7.0 and later refuse /dev/kfd while amdgpu has initialised no GPU (dmesg: \
             \"no gpu node! Cannot create KFD process\"); check dmesg for why amdgpu found none",
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
    let kfd_major = devices::char_major_in(&f.proc_devices, crate::probe::amd::KFD_DEVICE_NAME);
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
    let driver = Driver {
        module: targets::AMD_MODULE,
        entry: KFD_ENTRY,
        loaded: f.amdgpu_module,
        btf: &f.amdgpu_btf,
    };
    let mut kprobe = kprobe_row(ctx, s, &driver);
    if let Some(copies) = ctx.symbol_copies(MQD_INIT[0]).filter(|c| c.len() > 1) {
        let _ = write!(
            kprobe.why,
            "; {} has {} copies: attach by address, not by name (EADDRNOTAVAIL)",
            MQD_INIT[0],
            copies.len()
        );
    }
    rows.push(kprobe);
    rows.push(fentry_row(ctx, s, &driver));
    rows.push(lsm_row(ctx, s));
    rows
}

/// The four ioctl-layer hooks: the same kernel facility serves both vendors.
fn ioctl_layer_rows(ctx: &Ctx<'_>, s: Scope, rows: &mut Vec<Row>) {
    rows.push(trial_row(
        ctx,
        s,
        hook::RAW_TP,
        TrialHook::RawTracepoint(targets::SYS_EXIT.name),
        "ioctl+close",
    ));
    rows.push(trial_row(
        ctx,
        s,
        hook::TP_BTF,
        TrialHook::BtfTracepoint(targets::SYS_EXIT.name),
        "ioctl+close",
    ));
    let mut tps = trial_row(ctx, s, hook::SYSCALL_TPS, SYSCALL_TRACEPOINT, "ioctl+close");
    if ctx.chosen.iter().any(|c| c.contains("tracepoint/syscalls")) && tps.status == Status::Yes {
        tps.why.push_str("; gpu-trace uses them for ioctl+close");
    }
    rows.push(tps);
    rows.push(trial_row(
        ctx,
        s,
        hook::PROCESS_EXIT,
        TrialHook::RawTracepoint(targets::PROCESS_EXIT.name),
        "process exit",
    ));
}

/// A driver module and the entry point its kprobe and fentry rows are about.
struct Driver<'a> {
    module: &'static str,
    entry: &'static str,
    loaded: bool,
    btf: &'a ModuleBtf,
}

fn kprobe_row(ctx: &Ctx<'_>, s: Scope, driver: &Driver<'_>) -> Row {
    let &Driver {
        module,
        entry: target,
        loaded,
        ..
    } = driver;
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

fn fentry_row(ctx: &Ctx<'_>, s: Scope, driver: &Driver<'_>) -> Row {
    let &Driver {
        module,
        entry: target,
        loaded,
        btf: mb,
    } = driver;
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
                "trampolines work, but {} is missing: fentry on module functions needs module BTF",
                btf::module_btf_path(module)
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

/// The warning when neither vendor's driver is loaded (NVIDIA: no /proc/driver/nvidia/version
/// and no nvidia module; AMD: no /dev/kfd): "tracing yes" would otherwise read as "ready".
fn no_driver_warning(nvidia_loaded: bool, kfd_present: bool) -> Option<String> {
    (!nvidia_loaded && !kfd_present).then(|| {
        "no GPU driver is loaded (NVIDIA: no /proc/driver/nvidia/version and no nvidia module; \
         AMD: no /dev/kfd): a trace starts but sees nothing until one is (sudo modprobe nvidia, \
         or amdgpu)"
            .to_string()
    })
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
    let nvidia_loaded = facts.nvidia_version.is_some() || facts.nvidia_module;
    let warnings = no_driver_warning(nvidia_loaded, facts.kfd_node.is_some())
        .into_iter()
        .collect();
    Report {
        kernel: facts.kernel.clone(),
        arch: facts.arch.clone(),
        rows,
        tracing,
        deny,
        warnings,
        exit_code,
    }
}
