//! Admission control (`--deny-pid`): BPF LSM programs on `file_ioctl` and `file_ioctl_compat`
//! that refuse scheduling requests from denied processes with -EPERM.
//!
//! Refused: on a watched NVIDIA device, `RM_CONTROL` `GPFIFO_SCHEDULE` on a TSG (`0xA06C0101`)
//! or a channel (`0xA06F0103`) with `bEnable` set, direct or XFER-wrapped; on `/dev/kfd`,
//! `CREATE_QUEUE` (either size) and an `UPDATE_QUEUE` that leaves the queue active (ring
//! address and size set, percentage > 0). Everything else passes untouched, and a verdict an
//! earlier LSM already gave is returned as it is.
//!
//! Identity: by process (thread-group id), so every thread of a denied process is refused, or by
//! cgroup subtree (`--deny-cgroup`, `--deny-container`: every task in it, including tasks that
//! enter it later; `cgroup.rs`). An
//! entry is removed when the process exits (`process_exit` in main.rs), so a later process that
//! reuses the pid is not denied. Policy ends with the tracer: nothing is pinned.
//!
//! This is an experiment tool, not a security boundary: the parameters are read from user memory
//! before the driver copies them, so a process racing its own memory could slip through.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{lsm, map},
    maps::HashMap,
    programs::LsmContext,
};
use gpu_trace_common::{
    amd, counter,
    nvidia::{self, cmd, escape, off},
};

use crate::{bump, config, is_kfd, is_watched, kread};

/// Denied processes: tgid → 1. Filled by userspace before attach.
#[map]
pub static DENY: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

const EPERM: i32 = 1;

#[lsm(hook = "file_ioctl")]
pub fn deny_file_ioctl(ctx: LsmContext) -> i32 {
    decide(&ctx)
}

#[lsm(hook = "file_ioctl_compat")]
pub fn deny_file_ioctl_compat(ctx: LsmContext) -> i32 {
    decide(&ctx)
}

#[inline(always)]
fn decide(ctx: &LsmContext) -> i32 {
    // LSM programs get the previous verdict as the argument after the hook's own three.
    let previous: i32 = ctx.arg(3);
    if previous != 0 {
        return previous;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let cfg = config();
    if DENY.get_ptr(tgid).is_none() && !crate::cgroup::denied(&cfg) {
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
            match unsafe { bpf_probe_read_user(arg as *const [u32; 6]) } {
                Ok(a) => (a[0] != 0 || a[1] != 0) && a[3] != 0 && (a[4] & 0xff) != 0,
                Err(_) => false,
            }
        }
        _ => false,
    }
}

/// Whether this ioctl on an NVIDIA device is a GPFIFO_SCHEDULE with `bEnable` set.
#[inline(always)]
fn is_nvidia_schedule(ioctl_cmd: u32, arg: u64) -> bool {
    if !nvidia::ioctl_nr_is_candidate(ioctl_cmd) {
        return false;
    }
    let (esc, size, block) = if ioctl_cmd & 0xff == escape::IOCTL_XFER_CMD {
        // SAFETY: user-memory read through the helper.
        match unsafe { bpf_probe_read_user(arg as *const [u32; 4]) } {
            Ok(x) => (x[0] & 0xff, x[1], (x[2] as u64) | ((x[3] as u64) << 32)),
            Err(_) => return false,
        }
    } else {
        (ioctl_cmd & 0xff, nvidia::ioctl_size(ioctl_cmd), arg)
    };
    if esc != escape::RM_CONTROL || size != nvidia::NVOS54_SIZE {
        return false;
    }
    // NVOS54: cmd @8, params @16, paramsSize @24.
    // SAFETY: user-memory reads through the helper.
    let Ok(control) = (unsafe { bpf_probe_read_user(block as *const [u32; 8]) }) else {
        return false;
    };
    let command = control[off::CONTROL_CMD / 4];
    if command != cmd::TSG_GPFIFO_SCHEDULE && command != cmd::CHANNEL_GPFIFO_SCHEDULE {
        return false;
    }
    let params = (control[off::CONTROL_PARAMS_PTR / 4] as u64)
        | ((control[off::CONTROL_PARAMS_PTR / 4 + 1] as u64) << 32);
    if control[off::CONTROL_PARAMS_SIZE / 4] < 1 {
        return false;
    }
    // bEnable @0.
    matches!(unsafe { bpf_probe_read_user(params as *const u8) }, Ok(b) if b != 0)
}
