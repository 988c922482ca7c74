//! `gpu-trace --api`'s tie of a driver record to the API call open on its thread: one place for
//! both vendors' ioctl paths.

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use gpu_trace_common::{
    RecordHeader,
    api::{API_STACK_MAX, ApiTagRecord},
    record_kind,
};

use crate::{maps::API_OPEN, pipe::send};

/// `gpu-trace --api`: the API calls open on this thread (`API_OPEN`, kept by the uprobes of
/// `probes/api_call.rs`), the innermost and the one outside it, sent as an `API_TAG` with the
/// driver record's header just before that record (NVIDIA's `nvidia.rs`, AMD's `amd.rs`). A plain lookup and a bounded copy, sent
/// without a reservation (`pipe::send`: none is held on the way to the record's own), and the
/// cookies copied are never branched on, so that the verifier's paths join again after it.
/// Without `--api` the map is empty and nothing is sent.
#[inline(always)]
pub(crate) fn api_tag(hdr: &RecordHeader) {
    let id = bpf_get_current_pid_tgid();
    let Some(stack) = API_OPEN.get_ptr(id) else {
        return;
    };
    // SAFETY: map value pointer, read only; the thread's own uprobes are the only writers.
    let stack = unsafe { &*stack };
    let depth = stack.depth;
    if depth == 0 {
        return;
    }
    let kept = (depth as usize).min(API_STACK_MAX);
    let inner = stack.frames[(kept - 1) & (API_STACK_MAX - 1)].cookie;
    let outer = if kept > 1 {
        stack.frames[(kept - 2) & (API_STACK_MAX - 1)].cookie
    } else {
        0
    };
    send(&ApiTagRecord {
        hdr: RecordHeader {
            kind: record_kind::API_TAG,
            ..*hdr
        },
        inner,
        outer,
        depth,
        _pad: 0,
    });
}
