//! NVIDIA RM ioctl ABI facts that both sides need (open-gpu-kernel-modules 580.x; see
//! `docs/driver-abi.md` for the sources), and the rules that decide what the kernel
//! programs copy. Pure `const fn`s so that the kernel and userspace agree by construction.

/// Character major of `/dev/nvidia*` and `/dev/nvidiactl`.
pub const NV_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NV_CTL_MINOR: u32 = 255;

/// RM escapes (`_IOC_NR` of the ioctl command).
pub mod escape {
    pub const RM_FREE: u32 = 0x29;
    pub const RM_CONTROL: u32 = 0x2A;
    pub const RM_ALLOC: u32 = 0x2B;
    pub const IOCTL_XFER_CMD: u32 = 0xD3;
}

/// Parameter block sizes.
pub const NVOS00_SIZE: u32 = 16;
pub const NVOS21_SIZE: u32 = 32;
pub const NVOS54_SIZE: u32 = 32;
pub const NVOS64_SIZE: u32 = 48;
pub const NV_XFER_SIZE: u32 = 16;
/// `NV_ABSOLUTE_MAX_IOCTL_SIZE`: the driver refuses larger XFER sizes.
pub const NV_MAX_IOCTL_SIZE: u32 = 16384;

/// Offsets inside the parameter blocks.
pub mod off {
    /// NVOS21/NVOS64: `hClass`.
    pub const ALLOC_CLASS: usize = 12;
    /// NVOS21/NVOS64: `pAllocParms`.
    pub const ALLOC_PARAMS_PTR: usize = 16;
    /// NVOS21: `paramsSize`.
    pub const NVOS21_PARAMS_SIZE: usize = 24;
    /// NVOS64: `paramsSize`.
    pub const NVOS64_PARAMS_SIZE: usize = 32;
    /// NVOS54: `cmd`.
    pub const CONTROL_CMD: usize = 8;
    /// NVOS54: `flags`.
    pub const CONTROL_FLAGS: usize = 12;
    /// NVOS54: `params`.
    pub const CONTROL_PARAMS_PTR: usize = 16;
    /// NVOS54: `paramsSize`.
    pub const CONTROL_PARAMS_SIZE: usize = 24;
}

/// RM classes this tracer decodes.
pub mod class {
    pub const NV01_ROOT: u32 = 0x0000;
    pub const NV01_ROOT_NON_PRIV: u32 = 0x0001;
    pub const NV01_ROOT_CLIENT: u32 = 0x0041;
    pub const NV01_DEVICE_0: u32 = 0x0080;
    pub const KEPLER_CHANNEL_GROUP_A: u32 = 0xA06C;
    pub const KEPLER_CHANNEL_GPFIFO_A: u32 = 0xA06F;
    pub const KEPLER_CHANNEL_GPFIFO_B: u32 = 0xA16F;
    pub const KEPLER_CHANNEL_GPFIFO_C: u32 = 0xA26F;
    pub const MAXWELL_CHANNEL_GPFIFO_A: u32 = 0xB06F;
    pub const PASCAL_CHANNEL_GPFIFO_A: u32 = 0xC06F;
    pub const VOLTA_CHANNEL_GPFIFO_A: u32 = 0xC36F;
    pub const TURING_CHANNEL_GPFIFO_A: u32 = 0xC46F;
    pub const AMPERE_CHANNEL_GPFIFO_A: u32 = 0xC56F;
    pub const HOPPER_CHANNEL_GPFIFO_A: u32 = 0xC86F;
    pub const BLACKWELL_CHANNEL_GPFIFO_A: u32 = 0xC96F;
    pub const BLACKWELL_CHANNEL_GPFIFO_B: u32 = 0xCA6F;

    /// Every GPFIFO channel class of the 580 driver.
    pub const fn is_channel(class: u32) -> bool {
        matches!(
            class,
            KEPLER_CHANNEL_GPFIFO_A
                | KEPLER_CHANNEL_GPFIFO_B
                | KEPLER_CHANNEL_GPFIFO_C
                | MAXWELL_CHANNEL_GPFIFO_A
                | PASCAL_CHANNEL_GPFIFO_A
                | VOLTA_CHANNEL_GPFIFO_A
                | TURING_CHANNEL_GPFIFO_A
                | AMPERE_CHANNEL_GPFIFO_A
                | HOPPER_CHANNEL_GPFIFO_A
                | BLACKWELL_CHANNEL_GPFIFO_A
                | BLACKWELL_CHANNEL_GPFIFO_B
        )
    }

    pub const fn is_client(class: u32) -> bool {
        matches!(class, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT)
    }
}

/// RM control commands this tracer decodes.
pub mod cmd {
    /// TSG: `NVA06C_CTRL_CMD_GPFIFO_SCHEDULE` {bEnable, bSkipSubmit, bSkipEnable}.
    pub const TSG_GPFIFO_SCHEDULE: u32 = 0xA06C_0101;
    /// TSG: `NVA06C_CTRL_CMD_SET_TIMESLICE` {NvU64 timesliceUs}.
    pub const TSG_SET_TIMESLICE: u32 = 0xA06C_0103;
    /// TSG: `NVA06C_CTRL_CMD_GET_TIMESLICE` {NvU64 timesliceUs}.
    pub const TSG_GET_TIMESLICE: u32 = 0xA06C_0104;
    /// TSG: `NVA06C_CTRL_CMD_PREEMPT` {bWait, bManualTimeout, timeoutUs}.
    pub const TSG_PREEMPT: u32 = 0xA06C_0105;
    /// TSG: `NVA06C_CTRL_CMD_GET_INFO` {NvU32 tsgID}.
    pub const TSG_GET_INFO: u32 = 0xA06C_0106;
    /// TSG: `NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL` {NvU32 tsgInterleaveLevel}.
    pub const TSG_SET_INTERLEAVE_LEVEL: u32 = 0xA06C_0107;
    /// Channel: `NVA06F_CTRL_CMD_GPFIFO_SCHEDULE` {bEnable, bSkipSubmit, bSkipEnable}.
    pub const CHANNEL_GPFIFO_SCHEDULE: u32 = 0xA06F_0103;
    /// Channel: `NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL` {NvU32 channelInterleaveLevel}.
    pub const CHANNEL_SET_INTERLEAVE_LEVEL: u32 = 0xA06F_0109;
    /// Channel: `NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN` {NvU32 workSubmitToken}.
    pub const CHANNEL_GET_WORK_SUBMIT_TOKEN: u32 = 0xC36F_0108;
    /// Root client: `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` {gpuId, gpuFlags, deviceInstance,
    /// subDeviceInstance, sliStatus, boardId, gpuInstance, numaId}: which RM device instance a
    /// GPU (`gpuId`, its PCI address) is. CUDA asks it for each GPU it uses.
    pub const GPU_GET_ID_INFO_V2: u32 = 0x0000_0205;
}

/// How many bytes of a class's alloc parameters the kernel copies (0: none).
/// Only a fixed set of sizes is used so that each read has a constant length.
pub const fn alloc_capture_len(class: u32) -> u32 {
    match class {
        // NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS (sizeof 20)
        class::KEPLER_CHANNEL_GROUP_A => 20,
        // NV0080_ALLOC_PARAMETERS: deviceId @0
        class::NV01_DEVICE_0 => 4,
        c if class::is_client(c) => 0,
        // NV_CHANNEL_ALLOC_PARAMS up to and including `cid` (@132)
        c if class::is_channel(c) => 136,
        _ => u32::MAX,
    }
}

/// Whether an RM_ALLOC of this class is sent to userspace.
pub const fn alloc_is_traced(class: u32) -> bool {
    alloc_capture_len(class) != u32::MAX
}

/// How many bytes of a control's parameters the kernel copies, or `u32::MAX` when the control is
/// not traced.
pub const fn control_capture_len(cmd: u32) -> u32 {
    match cmd {
        cmd::TSG_GPFIFO_SCHEDULE | cmd::CHANNEL_GPFIFO_SCHEDULE => 3,
        cmd::TSG_SET_TIMESLICE | cmd::TSG_GET_TIMESLICE | cmd::TSG_PREEMPT => 8,
        cmd::TSG_GET_INFO
        | cmd::TSG_SET_INTERLEAVE_LEVEL
        | cmd::CHANNEL_SET_INTERLEAVE_LEVEL
        | cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN => 4,
        cmd::GPU_GET_ID_INFO_V2 => 32,
        _ => u32::MAX,
    }
}

/// The first filter the kernel applies, on the raw ioctl command: one of the RM escapes that
/// matter, or XFER. (The driver ignores `_IOC_TYPE` and `_IOC_DIR`, so they are not checked.)
pub const fn ioctl_nr_is_candidate(ioctl_cmd: u32) -> bool {
    matches!(
        ioctl_cmd & 0xff,
        escape::RM_FREE | escape::RM_CONTROL | escape::RM_ALLOC | escape::IOCTL_XFER_CMD
    )
}

/// `_IOC_SIZE` of an ioctl command.
pub const fn ioctl_size(ioctl_cmd: u32) -> u32 {
    (ioctl_cmd >> 16) & 0x3fff
}

/// `NVOS54_PARAMETERS.flags` bit `NVOS54_FLAGS_FINN_SERIALIZED` (`src/common/sdk/nvidia/inc/
/// nvos.h`): `params` points at a FINN-serialized buffer, not at the control's plain struct.
pub const NVOS54_FLAGS_FINN_SERIALIZED: u32 = 0x4;

/// The `--deny-*` decision on an NVIDIA `RM_CONTROL` from a denied process (the LSM programs
/// in `gpu-trace-ebpf/src/probes/file_ioctl.rs` call these; pure, so that the rule is
/// unit-tested here).
///
/// Rule: a `GPFIFO_SCHEDULE` (TSG or channel) is refused when its `bEnable` is set, and also,
/// failing closed, whenever the tracer cannot read `bEnable` reliably: the `NVOS54` block or
/// the parameters cannot be read from user memory (a page not present: the driver's
/// `copy_from_user` would fault it in, the BPF helper cannot), or the parameters are
/// FINN-serialized (their first byte is not `bEnable`). A block that cannot be read at all
/// might be any control: it is refused too. Everything else passes.
pub mod deny {
    use super::{NVOS54_FLAGS_FINN_SERIALIZED, cmd, off};

    /// Why a call was refused.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Refusal {
        /// A `GPFIFO_SCHEDULE` with `bEnable` set.
        Enable,
        /// A `GPFIFO_SCHEDULE` whose parameters are FINN-serialized.
        FinnSerialized,
        /// The block or the parameters could not be read.
        Unreadable,
    }

    /// What to do with an `RM_CONTROL` block (`NVOS54_PARAMETERS`, read as 8 words).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Control {
        /// Not a scheduling request: let it through.
        Pass,
        /// Refuse without reading more.
        Refuse(Refusal),
        /// A plain `GPFIFO_SCHEDULE`: read the first byte at `params` (`bEnable`) and decide
        /// with [`schedule`].
        ReadEnable { params: u64 },
    }

    /// The decision on the block, `None` when it could not be read.
    pub const fn control(block: Option<[u32; 8]>) -> Control {
        let Some(b) = block else {
            return Control::Refuse(Refusal::Unreadable);
        };
        let command = b[off::CONTROL_CMD / 4];
        if command != cmd::TSG_GPFIFO_SCHEDULE && command != cmd::CHANNEL_GPFIFO_SCHEDULE {
            return Control::Pass;
        }
        if b[off::CONTROL_FLAGS / 4] & NVOS54_FLAGS_FINN_SERIALIZED != 0 {
            return Control::Refuse(Refusal::FinnSerialized);
        }
        // RM refuses a size other than the control's own (`NV_ERR_INVALID_PARAM_STRUCT`).
        if b[off::CONTROL_PARAMS_SIZE / 4] < 1 {
            return Control::Pass;
        }
        let params = (b[off::CONTROL_PARAMS_PTR / 4] as u64)
            | ((b[off::CONTROL_PARAMS_PTR / 4 + 1] as u64) << 32);
        Control::ReadEnable { params }
    }

    /// The decision on a plain `GPFIFO_SCHEDULE` once `bEnable` was read (`None`: unreadable).
    pub const fn schedule(enable: Option<u8>) -> Option<Refusal> {
        match enable {
            Some(0) => None,
            Some(_) => Some(Refusal::Enable),
            None => Some(Refusal::Unreadable),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn block(command: u32, flags: u32, params: u64, size: u32) -> [u32; 8] {
            [
                1,
                2,
                command,
                flags,
                params as u32,
                (params >> 32) as u32,
                size,
                0,
            ]
        }

        #[test]
        fn plain_schedules_are_read_other_controls_pass() {
            for command in [cmd::TSG_GPFIFO_SCHEDULE, cmd::CHANNEL_GPFIFO_SCHEDULE] {
                assert_eq!(
                    control(Some(block(command, 0, 0x7fff_1234_5678, 3))),
                    Control::ReadEnable {
                        params: 0x7fff_1234_5678
                    }
                );
            }
            for command in [cmd::TSG_SET_TIMESLICE, cmd::TSG_GET_INFO, 0] {
                assert_eq!(
                    control(Some(block(command, NVOS54_FLAGS_FINN_SERIALIZED, 8, 3))),
                    Control::Pass
                );
            }
        }

        #[test]
        fn finn_serialized_schedules_are_refused_unread() {
            for command in [cmd::TSG_GPFIFO_SCHEDULE, cmd::CHANNEL_GPFIFO_SCHEDULE] {
                // The flag alone decides: whatever the buffer's first byte, size or address.
                for flags in [NVOS54_FLAGS_FINN_SERIALIZED, 0xffff_ffff] {
                    assert_eq!(
                        control(Some(block(command, flags, 0x1000, 3))),
                        Control::Refuse(Refusal::FinnSerialized)
                    );
                }
            }
            // Other flag bits do not change a plain schedule.
            assert_eq!(
                control(Some(block(cmd::TSG_GPFIFO_SCHEDULE, !0x4, 0x1000, 3))),
                Control::ReadEnable { params: 0x1000 }
            );
        }

        #[test]
        fn unreadable_blocks_and_parameters_are_refused() {
            assert_eq!(control(None), Control::Refuse(Refusal::Unreadable));
            assert_eq!(schedule(None), Some(Refusal::Unreadable));
            assert_eq!(schedule(Some(1)), Some(Refusal::Enable));
            assert_eq!(schedule(Some(0xff)), Some(Refusal::Enable));
            assert_eq!(schedule(Some(0)), None);
        }
    }
}

/// The scheduling hooks of gpu_ext's patched NVIDIA driver (`eunomia-bpf/gpu_ext-kernel-modules`,
/// a fork of open-gpu-kernel-modules 575): global `noinline` functions in the driver's
/// kernel-open part (`kernel-open/nvidia/nv-gpu-sched-hooks.c`), so they have module BTF and
/// kallsyms entries, each taking one pointer to a context struct that RM fills on its stack.
/// Layouts (x86-64) as the fork's headers define them; three versions of the fork differ
/// (called A, B, C here, oldest first), so only the prefixes common to all of them are read.
pub mod gpu_ext {
    /// Hook numbers ([`crate::NvSchedRecord::hook`]).
    pub mod hook {
        /// `nv_gpu_sched_task_init`: in `kchangrpInit_IMPL` (A, B) or `kchangrpapiConstruct_IMPL`
        /// (C), once the TSG has its hardware id.
        pub const TASK_INIT: u32 = 1;
        /// `nv_gpu_sched_bind` (A: `nv_gpu_sched_schedule`): in
        /// `kchangrpapiCtrlCmdGpFifoSchedule_IMPL`, before the request goes to GSP.
        pub const BIND: u32 = 2;
        /// `nv_gpu_sched_token_request`: when a work-submit token is handed out.
        pub const TOKEN_REQUEST: u32 = 3;
        /// `nv_gpu_sched_task_destroy`: first statement of `kchangrpDestruct_IMPL`.
        pub const TASK_DESTROY: u32 = 4;
    }

    /// The hook functions, by hook number (index `hook - 1`).
    pub const FUNCTIONS: [&str; 4] = [
        "nv_gpu_sched_task_init",
        "nv_gpu_sched_bind",
        "nv_gpu_sched_token_request",
        "nv_gpu_sched_task_destroy",
    ];

    /// Older names of the hook functions, tried where the current name is absent: version A of
    /// the fork calls `nv_gpu_sched_bind` `nv_gpu_sched_schedule` (same context layout).
    pub const OLD_NAMES: [(&str, &str); 1] = [("nv_gpu_sched_bind", "nv_gpu_sched_schedule")];

    /// Largest context prefix copied.
    pub const CTX_MAX: usize = 32;

    /// `struct nv_gpu_task_init_ctx`: the 32 bytes all versions share.
    pub mod task_init {
        pub const TSG_ID: usize = 0; // u64: the hardware TSG id (grpID)
        pub const ENGINE_TYPE: usize = 8; // u32: RM_ENGINE_TYPE (RM's internal numbering)
        pub const DEFAULT_TIMESLICE: usize = 16; // u64, µs
        pub const DEFAULT_INTERLEAVE: usize = 24; // u32 (0 in A/B: set later; 1 = MEDIUM in C)
        pub const RUNLIST_ID: usize = 28; // u32 (A/B: a local that is usually 0; C: the TSG's)
        pub const LEN: u32 = 32;
    }

    /// `struct nv_gpu_bind_ctx` (32 bytes, all versions).
    pub mod bind {
        pub const TSG_ID: usize = 0; // u64
        pub const RUNLIST_ID: usize = 8; // u32
        pub const CHANNEL_COUNT: usize = 12; // u32
        pub const TIMESLICE_US: usize = 16; // u64
        pub const INTERLEAVE_LEVEL: usize = 24; // u32 (NVA06C_CTRL_INTERLEAVE_LEVEL_*: 0/1/2)
        pub const ALLOW: usize = 28; // u32 (1 unless a struct_ops policy rejected the bind)
        pub const LEN: u32 = 32;
    }

    /// `struct nv_gpu_token_request_ctx` (24 bytes, all versions).
    pub mod token_request {
        pub const CHANNEL_ID: usize = 0; // u32 (ChID)
        pub const TSG_ID: usize = 8; // u64 (0 for a channel without a group)
        pub const TOKEN: usize = 16; // u32
        pub const LEN: u32 = 24;
    }

    /// `struct nv_gpu_task_destroy_ctx`: the 8 bytes all versions share.
    pub mod task_destroy {
        pub const TSG_ID: usize = 0; // u64
        pub const LEN: u32 = 8;
    }

    /// Bytes of the context struct copied for `hook` (0 for an unknown hook).
    pub const fn capture_len(hook: u32) -> u32 {
        match hook {
            hook::TASK_INIT => task_init::LEN,
            hook::BIND => bind::LEN,
            hook::TOKEN_REQUEST => token_request::LEN,
            hook::TASK_DESTROY => task_destroy::LEN,
            _ => 0,
        }
    }
}
