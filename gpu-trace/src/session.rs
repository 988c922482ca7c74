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
    probe::{
        inventory::{self, GpuNode, Inventory, WalkOptions},
        system,
    },
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
    Ok(match &args.output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).map_err(io_err(format!("creating {}", path.display())))?,
        )),
        None => Box::new(io::stdout().lock()),
    })
}

/// The pipeline for `args`: output to standard output or `-o FILE`, and the `--perfetto`
/// timeline when asked for.
/// `by_record_time`: `--interval` counts in the records' time (replay) rather than on the
/// caller's timer (live).
fn new_pipeline(
    args: &OutputArgs,
    clock: Clock,
    by_record_time: bool,
) -> Result<Pipeline<Box<dyn Write>>, RunError> {
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
    let pipeline = match perfetto {
        Some(p) => pipeline.with_perfetto(p),
        None => pipeline,
    };
    Ok(match interval(args) {
        Some(period) => pipeline.with_interval(period, by_record_time, Box::new(io::stderr())),
        None => pipeline,
    })
}

/// `--interval`.
fn interval(args: &OutputArgs) -> Option<Duration> {
    args.interval.map(Duration::from_secs_f64)
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

/// Warnings for `--pid` values that name no process now (`tgid_of`: the thread group of a
/// live task id, `None` when there is none): such a filter is kept and waits for the pid, and
/// a thread id is named with its process (events are filtered by process).
pub fn pid_warnings(pids: &[u32], tgid_of: impl Fn(u32) -> Option<u32>) -> Vec<String> {
    pids.iter()
        .filter_map(|&pid| match tgid_of(pid) {
            None => Some(format!(
                "--pid {pid}: no such process now; waiting for it (a process started later                  with this id is traced; nothing is printed until then)"
            )),
            Some(tgid) if tgid != pid => Some(format!(
                "--pid {pid} is a thread of process {tgid}: the filter is on processes, so                  nothing of {pid} will match; use --pid {tgid}"
            )),
            Some(_) => None,
        })
        .collect()
}

/// Trace live until Ctrl-C, SIGTERM or `--duration`.
pub async fn run_live(args: &TraceArgs) -> Result<Summary, RunError> {
    // Before anything is reported on stderr: a Ctrl-C right after the start-up report (or
    // during the inventory) stops tracing cleanly instead of killing the process.
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt())
        .map_err(io_err("installing the SIGINT handler"))?;
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())
        .map_err(io_err("installing the SIGTERM handler"))?;
    let vendor = match args.vendor {
        Vendor::Auto => detect_vendor()?,
        v => v,
    };
    for warning in pid_warnings(&args.output.pids, system::thread_group_of) {
        eprintln!("gpu-trace: warning: {warning}");
    }
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
    // NVML's own driver calls (it opens the GPU) are made before the programs attach, so that
    // gpu-trace does not trace itself; the walk comes after attaching.
    let nvml = (!amd).then(crate::probe::nvml::query);
    let mut tracer = Tracer::load(&options)?;
    // Late attach: the processes that have a GPU open already (after attaching, so that a
    // process opening the GPU now is seen by the hooks or by the walk), tracked from now on.
    let inventory = take_inventory(&args.watch_device, amd, nvml);
    tracer.track(&kernel_tracking(&inventory, &args.output))?;
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
    announce_inventory(&inventory);

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
                inventory: Some(inventory.clone()),
            };
            Some(RecordWriter::new(BufWriter::new(file), &header)?)
        }
        None => None,
    };

    let mut pipeline = new_pipeline(&args.output, clock, false)?;
    pipeline
        .inventory(&inventory)
        .map_err(io_err("writing the output"))?;
    let ring = tracer.take_ring_buffer()?;
    // SAFETY: the ring buffer owns its map fd and keeps it open for as long as the AsyncFd
    // that owns the ring buffer lives; nothing else closes it.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| RunError::Io {
            what: "polling the ring buffer".into(),
            source: e.into(),
        })?;

    let started = Instant::now();
    let deadline = args.duration.map(Duration::from_secs_f64);
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    let mut ticker = interval(&args.output)
        .map(|period| tokio::time::interval_at(tokio::time::Instant::now() + period, period));

    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut sleep => break,
            _ = async {
                match ticker.as_mut() {
                    Some(t) => {
                        t.tick().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            } => {
                // Everything up to now first, so that the statistics count it.
                drain(ring.get_mut(), &mut pipeline, &mut recorder)?;
                pipeline
                    .periodic_stats(started.elapsed(), tracer.counters().ok())
                    .and_then(|()| pipeline.flush())
                    .map_err(io_err("writing the output"))?;
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
fn announce_inventory(inv: &Inventory) {
    for line in inventory::render_text(inv) {
        eprintln!("gpu-trace: {line}");
    }
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
    let mut pipeline = new_pipeline(args, clock, true)?;
    if let Some(inv) = &reader.header.inventory {
        announce_inventory(inv);
        pipeline
            .inventory(inv)
            .map_err(io_err("writing the output"))?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

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
