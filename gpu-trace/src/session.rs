//! Live tracing and replay: the loops around [`Pipeline`].
//!
//! Live: load and attach ([`Tracer`]), report the hooks on stderr, read the ring buffer as it
//! fills (tokio `AsyncFd`), stop on Ctrl-C, SIGTERM or `--duration`, drain what is left, then
//! print the statistics with the kernel's counters. Replay: the same pipeline over a recording.

use std::{
    fs::File,
    io::{self, BufReader, BufWriter, Write},
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use thiserror::Error;
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};

use crate::{
    cli::{OutputArgs, TraceArgs, Vendor},
    loader::{LoadError, LoadOptions, Tracer},
    model::stats::KernelCounters,
    output::{clock::Clock, perfetto::PerfettoWriter},
    pipeline::{Pipeline, PipelineConfig},
    probe::system,
    record::{RecordError, RecordReader, RecordWriter, RecordingHeader, RecordingTrailer},
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
    #[error(transparent)]
    Metrics(#[from] crate::metrics::server::ServeError),
}

impl RunError {
    /// The system cannot support what was asked (exit code 3), as opposed to a runtime failure.
    pub fn is_unsupported(&self) -> bool {
        match self {
            Self::Unsupported(_) => true,
            Self::Load(e) => e.is_unsupported(),
            _ => false,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// What a run ended with, for the exit code.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub events: u64,
    pub dropped: u64,
}

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

fn open_output(args: &OutputArgs) -> Result<Box<dyn Write>, RunError> {
    if args.quiet {
        return Ok(Box::new(io::sink()));
    }
    Ok(match &args.output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).map_err(io_err(format!("creating {}", path.display())))?,
        )),
        None => Box::new(io::stdout().lock()),
    })
}

/// The pipeline for `args`: output to standard output or `-o FILE`, and the `--perfetto`
/// timeline when asked for.
fn new_pipeline(args: &OutputArgs, clock: Clock) -> Result<Pipeline<Box<dyn Write>>, RunError> {
    let perfetto = match &args.perfetto {
        Some(path) => {
            let file =
                File::create(path).map_err(io_err(format!("creating {}", path.display())))?;
            let out: Box<dyn Write> = Box::new(BufWriter::new(file));
            Some(
                PerfettoWriter::new(out, clock.clone())
                    .map_err(io_err(format!("writing {}", path.display())))?,
            )
        }
        None => None,
    };
    let out = open_output(args)?;
    let pipeline = Pipeline::new(pipeline_config(args, clock), out);
    Ok(match perfetto {
        Some(p) => pipeline.with_perfetto(p),
        None => pipeline,
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
    }
}

/// Trace live until Ctrl-C, SIGTERM or `--duration`.
pub async fn run_live(args: &TraceArgs) -> Result<Summary, RunError> {
    let vendor = match args.vendor {
        Vendor::Auto => detect_vendor()?,
        v => v,
    };
    let amd = vendor == Vendor::Amd;
    let watched = match &args.watch_device {
        Some(path) => Some(system::char_device_kernel_dev(path).map_err(LoadError::from)?),
        None => None,
    };
    // --watch-device adds a device of the vendor being traced.
    let (extra_device, extra_kfd_device) = if amd {
        (None, watched)
    } else {
        (watched, None)
    };
    let kfd = amd.then(crate::amd::KfdPresence::probe);
    if let Some(warning) = kfd.as_ref().and_then(|k| k.warning()) {
        eprintln!("gpu-trace: warning: {warning}");
    }
    let options = LoadOptions {
        nvidia: !amd,
        kfd_major: kfd.as_ref().and_then(|k| k.major),
        extra_kfd_device,
        extra_device,
        filter_tgid: match args.output.pids.as_slice() {
            [one] => Some(*one),
            _ => None,
        },
        ring_bytes: args.ring_size,
        syscall_hook: args.syscall_hook,
        deny_pids: args.deny_pids.clone(),
        deep_hooks: !args.no_deep_hooks,
        deep_attach: args.deep_attach,
    };
    // Bound before loading: a busy port or a refused address stops the run before any hook.
    let metrics = crate::metrics::server::serve(&args.metrics, args.ring_size)?;
    let mut tracer = Tracer::load(&options)?;
    let clock = Clock::from_system().map_err(io_err("reading the clocks"))?;
    let what = match &kfd {
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
        eprintln!("gpu-trace: (not used: {refused})");
    }

    let mut recorder = match &args.record {
        Some(path) => {
            let file =
                File::create(path).map_err(io_err(format!("creating {}", path.display())))?;
            let header = RecordingHeader {
                tool_version: env!("CARGO_PKG_VERSION").into(),
                host: system::host_name(),
                kernel: system::kernel_release(),
                driver: if amd {
                    crate::amd::driver_description()
                } else {
                    system::nvidia_driver()
                },
                realtime_offset_ns: clock.offset_ns(),
                hooks: tracer.hooks.iter().map(ToString::to_string).collect(),
                argv: std::env::args().collect(),
            };
            Some(RecordWriter::new(BufWriter::new(file), &header)?)
        }
        None => None,
    };

    let pipeline = new_pipeline(&args.output, clock)?;
    let (mut pipeline, _metrics_server) = match metrics {
        Some((m, server)) => (pipeline.with_metrics(m), Some(server)),
        None => (pipeline, None),
    };
    let mut health = tokio::time::interval(Duration::from_secs(1));
    let ring = tracer.take_ring_buffer()?;
    if let Some(m) = pipeline.metrics_mut() {
        use std::os::fd::AsFd as _;
        match crate::metrics::ring::RingFill::new(ring.as_fd()) {
            Ok(fill) => m.set_ring_fill(move || fill.used_bytes()),
            Err(e) => eprintln!("gpu-trace: (metrics: ring-buffer fill not available: {e})"),
        }
    }
    // SAFETY: the ring buffer owns its map fd and keeps it open for as long as the AsyncFd
    // that owns the ring buffer lives; nothing else closes it.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| RunError::Io {
            what: "polling the ring buffer".into(),
            source: e.into(),
        })?;

    let started = Instant::now();
    let deadline = args.duration.map(Duration::from_secs_f64);
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt())
        .map_err(io_err("installing the SIGINT handler"))?;
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())
        .map_err(io_err("installing the SIGTERM handler"))?;
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);

    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut sleep => break,
            _ = health.tick(), if _metrics_server.is_some() => {
                let counters = tracer.counters()?;
                if let Some(m) = pipeline.metrics_mut() {
                    m.set_kernel(&counters);
                }
            }
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(io_err("waiting for the ring buffer"))?;
                drain(guard.get_inner_mut(), &mut pipeline, &mut recorder)?;
                guard.clear_ready();
            }
        }
    }
    // Records written between the last wake-up and now.
    drain(ring.get_mut(), &mut pipeline, &mut recorder)?;

    let counters = tracer.counters()?;
    let duration = started.elapsed();
    if let Some(recorder) = recorder {
        let trailer = RecordingTrailer {
            kernel_counters: counters,
            duration_ns: duration.as_nanos() as u64,
        };
        recorder.finish(&trailer)?;
    }
    let summary = pipeline
        .finish(counters, duration)
        .map_err(io_err("writing the output"))?;
    drop(tracer); // detaches every program; nothing is pinned
    Ok(summary)
}

fn drain(
    ring: &mut RingBuf<MapData>,
    pipeline: &mut Pipeline<Box<dyn Write>>,
    recorder: &mut Option<RecordWriter<BufWriter<File>>>,
) -> Result<(), RunError> {
    while let Some(item) = ring.next() {
        if let Some(rec) = recorder.as_mut() {
            rec.record(&item)?;
        }
        pipeline.feed(&item).map_err(io_err("writing the output"))?;
    }
    pipeline.flush().map_err(io_err("writing the output"))
}

/// Decode a recording and print it as the live run did.
pub fn replay(path: &Path, args: &OutputArgs) -> Result<Summary, RunError> {
    let file = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let mut reader = RecordReader::new(BufReader::new(file))?;
    let clock = Clock::new(reader.header.realtime_offset_ns);
    let mut pipeline = new_pipeline(args, clock)?;
    while let Some(bytes) = reader.next_record()? {
        pipeline
            .feed(&bytes)
            .map_err(io_err("writing the output"))?;
    }
    let (counters, duration) = match &reader.trailer {
        Some(t) => (t.kernel_counters, Duration::from_nanos(t.duration_ns)),
        None => {
            eprintln!(
                "gpu-trace: {} ends without its trailer (the run was cut short): kernel counters \
                 (dropped, read_failed) are unknown and shown as 0",
                path.display()
            );
            (KernelCounters::default(), pipeline.span())
        }
    };
    pipeline
        .finish(counters, duration)
        .map_err(io_err("writing the output"))
}
