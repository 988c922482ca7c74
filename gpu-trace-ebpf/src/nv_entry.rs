//! The NVIDIA driver's own entry points, where the kernel allows hooking them: its ioctl
//! handler `nvidia_unlocked_ioctl(struct file *, unsigned int cmd, unsigned long arg)` at exit,
//! and its release handler `nvidia_close(struct inode *, struct file *)` at entry. With both,
//! no program runs for any other system call on the machine (the syscall layer is not
//! attached): the ioctl handler runs only for the driver's own files, so the fd → device walk
//! is not needed either.
//!
//! - The ioctl exit sees what the syscall layer sees: the same user memory after the driver
//!   copied its results back (the handler returns right after `copy_to_user`), and the return
//!   value the system call will return. The fd comes from the thread's saved user registers.
//! - The release runs once per open file, at its last close (not at `close()` of one of its
//!   dups, and also when a process's exit or a later `close()` of a forked copy drops it):
//!   the moment the driver frees what the file's clients held. It is reported as the close of
//!   the fd the file was first used through by a traced call ([`NV_FILES`]).
//!
//! Userspace attaches a trampoline (module BTF) where the kernel allows it, else kprobes, and
//! sets `gpu_trace_common::nv_entry_bits` for what is served here before the syscall layer
//! would attach (`gpu-trace/src/loader/nv_entry.rs`).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{fentry, fexit, kprobe, kretprobe, map},
    maps::{HashMap, LruHashMap},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
pub use gpu_trace_common::nv_entry_bits::{IOCTL, RELEASE};
use gpu_trace_common::{TaskRecord, nvidia, record_kind, wire_syscall};

use crate::{
    bump, config, file_rdev, handle_nv_ioctl, header, is_watched, nv_deep::current_syscall, send,
};

/// The process and fd through which a traced call first used an NVIDIA file, by `struct file *`
/// (LRU: a file whose release was missed cannot fill the map).
#[map]
static NV_FILES: LruHashMap<u64, NvFile> = LruHashMap::with_max_entries(16384, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct NvFile {
    tgid: u32,
    fd: i32,
    comm: [u8; 16],
}

/// Kprobe variant only: the ioctl handler's arguments at entry, by thread.
#[map]
static NV_ENTRY_ARGS: HashMap<u64, EntryArgs> = HashMap::with_max_entries(4096, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct EntryArgs {
    file: u64,
    cmd: u64,
    arg: u64,
}

/// Remembers the first (process, fd) a traced call used `file` through (called by
/// `handle_nv_ioctl` when the release handler is hooked).
#[inline(always)]
pub(crate) fn note_file(file: u64, tgid: u32, fd: i32) {
    if NV_FILES.get_ptr(&file).is_some() {
        return;
    }
    let comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
    let _ = NV_FILES.insert(&file, &NvFile { tgid, fd, comm }, 0);
}

/// The ioctl handler returned `ret` for (`file`, `cmd`, `arg`).
#[inline(always)]
fn ioctl_exit(file: u64, cmd: u64, arg: u64, ret: i64) {
    let cfg = config();
    let cmd = cmd as u32;
    if cfg.ready == 0 || !nvidia::ioctl_nr_is_candidate(cmd) {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if (cfg.filter_tgid != 0 && cfg.filter_tgid != tgid) || !crate::cgroup::wanted(&cfg) {
        return;
    }
    let Ok(rdev) = file_rdev(&cfg, file) else {
        bump(gpu_trace_common::counter::FD_LOOKUP_FAILED);
        return;
    };
    if !is_watched(&cfg, rdev) {
        return;
    }
    // The fd, as the syscall layer has it: from a 64-bit ioctl(2). A 32-bit caller's compat
    // ioctl is left out, as the syscall layer leaves it; where the registers cannot be found
    // the call is still reported, with fd -1.
    let fd = match current_syscall() {
        (wire_syscall::IOCTL, fd) => fd as i32,
        (wire_syscall::UNKNOWN, _) => -1,
        _ => return,
    };
    handle_nv_ioctl(fd, cmd, arg, ret, rdev, tgid, file);
}

/// The file's release began: its clients' objects are about to be freed.
#[inline(always)]
fn released(file: u64) {
    // SAFETY: the value is copied out before removal.
    let Some(f) = (unsafe { NV_FILES.get(&file) }).copied() else {
        return;
    };
    let _ = NV_FILES.remove(&file);
    let mut hdr = header(record_kind::FD_CLOSE);
    // Whoever drops the last reference (an exiting process, a forked child, a kernel
    // worker), the objects are those of the process that used the file.
    hdr.tgid = f.tgid;
    hdr.tid = f.tgid;
    hdr.comm = f.comm;
    send(&TaskRecord {
        hdr,
        value: f.fd,
        _pad: 0,
    });
}

#[fexit(function = "nvidia_unlocked_ioctl")]
pub fn nv_ioctl_fexit(ctx: FExitContext) -> i32 {
    let file: u64 = ctx.arg(0);
    let cmd: u64 = ctx.arg(1);
    let arg: u64 = ctx.arg(2);
    let ret: i64 = ctx.ret::<i64>().unwrap_or(0);
    ioctl_exit(file, cmd, arg, ret);
    0
}

#[kprobe]
pub fn nv_ioctl_entry(ctx: ProbeContext) -> u32 {
    let (Some(file), Some(cmd), Some(arg)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg(2))
    else {
        return 0;
    };
    if !nvidia::ioctl_nr_is_candidate(cmd as u32) {
        return 0;
    }
    let _ = NV_ENTRY_ARGS.insert(
        &bpf_get_current_pid_tgid(),
        &EntryArgs { file, cmd, arg },
        0,
    );
    0
}

#[kretprobe]
pub fn nv_ioctl_kret(ctx: RetProbeContext) -> u32 {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out before removal.
    let Some(a) = (unsafe { NV_ENTRY_ARGS.get(&key) }).copied() else {
        return 0;
    };
    let _ = NV_ENTRY_ARGS.remove(&key);
    let ret: i64 = ctx.ret();
    ioctl_exit(a.file, a.cmd, a.arg, ret);
    0
}

#[fentry(function = "nvidia_close")]
pub fn nv_close_fentry(ctx: FEntryContext) -> i32 {
    released(ctx.arg(1));
    0
}

#[kprobe]
pub fn nv_close_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(file) = ctx.arg::<u64>(1) {
        released(file);
    }
    0
}
