//! Prometheus metrics (`--metrics ADDR`): the same [`Event`]s and statistics the other outputs
//! get, kept as counters, gauges and histograms in a `prometheus-client` [`Registry`].
//!
//! This module is the pure core: no HTTP, no kernel. `gpu-trace`'s `metrics::server` serves the registry over HTTP;
//! the pipeline calls [`Metrics::observe`] for every event it emits and
//! [`Metrics::sync_stats`] / [`Metrics::set_kernel`] for the health counters.
//!
//! Cost per event: one hash lookup of the process name (borrowed, no allocation), one of a small
//! integer key, and atomic counter updates. A label set is built (allocated) only the first time
//! it is seen, and a task's state only at its `TASK_INIT`.
//!
//! Label cardinality is bounded: PIDs are never a label; at most [`MetricsConfig::max_comms`]
//! distinct process names, [`MetricsConfig::max_gpus`] distinct GPUs and
//! [`MetricsConfig::max_workloads`] distinct container/pod pairs get their own series at once
//! (a GPU for the tracer's life), and every later one is counted under the value [`OVERFLOW`]
//! (`comm="__overflow__"`), so a fork storm of uniquely named processes cannot grow the scrape;
//! [`MetricsConfig::max_label_sets`] caps the combinations.
//!
//! Label sets expire ([`MetricsConfig::expire`], `--metrics-expire`): the series of a label set
//! (gpu, engine, comm, workload) that has counted no event for that long and holds no live task
//! leave the scrape, and the label values no series holds any more — a pod's, a name no live
//! process has — give their room under the caps to new ones. Time is the events' own clock
//! (CLOCK_MONOTONIC; a live run also looks at the clock each second, [`Metrics::tick`]), so a
//! replay expires exactly as the run did. A label set that comes back starts its counters
//! from 0 (a counter reset, which Prometheus's `rate()` and `increase()` handle). `--api`'s
//! label sets expire the same way once their counters stop growing ([`api`]), and the share
//! gauge's label values once no sample names them.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use prometheus_client::{
    collector::Collector,
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::Registry,
};

use crate::model::gpus::GpuIdentity;
use crate::sink::{ApiEnriched, Enriched, RunEnd, ShareBatch, Sink, SinkError, Unreported};
use crate::{
    event::{DestroyCause, Event, EventKind, GpuNumbering, SchedChange, TaskEngine, TaskId},
    model::stats::{KernelCounters, Stats},
};

/// The label value that stands for every name (or GPU, container, pod) past the cap.
pub const OVERFLOW: &str = "__overflow__";

/// Caps on distinct label values (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Distinct process names (`comm` label) with their own series.
    pub max_comms: usize,
    /// Distinct GPUs (`gpu` label) with their own series.
    pub max_gpus: usize,
    /// Distinct (container, pod) pairs with their own series.
    pub max_workloads: usize,
    /// Distinct (gpu, engine, comm, container, pod) label sets: each label is capped, this caps
    /// their combinations (the series of every per-task metric).
    pub max_label_sets: usize,
    /// A label set that counted no event for this long and holds no live task leaves the
    /// scrape, and its label values their room under the caps (`None`: never).
    pub expire: Option<Duration>,
}

/// [`MetricsConfig::expire`] by default (`--metrics-expire`).
pub const DEFAULT_EXPIRE: Duration = Duration::from_secs(300);

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            max_comms: 128,
            max_gpus: 64,
            max_workloads: 256,
            max_label_sets: 1024,
            expire: Some(DEFAULT_EXPIRE),
        }
    }
}

/// Where a process runs, for the `container`, `pod`, `namespace` and `pod_uid` labels: the
/// pipeline fills them from the process's cgroup (`model::workload`) and what the node said of
/// its pod ([`crate::model::workload::PodNames`]), empty outside containers and pods;
/// [`Metrics::observe`] takes one so that the series carry the labels from the start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Workload {
    /// The container's name in a Kubernetes pod when the node said it, else the short container
    /// id (12 hex digits).
    pub container: String,
    /// The pod's name, when the node said it.
    pub pod: String,
    /// The pod's namespace, when the node said it.
    pub namespace: String,
    /// The pod's UID (from the cgroup path).
    pub pod_uid: String,
    /// The user whose delegated subtree (`user@UID.service`) holds the container, empty for
    /// the host's containers: a user's copy of a container id is a series of its own, with a
    /// `container_user` label that root's containers' series do not have.
    pub container_user: String,
}

/// `container_user="UID"` on the series of a user's container, no label at all on the others
/// (their label sets are what they were before the label existed).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct UserLabel(String);

impl UserLabel {
    pub(crate) fn of(w: &Workload) -> Self {
        Self(sanitize_label(&w.container_user))
    }
}

impl EncodeLabelSet for UserLabel {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        if self.0.is_empty() {
            return Ok(());
        }
        [("container_user", self.0.as_str())].encode(encoder)
    }
}

/// One metric of the reference (`cargo xtask gen --docs` writes docs/fleet.md's from
/// [`REFERENCE`]).
#[derive(Clone, Copy, Debug)]
pub struct MetricDoc {
    /// The sample name as Prometheus stores it (counters end in `_total`).
    pub name: &'static str,
    pub kind: &'static str,
    pub labels: &'static str,
    pub help: &'static str,
}

const TASK_LABELS: &str = "gpu, UUID, engine, comm, container, container_user (a user's container only), pod, namespace, pod_uid";

macro_rules! doc {
    ($id:ident, $name:expr, $kind:expr, $labels:expr, $help:expr) => {
        const $id: MetricDoc = MetricDoc {
            name: $name,
            kind: $kind,
            labels: $labels,
            help: $help,
        };
    };
}

doc!(
    EVENTS,
    "gpu_trace_events_total",
    "counter",
    "event, gpu, UUID, engine, comm, container, container_user (a user's container only), pod, namespace, pod_uid",
    "Events reported (`event` is TASK_INIT, SCHEDULE, WORK_SUBMIT, TASK_DESTROY, SCHED_UPDATE, PRETRACE_END or MPS_SHARED), whether printed or not (WORK_SUBMIT without -v)."
);
doc!(
    REFUSED,
    "gpu_trace_schedules_refused_total",
    "counter",
    TASK_LABELS,
    "SCHEDULE events the driver refused (allowed=no), including those refused by --deny-pid."
);
doc!(
    LIVE,
    "gpu_trace_live_tasks",
    "gauge",
    TASK_LABELS,
    "TSGs (NVIDIA) or KFD queues (AMD) alive now: created while tracing and not yet destroyed."
);
doc!(
    TIMESLICE,
    "gpu_trace_live_tasks_timeslice_seconds",
    "gauge",
    TASK_LABELS,
    "Sum of the timeslices of the live tasks whose timeslice is known (divide by gpu_trace_live_tasks for the mean)."
);
doc!(
    LIFETIME,
    "gpu_trace_task_lifetime_seconds",
    "histogram",
    "gpu, UUID, engine",
    "TASK_INIT to TASK_DESTROY of the tasks created while tracing."
);
doc!(
    LATENCY,
    "gpu_trace_schedule_latency_seconds",
    "histogram",
    "gpu, UUID, engine",
    "TASK_INIT to the task's first allowed SCHEDULE (admission latency)."
);
doc!(
    DROPPED,
    "gpu_trace_dropped_records_total",
    "counter",
    "",
    "Records the kernel programs lost because the ring buffer was full (raise --ring-size)."
);
doc!(
    READ_FAILED,
    "gpu_trace_read_failures_total",
    "counter",
    "",
    "Records sent without their driver arguments because reading the caller's memory failed."
);
doc!(
    DECODE,
    "gpu_trace_decode_errors_total",
    "counter",
    "",
    "Driver calls whose arguments could not be decoded."
);
doc!(
    MALFORMED,
    "gpu_trace_malformed_records_total",
    "counter",
    "",
    "Ring-buffer records userspace could not parse."
);
doc!(
    RECORDS,
    "gpu_trace_records_total",
    "counter",
    "",
    "Records the kernel programs wrote to the ring buffer."
);
doc!(
    FD_LOOKUP,
    "gpu_trace_fd_lookup_failures_total",
    "counter",
    "",
    "Driver calls whose file descriptor could not be resolved to its file."
);
doc!(
    SKIPPED,
    "gpu_trace_skipped_runs_total",
    "counter",
    "",
    "Runs of gpu-trace's kernel programs the kernel skipped because the program was already running on that CPU; each a system call not looked at (a GPU call among them lost its event)."
);
doc!(
    DENIED,
    "gpu_trace_denied_total",
    "counter",
    "",
    "Scheduling requests refused by --deny-pid (BPF LSM)."
);
doc!(
    DENIED_UNREAD,
    "gpu_trace_denied_unread_total",
    "counter",
    "",
    "Of gpu_trace_denied_total, the scheduling requests refused without reading bEnable (failing closed: FINN-serialized parameters, or parameters the BPF helper could not read)."
);
doc!(
    DENY_UNFOLLOWED,
    "gpu_trace_deny_unfollowed_total",
    "counter",
    "",
    "Processes created by a denied process that could not be added to the deny map because it was full: these processes were NOT denied."
);
doc!(
    OVERFLOWED,
    "gpu_trace_label_overflow_events_total",
    "counter",
    "",
    "Events counted under an __overflow__ label value because a label cap was reached."
);
doc!(
    UNTRACKED,
    "gpu_trace_untracked_handles_total",
    "counter",
    "",
    "Calls on handles never seen created that the tracer did not remember because its per-process or total cap was reached (docs/events.md, Bounded state); their events are still counted."
);
doc!(
    UNREPORTED,
    "gpu_trace_unreported_total",
    "counter",
    "reason",
    "What the run did not report, by the statistics' reason (JSON unreported): driver calls of interest that produced no event (schedule_unreadable, unknown_handle, pretrace_calls, ...), processes -- CMD created past the bound of those it follows (unfollowed), --api calls the kernel's full per-process sums could not count (api_uncounted, api_through_uncounted), the tracer's own records (own_process); docs/json-schema.md lists every reason. Alert on unfollowed and api_uncounted: events or calls were lost."
);
doc!(
    EXPIRED,
    "gpu_trace_label_sets_expired_total",
    "counter",
    "",
    "Label sets taken out of the scrape because they counted nothing for --metrics-expire: the events' (gpu, engine, comm, container, pod; holding no live task) and --api's (call counters, interposer counter); their label values free room under the label caps. One that comes back starts its counters from 0."
);
doc!(
    RING,
    "gpu_trace_ring_buffer_bytes",
    "gauge",
    "",
    "Size of the ring buffer (--ring-size); 0 in replay."
);
doc!(
    RING_USED,
    "gpu_trace_ring_buffer_used_bytes",
    "gauge",
    "",
    "Bytes the kernel programs wrote to the ring buffer and gpu-trace has not read yet, at scrape time (near gpu_trace_ring_buffer_bytes: records are about to be dropped). Absent in replay."
);
doc!(
    FLIGHT_TRIGGERS,
    "gpu_trace_flight_triggers_total",
    "counter",
    "trigger",
    "Flight-recorder triggers that came, by name (signal: SIGUSR1 or POST /dump; refused, recursion, dropped, signal-exit: --dump-on), whether a dump followed or not."
);
doc!(
    FLIGHT_DUMPS,
    "gpu_trace_flight_dumps_total",
    "counter",
    "",
    "Flight-recorder dumps written (renamed into place in --dump-dir)."
);
doc!(
    FLIGHT_SUPPRESSED,
    "gpu_trace_flight_dumps_suppressed_total",
    "counter",
    "",
    "Flight-recorder triggers not dumped because --dump-max-per-hour dumps were written in the last hour."
);
doc!(
    FLIGHT_FAILED,
    "gpu_trace_flight_dumps_failed_total",
    "counter",
    "",
    "Flight-recorder dumps that could not be written (the reason is on stderr)."
);
doc!(
    BUILD,
    "gpu_trace_build_info",
    "info",
    "version",
    "The gpu-trace version serving the metrics (always 1)."
);
/// Read at each scrape by the collector the binary adds (`gpu-trace`'s `metrics::process`):
/// this pure core reads nothing of the system.
pub const CPU: MetricDoc = MetricDoc {
    name: "process_cpu_seconds_total",
    kind: "counter",
    labels: "",
    help: "User and system CPU time gpu-trace's process has used.",
};
/// See [`CPU`].
pub const RSS: MetricDoc = MetricDoc {
    name: "process_resident_memory_bytes",
    kind: "gauge",
    labels: "",
    help: "Resident memory of gpu-trace's process.",
};

/// Every metric gpu-trace serves, in the order of the reference.
pub const REFERENCE: &[MetricDoc] = &[
    EVENTS,
    REFUSED,
    LIVE,
    TIMESLICE,
    LIFETIME,
    LATENCY,
    DROPPED,
    READ_FAILED,
    DECODE,
    MALFORMED,
    RECORDS,
    FD_LOOKUP,
    SKIPPED,
    DENIED,
    DENIED_UNREAD,
    DENY_UNFOLLOWED,
    OVERFLOWED,
    UNTRACKED,
    UNREPORTED,
    EXPIRED,
    RING,
    RING_USED,
    SHARE,
    api::CALLS,
    api::ERRORS,
    api::SECONDS,
    api::INTERPOSER,
    FLIGHT_TRIGGERS,
    FLIGHT_DUMPS,
    FLIGHT_SUPPRESSED,
    FLIGHT_FAILED,
    BUILD,
    CPU,
    RSS,
];

/// The name `prometheus-client` registers (it appends `_total` to counters itself).
fn family_name(doc: &MetricDoc) -> &'static str {
    (doc.name.strip_suffix("_total"))
        .or(doc.name.strip_suffix("_info"))
        .unwrap_or(doc.name)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: &'static str,
    #[prometheus(flatten)]
    task: TaskLabels,
}

/// dcgm-exporter's spelling of the GPU's UUID label (`UUID`), so that `on(gpu, UUID)` joins.
#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    gpu: String,
    UUID: String,
    engine: &'static str,
    comm: String,
    container: String,
    #[prometheus(flatten)]
    container_user: UserLabel,
    pod: String,
    namespace: String,
    pod_uid: String,
}

#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HwLabels {
    gpu: String,
    UUID: String,
    engine: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Distinct values up to a cap; index 0 is the empty value (unknown), the last index is
/// [`OVERFLOW`].
#[derive(Debug)]
struct Interner<T, L = String> {
    index: HashMap<T, u32>,
    labels: Vec<L>,
    cap: usize,
    /// Indices given back by [`Interner::release`], reused first.
    free: Vec<u32>,
}

/// The index [`Interner::slot`] returns past the cap.
const OVERFLOW_IX: u32 = u32::MAX;

impl<T: std::hash::Hash + Eq, L: Clone + Default> Interner<T, L> {
    fn new(cap: usize) -> Self {
        Self {
            index: HashMap::new(),
            labels: vec![L::default()],
            cap,
            free: Vec::new(),
        }
    }

    /// Whether `key` has an index now.
    fn contains<Q>(&self, key: &Q) -> bool
    where
        T: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.index.contains_key(key)
    }

    fn is_full(&self) -> bool {
        self.index.len() >= self.cap
    }

    /// Gives index `ix` back: its value no longer has one, and a new value may take it.
    fn release(&mut self, ix: u32) {
        let before = self.index.len();
        self.index.retain(|_, v| *v != ix);
        if self.index.len() < before {
            self.free.push(ix);
        }
    }

    /// The value's index, interning it (with its label text from `make`) while under the cap.
    fn slot<Q>(&mut self, key: &Q, make: impl FnOnce() -> (T, L)) -> u32
    where
        T: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        if let Some(&ix) = self.index.get(key) {
            return ix;
        }
        if self.index.len() >= self.cap {
            return OVERFLOW_IX;
        }
        let (owned, label) = make();
        let ix = match self.free.pop() {
            Some(ix) => {
                self.labels[ix as usize] = label;
                ix
            }
            None => {
                self.labels.push(label);
                self.labels.len() as u32 - 1
            }
        };
        self.index.insert(owned, ix);
        ix
    }

    /// The label of index `ix`, or `overflow` past the cap.
    fn label(&self, ix: u32, overflow: L) -> L {
        if ix == OVERFLOW_IX {
            overflow
        } else {
            self.labels[ix as usize].clone()
        }
    }
}

/// A process name as a label value, written as the text output writes it (the one rule of
/// output/escape.rs: `\\`, `\n`, `\xNN` for controls, bidi and invisible characters and
/// for bytes that are not UTF-8); the exposition format's own escaping (`\\`, `\"`, `\n`) is
/// the encoder's, on top.
pub fn sanitize_label(raw: &str) -> String {
    crate::escape::escape_text(raw).into_owned()
}

/// The key of a GPU in [`Metrics::gpus`]: nvidia-smi's `index` when the pipeline named the GPU
/// (its UUID then comes with it), else the event's own number (`raw`: AMD's `gpu_id`), the two
/// kept apart.
fn gpu_key(index: Option<u32>, raw: Option<u32>) -> u64 {
    match index {
        Some(i) => 1 << 32 | u64::from(i),
        None => u64::from(raw.unwrap_or(0)),
    }
}

/// The key of the NVIDIA GPUs the pipeline could not name (`gpu="?"`): RM's device instance is
/// not nvidia-smi's index, so it is not shown as one.
const UNNAMED_GPU_KEY: u64 = 2 << 32;

/// The `event` label values, in the order of [`Series::events`].
const EVENT_NAMES: [&str; 7] = [
    "TASK_INIT",
    "SCHEDULE",
    "WORK_SUBMIT",
    "TASK_DESTROY",
    "SCHED_UPDATE",
    "PRETRACE_END",
    "MPS_SHARED",
];

/// The series of one (gpu, engine, comm, workload).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct SeriesKey {
    gpu: u32,
    engine: u8,
    comm: u32,
    workload: u32,
}

/// The registered families of the per-task metrics (clones share them).
#[derive(Clone, Debug, Default)]
struct Families {
    events: Family<EventLabels, Counter>,
    refused: Family<TaskLabels, Counter>,
    live: Family<TaskLabels, Gauge>,
    timeslice: Family<TaskLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl Families {
    /// Takes every series of `labels` out of the scrape.
    fn remove(&self, labels: &TaskLabels) {
        for event in EVENT_NAMES {
            self.events.remove(&EventLabels {
                event,
                task: labels.clone(),
            });
        }
        self.refused.remove(labels);
        self.live.remove(labels);
        self.timeslice.remove(labels);
    }
}

/// Handles on one label set's metrics (clones share the registered atomics). Each metric's
/// series enters the scrape when it first gets a value: an event series at its first event of
/// that kind, the refusals at the first refusal, the live gauges at the first task created in
/// it, so that no series sits at zero for ever.
#[derive(Clone, Debug)]
struct Series {
    labels: TaskLabels,
    fam: Families,
    events: [Option<Counter>; 7],
    refused: Option<Counter>,
    live: Option<Gauge>,
    timeslice: Option<Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Microseconds behind `timeslice` (kept exact, set as seconds).
    timeslice_us: u64,
    overflow: bool,
    /// The time of its latest event (CLOCK_MONOTONIC ns), for [`MetricsConfig::expire`].
    last_ns: u64,
}

impl Series {
    /// Counts one event of kind `i` ([`EVENT_NAMES`]).
    fn count(&mut self, i: usize) {
        let (fam, labels) = (&self.fam, &self.labels);
        self.events[i]
            .get_or_insert_with(|| {
                fam.events.get_or_create_owned(&EventLabels {
                    event: EVENT_NAMES[i],
                    task: labels.clone(),
                })
            })
            .inc();
    }

    fn refused(&mut self) {
        let (fam, labels) = (&self.fam, &self.labels);
        (self.refused)
            .get_or_insert_with(|| fam.refused.get_or_create_owned(labels))
            .inc();
    }

    fn live(&mut self) -> &Gauge {
        let (fam, labels) = (&self.fam, &self.labels);
        self.live
            .get_or_insert_with(|| fam.live.get_or_create_owned(labels))
    }

    /// The live tasks' timeslices now sum to `us`.
    fn set_timeslice(&mut self, us: u64) {
        self.timeslice_us = us;
        let (fam, labels) = (&self.fam, &self.labels);
        (self.timeslice)
            .get_or_insert_with(|| fam.timeslice.get_or_create_owned(labels))
            .set(us as f64 / 1e6);
    }
}

#[derive(Clone, Debug)]
struct Hist {
    lifetime: Histogram,
    latency: Histogram,
}

/// A task created while tracing.
#[derive(Clone, Copy, Debug)]
struct TaskState {
    key: SeriesKey,
    init_ns: u64,
    scheduled: bool,
    timeslice_us: Option<u64>,
}

/// Who an event is of, besides its task: the GPU the pipeline named, its GPU numbering, the
/// engine its vendor names, the process's name and workload.
#[derive(Clone, Copy)]
struct Who<'a> {
    named: Option<&'a GpuIdentity>,
    numbering: GpuNumbering,
    engine: Option<TaskEngine>,
    process: &'a str,
    workload: Option<&'a Workload>,
}

impl TaskState {
    /// A task created at `init_ns`, not scheduled yet.
    fn new(key: SeriesKey, init_ns: u64, timeslice_us: Option<u64>) -> Self {
        Self {
            key,
            init_ns,
            scheduled: false,
            timeslice_us,
        }
    }
}

/// A hashable form of a task id (the model's type has no `Hash`).
fn tid(t: TaskId) -> (u8, u32) {
    match t {
        TaskId::HwTsg(v) => (0, v),
        TaskId::RmHandle(v) => (1, v),
        TaskId::KfdQueue(v) => (2, v),
        TaskId::KfdNoQueue => (3, 0),
        TaskId::PreTrace(v) => (4, v),
        TaskId::Shared(v) => (5, v),
        TaskId::Unknown => (6, 0),
    }
}

/// The metrics of a trace (see the module documentation).
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    fam: Families,
    lifetime: Family<HwLabels, Histogram>,
    latency: Family<HwLabels, Histogram>,
    health: Health,
    ring_fill: RingCollector,
    comms: Interner<String>,
    /// Keyed by [`gpu_key`]; labelled `(gpu, UUID)`.
    gpus: Interner<u64, (String, String)>,
    workloads: Interner<Workload, Workload>,
    series: HashMap<SeriesKey, Series>,
    /// [`MetricsConfig::max_label_sets`].
    max_series: usize,
    hists: HashMap<(u32, u8), Hist>,
    tasks: HashMap<(u32, u32, (u8, u32)), TaskState>,
    /// The `comm` label index of each live process seen (until its exit).
    comm_of_pid: HashMap<u32, u32>,
    /// Live processes per `comm` label index.
    comm_pids: HashMap<u32, u32>,
    /// `comm` label indices no live process holds any more, oldest first: evicted (their
    /// series removed, the index reused) when a new name meets the full cap.
    ended_comms: std::collections::VecDeque<u32>,
    /// [`MetricsConfig::expire`] in ns.
    expire_ns: Option<u64>,
    /// The latest time seen (events', or [`Metrics::tick`]'s), CLOCK_MONOTONIC ns.
    now_ns: u64,
    /// When idle label sets are looked for next.
    next_sweep_ns: u64,
    /// The live run's CLOCK_MONOTONIC, read on its health timer ([`Metrics::with_clock`]).
    clock: Option<MonotonicClock>,
    /// `gpu_trace_gpu_share_ratio` ([`share`]).
    share: share::ShareCollector,
    /// `--api`'s call counters ([`api`]).
    api: api::ApiRows,
    /// `--flight-recorder`'s counters ([`flight`]).
    flight: flight::FlightMetrics,
    /// The label values of the share gauge's samples and when they were last sampled, for the
    /// expiry (the gauge itself holds the last window's processes only).
    share_keys: HashMap<SeriesKey, u64>,
}

/// See [`Metrics::with_clock`].
struct MonotonicClock(Box<dyn Fn() -> u64 + Send + Sync>);

impl std::fmt::Debug for MonotonicClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MonotonicClock")
    }
}

#[derive(Debug, Default)]
struct Health {
    dropped: Counter,
    read_failed: Counter,
    decode: Counter,
    malformed: Counter,
    records: Counter,
    fd_lookup: Counter,
    skipped: Counter,
    denied: Counter,
    denied_unread: Counter,
    deny_unfollowed: Counter,
    overflowed: Counter,
    untracked: Counter,
    unreported: Family<ReasonLabel, Counter>,
    expired: Counter,
    ring: Gauge,
    /// Last values set, to turn absolute counts into increments.
    last_kernel: KernelCounters,
    last_decode: u64,
    last_malformed: u64,
    last_untracked: u64,
    last_unreported: std::collections::BTreeMap<&'static str, u64>,
}

/// `gpu_trace_unreported_total`'s label: one of the statistics' fixed reasons.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

impl Health {
    /// Registers the health counters (not the ring gauge) in `r`.
    fn register(&self, r: &mut Registry) {
        for (d, c) in [
            (&DROPPED, &self.dropped),
            (&READ_FAILED, &self.read_failed),
            (&DECODE, &self.decode),
            (&MALFORMED, &self.malformed),
            (&RECORDS, &self.records),
            (&FD_LOOKUP, &self.fd_lookup),
            (&SKIPPED, &self.skipped),
            (&DENIED, &self.denied),
            (&DENIED_UNREAD, &self.denied_unread),
            (&DENY_UNFOLLOWED, &self.deny_unfollowed),
            (&OVERFLOWED, &self.overflowed),
            (&UNTRACKED, &self.untracked),
            (&EXPIRED, &self.expired),
        ] {
            r.register(family_name(d), d.help.trim_end_matches('.'), c.clone());
        }
        r.register(
            family_name(&UNREPORTED),
            UNREPORTED.help.trim_end_matches('.'),
            self.unreported.clone(),
        );
    }
}

/// A counter exported from absolute readings: it goes up by what `now` adds to the largest
/// reading so far (`last`), never down.
fn advance(counter: &Counter, last: &mut u64, now: u64) {
    counter.inc_by(now.saturating_sub(*last));
    *last = (*last).max(now);
}

fn lifetime_histogram() -> Histogram {
    // 1 ms … ~13.5 h.
    Histogram::new(exponential_buckets(0.001, 5.0, 12))
}

fn latency_histogram() -> Histogram {
    // 10 µs … ~42 s.
    Histogram::new(exponential_buckets(0.000_01, 4.0, 12))
}

impl Metrics {
    pub fn new(config: MetricsConfig) -> Self {
        Self::with_collectors(config, Vec::new())
    }

    /// Like [`new`](Self::new), with `extra` collectors read at each scrape (the binary adds its
    /// own process's CPU time and memory, [`CPU`] and [`RSS`]).
    pub fn with_collectors(config: MetricsConfig, extra: Vec<Box<dyn Collector>>) -> Self {
        let mut registry = Registry::default();
        let fam = Families::default();
        let lifetime =
            Family::<HwLabels, Histogram>::new_with_constructor(lifetime_histogram as fn() -> _);
        let latency =
            Family::<HwLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        let health = Health::default();
        fn reg(r: &mut Registry, d: &MetricDoc, m: impl prometheus_client::registry::Metric) {
            // The client adds the final period itself.
            r.register(family_name(d), d.help.trim_end_matches('.'), m);
        }
        reg(&mut registry, &EVENTS, fam.events.clone());
        reg(&mut registry, &REFUSED, fam.refused.clone());
        reg(&mut registry, &LIVE, fam.live.clone());
        reg(&mut registry, &TIMESLICE, fam.timeslice.clone());
        reg(&mut registry, &LIFETIME, lifetime.clone());
        reg(&mut registry, &LATENCY, latency.clone());
        health.register(&mut registry);
        reg(&mut registry, &RING, health.ring.clone());
        reg(
            &mut registry,
            &BUILD,
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        let flight = flight::FlightMetrics::register(&mut registry);
        let ring_fill = RingCollector::default();
        for c in extra {
            registry.register_collector(c);
        }
        registry.register_collector(Box::new(ring_fill.clone()));
        let share = share::ShareCollector::default();
        registry.register_collector(Box::new(share.clone()));
        let api = api::ApiRows::default();
        registry.register_collector(Box::new(api.collector.clone()));
        registry.register_collector(Box::new(api.paths.clone()));
        Self {
            registry: Arc::new(registry),
            fam,
            lifetime,
            latency,
            health,
            ring_fill,
            comms: Interner::new(config.max_comms),
            gpus: Interner::new(config.max_gpus),
            workloads: Interner::new(config.max_workloads),
            max_series: config.max_label_sets,
            series: HashMap::new(),
            hists: HashMap::new(),
            tasks: HashMap::new(),
            comm_of_pid: HashMap::new(),
            comm_pids: HashMap::new(),
            ended_comms: std::collections::VecDeque::new(),
            expire_ns: (config.expire).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            now_ns: 0,
            next_sweep_ns: 0,
            clock: None,
            share,
            api,
            flight,
            share_keys: HashMap::new(),
        }
    }

    /// The flight recorder's counters, for the live run's flight recorder to count into.
    pub fn flight(&self) -> flight::FlightMetrics {
        self.flight.clone()
    }

    /// Process `pid` exited: when no live process holds its name any more, the name's label
    /// value may be evicted for a new one (see [`Metrics::key`]).
    pub fn process_exited(&mut self, pid: u32) {
        if let Some(ix) = self.comm_of_pid.remove(&pid) {
            self.comm_released(ix);
        }
    }

    fn comm_released(&mut self, ix: u32) {
        if let Some(n) = self.comm_pids.get_mut(&ix) {
            *n -= 1;
            if *n == 0 {
                self.comm_pids.remove(&ix);
                self.ended_comms.push_back(ix);
            }
        }
    }

    /// Process `pid`'s events count under `comm` label index `ix`.
    fn note_comm(&mut self, pid: u32, ix: u32) {
        if ix == OVERFLOW_IX || ix == 0 {
            return;
        }
        match self.comm_of_pid.insert(pid, ix) {
            Some(old) if old == ix => return,
            Some(old) => self.comm_released(old),
            None => {}
        }
        *self.comm_pids.entry(ix).or_default() += 1;
    }

    /// Makes room for a new `comm` value: evicts the oldest name no live process holds (and no
    /// live task counts under): its series leave the registry and its index is reused.
    fn evict_ended_comm(&mut self) {
        while let Some(ix) = self.ended_comms.pop_front() {
            if self.comm_pids.contains_key(&ix) || self.tasks.values().any(|t| t.key.comm == ix) {
                continue; // held again, or a task of it still counts
            }
            let doomed: Vec<SeriesKey> = self
                .series
                .keys()
                .filter(|k| k.comm == ix)
                .copied()
                .collect();
            for key in doomed {
                if let Some(s) = self.series.remove(&key) {
                    self.fam.remove(&s.labels);
                }
            }
            self.comms.release(ix);
            return;
        }
    }

    /// A live run's clock (CLOCK_MONOTONIC ns, the events' clock), read each second on its
    /// health timer ([`Sink::kernel`]) to expire label sets while no event comes. The binary
    /// gives it: this core reads nothing of the system.
    pub fn with_clock(mut self, now_ns: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.clock = Some(MonotonicClock(Box::new(now_ns)));
        self
    }

    /// The time is `now_ns` (CLOCK_MONOTONIC), or later: the label sets idle for
    /// [`MetricsConfig::expire`] leave the scrape (looked for at most every eighth of it, and
    /// at least every minute, of this clock). Events move the clock themselves; a live run also
    /// calls this each second, so that label sets expire while no event comes.
    pub fn tick(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        let Some(expire) = self.expire_ns else {
            return;
        };
        if self.now_ns < self.next_sweep_ns {
            return;
        }
        self.expire_idle(expire);
        let period = (expire / 8).clamp(1, 60_000_000_000);
        self.next_sweep_ns = self.now_ns.saturating_add(period);
    }

    /// Removes the series of every label set whose latest event is `expire` or more before
    /// now and that holds no live task; then gives back the label values no series holds any
    /// more (a `comm` only once no live process has it).
    fn expire_idle(&mut self, expire: u64) {
        let Some(before) = self.now_ns.checked_sub(expire) else {
            return;
        };
        let api = self.api.expire(before);
        self.health.expired.inc_by(api);
        let held: HashSet<SeriesKey> = self.tasks.values().map(|t| t.key).collect();
        let doomed: Vec<SeriesKey> = (self.series.iter())
            .filter(|(k, s)| s.last_ns <= before && !held.contains(k))
            .map(|(k, _)| *k)
            .collect();
        for key in &doomed {
            if let Some(s) = self.series.remove(key) {
                self.fam.remove(&s.labels);
            }
        }
        self.health.expired.inc_by(doomed.len() as u64);
        // The share gauge's label values not sampled since: their room goes back too.
        let shares: Vec<SeriesKey> = (self.share_keys.iter())
            .filter(|(_, t)| **t <= before)
            .map(|(k, _)| *k)
            .collect();
        for k in &shares {
            self.share_keys.remove(k);
        }
        self.release_unheld(doomed.into_iter().chain(shares));
    }

    /// Gives back the label values of `keys` that no series and no recent share sample holds
    /// any more (a `comm` only once no live process has it).
    fn release_unheld(&mut self, keys: impl Iterator<Item = SeriesKey>) {
        let all = || self.series.keys().chain(self.share_keys.keys());
        let comms: HashSet<u32> = all().map(|k| k.comm).collect();
        let workloads: HashSet<u32> = all().map(|k| k.workload).collect();
        for key in keys {
            if !comms.contains(&key.comm) && !self.comm_pids.contains_key(&key.comm) {
                self.comms.release(key.comm);
                self.ended_comms.retain(|&c| c != key.comm);
            }
            if !workloads.contains(&key.workload) {
                self.workloads.release(key.workload);
            }
        }
    }

    /// The registry to serve (shared with the HTTP server).
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The scrape body (OpenMetrics text, as the server sends it).
    pub fn encode(&self) -> String {
        encode(&self.registry)
    }

    /// Where the ring buffer's fill is read at each scrape (a live run's `RingFill`, in `gpu-trace`);
    /// without it, `gpu_trace_ring_buffer_used_bytes` is not served. Set once.
    pub fn set_ring_fill(&self, used_bytes: impl Fn() -> u64 + Send + Sync + 'static) {
        self.ring_fill_slot().set(used_bytes);
    }

    /// Where `gpu_trace_ring_buffer_used_bytes` will be read from: a handle the caller keeps
    /// after handing the metrics to the pipeline (the ring buffer is taken later).
    pub fn ring_fill_slot(&self) -> RingFillSlot {
        RingFillSlot(self.ring_fill.clone())
    }

    /// `--ring-size` of the live run.
    pub fn set_ring_bytes(&self, bytes: u64) {
        self.health.ring.set(bytes as i64);
    }

    /// Counts one event of process `process_name` (its first `comm`), running in `workload`
    /// (none known yet: pass `None`), its GPU not named (see [`Metrics::observe_on`]).
    pub fn observe(&mut self, ev: &Event, process_name: &str, workload: Option<&Workload>) {
        self.observe_on(ev, process_name, workload, None);
    }

    /// [`Metrics::observe`] of an event whose task is on the GPU `gpu` names (nvidia-smi's
    /// index and the UUID), when the pipeline knows it.
    pub fn observe_on(
        &mut self,
        ev: &Event,
        process_name: &str,
        workload: Option<&Workload>,
        gpu: Option<&GpuIdentity>,
    ) {
        // Idle label sets go first: their room is free for this event's.
        self.tick(ev.origin.ts_ns);
        let who = Who {
            named: gpu,
            numbering: ev.gpu_numbering(),
            engine: ev.engine(),
            process: process_name,
            workload,
        };
        let pid = ev.origin.pid;
        let key = match &ev.kind {
            EventKind::TaskInit {
                task,
                client,
                timeslice_us,
                ..
            } => {
                let key = self.key_of(who, ev.gpu_number());
                let state = TaskState::new(key, ev.origin.ts_ns, *timeslice_us);
                self.task_created((pid, *client, tid(*task)), state);
                key
            }
            EventKind::Schedule {
                task,
                client,
                allowed,
                timeslice_us,
                ..
            } => {
                let id = (pid, *client, tid(*task));
                let state = self.tasks.get(&id).copied();
                let key = self.task_key(id, who);
                self.scheduled(id, key, state, *allowed, *timeslice_us, ev.origin.ts_ns);
                key
            }
            EventKind::WorkSubmit { task, client, .. } => {
                let key = match self.tasks.get(&(pid, *client, tid(*task))) {
                    Some(t) => t.key,
                    None => self.key_of(who, ev.gpu_number()),
                };
                self.series_mut(key).count(2);
                key
            }
            EventKind::TaskDestroy {
                task,
                client,
                cause,
                ..
            } => {
                let id = (pid, *client, tid(*task));
                let state = self.tasks.remove(&id);
                if *cause == DestroyCause::TracerExit {
                    // Not an event (the statistics count it as alive at exit).
                    if let Some(t) = state {
                        self.end_task(t, None);
                    }
                    return;
                }
                let key = match state {
                    Some(t) => t.key,
                    None => self.task_key(id, who),
                };
                self.series_mut(key).count(3);
                if let Some(t) = state {
                    self.end_task(t, Some(ev.origin.ts_ns));
                }
                key
            }
            EventKind::SchedUpdate {
                task,
                client,
                change,
                allowed,
                ..
            } => {
                let id = (pid, *client, tid(*task));
                let state = self.tasks.get(&id).copied();
                let key = self.task_key(id, who);
                self.series_mut(key).count(4);
                // An accepted timeslice change moves the live-timeslice gauge (a refused one,
                // or one on a task not seen created, changes nothing known).
                if let (Some(t), true, SchedChange::Timeslice { new_us, .. }) =
                    (state, *allowed, change)
                {
                    self.timeslice_set(id, t, *new_us);
                }
                key
            }
            EventKind::PretraceEnd { .. } => {
                let key = self.key_of(who, None);
                self.series_mut(key).count(5);
                key
            }
            EventKind::MpsShared { task, client, .. } => {
                let id = (pid, *client, tid(*task));
                let key = self.task_key(id, who);
                self.series_mut(key).count(6);
                key
            }
        };
        let s = self.series_mut(key);
        s.last_ns = s.last_ns.max(ev.origin.ts_ns);
        if s.overflow {
            self.health.overflowed.inc();
        }
        self.note_comm(pid, key.comm);
    }

    /// The series of task `id` when it was seen created, else of its process (on the GPU the
    /// pipeline named, no engine but AMD's queue type).
    fn task_key(&mut self, id: (u32, u32, (u8, u32)), who: Who<'_>) -> SeriesKey {
        match self.tasks.get(&id) {
            Some(t) => t.key,
            None => self.key_of(who, None),
        }
    }

    /// The series of `who`'s event on `gpu` (the event's own number) and its engine.
    fn key_of(&mut self, who: Who<'_>, gpu: Option<u32>) -> SeriesKey {
        let engine = who.engine.map_or(0, TaskEngine::id);
        let gpu = self.gpu_slot(gpu, who.named, who.numbering);
        self.key_on(gpu, engine, who.process, who.workload)
    }

    /// A `TASK_INIT`: the task `id` counts as live in its series (and its timeslice in the
    /// live-timeslice gauge).
    fn task_created(&mut self, id: (u32, u32, (u8, u32)), state: TaskState) {
        let s = self.series_mut(state.key);
        s.count(0);
        s.live().inc();
        if let Some(us) = state.timeslice_us {
            s.set_timeslice(s.timeslice_us + us);
        }
        if let Some(old) = self.tasks.insert(id, state) {
            // The tracker replaced a handle it never saw freed: that task is gone.
            self.end_task(old, None);
        }
    }

    /// A `SCHEDULE` of the task `id` (`state`: as known, if it was seen created): counted, a
    /// refusal counted; the first allowed one observes the creation-to-schedule latency, and
    /// an allowed timeslice moves the live-timeslice gauge.
    fn scheduled(
        &mut self,
        id: (u32, u32, (u8, u32)),
        key: SeriesKey,
        state: Option<TaskState>,
        allowed: bool,
        timeslice_us: Option<u64>,
        ts_ns: u64,
    ) {
        let s = self.series_mut(key);
        s.count(1);
        if !allowed {
            s.refused();
        }
        if let (Some(mut t), true) = (state, allowed) {
            if !t.scheduled {
                t.scheduled = true;
                let secs = ts_ns.saturating_sub(t.init_ns) as f64 / 1e9;
                self.hist(key).latency.observe(secs);
            }
            match timeslice_us {
                Some(new) => self.timeslice_set(id, t, new),
                None => {
                    self.tasks.insert(id, t);
                }
            }
        }
    }

    /// The live task `id` (`t`) now has timeslice `new_us`: the live-timeslice gauge moves.
    fn timeslice_set(&mut self, id: (u32, u32, (u8, u32)), mut t: TaskState, new_us: u64) {
        let s = self.series_mut(t.key);
        s.set_timeslice(s.timeslice_us - t.timeslice_us.unwrap_or(0) + new_us);
        t.timeslice_us = Some(new_us);
        self.tasks.insert(id, t);
    }

    /// Removes a live task from the gauges; with `end_ns`, observes its lifetime.
    fn end_task(&mut self, t: TaskState, end_ns: Option<u64>) {
        let s = self.series_mut(t.key);
        s.live().dec();
        if let Some(us) = t.timeslice_us {
            s.set_timeslice(s.timeslice_us - us);
        }
        if let Some(end) = end_ns {
            let secs = end.saturating_sub(t.init_ns) as f64 / 1e9;
            self.hist(t.key).lifetime.observe(secs);
        }
    }

    /// The `gpu` label index of a GPU named by nvidia-smi's index and UUID (`named`), else by
    /// the event's own number where that is the driver's id (AMD's `gpu_id`), else (an RM
    /// device instance not named yet) as `?`.
    fn gpu_slot(
        &mut self,
        gpu: Option<u32>,
        named: Option<&GpuIdentity>,
        numbering: GpuNumbering,
    ) -> u32 {
        match (named, gpu) {
            (Some(id), _) => self.gpus.slot(&gpu_key(Some(id.index), None), || {
                let uuid = id.uuid.as_deref().map(sanitize_label).unwrap_or_default();
                (gpu_key(Some(id.index), None), (id.index.to_string(), uuid))
            }),
            (None, Some(_)) if numbering == GpuNumbering::RmDevice => {
                self.gpus.slot(&UNNAMED_GPU_KEY, || {
                    (UNNAMED_GPU_KEY, ("?".to_string(), String::new()))
                })
            }
            (None, Some(g)) => self.gpus.slot(&gpu_key(None, Some(g)), || {
                (gpu_key(None, Some(g)), (g.to_string(), String::new()))
            }),
            (None, None) => 0,
        }
    }

    /// The series of `gpu` (a [`Metrics::gpu_slot`]), `engine`, the process and its workload.
    fn key_on(
        &mut self,
        gpu: u32,
        engine: u8,
        process_name: &str,
        workload: Option<&Workload>,
    ) -> SeriesKey {
        if self.comms.is_full() && !self.comms.contains(process_name) {
            self.evict_ended_comm();
        }
        let comm = self.comms.slot(process_name, || {
            (process_name.to_string(), sanitize_label(process_name))
        });
        let workload = match workload {
            Some(w) if *w != Workload::default() => self.workloads.slot(w, || {
                let label = Workload {
                    container: sanitize_label(&w.container),
                    pod: sanitize_label(&w.pod),
                    namespace: sanitize_label(&w.namespace),
                    pod_uid: sanitize_label(&w.pod_uid),
                    container_user: sanitize_label(&w.container_user),
                };
                (w.clone(), label)
            }),
            _ => 0,
        };
        let key = SeriesKey {
            gpu,
            engine,
            comm,
            workload,
        };
        if self.series.len() >= self.max_series && !self.series.contains_key(&key) {
            // Each label is capped, but not their product: past the cap on label sets, every
            // new combination shares one series.
            return SeriesKey {
                gpu: OVERFLOW_IX,
                engine: 0,
                comm: OVERFLOW_IX,
                workload: OVERFLOW_IX,
            };
        }
        key
    }

    /// The label values of series `key`.
    fn labels_of(&self, key: SeriesKey) -> TaskLabels {
        let over = || OVERFLOW.to_string();
        let w = self.workloads.label(
            key.workload,
            Workload {
                container: over(),
                pod: over(),
                namespace: over(),
                pod_uid: over(),
                container_user: String::new(),
            },
        );
        let (gpu, uuid) = self.gpus.label(key.gpu, (over(), over()));
        TaskLabels {
            gpu,
            UUID: uuid,
            engine: engine_name(key.engine),
            comm: self.comms.label(key.comm, over()),
            container_user: UserLabel(w.container_user),
            container: w.container,
            pod: w.pod,
            namespace: w.namespace,
            pod_uid: w.pod_uid,
        }
    }

    fn series_mut(&mut self, key: SeriesKey) -> &mut Series {
        if !self.series.contains_key(&key) {
            let series = Series {
                labels: self.labels_of(key),
                fam: self.fam.clone(),
                events: Default::default(),
                refused: None,
                live: None,
                timeslice: None,
                timeslice_us: 0,
                overflow: [key.gpu, key.comm, key.workload].contains(&OVERFLOW_IX),
                last_ns: self.now_ns,
            };
            self.series.insert(key, series);
        }
        self.series.get_mut(&key).expect("inserted above")
    }

    fn hist(&mut self, key: SeriesKey) -> &Hist {
        let hk = (key.gpu, key.engine);
        if !self.hists.contains_key(&hk) {
            let (gpu, uuid) = self.gpus.label(key.gpu, (OVERFLOW.into(), OVERFLOW.into()));
            let labels = HwLabels {
                gpu,
                UUID: uuid,
                engine: engine_name(key.engine),
            };
            let h = Hist {
                lifetime: self.lifetime.get_or_create_owned(&labels),
                latency: self.latency.get_or_create_owned(&labels),
            };
            self.hists.insert(hk, h);
        }
        &self.hists[&hk]
    }

    /// The userspace health counters of `stats` (decode errors, malformed records).
    pub fn sync_stats(&mut self, stats: &Stats) {
        let h = &mut self.health;
        advance(&h.decode, &mut h.last_decode, stats.decode_errors);
        advance(&h.malformed, &mut h.last_malformed, stats.malformed);
    }

    /// The trackers' count of handles they did not remember (absolute).
    pub fn set_untracked(&mut self, untracked: u64) {
        let h = &mut self.health;
        advance(&h.untracked, &mut h.last_untracked, untracked);
    }

    /// What the run did not report so far, by reason (absolute counts, as the statistics'
    /// `unreported`): exported as increments.
    pub fn set_unreported(&mut self, unreported: &Unreported) {
        let h = &mut self.health;
        for (&reason, &now) in unreported {
            let counter = h.unreported.get_or_create(&ReasonLabel { reason });
            advance(&counter, h.last_unreported.entry(reason).or_default(), now);
        }
    }

    /// The kernel side's counters, as read from its map (absolute values).
    pub fn set_kernel(&mut self, k: &KernelCounters) {
        let h = &mut self.health;
        let last = h.last_kernel;
        for (c, now, before) in [
            (&h.dropped, k.dropped, last.dropped),
            (&h.read_failed, k.read_failed, last.read_failed),
            (&h.records, k.emitted, last.emitted),
            (&h.fd_lookup, k.fd_lookup_failed, last.fd_lookup_failed),
            (
                &h.skipped,
                k.skipped.unwrap_or(0),
                last.skipped.unwrap_or(0),
            ),
            (&h.denied, k.denied, last.denied),
            (
                &h.denied_unread,
                k.denied_unread.unwrap_or(0),
                last.denied_unread.unwrap_or(0),
            ),
            (
                &h.deny_unfollowed,
                k.deny_unfollowed.unwrap_or(0),
                last.deny_unfollowed.unwrap_or(0),
            ),
        ] {
            c.inc_by(now.saturating_sub(before));
        }
        h.last_kernel = KernelCounters {
            dropped: k.dropped.max(last.dropped),
            read_failed: k.read_failed.max(last.read_failed),
            ignored: k.ignored,
            emitted: k.emitted.max(last.emitted),
            fd_lookup_failed: k.fd_lookup_failed.max(last.fd_lookup_failed),
            denied: k.denied.max(last.denied),
            skipped: k.skipped.max(last.skipped),
            denied_unread: k.denied_unread.max(last.denied_unread),
            deny_unfollowed: k.deny_unfollowed.max(last.deny_unfollowed),
        };
    }
}

/// See [`Metrics::ring_fill_slot`].
#[derive(Clone, Debug)]
pub struct RingFillSlot(RingCollector);

impl RingFillSlot {
    /// The reader of the ring buffer's fill (the first one set stays).
    pub fn set(&self, used_bytes: impl Fn() -> u64 + Send + Sync + 'static) {
        let _ = self.0.0.set(Box::new(used_bytes));
    }
}

/// Serves `gpu_trace_ring_buffer_used_bytes` once a reader is set.
#[derive(Clone, Default)]
struct RingCollector(Arc<std::sync::OnceLock<Box<dyn Fn() -> u64 + Send + Sync>>>);

impl std::fmt::Debug for RingCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingCollector")
    }
}

impl prometheus_client::collector::Collector for RingCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::{encoding::EncodeMetric, metrics::gauge::ConstGauge};
        let Some(read) = self.0.get() else {
            return Ok(());
        };
        let g = ConstGauge::new(read() as i64);
        let m = encoder.encode_descriptor(RING_USED.name, RING_USED.help, None, g.metric_type())?;
        g.encode(m)
    }
}

/// OpenMetrics text of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, registry)
        .expect("writing to a String cannot fail");
    body
}

/// The content type [`encode`]'s text is served with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

mod api;
pub mod flight;
mod share;
pub use api::{CALLS as API_CALLS, ERRORS as API_ERRORS, SECONDS as API_SECONDS};
pub use share::SHARE;

/// The `engine` label's text of a series' engine slot ([`TaskEngine::id`]; 0: none).
fn engine_name(id: u8) -> &'static str {
    (id.checked_sub(1))
        .and_then(|i| TaskEngine::ALL.get(i as usize))
        .map_or("", |e| e.name())
}

#[cfg(test)]
mod tests;

/// The metrics sink (`--metrics`): every selected event counted, labelled by the process's name,
/// GPU, engine, container and pod.
impl Sink for Metrics {
    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        let workload = ev.cgroup.map(Workload::of);
        self.observe_on(ev.event, ev.process, workload.as_ref(), ev.gpu);
        Ok(())
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        use crate::api::names::ApiEvent;
        let workload = ev.cgroup.map(Workload::of);
        match ev.event {
            ApiEvent::Stats(row) => {
                let at = (self.max_series, ev.origin.ts_ns.max(self.now_ns));
                (self.api).add(row, ev.process, workload.as_ref(), at);
            }
            ApiEvent::Path(path) => {
                let at = (self.max_series, ev.origin.ts_ns.max(self.now_ns));
                (self.api.paths).set(path, ev.process, workload.as_ref(), at);
            }
            _ => return Ok(()),
        }
        self.tick(ev.origin.ts_ns);
        Ok(())
    }

    /// The share gauge: each process's share over the last window.
    fn shares(&mut self, batch: &ShareBatch<'_>) -> Result<(), SinkError> {
        let shares: Vec<_> = (batch.model.recent(batch.window_us).into_iter())
            .map(|(gpu, pid, ratio)| {
                let comm = batch.processes.get(&pid).cloned().unwrap_or_default();
                let workload = batch.cgroups.get(&pid).map(Workload::of);
                (gpu, comm, workload, ratio)
            })
            .collect();
        self.set_shares(&shares);
        Ok(())
    }

    fn process_exited(&mut self, pid: u32) {
        Metrics::process_exited(self, pid);
    }

    fn kernel(&mut self, counters: &KernelCounters, unreported: &Unreported) {
        self.set_kernel(counters);
        self.set_unreported(unreported);
        // The live run's health timer, each second: idle label sets expire while no event
        // comes too.
        if let Some(now) = self.clock.as_ref().map(|c| (c.0)()) {
            self.tick(now);
        }
    }

    fn flush(&mut self, stats: &Stats, untracked: u64) -> Result<(), SinkError> {
        self.sync_stats(stats);
        self.set_untracked(untracked);
        Ok(())
    }

    fn finish(&mut self, end: &RunEnd<'_>) -> Result<(), SinkError> {
        self.set_kernel(&end.counters);
        self.sync_stats(end.stats);
        self.set_untracked(end.untracked);
        self.set_unreported(&end.stats.unreported);
        Ok(())
    }
}
