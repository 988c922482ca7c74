//! The one way to the ring buffer: every record is reserved in `EVENTS` or its drop is counted
//! ([`reserve`]), filled in place and [`submit`]ted, or, for a small record built whole
//! beforehand, copied in ([`send`]); every record sent is counted, so that `emitted + dropped`
//! is what the programs tried to send. Also the header every record starts with and the per-CPU counters.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, generated},
    maps::ring_buf::RingBufEntry,
};
use gpu_trace_common::{RecordHeader, TaskRecord, counter};

use crate::maps::{COUNTERS, EVENTS};

/// Counts one event of `gpu_trace_common::counter` `index`.
#[inline(always)]
pub(crate) fn bump(index: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot of this CPU; programs on one CPU do not run concurrently.
        unsafe { *p += 1 };
    }
}

/// The header of a record of `kind` sent by the current task, now.
#[inline(always)]
pub(crate) fn header(kind: u32) -> RecordHeader {
    let pid_tgid = bpf_get_current_pid_tgid();
    RecordHeader {
        kind,
        // SAFETY: helpers without arguments.
        cpu: unsafe { generated::bpf_get_smp_processor_id() },
        ts_ns: unsafe { generated::bpf_ktime_get_ns() },
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        comm: bpf_get_current_comm().unwrap_or([0u8; 16]),
    }
}

/// Reserves a `T` in the ring for a record filled in place (every field written before
/// [`submit`]), or counts the drop (ring full).
#[inline(always)]
pub(crate) fn reserve<T: 'static>() -> Option<RingBufEntry<T>> {
    let Some(entry) = EVENTS.reserve::<T>(0) else {
        bump(counter::DROPPED);
        return None;
    };
    Some(entry)
}

/// Hands a record [`reserve`]d and filled in place to userspace and counts it (and a failed
/// read in it).
#[inline(always)]
pub(crate) fn submit<T>(entry: RingBufEntry<T>, read_failed: bool) {
    entry.submit(0);
    if read_failed {
        bump(counter::READ_FAILED);
    }
    bump(counter::EMITTED);
}

/// Sends a small record built whole beforehand, copied by `bpf_ringbuf_output` and counted like
/// every other record. Not through [`reserve`]: a reservation is a reference the verifier
/// tracks, and Linux 6.1's verifier (which compares reference ids exactly when it prunes) then
/// never found two paths through `cgroup::note` (a send on the way to the NVIDIA record's own
/// reservation) equal: the driver entry point's kretprobe went past 1 000 000 instructions
/// processed and was refused (the lab's `z.nv_entry` on 6.1 and a stalled start on 5.10).
#[inline(always)]
pub(crate) fn send<T: 'static>(rec: &T) -> bool {
    if EVENTS.output::<T>(rec, 0).is_err() {
        bump(counter::DROPPED);
        false
    } else {
        bump(counter::EMITTED);
        true
    }
}

/// Sends a [`TaskRecord`] of `kind` (`FD_CLOSE`, `PROCESS_EXIT`) for the current task.
#[inline(always)]
pub(crate) fn emit_task(kind: u32, value: i32) {
    send(&TaskRecord {
        hdr: header(kind),
        value,
        _pad: 0,
    });
}

const SIGSTOP: u32 = 19;
const SIGCONT: u32 = 18;

/// Stops the current process (SIGSTOP) when `hold`, **before** its record goes out: userspace,
/// woken by the record on another CPU, may continue the process (SIGCONT) before this program
/// ends, and a stop generated after that continue would never be undone (a `-- CMD` left
/// stopped, found by a CI run). Returns whether the process is stopped; the caller puts that
/// in the record, sends it, and calls [`unhold`] if the record could not go.
#[inline(always)]
pub(crate) fn hold(hold: bool) -> bool {
    // SAFETY: the helper signals the current process; no pointers.
    hold && unsafe { generated::bpf_send_signal(SIGSTOP) } == 0
}

/// Undoes [`hold`] for a record that could not be sent (nobody would continue the process): a
/// SIGCONT generated before the stop is delivered discards it.
#[inline(always)]
pub(crate) fn unhold(held: bool, sent: bool) {
    if held && !sent {
        // SAFETY: as in `hold`.
        unsafe { generated::bpf_send_signal(SIGCONT) };
    }
}
