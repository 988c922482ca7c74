//! `api_loaded`: a uprobe on the dynamic linker's `_dl_debug_state` in each target of the API
//! layer (issue 37), the function glibc's `ld.so` calls after every change of the list of
//! loaded objects (`dlopen`, `dlclose`, start-up): it tells userspace at once, with an
//! `API_LOADED` record, so that a library loaded after start is attached before the program
//! calls it, not at the next rescan. A process gpu-trace started (`API_HOLD`) is stopped
//! (SIGSTOP, before the record goes out: `pipe::hold`); userspace continues it (SIGCONT) once
//! the library's probes are on. Not stopped when the record could not be sent (nobody would
//! continue it: `pipe::unhold`).

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::uprobe, programs::ProbeContext};
use gpu_trace_common::api::{API_LOADED, ApiLoadedRecord};

use crate::maps::API_HOLD;
use crate::pipe::{header, hold, send, unhold};

#[uprobe]
pub fn api_loaded(_ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a map lookup by value.
    let held = hold(unsafe { API_HOLD.get(&tgid) }.is_some());
    let sent = send(&ApiLoadedRecord {
        hdr: header(API_LOADED),
        held: u32::from(held),
        _pad: 0,
    });
    unhold(held, sent);
    0
}
