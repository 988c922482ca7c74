//! Statistics of a trace: event counts, per-process counts, and the health counters of the
//! kernel side and of the userspace reader. Printed at the end of a trace
//! ([`Stats::render_text`], or `output::stats_json::stats_json`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::api::stats::CallStats;
use crate::event::{DestroyCause, Event, EventKind, Interleave, SchedChange, TaskKey};

/// At most this many ended tasks are kept for the per-task statistics; the ones after are only
/// counted ([`Stats::tasks_omitted`]).
pub const MAX_TASKS_KEPT: usize = 10_000;

/// At most this many live tasks are followed (tasks of processes that started before tracing
/// never end in the events, so they would otherwise pile up); the ones after are only counted
/// ([`Stats::tasks_omitted`]).
pub const MAX_LIVE_TASKS: usize = 100_000;

/// At most this many live tasks of one process are followed (a process can name any number of
/// handles it never created); the ones after are only counted ([`Stats::tasks_omitted`]).
pub const MAX_LIVE_TASKS_PER_PROCESS: usize = 4096;

/// At most this many tasks are listed in the text statistics (JSON lists all that are kept).
pub const MAX_TASKS_PRINTED: usize = 50;

/// `--api`: (process, library, symbol) rows of API call figures kept at most; a new row past
/// it is counted in [`Stats::api_dropped`], not kept.
pub const MAX_API_ROWS: usize = 65_536;

/// What one task (TSG / KFD queue) did, from its events: for experiments (latencies, final
/// parameters, preemptions). Times are CLOCK_MONOTONIC ns of the events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskStats {
    /// Run-unique identity (`PID:0xCLIENT:0xHANDLE`, see docs/events.md).
    pub key: TaskKey,
    pub pid: u32,
    /// The task column of the text output when the task was last seen.
    pub task: String,
    /// NVIDIA engine (`GRAPHICS`, `COPY`, ...) or AMD queue type; `None` when not known.
    pub engine: Option<String>,
    /// The driver's number of the task's GPU (NVIDIA RM device instance, AMD KFD `gpu_id`);
    /// the JSON row writes the number users read ([`Stats::shown_gpu`]) and RM's apart.
    #[serde(skip)]
    pub gpu: Option<u32>,
    pub runlist: Option<u32>,
    /// `TASK_INIT` (`None`: created before tracing).
    pub init_ns: Option<u64>,
    /// First allowed `SCHEDULE`.
    pub first_schedule_ns: Option<u64>,
    /// First `WORK_SUBMIT`.
    pub first_submit_ns: Option<u64>,
    /// `TASK_DESTROY` (`None`: still alive).
    pub end_ns: Option<u64>,
    /// Why it ended (`None`: still alive).
    pub end_cause: Option<DestroyCause>,
    /// `SCHEDULE`s the driver refused.
    pub schedule_refused: u64,
    /// Timeslice the task runs with as far as its events say (last `TASK_INIT`/`SCHEDULE`
    /// value or accepted change; the `TASK_DESTROY`'s final value where it has one).
    pub timeslice_us: Option<u64>,
    pub interleave: Option<Interleave>,
    /// Preemption requests (`SCHED_UPDATE preempt`), allowed or not.
    pub preemptions: u64,
    /// Accepted parameter changes (timeslice, interleave, run state, AMD priority/percentage/CU
    /// mask).
    pub param_changes: u64,
    /// Refused `SCHED_UPDATE`s.
    pub updates_refused: u64,
}

impl TaskStats {
    /// A task first seen now: nothing known of it yet.
    fn new(key: TaskKey, pid: u32, task: &str) -> Self {
        Self {
            key,
            pid,
            task: task.to_string(),
            engine: None,
            gpu: None,
            runlist: None,
            init_ns: None,
            first_schedule_ns: None,
            first_submit_ns: None,
            end_ns: None,
            end_cause: None,
            schedule_refused: 0,
            timeslice_us: None,
            interleave: None,
            preemptions: 0,
            param_changes: 0,
            updates_refused: 0,
        }
    }

    fn between(a: Option<u64>, b: Option<u64>) -> Option<u64> {
        Some(b?.saturating_sub(a?))
    }

    /// `TASK_INIT` → `TASK_DESTROY`, ns.
    pub fn lifetime_ns(&self) -> Option<u64> {
        Self::between(self.init_ns, self.end_ns)
    }

    /// `TASK_INIT` → first allowed `SCHEDULE`, ns.
    pub fn init_to_schedule_ns(&self) -> Option<u64> {
        Self::between(self.init_ns, self.first_schedule_ns)
    }

    /// `TASK_INIT` → first `WORK_SUBMIT` (the first work-submit token), ns.
    pub fn init_to_submit_ns(&self) -> Option<u64> {
        Self::between(self.init_ns, self.first_submit_ns)
    }
}

/// Counts per engine (NVIDIA engine or AMD queue type).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EngineStats {
    pub task_init: u64,
    pub schedule: u64,
    pub sched_update: u64,
    pub preempt: u64,
}

/// Live tasks now and at most, on one GPU or one runlist of a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Concurrency {
    pub live: u64,
    pub max_live: u64,
}

impl Concurrency {
    fn up(&mut self) {
        self.live += 1;
        self.max_live = self.max_live.max(self.live);
    }

    fn down(&mut self) {
        self.live = self.live.saturating_sub(1);
    }
}

/// Counters kept by the kernel programs, read from their map at the end of the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelCounters {
    /// Records lost because the ring buffer was full.
    pub dropped: u64,
    /// Records sent without their driver arguments because reading user memory failed.
    pub read_failed: u64,
    /// Driver calls seen but not of interest (other ioctl commands, classes).
    pub ignored: u64,
    /// Records written to the ring buffer.
    pub emitted: u64,
    /// Calls whose file descriptor could not be resolved to its file.
    pub fd_lookup_failed: u64,
    /// Scheduling requests refused by `--deny-pid` (BPF LSM).
    #[serde(default)]
    pub denied: u64,
    /// Runs of the kernel programs the kernel skipped because the program was already running
    /// on that CPU (`recursion_misses`): each a call not looked at, a GPU call among them lost.
    /// `None`: not known (a recording made before gpu-trace counted them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<u64>,
    /// Of `denied`, the scheduling requests refused without reading `bEnable` (failing closed:
    /// FINN-serialized parameters, or a block the BPF helper could not read).
    /// `None`: not known (a recording made before gpu-trace counted them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_unread: Option<u64>,
    /// Processes created by a denied process that could not be added to the deny map (full):
    /// these were NOT denied. `None`: not known (a recording made before gpu-trace counted them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_unfollowed: Option<u64>,
}

impl KernelCounters {
    /// The warning when a denial did not hold: processes created by denied processes that the
    /// full deny map could not take ran undenied. `None` when there were none (or not known).
    pub fn deny_unfollowed_warning(&self) -> Option<String> {
        let n = self.deny_unfollowed.filter(|&n| n > 0)?;
        Some(format!(
            "WARNING: {n} process(es) created by denied processes were NOT denied: the deny map \
             was full (docs/troubleshooting.md, \"Denied processes not followed\")"
        ))
    }
}

/// Event counts of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// The `comm` of the first event seen from the process.
    pub comm: String,
    /// `TASK_INIT` events.
    pub task_init: u64,
    /// `SCHEDULE` events, allowed or not.
    pub schedule: u64,
    /// `SCHEDULE` events the driver refused (`allowed=no`).
    pub schedule_refused: u64,
    /// `WORK_SUBMIT` events.
    pub work_submit: u64,
    /// `TASK_DESTROY` events.
    pub task_destroy: u64,
    /// `SCHED_UPDATE` events, allowed or not.
    pub sched_update: u64,
    /// Of those, preemption requests.
    pub preempt: u64,
    /// When the process exited (ns, the event clock): the time of its first `TASK_DESTROY`
    /// with cause `process_exit`; cleared by any later event of the pid other than a
    /// `TASK_DESTROY` (the pid reused). `None` while it runs, or when its exit is not known
    /// (it freed everything before exiting). Its tasks the tracer cannot end one by one (an
    /// MPS client's channels on the server's TSG, [`TaskId::Shared`](crate::event::TaskId))
    /// are not live from then on: `top` counts them so.
    pub exited_ns: Option<u64>,
}

impl ProcessStats {
    /// Adds `other`'s event counts to these (the name stays).
    fn add(&mut self, other: &ProcessStats) {
        self.task_init += other.task_init;
        self.schedule += other.schedule;
        self.schedule_refused += other.schedule_refused;
        self.sched_update += other.sched_update;
        self.preempt += other.preempt;
        self.work_submit += other.work_submit;
        self.task_destroy += other.task_destroy;
    }
}

/// Statistics of a whole trace. The event counts come from [`Stats::record`]; the other
/// counters are set by whoever knows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `TASK_INIT` events.
    pub task_init: u64,
    /// `SCHEDULE` events, allowed or not.
    pub schedule: u64,
    /// `SCHEDULE` events the driver refused (`allowed=false`).
    pub schedule_refused: u64,
    /// `WORK_SUBMIT` events.
    pub work_submit: u64,
    /// `SCHED_UPDATE` events, allowed or not.
    pub sched_update: u64,
    /// `SCHED_UPDATE` events the driver refused.
    pub sched_update_refused: u64,
    /// `SCHED_UPDATE` preemption requests.
    pub preempt: u64,
    /// `TASK_DESTROY` events (not counting [`DestroyCause::TracerExit`]).
    pub task_destroy: u64,
    /// Of [`task_destroy`](Self::task_destroy), those that were implicit (fd close, exit).
    pub task_destroy_implicit: u64,
    /// `PRETRACE_END` events (late attach: objects made before tracing ended).
    pub pretrace_end: u64,
    /// `MPS_SHARED` events (an MPS client's TSG related to the server's).
    pub mps_shared: u64,
    /// The kernel side's counters.
    pub kernel: KernelCounters,
    /// The kernel counters are not known (the replay of a recording cut short, without its
    /// trailer): `kernel` is all zeros, shown as unknown (`?`, JSON null), never as 0.
    pub kernel_unknown: bool,
    /// Records that userspace could not parse (short, unknown kind).
    pub malformed: u64,
    /// Driver calls whose arguments could not be decoded.
    pub decode_errors: u64,
    /// Objects still alive when tracing stopped. [`Stats::record`] counts the
    /// [`DestroyCause::TracerExit`] events here; set it directly only if those are not recorded.
    pub live_at_exit: u64,
    /// Samples the ring buffer reader reports lost, if it reports any. Live runs: records the
    /// kernel counted as sent (`emitted`) that userspace never read (0 since the shutdown
    /// drains the ring after detaching; `Some` only when not 0).
    pub lost_samples: Option<u64>,
    /// Output lines (standard output or `-o`) dropped because the reader did not keep up.
    pub output_lost: u64,
    /// Records of `--record` dropped because the recording's reader did not keep up.
    pub recording_lost: u64,
    /// `--flight-recorder`: its triggers and dumps (`None` without it).
    pub flight: Option<FlightStats>,
    /// Driver calls of interest that produced no event, by reason (e.g. `schedule_disable`,
    /// `schedule_unreadable`, `unknown_handle`): set from the trackers' counters at the end, so
    /// that nothing the tracer saw disappears without a count. Zero entries are left out.
    pub unreported: std::collections::BTreeMap<&'static str, u64>,
    /// How long the trace ran; when `None`, the span from the first to the last event is shown.
    pub elapsed: Option<Duration>,
    first_ts_ns: Option<u64>,
    last_ts_ns: Option<u64>,
    pub(crate) processes: BTreeMap<u32, ProcessStats>,
    /// The container / pod each process runs in (its statistics row label), for processes in
    /// one.
    groups: BTreeMap<u32, String>,
    /// `top`'s label of each process in a pod the node named (`NAMESPACE/NAME` first: the
    /// column is narrow), where it differs from its group label.
    row_labels: BTreeMap<u32, String>,
    /// RM device instance → nvidia-smi's index and the UUID, where known (`model::gpus`).
    pub(crate) gpu_names: BTreeMap<u32, (u32, Option<String>)>,
    /// The GPU numbers are the driver's own ids (an event numbered so was counted, AMD's KFD
    /// `gpu_id`s; one vendor per run), not RM device instances.
    driver_gpu_ids: bool,
    /// Tasks alive (as far as the events go), by key.
    pub(crate) live_tasks: BTreeMap<TaskKey, TaskStats>,
    /// Live tasks followed per process (for [`MAX_LIVE_TASKS_PER_PROCESS`]).
    live_per_process: std::collections::HashMap<u32, usize>,
    /// Tasks that ended, in the order they ended (at most [`MAX_TASKS_KEPT`]).
    pub(crate) ended_tasks: Vec<TaskStats>,
    /// Tasks and events not followed: ended tasks beyond [`MAX_TASKS_KEPT`], and events of new
    /// tasks while [`MAX_LIVE_TASKS`] were alive.
    pub tasks_omitted: u64,
    pub(crate) engines: BTreeMap<String, EngineStats>,
    pub(crate) gpus: BTreeMap<Option<u32>, Concurrency>,
    runlists: BTreeMap<(Option<u32>, u32), Concurrency>,
    /// NVML per-process GPU share samples, with the processes' scheduling parameters
    /// ([`super::share`]; empty without samples).
    pub share: super::share::ShareModel,
    /// `--api`: the latest figures (the kernel's sums so far) per (process, library, symbol);
    /// a process that exited keeps its last row. At most [`MAX_API_ROWS`].
    pub(crate) api: BTreeMap<(u32, String, String), CallStats>,
    /// `API_STATS` records of new rows not kept because [`MAX_API_ROWS`] rows were kept.
    pub api_dropped: u64,
    /// `--api`: each process's name as its `API_STATS` records give it (for a process that
    /// made API calls and no driver event: `top` names its row). Kept for the processes of
    /// the kept rows only.
    api_names: BTreeMap<u32, String>,
    /// `--api`: each process's calls (summed over its rows) at the last two reads that sent
    /// it records, `[previous, latest]` as (read time ns, calls): `top`'s rate.
    api_reads: BTreeMap<u32, [(u64, u64); 2]>,
    /// `--api`: the latest `API_PATH` per (process, interposer). At most [`MAX_API_PATHS`].
    pub(crate) api_paths: BTreeMap<(u32, String), crate::api::path::ApiPath>,
    /// `--api -v`: per process, its hand-outs.
    pub(crate) handouts: BTreeMap<u32, HandoutTally>,
}

/// A process's hand-outs: all counted, the hidden ones too, the first
/// [`MAX_HIDDEN_SHOWN`] hidden ones kept to be named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandoutTally {
    pub count: u64,
    pub hidden: u64,
    pub shown: Vec<crate::api::path::Handout>,
}

/// (process, interposer) verdicts kept for the statistics; processes whose hand-outs are kept.
pub const MAX_API_PATHS: usize = 4096;
/// Hidden hand-outs listed per process in the statistics (all are counted).
pub const MAX_HIDDEN_SHOWN: usize = 16;

impl Stats {
    /// Empty statistics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one event.
    pub fn record(&mut self, ev: &Event) {
        if let EventKind::TaskDestroy {
            cause: DestroyCause::TracerExit,
            ..
        } = ev.kind
        {
            self.live_at_exit += 1;
            return;
        }
        let ts = ev.origin.ts_ns;
        self.first_ts_ns = Some(self.first_ts_ns.map_or(ts, |t| t.min(ts)));
        self.last_ts_ns = Some(self.last_ts_ns.map_or(ts, |t| t.max(ts)));
        let proc = self
            .processes
            .entry(ev.origin.pid)
            .or_insert_with(|| ProcessStats {
                comm: ev.origin.comm.to_string(),
                ..ProcessStats::default()
            });
        if !matches!(ev.kind, EventKind::TaskDestroy { .. }) {
            proc.exited_ns = None;
        }
        self.driver_gpu_ids |= ev.gpu_numbering() == crate::event::GpuNumbering::Driver;
        match &ev.kind {
            EventKind::TaskInit { .. } => {
                self.task_init += 1;
                proc.task_init += 1;
            }
            EventKind::Schedule { allowed, .. } => {
                self.schedule += 1;
                proc.schedule += 1;
                if !allowed {
                    self.schedule_refused += 1;
                    proc.schedule_refused += 1;
                }
            }
            EventKind::WorkSubmit { .. } => {
                self.work_submit += 1;
                proc.work_submit += 1;
            }
            EventKind::TaskDestroy {
                implicit, cause, ..
            } => {
                self.task_destroy += 1;
                proc.task_destroy += 1;
                if *implicit {
                    self.task_destroy_implicit += 1;
                }
                if *cause == DestroyCause::ProcessExit && proc.exited_ns.is_none() {
                    proc.exited_ns = Some(ts);
                }
            }
            EventKind::SchedUpdate {
                change, allowed, ..
            } => {
                self.sched_update += 1;
                proc.sched_update += 1;
                if !allowed {
                    self.sched_update_refused += 1;
                }
                if matches!(change, SchedChange::Preempt { .. }) {
                    self.preempt += 1;
                    proc.preempt += 1;
                }
            }
            EventKind::PretraceEnd { .. } => self.pretrace_end += 1,
            EventKind::MpsShared { .. } => self.mps_shared += 1,
        }
        self.record_task(ev);
    }

    /// The per-task, per-engine and concurrency part of [`record`](Self::record).
    fn record_task(&mut self, ev: &Event) {
        let Some(key) = ev.key else { return };
        let ts = ev.origin.ts_ns;
        if !self.admit(key, &ev.kind, ts) {
            return;
        }
        let task_label = ev.kind.task().label();
        let t = self
            .live_tasks
            .entry(key)
            .or_insert_with(|| TaskStats::new(key, ev.origin.pid, task_label.as_str()));
        if t.task != task_label.as_str() {
            t.task = task_label.as_str().to_string();
        }
        let mut joined_runlist = None;
        let engine_of_event = ev.engine().map(|e| e.name().to_string());
        match &ev.kind {
            EventKind::TaskInit {
                timeslice_us,
                interleave,
                gpu,
                runlist,
                ..
            } => {
                t.init_ns = Some(ts);
                t.engine = engine_of_event;
                t.timeslice_us = *timeslice_us;
                t.interleave = *interleave;
                t.gpu = *gpu;
                self.gpus.entry(*gpu).or_default().up();
                if let Some(r) = runlist {
                    t.runlist = Some(*r);
                    joined_runlist = Some(*r);
                }
                let e = self
                    .engines
                    .entry(t.engine.clone().unwrap_or_else(|| "?".into()))
                    .or_default();
                e.task_init += 1;
            }
            EventKind::Schedule {
                allowed,
                timeslice_us,
                interleave,
                ..
            } => {
                if *allowed {
                    t.first_schedule_ns.get_or_insert(ts);
                } else {
                    t.schedule_refused += 1;
                }
                if timeslice_us.is_some() {
                    t.timeslice_us = *timeslice_us;
                }
                if interleave.is_some() {
                    t.interleave = *interleave;
                }
                self.engine_of(&key).schedule += 1;
            }
            EventKind::WorkSubmit { runlist, gpu, .. } => {
                t.first_submit_ns.get_or_insert(ts);
                if t.gpu.is_none() {
                    t.gpu = *gpu;
                }
                if t.runlist.is_none()
                    && let Some(r) = runlist
                {
                    t.runlist = Some(*r);
                    joined_runlist = Some(*r);
                }
            }
            EventKind::SchedUpdate {
                change, allowed, ..
            } => {
                match (change, *allowed) {
                    (SchedChange::Preempt { .. }, _) => t.preemptions += 1,
                    (_, false) => {}
                    (SchedChange::Timeslice { new_us, .. }, true) => {
                        t.timeslice_us = Some(*new_us);
                        t.param_changes += 1;
                    }
                    (SchedChange::Interleave { new, .. }, true) => {
                        t.interleave = *new;
                        t.param_changes += 1;
                    }
                    (_, true) => t.param_changes += 1,
                }
                if !allowed {
                    t.updates_refused += 1;
                }
                let preempt = matches!(change, SchedChange::Preempt { .. });
                let e = self.engine_of(&key);
                e.sched_update += 1;
                e.preempt += u64::from(preempt);
            }
            EventKind::TaskDestroy {
                cause,
                final_params,
                ..
            } => {
                if let Some(f) = final_params {
                    t.timeslice_us = f.sched.timeslice_us;
                    t.interleave = f.sched.interleave;
                }
                let cause = *cause;
                if let Some(t) = self.live_tasks.remove(&key) {
                    self.end_task(t, ts, cause);
                }
                return;
            }
            // Never reached: these events carry no task key.
            EventKind::PretraceEnd { .. } | EventKind::MpsShared { .. } => {}
        }
        if let (Some(r), Some(t)) = (joined_runlist, self.live_tasks.get(&key)) {
            let gpu = t.gpu;
            self.runlists.entry((gpu, r)).or_default().up();
        }
    }

    /// Whether the task `key` has (or may now have) an entry among the live tasks: a new one
    /// only within the caps (else it is counted in `tasks_omitted`). A `TASK_INIT` of a key
    /// still alive (cannot happen with generations; kept safe) ends the old one first.
    fn admit(&mut self, key: TaskKey, kind: &EventKind, ts: u64) -> bool {
        if let EventKind::TaskInit { .. } = kind
            && let Some(old) = self.live_tasks.remove(&key)
        {
            self.end_task(old, ts, DestroyCause::TracerExit);
        }
        if !self.live_tasks.contains_key(&key) {
            let of_process = self.live_per_process.get(&key.pid).copied().unwrap_or(0);
            if self.live_tasks.len() >= MAX_LIVE_TASKS || of_process >= MAX_LIVE_TASKS_PER_PROCESS {
                self.tasks_omitted += 1;
                return false;
            }
            *self.live_per_process.entry(key.pid).or_default() += 1;
        }
        true
    }

    /// The engine counts of the live task `key`.
    fn engine_of(&mut self, key: &TaskKey) -> &mut EngineStats {
        let name = self
            .live_tasks
            .get(key)
            .and_then(|t| t.engine.clone())
            .unwrap_or_else(|| "?".into());
        self.engines.entry(name).or_default()
    }

    fn end_task(&mut self, mut t: TaskStats, ts: u64, cause: DestroyCause) {
        if let Some(n) = self.live_per_process.get_mut(&t.key.pid) {
            *n -= 1;
            if *n == 0 {
                self.live_per_process.remove(&t.key.pid);
            }
        }
        if t.init_ns.is_some() {
            self.gpus.entry(t.gpu).or_default().down();
        }
        if let Some(r) = t.runlist {
            self.runlists.entry((t.gpu, r)).or_default().down();
        }
        t.end_ns = Some(ts);
        t.end_cause = Some(cause);
        if self.ended_tasks.len() < MAX_TASKS_KEPT {
            self.ended_tasks.push(t);
        } else {
            self.tasks_omitted += 1;
        }
    }

    /// The per-task statistics: ended tasks in the order they ended, then the live ones by key.
    pub fn tasks(&self) -> impl Iterator<Item = &TaskStats> {
        self.ended_tasks.iter().chain(self.live_tasks.values())
    }

    /// Counts per engine label (`GRAPHICS`, `COPY`, ..., AMD queue types; `?` when not known).
    pub fn engines(&self) -> impl Iterator<Item = (&str, &EngineStats)> {
        self.engines.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Live tasks per GPU (`None`: GPU not known), now and at most.
    pub fn gpu_concurrency(&self) -> impl Iterator<Item = (Option<u32>, Concurrency)> + '_ {
        self.gpus.iter().map(|(&g, &c)| (g, c))
    }

    /// Live tasks per `(GPU, runlist)`, now and at most. A task counts on its runlist from the
    /// event that first names the runlist (NVIDIA: its first `WORK_SUBMIT`).
    pub fn runlist_concurrency(
        &self,
    ) -> impl Iterator<Item = ((Option<u32>, u32), Concurrency)> + '_ {
        self.runlists.iter().map(|(&k, &c)| (k, c))
    }

    /// All events counted by [`record`](Self::record) (not the tracer-exit ones).
    pub fn events(&self) -> u64 {
        self.task_init
            + self.schedule
            + self.work_submit
            + self.task_destroy
            + self.sched_update
            + self.pretrace_end
            + self.mps_shared
    }

    /// The per-process counts, by ascending pid.
    /// The container / pod label of process `pid`, where known.
    pub fn group_of(&self, pid: u32) -> Option<&str> {
        self.groups.get(&pid).map(String::as_str)
    }

    /// RM device instance `rm_device` is nvidia-smi's GPU `index` (`uuid`).
    pub fn set_gpu_name(&mut self, rm_device: u32, index: u32, uuid: Option<&str>) {
        let known = self.gpu_names.get(&rm_device);
        if known.is_none_or(|(i, u)| *i != index || u.as_deref() != uuid) {
            self.gpu_names
                .insert(rm_device, (index, uuid.map(str::to_string)));
        }
    }

    /// nvidia-smi's index and the UUID of RM device instance `rm_device`, where known.
    pub fn gpu_name(&self, rm_device: u32) -> Option<&(u32, Option<String>)> {
        self.gpu_names.get(&rm_device)
    }

    /// The number users read and `--gpu` takes for the GPU the driver numbers `driver` (a
    /// task's `gpu`, a key of [`gpu_concurrency`](Self::gpu_concurrency)): NVIDIA, nvidia-smi's
    /// index where the run learned it (`None`: not known, printed `?`); AMD, the KFD `gpu_id`.
    pub fn shown_gpu(&self, driver: Option<u32>) -> Option<u32> {
        if self.driver_gpu_ids {
            return driver;
        }
        driver.and_then(|g| self.gpu_name(g)).map(|n| n.0)
    }

    /// RM's device instance behind a GPU the driver numbers `driver`, for the outputs that
    /// keep it apart (JSON `rm_device`): `None` (not written) for AMD, whose `gpu` is the
    /// driver's number already; `Some(None)`: NVIDIA, not seen.
    pub fn rm_device(&self, driver: Option<u32>) -> Option<Option<u32>> {
        (!self.driver_gpu_ids).then_some(driver)
    }

    /// Process `pid` runs in container / pod `group` (a row label: `podman 3f2a9c1b7d0e`);
    /// `top` shows it as `row` where given (a pod's name first).
    pub fn set_group(&mut self, pid: u32, group: String, row: Option<String>) {
        self.groups.insert(pid, group);
        match row {
            Some(row) => self.row_labels.insert(pid, row),
            None => self.row_labels.remove(&pid),
        };
    }

    /// `top`'s container / pod label of process `pid`: the pod's name first where the node
    /// named it, else [`group_of`](Self::group_of).
    pub fn row_label_of(&self, pid: u32) -> Option<&str> {
        (self.row_labels.get(&pid).map(String::as_str)).or_else(|| self.group_of(pid))
    }

    /// Event counts per container / pod, by label, with how many processes each had; the
    /// processes outside containers under `None` (last). Empty when no process was in one.
    pub fn groups(&self) -> Vec<(Option<&str>, u64, ProcessStats)> {
        if self.groups.is_empty() {
            return Vec::new();
        }
        let mut by: BTreeMap<Option<&str>, (u64, ProcessStats)> = BTreeMap::new();
        for (pid, p) in &self.processes {
            let e = by
                .entry(self.groups.get(pid).map(String::as_str))
                .or_default();
            e.0 += 1;
            e.1.add(p);
        }
        let mut rows: Vec<_> = by.into_iter().map(|(g, (n, p))| (g, n, p)).collect();
        // `None` sorts first in a BTreeMap: the host row goes last.
        rows.sort_by_key(|(g, _, _)| g.is_none());
        rows
    }

    pub fn processes(&self) -> impl Iterator<Item = (u32, &ProcessStats)> {
        self.processes.iter().map(|(&pid, p)| (pid, p))
    }

    /// `--api`: a process's figures of one library's symbol so far (an `API_STATS` record):
    /// they replace the row's last ones.
    pub fn record_api(&mut self, row: &CallStats, read_ns: u64) {
        let key = (row.pid, row.library.clone(), row.symbol.clone());
        if self.api.len() >= MAX_API_ROWS && !self.api.contains_key(&key) {
            self.api_dropped += 1;
            return;
        }
        self.api.insert(key, row.clone());
        let calls = self.api_rows_of(row.pid).map(|r| r.calls).sum();
        let reads = self.api_reads.entry(row.pid).or_insert([(0, 0); 2]);
        if reads[1].0 != read_ns {
            reads[0] = reads[1];
        }
        reads[1] = (read_ns, calls);
    }

    /// `--api`: process `pid`'s API calls per second between the last two reads that sent
    /// its figures (0 after a read that found no growth; 0 until a second read; `None`: no
    /// figures). By the reads' own times, not the viewer's: a frame between two reads, or
    /// with two reads in it, shows the same rate.
    pub fn api_rate(&self, pid: u32) -> Option<f64> {
        let [(t0, c0), (t1, c1)] = *self.api_reads.get(&pid)?;
        Some(if t0 == 0 || t1 <= t0 {
            0.0
        } else {
            c1.saturating_sub(c0) as f64 * 1e9 / (t1 - t0) as f64
        })
    }

    /// `--api`: notes the name of process `pid` as its API records give it (not empty).
    pub fn name_api_process(&mut self, pid: u32, name: &str) {
        if name.is_empty() || self.api_rows_of(pid).next().is_none() {
            return;
        }
        if self.api_names.get(&pid).is_none_or(|n| n != name) {
            self.api_names.insert(pid, name.to_string());
        }
    }

    /// `--api`: the name of a process with API figures, as its records gave it.
    pub fn api_process_name(&self, pid: u32) -> Option<&str> {
        self.api_names.get(&pid).map(String::as_str)
    }

    /// `--api`: the rows of process `pid` (a range of the ordered map, not a scan of every
    /// row: this runs for each `API_STATS` record).
    fn api_rows_of(&self, pid: u32) -> impl Iterator<Item = &CallStats> {
        self.api
            .range((pid, String::new(), String::new())..)
            .take_while(move |(k, _)| k.0 == pid)
            .map(|(_, r)| r)
    }

    /// `--api`: the latest figures per (process, library, symbol), in that order.
    pub fn api_rows(&self) -> impl Iterator<Item = &CallStats> {
        self.api.values()
    }

    /// The counts of one process.
    pub fn process(&self, pid: u32) -> Option<&ProcessStats> {
        self.processes.get(&pid)
    }

    /// [`elapsed`](Self::elapsed), else the span between the first and the last event recorded
    /// (zero without events).
    pub fn duration(&self) -> Duration {
        self.elapsed
            .unwrap_or_else(|| match (self.first_ts_ns, self.last_ts_ns) {
                (Some(first), Some(last)) => Duration::from_nanos(last - first),
                _ => Duration::ZERO,
            })
    }

    /// `--api`: an interposer's verdict so far (the latest per process and library is kept).
    pub fn record_api_path(&mut self, path: &crate::api::path::ApiPath) {
        let key = (path.pid, path.library.clone());
        if self.api_paths.len() < MAX_API_PATHS || self.api_paths.contains_key(&key) {
            self.api_paths.insert(key, path.clone());
        }
    }

    /// `--api -v`: a hand-out, counted for its process (a hidden one kept to be named, up to
    /// [`MAX_HIDDEN_SHOWN`]).
    pub fn record_handout(&mut self, h: &crate::api::path::Handout) {
        if self.handouts.len() >= MAX_API_PATHS && !self.handouts.contains_key(&h.pid) {
            return;
        }
        let tally = self.handouts.entry(h.pid).or_default();
        tally.count += 1;
        if h.hidden {
            tally.hidden += 1;
            if tally.shown.len() < MAX_HIDDEN_SHOWN {
                tally.shown.push(h.clone());
            }
        }
    }
}

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;

/// The flight recorder's counts, for the statistics (text and JSON `STATS`
/// `flight_recorder`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlightStats {
    /// Triggers that came, by name (`flight::Trigger::name`), whether a dump followed or not.
    pub triggers: std::collections::BTreeMap<&'static str, u64>,
    /// Dumps written.
    pub dumps: u64,
    /// Triggers not written because `--dump-max-per-hour` dumps were written in the last hour.
    pub not_written: u64,
    /// Dumps that could not be written (the error was said on stderr).
    pub failed: u64,
}
