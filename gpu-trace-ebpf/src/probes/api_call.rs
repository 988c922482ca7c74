//! `api_entry` / `api_return`: the API layer's uprobe and uretprobe (issue 28), attached by
//! `gpu-trace api` per process to every table symbol of every library mapped in it.
//!
//! A call is **counted at its entry** (`API_STATS.count`), so a call whose return the kernel
//! never reports still counts: the kernel omits return probes past 64 nested ones on a thread,
//! a `longjmp` or an exception leaves a call without returning, and a probe attached while the
//! thread is inside a call sees a return without its entry. The entry pushes a frame on the
//! thread's stack (`API_OPEN`) with the stack pointer the call will return with and its return
//! address; a return is **matched to its frame by the stack pointer**: frames below it are
//! ones the thread has left (dropped), and a return with no frame of its own (a call entered
//! before the attach, or past the kept frames) changes nothing. The matched return adds the
//! call's time, latency bucket and error to the process's sums (`API_STATS.timed`, `total_ns`,
//! `hist`, `errors`). An entry drops the frames the thread has left too (below its stack
//! pointer, or at the same one from the same return address: the earlier call is over), so a
//! stale frame never lasts past the thread's next call. The ring gets a record per matched
//! call only with `-v` (`API_CALL`), and one per (thread, symbol) when a call re-enters a
//! symbol of the same library or goes past the kept frames (`API_RECURSION`).
//!
//! Each program comes twice, the same body under two sections: `api_entry`/`api_return` for
//! one perf-event uprobe per symbol, `api_entry_multi`/`api_return_multi` (`uprobe.multi`) for
//! one batched link per (process, library, direction) — the kernel takes a program for one
//! kind of attach only, fixed when it is loaded.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpu_trace_common::api::{
    API_CALL, API_HIST_BUCKETS, API_RANGES_MAX, API_RECURSION, API_STACK_MAX, ApiCallRecord,
    ApiFrame, ApiKey, ApiRecursionRecord, ApiStack, ApiStat, ApiThroughKey, api_counter,
    api_switch,
};

use crate::maps::{
    API_COUNTERS, API_EMPTY, API_OPEN, API_RANGES, API_REPORTED, API_STATS, API_SWITCHES,
    API_THROUGH,
};
use crate::pipe::{header, reserve, send, submit};

#[inline(always)]
fn switch(i: u32) -> u32 {
    API_SWITCHES.get(i).copied().unwrap_or(0)
}

/// What the stack pointer at entry is plus, to be the one the call returns with: the return
/// address it pops on x86-64; nothing on arm64 (the return address is in the link register).
#[cfg(bpf_target_arch = "x86_64")]
pub(super) const RETURN_SP_ADJ: u64 = 8;
#[cfg(not(bpf_target_arch = "x86_64"))]
pub(super) const RETURN_SP_ADJ: u64 = 0;

/// The user stack pointer in a uprobe's or uretprobe's registers.
#[inline(always)]
pub(super) fn user_sp(regs: *const core::ffi::c_void) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: a kprobe-type context is the user's pt_regs; a field read.
        unsafe { (*regs.cast::<aya_ebpf::bindings::pt_regs>()).rsp }
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        // SAFETY: as above (arm64's context is user_pt_regs).
        unsafe { (*regs.cast::<aya_ebpf::bindings::user_pt_regs>()).sp }
    }
}

/// The return address at a uprobe on a function's first instruction.
#[inline(always)]
fn return_address(regs: *const core::ffi::c_void, sp: u64) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let _ = regs;
        // SAFETY: a user-memory read by the helper, which fails cleanly.
        unsafe { aya_ebpf::helpers::bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let _ = sp;
        // SAFETY: as in `user_sp`; x30 is the link register.
        unsafe { (*regs.cast::<aya_ebpf::bindings::user_pt_regs>()).regs[30] }
    }
}

#[uprobe]
pub fn api_entry(ctx: ProbeContext) -> u32 {
    let _ = try_api_entry(&ctx);
    0
}

#[uprobe(multi)]
pub fn api_entry_multi(ctx: ProbeContext) -> u32 {
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
    let entry_sp = user_sp(ctx.as_ptr());
    let sp = entry_sp.wrapping_add(RETURN_SP_ADJ);
    let ret_addr = return_address(ctx.as_ptr(), entry_sp);
    count(id, cookie);
    through(id, cookie, ret_addr);
    if API_OPEN.get_ptr_mut(id).is_none() {
        // SAFETY: a map value pointer, read only (see `API_EMPTY`).
        let empty = unsafe { &*API_EMPTY.get_ptr(0)? };
        API_OPEN.insert(id, empty, 0).ok()?;
    }
    let stack = API_OPEN.get_ptr_mut(id)?;
    // SAFETY: map value pointer of this thread's entry; only this thread writes it.
    let stack = unsafe { &mut *stack };
    // Frames are kept outermost first, their `sp` never rising: the ones the thread has left
    // are a run at the top.
    let mut depth = (stack.depth as usize).min(API_STACK_MAX);
    for i in 0..API_STACK_MAX {
        if i >= depth {
            break;
        }
        let f = &stack.frames[i];
        if f.sp < sp || (f.sp == sp && f.ret_addr == ret_addr) {
            depth = i;
            break;
        }
    }
    let cap = (switch(api_switch::MAX_DEPTH) as usize).clamp(1, API_STACK_MAX);
    stack.depth = depth as u32;
    let mut again = false;
    for i in 0..API_STACK_MAX {
        if i >= depth {
            break;
        }
        again |= stack.frames[i].cookie == cookie;
    }
    if again || depth >= cap {
        report_recursion(id, cookie, stack, depth >= cap);
    }
    if depth < cap {
        let i = depth & (API_STACK_MAX - 1);
        stack.frames[i] = ApiFrame {
            cookie,
            entry_ns: now,
            sp,
            ret_addr,
        };
        stack.depth = depth as u32 + 1;
    } else {
        stack.dropped = stack.dropped.wrapping_add(1);
    }
    Some(())
}

/// One more call `API_COUNTERS[index]` says was not counted.
#[inline(always)]
fn uncounted(index: u32) {
    if let Some(p) = API_COUNTERS.get_ptr_mut(index) {
        // SAFETY: this CPU's slot; programs on one CPU do not run concurrently.
        unsafe { *p += 1 };
    }
}

/// The process's sums for `cookie`; `entry`: a call's entry, which makes them at the first
/// call (a return only adds to sums its entry made: a call not counted stays out).
#[inline(always)]
fn sums(id: u64, cookie: u64, entry: bool) -> Option<&'static mut ApiStat> {
    let key = ApiKey {
        tgid: (id >> 32) as u32,
        _pad: 0,
        cookie,
    };
    if entry && API_STATS.get_ptr_mut(&key).is_none() {
        let zero = ApiStat {
            count: 0,
            timed: 0,
            errors: 0,
            total_ns: 0,
            hist: [0; API_HIST_BUCKETS],
        };
        if API_STATS.insert(&key, &zero, 0).is_err() {
            // Full: the call is counted as not counted, never lost silently.
            uncounted(api_counter::UNCOUNTED);
            return None;
        }
    }
    let stat = API_STATS.get_ptr_mut(&key)?;
    // SAFETY: this CPU's copy of the map value (per-CPU map: programs on one CPU do not run
    // concurrently, as for `pipe::bump`).
    Some(unsafe { &mut *stat })
}

/// A call whose caller's code is in one of its process's interposers (`API_RANGES`) counts for
/// that interposer too (`API_THROUGH`): the call went through it, hook exported or not.
#[inline(always)]
fn through(id: u64, cookie: u64, ret_addr: u64) {
    let tgid = (id >> 32) as u32;
    // SAFETY: a map lookup by value; the value is only read.
    let Some(r) = (unsafe { API_RANGES.get(&tgid) }) else {
        return;
    };
    for i in 0..API_RANGES_MAX {
        let range = &r.ranges[i];
        if range.end == 0 {
            return;
        }
        if ret_addr >= range.start && ret_addr < range.end {
            let key = ApiThroughKey {
                tgid,
                lib: range.lib as u32,
                cookie,
            };
            match API_THROUGH.get_ptr_mut(&key) {
                // SAFETY: this CPU's copy of the value (per-CPU map, as in `sums`).
                Some(n) => unsafe { *n += 1 },
                None => {
                    if API_THROUGH.insert(&key, &1, 0).is_err() {
                        uncounted(api_counter::THROUGH_UNCOUNTED);
                    }
                }
            }
            return;
        }
    }
}

/// One more call of `cookie` in the process.
#[inline(always)]
fn count(id: u64, cookie: u64) {
    if let Some(stat) = sums(id, cookie, true) {
        stat.count += 1;
    }
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
    // Filled in place: the record is too large to build on the program's stack.
    let rec = entry.as_mut_ptr();
    // SAFETY: the reserved record, written field by field before it is submitted.
    unsafe {
        (*rec).hdr = header(API_RECURSION);
        (*rec).cookie = cookie;
        (*rec).depth = stack.depth.wrapping_add(1);
        (*rec).past_cap = u32::from(past_cap);
        for i in 0..API_STACK_MAX {
            (*rec).chain[i] = stack.frames[i].cookie;
        }
    }
    submit(entry, false);
}

#[uretprobe]
pub fn api_return(ctx: RetProbeContext) -> u32 {
    let _ = try_api_return(&ctx);
    0
}

#[uretprobe(multi)]
pub fn api_return_multi(ctx: RetProbeContext) -> u32 {
    let _ = try_api_return(&ctx);
    0
}

#[inline(always)]
fn try_api_return(ctx: &RetProbeContext) -> Option<()> {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: helper without arguments.
    let now = unsafe { generated::bpf_ktime_get_ns() };
    let sp = user_sp(ctx.as_ptr());
    let stack = API_OPEN.get_ptr_mut(id)?;
    // SAFETY: map value pointer of this thread's entry; only this thread writes it.
    let stack = unsafe { &mut *stack };
    // Frames below `sp` are calls the thread has left; the one at `sp` is this return's.
    let mut above = (stack.depth as usize).min(API_STACK_MAX);
    for i in 0..API_STACK_MAX {
        if i >= above {
            break;
        }
        if stack.frames[i].sp < sp {
            above = i;
            break;
        }
    }
    if above == 0 || stack.frames[(above - 1) & (API_STACK_MAX - 1)].sp != sp {
        // No frame of its own: entered before the attach, or past the kept frames.
        stack.depth = above as u32;
        return None;
    }
    let depth = above - 1;
    stack.depth = depth as u32;
    let frame = stack.frames[depth & (API_STACK_MAX - 1)];
    let caller_cookie = if depth > 0 {
        // A fresh, masked index: the verifier refuses a frame address derived backwards
        // from `frame`'s.
        let i = core::hint::black_box(depth - 1) & (API_STACK_MAX - 1);
        stack.frames[i].cookie
    } else {
        0
    };
    let ret: u64 = ctx.ret();
    let stat = sums(id, frame.cookie, false)?;
    let ns = now.saturating_sub(frame.entry_ns);
    let bucket = (64 - ns.leading_zeros() as usize).min(API_HIST_BUCKETS - 1);
    stat.timed += 1;
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
