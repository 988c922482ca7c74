//! `pqm_uninit(pqm)`, at entry (trampoline, else kprobe): the process's KFD queues are torn
//! down (`DeepRecord`, `deep_hook::KFD_RELEASE`), whoever runs the teardown. The owner is read
//! from the process (`pqm->process->lead_thread->tgid`), not from the current task, which may
//! be a worker thread.

use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use gpu_trace_common::{counter, deep_hook, hook_source};

use crate::{
    amd::emit_deep,
    config::{config, deep_config},
    kernel::kread,
    pipe::bump,
};

#[fentry(function = "pqm_uninit")]
pub fn pqm_uninit_fentry(ctx: FEntryContext) -> i32 {
    let _ = try_kfd_release(ctx.arg(0), hook_source::TRAMPOLINE);
    0
}

#[kprobe]
pub fn pqm_uninit_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(pqm) = ctx.arg::<u64>(0) {
        let _ = try_kfd_release(pqm, hook_source::KPROBE);
    }
    0
}

#[inline(always)]
fn try_kfd_release(pqm: u64, source: u32) -> Option<()> {
    let cfg = config();
    let d = deep_config();
    if cfg.ready == 0 || d.ready == 0 {
        return None;
    }
    // SAFETY: kernel reads through the helper.
    let owner: Result<u32, ()> = unsafe {
        match kread::<u64>(pqm, d.pqm_process) {
            Ok(process) => match kread::<u64>(process, d.process_lead_thread) {
                Ok(task) => kread::<u32>(task, d.task_tgid),
                Err(()) => Err(()),
            },
            Err(()) => Err(()),
        }
    };
    let Ok(owner) = owner else {
        bump(counter::READ_FAILED);
        return None;
    };
    if cfg.filter_tgid != 0 && cfg.filter_tgid != owner {
        return None;
    }
    emit_deep(deep_hook::KFD_RELEASE, owner, 0, source);
    Some(())
}
