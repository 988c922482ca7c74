//! Where a finished event goes. The pipeline parses a record, its source (tracker) makes the
//! events, the pipeline filters them and adds what it knows of the process (its name, the GPU
//! the task is on, its cgroup): the [`Enriched`] event. Each output — the text or JSON lines,
//! the Perfetto timeline, the metrics — is a [`Sink`] that takes it and does its own formatting
//! (NVIDIA or AMD fields, metric labels, track names, the container field, the JSON field
//! order); the pipeline knows none of that. Each sink's failure is its own [`SinkError`] kind.

use std::io;

use crate::{
    api::names::ApiEvent,
    event::{Event, Origin},
    inventory::Inventory,
    model::{
        bounded::PidMap,
        gpus::GpuIdentity,
        share::{ShareModel, ShareSample},
        stats::{KernelCounters, Stats},
        workload::Attribution,
    },
};

/// One event that passed the filters, with what the pipeline knows of its process and task.
#[derive(Clone, Copy, Debug)]
pub struct Enriched<'a> {
    pub event: &'a Event,
    /// The process's name: the first `comm` seen for it (`--comm` matches it too), else the
    /// event's own.
    pub process: &'a str,
    /// NVIDIA: the GPU the task is on, as nvidia-smi names it, when known.
    pub gpu: Option<&'a GpuIdentity>,
    /// Who the process is (cgroup, container, pod), when known.
    pub cgroup: Option<&'a Attribution>,
    /// CLOCK_MONOTONIC ns of the first record of the run.
    pub trace_start_ns: u64,
}

/// One API record of the main trace (`gpu-trace --api`), named, with what the pipeline knows
/// of its process.
#[derive(Clone, Copy, Debug)]
pub struct ApiEnriched<'a> {
    pub event: &'a ApiEvent,
    /// Where the record was made: its time (a call's return, a recursion's entry, a sum's
    /// read), CPU, process, thread and thread name (a sum's: the reader's time and CPU, the
    /// process as its thread).
    pub origin: &'a Origin,
    /// The process's name, as for [`Enriched::process`].
    pub process: &'a str,
    /// Who the process is (cgroup, container, pod), when known.
    pub cgroup: Option<&'a Attribution>,
}

/// One NVML per-process utilization sample that passed the filters, with what the pipeline
/// knows of its process.
#[derive(Clone, Copy, Debug)]
pub struct ShareEnriched<'a> {
    pub sample: &'a ShareSample,
    /// The process's name, when one of its records named it.
    pub process: Option<&'a str>,
    /// Who the process is (cgroup, container, pod), when known.
    pub cgroup: Option<&'a Attribution>,
}

/// A batch of share samples (one read of the sampler, or of a recording) and the share model
/// after it: each sink takes what it shows (a line per sample, a counter per process over a
/// window, a gauge).
pub struct ShareBatch<'a> {
    /// The samples `--pid`/`--comm`/`-- CMD` select, in the sampler's order.
    pub samples: &'a [ShareEnriched<'a>],
    /// Every sample kept so far (the figures over a window are read from it).
    pub model: &'a ShareModel,
    /// The share's window for gauges: `--interval`, else 10 s.
    pub window_us: u64,
    /// The processes' names, as in [`ShareEnriched::process`], for figures over a window.
    pub processes: &'a PidMap<String>,
    /// The processes' attributions, as in [`ShareEnriched::cgroup`].
    pub cgroups: &'a PidMap<Attribution>,
}

/// How the run ended, for [`Sink::finish`].
#[derive(Clone, Copy, Debug)]
pub struct RunEnd<'a> {
    /// The final statistics (with the kernel's counters, `elapsed`, `live_at_exit`).
    pub stats: &'a Stats,
    pub counters: KernelCounters,
    /// CLOCK_MONOTONIC ns of the last record (0: none).
    pub last_ts: u64,
    /// Calls and events on handles the trackers did not remember.
    pub untracked: u64,
    /// The statistics block as text; `None` with `--no-stats` (then no sink prints statistics).
    pub stats_text: Option<&'a str>,
    /// The share's window (as [`ShareBatch::window_us`]) for the share statistics.
    pub share_window_us: u64,
}

/// A sink's failure, by sink: the session tells a broken timeline from a broken output by the
/// kind, not by the message.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The text or JSON lines (standard output or `-o FILE`).
    #[error("writing the output: {0}")]
    Output(#[source] io::Error),
    /// The Perfetto timeline (`--perfetto FILE`).
    #[error("writing the Perfetto timeline: {0}")]
    Perfetto(#[source] io::Error),
}

impl SinkError {
    /// The I/O error underneath.
    pub fn io(&self) -> &io::Error {
        match self {
            Self::Output(e) | Self::Perfetto(e) => e,
        }
    }

    pub fn into_io(self) -> io::Error {
        match self {
            Self::Output(e) | Self::Perfetto(e) => e,
        }
    }
}

/// What a run did not report, by reason (the statistics' `unreported`, JSON `unreported`):
/// absolute counts, non-zero reasons only.
pub type Unreported = std::collections::BTreeMap<&'static str, u64>;

/// An output of the pipeline.
pub trait Sink {
    /// The start-up inventory (late attach), before any event. `selected`: the processes the
    /// `--pid`/`--comm` filters select.
    fn inventory(&mut self, _inv: &Inventory, _selected: &Inventory) -> Result<(), SinkError> {
        Ok(())
    }

    /// One finished event.
    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError>;

    /// One API record (`gpu-trace --api`): a call, a recursion, a process's sums so far.
    fn api(&mut self, _ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        Ok(())
    }

    /// NVML share samples (see [`ShareBatch`]).
    fn shares(&mut self, _batch: &ShareBatch<'_>) -> Result<(), SinkError> {
        Ok(())
    }

    /// A process exited (after its last events).
    fn process_exited(&mut self, _pid: u32) {}

    /// The kernel side's counters as read now, with what the run did not report so far
    /// (live runs, on the health timer).
    fn kernel(&mut self, _counters: &KernelCounters, _unreported: &Unreported) {}

    /// `--interval`: the statistics so far.
    fn periodic(&mut self, _stats: &Stats) -> Result<(), SinkError> {
        Ok(())
    }

    /// Pushes what is buffered (live runs, between reads of the ring buffer).
    fn flush(&mut self, _stats: &Stats, _untracked: u64) -> Result<(), SinkError> {
        Ok(())
    }

    /// The end of the run.
    fn finish(&mut self, end: &RunEnd<'_>) -> Result<(), SinkError>;
}

/// The statistics are a sink too: every event counted, the GPU names learned from the events'
/// GPU identity. (The pipeline keeps them: the periodic and final blocks, `top`'s frames and the
/// other sinks' ends read them.)
impl Sink for Stats {
    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        self.record(ev.event);
        if let Some(g) = ev.gpu {
            self.set_gpu_name(g.rm_device, g.index, g.uuid.as_deref());
        }
        Ok(())
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        match ev.event {
            ApiEvent::Stats(row) => {
                self.record_api(row, ev.origin.ts_ns);
                self.name_api_process(row.pid, ev.process);
            }
            ApiEvent::Path(path) => self.record_api_path(path),
            ApiEvent::Handout(h) => self.record_handout(h),
            _ => {}
        }
        Ok(())
    }

    fn finish(&mut self, _end: &RunEnd<'_>) -> Result<(), SinkError> {
        Ok(())
    }
}
