//! `syscalls:sys_enter_close` / `sys_exit_close`: the classic tracepoints, the fallback where
//! neither `sys_exit` program can attach. The fd of a tracked NVIDIA user's `close()` waits in
//! `PENDING_CLOSE` for the exit, which takes the syscall layer's shared path (`syscall.rs`).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};

use super::TP_ARG0;
use crate::{
    maps::{self, PENDING_CLOSE},
    syscall::handle_close,
};

#[tracepoint]
pub fn tp_close_enter(ctx: TracePointContext) -> u32 {
    let _ = try_tp_close_enter(&ctx);
    0
}

#[inline(always)]
fn try_tp_close_enter(ctx: &TracePointContext) -> Option<()> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !maps::tracked_nv(tgid) {
        return None;
    }
    let fd = unsafe { ctx.read_at::<u64>(TP_ARG0) }.ok()?;
    let _ = PENDING_CLOSE.insert(bpf_get_current_pid_tgid() as u32, fd as u32, 0);
    Some(())
}

#[tracepoint]
pub fn tp_close_exit(ctx: TracePointContext) -> u32 {
    let _ = try_tp_close_exit(&ctx);
    0
}

#[inline(always)]
fn try_tp_close_exit(ctx: &TracePointContext) -> Option<()> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let fd = PENDING_CLOSE.get_ptr(tid)?;
    // SAFETY: map value pointer valid until removal; copied out first.
    let fd = unsafe { *fd };
    let _ = PENDING_CLOSE.remove(tid);
    let ret = unsafe { ctx.read_at::<i64>(TP_ARG0) }.ok()?;
    handle_close(fd as u64, ret);
    Some(())
}
