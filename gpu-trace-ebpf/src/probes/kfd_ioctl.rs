//! The AMD KFD driver's four ioctl handlers (`kfd_ioctl_create_queue`, `_destroy_queue`,
//! `_update_queue`, `_set_cu_mask`), at exit: the same `KfdIoctlRecord` as the syscall layer
//! (`kfd.rs`), but read from the driver's own copy of the arguments, and only for calls that
//! reached the handler. Each command hooked here has its bit set in the `SWITCHES` map, and the
//! syscall layer leaves it alone, so a call is never reported twice. Trampoline (module BTF)
//! where the kernel allows it, else kprobe + kretprobe (`gpu-trace/src/loader/deep.rs`).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{fexit, kprobe, kretprobe},
    programs::{FExitContext, ProbeContext, RetProbeContext},
};
use gpu_trace_common::{
    KfdDeepConfig,
    amd::{self, nr},
    hook_source,
};

use crate::{
    amd::{KfdCallHead, emit_kfd},
    config::{config, deep_config, kfd_deep_wanted},
    kernel::kread,
    maps::{KFD_HANDLER_ARGS, KfdEntryArgs},
};

#[inline(always)]
fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// The kernel's own size of the argument struct of handler `nr`.
#[inline(always)]
fn kernel_arg_size(nr: u32, deep: &KfdDeepConfig) -> u32 {
    match nr {
        nr::CREATE_QUEUE => deep.create_args_size,
        nr::DESTROY_QUEUE => amd::size::DESTROY_QUEUE,
        nr::UPDATE_QUEUE => amd::size::UPDATE_QUEUE,
        _ => amd::size::SET_CU_MASK,
    }
}

/// A KFD ioctl handler returned `ret`; `filep` and `data` are its first and third arguments.
#[inline(always)]
fn try_handler_exit(nr: u32, filep: u64, data: u64, ret: i64, source: u32) -> Option<()> {
    let tgid = current_tgid();
    if !kfd_deep_wanted(tgid) {
        return None;
    }
    let cfg = config();
    let deep = deep_config();
    // SAFETY: kernel reads through the helper.
    let rdev: u32 = unsafe {
        match kread::<u64>(filep, cfg.file_inode) {
            Ok(inode) => kread::<u32>(inode, cfg.inode_rdev).unwrap_or(0),
            Err(()) => 0,
        }
    };
    let head = KfdCallHead {
        fd: -1,
        ioctl_cmd: 0,
        rdev,
        nr,
        arg_size: kernel_arg_size(nr, &deep),
        ret,
        source,
    };
    emit_kfd(head, data, tgid);
    Some(())
}

/// Handler signature: `int kfd_ioctl_*(struct file *filep, struct kfd_process *p, void *data)`.
macro_rules! handler_programs {
    ($fexit:ident, $kret:ident, $func:literal, $nr:expr) => {
        #[fexit(function = $func)]
        pub fn $fexit(ctx: FExitContext) -> i32 {
            let filep: u64 = ctx.arg(0);
            let data: u64 = ctx.arg(2);
            let ret: i64 = ctx.ret::<i32>().unwrap_or(0) as i64;
            let _ = try_handler_exit($nr, filep, data, ret, hook_source::TRAMPOLINE);
            0
        }

        #[kretprobe]
        pub fn $kret(ctx: RetProbeContext) -> u32 {
            let _ = try_handler_kret($nr, &ctx);
            0
        }
    };
}

/// The return probe of handler `nr`: the arguments its entry probe kept.
#[inline(always)]
fn try_handler_kret(nr: u32, ctx: &RetProbeContext) -> Option<()> {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: map value copied out before removal.
    let args = (unsafe { KFD_HANDLER_ARGS.get(&key) }).copied()?;
    let _ = KFD_HANDLER_ARGS.remove(&key);
    let ret: i32 = ctx.ret();
    try_handler_exit(nr, args.a, args.b, ret as i64, hook_source::KPROBE)
}

handler_programs!(
    kfd_create_queue_fexit,
    kfd_create_queue_kret,
    "kfd_ioctl_create_queue",
    nr::CREATE_QUEUE
);
handler_programs!(
    kfd_destroy_queue_fexit,
    kfd_destroy_queue_kret,
    "kfd_ioctl_destroy_queue",
    nr::DESTROY_QUEUE
);
handler_programs!(
    kfd_update_queue_fexit,
    kfd_update_queue_kret,
    "kfd_ioctl_update_queue",
    nr::UPDATE_QUEUE
);
handler_programs!(
    kfd_set_cu_mask_fexit,
    kfd_set_cu_mask_kret,
    "kfd_ioctl_set_cu_mask",
    nr::SET_CU_MASK
);

/// Entry probe shared by the four handlers (attached once per handler): keeps `filep` and
/// `data` for the return probe, which cannot see the arguments.
#[kprobe]
pub fn kfd_handler_entry(ctx: ProbeContext) -> u32 {
    let _ = try_kfd_handler_entry(&ctx);
    0
}

#[inline(always)]
fn try_kfd_handler_entry(ctx: &ProbeContext) -> Option<()> {
    if !kfd_deep_wanted(current_tgid()) {
        return None;
    }
    let (Some(filep), Some(data)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(2)) else {
        return None;
    };
    let _ = KFD_HANDLER_ARGS.insert(
        &bpf_get_current_pid_tgid(),
        &KfdEntryArgs { a: filep, b: data },
        0,
    );
    Some(())
}
