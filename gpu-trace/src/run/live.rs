//! The live run: start, attach, the loop that reads the ring buffer until a stop, and the end.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::{
    error::{RunError, detect_vendor, io_err},
    event_loop::{self, Flow, Turns, Waits, every, every_after},
    files::Staged,
    flight::Flight,
    late_attach::{announce_inventory, kernel_tracking, traced_inventory},
    outputs::{OutputFiles, end_outputs, interval, new_pipeline, prepare_output_files, sink_error},
    plan::{CgroupSelection, api_layer, check_api_targets, check_kfd, load_options},
    reader::{CHILD_POLL, DRAIN_SLICE, Drained, Reader, follow_changes},
    record::{RecordTo, Recording, end_recordings, recording_header, start_recording},
    report::{
        Viewer, announce_hooks, describe_missed_runs, describe_program_stats, print_report,
        still_runs, warn_before_start, warn_unmatched_gpus, warn_unmatched_pods,
    },
    rotate::PieceFiles,
    share::{start_nvml, start_share_sampler},
    signals::{StopSignals, note},
};
use crate::api::stuck::STUCK_POLL;
use crate::metrics::server::MetricsServer;
use crate::pipeline::Summary;
use crate::{
    cli::{TraceArgs, Vendor},
    escape,
    loader::{LoadError, LoadOptions, Tracer},
    model::stats::KernelCounters,
    output::clock::Clock,
    pipeline::Pipeline,
    probe::{cgroup::CgroupResolver, system},
    queue::{Overflow, QueueWriter},
};

/// Trace live until Ctrl-C, SIGTERM or `--duration`.
pub async fn run_live(args: &TraceArgs) -> Result<Summary, RunError> {
    run_live_with(args, None).await
}

/// [`run_live`], with a live view drawn once a second instead of `--interval` statistics.
pub async fn run_live_with(
    args: &TraceArgs,
    viewer: Option<&mut dyn Viewer>,
) -> Result<Summary, RunError> {
    let started = Instant::now();
    // --duration counts from attach (below); before, it bounds the start-up waits (a FIFO).
    let startup_deadline = args.duration.map(|d| started + Duration::from_secs_f64(d));
    // Before anything is reported on stderr: a Ctrl-C right after the start-up report (or
    // during the inventory) stops tracing cleanly through the loop below.
    let mut signals = StopSignals::install()?;
    let mut usr1 = usr1_handler(args)?;
    check_api_targets(args)?;
    let (amd, watched) = vendor_and_watched(args)?;
    // Every output is opened before anything is attached (a FIFO waits for its reader here),
    // but an existing file is emptied only once every start-up check below passed: a busy
    // metrics port, a bad --cgroup or a refused program leaves yesterday's files as they were.
    let wake = Arc::new(tokio::sync::Notify::new());
    let (files, pending) = open_outputs(args, startup_deadline, &wake)?;
    let (cgroups, subtrees) = cgroup_selection(args)?;
    let (kfd, options) = kfd_and_options(args, amd, watched, &subtrees)?;
    // NVML's own driver calls (it opens the GPU) are made before the programs attach, so that
    // gpu-trace does not trace itself; the walk comes after attaching.
    // On a thread of its own, within a time limit: a wedged library costs a line, not the run.
    let (nvml, share_sampler) = start_nvml(args, amd);
    // Bound before loading: a busy port or a refused address stops the run before any hook.
    let metrics = crate::metrics::server::serve(&args.metrics, args.ring_size)?;
    let (launched, mut tracer) = (start_command(args)?, Tracer::load(&options)?);
    // Attached: tracing time (the deadline and the statistics' duration) starts here.
    let tracing_since = Instant::now();
    let deadline = args
        .duration
        .map(|d| tracing_since + Duration::from_secs_f64(d));
    // Late attach: the processes that have a GPU open already (after attaching, so that a
    // process opening the GPU now is seen by the hooks or by the walk), tracked from now on.
    let inventory = traced_inventory(args, amd, nvml, &subtrees, launched.as_ref());
    tracer.track(&kernel_tracking(&inventory, &args.output))?;
    let api = api_layer(&mut tracer, args, launched.as_ref().map(|(c, _)| c.pid))?;
    let clock = Clock::from_system().map_err(io_err("reading the clocks"))?;
    announce_hooks(&tracer, kfd.as_ref());
    announce_inventory(&inventory, &args.output, true);
    // Started: the -o and --record files may now lose their old contents.
    pending.commit()?;
    let sampled = (amd, share_sampler.is_some());
    let (mut recorder, trigger) = start_recorder(
        args,
        files.record,
        &wake,
        &clock,
        &tracer,
        &inventory,
        sampled,
    )?;
    let perfetto = files.perfetto.as_ref().map(|(s, _)| s);
    let pipeline = new_pipeline(&args.output, clock, files.out, perfetto, false)?;
    let (mut pipeline, metrics_server, ring_fill) =
        with_outputs(pipeline, trigger, metrics, &inventory, &mut recorder)?;
    let ring = watch_ring_buffer(&mut tracer, ring_fill)?;
    let (command, mut descendants) = release_command(launched, &mut pipeline);
    if let Some(d) = descendants.as_mut() {
        follow_with_ring(d, ring.get_ref());
    }
    let live = LiveRun {
        tracer,
        reader: Reader {
            descendants,
            api_verbose: args.output.verbose,
            stuck_after_ns: (args.stuck_after * 1e9) as u64,
            ..Reader::new(cgroups, api)
        },
        command,
        pipeline,
        recorder,
        viewer,
        tracing_since,
        share: start_share_sampler(share_sampler, args.share_interval),
        rotate_due: false,
    };
    let waits = Waits::new(&mut signals, usr1.as_mut(), deadline, Some(&wake));
    let ended = (files.perfetto, files.out_is_stdout);
    live.run_to_end(ring, waits, args, metrics_server.is_some(), ended)
        .await
}

/// Containers: the cgroup2 tree, for --cgroup/--container and to name each process's cgroup,
/// and the subtrees selected (said on stderr); a bad argument stops the run before anything
/// is attached.
fn cgroup_selection(
    args: &TraceArgs,
) -> Result<(Option<CgroupResolver>, CgroupSelection), RunError> {
    let mut cgroups = CgroupResolver::for_host();
    let subtrees = CgroupSelection::resolve(args, cgroups.as_mut())?;
    for line in subtrees.describe() {
        note(line);
    }
    Ok((cgroups, subtrees))
}

/// AMD: KFD here (checked against what was asked); the programs to load and their options.
fn kfd_and_options(
    args: &TraceArgs,
    amd: bool,
    watched: Option<u32>,
    subtrees: &CgroupSelection,
) -> Result<(Option<crate::probe::amd::KfdPresence>, LoadOptions), RunError> {
    let kfd = amd.then(crate::probe::amd::KfdPresence::probe);
    check_kfd(args, kfd.as_ref())?;
    let options = load_options(args, amd, kfd.as_ref(), watched, subtrees);
    Ok((kfd, options))
}

/// `-o`, `--perfetto` and `--record` opened, not emptied yet (with `--record-rotate` the
/// pieces are files of their own, made as the run goes).
fn open_outputs(
    args: &TraceArgs,
    startup_deadline: Option<Instant>,
    wake: &Arc<tokio::sync::Notify>,
) -> Result<(OutputFiles, super::outputs::Pending), RunError> {
    prepare_output_files(
        &args.output,
        (args.record.as_deref()).filter(|_| args.recording.record_rotate.is_none()),
        startup_deadline,
        Overflow::Drop,
        wake,
    )
}

/// --flight-recorder: SIGUSR1 dumps (its default action, ending the process, is replaced
/// before the line that says tracing started).
fn usr1_handler(args: &TraceArgs) -> Result<Option<tokio::signal::unix::Signal>, RunError> {
    args.recording
        .flight_recorder
        .map(|_| {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                .map_err(io_err("installing the SIGUSR1 handler"))
        })
        .transpose()
}

/// The vendor traced (`true`: AMD) and `--watch-device`'s kernel device number; the warnings
/// said before the start.
fn vendor_and_watched(args: &TraceArgs) -> Result<(bool, Option<u32>), RunError> {
    let vendor = match args.vendor {
        Vendor::Auto => detect_vendor()?,
        v => v,
    };
    let amd = vendor == Vendor::Amd;
    warn_before_start(args, amd);
    let watched = match &args.watch_device {
        Some(path) => Some(system::char_device_kernel_dev(path).map_err(LoadError::from)?),
        None => None,
    };
    Ok((amd, watched))
}

/// `--record` and `--flight-recorder` started: the recording's header written, the flight
/// window ready; returns the trigger sink the pipeline feeds. `sampled`: (AMD, share
/// sampling on).
fn start_recorder(
    args: &TraceArgs,
    record: Option<QueueWriter>,
    wake: &Arc<tokio::sync::Notify>,
    clock: &Clock,
    tracer: &Tracer,
    inventory: &gpu_trace_core::inventory::Inventory,
    sampled: (bool, bool),
) -> Result<(Recording, Option<Box<gpu_trace_core::flight::TriggerSink>>), RunError> {
    let file = recording_to(record, args, wake)
        .map(|to| start_recording(to, clock, tracer, inventory, sampled))
        .transpose()?;
    let flight = Flight::new(
        &args.recording,
        recording_header(clock, tracer, inventory, sampled.0),
    );
    let (flight, trigger_sink) = flight.map_or((None, None), |(f, s)| (Some(f), Some(s)));
    Ok((Recording { file, flight }, trigger_sink))
}

/// Where `--record` goes: the file opened (`record`), or with `--record-rotate` pieces made as
/// the run goes (a piece that cannot be made wakes the loop through `wake`).
fn recording_to(
    record: Option<QueueWriter>,
    args: &TraceArgs,
    wake: &Arc<tokio::sync::Notify>,
) -> Option<RecordTo> {
    match (record, args.recording.record_rotate, args.record.as_deref()) {
        (Some(queue), _, _) => Some(RecordTo::One(queue)),
        (None, Some(rotate), Some(path)) => {
            let on_failure = {
                let wake = wake.clone();
                Arc::new(move || wake.notify_one()) as Arc<dyn Fn() + Send + Sync>
            };
            let files = PieceFiles::new(path, on_failure);
            Some(RecordTo::Pieces(files, rotate, args.recording.record_keep))
        }
        _ => None,
    }
}

/// The pipeline and its outputs: the flight recorder's trigger sink and `--metrics`
/// (returned: the metrics server and the slot of the ring's fill), fed the inventory first.
type Outputs = (
    Pipeline<QueueWriter>,
    Option<MetricsServer>,
    Option<gpu_trace_core::metrics::RingFillSlot>,
);

/// The pipeline with the flight recorder's trigger sink and `--metrics` as outputs, fed the
/// start-up inventory.
fn with_outputs(
    pipeline: Pipeline<QueueWriter>,
    trigger_sink: Option<Box<gpu_trace_core::flight::TriggerSink>>,
    metrics: Option<(gpu_trace_core::metrics::Metrics, MetricsServer)>,
    inventory: &gpu_trace_core::inventory::Inventory,
    recorder: &mut Recording,
) -> Result<Outputs, RunError> {
    let pipeline = match trigger_sink {
        Some(sink) => pipeline.with_output(sink),
        None => pipeline,
    };
    let (mut pipeline, server, fill) = match metrics {
        Some((m, server)) => {
            let fill = m.ring_fill_slot();
            // The flight recorder's triggers and dumps go to the metrics too.
            if let Some(f) = recorder.flight.as_mut() {
                f.metrics = Some(m.flight());
            }
            (pipeline.with_output(Box::new(m)), Some(server), Some(fill))
        }
        None => (pipeline, None, None),
    };
    pipeline
        .inventory(inventory)
        .map_err(io_err("writing the output"))?;
    warn_unmatched_gpus(&pipeline);
    Ok((pipeline, server, fill))
}

/// `-- CMD`: the pipeline follows the command, which is let go (everything is attached);
/// returns its pid and the follower of its descendants.
pub(super) fn release_command(
    launched: Option<(crate::launch::Launched, crate::launch::Descendants)>,
    pipeline: &mut Pipeline<QueueWriter>,
) -> (Option<CommandRun>, Option<crate::launch::Descendants>) {
    let Some((child, descendants)) = launched else {
        return (None, None);
    };
    pipeline.follow(child.pid, true);
    let pid = child.pid;
    child.release();
    (Some(CommandRun { pid, status: None }), Some(descendants))
}

/// `-- CMD` while traced: its process id, and its exit status once it ended.
pub(super) struct CommandRun {
    pub(super) pid: u32,
    pub(super) status: Option<i32>,
}

/// `-- CMD`: the command forked and waiting for [`crate::launch::Launched::release`], and the
/// follower of the processes it creates (subscribed before it runs); `None` without `-- CMD`.
pub(super) fn start_command(
    args: &TraceArgs,
) -> Result<Option<(crate::launch::Launched, crate::launch::Descendants)>, RunError> {
    if args.launch.is_empty() {
        return Ok(None);
    }
    let user = match args.launch_user.as_deref() {
        Some(name) => Some(crate::launch::User::lookup(name)?),
        None => None,
    };
    let (child, descendants) = crate::launch::Descendants::launch(&args.launch, user.as_ref())?;
    let shown = escape::escape_text(&escape::decode_lossless(
        std::os::unix::ffi::OsStrExt::as_bytes(args.launch[0].as_os_str()),
    ))
    .into_owned();
    note(format_args!(
        "starting {shown} (pid {}) once attached; tracing it and every process it creates \
         until it exits",
        child.pid
    ));
    if let Some(why) = &descendants.degraded {
        crate::say!("gpu-trace: warning: {why}");
    }
    Ok(Some((child, descendants)))
}

/// `-- CMD`: the followed set reads the ring buffer's positions, so that a process that exited
/// leaves it (at its bound) only once its records are read.
fn follow_with_ring(d: &mut crate::launch::Descendants, ring: &RingBuf<MapData>) {
    use std::os::fd::AsFd as _;
    match crate::metrics::ring::RingFill::new(ring.as_fd()) {
        Ok(fill) => d.watch_ring(Box::new(move || fill.positions())),
        Err(e) => crate::say!(
            "gpu-trace: (the ring buffer's positions are not readable ({e}): at the bound of \
             followed processes, those that exited leave the set at once, and a record of \
             theirs still unread is then left out)"
        ),
    }
}

/// The ring buffer, taken from the tracer and registered with tokio to be read when it holds
/// records; `--metrics` reads its fill from the kernel's pages.
pub(super) fn watch_ring_buffer(
    tracer: &mut Tracer,
    metrics: Option<gpu_trace_core::metrics::RingFillSlot>,
) -> Result<AsyncFd<RingBuf<MapData>>, RunError> {
    let ring = tracer.take_ring_buffer()?;
    if let Some(slot) = metrics {
        use std::os::fd::AsFd as _;
        match crate::metrics::ring::RingFill::new(ring.as_fd()) {
            Ok(fill) => slot.set(move || fill.used_bytes()),
            Err(e) => crate::say!("gpu-trace: (metrics: ring-buffer fill not available: {e})"),
        }
    }
    event_loop::watch(ring)
}

/// A live run once attached: the ring buffer and its reader, the pipeline, the recording and
/// the live view.
pub(super) struct LiveRun<'v> {
    pub(super) tracer: Tracer,
    pub(super) reader: Reader,
    pub(super) pipeline: Pipeline<QueueWriter>,
    pub(super) recorder: Recording,
    pub(super) viewer: Option<&'v mut dyn Viewer>,
    pub(super) tracing_since: Instant,
    /// `--share-interval`: the GPU share sampler's thread, while tracing.
    pub(super) share: Option<crate::probe::share::ShareThread>,
    /// `-- CMD`: the command, and its exit status once it ended.
    pub(super) command: Option<CommandRun>,
    /// `--record-rotate TIME`: the clock said a piece is due (ended after the turn).
    pub(super) rotate_due: bool,
}

impl LiveRun<'_> {
    /// Traces until stopped, then detaches, reads what is left and ends the outputs
    /// (`ended`: the Perfetto file to finish, whether `-o` is standard output).
    pub(super) async fn run_to_end(
        mut self,
        mut ring: AsyncFd<RingBuf<MapData>>,
        waits: Waits<'_>,
        args: &TraceArgs,
        metrics_served: bool,
        ended: (Option<(Staged, PathBuf)>, bool),
    ) -> Result<Summary, RunError> {
        let period = interval(&args.output);
        (self.trace_until_stopped(&mut ring, waits, period, metrics_served)).await?;
        // Before detaching, which unloads the programs.
        self.report_program_runs(args.bpf_stats);
        let counters = self.drain_after_detach(ring.get_mut()).await?;
        // Dropped before the tracer whose map it was.
        drop(ring);
        // A denial that did not hold is said on stderr too, whatever the output and its format.
        if let Some(warning) = counters.deny_unfollowed_warning() {
            self.report(vec![warning]);
        }
        self.end(counters, args.record.as_deref(), ended.0, ended.1)
    }

    /// Reads the ring buffer as it fills until a stop signal, the deadline or an output's
    /// failure, in the one event loop ([`event_loop`]) with this run's pieces; `period`:
    /// `--interval`'s statistics (the live view instead draws a frame once a second);
    /// `metrics_served`: the kernel's counters go to the metrics once a second.
    pub(super) async fn trace_until_stopped(
        &mut self,
        ring: &mut AsyncFd<RingBuf<MapData>>,
        waits: Waits<'_>,
        period: Option<Duration>,
        metrics_served: bool,
    ) -> Result<(), RunError> {
        let second = Duration::from_secs(1);
        // The live view draws its first frame at once; --interval statistics after a period.
        let mut pieces = match (self.viewer.is_some(), period) {
            (true, _) => vec![every(LivePiece::Stats, second)],
            (false, Some(p)) => vec![every_after(LivePiece::Stats, p, p)],
            (false, None) => Vec::new(),
        };
        let on = [
            (
                self.share.is_some(),
                LivePiece::Share,
                Duration::from_millis(100),
            ),
            // `-- CMD`: whether the command ended, looked at this often.
            (self.command.is_some(), LivePiece::Child, CHILD_POLL),
            (self.reader.api.is_some(), LivePiece::ApiRescan, second),
            (self.reader.api.is_some(), LivePiece::Stuck, STUCK_POLL),
            // --record-rotate TIME: a piece ends on time even when no record comes to end it.
            (
                self.recorder.rotates_by_time() || self.recorder.flight.is_some(),
                LivePiece::Clock,
                second,
            ),
            (metrics_served, LivePiece::Health, second),
        ];
        let on = on.into_iter().filter(|&(on, _, _)| on);
        pieces.extend(on.map(|(_, p, t)| every(p, t)));
        let looped = event_loop::run(ring, waits, pieces, self).await;
        // Sampling stops with tracing: the samples taken so far are counted, the thread is let
        // go (never waited for).
        looped?;
        self.take_share()?;
        self.share = None;
        Ok(())
    }

    /// `-- CMD` ended? (`Flow::Stop` then; with `--dump-on signal-exit`, the flight recorder's
    /// window before the command's end is dumped.)
    fn child_tick(&mut self) -> Result<Flow, RunError> {
        let Some(c) = self.command.as_mut() else {
            return Ok(Flow::Go);
        };
        // The fork events queued since the last read, also while no record comes to read
        // them: the connector's queue never holds more than this period's forks (it would
        // overflow and leave the followed set to /proc), and `unfollowed` stays current.
        if let Some(d) = self.reader.descendants.as_mut() {
            follow_changes(&mut self.pipeline, d.refresh());
        }
        let ended = crate::launch::reap_signaled(c.pid);
        c.status = ended.map(|(code, _)| code);
        let Some((_, signaled)) = ended else {
            return Ok(Flow::Go);
        };
        if let (true, Some(f)) = (signaled, self.recorder.flight.as_ref()) {
            f.note(gpu_trace_core::flight::Trigger::SignalExit);
            self.recorder.turn(&self.tracer, false)?;
        }
        Ok(Flow::Stop)
    }

    /// `--api`, each second: new --comm processes and newly mapped libraries, then the sums.
    fn api_rescan(&mut self) {
        if let Some(api) = self.reader.api.as_mut() {
            // The command's processes as of now (fork events read first: a child that made
            // no driver call yet is known only from them).
            let followed = self.reader.descendants.as_mut().map(|d| {
                follow_changes(&mut self.pipeline, d.refresh());
                // Without the connector: found in /proc (no record may name them).
                follow_changes(&mut self.pipeline, d.scan_proc());
                d.pids()
            });
            api.rescan(&mut self.tracer, followed.into_iter().flatten());
        }
        let (reader, tracer) = (&mut self.reader, &mut self.tracer);
        reader.send_api_sums(tracer, &mut self.pipeline, &mut self.recorder);
    }

    /// `--api`: reads and attaches at once the targets whose link map changed (a library
    /// `dlopen`ed), and lets the ones the kernel stopped go on.
    pub(super) fn attach_loaded(&mut self) {
        if self.reader.loaded.is_empty() {
            return;
        }
        let loaded = std::mem::take(&mut self.reader.loaded);
        if let Some(api) = self.reader.api.as_mut() {
            for signal in &loaded {
                api.attacher.signal(self.tracer.ebpf_mut(), signal);
            }
        }
        self.reader.send_handouts(&mut self.pipeline);
    }

    /// `-- CMD`: the command's exit status (128 + N for a signal), looked at for 0.2 s more
    /// after a stop that came first (Ctrl-C reaches the command too); a command still running
    /// then is said on stderr and left to run, untraced.
    pub(super) fn child_end(&mut self) -> Option<i32> {
        let c = self.command.as_mut()?;
        let pid = c.pid;
        // A Ctrl-C reached the command too: a moment for it to end.
        c.status = c
            .status
            .or_else(|| crate::launch::reap_within(pid, crate::launch::STOP_GRACE));
        let status = c.status;
        if status.is_none() {
            self.report(vec![still_runs(pid)]);
        }
        status
    }

    /// The GPU share samples the sampler's thread has taken, into the pipeline.
    pub(super) fn take_share(&mut self) -> Result<(), RunError> {
        let Some(share) = &self.share else {
            return Ok(());
        };
        let batch = match share.take() {
            Ok(batch) => batch,
            Err(stalled) => {
                // Dropped, never joined: the stuck poll is left to itself.
                crate::say!("gpu-trace: GPU share sampling stopped: {stalled}; tracing goes on");
                self.share = None;
                return Ok(());
            }
        };
        if batch.is_empty() {
            return Ok(());
        }
        self.recorder.share(&batch);
        self.pipeline.share_samples(&batch).map_err(sink_error)
    }

    /// A frame of the live view, or `--interval`'s statistics on the output.
    pub(super) fn show_stats(&mut self) -> Result<(), RunError> {
        match self.viewer.as_mut() {
            Some(v) => v
                .frame(
                    self.pipeline.stats(),
                    self.tracing_since.elapsed(),
                    self.tracer.counters().ok(),
                )
                .map_err(io_err("drawing the live view")),
            None => self
                .pipeline
                .periodic_stats(self.tracing_since.elapsed(), self.tracer.counters().ok())
                .and_then(|()| self.pipeline.flush())
                .map_err(io_err("writing the output")),
        }
    }

    /// Report lines of the run's end: to the live view, which may hold the terminal, else on
    /// stderr.
    pub(super) fn report(&mut self, lines: Vec<String>) {
        match self.viewer.as_mut() {
            Some(v) => v.report(lines),
            None => print_report(lines),
        }
    }

    /// The programs' runs (`--bpf-stats`) and those the kernel skipped; before detaching,
    /// which unloads the programs.
    pub(super) fn report_program_runs(&mut self, bpf_stats: bool) {
        let program_stats = self.tracer.program_stats();
        let mut lines = if bpf_stats {
            describe_program_stats(&program_stats)
        } else {
            Vec::new()
        };
        lines.extend(describe_missed_runs(&program_stats));
        if !lines.is_empty() {
            self.report(lines);
        }
    }

    /// Detaches first, then reads until every record the kernel counted as sent has been read
    /// (a program running at the moment of detaching may still submit one), for at most a
    /// second; records sent but never read are counted as lost; then (`--api`) the calls' final
    /// sums. Returns the kernel's counters.
    pub(super) async fn drain_after_detach(
        &mut self,
        ring: &mut RingBuf<MapData>,
    ) -> Result<KernelCounters, RunError> {
        self.tracer.detach();
        let mut counters = self.tracer.counters()?;
        let settle = Instant::now();
        loop {
            // Detached: what is left is at most a ring's worth, read whole (in turns when
            // recording pieces fill up on the way).
            let more = self
                .reader
                .drain(ring, &mut self.pipeline, &mut self.recorder, None);
            self.recorder.turn(&self.tracer, false)?;
            if more == Drained::More {
                continue;
            }
            let now = self.tracer.counters()?;
            let done = self.reader.read >= now.emitted && now == counters;
            counters = now;
            if done || settle.elapsed() > Duration::from_secs(1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if self.reader.read < counters.emitted {
            self.pipeline.stats_mut().lost_samples = Some(counters.emitted - self.reader.read);
        }
        // --api: the calls' final sums, after the ring's last records; a process the kernel
        // stopped at a change of its link map that was not read any more goes on.
        self.reader
            .send_api_end(&mut self.tracer, &mut self.pipeline, &mut self.recorder);
        if let Some(api) = self.reader.api.as_mut() {
            api.attacher.release_held(self.tracer.ebpf_mut());
            api.attacher.report_skipped();
            // Calls the kernel could not count: in the statistics and said, never silent.
            let uncounted = crate::api::sums::Sums::uncounted(self.tracer.ebpf());
            let warning = uncounted.warning(api.sums.capacity());
            self.report(warning.into_iter().collect());
        }
        self.left_out_so_far();
        Ok(counters)
    }

    /// What the run left out before the pipeline that is read as a total: `-- CMD`'s
    /// processes not followed, `--api` calls the kernel's full sums could not count. Each
    /// health tick and at the end (the statistics, JSON and `gpu_trace_unreported_total`).
    fn left_out_so_far(&mut self) {
        if let Some(d) = self.reader.descendants.as_ref() {
            self.pipeline.left_out_so_far("unfollowed", d.unfollowed);
        }
        if self.reader.api.is_some() {
            let uncounted = crate::api::sums::Sums::uncounted(self.tracer.ebpf());
            (self.pipeline).left_out_so_far("api_uncounted", uncounted.calls);
            (self.pipeline).left_out_so_far("api_through_uncounted", uncounted.through);
        }
    }

    /// Ends the recording (`record_path`: where it goes) and the outputs; returns the
    /// summary, or the first failure of the run.
    pub(super) fn end(
        mut self,
        counters: KernelCounters,
        record_path: Option<&Path>,
        perfetto: Option<(Staged, PathBuf)>,
        out_is_stdout: bool,
    ) -> Result<Summary, RunError> {
        let child_status = self.child_end();
        let LiveRun {
            mut reader,
            mut pipeline,
            recorder,
            tracing_since,
            tracer,
            ..
        } = self;
        // Detached already; `--api`'s perf-event uprobes go in the background, not before the
        // results (batched links go here, in milliseconds).
        let per_probe = reader
            .api
            .as_ref()
            .is_some_and(|api| *api.method() != crate::api::attach::AttachMethod::Batched);
        tracer.release(per_probe);
        let duration = tracing_since.elapsed();
        let mut failure = reader.failure.take();
        let mut recorder = recorder;
        pipeline.stats_mut().flight = recorder.flight.take().map(Flight::finish);
        let recording_lost =
            end_recordings(recorder, counters, duration, record_path, &mut failure);
        pipeline.stats_mut().recording_lost = recording_lost;
        pipeline.stats_mut().output_lost = pipeline.output().lost();
        // `-- CMD`: processes it created past the bound of those followed were not traced:
        // said, and counted (`unfollowed`), never silent.
        if let Some(w) = (reader.descendants.as_ref()).and_then(|d| d.unfollowed_warning()) {
            crate::say!("gpu-trace: {w}");
        }
        warn_unmatched_pods(&pipeline);
        let finished = pipeline.finish_all(counters, duration);
        let summary = end_outputs(finished, perfetto, out_is_stdout, failure)?;
        Ok(Summary {
            child_status,
            ..summary
        })
    }
}

/// The main trace's periodic pieces in the event loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LivePiece {
    /// `--interval`'s statistics, or a frame of the live view.
    Stats,
    /// `--share-interval`: the samples the sampler's thread took.
    Share,
    /// `-- CMD`: whether the command ended; the fork events since the last read.
    Child,
    /// `--api`: the rescan and the sums.
    ApiRescan,
    /// `--api`: the calls open past `--stuck-after`.
    Stuck,
    /// `--record-rotate TIME` and the flight recorder's clock.
    Clock,
    /// `--metrics`: the kernel's counters.
    Health,
}

impl Turns for LiveRun<'_> {
    type Piece = LivePiece;

    fn failed(&self) -> bool {
        self.reader.outputs_failed(&self.pipeline, &self.recorder)
    }

    fn read(&mut self, ring: &mut RingBuf<MapData>) -> Result<Drained, RunError> {
        Ok(self.reader.drain(
            ring,
            &mut self.pipeline,
            &mut self.recorder,
            Some(DRAIN_SLICE),
        ))
    }

    fn piece(&mut self, piece: LivePiece, ring: &mut RingBuf<MapData>) -> Result<Flow, RunError> {
        match piece {
            LivePiece::Stats => {
                // What the ring holds first (one slice of it under a storm), so that the
                // statistics count it.
                let more = self.read(ring)?;
                let (reader, tracer) = (&mut self.reader, &mut self.tracer);
                reader.send_api_paths(tracer, &mut self.pipeline, false);
                self.show_stats()?;
                if more == Drained::More {
                    return Ok(Flow::More);
                }
            }
            LivePiece::Share => self.take_share()?,
            LivePiece::Child => return self.child_tick(),
            LivePiece::ApiRescan => self.api_rescan(),
            LivePiece::Stuck => {
                let (tracer, pipeline) = (&self.tracer, &mut self.pipeline);
                (self.reader).send_stuck(tracer, pipeline, &mut self.recorder)?;
            }
            LivePiece::Clock => {
                self.rotate_due = self.recorder.rotates_by_time();
                if let Some(f) = self.recorder.flight.as_mut() {
                    f.tick(&self.tracer);
                }
            }
            LivePiece::Health => {
                let counters = self.tracer.counters()?;
                self.left_out_so_far();
                self.pipeline.kernel_counters(&counters);
            }
        }
        Ok(Flow::Go)
    }

    /// --flight-recorder: SIGUSR1 (or an authenticated POST /dump) dumps the window, after
    /// what the ring holds (one slice of it under a storm): the window ends with the records
    /// made before the request.
    fn usr1(&mut self, ring: &mut RingBuf<MapData>) -> Result<Flow, RunError> {
        let more = self.read(ring)?;
        if let Some(f) = self.recorder.flight.as_ref() {
            f.note(gpu_trace_core::flight::Trigger::Signal);
        }
        Ok(if more == Drained::More {
            Flow::More
        } else {
            Flow::Go
        })
    }

    fn after_turn(&mut self) -> Result<(), RunError> {
        self.attach_loaded();
        // A full recording piece ends here, between two records.
        let rotate_due = std::mem::take(&mut self.rotate_due);
        self.recorder.turn(&self.tracer, rotate_due)
    }
}
