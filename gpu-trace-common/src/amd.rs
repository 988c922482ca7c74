//! AMD KFD (`/dev/kfd`) ioctl ABI facts that both sides need, and the rules that decide what the
//! kernel programs copy. Source: `include/uapi/linux/kfd_ioctl.h` and
//! `drivers/gpu/drm/amd/amdkfd/kfd_chardev.c` (Linux 6.1, 6.12 and 7.3; see
//! `docs/driver-abi.md` part B). Pure `const fn`s so that the kernel and userspace
//! agree by construction.
//!
//! How the driver dispatches (`kfd_ioctl`): it takes `_IOC_NR(cmd)` and looks the handler up in
//! its own table; the direction and the size it copies come from the table's definition, except
//! that it copies `_IOC_SIZE` of the *caller's* command from user memory (zero-filling the rest)
//! and back. So a 6.1-era caller's 88-byte `CREATE_QUEUE` (0xC0584B02) and a 6.12-era caller's
//! 96-byte one (0xC0604B02) both create a queue, and the results (`queue_id`, `doorbell_offset`)
//! are in user memory at syscall exit, whatever the size. The driver does not check the type
//! byte either; the kernel programs do (see [`ioctl_is_candidate`]).

/// `AMDKFD_IOCTL_BASE`: the ioctl type byte of every KFD command.
pub const KFD_IOCTL_TYPE: u32 = b'K' as u32;

/// KFD command numbers (`_IOC_NR`).
pub mod nr {
    /// `AMDKFD_IOC_GET_VERSION` (not traced).
    pub const GET_VERSION: u32 = 0x01;
    /// `AMDKFD_IOC_CREATE_QUEUE`.
    pub const CREATE_QUEUE: u32 = 0x02;
    /// `AMDKFD_IOC_DESTROY_QUEUE`.
    pub const DESTROY_QUEUE: u32 = 0x03;
    /// `AMDKFD_IOC_UPDATE_QUEUE`.
    pub const UPDATE_QUEUE: u32 = 0x07;
    /// `AMDKFD_IOC_SET_CU_MASK`.
    pub const SET_CU_MASK: u32 = 0x1A;
}

/// Full ioctl commands as the UAPI header defines them.
pub mod cmd {
    /// `_IOR('K', 0x01, struct kfd_ioctl_get_version_args)` (8 bytes).
    pub const GET_VERSION: u32 = 0x8008_4B01;
    /// `_IOWR('K', 0x02, struct kfd_ioctl_create_queue_args)`, 96 bytes (Linux ≥ 6.12 headers).
    pub const CREATE_QUEUE: u32 = 0xC060_4B02;
    /// The same command as built from older headers (Linux 6.1), where the struct is 88 bytes.
    pub const CREATE_QUEUE_88: u32 = 0xC058_4B02;
    /// `_IOWR('K', 0x03, struct kfd_ioctl_destroy_queue_args)` (8 bytes).
    pub const DESTROY_QUEUE: u32 = 0xC008_4B03;
    /// `_IOW('K', 0x07, struct kfd_ioctl_update_queue_args)` (24 bytes).
    pub const UPDATE_QUEUE: u32 = 0x4018_4B07;
    /// `_IOW('K', 0x1A, struct kfd_ioctl_set_cu_mask_args)` (16 bytes).
    pub const SET_CU_MASK: u32 = 0x4010_4B1A;
}

/// Argument struct sizes.
pub mod size {
    /// `kfd_ioctl_create_queue_args` since Linux 6.12 (adds `sdma_engine_id` and a pad /
    /// `metadata_ring_size`).
    pub const CREATE_QUEUE: u32 = 96;
    /// `kfd_ioctl_create_queue_args` up to Linux 6.1 (ends after `ctl_stack_size`).
    pub const CREATE_QUEUE_88: u32 = 88;
    pub const DESTROY_QUEUE: u32 = 8;
    pub const UPDATE_QUEUE: u32 = 24;
    pub const SET_CU_MASK: u32 = 16;
}

/// Field offsets inside the argument structs (all little-endian).
pub mod off {
    /// `kfd_ioctl_create_queue_args`.
    pub mod create {
        pub const RING_BASE_ADDRESS: usize = 0; // u64, in
        pub const WRITE_POINTER_ADDRESS: usize = 8; // u64, in
        pub const READ_POINTER_ADDRESS: usize = 16; // u64, in
        pub const DOORBELL_OFFSET: usize = 24; // u64, out
        pub const RING_SIZE: usize = 32; // u32, in (the driver writes back its clamp to 1024)
        pub const GPU_ID: usize = 36; // u32, in
        pub const QUEUE_TYPE: usize = 40; // u32, in
        pub const QUEUE_PERCENTAGE: usize = 44; // u32, in: bits 7:0 percent, 15:8 pm4_target_xcc
        pub const QUEUE_PRIORITY: usize = 48; // u32, in (0..=15)
        pub const QUEUE_ID: usize = 52; // u32, out
        pub const EOP_BUFFER_ADDRESS: usize = 56; // u64, in
        pub const EOP_BUFFER_SIZE: usize = 64; // u64, in
        pub const CTX_SAVE_RESTORE_ADDRESS: usize = 72; // u64, in
        pub const CTX_SAVE_RESTORE_SIZE: usize = 80; // u32, in
        pub const CTL_STACK_SIZE: usize = 84; // u32, in
        /// Only in the 96-byte form.
        pub const SDMA_ENGINE_ID: usize = 88; // u32, in
        /// Only in the 96-byte form: `pad` (6.12) or `metadata_ring_size` (7.3).
        pub const METADATA_RING_SIZE: usize = 92; // u32, in
    }
    /// `kfd_ioctl_destroy_queue_args`.
    pub mod destroy {
        pub const QUEUE_ID: usize = 0; // u32, in
    }
    /// `kfd_ioctl_update_queue_args`.
    pub mod update {
        pub const RING_BASE_ADDRESS: usize = 0; // u64
        pub const QUEUE_ID: usize = 8; // u32
        pub const RING_SIZE: usize = 12; // u32
        pub const QUEUE_PERCENTAGE: usize = 16; // u32
        pub const QUEUE_PRIORITY: usize = 20; // u32
    }
    /// `kfd_ioctl_set_cu_mask_args`.
    pub mod cu_mask {
        pub const QUEUE_ID: usize = 0; // u32
        pub const NUM_CU_MASK: usize = 4; // u32 (bits; a multiple of 32)
        pub const CU_MASK_PTR: usize = 8; // u64
    }
}

/// `KFD_IOC_QUEUE_TYPE_*` (the `queue_type` of `CREATE_QUEUE`).
pub mod queue_type {
    pub const COMPUTE: u32 = 0;
    pub const SDMA: u32 = 1;
    pub const COMPUTE_AQL: u32 = 2;
    pub const SDMA_XGMI: u32 = 3;
    pub const SDMA_BY_ENG_ID: u32 = 4;
}

/// `KFD_MAX_QUEUE_PERCENTAGE`.
pub const MAX_QUEUE_PERCENTAGE: u32 = 100;
/// `KFD_MAX_QUEUE_PRIORITY`.
pub const MAX_QUEUE_PRIORITY: u32 = 15;
/// `KFD_MIN_QUEUE_RING_SIZE`: smaller ring sizes are raised to this by the driver.
pub const MIN_QUEUE_RING_SIZE: u32 = 1024;

/// `doorbell_offset` returned by `CREATE_QUEUE`: an mmap offset of `/dev/kfd`,
/// `KFD_MMAP_TYPE_DOORBELL (3 << 62) | gpu_id << 46`, OR'd (SOC15 and later) with the byte
/// offset of the queue's doorbell inside the process's doorbell pages.
pub mod doorbell {
    pub const MMAP_TYPE_SHIFT: u32 = 62;
    pub const MMAP_TYPE_DOORBELL: u64 = 3;
    pub const GPU_ID_SHIFT: u32 = 46;
    pub const GPU_ID_MASK: u64 = 0xffff;
    /// Bits below the gpu id: the in-process byte offset.
    pub const OFFSET_MASK: u64 = (1 << 46) - 1;
}

/// Bits of [`crate::KfdIoctlRecord::flags`].
pub mod kfd_flags {
    /// Reading the argument struct from user memory failed (`args_len` is 0).
    pub const ARGS_READ_FAILED: u32 = 1 << 0;
    /// The caller's `_IOC_SIZE` is smaller than the fields this tracer decodes: nothing was read
    /// (the driver zero-fills the rest and runs the command anyway).
    pub const ARGS_SHORT: u32 = 1 << 1;
}

/// Largest argument struct copied (`CREATE_QUEUE`, 96 bytes).
pub const KFD_ARGS_MAX: usize = 96;

/// `_IOC_NR`.
pub const fn ioctl_nr(ioctl_cmd: u32) -> u32 {
    ioctl_cmd & 0xff
}

/// `_IOC_TYPE`.
pub const fn ioctl_type(ioctl_cmd: u32) -> u32 {
    (ioctl_cmd >> 8) & 0xff
}

/// `_IOC_SIZE`: the bytes the driver copies from and back to the caller.
pub const fn ioctl_size(ioctl_cmd: u32) -> u32 {
    (ioctl_cmd >> 16) & 0x3fff
}

/// Whether this command number is one the tracer decodes.
pub const fn nr_is_traced(nr: u32) -> bool {
    matches!(
        nr,
        nr::CREATE_QUEUE | nr::DESTROY_QUEUE | nr::UPDATE_QUEUE | nr::SET_CU_MASK
    )
}

/// The first filter the kernel applies, on the raw ioctl command: type byte `'K'` and one of
/// the traced command numbers. The driver itself dispatches on the number alone; checking the
/// type too keeps the many small-numbered ioctls of other drivers (terminals: `'T'` 0x02, 0x03,
/// 0x07, …) away from the fd lookup. Every KFD client (libhsakmt) builds its commands with `'K'`.
pub const fn ioctl_is_candidate(ioctl_cmd: u32) -> bool {
    ioctl_type(ioctl_cmd) == KFD_IOCTL_TYPE && nr_is_traced(ioctl_nr(ioctl_cmd))
}

/// How many bytes of the argument struct the kernel copies for command number `nr` when the
/// caller's `_IOC_SIZE` is `user_size`: the struct (the 88- or the 96-byte form for
/// `CREATE_QUEUE`), or 0 when the caller's size is too small to hold it (or `nr` is not traced).
/// Only these constant sizes are used, so that each read has a constant length.
pub const fn capture_len(nr: u32, user_size: u32) -> u32 {
    let want = match nr {
        nr::CREATE_QUEUE => {
            if user_size >= size::CREATE_QUEUE {
                return size::CREATE_QUEUE;
            }
            size::CREATE_QUEUE_88
        }
        nr::DESTROY_QUEUE => size::DESTROY_QUEUE,
        nr::UPDATE_QUEUE => size::UPDATE_QUEUE,
        nr::SET_CU_MASK => size::SET_CU_MASK,
        _ => return 0,
    };
    if user_size >= want { want } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_IOC(dir, type, nr, size)` of `include/uapi/asm-generic/ioctl.h`.
    const fn ioc(dir: u32, ty: u32, nr: u32, size: u32) -> u32 {
        (dir << 30) | (size << 16) | (ty << 8) | nr
    }
    const IOW: u32 = 1;
    const IOR: u32 = 2;
    const IOWR: u32 = 3;

    #[test]
    fn commands_match_the_uapi_macros() {
        assert_eq!(
            cmd::GET_VERSION,
            ioc(IOR, KFD_IOCTL_TYPE, nr::GET_VERSION, 8)
        );
        assert_eq!(
            cmd::CREATE_QUEUE,
            ioc(IOWR, KFD_IOCTL_TYPE, nr::CREATE_QUEUE, 96)
        );
        assert_eq!(
            cmd::CREATE_QUEUE_88,
            ioc(IOWR, KFD_IOCTL_TYPE, nr::CREATE_QUEUE, 88)
        );
        assert_eq!(
            cmd::DESTROY_QUEUE,
            ioc(IOWR, KFD_IOCTL_TYPE, nr::DESTROY_QUEUE, 8)
        );
        assert_eq!(
            cmd::UPDATE_QUEUE,
            ioc(IOW, KFD_IOCTL_TYPE, nr::UPDATE_QUEUE, 24)
        );
        assert_eq!(
            cmd::SET_CU_MASK,
            ioc(IOW, KFD_IOCTL_TYPE, nr::SET_CU_MASK, 16)
        );
    }

    #[test]
    fn candidates_need_the_type_byte_and_a_traced_number() {
        for c in [
            cmd::CREATE_QUEUE,
            cmd::CREATE_QUEUE_88,
            cmd::DESTROY_QUEUE,
            cmd::UPDATE_QUEUE,
            cmd::SET_CU_MASK,
        ] {
            assert!(ioctl_is_candidate(c), "{c:#x}");
        }
        assert!(!ioctl_is_candidate(cmd::GET_VERSION));
        // Terminal ioctls share the small numbers (TCSETS = 0x5402).
        assert!(!ioctl_is_candidate(0x5402));
        assert!(!ioctl_is_candidate(0x5403));
        // NVIDIA RM escapes are type 'F'.
        assert!(!ioctl_is_candidate(0xC030_462B));
        // Any size and direction with 'K' and a traced number is a candidate (the driver ignores
        // both).
        assert!(ioctl_is_candidate(ioc(
            0,
            KFD_IOCTL_TYPE,
            nr::DESTROY_QUEUE,
            0
        )));
    }

    #[test]
    fn capture_lengths() {
        assert_eq!(capture_len(nr::CREATE_QUEUE, 96), 96);
        assert_eq!(capture_len(nr::CREATE_QUEUE, 200), 96);
        assert_eq!(capture_len(nr::CREATE_QUEUE, 88), 88);
        assert_eq!(capture_len(nr::CREATE_QUEUE, 92), 88);
        assert_eq!(capture_len(nr::CREATE_QUEUE, 87), 0);
        assert_eq!(capture_len(nr::DESTROY_QUEUE, 8), 8);
        assert_eq!(capture_len(nr::DESTROY_QUEUE, 4), 0);
        assert_eq!(capture_len(nr::UPDATE_QUEUE, 24), 24);
        assert_eq!(capture_len(nr::SET_CU_MASK, 16), 16);
        assert_eq!(capture_len(nr::SET_CU_MASK, 15), 0);
        assert_eq!(capture_len(nr::GET_VERSION, 8), 0);
    }

    #[test]
    fn create_queue_offsets_tile_the_struct() {
        use off::create::*;
        // (offset, size) in declaration order: contiguous, no holes, 96 bytes in all.
        let fields = [
            (RING_BASE_ADDRESS, 8),
            (WRITE_POINTER_ADDRESS, 8),
            (READ_POINTER_ADDRESS, 8),
            (DOORBELL_OFFSET, 8),
            (RING_SIZE, 4),
            (GPU_ID, 4),
            (QUEUE_TYPE, 4),
            (QUEUE_PERCENTAGE, 4),
            (QUEUE_PRIORITY, 4),
            (QUEUE_ID, 4),
            (EOP_BUFFER_ADDRESS, 8),
            (EOP_BUFFER_SIZE, 8),
            (CTX_SAVE_RESTORE_ADDRESS, 8),
            (CTX_SAVE_RESTORE_SIZE, 4),
            (CTL_STACK_SIZE, 4),
            (SDMA_ENGINE_ID, 4),
            (METADATA_RING_SIZE, 4),
        ];
        let mut at = 0;
        for (o, s) in fields {
            assert_eq!(o, at);
            at += s;
        }
        assert_eq!(at, size::CREATE_QUEUE as usize);
        assert_eq!(SDMA_ENGINE_ID, size::CREATE_QUEUE_88 as usize);
    }
}
