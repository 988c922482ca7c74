//! Issue 17's proof by counts: with the drivers' own entry points hooked, no gpu-trace program
//! runs for unrelated system calls, and the driver hooks run exactly once per driver call. The
//! guest runs `lab-client storm SUB` (100000 getppid() and 100000 pipe ioctls, then SUB) under
//! `gpu-trace --bpf-stats`; the kernel's own run counts (BPF_ENABLE_STATS), printed by gpu-trace
//! at exit, are judged against what the client says it did. The syscall layer alone, counted the
//! same way, is the comparison that shows the counts would have seen the storm.

use std::collections::BTreeMap;

use super::kernel::has_module_btf;
use super::{Guest, Judged, Run, no_bad_lines, tracer_problems};

/// Any other program may run a little (process exits in the guest, the gpu_ext hooks), never
/// once per unrelated system call: below this share of the storm.
const OTHERS_AT_MOST: f64 = 0.01;

/// The programs of the syscall layer (gpu-trace-ebpf's main.rs).
const SYSCALL_LAYER: [&str; 6] = [
    "sys_exit_btf",
    "sys_exit_raw",
    "tp_ioctl_enter",
    "tp_ioctl_exit",
    "tp_close_enter",
    "tp_close_exit",
];

/// `--bpf-stats` lines of a run's stderr (`gpu-trace: program NAME: N runs, M ns/run`): program
/// name → runs.
pub(super) fn program_runs(stderr: &str) -> BTreeMap<String, u64> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("gpu-trace: program ")?;
            let (name, tail) = rest.split_once(": ")?;
            let runs = tail.split_once(" runs")?.0.parse().ok()?;
            Some((name.to_owned(), runs))
        })
        .collect()
}

/// What `lab-client storm SUB` said it did (`LAB storm …` in the run's client block).
struct Storm {
    syscalls: u64,
    driver_ioctls: u64,
    driver_opens: u64,
}

fn storm(g: &Guest, run: &str, problems: &mut Vec<String>) -> Option<Storm> {
    let client = g.client(&format!("{run}.client"));
    let Some(f) = client.find("storm", &[]) else {
        problems.push("the client printed no storm line".into());
        return None;
    };
    let n = |k: &str| f.int(k).and_then(|v| u64::try_from(v).ok());
    if f.int("rc") != Some(0) || f.int("pipe_ioctl_failures") != Some(0) {
        problems.push(format!(
            "the client failed: rc {:?}, pipe ioctl failures {:?}",
            f.int("rc"),
            f.int("pipe_ioctl_failures")
        ));
    }
    Some(Storm {
        syscalls: n("getppid")? + n("pipe_ioctls")?,
        driver_ioctls: n("driver_ioctls")?,
        driver_opens: n("driver_opens")?,
    })
}

/// The run's tracer, its program run counts and its stderr, or `None` (with the reason) when
/// it did not run.
fn counted_run<'g>(
    g: &'g Guest,
    run: &str,
    problems: &mut Vec<String>,
) -> Option<(BTreeMap<String, u64>, &'g Run)> {
    let Some(started) = g.started(run) else {
        problems.push(format!("the guest did not run {run}"));
        return None;
    };
    let traced = g.run(run);
    tracer_problems(traced, started, problems);
    let runs = program_runs(&traced.stderr);
    if runs.is_empty() {
        problems.push(format!("{run}: gpu-trace printed no program run counts"));
    }
    Some((runs, traced))
}

/// Runs of the first of `names` that was loaded, with its name.
fn runs_of<'a>(runs: &BTreeMap<String, u64>, names: &[&'a str]) -> Option<(&'a str, u64)> {
    names.iter().find_map(|n| runs.get(*n).map(|&v| (*n, v)))
}

/// Every program outside `exact` ran far less often than the storm.
fn others_quiet(
    runs: &BTreeMap<String, u64>,
    exact: &[&str],
    storm: &Storm,
    problems: &mut Vec<String>,
) {
    let limit = (storm.syscalls as f64 * OTHERS_AT_MOST) as u64;
    for (name, &n) in runs {
        if !exact.contains(&name.as_str()) && n >= limit {
            problems.push(format!(
                "program {name} ran {n} times (the storm was {} syscalls)",
                storm.syscalls
            ));
        }
    }
}

/// The syscall layer's program ran for (at least) every syscall of the storm.
fn syscall_layer_counted(runs: &BTreeMap<String, u64>, storm: &Storm, problems: &mut Vec<String>) {
    match runs_of(runs, &SYSCALL_LAYER) {
        Some((_, n)) if n >= storm.syscalls => {}
        other => problems.push(format!(
            "want the syscall layer's program run for each of the {} storm syscalls, got \
             {other:?}",
            storm.syscalls
        )),
    }
}

/// The storm client's events in run `run` (its nvobj pid), by name.
fn client_events(g: &Guest, run: &str, problems: &mut Vec<String>) -> Vec<String> {
    let pid = g
        .client(&format!("{run}.client"))
        .find("nvobj", &[])
        .and_then(|f| f.int("pid"));
    let traced = g.run(run);
    no_bad_lines(traced, problems);
    traced
        .output
        .of(pid)
        .iter()
        .map(|e| e.raw["event"].as_str().unwrap_or("?").to_owned())
        .collect()
}

pub(super) fn nv_entry(g: &Guest) -> Judged {
    let title = "NVIDIA driver entry points hooked (nvlab has the driver's nvidia_unlocked_ioctl \
                 and nvidia_close): the syscall layer not attached, no program run for 200000 \
                 unrelated syscalls (kernel run counts), the ioctl hook once per RM call, the \
                 release hook once per file, the same events as the syscall layer";
    if !g.module_loaded("nvlab") {
        return Judged::fail(title, "the nvlab module was not loaded");
    }
    let mut problems = Vec::new();
    let mut detail = String::new();
    if let (Some((runs, traced)), Some(storm)) = (
        counted_run(g, "nventry", &mut problems),
        storm(g, "nventry", &mut problems),
    ) {
        let (hooks, stderr) = (traced.hooks(), &traced.stderr);
        for want in ["NVIDIA ioctls → ", "NVIDIA file release → "] {
            if !hooks.contains(want) {
                problems.push(format!("want `{want}…` among the hooks: {hooks}"));
            }
        }
        if !stderr.contains("syscall layer not attached") {
            problems.push("want the syscall layer not attached".into());
        }
        for p in SYSCALL_LAYER {
            if let Some(n) = runs.get(p) {
                problems.push(format!("syscall-layer program {p} loaded ({n} runs)"));
            }
        }
        let ioctl = runs_of(&runs, &["nv_ioctl_fexit", "nv_ioctl_kret"]);
        if ioctl.map(|(_, n)| n) != Some(storm.driver_ioctls) {
            problems.push(format!(
                "ioctl hook runs {ioctl:?}, want one per RM call: {}",
                storm.driver_ioctls
            ));
        }
        if let Some(n) = runs.get("nv_ioctl_entry")
            && *n != storm.driver_ioctls
        {
            problems.push(format!(
                "kprobe nv_ioctl_entry ran {n} times, want {}",
                storm.driver_ioctls
            ));
        }
        let release = runs_of(&runs, &["nv_close_fentry", "nv_close_kprobe"]);
        if release.map(|(_, n)| n) != Some(storm.driver_opens) {
            problems.push(format!(
                "release hook runs {release:?}, want one per file opened: {}",
                storm.driver_opens
            ));
        }
        others_quiet(
            &runs,
            &[
                "nv_ioctl_fexit",
                "nv_ioctl_kret",
                "nv_ioctl_entry",
                "nv_close_fentry",
                "nv_close_kprobe",
            ],
            &storm,
            &mut problems,
        );
        detail = format!(
            "{} unrelated syscalls, {} RM ioctls, {} file(s); program runs {runs:?}",
            storm.syscalls, storm.driver_ioctls, storm.driver_opens
        );
    }
    // The comparison: the syscall layer alone, counted the same way.
    if let (Some((runs, _)), Some(storm)) = (
        counted_run(g, "nventry_sys", &mut problems),
        storm(g, "nventry_sys", &mut problems),
    ) {
        syscall_layer_counted(&runs, &storm, &mut problems);
        detail.push_str(&format!(
            "; syscall layer alone: {:?}",
            runs_of(&runs, &SYSCALL_LAYER)
        ));
    }
    let (entry, sys) = (
        client_events(g, "nventry", &mut problems),
        client_events(g, "nventry_sys", &mut problems),
    );
    if entry.is_empty() || entry != sys {
        problems.push(format!(
            "events {entry:?} at the entry points, {sys:?} from the syscall layer: want the same, \
             not none"
        ));
    }
    detail.push_str(&format!("; events {entry:?}"));
    Judged::of(title, &problems, || detail)
}

/// The four KFD handler hooks (fexit, or their kretprobes).
const KFD_HANDLER_RUNS: [[&str; 2]; 4] = [
    ["kfd_create_queue_fexit", "kfd_create_queue_kret"],
    ["kfd_destroy_queue_fexit", "kfd_destroy_queue_kret"],
    ["kfd_update_queue_fexit", "kfd_update_queue_kret"],
    ["kfd_set_cu_mask_fexit", "kfd_set_cu_mask_kret"],
];

pub(super) fn kfd_entry(g: &Guest) -> Judged {
    let new = has_module_btf(g);
    let title = if new {
        "AMD KFD handlers hooked in the real amdgpu: the syscall layer not attached, no program \
         run for 200000 unrelated syscalls (kernel run counts), each handler hook once per call"
    } else {
        "before 5.11 (no module BTF): CREATE_QUEUE needs the syscall layer, whose program the \
         kernel counts for every syscall of the storm"
    };
    let mut problems = Vec::new();
    let mut detail = String::new();
    if let (Some((runs, traced)), Some(storm)) = (
        counted_run(g, "kfdentry", &mut problems),
        storm(g, "kfdentry", &mut problems),
    ) {
        if new {
            if !traced.stderr.contains("syscall layer not attached") {
                problems.push("want the syscall layer not attached".into());
            }
            let mut exact = Vec::new();
            let mut total = 0;
            for names in KFD_HANDLER_RUNS {
                match runs_of(&runs, &names) {
                    Some((name, 1)) => {
                        exact.push(name);
                        total += 1;
                    }
                    other => problems.push(format!(
                        "handler hook {} ran {other:?}, want once (kfd-ops enters each handler \
                         once)",
                        names[0]
                    )),
                }
            }
            if total != storm.driver_ioctls {
                problems.push(format!(
                    "handler hooks ran {total} times for {} KFD ioctls",
                    storm.driver_ioctls
                ));
            }
            exact.push("kfd_handler_entry");
            others_quiet(&runs, &exact, &storm, &mut problems);
        } else {
            syscall_layer_counted(&runs, &storm, &mut problems);
        }
        detail = format!(
            "{} unrelated syscalls, {} KFD ioctls; program runs {runs:?}",
            storm.syscalls, storm.driver_ioctls
        );
    }
    Judged::of(title, &problems, || detail)
}

#[cfg(test)]
mod tests {
    use super::super::{Results, Status, judge};
    use super::*;

    /// The guest logs the judge's own tests use (xtask/testdata; see judge.rs).
    const GOOD: &str = include_str!("../../../testdata/lab-6.1-results.log");
    const OLD: &str = include_str!("../../../testdata/lab-5.10-results.log");

    fn status(text: &str, id: &str) -> Status {
        judge(&Results::parse(text))
            .into_iter()
            .find(|c| c.id == id)
            .map(|c| c.status)
            .unwrap()
    }

    /// `text` with `from` replaced by `to` in the first line after `after` that has it.
    fn edit(text: &str, after: &str, from: &str, to: &str) -> String {
        let start = text.find(after).unwrap_or_else(|| panic!("{after}"));
        let at = start + text[start..].find(from).unwrap_or_else(|| panic!("{from}"));
        format!("{}{to}{}", &text[..at], &text[at + from.len()..])
    }

    #[test]
    fn run_counts_are_read_from_the_stderr_lines() {
        let runs = program_runs(
            "gpu-trace: tracing …\ngpu-trace: program nv_ioctl_fexit: 20 runs, 812 ns/run\n\
             gpu-trace: program process_exit_raw: 3 runs, 0 ns/run\nprogram x: 5 runs\n",
        );
        assert_eq!(
            runs.into_iter().collect::<Vec<_>>(),
            [
                ("nv_ioctl_fexit".to_string(), 20),
                ("process_exit_raw".to_string(), 3)
            ]
        );
    }

    #[test]
    fn the_real_logs_pass() {
        for log in [GOOD, OLD] {
            assert_eq!(status(log, "z.nv_entry"), Status::Pass);
            assert_eq!(status(log, "z.kfd_entry"), Status::Pass);
        }
    }

    #[test]
    fn a_program_run_for_the_storm_or_a_miscount_fails() {
        // The syscall layer loaded beside the entry points (it would run for every syscall).
        let sys = GOOD.replacen(
            "LAB-BEGIN nventry.stderr\n",
            "LAB-BEGIN nventry.stderr\ngpu-trace: program sys_exit_btf: 200911 runs, 40 ns/run\n",
            1,
        );
        assert_eq!(status(&sys, "z.nv_entry"), Status::Fail);
        // (log, the section after which, from, to, the check that must fail)
        let cases = [
            // Another program that ran for every syscall of the storm.
            (
                GOOD,
                "nventry.stderr",
                "program process_exit_raw: ",
                "program process_exit_raw: 2000",
                "z.nv_entry",
            ),
            // One ioctl hook run more or less than the client's RM calls.
            (
                GOOD,
                "nventry.client",
                "driver_ioctls=20",
                "driver_ioctls=21",
                "z.nv_entry",
            ),
            // The release hook missed the file.
            (
                GOOD,
                "nventry.client",
                "driver_opens=1",
                "driver_opens=2",
                "z.nv_entry",
            ),
            // The comparison run did not see the storm: the counts prove nothing.
            (
                GOOD,
                "nventry_sys.stderr",
                "program sys_exit_btf: 2",
                "program sys_exit_btf: ",
                "z.nv_entry",
            ),
            // A KFD handler hook run twice for one call.
            (
                GOOD,
                "kfdentry.stderr",
                "program kfd_update_queue_fexit: 1 runs",
                "program kfd_update_queue_fexit: 2 runs",
                "z.kfd_entry",
            ),
            // Before 5.11 the syscall layer's count must cover the storm.
            (
                OLD,
                "kfdentry.stderr",
                "program sys_exit_btf: 2",
                "program sys_exit_btf: ",
                "z.kfd_entry",
            ),
        ];
        for (log, section, from, to, id) in cases {
            let broken = edit(log, &format!("LAB-BEGIN {section}"), from, to);
            assert_eq!(
                status(&broken, id),
                Status::Fail,
                "{section}: {from} → {to}"
            );
        }
    }

    #[test]
    fn different_events_at_the_entry_points_fail() {
        let start = GOOD.find("LAB-BEGIN nventry.jsonl").unwrap();
        let at = start + GOOD[start..].find("\"event\":\"WORK_SUBMIT\"").unwrap();
        let changed = format!(
            "{}\"event\":\"SCHED_UPDATE\"{}",
            &GOOD[..at],
            &GOOD[at + "\"event\":\"WORK_SUBMIT\"".len()..]
        );
        assert_eq!(status(&changed, "z.nv_entry"), Status::Fail);
    }
}
