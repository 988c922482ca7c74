//! Live tracing and replay: the loops around [`Pipeline`].
//!
//! Live: load and attach ([`Tracer`]), report the hooks on stderr, read the ring buffer as it
//! fills (tokio `AsyncFd`), stop on Ctrl-C, SIGTERM or `--duration`, drain what is left, then
//! print the statistics with the kernel's counters. Replay: the same pipeline over a recording.

use std::{
    fs::File,
    io::{self, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use gpu_trace_common::record_kind;
use gpu_trace_core::inventory::{GpuNode, Inventory, render_text_with};
use thiserror::Error;
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};

use crate::{
    cli::{OutputArgs, TraceArgs, Vendor},
    escape,
    loader::{LoadError, LoadOptions, Tracer},
    model::stats::KernelCounters,
    output::{
        clock::Clock,
        files::{self, Staged, Untouched},
        perfetto::{PerfettoSink, PerfettoWriter},
    },
    pipeline::{Finished, Pipeline, PipelineConfig},
    probe::{
        cgroup::{CgroupError, CgroupResolver, Subtree},
        inventory::{self, WalkOptions},
        system,
    },
    queue::{Overflow, QueueWriter, Units},
    record::{RecordError, RecordReader, RecordWriter, RecordingHeader, RecordingTrailer},
    sink::SinkError,
    wire::{self, RawRecord},
};

#[derive(Debug, Error)]
pub enum RunError {
    /// The system cannot support what was asked (exit code 3).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    /// The Perfetto timeline could not be written or put in place.
    #[error("{what}: {source}")]
    Perfetto { what: String, source: io::Error },
    #[error(transparent)]
    Metrics(#[from] crate::metrics::server::ServeError),
    /// A cgroup or container given on the command line names nothing usable (exit code 2).
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// `-- CMD` could not be started (a bad `--user` is bad usage, exit code 2).
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    /// Options that do not go together (exit code 2).
    #[error("{0}")]
    Usage(String),
}

impl RunError {
    /// The system cannot support what was asked (exit code 3), as opposed to a runtime failure.
    pub fn is_unsupported(&self) -> bool {
        match self {
            Self::Unsupported(_) => true,
            Self::Load(e) => e.is_unsupported(),
            Self::Cgroup(e) => e.is_unsupported(),
            _ => false,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

pub use crate::pipeline::Summary;

/// `--vendor auto`: the driver whose device nodes or module are present.
pub fn detect_vendor() -> Result<Vendor, RunError> {
    let nvidia = Path::new("/sys/module/nvidia").exists() || Path::new("/dev/nvidiactl").exists();
    let amd = Path::new("/dev/kfd").exists();
    match (nvidia, amd) {
        (true, _) => Ok(Vendor::Nvidia),
        (false, true) => Ok(Vendor::Amd),
        (false, false) => Err(RunError::Unsupported(
            "--vendor auto found no GPU driver: neither the nvidia module (/sys/module/nvidia, \
             /dev/nvidiactl) nor AMD KFD (/dev/kfd) is present. Load the driver, or name the \
             vendor with --vendor to trace processes that will start later."
                .into(),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Stop requests.

static STOP: AtomicBool = AtomicBool::new(false);

/// Installs SIGINT and SIGTERM handlers that only note the request ([`stop_requested`]). A live
/// run calls this first, before anything is validated, opened or attached, so that a signal
/// that comes during start-up ends the run cleanly as soon as it can instead of being lost.
pub fn install_stop_signals() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the action only stores to an atomic, which is async-signal-safe.
        unsafe {
            signal_hook_registry::register(signal, || STOP.store(true, Ordering::SeqCst))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// `-q`: warnings only.

static QUIET: AtomicBool = AtomicBool::new(false);

/// `-q` on the command line: from now on stderr gets warnings and errors only, besides the
/// line that says tracing started (`tracing …; hooks: …`, which scripts wait for) and where
/// `--metrics` serves; the start-up notes (what runs, what is not used, the inventory) are left
/// out.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::SeqCst);
}

/// A start-up note on stderr, after `gpu-trace: `, unless `-q` ([`set_quiet`]).
fn note(line: impl std::fmt::Display) {
    if !QUIET.load(Ordering::SeqCst) {
        eprintln!("gpu-trace: {line}");
    }
}

/// A SIGINT or SIGTERM came (after [`install_stop_signals`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------------
// Output files.

/// How long the end of a run waits for a stalled output to take the rest (without progress).
const OUTPUT_STALL: Duration = Duration::from_secs(2);

/// Refuses an output that is the input (`replay FILE`) or another output, before anything is
/// opened or attached. The message is for a usage error (exit 2).
pub fn check_paths(
    input: Option<&Path>,
    args: &OutputArgs,
    record: Option<&Path>,
) -> Result<(), String> {
    let inputs: Vec<(&str, &Path)> = input.map(|p| ("replay", p)).into_iter().collect();
    let outputs: Vec<(&str, &Path)> = [
        ("-o", args.output.as_deref()),
        ("--perfetto", args.perfetto.as_deref()),
        ("--record", record),
    ]
    .into_iter()
    .filter_map(|(what, p)| Some((what, p?)))
    .collect();
    files::check_distinct(&inputs, &outputs)
}

/// Opens an output file without truncating it (see [`Untouched`]); a FIFO that nobody reads yet
/// is waited for, with a message, until a reader comes, a stop signal arrives or `deadline`
/// passes.
fn open_waiting(what: &str, path: &Path, deadline: Option<Instant>) -> Result<Untouched, RunError> {
    let mut told = false;
    loop {
        match files::open_untouched(path) {
            Ok(f) => return Ok(f),
            Err(e) if files::is_no_reader(&e) => {
                if !told {
                    eprintln!(
                        "gpu-trace: waiting for a reader of the FIFO {} ({what}); Ctrl-C or \
                         --duration end the wait",
                        path.display()
                    );
                    told = true;
                }
                if stop_requested() || deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(RunError::Io {
                        what: format!("opening {what} {}", path.display()),
                        source: io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no process opened the FIFO for reading before the run was stopped \
                             (signal or --duration); nothing was traced. Start the reader first",
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io_err(format!("creating {what} {}", path.display()))(e)),
        }
    }
}

/// The outputs of a run, opened before anything is attached.
struct OutputFiles {
    out: QueueWriter,
    out_is_stdout: bool,
    perfetto: Option<(Staged, PathBuf)>,
    record: Option<QueueWriter>,
}

/// `-o` and `--record` files opened but not yet emptied: [`Untouched::commit`] once every
/// start-up check passed; dropped instead (a failed start), existing files keep their bytes and
/// files the open created are removed.
struct Pending(Vec<(&'static str, Untouched)>);

impl Pending {
    fn commit(self) -> Result<(), RunError> {
        for (what, mut file) in self.0 {
            file.commit()
                .map_err(io_err(format!("emptying the {what} file")))?;
        }
        Ok(())
    }
}

/// [`prepare_output_files`], emptied at once.
fn open_output_files(
    args: &OutputArgs,
    record: Option<&Path>,
    deadline: Option<Instant>,
    overflow: Overflow,
    wake: &Arc<tokio::sync::Notify>,
) -> Result<OutputFiles, RunError> {
    let (files, pending) = prepare_output_files(args, record, deadline, overflow, wake)?;
    pending.commit()?;
    Ok(files)
}

/// Opens the outputs without changing an existing file's contents yet: the `-o` and `--record`
/// files are emptied by [`Pending::commit`], the Perfetto timeline replaces its file only at the
/// end ([`Staged`]).
fn prepare_output_files(
    args: &OutputArgs,
    record: Option<&Path>,
    deadline: Option<Instant>,
    overflow: Overflow,
    wake: &Arc<tokio::sync::Notify>,
) -> Result<(OutputFiles, Pending), RunError> {
    let mut pending = Vec::new();
    let mut open = |what: &'static str, path: &Path| -> Result<File, RunError> {
        let file = open_waiting(what, path, deadline)?;
        let writer = file
            .writer()
            .map_err(io_err(format!("opening {what} {}", path.display())))?;
        pending.push((what, file));
        Ok(writer)
    };
    let on_failure = {
        let wake = wake.clone();
        Arc::new(move || wake.notify_one()) as Arc<dyn Fn() + Send + Sync>
    };
    let out: Box<dyn Write + Send> = match &args.output {
        // --quiet: no events and no statistics (e.g. with --metrics only).
        _ if args.quiet => Box::new(io::sink()),
        Some(path) => Box::new(open("-o", path)?),
        None => Box::new(io::stdout()),
    };
    let perfetto = match &args.perfetto {
        Some(path) => {
            let staged = if Staged::is_special(path) {
                Staged::in_place(open("--perfetto", path)?, path)
            } else {
                Staged::create(path).map_err(io_err(format!("creating {}", path.display())))?
            };
            Some((staged, path.clone()))
        }
        None => None,
    };
    let record = match record {
        Some(path) => Some(QueueWriter::new(
            Box::new(open("--record", path)?),
            Units::Marked,
            overflow,
            on_failure.clone(),
        )),
        None => None,
    };
    let files = OutputFiles {
        out: QueueWriter::new(out, Units::Lines, overflow, on_failure),
        out_is_stdout: args.output.is_none(),
        perfetto,
        record,
    };
    Ok((files, Pending(pending)))
}

/// The pipeline for `args` over the opened outputs. `by_record_time` (replay): `--interval` counts in
/// the records' time (replay) rather than on the caller's timer (live).
fn new_pipeline(
    args: &OutputArgs,
    clock: Clock,
    out: QueueWriter,
    perfetto: Option<&Staged>,
    by_record_time: bool,
) -> Result<Pipeline<QueueWriter>, RunError> {
    let pipeline =
        Pipeline::new(pipeline_config(args, clock.clone()), out).with_gpu_filter(args.gpus.clone());
    // Pods by name: the node's kubelet directory in a live run; replay only where told
    // (a recording's pods are another node's).
    let pods_dir = (args.pods_dir.clone())
        .or_else(|| (!by_record_time).then(|| crate::probe::pods::DEFAULT_DIR.into()));
    let pipeline = match pods_dir {
        Some(dir) => pipeline.with_pod_names(Box::new(crate::probe::pods::PodDirectory::new(dir))),
        None => pipeline,
    };
    let pipeline = match perfetto {
        Some(staged) => {
            let what = || "writing the Perfetto timeline";
            let file = staged.file().try_clone().map_err(io_err(what()))?;
            let out: Box<dyn Write> = Box::new(BufWriter::new(file));
            let writer = PerfettoWriter::new(out, clock.clone()).map_err(io_err(what()))?;
            pipeline.with_output(Box::new(PerfettoSink::new(writer, clock)))
        }
        None => pipeline,
    };
    Ok(match interval(args) {
        Some(period) => pipeline.with_interval(period, by_record_time, Box::new(io::stderr())),
        None => pipeline,
    })
}

/// `--interval`, kept from [`cli::MIN_INTERVAL_SECS`] to [`cli::MAX_INTERVAL_SECS`] (a zero
/// period makes tokio's interval panic, a huge one the `Instant` addition that starts it; the
/// parser refuses such values, this keeps any other caller safe).
fn interval(args: &OutputArgs) -> Option<Duration> {
    use crate::cli::{MAX_INTERVAL_SECS, MIN_INTERVAL_SECS};
    args.interval.map(|secs| {
        let secs = if secs.is_nan() {
            MIN_INTERVAL_SECS
        } else {
            secs.clamp(MIN_INTERVAL_SECS, MAX_INTERVAL_SECS)
        };
        Duration::from_secs_f64(secs)
    })
}

fn pipeline_config(args: &OutputArgs, clock: Clock) -> PipelineConfig {
    PipelineConfig {
        verbose: args.verbose,
        pids: args.pids.clone(),
        comms: args.comms.clone(),
        format: args.format,
        timestamps: args.timestamps,
        stats: !args.no_stats,
        clock,
        show_container: args.show_container,
    }
}

/// Warnings for `--pid` values that name no process now (`tgid_of`: the thread group of a
/// live task id, `None` when there is none): such a filter is kept and waits for the pid, and
/// a thread id is named with its process (events are filtered by process).
pub fn pid_warnings(pids: &[u32], tgid_of: impl Fn(u32) -> Option<u32>) -> Vec<String> {
    pids.iter()
        .filter_map(|&pid| match tgid_of(pid) {
            None => Some(format!(
                "--pid {pid}: no such process now; waiting for it (a process started later with \
                 this id is traced; nothing is printed until then)"
            )),
            Some(tgid) if tgid != pid => Some(format!(
                "--pid {pid} is a thread of process {tgid}: the filter is on processes, so \
                 nothing of {pid} will match; use --pid {tgid}"
            )),
            Some(_) => None,
        })
        .collect()
}

/// A live view of the statistics (`gpu-trace top`), given them once a second.
pub trait Viewer {
    fn frame(
        &mut self,
        stats: &crate::model::stats::Stats,
        elapsed: Duration,
        counters: Option<KernelCounters>,
    ) -> io::Result<()>;

    /// Replay: asked after each frame; `false` ends the replay there (the user quit).
    fn next(&mut self) -> io::Result<bool> {
        Ok(true)
    }

    /// Replay: the recording has no more records (the last frame was drawn).
    fn at_end(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Report lines of the run's end (`--bpf-stats`): printed now, or kept by a view that holds
    /// the terminal until it gives it back.
    fn report(&mut self, lines: Vec<String>) {
        print_report(lines);
    }
}

/// What the end of a run says of a `-- CMD` that a stop (SIGINT, SIGTERM, --duration) left
/// running (`gpu-trace` and `gpu-trace api` alike).
pub fn still_runs(pid: u32) -> String {
    format!(
        "the command (pid {pid}) still runs, no longer traced; the exit status is gpu-trace's own"
    )
}

/// Report lines on stderr, each after `gpu-trace: `.
pub fn print_report(lines: Vec<String>) {
    for line in lines {
        eprintln!("gpu-trace: {line}");
    }
}

/// `--bpf-stats` at exit: a line per loaded program, `program NAME: N runs, M ns/run`.
fn describe_program_stats(stats: &[crate::loader::ProgramStats]) -> Vec<String> {
    std::iter::once(
        "BPF program runs while tracing (--bpf-stats; programs not listed were not loaded):"
            .to_string(),
    )
    .chain(stats.iter().map(|p| {
        format!(
            "program {}: {} runs, {} ns/run{}",
            p.name,
            p.runs,
            p.run_time_ns.checked_div(p.runs).unwrap_or(0),
            if p.missed > 0 {
                format!(", {} skipped by the kernel", p.missed)
            } else {
                String::new()
            }
        )
    }))
    .collect()
}

/// At exit, always: runs of gpu-trace's programs that the kernel skipped (`recursion_misses`:
/// the program was already running on that CPU, e.g. preempted inside it on a kernel whose
/// syscall tracepoints are preemptible), whose calls were then not seen. Nothing when none.
fn describe_missed_runs(stats: &[crate::loader::ProgramStats]) -> Option<String> {
    let missed: Vec<String> = stats
        .iter()
        .filter(|p| p.missed > 0)
        .map(|p| format!("{} {}", p.name, p.missed))
        .collect();
    let total: u64 = stats.iter().map(|p| p.missed).sum();
    (total > 0).then(|| {
        format!(
            "WARNING: the kernel skipped {total} run(s) of gpu-trace's programs ({}): each was \
             already running on that CPU, so the call of each skipped run (of any process; a \
             GPU call among them lost its event) was not seen (docs/troubleshooting.md, \
             \"Skipped by the kernel\")",
            missed.join(", ")
        )
    })
}

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
    check_api_targets(args)?;
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
    // Every output is opened before anything is attached (a FIFO waits for its reader here),
    // but an existing file is emptied only once every start-up check below passed: a busy
    // metrics port, a bad --cgroup or a refused program leaves yesterday's files as they were.
    let wake = Arc::new(tokio::sync::Notify::new());
    let (files, pending) = prepare_output_files(
        &args.output,
        args.record.as_deref(),
        startup_deadline,
        Overflow::Drop,
        &wake,
    )?;
    // Containers: the cgroup2 tree, for --cgroup/--container and to name each process's
    // cgroup; a bad argument stops the run before anything is attached.
    let mut cgroups = CgroupResolver::for_host();
    let subtrees = CgroupSelection::resolve(args, cgroups.as_mut())?;
    for line in subtrees.describe() {
        note(line);
    }
    let kfd = amd.then(crate::probe::kfd::KfdPresence::probe);
    check_kfd(args, kfd.as_ref())?;
    let options = load_options(args, amd, kfd.as_ref(), watched, &subtrees);
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
    announce_inventory(&inventory, &args.output);
    // Started: the -o and --record files may now lose their old contents.
    pending.commit()?;
    let OutputFiles {
        out,
        out_is_stdout,
        perfetto,
        record,
    } = files;
    let sampled = (amd, share_sampler.is_some());
    let recorder = record
        .map(|queue| start_recording(queue, &clock, &tracer, &inventory, sampled))
        .transpose()?;
    let pipeline = new_pipeline(
        &args.output,
        clock,
        out,
        perfetto.as_ref().map(|(s, _)| s),
        false,
    )?;
    let (mut pipeline, metrics_server, ring_fill) = match metrics {
        Some((m, server)) => {
            let fill = m.ring_fill_slot();
            (pipeline.with_output(Box::new(m)), Some(server), Some(fill))
        }
        None => (pipeline, None, None),
    };
    pipeline
        .inventory(&inventory)
        .map_err(io_err("writing the output"))?;
    let ring = watch_ring_buffer(&mut tracer, ring_fill)?;
    let (command, descendants) = release_command(launched, &mut pipeline);
    let mut live = LiveRun {
        ring,
        tracer,
        reader: Reader {
            descendants,
            ..Reader::new(cgroups, api)
        },
        command,
        pipeline,
        recorder,
        viewer,
        tracing_since,
        share: start_share_sampler(share_sampler, args.share_interval),
    };
    live.trace_until_stopped(
        &mut signals,
        deadline,
        interval(&args.output),
        &wake,
        metrics_server.is_some(),
    )
    .await?;
    // Before detaching, which unloads the programs.
    live.report_program_runs(args.bpf_stats);
    let counters = live.drain_after_detach().await?;
    // A denial that did not hold is said on stderr too, whatever the output and its format.
    if let Some(warning) = counters.deny_unfollowed_warning() {
        live.report(vec![warning]);
    }
    live.end(counters, args.record.as_deref(), perfetto, out_is_stdout)
}

/// `-- CMD`: the pipeline follows the command, which is let go (everything is attached);
/// returns its pid and the follower of its descendants.
fn release_command(
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
struct CommandRun {
    pid: u32,
    status: Option<i32>,
}

/// `-- CMD`: the command forked and waiting for [`crate::launch::Launched::release`], and the
/// follower of the processes it creates (subscribed before it runs); `None` without `-- CMD`.
fn start_command(
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
        eprintln!("gpu-trace: warning: {why}");
    }
    Ok(Some((child, descendants)))
}

/// `--api` without `--pid`, `--comm` or `-- CMD`: bad usage, said before anything loads.
fn check_api_targets(args: &TraceArgs) -> Result<(), RunError> {
    let none =
        args.output.pids.is_empty() && args.output.comms.is_empty() && args.launch.is_empty();
    if args.api && none {
        return Err(RunError::Usage(
            crate::api::attach::TraceApiError::NoTarget.to_string(),
        ));
    }
    Ok(())
}

/// `--api`: the API layer's uprobes on the targets (before the start-up line says "hooks"):
/// `--pid`, `--comm`, and `-- CMD`'s own process (`command`; its libraries are attached at the
/// rescans once it has exec'd and mapped them).
fn api_layer(
    tracer: &mut Tracer,
    args: &TraceArgs,
    command: Option<u32>,
) -> Result<Option<crate::api::attach::TraceApi>, RunError> {
    if !args.api {
        return Ok(None);
    }
    let command = command.zip(args.launch.first());
    crate::api::attach::for_trace(
        tracer,
        &args.output.pids,
        &args.output.comms,
        command,
        stop_requested,
        args.api_calls,
    )
    .map(Some)
    .map_err(|e| RunError::Unsupported(e.to_string()))
}

/// NVML's figures for the inventory: `None` on AMD; `Err`: why not.
type NvmlFigures = Option<Result<Vec<crate::probe::nvml::NvmlGpu>, String>>;

/// NVML, started once (NVIDIA): the inventory's GPU names and per-process memory, and the GPU
/// share sampler (`--share-interval`; `None`: said once on stderr, tracing goes on, or
/// `--no-share`). Bounded by [`crate::probe::nvml::START_LIMIT`]: a library that does not
/// answer, or reports an absurd device count, is said once on stderr, even with `--no-share`.
fn start_nvml(
    args: &TraceArgs,
    amd: bool,
) -> (
    NvmlFigures,
    Option<Box<dyn crate::probe::share::ShareSampler>>,
) {
    use crate::probe::{nvml, share};
    if amd {
        if !args.no_share {
            note("GPU share: not sampled on AMD (KFD has no per-process utilization samples)");
        }
        return (None, None);
    }
    let replay = share::replay_capture();
    let keep = !args.no_share && replay.is_none();
    let (figures, nvml) = match nvml::start(keep) {
        Ok(started) => {
            let sampler = started
                .nvml
                .map(|n| share::NvmlSampler::new(n, started.devices));
            (Ok(started.gpus), Ok(sampler))
        }
        Err(why) => {
            if why.is_broken() {
                eprintln!("gpu-trace: {why}: GPU shares and UUIDs are not sampled this run");
            }
            (Err(why.to_string()), Err(why))
        }
    };
    let sampler = (!args.no_share)
        .then(|| open_share_sampler(replay, nvml))
        .flatten();
    (Some(figures), sampler)
}

/// The share sampler: the test stand-in when [`crate::probe::share::REPLAY_ENV`] names a
/// capture, else NVML's; `None` said once on stderr (unless [`start_nvml`] said it already).
fn open_share_sampler(
    replay: Option<String>,
    nvml: Result<Option<crate::probe::share::NvmlSampler>, crate::probe::nvml::StartError>,
) -> Option<Box<dyn crate::probe::share::ShareSampler>> {
    let why = match (replay, nvml) {
        (Some(path), _) => match crate::probe::share::ReplaySampler::open(&path) {
            Ok(s) => return Some(Box::new(s)),
            Err(why) => why,
        },
        (None, Ok(Some(s))) => return Some(Box::new(s)),
        (None, Ok(None)) => return None,
        (None, Err(why)) if why.is_broken() => return None,
        (None, Err(why)) => why.to_string(),
    };
    eprintln!(
        "gpu-trace: warning: GPU share not sampled: {why}; tracing goes on (--no-share silences \
         this)"
    );
    None
}

/// Starts the sampler's thread (a thread that cannot start: said once, tracing goes on).
fn start_share_sampler(
    sampler: Option<Box<dyn crate::probe::share::ShareSampler>>,
    period_s: f64,
) -> Option<crate::probe::share::ShareThread> {
    let period = Duration::from_secs_f64(period_s);
    match crate::probe::share::start(sampler?, period) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("gpu-trace: GPU share not sampled: no thread for it ({e}); tracing goes on");
            None
        }
    }
}

/// SIGINT and SIGTERM as the live loop waits for them (tokio's handlers).
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<Self, RunError> {
        Ok(Self {
            interrupt: tokio::signal::unix::signal(SignalKind::interrupt())
                .map_err(io_err("installing the SIGINT handler"))?,
            terminate: tokio::signal::unix::signal(SignalKind::terminate())
                .map_err(io_err("installing the SIGTERM handler"))?,
        })
    }

    /// Returns when a SIGINT or a SIGTERM came.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// The start-up warnings on stderr: `--pid` values that name no process now (or a thread), an
/// NVIDIA driver that is not loaded.
fn warn_before_start(args: &TraceArgs, amd: bool) {
    for warning in pid_warnings(&args.output.pids, system::thread_group_of) {
        eprintln!("gpu-trace: warning: {warning}");
    }
    // AMD without /dev/kfd is reported below (KfdPresence).
    if let Some(warning) = (!amd).then(system::nvidia_not_loaded_warning).flatten() {
        eprintln!("gpu-trace: warning: {warning}");
    }
}

/// AMD: what is missing of KFD, as a warning; without KFD's device number no KFD call can be
/// seen, so the run stops (exit 3) rather than run and report nothing, unless a test device
/// stands in for it (--watch-device).
fn check_kfd(
    args: &TraceArgs,
    kfd: Option<&crate::probe::kfd::KfdPresence>,
) -> Result<(), RunError> {
    if let Some(kfd) = kfd
        && let Some(warning) = kfd.warning()
    {
        if kfd.major.is_none() && args.watch_device.is_none() {
            return Err(RunError::Unsupported(warning));
        }
        eprintln!("gpu-trace: warning: {warning}");
    }
    Ok(())
}

/// What the loader is asked for: the vendor, its device numbers (`watched`: `--watch-device`
/// adds a device of the vendor being traced), the kernel-side filters and hook choices.
fn load_options(
    args: &TraceArgs,
    amd: bool,
    kfd: Option<&crate::probe::kfd::KfdPresence>,
    watched: Option<u32>,
    subtrees: &CgroupSelection,
) -> LoadOptions {
    let (extra_device, extra_kfd_device) = if amd {
        (None, watched)
    } else {
        (watched, None)
    };
    LoadOptions {
        nvidia: !amd,
        kfd_major: kfd.and_then(|k| k.major),
        extra_kfd_device,
        extra_device,
        filter_tgid: match args.output.pids.as_slice() {
            [one] => Some(*one),
            _ => None,
        },
        ring_bytes: args.ring_size,
        syscall_hook: args.syscall_hook,
        deny_pids: args.deny_pids.clone(),
        filter_cgroups: subtrees.filter.iter().map(Subtree::kernel_match).collect(),
        deny_cgroups: subtrees.deny.iter().map(Subtree::kernel_match).collect(),
        deep_hooks: !args.no_deep_hooks,
        deep_attach: args.deep_attach,
        bpf_stats: args.bpf_stats,
    }
}

/// The processes that have a GPU open already ([`take_inventory`]); under
/// `--cgroup`/`--container`, only those inside (the others are not traced, before or after);
/// with `-- CMD` (`launched`), only the command.
fn traced_inventory(
    args: &TraceArgs,
    amd: bool,
    nvml: Option<Result<Vec<crate::probe::nvml::NvmlGpu>, String>>,
    subtrees: &CgroupSelection,
    launched: Option<&(crate::launch::Launched, crate::launch::Descendants)>,
) -> Inventory {
    let mut inventory = take_inventory(&args.watch_device, amd, nvml);
    if let Some((command, _)) = launched {
        // `-- CMD`: the command's processes only; none had a GPU open before it started.
        inventory.processes.retain(|p| p.pid == command.pid);
    }
    if !subtrees.filter.is_empty() {
        inventory.processes.retain(|p| {
            p.cgroup
                .as_deref()
                .is_some_and(|c| subtrees.filter.iter().any(|s| s.contains(c)))
        });
    }
    inventory
}

/// The start-up report on stderr: what is traced, the hooks attached and those not used.
fn announce_hooks(tracer: &Tracer, kfd: Option<&crate::probe::kfd::KfdPresence>) {
    let what = match kfd {
        Some(k) => format!(
            "AMD KFD queue calls on /dev/kfd (char major {})",
            k.major
                .map_or_else(|| "unknown".to_string(), |m| m.to_string())
        ),
        None => "NVIDIA RM calls".to_string(),
    };
    eprintln!(
        "gpu-trace: tracing {what}; hooks: {}",
        tracer.describe_hooks()
    );
    for refused in &tracer.refused {
        note(format_args!("(not used: {refused})"));
    }
}

/// `--record`: the recording's header (this machine, the hooks, the command line, the
/// inventory) written to its queue, ready for the records.
fn start_recording(
    queue: QueueWriter,
    clock: &Clock,
    tracer: &Tracer,
    inventory: &Inventory,
    (amd, share): (bool, bool),
) -> Result<RecordWriter<QueueWriter>, RunError> {
    let header = RecordingHeader {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        host: system::host_name(),
        kernel: system::kernel_release(),
        driver: if amd {
            crate::probe::kfd::driver_description()
        } else {
            system::nvidia_driver()
        },
        realtime_offset_ns: clock.offset_ns(),
        hooks: tracer.hooks.iter().map(ToString::to_string).collect(),
        argv: std::env::args().collect(),
        inventory: Some(inventory.clone()),
    };
    // Version 2 only when share samples may come: the others stay readable by older readers.
    let mut w = if share {
        RecordWriter::with_share(queue, &header)?
    } else {
        RecordWriter::new(queue, &header)?
    };
    w.get_mut().mark_unit();
    Ok(w)
}

/// The ring buffer, taken from the tracer and registered with tokio to be read when it holds
/// records; `--metrics` reads its fill from the kernel's pages.
fn watch_ring_buffer(
    tracer: &mut Tracer,
    metrics: Option<gpu_trace_core::metrics::RingFillSlot>,
) -> Result<AsyncFd<RingBuf<MapData>>, RunError> {
    let ring = tracer.take_ring_buffer()?;
    if let Some(slot) = metrics {
        use std::os::fd::AsFd as _;
        match crate::metrics::ring::RingFill::new(ring.as_fd()) {
            Ok(fill) => slot.set(move || fill.used_bytes()),
            Err(e) => eprintln!("gpu-trace: (metrics: ring-buffer fill not available: {e})"),
        }
    }
    // SAFETY: the ring buffer owns its map fd and keeps it open for as long as the AsyncFd
    // that owns the ring buffer lives; nothing else closes it.
    unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }.map_err(|e| {
        RunError::Io {
            what: "polling the ring buffer".into(),
            source: e.into(),
        }
    })
}

/// A live run once attached: the ring buffer and its reader, the pipeline, the recording and
/// the live view.
struct LiveRun<'v> {
    // Declared (so dropped) before the tracer whose map it was.
    ring: AsyncFd<RingBuf<MapData>>,
    tracer: Tracer,
    reader: Reader,
    pipeline: Pipeline<QueueWriter>,
    recorder: Option<RecordWriter<QueueWriter>>,
    viewer: Option<&'v mut dyn Viewer>,
    tracing_since: Instant,
    /// `--share-interval`: the GPU share sampler's thread, while tracing.
    share: Option<crate::probe::share::ShareThread>,
    /// `-- CMD`: the command, and its exit status once it ended.
    command: Option<CommandRun>,
}

impl LiveRun<'_> {
    /// Reads the ring buffer as it fills until a stop signal, the deadline or an output's
    /// failure; `period`: `--interval`'s statistics (the live view instead draws a frame once a
    /// second); `metrics_served`: the kernel's counters go to the metrics once a second.
    async fn trace_until_stopped(
        &mut self,
        signals: &mut StopSignals,
        deadline: Option<Instant>,
        period: Option<Duration>,
        wake: &tokio::sync::Notify,
        metrics_served: bool,
    ) -> Result<(), RunError> {
        let mut health = tokio::time::interval(Duration::from_secs(1));
        // `-- CMD`: whether the command ended, looked at this often.
        let mut child_tick = tokio::time::interval(CHILD_POLL);
        let mut share_tick = tokio::time::interval(Duration::from_millis(100));
        let mut api_rescan = tokio::time::interval(Duration::from_secs(1));
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        // The live view draws its first frame at once; --interval statistics after a period.
        let now = tokio::time::Instant::now();
        let mut ticker = match self.viewer {
            Some(_) => Some(tokio::time::interval_at(now, Duration::from_secs(1))),
            None => period.map(|period| tokio::time::interval_at(now + period, period)),
        };
        // A stop requested during start-up (before the handlers above existed) is not lost.
        // The deadline is also looked at here, not only by its timer: under a storm the timer
        // is served only between two slices of reading.
        let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
        while !stop_requested()
            && !past_deadline()
            && !self.reader.outputs_failed(&self.pipeline, &self.recorder)
        {
            // Whether the ring still held records when the last slice of reading ended.
            let mut more = Drained::Empty;
            tokio::select! {
                () = signals.recv() => break,
                _ = &mut sleep => break,
                _ = async {
                    match ticker.as_mut() {
                        Some(t) => {
                            t.tick().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                } => {
                    // What the ring holds first (one slice of it under a storm), so that the
                    // statistics count it.
                    more = self.reader.drain(
                        self.ring.get_mut(),
                        &mut self.pipeline,
                        &mut self.recorder,
                        Some(DRAIN_SLICE),
                    );
                    self.show_stats()?;
                }
                () = wake.notified() => {} // an output failed: the loop condition sees it
                _ = share_tick.tick(), if self.share.is_some() => self.take_share()?,
                _ = child_tick.tick(), if self.command.is_some() => {
                    if let Some(c) = self.command.as_mut() {
                        c.status = crate::launch::reap(c.pid);
                        if c.status.is_some() {
                            break;
                        }
                    }
                }
                // --api: new --comm processes and newly mapped libraries.
                _ = api_rescan.tick(), if self.reader.api.is_some() => {
                    if let Some(api) = self.reader.api.as_mut() {
                        // The command's processes as of now (fork events read first: a child
                        // that made no driver call yet is known only from them).
                        let followed = self.reader.descendants.as_mut().map(|d| {
                            follow_changes(&mut self.pipeline, d.refresh());
                            d.pids()
                        });
                        api.rescan(&mut self.tracer, followed.into_iter().flatten());
                    }
                    let (reader, tracer) = (&mut self.reader, &self.tracer);
                    reader.send_api_sums(tracer, &mut self.pipeline, &mut self.recorder);
                }
                _ = health.tick(), if metrics_served => {
                    let counters = self.tracer.counters()?;
                    self.pipeline.kernel_counters(&counters);
                }
                guard = self.ring.readable_mut() => {
                    let mut guard = guard.map_err(io_err("waiting for the ring buffer"))?;
                    more = self.reader.drain(
                        guard.get_inner_mut(),
                        &mut self.pipeline,
                        &mut self.recorder,
                        Some(DRAIN_SLICE),
                    );
                    // Still ready while records are left: the next turn reads on.
                    if more == Drained::Empty {
                        guard.clear_ready();
                    }
                }
            }
            self.attach_loaded();
            if more == Drained::More {
                // Let the runtime serve its timers and signals before the next slice.
                tokio::task::yield_now().await;
            }
        }
        // Sampling stops with tracing: the samples taken so far are counted, the thread is let
        // go (never waited for).
        self.take_share()?;
        self.share = None;
        Ok(())
    }

    /// `--api`: reads and attaches at once the targets whose link map changed (a library
    /// `dlopen`ed), and lets the ones the kernel stopped go on.
    fn attach_loaded(&mut self) {
        if self.reader.loaded.is_empty() {
            return;
        }
        let loaded = std::mem::take(&mut self.reader.loaded);
        if let Some(api) = self.reader.api.as_mut() {
            for signal in &loaded {
                api.attacher.signal(self.tracer.ebpf_mut(), signal);
            }
            // Hand-outs are `gpu-trace api -v`'s lines; the main trace keeps none.
            api.attacher.take_handouts();
        }
    }

    /// `-- CMD`: the command's exit status (128 + N for a signal), looked at for 0.2 s more
    /// after a stop that came first (Ctrl-C reaches the command too); a command still running
    /// then is said on stderr and left to run, untraced.
    fn child_end(&mut self) -> Option<i32> {
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
    fn take_share(&mut self) -> Result<(), RunError> {
        let Some(share) = &self.share else {
            return Ok(());
        };
        let batch = match share.take() {
            Ok(batch) => batch,
            Err(stalled) => {
                // Dropped, never joined: the stuck poll is left to itself.
                eprintln!("gpu-trace: GPU share sampling stopped: {stalled}; tracing goes on");
                self.share = None;
                return Ok(());
            }
        };
        if batch.is_empty() {
            return Ok(());
        }
        if let Some(recorder) = self.recorder.as_mut() {
            // A failing recording shows through its queue (the loop's output check).
            let _ = recorder.share(&batch);
            recorder.get_mut().mark_unit();
        }
        self.pipeline.share_samples(&batch).map_err(sink_error)
    }

    /// A frame of the live view, or `--interval`'s statistics on the output.
    fn show_stats(&mut self) -> Result<(), RunError> {
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
    fn report(&mut self, lines: Vec<String>) {
        match self.viewer.as_mut() {
            Some(v) => v.report(lines),
            None => print_report(lines),
        }
    }

    /// The programs' runs (`--bpf-stats`) and those the kernel skipped; before detaching,
    /// which unloads the programs.
    fn report_program_runs(&mut self, bpf_stats: bool) {
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
    async fn drain_after_detach(&mut self) -> Result<KernelCounters, RunError> {
        self.tracer.detach();
        let mut counters = self.tracer.counters()?;
        let settle = Instant::now();
        loop {
            // Detached: what is left is at most a ring's worth, read whole.
            self.reader.drain(
                self.ring.get_mut(),
                &mut self.pipeline,
                &mut self.recorder,
                None,
            );
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
            .send_api_sums(&self.tracer, &mut self.pipeline, &mut self.recorder);
        if let Some(api) = self.reader.api.as_mut() {
            api.attacher.release_held();
            api.attacher.report_skipped();
        }
        Ok(counters)
    }

    /// Ends the recording (`record_path`: where it goes) and the outputs; returns the
    /// summary, or the first failure of the run.
    fn end(
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
        let recording_lost = match recorder {
            Some(recorder) => {
                end_recording(recorder, counters, duration, record_path, &mut failure)
            }
            None => 0,
        };
        pipeline.stats_mut().recording_lost = recording_lost;
        pipeline.stats_mut().output_lost = pipeline.output().lost();
        let finished = pipeline.finish_all(counters, duration);
        let summary = end_outputs(finished, perfetto, out_is_stdout, failure)?;
        Ok(Summary {
            child_status,
            ..summary
        })
    }
}

/// Writes the recording's trailer and waits (at most [`OUTPUT_STALL`] without progress) for
/// its reader to take the rest; a recording cut short is the run's failure unless one came
/// first. Returns the records the recording lost.
fn end_recording(
    recorder: RecordWriter<QueueWriter>,
    counters: KernelCounters,
    duration: Duration,
    path: Option<&Path>,
    failure: &mut Option<RunError>,
) -> u64 {
    let trailer = RecordingTrailer {
        kernel_counters: counters,
        duration_ns: duration.as_nanos() as u64,
        recording_lost: recorder_lost(&recorder),
    };
    match recorder.finish(&trailer) {
        Ok(queue) => {
            let closed = queue.close(OUTPUT_STALL);
            if !closed.complete && failure.is_none() {
                *failure = Some(RunError::Io {
                    what: format!(
                        "writing the recording {}",
                        path.unwrap_or(Path::new("")).display()
                    ),
                    source: closed.error.unwrap_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            "its reader stopped taking data; the recording is cut short",
                        )
                    }),
                });
            }
            closed.lost
        }
        Err(e) => {
            failure.get_or_insert(e.into());
            0
        }
    }
}

/// The inventory processes to put in the kernel's `TRACKED` map, with their bits: those the
/// `--pid`/`--comm` filters select (the others' `close()` and exit records would only be
/// filtered out again, and would compete for the ring buffer).
pub fn kernel_tracking(inv: &Inventory, filters: &crate::cli::OutputArgs) -> Vec<(u32, u32)> {
    inv.processes
        .iter()
        .filter(|p| filters.pids.is_empty() || filters.pids.contains(&p.pid))
        .filter(|p| filters.comms.is_empty() || filters.comms.contains(&p.comm))
        .map(|p| {
            let nv = if p.uses_nvidia() {
                crate::loader::TRACK_NV
            } else {
                0
            };
            let kfd = if p.uses_kfd() {
                crate::loader::TRACK_KFD
            } else {
                0
            };
            (p.pid, nv | kfd)
        })
        .filter(|&(_, bits)| bits != 0)
        .collect()
}

/// CLOCK_MONOTONIC now, in ns (the clock of the records' timestamps).
fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Walks `/proc` for processes with a device of the traced vendor open (and the watched node),
/// adding NVML's figures (`nvml`: queried before attaching) where the library is present.
fn take_inventory(
    watch_device: &Option<std::path::PathBuf>,
    amd: bool,
    nvml: Option<Result<Vec<crate::probe::nvml::NvmlGpu>, String>>,
) -> Inventory {
    use std::os::unix::fs::MetadataExt;
    let opts = WalkOptions {
        nvidia: !amd,
        kfd: amd,
        watched_rdev: watch_device
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.rdev()),
        self_pid: Some(std::process::id()),
    };
    let taken_ns = monotonic_now_ns();
    let mut inv = inventory::walk(Path::new("/proc"), &opts);
    inv.taken_ns = taken_ns;
    if amd {
        // --watch-device with --vendor amd stands for /dev/kfd.
        for p in &mut inv.processes {
            for f in &mut p.fds {
                if f.1 == GpuNode::Watched {
                    f.1 = GpuNode::Kfd;
                }
            }
        }
    }
    if let Some(nvml) = nvml {
        crate::probe::nvml::enrich(&mut inv, nvml);
    }
    inv
}

/// The inventory on standard error, before the first event (standard output, or `-o`, holds
/// only events and statistics in text mode).
/// The start-up inventory on stderr: the processes the `--pid`/`--comm` filters select (the
/// `--cgroup` filter was applied to the walk), without command lines under `--quiet`.
fn announce_inventory(inv: &Inventory, filters: &OutputArgs) {
    let shown = inv.selected(&filters.pids, &filters.comms);
    for line in render_text_with(&shown, !filters.quiet) {
        // Under -q only what could not be read, a warning.
        match line.trim_start().strip_prefix("(not inventoried: ") {
            Some(why) if QUIET.load(Ordering::SeqCst) => eprintln!(
                "gpu-trace: warning: not inventoried: {}",
                why.strip_suffix(')').unwrap_or(why)
            ),
            _ => note(line),
        }
    }
}

/// `-- CMD`: the processes that joined or left the command's set, into the pipeline's filter.
fn follow_changes(pipeline: &mut Pipeline<QueueWriter>, changes: Vec<crate::launch::Change>) {
    for c in changes {
        match c {
            crate::launch::Change::Follow(pid) => pipeline.follow(pid, true),
            crate::launch::Change::Unfollow(pid) => pipeline.follow(pid, false),
        }
    }
}

/// The ring-buffer reader of a live run: records read, the first failure of an output.
#[derive(Default)]
struct Reader {
    read: u64,
    failure: Option<RunError>,
    /// Resolves the kernel's cgroup records (`None`: no cgroup2 mount here).
    cgroups: Option<CgroupResolver>,
    /// Processes whose cgroup the pipeline knows (a `TASK_CGROUP` record, or /proc when that
    /// record was lost to a full ring).
    attributed: std::collections::HashSet<u32>,
    /// `-- CMD`: the command and the processes it created, which the pipeline follows.
    descendants: Option<crate::launch::Descendants>,
    /// `--api`: the probes and the names behind the kernel's `API_TAG` cookies.
    api: Option<crate::api::attach::TraceApi>,
    /// `--api`: targets whose link map changed (`API_LOADED`) or that were handed an address
    /// (`API_HANDOUT`), and whether the kernel stopped them, to attach at once, in ring order.
    loaded: Vec<crate::api::attach::ApiSignal>,
}

/// The cgroup subtrees of `--cgroup`/`--container` and `--deny-cgroup`/`--deny-container`.
#[derive(Debug, Default)]
struct CgroupSelection {
    filter: Vec<Subtree>,
    deny: Vec<Subtree>,
    /// What the command line said, per subtree, for the start-up report.
    named: Vec<String>,
    /// The cgroups with a `--container`/`--deny-container` id that were not selected (users'
    /// copies of a root container's id), for the start-up report.
    not_meant: Vec<String>,
}

impl CgroupSelection {
    fn resolve(
        args: &TraceArgs,
        resolver: Option<&mut CgroupResolver>,
    ) -> Result<Self, CgroupError> {
        let mut sel = Self::default();
        if args.cgroups.is_empty()
            && args.containers.is_empty()
            && args.deny_cgroups.is_empty()
            && args.deny_containers.is_empty()
        {
            return Ok(sel);
        }
        let r = resolver.ok_or(CgroupError::NoCgroup2)?;
        for (paths, ids, deny) in [
            (&args.cgroups, &args.containers, false),
            (&args.deny_cgroups, &args.deny_containers, true),
        ] {
            for p in paths {
                let s = r.subtree(p)?;
                sel.add(deny, format!("cgroup {}", s.path), s);
            }
            for id in ids {
                let found = r.find_container(id)?;
                sel.note_not_meant(deny, id, &found.not_meant);
                let s = found.subtree;
                sel.add(deny, format!("container {id}: cgroup {}", s.path), s);
            }
        }
        for (what, n) in [
            ("--cgroup/--container", sel.filter.len()),
            ("--deny-cgroup/--deny-container", sel.deny.len()),
        ] {
            if n > gpu_trace_common::CGROUP_MATCH_MAX as usize {
                return Err(CgroupError::TooMany { what, n });
            }
        }
        Ok(sel)
    }

    /// Keeps subtree `s` (`what` names it in the start-up report).
    fn add(&mut self, deny: bool, what: String, s: Subtree) {
        let role = if deny { "denying" } else { "tracing only" };
        self.named.push(format!("{role} {what}"));
        if deny {
            &mut self.deny
        } else {
            &mut self.filter
        }
        .push(s);
    }

    /// Says which cgroups with container id `id` were not selected, and why.
    fn note_not_meant(
        &mut self,
        deny: bool,
        id: &str,
        not_meant: &[(crate::model::workload::Maker, String)],
    ) {
        let (flag, not) = match deny {
            true => ("--deny-container", "not denied"),
            false => ("--container", "not traced"),
        };
        for (maker, path) in not_meant {
            self.not_meant.push(format!(
                "{flag} {id}: also found {maker} ({path}): {not}, not the container meant"
            ));
        }
    }

    /// One start-up line per subtree, then one per cgroup not meant (paths are the host's
    /// cgroup names, escaped).
    fn describe(&self) -> Vec<String> {
        (self.named.iter().chain(&self.not_meant))
            .map(|n| escape::escape_text(n).into_owned())
            .collect()
    }
}

/// How long one slice of reading may last before the live loop looks at signals, the deadline,
/// the ticker and the outputs again. Under a storm (any process can keep the ring non-empty) a
/// read that went on until the ring was empty would never return, and a stop would wait for
/// the storm to end.
const DRAIN_SLICE: Duration = Duration::from_millis(50);
/// How often the live loop looks whether `-- CMD` ended (its end stops tracing this much later
/// at most).
const CHILD_POLL: Duration = Duration::from_millis(20);
/// Records read between two looks at the clock and at a stop request.
const DRAIN_CHECK_EVERY: u64 = 256;

/// Whether a slice of reading left records in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    Empty,
    More,
}

impl Reader {
    fn new(cgroups: Option<CgroupResolver>, api: Option<crate::api::attach::TraceApi>) -> Self {
        Self {
            cgroups,
            api,
            ..Self::default()
        }
    }

    /// Reads the records the ring holds: all of them (`slice` `None`), or until `slice` has
    /// passed or a stop is requested, whichever comes first ([`Drained::More`] then). Records
    /// are counted even after an output failed, so that the counts stay exact; they are no
    /// longer written then.
    fn drain(
        &mut self,
        ring: &mut RingBuf<MapData>,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Option<RecordWriter<QueueWriter>>,
        slice: Option<Duration>,
    ) -> Drained {
        let until = slice.map(|s| Instant::now() + s);
        if let Some(d) = self.descendants.as_mut() {
            follow_changes(pipeline, d.refresh());
        }
        self.name_api_cookies(pipeline, recorder);
        let mut drained = Drained::Empty;
        let mut in_slice = 0u64;
        loop {
            in_slice += 1;
            if in_slice.is_multiple_of(DRAIN_CHECK_EVERY)
                && let Some(until) = until
                && (stop_requested() || Instant::now() >= until)
            {
                drained = Drained::More;
                break;
            }
            let Some(item) = ring.next() else { break };
            self.read += 1;
            if let Some(signal) = crate::api::attach::signal_of(&item) {
                // A live run's signal to attach, not an event: never recorded.
                self.loaded.push(signal);
                continue;
            }
            if self.failure.is_some() {
                continue;
            }
            // Parsed once: the value serves the decisions below and the pipeline; the recording
            // gets the bytes as the kernel wrote them.
            let parsed = wire::parse_record(&item);
            if let (Some(d), Ok(r)) = (self.descendants.as_mut(), parsed.as_ref())
                && !d.contains(r.header().tgid)
            {
                follow_changes(pipeline, d.resolve(r.header().tgid));
            }
            let (before, after) = self.attributions_around(parsed.as_ref().ok(), &item);
            // --api: a tag's names follow it (the pipeline and the recording both get them).
            let after = match (&parsed, &self.api) {
                (Ok(RawRecord::ApiTag(tag)), Some(api)) => {
                    Some(RawRecord::ApiContext(api.attacher.context(tag)))
                }
                _ => after,
            };
            let records = before
                .as_ref()
                .map(|a| (a.as_bytes(), Ok(a)))
                .into_iter()
                .chain(std::iter::once((&item[..], parsed.as_ref())))
                .chain(after.as_ref().map(|a| (a.as_bytes(), Ok(a))));
            for (bytes, record) in records {
                if !self.pass(bytes, record.ok(), pipeline, recorder) {
                    break;
                }
            }
        }
        if let Some(rec) = recorder.as_mut() {
            let _ = rec.flush();
        }
        let _ = pipeline.flush();
        drained
    }

    /// `--api`: the names of the cookies attached since the last drain (`API_SYMBOL`), into
    /// the recording and the pipeline before any ring record that may carry them.
    fn name_api_cookies(
        &mut self,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Option<RecordWriter<QueueWriter>>,
    ) {
        let Some(api) = self.api.as_mut() else {
            return;
        };
        for rec in api.attacher.take_symbol_records(monotonic_now_ns()) {
            let raw = RawRecord::ApiSymbol(rec);
            self.inject(&raw, pipeline, recorder);
        }
    }

    /// `--api`: the kernel's per-process call sums that changed since the last read, as
    /// `API_STATS` records into the recording and the pipeline (each second and once at the
    /// end), after the names of their cookies.
    fn send_api_sums(
        &mut self,
        tracer: &Tracer,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Option<RecordWriter<QueueWriter>>,
    ) {
        if self.api.is_none() {
            return;
        }
        self.name_api_cookies(pipeline, recorder);
        let sums = crate::api::attach::read_sums(tracer.ebpf());
        let Some(api) = self.api.as_mut() else {
            return;
        };
        for rec in api.stats_records(sums, monotonic_now_ns()) {
            self.inject(&RawRecord::ApiStats(rec), pipeline, recorder);
        }
    }

    /// A record made here (not by the kernel): into the recording and the pipeline.
    fn inject(
        &mut self,
        raw: &RawRecord,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Option<RecordWriter<QueueWriter>>,
    ) {
        if self.failure.is_none() {
            self.pass(raw.as_bytes(), Some(raw), pipeline, recorder);
        }
    }

    /// One record into the recording (`bytes`, as written) and the pipeline (`record`; `None`:
    /// the bytes are not a record, counted as malformed). False after a failure, which
    /// [`Self::failure`] then holds.
    fn pass(
        &mut self,
        bytes: &[u8],
        record: Option<&RawRecord>,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Option<RecordWriter<QueueWriter>>,
    ) -> bool {
        if let Some(rec) = recorder.as_mut() {
            if let Err(e) = rec.record(bytes) {
                self.failure = Some(e.into());
                return false;
            }
            rec.get_mut().mark_unit();
        }
        let fed = match record {
            Some(r) => pipeline.feed_record(r),
            None => {
                pipeline.malformed();
                Ok(())
            }
        };
        if let Err(e) = fed {
            self.failure = Some(sink_error(e));
            return false;
        }
        true
    }

    /// The `ATTRIBUTION` records that go with ring item `item` (`parsed`, when it is a
    /// record): one after a process's cgroup record (what it resolves to follows it, in the
    /// recording too), or one before the first record of a process whose cgroup record was lost
    /// to a full ring (from /proc, once).
    fn attributions_around(
        &mut self,
        parsed: Option<&RawRecord>,
        item: &[u8],
    ) -> (Option<RawRecord>, Option<RawRecord>) {
        // An item too malformed to parse still names its process when its header is whole.
        let hdr = match parsed {
            Some(RawRecord::TaskCgroup(tc)) => return (None, Some(self.attribution(*tc))),
            Some(r) => *r.header(),
            None => match wire::header_of(item) {
                Some(h) if h.kind != record_kind::TASK_CGROUP => h,
                _ => return (None, None),
            },
        };
        if hdr.kind == record_kind::PROCESS_EXIT {
            self.attributed.remove(&hdr.tgid);
            return (None, None);
        }
        if self.attributed.contains(&hdr.tgid) {
            return (None, None);
        }
        let path = crate::probe::cgroup::process_v2_path(hdr.tgid);
        let id = path
            .as_deref()
            .and_then(|p| self.cgroups.as_ref()?.id_of(p).ok());
        self.attributed.insert(hdr.tgid);
        let before = id.map(|cgroup_id| {
            self.attribution(gpu_trace_common::TaskCgroupRecord {
                hdr,
                cgroup_id,
                ns_pid: 0,
                _pad: 0,
            })
        });
        (before, None)
    }

    /// The `ATTRIBUTION` record of a process's cgroup record: its path and namespaced PID.
    fn attribution(&mut self, tc: gpu_trace_common::TaskCgroupRecord) -> RawRecord {
        self.attributed.insert(tc.hdr.tgid);
        let path = self
            .cgroups
            .as_mut()
            .and_then(|r| r.path(tc.cgroup_id).map(str::to_string));
        // The kernel's reading, made at the call; /proc only where it had none (a record made
        // up from /proc above), while the process is still there.
        let ns_pid = match tc.ns_pid {
            0 => system::namespaced_pid(tc.hdr.tgid),
            n => Some(n),
        };
        RawRecord::Attribution(wire::Attribution::new(&tc, path.as_deref(), ns_pid))
    }

    /// An output failed: the run stops.
    fn outputs_failed(
        &self,
        pipeline: &Pipeline<QueueWriter>,
        recorder: &Option<RecordWriter<QueueWriter>>,
    ) -> bool {
        self.failure.is_some()
            || pipeline.output().failed()
            || recorder.as_ref().is_some_and(|r| r.get_ref().failed())
    }
}

fn recorder_lost(recorder: &RecordWriter<QueueWriter>) -> u64 {
    recorder.get_ref().lost()
}

/// A sink's failure as the run's: `feed` fails in practice only on the Perfetto timeline (the
/// output goes to a queue that never fails).
fn sink_error(e: SinkError) -> RunError {
    match e {
        SinkError::Perfetto(source) => RunError::Perfetto {
            what: "writing the Perfetto timeline".into(),
            source,
        },
        SinkError::Output(source) => RunError::Io {
            what: "writing the output".into(),
            source,
        },
    }
}

/// Ends a run's outputs: the Perfetto timeline takes its name only when complete; the output
/// gets the statistics, or standard error does when the output cannot take them; a closed
/// standard output (`| head -1`) is a quiet end. Returns the first failure, if any.
fn end_outputs(
    finished: Finished<QueueWriter>,
    perfetto: Option<(Staged, PathBuf)>,
    out_is_stdout: bool,
    mut failure: Option<RunError>,
) -> Result<Summary, RunError> {
    let Finished {
        mut summary,
        out,
        errors,
        stats_text,
    } = finished;
    let perfetto_broken = matches!(failure, Some(RunError::Perfetto { .. }));
    // The output's own end is judged by its queue below; a timeline that did not close is
    // the run's failure.
    let perfetto_error = errors
        .into_iter()
        .find(|e| matches!(e, SinkError::Perfetto(_)));
    if let Some((staged, path)) = perfetto {
        let staged_name = staged.is_staged();
        match perfetto_error {
            None if !perfetto_broken => {
                if let Err(e) = staged.commit() {
                    failure.get_or_insert(RunError::Perfetto {
                        what: format!("renaming the Perfetto timeline into {}", path.display()),
                        source: e,
                    });
                }
            }
            Some(e) => {
                failure.get_or_insert(sink_error(e));
            }
            None => {}
        }
        if let Some(RunError::Perfetto { what, .. }) = failure.as_mut()
            && !what.contains(&*path.to_string_lossy())
        {
            what.push_str(&format!(" {}", path.display()));
            if staged_name {
                what.push_str(" (not replaced: the file there is as it was before the run)");
            }
        }
    }
    let closed = out.close(OUTPUT_STALL);
    summary.output_lost = closed.lost;
    let reader_left =
        out_is_stdout && matches!(&closed.error, Some(e) if e.kind() == io::ErrorKind::BrokenPipe);
    if !closed.complete && !reader_left {
        if let Some(text) = &stats_text {
            eprintln!("gpu-trace: the output did not take the statistics; they are:");
            eprint!("{text}");
        }
        if failure.is_none() {
            failure = Some(RunError::Io {
                what: "writing the output".into(),
                source: closed.error.unwrap_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "its reader stopped taking data (the last lines are lost)",
                    )
                }),
            });
        }
    }
    match failure {
        Some(f) => Err(f),
        None => Ok(summary),
    }
}

/// Decode a recording and print it as the live run did.
pub fn replay(path: &Path, args: &OutputArgs) -> Result<Summary, RunError> {
    replay_with(path, args, None)
}

/// [`replay`], with a view given a frame per second of the recording's own time (`replay
/// --top`); the view decides when the next second is read.
pub fn replay_with(
    path: &Path,
    args: &OutputArgs,
    mut viewer: Option<&mut dyn Viewer>,
) -> Result<Summary, RunError> {
    let file =
        files::open_for_reading(path).map_err(io_err(format!("opening {}", path.display())))?;
    let mut reader = RecordReader::new(BufReader::new(file))?;
    let clock = Clock::new(reader.header.realtime_offset_ns);
    let wake = Arc::new(tokio::sync::Notify::new());
    let OutputFiles {
        out,
        out_is_stdout,
        perfetto,
        record: _,
    } = open_output_files(args, None, None, Overflow::Block, &wake)?;
    let mut pipeline = new_pipeline(args, clock, out, perfetto.as_ref().map(|(s, _)| s), true)?;
    if let Some(inv) = &reader.header.inventory {
        announce_inventory(inv, args);
        pipeline
            .inventory(inv)
            .map_err(io_err("writing the output"))?;
    }
    let mut failure = None;
    let mut next_frame = Duration::from_secs(1);
    let mut quit = false;
    while !pipeline.output().failed() {
        match reader.next_item() {
            Ok(Some(gpu_trace_core::record::Item::Share(samples))) => {
                if let Err(e) = pipeline.share_samples(&samples) {
                    failure = Some(sink_error(e));
                    break;
                }
            }
            Ok(Some(gpu_trace_core::record::Item::Record(bytes))) => {
                if let Err(e) = pipeline.feed(&bytes) {
                    failure = Some(sink_error(e));
                    break;
                }
                if let Some(v) = viewer.as_deref_mut() {
                    // A frame for each whole second of the recording passed; a run of
                    // seconds without records is one frame (they would all look the same, and
                    // a recording whose clock jumps must not make a frame per second of it).
                    while pipeline.span() >= next_frame {
                        let whole = Duration::from_secs(pipeline.span().as_secs());
                        next_frame = next_frame.max(whole);
                        let shown = v
                            .frame(pipeline.stats(), next_frame, None)
                            .and_then(|()| v.next());
                        match shown {
                            Ok(true) => next_frame += Duration::from_secs(1),
                            Ok(false) => {
                                quit = true;
                                break;
                            }
                            Err(e) => {
                                failure = Some(io_err("drawing the view")(e));
                                quit = true;
                                break;
                            }
                        }
                    }
                    if quit {
                        break;
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                failure = Some(e.into());
                break;
            }
        }
    }
    let (counters, duration) = match &reader.trailer {
        Some(t) => {
            if t.recording_lost > 0 {
                eprintln!(
                    "gpu-trace: {} misses {} records: its reader did not keep up during the \
                     live run (its trailer says so)",
                    path.display(),
                    t.recording_lost
                );
            }
            (t.kernel_counters, Duration::from_nanos(t.duration_ns))
        }
        None => {
            if failure.is_none() && !pipeline.output().failed() && !quit {
                eprintln!(
                    "gpu-trace: WARNING: {} ends without its trailer (the run was cut short, \
                     e.g. killed): what it holds was replayed, but its counts may be \
                     incomplete and the kernel counters (dropped, read_failed) are unknown \
                     (shown as ?); exit status 4",
                    path.display()
                );
                // Unknown, not 0: the statistics and the exit status say so.
                pipeline.stats_mut().kernel_unknown = true;
            }
            (KernelCounters::default(), pipeline.span())
        }
    };
    let known = reader.trailer.is_some().then_some(counters);
    if let Some(v) = viewer.filter(|_| !quit && failure.is_none()) {
        let last = v
            .frame(pipeline.stats(), duration.max(pipeline.span()), known)
            .and_then(|()| v.at_end());
        if let Err(e) = last {
            failure = Some(io_err("drawing the view")(e));
        }
    }
    let finished = pipeline.finish_all(counters, duration);
    end_outputs(finished, perfetto, out_is_stdout, failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[test]
    fn skipped_runs_are_reported_only_when_the_kernel_skipped_some() {
        let stats = |name: &str, missed| crate::loader::ProgramStats {
            name: name.into(),
            runs: 0,
            run_time_ns: 0,
            missed,
        };
        assert_eq!(
            describe_missed_runs(&[stats("sys_exit_btf", 0), stats("nv_ioctl_fexit", 0)]),
            None
        );
        let w = describe_missed_runs(&[
            stats("nv_ioctl_fexit", 2),
            stats("process_exit_raw", 0),
            stats("sys_exit_btf", 35),
        ])
        .unwrap();
        assert!(
            w.starts_with(
                "WARNING: the kernel skipped 37 run(s) of gpu-trace's programs \
                 (nv_ioctl_fexit 2, sys_exit_btf 35)"
            ),
            "{w}"
        );
        // --bpf-stats names them on the program's own line.
        let lines = describe_program_stats(&[stats("sys_exit_btf", 35)]);
        assert!(
            lines[1].ends_with(", 35 skipped by the kernel"),
            "{lines:?}"
        );
    }

    #[test]
    fn pid_warnings_name_absent_pids_and_threads() {
        // 10: a process; 11: a thread of 10; 12: nothing.
        let tgid = |pid| match pid {
            10 | 11 => Some(10),
            _ => None,
        };
        let w = pid_warnings(&[10, 11, 12], tgid);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("--pid 11 is a thread of process 10"),
            "{}",
            w[0]
        );
        assert!(
            w[1].starts_with("--pid 12: no such process now; waiting"),
            "{}",
            w[1]
        );
        assert!(pid_warnings(&[10], tgid).is_empty());
    }

    #[test]
    fn only_the_filtered_inventory_processes_are_tracked_in_the_kernel() {
        use crate::probe::inventory::test_process;
        let inv = Inventory {
            processes: vec![
                test_process(10, "python3", vec![(8, GpuNode::NvCtl)]),
                test_process(11, "bash", vec![(3, GpuNode::Watched)]),
                test_process(12, "python3", vec![(4, GpuNode::Kfd), (5, GpuNode::NvUvm)]),
            ],
            ..Inventory::default()
        };
        let args = |pids: Vec<u32>, comms: Vec<&str>| {
            let mut a = crate::cli::Cli::try_parse_from(["gpu-trace"])
                .unwrap()
                .trace
                .output;
            a.pids = pids;
            a.comms = comms.into_iter().map(String::from).collect();
            a
        };
        let (nv, kfd) = (crate::loader::TRACK_NV, crate::loader::TRACK_KFD);
        assert_eq!(
            kernel_tracking(&inv, &args(vec![], vec![])),
            [(10, nv), (11, nv), (12, nv | kfd)]
        );
        assert_eq!(kernel_tracking(&inv, &args(vec![11], vec![])), [(11, nv)]);
        assert_eq!(
            kernel_tracking(&inv, &args(vec![], vec!["python3"])),
            [(10, nv), (12, nv | kfd)]
        );
        assert!(kernel_tracking(&inv, &args(vec![10], vec!["bash"])).is_empty());
    }

    #[test]
    fn pid_warnings_on_this_machine() {
        // This process exists; pid_max is at most 2^22, so this id cannot.
        let me = std::process::id();
        assert!(pid_warnings(&[me], system::thread_group_of).is_empty());
        assert_eq!(pid_warnings(&[1 << 23], system::thread_group_of).len(), 1);
    }
}
