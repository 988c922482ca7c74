//! Per-handle state with a ceiling: any process that can open `/dev/nvidiactl` or `/dev/kfd`
//! can name as many distinct handles as it likes, so what the trackers remember per handle is
//! capped per process and in total, forgotten when its process exits, and what is not
//! remembered is counted (`untracked_handles`, docs/events.md "Bounded state").

use std::collections::{BTreeMap, HashMap};

/// Handles remembered per process (objects created while traced are always remembered: the
/// driver bounds how many exist).
pub const MAX_HANDLES_PER_PROCESS: usize = 4096;

/// Handles remembered over all processes (about 40 bytes each).
pub const MAX_HANDLES: usize = 65_536;

/// The generation of the last task seen per `(pid, object)`: what makes a [`TaskKey`] unique
/// in a run when a handle is reused.
///
/// [`TaskKey`]: crate::model::event::TaskKey
#[derive(Clone, Debug, Default)]
pub struct Generations<K: Ord + Copy> {
    map: BTreeMap<(u32, K), u32>,
    per_pid: HashMap<u32, usize>,
}

impl<K: Ord + Copy> Generations<K> {
    pub fn get(&self, pid: u32, object: K) -> Option<u32> {
        self.map.get(&(pid, object)).copied()
    }

    /// Sets the generation of `(pid, object)`. A new entry is refused (`false`) past
    /// [`MAX_HANDLES_PER_PROCESS`] or [`MAX_HANDLES`] unless `created` (the object was seen
    /// created).
    pub fn set(&mut self, pid: u32, object: K, generation: u32, created: bool) -> bool {
        if let Some(g) = self.map.get_mut(&(pid, object)) {
            *g = generation;
            return true;
        }
        let n = self.per_pid.entry(pid).or_default();
        if !created && (*n >= MAX_HANDLES_PER_PROCESS || self.map.len() >= MAX_HANDLES) {
            if *n == 0 {
                self.per_pid.remove(&pid);
            }
            return false;
        }
        *n += 1;
        self.map.insert((pid, object), generation);
        true
    }

    /// Process `pid` exited: its handles are forgotten (a later process with the same id
    /// starts again at generation 1; the two never overlap in time).
    pub fn forget_process(&mut self, pid: u32)
    where
        K: Bounded,
    {
        if self.per_pid.remove(&pid).is_some() {
            let doomed: Vec<(u32, K)> = self
                .map
                .range((pid, K::MIN)..=(pid, K::MAX))
                .map(|(&k, _)| k)
                .collect();
            for k in doomed {
                self.map.remove(&k);
            }
        }
    }

    /// Handles remembered now.
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
        assert_eq!(g.len(), MAX_HANDLES);
        assert!(!g.set(9999, 1, 1, false));
        // An exit makes room, and leaves the others.
        g.forget_process(1);
        assert_eq!(g.get(1, 0), None);
        assert_eq!(g.get(2, 0), Some(1));
        assert!(g.set(9999, 1, 1, false));
        assert_eq!(g.len(), MAX_HANDLES - MAX_HANDLES_PER_PROCESS);
    }
}
