//! gpu-trace's own deep hooks on KFD (`f.*`, issue 3): the same `kfd-ops` calls traced through
//! the syscall layer only (`ops_syscall`), through the driver's functions (`ops_deep`) and
//! through their kprobe fallback (`ops_kprobe`).

use serde_json::Value;

use super::kernel::has_module_btf;
use super::{EFAULT, EINVAL, Guest, Judged, Run};

/// What gpu-trace prints for the AMD deep hooks on a kernel without module BTF: the three
/// handlers whose arguments it needs no size for by kprobe, CREATE_QUEUE left to the syscall
/// layer, and the hooks that read the driver's structures not used.
const NO_MODULE_BTF_HANDLERS: &str = "AMD ioctl events → kprobe+kretprobe/{kfd_ioctl_destroy_queue,\
                                      kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask} (in amdgpu)";
const NO_MODULE_BTF_REFUSALS: [&str; 4] = [
    "(not used: AMD ioctl events: kfd_ioctl_create_queue: the size of struct \
     kfd_ioctl_create_queue_args is unknown without the module's BTF; the syscall layer serves \
     CREATE_QUEUE)",
    "(not used: AMD queue details: create_queue_cpsch, create_queue_nocpsch: no module BTF to \
     read offsets from)",
    "(not used: AMD MQD init: no module BTF to read offsets from)",
    "(not used: AMD queue teardown: pqm_uninit: no module BTF to read offsets from)",
];

/// The fallback of a kernel without module BTF, as printed in a run's stderr: problems found.
fn no_module_btf_fallback(hooks: &str, stderr: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !hooks.contains(NO_MODULE_BTF_HANDLERS) {
        problems.push(format!("want `{NO_MODULE_BTF_HANDLERS}`"));
    }
    if !hooks.contains("ioctl+close → tp_btf/sys_exit") {
        problems.push("want the syscall layer attached for CREATE_QUEUE".into());
    }
    for want in NO_MODULE_BTF_REFUSALS {
        if !stderr.contains(want) {
            problems.push(format!("want `{want}`"));
        }
    }
    problems
}

/// Every copy of each MQD builder this kernel has, by address, as gpu-trace's hooks line says
/// it (`name ×attached/copies`).
fn mqd_copies(hooks: &str) -> Vec<(String, u32, u32)> {
    hooks
        .split(';')
        .find(|h| h.contains("AMD MQD init → kprobe by address:"))
        .map(|h| {
            h.split(['(', ':'])
                .nth(1)
                .unwrap_or("")
                .split(',')
                .filter_map(|part| {
                    let (name, counts) = part.trim().split_once(" ×")?;
                    let (a, b) = counts.split_once('/')?;
                    Some((
                        name.to_string(),
                        a.trim().parse::<u32>().ok()?,
                        b.trim().parse::<u32>().ok()?,
                    ))
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
}

/// What the deep run chose with module BTF: problems found.
fn deep_choice(hooks: &str, stderr: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let want_handlers = "AMD ioctl events → fexit/{kfd_ioctl_create_queue,kfd_ioctl_destroy_queue,\
                         kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask} (amdgpu BTF)";
    if !hooks.contains(want_handlers) {
        problems.push(format!("want `{want_handlers}`"));
    }
    // Both device-queue-manager implementations take six arguments: trampolines on 6.1 too.
    let want_dqm = "AMD queue details → fexit/{create_queue_cpsch,create_queue_nocpsch}";
    if !hooks.contains(want_dqm) {
        problems.push(format!("want `{want_dqm}`"));
    }
    let mqd = mqd_copies(hooks);
    let all_copies = mqd.iter().all(|(_, a, b)| a == b);
    let init_copies = mqd
        .iter()
        .find(|(n, _, _)| n == "init_mqd")
        .map(|(_, a, _)| *a);
    let sdma = mqd.iter().any(|(n, _, _)| n == "init_mqd_sdma");
    if !(all_copies && init_copies.is_some_and(|n| n > 1) && sdma) {
        problems.push(format!(
            "want every copy of init_mqd (> 1) and init_mqd_sdma attached by address, got {mqd:?}"
        ));
    }
    if !hooks.contains("AMD queue teardown → fentry/{pqm_uninit} (amdgpu BTF)") {
        problems.push("want fentry/{pqm_uninit}".into());
    }
    if !stderr.contains("syscall layer not attached") {
        problems.push(
            "want the syscall layer left out (every KFD command served by the driver hooks)".into(),
        );
    }
    problems
}

pub(super) fn select(g: &Guest) -> Judged {
    let run = g.run("ops_deep");
    let hooks = run.hooks();
    let module_btf = has_module_btf(g);
    let mut problems = if module_btf {
        deep_choice(&hooks, &run.stderr)
    } else {
        no_module_btf_fallback(&hooks, &run.stderr)
    };
    if !g.ready("ops_deep") {
        problems.push("tracer not ready".into());
    }
    Judged::new(
        if module_btf {
            "gpu-trace picks per event: fexit on the KFD handlers and on both DQM create_queue functions, every init_mqd/init_mqd_sdma copy by address, fentry on pqm_uninit; no syscall hook"
        } else {
            "before 5.11 (no module BTF): kprobes on the three handlers, CREATE_QUEUE on the syscall layer, the hooks that read driver structures refused with the reason"
        },
        problems.is_empty(),
        if problems.is_empty() {
            hooks
        } else {
            format!("{}: {}", problems.join("; "), run.stderr.trim())
        },
    )
}

/// The events of a run's `kfd-ops` client, without what differs between two runs of the same
/// calls (time, cpu, pid), for comparing runs.
fn normal(g: &Guest, name: &str) -> Vec<Value> {
    let pid = g
        .client(&format!("{name}.client"))
        .find("kfd_ops", &[])
        .and_then(|f| f.int("pid"));
    g.run(name)
        .output
        .of(pid)
        .into_iter()
        .map(|e| {
            let mut e = e.raw.clone();
            // `key` starts with the pid.
            for k in ["ts", "ts_ns", "cpu", "pid", "tid", "time", "key"] {
                e.as_object_mut().map(|o| o.remove(k));
            }
            // The driver's copy of an 88-byte CREATE_QUEUE is zero-filled to 96 bytes: the
            // deep hook reads sdma_engine_id 0 where the syscall layer reads nothing.
            e["amd"].as_object_mut().map(|o| o.remove("sdma_engine_id"));
            e
        })
        .collect()
}

/// What the calls are known to do without a GPU (no queue with the lab's gpu_id): CREATE_QUEUE
/// and DESTROY_QUEUE refused with EINVAL, UPDATE_QUEUE and SET_CU_MASK with EFAULT.
const KFD_OPS_RC: [(&str, i64); 4] = [
    ("create", -EINVAL),
    ("update", -EFAULT),
    ("cu_mask", -EFAULT),
    ("destroy", -EINVAL),
];

/// Same calls, same events: the deep run must print what the syscall layer printed.
pub(super) fn events(g: &Guest) -> Judged {
    let (sys, deep) = (g.run("ops_syscall"), g.run("ops_deep"));
    let (s_norm, d_norm) = (normal(g, "ops_syscall"), normal(g, "ops_deep"));
    let calls = g.client("ops_deep.client");
    let rc = |call: &str| {
        calls
            .find("kfd_ops", &[("call", call)])
            .and_then(|f| f.int("rc"))
    };
    let mut problems = Vec::new();
    let (sys_bad, deep_bad) = (&sys.output.bad, &deep.output.bad);
    if !sys_bad.is_empty() || !deep_bad.is_empty() {
        problems.push(format!("non-JSON lines: {sys_bad:?} {deep_bad:?}"));
    }
    if s_norm.is_empty() {
        problems.push("the syscall-layer run printed no event for the client".into());
    }
    if s_norm != d_norm {
        problems.push(format!(
            "syscall layer printed {s_norm:?}\ndeep hooks printed {d_norm:?}"
        ));
    }
    // The process's cgroup, one record per call, none twice, plus the exit notice; the deep run
    // also sends the driver's teardown (pqm_uninit) record. All counted in `emitted`.
    // Without module BTF there is no teardown hook: 6 in both runs.
    let deep_emitted = if has_module_btf(g) { 7 } else { 6 };
    let (se, de) = (
        sys.output.kernel(|k| k.emitted),
        deep.output.kernel(|k| k.emitted),
    );
    let dd = deep.output.kernel(|k| k.dropped);
    if (se, de, dd) != (Some(6), Some(deep_emitted), Some(0)) {
        problems.push(format!(
            "kernel emitted {se:?} (syscall) / {de:?} (deep), dropped {dd:?}: want 6 (cgroup + 4 calls + exit), \
             {deep_emitted} (+ pqm_uninit where hooked), 0",
        ));
    }
    let refused = |kind: &str| {
        d_norm
            .iter()
            .filter(|e| e["event"] == kind && e["allowed"] == false)
            .count()
    };
    // gpu-trace shows a refused SCHEDULE for the create (the admission request) and a refused
    // SCHED_UPDATE for the update and the CU mask (parameter changes); a refused destroy prints
    // nothing; in both runs.
    for (call, want) in KFD_OPS_RC {
        if rc(call) != Some(want) {
            problems.push(format!(
                "client {call} returned {:?}, want {want}",
                rc(call)
            ));
        }
    }
    let (sched, upd) = (refused("SCHEDULE"), refused("SCHED_UPDATE"));
    if d_norm.len() != 3 || sched != 1 || upd != 2 {
        problems.push(format!(
            "{} events, {sched} refused SCHEDULE, {upd} refused SCHED_UPDATE: want exactly 1 \
             (CREATE_QUEUE) and 2 (UPDATE_QUEUE, SET_CU_MASK)",
            d_norm.len()
        ));
    }
    Judged::of(
        "the four KFD handlers hooked: the same events as the syscall layer, each call once",
        &problems,
        || {
            format!(
                "client: create {:?}, update {:?}, cu_mask {:?}, destroy {:?}; {} events identical in both runs ({sched} refused SCHEDULE, {upd} refused SCHED_UPDATE); emitted 6 / {deep_emitted} (the process's cgroup, 4 calls, the exit notice, and the deep run's teardown record where hooked)",
                rc("create"),
                rc("update"),
                rc("cu_mask"),
                rc("destroy"),
                d_norm.len()
            )
        },
    )
}

/// What `--deep-attach kprobe` must print with module BTF.
const KPROBE_HOOKS: [&str; 3] = [
    "AMD ioctl events → kprobe+kretprobe/{kfd_ioctl_create_queue,kfd_ioctl_destroy_queue,\
     kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask} (in amdgpu)",
    "AMD queue details → kprobe+kretprobe/{create_queue_cpsch,create_queue_nocpsch} (in amdgpu)",
    "AMD queue teardown → kprobe/{pqm_uninit} (in amdgpu)",
];

/// The kprobe fallback of every deep hook (`--deep-attach kprobe`): chosen, same events, the
/// teardown seen.
pub(super) fn kprobe(g: &Guest) -> Judged {
    let module_btf = has_module_btf(g);
    let run: &Run = g.run("ops_kprobe");
    let khooks = run.hooks();
    let mut kproblems = if module_btf {
        Vec::new()
    } else {
        no_module_btf_fallback(&khooks, &run.stderr)
    };
    let wanted: &[&str] = if module_btf { &KPROBE_HOOKS } else { &[] };
    for want in wanted {
        if !khooks.contains(want) {
            kproblems.push(format!("want `{want}`"));
        }
    }
    let kbad = &run.output.bad;
    if !kbad.is_empty() {
        kproblems.push(format!("non-JSON lines: {kbad:?}"));
    }
    let (s_norm, k_norm) = (normal(g, "ops_syscall"), normal(g, "ops_kprobe"));
    if k_norm != s_norm {
        kproblems.push(format!(
            "syscall layer printed {s_norm:?}\nkprobes printed {k_norm:?}"
        ));
    }
    let out = &run.output;
    let kreleased = out.unreported(|u| u.kfd_release_no_queues);
    let want_k = if module_btf {
        (Some(7), Some(0), Some(1))
    } else {
        (Some(6), Some(0), None)
    };
    let (emitted, dropped) = (out.kernel(|k| k.emitted), out.kernel(|k| k.dropped));
    if (emitted, dropped, kreleased) != want_k {
        kproblems.push(format!(
            "emitted {emitted:?} dropped {dropped:?} kfd_release_no_queues {kreleased:?}: want {want_k:?} (cgroup, 4 calls, exit, \
             pqm_uninit where hooked; 0 dropped; the teardown seen where hooked)",
        ));
    }
    Judged::new(
        "--deep-attach kprobe: every deep hook on its kprobe fallback, the same events, the teardown seen",
        kproblems.is_empty(),
        if kproblems.is_empty() {
            khooks
        } else {
            format!("{}: {}", kproblems.join("; "), run.stderr.trim())
        },
    )
}

/// The client's process teardown, seen in the driver.
pub(super) fn release(g: &Guest) -> Judged {
    let deep = g.run("ops_deep");
    let released = deep.output.unreported(|u| u.kfd_release_no_queues);
    if has_module_btf(g) {
        Judged::new(
            "fentry/pqm_uninit sees the driver tear down the client's KFD process when it exits",
            released == Some(1),
            format!(
                "kfd_release_no_queues {released:?} (want 1: the client opened /dev/kfd, created no queue, exited)"
            ),
        )
    } else {
        // No offsets into the driver's structures: the queues end at process exit (implicit),
        // and the teardown hook is refused with its reason.
        let refused = deep.stderr.contains(NO_MODULE_BTF_REFUSALS[3]);
        Judged::new(
            "before 5.11: the teardown hook refused for want of module BTF (queues end at process exit), no teardown record",
            refused && released.is_none(),
            format!("refusal printed: {refused}; kfd_release_no_queues {released:?} (want none)"),
        )
    }
}
