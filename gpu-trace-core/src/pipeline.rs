//! Records in, text or JSON out: parse → decode → track → filter → print, and statistics.
//! Pure with respect to the kernel: live runs and `replay` share it, so a replay prints what the
//! live run printed.

use std::{collections::HashMap, io::Write, time::Duration};

use crate::{
    api::names::ApiEvent,
    event::{Event, EventKind, GpuNumbering, Origin, TaskKey},
    inventory::Inventory,
    model::{
        bounded::PidMap,
        gpus::{GpuDirectory, GpuIdentity},
        share::ShareSample,
        stats::{KernelCounters, Stats},
        workload::{Attribution, PodResolver},
    },
    output::{
        Format, Lines, Outputs,
        clock::Clock,
        json::JsonSink,
        text::{TextFormatter, TextSink, TimestampMode},
    },
    record::RecordingHeader,
    sink::{ApiEnriched, Enriched, RunEnd, ShareBatch, ShareEnriched, Sink, SinkError},
    source::{Fact, Sources},
    wire::{self, RawRecord},
};

/// What a run ended with, for the exit code.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub events: u64,
    pub dropped: u64,
    /// Output lines dropped because the output's reader did not keep up.
    pub output_lost: u64,
    /// The replayed recording ends without its trailer (cut short): its counts are
    /// incomplete and the kernel counters unknown ([`Stats::kernel_unknown`]).
    pub truncated: bool,
    /// `gpu-trace -- CMD`: the command's exit status (128 + N for a signal), when it ended
    /// while traced.
    pub child_status: Option<i32>,
}

/// What to show and how.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub verbose: bool,
    /// Only these processes (empty: all).
    pub pids: Vec<u32>,
    /// Only these thread or process names (empty: all).
    pub comms: Vec<String>,
    pub format: Format,
    pub timestamps: TimestampMode,
    /// Print the statistics block at the end.
    pub stats: bool,
    pub clock: Clock,
    /// Text: the `container=` field on every line, `-` outside containers (`--show-container`);
    /// otherwise only on lines of processes in a container or pod.
    pub show_container: bool,
}

#[cfg(test)]
impl PipelineConfig {
    /// JSON lines and statistics, no filter, clock offset 0 (the unit tests' pipeline).
    pub(crate) fn json_for_tests(verbose: bool) -> Self {
        Self {
            verbose,
            pids: Vec::new(),
            comms: Vec::new(),
            format: Format::Json,
            timestamps: TimestampMode::default(),
            stats: true,
            clock: Clock::new(0),
            show_container: false,
        }
    }
}

/// What [`Pipeline::finish_all`] ended with.
pub struct Finished<W> {
    pub summary: Summary,
    /// The output writer, flushed (or not: see `errors`).
    pub out: W,
    /// The outputs that failed to end (the statistics not written, the timeline not closed),
    /// each by its own kind; empty when all ended.
    pub errors: Vec<SinkError>,
    /// The statistics block as text (`None` with `--no-stats`).
    pub stats_text: Option<String>,
}

pub struct Pipeline<W: Write> {
    config: PipelineConfig,
    /// The vendors' trackers, each record routed to its own.
    sources: Sources,
    /// The last record's thread name, decoded once per run of records of one thread.
    comms: wire::CommCache,
    /// The events of the record being fed (kept for its allocation).
    events: Vec<Event>,
    stats: Stats,
    /// First `comm` seen per process: `--comm` matches it as the process name, so that a
    /// process's events from other threads (e.g. `cuda-EvtHandlr`) are kept.
    process_names: PidMap<String>,
    /// Who each process is (cgroup, container, pod), from `TASK_CGROUP` and `ATTRIBUTION`
    /// records.
    attributions: PidMap<Attribution>,
    /// The host's GPUs, and which RM device instance each is (from the processes' own calls).
    gpus: GpuDirectory,
    /// RM device instance of each NVIDIA task, from its `TASK_INIT` or `WORK_SUBMIT`.
    task_devices: HashMap<TaskKey, u32>,
    first_ts: Option<u64>,
    last_ts: Option<u64>,
    /// Where the events go: the lines (text or JSON) and the outputs the caller added.
    outputs: Outputs<W>,
    /// `--interval`: periodic statistics.
    interval: Option<Periodic>,
    /// `gpu-trace -- CMD`: only these processes (the command and those it created), as the
    /// caller follows them ([`Pipeline::follow`]); `None`: no such filter.
    followed: Option<std::collections::HashSet<u32>>,
    /// `--gpu`: only events on these GPUs (index, UUID or PCI bus id; empty: all).
    gpu_filter: Vec<String>,
    /// Events `--gpu` left out because their GPU was not known (yet).
    gpu_unknown: u64,
    /// What the live run left out before the pipeline, by reason ([`Self::left_out`]).
    left_out: std::collections::BTreeMap<&'static str, u64>,
    /// Names pods by UID (live runs: the node's /var/log/pods; `--pods-dir`).
    pods: Option<Box<dyn PodResolver>>,
    /// `--pod`, `--namespace`: only the processes of these pods and namespaces.
    pod_filter: PodFilter,
    /// `--api`: the names behind the API records' cookies.
    api_names: crate::api::names::Names,
    /// `gpu-trace merge`: the node whose recording this pipeline reads ([`Self::with_host`]).
    host: Option<String>,
}

/// `--interval`: when and where the periodic statistics go.
struct Periodic {
    period_ns: u64,
    /// Replay: due by the records' own timestamps (the live run calls
    /// [`Pipeline::periodic_stats`] on its timer instead).
    by_record_time: bool,
    /// The next one is due when a record at or after `first + next_ns` arrives.
    next_ns: u64,
}

impl<W: Write> Pipeline<W> {
    pub fn new(config: PipelineConfig, out: W) -> Self {
        let lines = match config.format {
            Format::Text => {
                let text = TextFormatter {
                    timestamps: config.timestamps,
                    verbose: config.verbose,
                };
                Lines::Text(TextSink::new(
                    text,
                    config.clock.clone(),
                    config.show_container,
                    out,
                ))
            }
            Format::Json => Lines::Json(JsonSink::new(config.clock.clone(), out)),
        };
        Self {
            config,
            sources: Sources::new(),
            comms: wire::CommCache::default(),
            events: Vec::new(),
            stats: Stats::new(),
            process_names: PidMap::default(),
            attributions: PidMap::default(),
            gpus: GpuDirectory::default(),
            task_devices: HashMap::new(),
            followed: None,
            gpu_filter: Vec::new(),
            gpu_unknown: 0,
            left_out: Default::default(),
            first_ts: None,
            last_ts: None,
            outputs: Outputs::new(lines),
            interval: None,
            pods: None,
            pod_filter: PodFilter::default(),
            api_names: Default::default(),
            host: None,
        }
    }

    /// `gpu-trace merge`: this pipeline reads node `host`'s recording; every line it writes
    /// names the node (text: `host=NAME` at the end; JSON: a first `host` key), and the text
    /// statistics block is titled with it.
    pub fn with_host(mut self, host: &str) -> Self {
        self.outputs.set_host(host);
        self.host = Some(host.to_string());
        self
    }

    /// Names the pods of the attributed processes with `resolver` (their `pod_name`,
    /// `namespace`, `container_name` and metric labels).
    pub fn with_pod_names(mut self, resolver: Box<dyn PodResolver>) -> Self {
        self.pods = Some(resolver);
        self
    }

    /// Also prints statistics every `period` (`--interval`): JSON as a `STATS` object with
    /// `"final": false` among the events, text as a block on `side` (standard error). With
    /// `by_record_time` (replay) they fall due by the records' timestamps; otherwise the caller
    /// calls [`periodic_stats`](Self::periodic_stats) on its own timer.
    pub fn with_interval(
        mut self,
        period: Duration,
        by_record_time: bool,
        side: Box<dyn Write>,
    ) -> Self {
        let period_ns = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.interval = Some(Periodic {
            period_ns,
            by_record_time,
            next_ns: period_ns,
        });
        self.outputs.set_side(side);
        self
    }

    /// Prints the statistics so far (`--interval`): `elapsed` is the time traced so far,
    /// `counters` the kernel side's counters when they can be read now.
    pub fn periodic_stats(
        &mut self,
        elapsed: Duration,
        counters: Option<KernelCounters>,
    ) -> std::io::Result<()> {
        self.periodic(elapsed, counters).map_err(SinkError::into_io)
    }

    fn periodic(
        &mut self,
        elapsed: Duration,
        counters: Option<KernelCounters>,
    ) -> Result<(), SinkError> {
        // In place, not on a clone: the statistics hold the share samples (up to 16 MiB) and
        // every task, and a block can be due every 10 ms.
        let unreported = self.unreported();
        let saved = (
            self.stats.elapsed.replace(elapsed),
            counters.map(|c| std::mem::replace(&mut self.stats.kernel, c)),
            std::mem::replace(&mut self.stats.unreported, unreported),
        );
        let result = self.outputs.periodic(&self.stats);
        self.stats.elapsed = saved.0;
        if let Some(k) = saved.1 {
            self.stats.kernel = k;
        }
        self.stats.unreported = saved.2;
        result
    }

    /// Replay: the periodic statistics that fall due before a record at `ts_ns`. Intervals
    /// without records are not printed one by one: a record that crosses several boundaries
    /// at once gets one block, at the last boundary it crossed (the statistics of the empty
    /// intervals before it would be the same). So there are at most as many blocks as records
    /// (plus the final one), however far the recording's clock jumps and however short the
    /// interval.
    fn due_by_record_time(&mut self, ts_ns: u64) -> Result<(), SinkError> {
        let Some(first) = self.first_ts else {
            return Ok(());
        };
        let elapsed = ts_ns.saturating_sub(first);
        let due = match self.interval.as_mut() {
            Some(p) if p.by_record_time && elapsed >= p.next_ns => {
                // The last boundary at or before `elapsed`; the next one after it.
                let due = elapsed - elapsed % p.period_ns;
                p.next_ns = due.saturating_add(p.period_ns);
                due
            }
            _ => return Ok(()),
        };
        self.periodic(Duration::from_nanos(due), None)
    }

    /// One more output (`--metrics`, `--perfetto`, …): every selected record reaches it,
    /// before the lines.
    pub fn with_output(mut self, sink: Box<dyn Sink>) -> Self {
        self.outputs.push(sink);
        self
    }

    /// The kernel side's counters as read now (live runs, on their health timer), with what
    /// the run did not report so far, to every output that shows them.
    pub fn kernel_counters(&mut self, counters: &KernelCounters) {
        let unreported = self.unreported();
        self.outputs.kernel(counters, &unreported);
    }

    /// The start-up inventory (late attach): its processes are known to hold driver objects
    /// made before tracing started (their end becomes `PRETRACE_END`); with `--format json`
    /// one `{"event":"INVENTORY",...}` line is written before any event; the Perfetto timeline
    /// names and labels the processes. The JSON line lists only the processes `--pid`/`--comm`
    /// and `--pod`/`--namespace` select. The text form goes to standard error (the session
    /// prints it with [`inventory::render_text_named`]).
    pub fn inventory(&mut self, inv: &Inventory) -> std::io::Result<()> {
        self.inventory_of(inv, &[])
    }

    /// The start of a recording: its inventory ([`Self::inventory`]; the processes of
    /// `header.state_pids` are not taken as pre-trace) and its state records ([`crate::state_log`]),
    /// fed to the trackers alone: no event is written or counted for them.
    pub fn start(&mut self, header: &RecordingHeader, state: &[Vec<u8>]) -> std::io::Result<()> {
        if let Some(inv) = &header.inventory {
            self.inventory_of(inv, &header.state_pids)?;
        }
        for bytes in state {
            self.state_record(bytes);
        }
        Ok(())
    }

    /// One state record (see [`Self::start`]).
    fn state_record(&mut self, bytes: &[u8]) {
        let Ok(record) = wire::parse_record(bytes) else {
            return;
        };
        if let RawRecord::ApiSymbol(rec) = &record {
            self.api_names.note(rec);
            return;
        }
        let origin = self.comms.origin(record.header());
        let mut events = Vec::new();
        if let Some(Fact::DeviceIsGpu {
            device_instance,
            gpu_id,
        }) = self.sources.observe_state(origin, &record, &mut events)
        {
            self.gpus.learn(device_instance, gpu_id);
        }
        // The tasks' GPUs, for their later events.
        for ev in &events {
            self.gpu_of(ev);
        }
    }

    fn inventory_of(&mut self, inv: &Inventory, traced: &[u32]) -> std::io::Result<()> {
        self.gpus = GpuDirectory::new(&inv.gpus);
        for p in &inv.processes {
            if !traced.contains(&p.pid) {
                self.sources.preexisting(p);
            }
            self.process_names
                .entry(p.pid)
                .or_insert_with(|| p.comm.clone());
            // Where it ran when the inventory was taken (its records, if any, say it again).
            if let Some(path) = p.cgroup.as_deref().filter(|c| c.starts_with('/')) {
                self.attribute(p.pid, Attribution::new(0, Some(path.to_string()), None));
            }
        }
        // The processes the filters select, as the text form on stderr shows them.
        let mut shown = inv.selected(&self.config.pids, &self.config.comms);
        if !self.pod_filter.is_empty() {
            let pids: Vec<u32> = shown.processes.iter().map(|p| p.pid).collect();
            let keep: std::collections::HashSet<u32> = pids
                .into_iter()
                .filter(|&pid| self.pod_selected(pid))
                .collect();
            shown.processes.retain(|p| keep.contains(&p.pid));
        }
        self.outputs
            .inventory(inv, &shown)
            .map_err(SinkError::into_io)
    }

    /// Feeds one ring-buffer record (or one record of a recording file); prints the events it
    /// produces. Bytes that are not a record are counted ([`Stats::malformed`]).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), SinkError> {
        // Borrowed, not moved out of the Result: an NVIDIA record is 264 bytes, and each move
        // of it was a memcpy on the hottest path (a sixth of text -v's time).
        match &wire::parse_record(bytes) {
            Ok(record) => self.feed_record(record),
            Err(_) => {
                self.malformed();
                Ok(())
            }
        }
    }

    /// Counts `n` more of what the live run left out before the pipeline, under `reason`
    /// among the statistics' unreported reasons: `own_process` (records of the tracer's own
    /// process, its NVML thread's driver calls), `unfollowed` (`-- CMD`'s processes created
    /// past the bound of those followed), `api_uncounted`/`api_through_uncounted` (API calls
    /// the kernel could not count: its sums were full).
    pub fn left_out(&mut self, reason: &'static str, n: u64) {
        if n == 0 {
            // The statistics list non-zero reasons only.
            return;
        }
        *self.left_out.entry(reason).or_default() += n;
    }

    /// Like [`left_out`](Self::left_out), for a count the live run reads as a total (the
    /// followed set's `unfollowed`, the kernel's uncounted API calls): the reason's count
    /// becomes `total` (it never goes down), however often it is read.
    pub fn left_out_so_far(&mut self, reason: &'static str, total: u64) {
        if total > 0 {
            let n = self.left_out.entry(reason).or_default();
            *n = (*n).max(total);
        }
    }

    /// Counts one ring-buffer item that was not a record (see [`feed`](Self::feed)).
    pub fn malformed(&mut self) {
        self.stats.malformed += 1;
    }

    /// Feeds one parsed record; prints the events it produces.
    pub fn feed_record(&mut self, record: &RawRecord) -> Result<(), SinkError> {
        let origin = self.comms.origin(record.header());
        // Names of the API layer's cookies: no process's record, no time of the run.
        if let RawRecord::ApiSymbol(rec) = record {
            self.api_names.note(rec);
            return Ok(());
        }
        self.due_by_record_time(origin.ts_ns)?;
        // A process's API sums are read by userspace (no thread, no name of its own).
        if let RawRecord::ApiStats(rec) = record {
            let ev = self.api_names.stats(rec);
            return self.emit_api(&ev, &origin);
        }
        self.first_ts.get_or_insert(origin.ts_ns);
        self.last_ts = Some(origin.ts_ns);
        self.process_names
            .entry(origin.pid)
            .or_insert_with(|| origin.comm.to_string());
        let pid = origin.pid;
        match record {
            RawRecord::TaskCgroup(rec) => {
                // Live runs follow it with what it resolves to (`ATTRIBUTION`); alone (a
                // recording cut between the two), the id is all that is known.
                let known = self.attributions.get(&pid);
                if known.is_none_or(|a| a.cgroup_id != rec.cgroup_id) {
                    self.attribute(pid, Attribution::new(rec.cgroup_id, None, None));
                }
                return Ok(());
            }
            RawRecord::Attribution(a) => {
                let attribution = Attribution::new(a.head.cgroup_id, a.path(), a.ns_pid());
                self.attribute(pid, attribution);
                return Ok(());
            }
            RawRecord::ApiCall(rec) => {
                let ev = self.api_names.call(&origin, rec);
                return self.emit_api(&ev, &origin);
            }
            RawRecord::ApiRecursion(rec) => {
                let ev = self.api_names.recursion(&origin, rec);
                return self.emit_api(&ev, &origin);
            }
            _ => {}
        }
        let mut events = std::mem::take(&mut self.events);
        match self.sources.observe(origin, record, &mut events) {
            Some(Fact::Malformed) => self.stats.decode_errors += 1,
            Some(Fact::DeviceIsGpu {
                device_instance,
                gpu_id,
            }) => self.gpus.learn(device_instance, gpu_id),
            None => {}
        }
        let emitted = self.emit_selected(&events);
        events.clear();
        self.events = events;
        emitted?;
        if matches!(record, RawRecord::ProcessExit(_)) {
            self.process_names.remove(&pid);
            self.attributions.remove(&pid);
            self.outputs.process_exited(pid);
        }
        Ok(())
    }

    /// The GPU an event's task is on, as nvidia-smi names it, when known and when the event's
    /// vendor numbers GPUs by RM device instance ([`GpuNumbering::RmDevice`]): that instance
    /// from the event itself (`TASK_INIT`, `WORK_SUBMIT`) or from the task's earlier events.
    fn gpu_of(&mut self, event: &Event) -> Option<GpuIdentity> {
        let own = event.kind.driver_gpu().flatten();
        if event.gpu_numbering() != GpuNumbering::RmDevice {
            return None;
        }
        let key = event.key?;
        // A task's last event takes its entry with it: a long run keeps only live tasks.
        let ended = matches!(event.kind, EventKind::TaskDestroy { .. });
        let device = match (own, ended) {
            (Some(d), _) => {
                self.task_devices.insert(key, d);
                d
            }
            (None, false) => *self.task_devices.get(&key)?,
            (None, true) => self.task_devices.remove(&key)?,
        };
        self.gpus.resolve(device)
    }

    /// Process `pid` runs in the cgroup `a` describes (from now on).
    fn attribute(&mut self, pid: u32, a: Attribution) {
        self.attributions.insert(pid, a);
        self.name_pod(pid);
        let Some(a) = self.attributions.get(&pid) else {
            return;
        };
        self.pod_filter.saw(a);
        if let Some(group) = a.group() {
            self.stats.set_group(pid, group, a.row_label());
        }
    }

    /// Names the pod of process `pid` when it is in one not named yet (asked again at its
    /// events until the resolver knows it: a pod's directory may appear after its process; the
    /// resolver bounds how often it rereads). Once named, its row label (statistics, `top`)
    /// names it too.
    fn name_pod(&mut self, pid: u32) {
        let (Some(r), Some(a)) = (self.pods.as_mut(), self.attributions.get_mut(&pid)) else {
            return;
        };
        let Some((uid, _)) = a.workload.pod.as_ref().filter(|_| a.names.is_none()) else {
            return;
        };
        let container = a.workload.container.as_ref().map(|(_, id)| id.as_str());
        a.names = r.resolve(uid, container);
        if a.names.is_some() {
            self.pod_filter.saw(a);
            if let Some(group) = a.group() {
                self.stats.set_group(pid, group, a.row_label());
            }
        }
    }

    /// `--pod`, `--namespace`: only the processes in one of `pods` (a pod's name, or its UID)
    /// and, when `namespaces` is not empty, in one of `namespaces`, as the node names them
    /// ([`with_pod_names`](Self::with_pod_names)); they apply where `--pid`/`--comm` do.
    /// A process whose pod is not named (yet) is left out.
    pub fn with_pod_filter(mut self, pods: Vec<String>, namespaces: Vec<String>) -> Self {
        self.pod_filter = PodFilter {
            pods,
            namespaces,
            ..PodFilter::default()
        };
        self
    }

    /// `--pod`/`--namespace` values that named none of the pods of the run's processes, each
    /// a warning line naming the pods there were; empty when each matched one (call at the end
    /// of the run).
    pub fn unmatched_pod_selectors(&self) -> Vec<String> {
        self.pod_filter.unmatched(self.pods.is_some())
    }

    /// `--gpu`: only the events on one of `gpus` (each an nvidia-smi index, a UUID or a PCI bus
    /// id, as [`gpu_matches`] reads them). An event whose GPU is not known is left out and
    /// counted (`gpu_unknown` among the statistics' unreported reasons).
    pub fn with_gpu_filter(mut self, gpus: Vec<String>) -> Self {
        self.gpu_filter = gpus;
        self
    }

    /// `--gpu` selectors that name none of the GPUs the inventory found (after
    /// [`inventory`](Self::inventory)), each with the GPUs there are (`0 GPU-… 0000:00:06.0`);
    /// empty when every selector names one. When the run lists no GPU at all (a recording made
    /// before recordings listed the host's GPUs, a host without the NVIDIA driver), no event
    /// can pass any selector: one line says so.
    pub fn unmatched_gpu_selectors(&self) -> Vec<String> {
        let gpus = self.gpus.all();
        if gpus.is_empty() {
            if self.gpu_filter.is_empty() {
                return Vec::new();
            }
            let sels: Vec<String> = (self.gpu_filter.iter())
                .map(|s| crate::escape::escape_text(s).into_owned())
                .collect();
            return vec![format!(
                "--gpu {}: this run lists no NVIDIA GPU (a recording made before gpu-trace \
                 recorded the host's GPUs, or no NVIDIA driver), so it cannot tell which GPU an \
                 event is on: no event will pass it",
                sels.join(", --gpu ")
            )];
        }
        let known: Vec<String> = (gpus.iter())
            .map(|g| {
                format!(
                    "{} {} {}",
                    g.index,
                    g.uuid.as_deref().unwrap_or("?"),
                    g.bus_id
                )
            })
            .collect();
        (self.gpu_filter.iter())
            .filter(|sel| !gpus.iter().any(|g| gpu_matches(g, sel)))
            .map(|sel| {
                format!(
                    "--gpu {} names none of the GPUs ({}): no event will pass it",
                    crate::escape::escape_text(sel),
                    known.join(", ")
                )
            })
            .collect()
    }

    /// From now on, only the events of `pid` (with `true`) and of the processes
    /// [`follow`](Self::follow) adds pass; `false` forgets `pid` again (its id was reused by a
    /// process the caller does not follow).
    pub fn follow(&mut self, pid: u32, follow: bool) {
        let set = self.followed.get_or_insert_with(Default::default);
        if follow {
            set.insert(pid);
        } else {
            set.remove(&pid);
        }
    }

    /// Whether process `pid` passes [`follow`](Self::follow)'s filter.
    fn followed(&self, pid: u32) -> bool {
        self.followed.as_ref().is_none_or(|f| f.contains(&pid))
    }

    /// Emits the events that pass the filters.
    fn emit_selected(&mut self, events: &[Event]) -> Result<(), SinkError> {
        for event in events {
            if !self.selected(event) {
                continue;
            }
            let gpu = self.gpu_of(event);
            if !self.gpu_filter.is_empty() {
                match &gpu {
                    Some(g) if self.gpu_filter.iter().any(|sel| gpu_matches(g, sel)) => {}
                    Some(_) => continue,
                    None => {
                        self.gpu_unknown += 1;
                        continue;
                    }
                }
            }
            self.emit(event, gpu.as_ref())?;
        }
        Ok(())
    }

    fn selected(&mut self, event: &Event) -> bool {
        self.process_selected(event.origin.pid, &event.origin.comm)
    }

    /// Whether `--pod`/`--namespace` select process `pid` (named first, when its pod was not
    /// yet: its directory may have come since).
    fn pod_selected(&mut self, pid: u32) -> bool {
        if self.pod_filter.is_empty() {
            return true;
        }
        self.name_pod(pid);
        self.pod_filter.selects(self.attributions.get(&pid))
    }

    /// Whether `--pid`/`--comm`/`-- CMD`/`--pod`/`--namespace` select process `pid`, whose
    /// record's thread name is `comm`.
    fn process_selected(&mut self, pid: u32, comm: &str) -> bool {
        let pid_ok =
            (self.config.pids.is_empty() || self.config.pids.contains(&pid)) && self.followed(pid);
        let comm_ok =
            self.config.comms.is_empty()
                || self.config.comms.iter().any(|c| {
                    *c == comm || self.process_names.get(&pid).is_some_and(|name| name == c)
                });
        pid_ok && comm_ok && self.pod_selected(pid)
    }

    /// An API record made in userspace, not read from the ring (`API_PATH` verdicts,
    /// `API_HANDOUT`s): the same filters and sinks as the kernel's records. `origin`: when it
    /// was made, and its process.
    pub fn api_event(&mut self, event: &ApiEvent, origin: &Origin) -> Result<(), SinkError> {
        self.emit_api(event, origin)
    }

    /// Hands an API record that passes `--pid`/`--comm`/`-- CMD` to each sink (`--gpu` does
    /// not apply: an API call is on no GPU).
    fn emit_api(&mut self, event: &ApiEvent, origin: &Origin) -> Result<(), SinkError> {
        let pid = event.pid();
        if !self.process_selected(pid, &origin.comm) {
            return Ok(());
        }
        self.name_pod(pid);
        let ev = ApiEnriched {
            event,
            origin,
            process: self
                .process_names
                .get(&pid)
                .map_or(origin.comm.as_str(), String::as_str),
            cgroup: self.attributions.get(&pid),
        };
        self.stats.api(&ev)?;
        self.outputs.api(&ev)
    }

    /// Adds what is known of the event's process and task, and hands it to each sink: the
    /// statistics, then the outputs.
    fn emit(&mut self, event: &Event, gpu: Option<&GpuIdentity>) -> Result<(), SinkError> {
        if matches!(
            event.kind,
            EventKind::TaskInit { .. } | EventKind::Schedule { .. } | EventKind::SchedUpdate { .. }
        ) {
            self.share_params(event);
        }
        self.name_pod(event.origin.pid);
        let ev = Enriched {
            event,
            process: self
                .process_names
                .get(&event.origin.pid)
                .map_or(event.origin.comm.as_str(), String::as_str),
            gpu,
            cgroup: self.attributions.get(&event.origin.pid),
            trace_start_ns: self.first_ts.unwrap_or(event.origin.ts_ns),
        };
        self.stats.event(&ev)?;
        self.outputs.event(&ev)
    }

    /// The event's scheduling parameters, for the share before/after each change.
    fn share_params(&mut self, event: &Event) {
        let clock = &self.config.clock;
        self.stats.share.observe(event, || {
            u64::try_from(clock.realtime_ns(event.origin.ts_ns) / 1000).unwrap_or(0)
        });
    }

    /// NVML per-process utilization samples (the live sampler, or a recording): counted for
    /// the statistics and `top`, and handed to the outputs (a `GPU_SHARE` line each, gauges,
    /// counters); `--pid`/`--comm`/`-- CMD` select them as they select events.
    pub fn share_samples(&mut self, samples: &[ShareSample]) -> Result<(), SinkError> {
        // `--pod`/`--namespace` first: naming a pod needs the pipeline itself.
        let by_pod: Vec<bool> = samples.iter().map(|s| self.pod_selected(s.pid)).collect();
        let mut selected = Vec::with_capacity(samples.len());
        for (s, pod_ok) in samples.iter().zip(by_pod) {
            let process = self.process_names.get(&s.pid).map(String::as_str);
            let pid_ok = (self.config.pids.is_empty() || self.config.pids.contains(&s.pid))
                && self.followed(s.pid);
            let comm_ok = self.config.comms.is_empty()
                || process.is_some_and(|c| self.config.comms.iter().any(|x| x == c));
            if !(pid_ok && comm_ok && pod_ok) {
                continue;
            }
            self.stats.share.add(s);
            selected.push(ShareEnriched {
                sample: s,
                process,
                cgroup: self.attributions.get(&s.pid),
            });
        }
        let batch = ShareBatch {
            samples: &selected,
            model: &self.stats.share,
            window_us: self.share_window_us(),
            processes: &self.process_names,
            cgroups: &self.attributions,
        };
        self.outputs.shares(&batch)
    }

    /// The share's window: `--interval`, else 10 s.
    fn share_window_us(&self) -> u64 {
        self.interval
            .as_ref()
            .map_or(10_000_000, |p| (p.period_ns / 1000).max(1))
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        let untracked = self.untracked_handles();
        self.outputs
            .flush(&self.stats, untracked)
            .map_err(SinkError::into_io)
    }

    /// The CLOCK_MONOTONIC times of the first and the last record seen (`None`: none yet).
    pub fn record_times(&self) -> Option<(u64, u64)> {
        self.first_ts.zip(self.last_ts)
    }

    /// Time between the first and the last record seen.
    pub fn span(&self) -> Duration {
        match (self.first_ts, self.last_ts) {
            (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
            _ => Duration::ZERO,
        }
    }

    /// Ends the run: prints the statistics (with the kernel's counters) and returns the summary.
    pub fn finish(self, counters: KernelCounters, duration: Duration) -> std::io::Result<Summary> {
        let f = self.finish_all(counters, duration);
        match f.errors.into_iter().next() {
            Some(e) => Err(e.into_io()),
            None => Ok(f.summary),
        }
    }

    /// Ends the run like [`finish`](Self::finish), but goes on past a failing output: the
    /// Perfetto timeline is closed even when the output failed, and the reverse; each result is
    /// returned, with the output writer and the statistics as text (for standard error when the
    /// output could not take them).
    pub fn finish_all(mut self, counters: KernelCounters, duration: Duration) -> Finished<W> {
        self.stats.kernel = counters;
        self.stats.elapsed = Some(duration);
        let untracked = self.untracked_handles();
        let last_ts = self.last_ts.unwrap_or(0);
        self.stats.live_at_exit = self.sources.live_tasks() as u64;
        self.stats.unreported = self.unreported();
        let share_window_us = self.share_window_us();
        let stats_text = self.config.stats.then(|| {
            let mut text = match &self.host {
                Some(host) => self.stats.render_text_titled(
                    self.config.verbose,
                    &format!(
                        "gpu-trace statistics of {}",
                        crate::escape::escape_text(host)
                    ),
                ),
                None => self.stats.render_text(self.config.verbose),
            };
            for line in self.stats.share.render_lines(share_window_us) {
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        let end = RunEnd {
            stats: &self.stats,
            counters,
            last_ts,
            untracked,
            stats_text: stats_text.as_deref(),
            share_window_us,
        };
        let errors = self.outputs.finish_each(&end);
        Finished {
            summary: Summary {
                events: self.stats.events(),
                dropped: counters.dropped,
                truncated: self.stats.kernel_unknown,
                ..Summary::default()
            },
            out: self.outputs.into_out(),
            errors,
            stats_text,
        }
    }

    /// The output writer (live runs check their output queue through it).
    pub fn output(&self) -> &W {
        self.outputs.out()
    }

    /// The output writer itself, for text a caller writes between two records (flush the
    /// pipeline first: `gpu-trace api`'s call tables).
    pub fn output_mut(&mut self) -> &mut W {
        self.outputs.out_mut()
    }

    /// The statistics, for counters the caller knows (records lost on the way, output lost).
    pub fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }

    /// Calls and events on handles the trackers did not remember (their caps were reached).
    fn untracked_handles(&self) -> u64 {
        self.sources.untracked_handles()
    }

    /// The trackers' counters of calls that produced no event, by reason (non-zero only).
    fn unreported(&self) -> crate::sink::Unreported {
        let mut reasons = self.sources.unreported();
        if self.gpu_unknown > 0 {
            reasons.insert("gpu_unknown", self.gpu_unknown);
        }
        for (&reason, &n) in &self.left_out {
            *reasons.entry(reason).or_default() += n;
        }
        reasons
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// `--pod`, `--namespace` ([`Pipeline::with_pod_filter`]), and the pods the run's processes
/// were in, for the warning about a value that named none.
#[derive(Default)]
struct PodFilter {
    pods: Vec<String>,
    namespaces: Vec<String>,
    /// The pods of the run's processes: UID → `namespace/name` where named (at most
    /// [`PodFilter::MAX_SEEN`]).
    seen: std::collections::BTreeMap<String, Option<(String, String)>>,
}

impl PodFilter {
    /// Pods remembered for the warning (a node runs at most a few hundred).
    const MAX_SEEN: usize = 4096;

    fn is_empty(&self) -> bool {
        self.pods.is_empty() && self.namespaces.is_empty()
    }

    /// Remembers the pod of `a` (only with a filter: nothing to warn about otherwise).
    fn saw(&mut self, a: &Attribution) {
        if self.is_empty() {
            return;
        }
        let Some((uid, _)) = a.workload.pod.as_ref() else {
            return;
        };
        let names = (a.names.as_ref()).map(|n| (n.namespace.clone(), n.pod.clone()));
        if self.seen.len() < Self::MAX_SEEN || self.seen.contains_key(uid) {
            let known = self.seen.entry(uid.clone()).or_default();
            if names.is_some() {
                *known = names;
            }
        }
    }

    /// Whether the process `a` describes passes: its pod's name (or UID) is one of `pods`, its
    /// namespace one of `namespaces` (each list where given).
    fn selects(&self, a: Option<&Attribution>) -> bool {
        a.is_some_and(|a| a.in_pods(&self.pods, &self.namespaces))
    }

    /// A warning for each value that named none of the pods seen; `resolver`: pods could be
    /// named at all.
    fn unmatched(&self, resolver: bool) -> Vec<String> {
        use crate::escape::escape_text;
        let named = || self.seen.values().flatten();
        let mut seen: Vec<String> = (self.seen.iter())
            .map(|(uid, n)| match n {
                Some((ns, pod)) => format!("{}/{} ({uid})", escape_text(ns), escape_text(pod)),
                None => format!("{uid} (not named)"),
            })
            .take(8)
            .collect();
        if self.seen.len() > seen.len() {
            seen.push(format!("{} more", self.seen.len() - seen.len()));
        }
        let there = if self.seen.is_empty() {
            "no traced process was in a Kubernetes pod".to_string()
        } else {
            format!("the traced processes' pods: {}", seen.join(", "))
        };
        let why = if resolver {
            String::new()
        } else {
            " (a replay names pods only with --pods-dir DIR)".to_string()
        };
        let mut out = Vec::new();
        for p in &self.pods {
            if !(self.seen.iter()).any(|(uid, n)| uid == p || n.as_ref().is_some_and(|n| n.1 == *p))
            {
                let p = escape_text(p);
                out.push(format!("--pod {p} named no pod of the run ({there}){why}"));
            }
        }
        for ns in &self.namespaces {
            if !named().any(|n| n.0 == *ns) {
                let ns = escape_text(ns);
                out.push(format!(
                    "--namespace {ns} named no pod's namespace of the run ({there}){why}"
                ));
            }
        }
        out
    }
}

/// Whether `sel` (`--gpu`) names GPU `g`: its nvidia-smi index (`1`), its UUID (`GPU-…`, any
/// case) or its PCI bus id (`0000:00:07.0`, `00000000:00:07.0` or `00:07.0`).
pub fn gpu_matches(g: &GpuIdentity, sel: &str) -> bool {
    let sel = sel.trim();
    if let Ok(index) = sel.parse::<u32>() {
        return g.index == index;
    }
    if g.uuid
        .as_deref()
        .is_some_and(|u| u.eq_ignore_ascii_case(sel))
    {
        return true;
    }
    let full = if sel.matches(':').count() == 1 {
        format!("0000:{sel}")
    } else {
        sel.to_string()
    };
    let pci = crate::model::gpus::parse_bus_id(&full);
    pci.is_some() && pci == crate::model::gpus::parse_bus_id(&g.bus_id)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::source::nvidia::decode::testrec;
    use gpu_trace_common::nvidia::cmd;

    /// A writer whose bytes the test reads afterwards.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Replay's `--interval 0.01` over records whose clock jumps by 1000 s (100 000 empty
    /// intervals) and by almost 2⁶⁴ ns: one block per record that crosses boundaries, never one
    /// per empty interval.
    #[test]
    fn replay_interval_blocks_are_bounded_by_the_records_whatever_the_clock_does() {
        let config = PipelineConfig {
            verbose: false,
            pids: Vec::new(),
            comms: Vec::new(),
            format: Format::Text,
            timestamps: TimestampMode::default(),
            stats: true,
            clock: Clock::new(0),
            show_container: false,
        };
        let side = Shared::default();
        let mut p = Pipeline::new(config, Vec::new()).with_interval(
            Duration::from_millis(10),
            true,
            Box::new(side.clone()),
        );
        let times = [
            1_000_000,
            5_000_000,
            25_000_000,
            1_000_025_000_000,
            1_000_025_000_001,
            u64::MAX - 1,
            u64::MAX,
        ];
        for (i, ts) in times.into_iter().enumerate() {
            let mut r = testrec::control(
                7,
                3,
                0xC1D0_0001,
                0x5C00_0000 + i as u32,
                cmd::TSG_GPFIFO_SCHEDULE,
                0,
                &[1, 0, 0],
            )
            .rec;
            r.hdr.ts_ns = ts;
            p.feed(crate::wire::nv_ioctl_bytes(&r)).unwrap();
        }
        let text = String::from_utf8(side.0.lock().unwrap().clone()).unwrap();
        let titles: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("--- gpu-trace statistics so far ("))
            .collect();
        // The 3rd record crosses 10 and 20 ms (one block, at 20 ms); the 4th 100 000 boundaries
        // (one block, at 1000.02 s); the 6th the rest of the clock (one block). The text shows
        // tenths of seconds.
        assert_eq!(titles.len(), 3, "{titles:#?}");
        assert!(titles[0].contains("(0.0 s)"), "{titles:#?}");
        assert!(titles[1].contains("(1000.0 s)"), "{titles:#?}");
    }

    /// Records of the tracer's own process are counted where the statistics and `STATS` show
    /// the calls that gave no event (`own_process`), and only when there were some.
    #[test]
    fn the_tracers_own_records_are_counted_as_unreported() {
        let config = PipelineConfig::json_for_tests(false);
        let stats_of = |own: u64| {
            let mut p = Pipeline::new(config.clone(), Vec::new());
            for _ in 0..own {
                p.left_out("own_process", 1);
            }
            let f = p.finish_all(KernelCounters::default(), Duration::from_secs(1));
            let out = String::from_utf8(f.out).unwrap();
            let last: serde_json::Value =
                serde_json::from_str(out.lines().last().unwrap()).unwrap();
            last["unreported"]["own_process"].clone()
        };
        assert_eq!(stats_of(4), 4);
        // Only the reasons with a count.
        assert!(stats_of(0).is_null());
    }
}
