//! `gpu-trace top`: what the live view shows, computed from two snapshots of the statistics
//! (pure: no terminal here; `gpu-trace`'s `top` module draws it).
//!
//! Per process: live tasks (TSGs / queues) by engine, schedules and refusals per second since the
//! last frame, scheduling updates per second, the timeslice its newest live task runs with, the
//! latest `TASK_INIT` → first allowed `SCHEDULE` latency, and its container or pod. Per GPU: live
//! and most-live tasks, with nvidia-smi's index and UUID where known. The tracer's health:
//! records dropped and emitted.

use std::collections::BTreeMap;

use crate::model::stats::{KernelCounters, Stats};

/// Sort orders of the process table (`s` cycles through them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortBy {
    /// Schedules per second, then live tasks (busiest first).
    #[default]
    ScheduleRate,
    /// Live tasks, then schedules per second.
    Live,
    /// Ascending pid.
    Pid,
}

impl SortBy {
    pub fn next(self) -> Self {
        match self {
            Self::ScheduleRate => Self::Live,
            Self::Live => Self::Pid,
            Self::Pid => Self::ScheduleRate,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::ScheduleRate => "SCHED/s",
            Self::Live => "LIVE",
            Self::Pid => "PID",
        }
    }
}

/// One process row.
#[derive(Clone, PartialEq)]
pub struct ProcessRow {
    pub pid: u32,
    /// Escaped for the terminal.
    pub comm: String,
    /// Container / pod label, where known.
    pub group: Option<String>,
    /// Live tasks by engine label (`GRAPHICS` 2, `COPY` 3, ...).
    pub live: BTreeMap<String, u64>,
    pub live_total: u64,
    pub schedules_per_s: f64,
    pub refused_per_s: f64,
    pub updates_per_s: f64,
    /// Totals since the start.
    pub schedules: u64,
    pub refused: u64,
    /// Timeslice of the newest live task, µs.
    pub timeslice_us: Option<u64>,
    /// Latest `TASK_INIT` → first allowed `SCHEDULE`, µs.
    pub init_to_schedule_us: Option<u64>,
    /// GPU share over the last [`SHARE_WINDOW_US`] (NVML samples, summed over its GPUs),
    /// 0..1; `None`: no sample names it.
    pub gpu_share: Option<f64>,
}

// Debug by hand: the share fields show only when there is a share, so that a frame of a run
// without NVML samples reads as it did before they existed (the golden frames).
impl std::fmt::Debug for ProcessRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ProcessRow");
        d.field("pid", &self.pid)
            .field("comm", &self.comm)
            .field("group", &self.group)
            .field("live", &self.live)
            .field("live_total", &self.live_total)
            .field("schedules_per_s", &self.schedules_per_s)
            .field("refused_per_s", &self.refused_per_s)
            .field("updates_per_s", &self.updates_per_s)
            .field("schedules", &self.schedules)
            .field("refused", &self.refused)
            .field("timeslice_us", &self.timeslice_us)
            .field("init_to_schedule_us", &self.init_to_schedule_us);
        if let Some(share) = self.gpu_share {
            d.field("gpu_share", &share);
        }
        d.finish()
    }
}

impl std::fmt::Debug for GpuRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("GpuRow");
        d.field("gpu", &self.gpu)
            .field("name", &self.name)
            .field("live", &self.live)
            .field("max_live", &self.max_live);
        if let Some(share) = self.share {
            d.field("share", &share);
        }
        d.finish()
    }
}

/// The window of `top`'s share columns.
pub const SHARE_WINDOW_US: u64 = 5_000_000;

/// One GPU row.
#[derive(Clone, PartialEq)]
pub struct GpuRow {
    /// RM device instance (`None`: not known).
    pub gpu: Option<u32>,
    /// nvidia-smi's index and UUID, where known.
    pub name: Option<(u32, Option<String>)>,
    pub live: u64,
    pub max_live: u64,
    /// Sum of the processes' GPU shares over the last [`SHARE_WINDOW_US`] (NVML index =
    /// nvidia-smi's), 0..1; `None`: no sample.
    pub share: Option<f64>,
}

/// One frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub elapsed_s: f64,
    pub processes: Vec<ProcessRow>,
    pub gpus: Vec<GpuRow>,
    pub dropped: u64,
    pub emitted: u64,
    pub events: u64,
    pub sort: SortBy,
}

/// The counts a rate is computed from, per process, at the previous frame.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    schedule: u64,
    refused: u64,
    updates: u64,
}

/// A process's live tasks by engine, and (creation time, timeslice) of its newest.
type LiveTasks = (BTreeMap<String, u64>, Option<(u64, Option<u64>)>);

/// Orders the process rows by `by`.
pub fn sort_rows(processes: &mut [ProcessRow], by: SortBy) {
    match by {
        SortBy::ScheduleRate => processes.sort_by(|a, b| {
            b.schedules_per_s
                .total_cmp(&a.schedules_per_s)
                .then(b.live_total.cmp(&a.live_total))
                .then(a.pid.cmp(&b.pid))
        }),
        SortBy::Live => processes.sort_by(|a, b| {
            b.live_total
                .cmp(&a.live_total)
                .then(b.schedules_per_s.total_cmp(&a.schedules_per_s))
                .then(a.pid.cmp(&b.pid))
        }),
        SortBy::Pid => processes.sort_by_key(|p| p.pid),
    }
}

impl Frame {
    /// The same frame sorted by `by` (a key press between two frames).
    pub fn resort(&mut self, by: SortBy) {
        self.sort = by;
        sort_rows(&mut self.processes, by);
    }
}

/// Turns successive statistics into frames.
#[derive(Debug, Default)]
pub struct TopModel {
    previous: BTreeMap<u32, Counts>,
    previous_s: f64,
    pub sort: SortBy,
}

impl TopModel {
    /// The frame for `stats` at `elapsed_s` seconds of tracing; rates are against the previous
    /// call (the first frame's rates are over the time since the start).
    pub fn frame(
        &mut self,
        stats: &Stats,
        elapsed_s: f64,
        counters: Option<KernelCounters>,
    ) -> Frame {
        let dt = (elapsed_s - self.previous_s).max(1e-3);
        let mut live: BTreeMap<u32, LiveTasks> = BTreeMap::new();
        let mut latency: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for t in stats.tasks() {
            if let (Some(init), Some(l)) = (t.init_ns, t.init_to_schedule_ns()) {
                let e = latency.entry(t.pid).or_insert((init, l));
                if init >= e.0 {
                    *e = (init, l);
                }
            }
            if t.end_ns.is_some() {
                continue;
            }
            let e = live.entry(t.pid).or_default();
            *e.0.entry(t.engine.clone().unwrap_or_else(|| "?".into()))
                .or_default() += 1;
            // The newest live task (by creation) gives the timeslice shown.
            let born = t.init_ns.unwrap_or(0);
            if e.1.is_none_or(|(b, _)| born >= b) {
                e.1 = Some((born, t.timeslice_us));
            }
        }
        let shares = stats.share.recent(SHARE_WINDOW_US);
        let share_of = |f: &dyn Fn(u32, u32) -> bool| {
            let v: Vec<f64> = shares
                .iter()
                .filter(|&&(g, p, _)| f(g, p))
                .map(|s| s.2)
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>())
        };
        let mut now = BTreeMap::new();
        let mut processes: Vec<ProcessRow> = stats
            .processes()
            .map(|(pid, p)| {
                let c = Counts {
                    schedule: p.schedule,
                    refused: p.schedule_refused,
                    updates: p.sched_update,
                };
                now.insert(pid, c);
                let before = self.previous.get(&pid).copied().unwrap_or_default();
                let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
                let (by_engine, newest) = live.remove(&pid).unwrap_or_default();
                ProcessRow {
                    pid,
                    comm: crate::event::Comm(&p.comm).to_string(),
                    group: stats.group_of(pid).map(str::to_string),
                    live_total: by_engine.values().sum(),
                    live: by_engine,
                    schedules_per_s: rate(c.schedule, before.schedule),
                    refused_per_s: rate(c.refused, before.refused),
                    updates_per_s: rate(c.updates, before.updates),
                    schedules: c.schedule,
                    refused: c.refused,
                    timeslice_us: newest.and_then(|(_, ts)| ts),
                    init_to_schedule_us: latency.get(&pid).map(|&(_, l)| l / 1000),
                    gpu_share: share_of(&|_, p| p == pid),
                }
            })
            .collect();
        // Processes NVML names that made no traced call (started before tracing, or not
        // selected by the hooks): their share still shows.
        for &(_, pid, _) in &shares {
            if !processes.iter().any(|p| p.pid == pid) {
                processes.push(ProcessRow {
                    pid,
                    comm: "?".into(),
                    group: stats.group_of(pid).map(str::to_string),
                    live: BTreeMap::new(),
                    live_total: 0,
                    schedules_per_s: 0.0,
                    refused_per_s: 0.0,
                    updates_per_s: 0.0,
                    schedules: 0,
                    refused: 0,
                    timeslice_us: None,
                    init_to_schedule_us: None,
                    gpu_share: share_of(&|_, p| p == pid),
                });
            }
        }
        sort_rows(&mut processes, self.sort);
        self.previous = now;
        self.previous_s = elapsed_s;
        let gpus = stats
            .gpu_concurrency()
            .map(|(gpu, c)| GpuRow {
                gpu,
                name: gpu.and_then(|g| stats.gpu_name(g)).cloned(),
                live: c.live,
                max_live: c.max_live,
                share: gpu
                    .and_then(|g| stats.gpu_name(g))
                    .and_then(|&(index, _)| share_of(&|g, _| g == index)),
            })
            .collect();
        let k = counters.unwrap_or(stats.kernel);
        Frame {
            elapsed_s,
            processes,
            gpus,
            dropped: k.dropped,
            emitted: k.emitted,
            events: stats.events(),
            sort: self.sort,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{
        DestroyCause, Engine, Event, EventKind, Origin, TaskId, TaskKey, ValueSource,
    };

    fn ev(ts_ms: u64, pid: u32, handle: u32, kind: EventKind) -> Event {
        Event {
            origin: Origin {
                ts_ns: ts_ms * 1_000_000,
                cpu: 0,
                pid,
                tid: pid,
                comm: compact_str::format_compact!("p{pid}"),
            },
            kind,
            amd: None,
            api: None,
            key: Some(TaskKey {
                pid,
                client: Some(1),
                object: handle,
                generation: 1,
            }),
        }
    }

    fn init(handle: u32, engine: Engine, ts: u64) -> EventKind {
        EventKind::TaskInit {
            task: TaskId::RmHandle(handle),
            client: 1,
            engine: Some(engine),
            engine_type: None,
            timeslice_us: Some(ts),
            timeslice_source: ValueSource::DriverDefault,
            interleave: None,
            interleave_source: ValueSource::DriverDefault,
            runlist: None,
            gpu: Some(0),
        }
    }

    fn schedule(handle: u32, allowed: bool) -> EventKind {
        EventKind::Schedule {
            task: TaskId::RmHandle(handle),
            client: 1,
            channels: None,
            timeslice_us: None,
            interleave: None,
            allowed,
            rm_status: Some(0),
            errno: if allowed { 0 } else { -1 },
            via_channel: false,
        }
    }

    #[test]
    fn rates_live_tasks_latency_and_sorting() {
        let mut s = Stats::new();
        // Process 10: a GRAPHICS TSG (1024 µs) scheduled 3 ms after creation, a COPY TSG
        // (2048 µs, newer) scheduled 1 ms after; process 20: one refused schedule of a TSG
        // that then ends.
        s.record(&ev(100, 10, 0xa, init(0xa, Engine::Graphics, 1024)));
        s.record(&ev(103, 10, 0xa, schedule(0xa, true)));
        s.record(&ev(200, 10, 0xb, init(0xb, Engine::Copy, 2048)));
        s.record(&ev(201, 10, 0xb, schedule(0xb, true)));
        s.record(&ev(300, 20, 0xc, init(0xc, Engine::Graphics, 1024)));
        s.record(&ev(301, 20, 0xc, schedule(0xc, false)));
        s.record(&ev(
            302,
            20,
            0xc,
            EventKind::TaskDestroy {
                task: TaskId::RmHandle(0xc),
                client: 1,
                cause: DestroyCause::Free,
                implicit: false,
                final_params: None,
            },
        ));
        let mut m = TopModel::default();
        let f = m.frame(&s, 2.0, None);
        assert_eq!(f.processes.len(), 2);
        let p10 = f.processes.iter().find(|p| p.pid == 10).unwrap();
        assert_eq!(p10.live_total, 2);
        assert_eq!(p10.live.get("GRAPHICS"), Some(&1));
        assert_eq!(p10.live.get("COPY"), Some(&1));
        // 2 schedules in the first 2 s.
        assert_eq!(p10.schedules_per_s, 1.0);
        assert_eq!(p10.timeslice_us, Some(2048), "the newest live task's");
        assert_eq!(
            p10.init_to_schedule_us,
            Some(1000),
            "the latest task's latency"
        );
        let p20 = f.processes.iter().find(|p| p.pid == 20).unwrap();
        assert_eq!(
            (p20.live_total, p20.refused, p20.refused_per_s),
            (0, 1, 0.5)
        );
        // Busiest first: both 1 schedule/s... 10 has 1.0, 20 0.5.
        assert_eq!(f.processes[0].pid, 10);

        // Next frame, one more schedule of 20 in 0.5 s: its rate is over that interval.
        s.record(&ev(2100, 20, 0xd, schedule(0xd, true)));
        let f = m.frame(&s, 2.5, None);
        let p20 = f.processes.iter().find(|p| p.pid == 20).unwrap();
        assert_eq!(p20.schedules_per_s, 2.0);
        assert_eq!(f.processes[0].pid, 20, "now the busiest");
        m.sort = SortBy::Live;
        let f = m.frame(&s, 3.5, None);
        assert_eq!(f.processes[0].pid, 10, "most live tasks first");
        assert_eq!(
            f.processes[0].schedules_per_s, 0.0,
            "nothing in the last second"
        );
        m.sort = m.sort.next();
        let f = m.frame(&s, 4.5, None);
        assert_eq!(
            f.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
            [10, 20]
        );
    }
}
