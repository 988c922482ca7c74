//! The API layer's maps (issue 28): what the uprobe programs (`gpu-trace-ebpf/src/probes/
//! api_call.rs`) keep per thread and add up per process, library and symbol, read by
//! `gpu-trace api` (`gpu-trace/src/api/trace.rs`).
//!
//! Each attach carries a cookie: the library's id in the high 32 bits, the symbol's id in the
//! low 32 (both userspace's numbering, per run).

use core::mem::size_of;

#[cfg(feature = "wire")]
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Open calls kept per thread; deeper calls are counted ([`ApiStack::dropped`]), not timed.
pub const API_STACK_MAX: usize = 16;

/// Latency histogram buckets: bucket `i` holds calls of `2^(i-1) ≤ ns < 2^i` (0 ns in 0; the
/// last bucket holds everything longer).
pub const API_HIST_BUCKETS: usize = 40;

/// One open call of a thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiFrame {
    /// The attach cookie: library id << 32 | symbol id.
    pub cookie: u64,
    /// `bpf_ktime_get_ns()` at entry.
    pub entry_ns: u64,
}

/// A thread's open calls (`API_OPEN`, by pid_tgid): the driver hooks may read it later to tag
/// their events with the open API call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiStack {
    /// Calls open now (may exceed [`API_STACK_MAX`]: the deeper ones are not kept).
    pub depth: u32,
    /// Calls past [`API_STACK_MAX`] this thread made (not timed).
    pub dropped: u32,
    pub frames: [ApiFrame; API_STACK_MAX],
}

/// `API_STATS` key: one process's calls of one symbol of one library.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiKey {
    pub tgid: u32,
    pub _pad: u32,
    pub cookie: u64,
}

/// `API_STATS` value: the completed calls.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiStat {
    pub count: u64,
    /// Calls whose return value (as a 32-bit status: CUresult, cudaError_t, hipError_t) was
    /// not 0.
    pub errors: u64,
    pub total_ns: u64,
    pub hist: [u64; API_HIST_BUCKETS],
}

const _: () = assert!(size_of::<ApiFrame>() == 16);
const _: () = assert!(size_of::<ApiStack>() == 8 + 16 * API_STACK_MAX);
const _: () = assert!(size_of::<ApiKey>() == 16);
const _: () = assert!(size_of::<ApiStat>() == 24 + 8 * API_HIST_BUCKETS);
