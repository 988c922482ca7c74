//! `gpu-trace replay`: a recording through the same pipeline as a live run.

use std::{io::BufReader, path::Path, sync::Arc, time::Duration};

use super::{
    error::{RunError, io_err},
    files,
    late_attach::announce_inventory,
    outputs::{OutputFiles, end_outputs, new_pipeline, open_output_files, sink_error},
    report::{Viewer, warn_unmatched_gpus, warn_unmatched_pods},
};
use crate::pipeline::Summary;
use crate::{
    cli::OutputArgs, model::stats::KernelCounters, output::clock::Clock, queue::Overflow,
    record::RecordReader,
};

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
        announce_inventory(inv, args, false);
    }
    // The inventory, and a piece's or a dump's state records: the tasks alive at its start.
    pipeline
        .start(&reader.header, &reader.state)
        .map_err(io_err("writing the output"))?;
    // Also without an inventory: a recording that lists no GPU passes no event through --gpu.
    warn_unmatched_gpus(&pipeline);
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
                crate::say!(
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
                crate::say!(
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
    warn_unmatched_pods(&pipeline);
    let finished = pipeline.finish_all(counters, duration);
    end_outputs(finished, perfetto, out_is_stdout, failure)
}
