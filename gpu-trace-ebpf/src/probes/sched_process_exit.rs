//! `sched_process_exit`: a thread exits; when it is the last one of a tracked process, the
//! process's end is reported (its fds, and with them the driver's objects, are released), and
//! a denied process's denial ends (its pid may be reused by an unrelated process). Raw,
//! BTF-typed and classic tracepoint, whichever the kernel allows.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{btf_tracepoint, raw_tracepoint, tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use gpu_trace_common::record_kind;

use crate::{
    cgroup,
    config::config,
    kernel::kread,
    maps::{DENY, TRACKED},
    pipe::emit_task,
};

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit_raw(_ctx: RawTracePointContext) -> i32 {
    let _ = try_process_exit();
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit_btf(_ctx: BtfTracePointContext) -> i32 {
    let _ = try_process_exit();
    0
}

#[tracepoint]
pub fn tp_process_exit(_ctx: TracePointContext) -> u32 {
    let _ = try_process_exit();
    0
}

#[inline(always)]
fn try_process_exit() -> Option<()> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Read the stored values (non-zero flags), not the pointers: LLVM would otherwise combine the
    // two null checks into an OR of pointers, which the verifier refuses.
    // SAFETY: plain map lookups; the values are copied out.
    let tracked = unsafe { TRACKED.get(tgid) }.copied().unwrap_or(0) != 0;
    let denied = unsafe { DENY.get(tgid) }.copied().unwrap_or(0) != 0;
    if !tracked && !denied {
        return None;
    }
    let cfg = config();
    // SAFETY: kernel reads through the helper.
    let live: Result<i32, ()> = unsafe {
        let task = generated::bpf_get_current_task();
        match kread::<u64>(task, cfg.task_signal) {
            Ok(signal) => kread::<i32>(signal, cfg.signal_live),
            Err(()) => Err(()),
        }
    };
    // do_exit() decrements `signal->live` before this tracepoint fires: 0 means the whole
    // thread group is gone (checked by the kernel test `process_exit_fires_once`).
    if let Ok(0) = live {
        if denied {
            // The pid may be reused by an unrelated process: its denial ends here.
            let _ = DENY.remove(tgid);
        }
        if tracked {
            let _ = TRACKED.remove(tgid);
            cgroup::forget(tgid);
            emit_task(record_kind::PROCESS_EXIT, -1);
        }
    }
    Some(())
}
