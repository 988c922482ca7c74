//! `gpu-trace api`'s run (issue 38: one event loop for both commands): the targets attached
//! (`-- CMD` before its exec, `--pid`, `--comm`, the cgroups; the API layer's own code is
//! `api/`'s), then the main trace's event loop ([`super::event_loop`]) with this command's
//! pieces ([`ApiPiece`]) — the ring's records as they come; each turn (20 ms) the command's
//! end, the targets' and the processes the command created; each interval the rescans, the
//! `--cgroup`/`--container` members and `--interval`'s tables and verdicts; every 250 ms the
//! calls open past `--stuck-after` — and the end: the last records, the table and verdicts at
//! exit, what the kernel could not count.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use gpu_trace_core::api::names::ApiEvent;
use gpu_trace_core::escape::{decode_lossless, escape_text};
use gpu_trace_core::event::Origin;
use gpu_trace_core::sink::SinkError;

use super::error::RunError;
use super::event_loop::{
    self, CHILD_POLL, Drained, Flow, StopSignals, Turns, Waits, every, every_after,
};
use crate::api::stuck::STUCK_POLL;
use crate::api::trace::{
    Lines, TraceError, Traced, Tracer, cgroup_members, lines, output_failed, raise_open_file_limit,
    send_tables, subtrees,
};
use crate::api::{ApiError, symbol_table};
use crate::cli::{ApiArgs, kernel_comm};
use crate::launch::{self, reap};
use crate::probe::cgroup::Subtree;
use crate::probe::libraries;

/// `gpu-trace api [--pid P]… [--comm NAME] [-- CMD]`: trace until the targets are gone, the
/// command exits, or SIGINT/SIGTERM; print the counts every `--interval` and at the end.
/// Once attached it runs on the main trace's event loop ([`super::event_loop`]) with its own
/// pieces ([`ApiPiece`]).
pub fn run_api(args: &ApiArgs) -> Result<Traced, TraceError> {
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
    // `-o FILE` before anything is loaded or launched: a file that cannot be written stops
    // the run before it starts.
    let out = lines(args, output(args)?)?;
    let _ = crate::flags::install_stop_signals();
    raise_open_file_limit();
    let mut tracer = Tracer::load(table.clone(), args)?;
    let attach_start = Instant::now();
    tracer.at.begin_progress("api");
    let attached = attach_targets(&mut tracer, args, &subtrees)?;
    tracer.at.end_progress();
    say_attached(&tracer, attached.targets.len(), attach_start);
    let run_stats = if args.bpf_stats {
        Some(
            aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| TraceError::Load(format!("BPF statistics: {}", e.io_error)))?,
        )
    } else {
        None
    };
    let mut run = ApiRun::new(tracer, args, attached, &subtrees, out);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TraceError::Loop(format!("starting the async runtime: {e}")))?;
    let status = (runtime.block_on(run.trace())).map_err(|e| TraceError::Loop(e.to_string()))?;
    finish(run, run_stats.is_some());
    Ok(Traced {
        child_status: status,
    })
}

/// The targets as attached at the start.
struct Attached {
    targets: HashSet<u32>,
    /// `-- CMD`: the command.
    child: Option<u32>,
    /// `-- CMD`: the follower of the processes it creates.
    descendants: Option<launch::Descendants>,
}

/// The targets attached: `-- CMD` (by path, before its exec), the `--pid`, `--comm` and
/// cgroup processes.
fn attach_targets(
    tracer: &mut Tracer,
    args: &ApiArgs,
    subtrees: &[Subtree],
) -> Result<Attached, TraceError> {
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
    targets.extend(cgroup_members(subtrees));
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
    Ok(Attached {
        targets,
        child,
        descendants,
    })
}

/// Where the lines go: `-o FILE` (created or emptied; a FIFO without a reader is refused at
/// once) or standard output.
fn output(args: &ApiArgs) -> Result<Box<dyn std::io::Write>, TraceError> {
    let Some(path) = &args.output else {
        return Ok(Box::new(std::io::stdout()));
    };
    let file = super::files::open_for_writing(path).map_err(|e| {
        let why = if super::files::is_no_reader(&e) {
            "a FIFO nobody reads (start its reader first)".to_string()
        } else {
            e.to_string()
        };
        TraceError::Output(format!("-o {}: {why}", path.display()))
    })?;
    Ok(Box::new(file))
}

/// What was attached, on stderr: probes, libraries, target processes, time, method.
fn say_attached(tracer: &Tracer, targets: usize, since: Instant) {
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
        targets,
        since.elapsed().as_millis(),
        tracer.at.method()
    );
}

/// The end: the last records, the table and the verdicts at exit, what the kernel could not
/// count, `--bpf-stats`; the probes go in the background.
fn finish(run: ApiRun<'_>, bpf_stats: bool) {
    let ApiRun {
        mut tracer,
        args,
        mut targets,
        mut follow,
        mut out,
        ..
    } = run;
    // A process the command created since the last turn: its sums are read too.
    follow.new_targets(&mut tracer, &mut targets, false);
    tracer.release_held();
    tracer.at.report_skipped();
    let mut ring = tracer.ring.take();
    let drained = match ring.as_mut() {
        Some(ring) => tracer.drain(ring, &mut out),
        None => Ok(()),
    };
    tracer.ring = ring;
    let ended = drained.and_then(|()| send_tables(args, &mut tracer, &targets, true, &mut out));
    if let Err(e) = ended {
        output_failed(&e);
    }
    // What the kernel's sums could not hold, said (never a silent gap in the table).
    let uncounted = crate::api::sums::Sums::uncounted(&tracer.ebpf);
    if let Some(w) = uncounted.warning(args.api_sums) {
        crate::say!("gpu-trace: api: {w}");
    }
    if let Some(w) = (follow.descendants.as_ref()).and_then(|d| d.unfollowed_warning()) {
        crate::say!("gpu-trace: api: {w}");
    }
    if tracer.sums.forgotten > 0 {
        crate::say!(
            "gpu-trace: api: warning: the sums of {} (process, symbol) pairs of processes that \
             ended are not in the table: more ended than the {} kept",
            tracer.sums.forgotten,
            crate::api::sums::KEPT_MAX
        );
    }
    if bpf_stats {
        crate::say!("gpu-trace: bpf-stats {}", tracer.runs());
    }
    tracer.release_in_background();
}

/// `gpu-trace api`'s periodic pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ApiPiece {
    /// The command's end, the targets', the processes the command created.
    Turn,
    /// The rescans and `--interval`'s tables.
    Interval,
    /// The calls open past `--stuck-after`.
    Stuck,
}

/// A `gpu-trace api` run once attached.
struct ApiRun<'a> {
    tracer: Tracer,
    args: &'a ApiArgs,
    /// The targets; they stay in the set when they exit: the final read is of their sums too.
    targets: HashSet<u32>,
    /// `-- CMD`: the command.
    child: Option<u32>,
    follow: Follow<'a>,
    out: Lines,
    /// The command's exit status, once it ended while traced.
    status: Option<i32>,
    /// Standard output failed (said): tracing ends, the command goes on untraced.
    output_failed: bool,
}

impl<'a> ApiRun<'a> {
    /// The run of `attached` (`subtrees`: `--cgroup`/`--container`'s), its lines into `out`.
    fn new(
        tracer: Tracer,
        args: &'a ApiArgs,
        attached: Attached,
        subtrees: &'a [Subtree],
        out: Lines,
    ) -> Self {
        let follow = Follow {
            subtrees,
            descendants: attached.descendants,
        };
        Self {
            tracer,
            args,
            targets: attached.targets,
            child: attached.child,
            follow,
            out,
            status: None,
            output_failed: false,
        }
    }

    /// Traces until the targets are gone, the command exits, SIGINT/SIGTERM or the output
    /// fails; returns the command's exit status (`None` in `--pid`/`--comm` mode).
    async fn trace(&mut self) -> Result<Option<i32>, RunError> {
        let mut signals = StopSignals::install()?;
        let Some(ring) = self.tracer.ring.take() else {
            return Ok(self.child_status());
        };
        let mut ring = event_loop::watch(ring)?;
        let interval = Duration::from_secs_f64(self.args.interval.unwrap_or(1.0));
        let pieces = vec![
            every(ApiPiece::Turn, CHILD_POLL),
            every_after(ApiPiece::Interval, interval, interval),
            every_after(ApiPiece::Stuck, STUCK_POLL, STUCK_POLL),
        ];
        let waits = Waits::new(&mut signals, None, None, None);
        let looped = event_loop::run(&mut ring, waits, pieces, self).await;
        self.tracer.ring = Some(ring.into_inner());
        looped?;
        Ok(self.child_status())
    }

    /// The command's exit status: as it ended while traced; else (a stop, the output closed)
    /// it goes on untraced, like strace's (it got the terminal's SIGINT too).
    fn child_status(&self) -> Option<i32> {
        let c = self.child?;
        if self.status.is_some() {
            return self.status;
        }
        let signal = if self.output_failed {
            libc::SIGPIPE
        } else {
            libc::SIGINT
        };
        Some(reap(c).unwrap_or(128 + signal))
    }

    /// Standard output failed: said once, tracing ends.
    fn fail(&mut self, e: &SinkError) {
        output_failed(e);
        self.output_failed = true;
    }

    /// Each turn: the command's end, the targets' end, the processes the command created.
    fn turn(&mut self) -> Flow {
        if let Some(c) = self.child
            && let Some(status) = reap(c)
        {
            self.status = Some(status);
            return Flow::Stop;
        }
        if self.child.is_none()
            && !(self.targets.iter()).any(|&p| std::path::Path::new(&format!("/proc/{p}")).exists())
        {
            return Flow::Stop;
        }
        (self.follow).new_targets(&mut self.tracer, &mut self.targets, false);
        Flow::Go
    }

    /// Each interval: new targets (the command's from /proc too, the cgroups' members), every
    /// target rescanned, and with `--interval` the table and the verdicts so far.
    fn interval(&mut self) -> Result<(), SinkError> {
        (self.follow).new_targets(&mut self.tracer, &mut self.targets, true);
        self.targets.extend(cgroup_members(self.follow.subtrees));
        let pids: Vec<u32> = self.targets.iter().copied().collect();
        for pid in pids {
            self.tracer.scan_saying(pid);
        }
        if self.args.interval.is_some() {
            send_tables(
                self.args,
                &mut self.tracer,
                &self.targets,
                false,
                &mut self.out,
            )?;
        }
        Ok(())
    }

    /// The calls of the targets open `--stuck-after` or longer, an `API_STUCK` each.
    fn stuck(&mut self) -> Result<(), SinkError> {
        let after = (self.args.stuck_after * 1e9) as u64;
        for e in self.tracer.stuck(&self.targets, after) {
            let origin = Origin::made_here(e.pid, e.tid, &e.comm);
            self.out.api_event(&ApiEvent::Stuck(e), &origin)?;
        }
        self.out.flush().map_err(SinkError::Output)
    }
}

impl Turns for ApiRun<'_> {
    type Piece = ApiPiece;

    fn failed(&self) -> bool {
        self.output_failed
    }

    fn read(&mut self, ring: &mut RingBuf<MapData>) -> Result<Drained, RunError> {
        if let Err(e) = self.tracer.drain(ring, &mut self.out) {
            self.fail(&e);
        }
        Ok(Drained::Empty)
    }

    fn piece(&mut self, piece: ApiPiece, _: &mut RingBuf<MapData>) -> Result<Flow, RunError> {
        let done = match piece {
            ApiPiece::Turn => return Ok(self.turn()),
            ApiPiece::Interval => self.interval(),
            ApiPiece::Stuck => self.stuck(),
        };
        if let Err(e) = done {
            self.fail(&e);
        }
        Ok(Flow::Go)
    }
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
