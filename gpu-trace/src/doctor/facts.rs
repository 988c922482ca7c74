//! What doctor observes: [`Facts::gather`] asks [`crate::probe`] (the only reader of /proc and
//! /sys), tries each hook for real with a trivial program ([`crate::probe::trial`]), and loads
//! gpu-trace's own programs the way `gpu-trace` would.

use std::{collections::BTreeMap, path::Path};

use crate::{
    loader::{LoadError, LoadOptions, Tracer},
    probe::{
        amd, btf, devices, kallsyms, system,
        trial::{self, Refusal, TrialHook},
    },
    targets,
};

pub use crate::probe::devices::DevNode;

/// The vmlinux function the kprobe and trampoline trials attach to: present and traceable on
/// every kernel, and harmless to probe for a moment.
pub const PROBE_FUNCTION: &str = "vfs_read";
/// The LSM hook `--deny-pid` uses.
pub const LSM_HOOK: &str = targets::DENY[0].hook;
/// The kernel's BPF stub of [`LSM_HOOK`] (`bpf_lsm_<hook>`), in kallsyms where BPF LSM is
/// built in.
pub const LSM_SYMBOL: &str = "bpf_lsm_file_ioctl";
/// The classic syscall tracepoint the trial attaches to (one of gpu-trace's four).
pub const SYSCALL_TRACEPOINT: TrialHook = TrialHook::Tracepoint {
    category: targets::SYSCALL_TRACEPOINTS[1].category,
    name: targets::SYSCALL_TRACEPOINTS[1].name,
};
/// The first of gpu_ext's scheduling hooks (a patched NVIDIA driver defines it).
pub const GPU_EXT_HOOK: &str = targets::GPU_EXT[0].func;

/// KFD functions gpu-trace's deep hooks use (one of each group: handlers, the device queue
/// manager, teardown, MQD builders); `init_mqd` exists once per GFX generation.
pub const KFD_DEEP: [&str; 4] = [
    targets::KFD_HANDLERS[0].target.func,
    targets::DQM_CREATE[0].func,
    targets::PQM_UNINIT.func,
    targets::MQD_INIT[0],
];

/// Every symbol doctor looks up in kallsyms and ftrace's function list.
pub fn symbols_of_interest() -> Vec<&'static str> {
    let mut v = vec![
        PROBE_FUNCTION,
        LSM_SYMBOL,
        targets::NVIDIA_ENTRY,
        targets::NVIDIA_RM_CORE,
        targets::KFD_ENTRY,
        GPU_EXT_HOOK,
    ];
    v.extend(KFD_DEEP);
    v
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
    /// How the API layer's uprobes would go on (its programs loaded as `gpu-trace api` loads
    /// them), or why that could not be tried.
    pub api_attach: Result<crate::api::attach::AttachMethod, String>,
}

/// Loads gpu-trace's programs on the BTF parsed once; where it could not be parsed, the
/// loader's own attempt gives the error gpu-trace would print.
fn load(
    options: &LoadOptions,
    kernel_btf: &Result<btf::KernelBtf, btf::BtfError>,
) -> Result<Tracer, LoadError> {
    match kernel_btf {
        Ok(b) => Tracer::load_with(options, b),
        Err(_) => Tracer::load(options),
    }
}

fn module_btf(module: &str, names: &[&str]) -> ModuleBtf {
    match btf::read_module_btf(module) {
        Ok(bytes) => ModuleBtf {
            present: true,
            names: names
                .iter()
                .map(|n| (n.to_string(), btf::btf_strings_contain(&bytes, n)))
                .collect(),
        },
        Err(_) => ModuleBtf {
            present: false,
            names: BTreeMap::new(),
        },
    }
}

/// The trials doctor runs, in table order. Kprobe trials on driver functions are added by
/// [`Facts::gather`] when the driver is loaded.
pub fn base_trials() -> Vec<TrialHook> {
    vec![
        TrialHook::RawTracepoint(targets::SYS_EXIT.name),
        TrialHook::BtfTracepoint(targets::SYS_EXIT.name),
        SYSCALL_TRACEPOINT,
        TrialHook::RawTracepoint(targets::PROCESS_EXIT.name),
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
        let mounts = system::mounts();

        let vmlinux_btf = btf::vmlinux_btf_size();
        // vmlinux's BTF, parsed once for the offsets, the trials and both loads below.
        let kernel_btf = btf::KernelBtf::load();
        let offsets = match &kernel_btf {
            Ok(b) => btf::kernel_offsets(&b.vmlinux)
                .map(drop)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let aya_btf = kernel_btf.as_ref().ok().and_then(|b| b.aya.as_ref());

        let tracefs = system::ensure_tracefs()
            .map(str::to_string)
            .map_err(|e| e.to_string());
        // Mounts securityfs when it is not mounted (as --deny-pid does), so lockdown is readable too.
        let lsm = system::active_lsms().map_err(|e| e.to_string());
        let lockdown = system::lockdown().map_err(|e| e.to_string());
        let tracefs_dir = tracefs.as_ref().ok().cloned();

        let names = symbols_of_interest();
        let kallsyms = kallsyms::read_text()
            .map(|text| kallsyms::count_symbols(&text, &names))
            .map_err(|e| format!("cannot read {}: {e}", kallsyms::KALLSYMS_PATH));
        let filter_functions = match &tracefs_dir {
            Some(dir) => {
                system::filter_functions(dir).map(|text| system::listed_functions(&text, &names))
            }
            None => Err("tracefs is not mounted".into()),
        };
        let kprobe_events = tracefs_dir.as_deref().is_some_and(system::kprobe_events);

        let kfd_node = devices::char_device(Path::new(amd::KFD_PATH)).ok();
        let kfd_version = kfd_node.as_ref().map(devices::kfd_version);

        let mut hooks = base_trials();
        let syms = kallsyms.as_ref().ok();
        let loaded = |name: &str| syms.is_some_and(|s| s.get(name).is_some_and(|c| !c.is_empty()));
        for entry in [targets::NVIDIA_ENTRY, targets::KFD_ENTRY] {
            if loaded(entry) {
                hooks.push(TrialHook::Kprobe(entry));
            }
        }
        let trials = hooks
            .into_iter()
            .map(|h| (h, trial::try_hook(h, aya_btf, tracefs_dir.as_deref())))
            .collect::<Vec<_>>();

        let tracer = if privileged {
            match load(&LoadOptions::default(), &kernel_btf) {
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
            load(&options, &kernel_btf)
                .map(drop)
                .map_err(|e| e.to_string())
        });

        let api_attach = if privileged {
            aya::Ebpf::load(crate::loader::PROGRAMS)
                .map_err(|e| e.to_string())
                .and_then(|mut ebpf| crate::api::attach::load_programs(&mut ebpf, false, 1))
        } else {
            Err("needs root (or CAP_BPF and CAP_PERFMON)".into())
        };

        Facts {
            kernel: system::kernel_release(),
            arch: std::env::consts::ARCH.to_string(),
            euid,
            privileged,
            vmlinux_btf,
            offsets,
            nvidia_btf: module_btf(targets::NVIDIA_MODULE, &[targets::NVIDIA_ENTRY]),
            amdgpu_btf: module_btf(
                targets::AMD_MODULE,
                &[
                    targets::KFD_ENTRY,
                    targets::KFD_HANDLERS[0].target.func,
                    targets::DQM_CREATE[0].func,
                    targets::PQM_UNINIT.func,
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
            proc_devices: devices::proc_devices().unwrap_or_default(),
            nvidia_module: system::module_loaded(targets::NVIDIA_MODULE),
            nvidia_version: system::nvidia_version_text(),
            nvidia_nodes: devices::nvidia_nodes(),
            amdgpu_module: system::module_loaded(targets::AMD_MODULE),
            kfd_node,
            kfd_version,
            kfd_gpus: devices::kfd_gpus(),
            trials,
            tracer,
            api_attach,
            deny_load,
        }
    }
}
