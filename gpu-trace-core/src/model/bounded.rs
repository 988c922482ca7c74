//! Per-handle state with a ceiling: any process that can open `/dev/nvidiactl` or `/dev/kfd`
//! can name as many distinct handles as it likes, so what the trackers remember per handle is
//! capped per process and in total, forgotten when its process exits, and what is not
//! remembered is counted (`untracked_handles`, docs/events.md "Bounded state").

use std::{
    collections::{BTreeMap, HashMap},
    hash::{BuildHasherDefault, Hasher},
};

/// A map keyed by an id the kernel assigns (process or thread id), looked up for every record:
/// hashed by a multiply-and-fold instead of the standard library's keyed SipHash, which is
/// there against keys an adversary picks. Traced processes do not pick their ids; handles,
/// which they can pick, stay in ordered maps.
pub type PidMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// The hasher of [`PidMap`].
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing; the fold brings the well-mixed high bits down to the low bits
        // that pick the bucket.
        let h = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

/// Handles never seen created remembered per process.
pub const MAX_HANDLES_PER_PROCESS: usize = 4096;

/// Handles never seen created remembered over all processes (about 40 bytes each).
pub const MAX_HANDLES: usize = 65_536;

/// The generation of the last task seen per `(pid, object)`: what makes a [`TaskKey`] unique
/// in a run when a handle is reused. Objects seen created are always remembered, for the whole
/// run (a PID reused by a new process still gets new keys; the driver bounds how many objects
/// exist). Objects only named (calls on handles never seen created) are capped per process and
/// in total, and forgotten when their process exits.
///
/// [`TaskKey`]: crate::event::TaskKey
#[derive(Clone, Debug, Default)]
pub struct Generations<K: Ord + Copy> {
    /// Generation, and whether an object of that handle was seen created.
    map: BTreeMap<(u32, K), (u32, bool)>,
    /// Entries never seen created, per process, and in all.
    unseen_per_pid: PidMap<usize>,
    unseen: usize,
}

impl<K: Ord + Copy> Generations<K> {
    pub fn get(&self, pid: u32, object: K) -> Option<u32> {
        self.map.get(&(pid, object)).map(|&(g, _)| g)
    }

    /// Sets the generation of `(pid, object)`; `created`: an object of that handle was seen
    /// created. A new entry not `created` is refused (`false`) past [`MAX_HANDLES_PER_PROCESS`]
    /// or [`MAX_HANDLES`].
    pub fn set(&mut self, pid: u32, object: K, generation: u32, created: bool) -> bool {
        if let Some(e) = self.map.get_mut(&(pid, object)) {
            if created && !e.1 {
                // Now seen created: no longer counted among the unseen.
                self.unseen -= 1;
                if let Some(n) = self.unseen_per_pid.get_mut(&pid) {
                    *n -= 1;
                    if *n == 0 {
                        self.unseen_per_pid.remove(&pid);
                    }
                }
            }
            *e = (generation, e.1 || created);
            return true;
        }
        if !created {
            let n = self.unseen_per_pid.get(&pid).copied().unwrap_or(0);
            if n >= MAX_HANDLES_PER_PROCESS || self.unseen >= MAX_HANDLES {
                return false;
            }
            *self.unseen_per_pid.entry(pid).or_default() += 1;
            self.unseen += 1;
        }
        self.map.insert((pid, object), (generation, created));
        true
    }

    /// Process `pid` exited: the handles it only named are forgotten (those of objects seen
    /// created stay, so that a later process with the same id gets new generations).
    pub fn forget_process(&mut self, pid: u32)
    where
        K: Bounded,
    {
        let Some(n) = self.unseen_per_pid.remove(&pid) else {
            return;
        };
        let doomed: Vec<(u32, K)> = self
            .map
            .range((pid, K::MIN)..=(pid, K::MAX))
            .filter(|(_, v)| !v.1)
            .map(|(&k, _)| k)
            .collect();
        for k in doomed {
            self.map.remove(&k);
        }
        self.unseen -= n;
    }

    /// Handles remembered now (seen created or not).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The least and greatest object of a key type (for a process's range).
pub trait Bounded {
    const MIN: Self;
    const MAX: Self;
}

impl Bounded for u32 {
    const MIN: u32 = 0;
    const MAX: u32 = u32::MAX;
}

impl Bounded for (u32, u32) {
    const MIN: (u32, u32) = (0, 0);
    const MAX: (u32, u32) = (u32::MAX, u32::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Process ids that differ only above the bits a table's size uses still land in
    /// different buckets: the hash folds its high bits down.
    #[test]
    fn pid_hashes_spread_ids_that_share_their_low_bits() {
        use std::hash::BuildHasher;
        let build = std::hash::BuildHasherDefault::<IdHasher>::default();
        let buckets: std::collections::BTreeSet<u64> = (1..=1024u32)
            .map(|k| build.hash_one(k << 12) & 0xfff)
            .collect();
        assert!(buckets.len() > 600, "{} of 1024 buckets", buckets.len());
        let mut m = PidMap::default();
        for pid in (0..4096u32).map(|k| k << 12) {
            m.insert(pid, pid);
        }
        assert!((0..4096u32).all(|k| m.get(&(k << 12)) == Some(&(k << 12))));
    }

    #[test]
    fn unseen_handles_are_capped_per_process_and_in_total_and_forgotten_at_exit() {
        let mut g = Generations::<u32>::default();
        let per = MAX_HANDLES_PER_PROCESS as u32;
        for h in 0..per + 10 {
            g.set(1, h, 1, false);
        }
        assert_eq!(g.len(), MAX_HANDLES_PER_PROCESS);
        // Created objects are remembered past the cap.
        assert!(g.set(1, per + 20, 1, true));
        // Known entries are updated whatever the caps.
        assert!(g.set(1, 0, 7, false));
        assert_eq!(g.get(1, 0), Some(7));
        // The total: many processes.
        let procs = (MAX_HANDLES / MAX_HANDLES_PER_PROCESS) as u32 + 2;
        for pid in 2..2 + procs {
            for h in 0..per {
                g.set(pid, h, 1, false);
            }
        }
        assert_eq!(g.len(), MAX_HANDLES + 1);
        assert!(!g.set(9999, 1, 1, false));
        // An exit makes room, and leaves the others; what the process created stays.
        g.forget_process(1);
        assert_eq!(g.get(1, 0), None);
        assert_eq!(g.get(1, per + 20), Some(1));
        assert_eq!(g.get(2, 0), Some(1));
        assert!(g.set(9999, 1, 1, false));
        assert_eq!(g.len(), MAX_HANDLES - MAX_HANDLES_PER_PROCESS + 2);
    }

    #[test]
    fn a_named_handle_later_created_counts_no_more_against_the_cap() {
        let mut g = Generations::<u32>::default();
        let per = MAX_HANDLES_PER_PROCESS as u32;
        for h in 0..per {
            g.set(1, h, 1, false);
        }
        assert!(!g.set(1, per, 1, false));
        // Handle 0 is now created (a TSG allocated under it): room for one more unseen.
        g.set(1, 0, 2, true);
        assert!(g.set(1, per, 1, false));
        g.forget_process(1);
        assert_eq!(g.len(), 1);
        assert_eq!(g.get(1, 0), Some(2));
    }

    /// The total cap too: a handle of one process seen created makes room for an unseen one
    /// of another.
    #[test]
    fn a_handle_later_created_makes_room_under_the_total_cap() {
        let mut g = Generations::<u32>::default();
        assert!(g.is_empty());
        let per = MAX_HANDLES_PER_PROCESS as u32;
        for pid in 1..=(MAX_HANDLES / MAX_HANDLES_PER_PROCESS) as u32 {
            for h in 0..per {
                assert!(g.set(pid, h, 1, false));
            }
        }
        assert!(!g.set(9999, 0, 1, false), "the total cap reached");
        assert!(!g.is_empty());
        g.set(1, 0, 2, true);
        assert!(g.set(9999, 0, 1, false), "room for one");
        assert!(!g.set(9999, 1, 1, false), "and only one");
    }
}
