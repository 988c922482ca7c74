//! The judge's own tests: real guest logs (xtask/testdata) pass, and each broken fact fails
//! its check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;

/// Every `results.log` below `dir` (the lab keeps one per kernel: `run/<release>/results.log`).
fn results_logs(dir: &Path) -> Vec<PathBuf> {
    let mut logs = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for path in entries.map(|e| e.unwrap().path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == "results.log") {
                logs.push(path);
            }
        }
    }
    logs.sort();
    logs
}

/// Check `id` over every results log under `$GPU_TRACE_LAB_RESULTS` (the `each` tests): it
/// passed on each, or was not applicable where `a.kfd` asserts why; a failure names the log
/// and says why.
pub(super) fn judge_results_dir(id: &str) {
    let dir = std::env::var_os("GPU_TRACE_LAB_RESULTS").unwrap_or_else(|| {
        panic!(
            "set GPU_TRACE_LAB_RESULTS to a directory of the lab's results (target/lab-cache/run \
             after `cargo xtask lab`)"
        )
    });
    // Relative to the workspace (cargo runs the tests in xtask/).
    let dir = crate::host::workspace_root().join(dir);
    let logs = results_logs(&dir);
    assert!(!logs.is_empty(), "no results.log under {dir:?}");
    let failed: Vec<String> = logs
        .iter()
        .filter_map(|log| {
            let text = std::fs::read_to_string(log).unwrap();
            let checks = judge(&Results::parse(&text));
            let c = checks.into_iter().find(|c| c.id == id).unwrap();
            (c.status == Status::Fail).then(|| format!("{}: {}", log.display(), c.detail))
        })
        .collect();
    assert!(failed.is_empty(), "{id} failed:\n{}", failed.join("\n"));
    println!(
        "{id}: passed (or not applicable) on {} log(s) under {dir:?}",
        logs.len()
    );
}

/// The ids of the checks that need `needs` of the kernel's KFD.
fn needing(needs: Needs) -> Vec<&'static str> {
    CHECKS
        .iter()
        .filter(|e| e.needs == needs)
        .map(|e| e.id)
        .collect()
}

/// A results log exactly as a current guest wrote it: `cargo xtask lab --kernel 6.1` of this
/// tree (Debian 6.1.0-56, 30 checks passed; refreshed on 2026-11-25 with issue 17's
/// driver entry points, `lab.limits` and the `storm` runs), copied from
/// `target/lab-cache/run/6.1.0-56-amd64/results.log` (the serial console's CRs removed).
const GOOD: &str = include_str!("../../../testdata/lab-6.1-results.log");

fn statuses(text: &str) -> BTreeMap<&'static str, Status> {
    judge(&Results::parse(text))
        .into_iter()
        .map(|c| (c.id, c.status))
        .collect()
}

/// The checks of issue 26's `deny_fork` step, which the logs recorded before it lack.
const DENY_FORK_CHECKS: [&str; 2] = ["e.deny_fork_nv", "e.deny_finn_nv"];

/// Whether `id` is a check that `text` was recorded before (so it fails: the run is
/// missing, and a missing run never passes).
fn predates(text: &str, id: &str) -> bool {
    (DENY_FORK_CHECKS.contains(&id) && !text.contains("LAB step deny_fork"))
        || (id == "e.deny_compat_nv"
            && !text.contains("LAB step deny_compat")
            && !text.contains("LAB fact arch=aarch64"))
}

/// `judge` of `text` without the checks `text` was recorded before (for the tests of other
/// checks that edit an older log).
fn judge_recorded(text: &str) -> Vec<Check> {
    judge(&Results::parse(text))
        .into_iter()
        .filter(|c| !predates(text, c.id))
        .collect()
}

/// Every check of `text` passed (those it predates failed); its statuses.
fn all_pass(text: &str) -> BTreeMap<&'static str, Status> {
    let s = statuses(text);
    for (id, st) in &s {
        if predates(text, id) {
            assert_eq!(*st, Status::Fail, "{id}");
            continue;
        }
        assert_eq!(
            *st,
            Status::Pass,
            "{id}: {:#?}",
            judge(&Results::parse(text))
        );
    }
    s
}

#[test]
fn a_current_guest_log_passes_every_check() {
    assert_eq!(all_pass(GOOD).len(), CHECKS.len());
}

/// Debian 11's kernel (5.10.0-46, upstream 5.10.262) as its guest wrote it: `cargo xtask
/// lab --kernel 5.10` of this tree on 2026-11-26 (with issue 26's `deny_fork` step), 32
/// checks passed, copied from
/// `target/lab-cache/run/5.10.0-46-amd64/results.log` (CRs removed).
const OLD: &str = include_str!("../../../testdata/lab-5.10-results.log");

#[test]
fn an_old_kernel_passes_on_its_documented_fallbacks() {
    let s = all_pass(OLD);
    assert_eq!(s.len(), CHECKS.len());
    // The same checks, not fewer: the ids are those of a current kernel's log.
    let current: Vec<_> = statuses(GOOD).into_keys().collect();
    assert_eq!(s.into_keys().collect::<Vec<_>>(), current);
}

#[test]
fn the_fallbacks_are_asserted_not_skipped() {
    // The 5.10 log claimed by a kernel that has module BTF and the cgroup helper: every
    // check that accepted a fallback fails.
    let relabelled = OLD.replace("kernel=5.10.0-46-amd64", "kernel=6.1.0-56-amd64");
    let s = statuses(&relabelled);
    for id in [
        "a.module_btf",
        "d.fentry",
        "f.deep_select",
        "f.deep_events",
        "f.deep_kprobe",
        "f.deep_release",
        "e.deny_cgroup_nv",
        "e.deny_cgroup_amd",
    ] {
        assert_eq!(s[id], Status::Fail, "{id}");
    }
    // On 5.10 itself, each fallback is checked for what it must show.
    let cases = [
        // module BTF that 5.10 cannot have
        ("amdgpu_btf=absent", "amdgpu_btf=2095369", "a.module_btf"),
        // a handler missing from the kprobe fallback
        (
            "kprobe+kretprobe/{kfd_ioctl_destroy_queue,kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask}",
            "kprobe+kretprobe/{kfd_ioctl_destroy_queue,kfd_ioctl_update_queue}",
            "f.deep_select",
        ),
        // the teardown refusal not printed
        (
            "(not used: AMD queue teardown: pqm_uninit: no module BTF to read offsets from)",
            "",
            "f.deep_release",
        ),
        // --deny-cgroup refused without naming the helper
        (
            "this kernel does not let these programs call bpf_get_current_ancestor_cgroup_id \
             (bpf_get_current_ancestor_cgroup_id in tracing and LSM programs: Linux 5.14 and \
             later), which --cgroup, --container, --deny-cgroup, --deny-container need",
            "BPF LSM programs need CONFIG_BPF_LSM=y",
            "e.deny_cgroup_nv",
        ),
        // ... or not refused at all
        (
            "LAB deny_cgroup_amd tracer_exit=3",
            "LAB deny_cgroup_amd tracer_exit=0",
            "e.deny_cgroup_amd",
        ),
    ];
    for (from, to, id) in cases {
        assert!(OLD.contains(from), "{from}");
        let broken = OLD.replace(from, to);
        assert_eq!(
            statuses(&broken)[id],
            Status::Fail,
            "{id} after {from:?} -> {to:?}"
        );
    }
}

/// A shipped feature that did not run fails its check: the guest's log as it would be had
/// the feature's run been left out, or had the build refused it.
#[test]
fn a_feature_that_did_not_run_fails_never_skips() {
    let block = |name: &str| {
        let begin = GOOD.find(&format!("LAB-BEGIN {name}")).unwrap();
        let end_tag = format!("LAB-END {name} rc=");
        let end = GOOD[begin..].find(&end_tag).unwrap() + begin;
        let end = GOOD[end..].find('\n').unwrap() + end + 1;
        (begin, end)
    };
    let without = |name: &str| {
        let (b, e) = block(name);
        format!("{}{}", &GOOD[..b], &GOOD[e..])
    };
    // doctor: no block at all, or the block of a build without the subcommand.
    assert_eq!(statuses(&without("doctor"))["a.doctor"], Status::Fail);
    let (b, e) = block("doctor");
    let no_doctor = format!(
        "{}LAB-BEGIN doctor\nerror: unrecognized subcommand 'doctor'\nLAB-END doctor rc=2\n{}",
        &GOOD[..b],
        &GOOD[e..]
    );
    assert_eq!(statuses(&no_doctor)["a.doctor"], Status::Fail);
    // --deny-pid: the runs left out, or refused by the build.
    let mut no_deny = GOOD.to_string();
    no_deny.truncate(GOOD.find("LAB deny_nv tracer_ready").unwrap());
    no_deny.push_str(&GOOD[GOOD.find("LAB step kprobe").unwrap()..]);
    let s = statuses(&no_deny);
    assert_eq!(
        (s["e.deny_nv"], s["e.deny_amd"]),
        (Status::Fail, Status::Fail)
    );
    let refused = GOOD.replacen(
        "LAB deny_amd tracer_exit=0",
        "LAB deny_amd tracer_exit=3",
        1,
    );
    assert_ne!(refused, GOOD);
    assert_eq!(statuses(&refused)["e.deny_amd"], Status::Fail);
    // --deny-cgroup: refused by the build, or the client that joined the cgroup not refused,
    // or its events not naming the cgroup.
    let refused = GOOD.replacen(
        "LAB deny_cgroup_nv tracer_exit=0",
        "LAB deny_cgroup_nv tracer_exit=2",
        1,
    );
    assert_ne!(refused, GOOD);
    assert_eq!(statuses(&refused)["e.deny_cgroup_nv"], Status::Fail);
    let (b, e) = block("deny_cgroup_amd.jsonl");
    let elsewhere = format!(
        "{}{}{}",
        &GOOD[..b],
        GOOD[b..e].replace("\"path\":\"/gt-denied\"", "\"path\":\"/\""),
        &GOOD[e..]
    );
    assert_ne!(elsewhere, GOOD);
    assert_eq!(statuses(&elsewhere)["e.deny_cgroup_amd"], Status::Fail);
    let allowed = format!(
        "{}{}{}",
        &GOOD[..b],
        GOOD[b..e].replace("\"errno\":-1,", "\"errno\":-22,"),
        &GOOD[e..]
    );
    assert_ne!(allowed, GOOD);
    assert_eq!(statuses(&allowed)["e.deny_cgroup_amd"], Status::Fail);
    // --vendor amd refused by the build.
    let (b, e) = block("amd.probe");
    let no_amd = format!(
        "{}LAB-BEGIN amd.probe\ngpu-trace: AMD KFD tracing is not implemented yet in this build\nLAB-END amd.probe rc=3\n{}",
        &GOOD[..b],
        &GOOD[e..]
    );
    assert_eq!(statuses(&no_amd)["c.trace"], Status::Fail);
}

/// The deep-hook checks fail when the choice, the events or the teardown are wrong.
#[test]
fn deep_hook_checks_catch_a_wrong_choice_double_counting_and_a_missed_teardown() {
    let st = |text: &str, id: &str| statuses(text)[id];
    assert_eq!(st(GOOD, "f.deep_select"), Status::Pass);
    // The device queue manager's functions fell back to kprobes (six arguments: trampolines
    // work on both lab kernels), or an init_mqd copy was missed.
    let fallback = GOOD.replace(
        "AMD queue details → fexit/{create_queue_cpsch,create_queue_nocpsch}",
        "AMD queue details → kprobe+kretprobe/{create_queue_cpsch,create_queue_nocpsch}",
    );
    assert_eq!(st(&fallback, "f.deep_select"), Status::Fail);
    let missed_copy = GOOD.replace("init_mqd ×5/5", "init_mqd ×4/5");
    assert_ne!(missed_copy, GOOD);
    assert_eq!(st(&missed_copy, "f.deep_select"), Status::Fail);
    // The syscall layer attached as well: not the selection asked for.
    let both = GOOD.replace(
        "gpu-trace: (not used: ioctl+close: syscall layer not attached: the driver's own hooks serve every call, so unrelated syscalls pay nothing)\n",
        "",
    );
    assert_eq!(st(&both, "f.deep_select"), Status::Fail);
    // One call reported twice (the kernel emitted 8 where 7 records were sent), or an event that differs.
    let twice = GOOD.replacen("\"emitted\":7,\"fd_lookup_failed\":0,\"denied\":0},\"malformed\":0,\"decode_errors\":0,\"live_at_exit\":0,\"unreported\":{\"kfd_release", "\"emitted\":8,\"fd_lookup_failed\":0,\"denied\":0},\"malformed\":0,\"decode_errors\":0,\"live_at_exit\":0,\"unreported\":{\"kfd_release", 1);
    assert_ne!(twice, GOOD);
    assert_eq!(st(&twice, "f.deep_events"), Status::Fail);
    // Only the deep run's cu_mask event says another errno.
    let pat = "\"errno\":-14,\"via_channel\":false,\"amd\":{\"via\":\"cu_mask\"";
    let deep_at = GOOD.find("LAB-BEGIN ops_deep.jsonl").unwrap();
    let at = deep_at + GOOD[deep_at..].find(pat).unwrap();
    let differs = format!(
        "{}{}{}",
        &GOOD[..at],
        pat.replace("-14", "-22"),
        &GOOD[at + pat.len()..]
    );
    assert_eq!(st(&differs, "f.deep_events"), Status::Fail);
    assert_eq!(
        st(&differs, "f.deep_kprobe"),
        Status::Pass,
        "the kprobe run is another block"
    );
    // The kprobe run on a trampoline: not the fallback asked for.
    let kprobe_at = GOOD.find("LAB-BEGIN ops_kprobe.stderr").unwrap();
    let (head, tail) = GOOD.split_at(kprobe_at);
    let on_trampoline = format!(
        "{head}{}",
        tail.replacen(
            "AMD queue teardown → kprobe/{pqm_uninit}",
            "AMD queue teardown → fentry/{pqm_uninit}",
            1
        )
    );
    assert_eq!(st(&on_trampoline, "f.deep_kprobe"), Status::Fail);
    // A client call returned what the driver does not (the docs' EINVAL, EFAULT, EFAULT,
    // EINVAL), or the same event is missing from both runs (identical, but not the 3).
    let rc = edit_line(
        GOOD,
        "LAB-BEGIN ops_deep.client",
        &["call=update"],
        "rc=-14",
        "rc=-22",
    );
    assert_eq!(st(&rc, "f.deep_events"), Status::Fail);
    let mut gone = GOOD.to_string();
    for run in ["LAB-BEGIN ops_syscall.jsonl", "LAB-BEGIN ops_deep.jsonl"] {
        let line = edit_line(&gone, run, &["\"via\":\"cu_mask\""], "{", "\u{0}{");
        gone = line
            .split_inclusive('\n')
            .filter(|l| !l.starts_with('\u{0}'))
            .collect();
    }
    assert_eq!(st(&gone, "f.deep_events"), Status::Fail);
    // The teardown not seen.
    let missed = GOOD.replace("\"kfd_release_no_queues\":1,", "");
    assert_eq!(st(&missed, "f.deep_release"), Status::Fail);
    // gpu_ext: the hooks' values not added (the TSGs keep the assumed 1024 µs), or a hook
    // left unclaimed.
    assert_eq!(st(GOOD, "g.gpu_ext"), Status::Pass);
    let gx_start = GOOD.find("LAB nvdev_gx tracer_ready").unwrap();
    let (head, tail) = GOOD.split_at(gx_start);
    let assumed = format!(
        "{head}{}",
        tail.replacen("\"timeslice_us\":3000", "\"timeslice_us\":1024", 1)
    );
    assert_eq!(st(&assumed, "g.gpu_ext"), Status::Fail);
    let unclaimed = format!(
        "{head}{}",
        tail.replacen(
            "\"unreported\":{",
            "\"unreported\":{\"gpu_ext_unmatched\":1,",
            1
        )
    );
    assert_ne!(unclaimed, GOOD);
    assert_eq!(st(&unclaimed, "g.gpu_ext"), Status::Fail);
}

#[test]
fn each_broken_fact_fails_its_check() {
    let cases = [
        ("LAB-DONE\n", "", "a.boot"),
        (
            "LAB step done",
            "LAB timeout what=lsm after=240s t=300.1\nLAB step done",
            "lab.limits",
        ),
        (
            "LAB fact lsm=lockdown,capability,landlock,yama,apparmor,bpf",
            "LAB fact lsm=lockdown,capability",
            "a.lsm",
        ),
        ("kprobe_pmu=6", "kprobe_pmu=absent", "a.kprobes"),
        ("amdgpu_btf=2095369", "amdgpu_btf=absent", "a.module_btf"),
        ("\"emitted\":8", "\"emitted\":7", "b.records"),
        ("\"allowed\":false", "\"allowed\":true", "b.records"),
        ("\"value\":1543503888", "\"value\":1543503889", "b.records"),
        ("nv tracer_exit=0", "nv tracer_exit=1", "b.load"),
        ("nvlab loaded=yes", "nvlab loaded=no", "b.nvdev"),
        (
            "call=free_b rc=0 status=0",
            "call=free_b rc=0 status=4294967295",
            "b.nvdev",
        ),
        ("\"allowed\":true", "\"allowed\":false", "b.nvdev"),
        (
            "\"cause\":\"free\",",
            "\"cause\":\"process_exit\",",
            "b.nvdev",
        ),
        (
            "\"value\":1543503889},\"client\":3251634177,\"engine\"",
            "\"value\":1543503890},\"client\":3251634177,\"engine\"",
            "b.nvdev",
        ),
        (
            "\"ignored\":0,\"emitted\":10,\"fd_lookup_failed\"",
            "\"ignored\":0,\"emitted\":11,\"fd_lookup_failed\"",
            "b.nvdev",
        ),
        (
            "size=88 cmd=0xc0584b02 rc=-22",
            "size=88 cmd=0xc0584b02 rc=-25",
            "c.driver",
        ),
        ("kprobe entry_hits=1", "kprobe entry_hits=0", "d.kprobe"),
        (
            "by_address_attached=5",
            "by_address_attached=4",
            "d.ambiguous",
        ),
        (
            "fentry entry_hits=1 gpu_id=0x4c4142",
            "fentry entry_hits=1 gpu_id=0x0",
            "d.fentry",
        ),
        ("self_denied88=-1", "self_denied88=-22", "e.lsm"),
        ("other_process=-22", "other_process=-1", "e.lsm"),
    ];
    for (from, to, id) in cases {
        assert!(GOOD.contains(from), "{from}");
        let broken = GOOD.replacen(from, to, 1);
        assert_eq!(
            statuses(&broken)[id],
            Status::Fail,
            "{from} → {to} must fail {id}"
        );
    }
}

/// The `--vendor amd` run's event lines in the guest's log (the STATS line excluded): the
/// 96-byte and the 88-byte CREATE_QUEUE, both refused.
fn amd_events() -> Vec<&'static str> {
    let at = GOOD.find("LAB-BEGIN amd.jsonl\n").unwrap() + "LAB-BEGIN amd.jsonl\n".len();
    let end = at + GOOD[at..].find("LAB-END amd.jsonl").unwrap();
    GOOD[at..end]
        .lines()
        .filter(|l| !l.contains("\"STATS\"") && !l.contains("\"INVENTORY\""))
        .collect()
}

/// The guest's log with the `--vendor amd` run's events replaced by `events`.
fn with_amd_trace(events: &[&str]) -> String {
    let real = amd_events().join("\n") + "\n";
    let replaced = if events.is_empty() {
        String::new()
    } else {
        events.join("\n") + "\n"
    };
    assert!(GOOD.contains(&real));
    GOOD.replacen(&real, &replaced, 1)
}

#[test]
fn amd_tracing_is_judged_on_the_events_of_the_real_run() {
    let real = amd_events();
    assert_eq!(real.len(), 2, "{real:?}");
    let (e96, e88) = (real[0], real[1]);
    let trace = |events: &[&str]| statuses(&with_amd_trace(events))["c.trace"];
    assert_eq!(trace(&[e96, e88]), Status::Pass);
    let pid = format!("\"pid\":{}", {
        let at = e96.find("\"pid\":").unwrap() + 6;
        &e96[at..at + e96[at..].find(',').unwrap()]
    });
    let broken = [
        ("\"errno\":-22".to_string(), "\"errno\":-1".to_string()),
        ("\"allowed\":false".into(), "\"allowed\":true".into()),
        (
            "\"kind\":\"kfd_no_queue\"".into(),
            "\"kind\":\"kfd_queue\",\"value\":0".into(),
        ),
        ("\"gpu_id\":4997442".into(), "\"gpu_id\":0".into()),
        ("\"priority\":7".into(), "\"priority\":0".into()),
        ("\"ring_size\":4096".into(), "\"ring_size\":1024".into()),
        (pid.clone(), "\"pid\":1".into()),
    ];
    for (from, to) in &broken {
        let bad = e96.replace(from, to);
        assert_ne!(bad, e96, "{from}");
        assert_eq!(trace(&[&bad, e88]), Status::Fail, "{from} → {to}");
    }
    assert_eq!(trace(&[e96]), Status::Fail, "one call missing");
    assert_eq!(
        trace(&[e96, e96]),
        Status::Fail,
        "the 88-byte form not told apart"
    );
    let init = e96.replace("\"event\":\"SCHEDULE\"", "\"event\":\"TASK_INIT\"");
    assert_eq!(trace(&[e96, e88, &init]), Status::Fail);
    let extra = edit_line(
        GOOD,
        "LAB-BEGIN amd.jsonl",
        &["STATS"],
        "\"emitted\":4",
        "\"emitted\":5",
    );
    assert_eq!(statuses(&extra)["c.trace"], Status::Fail);
}

#[test]
fn doctor_is_judged_by_its_exit_code() {
    assert_eq!(statuses(GOOD)["a.doctor"], Status::Pass);
    let rc5 = GOOD.replacen("LAB-END doctor rc=0", "LAB-END doctor rc=5", 1);
    assert_ne!(rc5, GOOD);
    assert_eq!(statuses(&rc5)["a.doctor"], Status::Fail);
}

/// `text` with `from` replaced by `to` in the first line after `after` that holds every
/// string of `has`.
fn edit_line(text: &str, after: &str, has: &[&str], from: &str, to: &str) -> String {
    let start = text
        .find(after)
        .unwrap_or_else(|| panic!("{after} not in the log"));
    let mut at = start;
    for line in text[start..].split_inclusive('\n') {
        if has.iter().all(|h| line.contains(h)) && line.contains(from) {
            let edited = line.replacen(from, to, 1);
            return format!("{}{}{}", &text[..at], edited, &text[at + line.len()..]);
        }
        at += line.len();
    }
    panic!("no line with {has:?} and {from} after {after}");
}

#[test]
fn deny_runs_are_judged_on_what_each_process_saw() {
    let s = statuses(GOOD);
    assert_eq!(
        (s["e.deny_nv"], s["e.deny_amd"]),
        (Status::Pass, Status::Pass)
    );
    // The PID the reuse run's process got in this log (a real run: it changes with the log).
    let reuse_pid: u32 = GOOD[GOOD.find("LAB-BEGIN deny_nv.reuse").unwrap()..]
        .lines()
        .find_map(|l| l.strip_prefix("LAB nvdeny pid="))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("the reuse run's pid line");
    let (reuse_from, reuse_to) = (format!("pid={reuse_pid}"), format!("pid={}", reuse_pid + 2));
    let cases: [(&str, &[&str], &str, &str, &str); 13] = [
        // The denied schedule reached the driver.
        (
            "LAB-BEGIN deny_nv.denied",
            &["call=schedule"],
            "status=4294967295",
            "status=0",
            "e.deny_nv",
        ),
        // The XFER-wrapped, channel-level or other thread's schedule reached the driver.
        (
            "LAB-BEGIN deny_nv.denied",
            &["call=schedule_xfer"],
            "status=4294967295",
            "status=0",
            "e.deny_nv",
        ),
        (
            "LAB-BEGIN deny_nv.denied",
            &["call=schedule_channel"],
            "rc=-1 ",
            "rc=0 ",
            "e.deny_nv",
        ),
        (
            "LAB-BEGIN deny_nv.denied",
            &["call=schedule_thread"],
            "status=4294967295",
            "status=0",
            "e.deny_nv",
        ),
        // The activating UPDATE_QUEUE of the denied process reached the driver.
        (
            "LAB-BEGIN deny_amd.denied",
            &["call=update_active"],
            "rc=-1",
            "rc=-22",
            "e.deny_amd",
        ),
        // The next owner of the PID was denied too.
        (
            "LAB-BEGIN deny_nv.jsonl",
            &["SCHEDULE", "lab-reuse"],
            "\"allowed\":true",
            "\"allowed\":false",
            "e.deny_nv",
        ),
        // The PID was not reused.
        (
            "LAB-BEGIN deny_nv.reuse",
            &["LAB nvdeny pid="],
            &reuse_from,
            &reuse_to,
            "e.deny_nv",
        ),
        // The other process was denied.
        (
            "LAB-BEGIN deny_amd.other",
            &["size=96"],
            "rc=-22",
            "rc=-1",
            "e.deny_amd",
        ),
        // gpu-trace did not show the refusal (the denied process's first call shown allowed).
        (
            "LAB-BEGIN deny_amd.jsonl",
            &["lab-client"],
            "\"errno\":-1",
            "\"errno\":-22",
            "e.deny_amd",
        ),
        // The tracer failed.
        (
            "LAB deny_amd tracer_exit",
            &["tracer_exit"],
            "tracer_exit=0",
            "tracer_exit=1",
            "e.deny_amd",
        ),
        (
            "LAB deny_nv tracer_ready",
            &["tracer_ready"],
            "tracer_ready=yes",
            "tracer_ready=no",
            "e.deny_nv",
        ),
        // The kernel counted another number of denials.
        (
            "LAB-BEGIN deny_nv.jsonl",
            &["STATS"],
            "\"denied\":4}",
            "\"denied\":3}",
            "e.deny_nv",
        ),
        (
            "LAB-BEGIN deny_amd.jsonl",
            &["STATS"],
            "\"denied\":3}",
            "\"denied\":2}",
            "e.deny_amd",
        ),
    ];
    for (after, has, from, to, id) in cases {
        let broken = edit_line(GOOD, after, has, from, to);
        assert_eq!(
            statuses(&broken)[id],
            Status::Fail,
            "{from} → {to} after {after} must fail {id}"
        );
    }
}

/// `g.nvobj` compares gpu-trace's events with what nvlab answered as the client received
/// it: each planted disagreement in the real guest log fails the check.
#[test]
fn nvobj_is_judged_against_what_the_client_received() {
    assert_eq!(statuses(GOOD)["g.nvobj"], Status::Pass);
    // The module's answers in this log (a real run: they change with the log).
    let client_value = |call: &str, key: &str| -> u64 {
        let at = GOOD.find("LAB-BEGIN nvobj.client").unwrap();
        GOOD[at..]
            .lines()
            .find(|l| l.contains(&format!("call={call} ")))
            .and_then(|l| {
                l.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{call} {key} in the log"))
    };
    let (tsg, token_a, token_b) = (
        client_value("get_info", "tsg_id"),
        client_value("token_a", "token"),
        client_value("token_b", "token"),
    );
    let token = |t: u64| format!("token={t}");
    let json_token = |t: u64| format!("\"token\":{t}");
    let hw = |t: u64| format!("\"task\":{{\"kind\":\"hw_tsg\",\"value\":{t}}}");
    let cases: [(&str, &[&str], String, String); 10] = [
        // The token the client received differs from the one gpu-trace printed.
        (
            "LAB-BEGIN nvobj.client",
            &["call=token_a "],
            token(token_a),
            token(token_a + 1),
        ),
        (
            "LAB-BEGIN nvobj.jsonl",
            &["WORK_SUBMIT"],
            json_token(token_b),
            json_token(token_b + 0x10000),
        ),
        // The module's TSG id (GET_INFO) is not the one the events name.
        (
            "LAB-BEGIN nvobj.client",
            &["call=get_info "],
            format!("tsg_id={tsg}"),
            format!("tsg_id={}", tsg + 1),
        ),
        (
            "LAB-BEGIN nvobj.jsonl",
            &["TASK_INIT"],
            hw(tsg),
            "\"task\":{\"kind\":\"tsg\",\"value\":1543503920}".into(),
        ),
        // The bind hook's channel count not in the SCHEDULE, or not decremented on free.
        (
            "LAB-BEGIN nvobj.jsonl",
            &["SCHEDULE"],
            "\"channels\":2".into(),
            "\"channels\":0".into(),
        ),
        (
            "LAB-BEGIN nvobj.jsonl",
            &["SCHEDULE", "\"channels\":1"],
            "\"channels\":1".into(),
            "\"channels\":2".into(),
        ),
        // The module accepted what RM refuses.
        (
            "LAB-BEGIN nvobj.client",
            &["call=alloc_tsg_again "],
            "status=25 ".into(),
            "status=0 ".into(),
        ),
        (
            "LAB-BEGIN nvobj.client",
            &["call=free_unknown_client "],
            "status=51 ".into(),
            "status=0 ".into(),
        ),
        (
            "LAB-BEGIN nvobj.client",
            &["call=token_unknown "],
            "token=4294967295".into(),
            "token=851971".into(),
        ),
        // The tracer did not run.
        (
            "LAB nvobj tracer_ready",
            &["tracer_ready"],
            "tracer_ready=yes".into(),
            "tracer_ready=no".into(),
        ),
    ];
    for (after, has, from, to) in &cases {
        let broken = edit_line(GOOD, after, has, from, to);
        assert_ne!(broken, GOOD);
        assert_eq!(
            statuses(&broken)["g.nvobj"],
            Status::Fail,
            "{from} → {to} after {after} must fail g.nvobj"
        );
    }
    // A TASK_DESTROY for the refused free (the TSG's line once more, before its real one).
    let at = GOOD.find("LAB-BEGIN nvobj.jsonl").unwrap();
    let line = GOOD[at..]
        .lines()
        .find(|l| l.contains("\"event\":\"TASK_DESTROY\""))
        .unwrap();
    let twice = GOOD.replacen(line, &format!("{line}\n{line}"), 1);
    assert_ne!(twice, GOOD);
    assert_eq!(statuses(&twice)["g.nvobj"], Status::Fail);
    // The run left out of the guest's scenario.
    let (b, e) = (
        GOOD.find("LAB nvobj tracer_ready").unwrap(),
        GOOD.find("LAB-END nvobj.jsonl").unwrap(),
    );
    let without = format!("{}{}", &GOOD[..b], &GOOD[e..]);
    assert_eq!(statuses(&without)["g.nvobj"], Status::Fail);
}

#[test]
fn the_verdict_fails_when_any_kernel_fails() {
    let good = || judge_recorded(GOOD);
    assert!(verdict(&[good(), good()]).is_ok());
    assert!(verdict(&[good(), judge(&Results::parse(""))]).is_err());
    let one_failed = GOOD.replacen("LAB-DONE\n", "", 1);
    assert!(verdict(&[judge(&Results::parse(&one_failed))]).is_err());
}

#[test]
fn an_unfinished_scenario_names_its_last_step() {
    let cut = &GOOD[..GOOD.find("LAB step lsm").unwrap()];
    let checks = judge(&Results::parse(cut));
    let boot = checks.iter().find(|c| c.id == "a.boot").unwrap();
    assert_eq!(boot.status, Status::Fail);
    assert!(
        boot.detail.contains("the last step begun: fentry t="),
        "{}",
        boot.detail
    );
}

#[test]
fn an_empty_log_fails_everything() {
    for (id, st) in statuses("") {
        assert_eq!(st, Status::Fail, "{id}");
    }
}

/// The doctor's AMD driver row of GOOD, and what it says on a kernel whose KFD cannot serve.
const AMD_YES: &str = "AMD     driver                yes  KFD 1.11 (AMDKFD_IOC_GET_VERSION); 0 GPU node(s) in the KFD topology";

#[test]
fn a_kernel_without_kfd_asserts_why_and_the_amd_checks_are_not_applicable() {
    // Debian's arm64 kernels: amdgpu without KFD (CONFIG_HSA_AMD not set).
    let no_kfd = GOOD
        .replace(
            "LAB fact kfd=present dev=f3:0 proc_devices_major=243",
            "LAB fact hsa_amd=n # CONFIG_HSA_AMD is not set\nLAB fact kfd=absent",
        )
        .replace(
            AMD_YES,
            "AMD     driver                no   amdgpu is loaded but /dev/kfd is missing",
        );
    passes_but(&no_kfd, &every_kfd_check());
    // The same kernel with a doctor that claims the driver works, or a /dev/kfd: a.kfd fails.
    assert_eq!(
        statuses(&no_kfd.replace(
            "AMD     driver                no ",
            "AMD     driver                yes"
        ))["a.kfd"],
        Status::Fail
    );
    assert_eq!(
        statuses(&no_kfd.replace("LAB fact kfd=absent", "LAB fact kfd=present dev=f3:0"))["a.kfd"],
        Status::Fail
    );
    // And the verdict counts them apart: no failure, not passes either.
    let checks = judge_recorded(&no_kfd);
    let na = checks
        .iter()
        .filter(|c| c.status == Status::NotApplicable)
        .count();
    assert_eq!(
        na,
        needing(Needs::KfdCalls).len() + needing(Needs::KfdFunctions).len()
    );
    assert!(verdict(&[checks]).is_ok());
}

#[test]
fn kfd_refusing_processes_without_a_gpu_keeps_the_attach_checks() {
    // Linux 7.0 on (Debian sid): open("/dev/kfd") is EINVAL, the kernel says why.
    let refused = GOOD
        .replace(
            "LAB kfd get_version rc=0 major=1 minor=11",
            "LAB error open=/dev/kfd errno=22 (Invalid argument)",
        )
        .replace(
            "LAB fact kfd=present",
            "LAB fact hsa_amd=y\nLAB fact kfd_refusal=amdgpu: no gpu node! Cannot create KFD process\nLAB fact kfd=present",
        )
        .replace(
            AMD_YES,
            "AMD     driver                no   /dev/kfd exists but opening /dev/kfd: Invalid argument (os error 22)",
        );
    let s = statuses(&refused);
    assert_eq!(s["a.kfd"], Status::Pass);
    for id in needing(Needs::KfdCalls) {
        assert_eq!(s[id], Status::NotApplicable, "{id}");
    }
    for id in needing(Needs::KfdFunctions) {
        assert_eq!(s[id], Status::Pass, "{id}");
    }
    // Without the kernel's reason the refusal is a failure, as before.
    let unexplained = refused.replace("no gpu node! ", "");
    let s = statuses(&unexplained);
    assert_eq!(s["a.kfd_version"], Status::Fail);
    assert!(s.values().all(|st| *st != Status::NotApplicable));
}

#[test]
fn a_failure_in_a_guest_whose_kernel_skipped_runs_names_them() {
    let warning = "gpu-trace: WARNING: the kernel skipped 35 run(s) of gpu-trace's programs (sys_exit_btf 35): each was already running on that CPU, so the calls of those runs were not seen";
    // The 6.1 log with one client event missing and the warning in that run's stderr.
    let broken = GOOD.replacen(
        "LAB-END deny_nv.stderr",
        &format!("{warning}\nLAB-END deny_nv.stderr"),
        1,
    );
    assert_ne!(broken, GOOD, "the log has a deny_nv stderr block");
    let checks = judge_recorded(&broken);
    // Nothing failed: no note anywhere.
    assert!(checks.iter().all(|c| !c.detail.contains("skipped runs")));
    let failing = broken.replacen("LAB kfd get_version rc=0 major=1 minor=11", "", 1);
    let checks = judge(&Results::parse(&failing));
    let kv = checks.iter().find(|c| c.id == "a.kfd_version").unwrap();
    assert_eq!(kv.status, Status::Fail);
    assert!(
        kv.detail.contains(
            "skipped runs of gpu-trace's programs, each losing its calls, in: deny_nv (35)"
        ),
        "{}",
        kv.detail
    );
}

/// Debian 6.12.117+deb12 as its guest wrote it with issue 26's `deny_fork` step and issue
/// 40's `deny_compat` step (`cargo xtask lab --kernel 6.12` of this tree, 2026-11-29, 33
/// checks passed; gpu-trace the static musl build), copied from
/// `target/lab-cache/run/6.12.117+deb12-amd64/results.log` (CRs removed).
const DENY_FORK: &str = include_str!("../../../testdata/lab-6.12-results.log");

/// `text` with the first `from` after the line `LAB-BEGIN block` replaced by `to`.
fn in_block(text: &str, block: &str, from: &str, to: &str) -> String {
    let start = text
        .find(&format!("LAB-BEGIN {block}\n"))
        .unwrap_or_else(|| panic!("no block {block}"));
    let at = start + text[start..].find(from).expect("the line is in the block");
    format!("{}{to}{}", &text[..at], &text[at + from.len()..])
}

#[test]
fn deny_fork_finn_and_compat_runs_pass_and_each_escape_fails() {
    let s = all_pass(DENY_FORK);
    assert_eq!(s.len(), CHECKS.len());
    let current: Vec<_> = statuses(GOOD).into_keys().collect();
    assert_eq!(s.into_keys().collect::<Vec<_>>(), current);
    let refused = "rc=-1 status=4294967295";
    let cases = [
        // The denied client's child was not denied (the fork not followed).
        (
            "deny_fork_nv.denied",
            format!("call=schedule {refused}"),
            "call=schedule rc=0 status=0".to_string(),
            "e.deny_fork_nv",
        ),
        // The child ran while its parent was alive (not the reparented case).
        (
            "deny_fork_nv.denied",
            "reparented=1".into(),
            "reparented=0".into(),
            "e.deny_fork_nv",
        ),
        // The other client's child was denied.
        (
            "deny_fork_nv.other",
            "call=schedule_xfer rc=0 status=0".into(),
            format!("call=schedule_xfer {refused}"),
            "e.deny_fork_nv",
        ),
        // A FINN-serialized schedule of the denied process reached the driver (bEnable read
        // from the serialized buffer's first byte, 0: the bypass).
        (
            "deny_finn_nv.denied",
            format!("call=schedule_finn {refused}"),
            "call=schedule_finn rc=0 status=0".into(),
            "e.deny_finn_nv",
        ),
        // The channel's XFER-wrapped FINN schedule likewise.
        (
            "deny_finn_nv.denied",
            format!("call=schedule_finn_channel_xfer {refused}"),
            "call=schedule_finn_channel_xfer rc=0 status=0".into(),
            "e.deny_finn_nv",
        ),
        // A stand-in that checks _IOC_TYPE, as the real driver does not.
        (
            "deny_finn_nv.other",
            "call=schedule_type0 rc=0 status=0".into(),
            "call=schedule_type0 rc=-25 status=4294967295".into(),
            "e.deny_finn_nv",
        ),
        // The policy refused the plain disable.
        (
            "deny_finn_nv.denied",
            "call=disable rc=0 status=0".into(),
            format!("call=disable {refused}"),
            "e.deny_finn_nv",
        ),
        // The compat hook let the denied 32-bit client's schedule through (the mutant of issue
        // 40: file_ioctl_compat allowing everything); nvlab answered it.
        (
            "deny_compat_nv.denied",
            format!("call=schedule {refused}"),
            "call=schedule rc=0 status=35".into(),
            "e.deny_compat_nv",
        ),
        // ... or its XFER-wrapped one.
        (
            "deny_compat_nv.denied",
            format!("call=schedule_xfer {refused}"),
            "call=schedule_xfer rc=0 status=35".into(),
            "e.deny_compat_nv",
        ),
        // The other 32-bit client was refused.
        (
            "deny_compat_nv.other",
            "call=schedule rc=0 status=35".into(),
            format!("call=schedule {refused}"),
            "e.deny_compat_nv",
        ),
        // The client that ran was not the 32-bit one.
        (
            "deny_compat_nv.other",
            "bits=32".into(),
            "bits=64".into(),
            "e.deny_compat_nv",
        ),
    ];
    for (block, from, to, id) in cases {
        let broken = in_block(DENY_FORK, block, &from, &to);
        let st = statuses(&broken);
        assert_eq!(st[id], Status::Fail, "{block}: {from} -> {to}");
        let failed: Vec<_> = st.iter().filter(|(_, s)| **s == Status::Fail).collect();
        assert_eq!(failed.len(), 1, "{block}: {from} -> {to}: {failed:?}");
    }
}

/// Debian sid's 7.2.13+deb14 as its guest wrote it (`cargo xtask lab --kernel sid` of this
/// tree, 2026-11-25 20:09, single-threaded TCG), copied from
/// `target/lab-cache/run/7.2.13+deb14-amd64/results.log` (CRs removed): KFD refuses open().
const SID: &str = include_str!("../../../testdata/lab-sid-results.log");
/// Debian's arm64 6.12.117+deb12 (`cargo xtask lab --arch arm64` of issue 26's tree,
/// 2026-11-26, with the `deny_fork` step: 18 passed, 14 not applicable), from
/// `target/lab-cache/run/6.12.117+deb12-arm64/results.log`: a kernel without KFD.
const ARM64: &str = include_str!("../../../testdata/lab-arm64-6.12-results.log");

/// The checks a kernel without KFD cannot run.
fn every_kfd_check() -> Vec<&'static str> {
    let mut ids = needing(Needs::KfdCalls);
    ids.extend(needing(Needs::KfdFunctions));
    ids
}

/// The checks not applicable on the arm64 guest: those that need KFD or a 32-bit x86 client.
fn every_arm64_na() -> Vec<&'static str> {
    let mut ids = every_kfd_check();
    ids.extend(needing(Needs::X86Compat));
    ids
}

/// Every check of `text` passed except `na`, which are not applicable (a.kfd among the
/// passes); the same ids as a current x86-64 kernel's log.
fn passes_but(text: &str, na: &[&str]) {
    let s = statuses(text);
    for (id, st) in &s {
        if predates(text, id) {
            assert_eq!(*st, Status::Fail, "{id}");
            continue;
        }
        let want = if na.contains(id) {
            Status::NotApplicable
        } else {
            Status::Pass
        };
        assert_eq!(*st, want, "{id}: {:#?}", judge(&Results::parse(text)));
    }
    let current: Vec<_> = statuses(GOOD).into_keys().collect();
    assert_eq!(s.into_keys().collect::<Vec<_>>(), current);
}

#[test]
fn sid_passes_with_the_checks_that_make_kfd_calls_not_applicable() {
    passes_but(SID, &needing(Needs::KfdCalls));
    // Its a.kfd is the refusal's own check, with the kernel's words.
    let kfd = judge(&Results::parse(SID))
        .into_iter()
        .find(|c| c.id == "a.kfd")
        .unwrap();
    assert!(kfd.detail.contains("no gpu node!"), "{}", kfd.detail);
}

#[test]
fn arm64_passes_with_every_kfd_check_not_applicable() {
    passes_but(ARM64, &every_arm64_na());
    assert_eq!(
        Guest::read(&Results::parse(ARM64)).fact("arch"),
        Some("aarch64")
    );
}

/// The guests' results read once into typed values: every JSON line gpu-trace printed in the
/// real logs is a typed event (the serde types accept its output as it is), each run's STATS
/// line gives its counters, and a run's exit is known.
#[test]
fn every_run_of_the_real_logs_reads_into_typed_values() {
    for (name, log) in [
        ("6.1", GOOD),
        ("5.10", OLD),
        ("6.12", DENY_FORK),
        ("sid", SID),
        ("arm64", ARM64),
    ] {
        let r = Results::parse(log);
        let g = Guest::read(&r);
        let mut events = 0;
        for run in r.blocks.keys().filter_map(|b| b.strip_suffix(".jsonl")) {
            let out = &g.run(run).output;
            assert!(out.bad.is_empty(), "{name} {run}: {:?}", out.bad);
            events += out.events.len();
            if out.events.iter().any(|e| e.is("STATS")) {
                let emitted = out.kernel(|k| k.emitted);
                assert!(
                    emitted.is_some(),
                    "{name} {run}: STATS without kernel.emitted"
                );
            }
            assert!(g.run(run).exit.is_some(), "{name} {run}: no tracer_exit");
        }
        assert!(events > 50, "{name}: {events} events");
        // The typed fields are the line's own.
        let nv = g.run("nv").output.of(g
            .client("nv.client")
            .with_key("nv", "pid")
            .and_then(|f| f.int("pid")));
        let sched = nv.iter().find(|e| e.is("SCHEDULE")).unwrap();
        assert_eq!(sched.task.value, sched.raw["task"]["value"].as_u64());
        assert_eq!(sched.errno, Some(-ENOTTY), "{name}");
        assert_eq!(sched.allowed, Some(false), "{name}");
    }
}

/// `.ci/expected-skips` lets the arm64 kernel's N/A through one check at a time: exactly the
/// checks that need KFD, with the reason `Kfd::cannot_serve` gives a kernel without it, and
/// those that need a 32-bit x86 client, with theirs, so that a check that needs neither, or one
/// that comes to need one, cannot be N/A there unjudged.
#[test]
fn ci_expects_arm64_na_for_exactly_the_checks_that_need_kfd_or_x86_compat() {
    let path = crate::host::workspace_root().join(".ci/expected-skips");
    let text = std::fs::read_to_string(&path).unwrap();
    let reason = Kfd::NotBuilt {
        config: String::new(),
    }
    .cannot_serve(Needs::KfdCalls)
    .unwrap();
    let mut listed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("na "))
        .map(|l| {
            let glob = l.split(" | ").next().unwrap();
            let rest = glob
                .strip_prefix("lab Debian * in QEMU (aarch64 *): ")
                .unwrap_or_else(|| panic!("an N/A glob not pinned to arm64: {l}"));
            let (id, why) = rest
                .split_once(": ")
                .unwrap_or_else(|| panic!("no check id: {l}"));
            let reason = if needing(Needs::X86Compat).contains(&id) {
                super::NOT_X86
            } else {
                reason
            };
            assert_eq!(why, format!("{reason}; as judged: *"), "{l}");
            id
        })
        .collect();
    listed.sort_unstable();
    let mut want = every_arm64_na();
    want.sort_unstable();
    assert_eq!(listed, want);
}
