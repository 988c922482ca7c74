//! The AMD device queue manager's `create_queue_cpsch` / `create_queue_nocpsch` (whichever the
//! scheduling policy uses; each loaded on its own), at exit: the queue as the driver holds it
//! in its own `struct queue` (`KfdQueueRecord`). (Not `pqm_create_queue`: its `properties`
//! argument is the handler's copy, which never gets the doorbell or the active state.) Every
//! struct offset and parameter position comes from `KFD_DEEP`, which userspace fills from the
//! module's BTF.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{fexit, kprobe, kretprobe},
    programs::{FExitContext, ProbeContext, RetProbeContext},
};
use gpu_trace_common::{KfdQueueRecord, hook_source, kfd_queue_flags, record_kind};

use crate::{
    amd::{fexit_arg3, probe_arg},
    cgroup,
    config::{deep_config, kfd_deep_wanted},
    kernel::kread,
    maps::DQM_CREATE_ARGS,
    pipe::{header, reserve, submit},
};

#[inline(always)]
fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// Attached (each loaded on its own) to `create_queue_cpsch` and `create_queue_nocpsch`.
#[fexit(function = "create_queue_cpsch")]
pub fn dqm_create_fexit(ctx: FExitContext) -> i32 {
    let _ = try_dqm_create_fexit(&ctx);
    0
}

#[inline(always)]
fn try_dqm_create_fexit(ctx: &FExitContext) -> Option<()> {
    let q = fexit_arg3(ctx, deep_config().dqm_create_q_arg)?;
    let ret = ctx.ret::<i32>().unwrap_or(0);
    try_queue_built(q, ret, hook_source::TRAMPOLINE)
}

#[kprobe]
pub fn dqm_create_entry(ctx: ProbeContext) -> u32 {
    let _ = try_dqm_create_entry(&ctx);
    0
}

#[inline(always)]
fn try_dqm_create_entry(ctx: &ProbeContext) -> Option<()> {
    if !kfd_deep_wanted(current_tgid()) {
        return None;
    }
    let q = probe_arg(ctx, deep_config().dqm_create_q_arg)?;
    let _ = DQM_CREATE_ARGS.insert(&bpf_get_current_pid_tgid(), &q, 0);
    Some(())
}

#[kretprobe]
pub fn dqm_create_kret(ctx: RetProbeContext) -> u32 {
    let _ = try_dqm_create_kret(&ctx);
    0
}

#[inline(always)]
fn try_dqm_create_kret(ctx: &RetProbeContext) -> Option<()> {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: map value copied out before removal.
    let q = (unsafe { DQM_CREATE_ARGS.get(&key) }).copied()?;
    let _ = DQM_CREATE_ARGS.remove(&key);
    try_queue_built(q, ctx.ret(), hook_source::KPROBE)
}

/// The DQM's `create_queue_*` returned `ret`; `q` is its `struct queue *`.
#[inline(always)]
fn try_queue_built(q: u64, ret: i32, source: u32) -> Option<()> {
    if !kfd_deep_wanted(current_tgid()) {
        return None;
    }
    let d = deep_config();
    let props = q + d.queue_properties as u64;
    cgroup::note(current_tgid());
    let mut entry = reserve::<KfdQueueRecord>()?;
    let rec = entry.as_mut_ptr();
    let mut flags = 0u32;
    // SAFETY: kernel reads through the helper into a reserved, exclusively owned record; every
    // field is written before submit.
    unsafe {
        (*rec).hdr = header(record_kind::KFD_QUEUE);
        (*rec).source = source;
        (*rec).ret = ret;
        (*rec)._pad = 0;
        let fields = (
            kread::<u32>(props, d.qp_type),
            kread::<u32>(props, d.qp_format),
            kread::<u32>(props, d.qp_queue_id),
            kread::<u32>(props, d.qp_priority),
            kread::<u32>(props, d.qp_percent),
            kread::<u32>(props, d.qp_doorbell_off),
            kread::<u8>(props, d.qp_is_active),
            kread::<u32>(props, d.qp_vmid),
            kread::<u64>(props, d.qp_queue_size),
            kread::<u64>(props, d.qp_queue_address),
        );
        if let (
            Ok(t),
            Ok(f),
            Ok(id),
            Ok(prio),
            Ok(pct),
            Ok(db),
            Ok(active),
            Ok(vmid),
            Ok(size),
            Ok(addr),
        ) = fields
        {
            (*rec).q_type = t;
            (*rec).q_format = f;
            (*rec).queue_id = id;
            (*rec).priority = prio;
            (*rec).percent = pct;
            (*rec).doorbell_off = db;
            (*rec).is_active = active as u32;
            (*rec).vmid = vmid;
            (*rec).queue_size = size;
            (*rec).queue_address = addr;
        } else {
            flags |= kfd_queue_flags::PROPS_READ_FAILED;
            (*rec).q_type = 0;
            (*rec).q_format = 0;
            (*rec).queue_id = 0;
            (*rec).priority = 0;
            (*rec).percent = 0;
            (*rec).doorbell_off = 0;
            (*rec).is_active = 0;
            (*rec).vmid = 0;
            (*rec).queue_size = 0;
            (*rec).queue_address = 0;
        }
        (*rec).flags = flags;
    }
    submit(entry, flags != 0);
    Some(())
}
