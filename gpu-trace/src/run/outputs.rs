//! The run's outputs: files opened before anything is attached (`-o`, `--record`, the staged
//! Perfetto timeline), the pipeline built over them from the flags, and their end.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    error::{RunError, io_err},
    files::{self, Staged, Untouched},
    signals::stop_requested,
};
use crate::pipeline::Summary;
use crate::{
    cli::OutputArgs,
    output::{
        clock::Clock,
        perfetto::{PerfettoSink, PerfettoWriter},
    },
    pipeline::{Finished, Pipeline, PipelineConfig},
    queue::{Overflow, QueueWriter, Units},
    sink::SinkError,
};

/// How long the end of a run waits for a stalled output to take the rest (without progress).
pub(super) const OUTPUT_STALL: Duration = Duration::from_secs(2);

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
pub(super) fn open_waiting(
    what: &str,
    path: &Path,
    deadline: Option<Instant>,
) -> Result<Untouched, RunError> {
    let mut told = false;
    loop {
        match files::open_untouched(path) {
            Ok(f) => return Ok(f),
            Err(e) if files::is_no_reader(&e) => {
                if !told {
                    crate::say!(
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
pub(super) struct OutputFiles {
    pub(super) out: QueueWriter,
    pub(super) out_is_stdout: bool,
    pub(super) perfetto: Option<(Staged, PathBuf)>,
    pub(super) record: Option<QueueWriter>,
}

/// `-o` and `--record` files opened but not yet emptied: [`Untouched::commit`] once every
/// start-up check passed; dropped instead (a failed start), existing files keep their bytes and
/// files the open created are removed.
pub(super) struct Pending(Vec<(&'static str, Untouched)>);

impl Pending {
    pub(super) fn commit(self) -> Result<(), RunError> {
        for (what, mut file) in self.0 {
            file.commit()
                .map_err(io_err(format!("emptying the {what} file")))?;
        }
        Ok(())
    }
}

/// [`prepare_output_files`], emptied at once.
pub(super) fn open_output_files(
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
pub(super) fn prepare_output_files(
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
pub(super) fn new_pipeline(
    args: &OutputArgs,
    clock: Clock,
    out: QueueWriter,
    perfetto: Option<&Staged>,
    by_record_time: bool,
) -> Result<Pipeline<QueueWriter>, RunError> {
    let pipeline = Pipeline::new(pipeline_config(args, clock.clone()), out)
        .with_gpu_filter(args.gpus.clone())
        .with_pod_filter(args.pods.clone(), args.namespaces.clone());
    let pipeline = match pods_dir(args, !by_record_time) {
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

/// Where pods get their names: the node's kubelet directory in a live run (`live`), `--pods-dir`
/// where given; a replay names pods only where told (a recording's pods are another node's).
pub(super) fn pods_dir(args: &OutputArgs, live: bool) -> Option<PathBuf> {
    (args.pods_dir.clone()).or_else(|| live.then(|| crate::probe::pods::DEFAULT_DIR.into()))
}

/// `--interval`, kept from [`cli::MIN_INTERVAL_SECS`] to [`cli::MAX_INTERVAL_SECS`] (a zero
/// period makes tokio's interval panic, a huge one the `Instant` addition that starts it; the
/// parser refuses such values, this keeps any other caller safe).
pub(super) fn interval(args: &OutputArgs) -> Option<Duration> {
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

pub(super) fn pipeline_config(args: &OutputArgs, clock: Clock) -> PipelineConfig {
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

/// A sink's failure as the run's: `feed` fails in practice only on the Perfetto timeline (the
/// output goes to a queue that never fails).
pub(super) fn sink_error(e: SinkError) -> RunError {
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
pub(super) fn end_outputs(
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
            crate::say!("gpu-trace: the output did not take the statistics; they are:");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
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
