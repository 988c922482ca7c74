//! `nvidia_unlocked_ioctl(struct file *, unsigned int cmd, unsigned long arg)` at exit: the
//! NVIDIA driver's own ioctl handler, where the kernel allows hooking it (trampoline through
//! the module's BTF, else kprobe + kretprobe; `gpu-trace/src/loader/nv_entry.rs`). With it and
//! `nv_close.rs`, no program runs for any other system call on the machine (the syscall layer
//! is not attached, `nv_entry_bits`): the handler runs only for the driver's own files, so the
//! fd → device walk is not needed either.
//!
//! The exit sees what the syscall layer sees: the same user memory after the driver copied its
//! results back (the handler returns right after `copy_to_user`), and the return value the
//! system call will return. The fd comes from the thread's saved user registers.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{fexit, kprobe, kretprobe},
    programs::{FExitContext, ProbeContext, RetProbeContext},
};
use gpu_trace_common::{counter, nvidia, wire_syscall};

use crate::{
    config::{cgroup_wanted, config, is_watched},
    kernel::file_rdev,
    maps::{NV_ENTRY_ARGS, NvEntryArgs},
    nvidia::handle_nv_ioctl,
    pipe::bump,
    syscall::current_syscall,
};

#[fexit(function = "nvidia_unlocked_ioctl")]
pub fn nv_ioctl_fexit(ctx: FExitContext) -> i32 {
    let file: u64 = ctx.arg(0);
    let cmd: u64 = ctx.arg(1);
    let arg: u64 = ctx.arg(2);
    let ret: i64 = ctx.ret::<i64>().unwrap_or(0);
    let _ = try_ioctl_exit(file, cmd, arg, ret);
    0
}

#[kprobe]
pub fn nv_ioctl_entry(ctx: ProbeContext) -> u32 {
    let _ = try_nv_ioctl_entry(&ctx);
    0
}

#[inline(always)]
fn try_nv_ioctl_entry(ctx: &ProbeContext) -> Option<()> {
    let (Some(file), Some(cmd), Some(arg)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg(2))
    else {
        return None;
    };
    if !nvidia::ioctl_nr_is_candidate(cmd as u32) {
        return None;
    }
    let _ = NV_ENTRY_ARGS.insert(
        &bpf_get_current_pid_tgid(),
        &NvEntryArgs { file, cmd, arg },
        0,
    );
    Some(())
}

#[kretprobe]
pub fn nv_ioctl_kret(ctx: RetProbeContext) -> u32 {
    let _ = try_nv_ioctl_kret(&ctx);
    0
}

#[inline(always)]
fn try_nv_ioctl_kret(ctx: &RetProbeContext) -> Option<()> {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out before removal.
    let a = (unsafe { NV_ENTRY_ARGS.get(&key) }).copied()?;
    let _ = NV_ENTRY_ARGS.remove(&key);
    let ret: i64 = ctx.ret();
    try_ioctl_exit(a.file, a.cmd, a.arg, ret)
}

/// The ioctl handler returned `ret` for (`file`, `cmd`, `arg`).
#[inline(always)]
fn try_ioctl_exit(file: u64, cmd: u64, arg: u64, ret: i64) -> Option<()> {
    let cfg = config();
    let cmd = cmd as u32;
    if cfg.ready == 0 || !nvidia::ioctl_nr_is_candidate(cmd) {
        return None;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if (cfg.filter_tgid != 0 && cfg.filter_tgid != tgid) || !cgroup_wanted(&cfg) {
        return None;
    }
    let Ok(rdev) = file_rdev(&cfg, file) else {
        bump(counter::FD_LOOKUP_FAILED);
        return None;
    };
    if !is_watched(&cfg, rdev) {
        return None;
    }
    // The fd, as the syscall layer has it: from a 64-bit ioctl(2). A 32-bit caller's compat
    // ioctl is left out, as the syscall layer leaves it; where the registers cannot be found
    // the call is still reported, with fd -1.
    let fd = match current_syscall() {
        (wire_syscall::IOCTL, fd) => fd as i32,
        (wire_syscall::UNKNOWN, _) => -1,
        _ => return None,
    };
    handle_nv_ioctl(fd, cmd, arg, ret, rdev, tgid, file);
    Some(())
}
