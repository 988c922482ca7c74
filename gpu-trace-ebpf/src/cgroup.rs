//! Containers (cgroup v2): which cgroup each traced process runs in. A process's cgroup id is
//! sent once, before its first record of the run (a `TASK_CGROUP` record), and again when it
//! changes; userspace resolves the id to a path and a container. The cgroup filters
//! (`--cgroup`, `--deny-cgroup`) are in `config.rs`.

use aya_ebpf::helpers::generated;
use gpu_trace_common::{KernelConfig, TaskCgroupRecord, record_kind};

use crate::{
    config::config,
    kernel::kread,
    maps::CGROUP_SENT,
    pipe::{header, send},
};

/// `bpf_map_update_elem` flags.
const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

/// Sends a `TASK_CGROUP` record for process `tgid` when its cgroup is not the one last sent.
/// Called before a process's record is reserved, so that the cgroup record comes first.
#[inline(always)]
pub(crate) fn note(tgid: u32) {
    // SAFETY: a helper without arguments.
    let id = unsafe { generated::bpf_get_current_cgroup_id() };
    // Remembered before sending, so that each (process, cgroup) costs one attempt: a record
    // lost to a full ring is not retried with every later record (that would double the drops
    // of a storm); userspace resolves a process it has no cgroup record for from /proc. A
    // process's first record: only the thread whose insert creates the entry sends, so two
    // threads starting at once on two CPUs do not both send.
    // SAFETY: the value is copied out.
    match unsafe { CGROUP_SENT.get(&tgid) }.copied() {
        Some(sent) if sent == id => return,
        // Moved to another cgroup (two threads racing here may both send: same contents).
        Some(_) => {
            let _ = CGROUP_SENT.insert(&tgid, &id, BPF_EXIST);
        }
        None => {
            if CGROUP_SENT.insert(&tgid, &id, BPF_NOEXIST).is_err() {
                return;
            }
        }
    }
    send(&TaskCgroupRecord {
        hdr: header(record_kind::TASK_CGROUP),
        cgroup_id: id,
        ns_pid: namespaced_tgid(&config()),
        _pad: 0,
    });
}

/// The current process's PID in its innermost PID namespace (`group_leader->thread_pid->
/// numbers[level].nr`), 0 in the host's namespace or when a read fails.
#[inline(always)]
fn namespaced_tgid(cfg: &KernelConfig) -> u32 {
    // SAFETY: a helper without arguments; kernel reads through the helper.
    unsafe {
        let task = generated::bpf_get_current_task();
        let Ok(leader) = kread::<u64>(task, cfg.task_group_leader) else {
            return 0;
        };
        let Ok(pid) = kread::<u64>(leader, cfg.task_thread_pid) else {
            return 0;
        };
        let Ok(level) = kread::<u32>(pid, cfg.pid_level) else {
            return 0;
        };
        if level == 0 || level > 32 {
            return 0;
        }
        let at = cfg.pid_numbers + (level & 63) * cfg.upid_size;
        kread::<i32>(pid, at).map_or(0, |nr| nr as u32)
    }
}

/// Process `tgid` ended: a later process with its pid gets its own record.
#[inline(always)]
pub(crate) fn forget(tgid: u32) {
    let _ = CGROUP_SENT.remove(&tgid);
}
