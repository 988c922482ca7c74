//! The `STATS` JSON line: the run's counts, per process, container, engine, GPU, runlist and
//! task, and the kernel's counters (schema: docs/json-schema.md, from `output::json`'s module
//! documentation). The model ([`crate::model::stats`]) counts; this renders, as
//! [`super::stats_text`] does the text block.

use serde::Serialize;

use crate::escape;
use crate::model::stats::{EngineStats, KernelCounters, ProcessStats, Stats, TaskStats};

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Serialize)]
struct StatsLine<'a> {
    event: &'static str,
    #[serde(rename = "final")]
    is_final: bool,
    duration_s: f64,
    task_init: u64,
    schedule: u64,
    schedule_refused: u64,
    sched_update: u64,
    sched_update_refused: u64,
    preempt: u64,
    work_submit: u64,
    task_destroy: u64,
    task_destroy_implicit: u64,
    /// Null when not known (a recording without its trailer).
    kernel: Option<KernelCounters>,
    malformed: u64,
    decode_errors: u64,
    live_at_exit: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pretrace_end: u64,
    #[serde(skip_serializing_if = "is_zero")]
    mps_shared: u64,
    unreported: std::collections::BTreeMap<&'static str, u64>,
    lost_samples: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    output_lost: u64,
    #[serde(skip_serializing_if = "is_zero")]
    recording_lost: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    flight_recorder: Option<&'a crate::model::stats::FlightStats>,
    processes: Vec<ProcessLine<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    containers: Vec<GroupLine<'a>>,
    engines: Vec<EngineLine<'a>>,
    gpus: Vec<GpuLine>,
    runlists: Vec<RunlistLine>,
    tasks: Vec<TaskLine<'a>>,
    tasks_omitted: u64,
    diagnostics: Option<Diagnostics>,
}

#[derive(Serialize)]
struct ProcessLine<'a> {
    pid: u32,
    #[serde(flatten)]
    comm: crate::event::CommFields<'a>,
    #[serde(flatten)]
    counts: CountsLine,
}

/// The event counts of a process, or of a container's processes summed.
#[derive(Serialize)]
struct CountsLine {
    task_init: u64,
    schedule: u64,
    schedule_refused: u64,
    sched_update: u64,
    preempt: u64,
    work_submit: u64,
    task_destroy: u64,
}

impl From<&ProcessStats> for CountsLine {
    fn from(p: &ProcessStats) -> Self {
        Self {
            task_init: p.task_init,
            schedule: p.schedule,
            schedule_refused: p.schedule_refused,
            sched_update: p.sched_update,
            preempt: p.preempt,
            work_submit: p.work_submit,
            task_destroy: p.task_destroy,
        }
    }
}

#[derive(Serialize)]
struct GroupLine<'a> {
    /// null: the processes outside containers.
    group: Option<&'a str>,
    processes: u64,
    #[serde(flatten)]
    counts: CountsLine,
}

#[derive(Serialize)]
struct EngineLine<'a> {
    engine: &'a str,
    #[serde(flatten)]
    counts: &'a EngineStats,
}

/// A GPU's numbers in the `STATS` rows: `gpu` as users read it ([`Stats::shown_gpu`]), then
/// RM's device instance (NVIDIA only).
#[derive(Serialize)]
struct GpuNumbers {
    gpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rm_device: Option<Option<u32>>,
}

impl GpuNumbers {
    fn of(stats: &Stats, driver: Option<u32>) -> Self {
        Self {
            gpu: stats.shown_gpu(driver),
            rm_device: stats.rm_device(driver),
        }
    }
}

#[derive(Serialize)]
struct GpuLine {
    #[serde(flatten)]
    gpu: GpuNumbers,
    /// The UUID, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    uuid: Option<String>,
    live: u64,
    max_live: u64,
}

#[derive(Serialize)]
struct RunlistLine {
    #[serde(flatten)]
    gpu: GpuNumbers,
    runlist: u32,
    live: u64,
    max_live: u64,
}

#[derive(Serialize)]
struct TaskLine<'a> {
    #[serde(flatten)]
    task: &'a TaskStats,
    #[serde(flatten)]
    gpu: GpuNumbers,
    lifetime_ns: Option<u64>,
    init_to_schedule_ns: Option<u64>,
    init_to_submit_ns: Option<u64>,
}

#[derive(Serialize)]
struct Diagnostics {
    emitted: u64,
    ignored: u64,
}

/// The `{"event":"STATS", ...}` line (no newline), final or periodic, as described in the
/// [module documentation](self); strings terminal-safe.
///
/// # Panics
///
/// Never: the statistics always serialize.
pub fn stats_json(stats: &Stats, is_final: bool) -> String {
    let k = &stats.kernel;
    let line = StatsLine {
        event: "STATS",
        is_final,
        duration_s: stats.duration().as_secs_f64(),
        task_init: stats.task_init,
        schedule: stats.schedule,
        schedule_refused: stats.schedule_refused,
        sched_update: stats.sched_update,
        sched_update_refused: stats.sched_update_refused,
        preempt: stats.preempt,
        work_submit: stats.work_submit,
        task_destroy: stats.task_destroy,
        task_destroy_implicit: stats.task_destroy_implicit,
        kernel: (!stats.kernel_unknown).then_some(*k),
        malformed: stats.malformed,
        decode_errors: stats.decode_errors,
        live_at_exit: stats.live_at_exit,
        pretrace_end: stats.pretrace_end,
        mps_shared: stats.mps_shared,
        unreported: stats
            .unreported
            .iter()
            .filter(|&(_, &v)| v != 0)
            .map(|(&k, &v)| (k, v))
            .collect(),
        lost_samples: stats.lost_samples,
        output_lost: stats.output_lost,
        recording_lost: stats.recording_lost,
        flight_recorder: stats.flight.as_ref(),
        containers: group_lines(stats),
        processes: process_lines(stats),
        engines: stats
            .engines()
            .map(|(engine, counts)| EngineLine { engine, counts })
            .collect(),
        gpus: gpu_lines(stats),
        runlists: runlist_lines(stats),
        tasks: task_lines(stats),
        tasks_omitted: stats.tasks_omitted,
        diagnostics: (!stats.kernel_unknown).then_some(Diagnostics {
            emitted: k.emitted,
            ignored: k.ignored,
        }),
    };
    let mut out = Vec::with_capacity(1024);
    escape::write_json(&mut out, &line);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// The `containers` rows: each group's processes and their counts summed.
fn group_lines(stats: &Stats) -> Vec<GroupLine<'_>> {
    stats
        .groups()
        .into_iter()
        .map(|(group, processes, p)| GroupLine {
            group,
            processes,
            counts: (&p).into(),
        })
        .collect()
}

/// The `processes` rows.
fn process_lines(stats: &Stats) -> Vec<ProcessLine<'_>> {
    stats
        .processes()
        .map(|(pid, p)| ProcessLine {
            pid,
            comm: crate::event::Comm(&p.comm).json(),
            counts: p.into(),
        })
        .collect()
}

/// The `gpus` rows: each GPU's tasks live and most live.
fn gpu_lines(stats: &Stats) -> Vec<GpuLine> {
    stats
        .gpu_concurrency()
        .map(|(gpu, c)| GpuLine {
            gpu: GpuNumbers::of(stats, gpu),
            uuid: gpu
                .and_then(|g| stats.gpu_name(g))
                .and_then(|n| n.1.clone()),
            live: c.live,
            max_live: c.max_live,
        })
        .collect()
}

/// The `runlists` rows: each (GPU, runlist)'s tasks live and most live.
fn runlist_lines(stats: &Stats) -> Vec<RunlistLine> {
    stats
        .runlist_concurrency()
        .map(|((gpu, runlist), c)| RunlistLine {
            gpu: GpuNumbers::of(stats, gpu),
            runlist,
            live: c.live,
            max_live: c.max_live,
        })
        .collect()
}

/// The `tasks` rows, with the task's GPU numbers and its intervals.
fn task_lines(stats: &Stats) -> Vec<TaskLine<'_>> {
    stats
        .tasks()
        .map(|t| TaskLine {
            task: t,
            gpu: GpuNumbers::of(stats, t.gpu),
            lifetime_ns: t.lifetime_ns(),
            init_to_schedule_ns: t.init_to_schedule_ns(),
            init_to_submit_ns: t.init_to_submit_ns(),
        })
        .collect()
}
