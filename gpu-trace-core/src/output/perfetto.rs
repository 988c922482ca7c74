//! `--perfetto FILE`: a timeline in the Chrome JSON trace event format, which the Perfetto UI
//! (ui.perfetto.dev, "Open trace file") and `chrome://tracing` open.
//!
//! Layout:
//! - one **process** (`pid`, named by a `process_name` metadata event after the first `comm` seen)
//!   per traced process: Perfetto shows it as a track group;
//! - **thread tracks** inside it for its TSGs / queues, reused: a task takes the process's
//!   lowest track free since before its begin, so a process has as many tracks as it had tasks
//!   alive at once (`TSG slot 1`, `TSG slot 2`, ...; `queue slot N` for AMD), however many
//!   contexts it made one after another. Their `tid` is synthetic: [`TRACK_TID_BASE`] plus a
//!   counter, above any real Linux thread id (`PID_MAX_LIMIT` is 2²²); tasks alive at once never
//!   share a track, so slices always nest;
//! - a **`GPUs` process** ([`GPU_PID`]) with two counter tracks per GPU (N its index as
//!   `nvidia-smi` shows it, what `--gpu` takes; `? (RM device D)` while the run does not know
//!   which GPU RM's device instance D of `TASK_INIT` is; AMD: the KFD `gpu_id`): `live tasks GPU N`, the tasks alive on it over time, and
//!   `schedules/s GPU N`, its `SCHEDULE`s over the last second: a step up at each `SCHEDULE`
//!   and a step down one second after it (the count of `SCHEDULE`s in `(t − 1 s, t]` at every
//!   moment `t`, never ahead of the events);
//! - a **`GPU N` process** per GPU (`GPU N runlist R` where `TASK_INIT` names the runlist, with
//!   gpu_ext's hooks) whose slot tracks show every process's tasks alive on it, one slice per
//!   lifetime named `<comm> <pid>: TSG <id> <ENGINE>` (pids from [`GPU_GROUP_PID_BASE`] up);
//! - one **slice** per lifetime, named after the task and its engine where `TASK_INIT` names
//!   one (`TSG 0x5c000015 GRAPHICS`, `queue 3 SDMA`): `B` at `TASK_INIT`, `E` at
//!   `TASK_DESTROY`; late attach: a
//!   `TSGs created before tracing` slice from the first record to each `PRETRACE_END`;
//!   processes of the start-up inventory are named and get `process_labels`. A task first seen
//!   after the trace started (its `TASK_INIT` happened before) begins at the first record of the
//!   trace; a task still alive at the end ends at the last record. The slice's args carry the
//!   `TASK_INIT` fields under `task_init`, the `TASK_DESTROY` fields under `task_destroy`, or
//!   `note` for the cases above;
//! - one **point** (a zero-length complete event, `ph: "X"`, `dur: 0`) per `TASK_INIT`,
//!   `SCHEDULE`, `SCHED_UPDATE` and `WORK_SUBMIT` on the task's track, inside its slice, with
//!   the event's fields as args. `WORK_SUBMIT` is always written (the file is not a terminal;
//!   `-v` only concerns the printed output). An event that belongs to no task becomes a
//!   process-scoped instant (`ph: "i"`);
//! - **flow arrows** through a lifetime's points in order, `TASK_INIT` → `SCHEDULE` → tokens
//!   (`WORK_SUBMIT`) → ...: Perfetto's flow events v2 (`bind_id` one per lifetime, `flow_out`
//!   on the first point, `flow_in` and `flow_out` on the next ones), which its importer binds to
//!   the complete event that carries them (instants cannot carry flows there, hence `X`).
//!
//! - `gpu-trace --api`: the **calling thread's own track** (its real tid, in its process's
//!   group, named after the thread) holds each `API_CALL` (`--api-calls`) as a complete slice
//!   (`ph: "X"`) named after the symbol, from the call's entry (its return less its duration)
//!   to its return, args `library`, `caller`, `ret`, `depth`, `duration_ns`; each
//!   `API_RECURSION` as a thread-scoped instant; and each driver event that carries an `api`,
//!   also as a thread-scoped instant, which so falls inside the slice of its call. Calls nest
//!   by construction: an inner call returns (and is written) before its caller, and Perfetto
//!   sorts by `ts`.
//!
//! Events do not have to come in timestamp order (a live ring buffer delivers records from
//! different CPUs slightly out of order): the writer tolerates disorder. Perfetto sorts events by
//! `ts` itself; the one thing disorder could break is a slice, so an `E` or a point older than
//! its slice's `B` is placed at the `B` (its args keep the true `ts_ns`), and `otherData` counts
//! them as `placed_at_slice_begin`.
//!
//! Field names in args are those of the JSON lines output (docs/json-schema.md), plus `time`
//! (wall clock, UTC), `ts_ns` (CLOCK_MONOTONIC ns), `cpu`, `tid` and `comm` of the calling thread,
//! `amd` (the queue's properties) for AMD KFD events, and `api` (the API call the event happened
//! in) with `gpu-trace --api`.
//! `ts` is CLOCK_MONOTONIC in microseconds with nanosecond decimals.
//!
//! Perfetto's JSON importer reads keys in order and stops at an array inside an event, so
//! `traceEvents` comes first and no event holds an array (arrays in args are written as strings).

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap, HashSet},
    io::{self, Write},
    rc::Rc,
};

use chrono::SecondsFormat;
use serde_json::{Map, Value, json};

use crate::api::names::ApiEvent;
use crate::inventory::{Inventory, MpsRole};
use crate::model::gpus::GpuIdentity;
use crate::model::workload::Attribution;
use crate::sink::{ApiEnriched, Enriched, RunEnd, ShareBatch, Sink, SinkError};
use crate::{
    event::{Event, EventKind, GpuNumbering, TaskId},
    output::clock::Clock,
};

/// The first synthetic thread id of task tracks.
pub const TRACK_TID_BASE: u32 = 1 << 24;

/// The synthetic process that holds the per-GPU counter tracks.
pub const GPU_PID: u32 = 0x7fff_fff0;

/// The first synthetic pid of the per-GPU (per-runlist) track groups, in order of first use.
pub const GPU_GROUP_PID_BASE: u32 = 0x7ff0_0000;

/// Track groups of distinct (GPU, runlist) pairs; later pairs share one more group.
pub const MAX_GPU_GROUPS: u32 = 1024;

/// Tracks of one process (or one GPU's track group): a task alive beyond this many at once in
/// it is not drawn (`otherData` counts its `TASK_INIT` in `tasks_not_drawn` and each of its
/// events in `events_not_drawn`; a lifetime drawn in its process whose GPU group is full in
/// `gpu_slices_not_drawn`). A real process has a few dozen TSGs or queues alive at once.
pub const MAX_TRACKS_PER_PROCESS: usize = 1024;

/// Tracks of the whole timeline (all processes and GPU groups): the same rule past it. Bounds the
/// writer's memory whatever the input: each open slice costs about 200 bytes.
pub const MAX_TRACKS: u32 = 65_536;

/// Free tracks of a process looked at for a slice: a track freed after the slice begins (events
/// out of order) is passed over, and past this many such a new track is made.
const FREE_TRACKS_LOOKED_AT: usize = 8;

/// The category of every event gpu-trace writes.
const CATEGORY: &str = "gpu";

/// A task's identity for track bookkeeping (TaskId is not `Hash`).
type TaskKey = (u32, String);

struct Track {
    tid: u32,
    /// Its slot among its process's tracks.
    slot: usize,
    slice: String,
    /// When the slice began: nothing on the track is placed before it.
    begin_ns: u64,
    /// The GPU (RM device instance) whose live-task counter it is in.
    gpu: Option<u32>,
    /// The same lifetime's slice in its GPU's track group: (group pid, track, slot, slice
    /// name).
    on_gpu: Option<(u32, u32, usize, String)>,
    /// The lifetime's flow (`bind_id`), and whether a point of it was written yet.
    flow: u64,
    flowing: bool,
}

/// Where a lifetime runs: its GPU, runlist and owner (`<comm> <pid>`), for the GPU's track group.
struct GpuPlace {
    gpu: u32,
    runlist: Option<u32>,
    owner: String,
}

/// The tracks of one process (or GPU group).
#[derive(Default)]
struct Tracks {
    /// Track id of each slot, in the order made.
    tids: Vec<u32>,
    /// Free slots, and when the last slice on each ended.
    free: BTreeMap<usize, u64>,
    /// A task of it was not drawn because its tracks were all busy: tasks not open are drawn
    /// from their next event on (not from the trace's start).
    overflowed: bool,
}

/// Writes a Chrome JSON trace as events arrive; [`PerfettoWriter::finish`] closes it.
pub struct PerfettoWriter<W: Write> {
    out: W,
    clock: Clock,
    wrote_any: bool,
    /// `gpu-trace merge`: this node's place in a file that several nodes' writers share.
    node: Option<NodePlace>,
    /// Events placed at their track's begin because they came earlier (live ring order is not
    /// timestamp order across CPUs).
    clamped: u64,
    open: HashMap<TaskKey, Track>,
    named: HashSet<u32>,
    next_track: u32,
    /// Per process: its tracks (at most [`MAX_TRACKS_PER_PROCESS`]).
    tracks: HashMap<u32, Tracks>,
    /// Tasks not drawn because their process (or GPU group) had [`MAX_TRACKS_PER_PROCESS`]
    /// tracks busy or the timeline [`MAX_TRACKS`], and their events.
    tasks_not_drawn: u64,
    events_not_drawn: u64,
    /// Lifetimes drawn in their process but not in their GPU's group (its tracks all busy).
    gpu_slices_not_drawn: u64,
    /// Live tasks per GPU (the counter tracks).
    live_per_gpu: HashMap<u32, u64>,
    /// The track group of each (GPU, runlist) seen, by first use.
    gpu_groups: HashMap<(u32, Option<u32>), u32>,
    /// RM device instance → nvidia-smi's index, as the events' GPU identities said: the GPU
    /// groups and counters are keyed by the driver's number and named by this index.
    gpu_index: HashMap<u32, u32>,
    /// The GPU numbers are the driver's own ids (AMD's KFD `gpu_id`s; shown as they are).
    driver_gpu_ids: bool,
    /// Per GPU (`None`: not known): the `SCHEDULE`s of the last second, oldest first (their
    /// timestamps), and the latest written.
    schedules: BTreeMap<Option<u32>, RateWindow>,
    /// `SCHEDULE`s beyond [`MAX_RATE_WINDOW`] in a second on one GPU: counted in its counter
    /// but without their step down (said in `otherData`).
    rate_window_full: u64,
    next_flow: u64,
    /// Thread tracks named (`gpu-trace --api`: the calling threads' tracks), at most
    /// [`MAX_TRACKS`]; later ones are drawn unnamed.
    threads_named: HashSet<u32>,
}

/// At most this many `SCHEDULE`s of one GPU within a second are remembered for their step down
/// (8 MiB): a process issuing more is counted, without a step down for the excess.
pub const MAX_RATE_WINDOW: usize = 1 << 20;

/// One GPU's `schedules/s` counter: the timestamps of the `SCHEDULE`s of the last second.
#[derive(Default)]
struct RateWindow {
    window: std::collections::VecDeque<u64>,
    /// `SCHEDULE`s past [`MAX_RATE_WINDOW`], counted and never stepped down.
    extra: u64,
    latest_ns: u64,
}

impl RateWindow {
    fn count(&self) -> u64 {
        self.window.len() as u64 + self.extra
    }

    /// Removes the schedules whose second has ended by `ts_ns`; returns the counter's points
    /// (step downs at each one's end, a second after it).
    fn expire(&mut self, ts_ns: u64) -> Vec<(u64, u64)> {
        let mut points = Vec::new();
        while let Some(&first) = self.window.front() {
            let end = first.saturating_add(1_000_000_000);
            if end > ts_ns {
                break;
            }
            self.window.pop_front();
            points.push((end, self.count()));
        }
        points
    }
}

/// Microseconds with three decimals, exactly (no float rounding).
fn ts_us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// The JSON value with every array replaced by its JSON text (Perfetto's importer rejects
/// arrays inside events).
fn without_arrays(v: Value) -> Value {
    match v {
        Value::Array(a) => Value::String(Value::Array(a).to_string()),
        Value::Object(m) => {
            Value::Object(m.into_iter().map(|(k, v)| (k, without_arrays(v))).collect())
        }
        other => other,
    }
}

fn task_key(pid: u32, task: TaskId) -> TaskKey {
    (pid, format!("{task:?}"))
}

/// The Perfetto sink (`--perfetto FILE`): the timeline written alongside the output; process
/// tracks named by the process and, where known, its container or pod.
pub struct PerfettoSink {
    /// `None` once finished.
    writer: Option<PerfettoWriter<Box<dyn Write>>>,
    clock: Clock,
    /// A node of a merged file: where its end goes (the file is closed by
    /// [`MergedTimeline::finish`]).
    merged: Option<(String, Rc<RefCell<Vec<NodeEnd>>>)>,
}

impl PerfettoSink {
    pub fn new(writer: PerfettoWriter<Box<dyn Write>>, clock: Clock) -> Self {
        Self {
            writer: Some(writer),
            clock,
            merged: None,
        }
    }
}

/// What the writers of a merged file share: whether an event was written yet (the commas),
/// the next pid/tid and the next flow id.
#[derive(Default)]
struct MergedIds {
    wrote_any: bool,
    next_id: u32,
    next_flow: u64,
}

/// One node's place in a merged file.
struct NodePlace {
    /// The node's name (escaped), leading its track groups' names.
    host: String,
    /// Added to the node's CLOCK_MONOTONIC timestamps: its realtime offset less the file's
    /// base, so that `ts` is real time less the base on every node.
    shift_ns: u64,
    /// The node's pids and tids (real ones and the writer's synthetic ones) → the file's.
    ids: HashMap<u32, u32>,
    shared: Rc<RefCell<MergedIds>>,
}

/// How a node's part of a merged file ended, for `otherData`.
struct NodeEnd {
    host: String,
    offset_ns: i128,
    dropped: String,
    counts: Vec<(&'static str, u64)>,
}

/// `gpu-trace merge --perfetto`: one timeline of several nodes' recordings. Each node gets a
/// [`PerfettoSink`] of its own ([`Self::node`]; its pipeline's events, as a single run's
/// writer draws them) writing into the one file, where
/// - `ts` is real time (the node's CLOCK_MONOTONIC plus its realtime offset) less `base_ns`,
///   the same axis for every node (`otherData.realtime_base_ns`);
/// - every pid and tid (real or synthetic) is a number of the file's own per node, from 1 up
///   in order of first use, so that two nodes' processes, tracks, GPU groups and counters never
///   share one; flow ids are unique in the file;
/// - every track group's name leads with its node's (`node-a: python3 [pod ns/name] pid 427`,
///   `node-a: GPU 0 runlist 1`, `node-a: GPUs`), and a traced process's name ends with its real
///   pid. Chrome's JSON format has no nested groups: node → pod → process is in the name, the
///   tasks are the tracks inside.
pub struct MergedTimeline {
    out: super::Shared<Box<dyn Write>>,
    ids: Rc<RefCell<MergedIds>>,
    base_ns: i128,
    ends: Rc<RefCell<Vec<NodeEnd>>>,
}

impl MergedTimeline {
    /// Starts the file. `base_ns`: the real time (ns) that `ts` 0 stands for, at most every
    /// node's realtime offset (so that no `ts` is negative).
    pub fn new(mut out: Box<dyn Write>, base_ns: i128) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[")?;
        Ok(Self {
            out: super::Shared::new(out),
            ids: Rc::default(),
            base_ns,
            ends: Rc::default(),
        })
    }

    /// The sink of node `host`, whose recording's clock is `clock`.
    pub fn node(&self, host: &str, clock: Clock) -> PerfettoSink {
        let shift = clock.offset_ns().saturating_sub(self.base_ns).max(0);
        let place = NodePlace {
            host: crate::escape::escape_text(host).into_owned(),
            shift_ns: u64::try_from(shift).unwrap_or(u64::MAX),
            ids: HashMap::new(),
            shared: self.ids.clone(),
        };
        let out: Box<dyn Write> = Box::new(self.out.clone());
        let writer = PerfettoWriter::for_node(out, clock.clone(), place);
        PerfettoSink {
            writer: Some(writer),
            clock,
            merged: Some((host.to_string(), self.ends.clone())),
        }
    }

    /// Closes the file once every node's sink has finished: `otherData` says the nodes, the
    /// base and each node's offset, drops and counts (keys `HOST.dropped`, …).
    pub fn finish(self) -> io::Result<Box<dyn Write>> {
        let mut other = Map::new();
        other.insert(
            "tool".into(),
            format!("gpu-trace {} merge", env!("CARGO_PKG_VERSION")).into(),
        );
        other.insert(
            "clock".into(),
            "real time less realtime_base_ns (ts in microseconds)".into(),
        );
        other.insert("realtime_base_ns".into(), self.base_ns.to_string().into());
        let ends = std::mem::take(&mut *self.ends.borrow_mut());
        let hosts: Vec<&str> = ends.iter().map(|e| e.host.as_str()).collect();
        other.insert("nodes".into(), hosts.join(", ").into());
        for end in &ends {
            let h = &end.host;
            other.insert(
                format!("{h}.realtime_offset_ns"),
                end.offset_ns.to_string().into(),
            );
            other.insert(format!("{h}.dropped"), end.dropped.clone().into());
            for (k, v) in &end.counts {
                other.insert(format!("{h}.{k}"), v.to_string().into());
            }
        }
        let mut out = self
            .out
            .into_inner()
            .map_err(|_| io::Error::other("a node's timeline writer is still open"))?;
        write!(out, "\n],\n\"otherData\":{}}}\n", Value::Object(other))?;
        out.flush()?;
        Ok(out)
    }
}

impl Sink for PerfettoSink {
    /// Names and labels the processes that had a GPU open before tracing.
    fn inventory(&mut self, inv: &Inventory, _selected: &Inventory) -> Result<(), SinkError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        for p in &inv.processes {
            let label = match p.mps {
                Some(MpsRole::Server) => "GPU open before tracing; MPS server",
                Some(MpsRole::Control) => "GPU open before tracing; MPS control",
                None => "GPU open before tracing",
            };
            w.process_label(p.pid, &p.comm, label)
                .map_err(SinkError::Perfetto)?;
        }
        Ok(())
    }

    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        let written = match ev.cgroup.and_then(Attribution::group) {
            // The process track's name says where it runs.
            Some(group) => w.event_on(
                ev.event,
                ev.gpu,
                &format!("{} [{group}]", ev.process),
                ev.trace_start_ns,
            ),
            None => w.event_on(ev.event, ev.gpu, ev.process, ev.trace_start_ns),
        };
        written.map_err(SinkError::Perfetto)
    }

    /// Each process's GPU-share counter track (`GPU share (gpu N)`, percent): at the batch's
    /// newest sample, its share over the last second (5 sampling points on an H100).
    fn shares(&mut self, batch: &ShareBatch<'_>) -> Result<(), SinkError> {
        let (Some(w), Some(newest)) = (
            self.writer.as_mut(),
            batch.samples.iter().map(|s| s.sample.ts_us).max(),
        ) else {
            return Ok(());
        };
        // On the driver events' clock (monotonic): a sample older than this machine's boot
        // (a capture replayed days later) gets a negative time rather than none.
        let mono_ns = i128::from(newest) * 1000 - self.clock.offset_ns();
        for (gpu, pid, ratio) in batch.model.recent(1_000_000) {
            w.share_counter(mono_ns, gpu, pid, ratio)
                .map_err(SinkError::Perfetto)?;
        }
        Ok(())
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        let process = match ev.cgroup.and_then(Attribution::group) {
            Some(group) => format!("{} [{group}]", ev.process),
            None => ev.process.to_string(),
        };
        w.api(ev, &process).map_err(SinkError::Perfetto)
    }

    fn finish(&mut self, end: &RunEnd<'_>) -> Result<(), SinkError> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        let dropped = if end.stats.kernel_unknown {
            "unknown".to_string()
        } else {
            end.counters.dropped.to_string()
        };
        if let Some((host, ends)) = &self.merged {
            let counts = w.finish_node(end.last_ts).map_err(SinkError::Perfetto)?;
            ends.borrow_mut().push(NodeEnd {
                host: host.clone(),
                offset_ns: self.clock.offset_ns(),
                dropped,
                counts,
            });
            return Ok(());
        }
        let other = [
            ("tool", format!("gpu-trace {}", env!("CARGO_PKG_VERSION"))),
            ("clock", "CLOCK_MONOTONIC (ts in microseconds)".to_string()),
            ("realtime_offset_ns", self.clock.offset_ns().to_string()),
            ("dropped", dropped),
        ];
        w.finish(end.last_ts, &other)
            .map(drop)
            .map_err(SinkError::Perfetto)
    }
}

/// The slice and track name of a task: `TSG 0x5c000015`, `TSG 12` (hardware id), `queue 3`.
pub fn task_label(task: TaskId) -> String {
    match task {
        TaskId::KfdQueue(_) => format!("queue {}", task.label()),
        TaskId::Unknown => "TSGs created before tracing".to_string(),
        _ => format!("TSG {}", task.label()),
    }
}

impl<W: Write> PerfettoWriter<W> {
    /// Starts the file. `clock` converts timestamps to wall-clock time for the args.
    pub fn new(mut out: W, clock: Clock) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[")?;
        Ok(Self::new_unstarted(out, clock))
    }

    fn new_unstarted(out: W, clock: Clock) -> Self {
        Self {
            out,
            clock,
            wrote_any: false,
            node: None,
            clamped: 0,
            open: HashMap::new(),
            named: HashSet::new(),
            next_track: 0,
            tracks: HashMap::new(),
            tasks_not_drawn: 0,
            events_not_drawn: 0,
            gpu_slices_not_drawn: 0,
            live_per_gpu: HashMap::new(),
            gpu_groups: HashMap::new(),
            gpu_index: HashMap::new(),
            driver_gpu_ids: false,
            schedules: BTreeMap::new(),
            rate_window_full: 0,
            next_flow: 0,
            threads_named: HashSet::new(),
        }
    }

    /// The file's id of this node's pid or tid `raw` (real, or synthetic as [`GPU_PID`]): itself
    /// in a file of one run; in a merged file, a number of its own per node and id, so that
    /// no two nodes' processes or tracks share one.
    fn id(&mut self, raw: u32) -> u32 {
        match &mut self.node {
            None => raw,
            Some(n) => *n.ids.entry(raw).or_insert_with(|| {
                let mut shared = n.shared.borrow_mut();
                shared.next_id += 1;
                shared.next_id
            }),
        }
    }

    /// The next flow id (`bind_id`): unique in the file, across nodes too.
    fn new_flow(&mut self) -> u64 {
        match &self.node {
            None => {
                self.next_flow += 1;
                self.next_flow - 1
            }
            Some(n) => {
                let mut shared = n.shared.borrow_mut();
                shared.next_flow += 1;
                shared.next_flow - 1
            }
        }
    }

    /// `ts` of an event at `ns` (this node's CLOCK_MONOTONIC): on a merged file's time axis,
    /// shifted by the node's [`NodePlace::shift_ns`].
    fn ts(&self, ns: u64) -> String {
        ts_us(ns.saturating_add(self.node.as_ref().map_or(0, |n| n.shift_ns)))
    }

    /// The name of a traced process's track group: in a merged file, with its real pid (the
    /// file's pid is a number of its own).
    fn process_title(&self, pid: u32, name: &str) -> String {
        match &self.node {
            None => name.to_string(),
            Some(_) => format!("{name} pid {pid}"),
        }
    }

    /// A writer of node `host`'s events into a merged file ([`MergedTimeline::node`]): the
    /// file's start is not written again, and its pids, tids, flows and times are the file's.
    fn for_node(out: W, clock: Clock, place: NodePlace) -> Self {
        let mut w = Self::new_unstarted(out, clock);
        w.node = Some(place);
        w
    }

    fn write_event(&mut self, fields: &str) -> io::Result<()> {
        let first = match &self.node {
            Some(n) => !std::mem::replace(&mut n.shared.borrow_mut().wrote_any, true),
            None => !std::mem::replace(&mut self.wrote_any, true),
        };
        self.out.write_all(if first { b"\n" } else { b",\n" })?;
        // The one escaping rule (output/escape.rs): no bidi, invisible or control character
        // reaches the file raw, whatever field holds it.
        let line = crate::escape::json_terminal_safe(fields.to_string());
        self.out.write_all(line.as_bytes())
    }

    /// Late attach: names a process of the start-up inventory and labels it (Perfetto shows
    /// `process_labels` next to the process name).
    pub fn process_label(&mut self, pid: u32, comm: &str, label: &str) -> io::Result<()> {
        if self.named.insert(pid) {
            let title = self.process_title(pid, &crate::escape::escape_text(comm));
            self.metadata("process_name", pid, 0, &title)?;
        }
        let pid = self.id(pid);
        let line = format!(
            "{{\"ph\":\"M\",\"name\":\"process_labels\",\"pid\":{pid},\"tid\":0,\"args\":{{\"labels\":{}}}}}",
            Value::from(label)
        );
        self.write_event(&line)
    }

    fn metadata(&mut self, name: &str, pid: u32, tid: u32, value: &str) -> io::Result<()> {
        // A merged file: each process's name leads with its node's.
        let value = match &self.node {
            Some(n) if name == "process_name" => format!("{}: {value}", n.host),
            _ => value.to_string(),
        };
        let (pid, tid) = (self.id(pid), if tid == 0 { 0 } else { self.id(tid) });
        let line = format!(
            "{{\"ph\":\"M\",\"name\":\"{name}\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
            Value::from(value)
        );
        self.write_event(&line)
    }

    /// A `B` or `E` of a slice on track `tid` of `pid`.
    fn edge(
        &mut self,
        ph: &str,
        ts_ns: u64,
        track: (u32, u32),
        name: &str,
        args: Value,
    ) -> io::Result<()> {
        self.on_track((ph, ""), ts_ns, track, name, args)
    }

    /// An event of phase `ph` on track `tid` of `pid`; `extra`: its own fields (each with
    /// its comma after it) before `args`.
    fn on_track(
        &mut self,
        (ph, extra): (&str, &str),
        ts_ns: u64,
        (pid, tid): (u32, u32),
        name: &str,
        args: Value,
    ) -> io::Result<()> {
        let line = format!(
            "{{\"ph\":\"{ph}\",\"ts\":{},\"pid\":{},\"tid\":{},\"name\":{},\"cat\":\"{CATEGORY}\",{extra}\"args\":{}}}",
            self.ts(ts_ns),
            self.id(pid),
            self.id(tid),
            Value::from(name),
            without_arrays(args)
        );
        self.write_event(&line)
    }

    /// An event of process `pid` that belongs to no task: a process-scoped instant.
    fn process_instant(&mut self, ts_ns: u64, pid: u32, name: &str, args: Value) -> io::Result<()> {
        let pid = self.id(pid);
        let line = format!(
            "{{\"ph\":\"i\",\"ts\":{},\"pid\":{pid},\"tid\":{pid},\"name\":{},\"cat\":\"{CATEGORY}\",\"s\":\"p\",\"args\":{}}}",
            self.ts(ts_ns),
            Value::from(name),
            without_arrays(args)
        );
        self.write_event(&line)
    }

    /// The event's fields as in the JSON lines output, plus the calling thread.
    fn fields(&self, ev: &Event, gpu: Option<&GpuIdentity>) -> Value {
        let mut m = match serde_json::to_value(&ev.kind) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        // `gpu` (and NVIDIA's `rm_device`) as the JSON lines write them.
        if let Some(driver) = ev.kind.driver_gpu() {
            match ev.gpu_numbering() {
                GpuNumbering::Driver => {
                    m.insert("gpu".into(), driver.into());
                }
                GpuNumbering::RmDevice => {
                    m.insert("gpu".into(), gpu.map(|g| g.index).into());
                    m.insert("rm_device".into(), driver.into());
                }
            }
        }
        // The timeline's args carry the errno as a number only.
        m.remove("errno_name");
        let o = &ev.origin;
        m.insert(
            "time".into(),
            self.clock
                .utc(o.ts_ns)
                .to_rfc3339_opts(SecondsFormat::Micros, true)
                .into(),
        );
        m.insert("ts_ns".into(), o.ts_ns.into());
        if let Ok(Value::Object(ids)) = serde_json::to_value(ev.identity()) {
            m.extend(ids);
        }
        m.insert("cpu".into(), o.cpu().into());
        m.insert("tid".into(), o.tid.into());
        let comm = o.comm().json();
        m.insert("comm".into(), comm.comm.into());
        if let Some(bytes) = comm.comm_bytes {
            m.insert("comm_bytes".into(), bytes.into_owned().into());
        }
        if let Some(amd) = ev.amd.as_ref().and_then(|a| serde_json::to_value(a).ok()) {
            m.insert("amd".into(), amd);
        }
        if let Some(api) = ev.api.as_ref().and_then(|a| serde_json::to_value(a).ok()) {
            m.insert("api".into(), api);
        }
        Value::Object(m)
    }

    fn name_process(&mut self, pid: u32, process_name: &str) -> io::Result<()> {
        if self.named.insert(pid) {
            let title = self.process_title(pid, process_name);
            self.metadata_escaped("process_name", (pid, pid), &title)?;
        }
        Ok(())
    }

    /// Metadata `name` naming a track: `value` shown as the text output shows it (escape.rs):
    /// `\xNN` for a byte that is not UTF-8 and for each byte of a hidden character.
    fn metadata_escaped(
        &mut self,
        name: &str,
        (pid, tid): (u32, u32),
        value: &str,
    ) -> io::Result<()> {
        self.metadata(name, pid, tid, &crate::escape::escape_text(value))
    }

    /// A track of process `pid` for a slice beginning at `ts_ns`: the lowest one free since
    /// then (of the first few free ones), else a new one (named `<kind> slot N`); `None` when
    /// the process has [`MAX_TRACKS_PER_PROCESS`] busy or the timeline [`MAX_TRACKS`].
    /// Amortized O(log tracks): a process's free tracks are kept in order.
    fn take_track(
        &mut self,
        pid: u32,
        task: TaskId,
        ts_ns: u64,
    ) -> io::Result<Option<(u32, usize)>> {
        if self.next_track >= MAX_TRACKS && !self.tracks.contains_key(&pid) {
            // A full timeline remembers nothing more per process.
            return Ok(None);
        }
        let tracks = self.tracks.entry(pid).or_default();
        let found = tracks
            .free
            .iter()
            .take(FREE_TRACKS_LOOKED_AT)
            .find(|&(_, &end)| end <= ts_ns)
            .map(|(&slot, _)| slot);
        if let Some(slot) = found {
            tracks.free.remove(&slot);
            return Ok(Some((tracks.tids[slot], slot)));
        }
        if tracks.tids.len() >= MAX_TRACKS_PER_PROCESS || self.next_track >= MAX_TRACKS {
            tracks.overflowed = true;
            return Ok(None);
        }
        let tid = TRACK_TID_BASE + self.next_track;
        self.next_track += 1;
        let slot = tracks.tids.len();
        tracks.tids.push(tid);
        let kind = match task {
            TaskId::KfdQueue(_) => "queue",
            _ => "TSG",
        };
        self.metadata(
            "thread_name",
            pid,
            tid,
            &format!("{kind} slot {}", slot + 1),
        )?;
        Ok(Some((tid, slot)))
    }

    /// Opens a slice for `task` at `ts_ns` on a free track of its process, and where its GPU
    /// is known, the same lifetime on a track of the GPU's group.
    fn open_track(
        &mut self,
        pid: u32,
        task: TaskId,
        ts_ns: u64,
        slice: &str,
        place: Option<GpuPlace>,
        args: Value,
    ) -> io::Result<Option<u32>> {
        let Some((tid, slot)) = self.take_track(pid, task, ts_ns)? else {
            return Ok(None);
        };
        self.edge("B", ts_ns, (pid, tid), slice, args)?;
        let mut on_gpu = None;
        if let Some(p) = &place {
            let group = self.gpu_group(p.gpu, p.runlist)?;
            // A GPU group with every track busy shows the lifetime in its process only.
            if let Some((track, gslot)) = self.take_track(group, task, ts_ns)? {
                let name = format!("{}: {slice}", p.owner);
                self.edge("B", ts_ns, (group, track), &name, json!({}))?;
                on_gpu = Some((group, track, gslot, name));
            } else {
                self.gpu_slices_not_drawn += 1;
            }
        }
        let flow = self.new_flow();
        self.open.insert(
            task_key(pid, task),
            Track {
                tid,
                slot,
                slice: slice.to_string(),
                begin_ns: ts_ns,
                gpu: place.as_ref().map(|p| p.gpu),
                on_gpu,
                flow,
                flowing: false,
            },
        );
        if let Some(p) = place {
            self.count_live(p.gpu, ts_ns, 1)?;
        }
        Ok(Some(tid))
    }

    /// The track group of GPU `gpu` (and runlist, where known), named at first use.
    fn gpu_group(&mut self, gpu: u32, runlist: Option<u32>) -> io::Result<u32> {
        if let Some(&pid) = self.gpu_groups.get(&(gpu, runlist)) {
            return Ok(pid);
        }
        // A recording can name any number of (GPU, runlist) pairs: past the cap they share
        // one group and are not remembered (a real host has a few GPUs, a few dozen runlists).
        let n = self.gpu_groups.len() as u32;
        let (pid, name) = if n < MAX_GPU_GROUPS {
            let label = self.gpu_label(gpu);
            let name = match runlist {
                Some(r) => format!("GPU {label} runlist {r}"),
                None => format!("GPU {label}"),
            };
            self.gpu_groups
                .insert((gpu, runlist), GPU_GROUP_PID_BASE + n);
            (GPU_GROUP_PID_BASE + n, name)
        } else {
            (
                GPU_GROUP_PID_BASE + MAX_GPU_GROUPS,
                format!("other GPUs and runlists (past {MAX_GPU_GROUPS})"),
            )
        };
        if !self.named.insert(pid) {
            return Ok(pid);
        }
        self.metadata("process_name", pid, 0, &name)?;
        Ok(pid)
    }

    fn close_track(&mut self, pid: u32, track: Track, ts_ns: u64, args: Value) -> io::Result<()> {
        let ts = self.not_before(ts_ns, track.begin_ns);
        self.edge("E", ts, (pid, track.tid), &track.slice, args)?;
        self.free_track(pid, track.slot, ts);
        if let Some((group, tid, slot, name)) = &track.on_gpu {
            self.edge("E", ts, (*group, *tid), name, json!({}))?;
            self.free_track(*group, *slot, ts);
        }
        if let Some(g) = track.gpu {
            self.count_live(g, ts, -1)?;
        }
        Ok(())
    }

    /// Track `slot` of `pid` is free from `ts_ns` on.
    fn free_track(&mut self, pid: u32, slot: usize, ts_ns: u64) {
        if let Some(t) = self.tracks.get_mut(&pid) {
            t.free.insert(slot, ts_ns);
        }
    }

    /// A zero-length complete event on `key`'s open track, the next step of its lifetime's
    /// flow (see the module's documentation).
    fn point(&mut self, ts_ns: u64, key: &TaskKey, name: &str, args: Value) -> io::Result<()> {
        let pid = key.0;
        let Some(track) = self.open.get_mut(key) else {
            self.events_not_drawn += 1;
            return Ok(());
        };
        let (tid, flow, flow_in, begin) = (track.tid, track.flow, track.flowing, track.begin_ns);
        track.flowing = true;
        let ts = self.not_before(ts_ns, begin);
        let (pid, tid) = (self.id(pid), self.id(tid));
        let line = format!(
            "{{\"ph\":\"X\",\"ts\":{},\"dur\":0,\"pid\":{pid},\"tid\":{tid},\"name\":{},\"cat\":\"{CATEGORY}\",\"bind_id\":{flow},{}\"flow_out\":true,\"args\":{}}}",
            self.ts(ts),
            Value::from(name),
            if flow_in { "\"flow_in\":true," } else { "" },
            without_arrays(args)
        );
        self.write_event(&line)
    }

    /// The live-task counter of GPU `gpu` moves by `delta` at `ts_ns`.
    fn count_live(&mut self, gpu: u32, ts_ns: u64, delta: i64) -> io::Result<()> {
        let n = self.live_per_gpu.entry(gpu).or_default();
        *n = n.saturating_add_signed(delta);
        let value = *n;
        let name = format!("live tasks GPU {}", self.gpu_label(gpu));
        self.counter(ts_ns, &name, "live", value)
    }

    /// How the timeline names GPU `driver` (the driver's number: RM device instance, KFD
    /// `gpu_id`): NVIDIA by nvidia-smi's index, `? (RM device N)` while that is not known
    /// (never a guess; two such GPUs stay apart); AMD by its `gpu_id`.
    fn gpu_label(&self, driver: u32) -> String {
        match self.gpu_index.get(&driver) {
            _ if self.driver_gpu_ids => driver.to_string(),
            Some(index) => index.to_string(),
            None => format!("? (RM device {driver})"),
        }
    }

    /// A point of counter `name` (series `series`) in the `GPUs` process, named at first use.
    fn counter(&mut self, ts_ns: u64, name: &str, series: &str, value: u64) -> io::Result<()> {
        if self.named.insert(GPU_PID) {
            self.metadata("process_name", GPU_PID, 0, "GPUs")?;
        }
        let line = format!(
            "{{\"ph\":\"C\",\"ts\":{},\"pid\":{},\"tid\":0,\"name\":{},\"cat\":\"{CATEGORY}\",\"args\":{{\"{series}\":{value}}}}}",
            self.ts(ts_ns),
            self.id(GPU_PID),
            Value::from(name)
        );
        self.write_event(&line)
    }

    /// A point of process `pid`'s counter track `GPU share (gpu N)`: the share in percent.
    pub fn share_counter(&mut self, ts_ns: i128, gpu: u32, pid: u32, ratio: f64) -> io::Result<()> {
        let ts_ns = ts_ns + i128::from(self.node.as_ref().map_or(0, |n| n.shift_ns));
        let pid = self.id(pid);
        let abs = u64::try_from(ts_ns.unsigned_abs()).unwrap_or(u64::MAX);
        let sign = if ts_ns < 0 { "-" } else { "" };
        let line = format!(
            "{{\"ph\":\"C\",\"ts\":{sign}{},\"pid\":{pid},\"tid\":0,\"name\":\"GPU share (gpu {gpu})\",\"cat\":\"{CATEGORY}\",\"args\":{{\"share_percent\":{:.1}}}}}",
            ts_us(abs),
            ratio * 100.0
        );
        self.write_event(&line)
    }

    /// `ts_ns`, or `begin_ns` when the event is older than the slice it belongs in (counted).
    fn not_before(&mut self, ts_ns: u64, begin_ns: u64) -> u64 {
        if ts_ns < begin_ns {
            self.clamped += 1;
            begin_ns
        } else {
            ts_ns
        }
    }

    /// The open track of `task`, opened at `trace_start_ns` if the task was created before the
    /// trace started (at `ts_ns` if its process ran out of tracks before: it may be a task that
    /// was not drawn then); `None` when it cannot be drawn.
    fn track_of(
        &mut self,
        pid: u32,
        task: TaskId,
        ts_ns: u64,
        trace_start_ns: u64,
    ) -> io::Result<Option<u32>> {
        if let Some(t) = self.open.get(&task_key(pid, task)) {
            return Ok(Some(t.tid));
        }
        let name = task_label(task);
        let full =
            self.tracks.get(&pid).is_some_and(|t| t.overflowed) || self.next_track >= MAX_TRACKS;
        let (begin, note) = if full {
            (
                ts_ns,
                "drawn from here: began earlier, while its process had every track busy or \
                 was created before the trace started",
            )
        } else {
            (trace_start_ns, "created before the trace started")
        };
        self.open_track(pid, task, begin, &name, None, json!({ "note": note }))
    }

    /// Writes one event. `process_name` names the process's track group; `trace_start_ns` is
    /// the timestamp of the first record of the trace.
    pub fn event(&mut self, ev: &Event, process_name: &str, trace_start_ns: u64) -> io::Result<()> {
        self.event_on(ev, None, process_name, trace_start_ns)
    }

    /// [`event`](Self::event) of a task on GPU `gpu`, as the pipeline named it (`None`: not
    /// known): the GPU's group, counters and the event's `gpu` go by its nvidia-smi index.
    pub fn event_on(
        &mut self,
        ev: &Event,
        gpu: Option<&GpuIdentity>,
        process_name: &str,
        trace_start_ns: u64,
    ) -> io::Result<()> {
        if let Some(g) = gpu {
            self.gpu_index.insert(g.rm_device, g.index);
        }
        self.driver_gpu_ids |= ev.gpu_numbering() == crate::event::GpuNumbering::Driver;
        let pid = ev.origin.pid;
        let ts = ev.origin.ts_ns;
        self.name_process(pid, process_name)?;
        let task = ev.kind.task();
        let fields = self.fields(ev, gpu);
        if ev.api.is_some() {
            // Inside an API call: also on the thread's own track, where the call's slice is.
            let o = &ev.origin;
            self.name_thread(pid, o.tid, &o.comm)?;
            self.thread_instant(ts, (pid, o.tid), ev.kind.name(), fields.clone())?;
        }
        if matches!(task, TaskId::KfdNoQueue) {
            return self.process_instant(ts, pid, ev.kind.name(), fields);
        }
        let key = task_key(pid, task);
        match &ev.kind {
            EventKind::TaskInit { gpu, runlist, .. } => {
                if let Some(old) = self.open.remove(&key) {
                    self.close_track(
                        pid,
                        old,
                        ts,
                        json!({"note": "superseded by a new TASK_INIT of the same id"}),
                    )?;
                }
                let slice = match fields.get("engine").and_then(Value::as_str).or_else(|| {
                    fields
                        .get("amd")
                        .and_then(|a| a.get("queue_type"))
                        .and_then(Value::as_str)
                }) {
                    Some(engine) => format!("{} {engine}", task_label(task)),
                    None => task_label(task),
                };
                let place = gpu.map(|gpu| GpuPlace {
                    gpu,
                    runlist: *runlist,
                    owner: format!("{} {pid}", crate::escape::escape_text(process_name)),
                });
                if self
                    .open_track(pid, task, ts, &slice, place, json!({ "task_init": fields }))?
                    .is_none()
                {
                    self.tasks_not_drawn += 1;
                }
                self.point(ts, &key, ev.kind.name(), fields)?;
            }
            // PRETRACE_END closes a "TSGs created before tracing" slice opened at the start.
            EventKind::TaskDestroy { .. } | EventKind::PretraceEnd { .. } => {
                self.track_of(pid, task, ts, trace_start_ns)?;
                match self.open.remove(&key) {
                    Some(track) => {
                        self.close_track(pid, track, ts, json!({ "task_destroy": fields }))?
                    }
                    None => self.events_not_drawn += 1,
                }
            }
            _ => {
                self.track_of(pid, task, ts, trace_start_ns)?;
                if matches!(ev.kind, EventKind::Schedule { .. }) {
                    let gpu = self.open.get(&key).and_then(|t| t.gpu);
                    self.count_schedule(gpu, ts)?;
                }
                self.point(ts, &key, ev.kind.name(), fields)?;
            }
        }
        Ok(())
    }

    /// Names thread `tid`'s track (`thread_name`: its name, escaped) the first time it is
    /// drawn on, up to [`MAX_TRACKS`] threads.
    fn name_thread(&mut self, pid: u32, tid: u32, comm: &str) -> io::Result<()> {
        if self.threads_named.len() < MAX_TRACKS as usize && self.threads_named.insert(tid) {
            self.metadata_escaped("thread_name", (pid, tid), comm)?;
        }
        Ok(())
    }

    /// A thread-scoped instant on the calling thread's own track (`gpu-trace --api`): a
    /// driver event made inside an API call, which so nests in that call's slice, or an
    /// `API_RECURSION`.
    fn thread_instant(
        &mut self,
        ts_ns: u64,
        thread: (u32, u32),
        name: &str,
        args: Value,
    ) -> io::Result<()> {
        self.on_track(("i", "\"s\":\"t\","), ts_ns, thread, name, args)
    }

    /// An API record of the main trace (`gpu-trace --api`) on its thread's track: an
    /// `API_CALL` as a complete slice (`ph: "X"`) from its entry (the record's time, its
    /// return, less its duration) to its return, named after the symbol; an `API_RECURSION`
    /// as an instant. A thread's calls nest by construction (an inner call returns first and
    /// is written first: Perfetto sorts by `ts`). `process_name` names the process's track
    /// group. A process's sums (`API_STATS`) are not drawn.
    pub fn api(&mut self, ev: &ApiEnriched<'_>, process_name: &str) -> io::Result<()> {
        use crate::api::events::site_text;
        // A call or a recursion (a verdict or a hand-out is no moment of a thread).
        if ev.event.site().is_none() {
            return Ok(());
        }
        let o = ev.origin;
        let (pid, tid, ts_ns) = (o.pid, o.tid, o.ts_ns);
        self.name_process(pid, process_name)?;
        self.name_thread(pid, tid, &o.comm)?;
        let mut args = json!({
            "time": self.clock.utc(ts_ns).to_rfc3339_opts(SecondsFormat::Micros, true),
            "ts_ns": ts_ns,
            "cpu": o.cpu(),
            "tid": tid,
            "comm": crate::escape::lossy(&o.comm),
        });
        match ev.event {
            ApiEvent::Call(e) => {
                args["library"] = crate::escape::lossy(&e.site.library).into();
                args["caller"] = e.caller.as_ref().map(site_text).into();
                args["ret"] = (e.ret as u32 as i32).into();
                args["depth"] = e.depth.into();
                args["duration_ns"] = e.duration_ns.into();
                let begin = ts_ns.saturating_sub(e.duration_ns);
                let dur = format!("\"dur\":{},", ts_us(ts_ns - begin));
                let name = crate::escape::escape_text(&e.site.symbol);
                self.on_track(("X", &dur), begin, (pid, tid), &name, args)
            }
            ApiEvent::Recursion(e) => {
                args["symbol"] = crate::escape::lossy(&e.site.symbol).into();
                args["library"] = crate::escape::lossy(&e.site.library).into();
                args["why"] = crate::api::events::why(e).into();
                args["depth"] = e.depth.into();
                let chain: Vec<String> = e.chain.iter().map(site_text).collect();
                args["chain"] = chain.join(" > ").into();
                self.thread_instant(ts_ns, (pid, tid), "API_RECURSION", args)
            }
            ApiEvent::Stuck(e) => {
                args["symbol"] = crate::escape::lossy(&e.site.symbol).into();
                args["library"] = crate::escape::lossy(&e.site.library).into();
                args["open_ns"] = e.open_ns.into();
                self.thread_instant(ts_ns, (pid, tid), "API_STUCK", args)
            }
            ApiEvent::Stats(_) | ApiEvent::Path(_) | ApiEvent::Handout(_) => Ok(()),
        }
    }

    /// `schedules/s GPU N` at a `SCHEDULE` at `ts_ns`: the steps down of the schedules that
    /// left the last second by then, and this one's step up. Timestamps are kept in order on
    /// each counter (a record older than the counter's latest point counts at that point).
    fn count_schedule(&mut self, gpu: Option<u32>, ts_ns: u64) -> io::Result<()> {
        let w = self.schedules.entry(gpu).or_default();
        let ts = ts_ns.max(w.latest_ns);
        let mut points = w.expire(ts);
        if w.window.len() < MAX_RATE_WINDOW {
            w.window.push_back(ts);
        } else {
            self.rate_window_full += 1;
            w.extra += 1;
        }
        w.latest_ns = ts;
        points.push((ts, w.count()));
        self.rate_points(gpu, &points)
    }

    /// Writes points of GPU `gpu`'s `schedules/s` counter.
    fn rate_points(&mut self, gpu: Option<u32>, points: &[(u64, u64)]) -> io::Result<()> {
        let name = match gpu {
            Some(g) => format!("schedules/s GPU {}", self.gpu_label(g)),
            None => "schedules/s GPU ?".to_string(),
        };
        for &(ts, n) in points {
            self.counter(ts, &name, "schedules", n)?;
        }
        Ok(())
    }

    /// The steps down still due at the end: each schedule's second ends (the counter falls to
    /// 0, or to the schedules counted past [`MAX_RATE_WINDOW`]).
    fn schedule_counters(&mut self) -> io::Result<()> {
        let gpus: Vec<Option<u32>> = self.schedules.keys().copied().collect();
        for gpu in gpus {
            let points = self
                .schedules
                .get_mut(&gpu)
                .map(|w| w.expire(u64::MAX))
                .unwrap_or_default();
            self.rate_points(gpu, &points)?;
        }
        Ok(())
    }

    /// Ends every slice still open at `end_ns` (the last record of the trace), closes the JSON
    /// and flushes. `other` goes to `otherData` (strings, shown by Perfetto as trace metadata).
    pub fn finish(mut self, end_ns: u64, other: &[(&str, String)]) -> io::Result<W> {
        let counts = self.end_slices(end_ns)?;
        let mut other: Map<String, Value> = other
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(v.as_str())))
            .collect();
        for (k, v) in counts {
            other.insert(k.into(), Value::from(v.to_string()));
        }
        write!(self.out, "\n],\n\"otherData\":{}}}\n", Value::Object(other))?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// A merged file's node ([`MergedTimeline::node`]): ends its slices as
    /// [`finish`](Self::finish) does, without closing the file; returns its `otherData` counts.
    fn finish_node(mut self, end_ns: u64) -> io::Result<Vec<(&'static str, u64)>> {
        let counts = self.end_slices(end_ns)?;
        self.out.flush()?;
        Ok(counts)
    }

    /// Ends every slice still open at `end_ns` and the schedule counters; returns the counts
    /// of what was placed or left out, non-zero only, for `otherData`.
    fn end_slices(&mut self, end_ns: u64) -> io::Result<Vec<(&'static str, u64)>> {
        self.schedule_counters()?;
        let mut still_open: Vec<(TaskKey, Track)> = self.open.drain().collect();
        still_open.sort_by_key(|(_, t)| t.tid);
        for ((pid, _), track) in still_open {
            self.close_track(
                pid,
                track,
                end_ns,
                json!({"note": "still alive when the trace ended"}),
            )?;
        }
        let mut counts = Vec::new();
        if self.clamped > 0 {
            counts.push(("placed_at_slice_begin", self.clamped));
        }
        if self.events_not_drawn > 0 || self.gpu_slices_not_drawn > 0 {
            eprintln!(
                "gpu-trace: the Perfetto timeline leaves out {} events ({} tasks begun) and {} \
                 GPU-group slices: their process or GPU group had {MAX_TRACKS_PER_PROCESS} \
                 tracks busy, or the timeline {MAX_TRACKS} (its otherData counts them)",
                self.events_not_drawn, self.tasks_not_drawn, self.gpu_slices_not_drawn
            );
        }
        for (k, v) in [
            ("tasks_not_drawn", self.tasks_not_drawn),
            ("events_not_drawn", self.events_not_drawn),
            ("gpu_slices_not_drawn", self.gpu_slices_not_drawn),
            ("schedules_without_step_down", self.rate_window_full),
        ] {
            if v > 0 {
                counts.push((k, v));
            }
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{DestroyCause, Engine, Interleave, Origin, ValueSource};

    fn origin(ts_ns: u64, pid: u32, comm: &str) -> Origin {
        Origin {
            ts_ns,
            cpu: 1,
            pid,
            tid: pid,
            comm: comm.into(),
        }
    }

    fn init(ts: u64, pid: u32, handle: u32) -> Event {
        Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(ts, pid, "python3"),
            kind: EventKind::TaskInit {
                task: TaskId::RmHandle(handle),
                client: 7,
                engine: Some(Engine::Graphics),
                engine_type: Some(1),
                timeslice_us: Some(1024),
                timeslice_source: ValueSource::DriverDefault,
                interleave: Some(Interleave::Medium),
                interleave_source: ValueSource::DriverDefault,
                runlist: None,
                gpu: Some(0),
            },
        }
    }

    fn schedule(ts: u64, pid: u32, handle: u32) -> Event {
        Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(ts, pid, "python3"),
            kind: EventKind::Schedule {
                task: TaskId::RmHandle(handle),
                client: 7,
                channels: Some(8),
                timeslice_us: Some(1024),
                interleave: Some(Interleave::Medium),
                allowed: true,
                rm_status: Some(0),
                errno: 0,
                via_channel: false,
            },
        }
    }

    fn destroy(ts: u64, pid: u32, handle: u32) -> Event {
        Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(ts, pid, "cuda-EvtHandlr"),
            kind: EventKind::TaskDestroy {
                final_params: None,
                task: TaskId::RmHandle(handle),
                client: 7,
                cause: DestroyCause::ProcessExit,
                implicit: true,
            },
        }
    }

    /// The timeline of `events`, each on the GPU the pipeline would name on a host where RM's
    /// device instance D is nvidia-smi's GPU D (these tests are about the layout;
    /// `gpus_are_named_by_nvidia_smi_s_index_or_question_mark` about the numbering).
    fn write(events: &[Event], start: u64, end: u64) -> Value {
        let mut w = PerfettoWriter::new(Vec::new(), Clock::new(0)).unwrap();
        let mut devices = HashMap::new();
        for e in events {
            if let Some(Some(d)) = e.kind.driver_gpu() {
                devices.insert(task_key(e.origin.pid, e.kind.task()), d);
            }
            let named = devices
                .get(&task_key(e.origin.pid, e.kind.task()))
                .map(|&d| GpuIdentity {
                    index: d,
                    uuid: None,
                    bus_id: format!("0000:{d:02x}:00.0"),
                    rm_device: d,
                });
            w.event_on(e, named.as_ref(), "python3", start).unwrap();
        }
        let bytes = w.finish(end, &[("tool", "test".into())]).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.starts_with("{\"traceEvents\":["),
            "traceEvents must come first"
        );
        serde_json::from_str(&text).unwrap()
    }

    /// The traced processes' events (not the GPUs' counters and track groups).
    fn procs(v: &Value) -> Vec<Value> {
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["pid"].as_u64().unwrap() < u64::from(GPU_GROUP_PID_BASE))
            .cloned()
            .collect()
    }

    /// GPU `gpu`'s `schedules/s` counter: (ts µs, schedules) in file order.
    fn rate_of(v: &Value, gpu: u32) -> Vec<(f64, u64)> {
        let name = format!("schedules/s GPU {gpu}");
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == name.as_str())
            .map(|e| {
                (
                    e["ts"].as_f64().unwrap(),
                    e["args"]["schedules"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// The phases of the traced processes' events.
    fn phases(v: &Value) -> Vec<String> {
        procs(v)
            .iter()
            .map(|e| e["ph"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn events_older_than_their_slice_are_placed_at_its_begin() {
        // Ring order from two CPUs: the schedule (2.0 µs) and the destroy (2.5 µs) arrive after
        // a TASK_INIT stamped 3.0 µs.
        let v = write(
            &[
                init(3_000, 42, 0x5c00_0015),
                schedule(2_000, 42, 0x5c00_0015),
                destroy(2_500, 42, 0x5c00_0015),
            ],
            2_000,
            3_000,
        );
        let evs = procs(&v);
        let timed: Vec<&Value> = evs.iter().filter(|e| e["ph"] != "M").collect();
        // B, the TASK_INIT and SCHEDULE points, E: all at the TASK_INIT's 3.0 µs.
        assert_eq!(timed.len(), 4);
        assert!(
            timed.iter().all(|e| e["ts"].as_f64() == Some(3.0)),
            "{timed:?}"
        );
        // The args keep the true times.
        let sched = evs.iter().find(|e| e["name"] == "SCHEDULE").unwrap();
        assert_eq!(sched["args"]["ts_ns"], 2_000);
        assert_eq!(v["otherData"]["placed_at_slice_begin"], "2");
        // In the GPU's group too, the lifetime is whole and in order.
        let on_gpu: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["pid"] == GPU_GROUP_PID_BASE && e["ph"] != "M")
            .collect();
        assert_eq!(on_gpu.len(), 2);
        assert!(on_gpu.iter().all(|e| e["ts"].as_f64() == Some(3.0)));
    }

    /// `gpu-trace --api`: calls arrive in return order (inner first) and become complete
    /// slices on the calling thread's track, from entry (return less duration) to return; a
    /// driver event inside a call is also an instant on that track, inside the call's slice;
    /// the thread's track is named once; a process's sums are not drawn.
    #[test]
    fn api_calls_are_slices_on_the_thread_track_with_driver_events_inside() {
        use crate::api::{events::samples, names::ApiEvent};
        use crate::sink::ApiEnriched;
        let mut w = PerfettoWriter::new(Vec::new(), Clock::new(0)).unwrap();
        let inner = samples::call("python3", "libcuda.so.1");
        let mut outer = inner.clone();
        outer.site = samples::site("cudaMalloc", "libcudart.so.12");
        (outer.caller, outer.depth, outer.duration_ns) = (None, 0, 40_000);
        let mut sched = schedule(20_000, 4242, 0x5c00_0015);
        sched.origin.tid = 4243;
        sched.api = Some(crate::event::ApiOpen {
            call: crate::event::ApiCall {
                symbol: "cuCtxCreate_v4".into(),
                library: "libcuda.so.1".into(),
            },
            caller: None,
            depth: 2,
        });
        w.event(&sched, "python3", 0).unwrap();
        let stats = ApiEvent::Stats(crate::api::stats::CallStats {
            pid: 4242,
            library: String::new(),
            preload: false,
            symbol: String::new(),
            calls: 1,
            errors: 0,
            total_ns: 0,
            hist: vec![],
        });
        for (event, ts_ns) in [
            (ApiEvent::Call(inner), 25_000),
            (ApiEvent::Call(outer), 50_000),
            (stats, 60_000),
        ] {
            let origin = crate::api::events::samples::origin_of(&event, ts_ns, 1);
            let ev = ApiEnriched {
                event: &event,
                origin: &origin,
                process: "python3",
                cgroup: None,
            };
            w.api(&ev, "python3").unwrap();
        }
        let text = String::from_utf8(w.finish(60_000, &[]).unwrap()).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let on_thread: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["pid"] == 4242 && e["tid"] == 4243)
            .collect();
        let thread_names: Vec<_> = on_thread.iter().filter(|e| e["ph"] == "M").collect();
        assert_eq!(thread_names.len(), 1, "{text}");
        assert_eq!(thread_names[0]["args"]["name"], "python3");
        let slices: Vec<(f64, f64, &str)> = on_thread
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["ts"].as_f64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                    e["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            slices,
            [
                (12.655, 12.345, "cuCtxCreate_v4"),
                (10.0, 40.0, "cudaMalloc")
            ]
        );
        let instant: Vec<_> = on_thread.iter().filter(|e| e["ph"] == "i").collect();
        assert_eq!(instant.len(), 1, "{text}");
        assert_eq!(
            (&instant[0]["name"], &instant[0]["s"]),
            (&json!("SCHEDULE"), &json!("t"))
        );
        assert_eq!(instant[0]["ts"], 20.0);
        let ctx = on_thread
            .iter()
            .find(|e| e["name"] == "cuCtxCreate_v4")
            .unwrap();
        assert_eq!(ctx["args"]["caller"], "cudaMalloc@libcudart.so.12");
        assert_eq!(
            (ctx["args"]["depth"] == 1, ctx["args"]["ret"] == 0),
            (true, true)
        );
    }

    #[test]
    fn an_event_inside_an_api_call_names_it_in_its_args() {
        let mut e = schedule(2_000, 42, 0x5c00_0015);
        e.api = Some(crate::event::ApiOpen {
            call: crate::event::ApiCall {
                symbol: "cuCtxCreate_v4".into(),
                library: "libcuda.so.1".into(),
            },
            caller: None,
            depth: 1,
        });
        let v = write(&[init(1_000, 42, 0x5c00_0015), e], 1_000, 3_000);
        let evs = procs(&v);
        let sched = evs.iter().find(|e| e["name"] == "SCHEDULE").unwrap();
        assert_eq!(sched["args"]["api"]["symbol"], "cuCtxCreate_v4");
        let init = evs.iter().find(|e| e["name"] == "TASK_INIT").unwrap();
        assert!(init["args"].get("api").is_none());
    }

    /// A GPU's group and counters are named by nvidia-smi's index of the GPU the pipeline
    /// named (RM's device instance 0 here being nvidia-smi's GPU 1), `? (RM device N)` where it
    /// could not: RM's number never passes for an index. The event's args carry both numbers,
    /// as the JSON lines do.
    #[test]
    fn gpus_are_named_by_nvidia_smi_s_index_or_question_mark() {
        let second = GpuIdentity {
            index: 1,
            uuid: None,
            bus_id: "0000:41:00.0".into(),
            rm_device: 0,
        };
        let mut w = PerfettoWriter::new(Vec::new(), Clock::new(0)).unwrap();
        // Process 42's task on RM device 0 (named), process 43's on RM device 3 (not named).
        w.event_on(&init(1_000, 42, 1), Some(&second), "a", 0)
            .unwrap();
        w.event_on(&schedule(1_500, 42, 1), Some(&second), "a", 0)
            .unwrap();
        let mut other = init(2_000, 43, 2);
        if let EventKind::TaskInit { gpu, .. } = &mut other.kind {
            *gpu = Some(3);
        }
        w.event_on(&other, None, "b", 0).unwrap();
        w.event_on(&schedule(2_500, 43, 2), None, "b", 0).unwrap();
        let bytes = w.finish(3_000, &[]).unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let names: HashSet<String> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "C" || e["name"] == "process_name")
            .map(|e| match e["ph"].as_str() {
                Some("C") => e["name"].as_str().unwrap().to_string(),
                _ => e["args"]["name"].as_str().unwrap().to_string(),
            })
            .collect();
        for want in [
            "GPU 1",
            "live tasks GPU 1",
            "schedules/s GPU 1",
            "GPU ? (RM device 3)",
            "live tasks GPU ? (RM device 3)",
            "schedules/s GPU ? (RM device 3)",
        ] {
            assert!(names.contains(want), "{want}: {names:?}");
        }
        for never in ["GPU 0", "GPU 3", "live tasks GPU 0", "live tasks GPU 3"] {
            assert!(!names.contains(never), "{never}: {names:?}");
        }
        let inits: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "TASK_INIT" && e["ph"] == "X")
            .collect();
        let numbers: Vec<(Value, Value)> = (inits.iter())
            .map(|e| (e["args"]["gpu"].clone(), e["args"]["rm_device"].clone()))
            .collect();
        assert_eq!(
            numbers,
            [(json!(1), json!(0)), (Value::Null, json!(3))],
            "{inits:?}"
        );
    }

    #[test]
    fn timestamps_are_exact_microseconds() {
        assert_eq!(ts_us(1_234_567), "1234.567");
        assert_eq!(ts_us(5), "0.005");
        assert_eq!(ts_us(u64::MAX), "18446744073709551.615");
    }

    #[test]
    fn a_lifetime_is_a_slice_with_its_instants_inside() {
        let v = write(
            &[
                init(1_000, 42, 0x5c00_0015),
                schedule(2_000, 42, 0x5c00_0015),
                destroy(3_000, 42, 0x5c00_0015),
            ],
            500,
            4_000,
        );
        assert_eq!(phases(&v), ["M", "M", "B", "X", "X", "E"]);
        let all = v["traceEvents"].as_array().unwrap();
        let ev = procs(&v);
        assert_eq!(ev[0]["name"], "process_name");
        assert_eq!(ev[0]["args"]["name"], "python3");
        assert_eq!(ev[1]["name"], "thread_name");
        assert_eq!(ev[1]["args"]["name"], "TSG slot 1");
        // GPU 0's live-task counter: 1 from the TASK_INIT, 0 from the TASK_DESTROY.
        let counter: Vec<(f64, u64)> = all
            .iter()
            .filter(|e| e["ph"] == "C" && e["args"]["live"].is_u64())
            .map(|e| {
                assert_eq!(e["name"], "live tasks GPU 0");
                (
                    e["ts"].as_f64().unwrap(),
                    e["args"]["live"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(counter, [(1.0, 1), (3.0, 0)]);
        let tid = ev[1]["tid"].as_u64().unwrap();
        assert!(tid >= u64::from(TRACK_TID_BASE));
        assert!(ev[2..].iter().all(|e| e["tid"] == tid && e["pid"] == 42));
        assert_eq!(ev[2]["name"], "TSG 0x5c000015 GRAPHICS");
        assert_eq!(ev[5]["name"], "TSG 0x5c000015 GRAPHICS");
        assert_eq!(ev[2]["ts"].as_f64(), Some(1.0));
        assert_eq!(ev[2]["args"]["task_init"]["engine"], "GRAPHICS");
        assert_eq!(ev[2]["args"]["task_init"]["task"]["value"], 0x5c00_0015);
        // The TASK_INIT point begins the lifetime's flow, the SCHEDULE takes it in.
        assert_eq!(ev[3]["name"], "TASK_INIT");
        assert_eq!(
            (ev[3]["ts"].as_f64(), ev[3]["dur"].as_u64()),
            (Some(1.0), Some(0))
        );
        assert_eq!(ev[3]["flow_out"], true);
        assert!(ev[3].get("flow_in").is_none());
        assert_eq!(ev[4]["name"], "SCHEDULE");
        assert_eq!(ev[4]["bind_id"], ev[3]["bind_id"]);
        assert_eq!(
            (ev[4]["flow_in"].clone(), ev[4]["flow_out"].clone()),
            (json!(true), json!(true))
        );
        assert_eq!(ev[4]["args"]["channels"], 8);
        assert_eq!(ev[4]["args"]["allowed"], true);
        assert_eq!(ev[5]["args"]["task_destroy"]["cause"], "process_exit");
        assert_eq!(ev[5]["args"]["task_destroy"]["comm"], "cuda-EvtHandlr");
        assert_eq!(v["otherData"]["tool"], "test");
        // GPU 0's group: the lifetime named by its owner; its schedules/s: 1 from the SCHEDULE
        // for a second (not from the trace's start, before the TASK_INIT).
        let g: Vec<&Value> = all
            .iter()
            .filter(|e| e["pid"] == GPU_GROUP_PID_BASE)
            .collect();
        assert_eq!(g[0]["args"]["name"], "GPU 0");
        let b = g.iter().find(|e| e["ph"] == "B").unwrap();
        assert_eq!(
            (b["name"].as_str(), b["ts"].as_f64()),
            (Some("python3 42: TSG 0x5c000015 GRAPHICS"), Some(1.0))
        );
        assert_eq!(rate_of(&v, 0), [(2.0, 1), (1_000_002.0, 0)]);
    }

    #[test]
    fn overlapping_lifetimes_get_their_own_tracks() {
        let v = write(
            &[
                init(1, 1, 10),
                init(2, 1, 11),
                destroy(3, 1, 10),
                destroy(4, 1, 11),
            ],
            1,
            4,
        );
        let ev = procs(&v);
        let b: Vec<u64> = ev
            .iter()
            .filter(|e| e["ph"] == "B")
            .map(|e| e["tid"].as_u64().unwrap())
            .collect();
        let e: Vec<u64> = ev
            .iter()
            .filter(|e| e["ph"] == "E")
            .map(|e| e["tid"].as_u64().unwrap())
            .collect();
        assert_eq!(b.len(), 2);
        assert_ne!(b[0], b[1]);
        assert_eq!(b, e, "each slice ends on its own track");
    }

    #[test]
    fn lifetimes_one_after_another_share_one_track() {
        // Three contexts made and freed in turn: one track, three slices on it.
        let v = write(
            &[
                init(1, 1, 10),
                destroy(2, 1, 10),
                init(3, 1, 10),
                destroy(4, 1, 10),
                init(5, 1, 11),
                destroy(6, 1, 11),
            ],
            1,
            6,
        );
        let ev = procs(&v);
        let names: Vec<&Value> = ev.iter().filter(|e| e["name"] == "thread_name").collect();
        assert_eq!(names.len(), 1);
        let tid = &names[0]["tid"];
        let b = ev
            .iter()
            .filter(|e| e["ph"] == "B" && &e["tid"] == tid)
            .count();
        assert_eq!(b, 3);
        // A slice that begins before the last one on a track ended gets another track.
        let v = write(&[init(1, 1, 10), destroy(5, 1, 10), init(3, 1, 11)], 1, 6);
        let ev = procs(&v);
        assert_eq!(
            ev.iter().filter(|e| e["name"] == "thread_name").count(),
            2,
            "disorder never makes slices overlap on a track"
        );
    }

    #[test]
    fn tasks_from_before_the_trace_and_still_alive_at_its_end_are_bounded_by_it() {
        let v = write(&[schedule(2_000, 9, 5), init(2_500, 9, 6)], 1_000, 9_000);
        let ev = procs(&v);
        let b: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "B").collect();
        assert_eq!(b[0]["ts"].as_f64(), Some(1.0), "begins at the first record");
        assert_eq!(b[0]["args"]["note"], "created before the trace started");
        let e: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "E").collect();
        assert_eq!(e.len(), 2);
        assert!(e.iter().all(|e| e["ts"].as_f64() == Some(9.0)
            && e["args"]["note"] == "still alive when the trace ended"));
    }

    #[test]
    fn schedules_per_second_step_at_each_schedule_and_a_second_after_it() {
        // The counter is the number of SCHEDULEs in the last second at every moment: up at
        // each one, down a second after it; nothing before the first (the old per-second bins
        // counted from the first record read 2 at ts 0, before any schedule); a record ~584
        // years later costs two points, not one per second.
        let far = u64::MAX - 1_000;
        let evs = [
            init(0, 1, 10),
            schedule(100, 1, 10),
            schedule(200, 1, 10),
            schedule(1_000_000_100, 1, 10),
            schedule(5_000_000_000, 1, 10),
            schedule(far, 1, 10),
        ];
        let v = write(&evs, 0, far);
        let rate = rate_of(&v, 0);
        assert_eq!(
            rate[..8],
            [
                (0.1, 1),
                (0.2, 2),
                // At 1 s + 100 ns the first leaves the window as the third enters it: 2 (the
                // later point at the same time is the value).
                (1_000_000.1, 1),
                (1_000_000.1, 2),
                (1_000_000.2, 1),
                (2_000_000.1, 0),
                (5e6, 1),
                (6e6, 0),
            ],
            "{rate:?}"
        );
        assert_eq!(rate.len(), 10, "{rate:?}");
        assert_eq!((rate[8].1, rate[9].1), (1, 0));
        assert!(rate[8].0 > 1e16 && rate[9].0 >= rate[8].0);
        assert!(rate.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
    }

    #[test]
    fn slices_are_named_with_the_engine_of_their_task_init() {
        let v = write(&[init(0, 1, 10), destroy(5, 1, 10)], 0, 10);
        let names: Vec<&str> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "B")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(!names.is_empty());
        assert!(
            names.iter().all(|n| n.ends_with("TSG 0x0000000a GRAPHICS")),
            "{names:?}"
        );
    }

    /// Distinct thread tracks (`thread_name` metadata) of process `pid`.
    fn tracks_of(v: &Value, pid: u64) -> usize {
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name" && e["pid"] == pid)
            .count()
    }

    #[test]
    fn a_process_naming_endless_handles_gets_a_bounded_number_of_tracks_and_a_count() {
        // Schedules on distinct handles never seen created: each is a task alive until the end
        // (what any process can make with refused calls). Past the cap they are not drawn, and
        // counted.
        let n = MAX_TRACKS_PER_PROCESS as u32 * 3;
        let evs: Vec<Event> = (0..n)
            .map(|i| schedule(u64::from(i) + 1, 7, 0x1000 + i))
            .collect();
        let v = write(&evs, 1, 1_000_000);
        assert_eq!(tracks_of(&v, 7), MAX_TRACKS_PER_PROCESS);
        let other = &v["otherData"];
        let extra = u64::from(n) - MAX_TRACKS_PER_PROCESS as u64;
        assert_eq!(other["events_not_drawn"], extra.to_string(), "{other}");
        // Drawn: one point each, every slice closed at the end.
        let points = procs(&v).iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(points, MAX_TRACKS_PER_PROCESS);
        let (b, e) = procs(&v).iter().fold((0, 0), |(b, e), ev| {
            (
                b + usize::from(ev["ph"] == "B"),
                e + usize::from(ev["ph"] == "E"),
            )
        });
        assert_eq!((b, e), (MAX_TRACKS_PER_PROCESS, MAX_TRACKS_PER_PROCESS));
        // Another process still gets its tracks.
        let mut more = evs.clone();
        more.push(schedule(u64::from(n) + 5, 8, 0x1));
        let v = write(&more, 1, 1_000_000);
        assert_eq!(tracks_of(&v, 8), 1);
    }

    #[test]
    fn tasks_of_a_full_process_are_drawn_again_once_tracks_free_up() {
        let cap = MAX_TRACKS_PER_PROCESS as u32;
        let mut evs: Vec<Event> = (0..=cap)
            .map(|i| init(u64::from(i) + 1, 7, 0x1000 + i))
            .collect();
        // The one past the cap is not drawn; its later schedule is not either (still full).
        evs.push(schedule(u64::from(cap) + 10, 7, 0x1000 + cap));
        // One ends; a new task takes its track.
        evs.push(destroy(u64::from(cap) + 20, 7, 0x1000));
        evs.push(init(u64::from(cap) + 30, 7, 0x9999));
        let v = write(&evs, 1, 1_000_000);
        let other = &v["otherData"];
        assert_eq!(other["tasks_not_drawn"], "1", "{other}");
        // Its TASK_INIT point and its SCHEDULE.
        assert_eq!(other["events_not_drawn"], "2", "{other}");
        assert_eq!(tracks_of(&v, 7), MAX_TRACKS_PER_PROCESS);
        let since = f64::from(cap + 30) / 1000.0;
        let late = procs(&v)
            .iter()
            .filter(|e| e["ph"] == "B" && e["ts"].as_f64().unwrap() >= since)
            .count();
        assert_eq!(late, 1, "the new task got the freed track");
    }

    #[test]
    fn the_whole_timeline_is_capped_and_remembers_nothing_more_per_process_past_it() {
        let mut w = PerfettoWriter::new(std::io::sink(), Clock::new(0)).unwrap();
        let procs = (MAX_TRACKS as usize).div_ceil(MAX_TRACKS_PER_PROCESS) as u32 + 3;
        let mut ts = 1;
        for pid in 0..procs {
            for h in 0..MAX_TRACKS_PER_PROCESS as u32 {
                ts += 1;
                w.event(&schedule(ts, 100 + pid, h), "storm", 1).unwrap();
            }
        }
        assert_eq!(w.next_track, MAX_TRACKS);
        assert_eq!(w.open.len(), MAX_TRACKS as usize);
        let with_tracks = w.tracks.len();
        // New processes past the cap: not drawn, and no state kept for them.
        for pid in 0..1000 {
            w.event(&schedule(ts + 1, 10_000 + pid, 1), "late", 1)
                .unwrap();
        }
        assert_eq!(w.tracks.len(), with_tracks);
        let expected =
            u64::from(procs) * MAX_TRACKS_PER_PROCESS as u64 - u64::from(MAX_TRACKS) + 1000;
        assert_eq!(w.events_not_drawn, expected);
    }

    /// 300 000 distinct handles in one process (the case: 77 s before, quadratic in the
    /// live tasks): the writer finishes, its output is valid, and what it drew is bounded.
    #[test]
    fn three_hundred_thousand_distinct_handles_finish_with_a_bounded_timeline() {
        let mut w = PerfettoWriter::new(Vec::new(), Clock::new(0)).unwrap();
        for i in 0..300_000u32 {
            w.event(&schedule(u64::from(i) + 1, 7, i), "storm", 1)
                .unwrap();
        }
        assert!(w.open.len() <= MAX_TRACKS_PER_PROCESS);
        let bytes = w.finish(400_000, &[]).unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(tracks_of(&v, 7), MAX_TRACKS_PER_PROCESS);
        assert_eq!(
            v["otherData"]["events_not_drawn"],
            (300_000 - MAX_TRACKS_PER_PROCESS).to_string()
        );
    }

    #[test]
    fn a_recording_naming_endless_gpus_gets_a_bounded_number_of_groups() {
        let mut evs = Vec::new();
        for i in 0..(MAX_GPU_GROUPS + 10) {
            // One process per task: a process's own tracks are capped too.
            let mut e = init(u64::from(i) + 1, 7 + i, 0x100 + i);
            if let EventKind::TaskInit { gpu, .. } = &mut e.kind {
                *gpu = Some(i);
            }
            evs.push(e);
        }
        let v = write(&evs, 1, 10_000);
        let groups: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["name"] == "process_name"
                    && e["pid"].as_u64().unwrap() >= u64::from(GPU_GROUP_PID_BASE)
                    && e["pid"] != GPU_PID
            })
            .collect();
        assert_eq!(groups.len() as u32, MAX_GPU_GROUPS + 1);
        assert!(
            groups.last().unwrap()["args"]["name"]
                .as_str()
                .unwrap()
                .starts_with("other GPUs")
        );
        assert!(
            groups
                .iter()
                .all(|g| g["pid"].as_u64().unwrap() < u64::from(GPU_PID))
        );
    }

    #[test]
    fn arrays_never_reach_an_event() {
        assert_eq!(
            without_arrays(json!({"a": [1, 2], "b": {"c": [3]}})),
            json!({"a": "[1,2]", "b": {"c": "[3]"}})
        );
    }

    #[test]
    fn process_and_task_names_are_json_escaped() {
        let mut w = PerfettoWriter::new(Vec::new(), Clock::new(0)).unwrap();
        let mut e = init(1, 3, 1);
        e.origin.comm = "we\"ird\\name".into();
        w.event(&e, "we\"ird\\name", 1).unwrap();
        let text = String::from_utf8(w.finish(2, &[]).unwrap()).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        // JSON-escaped, and spelled as the text output spells it (escape.rs: `\\` for `\`).
        assert_eq!(v["traceEvents"][0]["args"]["name"], "we\"ird\\\\name");
    }
}
