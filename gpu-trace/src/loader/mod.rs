//! Loading the kernel programs and attaching, per event, the cheapest hook the running kernel
//! allows. Every refusal is kept, so that the start-up report and the final error say what was
//! tried and why it failed.

pub mod deep;
pub mod gpu_ext;
pub mod trampoline;

use std::fmt;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::HashMap as BpfHashMap,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, Lsm, RawTracePoint, TracePoint},
};
use gpu_trace_common::{KernelConfig, KfdDeepConfig, amd::nr, counter, nvidia::NV_MAJOR};
use thiserror::Error;

use crate::{
    model::stats::KernelCounters,
    probe::{btf, system},
};

/// The compiled kernel programs (built by build.rs).
pub(crate) static PROGRAMS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpu-trace"));

/// Default ring-buffer size in bytes.
pub const DEFAULT_RING_BYTES: u32 = 1 << 22;

#[derive(Debug, Error)]
pub enum LoadError {
    #[error(transparent)]
    System(#[from] system::SystemError),
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
    #[error("--ring-size must be a power of two and a multiple of the page size (4096), got {0}")]
    RingSize(u32),
    #[error(
        "loading the kernel programs failed: {0}. Run `gpu-trace` with RUST_LOG unset and \
             report this with `uname -r`"
    )]
    Load(#[source] aya::EbpfError),
    #[error("the kernel refused every hook for {event}:\n{tried}\nSee docs/troubleshooting.md.")]
    NoHook { event: &'static str, tried: String },
    #[error("map {0} is missing from the kernel programs (build mismatch)")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("--deny-pid cannot work on this kernel: {0}")]
    DenyUnsupported(String),
    #[error("--deny-pid {pid}: no such process (it must be running when gpu-trace starts)")]
    NoSuchProcess { pid: u32 },
}

/// The attach types gpu-trace can use for the syscall-exit hook, in the order it tries them:
/// tp_btf, raw_tp, classic tracepoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SyscallHook {
    /// Raw tracepoint `sys_exit`: one program for every syscall exit; registers read with one
    /// helper call. Used where tp_btf is refused.
    RawTp,
    /// BTF-typed tracepoint `sys_exit`: same per-syscall floor as raw_tp, registers read with
    /// plain loads: the cheapest, tried first.
    TpBtf,
    /// Classic `syscalls:sys_{enter,exit}_{ioctl,close}` tracepoints (needs tracefs).
    Tracepoint,
}

impl LoadError {
    /// The system cannot support tracing as asked (privileges, BTF, hooks), as opposed to a
    /// runtime failure.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            Self::System(_) | Self::Btf(_) | Self::NoHook { .. } | Self::DenyUnsupported(_)
        )
    }
}

/// What the caller wants traced.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Also treat this device (kernel `dev_t`) as NVIDIA. Tests use `/dev/null`.
    pub extra_device: Option<u32>,
    /// Only this process (kernel-side filter).
    pub filter_tgid: Option<u32>,
    /// Ring-buffer size in bytes.
    pub ring_bytes: u32,
    /// Use only this attach type for the syscall hook (default: the cheapest that works).
    pub syscall_hook: Option<SyscallHook>,
    /// Refuse scheduling requests from these processes (BPF LSM; empty: no policy).
    pub deny_pids: Vec<u32>,
    /// Trace the NVIDIA devices (char major 195). Default: yes.
    pub nvidia: bool,
    /// Trace `/dev/kfd` (AMD KFD), whose character major this is (dynamic: see
    /// `amd::kfd_char_major`). Default: none.
    pub kfd_major: Option<u32>,
    /// Also treat this device (kernel `dev_t`) as `/dev/kfd`. Tests use `/dev/null`.
    pub extra_kfd_device: Option<u32>,
    /// Attach to the drivers' own functions (AMD KFD, gpu_ext hooks) where the kernel allows
    /// it (default), or use the syscall layer only.
    pub deep_hooks: bool,
    /// Which attach types the deep hooks may use (default: a trampoline, else a kprobe).
    pub deep_attach: DeepAttach,
}

/// The attach types the deep hooks may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DeepAttach {
    /// A trampoline (fentry/fexit, module BTF) where the kernel allows it, else a kprobe.
    #[default]
    Auto,
    /// Kprobes only (for comparisons, or where trampolines misbehave).
    Kprobe,
    /// Trampolines only (no kprobe fallback; the by-address MQD hooks are then left out).
    Trampoline,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            extra_device: None,
            filter_tgid: None,
            ring_bytes: DEFAULT_RING_BYTES,
            syscall_hook: None,
            deny_pids: Vec::new(),
            nvidia: true,
            kfd_major: None,
            extra_kfd_device: None,
            deep_hooks: true,
            deep_attach: DeepAttach::Auto,
        }
    }
}

/// A hook gpu-trace attached: the event it serves and the attach point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    pub event: &'static str,
    pub attach: String,
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} → {}", self.event, self.attach)
    }
}

/// The loaded, attached programs. Dropping it detaches everything (nothing is pinned).
pub struct Tracer {
    /// Dropped after `ebpf`'s programs are no longer needed: declared first, so dropped first.
    _deep: deep::DeepHooks,
    ebpf: Ebpf,
    pub hooks: Vec<Hook>,
    /// Attach points that were tried and refused before the chosen one, with the reason.
    pub refused: Vec<String>,
}

/// One attach strategy: a name for reports and the code that loads and attaches it.
type Attempt<'a> = (
    String,
    Box<dyn FnOnce(&mut Ebpf) -> Result<(), String> + 'a>,
);

fn attach_raw_tp(
    program: &'static str,
    tp: &'static str,
) -> impl FnOnce(&mut Ebpf) -> Result<(), String> {
    move |ebpf| {
        let prog: &mut RawTracePoint = ebpf
            .program_mut(program)
            .ok_or("program missing")?
            .try_into()
            .map_err(err)?;
        prog.load().map_err(err)?;
        prog.attach(tp).map(|_| ()).map_err(err)
    }
}

fn attach_tp_btf<'a>(
    program: &'static str,
    tp: &'static str,
    kernel_btf: &'a Option<Btf>,
) -> impl FnOnce(&mut Ebpf) -> Result<(), String> + 'a {
    move |ebpf| {
        let btf = kernel_btf.as_ref().ok_or("no kernel BTF")?;
        let prog: &mut BtfTracePoint = ebpf
            .program_mut(program)
            .ok_or("program missing")?
            .try_into()
            .map_err(err)?;
        prog.load(tp, btf).map_err(err)?;
        prog.attach().map(|_| ()).map_err(err)
    }
}

fn attach_tracepoints(
    pairs: &'static [(&'static str, &'static str, &'static str)],
) -> impl FnOnce(&mut Ebpf) -> Result<(), String> {
    move |ebpf| {
        system::ensure_tracefs().map_err(err)?;
        for (program, category, name) in pairs {
            let prog: &mut TracePoint = ebpf
                .program_mut(program)
                .ok_or("program missing")?
                .try_into()
                .map_err(err)?;
            prog.load().map_err(err)?;
            prog.attach(category, name).map_err(err)?;
        }
        Ok(())
    }
}

fn err(e: impl std::error::Error) -> String {
    // The message and its causes (aya puts the errno in the source of attach errors).
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    // The verifier log can be long: keep its first line and its last lines, which say why.
    let text = text
        .trim_end()
        .trim_end_matches("Verifier output:")
        .trim_end();
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 4 {
        return lines.join(" | ");
    }
    format!(
        "{} | … | {}",
        lines[0],
        lines[lines.len().saturating_sub(6)..].join(" | ")
    )
}

/// Tries each attempt in order; returns the first that worked.
fn first_that_attaches(
    ebpf: &mut Ebpf,
    event: &'static str,
    attempts: Vec<Attempt<'_>>,
    refused: &mut Vec<String>,
) -> Result<Hook, LoadError> {
    let mut tried = Vec::new();
    for (name, attempt) in attempts {
        match attempt(ebpf) {
            Ok(()) => {
                refused.extend(tried.iter().map(|t: &String| format!("{event}: {t}")));
                return Ok(Hook {
                    event,
                    attach: name,
                });
            }
            Err(why) => tried.push(format!("{name}: {why}")),
        }
    }
    Err(LoadError::NoHook {
        event,
        tried: tried
            .iter()
            .map(|t| format!("  - {t}"))
            .collect::<Vec<_>>()
            .join("\n"),
    })
}

impl Tracer {
    /// Checks privileges, resolves kernel offsets from BTF, loads the programs and attaches the
    /// best hook for each event.
    pub fn load(options: &LoadOptions) -> Result<Self, LoadError> {
        system::check_privileges()?;
        let ring = options.ring_bytes;
        if !ring.is_power_of_two() || ring < 4096 {
            return Err(LoadError::RingSize(ring));
        }
        let offsets = btf::load_kernel_offsets()?;
        let mut config = KernelConfig {
            nv_major: if options.nvidia { NV_MAJOR } else { 0 },
            extra_rdev: options.extra_device.unwrap_or(0),
            kfd_major: options.kfd_major.unwrap_or(0),
            extra_kfd_rdev: options.extra_kfd_device.unwrap_or(0),
            filter_tgid: options.filter_tgid.unwrap_or(0),
            ready: 1,
            ..Default::default()
        };
        offsets.apply(&mut config);
        raise_memlock_limit();

        let mut refused = Vec::new();
        let mut hooks = Vec::new();
        // AMD deep hooks: what the driver's BTF says, before load (it goes into KFD_DEEP). The
        // test device (`extra_kfd_device`) is not the driver: the syscall layer serves it.
        let deep_plan = if options.kfd_major.is_some()
            && options.deep_hooks
            && options.extra_kfd_device.is_none()
        {
            match deep::KfdDeepPlan::prepare() {
                Ok(plan) => Some(plan),
                Err(why) => {
                    refused.push(format!("AMD deep hooks: {why}"));
                    None
                }
            }
        } else {
            None
        };
        let deep_config = deep_plan
            .as_ref()
            .map_or_else(KfdDeepConfig::default, |p| p.config);

        let mut ebpf = EbpfLoader::new()
            .override_global("CONFIG", &config, true)
            .override_global("KFD_DEEP", &deep_config, true)
            .map_max_entries("EVENTS", ring)
            .load(PROGRAMS)
            .map_err(LoadError::Load)?;

        let kernel_btf = Btf::from_sys_fs().ok();
        // Deep hooks first, then the switch that takes their commands away from the syscall
        // layer, then the syscall layer: no call is seen twice, none is missed in between.
        let mut deep_hooks = match &deep_plan {
            Some(plan) => deep::attach(
                &mut ebpf,
                plan,
                options.deny_pids.is_empty(),
                options.deep_attach,
            ),
            None => deep::DeepHooks::default(),
        };
        // NVIDIA: the scheduling hooks of a gpu_ext-patched driver, where one is loaded.
        if options.nvidia && options.deep_hooks {
            match gpu_ext::prepare() {
                Ok(targets) => {
                    gpu_ext::attach(&mut ebpf, &targets, &mut deep_hooks, options.deep_attach)
                }
                Err(why) => deep_hooks
                    .refused
                    .push(format!("NVIDIA gpu_ext hooks: {why}")),
            }
        }
        refused.extend(deep_hooks.refused.iter().cloned());
        hooks.extend(deep_hooks.hooks.iter().cloned());
        if deep_hooks.handler_mask != 0 {
            let mut switches: Array<_, u32> = Array::try_from(
                ebpf.map_mut("SWITCHES")
                    .ok_or(LoadError::MissingMap("SWITCHES"))?,
            )
            .map_err(|source| LoadError::Map {
                name: "SWITCHES",
                source,
            })?;
            switches
                .set(0, deep_hooks.handler_mask, 0)
                .map_err(|source| LoadError::Map {
                    name: "SWITCHES",
                    source,
                })?;
        }
        let all_kfd = [
            nr::CREATE_QUEUE,
            nr::DESTROY_QUEUE,
            nr::UPDATE_QUEUE,
            nr::SET_CU_MASK,
        ]
        .iter()
        .all(|&n| deep_hooks.handler_mask & (1 << n) != 0);
        // AMD only, every command served by the driver hooks: no program on every syscall.
        let syscall_layer_needed = options.nvidia || options.extra_device.is_some() || !all_kfd;

        static SYSCALL_TPS: &[(&str, &str, &str)] = &[
            ("tp_ioctl_enter", "syscalls", "sys_enter_ioctl"),
            ("tp_ioctl_exit", "syscalls", "sys_exit_ioctl"),
            ("tp_close_enter", "syscalls", "sys_enter_close"),
            ("tp_close_exit", "syscalls", "sys_exit_close"),
        ];
        static EXIT_TPS: &[(&str, &str, &str)] =
            &[("tp_process_exit", "sched", "sched_process_exit")];

        let wanted = |hook: SyscallHook| options.syscall_hook.is_none_or(|h| h == hook);
        let mut syscall_attempts: Vec<Attempt<'_>> = Vec::new();
        // tp_btf first: the same per-syscall floor as raw_tp, and its program reads the
        // registers with plain loads instead of helper calls (docs/performance.md, part 3).
        if wanted(SyscallHook::TpBtf) {
            syscall_attempts.push((
                "tp_btf/sys_exit".into(),
                Box::new(attach_tp_btf("sys_exit_btf", "sys_exit", &kernel_btf)),
            ));
        }
        if wanted(SyscallHook::RawTp) {
            syscall_attempts.push((
                "raw_tp/sys_exit".into(),
                Box::new(attach_raw_tp("sys_exit_raw", "sys_exit")),
            ));
        }
        if wanted(SyscallHook::Tracepoint) {
            syscall_attempts.push((
                "tracepoint/syscalls:sys_{enter,exit}_{ioctl,close}".into(),
                Box::new(attach_tracepoints(SYSCALL_TPS)),
            ));
        }
        if syscall_layer_needed {
            hooks.push(first_that_attaches(
                &mut ebpf,
                "ioctl+close",
                syscall_attempts,
                &mut refused,
            )?);
        } else {
            refused.push(
                "ioctl+close: syscall layer not attached: the driver hooks serve every KFD \
                 command, so unrelated syscalls pay nothing"
                    .into(),
            );
        }

        let exit_attempts: Vec<Attempt<'_>> = vec![
            (
                "raw_tp/sched_process_exit".into(),
                Box::new(attach_raw_tp("process_exit_raw", "sched_process_exit")),
            ),
            (
                "tp_btf/sched_process_exit".into(),
                Box::new(attach_tp_btf(
                    "process_exit_btf",
                    "sched_process_exit",
                    &kernel_btf,
                )),
            ),
            (
                "tracepoint/sched:sched_process_exit".into(),
                Box::new(attach_tracepoints(EXIT_TPS)),
            ),
        ];
        hooks.push(first_that_attaches(
            &mut ebpf,
            "process exit",
            exit_attempts,
            &mut refused,
        )?);

        if !options.deny_pids.is_empty() {
            hooks.push(attach_deny(&mut ebpf, &options.deny_pids, &kernel_btf)?);
        }

        Ok(Self {
            _deep: deep_hooks,
            ebpf,
            hooks,
            refused,
        })
    }

    /// The ring buffer the programs write records into. Can be taken once.
    pub fn take_ring_buffer(&mut self) -> Result<RingBuf<MapData>, LoadError> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .ok_or(LoadError::MissingMap("EVENTS"))?;
        RingBuf::try_from(map).map_err(|source| LoadError::Map {
            name: "EVENTS",
            source,
        })
    }

    /// The kernel-side counters, summed over CPUs.
    pub fn counters(&self) -> Result<KernelCounters, LoadError> {
        let map = self
            .ebpf
            .map("COUNTERS")
            .ok_or(LoadError::MissingMap("COUNTERS"))?;
        let array: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(map).map_err(|source| LoadError::Map {
                name: "COUNTERS",
                source,
            })?;
        let sum = |index: u32| -> Result<u64, LoadError> {
            let values = array.get(&index, 0).map_err(|source| LoadError::Map {
                name: "COUNTERS",
                source,
            })?;
            Ok(values.iter().sum())
        };
        Ok(KernelCounters {
            dropped: sum(counter::DROPPED)?,
            read_failed: sum(counter::READ_FAILED)?,
            ignored: sum(counter::IGNORED)?,
            emitted: sum(counter::EMITTED)?,
            fd_lookup_failed: sum(counter::FD_LOOKUP_FAILED)?,
            denied: sum(counter::DENIED)?,
        })
    }

    /// Detaches and unloads every program, keeping the maps: no record is written after this
    /// returns (but one a program was writing at that moment may still arrive: drain until
    /// the counters stop changing), and [`counters`](Self::counters) stays readable.
    pub fn detach(&mut self) {
        use aya::programs::Program;
        self._deep.detach();
        for (_, program) in self.ebpf.programs_mut() {
            // Programs never loaded (the hooks not chosen) answer NotLoaded: nothing to do.
            let _ = match program {
                Program::RawTracePoint(p) => p.unload(),
                Program::BtfTracePoint(p) => p.unload(),
                Program::TracePoint(p) => p.unload(),
                Program::KProbe(p) => p.unload(),
                Program::FEntry(p) => p.unload(),
                Program::FExit(p) => p.unload(),
                Program::Lsm(p) => p.unload(),
                _ => Ok(()),
            };
        }
    }

    /// One line for the start-up report: which hook serves which event.
    pub fn describe_hooks(&self) -> String {
        self.hooks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// `--deny-pid`: checks that BPF LSM programs can run here, fills the deny map with the
/// processes' tgids, then attaches the LSM programs. Fails, rather than tracing on while
/// pretending to enforce, when any step is refused.
fn attach_deny(ebpf: &mut Ebpf, pids: &[u32], kernel_btf: &Option<Btf>) -> Result<Hook, LoadError> {
    let active = system::active_lsms().map_err(|e| LoadError::DenyUnsupported(e.to_string()))?;
    if !active.split(',').any(|m| m == "bpf") {
        return Err(LoadError::DenyUnsupported(format!(
            "the BPF LSM is not active (active LSMs: {active}); reboot with the kernel parameter \
             lsm={active},bpf"
        )));
    }
    let btf = kernel_btf.as_ref().ok_or_else(|| {
        LoadError::DenyUnsupported("kernel BTF is missing (/sys/kernel/btf/vmlinux)".into())
    })?;
    let mut deny: BpfHashMap<_, u32, u32> = BpfHashMap::try_from(
        ebpf.map_mut("DENY").ok_or(LoadError::MissingMap("DENY"))?,
    )
    .map_err(|source| LoadError::Map {
        name: "DENY",
        source,
    })?;
    for &pid in pids {
        let tgid = system::thread_group_of(pid).ok_or(LoadError::NoSuchProcess { pid })?;
        deny.insert(tgid, 1, 0).map_err(|source| LoadError::Map {
            name: "DENY",
            source,
        })?;
    }
    for (program, hook) in [
        ("deny_file_ioctl", "file_ioctl"),
        ("deny_file_ioctl_compat", "file_ioctl_compat"),
    ] {
        let mut attach = || -> Result<(), String> {
            let prog: &mut Lsm = ebpf
                .program_mut(program)
                .ok_or("program missing")?
                .try_into()
                .map_err(err)?;
            prog.load(hook, btf).map_err(err)?;
            prog.attach().map(|_| ()).map_err(err)
        };
        attach().map_err(|why| {
            LoadError::DenyUnsupported(format!(
                "the kernel refused the BPF LSM program on {hook}: {why} BPF LSM programs need \
                 CONFIG_BPF_LSM=y, `bpf` in the lsm= boot parameter, and a kernel that allows \
                 BPF trampolines (run `gpu-trace doctor`)"
            ))
        })?;
    }
    Ok(Hook {
        event: "deny",
        attach: "lsm/file_ioctl + lsm/file_ioctl_compat".into(),
    })
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; raise it (harmless elsewhere).
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid struct; failure only matters on old kernels, where the
    // load error that follows says so.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
}
