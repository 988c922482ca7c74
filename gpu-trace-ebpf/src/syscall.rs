//! The syscall layer's shared path, whichever hook saw the call (`probes/sys_exit.rs`,
//! `probes/syscalls_ioctl.rs`, `probes/syscalls_close.rs`): the filters every candidate
//! `ioctl()` and `close()` goes through before a vendor builds its record, and the register
//! layout of a system call (also read by the driver hooks, [`current_syscall`]).

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, generated};
use gpu_trace_common::{amd, counter, nv_entry_bits, nvidia, record_kind, wire_syscall};

use crate::{
    config::{cgroup_wanted, config, is_kfd, is_watched, kfd_served_by_deep_hook, nv_entry_serves},
    kernel::{fd_file_rdev, kread},
    maps,
    pipe::{bump, emit_task},
};

// Syscall register layout at exit (`struct pt_regs`), per architecture.
#[cfg(bpf_target_arch = "x86_64")]
pub(crate) mod regs {
    pub const NR: usize = 120; // orig_ax
    pub const ARG0: usize = 112; // di
    pub const ARG1: usize = 104; // si
    pub const ARG2: usize = 96; // dx
    pub const CS: usize = 136; // cs: 0x33 for 64-bit callers
    pub const USER64_CS: u64 = 0x33;
    pub const SYS_IOCTL: u64 = 16;
    pub const SYS_CLOSE: u64 = 3;
}

#[cfg(bpf_target_arch = "aarch64")]
pub(crate) mod regs {
    pub const NR: usize = 280; // syscallno (s32; the next 4 bytes are another field)
    pub const ARG0: usize = 272; // orig_x0 (x0 holds the return value at exit)
    pub const ARG1: usize = 8; // x1
    pub const ARG2: usize = 16; // x2
    pub const PSTATE: usize = 264; // pstate: PSR_MODE32_BIT for 32-bit (AArch32) callers
    pub const PSR_MODE32_BIT: u64 = 0x10;
    pub const SYS_IOCTL: u64 = 29;
    pub const SYS_CLOSE: u64 = 57;
}

/// The shared ioctl path: filters, reads, emits. `ret` is the syscall's return value.
#[inline(always)]
pub(crate) fn handle_ioctl(fd: u64, ioctl_cmd: u64, arg: u64, ret: i64) {
    let cfg = config();
    if cfg.ready == 0 {
        return;
    }
    let ioctl_cmd = ioctl_cmd as u32;
    // NVIDIA and KFD candidates are disjoint (RM escape numbers vs 'K' and KFD numbers).
    let kfd = amd::ioctl_is_candidate(ioctl_cmd);
    if !kfd && !nvidia::ioctl_nr_is_candidate(ioctl_cmd) {
        return;
    }
    if kfd && kfd_served_by_deep_hook(amd::ioctl_nr(ioctl_cmd)) {
        return;
    }
    if !kfd && nv_entry_serves(nv_entry_bits::IOCTL) {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if cfg.filter_tgid != 0 && cfg.filter_tgid != tgid {
        return;
    }
    if !cgroup_wanted(&cfg) {
        return;
    }
    let (file, rdev) = match fd_file_rdev(&cfg, fd) {
        Ok(found) => found,
        Err(()) => {
            bump(counter::FD_LOOKUP_FAILED);
            return;
        }
    };
    if kfd {
        if is_kfd(&cfg, rdev) {
            crate::amd::handle_kfd_ioctl(fd, ioctl_cmd, arg, ret, rdev, tgid);
        }
        return;
    }
    if !is_watched(&cfg, rdev) {
        return;
    }
    crate::nvidia::handle_nv_ioctl(fd as i32, ioctl_cmd, arg, ret, rdev, tgid, file);
}

/// `close(fd)` returned 0 in a tracked process.
#[inline(always)]
pub(crate) fn handle_close(fd: u64, ret: i64) {
    if ret != 0 {
        return;
    }
    if nv_entry_serves(nv_entry_bits::RELEASE) {
        // The driver's release handler reports the file's last close instead.
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !maps::tracked_nv(tgid) {
        return;
    }
    emit_task(record_kind::FD_CLOSE, fd as i32);
}

/// The current thread's system call number (in the records' numbering, see
/// [`wire_syscall_nr`]) and first argument, from its saved user registers;
/// `wire_syscall::UNKNOWN` where unknown (kernel threads have none). Used by the driver hooks
/// (`probes/nv_ioctl.rs` for the fd of an ioctl, `probes/nv_gpu_sched.rs`).
#[inline(always)]
pub(crate) fn current_syscall() -> (u32, u64) {
    let cfg = config();
    // SAFETY: helper calls; the registers are read through bpf_probe_read_kernel.
    unsafe {
        let regs = if cfg.stack_regs == 0 {
            // bpf_task_pt_regs (5.15) wants a trusted task pointer: the BTF-typed current
            // task (5.11). `stack_regs` is a constant of the read-only config, so on older
            // kernels the verifier never sees these calls.
            let task = generated::bpf_get_current_task_btf();
            generated::bpf_task_pt_regs(task) as u64
        } else {
            #[cfg(bpf_target_arch = "x86_64")]
            {
                // Older kernels: what task_pt_regs() computes, the top of the task's kernel
                // stack less one pt_regs. A 64-bit caller's saved `cs` confirms the place.
                let task = generated::bpf_get_current_task();
                match kread::<u64>(task, u32::from(cfg.task_stack)) {
                    Ok(stack) if stack != 0 => {
                        let regs = stack + u64::from(cfg.stack_regs);
                        match kread::<u64>(regs, regs::CS as u32) {
                            Ok(cs) if cs == regs::USER64_CS => regs,
                            _ => 0,
                        }
                    }
                    _ => 0,
                }
            }
            // Elsewhere only bpf_task_pt_regs finds them (userspace sets no stack offsets).
            #[cfg(not(bpf_target_arch = "x86_64"))]
            {
                0
            }
        };
        if regs != 0
            && let (Ok(nr), Ok(arg0)) = (
                kread::<u64>(regs, regs::NR as u32),
                kread::<u64>(regs, regs::ARG0 as u32),
            )
        {
            // aarch64's syscallno is a 32-bit field (-1: not in a system call).
            let nr = nr as u32;
            if nr != u32::MAX {
                return (wire_syscall_nr(nr), arg0);
            }
        }
    }
    (wire_syscall::UNKNOWN, 0)
}

/// This architecture's system call number in the records' numbering (x86-64's:
/// [`gpu_trace_common::wire_syscall`]).
#[inline(always)]
fn wire_syscall_nr(nr: u32) -> u32 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        nr
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        match u64::from(nr) {
            regs::SYS_IOCTL => wire_syscall::IOCTL,
            regs::SYS_CLOSE => wire_syscall::CLOSE,
            _ => wire_syscall::OTHER,
        }
    }
}
