//! `--record`: the recording's header at the start, its trailer and drain at the end.

use std::{
    io::{self},
    path::Path,
    time::Duration,
};

use gpu_trace_core::inventory::Inventory;

use super::{error::RunError, outputs::OUTPUT_STALL};
use crate::{
    loader::Tracer,
    model::stats::KernelCounters,
    output::clock::Clock,
    probe::system,
    queue::QueueWriter,
    record::{RecordWriter, RecordingHeader, RecordingTrailer},
};

/// `--record`: the recording's header (this machine, the hooks, the command line, the
/// inventory) written to its queue, ready for the records.
pub(super) fn start_recording(
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

/// Writes the recording's trailer and waits (at most [`OUTPUT_STALL`] without progress) for
/// its reader to take the rest; a recording cut short is the run's failure unless one came
/// first. Returns the records the recording lost.
pub(super) fn end_recording(
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

pub(super) fn recorder_lost(recorder: &RecordWriter<QueueWriter>) -> u64 {
    recorder.get_ref().lost()
}
