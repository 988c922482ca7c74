//! Admission control (`--deny-pid`): BPF LSM programs on `file_ioctl` and `file_ioctl_compat`
//! that refuse scheduling requests from denied processes with -EPERM.
//!
//! Refused: on a watched NVIDIA device, `RM_CONTROL` `GPFIFO_SCHEDULE` on a TSG (`0xA06C0101`)
//! or a channel (`0xA06F0103`) with `bEnable` set, direct or XFER-wrapped, and, failing closed,
//! one whose `bEnable` cannot be read reliably (FINN-serialized parameters, a block or
//! parameters the helper cannot read: `gpu_trace_common::nvidia::deny`); on `/dev/kfd`,
//! `CREATE_QUEUE` (either size) and an `UPDATE_QUEUE` that leaves the queue active (ring
//! address and size set, percentage > 0) or whose arguments cannot be read. Everything else
//! passes untouched, and a verdict an earlier LSM already gave is returned as it is.
//!
//! Identity: by process (thread-group id, the `DENY` map), so every thread of a denied process
//! is refused, or by cgroup subtree (`--deny-cgroup`, `--deny-container`: every task in it,
//! including tasks that enter it later; `config.rs`). A process created by a denied process is
//! denied from its creation on (`sched_process_fork.rs`); an entry is removed when the process
//! exits (`sched_process_exit.rs`), so a later process that reuses the pid is not denied.
//! Policy ends with the tracer: nothing is pinned.
//!
//! This is an experiment tool, not a security boundary: the parameters are read from user memory
//! before the driver copies them, so a process racing its own memory could slip through.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::lsm,
    programs::LsmContext,
};
use gpu_trace_common::{
    amd, counter,
    nvidia::{
        self,
        deny::{self as rule, Control, Refusal},
        escape,
    },
};

use crate::{
    config::{cgroup_denied, config, is_kfd, is_watched},
    kernel::kread,
    maps::DENY,
    pipe::bump,
};

const EPERM: i32 = 1;

#[lsm(hook = "file_ioctl")]
pub fn deny_file_ioctl(ctx: LsmContext) -> i32 {
    try_decide(&ctx)
}

#[lsm(hook = "file_ioctl_compat")]
pub fn deny_file_ioctl_compat(ctx: LsmContext) -> i32 {
    try_decide(&ctx)
}

/// The verdict: the previous one, 0 (allowed) or -EPERM.
#[inline(always)]
fn try_decide(ctx: &LsmContext) -> i32 {
    // LSM programs get the previous verdict as the argument after the hook's own three.
    let previous: i32 = ctx.arg(3);
    if previous != 0 {
        return previous;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let cfg = config();
    if DENY.get_ptr(tgid).is_none() && !cgroup_denied(&cfg) {
        return 0;
    }
    let file: u64 = ctx.arg(0);
    let ioctl_cmd: u32 = ctx.arg(1);
    let arg: u64 = ctx.arg(2);
    // SAFETY: kernel reads through the helper.
    let rdev: u32 = match unsafe { kread::<u64>(file, cfg.file_inode) } {
        Ok(inode) => match unsafe { kread::<u32>(inode, cfg.inode_rdev) } {
            Ok(rdev) => rdev,
            Err(()) => return 0,
        },
        Err(()) => return 0,
    };
    let refuse = if is_watched(&cfg, rdev) {
        is_nvidia_schedule(ioctl_cmd, arg)
    } else if is_kfd(&cfg, rdev) {
        is_kfd_activation(ioctl_cmd, arg)
    } else {
        false
    };
    if refuse {
        bump(counter::DENIED);
        return -EPERM;
    }
    0
}

/// Whether this KFD ioctl creates a queue, or updates one so that it is active.
#[inline(always)]
fn is_kfd_activation(ioctl_cmd: u32, arg: u64) -> bool {
    if (ioctl_cmd >> 8) & 0xff != amd::KFD_IOCTL_TYPE {
        return false;
    }
    match ioctl_cmd & 0xff {
        amd::nr::CREATE_QUEUE => true,
        amd::nr::UPDATE_QUEUE => {
            // kfd_ioctl_update_queue_args: ring_base_address u64 @0, queue_id @8,
            // ring_size @12, queue_percentage @16, queue_priority @20.
            // SAFETY: user-memory read through the helper.
            // Unreadable: refused (fail closed), the driver might read something active.
            match unsafe { bpf_probe_read_user(arg as *const [u32; 6]) } {
                Ok(a) => (a[0] != 0 || a[1] != 0) && a[3] != 0 && (a[4] & 0xff) != 0,
                Err(_) => {
                    bump(counter::DENIED_UNREAD);
                    true
                }
            }
        }
        _ => false,
    }
}

/// Whether this ioctl on an NVIDIA device is refused (`gpu_trace_common::nvidia::deny`): a
/// GPFIFO_SCHEDULE with `bEnable` set, or one whose `bEnable` cannot be read reliably.
#[inline(always)]
fn is_nvidia_schedule(ioctl_cmd: u32, arg: u64) -> bool {
    if !nvidia::ioctl_nr_is_candidate(ioctl_cmd) {
        return false;
    }
    let (esc, size, block) = if ioctl_cmd & 0xff == escape::IOCTL_XFER_CMD {
        // SAFETY: user-memory read through the helper.
        match unsafe { bpf_probe_read_user(arg as *const [u32; 4]) } {
            Ok(x) => (x[0] & 0xff, x[1], (x[2] as u64) | ((x[3] as u64) << 32)),
            // What it wraps is unknown: it might be a schedule.
            Err(_) => return refused(Refusal::Unreadable),
        }
    } else {
        (ioctl_cmd & 0xff, nvidia::ioctl_size(ioctl_cmd), arg)
    };
    if esc != escape::RM_CONTROL || size != nvidia::NVOS54_SIZE {
        return false;
    }
    // SAFETY: user-memory reads through the helper.
    let control = unsafe { bpf_probe_read_user(block as *const [u32; 8]) }.ok();
    match rule::control(control) {
        Control::Pass => false,
        Control::Refuse(why) => refused(why),
        // bEnable @0.
        Control::ReadEnable { params } => {
            // SAFETY: user-memory read through the helper.
            let enable = unsafe { bpf_probe_read_user(params as *const u8) }.ok();
            match rule::schedule(enable) {
                Some(why) => refused(why),
                None => false,
            }
        }
    }
}

/// Counts a refusal made without reading `bEnable`; true (refuse).
#[inline(always)]
fn refused(why: Refusal) -> bool {
    if why != Refusal::Enable {
        bump(counter::DENIED_UNREAD);
    }
    true
}
