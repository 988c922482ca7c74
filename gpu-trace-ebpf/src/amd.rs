//! What a KFD command on `/dev/kfd` becomes, whichever hook saw it (the syscall layer,
//! `syscall.rs`, reading user memory at exit, or a deep hook on the driver's handler,
//! `probes/kfd_ioctl.rs`, reading the driver's own copy): a `KfdIoctlRecord` with the argument
//! struct. Also what the AMD deep hooks share: the `DeepRecord`, the argument of a kprobe or
//! trampoline by position.

use aya_ebpf::{
    EbpfContext,
    helpers::generated,
    programs::{FExitContext, ProbeContext},
};
use gpu_trace_common::{
    DeepRecord, KfdIoctlRecord,
    amd::{self, kfd_flags},
    hook_source, record_kind,
};

use crate::{
    api_tag::api_tag,
    cgroup,
    maps::{self, TRACK_KFD},
    pipe::{header, reserve, send, submit},
};

/// Copies `len` bytes of KFD arguments (one of the sizes of `amd::capture_len`) from user
/// memory (`from_kernel` false: the syscall layer) or from the driver's own copy (`from_kernel`
/// true: the deep hooks on the handlers). Each arm passes a constant length, as the verifier
/// wants.
#[inline(always)]
unsafe fn read_kfd_args(dst: *mut u8, src: u64, len: u32, from_kernel: bool) -> bool {
    let src = src as *const core::ffi::c_void;
    let dst = dst as *mut core::ffi::c_void;
    let read = |n: u32| {
        // SAFETY: `dst` points into a reserved ring-buffer record with room for KFD_ARGS_MAX
        // bytes, and `n` is at most that.
        unsafe {
            if from_kernel {
                generated::bpf_probe_read_kernel(dst, n, src)
            } else {
                generated::bpf_probe_read_user(dst, n, src)
            }
        }
    };
    let rc = match len {
        96 => read(96),
        88 => read(88),
        24 => read(24),
        16 => read(16),
        8 => read(8),
        _ => return false,
    };
    rc == 0
}

/// What a KFD record says about the call besides its arguments.
#[derive(Clone, Copy)]
pub(crate) struct KfdCallHead {
    pub(crate) fd: i32,
    pub(crate) ioctl_cmd: u32,
    pub(crate) rdev: u32,
    pub(crate) nr: u32,
    /// The size the arguments have for whoever copied them (see `KfdIoctlRecord::arg_size`).
    pub(crate) arg_size: u32,
    pub(crate) ret: i64,
    /// `hook_source`: the syscall layer reads user memory, the deep hooks the driver's copy.
    pub(crate) source: u32,
}

/// Emits a [`KfdIoctlRecord`] with `capture_len` bytes of the arguments at `args`.
#[inline(always)]
pub(crate) fn emit_kfd(head: KfdCallHead, args: u64, tgid: u32) {
    let len = amd::capture_len(head.nr, head.arg_size);
    cgroup::note(tgid);
    let hdr = header(record_kind::KFD_IOCTL);
    api_tag(&hdr);
    let Some(mut entry) = reserve::<KfdIoctlRecord>() else {
        return;
    };
    let rec = entry.as_mut_ptr();
    let mut flags = 0u32;
    // SAFETY: `rec` points at a reserved, exclusively owned record of the right size; every
    // field is written before submit.
    unsafe {
        (*rec).hdr = hdr;
        (*rec).ret = head.ret;
        (*rec).fd = head.fd;
        (*rec).ioctl_cmd = head.ioctl_cmd;
        (*rec).rdev = head.rdev;
        (*rec).nr = head.nr;
        (*rec).arg_size = head.arg_size;
        (*rec).source = head.source;
        (*rec).args = [0u8; amd::KFD_ARGS_MAX];
        (*rec).args_len = 0;
        let from_kernel = head.source != hook_source::SYSCALL;
        if len == 0 {
            flags |= kfd_flags::ARGS_SHORT;
        } else if read_kfd_args((*rec).args.as_mut_ptr(), args, len, from_kernel) {
            (*rec).args_len = len;
        } else {
            flags |= kfd_flags::ARGS_READ_FAILED;
        }
        (*rec).flags = flags;
    }
    submit(entry, flags & kfd_flags::ARGS_READ_FAILED != 0);
    maps::mark_tracked(tgid, TRACK_KFD);
}

/// A traced KFD command (`CREATE_QUEUE`, `DESTROY_QUEUE`, `UPDATE_QUEUE`, `SET_CU_MASK`) on
/// `/dev/kfd` seen by the syscall layer: copy its argument struct as user memory holds it at
/// exit (the driver has copied its results back by then: `queue_id`, `doorbell_offset`, the
/// clamped `ring_size`).
#[inline(always)]
pub(crate) fn handle_kfd_ioctl(fd: u64, ioctl_cmd: u32, arg: u64, ret: i64, rdev: u32, tgid: u32) {
    let head = KfdCallHead {
        fd: fd as i32,
        ioctl_cmd,
        rdev,
        nr: amd::ioctl_nr(ioctl_cmd),
        arg_size: amd::ioctl_size(ioctl_cmd),
        ret,
        source: hook_source::SYSCALL,
    };
    emit_kfd(head, arg, tgid);
}

/// Sends a [`DeepRecord`] (`deep_hook::INIT_MQD`, `deep_hook::KFD_RELEASE`).
#[inline(always)]
pub(crate) fn emit_deep(hook: u32, value: u32, addr: u64, source: u32) {
    send(&DeepRecord {
        hdr: header(record_kind::DEEP),
        hook,
        value,
        addr,
        source,
        _pad: 0,
    });
}

/// Value `n` (0..=5) of `args`. The callers load all six arguments first with volatile loads,
/// each at a constant context offset, so that the compiler cannot fold the choice into one load
/// at a computed context offset, which the verifier refuses ("dereference of modified ctx
/// ptr").
#[inline(always)]
fn pick(n: u32, args: [u64; 6]) -> Option<u64> {
    match n {
        0 => Some(args[0]),
        1 => Some(args[1]),
        2 => Some(args[2]),
        3 => Some(args[3]),
        4 => Some(args[4]),
        5 => Some(args[5]),
        _ => None,
    }
}

/// Argument `n` (a register argument, 0..=5) of a kprobe.
#[inline(always)]
pub(crate) fn probe_arg(ctx: &ProbeContext, n: u32) -> Option<u64> {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let r = ctx.regs;
        // SAFETY: loads from the pt_regs the kernel passes to the kprobe.
        let args = unsafe {
            use core::ptr::{addr_of, read_volatile};
            [
                read_volatile(addr_of!((*r).rdi)),
                read_volatile(addr_of!((*r).rsi)),
                read_volatile(addr_of!((*r).rdx)),
                read_volatile(addr_of!((*r).rcx)),
                read_volatile(addr_of!((*r).r8)),
                read_volatile(addr_of!((*r).r9)),
            ]
        };
        pick(n, args)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let a = |i| ctx.arg::<u64>(i).unwrap_or(0);
        pick(n, [a(0), a(1), a(2), a(3), a(4), a(5)])
    }
}

/// Argument `n` (0..=2) of a trampoline program. Only the first three are loaded: the verifier
/// checks each context load against the function's BTF, and 6.1 refuses loads of arguments it
/// cannot type (`const void *restore_mqd`, argument 4 of the DQM's `create_queue_*`: "type
/// UNKNOWN is not a struct", seen in the lab).
#[inline(always)]
pub(crate) fn fexit_arg3(ctx: &FExitContext, n: u32) -> Option<u64> {
    let p = ctx.as_ptr() as *const u64;
    // SAFETY: the trampoline context is an array of the function's arguments (at least three
    // here), each 8 bytes.
    let args = unsafe {
        use core::ptr::read_volatile;
        [
            read_volatile(p),
            read_volatile(p.add(1)),
            read_volatile(p.add(2)),
            0,
            0,
            0,
        ]
    };
    if n > 2 {
        return None;
    }
    pick(n, args)
}
