//! The MQD managers' `init_mqd`, `init_mqd_sdma` and `init_mqd_v9_4_3` (static, one copy per
//! GPU generation, so kprobes by address, every copy): which copy built the queue's hardware
//! descriptor (`DeepRecord`, `deep_hook::INIT_MQD`).

use aya_ebpf::{
    EbpfContext, helpers::bpf_get_current_pid_tgid, helpers::generated, macros::kprobe,
    programs::ProbeContext,
};
use gpu_trace_common::{counter, deep_hook, hook_source};

use crate::{
    amd::{emit_deep, probe_arg},
    config::{deep_config, kfd_deep_wanted},
    kernel::kread,
    pipe::bump,
};

/// A copy of an MQD manager's `init_mqd*` (attached by address, every copy) is building the
/// hardware descriptor of the queue whose `queue_properties` is its argument `init_mqd_q_arg`
/// (the queue's own copy).
#[kprobe]
pub fn init_mqd_kprobe(ctx: ProbeContext) -> u32 {
    let _ = try_init_mqd(&ctx);
    0
}

#[inline(always)]
fn try_init_mqd(ctx: &ProbeContext) -> Option<()> {
    if !kfd_deep_wanted((bpf_get_current_pid_tgid() >> 32) as u32) {
        return None;
    }
    let d = deep_config();
    let props = probe_arg(ctx, d.init_mqd_q_arg)?;
    // SAFETY: kernel read through the helper; the helper takes the kprobe context.
    let (queue_id, ip) = unsafe {
        (
            kread::<u32>(props, d.qp_queue_id),
            generated::bpf_get_func_ip(ctx.as_ptr()),
        )
    };
    let queue_id = match queue_id {
        Ok(q) => q,
        Err(()) => {
            bump(counter::READ_FAILED);
            u32::MAX
        }
    };
    emit_deep(deep_hook::INIT_MQD, queue_id, ip, hook_source::KPROBE);
    Some(())
}
