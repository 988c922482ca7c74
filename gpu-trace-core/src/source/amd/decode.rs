//! KFD ioctl records → typed calls. Pure code: no kernel, no I/O.
//!
//! The kernel programs copy a traced command's argument struct as user memory held it at syscall
//! exit (see `gpu_trace_common::amd`). For `CREATE_QUEUE` that includes the driver's results
//! (`queue_id`, `doorbell_offset`, the `ring_size` clamped to 1024) — but only when the call
//! succeeded: on failure the driver copies the caller's own input back, so those fields mean
//! nothing, and [`CreateQueue`] users must look at the errno first.
//!
//! Both `CREATE_QUEUE` layouts are decoded: the 88-byte struct of Linux ≤ 6.1 headers and the
//! 96-byte one of 6.12+ headers (which adds `sdma_engine_id` and `pad`/`metadata_ring_size`).
//! The driver dispatches on the command number and accepts both.

use gpu_trace_common::{
    DeepRecord, KfdIoctlRecord, KfdQueueRecord,
    amd::{self, doorbell, kfd_flags, nr, off, queue_type},
    deep_hook, kfd_queue_flags,
};
use serde::Serialize;

use crate::event::AmdQueueType;

/// A queue as the driver's device queue manager created it (deep hook at the exit of
/// `create_queue_cpsch` / `create_queue_nocpsch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueBuilt {
    /// The create function's return value (0 or a negative errno).
    pub ret: i32,
    /// The queue's `struct queue_properties` fields; `None` if they could not be read.
    pub props: Option<DriverQueue>,
}

/// Fields of the driver's `struct queue_properties` that the ioctl arguments do not show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverQueue {
    /// `enum kfd_queue_type` (0 compute, 1 SDMA, 2 HIQ, 3 SDMA XGMI, 4 SDMA by engine id).
    pub kernel_type: u32,
    /// 0 PM4, 1 AQL.
    pub format: u32,
    pub queue_id: u32,
    pub priority: u32,
    pub percent: u32,
    /// The doorbell's absolute dword index in the doorbell BAR.
    pub hw_doorbell: u32,
    /// Whether the driver made the queue active.
    pub active: bool,
    pub vmid: u32,
    pub queue_size: u64,
    pub queue_address: u64,
}

/// A driver-internal step seen by a deep hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeepStep {
    /// A copy of `init_mqd` at `addr` built the hardware descriptor of queue `queue_id`
    /// (`None`: the queue id could not be read).
    MqdInit { queue_id: Option<u32>, addr: u64 },
    /// The queues of process `owner` are being torn down by the driver (`pqm_uninit`).
    Release { owner: u32 },
    /// A hook number this decoder does not know (a newer kernel-side program).
    Unknown { hook: u32 },
}

/// Decodes a [`KfdQueueRecord`].
pub fn decode_queue(rec: &KfdQueueRecord) -> QueueBuilt {
    QueueBuilt {
        ret: rec.ret,
        props: (rec.flags & kfd_queue_flags::PROPS_READ_FAILED == 0).then_some(DriverQueue {
            kernel_type: rec.q_type,
            format: rec.q_format,
            queue_id: rec.queue_id,
            priority: rec.priority,
            percent: rec.percent,
            hw_doorbell: rec.doorbell_off,
            active: rec.is_active != 0,
            vmid: rec.vmid,
            queue_size: rec.queue_size,
            queue_address: rec.queue_address,
        }),
    }
}

/// Decodes a [`DeepRecord`].
pub fn decode_deep(rec: &DeepRecord) -> DeepStep {
    match rec.hook {
        deep_hook::INIT_MQD => DeepStep::MqdInit {
            queue_id: (rec.value != u32::MAX).then_some(rec.value),
            addr: rec.addr,
        },
        deep_hook::KFD_RELEASE => DeepStep::Release { owner: rec.value },
        hook => DeepStep::Unknown { hook },
    }
}

/// One decoded KFD call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KfdCall {
    /// `AMDKFD_IOC_CREATE_QUEUE`.
    CreateQueue(CreateQueue),
    /// `AMDKFD_IOC_DESTROY_QUEUE`.
    DestroyQueue { queue_id: u32 },
    /// `AMDKFD_IOC_UPDATE_QUEUE`.
    UpdateQueue(UpdateQueue),
    /// `AMDKFD_IOC_SET_CU_MASK`.
    SetCuMask {
        queue_id: u32,
        /// Bits in the mask (a multiple of 32; the driver uses at most 1024).
        num_cu_mask: u32,
        cu_mask_ptr: u64,
    },
    /// The record could not be decoded.
    Malformed { nr: u32, reason: KfdMalformed },
}

/// Why a KFD record could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KfdMalformed {
    /// The argument struct could not be read from user memory.
    ArgsReadFailed,
    /// The caller's `_IOC_SIZE` is too small for the struct (nothing was read).
    ArgsShort,
    /// A command number this decoder does not handle.
    UnknownCommand,
    /// `args_len` does not match what the kernel side copies for this command and size.
    BadLength,
}

/// The scheduling parameters `CREATE_QUEUE` and `UPDATE_QUEUE` both carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueParams {
    pub ring_base_address: u64,
    /// `CREATE_QUEUE`: the driver raises sizes below 1024 to 1024 and writes that back.
    /// `UPDATE_QUEUE`: as given (the driver uses at least 1024 but writes nothing back).
    pub ring_size: u32,
    /// Raw: bits 7:0 percentage, 15:8 `pm4_target_xcc`.
    pub queue_percentage: u32,
    /// 0..=15.
    pub queue_priority: u32,
}

impl QueueParams {
    /// Queue percentage (bits 7:0).
    pub fn percentage(&self) -> u32 {
        self.queue_percentage & 0xff
    }

    /// `pm4_target_xcc` (bits 15:8).
    pub fn pm4_target_xcc(&self) -> u32 {
        (self.queue_percentage >> 8) & 0xff
    }

    /// The ring size the driver uses (at least `KFD_MIN_QUEUE_RING_SIZE`).
    pub fn effective_ring_size(&self) -> u32 {
        self.ring_size.max(amd::MIN_QUEUE_RING_SIZE)
    }

    /// `QUEUE_IS_ACTIVE` as far as the arguments go: a ring address and size (always, after
    /// the driver's minimum) and a non-zero percentage.
    pub fn active(&self) -> bool {
        self.ring_base_address != 0 && self.percentage() > 0
    }
}

/// `struct kfd_ioctl_create_queue_args`, as read at syscall exit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateQueue {
    /// `ring_base_address`, `ring_size`, `queue_percentage`, `queue_priority`.
    pub params: QueueParams,
    pub write_pointer_address: u64,
    pub read_pointer_address: u64,
    /// Out: the mmap offset of the queue's doorbell (valid only if the call succeeded).
    pub doorbell_offset: u64,
    pub gpu_id: u32,
    /// `KFD_IOC_QUEUE_TYPE_*`.
    pub queue_type: u32,
    /// Out: the queue id (valid only if the call succeeded).
    pub queue_id: u32,
    pub eop_buffer_address: u64,
    pub eop_buffer_size: u64,
    pub ctx_save_restore_address: u64,
    pub ctx_save_restore_size: u32,
    pub ctl_stack_size: u32,
    /// 96-byte form only (the driver sees 0 for an 88-byte caller).
    pub sdma_engine_id: Option<u32>,
    /// 96-byte form only: `metadata_ring_size` (7.3) / `pad` (6.12).
    pub metadata_ring_size: Option<u32>,
    /// The caller's struct size (`_IOC_SIZE`): 88, 96, or larger.
    pub arg_size: u32,
}

/// `struct kfd_ioctl_update_queue_args`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateQueue {
    pub queue_id: u32,
    /// `ring_base_address`, `ring_size`, `queue_percentage`, `queue_priority`.
    pub params: QueueParams,
}

/// The parts of a `doorbell_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorbellFields {
    /// `KFD_MMAP_TYPE_*` (3 = doorbell).
    pub mmap_type: u64,
    /// The gpu_id encoded in the offset.
    pub gpu_id: u32,
    /// Byte offset of the queue's doorbell in the process's doorbell pages (SOC15 and later;
    /// 0 on older GPUs).
    pub offset_in_process: u64,
}

/// Splits a `CREATE_QUEUE` `doorbell_offset` into its fields.
pub fn split_doorbell(offset: u64) -> DoorbellFields {
    DoorbellFields {
        mmap_type: offset >> doorbell::MMAP_TYPE_SHIFT,
        gpu_id: ((offset >> doorbell::GPU_ID_SHIFT) & doorbell::GPU_ID_MASK) as u32,
        offset_in_process: offset & doorbell::OFFSET_MASK,
    }
}

/// The queue type for a raw `KFD_IOC_QUEUE_TYPE_*` value.
pub fn queue_type_of(raw: u32) -> AmdQueueType {
    match raw {
        queue_type::COMPUTE => AmdQueueType::Compute,
        queue_type::SDMA => AmdQueueType::Sdma,
        queue_type::COMPUTE_AQL => AmdQueueType::ComputeAql,
        queue_type::SDMA_XGMI => AmdQueueType::SdmaXgmi,
        queue_type::SDMA_BY_ENG_ID => AmdQueueType::SdmaByEngId,
        _ => AmdQueueType::Unknown,
    }
}

/// The syscall's errno as a negative number, 0 on success.
pub fn errno(rec: &KfdIoctlRecord) -> i32 {
    if rec.ret < 0 {
        i32::try_from(rec.ret).unwrap_or(i32::MIN)
    } else {
        0
    }
}

/// The fd the call was issued on.
pub fn fd(rec: &KfdIoctlRecord) -> i32 {
    rec.fd
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | (u64::from(u32_at(b, at + 4)) << 32)
}

/// Decodes one record.
pub fn decode(rec: &KfdIoctlRecord) -> KfdCall {
    let nr = rec.nr;
    let malformed = |reason| KfdCall::Malformed { nr, reason };
    if !amd::nr_is_traced(nr) {
        return malformed(KfdMalformed::UnknownCommand);
    }
    if rec.flags & kfd_flags::ARGS_SHORT != 0 {
        return malformed(KfdMalformed::ArgsShort);
    }
    if rec.flags & kfd_flags::ARGS_READ_FAILED != 0 {
        return malformed(KfdMalformed::ArgsReadFailed);
    }
    let len = rec.args_len as usize;
    if len == 0 || len != amd::capture_len(nr, rec.arg_size) as usize || len > rec.args.len() {
        return malformed(KfdMalformed::BadLength);
    }
    let b = &rec.args[..len];
    match nr {
        nr::CREATE_QUEUE => {
            use off::create::*;
            let long = len >= amd::size::CREATE_QUEUE as usize;
            KfdCall::CreateQueue(CreateQueue {
                params: QueueParams {
                    ring_base_address: u64_at(b, RING_BASE_ADDRESS),
                    ring_size: u32_at(b, RING_SIZE),
                    queue_percentage: u32_at(b, QUEUE_PERCENTAGE),
                    queue_priority: u32_at(b, QUEUE_PRIORITY),
                },
                write_pointer_address: u64_at(b, WRITE_POINTER_ADDRESS),
                read_pointer_address: u64_at(b, READ_POINTER_ADDRESS),
                doorbell_offset: u64_at(b, DOORBELL_OFFSET),
                gpu_id: u32_at(b, GPU_ID),
                queue_type: u32_at(b, QUEUE_TYPE),
                queue_id: u32_at(b, QUEUE_ID),
                eop_buffer_address: u64_at(b, EOP_BUFFER_ADDRESS),
                eop_buffer_size: u64_at(b, EOP_BUFFER_SIZE),
                ctx_save_restore_address: u64_at(b, CTX_SAVE_RESTORE_ADDRESS),
                ctx_save_restore_size: u32_at(b, CTX_SAVE_RESTORE_SIZE),
                ctl_stack_size: u32_at(b, CTL_STACK_SIZE),
                sdma_engine_id: long.then(|| u32_at(b, SDMA_ENGINE_ID)),
                metadata_ring_size: long.then(|| u32_at(b, METADATA_RING_SIZE)),
                arg_size: rec.arg_size,
            })
        }
        nr::DESTROY_QUEUE => KfdCall::DestroyQueue {
            queue_id: u32_at(b, off::destroy::QUEUE_ID),
        },
        nr::UPDATE_QUEUE => {
            use off::update::*;
            KfdCall::UpdateQueue(UpdateQueue {
                queue_id: u32_at(b, QUEUE_ID),
                params: QueueParams {
                    ring_base_address: u64_at(b, RING_BASE_ADDRESS),
                    ring_size: u32_at(b, RING_SIZE),
                    queue_percentage: u32_at(b, QUEUE_PERCENTAGE),
                    queue_priority: u32_at(b, QUEUE_PRIORITY),
                },
            })
        }
        nr::SET_CU_MASK => KfdCall::SetCuMask {
            queue_id: u32_at(b, off::cu_mask::QUEUE_ID),
            num_cu_mask: u32_at(b, off::cu_mask::NUM_CU_MASK),
            cu_mask_ptr: u64_at(b, off::cu_mask::CU_MASK_PTR),
        },
        _ => malformed(KfdMalformed::UnknownCommand),
    }
}

/// Building KFD records the way the kernel programs do, for tests (here and in the tracker's).
///
/// No AMD GPU was available to capture real records: every byte below is laid out from the
/// documented UAPI (`include/uapi/linux/kfd_ioctl.h`, Linux 6.1 / 6.12 / 7.3), field by field
/// at the offsets of `gpu_trace_common::amd::off` — which the common crate's tests check against
/// the struct's declaration order and size.
#[cfg(test)]
pub(crate) mod testing {
    use gpu_trace_common::{
        KfdIoctlRecord, RecordHeader,
        amd::{self, KFD_ARGS_MAX, cmd},
        kernel_dev, record_kind,
    };

    /// A record for command `ioctl_cmd` from `pid` whose argument bytes are `args` (the kernel
    /// copies `capture_len` of them).
    pub fn record(pid: u32, fd: i32, ioctl_cmd: u32, ret: i64, args: &[u8]) -> KfdIoctlRecord {
        let nr = amd::ioctl_nr(ioctl_cmd);
        let size = amd::ioctl_size(ioctl_cmd);
        let len = amd::capture_len(nr, size);
        let mut buf = [0u8; KFD_ARGS_MAX];
        let mut flags = 0;
        if len == 0 {
            flags |= amd::kfd_flags::ARGS_SHORT;
        } else {
            buf[..len as usize].copy_from_slice(&args[..len as usize]);
        }
        let mut comm = [0u8; 16];
        comm[..7].copy_from_slice(b"hip_app");
        KfdIoctlRecord {
            hdr: RecordHeader {
                kind: record_kind::KFD_IOCTL,
                cpu: 2,
                ts_ns: 1_000_000,
                tgid: pid,
                tid: pid,
                comm,
            },
            ret,
            fd,
            ioctl_cmd,
            rdev: kernel_dev(236, 0),
            nr,
            arg_size: size,
            flags,
            args_len: len,
            source: gpu_trace_common::hook_source::SYSCALL,
            args: buf,
        }
    }

    /// `kfd_ioctl_create_queue_args` bytes (96; take the first 88 for the old form).
    #[derive(Clone, Copy, Debug)]
    pub struct CreateArgs {
        pub ring_base: u64,
        pub doorbell_offset: u64,
        pub ring_size: u32,
        pub gpu_id: u32,
        pub queue_type: u32,
        pub percentage: u32,
        pub priority: u32,
        pub queue_id: u32,
        pub sdma_engine_id: u32,
        pub metadata_ring_size: u32,
    }

    impl Default for CreateArgs {
        fn default() -> Self {
            Self {
                ring_base: 0x7f00_0000_0000,
                doorbell_offset: 0,
                ring_size: 0x10_0000,
                gpu_id: 0xbeef,
                queue_type: amd::queue_type::COMPUTE_AQL,
                percentage: 100,
                priority: 7,
                queue_id: 0,
                sdma_engine_id: 0,
                metadata_ring_size: 0,
            }
        }
    }

    impl CreateArgs {
        pub fn bytes(&self) -> Vec<u8> {
            let mut b = Vec::with_capacity(96);
            b.extend_from_slice(&self.ring_base.to_le_bytes()); // ring_base_address @0
            b.extend_from_slice(&0x7f00_0000_1000u64.to_le_bytes()); // write_pointer_address @8
            b.extend_from_slice(&0x7f00_0000_2000u64.to_le_bytes()); // read_pointer_address @16
            b.extend_from_slice(&self.doorbell_offset.to_le_bytes()); // doorbell_offset @24
            b.extend_from_slice(&self.ring_size.to_le_bytes()); // ring_size @32
            b.extend_from_slice(&self.gpu_id.to_le_bytes()); // gpu_id @36
            b.extend_from_slice(&self.queue_type.to_le_bytes()); // queue_type @40
            b.extend_from_slice(&self.percentage.to_le_bytes()); // queue_percentage @44
            b.extend_from_slice(&self.priority.to_le_bytes()); // queue_priority @48
            b.extend_from_slice(&self.queue_id.to_le_bytes()); // queue_id @52
            b.extend_from_slice(&0x7f00_0000_3000u64.to_le_bytes()); // eop_buffer_address @56
            b.extend_from_slice(&0x1000u64.to_le_bytes()); // eop_buffer_size @64
            b.extend_from_slice(&0x7f00_0000_4000u64.to_le_bytes()); // ctx_save_restore_address @72
            b.extend_from_slice(&0x2000u32.to_le_bytes()); // ctx_save_restore_size @80
            b.extend_from_slice(&0x800u32.to_le_bytes()); // ctl_stack_size @84
            b.extend_from_slice(&self.sdma_engine_id.to_le_bytes()); // sdma_engine_id @88
            b.extend_from_slice(&self.metadata_ring_size.to_le_bytes()); // pad / metadata_ring_size @92
            assert_eq!(b.len(), 96);
            b
        }

        /// A successful 96-byte create, as user memory holds it at exit.
        pub fn created(self, pid: u32, fd: i32) -> KfdIoctlRecord {
            record(pid, fd, cmd::CREATE_QUEUE, 0, &self.bytes())
        }
    }

    /// The doorbell offset the driver returns on SOC15 GPUs.
    pub fn soc15_doorbell(gpu_id: u32, offset_in_process: u64) -> u64 {
        (3u64 << 62) | (u64::from(gpu_id) << 46) | offset_in_process
    }

    fn header(kind: u32, pid: u32) -> RecordHeader {
        let mut comm = [0u8; 16];
        comm[..7].copy_from_slice(b"hip_app");
        RecordHeader {
            kind,
            cpu: 2,
            ts_ns: 999_000,
            tgid: pid,
            tid: pid,
            comm,
        }
    }

    /// What the DQM `create_queue_*` exit program writes for a queue the driver created, with
    /// the `struct queue_properties` values a 6.12 driver holds for a freshly created active
    /// AQL compute queue under the hardware scheduler (docs/driver-abi.md B5: kernel type 0 =
    /// compute, format 1 = AQL, vmid 0 until the scheduler maps the process).
    pub fn queue_built(
        pid: u32,
        queue_id: u32,
        hw_doorbell: u32,
    ) -> gpu_trace_common::KfdQueueRecord {
        gpu_trace_common::KfdQueueRecord {
            hdr: header(record_kind::KFD_QUEUE, pid),
            source: gpu_trace_common::hook_source::TRAMPOLINE,
            ret: 0,
            _pad: 0,
            flags: 0,
            q_type: 0,
            q_format: 1,
            queue_id,
            priority: 7,
            percent: 100,
            doorbell_off: hw_doorbell,
            is_active: 1,
            vmid: 0,
            queue_size: 0x10_0000,
            queue_address: 0x7f00_0000_0000,
        }
    }

    /// What the deep programs write for `hook` (`gpu_trace_common::deep_hook`).
    pub fn deep(pid: u32, hook: u32, value: u32, addr: u64) -> gpu_trace_common::DeepRecord {
        gpu_trace_common::DeepRecord {
            hdr: header(record_kind::DEEP, pid),
            hook,
            value,
            addr,
            source: gpu_trace_common::hook_source::KPROBE,
            _pad: 0,
        }
    }

    pub fn destroy(pid: u32, fd: i32, queue_id: u32, ret: i64) -> KfdIoctlRecord {
        let mut b = queue_id.to_le_bytes().to_vec(); // queue_id @0
        b.extend_from_slice(&0u32.to_le_bytes()); // pad @4
        record(pid, fd, cmd::DESTROY_QUEUE, ret, &b)
    }

    pub fn update(
        pid: u32,
        fd: i32,
        queue_id: u32,
        ring_size: u32,
        percentage: u32,
        priority: u32,
        ret: i64,
    ) -> KfdIoctlRecord {
        let mut b = 0x7f00_0000_0000u64.to_le_bytes().to_vec(); // ring_base_address @0
        b.extend_from_slice(&queue_id.to_le_bytes()); // queue_id @8
        b.extend_from_slice(&ring_size.to_le_bytes()); // ring_size @12
        b.extend_from_slice(&percentage.to_le_bytes()); // queue_percentage @16
        b.extend_from_slice(&priority.to_le_bytes()); // queue_priority @20
        record(pid, fd, cmd::UPDATE_QUEUE, ret, &b)
    }

    pub fn cu_mask(pid: u32, fd: i32, queue_id: u32, bits: u32, ret: i64) -> KfdIoctlRecord {
        let mut b = queue_id.to_le_bytes().to_vec(); // queue_id @0
        b.extend_from_slice(&bits.to_le_bytes()); // num_cu_mask @4
        b.extend_from_slice(&0x5555_0000u64.to_le_bytes()); // cu_mask_ptr @8
        record(pid, fd, cmd::SET_CU_MASK, ret, &b)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::wire::{self, RawRecord};
    use gpu_trace_common::amd::cmd;

    // No AMD GPU was available: the bytes of these tests are built from the documented UAPI
    // layout (kfd_ioctl.h), not captured from a driver. See `testing`.

    /// The deep hooks' records: the MQD copy's queue id (`u32::MAX`: not read), the
    /// teardown's owner, a hook number this decoder does not know.
    #[test]
    fn deep_records_decode_by_hook() {
        use gpu_trace_common::deep_hook;
        let step = |hook, value| decode_deep(&deep(100, hook, value, 0xffff_0000));
        assert_eq!(
            step(deep_hook::INIT_MQD, 2),
            DeepStep::MqdInit {
                queue_id: Some(2),
                addr: 0xffff_0000
            }
        );
        assert_eq!(
            step(deep_hook::INIT_MQD, u32::MAX),
            DeepStep::MqdInit {
                queue_id: None,
                addr: 0xffff_0000
            }
        );
        assert_eq!(
            step(deep_hook::KFD_RELEASE, 77),
            DeepStep::Release { owner: 77 }
        );
        assert_eq!(step(0x7777, 1), DeepStep::Unknown { hook: 0x7777 });
    }

    #[test]
    fn create_queue_96_bytes_decodes_every_field() {
        let args = CreateArgs {
            doorbell_offset: soc15_doorbell(0xbeef, 0x18),
            queue_id: 5,
            percentage: (2 << 8) | 80,
            priority: 11,
            queue_type: amd::queue_type::SDMA_BY_ENG_ID,
            sdma_engine_id: 3,
            metadata_ring_size: 0x400,
            ..CreateArgs::default()
        };
        let rec = args.created(100, 4);
        assert_eq!(rec.args_len, 96);
        let KfdCall::CreateQueue(c) = decode(&rec) else {
            panic!("{:?}", decode(&rec))
        };
        assert_eq!(c.params.ring_base_address, 0x7f00_0000_0000);
        assert_eq!(c.write_pointer_address, 0x7f00_0000_1000);
        assert_eq!(c.read_pointer_address, 0x7f00_0000_2000);
        assert_eq!(c.doorbell_offset, soc15_doorbell(0xbeef, 0x18));
        assert_eq!(c.params.ring_size, 0x10_0000);
        assert_eq!(c.gpu_id, 0xbeef);
        assert_eq!(c.queue_type, amd::queue_type::SDMA_BY_ENG_ID);
        assert_eq!(c.params.percentage(), 80);
        assert_eq!(c.params.pm4_target_xcc(), 2);
        assert_eq!(c.params.queue_priority, 11);
        assert_eq!(c.queue_id, 5);
        assert_eq!(c.eop_buffer_address, 0x7f00_0000_3000);
        assert_eq!(c.eop_buffer_size, 0x1000);
        assert_eq!(c.ctx_save_restore_address, 0x7f00_0000_4000);
        assert_eq!(c.ctx_save_restore_size, 0x2000);
        assert_eq!(c.ctl_stack_size, 0x800);
        assert_eq!(c.sdma_engine_id, Some(3));
        assert_eq!(c.metadata_ring_size, Some(0x400));
        assert_eq!(c.arg_size, 96);
        assert!(c.params.active());
        assert_eq!(queue_type_of(c.queue_type), AmdQueueType::SdmaByEngId);
    }

    #[test]
    fn create_queue_88_bytes_has_no_sdma_engine() {
        let args = CreateArgs {
            queue_id: 9,
            sdma_engine_id: 0xdead,
            ..CreateArgs::default()
        };
        // The 6.1 header's command (size 88); the kernel copies 88 bytes.
        let rec = record(1, 3, cmd::CREATE_QUEUE_88, 0, &args.bytes());
        assert_eq!(rec.arg_size, 88);
        assert_eq!(rec.args_len, 88);
        assert_eq!(
            &rec.args[88..],
            &[0u8; 8],
            "nothing past the caller's struct is copied"
        );
        let KfdCall::CreateQueue(c) = decode(&rec) else {
            panic!()
        };
        assert_eq!(c.queue_id, 9);
        assert_eq!(
            c.ctl_stack_size, 0x800,
            "the last field of the 88-byte form"
        );
        assert_eq!(c.sdma_engine_id, None);
        assert_eq!(c.metadata_ring_size, None);
        assert_eq!(queue_type_of(c.queue_type), AmdQueueType::ComputeAql);
        // Same fields as the 96-byte decode of the same bytes, apart from the tail.
        let KfdCall::CreateQueue(long) = decode(&args.created(1, 3)) else {
            panic!()
        };
        assert_eq!(
            CreateQueue {
                sdma_engine_id: None,
                metadata_ring_size: None,
                arg_size: 88,
                ..long
            },
            c
        );
    }

    #[test]
    fn larger_caller_structs_decode_as_96_bytes() {
        // A caller built with a future, longer struct: the driver copies its size; the tracer
        // reads the 96 bytes it knows.
        let cmd_128 = (cmd::CREATE_QUEUE & !(0x3fff << 16)) | (128 << 16);
        let mut bytes = CreateArgs {
            queue_id: 1,
            ..CreateArgs::default()
        }
        .bytes();
        bytes.resize(128, 0xff);
        let rec = record(1, 3, cmd_128, 0, &bytes);
        assert_eq!(rec.args_len, 96);
        let KfdCall::CreateQueue(c) = decode(&rec) else {
            panic!()
        };
        assert_eq!(
            (c.queue_id, c.arg_size, c.sdma_engine_id),
            (1, 128, Some(0))
        );
    }

    #[test]
    fn destroy_update_and_cu_mask() {
        assert_eq!(
            decode(&destroy(1, 3, 42, 0)),
            KfdCall::DestroyQueue { queue_id: 42 }
        );
        let u = update(1, 3, 7, 4096, (1 << 8) | 50, 15, 0);
        let KfdCall::UpdateQueue(q) = decode(&u) else {
            panic!()
        };
        assert_eq!(q.queue_id, 7);
        let p = q.params;
        assert_eq!(p.ring_base_address, 0x7f00_0000_0000);
        assert_eq!(p.ring_size, 4096);
        assert_eq!((p.percentage(), p.pm4_target_xcc()), (50, 1));
        assert_eq!(p.queue_priority, 15);
        assert!(p.active());
        let idle = update(1, 3, 7, 0, 0, 0, 0);
        let KfdCall::UpdateQueue(q) = decode(&idle) else {
            panic!()
        };
        assert!(!q.params.active());
        assert_eq!(q.params.effective_ring_size(), 1024);
        assert_eq!(
            decode(&cu_mask(1, 3, 7, 64, 0)),
            KfdCall::SetCuMask {
                queue_id: 7,
                num_cu_mask: 64,
                cu_mask_ptr: 0x5555_0000
            }
        );
    }

    #[test]
    fn unreadable_short_and_inconsistent_records_are_malformed() {
        let mut rec = destroy(1, 3, 1, 0);
        rec.flags = kfd_flags::ARGS_READ_FAILED;
        rec.args_len = 0;
        assert_eq!(
            decode(&rec),
            KfdCall::Malformed {
                nr: 3,
                reason: KfdMalformed::ArgsReadFailed
            }
        );
        // A caller that passed a 4-byte DESTROY_QUEUE: the kernel reads nothing.
        let short_cmd = (cmd::DESTROY_QUEUE & !(0x3fff << 16)) | (4 << 16);
        let rec = record(1, 3, short_cmd, 0, &[1, 0, 0, 0]);
        assert_eq!(rec.flags, kfd_flags::ARGS_SHORT);
        assert_eq!(
            decode(&rec),
            KfdCall::Malformed {
                nr: 3,
                reason: KfdMalformed::ArgsShort
            }
        );
        let mut rec = destroy(1, 3, 1, 0);
        rec.args_len = 16;
        assert_eq!(
            decode(&rec),
            KfdCall::Malformed {
                nr: 3,
                reason: KfdMalformed::BadLength
            }
        );
        let mut rec = destroy(1, 3, 1, 0);
        rec.nr = amd::nr::GET_VERSION;
        assert_eq!(
            decode(&rec),
            KfdCall::Malformed {
                nr: 1,
                reason: KfdMalformed::UnknownCommand
            }
        );
    }

    #[test]
    fn errno_and_doorbell_fields() {
        assert_eq!(errno(&destroy(1, 3, 1, -22)), -22);
        assert_eq!(errno(&destroy(1, 3, 1, 0)), 0);
        assert_eq!(fd(&destroy(1, 9, 1, 0)), 9);
        let d = split_doorbell(soc15_doorbell(0xbeef, 0x808));
        assert_eq!(
            d,
            DoorbellFields {
                mmap_type: 3,
                gpu_id: 0xbeef,
                offset_in_process: 0x808
            }
        );
        assert_eq!(queue_type_of(0), AmdQueueType::Compute);
        assert_eq!(queue_type_of(1), AmdQueueType::Sdma);
        assert_eq!(queue_type_of(3), AmdQueueType::SdmaXgmi);
        assert_eq!(queue_type_of(99), AmdQueueType::Unknown);
    }

    /// The wire layout of a KFD record, laid out by hand from the documented offsets of
    /// `KfdIoctlRecord`, parses to the same record.
    #[test]
    fn wire_bytes_by_hand_parse() {
        let rec = CreateArgs {
            queue_id: 3,
            ..CreateArgs::default()
        }
        .created(4242, 5);
        let mut b = Vec::new();
        b.extend_from_slice(&gpu_trace_common::record_kind::KFD_IOCTL.to_le_bytes()); // kind @0
        b.extend_from_slice(&2u32.to_le_bytes()); // cpu @4
        b.extend_from_slice(&1_000_000u64.to_le_bytes()); // ts_ns @8
        b.extend_from_slice(&4242u32.to_le_bytes()); // tgid @16
        b.extend_from_slice(&4242u32.to_le_bytes()); // tid @20
        b.extend_from_slice(&rec.hdr.comm); // comm @24
        b.extend_from_slice(&0i64.to_le_bytes()); // ret @40
        b.extend_from_slice(&5i32.to_le_bytes()); // fd @48
        b.extend_from_slice(&cmd::CREATE_QUEUE.to_le_bytes()); // ioctl_cmd @52
        b.extend_from_slice(&(236u32 << 20).to_le_bytes()); // rdev @56 (major 236, minor 0)
        b.extend_from_slice(&2u32.to_le_bytes()); // nr @60
        b.extend_from_slice(&96u32.to_le_bytes()); // arg_size @64
        b.extend_from_slice(&0u32.to_le_bytes()); // flags @68
        b.extend_from_slice(&96u32.to_le_bytes()); // args_len @72
        b.extend_from_slice(&0u32.to_le_bytes()); // source @76 (syscall layer)
        b.extend_from_slice(
            &CreateArgs {
                queue_id: 3,
                ..CreateArgs::default()
            }
            .bytes(),
        ); // args @80
        assert_eq!(b.len(), 176);
        assert_eq!(wire::parse_record(&b), Ok(RawRecord::KfdIoctl(rec)));
        assert_eq!(RawRecord::KfdIoctl(rec).as_bytes(), b.as_slice());
        assert_eq!(RawRecord::KfdIoctl(rec).origin().pid, 4242);
        let mut short = b.clone();
        short.pop();
        assert!(matches!(
            wire::parse_record(&short),
            Err(wire::WireError::BadLength {
                expected: 176,
                len: 175,
                ..
            })
        ));
    }
}
