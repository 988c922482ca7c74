//! `syscalls:sys_enter_ioctl` / `sys_exit_ioctl`: the classic tracepoints, the fallback where
//! neither `sys_exit` program can attach. The arguments seen at entry wait in `PENDING_IOCTL`
//! for the exit, which takes the syscall layer's shared path (`syscall.rs`).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use gpu_trace_common::{amd, nvidia};

use super::TP_ARG0;
use crate::{
    maps::{IoctlArgs, PENDING_IOCTL},
    syscall::handle_ioctl,
};

#[tracepoint]
pub fn tp_ioctl_enter(ctx: TracePointContext) -> u32 {
    let _ = try_tp_ioctl_enter(&ctx);
    0
}

#[inline(always)]
fn try_tp_ioctl_enter(ctx: &TracePointContext) -> Option<()> {
    // SAFETY: reads within the tracepoint record.
    let read = |at: usize| unsafe { ctx.read_at::<u64>(at) };
    let (Ok(fd), Ok(cmd), Ok(arg)) = (read(TP_ARG0), read(TP_ARG0 + 8), read(TP_ARG0 + 16)) else {
        return None;
    };
    if !nvidia::ioctl_nr_is_candidate(cmd as u32) && !amd::ioctl_is_candidate(cmd as u32) {
        return None;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = PENDING_IOCTL.insert(tid, IoctlArgs { fd, cmd, arg }, 0);
    Some(())
}

#[tracepoint]
pub fn tp_ioctl_exit(ctx: TracePointContext) -> u32 {
    let _ = try_tp_ioctl_exit(&ctx);
    0
}

#[inline(always)]
fn try_tp_ioctl_exit(ctx: &TracePointContext) -> Option<()> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let args = PENDING_IOCTL.get_ptr(tid)?;
    // SAFETY: map value pointer valid until removal; copied out first.
    let args = unsafe { *args };
    let _ = PENDING_IOCTL.remove(tid);
    let ret = unsafe { ctx.read_at::<i64>(TP_ARG0) }.ok()?;
    handle_ioctl(args.fd, args.cmd, args.arg, ret);
    Some(())
}
