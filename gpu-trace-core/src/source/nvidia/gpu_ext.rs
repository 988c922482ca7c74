//! gpu_ext hook records → typed hook calls. Pure code: no kernel, no I/O.
//!
//! The kernel programs copy the first bytes of the context struct each hook of a
//! gpu_ext-patched driver receives (`gpu_trace_common::nvidia::gpu_ext`, which gives the
//! layouts and where each hook runs), and the system call the thread was in. This decodes them.

use gpu_trace_common::{
    NvSchedRecord,
    nvidia::gpu_ext::{bind, hook, task_destroy, task_init, token_request},
};

use super::decode::{interleave_of, u32_at, u64_at};
use crate::event::Interleave;

/// One hook call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GxHook {
    /// `nv_gpu_sched_task_init`: a TSG got its hardware id.
    TaskInit {
        tsg_id: u64,
        /// RM's internal engine numbering (`RM_ENGINE_TYPE`), not the NV2080 one of the
        /// alloc parameters.
        engine_type: u32,
        /// The driver's default timeslice for this TSG, in µs.
        default_timeslice_us: u64,
    },
    /// `nv_gpu_sched_bind`: a `GPFIFO_SCHEDULE` of a TSG reached RM.
    Bind {
        tsg_id: u64,
        runlist_id: u32,
        channel_count: u32,
        timeslice_us: u64,
        /// `None` for a value outside 0..=2.
        interleave: Option<Interleave>,
        /// 0 when a struct_ops policy rejected the bind (RM then answers NV_ERR_BUSY_RETRY).
        allow: bool,
    },
    /// `nv_gpu_sched_token_request`: a work-submit token was handed out.
    TokenRequest {
        channel_id: u32,
        tsg_id: u64,
        token: u32,
    },
    /// `nv_gpu_sched_task_destroy`: a TSG is being destroyed.
    TaskDestroy { tsg_id: u64 },
}

/// A decoded hook record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GxCall {
    /// `None` when the context could not be read or the hook is unknown.
    pub hook: Option<GxHook>,
    /// The system call the thread was in: (number, first argument), `None` when not known.
    pub syscall: Option<(u32, u64)>,
}

/// Decodes a [`NvSchedRecord`].
pub fn decode(rec: &NvSchedRecord) -> GxCall {
    let c = &rec.ctx;
    let len = rec.ctx_len;
    let have = |want: u32| len == want;
    let hook = match rec.hook {
        hook::TASK_INIT if have(task_init::LEN) => Some(GxHook::TaskInit {
            tsg_id: u64_at(c, task_init::TSG_ID),
            engine_type: u32_at(c, task_init::ENGINE_TYPE),
            default_timeslice_us: u64_at(c, task_init::DEFAULT_TIMESLICE),
        }),
        hook::BIND if have(bind::LEN) => Some(GxHook::Bind {
            tsg_id: u64_at(c, bind::TSG_ID),
            runlist_id: u32_at(c, bind::RUNLIST_ID),
            channel_count: u32_at(c, bind::CHANNEL_COUNT),
            timeslice_us: u64_at(c, bind::TIMESLICE_US),
            interleave: interleave_of(u32_at(c, bind::INTERLEAVE_LEVEL)),
            allow: u32_at(c, bind::ALLOW) != 0,
        }),
        hook::TOKEN_REQUEST if have(token_request::LEN) => Some(GxHook::TokenRequest {
            channel_id: u32_at(c, token_request::CHANNEL_ID),
            tsg_id: u64_at(c, token_request::TSG_ID),
            token: u32_at(c, token_request::TOKEN),
        }),
        hook::TASK_DESTROY if have(task_destroy::LEN) => Some(GxHook::TaskDestroy {
            tsg_id: u64_at(c, task_destroy::TSG_ID),
        }),
        _ => None,
    };
    GxCall {
        hook,
        syscall: (rec.syscall_nr != gpu_trace_common::wire_syscall::UNKNOWN)
            .then_some((rec.syscall_nr, rec.syscall_arg0)),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use gpu_trace_common::{
        NvSchedRecord, RecordHeader, hook_source,
        nvidia::gpu_ext::{CTX_MAX, capture_len},
        record_kind,
    };

    /// The records' `ioctl` system call number.
    pub const SYS_IOCTL: u32 = gpu_trace_common::wire_syscall::IOCTL;

    /// A record as the kernel programs write it for `hook`, from `pid` inside `ioctl(fd, …)`,
    /// with the context bytes `ctx` (laid out by the callers field by field at the offsets of
    /// `gpu_trace_common::nvidia::gpu_ext`, which follow the gpu_ext fork's headers).
    pub fn record(pid: u32, hook: u32, fd: u64, ctx: &[u8]) -> NvSchedRecord {
        let mut buf = [0u8; CTX_MAX];
        let len = capture_len(hook) as usize;
        buf[..len].copy_from_slice(&ctx[..len]);
        let mut comm = [0u8; 16];
        comm[..7].copy_from_slice(b"python3");
        NvSchedRecord {
            hdr: RecordHeader {
                kind: record_kind::NV_SCHED,
                cpu: 1,
                ts_ns: 500,
                tgid: pid,
                tid: pid,
                comm,
            },
            hook,
            source: hook_source::KPROBE,
            ctx_len: len as u32,
            syscall_nr: SYS_IOCTL,
            syscall_arg0: fd,
            ctx: buf,
        }
    }

    /// Little-endian fields at their offsets.
    pub fn ctx(fields: &[(usize, u64, usize)]) -> Vec<u8> {
        let mut b = vec![0u8; CTX_MAX];
        for &(at, value, size) in fields {
            b[at..at + size].copy_from_slice(&value.to_le_bytes()[..size]);
        }
        b
    }

    /// `nv_gpu_task_init_ctx` of TSG `tsg_id` (GR, default timeslice `timeslice_us`).
    pub fn task_init(pid: u32, fd: u64, tsg_id: u64, timeslice_us: u64) -> NvSchedRecord {
        use gpu_trace_common::nvidia::gpu_ext::{hook, task_init as t};
        record(
            pid,
            hook::TASK_INIT,
            fd,
            &ctx(&[
                (t::TSG_ID, tsg_id, 8),
                (t::ENGINE_TYPE, 1, 4),
                (t::DEFAULT_TIMESLICE, timeslice_us, 8),
            ]),
        )
    }

    /// `nv_gpu_bind_ctx` of TSG `tsg_id`.
    pub fn bind(
        pid: u32,
        fd: u64,
        tsg_id: u64,
        runlist: u32,
        channels: u32,
        timeslice_us: u64,
        level: u32,
    ) -> NvSchedRecord {
        use gpu_trace_common::nvidia::gpu_ext::{bind as b, hook};
        record(
            pid,
            hook::BIND,
            fd,
            &ctx(&[
                (b::TSG_ID, tsg_id, 8),
                (b::RUNLIST_ID, runlist.into(), 4),
                (b::CHANNEL_COUNT, channels.into(), 4),
                (b::TIMESLICE_US, timeslice_us, 8),
                (b::INTERLEAVE_LEVEL, level.into(), 4),
                (b::ALLOW, 1, 4),
            ]),
        )
    }

    /// `nv_gpu_task_destroy_ctx` of TSG `tsg_id`.
    pub fn task_destroy(pid: u32, fd: u64, tsg_id: u64) -> NvSchedRecord {
        use gpu_trace_common::nvidia::gpu_ext::{hook, task_destroy as t};
        record(pid, hook::TASK_DESTROY, fd, &ctx(&[(t::TSG_ID, tsg_id, 8)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_trace_common::nvidia::gpu_ext::{CTX_MAX, hook as h};

    #[test]
    fn each_hook_decodes_from_its_documented_layout() {
        let c = decode(&testing::task_init(7, 3, 5, 2048));
        assert_eq!(
            c.hook,
            Some(GxHook::TaskInit {
                tsg_id: 5,
                engine_type: 1,
                default_timeslice_us: 2048
            })
        );
        assert_eq!(c.syscall, Some((testing::SYS_IOCTL, 3)));
        let c = decode(&testing::bind(7, 3, 5, 13, 8, 1024, 2));
        assert_eq!(
            c.hook,
            Some(GxHook::Bind {
                tsg_id: 5,
                runlist_id: 13,
                channel_count: 8,
                timeslice_us: 1024,
                interleave: Some(Interleave::High),
                allow: true
            })
        );
        assert_eq!(
            decode(&testing::task_destroy(7, 3, 5)).hook,
            Some(GxHook::TaskDestroy { tsg_id: 5 })
        );
        let tok = testing::record(
            7,
            h::TOKEN_REQUEST,
            3,
            &testing::ctx(&[(0, 0x21, 4), (8, 5, 8), (16, 0x000d_0021, 4)]),
        );
        assert_eq!(
            decode(&tok).hook,
            Some(GxHook::TokenRequest {
                channel_id: 0x21,
                tsg_id: 5,
                token: 0x000d_0021
            })
        );
    }

    #[test]
    fn unreadable_unknown_or_outside_a_syscall_is_said_so() {
        let mut r = testing::bind(7, 3, 5, 13, 8, 1024, 9);
        assert!(matches!(
            decode(&r).hook,
            Some(GxHook::Bind {
                interleave: None,
                ..
            })
        ));
        r.ctx_len = 0;
        assert_eq!(decode(&r).hook, None);
        // Every hook: a context of another length than its layout's is not read.
        for hook in [h::TASK_INIT, h::BIND, h::TOKEN_REQUEST, h::TASK_DESTROY] {
            let mut other = testing::task_init(7, 3, 5, 2048);
            (other.hook, other.ctx_len) = (hook, 4);
            assert_eq!(decode(&other).hook, None, "hook {hook}");
        }
        r.hook = 99;
        r.ctx_len = CTX_MAX as u32;
        assert_eq!(decode(&r).hook, None);
        r.syscall_nr = u32::MAX;
        assert_eq!(decode(&r).syscall, None);
    }
}
