//! Reads of kernel memory: one field at an offset, and the walk from an fd of the current task
//! to its file and device (offsets from BTF, handed in through `CONFIG`).

use aya_ebpf::helpers::{bpf_probe_read_kernel, generated};
use gpu_trace_common::KernelConfig;

/// The `T` at `base + offset` in kernel memory, through the helper (which fails cleanly).
#[inline(always)]
pub(crate) unsafe fn kread<T>(base: u64, offset: u32) -> Result<T, ()> {
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T).map_err(|_| ()) }
}

/// The `struct file *` behind `fd` in the current task's fd table, and its inode's `i_rdev`
/// (task → files → fdtable → file → inode).
#[inline(always)]
pub(crate) fn fd_file_rdev(cfg: &KernelConfig, fd: u64) -> Result<(u64, u32), ()> {
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
pub(crate) fn file_rdev(cfg: &KernelConfig, file: u64) -> Result<u32, ()> {
    // SAFETY: kernel reads through the helper, which fails cleanly.
    unsafe {
        let inode: u64 = kread(file, cfg.file_inode)?;
        kread(inode, cfg.inode_rdev)
    }
}
