//! `api_entry` / `api_return`: the API layer's uprobe and uretprobe (issue 28), attached by
//! `gpu-trace api` per process to every table symbol of every library mapped in it. Entry
//! pushes the call on the thread's stack (`API_OPEN`); return pops it and adds it to the
//! process's count, time, latency histogram and errors for that library and symbol
//! (`API_STATS`), which userspace reads each interval. The ring gets a record per call only
//! with `-v` (`API_CALL`), and one per (thread, symbol) when a call re-enters a symbol of the
//! same library or goes past the depth cap (`API_RECURSION`).

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpu_trace_common::api::{
    API_CALL, API_HIST_BUCKETS, API_RECURSION, API_STACK_MAX, ApiCallRecord, ApiFrame, ApiKey,
    ApiRecursionRecord, ApiStack, ApiStat, api_switch,
};

use crate::maps::{API_OPEN, API_REPORTED, API_STATS, API_SWITCHES};
use crate::pipe::{header, reserve, send, submit};

#[inline(always)]
fn switch(i: u32) -> u32 {
    API_SWITCHES.get(i).copied().unwrap_or(0)
}

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
    let cap = (switch(api_switch::MAX_DEPTH) as usize).clamp(1, API_STACK_MAX);
    if depth < cap {
        let mut again = false;
        for i in 0..API_STACK_MAX {
            if i >= depth {
                break;
            }
            again |= stack.frames[i].cookie == cookie;
        }
        if again {
            report_recursion(id, cookie, stack, false);
        }
        if depth < API_STACK_MAX {
            stack.frames[depth] = ApiFrame {
                cookie,
                entry_ns: now,
            };
        }
    } else {
        if depth == cap {
            report_recursion(id, cookie, stack, true);
        }
        stack.dropped = stack.dropped.wrapping_add(1);
    }
    stack.depth = stack.depth.wrapping_add(1);
    Some(())
}

/// Sends `API_RECURSION` once per (thread, cookie): the call re-entered (`past_cap` 0) or
/// went past the depth cap (1; reported once per thread).
#[inline(always)]
fn report_recursion(id: u64, cookie: u64, stack: &ApiStack, past_cap: bool) {
    let key = [id, if past_cap { u64::MAX } else { cookie }];
    if API_REPORTED.get_ptr(&key).is_some() {
        return;
    }
    let _ = API_REPORTED.insert(&key, &1, 0);
    let Some(mut entry) = reserve::<ApiRecursionRecord>() else {
        return;
    };
    let mut chain = [0u64; API_STACK_MAX];
    for (i, c) in chain.iter_mut().enumerate() {
        *c = stack.frames[i].cookie;
    }
    entry.write(ApiRecursionRecord {
        hdr: header(API_RECURSION),
        cookie,
        depth: stack.depth.wrapping_add(1),
        past_cap: u32::from(past_cap),
        chain,
    });
    submit(entry, false);
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
    let cap = (switch(api_switch::MAX_DEPTH) as usize).clamp(1, API_STACK_MAX);
    // Past the cap the entry kept no frame.
    if depth >= cap || depth >= API_STACK_MAX {
        return None;
    }
    let frame = stack.frames[depth];
    let caller_cookie = if depth > 0 {
        // A fresh, masked index: the verifier refuses a frame address derived backwards
        // from `frame`'s.
        let i = core::hint::black_box(depth - 1) & (API_STACK_MAX - 1);
        stack.frames[i].cookie
    } else {
        0
    };
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
    if switch(api_switch::VERBOSE) != 0 {
        send(&ApiCallRecord {
            hdr: header(API_CALL),
            cookie: frame.cookie,
            caller_cookie,
            duration_ns: ns,
            ret,
            depth: depth as u32,
            _pad: 0,
        });
    }
    Some(())
}
