//! One captured NVIDIA ioctl record → a typed RM call. Pure code.
//!
//! The kernel programs copy, at syscall exit, the RM parameter block (NVOS00 free, NVOS21/NVOS64
//! alloc, NVOS54 control) and a fixed prefix of the class/control sub-parameters. So `status`,
//! `hObjectNew` and output parameters (tokens, ids, timeslices) are the driver's results.
//! Layouts: `docs/driver-abi.md` part A (open-gpu-kernel-modules 580.x).

use gpu_trace_common::{
    NvIoctlRecord, nv_flags,
    nvidia::{NVOS00_SIZE, NVOS21_SIZE, NVOS54_SIZE, NVOS64_SIZE, class, cmd, escape},
};
use serde::Serialize;

use crate::event::{Engine, Interleave};

/// RM status codes (`nvstatuscodes.h`) this tracer names.
pub mod status {
    /// Success.
    pub const NV_OK: u32 = 0x0000_0000;
    /// `NV_ERR_INSUFFICIENT_PERMISSIONS`.
    pub const NV_ERR_INSUFFICIENT_PERMISSIONS: u32 = 0x0000_001B;
    /// `NV_ERR_INVALID_ARGUMENT`.
    pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x0000_001F;
    /// `NV_ERR_INVALID_OBJECT_HANDLE`.
    pub const NV_ERR_INVALID_OBJECT_HANDLE: u32 = 0x0000_0033;
    /// `NV_ERR_NOT_SUPPORTED`.
    pub const NV_ERR_NOT_SUPPORTED: u32 = 0x0000_0056;
    /// `NV_ERR_OBJECT_NOT_FOUND`.
    pub const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x0000_0057;
}

/// `NVOS54_PARAMETERS.flags`: the params buffer is FINN-serialized, not the plain struct.
pub const NVOS54_FLAGS_FINN_SERIALIZED: u32 = 0x4;
/// `NVOS64_PARAMETERS.flags`: the alloc params buffer is FINN-serialized.
pub const NVOS64_FLAGS_FINN_SERIALIZED: u32 = 0x1;

/// Driver default timeslice of a new TSG on every non-Tegra chip (µs):
/// `NV_RAMRL_ENTRY_TSG_TIMESLICE_TIMEOUT_128 << SCALE_3`.
pub const DEFAULT_TIMESLICE_US: u64 = 1024;
/// Interleave level `kchangrpapiConstruct_IMPL` gives a new TSG.
pub const DEFAULT_INTERLEAVE: Interleave = Interleave::Medium;

/// Why a record could not be decoded as an RM call at all (the kernel flagged a failed read or a
/// call the driver refuses before RM sees it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MalformedReason {
    /// `NV_ESC_IOCTL_XFER_CMD` wrapper could not be read.
    XferReadFailed,
    /// The XFER size is above `NV_ABSOLUTE_MAX_IOCTL_SIZE`: the driver refused the call.
    XferOversize,
    /// The block size does not match the escape: the driver refused the call.
    BadSize,
    /// The RM parameter block could not be read from user memory.
    ParamsReadFailed,
    /// Fewer block bytes were captured than the escape's layout needs.
    ShortParams,
    /// The escape is not one this decoder knows (the kernel should not send it).
    UnknownEscape,
}

/// Why the class/control sub-parameters of a well-formed call were not decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unreadable {
    /// The kernel's read of the sub-parameters failed (or the pointer was NULL).
    ReadFailed,
    /// The caller's `paramsSize` was smaller than the control's parameters.
    Truncated,
    /// The buffer is FINN-serialized (NVOS54 flag 0x4 / NVOS64 flag 0x1).
    FinnSerialized,
    /// Fewer bytes were captured than the parameters' layout needs.
    Short,
}

/// Decoded class allocation parameters (`pAllocParms`), as user memory held them at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AllocParams {
    /// `KEPLER_CHANNEL_GROUP_A`: `NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS`.
    Tsg {
        /// `hObjectError` @0.
        h_object_error: u32,
        /// `hVASpace` @8.
        h_vaspace: u32,
        /// `engineType` @12 (NV2080_ENGINE_TYPE_*).
        engine_type: u32,
    },
    /// A `*_CHANNEL_GPFIFO_*` class: `NV_CHANNEL_ALLOC_PARAMS` (prefix up to `cid`).
    Channel {
        /// `hObjectError` @0.
        h_object_error: u32,
        /// `gpFifoEntries` @16.
        gpfifo_entries: u32,
        /// `flags` @20 (NVOS04_FLAGS_*).
        flags: u32,
        /// `hContextShare` @24.
        h_context_share: u32,
        /// `hVASpace` @28.
        h_vaspace: u32,
        /// `engineType` @128 (NV2080_ENGINE_TYPE_*).
        engine_type: u32,
        /// `cid` @132 (written by RM: a result at exit).
        cid: u32,
    },
    /// `NV01_DEVICE_0`: `NV0080_ALLOC_PARAMETERS.deviceId` @0.
    Device {
        /// GPU index of the device object.
        device_id: u32,
    },
    /// An RM client (`NV01_ROOT*`): no parameters are captured.
    Client,
    /// A class whose parameters this decoder does not read.
    NotDecoded,
    /// The parameters could not be decoded.
    Unreadable {
        /// Why.
        reason: Unreadable,
    },
}

/// Decoded control parameters (`NVOS54.params`), as user memory held them at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ControlParams {
    /// `NVA06C`/`NVA06F` `GPFIFO_SCHEDULE`.
    Schedule {
        /// `bEnable` @0: enable and add to the runlist (false: disable and remove).
        enable: bool,
        /// `bSkipSubmit` @1: enabled but not scheduled.
        skip_submit: bool,
        /// `bSkipEnable` @2: scheduled but not enabled.
        skip_enable: bool,
    },
    /// `NVA06C` `SET_TIMESLICE` / `GET_TIMESLICE`: `timesliceUs` @0.
    Timeslice {
        /// Timeslice in µs.
        us: u64,
    },
    /// `NVA06C_CTRL_CMD_GET_INFO`: `tsgID` @0 (hardware TSG id).
    TsgInfo {
        /// Hardware TSG id.
        tsg_id: u32,
    },
    /// `NVA06C`/`NVA06F` `SET_INTERLEAVE_LEVEL`: level @0 (0 LOW, 1 MEDIUM, 2 HIGH).
    Interleave {
        /// Raw level.
        level: u32,
    },
    /// `NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN`: `workSubmitToken` @0.
    WorkSubmitToken {
        /// The token.
        token: u32,
    },
    /// `NVA06C_CTRL_CMD_PREEMPT`.
    Preempt {
        /// `bWait` @0.
        wait: bool,
        /// `bManualTimeout` @1.
        manual_timeout: bool,
        /// `timeoutUs` @4.
        timeout_us: u32,
    },
    /// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`: which device instance the GPU `gpuId` is.
    GpuIdInfo {
        /// `gpuId` @0 (in): the GPU's PCI address, RM-encoded.
        gpu_id: u32,
        /// `deviceInstance` @8 (out).
        device_instance: u32,
        /// `subDeviceInstance` @12 (out).
        sub_device_instance: u32,
    },
    /// A command whose parameters this decoder does not read.
    NotDecoded,
    /// The parameters could not be decoded.
    Unreadable {
        /// Why.
        reason: Unreadable,
    },
}

/// One RM call, decoded from an [`NvIoctlRecord`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum RmCall {
    /// `NV_ESC_RM_ALLOC` (NVOS21 or NVOS64).
    Alloc {
        /// `hRoot`: the RM client.
        client: u32,
        /// `hObjectParent`.
        parent: u32,
        /// `hObjectNew` at exit: the new object's handle (RM fills it in when the caller passed 0).
        handle: u32,
        /// `hClass`.
        class: u32,
        /// RM status at exit.
        status: u32,
        /// The 48-byte NVOS64 form was used.
        nvos64: bool,
        /// NVOS64 `flags` has `FINN_SERIALIZED`.
        finn_serialized: bool,
        /// The class parameters.
        params: AllocParams,
    },
    /// `NV_ESC_RM_CONTROL` (NVOS54).
    Control {
        /// `hClient`.
        client: u32,
        /// `hObject`: the object the control is sent to.
        object: u32,
        /// `cmd`.
        cmd: u32,
        /// RM status at exit.
        status: u32,
        /// NVOS54 `flags` has `FINN_SERIALIZED`.
        finn_serialized: bool,
        /// The control parameters.
        params: ControlParams,
    },
    /// `NV_ESC_RM_FREE` (NVOS00).
    Free {
        /// `hRoot`: the RM client.
        client: u32,
        /// `hObjectParent`.
        parent: u32,
        /// `hObjectOld`: the object freed (`== client` frees the client and everything under it).
        object: u32,
        /// RM status at exit.
        status: u32,
    },
    /// The record does not describe a decodable RM call.
    Malformed {
        /// The escape the kernel saw (0 when the XFER wrapper could not be read).
        escape: u32,
        /// Why.
        reason: MalformedReason,
    },
}

impl RmCall {
    /// RM status of a well-formed call.
    pub fn status(&self) -> Option<u32> {
        match self {
            Self::Alloc { status, .. }
            | Self::Control { status, .. }
            | Self::Free { status, .. } => Some(*status),
            Self::Malformed { .. } => None,
        }
    }
}

/// The syscall's negative errno (0 on success). The driver returns 0 for RM failures; a
/// non-zero value means the call failed before or around RM (-EFAULT, -EINVAL, an LSM deny).
pub fn errno(rec: &NvIoctlRecord) -> i32 {
    if rec.ret >= 0 {
        0
    } else {
        i32::try_from(rec.ret).unwrap_or(i32::MIN)
    }
}

/// The call came through `NV_ESC_IOCTL_XFER_CMD`.
pub fn via_xfer(rec: &NvIoctlRecord) -> bool {
    rec.flags & nv_flags::XFER != 0
}

/// The file descriptor the ioctl was issued on.
pub fn fd(rec: &NvIoctlRecord) -> i32 {
    rec.fd
}

/// Did the call succeed: syscall returned 0 and RM returned `NV_OK`.
pub fn succeeded(errno: i32, status: u32) -> bool {
    errno == 0 && status == status::NV_OK
}

/// The little-endian words of the records' byte arrays (the RM parameters, gpu_ext's context).
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | (u64::from(u32_at(b, at + 4)) << 32)
}

/// Decodes one record. Pure: the same record always gives the same call.
pub fn decode(rec: &NvIoctlRecord) -> RmCall {
    let malformed = |reason| RmCall::Malformed {
        escape: rec.escape,
        reason,
    };
    if rec.flags & nv_flags::XFER_READ_FAILED != 0 {
        return malformed(MalformedReason::XferReadFailed);
    }
    if rec.flags & nv_flags::XFER_OVERSIZE != 0 {
        return malformed(MalformedReason::XferOversize);
    }
    if rec.flags & nv_flags::BAD_SIZE != 0 {
        return malformed(MalformedReason::BadSize);
    }
    if rec.flags & nv_flags::PARAMS_READ_FAILED != 0 {
        return malformed(MalformedReason::ParamsReadFailed);
    }
    let need = match rec.escape {
        escape::RM_FREE => NVOS00_SIZE,
        escape::RM_CONTROL => NVOS54_SIZE,
        escape::RM_ALLOC if rec.param_size == NVOS64_SIZE => NVOS64_SIZE,
        escape::RM_ALLOC => NVOS21_SIZE,
        _ => return malformed(MalformedReason::UnknownEscape),
    };
    let params_len = (rec.params_len as usize).min(rec.params.len());
    if params_len < need as usize {
        return malformed(MalformedReason::ShortParams);
    }
    let p = &rec.params[..params_len];
    match rec.escape {
        escape::RM_FREE => RmCall::Free {
            client: u32_at(p, 0),
            parent: u32_at(p, 4),
            object: u32_at(p, 8),
            status: u32_at(p, 12),
        },
        escape::RM_CONTROL => {
            let flags = u32_at(p, 12);
            let finn_serialized = flags & NVOS54_FLAGS_FINN_SERIALIZED != 0;
            let cmd = u32_at(p, 8);
            RmCall::Control {
                client: u32_at(p, 0),
                object: u32_at(p, 4),
                cmd,
                status: u32_at(p, 28),
                finn_serialized,
                params: control_params(rec, cmd, finn_serialized),
            }
        }
        _ => {
            let nvos64 = need == NVOS64_SIZE;
            let (status, finn_serialized) = if nvos64 {
                (
                    u32_at(p, 40),
                    u32_at(p, 36) & NVOS64_FLAGS_FINN_SERIALIZED != 0,
                )
            } else {
                (u32_at(p, 28), false)
            };
            let class = u32_at(p, 12);
            RmCall::Alloc {
                client: u32_at(p, 0),
                parent: u32_at(p, 4),
                handle: u32_at(p, 8),
                class,
                status,
                nvos64,
                finn_serialized,
                params: alloc_params(rec, class, finn_serialized),
            }
        }
    }
}

/// The captured sub-parameter bytes, or why they cannot be used.
fn sub_bytes(rec: &NvIoctlRecord, need: usize, finn: bool) -> Result<&[u8], Unreadable> {
    if finn {
        return Err(Unreadable::FinnSerialized);
    }
    if rec.flags & nv_flags::SUB_READ_FAILED != 0 {
        return Err(Unreadable::ReadFailed);
    }
    if rec.flags & nv_flags::SUB_TRUNCATED != 0 {
        return Err(Unreadable::Truncated);
    }
    let len = (rec.sub_len as usize).min(rec.sub.len());
    if len < need {
        return Err(Unreadable::Short);
    }
    Ok(&rec.sub[..len])
}

fn alloc_params(rec: &NvIoctlRecord, class: u32, finn: bool) -> AllocParams {
    let need = match class {
        class::KEPLER_CHANNEL_GROUP_A => 16,
        class::NV01_DEVICE_0 => 4,
        c if class::is_channel(c) => 136,
        c if class::is_client(c) => return AllocParams::Client,
        _ => return AllocParams::NotDecoded,
    };
    let s = match sub_bytes(rec, need, finn) {
        Ok(s) => s,
        Err(reason) => return AllocParams::Unreadable { reason },
    };
    match class {
        class::KEPLER_CHANNEL_GROUP_A => AllocParams::Tsg {
            h_object_error: u32_at(s, 0),
            h_vaspace: u32_at(s, 8),
            engine_type: u32_at(s, 12),
        },
        class::NV01_DEVICE_0 => AllocParams::Device {
            device_id: u32_at(s, 0),
        },
        _ => AllocParams::Channel {
            h_object_error: u32_at(s, 0),
            gpfifo_entries: u32_at(s, 16),
            flags: u32_at(s, 20),
            h_context_share: u32_at(s, 24),
            h_vaspace: u32_at(s, 28),
            engine_type: u32_at(s, 128),
            cid: u32_at(s, 132),
        },
    }
}

fn control_params(rec: &NvIoctlRecord, command: u32, finn: bool) -> ControlParams {
    // What the kernel copies of each traced control is what is decoded (one table).
    let need = match gpu_trace_common::nvidia::control_capture_len(command) {
        u32::MAX => return ControlParams::NotDecoded,
        n => n as usize,
    };
    let s = match sub_bytes(rec, need, finn) {
        Ok(s) => s,
        Err(reason) => return ControlParams::Unreadable { reason },
    };
    match command {
        cmd::TSG_GPFIFO_SCHEDULE | cmd::CHANNEL_GPFIFO_SCHEDULE => ControlParams::Schedule {
            enable: s[0] != 0,
            skip_submit: s[1] != 0,
            skip_enable: s[2] != 0,
        },
        cmd::TSG_SET_TIMESLICE | cmd::TSG_GET_TIMESLICE => {
            ControlParams::Timeslice { us: u64_at(s, 0) }
        }
        cmd::TSG_PREEMPT => ControlParams::Preempt {
            wait: s[0] != 0,
            manual_timeout: s[1] != 0,
            timeout_us: u32_at(s, 4),
        },
        cmd::TSG_GET_INFO => ControlParams::TsgInfo {
            tsg_id: u32_at(s, 0),
        },
        cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN => ControlParams::WorkSubmitToken {
            token: u32_at(s, 0),
        },
        cmd::GPU_GET_ID_INFO_V2 => ControlParams::GpuIdInfo {
            gpu_id: u32_at(s, 0),
            device_instance: u32_at(s, 8),
            sub_device_instance: u32_at(s, 12),
        },
        _ => ControlParams::Interleave {
            level: u32_at(s, 0),
        },
    }
}

/// `NVA06C_CTRL_INTERLEAVE_LEVEL_*` → [`Interleave`] (`None` for values outside 0..=2).
pub fn interleave_of(level: u32) -> Option<Interleave> {
    match level {
        0 => Some(Interleave::Low),
        1 => Some(Interleave::Medium),
        2 => Some(Interleave::High),
        _ => None,
    }
}

/// NV2080_ENGINE_TYPE_* (the values in alloc parameters; `cl2080_notification.h`) → engine
/// family.
pub fn engine_of(nv2080_engine_type: u32) -> Engine {
    match nv2080_engine_type {
        // GR0..GR7
        0x01..=0x08 => Engine::Graphics,
        // COPY0..9, COPY10..19, COMP_DECOMP_COPY0..19
        0x09..=0x12 | 0x34..=0x3D | 0x40..=0x53 => Engine::Copy,
        // NVDEC0..7
        0x13..=0x1A => Engine::Nvdec,
        // NVENC0..2, NVENC3
        0x1B..=0x1D | 0x3F => Engine::Nvenc,
        // NVJPEG0..7
        0x2B..=0x32 => Engine::Nvjpeg,
        // OFA0, OFA1
        0x33 | 0x3E => Engine::Ofa,
        0x26 => Engine::Sec2,
        _ => Engine::Other,
    }
}

/// A work-submit token split into its fields (`NV_CTRL_VF_DOORBELL_*` /
/// `NV_VIRTUAL_FUNCTION_DOORBELL_*`; same layout from Turing to Blackwell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TokenFields {
    /// Runlist id, bits 22:16.
    pub runlist: u32,
    /// Hardware channel id (doorbell vector), bits 11:0.
    pub chid: u32,
    /// Bit 30 (`_RUNLIST_DOORBELL` ENABLE), set by GB20x.
    pub runlist_doorbell: bool,
}

/// Splits a work-submit token: runlist = bits 22:16, chid = bits 11:0, bit 30 on GB20x.
pub fn split_token(token: u32) -> TokenFields {
    TokenFields {
        runlist: (token >> 16) & 0x7F,
        chid: token & 0xFFF,
        runlist_doorbell: token & (1 << 30) != 0,
    }
}

/// Test helpers: build [`NvIoctlRecord`]s exactly as the kernel programs fill them, NVOS blocks
/// laid out byte by byte at the reference's offsets. The one set of record builders: the unit
/// tests here and in the model use it, and `gpu-trace`'s integration tests through the
/// `testing` feature (a dev-dependency; never in a build of the tool).
#[cfg(any(test, feature = "testing"))]
pub mod testrec {
    use gpu_trace_common::{
        NV_PARAMS_MAX, NV_SUB_MAX, NvIoctlRecord, RecordHeader, kernel_dev, nv_flags,
        nvidia::{self, NV_CTL_MINOR, NV_MAJOR, escape},
        record_kind,
    };

    fn put32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn put64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// A user-space pointer value for `pAllocParms` / `params` (only its presence matters).
    const USER_PTR: u64 = 0x7fff_dead_0000;

    /// What the kernel program would capture for one ioctl.
    pub struct Rec {
        /// The record; adjust fields (flags, ret, ...) before use.
        pub rec: NvIoctlRecord,
    }

    /// A record header as the kernel writes it (`comm` cut to 15 bytes and NUL-terminated).
    pub fn header(kind: u32, ts_ns: u64, pid: u32, tid: u32, comm: &str) -> RecordHeader {
        let mut c = [0u8; 16];
        let n = comm.len().min(15);
        c[..n].copy_from_slice(&comm.as_bytes()[..n]);
        RecordHeader {
            kind,
            cpu: 0,
            ts_ns,
            tgid: pid,
            tid,
            comm: c,
        }
    }

    /// The record of an ioctl `ioctl_cmd` on `/dev/nvidiactl` (fd 3) with parameter block
    /// `block` (its bytes at exit) and captured sub-parameters `sub` (`None`: not captured), the
    /// syscall returning `ret`: any block, as it came (the builders below lay out the NVOS ones).
    pub fn raw(
        hdr: RecordHeader,
        ioctl_cmd: u32,
        block: &[u8],
        sub: Option<&[u8]>,
        ret: i64,
    ) -> NvIoctlRecord {
        let mut r = base(
            hdr.tgid,
            3,
            ioctl_cmd,
            ioctl_cmd & 0xff,
            nvidia::ioctl_size(ioctl_cmd),
        );
        r.hdr = hdr;
        r.ret = ret;
        r.params[..block.len()].copy_from_slice(block);
        r.params_len = block.len() as u32;
        if let Some(s) = sub {
            r.sub[..s.len()].copy_from_slice(s);
            r.sub_len = s.len() as u32;
        }
        r
    }

    fn base(pid: u32, fd: i32, ioctl_cmd: u32, esc: u32, size: u32) -> NvIoctlRecord {
        NvIoctlRecord {
            hdr: header(record_kind::NV_IOCTL, 1, pid, pid, "cuda"),
            ret: 0,
            fd,
            ioctl_cmd,
            rdev: kernel_dev(NV_MAJOR, NV_CTL_MINOR),
            escape: esc,
            param_size: size,
            flags: 0,
            params_len: size.min(NV_PARAMS_MAX as u32),
            sub_len: 0,
            params: [0; NV_PARAMS_MAX],
            sub: [0; NV_SUB_MAX],
        }
    }

    /// Copies `sub` as the kernel does: `capture` bytes (the per-class/command length) if the
    /// caller's parameters are at least that long.
    fn fill_sub(r: &mut NvIoctlRecord, capture: u32, sub: &[u8]) {
        if capture == 0 || capture == u32::MAX {
            return;
        }
        let n = capture as usize;
        r.sub[..n.min(sub.len())].copy_from_slice(&sub[..n.min(sub.len())]);
        r.sub_len = capture;
    }

    /// `NV_ESC_RM_ALLOC` with an NVOS64 block (48 bytes, cmd 0xC030462B) or NVOS21 (32 bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn alloc(
        pid: u32,
        fd: i32,
        nvos64: bool,
        client: u32,
        parent: u32,
        handle: u32,
        class: u32,
        status: u32,
        sub: &[u8],
    ) -> Rec {
        let (size, ioctl) = if nvos64 {
            (48, 0xC030_462B)
        } else {
            (32, 0xC020_462B)
        };
        let mut r = base(pid, fd, ioctl, escape::RM_ALLOC, size);
        let p = &mut r.params;
        put32(p, 0, client); // hRoot
        put32(p, 4, parent); // hObjectParent
        put32(p, 8, handle); // hObjectNew (result at exit)
        put32(p, 12, class); // hClass
        put64(p, 16, USER_PTR); // pAllocParms
        if nvos64 {
            put64(p, 24, 0); // pRightsRequested
            put32(p, 32, 0); // paramsSize (CUDA passes 0)
            put32(p, 36, 0); // flags
            put32(p, 40, status); // status
        } else {
            put32(p, 24, 0); // paramsSize
            put32(p, 28, status); // status
        }
        fill_sub(&mut r, nvidia::alloc_capture_len(class), sub);
        Rec { rec: r }
    }

    /// `NV_ESC_RM_CONTROL` with an NVOS54 block (32 bytes, cmd 0xC020462A).
    pub fn control(
        pid: u32,
        fd: i32,
        client: u32,
        object: u32,
        command: u32,
        status: u32,
        sub: &[u8],
    ) -> Rec {
        let mut r = base(pid, fd, 0xC020_462A, escape::RM_CONTROL, 32);
        let p = &mut r.params;
        put32(p, 0, client); // hClient
        put32(p, 4, object); // hObject
        put32(p, 8, command); // cmd
        put32(p, 12, 0); // flags
        put64(p, 16, USER_PTR); // params
        put32(p, 24, sub.len() as u32); // paramsSize
        put32(p, 28, status); // status
        let want = nvidia::control_capture_len(command);
        if want != u32::MAX && (sub.len() as u32) < want {
            r.flags |= nv_flags::SUB_TRUNCATED;
        } else {
            fill_sub(&mut r, want, sub);
        }
        Rec { rec: r }
    }

    /// `NV_ESC_RM_FREE` with an NVOS00 block (16 bytes, cmd 0xC0104629).
    pub fn free(pid: u32, fd: i32, client: u32, parent: u32, object: u32, status: u32) -> Rec {
        let mut r = base(pid, fd, 0xC010_4629, escape::RM_FREE, 16);
        let p = &mut r.params;
        put32(p, 0, client); // hRoot
        put32(p, 4, parent); // hObjectParent
        put32(p, 8, object); // hObjectOld
        put32(p, 12, status); // status
        Rec { rec: r }
    }

    /// `NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS` (20 bytes).
    pub fn tsg_params(engine_type: u32, h_vaspace: u32) -> Vec<u8> {
        let mut b = vec![0u8; 20];
        put32(&mut b, 0, 0xE000_0001); // hObjectError
        put32(&mut b, 4, 0); // hObjectEccError
        put32(&mut b, 8, h_vaspace); // hVASpace
        put32(&mut b, 12, engine_type); // engineType
        b
    }

    /// `NV_CHANNEL_ALLOC_PARAMS` (368 bytes; the kernel copies the first 136).
    pub fn channel_params(engine_type: u32, flags: u32, cid: u32) -> Vec<u8> {
        let mut b = vec![0u8; 368];
        put32(&mut b, 0, 0xE000_0002); // hObjectError
        put64(&mut b, 8, 0x1_0000_0000); // gpFifoOffset
        put32(&mut b, 16, 1024); // gpFifoEntries
        put32(&mut b, 20, flags); // flags
        put32(&mut b, 24, 0xCC00_0001); // hContextShare
        put32(&mut b, 28, 0); // hVASpace
        put32(&mut b, 128, engine_type); // engineType
        put32(&mut b, 132, cid); // cid
        b
    }

    /// `NV0080_ALLOC_PARAMETERS` (prefix: deviceId @0).
    pub fn device_params(device_id: u32) -> Vec<u8> {
        let mut b = vec![0u8; 56];
        put32(&mut b, 0, device_id);
        b
    }

    /// `GPFIFO_SCHEDULE` params (3 bytes).
    pub fn schedule_params(enable: bool, skip_submit: bool, skip_enable: bool) -> Vec<u8> {
        vec![enable as u8, skip_submit as u8, skip_enable as u8]
    }

    /// A 4-byte `NvU32` parameter block.
    pub fn u32_params(v: u32) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }

    /// An 8-byte `NvU64` parameter block.
    pub fn u64_params(v: u64) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::testrec::*;
    use super::*;
    use gpu_trace_common::nvidia::cmd;

    const CLIENT: u32 = 0xC1D0_0001;
    const DEVICE: u32 = 0xCAF0_0001;
    const TSG: u32 = 0xCAF0_0010;

    #[test]
    fn decodes_nvos64_tsg_alloc() {
        let r = alloc(
            10,
            5,
            true,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0,
            &tsg_params(0x1, 0xBEEF),
        );
        assert_eq!(
            decode(&r.rec),
            RmCall::Alloc {
                client: CLIENT,
                parent: DEVICE,
                handle: TSG,
                class: 0xA06C,
                status: 0,
                nvos64: true,
                finn_serialized: false,
                params: AllocParams::Tsg {
                    h_object_error: 0xE000_0001,
                    h_vaspace: 0xBEEF,
                    engine_type: 1
                },
            }
        );
    }

    #[test]
    fn nvos21_status_is_at_28_and_nvos64_at_40() {
        let r21 = alloc(
            10,
            5,
            false,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0x1B,
            &tsg_params(0x9, 0),
        );
        let RmCall::Alloc {
            status,
            nvos64,
            params,
            ..
        } = decode(&r21.rec)
        else {
            panic!()
        };
        assert_eq!((status, nvos64), (0x1B, false));
        assert!(matches!(
            params,
            AllocParams::Tsg {
                engine_type: 0x9,
                ..
            }
        ));
        let r64 = alloc(
            10,
            5,
            true,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0x57,
            &tsg_params(0x9, 0),
        );
        assert_eq!(decode(&r64.rec).status(), Some(0x57));
    }

    #[test]
    fn decodes_channel_and_device_and_client_allocs() {
        let ch = alloc(
            1,
            5,
            true,
            CLIENT,
            TSG,
            0xCAF0_0020,
            0xC86F,
            0,
            &channel_params(0x1, 0x40, 77),
        );
        let RmCall::Alloc { params, .. } = decode(&ch.rec) else {
            panic!()
        };
        assert_eq!(
            params,
            AllocParams::Channel {
                h_object_error: 0xE000_0002,
                gpfifo_entries: 1024,
                flags: 0x40,
                h_context_share: 0xCC00_0001,
                h_vaspace: 0,
                engine_type: 1,
                cid: 77,
            }
        );
        let dev = alloc(
            1,
            5,
            true,
            CLIENT,
            CLIENT,
            DEVICE,
            0x80,
            0,
            &device_params(3),
        );
        let RmCall::Alloc { params, .. } = decode(&dev.rec) else {
            panic!()
        };
        assert_eq!(params, AllocParams::Device { device_id: 3 });
        let cl = alloc(1, 5, true, 0, 0, CLIENT, 0x41, 0, &[]);
        let RmCall::Alloc { params, handle, .. } = decode(&cl.rec) else {
            panic!()
        };
        assert_eq!((params, handle), (AllocParams::Client, CLIENT));
    }

    #[test]
    fn finn_serialized_alloc_is_not_decoded() {
        let mut r = alloc(
            1,
            5,
            true,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0,
            &tsg_params(1, 0),
        );
        r.rec.params[36] = 0x1; // NVOS64 flags: FINN_SERIALIZED
        let RmCall::Alloc {
            finn_serialized,
            params,
            ..
        } = decode(&r.rec)
        else {
            panic!()
        };
        assert!(finn_serialized);
        assert_eq!(
            params,
            AllocParams::Unreadable {
                reason: Unreadable::FinnSerialized
            }
        );
        // NVOS21 has no flags word: offset 36 is outside the block and means nothing.
        let mut r = alloc(
            1,
            5,
            false,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0,
            &tsg_params(1, 0),
        );
        r.rec.params[36] = 0x1;
        let RmCall::Alloc {
            finn_serialized, ..
        } = decode(&r.rec)
        else {
            panic!()
        };
        assert!(!finn_serialized);
    }

    #[test]
    fn finn_serialized_control_is_not_decoded() {
        let mut r = control(
            1,
            5,
            CLIENT,
            TSG,
            cmd::TSG_GPFIFO_SCHEDULE,
            0,
            &schedule_params(true, false, false),
        );
        r.rec.params[12] = 0x4; // NVOS54 flags: FINN_SERIALIZED
        let RmCall::Control {
            finn_serialized,
            params,
            ..
        } = decode(&r.rec)
        else {
            panic!()
        };
        assert!(finn_serialized);
        assert_eq!(
            params,
            ControlParams::Unreadable {
                reason: Unreadable::FinnSerialized
            }
        );
        // Other flag bits (IRQL_RAISED 0x1, LOCK_BYPASS 0x2) do not stop decoding.
        r.rec.params[12] = 0x3;
        let RmCall::Control { params, .. } = decode(&r.rec) else {
            panic!()
        };
        assert!(matches!(
            params,
            ControlParams::Schedule { enable: true, .. }
        ));
    }

    #[test]
    fn decodes_controls() {
        let cases: Vec<(u32, Vec<u8>, ControlParams)> = vec![
            (
                cmd::TSG_GPFIFO_SCHEDULE,
                schedule_params(true, false, true),
                ControlParams::Schedule {
                    enable: true,
                    skip_submit: false,
                    skip_enable: true,
                },
            ),
            (
                cmd::CHANNEL_GPFIFO_SCHEDULE,
                schedule_params(false, true, false),
                ControlParams::Schedule {
                    enable: false,
                    skip_submit: true,
                    skip_enable: false,
                },
            ),
            (
                cmd::TSG_SET_TIMESLICE,
                u64_params(2048),
                ControlParams::Timeslice { us: 2048 },
            ),
            (
                cmd::TSG_GET_TIMESLICE,
                u64_params(0x1_0000_0400),
                ControlParams::Timeslice { us: 0x1_0000_0400 },
            ),
            (
                cmd::TSG_GET_INFO,
                u32_params(0x2A),
                ControlParams::TsgInfo { tsg_id: 0x2A },
            ),
            (
                cmd::TSG_SET_INTERLEAVE_LEVEL,
                u32_params(2),
                ControlParams::Interleave { level: 2 },
            ),
            (
                cmd::CHANNEL_SET_INTERLEAVE_LEVEL,
                u32_params(0),
                ControlParams::Interleave { level: 0 },
            ),
            (
                cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                u32_params(0x0003_0005),
                ControlParams::WorkSubmitToken { token: 0x0003_0005 },
            ),
            (
                cmd::TSG_PREEMPT,
                vec![1, 0, 0, 0, 0x10, 0x27, 0, 0],
                ControlParams::Preempt {
                    wait: true,
                    manual_timeout: false,
                    timeout_us: 10000,
                },
            ),
        ];
        for (command, sub, want) in cases {
            let r = control(9, 4, CLIENT, TSG, command, 0, &sub);
            assert_eq!(
                decode(&r.rec),
                RmCall::Control {
                    client: CLIENT,
                    object: TSG,
                    cmd: command,
                    status: 0,
                    finn_serialized: false,
                    params: want,
                },
                "cmd {command:#x}"
            );
        }
    }

    #[test]
    fn unknown_control_and_class_are_not_decoded() {
        let r = control(1, 4, CLIENT, TSG, 0x2080_0101, 0, &[1, 2, 3, 4]);
        let RmCall::Control { params, .. } = decode(&r.rec) else {
            panic!()
        };
        assert_eq!(params, ControlParams::NotDecoded);
        let r = alloc(1, 4, true, CLIENT, DEVICE, 0x1234, 0x2080, 0, &[]);
        let RmCall::Alloc { params, .. } = decode(&r.rec) else {
            panic!()
        };
        assert_eq!(params, AllocParams::NotDecoded);
    }

    #[test]
    fn sub_read_problems_are_reported() {
        let mut r = control(
            1,
            4,
            CLIENT,
            TSG,
            cmd::TSG_GPFIFO_SCHEDULE,
            0,
            &schedule_params(true, false, false),
        );
        r.rec.flags |= nv_flags::SUB_READ_FAILED;
        r.rec.sub_len = 0;
        let RmCall::Control { params, .. } = decode(&r.rec) else {
            panic!()
        };
        assert_eq!(
            params,
            ControlParams::Unreadable {
                reason: Unreadable::ReadFailed
            }
        );
        // paramsSize smaller than the struct: the kernel flags it and copies nothing.
        let r = control(1, 4, CLIENT, TSG, cmd::TSG_SET_TIMESLICE, 0, &[0, 8, 0, 0]);
        assert_ne!(r.rec.flags & nv_flags::SUB_TRUNCATED, 0);
        let RmCall::Control { params, .. } = decode(&r.rec) else {
            panic!()
        };
        assert_eq!(
            params,
            ControlParams::Unreadable {
                reason: Unreadable::Truncated
            }
        );
        // Fewer captured bytes than the layout needs.
        let mut r = alloc(
            1,
            4,
            true,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0,
            &tsg_params(1, 0),
        );
        r.rec.sub_len = 12;
        let RmCall::Alloc { params, .. } = decode(&r.rec) else {
            panic!()
        };
        assert_eq!(
            params,
            AllocParams::Unreadable {
                reason: Unreadable::Short
            }
        );
    }

    #[test]
    fn decodes_free() {
        let r = free(3, 4, CLIENT, DEVICE, TSG, 0x33);
        assert_eq!(
            decode(&r.rec),
            RmCall::Free {
                client: CLIENT,
                parent: DEVICE,
                object: TSG,
                status: 0x33
            }
        );
    }

    #[test]
    fn flags_make_records_malformed() {
        let cases = [
            (
                nv_flags::XFER | nv_flags::XFER_READ_FAILED,
                MalformedReason::XferReadFailed,
            ),
            (
                nv_flags::XFER | nv_flags::XFER_OVERSIZE,
                MalformedReason::XferOversize,
            ),
            (nv_flags::BAD_SIZE, MalformedReason::BadSize),
            (
                nv_flags::PARAMS_READ_FAILED,
                MalformedReason::ParamsReadFailed,
            ),
        ];
        for (flags, reason) in cases {
            let mut r = free(3, 4, CLIENT, DEVICE, TSG, 0);
            r.rec.flags = flags;
            assert_eq!(
                decode(&r.rec),
                RmCall::Malformed {
                    escape: 0x29,
                    reason
                },
                "{flags:#x}"
            );
        }
        let mut r = control(3, 4, CLIENT, TSG, cmd::TSG_GET_INFO, 0, &u32_params(1));
        r.rec.params_len = 16;
        assert_eq!(
            decode(&r.rec),
            RmCall::Malformed {
                escape: 0x2A,
                reason: MalformedReason::ShortParams
            }
        );
        let mut r = free(3, 4, CLIENT, DEVICE, TSG, 0);
        r.rec.escape = 0x4A;
        assert_eq!(
            decode(&r.rec),
            RmCall::Malformed {
                escape: 0x4A,
                reason: MalformedReason::UnknownEscape
            }
        );
    }

    #[test]
    fn xfer_calls_decode_like_direct_ones() {
        let direct = control(3, 4, CLIENT, TSG, cmd::TSG_GET_INFO, 0, &u32_params(7));
        let mut xfer = control(3, 4, CLIENT, TSG, cmd::TSG_GET_INFO, 0, &u32_params(7));
        xfer.rec.ioctl_cmd = 0xC010_46D3;
        xfer.rec.flags |= nv_flags::XFER;
        assert!(via_xfer(&xfer.rec));
        assert!(!via_xfer(&direct.rec));
        assert_eq!(decode(&xfer.rec), decode(&direct.rec));
    }

    #[test]
    fn errno_and_fd() {
        let mut r = free(3, 11, CLIENT, DEVICE, TSG, 0);
        assert_eq!((errno(&r.rec), fd(&r.rec)), (0, 11));
        r.rec.ret = -1; // -EPERM
        assert_eq!(errno(&r.rec), -1);
        r.rec.ret = -14; // -EFAULT
        assert_eq!(errno(&r.rec), -14);
        r.rec.ret = 5;
        assert_eq!(errno(&r.rec), 0);
        assert!(succeeded(0, status::NV_OK));
        assert!(!succeeded(-1, status::NV_OK));
        assert!(!succeeded(0, status::NV_ERR_INSUFFICIENT_PERMISSIONS));
    }

    #[test]
    fn engine_families() {
        let cases = [
            (0x00, Engine::Other),
            (0x01, Engine::Graphics),
            (0x08, Engine::Graphics),
            (0x09, Engine::Copy),
            (0x12, Engine::Copy),
            (0x13, Engine::Nvdec),
            (0x1A, Engine::Nvdec),
            (0x1B, Engine::Nvenc),
            (0x1D, Engine::Nvenc),
            (0x1E, Engine::Other),
            (0x23, Engine::Other),
            (0x26, Engine::Sec2),
            (0x2B, Engine::Nvjpeg),
            (0x32, Engine::Nvjpeg),
            (0x33, Engine::Ofa),
            (0x34, Engine::Copy),
            (0x3D, Engine::Copy),
            (0x3E, Engine::Ofa),
            (0x3F, Engine::Nvenc),
            (0x40, Engine::Copy),
            (0x53, Engine::Copy),
            (0x54, Engine::Other),
            (0xFFFF_FFFF, Engine::Other),
        ];
        for (v, e) in cases {
            assert_eq!(engine_of(v), e, "{v:#x}");
        }
    }

    #[test]
    fn token_split() {
        assert_eq!(
            split_token(0x0003_0005),
            TokenFields {
                runlist: 3,
                chid: 5,
                runlist_doorbell: false
            }
        );
        // Bits outside the fields (15:12, 29:23) are ignored; bit 30 is GB20x's flag.
        assert_eq!(
            split_token(0x407F_FFFF),
            TokenFields {
                runlist: 0x7F,
                chid: 0xFFF,
                runlist_doorbell: true
            }
        );
        assert_eq!(
            split_token(0x0080_F000),
            TokenFields {
                runlist: 0,
                chid: 0,
                runlist_doorbell: false
            }
        );
    }

    #[test]
    fn interleave_levels() {
        assert_eq!(interleave_of(0), Some(Interleave::Low));
        assert_eq!(interleave_of(1), Some(Interleave::Medium));
        assert_eq!(interleave_of(2), Some(Interleave::High));
        assert_eq!(interleave_of(3), None);
    }

    /// `GET_ID_INFO_V2` decoded from the driver's real answers (the two-H200 host's recording
    /// `h200x2_gpu_ids/each.gtrace`), against what an LD_PRELOAD shim in the same workload logged of
    /// the same answers (`each.ids`, written by `examples/rm_ids_shim.c`, not by gpu-trace): a
    /// wrong field offset (gpuFlags at 4, gpuInstance at 24, …) or a swapped field gives other
    /// values for at least one of the answers.
    #[test]
    fn gpu_id_info_v2_decodes_as_the_shim_saw_the_real_answers() {
        use crate::{record::RecordReader, wire};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../gpu-trace/tests/fixtures/h200x2_gpu_ids");
        let field = |line: &str, key: &str| -> u32 {
            let v = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("{key} in {line}"));
            match v.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
                None => v.parse().unwrap(),
            }
        };
        let mut expected: Vec<(u32, u32, u32, u32)> = std::fs::read_to_string(dir.join("each.ids"))
            .unwrap()
            .lines()
            .filter(|l| l.contains(" GET_ID_INFO_V2 "))
            .map(|l| {
                (
                    field(l, "pid="),
                    field(l, "gpuId="),
                    field(l, "deviceInstance="),
                    field(l, "subDeviceInstance="),
                )
            })
            .collect();
        let file = std::fs::File::open(dir.join("each.gtrace")).unwrap();
        let mut reader = RecordReader::new(std::io::BufReader::new(file)).unwrap();
        let mut decoded = Vec::new();
        while let Some(bytes) = reader.next_record().unwrap() {
            let Ok(wire::RawRecord::NvIoctl(r)) = wire::parse_record(&bytes) else {
                continue;
            };
            if let RmCall::Control {
                params:
                    ControlParams::GpuIdInfo {
                        gpu_id,
                        device_instance,
                        sub_device_instance,
                    },
                ..
            } = decode(&r)
            {
                decoded.push((r.hdr.tgid, gpu_id, device_instance, sub_device_instance));
            }
        }
        // Both GPUs answered, under distinct device instances.
        let gpus: std::collections::BTreeSet<_> =
            expected.iter().map(|e| (e.1, e.2, e.3)).collect();
        assert_eq!(gpus.len(), 2, "{expected:?}");
        // The shim ran in one process: its answers exactly; the other processes' (not
        // shimmed) answers name the same GPUs the same way.
        let shimmed: std::collections::BTreeSet<u32> = expected.iter().map(|e| e.0).collect();
        let (mut mine, others): (Vec<_>, Vec<_>) =
            decoded.into_iter().partition(|d| shimmed.contains(&d.0));
        expected.sort_unstable();
        mine.sort_unstable();
        assert_eq!(mine, expected);
        for d in others {
            assert!(gpus.contains(&(d.1, d.2, d.3)), "{d:?} against {gpus:?}");
        }
    }
}
