//! What userspace decides and the programs read: the two globals it rewrites in the object
//! before load (`CONFIG`, `KFD_DEEP`), the run-time switches, and every filter built on them
//! (device, `--pid`, `--cgroup`, `--deny-cgroup`, what the driver hooks serve).

use aya_ebpf::helpers::generated;
use gpu_trace_common::{
    CGROUP_MATCH_MAX, CgroupMatch, KernelConfig, KfdDeepConfig, kernel_dev_major, switch,
};

use crate::maps::{CGROUP_FILTER, DENY_CGROUP, SWITCHES};

/// Filled in by userspace before load (`EbpfLoader::set_global`).
#[unsafe(no_mangle)]
static CONFIG: KernelConfig = KernelConfig {
    task_files: 0,
    files_fdt: 0,
    fdt_max_fds: 0,
    fdt_fd: 0,
    file_inode: 0,
    inode_rdev: 0,
    task_signal: 0,
    signal_live: 0,
    nv_major: 0,
    extra_rdev: 0,
    filter_tgid: 0,
    kfd_major: 0,
    extra_kfd_rdev: 0,
    ready: 0,
    filter_cgroups: 0,
    deny_cgroups: 0,
    task_group_leader: 0,
    task_thread_pid: 0,
    pid_level: 0,
    pid_numbers: 0,
    upid_size: 0,
    task_stack: 0,
    stack_regs: 0,
};

/// The AMD deep hooks' offsets and argument positions, filled in by userspace before load from
/// the module's BTF.
#[unsafe(no_mangle)]
static KFD_DEEP: KfdDeepConfig = KfdDeepConfig {
    create_args_size: 0,
    pqm_process: 0,
    process_lead_thread: 0,
    task_tgid: 0,
    qp_type: 0,
    qp_format: 0,
    qp_queue_id: 0,
    qp_queue_address: 0,
    qp_queue_size: 0,
    qp_priority: 0,
    qp_percent: 0,
    qp_doorbell_off: 0,
    qp_is_active: 0,
    qp_vmid: 0,
    dqm_create_q_arg: 0,
    queue_properties: 0,
    init_mqd_q_arg: 0,
    ready: 0,
};

#[inline(always)]
pub(crate) fn config() -> KernelConfig {
    // SAFETY: a plain read of our own global; volatile so that the compiler keeps the load
    // (userspace rewrites the value in the object before load).
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

#[inline(always)]
pub(crate) fn deep_config() -> KfdDeepConfig {
    // SAFETY: a plain read of our own global (volatile: userspace rewrites it before load).
    unsafe { core::ptr::read_volatile(&KFD_DEEP) }
}

/// The value of switch `index` (0 when unset).
#[inline(always)]
fn switch_value(index: u32) -> u32 {
    SWITCHES.get(index).copied().unwrap_or(0)
}

/// Whether the NVIDIA driver's entry points serve `bit` (`nv_entry_bits`).
#[inline(always)]
pub(crate) fn nv_entry_serves(bit: u32) -> bool {
    switch_value(switch::NV_ENTRY) & bit != 0
}

/// Whether a deep hook on the driver's handler reports KFD command `nr` instead of this layer.
#[inline(always)]
pub(crate) fn kfd_served_by_deep_hook(nr: u32) -> bool {
    nr < 32 && (switch_value(switch::KFD_DEEP) >> nr) & 1 != 0
}

/// A watched NVIDIA device (major 195 from `CONFIG`), or the test device.
#[inline(always)]
pub(crate) fn is_watched(cfg: &KernelConfig, rdev: u32) -> bool {
    (cfg.nv_major != 0 && kernel_dev_major(rdev) == cfg.nv_major)
        || (cfg.extra_rdev != 0 && rdev == cfg.extra_rdev)
}

/// `/dev/kfd` (dynamic major; 0 in `CONFIG` means KFD is not traced), or the test device.
#[inline(always)]
pub(crate) fn is_kfd(cfg: &KernelConfig, rdev: u32) -> bool {
    (cfg.kfd_major != 0 && kernel_dev_major(rdev) == cfg.kfd_major)
        || (cfg.extra_kfd_rdev != 0 && rdev == cfg.extra_kfd_rdev)
}

/// Whether the current task is in one of the first `n` subtrees of `map`. Subtrees match by
/// ancestry: a task is in subtree (id, level) when its cgroup's ancestor at `level` is `id`, so
/// cgroups created below it later match too.
#[inline(always)]
fn in_subtrees(map: &aya_ebpf::maps::Array<CgroupMatch>, n: u32) -> bool {
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
pub(crate) fn cgroup_wanted(cfg: &KernelConfig) -> bool {
    cfg.filter_cgroups == 0 || in_subtrees(&CGROUP_FILTER, cfg.filter_cgroups)
}

/// The current task is in a denied subtree.
#[inline(always)]
pub(crate) fn cgroup_denied(cfg: &KernelConfig) -> bool {
    cfg.deny_cgroups != 0 && in_subtrees(&DENY_CGROUP, cfg.deny_cgroups)
}

/// Whether the current process passes the AMD deep hooks' gates and the `--pid` and cgroup
/// filters.
#[inline(always)]
pub(crate) fn kfd_deep_wanted(tgid: u32) -> bool {
    let cfg = config();
    cfg.ready != 0
        && deep_config().ready != 0
        && (cfg.filter_tgid == 0 || cfg.filter_tgid == tgid)
        && cgroup_wanted(&cfg)
}
