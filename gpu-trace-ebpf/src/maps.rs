//! Every map of the kernel programs, by the name the loader finds it under
//! (`gpu-trace/src/loader/`), with the small accessors that only read or set one map.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use gpu_trace_common::{
    CGROUP_MATCH_MAX, CgroupMatch,
    api::{
        API_SUMS_DEFAULT, ApiKey, ApiLookupFrame, ApiRanges, ApiStack, ApiStat, ApiThroughKey,
        api_counter, api_switch,
    },
    counter, switch,
};

/// Records to userspace. Userspace sets the size (`--ring-size`). Written only through
/// `pipe.rs`.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Per-CPU counters, indexed by `gpu_trace_common::counter`.
#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Run-time switches (`gpu_trace_common::switch`): what the driver hooks serve
/// (`probes/kfd_ioctl.rs`, `probes/nv_ioctl.rs`, `probes/nv_close.rs`), which the syscall layer
/// leaves alone, so that no call is reported twice. Read through `config.rs`.
#[map]
pub(crate) static SWITCHES: Array<u32> = Array::with_max_entries(switch::COUNT, 0);

/// Processes that issued at least one traced ioctl (tgid → [`TRACK_NV`] | [`TRACK_KFD`]): their
/// exit is reported, and, for NVIDIA users, their `close()` calls.
#[map]
pub(crate) static TRACKED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// [`TRACKED`] bit: the process used an NVIDIA device (RM objects die with their fd: report
/// `close()`).
pub(crate) const TRACK_NV: u32 = 1;
/// [`TRACKED`] bit: the process used `/dev/kfd` (KFD queues live as long as the process's
/// address space, not its fd: only the exit is reported).
pub(crate) const TRACK_KFD: u32 = 2;

/// Sets `bit` in the process's [`TRACKED`] entry.
#[inline(always)]
pub(crate) fn mark_tracked(tgid: u32, bit: u32) {
    // SAFETY: map value pointer, read once.
    let old = match TRACKED.get_ptr(tgid) {
        Some(p) => unsafe { *p },
        None => 0,
    };
    if old & bit == 0 {
        let _ = TRACKED.insert(tgid, old | bit, 0);
    }
}

/// Whether the process used an NVIDIA device (its `close()` calls are reported).
#[inline(always)]
pub(crate) fn tracked_nv(tgid: u32) -> bool {
    // SAFETY: map value pointer, read once.
    TRACKED
        .get_ptr(tgid)
        .is_some_and(|p| unsafe { *p } & TRACK_NV != 0)
}

/// Classic-tracepoint fallback only: the ioctl arguments seen at entry, by thread id.
#[map]
pub(crate) static PENDING_IOCTL: HashMap<u32, IoctlArgs> = HashMap::with_max_entries(16384, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IoctlArgs {
    pub(crate) fd: u64,
    pub(crate) cmd: u64,
    pub(crate) arg: u64,
}

/// Classic-tracepoint fallback only: the fd of a pending `close()`, by thread id.
#[map]
pub(crate) static PENDING_CLOSE: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// The process and fd through which a traced call first used an NVIDIA file, by `struct file *`
/// (LRU: a file whose release was missed cannot fill the map).
#[map]
pub(crate) static NV_FILES: LruHashMap<u64, NvFile> = LruHashMap::with_max_entries(16384, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct NvFile {
    pub(crate) tgid: u32,
    pub(crate) fd: i32,
    pub(crate) comm: [u8; 16],
}

/// Kprobe variant only: the NVIDIA ioctl handler's arguments at entry, by thread.
#[map]
pub(crate) static NV_ENTRY_ARGS: HashMap<u64, NvEntryArgs> = HashMap::with_max_entries(4096, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct NvEntryArgs {
    pub(crate) file: u64,
    pub(crate) cmd: u64,
    pub(crate) arg: u64,
}

/// KFD handler kprobes: `filep` and `data` at entry, by pid_tgid, for the return probe.
#[map]
pub(crate) static KFD_HANDLER_ARGS: HashMap<u64, KfdEntryArgs> = HashMap::with_max_entries(4096, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct KfdEntryArgs {
    pub(crate) a: u64,
    pub(crate) b: u64,
}

/// DQM `create_queue_*` kprobe: the `struct queue *` at entry, by pid_tgid.
#[map]
pub(crate) static DQM_CREATE_ARGS: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

/// `--cgroup` / `--container` subtrees (the first `filter_cgroups` entries).
#[map]
pub(crate) static CGROUP_FILTER: Array<CgroupMatch> = Array::with_max_entries(CGROUP_MATCH_MAX, 0);

/// `--deny-cgroup` / `--deny-container` subtrees (the first `deny_cgroups` entries).
#[map]
pub(crate) static DENY_CGROUP: Array<CgroupMatch> = Array::with_max_entries(CGROUP_MATCH_MAX, 0);

/// The cgroup id last sent (or tried) for each process (tgid → id). LRU: an evicted process is
/// sent again, which costs one record and loses nothing.
#[map]
pub(crate) static CGROUP_SENT: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Denied processes alive at once, the `--deny-pid` processes and everything they created
/// since (or before: userspace adds the descendants it finds at start). The loader's
/// `DENY_MAX` must match.
pub(crate) const DENY_MAX: u32 = 16384;

/// Denied processes: tgid → 1. Filled by userspace before attach, then by `deny_fork`
/// (`probes/sched_process_fork.rs`); an entry ends with its process
/// (`probes/sched_process_exit.rs`).
#[map]
pub(crate) static DENY: HashMap<u32, u32> = HashMap::with_max_entries(DENY_MAX, 0);

/// The API layer (`probes/api_call.rs`): each thread's open API calls, by pid_tgid (LRU: the
/// entries of threads that ended cannot fill it). The driver hooks may read it later to tag
/// their events with the open call.
#[map]
pub(crate) static API_OPEN: LruHashMap<u64, ApiStack> = LruHashMap::with_max_entries(16384, 0);

/// One empty open-call stack, never written (the kernel zeroes array maps): a thread's first
/// `API_OPEN` entry is copied from it, since the stack is larger than a program's 512-byte
/// stack frame.
#[map]
pub(crate) static API_EMPTY: Array<ApiStack> = Array::with_max_entries(1, 0);

/// The API layer's completed calls, by process and attach cookie (library and symbol), per CPU
/// (no atomics needed; userspace adds the CPUs up). Read by `gpu-trace api` each interval;
/// sized by userspace at load (`--api-sums`), which removes the entries of processes that
/// ended once their sums are read when the map fills up. A call whose entry cannot be made
/// (full) is counted in `API_COUNTERS`.
#[map]
pub(crate) static API_STATS: PerCpuHashMap<ApiKey, ApiStat> =
    PerCpuHashMap::with_max_entries(API_SUMS_DEFAULT, 0);

/// What the API layer could not count (`api_counter`), per CPU.
#[map]
pub(crate) static API_COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(api_counter::COUNT, 0);

/// The API layer's switches (`gpu_trace_common::api::api_switch`), set by userspace.
#[map]
pub(crate) static API_SWITCHES: Array<u32> = Array::with_max_entries(api_switch::COUNT, 0);

/// Recursion reported already, by (thread, cookie) (LRU: bounded, and a forgotten entry only
/// costs one more report).
#[map]
pub(crate) static API_REPORTED: LruHashMap<[u64; 2], u8> = LruHashMap::with_max_entries(4096, 0);

/// Processes gpu-trace started (`-- CMD`, and those they create), by tgid: `api_loaded` stops
/// them at each change of their link map until userspace has attached what they loaded, so
/// that no call of a library they `dlopen` is missed.
#[map]
pub(crate) static API_HOLD: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// Lookups in flight (`probes/api_lookup.rs`), by (pid_tgid, the stack pointer the call
/// returns with): nested lookups (a shim's `dlsym` calling libc's) each find their own.
#[map]
pub(crate) static API_LOOKUPS: LruHashMap<[u64; 2], ApiLookupFrame> =
    LruHashMap::with_max_entries(4096, 0);

/// Each traced process's interposer code ranges (userspace writes them at each read of the
/// process): `api_entry` counts a call whose caller is in one in `API_THROUGH` (LRU: the
/// entries of processes that ended cannot fill it).
#[map]
pub(crate) static API_RANGES: LruHashMap<u32, ApiRanges> = LruHashMap::with_max_entries(4096, 0);

/// Calls by (process, interposer library, cookie) entered from the interposer's code, per CPU
/// (the path verdict's `through` for hooks no symbol table shows).
#[map]
pub(crate) static API_THROUGH: PerCpuHashMap<ApiThroughKey, u64> =
    PerCpuHashMap::with_max_entries(API_SUMS_DEFAULT, 0);
