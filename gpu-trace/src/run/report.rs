//! What the run says on stderr beside the events: pid warnings, the hooks in use, the kernel's
//! skipped program runs, and the live view's trait.

use std::{
    io::{self},
    time::Duration,
};

use super::signals::note;
use crate::{cli::TraceArgs, loader::Tracer, model::stats::KernelCounters, probe::system};

/// Warnings for `--pid` values that name no process now (`tgid_of`: the thread group of a
/// live task id, `None` when there is none): such a filter is kept and waits for the pid, and
/// a thread id is named with its process (events are filtered by process).
pub fn pid_warnings(pids: &[u32], tgid_of: impl Fn(u32) -> Option<u32>) -> Vec<String> {
    pids.iter()
        .filter_map(|&pid| match tgid_of(pid) {
            None => Some(format!(
                "--pid {pid}: no such process now; waiting for it (a process started later with \
                 this id is traced; nothing is printed until then)"
            )),
            Some(tgid) if tgid != pid => Some(format!(
                "--pid {pid} is a thread of process {tgid}: the filter is on processes, so \
                 nothing of {pid} will match; use --pid {tgid}"
            )),
            Some(_) => None,
        })
        .collect()
}

/// A live view of the statistics (`gpu-trace top`), given them once a second.
pub trait Viewer {
    fn frame(
        &mut self,
        stats: &crate::model::stats::Stats,
        elapsed: Duration,
        counters: Option<KernelCounters>,
    ) -> io::Result<()>;

    /// Replay: asked after each frame; `false` ends the replay there (the user quit).
    fn next(&mut self) -> io::Result<bool> {
        Ok(true)
    }

    /// Replay: the recording has no more records (the last frame was drawn).
    fn at_end(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Report lines of the run's end (`--bpf-stats`): printed now, or kept by a view that holds
    /// the terminal until it gives it back.
    fn report(&mut self, lines: Vec<String>) {
        print_report(lines);
    }
}

/// What the end of a run says of a `-- CMD` that a stop (SIGINT, SIGTERM, --duration) left
/// running (`gpu-trace` and `gpu-trace api` alike).
pub fn still_runs(pid: u32) -> String {
    format!(
        "the command (pid {pid}) still runs, no longer traced; the exit status is gpu-trace's own"
    )
}

/// Report lines on stderr, each after `gpu-trace: `.
pub fn print_report(lines: Vec<String>) {
    for line in lines {
        crate::say!("gpu-trace: {line}");
    }
}

/// `--bpf-stats` at exit: a line per loaded program, `program NAME: N runs, M ns/run`.
pub(super) fn describe_program_stats(stats: &[crate::loader::ProgramStats]) -> Vec<String> {
    std::iter::once(
        "BPF program runs while tracing (--bpf-stats; programs not listed were not loaded):"
            .to_string(),
    )
    .chain(stats.iter().map(|p| {
        format!(
            "program {}: {} runs, {} ns/run{}",
            p.name,
            p.runs,
            p.run_time_ns.checked_div(p.runs).unwrap_or(0),
            if p.missed > 0 {
                format!(", {} skipped by the kernel", p.missed)
            } else {
                String::new()
            }
        )
    }))
    .collect()
}

/// At exit, always: runs of gpu-trace's programs that the kernel skipped (`recursion_misses`:
/// the program was already running on that CPU, e.g. preempted inside it on a kernel whose
/// syscall tracepoints are preemptible), whose calls were then not seen. Nothing when none.
pub(super) fn describe_missed_runs(stats: &[crate::loader::ProgramStats]) -> Option<String> {
    let missed: Vec<String> = stats
        .iter()
        .filter(|p| p.missed > 0)
        .map(|p| format!("{} {}", p.name, p.missed))
        .collect();
    let total: u64 = stats.iter().map(|p| p.missed).sum();
    (total > 0).then(|| {
        format!(
            "WARNING: the kernel skipped {total} run(s) of gpu-trace's programs ({}): each was \
             already running on that CPU, so the call of each skipped run (of any process; a \
             GPU call among them lost its event) was not seen (docs/troubleshooting.md, \
             \"Skipped by the kernel\")",
            missed.join(", ")
        )
    })
}

/// The start-up warnings on stderr: `--pid` values that name no process now (or a thread), an
/// NVIDIA driver that is not loaded.
pub(super) fn warn_before_start(args: &TraceArgs, amd: bool) {
    for warning in pid_warnings(&args.output.pids, system::thread_group_of) {
        crate::say!("gpu-trace: warning: {warning}");
    }
    // AMD without /dev/kfd is reported below (KfdPresence).
    if let Some(warning) = (!amd).then(system::nvidia_not_loaded_warning).flatten() {
        crate::say!("gpu-trace: warning: {warning}");
    }
}

/// The start-up report on stderr: what is traced, the hooks attached and those not used.
pub(super) fn announce_hooks(tracer: &Tracer, kfd: Option<&crate::probe::amd::KfdPresence>) {
    let what = match kfd {
        Some(k) => format!(
            "AMD KFD queue calls on /dev/kfd (char major {})",
            k.major
                .map_or_else(|| "unknown".to_string(), |m| m.to_string())
        ),
        None => "NVIDIA RM calls".to_string(),
    };
    crate::say!(
        "gpu-trace: tracing {what}; hooks: {}",
        tracer.describe_hooks()
    );
    for refused in &tracer.refused {
        note(format_args!("(not used: {refused})"));
    }
}

/// `--pod`/`--namespace` values that named no pod of the run's processes, a warning each (at
/// the end: a pod's processes may come at any time).
pub(super) fn warn_unmatched_pods<W: std::io::Write>(pipeline: &crate::pipeline::Pipeline<W>) {
    for line in pipeline.unmatched_pod_selectors() {
        crate::say!("gpu-trace: warning: {line}");
    }
}

/// `--gpu` selectors that name none of the run's GPUs, a warning each (the run goes on: its
/// events would all be left out).
pub(super) fn warn_unmatched_gpus<W: std::io::Write>(pipeline: &crate::pipeline::Pipeline<W>) {
    for line in pipeline.unmatched_gpu_selectors() {
        crate::say!("gpu-trace: warning: {line}");
    }
}
