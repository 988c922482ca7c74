//! `gpu-trace api` without `--resolve`: the API layer's tracing (issue 28). Every table symbol
//! of every library mapped in each target gets a uprobe and a uretprobe, attached per process
//! (the kernel fires them for that process only), with a cookie naming the library and symbol;
//! the kernel adds the calls up (`probes/api_call.rs`) and this reads the sums each interval
//! and at exit. Launch mode (`-- CMD`) attaches by path before the child execs, so that the
//! first calls are seen; every interval rescans each target's maps and attaches new libraries.
//!
//! Its records (`API_CALL`, `API_RECURSION`, `API_STUCK`, `API_PATH`, `API_HANDOUT`) leave
//! through the core's [`Pipeline`] and its line outputs, as the main trace's `--api` records
//! do: one text shape and one JSON shape per record kind for both commands.

use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
};
use gpu_trace_common::api::{ApiKey, ApiStat};
use gpu_trace_core::api::events::{Site, StuckEvent};
use gpu_trace_core::api::names::{self, ApiEvent};
use gpu_trace_core::api::stats::{self, CallStats};
use gpu_trace_core::api::symbols::SymbolTable;
use gpu_trace_core::escape::{decode_lossless, escape_text};
use gpu_trace_core::event::Origin;
use gpu_trace_core::output::{Format, clock::Clock, text::TimestampMode};
use gpu_trace_core::pipeline::{Pipeline, PipelineConfig};
use gpu_trace_core::sink::SinkError;
use gpu_trace_core::wire::{self, RawRecord};

use super::ApiError;
use super::attach::{Attacher, load_programs};
use super::stuck::StuckFinder;
use crate::cli::{ApiArgs, ApiFormat};
use crate::loader::trampoline::run_stats;
use crate::probe::cgroup::{CgroupResolver, Subtree, process_v2_path};
use crate::probe::libraries;

/// How the tracing ended: the launched command's exit status (`None` in `--pid`/`--comm` mode).
pub struct Traced {
    pub child_status: Option<i32>,
}

/// Why tracing could not run.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(
        "loading the uprobe programs: {0} (the kernel needs uprobes (CONFIG_UPROBE_EVENTS) and \
         BPF attach cookies (5.15 or later); run as root)"
    )]
    Load(String),
    #[error("give --pid, --comm, --cgroup, --container or `-- CMD` (which processes to trace)")]
    NoTarget,
    #[error(transparent)]
    Cgroup(#[from] crate::probe::cgroup::CgroupError),
    #[error(
        "--cgroup/--container: no cgroup v2 mount on this host (mount -t cgroup2 none /sys/fs/cgroup)"
    )]
    NoCgroup2,
    #[error("{0}")]
    NoGpuLibrary(String),
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    #[error("reading the clocks: {0}")]
    Clock(std::io::Error),
    /// The event loop could not start or wait (the runtime, the signal handlers, the ring).
    #[error("{0}")]
    Loop(String),
    /// `-o FILE` could not be opened.
    #[error("{0}")]
    Output(String),
}

/// Where the records go: the core's pipeline, its lines on standard output or in `-o FILE`.
pub(crate) type Lines = Pipeline<BufWriter<Box<dyn Write>>>;

/// The pipeline of `args`' format into `sink` (standard output or `-o FILE`): every record a
/// line, no driver statistics (the call tables are this command's own).
pub(crate) fn lines(args: &ApiArgs, sink: Box<dyn Write>) -> Result<Lines, TraceError> {
    let config = PipelineConfig {
        verbose: args.verbose,
        pids: Vec::new(),
        comms: Vec::new(),
        format: match args.format {
            ApiFormat::Text => Format::Text,
            ApiFormat::Json => Format::Json,
        },
        timestamps: TimestampMode::Wall,
        stats: false,
        clock: Clock::from_system().map_err(TraceError::Clock)?,
        show_container: false,
    };
    Ok(Pipeline::new(config, BufWriter::new(sink)))
}

/// Standard output failed: a closed pipe (`| head`) ends the run quietly, as coreutils do;
/// anything else is said once.
pub(crate) fn output_failed(e: &SinkError) {
    let closed = matches!(e, SinkError::Output(io) if io.kind() == std::io::ErrorKind::BrokenPipe);
    if !closed {
        crate::say!("gpu-trace: api: writing the output: {e}; tracing stops");
    }
}

/// The loaded programs and what is attached.
pub(crate) struct Tracer {
    pub(crate) ebpf: Ebpf,
    /// The probes attached and the names behind their cookies.
    pub(crate) at: Attacher,
    /// `API_CALL` and `API_RECURSION` records (the event loop's while it runs).
    pub(crate) ring: Option<RingBuf<MapData>>,
    /// `API_STUCK`'s finder.
    stuck: StuckFinder,
    /// The kernel's sums as read.
    pub(crate) sums: super::sums::Sums,
    /// `-v`: `API_HANDOUT` lines too.
    verbose: bool,
}

impl Tracer {
    pub(crate) fn load(table: SymbolTable, args: &ApiArgs) -> Result<Self, TraceError> {
        let mut ebpf = aya::EbpfLoader::new()
            .map_max_entries("API_STATS", args.api_sums)
            .map_max_entries("API_THROUGH", args.api_sums)
            .load(crate::loader::PROGRAMS)
            .map_err(|e| TraceError::Load(e.to_string()))?;
        let method =
            load_programs(&mut ebpf, args.verbose, args.max_depth).map_err(TraceError::Load)?;
        let ring = ebpf
            .take_map("EVENTS")
            .and_then(|m| RingBuf::try_from(m).ok())
            .ok_or_else(|| TraceError::Load("no EVENTS ring buffer in the programs".into()))?;
        Ok(Self {
            ebpf,
            at: Attacher::new(table, crate::flags::stop_requested, method),
            ring: Some(ring),
            stuck: StuckFinder::default(),
            sums: super::sums::Sums::new(args.api_sums),
            verbose: args.verbose,
        })
    }

    fn scan(&mut self, pid: u32) -> Option<usize> {
        self.at.scan(&mut self.ebpf, pid)
    }

    /// [`Self::scan`] while tracing: a process that got probes says so on stderr (a target
    /// started since, a library it loaded since).
    pub(crate) fn scan_saying(&mut self, pid: u32) {
        let before = self.at.probes();
        let _ = self.scan(pid);
        let added = self.at.probes().saturating_sub(before);
        if added > 0 {
            let comm = libraries::comm_of(pid).unwrap_or_default();
            crate::say!(
                "gpu-trace: api: pid {pid} ({}): {added} more uprobes attached",
                escape_text(&decode_lossless(&comm))
            );
        }
    }

    fn site(&self, cookie: u64) -> Site {
        self.at.site(cookie)
    }

    /// Ends the run with the results already out, without waiting for the kernel to remove the
    /// probes: it waits for a grace period for each perf-event uprobe it removes (0.1 to 0.2 s
    /// each, one at a time: a minute for PyTorch's libcuda and libcudart on the GPU host). A
    /// child process inherits the probes' descriptors and drops them as it exits, in the
    /// background; this process then lets its own copies go without detaching (the last
    /// holder's close is the slow one). Where fork fails, detaches here.
    /// Batched links are removed here: milliseconds each, nothing left to the kernel.
    pub(crate) fn release_in_background(mut self) {
        if *self.at.method() == super::attach::AttachMethod::Batched {
            self.detach();
        } else if crate::loader::hold::hold_in_background() {
            std::mem::forget(self);
        } else {
            self.detach();
        }
    }

    /// Lets the processes held at a change of their link map go on (the end of the run).
    pub(crate) fn release_held(&mut self) {
        self.at.release_held(&mut self.ebpf);
    }

    /// Detaches everything now (the fallback of [`Self::release_in_background`]).
    fn detach(&mut self) {
        self.at.detach(&mut self.ebpf);
    }

    /// `api_entry runs=N api_return runs=M`: the kernel's run counts (BPF statistics on).
    /// Each program's batched copy counts with it.
    pub(crate) fn runs(&self) -> String {
        super::attach::PROGRAMS
            .iter()
            .zip(super::attach::PROGRAMS_MULTI)
            .map(|(name, multi)| {
                let runs: u64 = [*name, multi]
                    .iter()
                    .filter_map(|n| self.ebpf.program(n))
                    .filter_map(|p| p.fd().ok())
                    .filter_map(|fd| run_stats(fd.as_fd().as_raw_fd()))
                    .map(|s| s.runs)
                    .sum();
                format!("{name} runs={runs}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The records the ring holds now, into `out`. A target whose link map changed
    /// (`API_LOADED`) is read and attached at once, then continued if it was held.
    pub(crate) fn drain(
        &mut self,
        ring: &mut RingBuf<MapData>,
        out: &mut Lines,
    ) -> Result<(), SinkError> {
        let mut raw = Vec::new();
        while let Some(item) = ring.next() {
            raw.push(item.to_vec());
        }
        for signal in raw.iter().filter_map(|b| super::attach::signal_of(b)) {
            self.at.signal(&mut self.ebpf, &signal);
        }
        for b in &raw {
            if let Some((event, origin)) = self.decode(b) {
                out.api_event(&event, &origin)?;
            }
        }
        // `-v` only (the interposer verdicts count them all).
        let handouts = self.at.take_handouts();
        for h in handouts.into_iter().filter(|_| self.verbose) {
            let origin = Origin::made_here(h.pid, h.pid, &h.comm);
            out.api_event(&ApiEvent::Handout(h), &origin)?;
        }
        out.flush().map_err(SinkError::Output)
    }

    /// One ring item as an event: an `API_CALL` or `API_RECURSION` (the same records and the
    /// same events as the main trace's, named by this run's attacher, which knows the
    /// library's path and whether it came through `LD_PRELOAD`).
    fn decode(&self, b: &[u8]) -> Option<(ApiEvent, Origin)> {
        let record = wire::parse_record(b).ok()?;
        let origin = record.origin();
        let site = |c| self.site(c);
        let event = match &record {
            RawRecord::ApiCall(r) => {
                let preload = self.at.is_preload(r.hdr.tgid, r.cookie);
                ApiEvent::Call(names::call_event(&origin, r, site, Some(preload)))
            }
            RawRecord::ApiRecursion(r) => {
                ApiEvent::Recursion(names::recursion_event(&origin, r, site))
            }
            _ => return None,
        };
        Some((event, origin))
    }

    /// The calls of `targets` open `after_ns` or longer and not reported yet.
    pub(crate) fn stuck(&mut self, targets: &HashSet<u32>, after_ns: u64) -> Vec<StuckEvent> {
        let at = &self.at;
        (self.stuck).find(
            &self.ebpf,
            |p| targets.contains(&p),
            after_ns,
            |c| at.site(c),
        )
    }

    /// The rows of `pids` in `sums` (a read of the kernel's sums), sorted.
    fn rows(&self, sums: Vec<(ApiKey, ApiStat)>, pids: &HashSet<u32>) -> Vec<CallStats> {
        let mut rows: Vec<CallStats> = sums
            .into_iter()
            .filter(|(key, _)| pids.contains(&key.tgid))
            .map(|(key, stat)| {
                CallStats::new(
                    key.tgid,
                    self.site(key.cookie),
                    self.at.is_preload(key.tgid, key.cookie),
                    stat.count,
                    stat.errors,
                    stat.total_ns,
                    &stat.hist,
                )
            })
            .collect();
        stats::sort(&mut rows);
        rows
    }
}

/// Two descriptors per probed symbol (entry and return), a hundred symbols in libcuda alone: a
/// soft limit of 1024 open files (a common default) leaves no room for PyTorch's runtimes. The
/// soft limit goes up to the hard one, as other tracers do.
pub(crate) fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The cgroup v2 subtrees `--cgroup` and `--container` name (none without them).
pub(crate) fn subtrees(args: &ApiArgs) -> Result<Vec<Subtree>, TraceError> {
    if args.cgroups.is_empty() && args.containers.is_empty() {
        return Ok(Vec::new());
    }
    let mut resolver = CgroupResolver::for_host().ok_or(TraceError::NoCgroup2)?;
    let mut out = Vec::new();
    for path in &args.cgroups {
        out.push(resolver.subtree(path)?);
    }
    for id in &args.containers {
        out.push(resolver.container(id)?);
    }
    Ok(out)
}

/// The running processes whose cgroup v2 is in one of `subtrees` (this one aside).
pub(crate) fn cgroup_members(subtrees: &[Subtree]) -> Vec<u32> {
    if subtrees.is_empty() {
        return Vec::new();
    }
    let own = std::process::id();
    libraries::all_pids()
        .into_iter()
        .filter(|&pid| {
            pid != own
                && process_v2_path(pid).is_some_and(|p| subtrees.iter().any(|s| s.contains(&p)))
        })
        .collect()
}

/// The targets' call table, then the `API_PATH` verdicts of their interposers, from one read
/// of the kernel's sums (`last`: at exit).
pub(crate) fn send_tables(
    args: &ApiArgs,
    tracer: &mut Tracer,
    targets: &HashSet<u32>,
    last: bool,
    out: &mut Lines,
) -> Result<(), SinkError> {
    let read = tracer.sums.read(&mut tracer.ebpf);
    let paths = tracer.at.paths(&read.sums, &read.through, last);
    print(args, &tracer.rows(read.sums, targets), last, out)?;
    for p in paths {
        if targets.contains(&p.pid) {
            let origin = Origin::made_here(p.pid, p.pid, &p.comm);
            out.api_event(&ApiEvent::Path(p), &origin)?;
        }
    }
    out.flush().map_err(SinkError::Output)
}

/// The call table (text) or `API_STATS` objects (JSON), after the lines written so far.
fn print(
    args: &ApiArgs,
    rows: &[CallStats],
    final_: bool,
    out: &mut Lines,
) -> Result<(), SinkError> {
    out.flush().map_err(SinkError::Output)?;
    let text = match args.format {
        ApiFormat::Text => {
            let title = if final_ {
                "API calls (at exit):"
            } else {
                "API calls so far:"
            };
            stats::text(title, rows)
        }
        ApiFormat::Json => rows.iter().map(|r| stats::json(r, final_) + "\n").collect(),
    };
    // Into the lines' own writer (standard output or `-o FILE`), after them.
    let w = out.output_mut();
    w.write_all(text.as_bytes())
        .and_then(|()| w.flush())
        .map_err(SinkError::Output)
}
