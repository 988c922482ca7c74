//! `api_lookup` / `api_lookup_return`: the lookups a runtime or an interposer uses to find
//! entry points (issue 39) — `dlsym`/`dlvsym` in every library that defines them (libc's, and
//! a shim's own), `cuGetProcAddress*`, `cudaGetDriverEntryPoint*`, `hipGetProcAddress`. The
//! Two shapes, told apart by the attach cookie (`LOOKUP_PROCADDRESS`):
//! - `cuGetProcAddress(name, &pfn, …)`: the entry keeps where the name is and where the answer
//!   goes (`API_LOOKUPS`, by thread and the stack pointer the call returns with); the return
//!   sends what was handed out (`API_HANDOUT`: the name, the address), so that userspace can
//!   probe a hook that no symbol table exports.
//! - `dlsym(handle, name)`: **entry only**, the name sent at once with no address. A return
//!   probe replaces the return address on the stack, and glibc's `dlsym`/`dlvsym` read theirs
//!   to find the caller's object for `RTLD_NEXT`: with one on libc's `dlsym`, a shim's
//!   `dlvsym(RTLD_NEXT, "dlsym", …)` returned NULL and the traced program crashed.
//!
//! Like `api_call.rs`, each program comes twice (perf-event uprobe, batched link).

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_str_bytes, generated,
    },
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpu_trace_common::api::{
    API_HANDOUT, API_NAME_MAX, ApiHandoutRecord, ApiLookupFrame, LOOKUP_PROCADDRESS,
};

use super::api_call::{RETURN_SP_ADJ, user_sp};
use crate::maps::{API_HOLD, API_LOOKUPS};
use crate::pipe::{header, hold, send, unhold};

#[uprobe]
pub fn api_lookup(ctx: ProbeContext) -> u32 {
    let _ = try_lookup(&ctx);
    0
}

#[uprobe(multi)]
pub fn api_lookup_multi(ctx: ProbeContext) -> u32 {
    let _ = try_lookup(&ctx);
    0
}

#[inline(always)]
fn try_lookup(ctx: &ProbeContext) -> Option<()> {
    // SAFETY: the helper reads the attach's cookie from the context the kernel passed.
    let cookie = unsafe { generated::bpf_get_attach_cookie(ctx.as_ptr()) };
    let key = [
        bpf_get_current_pid_tgid(),
        user_sp(ctx.as_ptr()) + RETURN_SP_ADJ,
    ];
    // Both arguments read before the shape is looked at: a pointer into the context chosen by
    // a branch is refused by the verifier.
    let (first, second) = (ctx.arg::<u64>(0)?, ctx.arg::<u64>(1)?);
    if cookie & LOOKUP_PROCADDRESS == 0 {
        // `dlsym`'s shape: entry only, the name reported now (see the module's note).
        report(cookie, second, 0, false);
        return Some(());
    }
    let frame = ApiLookupFrame {
        name: first,
        out: second,
        cookie,
    };
    API_LOOKUPS.insert(&key, &frame, 0).ok()
}

#[uretprobe]
pub fn api_lookup_return(ctx: RetProbeContext) -> u32 {
    let _ = try_lookup_return(&ctx);
    0
}

#[uretprobe(multi)]
pub fn api_lookup_return_multi(ctx: RetProbeContext) -> u32 {
    let _ = try_lookup_return(&ctx);
    0
}

#[inline(always)]
fn try_lookup_return(ctx: &RetProbeContext) -> Option<()> {
    let key = [bpf_get_current_pid_tgid(), user_sp(ctx.as_ptr())];
    // SAFETY: a copy out of the map entry before it is removed.
    let frame = unsafe { *API_LOOKUPS.get(&key)? };
    let _ = API_LOOKUPS.remove(&key);
    let addr = if frame.out != 0 {
        // SAFETY: a user-memory read by the helper, which fails cleanly.
        unsafe { bpf_probe_read_user(frame.out as *const u64) }.ok()?
    } else {
        ctx.ret::<u64>()
    };
    report(frame.cookie, frame.name, addr, true);
    Some(())
}

/// Sends the `API_HANDOUT` of a lookup of the name at `name`: `addr` handed out (0 for
/// `dlsym`'s shape, seen at its entry). `may_hold`: a process gpu-trace started waits while a
/// GPU API name's answer is probed (a hidden hook is then counted from its first call); other
/// names (a Python extension's `PyInit_*`) never stop it.
#[inline(always)]
fn report(cookie: u64, name: u64, addr: u64, may_hold: bool) {
    let mut rec = ApiHandoutRecord {
        hdr: header(API_HANDOUT),
        cookie,
        addr,
        held: 0,
        _pad: 0,
        name: [0u8; API_NAME_MAX],
    };
    // SAFETY: the helper reads at most the buffer's length from user memory, failing cleanly.
    let _ = unsafe { bpf_probe_read_user_str_bytes(name as *const u8, &mut rec.name) };
    let gpu_name = (rec.name[0] == b'c' && rec.name[1] == b'u')
        || (rec.name[0] == b'h' && rec.name[1] == b'i' && rec.name[2] == b'p');
    let tgid = rec.hdr.tgid;
    // SAFETY: a map lookup by value.
    let held = hold(may_hold && addr != 0 && gpu_name && unsafe { API_HOLD.get(&tgid) }.is_some());
    rec.held = u32::from(held);
    let sent = send(&rec);
    unhold(held, sent);
}
