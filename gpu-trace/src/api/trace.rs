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
use std::io::{BufWriter, Stdout, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::time::{Duration, Instant};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
};
use gpu_trace_common::api::{API_STACK_MAX, ApiStack};
use gpu_trace_common::zerocopy::FromBytes as _;
use gpu_trace_core::api::events::{Site, StuckEvent};
use gpu_trace_core::api::names::{self, ApiEvent};
use gpu_trace_core::api::stats::{self, CallStats};
use gpu_trace_core::api::symbols::SymbolTable;
use gpu_trace_core::escape::{decode_lossless, escape_text};
use gpu_trace_core::event::{Origin, monotonic_ns};
use gpu_trace_core::output::{Format, clock::Clock, text::TimestampMode};
use gpu_trace_core::pipeline::{Pipeline, PipelineConfig};
use gpu_trace_core::sink::SinkError;
use gpu_trace_core::wire::{self, RawRecord};

use super::attach::{Attacher, load_programs};
use super::stuck::Symbolizer;
use super::{ApiError, symbol_table};
use crate::cli::{ApiArgs, ApiFormat, kernel_comm};
use crate::launch::{self, reap};
use crate::loader::trampoline::run_stats;
use crate::probe::cgroup::{CgroupResolver, Subtree, process_v2_path};
use crate::probe::libraries;
use crate::probe::untrusted;

const STACK_LEN: usize = size_of::<ApiStack>();
/// How often the open calls are checked for `--stuck-after`.
const STUCK_POLL: Duration = Duration::from_millis(250);

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
}

/// Where the records go: the core's pipeline, its lines on standard output.
type Lines = Pipeline<BufWriter<Stdout>>;

/// The pipeline of `args`' format: every record a line, no driver statistics (the call
/// tables are this command's own).
fn lines(args: &ApiArgs) -> Result<Lines, TraceError> {
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
    Ok(Pipeline::new(config, BufWriter::new(std::io::stdout())))
}

/// Standard output failed: a closed pipe (`| head`) ends the run quietly, as coreutils do;
/// anything else is said once.
fn output_failed(e: &SinkError) {
    let closed = matches!(e, SinkError::Output(io) if io.kind() == std::io::ErrorKind::BrokenPipe);
    if !closed {
        crate::say!("gpu-trace: api: writing the output: {e}; tracing stops");
    }
}

/// The loaded programs and what is attached.
struct Tracer {
    ebpf: Ebpf,
    /// The probes attached and the names behind their cookies.
    at: Attacher,
    /// `API_CALL` and `API_RECURSION` records.
    ring: Option<RingBuf<MapData>>,
    symbolizer: Symbolizer,
    /// Stuck calls reported: (pid_tgid, cookie, entry time).
    stuck_seen: HashSet<(u64, u64, u64)>,
    /// The kernel's sums as read.
    sums: super::sums::Sums,
    /// `-v`: `API_HANDOUT` lines too.
    verbose: bool,
}

impl Tracer {
    fn load(table: SymbolTable, args: &ApiArgs) -> Result<Self, TraceError> {
        let mut ebpf = aya::EbpfLoader::new()
            .map_max_entries("API_STATS", args.api_sums)
            .map_max_entries("API_THROUGH", args.api_sums)
            .load(crate::loader::PROGRAMS)
            .map_err(|e| TraceError::Load(e.to_string()))?;
        let method =
            load_programs(&mut ebpf, args.verbose, args.max_depth).map_err(TraceError::Load)?;
        let ring = ebpf
            .take_map("EVENTS")
            .and_then(|m| RingBuf::try_from(m).ok());
        Ok(Self {
            ebpf,
            at: Attacher::new(table, crate::flags::stop_requested, method),
            ring,
            symbolizer: Symbolizer::default(),
            stuck_seen: HashSet::new(),
            sums: super::sums::Sums::new(args.api_sums),
            verbose: args.verbose,
        })
    }

    fn scan(&mut self, pid: u32) -> Option<usize> {
        self.at.scan(&mut self.ebpf, pid)
    }

    /// [`Self::scan`] while tracing: a process that got probes says so on stderr (a target
    /// started since, a library it loaded since).
    fn scan_saying(&mut self, pid: u32) {
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
    fn release_in_background(mut self) {
        if *self.at.method() == super::attach::AttachMethod::Batched {
            self.detach();
        } else if crate::loader::hold::hold_in_background() {
            std::mem::forget(self);
        } else {
            self.detach();
        }
    }

    /// Lets the processes held at a change of their link map go on (the end of the run).
    fn release_held(&mut self) {
        self.at.release_held(&mut self.ebpf);
    }

    /// Detaches everything now (the fallback of [`Self::release_in_background`]).
    fn detach(&mut self) {
        self.at.detach(&mut self.ebpf);
    }

    /// `api_entry runs=N api_return runs=M`: the kernel's run counts (BPF statistics on).
    /// Each program's batched copy counts with it.
    fn runs(&self) -> String {
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

    /// Waits until the ring has a record or `at_most` has passed (a process stopped at a
    /// change of its link map or a hand-out waits only for this).
    fn wait(&self, at_most: Duration) {
        let Some(ring) = self.ring.as_ref() else {
            std::thread::sleep(at_most);
            return;
        };
        let mut fd = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the ring's descriptor lives as long as `self`.
        unsafe { libc::poll(&mut fd, 1, at_most.as_millis() as i32) };
    }

    /// The records the ring holds now, into `out`. A target whose link map changed
    /// (`API_LOADED`) is read and attached at once, then continued if it was held.
    fn drain(&mut self, out: &mut Lines) -> Result<(), SinkError> {
        let mut raw = Vec::new();
        if let Some(ring) = self.ring.as_mut() {
            while let Some(item) = ring.next() {
                raw.push(item.to_vec());
            }
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
    fn stuck(&mut self, targets: &HashSet<u32>, after_ns: u64) -> Vec<StuckEvent> {
        let now = monotonic_ns();
        let mut found = Vec::new();
        if let Some(map) = self.ebpf.map("API_OPEN")
            && let Ok(map) = BpfHashMap::<_, u64, [u8; STACK_LEN]>::try_from(map)
        {
            for (id, raw) in map.iter().flatten() {
                let Ok(stack) = ApiStack::read_from_bytes(&raw) else {
                    continue;
                };
                if !targets.contains(&((id >> 32) as u32)) {
                    continue;
                }
                let kept = (stack.depth as usize).min(API_STACK_MAX);
                for f in &stack.frames[..kept] {
                    let open = now.saturating_sub(f.entry_ns);
                    if open >= after_ns && self.stuck_seen.insert((id, f.cookie, f.entry_ns)) {
                        found.push((id, f.cookie, f.sp, open));
                    }
                }
            }
        }
        let mut events = Vec::new();
        for (id, cookie, frame_sp, open_ns) in found {
            let (pid, tid) = ((id >> 32) as u32, id as u32);
            let dir = format!("/proc/{pid}/task/{tid}");
            // A thread that ended inside the call: nothing to report.
            let Ok(comm) = std::fs::read(format!("{dir}/comm")) else {
                continue;
            };
            // Its /proc entries and the files it maps are read on a worker under the
            // deadline (docs/reliability.md, section 13).
            let mut symbolizer = std::mem::take(&mut self.symbolizer);
            let Some((symbolizer, t)) = untrusted::bounded(
                untrusted::TARGET_DEADLINE,
                &crate::flags::stop_requested,
                move || {
                    let t = symbolizer.thread(pid, tid);
                    (symbolizer, t)
                },
            ) else {
                continue;
            };
            self.symbolizer = symbolizer;
            if t.sp.is_some_and(|sp| frame_sp <= sp) {
                // A frame the thread has left: not a call it is in.
                continue;
            }
            events.push(StuckEvent {
                pid,
                tid,
                comm: decode_lossless(comm.strip_suffix(b"\n").unwrap_or(&comm)),
                site: self.site(cookie),
                open_ns,
                state: t.state,
                wchan: t.wchan,
                syscall: t.syscall,
                stack: t.stack,
            });
        }
        events
    }

    /// The sums the kernel holds for `pids`.
    fn read(&mut self, pids: &HashSet<u32>) -> Vec<CallStats> {
        let sums = self.sums.read(&mut self.ebpf).sums;
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
fn raise_open_file_limit() {
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

/// `gpu-trace api [--pid P]… [--comm NAME] [-- CMD]`: trace until the targets are gone, the
/// command exits, or SIGINT/SIGTERM; print the counts every `--interval` and at the end.
pub fn trace(args: &ApiArgs) -> Result<Traced, TraceError> {
    let table = symbol_table(args)?;
    if args.pids.is_empty()
        && args.comm.is_none()
        && args.command.is_empty()
        && args.cgroups.is_empty()
        && args.containers.is_empty()
    {
        return Err(TraceError::NoTarget);
    }
    let subtrees = subtrees(args)?;
    let _ = crate::flags::install_stop_signals();
    raise_open_file_limit();
    let mut tracer = Tracer::load(table.clone(), args)?;
    let attach_start = std::time::Instant::now();
    tracer.at.begin_progress("api");
    let mut targets: HashSet<u32> = args.pids.iter().copied().collect();
    let mut child = None;
    let mut descendants = None;
    if !args.command.is_empty() {
        // The command and every process it creates (the main trace's follower).
        let (launched, followed) = launch::Descendants::launch(&args.command, None)?;
        if let Some(why) = &followed.degraded {
            crate::say!("gpu-trace: api: warning: {why}");
        }
        descendants = Some(followed);
        tracer
            .at
            .attach_launch(&mut tracer.ebpf, launched.pid, &args.command[0]);
        targets.insert(launched.pid);
        child = Some(launched.pid);
        launched.release();
    }
    if let Some(c) = args.comm.as_deref() {
        let c = kernel_comm(c);
        let own = std::process::id();
        targets.extend(
            libraries::all_pids()
                .into_iter()
                .filter(|&p| p != own && libraries::comm_of(p).as_deref() == Some(c.as_bytes())),
        );
        if targets.is_empty() {
            return Err(
                ApiError::NoComm(escape_text(&decode_lossless(c.as_bytes())).into_owned()).into(),
            );
        }
    }
    targets.extend(cgroup_members(&subtrees));
    if child.is_none() {
        let with = (tracer.at).attach_pids(&mut tracer.ebpf, targets.iter().copied());
        if with == 0 {
            return Err(TraceError::NoGpuLibrary(format!(
                "no target maps a library that defines a GPU API symbol (see `gpu-trace api \
                 --resolve` for what each maps; add your library with --probe LIB:SYMBOL): {} \
                 process(es) checked",
                targets.len()
            )));
        }
    }
    tracer.at.end_progress();
    crate::say!(
        "gpu-trace: api: {} uprobes attached in {} librar{} for {} target process(es) in {} ms: \
         {}",
        tracer.at.probes(),
        tracer.at.libraries(),
        if tracer.at.libraries() == 1 {
            "y"
        } else {
            "ies"
        },
        targets.len(),
        attach_start.elapsed().as_millis(),
        tracer.at.method()
    );
    let run_stats = if args.bpf_stats {
        Some(
            aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| TraceError::Load(format!("BPF statistics: {}", e.io_error)))?,
        )
    } else {
        None
    };
    let mut out = lines(args)?;
    let mut follow = Follow {
        subtrees: &subtrees,
        descendants,
    };
    let status = run_loop(
        &mut tracer,
        args,
        &mut targets,
        child,
        &mut follow,
        &mut out,
    );
    // A process the command created since the last turn: its sums are read too.
    follow.new_targets(&mut tracer, &mut targets, false);
    tracer.release_held();
    tracer.at.report_skipped();
    let ended = tracer.drain(&mut out).and_then(|()| {
        let rows = tracer.read(&targets);
        print(args, &rows, true, &mut out)
    });
    let ended = ended.and_then(|()| send_paths(&mut tracer, &targets, true, &mut out));
    if let Err(e) = ended {
        output_failed(&e);
    }
    // What the kernel's sums could not hold, said (never a silent gap in the table).
    let uncounted = super::sums::Sums::uncounted(&tracer.ebpf);
    if let Some(w) = uncounted.warning(args.api_sums) {
        crate::say!("gpu-trace: api: {w}");
    }
    if tracer.sums.forgotten > 0 {
        crate::say!(
            "gpu-trace: api: warning: the sums of {} (process, symbol) pairs of processes that \
             ended are not in the table: more ended than the {} kept",
            tracer.sums.forgotten,
            super::sums::KEPT_MAX
        );
    }
    if run_stats.is_some() {
        crate::say!("gpu-trace: bpf-stats {}", tracer.runs());
    }
    tracer.release_in_background();
    Ok(Traced {
        child_status: status,
    })
}

/// Where new targets come from while tracing: `-- CMD`'s processes (each turn) and the
/// `--cgroup`/`--container` subtrees (each interval).
struct Follow<'a> {
    subtrees: &'a [Subtree],
    descendants: Option<launch::Descendants>,
}

impl Follow<'_> {
    /// The processes the command created since the last call: targets from now on, held at
    /// each change of their link map like the command (a library they load is attached
    /// before they call it), and read now. `from_proc` (each interval): without the kernel's
    /// fork events, the command's processes are looked for in /proc too.
    fn new_targets(&mut self, tracer: &mut Tracer, targets: &mut HashSet<u32>, from_proc: bool) {
        let Some(d) = self.descendants.as_mut() else {
            return;
        };
        d.refresh();
        if from_proc {
            d.scan_proc();
        }
        for pid in d.pids() {
            if targets.insert(pid) {
                tracer.at.hold(&mut tracer.ebpf, pid);
                tracer.scan_saying(pid);
            }
        }
    }
}

/// The cgroup v2 subtrees `--cgroup` and `--container` name (none without them).
fn subtrees(args: &ApiArgs) -> Result<Vec<Subtree>, TraceError> {
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
fn cgroup_members(subtrees: &[Subtree]) -> Vec<u32> {
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

/// Rescans and prints each interval until the end; returns the child's exit status.
fn run_loop(
    tracer: &mut Tracer,
    args: &ApiArgs,
    targets: &mut HashSet<u32>,
    child: Option<u32>,
    follow: &mut Follow<'_>,
    out: &mut Lines,
) -> Option<i32> {
    let every = Duration::from_secs_f64(args.interval.unwrap_or(1.0));
    let mut next = Instant::now() + every;
    let mut next_stuck = Instant::now() + STUCK_POLL;
    loop {
        if crate::flags::stop_requested() {
            // Like strace: the command goes on untraced (it got the terminal's SIGINT too).
            return child.map(|c| reap(c).unwrap_or(128 + libc::SIGINT));
        }
        if let Some(c) = child
            && let Some(status) = reap(c)
        {
            return Some(status);
        }
        // The targets stay in the set when they exit: the final read is of their sums too.
        if child.is_none()
            && !targets
                .iter()
                .any(|&p| std::path::Path::new(&format!("/proc/{p}")).exists())
        {
            return None;
        }
        if let Err(e) = step(
            tracer,
            args,
            targets,
            follow,
            out,
            &mut next,
            &mut next_stuck,
        ) {
            // Nowhere to write: the command goes on untraced, as after a Ctrl-C.
            output_failed(&e);
            return child.map(|c| reap(c).unwrap_or(128 + libc::SIGPIPE));
        }
        tracer.wait(Duration::from_millis(20));
    }
}

/// One turn of the loop: the interval's rescan and tables when due, the ring's records, the
/// stuck calls when due.
fn step(
    tracer: &mut Tracer,
    args: &ApiArgs,
    targets: &mut HashSet<u32>,
    follow: &mut Follow<'_>,
    out: &mut Lines,
    next: &mut Instant,
    next_stuck: &mut Instant,
) -> Result<(), SinkError> {
    let due = Instant::now() >= *next;
    follow.new_targets(tracer, targets, due);
    if due {
        *next += Duration::from_secs_f64(args.interval.unwrap_or(1.0));
        targets.extend(cgroup_members(follow.subtrees));
        let pids: Vec<u32> = targets.iter().copied().collect();
        for pid in pids {
            tracer.scan_saying(pid);
        }
        if args.interval.is_some() {
            let rows = tracer.read(targets);
            print(args, &rows, false, out)?;
            send_paths(tracer, targets, false, out)?;
        }
    }
    tracer.drain(out)?;
    if Instant::now() >= *next_stuck {
        *next_stuck += STUCK_POLL;
        let after = (args.stuck_after * 1e9) as u64;
        for e in tracer.stuck(targets, after) {
            let origin = Origin::made_here(e.pid, e.tid, &e.comm);
            out.api_event(&ApiEvent::Stuck(e), &origin)?;
        }
        out.flush().map_err(SinkError::Output)?;
    }
    Ok(())
}

/// The `API_PATH` verdicts of the targets' interposers.
fn send_paths(
    tracer: &mut Tracer,
    targets: &HashSet<u32>,
    last: bool,
    out: &mut Lines,
) -> Result<(), SinkError> {
    let read = tracer.sums.read(&mut tracer.ebpf);
    for p in tracer.at.paths(&read.sums, &read.through, last) {
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
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(SinkError::Output)
}
