//! `nv_gpu_sched_task_init`, `_bind`, `_token_request`, `_task_destroy`: the scheduling hook
//! functions of a gpu_ext-patched NVIDIA driver (`gpu_trace_common::nvidia::gpu_ext`). Each
//! program copies the first bytes of the hook's context struct (hardware TSG id, runlist,
//! timeslice, interleave, channel count, token) and the system call the thread is in, so that
//! userspace can add them to the event of the RM ioctl that caused them. Userspace attaches a
//! trampoline (module BTF) where the kernel allows it, else a kprobe; the stock driver has no
//! such functions, and then none of this is loaded.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use gpu_trace_common::{
    NvSchedRecord, hook_source,
    nvidia::gpu_ext::{self, hook},
    record_kind,
};

use crate::{
    cgroup,
    config::{cgroup_wanted, config},
    pipe::{header, reserve, submit},
    syscall::current_syscall,
};

/// A hook ran with its context struct at `ctx_ptr`.
#[inline(always)]
fn try_hook_ran(hook: u32, ctx_ptr: u64, source: u32) -> Option<()> {
    let cfg = config();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if cfg.ready == 0
        || cfg.nv_major == 0
        || (cfg.filter_tgid != 0 && cfg.filter_tgid != tgid)
        || !cgroup_wanted(&cfg)
    {
        return None;
    }
    let (syscall_nr, syscall_arg0) = current_syscall();
    cgroup::note(tgid);
    let mut entry = reserve::<NvSchedRecord>()?;
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
    submit(entry, !ok);
    Some(())
}

macro_rules! hook_programs {
    ($fentry:ident, $kprobe:ident, $func:literal, $hook:expr) => {
        #[fentry(function = $func)]
        pub fn $fentry(ctx: FEntryContext) -> i32 {
            let _ = try_hook_ran($hook, ctx.arg(0), hook_source::TRAMPOLINE);
            0
        }

        #[kprobe]
        pub fn $kprobe(ctx: ProbeContext) -> u32 {
            if let Some(p) = ctx.arg::<u64>(0) {
                let _ = try_hook_ran($hook, p, hook_source::KPROBE);
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
