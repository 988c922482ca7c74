//! The API layer's maps (issue 28): what the uprobe programs (`gpu-trace-ebpf/src/probes/
//! api_call.rs`) keep per thread and add up per process, library and symbol, read by
//! `gpu-trace api` (`gpu-trace/src/api/trace.rs`).
//!
//! Each attach carries a cookie: the library's id in the high 32 bits, the symbol's id in the
//! low 32 (both userspace's numbering, per run).

use core::mem::size_of;

use crate::RecordHeader;

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
    /// The stack pointer the call returns with (x86-64: the entry's plus the return address it
    /// pops; arm64: the entry's): a return is matched to its frame by it, and a frame whose
    /// `sp` is below the thread's stack pointer is one the thread has left (a longjmp, an
    /// exception, a return the kernel did not report).
    pub sp: u64,
    /// The return address at entry (x86-64: the word at the stack pointer; arm64: the link
    /// register): a new call from the same place with the same `sp` means this one is over.
    pub ret_addr: u64,
}

/// A thread's open calls (`API_OPEN`, by pid_tgid): the driver hooks may read it later to tag
/// their events with the open API call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiStack {
    /// Frames kept (at most [`API_STACK_MAX`], or the `MAX_DEPTH` switch): the calls open
    /// now, outermost first, as far as they are known.
    pub depth: u32,
    /// Calls this thread made past the kept frames (counted, not timed).
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
    /// Calls entered (counted at entry: a call whose return is never seen still counts).
    pub count: u64,
    /// Calls whose return was matched to their entry: the ones `total_ns` and `hist` hold.
    pub timed: u64,
    /// Calls whose return value (as a 32-bit status: CUresult, cudaError_t, hipError_t) was
    /// not 0.
    pub errors: u64,
    pub total_ns: u64,
    pub hist: [u64; API_HIST_BUCKETS],
}

const _: () = assert!(size_of::<ApiFrame>() == 32);
const _: () = assert!(size_of::<ApiStack>() == 8 + 32 * API_STACK_MAX);
const _: () = assert!(size_of::<ApiKey>() == 16);
const _: () = assert!(size_of::<ApiStat>() == 32 + 8 * API_HIST_BUCKETS);

/// [`ApiCallRecord`]'s type tag (the API layer's own ring; not a driver record).
pub const API_CALL: u32 = 0x20;
/// [`ApiRecursionRecord`]'s type tag.
pub const API_RECURSION: u32 = 0x21;

/// `API_SWITCHES` indexes (`Array<u32>`, set by userspace before attach).
pub mod api_switch {
    /// 1: send one [`super::ApiCallRecord`] per completed call (`gpu-trace api -v`).
    pub const VERBOSE: u32 = 0;
    /// Calls open at once on a thread past which the entry program reports recursion and
    /// stops keeping frames (`--max-depth`, at most [`super::API_STACK_MAX`]).
    pub const MAX_DEPTH: u32 = 1;
    pub const COUNT: u32 = 2;
}

/// `API_COUNTERS` indexes (`PerCpuArray<u64>`, added up by userspace): what the API layer's
/// programs could not count.
pub mod api_counter {
    /// Calls not counted: their (process, symbol) had no entry in `API_STATS` and the map
    /// was full.
    pub const UNCOUNTED: u32 = 0;
    /// Calls through an interposer not counted: `API_THROUGH` was full.
    pub const THROUGH_UNCOUNTED: u32 = 1;
    pub const COUNT: u32 = 2;
}

/// Entries of `API_STATS` and `API_THROUGH` (per (process, symbol)) unless the run sets
/// another size (`--api-sums`).
pub const API_SUMS_DEFAULT: u32 = 16_384;

/// [`ApiLoadedRecord`]'s type tag.
pub const API_LOADED: u32 = 0x22;

/// A process's dynamic linker changed its list of loaded objects (`_dl_debug_state`, the
/// breakpoint debuggers use: after every `dlopen`/`dlclose` and at start-up): userspace reads
/// the process again and attaches what it loaded. Consumed by the live run, never recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiLoadedRecord {
    pub hdr: RecordHeader,
    /// 1: the kernel stopped the process (SIGSTOP) until userspace has attached and sends
    /// SIGCONT (a process in `API_HOLD`: one gpu-trace started).
    pub held: u32,
    pub _pad: u32,
}

const _: () = assert!(size_of::<ApiLoadedRecord>() == size_of::<RecordHeader>() + 8);

/// Code ranges of a process's interposers kept for the kernel (`API_RANGES`).
pub const API_RANGES_MAX: usize = 8;

/// One executable mapping of an interposer: `[start, end)` and its library id (this run's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiRange {
    pub start: u64,
    pub end: u64,
    pub lib: u64,
}

/// A process's interposer code ranges (`API_RANGES`, by tgid): a call entered from inside one
/// is counted for that library too (`API_THROUGH`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiRanges {
    pub ranges: [ApiRange; API_RANGES_MAX],
}

/// `API_THROUGH`'s key: calls of `cookie` in `tgid` whose caller's code is in library `lib`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiThroughKey {
    pub tgid: u32,
    pub lib: u32,
    pub cookie: u64,
}

const _: () = assert!(size_of::<ApiRange>() == 24);
const _: () = assert!(size_of::<ApiRanges>() == 24 * API_RANGES_MAX);
const _: () = assert!(size_of::<ApiThroughKey>() == 16);

/// [`ApiHandoutRecord`]'s type tag.
pub const API_HANDOUT: u32 = 0x23;

/// The attach cookie's bit of a lookup probe (`api_lookup`) whose function has
/// `cuGetProcAddress`'s shape: the symbol's name in the first argument, the address written
/// through the second (`cuGetProcAddress*`, `cudaGetDriverEntryPoint*`, `hipGetProcAddress`).
/// Without it: `dlsym`'s shape (the name in the second argument, the address returned).
pub const LOOKUP_PROCADDRESS: u64 = 1 << 63;

/// A lookup call in flight on a thread (`API_LOOKUPS`, keyed by thread and the stack pointer
/// it returns with): what its return needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiLookupFrame {
    /// The name's address in the caller's memory.
    pub name: u64,
    /// Where the address is written (`cuGetProcAddress`'s shape), else 0.
    pub out: u64,
    pub cookie: u64,
}

const _: () = assert!(size_of::<ApiLookupFrame>() == 24);

/// A lookup (`dlsym`, `dlvsym`, `cuGetProcAddress*`, `cudaGetDriverEntryPoint*`,
/// `hipGetProcAddress`, in whichever library defines one) returned an address: the name asked
/// for and what was handed out. Userspace finds the code behind the address and, when it is not
/// the real provider's export, probes it (a hidden hook). Consumed by the live run, never
/// recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiHandoutRecord {
    pub hdr: RecordHeader,
    /// The lookup probe's cookie (its library and function; [`LOOKUP_PROCADDRESS`] set or not).
    pub cookie: u64,
    /// The address handed out (0: nothing found).
    pub addr: u64,
    /// 1: the kernel stopped the process (SIGSTOP, a process in `API_HOLD`, a name starting
    /// with `cu` or `hip`) until userspace has probed what was handed out and sends SIGCONT.
    pub held: u32,
    pub _pad: u32,
    /// The name asked for, NUL-padded (cut at [`API_NAME_MAX`] - 1 bytes).
    pub name: [u8; API_NAME_MAX],
}

const _: () =
    assert!(size_of::<ApiHandoutRecord>() == size_of::<RecordHeader>() + 24 + API_NAME_MAX);

/// One completed call (`-v`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiCallRecord {
    pub hdr: RecordHeader,
    pub cookie: u64,
    /// The cookie of the call one level out on this thread (0: none).
    pub caller_cookie: u64,
    pub duration_ns: u64,
    /// The return register as it was.
    pub ret: u64,
    /// Calls open on the thread when this one started (0: outermost).
    pub depth: u32,
    pub _pad: u32,
}

/// A symbol re-entered on a thread through the same library, or a thread past the depth cap:
/// the thread's open calls, outermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiRecursionRecord {
    pub hdr: RecordHeader,
    /// The call that re-entered (or went past the cap).
    pub cookie: u64,
    /// Calls open on the thread, this one included.
    pub depth: u32,
    /// 1: past the depth cap; 0: re-entered.
    pub past_cap: u32,
    /// The open calls' cookies, outermost first (the first `min(depth, API_STACK_MAX)`).
    pub chain: [u64; API_STACK_MAX],
}

const _: () = assert!(size_of::<ApiCallRecord>() == size_of::<RecordHeader>() + 40);
const _: () =
    assert!(size_of::<ApiRecursionRecord>() == size_of::<RecordHeader>() + 16 + 8 * API_STACK_MAX);

/// [`crate::record_kind::API_TAG`]: the innermost call open on the thread and the one outside
/// it, sent by the ioctl programs (NVIDIA and AMD KFD) just before their own record, with the same header
/// (kind aside): userspace pairs the two by thread and time.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "wire", derive(FromBytes, IntoBytes, KnownLayout, Immutable))]
pub struct ApiTagRecord {
    pub hdr: RecordHeader,
    /// The innermost open call's cookie.
    pub inner: u64,
    /// The cookie of the call one level out (0: none).
    pub outer: u64,
    /// Calls open on the thread.
    pub depth: u32,
    pub _pad: u32,
}

/// Longest symbol or library name an [`ApiContextRecord`] carries (longer ones are cut).
pub const API_NAME_MAX: usize = 64;

const _: () = assert!(size_of::<ApiTagRecord>() == size_of::<RecordHeader>() + 24);
