//! gpu-trace's kernel programs.
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
//! classic `syscalls:sys_{enter,exit}_{ioctl,close}` tracepoints; `raw_tp/sched_process_exit`.
//! Userspace picks what the kernel allows. Deep hooks on the AMD KFD driver's own functions are
//! in `kfd_deep.rs`. No `bpf_printk`, no writes to user memory.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user,
        generated,
    },
    macros::{btf_tracepoint, map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use gpu_trace_common::{
    KernelConfig, KfdIoctlRecord, NV_PARAMS_MAX, NvIoctlRecord, RecordHeader, TaskRecord,
    amd::{self, kfd_flags},
    counter, hook_source, kernel_dev_major, nv_flags,
    nvidia::{self, escape, off},
    record_kind, switch,
};

mod cgroup;
mod deny;
mod kfd_deep;
mod nv_deep;
mod nv_entry;

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

/// Records to userspace. Userspace sets the size (`--ring-size`).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Per-CPU counters, indexed by `gpu_trace_common::counter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Run-time switches (`gpu_trace_common::switch`): what the driver hooks serve (`kfd_deep.rs`,
/// `nv_entry.rs`), which the syscall layer leaves alone, so that no call is reported twice.
#[map]
static SWITCHES: Array<u32> = Array::with_max_entries(switch::COUNT, 0);

/// The value of switch `index` (0 when unset).
#[inline(always)]
fn switch_value(index: u32) -> u32 {
    SWITCHES.get(index).copied().unwrap_or(0)
}

/// Whether the NVIDIA driver's entry points serve `bit` (`nv_entry_bits`).
#[inline(always)]
fn nv_entry_serves(bit: u32) -> bool {
    switch_value(switch::NV_ENTRY) & bit != 0
}

/// Whether a deep hook on the driver's handler reports KFD command `nr` instead of this layer.
#[inline(always)]
fn kfd_served_by_deep_hook(nr: u32) -> bool {
    nr < 32 && (switch_value(switch::KFD_DEEP) >> nr) & 1 != 0
}

/// Processes that issued at least one traced ioctl (tgid → [`TRACK_NV`] | [`TRACK_KFD`]): their
/// exit is reported, and, for NVIDIA users, their `close()` calls.
#[map]
static TRACKED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// [`TRACKED`] bit: the process used an NVIDIA device (RM objects die with their fd: report
/// `close()`).
const TRACK_NV: u32 = 1;
/// [`TRACKED`] bit: the process used `/dev/kfd` (KFD queues live as long as the process's
/// address space, not its fd: only the exit is reported).
const TRACK_KFD: u32 = 2;

/// Classic-tracepoint fallback only: the ioctl arguments seen at entry, by thread id.
#[map]
static PENDING_IOCTL: HashMap<u32, IoctlArgs> = HashMap::with_max_entries(16384, 0);

/// Classic-tracepoint fallback only: the fd of a pending `close()`, by thread id.
#[map]
static PENDING_CLOSE: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct IoctlArgs {
    fd: u64,
    cmd: u64,
    arg: u64,
}

// Syscall register layout at exit (`struct pt_regs`), per architecture.
#[cfg(bpf_target_arch = "x86_64")]
mod regs {
    pub const NR: usize = 120; // orig_ax
    pub const ARG0: usize = 112; // di
    pub const ARG1: usize = 104; // si
    pub const ARG2: usize = 96; // dx
    pub const CS: usize = 136; // cs: 0x33 for 64-bit callers
    pub const USER64_CS: u64 = 0x33;
    pub const SYS_IOCTL: u64 = 16;
    pub const SYS_CLOSE: u64 = 3;
}

#[cfg(bpf_target_arch = "aarch64")]
mod regs {
    pub const NR: usize = 280; // syscallno (s32; the next 4 bytes are another field)
    pub const ARG0: usize = 272; // orig_x0 (x0 holds the return value at exit)
    pub const ARG1: usize = 8; // x1
    pub const ARG2: usize = 16; // x2
    pub const PSTATE: usize = 264; // pstate: PSR_MODE32_BIT for 32-bit (AArch32) callers
    pub const PSR_MODE32_BIT: u64 = 0x10;
    pub const SYS_IOCTL: u64 = 29;
    pub const SYS_CLOSE: u64 = 57;
}

#[inline(always)]
fn config() -> KernelConfig {
    // SAFETY: a plain read of our own global; volatile so that the compiler keeps the load
    // (userspace rewrites the value in the object before load).
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

#[inline(always)]
fn bump(index: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot of this CPU; programs on one CPU do not run concurrently.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn header(kind: u32) -> RecordHeader {
    let pid_tgid = bpf_get_current_pid_tgid();
    RecordHeader {
        kind,
        // SAFETY: helpers without arguments.
        cpu: unsafe { generated::bpf_get_smp_processor_id() },
        ts_ns: unsafe { generated::bpf_ktime_get_ns() },
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        comm: bpf_get_current_comm().unwrap_or([0u8; 16]),
    }
}

#[inline(always)]
unsafe fn kread<T>(base: u64, offset: u32) -> Result<T, ()> {
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T).map_err(|_| ()) }
}

/// The `struct file *` behind `fd` in the current task's fd table, and its inode's `i_rdev`.
#[inline(always)]
fn fd_file_rdev(cfg: &KernelConfig, fd: u64) -> Result<(u64, u32), ()> {
    // SAFETY: every dereference goes through bpf_probe_read_kernel, which fails cleanly.
    unsafe {
        let task = generated::bpf_get_current_task();
        let files: u64 = kread(task, cfg.task_files)?;
        let fdt: u64 = kread(files, cfg.files_fdt)?;
        let max_fds: u32 = kread(fdt, cfg.fdt_max_fds)?;
        if fd >= max_fds as u64 {
            return Err(());
        }
        let fd_array: u64 = kread(fdt, cfg.fdt_fd)?;
        let file: u64 = bpf_probe_read_kernel((fd_array + fd * 8) as *const u64).map_err(|_| ())?;
        if file == 0 {
            return Err(());
        }
        Ok((file, file_rdev(cfg, file)?))
    }
}

/// `i_rdev` of the inode of `file` (a `struct file *`).
#[inline(always)]
fn file_rdev(cfg: &KernelConfig, file: u64) -> Result<u32, ()> {
    // SAFETY: kernel reads through the helper, which fails cleanly.
    unsafe {
        let inode: u64 = kread(file, cfg.file_inode)?;
        kread(inode, cfg.inode_rdev)
    }
}

#[inline(always)]
fn is_watched(cfg: &KernelConfig, rdev: u32) -> bool {
    (cfg.nv_major != 0 && kernel_dev_major(rdev) == cfg.nv_major)
        || (cfg.extra_rdev != 0 && rdev == cfg.extra_rdev)
}

/// `/dev/kfd` (dynamic major; 0 in `CONFIG` means KFD is not traced), or the test device.
#[inline(always)]
fn is_kfd(cfg: &KernelConfig, rdev: u32) -> bool {
    (cfg.kfd_major != 0 && kernel_dev_major(rdev) == cfg.kfd_major)
        || (cfg.extra_kfd_rdev != 0 && rdev == cfg.extra_kfd_rdev)
}

/// Sets `bit` in the process's [`TRACKED`] entry.
#[inline(always)]
fn mark_tracked(tgid: u32, bit: u32) {
    // SAFETY: map value pointer, read once.
    let old = match TRACKED.get_ptr(tgid) {
        Some(p) => unsafe { *p },
        None => 0,
    };
    if old & bit == 0 {
        let _ = TRACKED.insert(tgid, old | bit, 0);
    }
}

/// Whether the process used an NVIDIA device (its `close()` calls are reported).
#[inline(always)]
fn tracked_nv(tgid: u32) -> bool {
    // SAFETY: map value pointer, read once.
    TRACKED
        .get_ptr(tgid)
        .is_some_and(|p| unsafe { *p } & TRACK_NV != 0)
}

#[inline(always)]
fn u32_at(buf: &[u8; NV_PARAMS_MAX], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

#[inline(always)]
fn u64_at(buf: &[u8; NV_PARAMS_MAX], at: usize) -> u64 {
    (u32_at(buf, at) as u64) | ((u32_at(buf, at + 4) as u64) << 32)
}

/// Copies `len` bytes (one of the sizes `gpu_trace_common::nvidia` uses) from user memory.
/// Each arm passes a constant length, as the verifier wants.
#[inline(always)]
unsafe fn read_user_prefix(dst: *mut u8, src: u64, len: u32) -> bool {
    let src = src as *const core::ffi::c_void;
    let dst = dst as *mut core::ffi::c_void;
    // SAFETY: `dst` points into a reserved ring-buffer record with room for NV_SUB_MAX bytes.
    let rc = unsafe {
        match len {
            3 => generated::bpf_probe_read_user(dst, 3, src),
            4 => generated::bpf_probe_read_user(dst, 4, src),
            8 => generated::bpf_probe_read_user(dst, 8, src),
            20 => generated::bpf_probe_read_user(dst, 20, src),
            32 => generated::bpf_probe_read_user(dst, 32, src),
            136 => generated::bpf_probe_read_user(dst, 136, src),
            _ => return false,
        }
    };
    rc == 0
}

/// The shared ioctl path: filters, reads, emits. `ret` is the syscall's return value.
#[inline(always)]
fn handle_ioctl(fd: u64, ioctl_cmd: u64, arg: u64, ret: i64) {
    let cfg = config();
    if cfg.ready == 0 {
        return;
    }
    let ioctl_cmd = ioctl_cmd as u32;
    // NVIDIA and KFD candidates are disjoint (RM escape numbers vs 'K' and KFD numbers).
    let kfd = amd::ioctl_is_candidate(ioctl_cmd);
    if !kfd && !nvidia::ioctl_nr_is_candidate(ioctl_cmd) {
        return;
    }
    if kfd && kfd_served_by_deep_hook(amd::ioctl_nr(ioctl_cmd)) {
        return;
    }
    if !kfd && nv_entry_serves(nv_entry::IOCTL) {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if cfg.filter_tgid != 0 && cfg.filter_tgid != tgid {
        return;
    }
    if !cgroup::wanted(&cfg) {
        return;
    }
    let (file, rdev) = match fd_file_rdev(&cfg, fd) {
        Ok(found) => found,
        Err(()) => {
            bump(counter::FD_LOOKUP_FAILED);
            return;
        }
    };
    if kfd {
        if is_kfd(&cfg, rdev) {
            handle_kfd_ioctl(fd, ioctl_cmd, arg, ret, rdev, tgid);
        }
        return;
    }
    if !is_watched(&cfg, rdev) {
        return;
    }
    handle_nv_ioctl(fd as i32, ioctl_cmd, arg, ret, rdev, tgid, file);
}

/// An RM escape on an NVIDIA device (`rdev`, through `file`), seen by the syscall layer or at
/// the driver's ioctl entry point: reads the parameter block and what it points to, emits.
#[inline(always)]
fn handle_nv_ioctl(fd: i32, ioctl_cmd: u32, arg: u64, ret: i64, rdev: u32, tgid: u32, file: u64) {
    let mut flags = 0u32;
    let mut esc = ioctl_cmd & 0xff;
    let mut size = nvidia::ioctl_size(ioctl_cmd);
    let mut block = arg;
    if esc == escape::IOCTL_XFER_CMD {
        flags |= nv_flags::XFER;
        // nv_ioctl_xfer_t { u32 cmd; u32 size; u64 ptr; }
        // SAFETY: user-memory read through the helper.
        match unsafe { bpf_probe_read_user(arg as *const [u32; 4]) } {
            Ok(x) => {
                esc = x[0] & 0xff;
                size = x[1];
                block = (x[2] as u64) | ((x[3] as u64) << 32);
                if size > nvidia::NV_MAX_IOCTL_SIZE {
                    flags |= nv_flags::XFER_OVERSIZE;
                }
            }
            Err(_) => {
                flags |= nv_flags::XFER_READ_FAILED;
                esc = 0;
            }
        }
    }

    // How much of the block to read for this escape; anything else is not ours.
    let params_len: u32 = match esc {
        escape::RM_FREE => nvidia::NVOS00_SIZE,
        escape::RM_CONTROL => nvidia::NVOS54_SIZE,
        escape::RM_ALLOC if size == nvidia::NVOS64_SIZE => nvidia::NVOS64_SIZE,
        escape::RM_ALLOC => nvidia::NVOS21_SIZE,
        _ => 0,
    };
    if params_len != 0 && size != params_len {
        flags |= nv_flags::BAD_SIZE;
    }

    let mut params = [0u8; NV_PARAMS_MAX];
    let mut sub_src = 0u64;
    let mut sub_len = 0u32;
    if params_len != 0 && flags & (nv_flags::BAD_SIZE | nv_flags::XFER_OVERSIZE) == 0 {
        // SAFETY: user-memory reads through the helper, constant sizes.
        let ok = unsafe {
            let dst = params.as_mut_ptr() as *mut core::ffi::c_void;
            let src = block as *const core::ffi::c_void;
            match params_len {
                16 => generated::bpf_probe_read_user(dst, 16, src) == 0,
                32 => generated::bpf_probe_read_user(dst, 32, src) == 0,
                _ => generated::bpf_probe_read_user(dst, 48, src) == 0,
            }
        };
        if !ok {
            flags |= nv_flags::PARAMS_READ_FAILED;
        } else {
            match esc {
                escape::RM_ALLOC => {
                    let class = u32_at(&params, off::ALLOC_CLASS);
                    if !nvidia::alloc_is_traced(class) {
                        bump(counter::IGNORED);
                        return;
                    }
                    sub_len = nvidia::alloc_capture_len(class);
                    sub_src = u64_at(&params, off::ALLOC_PARAMS_PTR);
                }
                escape::RM_CONTROL => {
                    let cmd = u32_at(&params, off::CONTROL_CMD);
                    let want = nvidia::control_capture_len(cmd);
                    if want == u32::MAX {
                        bump(counter::IGNORED);
                        return;
                    }
                    sub_src = u64_at(&params, off::CONTROL_PARAMS_PTR);
                    if u32_at(&params, off::CONTROL_PARAMS_SIZE) < want {
                        flags |= nv_flags::SUB_TRUNCATED;
                    } else {
                        sub_len = want;
                    }
                }
                _ => {}
            }
        }
    } else if params_len == 0 && flags & nv_flags::XFER_READ_FAILED == 0 {
        // An escape we do not decode (version checks, memory mapping, ...).
        bump(counter::IGNORED);
        return;
    }

    cgroup::note(tgid);
    let Some(mut entry) = EVENTS.reserve::<NvIoctlRecord>(0) else {
        bump(counter::DROPPED);
        return;
    };
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` points at a reserved, exclusively owned record of the right size; every
    // field is written before submit.
    unsafe {
        (*rec).hdr = header(record_kind::NV_IOCTL);
        (*rec).ret = ret;
        (*rec).fd = fd;
        (*rec).ioctl_cmd = ioctl_cmd;
        (*rec).rdev = rdev;
        (*rec).escape = esc;
        (*rec).param_size = size;
        (*rec).params = params;
        (*rec).params_len = if flags & nv_flags::PARAMS_READ_FAILED == 0 {
            params_len
        } else {
            0
        };
        (*rec).sub = [0u8; gpu_trace_common::NV_SUB_MAX];
        (*rec).sub_len = 0;
        if sub_len != 0 {
            if sub_src != 0 && read_user_prefix((*rec).sub.as_mut_ptr(), sub_src, sub_len) {
                (*rec).sub_len = sub_len;
            } else {
                flags |= nv_flags::SUB_READ_FAILED;
            }
        }
        (*rec).flags = flags;
    }
    entry.submit(0);
    if flags
        & (nv_flags::XFER_READ_FAILED | nv_flags::PARAMS_READ_FAILED | nv_flags::SUB_READ_FAILED)
        != 0
    {
        bump(counter::READ_FAILED);
    }
    bump(counter::EMITTED);
    mark_tracked(tgid, TRACK_NV);
    if nv_entry_serves(nv_entry::RELEASE) {
        nv_entry::note_file(file, tgid, fd);
    }
}

/// Copies `len` bytes of KFD arguments (one of the sizes of `amd::capture_len`) from user
/// memory (`from_kernel` false: the syscall layer) or from the driver's own copy (`from_kernel`
/// true: the deep hooks on the handlers). Each arm passes a constant length, as the verifier
/// wants.
#[inline(always)]
unsafe fn read_kfd_args(dst: *mut u8, src: u64, len: u32, from_kernel: bool) -> bool {
    let src = src as *const core::ffi::c_void;
    let dst = dst as *mut core::ffi::c_void;
    let read = |n: u32| {
        // SAFETY: `dst` points into a reserved ring-buffer record with room for KFD_ARGS_MAX
        // bytes, and `n` is at most that.
        unsafe {
            if from_kernel {
                generated::bpf_probe_read_kernel(dst, n, src)
            } else {
                generated::bpf_probe_read_user(dst, n, src)
            }
        }
    };
    let rc = match len {
        96 => read(96),
        88 => read(88),
        24 => read(24),
        16 => read(16),
        8 => read(8),
        _ => return false,
    };
    rc == 0
}

/// What a KFD record says about the call besides its arguments.
#[derive(Clone, Copy)]
struct KfdCallHead {
    fd: i32,
    ioctl_cmd: u32,
    rdev: u32,
    nr: u32,
    /// The size the arguments have for whoever copied them (see `KfdIoctlRecord::arg_size`).
    arg_size: u32,
    ret: i64,
    /// `hook_source`: the syscall layer reads user memory, the deep hooks the driver's copy.
    source: u32,
}

/// Emits a [`KfdIoctlRecord`] with `capture_len` bytes of the arguments at `args`.
#[inline(always)]
fn emit_kfd(head: KfdCallHead, args: u64, tgid: u32) {
    let len = amd::capture_len(head.nr, head.arg_size);
    cgroup::note(tgid);
    let Some(mut entry) = EVENTS.reserve::<KfdIoctlRecord>(0) else {
        bump(counter::DROPPED);
        return;
    };
    let rec = entry.as_mut_ptr();
    let mut flags = 0u32;
    // SAFETY: `rec` points at a reserved, exclusively owned record of the right size; every
    // field is written before submit.
    unsafe {
        (*rec).hdr = header(record_kind::KFD_IOCTL);
        (*rec).ret = head.ret;
        (*rec).fd = head.fd;
        (*rec).ioctl_cmd = head.ioctl_cmd;
        (*rec).rdev = head.rdev;
        (*rec).nr = head.nr;
        (*rec).arg_size = head.arg_size;
        (*rec).source = head.source;
        (*rec).args = [0u8; amd::KFD_ARGS_MAX];
        (*rec).args_len = 0;
        let from_kernel = head.source != hook_source::SYSCALL;
        if len == 0 {
            flags |= kfd_flags::ARGS_SHORT;
        } else if read_kfd_args((*rec).args.as_mut_ptr(), args, len, from_kernel) {
            (*rec).args_len = len;
        } else {
            flags |= kfd_flags::ARGS_READ_FAILED;
        }
        (*rec).flags = flags;
    }
    entry.submit(0);
    if flags & kfd_flags::ARGS_READ_FAILED != 0 {
        bump(counter::READ_FAILED);
    }
    bump(counter::EMITTED);
    mark_tracked(tgid, TRACK_KFD);
}

/// A traced KFD command (`CREATE_QUEUE`, `DESTROY_QUEUE`, `UPDATE_QUEUE`, `SET_CU_MASK`) on
/// `/dev/kfd`: copy its argument struct as user memory holds it at exit (the driver has copied
/// its results back by then: `queue_id`, `doorbell_offset`, the clamped `ring_size`).
#[inline(always)]
fn handle_kfd_ioctl(fd: u64, ioctl_cmd: u32, arg: u64, ret: i64, rdev: u32, tgid: u32) {
    let head = KfdCallHead {
        fd: fd as i32,
        ioctl_cmd,
        rdev,
        nr: amd::ioctl_nr(ioctl_cmd),
        arg_size: amd::ioctl_size(ioctl_cmd),
        ret,
        source: hook_source::SYSCALL,
    };
    emit_kfd(head, arg, tgid);
}

/// `close(fd)` returned 0 in a tracked process.
#[inline(always)]
fn handle_close(fd: u64, ret: i64) {
    if ret != 0 {
        return;
    }
    if nv_entry_serves(nv_entry::RELEASE) {
        // The driver's release handler reports the file's last close instead.
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !tracked_nv(tgid) {
        return;
    }
    emit_task(record_kind::FD_CLOSE, fd as i32);
}

#[inline(always)]
fn emit_task(kind: u32, value: i32) {
    send(&TaskRecord {
        hdr: header(kind),
        value,
        _pad: 0,
    });
}

/// Sends a record built on the stack, counted like every other record: `emitted + dropped` is
/// what the programs tried to send.
#[inline(always)]
fn send<T>(rec: &T) {
    if EVENTS.output::<T>(rec, 0).is_err() {
        bump(counter::DROPPED);
    } else {
        bump(counter::EMITTED);
    }
}

/// Shared body of the `sys_exit` programs: `regs` is the syscall's `struct pt_regs *`.
#[inline(always)]
fn on_sys_exit(regs: u64, ret: i64) {
    // One helper call for every syscall: the registers from dx to cs (pt_regs 96..144) in a
    // single 48-byte read, instead of a read per register (docs/performance.md, part 3).
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: kernel read through the helper.
        let Ok(r) = (unsafe { kread::<[u64; 6]>(regs, regs::ARG2 as u32) }) else {
            return;
        };
        // r: dx, si, di, orig_ax, ip, cs
        dispatch(r[3], r[5], r[2], r[1], r[0], ret);
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        // SAFETY: kernel reads through the helper.
        let Ok(nr) = (unsafe { kread::<u32>(regs, regs::NR as u32) }) else {
            return;
        };
        let nr = u64::from(nr);
        if nr != regs::SYS_IOCTL && nr != regs::SYS_CLOSE {
            return;
        }
        let read = |off: usize| unsafe { kread::<u64>(regs, off as u32) };
        // 32-bit (AArch32) callers use another syscall table: their numbers mean other calls.
        #[cfg(bpf_target_arch = "aarch64")]
        if !read(regs::PSTATE).is_ok_and(|p| p & regs::PSR_MODE32_BIT == 0) {
            return;
        }
        let (Ok(fd), Ok(cmd), Ok(arg)) = (read(regs::ARG0), read(regs::ARG1), read(regs::ARG2))
        else {
            return;
        };
        dispatch(nr, 0, fd, cmd, arg, ret);
    }
}

/// What both `sys_exit` programs do once they have the registers: `close()` and candidate
/// `ioctl()`s from 64-bit callers go on; everything else stops here.
#[inline(always)]
fn dispatch(nr: u64, cs: u64, fd: u64, cmd: u64, arg: u64, ret: i64) {
    if nr != regs::SYS_IOCTL && nr != regs::SYS_CLOSE {
        return;
    }
    // 32-bit callers use another syscall table: their numbers mean other calls.
    #[cfg(bpf_target_arch = "x86_64")]
    if cs != regs::USER64_CS {
        return;
    }
    let _ = cs;
    if nr == regs::SYS_CLOSE {
        handle_close(fd, ret);
        return;
    }
    if !nvidia::ioctl_nr_is_candidate(cmd as u32) && !amd::ioctl_is_candidate(cmd as u32) {
        return;
    }
    handle_ioctl(fd, cmd, arg, ret);
}

/// Raw tracepoint `sys_exit` (args: `struct pt_regs *regs, long ret`): registers read with a
/// helper. Used where BTF-typed tracepoints are refused.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit_raw(ctx: RawTracePointContext) -> i32 {
    let regs: u64 = ctx.arg(0);
    let ret: i64 = ctx.arg(1);
    on_sys_exit(regs, ret);
    0
}

/// Preferred hook: BTF-typed tracepoint `sys_exit`. Its first argument is a typed
/// `struct pt_regs *`, so the registers are plain loads the verifier checks (no helper call):
/// the cheapest program on the cheapest attach type (docs/performance.md, part 3).
#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit_btf(ctx: BtfTracePointContext) -> i32 {
    let ret: i64 = ctx.arg(1);
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let regs: *const u64 = ctx.arg(0);
        // SAFETY: loads from the BTF-typed pt_regs the kernel passes; the verifier checks each
        // offset against struct pt_regs.
        let load = |off: usize| unsafe { core::ptr::read_volatile(regs.add(off / 8)) };
        let nr = load(regs::NR);
        if nr != regs::SYS_IOCTL && nr != regs::SYS_CLOSE {
            return 0;
        }
        dispatch(
            nr,
            load(regs::CS),
            load(regs::ARG0),
            load(regs::ARG1),
            load(regs::ARG2),
            ret,
        );
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    on_sys_exit(ctx.arg(0), ret);
    0
}

// Classic `syscalls:*` tracepoints (fallback). Record layout: 8 bytes of common fields,
// `int __syscall_nr` at 8, then the arguments (or `long ret`) as 8-byte slots from 16.
const TP_ARG0: usize = 16;

#[tracepoint]
pub fn tp_ioctl_enter(ctx: TracePointContext) -> u32 {
    // SAFETY: reads within the tracepoint record.
    let read = |at: usize| unsafe { ctx.read_at::<u64>(at) };
    let (Ok(fd), Ok(cmd), Ok(arg)) = (read(TP_ARG0), read(TP_ARG0 + 8), read(TP_ARG0 + 16)) else {
        return 0;
    };
    if !nvidia::ioctl_nr_is_candidate(cmd as u32) && !amd::ioctl_is_candidate(cmd as u32) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = PENDING_IOCTL.insert(tid, IoctlArgs { fd, cmd, arg }, 0);
    0
}

#[tracepoint]
pub fn tp_ioctl_exit(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(args) = PENDING_IOCTL.get_ptr(tid) else {
        return 0;
    };
    // SAFETY: map value pointer valid until removal; copied out first.
    let args = unsafe { *args };
    let _ = PENDING_IOCTL.remove(tid);
    let Ok(ret) = (unsafe { ctx.read_at::<i64>(TP_ARG0) }) else {
        return 0;
    };
    handle_ioctl(args.fd, args.cmd, args.arg, ret);
    0
}

#[tracepoint]
pub fn tp_close_enter(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !tracked_nv(tgid) {
        return 0;
    }
    let Ok(fd) = (unsafe { ctx.read_at::<u64>(TP_ARG0) }) else {
        return 0;
    };
    let _ = PENDING_CLOSE.insert(bpf_get_current_pid_tgid() as u32, fd as u32, 0);
    0
}

#[tracepoint]
pub fn tp_close_exit(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(fd) = PENDING_CLOSE.get_ptr(tid) else {
        return 0;
    };
    // SAFETY: as above.
    let fd = unsafe { *fd };
    let _ = PENDING_CLOSE.remove(tid);
    let Ok(ret) = (unsafe { ctx.read_at::<i64>(TP_ARG0) }) else {
        return 0;
    };
    handle_close(fd as u64, ret);
    0
}

/// A thread exits; when it is the last one of a tracked process, report the process's end
/// (its fds, and with them the driver's objects, are released).
#[inline(always)]
fn on_process_exit() {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Read the stored values (non-zero flags), not the pointers: LLVM would otherwise combine the
    // two null checks into an OR of pointers, which the verifier refuses.
    // SAFETY: plain map lookups; the values are copied out.
    let tracked = unsafe { TRACKED.get(tgid) }.copied().unwrap_or(0) != 0;
    let denied = unsafe { deny::DENY.get(tgid) }.copied().unwrap_or(0) != 0;
    if !tracked && !denied {
        return;
    }
    let cfg = config();
    // SAFETY: kernel reads through the helper.
    let live: Result<i32, ()> = unsafe {
        let task = generated::bpf_get_current_task();
        match kread::<u64>(task, cfg.task_signal) {
            Ok(signal) => kread::<i32>(signal, cfg.signal_live),
            Err(()) => Err(()),
        }
    };
    // do_exit() decrements `signal->live` before this tracepoint fires: 0 means the whole
    // thread group is gone (checked by the kernel test `process_exit_fires_once`).
    if let Ok(0) = live {
        if denied {
            // The pid may be reused by an unrelated process: its denial ends here.
            let _ = deny::DENY.remove(tgid);
        }
        if tracked {
            let _ = TRACKED.remove(tgid);
            cgroup::forget(tgid);
            emit_task(record_kind::PROCESS_EXIT, -1);
        }
    }
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit_raw(_ctx: RawTracePointContext) -> i32 {
    on_process_exit();
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit_btf(_ctx: BtfTracePointContext) -> i32 {
    on_process_exit();
    0
}

#[tracepoint]
pub fn tp_process_exit(_ctx: TracePointContext) -> u32 {
    on_process_exit();
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
