//! Loading the kernel programs and attaching, per event, the cheapest hook the running kernel
//! allows. Every refusal is kept, so that the start-up report and the final error say what was
//! tried and why it failed.

pub mod amd;
pub mod deny;
pub mod hold;
pub mod module_hooks;
pub mod nvidia;
pub mod trampoline;

use std::{
    fmt,
    os::fd::{AsFd, AsRawFd},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::HashMap as BpfHashMap,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, Lsm, RawTracePoint, TracePoint},
};
use gpu_trace_common::{
    CGROUP_MATCH_MAX, CgroupMatch, KernelConfig, KfdDeepConfig, amd::nr, counter, nv_entry_bits,
    nvidia::NV_MAJOR, switch,
};
use thiserror::Error;

use crate::{
    model::stats::KernelCounters,
    probe::{
        btf::{self, KernelBtf},
        system,
    },
    targets,
};

/// The compiled kernel programs (built by build.rs).
pub(crate) static PROGRAMS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpu-trace-ebpf"));

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
    /// The kernel lacks every hook tried for `event` (no such tracepoint or attach type, a
    /// helper it does not have, no privileges): tests report this as a skip.
    #[error("the kernel refused every hook for {event}:\n{tried}\nSee docs/troubleshooting.md.")]
    NoHook { event: &'static str, tried: String },
    /// No hook for `event` attached and the kernel's verifier refused one of gpu-trace's own
    /// programs on the way ([`refused_by_verifier`]): a bug in the programs (or in their build),
    /// never a property of the machine, so never a skip.
    #[error(
        "the kernel's verifier refused gpu-trace's own program for {event}:\n{tried}\nThis is \
         a bug in gpu-trace's kernel programs, not a limit of this machine: report it with \
         `uname -r` and the lines above (docs/troubleshooting.md)."
    )]
    Rejected { event: &'static str, tried: String },
    #[error("map {0} is missing from the kernel programs (build mismatch)")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("--deny-pid/--deny-cgroup/--deny-container cannot work on this kernel: {0}")]
    DenyUnsupported(String),
    #[error("{what}: {n} cgroups given, the kernel programs take at most {CGROUP_MATCH_MAX}")]
    TooManyCgroups { what: &'static str, n: usize },
    #[error("--deny-pid {pid}: no such process (it must be running when gpu-trace starts)")]
    NoSuchProcess { pid: u32 },
    #[error(
        "--bpf-stats: the kernel refused to count BPF program runs (BPF_ENABLE_STATS, Linux \
         5.8): {0}"
    )]
    RunStats(#[source] std::io::Error),
    /// The kernel lacks a feature nothing can replace (`probe::kernel`).
    #[error("{0}")]
    KernelTooOld(String),
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
            Self::System(_)
                | Self::Btf(_)
                | Self::NoHook { .. }
                | Self::DenyUnsupported(_)
                | Self::RunStats(_)
                | Self::KernelTooOld(_)
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
    /// Only trace tasks in these cgroup subtrees (kernel-side; empty: all). At most
    /// [`CGROUP_MATCH_MAX`].
    pub filter_cgroups: Vec<CgroupMatch>,
    /// Refuse scheduling requests from every task in these cgroup subtrees (BPF LSM).
    pub deny_cgroups: Vec<CgroupMatch>,
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
    /// `--bpf-stats`: the kernel counts every run of a BPF program (and its run time) while
    /// the tracer lives ([`Tracer::program_stats`]).
    pub bpf_stats: bool,
    /// Entries of the API layer's per-process sums (`--api-sums`).
    pub api_sums: u32,
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

impl LoadOptions {
    /// Whether anything is to be refused (`--deny-pid`, `--deny-cgroup`, `--deny-container`).
    pub fn denies(&self) -> bool {
        !self.deny_pids.is_empty() || !self.deny_cgroups.is_empty()
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            extra_device: None,
            filter_tgid: None,
            ring_bytes: DEFAULT_RING_BYTES,
            syscall_hook: None,
            deny_pids: Vec::new(),
            filter_cgroups: Vec::new(),
            deny_cgroups: Vec::new(),
            nvidia: true,
            kfd_major: None,
            extra_kfd_device: None,
            deep_hooks: true,
            deep_attach: DeepAttach::Auto,
            bpf_stats: false,
            api_sums: gpu_trace_common::api::API_SUMS_DEFAULT,
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

/// `TRACKED` bit of the kernel programs: the process used an NVIDIA device (its `close()` calls
/// and exit are reported). Must match gpu-trace-ebpf's `TRACK_NV`.
pub const TRACK_NV: u32 = 1;
/// `TRACKED` bit: the process used `/dev/kfd` (its exit is reported). gpu-trace-ebpf's `TRACK_KFD`.
pub const TRACK_KFD: u32 = 2;

/// The loaded, attached programs. Dropping it detaches everything (nothing is pinned).
pub struct Tracer {
    /// Dropped after `ebpf`'s programs are no longer needed: declared first, so dropped first.
    _deep: module_hooks::ModuleHooks,
    ebpf: Ebpf,
    pub hooks: Vec<Hook>,
    /// Attach points that were tried and refused before the chosen one, with the reason.
    pub refused: Vec<String>,
    /// Keeps the kernel's BPF run statistics on (`--bpf-stats`) until the tracer is dropped.
    _run_stats: Option<std::os::fd::OwnedFd>,
    /// The programs' skipped runs as last read while they were loaded: [`counters`]
    /// (Self::counters) still has them after [`detach`](Self::detach) unloads the programs.
    skipped: std::cell::Cell<u64>,
}

/// One of the tracer's programs, as the kernel counted it while `--bpf-stats` was on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    /// The program's name in the kernel object (`gpu-trace-ebpf`).
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
    /// Runs the kernel skipped (the program was already running on that CPU).
    pub missed: u64,
}

/// Code that loads and attaches a program (the error says why not).
type AttachFn<'a> = Box<dyn FnOnce(&mut Ebpf) -> Result<(), String> + 'a>;

/// One attach strategy: a name for reports and the code that loads and attaches it.
struct Attempt<'a> {
    name: String,
    attach: AttachFn<'a>,
}

impl<'a> Attempt<'a> {
    fn new(name: String, attach: impl FnOnce(&mut Ebpf) -> Result<(), String> + 'a) -> Self {
        Self {
            name,
            attach: Box::new(attach),
        }
    }

    /// The raw tracepoint program of `tp`.
    fn raw_tp(tp: targets::RawTracepoint) -> Self {
        Self::new(
            format!("raw_tp/{}", tp.name),
            attach_raw_tp(tp.raw_program, tp.name),
        )
    }

    /// The BTF-typed tracepoint program of `tp`.
    fn tp_btf(tp: targets::RawTracepoint, kernel_btf: &'a Option<Btf>) -> Self {
        Self::new(
            format!("tp_btf/{}", tp.name),
            attach_tp_btf(tp.btf_program, tp.name, kernel_btf),
        )
    }
}

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
    tracepoints: &'static [targets::Tracepoint],
) -> impl FnOnce(&mut Ebpf) -> Result<(), String> {
    move |ebpf| {
        system::ensure_tracefs().map_err(err)?;
        for targets::Tracepoint {
            program,
            category,
            name,
        } in tracepoints
        {
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
    for Attempt { name, attach } in attempts {
        match attach(ebpf) {
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
    Err(no_hook_error(event, &tried))
}

/// Whether one attempt's failure (as [`err`] words it) is the verifier refusing the program
/// itself, as opposed to the kernel lacking what the attempt needs. A load that failed with a
/// verifier log is the verifier's refusal, unless the log says a helper is unknown to this
/// kernel (`unknown func`, or `invalid func` for an id past the kernel's last helper): that is
/// a kernel without the helper, as `probe::kernel::explain_refusal` reports. A load refused
/// with no log (EPERM, a program type the kernel does not have) and every attach failure are
/// the kernel's.
pub fn refused_by_verifier(why: &str) -> bool {
    why.contains("BPF_PROG_LOAD syscall returned")
        && why.contains("Verifier output:")
        && !why.contains("unknown func ")
        && !why.contains("invalid func unknown#")
}

/// The error for `event` when every attempt in `tried` (`"<attempt>: <why>"`) failed:
/// [`LoadError::Rejected`] when the verifier refused one of them, else [`LoadError::NoHook`].
fn no_hook_error(event: &'static str, tried: &[String]) -> LoadError {
    // Every hook refused for one reason an option caused (a helper this kernel lacks): say so.
    let explained = tried
        .iter()
        .find_map(|t| crate::probe::kernel::explain_refusal(t))
        .map(|why| format!("\n  ({why})"))
        .unwrap_or_default();
    let tried_text = tried
        .iter()
        .map(|t| format!("  - {t}"))
        .collect::<Vec<_>>()
        .join("\n")
        + &explained;
    if tried.iter().any(|t| refused_by_verifier(t)) {
        LoadError::Rejected {
            event,
            tried: tried_text,
        }
    } else {
        LoadError::NoHook {
            event,
            tried: tried_text,
        }
    }
}

impl Tracer {
    /// Checks privileges, reads and parses vmlinux's BTF (once), resolves kernel offsets from
    /// it, loads the programs and attaches the best hook for each event.
    pub fn load(options: &LoadOptions) -> Result<Self, LoadError> {
        preflight(options)?;
        Self::load_with(options, &KernelBtf::load()?)
    }

    /// [`Tracer::load`] with vmlinux's BTF already parsed (doctor loads twice on one parse).
    pub fn load_with(options: &LoadOptions, kernel_btf: &KernelBtf) -> Result<Self, LoadError> {
        preflight(options)?;
        let config = kernel_config(options, kernel_btf)?;
        raise_memlock_limit();

        let mut refused = Vec::new();
        let mut hooks = Vec::new();
        let deep_plan = kfd_deep_plan(options, kernel_btf, &mut refused);
        let mut ebpf = load_programs(options, kernel_btf, &config, deep_plan.as_ref())?;

        let aya_btf = &kernel_btf.aya;
        // Deep hooks first, then the switch that takes their commands away from the syscall
        // layer, then the syscall layer: no call is seen twice, none is missed in between.
        let (deep_hooks, nv_bits) =
            attach_driver_hooks(&mut ebpf, options, kernel_btf, deep_plan.as_ref());
        refused.extend(deep_hooks.refused.iter().cloned());
        hooks.extend(deep_hooks.hooks.iter().cloned());
        // What the driver hooks serve, before the syscall layer attaches.
        set_switches(&mut ebpf, &deep_hooks, nv_bits)?;
        if syscall_layer_needed(options, &deep_hooks, nv_bits) {
            hooks.push(first_that_attaches(
                &mut ebpf,
                "ioctl+close",
                syscall_attempts(options, aya_btf),
                &mut refused,
            )?);
        } else {
            refused.push(
                "ioctl+close: syscall layer not attached: the driver's own hooks serve every \
                 call, so unrelated syscalls pay nothing"
                    .into(),
            );
        }
        hooks.push(first_that_attaches(
            &mut ebpf,
            "process exit",
            process_exit_attempts(aya_btf),
            &mut refused,
        )?);

        if options.denies() {
            hooks.extend(attach_deny(&mut ebpf, &options.deny_pids, aya_btf)?);
        }

        // Counting starts once everything is attached, before any event is read.
        let run_stats = if options.bpf_stats {
            Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime)
                    .map_err(|e| LoadError::RunStats(e.io_error))?,
            )
        } else {
            None
        };
        Ok(Self {
            _deep: deep_hooks,
            ebpf,
            hooks,
            refused,
            _run_stats: run_stats,
            skipped: std::cell::Cell::new(0),
        })
    }

    /// The loaded object, for the API layer (`crate::api::attach`), which loads its uprobe
    /// programs into it (where they share the open-call stacks, `API_OPEN`, with the driver
    /// programs that tag their records from them), attaches them and reads their sums.
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// [`Self::ebpf_mut`], read only.
    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
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

    /// Late attach: marks processes found by the start-up inventory in the kernel programs'
    /// `TRACKED` map, as if they had issued a traced ioctl, so that their `close()` calls (NVIDIA)
    /// and their exit are reported. `(tgid, bits)`: [`TRACK_NV`] and/or [`TRACK_KFD`]. A process
    /// that issued a traced call meanwhile keeps its bits (they are or-ed).
    pub fn track(&mut self, pids: &[(u32, u32)]) -> Result<(), LoadError> {
        let map = |source| LoadError::Map {
            name: "TRACKED",
            source,
        };
        let mut tracked: BpfHashMap<_, u32, u32> = BpfHashMap::try_from(
            self.ebpf
                .map_mut("TRACKED")
                .ok_or(LoadError::MissingMap("TRACKED"))?,
        )
        .map_err(map)?;
        for &(tgid, bits) in pids {
            let old = tracked.get(&tgid, 0).unwrap_or(0);
            tracked.insert(&tgid, &(old | bits), 0).map_err(map)?;
        }
        Ok(())
    }

    /// The kernel-side counters, summed over CPUs.
    pub fn counters(&self) -> Result<KernelCounters, LoadError> {
        read_counters(&self.ebpf, self.skipped_runs())
    }

    /// The runs of the tracer's programs the kernel skipped so far (each program's
    /// `recursion_misses`); after [`detach`](Self::detach), the last count read before it.
    fn skipped_runs(&self) -> u64 {
        let now: u64 = self.program_stats().iter().map(|p| p.missed).sum();
        // Unloaded programs answer nothing: keep the larger, earlier count.
        let kept = self.skipped.get().max(now);
        self.skipped.set(kept);
        kept
    }

    /// Detaches and unloads every program, keeping the maps: no record is written after this
    /// returns (but one a program was writing at that moment may still arrive: drain until
    /// the counters stop changing), and [`counters`](Self::counters) stays readable.
    pub fn detach(&mut self) {
        use aya::programs::Program;
        // The skipped runs are read from the programs, which this unloads: keep the count.
        self.skipped_runs();
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

    /// Ends the tracer. With `--api` attached one perf-event uprobe per symbol
    /// (`per_probe_uprobes`), the uprobes are still attached after [`detach`](Self::detach),
    /// and the kernel removes each with a grace period (a minute for PyTorch's runtimes): a
    /// child holds them and pays for that after this process has exited
    /// ([`hold::hold_in_background`]). Otherwise (batched links: milliseconds), dropped here.
    pub fn release(self, per_probe_uprobes: bool) {
        if per_probe_uprobes && hold::hold_in_background() {
            std::mem::forget(self);
        }
    }

    /// Runs and run time of each of the tracer's loaded programs, as counted since
    /// `--bpf-stats` turned counting on (all zero without it), and the runs the kernel skipped
    /// (always counted). Read before [`detach`](Self::detach), which unloads them.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        let mut out: Vec<ProgramStats> = self
            .ebpf
            .programs()
            .filter_map(|(name, program)| {
                let fd = program.fd().ok()?.as_fd().as_raw_fd();
                let s = trampoline::run_stats(fd)?;
                Some(ProgramStats {
                    name: name.to_string(),
                    runs: s.runs,
                    run_time_ns: s.run_time_ns,
                    missed: s.missed,
                })
            })
            .collect();
        // Trampolines on module functions: loaded outside Aya (loader/trampoline.rs). A
        // program attached to several functions (dqm_create_fexit) is one line per copy.
        out.extend(self._deep.trampolines().iter().filter_map(|t| {
            let s = t.run_stats()?;
            Some(ProgramStats {
                name: t.name.clone(),
                runs: s.runs,
                run_time_ns: s.run_time_ns,
                missed: s.missed,
            })
        }));
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
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

/// The kernel programs' `CONFIG` global: the devices and filters of `options`, and the kernel
/// offsets read from vmlinux's BTF.
fn kernel_config(options: &LoadOptions, kernel_btf: &KernelBtf) -> Result<KernelConfig, LoadError> {
    let config = KernelConfig {
        nv_major: if options.nvidia { NV_MAJOR } else { 0 },
        extra_rdev: options.extra_device.unwrap_or(0),
        kfd_major: options.kfd_major.unwrap_or(0),
        extra_kfd_rdev: options.extra_kfd_device.unwrap_or(0),
        filter_tgid: options.filter_tgid.unwrap_or(0),
        filter_cgroups: options.filter_cgroups.len() as u32,
        deny_cgroups: options.deny_cgroups.len() as u32,
        ready: 1,
        ..btf::kernel_offsets(&kernel_btf.vmlinux)?
    };
    // Before 5.15 the gpu_ext hook programs find the user registers on the kernel stack;
    // without even that, they report no system call (their records then match no ioctl).
    let (task_stack, stack_regs) = btf::stack_regs(&kernel_btf.vmlinux).unwrap_or((0, 0));
    Ok(KernelConfig {
        task_stack,
        stack_regs,
        ..config
    })
}

/// AMD deep hooks: what the driver's BTF says, before load (it goes into `KFD_DEEP`); why not,
/// into `refused`. The test device (`extra_kfd_device`) is not the driver: the syscall layer
/// serves it.
fn kfd_deep_plan(
    options: &LoadOptions,
    kernel_btf: &KernelBtf,
    refused: &mut Vec<String>,
) -> Option<amd::KfdDeepPlan> {
    if options.kfd_major.is_none() || !options.deep_hooks || options.extra_kfd_device.is_some() {
        return None;
    }
    match amd::KfdDeepPlan::prepare(&kernel_btf.vmlinux) {
        Ok(plan) => Some(plan),
        Err(why) => {
            refused.push(format!("AMD deep hooks: {why}"));
            None
        }
    }
}

/// Loads the kernel programs with their globals set and the ring buffer sized, and fills the
/// cgroup filters before anything attaches (the filter holds from the first event).
fn load_programs(
    options: &LoadOptions,
    kernel_btf: &KernelBtf,
    config: &KernelConfig,
    deep_plan: Option<&amd::KfdDeepPlan>,
) -> Result<Ebpf, LoadError> {
    let deep_config = deep_plan.map_or_else(KfdDeepConfig::default, |p| p.config);
    // Relocations use the BTF parsed once at start, as every other step does (without it,
    // aya would read vmlinux's BTF again, only if the object needed it).
    let mut loader = EbpfLoader::new();
    if let Some(btf) = kernel_btf.aya.as_ref() {
        loader.btf(btf);
    }
    let mut ebpf = loader
        .override_global("CONFIG", config, true)
        .override_global("KFD_DEEP", &deep_config, true)
        .map_max_entries("EVENTS", options.ring_bytes)
        .map_max_entries("API_STATS", options.api_sums)
        .map_max_entries("API_THROUGH", options.api_sums)
        .load(PROGRAMS)
        .map_err(LoadError::Load)?;
    fill_cgroup_map(&mut ebpf, "CGROUP_FILTER", &options.filter_cgroups)?;
    fill_cgroup_map(&mut ebpf, "DENY_CGROUP", &options.deny_cgroups)?;
    Ok(ebpf)
}

/// The driver's own hooks this kernel allows: AMD's deep hooks (`deep_plan`), NVIDIA's entry
/// points and gpu_ext scheduling hooks. Returns them with the NVIDIA entry points hooked
/// (`nv_entry_bits`).
fn attach_driver_hooks(
    ebpf: &mut Ebpf,
    options: &LoadOptions,
    kernel_btf: &KernelBtf,
    deep_plan: Option<&amd::KfdDeepPlan>,
) -> (module_hooks::ModuleHooks, u32) {
    let mut deep_hooks = match deep_plan {
        Some(plan) => amd::attach(ebpf, plan, !options.denies(), options.deep_attach),
        None => module_hooks::ModuleHooks::default(),
    };
    let mut nv_bits = 0;
    if !(options.nvidia && options.deep_hooks) {
        return (deep_hooks, nv_bits);
    }
    // NVIDIA: the driver's own entry points, where the kernel lets them be hooked and the
    // syscall layer is not needed for what the driver never sees.
    match nv_entry_refusal(options).map_or_else(|| nvidia::entry::prepare(&kernel_btf.vmlinux), Err)
    {
        Ok(targets) => {
            nv_bits = nvidia::entry::attach(ebpf, &targets, &mut deep_hooks, options.deep_attach)
        }
        Err(why) => deep_hooks
            .refused
            .push(format!("NVIDIA driver entry points: {why}")),
    }
    // NVIDIA: the scheduling hooks of a gpu_ext-patched driver, where one is loaded.
    match nvidia::gpu_ext::prepare(&kernel_btf.vmlinux) {
        Ok(targets) => {
            nvidia::gpu_ext::attach(ebpf, &targets, &mut deep_hooks, options.deep_attach)
        }
        Err(why) => deep_hooks
            .refused
            .push(format!("NVIDIA gpu_ext hooks: {why}")),
    }
    (deep_hooks, nv_bits)
}

/// Why the options leave NVIDIA's calls to the syscall layer rather than the driver's entry
/// points, if they do.
fn nv_entry_refusal(options: &LoadOptions) -> Option<String> {
    if options.denies() {
        Some(
            "--deny-* refuses calls before they reach the driver, so the syscall layer serves \
             them"
                .to_string(),
        )
    } else if options.extra_device.is_some() {
        Some("--watch-device traces a device that is not the driver's".into())
    } else {
        options.syscall_hook.map(|hook| {
            format!(
                "--syscall-hook {} asks for the syscall layer",
                clap::ValueEnum::to_possible_value(&hook)
                    .map_or_else(|| format!("{hook:?}"), |v| v.get_name().to_string())
            )
        })
    }
}

/// Tells the syscall layer's programs which calls the driver hooks serve (`SWITCHES`).
fn set_switches(
    ebpf: &mut Ebpf,
    deep_hooks: &module_hooks::ModuleHooks,
    nv_bits: u32,
) -> Result<(), LoadError> {
    let mut switches: Array<_, u32> = Array::try_from(
        ebpf.map_mut("SWITCHES")
            .ok_or(LoadError::MissingMap("SWITCHES"))?,
    )
    .map_err(|source| LoadError::Map {
        name: "SWITCHES",
        source,
    })?;
    for (index, value) in [
        (switch::KFD_DEEP, deep_hooks.handler_mask),
        (switch::NV_ENTRY, nv_bits),
    ] {
        switches
            .set(index, &value, 0)
            .map_err(|source| LoadError::Map {
                name: "SWITCHES",
                source,
            })?;
    }
    Ok(())
}

/// Whether some call is left to the syscall layer: every call served by the driver's own
/// hooks (all KFD commands for AMD; ioctls and releases for NVIDIA) needs no program on every
/// syscall.
fn syscall_layer_needed(
    options: &LoadOptions,
    deep_hooks: &module_hooks::ModuleHooks,
    nv_bits: u32,
) -> bool {
    let all_kfd = [
        nr::CREATE_QUEUE,
        nr::DESTROY_QUEUE,
        nr::UPDATE_QUEUE,
        nr::SET_CU_MASK,
    ]
    .iter()
    .all(|&n| deep_hooks.handler_mask & (1 << n) != 0);
    let nv_all = nv_bits == nv_entry_bits::IOCTL | nv_entry_bits::RELEASE;
    (options.nvidia && !nv_all) || (!options.nvidia && !all_kfd) || options.extra_device.is_some()
}

/// The syscall layer's hooks for ioctl and close, in the order tried (`--syscall-hook` keeps
/// one).
fn syscall_attempts<'a>(options: &LoadOptions, aya_btf: &'a Option<Btf>) -> Vec<Attempt<'a>> {
    use targets::{SYS_EXIT, SYSCALL_TRACEPOINTS};
    let wanted = |hook: SyscallHook| options.syscall_hook.is_none_or(|h| h == hook);
    let mut attempts = Vec::new();
    // tp_btf first: the same per-syscall floor as raw_tp, and its program reads the
    // registers with plain loads instead of helper calls (docs/performance.md, part 3).
    if wanted(SyscallHook::TpBtf) {
        attempts.push(Attempt::tp_btf(SYS_EXIT, aya_btf));
    }
    if wanted(SyscallHook::RawTp) {
        attempts.push(Attempt::raw_tp(SYS_EXIT));
    }
    if wanted(SyscallHook::Tracepoint) {
        attempts.push(Attempt::new(
            "tracepoint/syscalls:sys_{enter,exit}_{ioctl,close}".into(),
            attach_tracepoints(&SYSCALL_TRACEPOINTS),
        ));
    }
    attempts
}

/// The hooks for a process's exit, in the order tried.
fn process_exit_attempts(aya_btf: &Option<Btf>) -> Vec<Attempt<'_>> {
    use targets::{PROCESS_EXIT, PROCESS_EXIT_TRACEPOINT};
    vec![
        Attempt::raw_tp(PROCESS_EXIT),
        Attempt::tp_btf(PROCESS_EXIT, aya_btf),
        Attempt::new(
            format!(
                "tracepoint/{}:{}",
                PROCESS_EXIT_TRACEPOINT[0].category, PROCESS_EXIT_TRACEPOINT[0].name
            ),
            attach_tracepoints(&PROCESS_EXIT_TRACEPOINT),
        ),
    ]
}

/// `--deny-pid`: checks that BPF LSM programs can run here, fills the deny map with the
/// processes' tgids, attaches the fork hook that denies what they create from then on, adds
/// their descendants that exist already, then attaches the LSM programs. Fails, rather than
/// tracing on while pretending to enforce, when any step is refused.
fn attach_deny(
    ebpf: &mut Ebpf,
    pids: &[u32],
    kernel_btf: &Option<Btf>,
) -> Result<Vec<Hook>, LoadError> {
    let active = system::active_lsms().map_err(|e| LoadError::DenyUnsupported(e.to_string()))?;
    if !system::lsm_list(&active).iter().any(|m| m == "bpf") {
        return Err(LoadError::DenyUnsupported(format!(
            "the BPF LSM is not active (active LSMs: {active}); reboot with the kernel parameter \
             lsm={active},bpf"
        )));
    }
    let btf = kernel_btf.as_ref().ok_or_else(|| {
        LoadError::DenyUnsupported(format!("kernel BTF is missing ({})", btf::VMLINUX_BTF_PATH))
    })?;
    let mut roots = std::collections::BTreeSet::new();
    for &pid in pids {
        roots.insert(system::thread_group_of(pid).ok_or(LoadError::NoSuchProcess { pid })?);
    }
    // With --deny-cgroup alone there is nothing to follow: a new process starts in its
    // parent's cgroup, so a subtree covers descendants by itself.
    let mut hooks = Vec::new();
    if !roots.is_empty() {
        follow_forks(ebpf, &roots)?;
        hooks.push(Hook {
            event: "deny-fork",
            attach: format!("raw_tp/{}", targets::DENY_FORK.name),
        });
    }
    for targets::LsmHook { program, hook } in targets::DENY {
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
            LoadError::DenyUnsupported(match crate::probe::kernel::explain_refusal(&why) {
                Some(missing) => {
                    format!("the kernel refused the BPF LSM program on {hook}: {missing}")
                }
                None => format!(
                    "the kernel refused the BPF LSM program on {hook}: {why} BPF LSM programs need \
                     CONFIG_BPF_LSM=y, `bpf` in the lsm= boot parameter, and a kernel that allows \
                     BPF trampolines (run `gpu-trace doctor`)"
                ),
            })
        })?;
    }
    hooks.push(Hook {
        event: "deny",
        attach: targets::DENY.map(|d| format!("lsm/{}", d.hook)).join(" + "),
    });
    Ok(hooks)
}

/// Fills the deny map with `roots`, attaches `deny_fork` (from then on the kernel denies every
/// process a denied one creates), then adds the roots' descendants that exist already
/// (`deny::add_existing_descendants`).
pub(crate) fn follow_forks(
    ebpf: &mut Ebpf,
    roots: &std::collections::BTreeSet<u32>,
) -> Result<(), LoadError> {
    let map_error = |source| LoadError::Map {
        name: "DENY",
        source,
    };
    {
        let mut deny: BpfHashMap<_, u32, u32> =
            BpfHashMap::try_from(ebpf.map_mut("DENY").ok_or(LoadError::MissingMap("DENY"))?)
                .map_err(map_error)?;
        for &tgid in roots {
            deny.insert(&tgid, &1, 0).map_err(map_error)?;
        }
    }
    attach_raw_tp(targets::DENY_FORK.program, targets::DENY_FORK.name)(ebpf).map_err(|why| {
        LoadError::DenyUnsupported(format!(
            "the kernel refused the program that denies the processes a denied process creates \
             (raw_tp/{}): {why}",
            targets::DENY_FORK.name
        ))
    })?;
    let mut deny: BpfHashMap<_, u32, u32> =
        BpfHashMap::try_from(ebpf.map_mut("DENY").ok_or(LoadError::MissingMap("DENY"))?)
            .map_err(map_error)?;
    deny::add_existing_descendants(roots, |pid| {
        if deny.get(&pid, 0).is_ok() {
            return Ok(false);
        }
        deny.insert(&pid, &1, 0)
            .map(|()| true)
            .map_err(|e| e.to_string())
    })
    .map_err(|why| {
        LoadError::DenyUnsupported(format!(
            "adding the denied processes' descendants to the deny map failed: {why} (at most {} \
             denied processes at once)",
            DENY_MAX
        ))
    })?;
    Ok(())
}

/// The counters of the `COUNTERS` map of `ebpf`, summed over CPUs, with `skipped` (the
/// programs' runs the kernel skipped, read from the programs, not this map).
fn read_counters(ebpf: &aya::Ebpf, skipped: u64) -> Result<KernelCounters, LoadError> {
    let map = ebpf
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
        skipped: Some(skipped),
        denied_unread: Some(sum(counter::DENIED_UNREAD)?),
        deny_unfollowed: Some(sum(counter::DENY_UNFOLLOWED)?),
    })
}

/// Entries of the kernel's deny map (`DENY_MAX` in `gpu-trace-ebpf/src/maps.rs`).
pub const DENY_MAX: u32 = 16384;

/// Writes cgroup subtrees into one of the programs' [`CgroupMatch`] arrays.
fn fill_cgroup_map(
    ebpf: &mut Ebpf,
    name: &'static str,
    subtrees: &[CgroupMatch],
) -> Result<(), LoadError> {
    if subtrees.is_empty() {
        return Ok(());
    }
    let mut map: Array<_, CgroupMatch> =
        Array::try_from(ebpf.map_mut(name).ok_or(LoadError::MissingMap(name))?)
            .map_err(|source| LoadError::Map { name, source })?;
    for (i, m) in subtrees.iter().enumerate() {
        map.set(i as u32, m, 0)
            .map_err(|source| LoadError::Map { name, source })?;
    }
    Ok(())
}

/// What is checked before anything is read or loaded: privileges, then the ring size and the
/// number of cgroup subtrees.
fn preflight(options: &LoadOptions) -> Result<(), LoadError> {
    system::check_privileges()?;
    // Below the ring buffer's release, the kernel is asked (a backport counts) before anything
    // loads.
    crate::probe::kernel::check_minimum(&system::kernel_release(), || {
        raise_memlock_limit();
        aya::sys::is_map_supported(aya::maps::MapType::RingBuf).ok()
    })
    .map_err(LoadError::KernelTooOld)?;
    let ring = options.ring_bytes;
    if !ring.is_power_of_two() || ring < 4096 {
        return Err(LoadError::RingSize(ring));
    }
    for (what, n) in [
        ("--cgroup/--container", options.filter_cgroups.len()),
        ("--deny-cgroup/--deny-container", options.deny_cgroups.len()),
    ] {
        if n > CGROUP_MATCH_MAX as usize {
            return Err(LoadError::TooManyCgroups { what, n });
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use crate::targets::*;

    /// This kernel's verifier refusing a program, as aya reports it: a raw_tp program that
    /// exits without setting r0 (`exit` alone), loaded for real. `None` where this process
    /// may not load BPF programs at all.
    fn real_verifier_refusal() -> Option<String> {
        use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_type};
        const EXIT_ONLY: [u64; 1] = [0x0000_0000_0000_0095];
        let mut log = vec![0u8; 4096];
        // SAFETY: all-zero is a valid bpf_attr.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the PROG_LOAD member, which BPF_PROG_LOAD reads.
        let u = unsafe { &mut attr.__bindgen_anon_3 };
        u.prog_type = bpf_prog_type::BPF_PROG_TYPE_RAW_TRACEPOINT as u32;
        u.insn_cnt = EXIT_ONLY.len() as u32;
        u.insns = EXIT_ONLY.as_ptr() as u64;
        u.license = c"GPL".as_ptr() as u64;
        u.log_level = 1;
        u.log_size = log.len() as u32;
        u.log_buf = log.as_mut_ptr() as u64;
        let io_error = match crate::probe::trial::sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) {
            Ok(_) => panic!("the kernel loaded a program that never sets r0"),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => return None,
            Err(e) => e,
        };
        let text = String::from_utf8_lossy(&log);
        let text = text.split('\0').next().unwrap_or_default().to_string();
        assert!(
            !text.trim().is_empty(),
            "the verifier said nothing ({io_error})"
        );
        let e = aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log: aya_obj::VerifierLog::new(text),
        };
        Some(super::err(e))
    }

    #[test]
    fn a_verifier_refusal_of_our_program_is_an_error_never_a_missing_hook() {
        let Some(verifier) = real_verifier_refusal() else {
            gpu_trace_core::skip::skipped(
                "a_verifier_refusal_of_our_program_is_an_error_never_a_missing_hook",
                "this process may not load BPF programs (run the tests as root)",
            );
            return;
        };
        assert!(super::refused_by_verifier(&verifier), "{verifier}");
        // The kernel lacking the hook: aya's own wording of each (an attach that found no
        // tracepoint, a load refused with no log, a helper this kernel does not know).
        let no_tracepoint = super::err(aya::programs::ProgramError::SyscallError(
            aya::sys::SyscallError {
                call: "bpf_raw_tracepoint_open",
                io_error: std::io::Error::from_raw_os_error(libc::ENOENT),
            },
        ));
        let no_log = super::err(aya::programs::ProgramError::LoadError {
            io_error: std::io::Error::from_raw_os_error(libc::EINVAL),
            verifier_log: aya_obj::VerifierLog::new(String::new()),
        });
        let no_helper = super::err(aya::programs::ProgramError::LoadError {
            io_error: std::io::Error::from_raw_os_error(libc::EINVAL),
            verifier_log: aya_obj::VerifierLog::new(
                "0: R1=ctx() R10=fp0\n0: (85) call bpf_get_func_ip#173\nunknown func \
                 bpf_get_func_ip#173\nprocessed 1 insns"
                    .into(),
            ),
        });
        for missing in [&no_tracepoint, &no_log, &no_helper] {
            assert!(!super::refused_by_verifier(missing), "{missing}");
        }
        let missing = super::no_hook_error(
            "ioctl+close",
            &[
                format!("tp_btf/sys_exit: {no_log}"),
                format!("raw_tp/sys_exit: {no_tracepoint}"),
            ],
        );
        assert!(
            matches!(missing, super::LoadError::NoHook { .. }) && missing.is_unsupported(),
            "{missing}"
        );
        let rejected = super::no_hook_error(
            "ioctl+close",
            &[
                format!("tp_btf/sys_exit: {no_helper}"),
                format!("raw_tp/sys_exit: {verifier}"),
                format!("tracepoint/syscalls:sys_exit_ioctl: {no_tracepoint}"),
            ],
        );
        assert!(
            matches!(rejected, super::LoadError::Rejected { .. }) && !rejected.is_unsupported(),
            "{rejected}"
        );
        assert!(
            rejected.to_string().contains("bug in gpu-trace"),
            "{rejected}"
        );
    }

    #[test]
    fn every_program_named_here_is_in_the_kernel_object() {
        // Parsed, not loaded: no kernel involved.
        let object = aya_obj::Object::parse(super::PROGRAMS).expect("the kernel object parses");
        let mut names: Vec<&str> = vec![
            SYS_EXIT.raw_program,
            SYS_EXIT.btf_program,
            PROCESS_EXIT.raw_program,
            PROCESS_EXIT.btf_program,
            MQD_INIT_PROGRAM,
        ];
        names.extend(SYSCALL_TRACEPOINTS.iter().map(|t| t.program));
        names.extend(PROCESS_EXIT_TRACEPOINT.iter().map(|t| t.program));
        names.extend(DENY.iter().map(|d| d.program));
        let deep = KFD_HANDLERS
            .iter()
            .map(|h| h.target)
            .chain(DQM_CREATE)
            .chain([PQM_UNINIT])
            .chain(GPU_EXT)
            .chain([NV_IOCTL_ENTRY, NV_RELEASE_ENTRY]);
        for t in deep {
            names.push(t.trampoline);
            names.extend(t.kprobes);
        }
        assert!(
            !object.programs.keys().any(|k| k.starts_with("bench_floor")),
            "the benchmark's floor programs are in gpu-trace's own object"
        );
        for name in names {
            assert!(
                object.programs.contains_key(name),
                "program {name} is not in the kernel object"
            );
        }
    }
}
