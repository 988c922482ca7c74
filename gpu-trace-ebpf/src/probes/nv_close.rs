//! `nvidia_close(struct inode *, struct file *)` at entry: the NVIDIA driver's release handler,
//! where the kernel allows hooking it (trampoline, else kprobe). It runs once per open file, at
//! its last close (not at `close()` of one of its dups, and also when a process's exit or a
//! later `close()` of a forked copy drops it): the moment the driver frees what the file's
//! clients held. It is reported as the close of the fd the file was first used through by a
//! traced call (`NV_FILES`, filled by `nv.rs`), instead of the syscall layer's `close()`
//! (`nv_entry_bits::RELEASE`).

use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use gpu_trace_common::{TaskRecord, record_kind};

use crate::{
    maps::NV_FILES,
    pipe::{header, send},
};

#[fentry(function = "nvidia_close")]
pub fn nv_close_fentry(ctx: FEntryContext) -> i32 {
    let _ = try_released(ctx.arg(1));
    0
}

#[kprobe]
pub fn nv_close_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(file) = ctx.arg::<u64>(1) {
        let _ = try_released(file);
    }
    0
}

/// The file's release began: its clients' objects are about to be freed.
#[inline(always)]
fn try_released(file: u64) -> Option<()> {
    // SAFETY: the value is copied out before removal.
    let f = (unsafe { NV_FILES.get(&file) }).copied()?;
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
    Some(())
}
