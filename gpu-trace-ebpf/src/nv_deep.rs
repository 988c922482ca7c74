//! Deep hooks on a gpu_ext-patched NVIDIA driver: programs on its scheduling hook functions
//! (`nv_gpu_sched_task_init`, `_bind`, `_token_request`, `_task_destroy`; see
//! `gpu_trace_common::nvidia::gpu_ext`). Each copies the first bytes of the hook's context
//! struct (hardware TSG id, runlist, timeslice, interleave, channel count, token) and the
//! system call the thread is in, so that userspace can add them to the event of the RM ioctl
//! that caused them. Userspace attaches a trampoline (module BTF) where the kernel allows it,
//! else a kprobe; the stock driver has no such functions, and then none of this is loaded.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use gpu_trace_common::{
    NvSchedRecord, counter, hook_source,
    nvidia::gpu_ext::{self, hook},
    record_kind,
};

use crate::{EVENTS, bump, config, header, kread};

/// The current thread's system call number (in the records' numbering, see
/// [`wire_syscall_nr`]) and first argument, from its saved user registers;
/// `wire_syscall::UNKNOWN` where unknown (kernel threads have none). Also used by the driver entry hooks
/// (`nv_entry.rs`) for the fd of an ioctl.
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
                        match kread::<u64>(regs, crate::regs::CS as u32) {
                            Ok(cs) if cs == crate::regs::USER64_CS => regs,
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
                kread::<u64>(regs, crate::regs::NR as u32),
                kread::<u64>(regs, crate::regs::ARG0 as u32),
            )
        {
            // aarch64's syscallno is a 32-bit field (-1: not in a system call).
            let nr = nr as u32;
            if nr != u32::MAX {
                return (wire_syscall_nr(nr), arg0);
            }
        }
    }
    (gpu_trace_common::wire_syscall::UNKNOWN, 0)
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
        use gpu_trace_common::wire_syscall;
        match u64::from(nr) {
            crate::regs::SYS_IOCTL => wire_syscall::IOCTL,
            crate::regs::SYS_CLOSE => wire_syscall::CLOSE,
            _ => wire_syscall::OTHER,
        }
    }
}

/// A hook ran with its context struct at `ctx_ptr`.
#[inline(always)]
fn hook_ran(hook: u32, ctx_ptr: u64, source: u32) {
    let cfg = config();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if cfg.ready == 0
        || cfg.nv_major == 0
        || (cfg.filter_tgid != 0 && cfg.filter_tgid != tgid)
        || !crate::cgroup::wanted(&cfg)
    {
        return;
    }
    let (syscall_nr, syscall_arg0) = current_syscall();
    crate::cgroup::note(tgid);
    let Some(mut entry) = EVENTS.reserve::<NvSchedRecord>(0) else {
        bump(counter::DROPPED);
        return;
    };
    let rec = entry.as_mut_ptr();
    let len = gpu_ext::capture_len(hook);
    // SAFETY: `rec` points at a reserved, exclusively owned record; every field is written.
    let ok = unsafe {
        (*rec).hdr = header(record_kind::NV_SCHED);
        (*rec).hook = hook;
        (*rec).source = source;
        (*rec).syscall_nr = syscall_nr;
        (*rec).syscall_arg0 = syscall_arg0;
        (*rec).ctx = [0u8; gpu_ext::CTX_MAX];
        let dst = (*rec).ctx.as_mut_ptr() as *mut core::ffi::c_void;
        let src = ctx_ptr as *const core::ffi::c_void;
        let rc = match len {
            32 => generated::bpf_probe_read_kernel(dst, 32, src),
            24 => generated::bpf_probe_read_kernel(dst, 24, src),
            8 => generated::bpf_probe_read_kernel(dst, 8, src),
            _ => -1,
        };
        (*rec).ctx_len = if rc == 0 { len } else { 0 };
        rc == 0
    };
    entry.submit(0);
    if !ok {
        bump(counter::READ_FAILED);
    }
    bump(counter::EMITTED);
}

macro_rules! hook_programs {
    ($fentry:ident, $kprobe:ident, $func:literal, $hook:expr) => {
        #[fentry(function = $func)]
        pub fn $fentry(ctx: FEntryContext) -> i32 {
            hook_ran($hook, ctx.arg(0), hook_source::TRAMPOLINE);
            0
        }

        #[kprobe]
        pub fn $kprobe(ctx: ProbeContext) -> u32 {
            if let Some(p) = ctx.arg::<u64>(0) {
                hook_ran($hook, p, hook_source::KPROBE);
            }
            0
        }
    };
}

hook_programs!(
    nv_task_init_fentry,
    nv_task_init_kprobe,
    "nv_gpu_sched_task_init",
    hook::TASK_INIT
);
hook_programs!(
    nv_bind_fentry,
    nv_bind_kprobe,
    "nv_gpu_sched_bind",
    hook::BIND
);
hook_programs!(
    nv_token_fentry,
    nv_token_kprobe,
    "nv_gpu_sched_token_request",
    hook::TOKEN_REQUEST
);
hook_programs!(
    nv_task_destroy_fentry,
    nv_task_destroy_kprobe,
    "nv_gpu_sched_task_destroy",
    hook::TASK_DESTROY
);
