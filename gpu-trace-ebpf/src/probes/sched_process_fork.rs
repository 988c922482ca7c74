//! `sched_process_fork` (`--deny-pid`): a process created by a denied process is denied too,
//! from its creation on, before it first runs. The tracepoint fires in the creator (`current`)
//! after `copy_process`, before the child is first woken, with (parent, child) as arguments. A
//! new thread shares its creator's `signal_struct` and tgid: nothing to add. A new process's
//! tgid is its pid (`thread_pid->numbers[0].nr`, the initial namespace); it stays denied when
//! its creator exits (it is keyed by its own tgid, not by its parent).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use gpu_trace_common::counter;

use crate::{config::config, kernel::kread, maps::DENY, pipe::bump};

#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn deny_fork(ctx: RawTracePointContext) -> i32 {
    let _ = try_deny_fork(&ctx);
    0
}

#[inline(always)]
fn try_deny_fork(ctx: &RawTracePointContext) -> Option<()> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: the value is copied out.
    if unsafe { DENY.get(tgid) }.copied().unwrap_or(0) == 0 {
        return None;
    }
    let child: u64 = ctx.arg(1);
    let cfg = config();
    // SAFETY: kernel reads through the helper.
    let child_tgid = unsafe {
        let current = generated::bpf_get_current_task();
        let (Ok(own), Ok(its)) = (
            kread::<u64>(current, cfg.task_signal),
            kread::<u64>(child, cfg.task_signal),
        ) else {
            bump(counter::DENY_UNFOLLOWED);
            return None;
        };
        if own == its {
            return None;
        }
        match kread::<u64>(child, cfg.task_thread_pid) {
            Ok(pid) => kread::<i32>(pid, cfg.pid_numbers).map_or(0, |nr| nr as u32),
            Err(()) => 0,
        }
    };
    if child_tgid == 0 || DENY.insert(child_tgid, 1, 0).is_err() {
        bump(counter::DENY_UNFOLLOWED);
    }
    Some(())
}
