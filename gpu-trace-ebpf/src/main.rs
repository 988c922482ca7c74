//! gpu-trace's kernel programs, one file per hook under `probes/` (each a thin program wrapper
//! around a `try_*` body), on a few shared parts: every map in `maps.rs`, what userspace
//! configures and the filters built on it in `config.rs`, the one way to the ring buffer in
//! `pipe.rs` (reserve a record or count the drop), kernel reads in `kernel.rs`, and what a
//! vendor's call becomes whichever hook saw it in `nvidia.rs` (NVIDIA RM escapes) and `amd.rs`
//! (AMD KFD commands), the syscall layer's shared path in `syscall.rs`, cgroup attribution in
//! `cgroup.rs`.
//!
//! What they do, cheapest first:
//! 1. at syscall exit, keep only `ioctl` calls whose command number is an RM escape of interest
//!    (`RM_ALLOC`, `RM_CONTROL`, `RM_FREE`, `IOCTL_XFER`), or a KFD command of interest (type
//!    `'K'`, `CREATE_QUEUE`, `DESTROY_QUEUE`, `UPDATE_QUEUE`, `SET_CU_MASK`), from the process
//!    being filtered for;
//! 2. resolve the fd to its inode's `i_rdev` (task → files → fdtable → file → inode, offsets
//!    from BTF, handed in through `CONFIG`) and keep NVIDIA devices (major 195) for RM escapes,
//!    `/dev/kfd` (dynamic major, from `CONFIG`) for KFD commands;
//! 3. NVIDIA: read the RM parameter block and, for the classes and controls that describe
//!    scheduling, a fixed-size prefix of their parameters; KFD: read the argument struct; both
//!    from user memory as it is at exit (results included), straight into a ring-buffer record.
//!
//! They also report process exit for processes that used a watched device, and `close()` for
//! NVIDIA users, so that userspace can end the objects the driver tears down implicitly.
//!
//! Attach points: `tp_btf/sys_exit` (preferred), the same program as `raw_tp/sys_exit`, or the
//! classic `syscalls:sys_{enter,exit}_{ioctl,close}` tracepoints; `sched_process_exit`; the
//! drivers' own functions where the kernel allows hooking them (NVIDIA's ioctl and release
//! handlers, gpu_ext's scheduling hooks, AMD KFD's handlers and queue functions); the LSM hooks
//! and `sched_process_fork` for `--deny-pid`. Userspace picks what the kernel allows. No
//! `bpf_printk`, no writes to user memory. The benchmark's empty programs are a crate of their
//! own (`test/bench-ebpf`), not in this object.
#![no_std]
#![no_main]

mod amd;
mod api_tag;
mod cgroup;
mod config;
mod kernel;
mod maps;
mod nvidia;
mod pipe;
mod syscall;

/// One file per hook: the programs, by the kernel function or tracepoint they attach to.
mod probes {
    /// Classic tracepoints' record layout: 8 bytes of common fields, `int __syscall_nr` at 8,
    /// then the arguments (or `long ret`) as 8-byte slots from 16.
    const TP_ARG0: usize = 16;

    mod api_call;
    mod api_loaded;
    mod api_lookup;
    mod dqm_create_queue;
    mod file_ioctl;
    mod init_mqd;
    mod kfd_ioctl;
    mod nv_close;
    mod nv_gpu_sched;
    mod nv_ioctl;
    mod pqm_uninit;
    mod sched_process_exit;
    mod sched_process_fork;
    mod sys_exit;
    mod syscalls_close;
    mod syscalls_ioctl;
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
