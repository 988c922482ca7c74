//! Every kernel function, tracepoint and LSM hook gpu-trace attaches to, with the programs that
//! attach there: one table, which the loader attaches from, `gpu-trace doctor` checks, and the
//! benchmark's floor programs copy. A name changes here and nowhere else.

use gpu_trace_common::{amd::nr, nvidia::gpu_ext};

/// A tracepoint hook with its two program flavours: the raw tracepoint (`raw_tp/<name>`) and
/// the BTF-typed one (`tp_btf/<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawTracepoint {
    /// The tracepoint (`sys_exit`, `sched_process_exit`).
    pub name: &'static str,
    /// The `raw_tp` program.
    pub raw_program: &'static str,
    /// The `tp_btf` program.
    pub btf_program: &'static str,
}

/// A classic (tracefs) tracepoint and the program attached to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracepoint {
    pub program: &'static str,
    pub category: &'static str,
    pub name: &'static str,
}

/// One driver function a deep hook attaches to: its trampoline program, and the kprobe
/// programs that replace it where trampolines are refused (all of them attach: e.g. an entry
/// and a return probe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeepTarget {
    pub func: &'static str,
    pub trampoline: &'static str,
    pub kprobes: &'static [&'static str],
}

/// A KFD ioctl handler: its deep target and the KFD command it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KfdHandler {
    pub target: DeepTarget,
    /// The KFD command number (`gpu_trace_common::amd::nr`).
    pub cmd: u32,
}

/// An LSM hook and the program `--deny-pid` attaches to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LsmHook {
    pub program: &'static str,
    pub hook: &'static str,
}

/// The syscall layer: `sys_exit` (every syscall; the program keeps ioctl and close).
pub const SYS_EXIT: RawTracepoint = RawTracepoint {
    name: "sys_exit",
    raw_program: "sys_exit_raw",
    btf_program: "sys_exit_btf",
};

/// The syscall layer's fallback: the classic per-syscall tracepoints.
pub const SYSCALL_TRACEPOINTS: [Tracepoint; 4] = [
    Tracepoint {
        program: "tp_ioctl_enter",
        category: "syscalls",
        name: "sys_enter_ioctl",
    },
    Tracepoint {
        program: "tp_ioctl_exit",
        category: "syscalls",
        name: "sys_exit_ioctl",
    },
    Tracepoint {
        program: "tp_close_enter",
        category: "syscalls",
        name: "sys_enter_close",
    },
    Tracepoint {
        program: "tp_close_exit",
        category: "syscalls",
        name: "sys_exit_close",
    },
];

/// Process exit.
pub const PROCESS_EXIT: RawTracepoint = RawTracepoint {
    name: "sched_process_exit",
    raw_program: "process_exit_raw",
    btf_program: "process_exit_btf",
};

/// Process exit's fallback: the classic tracepoint.
pub const PROCESS_EXIT_TRACEPOINT: [Tracepoint; 1] = [Tracepoint {
    program: "tp_process_exit",
    category: "sched",
    name: "sched_process_exit",
}];

/// `--deny-pid`: the LSM hooks on ioctl (native and 32-bit compat).
pub const DENY: [LsmHook; 2] = [
    LsmHook {
        program: "deny_file_ioctl",
        hook: "file_ioctl",
    },
    LsmHook {
        program: "deny_file_ioctl_compat",
        hook: "file_ioctl_compat",
    },
];

/// `--deny-*`: a process created by a denied process is denied too (`deny_fork`, a raw
/// tracepoint: every kernel gpu-trace supports has it; required, no fallback).
pub const DENY_FORK: Tracepoint = Tracepoint {
    program: "deny_fork",
    category: "sched",
    name: "sched_process_fork",
};

/// The NVIDIA kernel module.
pub const NVIDIA_MODULE: &str = "nvidia";
/// The ioctl entry point of the NVIDIA kernel module (`file_operations.unlocked_ioctl`, also
/// its `compat_ioctl`; a traceable function with BTF).
pub const NVIDIA_ENTRY: &str = "nvidia_unlocked_ioctl";
/// The NVIDIA kernel module's release handler (`file_operations.release`): a file's last
/// close.
pub const NVIDIA_RELEASE: &str = "nvidia_close";

/// The NVIDIA driver's entry points (`loader/nv_entry.rs`): its ioctl handler at exit, which
/// serves RM ioctls instead of the syscall layer...
pub const NV_IOCTL_ENTRY: DeepTarget = DeepTarget {
    func: NVIDIA_ENTRY,
    trampoline: "nv_ioctl_fexit",
    kprobes: &["nv_ioctl_entry", "nv_ioctl_kret"],
};
/// ... and its release handler at entry, which serves the end of an fd's RM objects instead of
/// `close()`.
pub const NV_RELEASE_ENTRY: DeepTarget = DeepTarget {
    func: NVIDIA_RELEASE,
    trampoline: "nv_close_fentry",
    kprobes: &["nv_close_kprobe"],
};
/// The RM core's ioctl handler: in kallsyms, never in BTF.
pub const NVIDIA_RM_CORE: &str = "rm_ioctl";

/// The module the AMD deep hooks attach to.
pub const AMD_MODULE: &str = "amdgpu";
/// KFD's ioctl entry point.
pub const KFD_ENTRY: &str = "kfd_ioctl";

/// The KFD ioctl handlers: each one hooked takes its command away from the syscall layer.
pub const KFD_HANDLERS: [KfdHandler; 4] = [
    KfdHandler {
        target: DeepTarget {
            func: "kfd_ioctl_create_queue",
            trampoline: "kfd_create_queue_fexit",
            kprobes: &["kfd_handler_entry", "kfd_create_queue_kret"],
        },
        cmd: nr::CREATE_QUEUE,
    },
    KfdHandler {
        target: DeepTarget {
            func: "kfd_ioctl_destroy_queue",
            trampoline: "kfd_destroy_queue_fexit",
            kprobes: &["kfd_handler_entry", "kfd_destroy_queue_kret"],
        },
        cmd: nr::DESTROY_QUEUE,
    },
    KfdHandler {
        target: DeepTarget {
            func: "kfd_ioctl_update_queue",
            trampoline: "kfd_update_queue_fexit",
            kprobes: &["kfd_handler_entry", "kfd_update_queue_kret"],
        },
        cmd: nr::UPDATE_QUEUE,
    },
    KfdHandler {
        target: DeepTarget {
            func: "kfd_ioctl_set_cu_mask",
            trampoline: "kfd_set_cu_mask_fexit",
            kprobes: &["kfd_handler_entry", "kfd_set_cu_mask_kret"],
        },
        cmd: nr::SET_CU_MASK,
    },
];

/// The device queue manager's `create_queue` implementations (HWS, no-HWS): the scheduling
/// policy picks one at module load; both share the `create_queue` op's prototype.
pub const DQM_CREATE: [DeepTarget; 2] = [
    DeepTarget {
        func: "create_queue_cpsch",
        trampoline: "dqm_create_fexit",
        kprobes: &["dqm_create_entry", "dqm_create_kret"],
    },
    DeepTarget {
        func: "create_queue_nocpsch",
        trampoline: "dqm_create_fexit",
        kprobes: &["dqm_create_entry", "dqm_create_kret"],
    },
];

/// The MQD managers' descriptor builders for user queues (compute, SDMA, GFX 9.4.3), each a
/// static function with one copy per GPU generation (the HIQ's, a kernel queue, is left out):
/// never by trampoline (a trampoline would take one copy silently), one kprobe per copy, by
/// address.
pub const MQD_INIT: [&str; 3] = ["init_mqd", "init_mqd_sdma", "init_mqd_v9_4_3"];
/// The kprobe program attached to every copy of every [`MQD_INIT`] function.
pub const MQD_INIT_PROGRAM: &str = "init_mqd_kprobe";

/// Queue teardown.
pub const PQM_UNINIT: DeepTarget = DeepTarget {
    func: "pqm_uninit",
    trampoline: "pqm_uninit_fentry",
    kprobes: &["pqm_uninit_kprobe"],
};

/// The scheduling hooks of a gpu_ext-patched NVIDIA driver, in the order of
/// [`gpu_ext::FUNCTIONS`] (a fork version may name them as in [`gpu_ext::OLD_NAMES`]).
pub const GPU_EXT: [DeepTarget; 4] = [
    DeepTarget {
        func: gpu_ext::FUNCTIONS[0],
        trampoline: "nv_task_init_fentry",
        kprobes: &["nv_task_init_kprobe"],
    },
    DeepTarget {
        func: gpu_ext::FUNCTIONS[1],
        trampoline: "nv_bind_fentry",
        kprobes: &["nv_bind_kprobe"],
    },
    DeepTarget {
        func: gpu_ext::FUNCTIONS[2],
        trampoline: "nv_token_fentry",
        kprobes: &["nv_token_kprobe"],
    },
    DeepTarget {
        func: gpu_ext::FUNCTIONS[3],
        trampoline: "nv_task_destroy_fentry",
        kprobes: &["nv_task_destroy_kprobe"],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_ext_targets_follow_the_common_function_list() {
        for (t, f) in GPU_EXT.iter().zip(gpu_ext::FUNCTIONS) {
            assert_eq!(t.func, f);
        }
        assert_eq!(GPU_EXT.len(), gpu_ext::FUNCTIONS.len());
    }
}
