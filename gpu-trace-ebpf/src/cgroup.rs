//! Containers (cgroup v2): which cgroup each traced process runs in, the kernel-side cgroup
//! filter (`--cgroup`, `--container`) and the cgroup part of admission control
//! (`--deny-cgroup`, `--deny-container`).
//!
//! A process's cgroup id is sent once, before its first record of the run (a
//! `TASK_CGROUP` record), and again when it changes; userspace resolves the id to a path
//! and a container. Subtrees match by ancestry: a task is in subtree (id, level) when its
//! cgroup's ancestor at `level` is `id`, so cgroups created below it later match too.

use aya_ebpf::{
    helpers::generated,
    macros::map,
    maps::{Array, LruHashMap},
};
use gpu_trace_common::{
    CGROUP_MATCH_MAX, CgroupMatch, KernelConfig, TaskCgroupRecord, record_kind,
};

use crate::{header, kread, send};

/// `--cgroup` / `--container` subtrees (the first `filter_cgroups` entries).
#[map]
static CGROUP_FILTER: Array<CgroupMatch> = Array::with_max_entries(CGROUP_MATCH_MAX, 0);

/// `--deny-cgroup` / `--deny-container` subtrees (the first `deny_cgroups` entries).
#[map]
static DENY_CGROUP: Array<CgroupMatch> = Array::with_max_entries(CGROUP_MATCH_MAX, 0);

/// `bpf_map_update_elem` flags.
const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

/// The cgroup id last sent (or tried) for each process (tgid → id). LRU: an evicted process is
/// sent again, which costs one record and loses nothing.
#[map]
static CGROUP_SENT: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Whether the current task is in one of the first `n` subtrees of `map`.
#[inline(always)]
fn in_subtrees(map: &Array<CgroupMatch>, n: u32) -> bool {
    let mut i = 0;
    while i < CGROUP_MATCH_MAX && i < n {
        if let Some(m) = map.get(i) {
            // SAFETY: a helper without memory arguments.
            let ancestor = unsafe { generated::bpf_get_current_ancestor_cgroup_id(m.level as i32) };
            if ancestor == m.id {
                return true;
            }
        }
        i += 1;
    }
    false
}

/// The cgroup filter lets the current task through (always, without `--cgroup`).
#[inline(always)]
pub fn wanted(cfg: &KernelConfig) -> bool {
    cfg.filter_cgroups == 0 || in_subtrees(&CGROUP_FILTER, cfg.filter_cgroups)
}

/// The current task is in a denied subtree.
#[inline(always)]
pub fn denied(cfg: &KernelConfig) -> bool {
    cfg.deny_cgroups != 0 && in_subtrees(&DENY_CGROUP, cfg.deny_cgroups)
}

/// Sends a `TASK_CGROUP` record for process `tgid` when its cgroup is not the one last sent.
/// Called before a process's record is reserved, so that the cgroup record comes first.
#[inline(always)]
pub fn note(tgid: u32) {
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
        ns_pid: namespaced_tgid(&crate::config()),
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
pub fn forget(tgid: u32) {
    let _ = CGROUP_SENT.remove(&tgid);
}
