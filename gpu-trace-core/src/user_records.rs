//! Record kinds written by userspace, never by the kernel (issue 38: out of the crate shared
//! with the kernel programs): the live run makes them from what it reads (a cgroup's path, the
//! names behind a cookie, the kernel's call sums) and puts them in the pipeline and the
//! recording beside the kernel's records, so that a replay sees what the live run saw. Same
//! rules as the kernel's wire types: `#[repr(C)]`, explicit padding, size asserts, the
//! [`RecordHeader`] (its kind) first.

use gpu_trace_common::RecordHeader;
use gpu_trace_common::api::{API_HIST_BUCKETS, API_NAME_MAX};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Their kinds (`RecordHeader::kind`), in the range the kernel's kinds never use.
pub mod user_kind {
    /// [`super::AttributionHead`] and a path: written by userspace, never by the kernel. A live
    /// run resolves each `TASK_CGROUP` record (cgroup path, the process's own PID in its PID
    /// namespace) and puts this record after it in the recording and in the pipeline, so that
    /// a replay on another machine attributes events as the live run did.
    pub const ATTRIBUTION: u32 = 0x100;
    /// [`super::ApiContextRecord`]: written by userspace, never by the kernel. A live run
    /// resolves each `API_TAG` (its cookies) into the symbol and library names and puts this
    /// record after it, so that a replay names the calls as the live run did.
    pub const API_CONTEXT: u32 = 0x101;
    /// [`super::ApiSymbolRecord`]: written by userspace: the names behind an attach
    /// cookie, before any record that carries it.
    pub const API_SYMBOL: u32 = 0x102;
    /// [`super::ApiStatsRecord`]: written by userspace: a process's calls of one
    /// cookie so far, as the kernel summed them.
    pub const API_STATS: u32 = 0x103;
}

/// What userspace learnt about a `TaskCgroupRecord`'s process (the head of a
/// [`user_kind::ATTRIBUTION`] record; `path_len` bytes of cgroup path follow, 56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct AttributionHead {
    /// A copy of the `TaskCgroupRecord`'s header with `kind` set to ATTRIBUTION.
    pub hdr: RecordHeader,
    pub cgroup_id: u64,
    /// The process's PID in its own PID namespace (`NSpid` in /proc), 0 when it is the host
    /// PID or could not be read.
    pub ns_pid: u32,
    /// Bytes of the cgroup path (relative to the cgroup2 root, starting with `/`) that follow;
    /// 0 when it could not be resolved (the cgroup was gone).
    pub path_len: u32,
}

/// Longest cgroup path an [`user_kind::ATTRIBUTION`] record carries.
pub const ATTRIBUTION_PATH_MAX: usize = 4096;

const _: () = assert!(size_of::<AttributionHead>() == 56);

/// One call's names in an [`ApiContextRecord`], NUL padded.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct ApiNames {
    pub symbol: [u8; API_NAME_MAX],
    /// The library's file name (no directory).
    pub library: [u8; API_NAME_MAX],
}

/// [`user_kind::API_CONTEXT`]: an `ApiTagRecord` resolved by userspace into names
/// (header copied from the tag, kind aside).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct ApiContextRecord {
    pub hdr: RecordHeader,
    /// Calls open on the thread (the tag's).
    pub depth: u32,
    /// 1: `outer` holds the call one level out; 0: the innermost call was the only one.
    pub has_outer: u32,
    pub inner: ApiNames,
    pub outer: ApiNames,
}

const _: () = assert!(size_of::<ApiNames>() == 2 * API_NAME_MAX);
const _: () =
    assert!(size_of::<ApiContextRecord>() == size_of::<RecordHeader>() + 8 + 4 * API_NAME_MAX);

/// [`user_kind::API_SYMBOL`]: written by userspace, never by the kernel. The names
/// behind one attach cookie of this run (`gpu-trace --api`), sent once per cookie before any
/// record that carries it (`API_CALL`, `API_RECURSION`, `API_STATS`), so that a replay names the
/// calls as the live run did. `hdr.tgid` is the process it was first attached for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct ApiSymbolRecord {
    pub hdr: RecordHeader,
    pub cookie: u64,
    pub names: ApiNames,
}

/// [`user_kind::API_STATS`]: written by userspace, never by the kernel. One
/// process's completed calls of one cookie (library and symbol) since the start of the run, as
/// the kernel's `API_STATS` map holds them summed over CPUs (`gpu-trace --api`: read every
/// second, sent when they changed, and at the end). `hdr.tgid` is the process; `hdr.ts_ns` the
/// time of the read.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct ApiStatsRecord {
    pub hdr: RecordHeader,
    pub cookie: u64,
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub hist: [u64; API_HIST_BUCKETS],
}

const _: () =
    assert!(size_of::<ApiSymbolRecord>() == size_of::<RecordHeader>() + 8 + 2 * API_NAME_MAX);
const _: () =
    assert!(size_of::<ApiStatsRecord>() == size_of::<RecordHeader>() + 32 + 8 * API_HIST_BUCKETS);
