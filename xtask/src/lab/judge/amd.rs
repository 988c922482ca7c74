//! AMD (`c.*`, `d.*`): CREATE_QUEUE on /dev/kfd reaching the driver and traced by gpu-trace,
//! and the kernel's attach mechanisms on KFD's functions (kprobe, by address, fentry).

use super::events::Event;
use super::guest::Records;
use super::kernel::has_module_btf;
use super::{EADDRNOTAVAIL, EINVAL, Guest, Judged, LAB_GPU_ID, indent, no_bad_lines};

pub(super) fn driver(g: &Guest) -> Judged {
    let client = g.client("amd.client");
    let rc = |size: &str| {
        client
            .find("kfd_create", &[("size", size)])
            .and_then(|f| f.int("rc"))
    };
    let (r96, r88) = (rc("96"), rc("88"));
    Judged::new(
        "CREATE_QUEUE on /dev/kfd enters the driver and fails with EINVAL (96- and 88-byte forms)",
        r96 == Some(-EINVAL) && r88 == Some(-EINVAL),
        format!(
            "96-byte: {r96:?}, 88-byte: {r88:?} (want -{EINVAL}: no GPU with the lab's gpu_id)"
        ),
    )
}

/// docs/amd.md: a refused CREATE_QUEUE is `SCHEDULE via=create allowed=no` with the errno,
/// task `kfd_no_queue`, and the parameters the caller passed (lab/client.c `LAB_*`).
fn refused_create(e: &Event) -> bool {
    let Some(amd) = &e.amd else { return false };
    e.is("SCHEDULE")
        && e.allowed == Some(false)
        && e.errno == Some(-EINVAL)
        && e.task.kind.as_deref() == Some("kfd_no_queue")
        && amd.via.as_deref() == Some("create")
        && amd.gpu_id == Some(LAB_GPU_ID)
        && amd.queue_type.as_deref() == Some("COMPUTE_AQL")
        && amd.priority == Some(7)
        && amd.percentage == Some(100)
        && amd.ring_size == Some(4096)
}

pub(super) fn trace(g: &Guest) -> Judged {
    let client = g.client("amd.client");
    let run = g.run("amd");
    // A build that cannot trace AMD (the probe run exits non-zero) fails below: the tracer is
    // not ready and no event arrives.
    if let Some(b) = g.block("amd.probe").filter(|b| b.rc != Some(0)) {
        return Judged::fail(
            "gpu-trace --vendor amd shows the refused CREATE_QUEUE calls",
            format!(
                "`gpu-trace --vendor amd` exited {:?}:\n{}",
                b.rc,
                indent(&b.text)
            ),
        );
    }
    let pid = client.find("kfd_create", &[]).and_then(|f| f.int("pid"));
    let out = &run.output;
    let mut problems = Vec::new();
    if !g.ready("amd") {
        problems.push(format!("tracer not ready: {}", run.stderr.trim()));
    }
    no_bad_lines(run, &mut problems);
    let of_client = out.of(pid);
    if out.events.iter().any(|e| e.is("TASK_INIT")) {
        problems.push("a TASK_INIT although no queue was created".into());
    }
    let refused: Vec<&&Event> = of_client.iter().filter(|e| refused_create(e)).collect();
    if refused.len() != 2 {
        problems.push(format!(
            "want 2 refused CREATE_QUEUE events (SCHEDULE via=create allowed=false errno=-{EINVAL}, \
             task kfd_no_queue, gpu_id {LAB_GPU_ID:#x} COMPUTE_AQL priority 7, 100 %, ring 4096) \
             for pid {pid:?}, got {}: {of_client:?}",
            refused.len()
        ));
    }
    // The 88-byte form ends before sdma_engine_id: gpu-trace reports it unknown (null); the
    // 96-byte form carries it (0). So each form was read with its own size.
    let sdma: Vec<&serde_json::Value> = refused
        .iter()
        .map(|e| &e.raw["amd"]["sdma_engine_id"])
        .collect();
    if refused.len() == 2
        && !(sdma.contains(&&serde_json::json!(0)) && sdma.contains(&&serde_json::Value::Null))
    {
        problems.push(format!(
            "sdma_engine_id {sdma:?}: want 0 (96-byte form) and null (88-byte form)"
        ));
    }
    // 2 refused creates and the client's exit notice (close notices are for RM processes only).
    let (emitted, dropped) = (out.kernel(|k| k.emitted), out.kernel(|k| k.dropped));
    if (emitted, dropped) != (Some(4), Some(0)) {
        problems.push(format!(
            "kernel emitted {emitted:?} dropped {dropped:?}: want 4 (the process's cgroup, 2 calls, 1 exit notice), 0",
        ));
    }
    Judged::of(
        "gpu-trace --vendor amd shows both CREATE_QUEUE calls refused with EINVAL, no TASK_INIT",
        &problems,
        || {
            format!(
                "{}; 2 × SCHEDULE via=create allowed=false errno=-22 task=kfd_no_queue, gpu_id, \
                 type, priority, percentage, ring decoded; sdma_engine_id 0 (96-byte) and null \
                 (88-byte)",
                run.hooks()
            )
        },
    )
}

/// Entry and return programs on kfd_ioctl_create_queue: one hit each, the driver's copy of the
/// arguments read at entry, the driver's errno at return.
fn create_queue_probe(r: &Records, topic: &str) -> (bool, String) {
    let Some(f) = r.with_key(topic, "entry_hits") else {
        let lines = r.lines_starting(&format!("LAB {topic} "));
        return (false, format!("no result; client said: {lines:?}"));
    };
    let ok = f.int("entry_hits") == Some(1)
        && f.int("return_hits") == Some(1)
        && f.int("gpu_id") == Some(LAB_GPU_ID as i64)
        && f.int("ret") == Some(-EINVAL);
    (
        ok,
        format!(
            "entry hits {}, gpu_id read from the driver's args {}, return hits {}, returned {} (want 1, {LAB_GPU_ID:#x}, 1, -{EINVAL})",
            f.get("entry_hits").unwrap_or("?"),
            f.get("gpu_id").unwrap_or("?"),
            f.get("return_hits").unwrap_or("?"),
            f.get("ret").unwrap_or("?")
        ),
    )
}

pub(super) fn kprobe(g: &Guest) -> Judged {
    let (ok, detail) = create_queue_probe(&g.records, "kprobe");
    Judged::new(
        "kprobe + kretprobe on kfd_ioctl_create_queue fire for CREATE_QUEUE",
        ok,
        detail,
    )
}

pub(super) fn ambiguous(g: &Guest) -> Judged {
    let amb = g.records.find("kprobe", &[("ambiguous", "init_mqd")]);
    let att = g.records.with_key("kprobe", "by_address_attached");
    let copies = amb.and_then(|f| f.int("copies"));
    let ok = copies.is_some_and(|n| n > 1)
        && amb.and_then(|f| f.get("by_name")) == Some("refused")
        && amb.and_then(|f| f.int("errno")) == Some(EADDRNOTAVAIL)
        && att.and_then(|f| f.int("by_address_attached")) == copies;
    Judged::new(
        "ambiguous static name (init_mqd): refused by name (EADDRNOTAVAIL), every copy attaches by address",
        ok,
        format!(
            "{} copies in kallsyms; by name: {} (errno {}); attached by address: {}",
            copies.map_or("?".into(), |n| n.to_string()),
            amb.and_then(|f| f.get("by_name")).unwrap_or("?"),
            amb.and_then(|f| f.get("errno")).unwrap_or("?"),
            att.and_then(|f| f.get("by_address_attached"))
                .unwrap_or("?"),
        ),
    )
}

pub(super) fn fentry(g: &Guest) -> Judged {
    let (ok, detail) = create_queue_probe(&g.records, "fentry");
    let btf = g
        .records
        .with_key("fentry", "func_id")
        .map(|f| {
            format!(
                "; split-BTF id {} (vmlinux has {} types)",
                f.get("func_id").unwrap_or("?"),
                f.get("vmlinux_types").unwrap_or("?")
            )
        })
        .unwrap_or_default();
    if has_module_btf(g) {
        Judged::new(
            "fentry + fexit on kfd_ioctl_create_queue through amdgpu's module BTF",
            ok,
            format!("{detail}{btf}"),
        )
    } else {
        // The client looks for /sys/kernel/btf/amdgpu first and says it is missing.
        let missing = g.records.find("fentry", &[("btf", "missing")]).is_some();
        Judged::new(
            "before 5.11: no trampoline on a module function (the client finds no amdgpu BTF)",
            missing && !ok,
            format!("btf=missing: {missing}; {detail}"),
        )
    }
}
