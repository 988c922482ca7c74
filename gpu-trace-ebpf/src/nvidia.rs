//! What an RM escape on an NVIDIA device becomes, whichever hook saw it (the syscall layer,
//! `syscall.rs`, or the driver's ioctl entry point, `probes/nv_ioctl.rs`): the parameter block
//! and, for the classes and controls that describe scheduling, a fixed-size prefix of what it
//! points to, read from user memory as it is at exit (results included), straight into an
//! `NvIoctlRecord`.

use aya_ebpf::helpers::{bpf_get_current_comm, bpf_probe_read_user, generated};
use gpu_trace_common::{
    NV_PARAMS_MAX, NV_SUB_MAX, NvIoctlRecord, counter, nv_entry_bits, nv_flags,
    nvidia::{self, escape, off},
    record_kind,
};

use crate::{
    api_tag::api_tag,
    cgroup,
    config::nv_entry_serves,
    maps::{self, NV_FILES, NvFile, TRACK_NV},
    pipe::{bump, header, reserve, submit},
};

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

/// The escape an ioctl makes, `IOCTL_XFER` unwrapped: its number, the size of its parameter
/// block, the block's address, and the `nv_flags` found on the way.
struct Escape {
    flags: u32,
    esc: u32,
    size: u32,
    block: u64,
}

#[inline(always)]
fn unwrap_xfer(ioctl_cmd: u32, arg: u64) -> Escape {
    let mut e = Escape {
        flags: 0,
        esc: ioctl_cmd & 0xff,
        size: nvidia::ioctl_size(ioctl_cmd),
        block: arg,
    };
    if e.esc == escape::IOCTL_XFER_CMD {
        e.flags |= nv_flags::XFER;
        // nv_ioctl_xfer_t { u32 cmd; u32 size; u64 ptr; }
        // SAFETY: user-memory read through the helper.
        match unsafe { bpf_probe_read_user(arg as *const [u32; 4]) } {
            Ok(x) => {
                e.esc = x[0] & 0xff;
                e.size = x[1];
                e.block = (x[2] as u64) | ((x[3] as u64) << 32);
                if e.size > nvidia::NV_MAX_IOCTL_SIZE {
                    e.flags |= nv_flags::XFER_OVERSIZE;
                }
            }
            Err(_) => {
                e.flags |= nv_flags::XFER_READ_FAILED;
                e.esc = 0;
            }
        }
    }
    e
}

/// Where the prefix of an escape's parameters is, and how much of it to read.
struct Sub {
    params_len: u32,
    src: u64,
    len: u32,
}

/// Reads the parameter block of `e` into `params` and finds the prefix to capture; `None` for
/// an escape, a class or a control that is not traced (counted as ignored).
#[inline(always)]
fn capture(e: &mut Escape, params: &mut [u8; NV_PARAMS_MAX]) -> Option<Sub> {
    // How much of the block to read for this escape; anything else is not ours.
    let params_len: u32 = match e.esc {
        escape::RM_FREE => nvidia::NVOS00_SIZE,
        escape::RM_CONTROL => nvidia::NVOS54_SIZE,
        escape::RM_ALLOC if e.size == nvidia::NVOS64_SIZE => nvidia::NVOS64_SIZE,
        escape::RM_ALLOC => nvidia::NVOS21_SIZE,
        _ => 0,
    };
    if params_len != 0 && e.size != params_len {
        e.flags |= nv_flags::BAD_SIZE;
    }
    let mut sub = Sub {
        params_len,
        src: 0,
        len: 0,
    };
    if params_len != 0 && e.flags & (nv_flags::BAD_SIZE | nv_flags::XFER_OVERSIZE) == 0 {
        // SAFETY: user-memory reads through the helper, constant sizes.
        let ok = unsafe {
            let dst = params.as_mut_ptr() as *mut core::ffi::c_void;
            let src = e.block as *const core::ffi::c_void;
            match params_len {
                16 => generated::bpf_probe_read_user(dst, 16, src) == 0,
                32 => generated::bpf_probe_read_user(dst, 32, src) == 0,
                _ => generated::bpf_probe_read_user(dst, 48, src) == 0,
            }
        };
        if !ok {
            e.flags |= nv_flags::PARAMS_READ_FAILED;
        } else {
            match e.esc {
                escape::RM_ALLOC => {
                    let class = u32_at(params, off::ALLOC_CLASS);
                    if !nvidia::alloc_is_traced(class) {
                        bump(counter::IGNORED);
                        return None;
                    }
                    sub.len = nvidia::alloc_capture_len(class);
                    sub.src = u64_at(params, off::ALLOC_PARAMS_PTR);
                }
                escape::RM_CONTROL => {
                    let cmd = u32_at(params, off::CONTROL_CMD);
                    let want = nvidia::control_capture_len(cmd);
                    if want == u32::MAX {
                        bump(counter::IGNORED);
                        return None;
                    }
                    sub.src = u64_at(params, off::CONTROL_PARAMS_PTR);
                    if u32_at(params, off::CONTROL_PARAMS_SIZE) < want {
                        e.flags |= nv_flags::SUB_TRUNCATED;
                    } else {
                        sub.len = want;
                    }
                }
                _ => {}
            }
        }
    } else if params_len == 0 && e.flags & nv_flags::XFER_READ_FAILED == 0 {
        // An escape we do not decode (version checks, memory mapping, ...).
        bump(counter::IGNORED);
        return None;
    }
    Some(sub)
}

/// An RM escape on an NVIDIA device (`rdev`, through `file`), seen by the syscall layer or at
/// the driver's ioctl entry point: reads the parameter block and what it points to, emits.
#[inline(always)]
pub(crate) fn handle_nv_ioctl(
    fd: i32,
    ioctl_cmd: u32,
    arg: u64,
    ret: i64,
    rdev: u32,
    tgid: u32,
    file: u64,
) {
    let mut e = unwrap_xfer(ioctl_cmd, arg);
    let mut params = [0u8; NV_PARAMS_MAX];
    let Some(sub) = capture(&mut e, &mut params) else {
        return;
    };
    let mut flags = e.flags;
    cgroup::note(tgid);
    let hdr = header(record_kind::NV_IOCTL);
    api_tag(&hdr);
    let Some(mut entry) = reserve::<NvIoctlRecord>() else {
        return;
    };
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` points at a reserved, exclusively owned record of the right size; every
    // field is written before submit.
    unsafe {
        (*rec).hdr = hdr;
        (*rec).ret = ret;
        (*rec).fd = fd;
        (*rec).ioctl_cmd = ioctl_cmd;
        (*rec).rdev = rdev;
        (*rec).escape = e.esc;
        (*rec).param_size = e.size;
        (*rec).params = params;
        (*rec).params_len = if flags & nv_flags::PARAMS_READ_FAILED == 0 {
            sub.params_len
        } else {
            0
        };
        (*rec).sub = [0u8; NV_SUB_MAX];
        (*rec).sub_len = 0;
        if sub.len != 0 {
            if sub.src != 0 && read_user_prefix((*rec).sub.as_mut_ptr(), sub.src, sub.len) {
                (*rec).sub_len = sub.len;
            } else {
                flags |= nv_flags::SUB_READ_FAILED;
            }
        }
        (*rec).flags = flags;
    }
    submit(
        entry,
        flags
            & (nv_flags::XFER_READ_FAILED
                | nv_flags::PARAMS_READ_FAILED
                | nv_flags::SUB_READ_FAILED)
            != 0,
    );
    maps::mark_tracked(tgid, TRACK_NV);
    if nv_entry_serves(nv_entry_bits::RELEASE) {
        note_file(file, tgid, fd);
    }
}

/// Remembers the first (process, fd) a traced call used `file` through, for the release handler
/// (`probes/nv_close.rs`) when it is hooked.
#[inline(always)]
fn note_file(file: u64, tgid: u32, fd: i32) {
    if NV_FILES.get_ptr(&file).is_some() {
        return;
    }
    let comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
    let _ = NV_FILES.insert(&file, &NvFile { tgid, fd, comm }, 0);
}
