//! The kernel's per-process call sums as userspace reads them, one owner for both commands
//! (`gpu-trace api`, the main trace's `--api`): `API_STATS` (calls, errors, times per
//! (process, symbol)) and `API_THROUGH` (calls entered from an interposer's code), summed over
//! the CPUs, and `API_COUNTERS` (calls the programs could not count).
//!
//! Bounded: the maps hold `--api-sums` entries each (16 384 by default) and are not LRU (an
//! eviction would lose counts no one read). Once a map is half full, each read moves the
//! entries of processes that no longer exist (read just now: nothing more can come) out of
//! the kernel into [`Sums`]' own store, which every later read still returns, so the tables,
//! records and verdicts are what they would be without the move. That store keeps at most
//! [`KEPT_MAX`] entries (about 6 MiB); past it the oldest processes' are forgotten and counted
//! ([`Sums::forgotten`]).
//! A call whose entry cannot be made (more live (process, symbol) pairs than the map holds)
//! is counted by the kernel as not counted and said at the end ([`Sums::uncounted`]).

use std::collections::{HashMap, VecDeque};

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray, PerCpuHashMap},
};
use gpu_trace_common::api::{API_HIST_BUCKETS, ApiKey, ApiStat, ApiThroughKey, api_counter};
use gpu_trace_common::zerocopy::{FromBytes as _, IntoBytes as _};

/// Entries of ended processes kept in userspace at most (each about 360 bytes).
pub const KEPT_MAX: usize = 16_384;

const KEY_LEN: usize = size_of::<ApiKey>();
const STAT_LEN: usize = size_of::<ApiStat>();
const THROUGH_KEY_LEN: usize = size_of::<ApiThroughKey>();

/// One read of both maps: (process, cookie) sums and (process, interposer, cookie) calls.
pub struct Read {
    pub sums: Vec<(ApiKey, ApiStat)>,
    pub through: Vec<(ApiThroughKey, u64)>,
}

/// What the programs could not count, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uncounted {
    /// Calls with no `API_STATS` entry (the map was full).
    pub calls: u64,
    /// Calls through an interposer with no `API_THROUGH` entry (full).
    pub through: u64,
}

impl Uncounted {
    /// The warning for the end of the run (`None` when everything was counted).
    pub fn warning(&self, capacity: u32) -> Option<String> {
        if self.calls == 0 && self.through == 0 {
            return None;
        }
        Some(format!(
            "warning: {} API calls were not counted ({} of the calls through interposers): \
             more (process, symbol) pairs were alive at once than the kernel's sums hold \
             ({capacity}); run again with a larger --api-sums",
            self.calls, self.through
        ))
    }
}

/// The sums of ended processes moved out of the kernel, and the maps' size.
pub struct Sums {
    capacity: u32,
    /// Entries of the store at most ([`KEPT_MAX`]; tests lower it).
    kept_max: usize,
    retired: HashMap<(u32, u64), ApiStat>,
    retired_through: HashMap<(u32, u32, u64), u64>,
    /// Processes in the order they were retired (the oldest forgotten first).
    order: VecDeque<u32>,
    /// Entries of ended processes forgotten past the store's bound (not in later reads).
    pub forgotten: u64,
}

impl Sums {
    /// For maps of `capacity` entries each (the size the programs were loaded with).
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity,
            kept_max: KEPT_MAX,
            retired: HashMap::new(),
            retired_through: HashMap::new(),
            order: VecDeque::new(),
            forgotten: 0,
        }
    }

    /// The maps' size.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Both maps now, with the sums of the ended processes moved out before. Past half full,
    /// the entries of processes gone are moved out of the kernel ([module](self)).
    pub fn read(&mut self, ebpf: &mut Ebpf) -> Read {
        let mut sums = read_stats(ebpf);
        let mut through = read_through(ebpf);
        let half = (self.capacity as usize).div_ceil(2);
        if sums.len() >= half || through.len() >= half {
            self.retire(ebpf, &sums, &through);
            // Moved: in the store now, returned from there once.
            sums.retain(|(k, _)| !self.retired.contains_key(&(k.tgid, k.cookie)));
            through.retain(|(k, _)| {
                !self
                    .retired_through
                    .contains_key(&(k.tgid, k.lib, k.cookie))
            });
        }
        sums.extend((self.retired.iter()).map(|(&(tgid, cookie), s)| (key(tgid, cookie), *s)));
        through.extend(
            self.retired_through
                .iter()
                .map(|(&(tgid, lib, cookie), &n)| (ApiThroughKey { tgid, lib, cookie }, n)),
        );
        Read { sums, through }
    }

    /// Moves the entries of the processes of `sums`/`through` that no longer exist out of the
    /// kernel's maps into the store (a process read after its end: nothing more can come).
    fn retire(
        &mut self,
        ebpf: &mut Ebpf,
        sums: &[(ApiKey, ApiStat)],
        through: &[(ApiThroughKey, u64)],
    ) {
        let mut gone: HashMap<u32, bool> = HashMap::new();
        let mut ended = |pid: u32| {
            *gone
                .entry(pid)
                .or_insert_with(|| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        };
        let stats: Vec<_> = sums.iter().filter(|(k, _)| ended(k.tgid)).collect();
        let paths: Vec<_> = through.iter().filter(|(k, _)| ended(k.tgid)).collect();
        let (mut moved, mut moved_through) = (Vec::new(), Vec::new());
        if let Some(Ok(mut map)) = ebpf
            .map_mut("API_STATS")
            .map(PerCpuHashMap::<&mut MapData, [u8; KEY_LEN], [u8; STAT_LEN]>::try_from)
        {
            for (k, s) in stats {
                let mut bytes = [0u8; KEY_LEN];
                bytes.copy_from_slice(k.as_bytes());
                if map.remove(&bytes).is_ok() {
                    moved.push(((k.tgid, k.cookie), *s));
                }
            }
        }
        if let Some(Ok(mut map)) = ebpf
            .map_mut("API_THROUGH")
            .map(PerCpuHashMap::<&mut MapData, [u8; THROUGH_KEY_LEN], u64>::try_from)
        {
            for (k, n) in paths {
                let mut bytes = [0u8; THROUGH_KEY_LEN];
                bytes.copy_from_slice(k.as_bytes());
                if map.remove(&bytes).is_ok() {
                    moved_through.push(((k.tgid, k.lib, k.cookie), *n));
                }
            }
        }
        let pids = gone.into_iter().filter(|&(_, g)| g).map(|(pid, _)| pid);
        self.keep(moved, moved_through, pids);
    }

    /// Keeps the entries moved out of the kernel, of the processes `pids` (ended, in the order
    /// they were found so), then forgets the oldest processes' past the store's bound.
    fn keep(
        &mut self,
        moved: Vec<((u32, u64), ApiStat)>,
        moved_through: Vec<((u32, u32, u64), u64)>,
        pids: impl IntoIterator<Item = u32>,
    ) {
        self.retired.extend(moved);
        self.retired_through.extend(moved_through);
        self.order.extend(pids);
        while self.retired.len() + self.retired_through.len() > self.kept_max {
            let Some(pid) = self.order.pop_front() else {
                break;
            };
            let before = self.retired.len() + self.retired_through.len();
            self.retired.retain(|&(tgid, _), _| tgid != pid);
            self.retired_through.retain(|&(tgid, _, _), _| tgid != pid);
            self.forgotten += (before - self.retired.len() - self.retired_through.len()) as u64;
        }
    }

    /// What the programs could not count so far.
    pub fn uncounted(ebpf: &Ebpf) -> Uncounted {
        let Some(Ok(map)) = ebpf
            .map("API_COUNTERS")
            .map(PerCpuArray::<&MapData, u64>::try_from)
        else {
            return Uncounted::default();
        };
        let sum = |i| map.get(&i, 0).map_or(0, |v| v.iter().sum());
        Uncounted {
            calls: sum(api_counter::UNCOUNTED),
            through: sum(api_counter::THROUGH_UNCOUNTED),
        }
    }
}

fn key(tgid: u32, cookie: u64) -> ApiKey {
    ApiKey {
        tgid,
        _pad: 0,
        cookie,
    }
}

/// The kernel's `API_STATS` map summed over CPUs: per (process, cookie), the calls so far.
/// Empty when the object has no such map (the programs not loaded).
fn read_stats(ebpf: &Ebpf) -> Vec<(ApiKey, ApiStat)> {
    let Some(Ok(map)) = ebpf
        .map("API_STATS")
        .map(PerCpuHashMap::<&MapData, [u8; KEY_LEN], [u8; STAT_LEN]>::try_from)
    else {
        return Vec::new();
    };
    let mut sums = Vec::new();
    for (k, per_cpu) in map.iter().flatten() {
        let Ok(key) = ApiKey::read_from_bytes(&k) else {
            continue;
        };
        let mut stat = ApiStat {
            count: 0,
            timed: 0,
            errors: 0,
            total_ns: 0,
            hist: [0; API_HIST_BUCKETS],
        };
        for s in per_cpu
            .iter()
            .filter_map(|v| ApiStat::read_from_bytes(v).ok())
        {
            stat.count += s.count;
            stat.timed += s.timed;
            stat.errors += s.errors;
            stat.total_ns += s.total_ns;
            for (a, b) in stat.hist.iter_mut().zip(s.hist) {
                *a += b;
            }
        }
        sums.push((key, stat));
    }
    sums
}

/// The kernel's `API_THROUGH` map summed over CPUs.
fn read_through(ebpf: &Ebpf) -> Vec<(ApiThroughKey, u64)> {
    let Some(Ok(map)) = ebpf
        .map("API_THROUGH")
        .map(PerCpuHashMap::<&MapData, [u8; THROUGH_KEY_LEN], u64>::try_from)
    else {
        return Vec::new();
    };
    map.iter()
        .filter_map(Result::ok)
        .filter_map(|(k, v)| Some((ApiThroughKey::read_from_bytes(&k).ok()?, v.iter().sum())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(count: u64) -> ApiStat {
        ApiStat {
            count,
            timed: count,
            errors: 0,
            total_ns: 0,
            hist: [0; API_HIST_BUCKETS],
        }
    }

    /// Past the store's bound the oldest ended processes' entries go first, all of a process
    /// at once, counted; the newer ones stay.
    #[test]
    fn the_oldest_ended_processes_are_forgotten_first_and_counted() {
        let mut sums = Sums::new(8);
        sums.kept_max = 4;
        sums.keep(
            vec![((1, 7), stat(1)), ((1, 8), stat(2))],
            vec![((1, 3, 7), 1)],
            [1],
        );
        sums.keep(vec![((2, 7), stat(3))], vec![], [2]);
        assert_eq!((sums.retired.len(), sums.forgotten), (3, 0));
        sums.keep(vec![((3, 7), stat(4)), ((3, 8), stat(5))], vec![], [3]);
        // 6 > 4: process 1's three entries go (it ended first); 2 and 3 stay.
        assert_eq!(sums.forgotten, 3);
        let mut left: Vec<_> = sums.retired.keys().copied().collect();
        left.sort();
        assert_eq!(left, [(2, 7), (3, 7), (3, 8)]);
        assert!(sums.retired_through.is_empty());
    }
}
