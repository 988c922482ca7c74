//! Wire types shared by the kernel programs (`gpu-trace-ebpf`) and userspace (`gpu-trace`).
//!
//! Rules for everything in this crate:
//! - `#[repr(C)]`, explicit padding fields, sizes checked at compile time;
//! - no `bool`, `Option` or enums on the wire: plain integers and byte arrays;
//! - every record starts with a [`RecordHeader`] whose first field is the type tag ([`RecordKind`]).
//!
//! The kernel side only copies bytes: it reads the RM parameter block and the class/control
//! sub-parameters from user memory as they are at syscall exit, and userspace decodes them. That
//! keeps the programs small and makes decoding pure code that is tested on captured bytes.
#![no_std]

pub mod amd;
pub mod api;
pub mod nvidia;

/// The byte-level traits the records derive (feature `wire`), for their readers.
#[cfg(feature = "wire")]
pub use zerocopy;

use core::mem::size_of;

#[cfg(feature = "wire")]
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Type tags (first `u32` of every record).
pub mod record_kind {
    // 0x100..=0x1ff: kinds written by userspace, never by the kernel
    // (gpu_trace_core::user_records::user_kind).
    /// [`crate::NvIoctlRecord`]: one completed ioctl on a watched NVIDIA device.
    pub const NV_IOCTL: u32 = 1;
    /// [`crate::TaskRecord`]: the last thread of a process that used a watched device exited.
    pub const PROCESS_EXIT: u32 = 2;
    /// [`crate::TaskRecord`]: a process that used a watched device closed a file descriptor.
    pub const FD_CLOSE: u32 = 3;
    /// [`crate::KfdIoctlRecord`]: one completed ioctl on `/dev/kfd` (AMD KFD), from the
    /// syscall layer or from a deep hook on the driver's ioctl handler (see its `source`).
    pub const KFD_IOCTL: u32 = 4;
    /// [`crate::KfdQueueRecord`]: the driver's device queue manager created a queue (deep hook
    /// on the exit of `create_queue_cpsch` / `create_queue_nocpsch`).
    pub const KFD_QUEUE: u32 = 5;
    /// [`crate::DeepRecord`]: a driver-internal step seen by a deep hook ([`crate::deep_hook`]).
    pub const DEEP: u32 = 6;
    /// [`crate::NvSchedRecord`]: a scheduling hook of a gpu_ext-patched NVIDIA driver ran.
    pub const NV_SCHED: u32 = 7;
    /// [`crate::TaskCgroupRecord`]: the cgroup (v2) of a process, sent before its first record
    /// of the run and again whenever it changes (the process moved).
    pub const TASK_CGROUP: u32 = 8;
    /// [`crate::api::ApiTagRecord`]: the API calls open on the calling thread, sent just
    /// before the driver record of the same call (same header time and thread) when the thread
    /// has one open (`gpu-trace --api`; never without it).
    pub const API_TAG: u32 = 9;
    /// [`crate::api::ApiCallRecord`]: one completed API call (`gpu-trace --api-calls`,
    /// `gpu-trace api -v`).
    pub const API_CALL: u32 = crate::api::API_CALL;
    /// [`crate::api::ApiRecursionRecord`]: an API call re-entered on a thread, or a thread
    /// past the depth cap.
    pub const API_RECURSION: u32 = crate::api::API_RECURSION;
    /// [`crate::api::ApiLoadedRecord`]: a target's link map changed (consumed by the live
    /// run, never recorded).
    pub const API_LOADED: u32 = crate::api::API_LOADED;
    /// [`crate::api::ApiHandoutRecord`]: a lookup handed out an address (consumed by the live
    /// run, never recorded).
    pub const API_HANDOUT: u32 = crate::api::API_HANDOUT;
}

/// Which hook produced a record that several hooks can produce ([`KfdIoctlRecord::source`],
/// [`KfdQueueRecord::source`], [`DeepRecord::source`]).
pub mod hook_source {
    /// The syscall layer (`sys_exit` programs): the ioctl as the process issued it.
    pub const SYSCALL: u32 = 0;
    /// A BPF trampoline (fentry/fexit) on the driver function, typed by the module's BTF.
    pub const TRAMPOLINE: u32 = 1;
    /// A kprobe / kretprobe on the driver function.
    pub const KPROBE: u32 = 2;
}

/// System call numbers as records carry them: x86-64's, on every architecture. A kernel
/// program elsewhere translates the calls the model needs (arm64's `ioctl` is 29 and `close`
/// 57) and marks any other as [`OTHER`](wire_syscall::OTHER), so that one decoder reads a
/// record, or a recording, from any machine.
pub mod wire_syscall {
    pub const IOCTL: u32 = 16;
    pub const CLOSE: u32 = 3;
    /// A system call the model does not use, on an architecture whose numbers differ.
    pub const OTHER: u32 = u32::MAX - 1;
    /// Not known: the registers were not read, or a kernel thread.
    pub const UNKNOWN: u32 = u32::MAX;
}

/// Indices of the kernel programs' `SWITCHES` array, which userspace sets after attaching the
/// driver hooks and before attaching the syscall layer: what the driver hooks serve, which the
/// syscall layer then leaves to them.
pub mod switch {
    /// `1 << nr` for every KFD command whose driver handler has a deep hook.
    pub const KFD_DEEP: u32 = 0;
    /// [`super::nv_entry_bits`] of what the NVIDIA driver's entry points serve.
    pub const NV_ENTRY: u32 = 1;
    /// Entries of the array.
    pub const COUNT: u32 = 2;
}

/// What the NVIDIA driver's own entry points serve (the value at [`switch::NV_ENTRY`]).
pub mod nv_entry_bits {
    /// RM ioctls: `nvidia_unlocked_ioctl` is hooked at its exit.
    pub const IOCTL: u32 = 1 << 0;
    /// The end of an fd's RM objects: `nvidia_close` (the file's release, at its last close)
    /// is hooked, instead of `close()` of each fd.
    pub const RELEASE: u32 = 1 << 1;
}

/// What a [`DeepRecord`] reports (its `hook` field).
pub mod deep_hook {
    /// A copy of the KFD MQD manager's `init_mqd` ran (the queue's hardware descriptor was
    /// built): `value` is the queue id, `addr` the address of the copy that ran.
    pub const INIT_MQD: u32 = 1;
    /// The KFD process's queue manager was torn down (`pqm_uninit`): every queue of the process
    /// ends. `value` is the owning process (tgid of its lead thread); the record's header names
    /// the thread that ran the teardown.
    pub const KFD_RELEASE: u32 = 2;
}

/// Common header of every ring-buffer record (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct RecordHeader {
    /// One of [`record_kind`].
    pub kind: u32,
    /// CPU the program ran on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// Process id (thread-group id).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// `comm` of the calling thread, NUL padded.
    pub comm: [u8; 16],
}

/// Bits of [`NvIoctlRecord::flags`].
pub mod nv_flags {
    /// The call used `NV_ESC_IOCTL_XFER_CMD` (the escape and block came from the xfer struct).
    pub const XFER: u32 = 1 << 0;
    /// Reading the 16-byte xfer struct from user memory failed.
    pub const XFER_READ_FAILED: u32 = 1 << 1;
    /// The xfer size was above the driver's limit (16384): the driver refuses the call.
    pub const XFER_OVERSIZE: u32 = 1 << 2;
    /// Reading the RM parameter block (NVOS00/21/54/64) from user memory failed.
    pub const PARAMS_READ_FAILED: u32 = 1 << 3;
    /// Reading the class/control sub-parameters from user memory failed.
    pub const SUB_READ_FAILED: u32 = 1 << 4;
    /// The block size does not match the escape (the driver refuses the call).
    pub const BAD_SIZE: u32 = 1 << 5;
    /// The caller's `paramsSize` was smaller than the sub-parameters this tracer reads: `sub`
    /// holds only `sub_len` bytes.
    pub const SUB_TRUNCATED: u32 = 1 << 6;
}

/// Largest RM parameter block copied (NVOS64 is 48 bytes).
pub const NV_PARAMS_MAX: usize = 48;
/// Largest class/control sub-parameter prefix copied (the channel alloc params up to `cid`).
pub const NV_SUB_MAX: usize = 136;

/// One ioctl on a watched NVIDIA device whose escape and class/command are of interest,
/// captured at syscall exit (264 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct NvIoctlRecord {
    pub hdr: RecordHeader,
    /// Syscall return value (0, or a negative errno). RM failures return 0: see the block's `status`.
    pub ret: i64,
    /// The file descriptor the ioctl was issued on.
    pub fd: i32,
    /// The ioctl command as issued.
    pub ioctl_cmd: u32,
    /// Kernel `dev_t` (`major << 20 | minor`) of the fd's inode.
    pub rdev: u32,
    /// RM escape number (`_IOC_NR`, after unwrapping XFER).
    pub escape: u32,
    /// Size of the RM parameter block (`_IOC_SIZE`, or the xfer size).
    pub param_size: u32,
    /// [`nv_flags`] bits.
    pub flags: u32,
    /// Valid bytes in `params`.
    pub params_len: u32,
    /// Valid bytes in `sub`.
    pub sub_len: u32,
    /// The RM parameter block, as user memory held it at syscall exit.
    pub params: [u8; NV_PARAMS_MAX],
    /// Class alloc parameters or control parameters (prefix), read at syscall exit.
    pub sub: [u8; NV_SUB_MAX],
}

/// One ioctl on `/dev/kfd` whose command this tracer decodes (`CREATE_QUEUE`,
/// `DESTROY_QUEUE`, `UPDATE_QUEUE`, `SET_CU_MASK`), with its argument struct as user memory held
/// it at syscall exit (results included) (176 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct KfdIoctlRecord {
    pub hdr: RecordHeader,
    /// Syscall return value: 0, or a negative errno (KFD reports failures this way).
    pub ret: i64,
    /// The file descriptor the ioctl was issued on.
    pub fd: i32,
    /// The ioctl command as issued.
    pub ioctl_cmd: u32,
    /// Kernel `dev_t` (`major << 20 | minor`) of the fd's inode.
    pub rdev: u32,
    /// KFD command number (`_IOC_NR`): one of [`amd::nr`].
    pub nr: u32,
    /// `_IOC_SIZE` of the command as issued: the bytes the driver copies in and out. From a
    /// deep hook on the handler: the size of the kernel's own argument struct (its copy holds
    /// at least that much, zero-filled past what the caller passed).
    pub arg_size: u32,
    /// [`amd::kfd_flags`] bits.
    pub flags: u32,
    /// Valid bytes in `args` (0, or [`amd::capture_len`]).
    pub args_len: u32,
    /// [`hook_source`]: the syscall layer (`fd` and `ioctl_cmd` known, `args` read from user
    /// memory) or a deep hook on the driver's handler (`fd` is -1 and `ioctl_cmd` 0: the handler
    /// sees neither; `args` read from the driver's own copy).
    pub source: u32,
    /// The argument struct, read at syscall exit.
    pub args: [u8; amd::KFD_ARGS_MAX],
}

/// Bits of [`KfdQueueRecord::flags`].
pub mod kfd_queue_flags {
    /// Reading the driver's `struct queue_properties` failed: its fields are 0.
    pub const PROPS_READ_FAILED: u32 = 1 << 0;
}

/// The device queue manager finished creating a queue (`create_queue_cpsch` or
/// `create_queue_nocpsch` returned): the queue as the driver holds it in its own `struct queue`,
/// which the ioctl arguments do not show (the kernel's queue type and format, the absolute
/// doorbell index, whether the driver made it active, the VMID) (104 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct KfdQueueRecord {
    pub hdr: RecordHeader,
    /// [`hook_source`] (trampoline or kprobe).
    pub source: u32,
    /// The create function's return value (0 or a negative errno).
    pub ret: i32,
    pub _pad: u32,
    /// [`kfd_queue_flags`] bits.
    pub flags: u32,
    /// `queue_properties.type` (`enum kfd_queue_type`: 0 compute, 1 SDMA, 2 HIQ, 3 SDMA XGMI,
    /// 4 SDMA by engine id).
    pub q_type: u32,
    /// `queue_properties.format` (0 PM4, 1 AQL).
    pub q_format: u32,
    /// `queue_properties.queue_id`.
    pub queue_id: u32,
    /// `queue_properties.priority` (0..=15).
    pub priority: u32,
    /// `queue_properties.queue_percent`.
    pub percent: u32,
    /// `queue_properties.doorbell_off`: the doorbell's absolute dword index in the doorbell BAR.
    pub doorbell_off: u32,
    /// `queue_properties.is_active` (0 or 1).
    pub is_active: u32,
    /// `queue_properties.vmid` (0 under the hardware scheduler until it maps the process).
    pub vmid: u32,
    /// `queue_properties.queue_size` (bytes).
    pub queue_size: u64,
    /// `queue_properties.queue_address` (the ring's GPU virtual address).
    pub queue_address: u64,
}

/// A driver-internal step seen by a deep hook, with one value and one address whose meaning
/// [`deep_hook`] gives (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct DeepRecord {
    pub hdr: RecordHeader,
    /// One of [`deep_hook`].
    pub hook: u32,
    /// See [`deep_hook`].
    pub value: u32,
    /// See [`deep_hook`] (0 where unused).
    pub addr: u64,
    /// [`hook_source`] (trampoline or kprobe).
    pub source: u32,
    pub _pad: u32,
}

/// A scheduling hook of the gpu_ext-patched NVIDIA driver (`nv_gpu_sched_*`, see
/// [`nvidia::gpu_ext`]) ran: its context struct's first bytes, and the system call the thread
/// was in, so that userspace can tell a hook inside a traced RM ioctl from one inside another
/// call (UVM's) or a kernel thread (96 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct NvSchedRecord {
    pub hdr: RecordHeader,
    /// One of [`nvidia::gpu_ext::hook`].
    pub hook: u32,
    /// [`hook_source`] (trampoline or kprobe).
    pub source: u32,
    /// Valid bytes in `ctx` (0 when reading it failed).
    pub ctx_len: u32,
    /// The thread's system call when the hook ran, in [`wire_syscall`]'s numbering (x86-64's,
    /// whatever the machine); [`wire_syscall::UNKNOWN`] when it is not known (not read, or a
    /// kernel thread).
    pub syscall_nr: u32,
    /// The system call's first argument (the fd, for `ioctl`).
    pub syscall_arg0: u64,
    /// The hook's context struct, prefix ([`nvidia::gpu_ext::capture_len`]).
    pub ctx: [u8; nvidia::gpu_ext::CTX_MAX],
}

/// Process exit or fd close by a process that used a watched device (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct TaskRecord {
    pub hdr: RecordHeader,
    /// [`record_kind::FD_CLOSE`]: the closed fd. [`record_kind::PROCESS_EXIT`]: the exit code
    /// (`task->exit_code`, raw), or -1 where it was not read.
    pub value: i32,
    pub _pad: u32,
}

/// The cgroup (v2) a process runs in, sent before the process's first record of the run and
/// whenever it changes (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct TaskCgroupRecord {
    pub hdr: RecordHeader,
    /// `bpf_get_current_cgroup_id()`: the kernfs id (inode number) of the cgroup on the
    /// cgroup2 mount.
    pub cgroup_id: u64,
    /// The process's PID in its own (innermost) PID namespace, read from the kernel
    /// (`group_leader->thread_pid->numbers[level].nr`); 0 when that namespace is the host's or
    /// the read failed.
    pub ns_pid: u32,
    pub _pad: u32,
}

/// One cgroup subtree for the kernel-side filters (`--cgroup`, `--container`) and denial
/// (`--deny-cgroup`, `--deny-container`): a task matches when its cgroup's ancestor at `level`
/// is `id` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupMatch {
    /// Kernfs id of the subtree's root cgroup.
    pub id: u64,
    /// Its depth below the cgroup2 root (the root is 0).
    pub level: u32,
    pub _pad: u32,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for CgroupMatch {}

/// Entries of the `CGROUP_FILTER` and `DENY_CGROUP` maps.
pub const CGROUP_MATCH_MAX: u32 = 8;

/// Index of each counter in the per-CPU `COUNTERS` array.
pub mod counter {
    /// Ring-buffer reservations that failed: records lost.
    pub const DROPPED: u32 = 0;
    /// User-memory reads that failed (the record is still sent, flagged).
    pub const READ_FAILED: u32 = 1;
    /// Ioctls on watched devices with an escape, class or command this tracer does not decode.
    pub const IGNORED: u32 = 2;
    /// Records sent to userspace, of every kind (calls, close and exit notices, deep-hook and
    /// gpu_ext records): `EMITTED + DROPPED` is what the programs tried to send.
    pub const EMITTED: u32 = 3;
    /// Ioctls whose fd could not be resolved to an inode (fd table read failed).
    pub const FD_LOOKUP_FAILED: u32 = 4;
    /// Scheduling requests refused by the `--deny-pid` LSM programs.
    pub const DENIED: u32 = 5;
    /// Of [`DENIED`], those refused without reading `bEnable` (failing closed): FINN-serialized
    /// parameters, or a block / parameters the BPF helper could not read.
    pub const DENIED_UNREAD: u32 = 6;
    /// Processes created by a denied process that could not be added to the deny map (full):
    /// not denied.
    pub const DENY_UNFOLLOWED: u32 = 7;
    pub const COUNT: u32 = 8;
}

/// Kernel structure offsets (from `/sys/kernel/btf/vmlinux`) and filters, written into the
/// programs' `CONFIG` global before load (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelConfig {
    /// `task_struct.files`
    pub task_files: u32,
    /// `files_struct.fdt`
    pub files_fdt: u32,
    /// `fdtable.max_fds`
    pub fdt_max_fds: u32,
    /// `fdtable.fd`
    pub fdt_fd: u32,
    /// `file.f_inode`
    pub file_inode: u32,
    /// `inode.i_rdev`
    pub inode_rdev: u32,
    /// `task_struct.signal`
    pub task_signal: u32,
    /// `signal_struct.live`
    pub signal_live: u32,
    /// Character major of the NVIDIA devices (195); 0 = do not trace NVIDIA.
    pub nv_major: u32,
    /// One more device to treat as NVIDIA (kernel `dev_t`; 0 = none). Tests use it.
    pub extra_rdev: u32,
    /// Only trace this process (0 = all).
    pub filter_tgid: u32,
    /// Character major of `/dev/kfd` (dynamic, from `/proc/devices`); 0 = do not trace KFD.
    pub kfd_major: u32,
    /// One more device to treat as `/dev/kfd` (kernel `dev_t`; 0 = none). Tests use it.
    pub extra_kfd_rdev: u32,
    /// Non-zero once userspace has filled this in; the programs do nothing while it is 0.
    pub ready: u32,
    /// Entries in `CGROUP_FILTER` (`--cgroup`, `--container`): only tasks in those subtrees
    /// are traced. 0 = no cgroup filter.
    pub filter_cgroups: u32,
    /// Entries in `DENY_CGROUP` (`--deny-cgroup`, `--deny-container`).
    pub deny_cgroups: u32,
    /// `task_struct.group_leader`
    pub task_group_leader: u32,
    /// `task_struct.thread_pid`
    pub task_thread_pid: u32,
    /// `pid.level`
    pub pid_level: u32,
    /// `pid.numbers`
    pub pid_numbers: u32,
    /// `sizeof(struct upid)`
    pub upid_size: u32,
    /// `task_struct.stack`, for kernels without `bpf_task_pt_regs` (before Linux 5.15); 0
    /// with [`Self::stack_regs`] 0.
    pub task_stack: u16,
    /// Where a task's saved user registers are, from the base of its kernel stack
    /// (`THREAD_SIZE - sizeof(struct pt_regs)`), where the kernel has no `bpf_task_pt_regs`
    /// (before Linux 5.15); 0: the programs use that helper.
    pub stack_regs: u16,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for KernelConfig {}

/// What the deep KFD programs need to know about this kernel and this `amdgpu` build, from the
/// module's BTF (split on vmlinux's), written into their `KFD_DEEP` global before load
/// (72 bytes). Offsets are in bytes; argument positions are 0-based parameter indices.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KfdDeepConfig {
    /// `sizeof(struct kfd_ioctl_create_queue_args)` in this kernel (88 or 96).
    pub create_args_size: u32,
    /// `process_queue_manager.process`
    pub pqm_process: u32,
    /// `kfd_process.lead_thread`
    pub process_lead_thread: u32,
    /// `task_struct.tgid` (vmlinux)
    pub task_tgid: u32,
    /// `queue_properties.type`
    pub qp_type: u32,
    /// `queue_properties.format`
    pub qp_format: u32,
    /// `queue_properties.queue_id`
    pub qp_queue_id: u32,
    /// `queue_properties.queue_address`
    pub qp_queue_address: u32,
    /// `queue_properties.queue_size`
    pub qp_queue_size: u32,
    /// `queue_properties.priority`
    pub qp_priority: u32,
    /// `queue_properties.queue_percent`
    pub qp_percent: u32,
    /// `queue_properties.doorbell_off`
    pub qp_doorbell_off: u32,
    /// `queue_properties.is_active`
    pub qp_is_active: u32,
    /// `queue_properties.vmid`
    pub qp_vmid: u32,
    /// Position of `q` (the `struct queue *`) among the parameters of the device queue
    /// manager's `create_queue_cpsch` / `create_queue_nocpsch` (1 in 6.1 and 6.12).
    pub dqm_create_q_arg: u32,
    /// `queue.properties`: the driver's own `struct queue_properties` inside its `struct queue`.
    pub queue_properties: u32,
    /// Position of `q` (the `queue_properties`) among `init_mqd`'s parameters.
    pub init_mqd_q_arg: u32,
    /// Non-zero once userspace has filled this in.
    pub ready: u32,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for KfdDeepConfig {}

/// Kernel `dev_t` encoding (`MKDEV`).
pub const fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xfffff)
}

pub const fn kernel_dev_major(dev: u32) -> u32 {
    dev >> 20
}

pub const fn kernel_dev_minor(dev: u32) -> u32 {
    dev & 0xfffff
}

const _: () = assert!(size_of::<RecordHeader>() == 40);
const _: () = assert!(size_of::<NvIoctlRecord>() == 264);
const _: () = assert!(size_of::<TaskRecord>() == 48);
const _: () = assert!(size_of::<KernelConfig>() == 88);
const _: () = assert!(size_of::<TaskCgroupRecord>() == 56);
const _: () = assert!(size_of::<CgroupMatch>() == 16);
const _: () = assert!(size_of::<KfdIoctlRecord>() == 176);
const _: () = assert!(size_of::<KfdQueueRecord>() == 104);
const _: () = assert!(size_of::<DeepRecord>() == 64);
const _: () = assert!(size_of::<NvSchedRecord>() == 96);
const _: () = assert!(size_of::<KfdDeepConfig>() == 72);
const _: () = assert!(core::mem::offset_of!(KfdIoctlRecord, args) == 80);
const _: () = assert!(core::mem::offset_of!(NvIoctlRecord, params) == 80);
