//! `--record`: the recording's header at the start, its trailer and drain at the end; with
//! `--record-rotate`, the recording in pieces ([`super::rotate`]). [`Recording`] is what the
//! reader hands every record to.

use std::{
    io::{self},
    path::Path,
    time::Duration,
};

use gpu_trace_core::{
    inventory::Inventory,
    rotate::{RotateLimit, Rotating},
};

use super::{error::RunError, flight::Flight, outputs::OUTPUT_STALL, rotate::PieceFiles};
use crate::{
    cli::recording::Rotate,
    event::monotonic_ns,
    loader::Tracer,
    model::stats::KernelCounters,
    output::clock::Clock,
    probe::system,
    queue::QueueWriter,
    record::{RecordWriter, RecordingHeader, RecordingTrailer},
};

/// Where the run's records are recorded: `--record` (one file, or pieces) and the flight
/// recorder's window.
#[derive(Default)]
pub(super) struct Recording {
    pub(super) file: Option<FileRecording>,
    pub(super) flight: Option<Flight>,
}

/// `--record FILE`: one file, or (`--record-rotate`) its pieces.
pub(super) enum FileRecording {
    One(RecordWriter<QueueWriter>),
    Pieces(Box<Rotating<PieceFiles>>),
}

impl Recording {
    /// One record, as the kernel (or userspace) wrote it.
    pub(super) fn record(&mut self, bytes: &[u8]) -> Result<(), RunError> {
        if let Some(f) = self.flight.as_mut() {
            f.push(bytes);
        }
        match self.file.as_mut() {
            Some(FileRecording::One(w)) => {
                w.record(bytes)?;
                w.get_mut().mark_unit();
            }
            Some(FileRecording::Pieces(r)) => {
                r.record(bytes)?;
                if let Some(w) = r.writer_mut() {
                    w.mark_unit();
                }
            }
            None => {}
        }
        Ok(())
    }

    /// A batch of GPU share samples (version-2 recordings).
    pub(super) fn share(&mut self, batch: &[gpu_trace_core::model::share::ShareSample]) {
        // A failing recording shows through its queue (the loop's output check).
        match self.file.as_mut() {
            Some(FileRecording::One(w)) => {
                let _ = w.share(batch);
                w.get_mut().mark_unit();
            }
            Some(FileRecording::Pieces(r)) => {
                let _ = r.share(batch);
                if let Some(w) = r.writer_mut() {
                    w.mark_unit();
                }
            }
            None => {}
        }
    }

    /// Hands what was recorded so far to the writer threads.
    pub(super) fn flush(&mut self) {
        let w = match self.file.as_mut() {
            Some(FileRecording::One(w)) => Some(w.get_mut()),
            Some(FileRecording::Pieces(r)) => r.writer_mut(),
            None => None,
        };
        if let Some(w) = w {
            let _ = std::io::Write::flush(w);
        }
    }

    /// A recording's writer failed (the run stops).
    pub(super) fn failed(&self) -> bool {
        match self.file.as_ref() {
            Some(FileRecording::One(w)) => w.get_ref().failed(),
            Some(FileRecording::Pieces(r)) => r.writer().is_some_and(QueueWriter::failed),
            None => false,
        }
    }

    /// `--record-rotate TIME`: pieces also end on the clock.
    pub(super) fn rotates_by_time(&self) -> bool {
        matches!(&self.file, Some(FileRecording::Pieces(r)) if r.by_time())
    }

    /// Something is to be done between two records ([`Self::turn`]): a piece is full, or a
    /// flight-recorder trigger came.
    pub(super) fn needs_turn(&self) -> bool {
        matches!(&self.file, Some(FileRecording::Pieces(r)) if r.due())
            || self.flight.as_ref().is_some_and(Flight::pending)
    }

    /// Between two records: a full piece is ended (its trailer with the kernel's counters read
    /// now) and the next one started; `by_time`: also a piece that lasted its time without a
    /// record to end it.
    pub(super) fn turn(&mut self, tracer: &Tracer, by_time: bool) -> Result<(), RunError> {
        if let Some(f) = self.flight.as_mut() {
            f.serve(tracer)?;
        }
        if let Some(FileRecording::Pieces(r)) = self.file.as_mut() {
            let now = monotonic_ns();
            if r.due() || (by_time && r.due_at(now)) {
                let counters = tracer.counters()?;
                r.rotate(counters, now)?;
            }
        }
        Ok(())
    }
}

/// Where `--record` goes: one file's queue, or (`--record-rotate`, `--record-keep`) pieces.
pub(super) enum RecordTo {
    One(QueueWriter),
    Pieces(PieceFiles, Rotate, Option<u32>),
}

/// `--record`: the recording's header (this machine, the hooks, the command line, the
/// inventory) written to its queue (the first piece's), ready for the records.
pub(super) fn start_recording(
    to: RecordTo,
    clock: &Clock,
    tracer: &Tracer,
    inventory: &Inventory,
    (amd, share): (bool, bool),
) -> Result<FileRecording, RunError> {
    let header = recording_header(clock, tracer, inventory, amd);
    match to {
        RecordTo::One(queue) => {
            // Version 2 only when share samples may come: the others stay readable by older
            // readers.
            let mut w = if share {
                RecordWriter::with_share(queue, &header)?
            } else {
                RecordWriter::new(queue, &header)?
            };
            w.get_mut().mark_unit();
            Ok(FileRecording::One(w))
        }
        RecordTo::Pieces(files, rotate, keep) => {
            let limit = match rotate {
                Rotate::Bytes(b) => RotateLimit::Bytes(b),
                Rotate::Seconds(s) => RotateLimit::Nanos((s * 1e9) as u64),
            };
            let mut r = Rotating::new(files, header, share, limit, keep, inventory.taken_ns)?;
            if let Some(w) = r.writer_mut() {
                w.mark_unit();
            }
            Ok(FileRecording::Pieces(Box::new(r)))
        }
    }
}

/// The header of the run's recordings: this machine, the hooks, the command line, the
/// start-up inventory.
pub(super) fn recording_header(
    clock: &Clock,
    tracer: &Tracer,
    inventory: &Inventory,
    amd: bool,
) -> RecordingHeader {
    RecordingHeader {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        host: system::host_name(),
        kernel: system::kernel_release(),
        driver: if amd {
            crate::probe::amd::driver_description()
        } else {
            system::nvidia_driver()
        },
        realtime_offset_ns: clock.offset_ns(),
        hooks: tracer.hooks.iter().map(ToString::to_string).collect(),
        argv: std::env::args().collect(),
        inventory: Some(inventory.clone()),
        ..Default::default()
    }
}

/// Ends the recording ([`end_recording`], or the last piece's trailer); returns the records
/// it lost.
pub(super) fn end_recordings(
    recording: Recording,
    counters: KernelCounters,
    duration: Duration,
    path: Option<&Path>,
    failure: &mut Option<RunError>,
) -> u64 {
    match recording.file {
        Some(FileRecording::One(w)) => end_recording(w, counters, duration, path, failure),
        Some(FileRecording::Pieces(r)) => {
            let lost_now = r.writer().map_or(0, QueueWriter::lost);
            match r.finish(counters, monotonic_ns()) {
                Ok((files, _)) => files.lost,
                Err(e) => {
                    failure.get_or_insert(e.into());
                    lost_now
                }
            }
        }
        None => 0,
    }
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
