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
pub mod nvidia;

use core::mem::size_of;

/// Type tags (first `u32` of every record).
pub mod record_kind {
    /// [`crate::NvIoctlRecord`]: one completed ioctl on a watched NVIDIA device.
    pub const NV_IOCTL: u32 = 1;
    /// [`crate::TaskRecord`]: the last thread of a process that used a watched device exited.
    pub const PROCESS_EXIT: u32 = 2;
    /// [`crate::TaskRecord`]: a process that used a watched device closed a file descriptor.
    pub const FD_CLOSE: u32 = 3;
    /// [`crate::KfdIoctlRecord`]: one completed ioctl on `/dev/kfd` (AMD KFD).
    pub const KFD_IOCTL: u32 = 4;
}

/// Common header of every ring-buffer record (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// `_IOC_SIZE` of the command as issued: the bytes the driver copies in and out.
    pub arg_size: u32,
    /// [`amd::kfd_flags`] bits.
    pub flags: u32,
    /// Valid bytes in `args` (0, or [`amd::capture_len`]).
    pub args_len: u32,
    pub _pad: u32,
    /// The argument struct, read at syscall exit.
    pub args: [u8; amd::KFD_ARGS_MAX],
}

/// Process exit or fd close by a process that used a watched device (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    pub hdr: RecordHeader,
    /// [`record_kind::FD_CLOSE`]: the closed fd. [`record_kind::PROCESS_EXIT`]: the exit code
    /// (`task->exit_code`, raw), or -1 where it was not read.
    pub value: i32,
    pub _pad: u32,
}

/// Index of each counter in the per-CPU `COUNTERS` array.
pub mod counter {
    /// Ring-buffer reservations that failed: records lost.
    pub const DROPPED: u32 = 0;
    /// User-memory reads that failed (the record is still sent, flagged).
    pub const READ_FAILED: u32 = 1;
    /// Ioctls on watched devices with an escape, class or command this tracer does not decode.
    pub const IGNORED: u32 = 2;
    /// Ioctls on watched devices that were sent to userspace.
    pub const EMITTED: u32 = 3;
    /// Ioctls whose fd could not be resolved to an inode (fd table read failed).
    pub const FD_LOOKUP_FAILED: u32 = 4;
    /// Scheduling requests refused by the `--deny-pid` LSM programs.
    pub const DENIED: u32 = 5;
    pub const COUNT: u32 = 6;
}

/// Kernel structure offsets (from `/sys/kernel/btf/vmlinux`) and filters, written into the
/// programs' `CONFIG` global before load (56 bytes).
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
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for KernelConfig {}

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
const _: () = assert!(size_of::<KernelConfig>() == 56);
const _: () = assert!(size_of::<KfdIoctlRecord>() == 176);
const _: () = assert!(core::mem::offset_of!(KfdIoctlRecord, args) == 80);
const _: () = assert!(core::mem::offset_of!(NvIoctlRecord, params) == 80);
