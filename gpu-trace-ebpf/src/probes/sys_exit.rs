//! `sys_exit`: every system call's exit, on the BTF-typed tracepoint (preferred) or the raw
//! one. `close()` and candidate `ioctl()`s from 64-bit callers go on to the syscall layer's
//! shared path (`syscall.rs`); everything else stops here, as cheaply as the hook allows.

use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use gpu_trace_common::{amd, nvidia};

#[cfg(not(bpf_target_arch = "x86_64"))]
use crate::kernel::kread;
use crate::syscall::{handle_close, handle_ioctl, regs};

/// Raw tracepoint `sys_exit` (args: `struct pt_regs *regs, long ret`): registers read with a
/// helper. Used where BTF-typed tracepoints are refused.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit_raw(ctx: RawTracePointContext) -> i32 {
    let _ = try_sys_exit_raw(&ctx);
    0
}

#[inline(always)]
fn try_sys_exit_raw(ctx: &RawTracePointContext) -> Option<()> {
    let regs: u64 = ctx.arg(0);
    let ret: i64 = ctx.arg(1);
    from_regs(regs, ret)
}

/// Preferred hook: BTF-typed tracepoint `sys_exit`. Its first argument is a typed
/// `struct pt_regs *`, so the registers are plain loads the verifier checks (no helper call):
/// the cheapest program on the cheapest attach type (docs/performance.md, part 3).
#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit_btf(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sys_exit_btf(&ctx);
    0
}

#[inline(always)]
fn try_sys_exit_btf(ctx: &BtfTracePointContext) -> Option<()> {
    let ret: i64 = ctx.arg(1);
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let regs: *const u64 = ctx.arg(0);
        // SAFETY: loads from the BTF-typed pt_regs the kernel passes; the verifier checks each
        // offset against struct pt_regs.
        let load = |off: usize| unsafe { core::ptr::read_volatile(regs.add(off / 8)) };
        let nr = load(regs::NR);
        if nr != regs::SYS_IOCTL && nr != regs::SYS_CLOSE {
            return None;
        }
        dispatch(
            nr,
            load(regs::CS),
            load(regs::ARG0),
            load(regs::ARG1),
            load(regs::ARG2),
            ret,
        )
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    from_regs(ctx.arg(0), ret)
}

/// Both programs' path where the registers are read with a helper: `regs` is the syscall's
/// `struct pt_regs *`.
#[inline(always)]
fn from_regs(regs: u64, ret: i64) -> Option<()> {
    // One helper call for every syscall: the registers from dx to cs (pt_regs 96..144) in a
    // single 48-byte read, instead of a read per register (docs/performance.md, part 3).
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: kernel read through the helper.
        let r = unsafe { crate::kernel::kread::<[u64; 6]>(regs, regs::ARG2 as u32) }.ok()?;
        // r: dx, si, di, orig_ax, ip, cs
        dispatch(r[3], r[5], r[2], r[1], r[0], ret)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        // SAFETY: kernel reads through the helper.
        let nr = u64::from(unsafe { kread::<u32>(regs, regs::NR as u32) }.ok()?);
        if nr != regs::SYS_IOCTL && nr != regs::SYS_CLOSE {
            return None;
        }
        let read = |off: usize| unsafe { kread::<u64>(regs, off as u32) };
        // 32-bit (AArch32) callers use another syscall table: their numbers mean other calls.
        #[cfg(bpf_target_arch = "aarch64")]
        if !read(regs::PSTATE).is_ok_and(|p| p & regs::PSR_MODE32_BIT == 0) {
            return None;
        }
        let (Ok(fd), Ok(cmd), Ok(arg)) = (read(regs::ARG0), read(regs::ARG1), read(regs::ARG2))
        else {
            return None;
        };
        dispatch(nr, 0, fd, cmd, arg, ret)
    }
}

/// What both programs do once they have the registers: `close()` and candidate `ioctl()`s
/// from 64-bit callers go on; everything else stops here.
#[inline(always)]
fn dispatch(nr: u64, cs: u64, fd: u64, cmd: u64, arg: u64, ret: i64) -> Option<()> {
    if nr != regs::SYS_IOCTL && nr != regs::SYS_CLOSE {
        return None;
    }
    // 32-bit callers use another syscall table: their numbers mean other calls.
    #[cfg(bpf_target_arch = "x86_64")]
    if cs != regs::USER64_CS {
        return None;
    }
    let _ = cs;
    if nr == regs::SYS_CLOSE {
        handle_close(fd, ret);
        return Some(());
    }
    if !nvidia::ioctl_nr_is_candidate(cmd as u32) && !amd::ioctl_is_candidate(cmd as u32) {
        return None;
    }
    handle_ioctl(fd, cmd, arg, ret);
    Some(())
}
