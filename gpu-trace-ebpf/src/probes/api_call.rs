//! `api_entry` / `api_return`: the API layer's uprobe and uretprobe (issue 28), attached by
//! `gpu-trace api` per process to every table symbol of every library mapped in it. Entry
//! pushes the call on the thread's stack (`API_OPEN`); return pops it and adds it to the
//! process's count, time, latency histogram and errors for that library and symbol
//! (`API_STATS`). Nothing goes to the ring: userspace reads the map each interval.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpu_trace_common::api::{API_HIST_BUCKETS, API_STACK_MAX, ApiFrame, ApiKey, ApiStack, ApiStat};

use crate::maps::{API_OPEN, API_STATS};

#[uprobe]
pub fn api_entry(ctx: ProbeContext) -> u32 {
    let _ = try_api_entry(&ctx);
    0
}

#[inline(always)]
fn try_api_entry(ctx: &ProbeContext) -> Option<()> {
    // SAFETY: the helper reads the attach's cookie from the context the kernel passed.
    let cookie = unsafe { generated::bpf_get_attach_cookie(ctx.as_ptr()) };
    let id = bpf_get_current_pid_tgid();
    // SAFETY: helper without arguments.
    let now = unsafe { generated::bpf_ktime_get_ns() };
    if API_OPEN.get_ptr_mut(id).is_none() {
        let fresh = ApiStack {
            depth: 0,
            dropped: 0,
            frames: [ApiFrame::default(); API_STACK_MAX],
        };
        API_OPEN.insert(id, fresh, 0).ok()?;
    }
    let stack = API_OPEN.get_ptr_mut(id)?;
    // SAFETY: map value pointer of this thread's entry; only this thread writes it.
    let stack = unsafe { &mut *stack };
    let depth = stack.depth as usize;
    if depth < API_STACK_MAX {
        stack.frames[depth] = ApiFrame {
            cookie,
            entry_ns: now,
        };
    } else {
        stack.dropped = stack.dropped.wrapping_add(1);
    }
    stack.depth = stack.depth.wrapping_add(1);
    Some(())
}

#[uretprobe]
pub fn api_return(ctx: RetProbeContext) -> u32 {
    let _ = try_api_return(&ctx);
    0
}

#[inline(always)]
fn try_api_return(ctx: &RetProbeContext) -> Option<()> {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: helper without arguments.
    let now = unsafe { generated::bpf_ktime_get_ns() };
    let stack = API_OPEN.get_ptr_mut(id)?;
    // SAFETY: map value pointer of this thread's entry; only this thread writes it.
    let stack = unsafe { &mut *stack };
    if stack.depth == 0 {
        return None;
    }
    stack.depth -= 1;
    let depth = stack.depth as usize;
    if depth >= API_STACK_MAX {
        return None;
    }
    let frame = stack.frames[depth];
    let ret: u64 = ctx.ret();
    let key = ApiKey {
        tgid: (id >> 32) as u32,
        _pad: 0,
        cookie: frame.cookie,
    };
    if API_STATS.get_ptr_mut(&key).is_none() {
        let zero = ApiStat {
            count: 0,
            errors: 0,
            total_ns: 0,
            hist: [0; API_HIST_BUCKETS],
        };
        let _ = API_STATS.insert(&key, &zero, 0);
    }
    let stat = API_STATS.get_ptr_mut(&key)?;
    let ns = now.saturating_sub(frame.entry_ns);
    let bucket = (64 - ns.leading_zeros() as usize).min(API_HIST_BUCKETS - 1);
    // SAFETY: this CPU's copy of the map value (per-CPU map: programs on one CPU do not run
    // concurrently, as for `pipe::bump`).
    let stat = unsafe { &mut *stat };
    stat.count += 1;
    stat.total_ns += ns;
    if ret as u32 != 0 {
        stat.errors += 1;
    }
    if bucket < API_HIST_BUCKETS {
        stat.hist[bucket] += 1;
    }
    Some(())
}
