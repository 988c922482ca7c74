//! `--deny-pid` covers what the denied processes create: the kernel side (`deny_fork` in
//! `gpu-trace-ebpf/src/probes/sched_process_fork.rs`) adds every process a denied process
//! creates from the moment it is attached; this adds the descendants that already existed
//! when gpu-trace started, found by their parent in /proc.

use std::collections::{BTreeMap, BTreeSet};

/// Rounds of /proc reading at most: each round adds what the previous one could not see (a
/// process created by a descendant before that descendant was added to the map).
const ROUNDS: usize = 64;

/// Every process of `parents` (pid → parent's pid) that descends from one of `roots`, roots
/// excluded.
pub fn descendants(roots: &BTreeSet<u32>, parents: &BTreeMap<u32, u32>) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&pid, &ppid) in parents {
        if pid != ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = BTreeSet::new();
    let mut todo: Vec<u32> = roots.iter().copied().collect();
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map_or(&[][..], Vec::as_slice) {
            if !roots.contains(&c) && found.insert(c) {
                todo.push(c);
            }
        }
    }
    found
}

/// Each process's parent (`/proc/PID/stat`, field 4, the parent's tgid), for the processes
/// visible now; those that end while being read are left out.
pub fn proc_parents() -> BTreeMap<u32, u32> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = std::fs::read(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| stat_ppid(&s))
        {
            out.insert(pid, ppid);
        }
    }
    out
}

/// The parent's pid in a `/proc/PID/stat` line: the field after the state, after the last `)`
/// (the command name in parentheses may hold anything, `)` and spaces included).
fn stat_ppid(stat: &[u8]) -> Option<u32> {
    let end = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[end + 1..]).ok()?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// Adds the existing descendants of the denied `roots` with `insert` (which answers whether the
/// process was not there yet), reading /proc again until a round adds nothing (the kernel side
/// must be attached first: from then on it adds new processes itself). Returns how many were
/// added.
pub fn add_existing_descendants(
    roots: &BTreeSet<u32>,
    mut insert: impl FnMut(u32) -> Result<bool, String>,
) -> Result<usize, String> {
    let mut denied = roots.clone();
    let mut added = 0;
    for _ in 0..ROUNDS {
        let mut new = 0;
        for pid in descendants(&denied, &proc_parents()) {
            if insert(pid)? {
                new += 1;
            }
            denied.insert(pid);
        }
        added += new;
        if new == 0 {
            return Ok(added);
        }
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_follow_every_generation_and_nothing_else() {
        // 1 ← 10 ← 11 ← 12; 10 ← 13; 1 ← 20 ← 21; a cycle guard (30 ← 30).
        let parents: BTreeMap<u32, u32> = [
            (10, 1),
            (11, 10),
            (12, 11),
            (13, 10),
            (20, 1),
            (21, 20),
            (30, 30),
        ]
        .into_iter()
        .collect();
        let roots: BTreeSet<u32> = [10].into_iter().collect();
        assert_eq!(
            descendants(&roots, &parents),
            [11, 12, 13].into_iter().collect()
        );
        let roots: BTreeSet<u32> = [11, 21].into_iter().collect();
        assert_eq!(descendants(&roots, &parents), [12].into_iter().collect());
        let roots: BTreeSet<u32> = [30].into_iter().collect();
        assert!(descendants(&roots, &parents).is_empty());
    }

    #[test]
    fn stat_parent_survives_any_command_name() {
        assert_eq!(stat_ppid(b"42 (sh) S 7 42 42 0 -1"), Some(7));
        assert_eq!(stat_ppid(b"42 (a) b) S 9 42 42 0"), Some(9));
        assert_eq!(stat_ppid(b"42 (x y\nz) R 3 1"), Some(3));
        assert_eq!(stat_ppid(b"42 sh S 7"), None);
    }

    /// Real processes: a shell whose child forks a grandchild; all found from the shell.
    #[test]
    fn existing_descendants_are_found_in_proc() {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        let mut root = Command::new("sh")
            .args(["-c", "sh -c 'sleep 30 & echo $$ $!; wait' & wait"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(root.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ids: Vec<u32> = line
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        let roots: BTreeSet<u32> = [root.id()].into_iter().collect();
        let mut seen = Vec::new();
        let added = add_existing_descendants(&roots, |pid| {
            let new = !seen.contains(&pid);
            seen.push(pid);
            Ok(new)
        })
        .unwrap();
        let _ = Command::new("kill").arg(ids[1].to_string()).status();
        let _ = root.wait();
        assert_eq!(added, 2, "{seen:?}, expected {ids:?}");
        for id in ids {
            assert!(seen.contains(&id), "{id} not found: {seen:?}");
        }
        // Not this test's own process, not the root's parent.
        assert!(!seen.contains(&std::process::id()));
    }
}

/// The kernel side, on this kernel: `deny_fork` and the exit hook, attached by the loader's
/// own `follow_forks`, with real processes. Needs no BPF LSM (only the map is checked).
#[cfg(test)]
mod kernel_tests {
    use std::{
        collections::BTreeSet,
        io::{BufRead, BufReader, Write},
        process::{Command, Stdio},
        time::{Duration, Instant},
    };

    use aya::{EbpfLoader, maps::HashMap as BpfHashMap};
    use gpu_trace_common::KernelConfig;

    use gpu_trace_core::skip::skipped;

    use crate::probe::btf::{self, KernelBtf};

    /// gpu-trace's kernel object loaded on this kernel as the loader loads it, or `None` (said
    /// as a skip of `test`) where this process cannot load it (not root, no kernel BTF).
    fn load_programs(test: &str) -> Option<aya::Ebpf> {
        // SAFETY: no arguments.
        if unsafe { libc::geteuid() } != 0 {
            skipped(test, "needs root");
            return None;
        }
        let kbtf = match KernelBtf::load() {
            Ok(k) => k,
            Err(e) => {
                skipped(test, format!("no kernel BTF: {e}"));
                return None;
            }
        };
        let config = KernelConfig {
            ready: 1,
            ..btf::kernel_offsets(&kbtf.vmlinux).unwrap()
        };
        super::super::raise_memlock_limit();
        Some(
            {
                let mut loader = EbpfLoader::new();
                if let Some(b) = kbtf.aya.as_ref() {
                    loader.btf(b);
                }
                loader
            }
            .override_global("CONFIG", &config, true)
            .load(super::super::PROGRAMS)
            .expect("gpu-trace's kernel object loads"),
        )
    }

    /// Whether `pid` is in the deny map, waiting up to 2 s for `want` (an exit is seen by the
    /// kernel program a moment after the process ended).
    fn denied_becomes(ebpf: &aya::Ebpf, pid: u32, want: bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let map: BpfHashMap<_, u32, u32> =
                BpfHashMap::try_from(ebpf.map("DENY").unwrap()).unwrap();
            let now = map.get(&pid, 0).is_ok();
            if now == want || Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn read_ids(out: &mut impl BufRead) -> Vec<u32> {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect()
    }

    #[test]
    fn deny_fork_follows_processes_not_threads() {
        let Some(mut ebpf) = load_programs("deny_fork_follows_processes_not_threads") else {
            return;
        };
        // The verifier must accept both programs on this kernel: a refusal is a failure.
        super::super::attach_raw_tp(
            crate::targets::PROCESS_EXIT.raw_program,
            crate::targets::PROCESS_EXIT.name,
        )(&mut ebpf)
        .expect("process_exit_raw attaches");

        // A process that is not descended from a denied one: never denied.
        let mut outsider = Command::new("sleep").arg("30").spawn().unwrap();

        // The denied root, with a child that exists before gpu-trace starts.
        let mut root = Command::new("sh")
            .args([
                "-c",
                "sleep 30 & echo $!; read go; sh -c 'sleep 30 & echo $$ $!'; read stop",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(root.stdout.take().unwrap());
        let existing = read_ids(&mut out)[0];
        let roots: BTreeSet<u32> = [root.id()].into_iter().collect();
        super::super::follow_forks(&mut ebpf, &roots).expect("deny_fork attaches");
        assert!(denied_becomes(&ebpf, root.id(), true));
        assert!(
            denied_becomes(&ebpf, existing, true),
            "a child that existed at start is not denied"
        );

        // New: the root runs a shell (child) that starts a sleep (grandchild) and exits, so
        // that the grandchild outlives its parent (reparented).
        root.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let ids = read_ids(&mut out);
        let (child, grandchild) = (ids[0], ids[1]);
        assert!(
            denied_becomes(&ebpf, grandchild, true),
            "a grandchild created after start, now reparented, is not denied"
        );
        assert!(
            !denied_becomes(&ebpf, child, false),
            "an exited child's entry stays (its pid could be reused)"
        );
        assert!(!denied_becomes(&ebpf, outsider.id(), false));

        // Threads of a denied process are not separate entries; a process it creates is.
        let own = std::process::id();
        {
            let mut map: BpfHashMap<_, u32, u32> =
                BpfHashMap::try_from(ebpf.map_mut("DENY").unwrap()).unwrap();
            map.insert(&own, &1, 0).unwrap();
        }
        let tid = std::thread::spawn(|| {
            // SAFETY: no arguments.
            unsafe { libc::gettid() as u32 }
        })
        .join()
        .unwrap();
        let mut spawned = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(denied_becomes(&ebpf, spawned.id(), true));
        assert!(
            !denied_becomes(&ebpf, tid, false) || tid == own,
            "a thread was added as a process"
        );
        {
            let mut map: BpfHashMap<_, u32, u32> =
                BpfHashMap::try_from(ebpf.map_mut("DENY").unwrap()).unwrap();
            map.remove(&own).unwrap();
        }
        // An exiting process's entry goes with it.
        spawned.kill().unwrap();
        spawned.wait().unwrap();
        assert!(!denied_becomes(&ebpf, spawned.id(), false));

        for pid in [existing, grandchild] {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
        assert!(!denied_becomes(&ebpf, grandchild, false));
        root.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
        root.wait().unwrap();
        assert!(!denied_becomes(&ebpf, root.id(), false));
        outsider.kill().unwrap();
        outsider.wait().unwrap();
    }

    /// `DENY_UNFOLLOWED` is counted by `deny_fork` when the deny map is full, and reaches
    /// [`KernelCounters`](crate::model::stats::KernelCounters) through the loader's own
    /// `read_counters` (as `counters()` reads it); `DENIED_UNREAD`, which only a BPF LSM can
    /// raise, is read from its own slot of the map (written here per CPU).
    #[test]
    fn deny_unfollowed_counts_the_children_a_full_deny_map_could_not_take() {
        use aya::maps::{PerCpuArray, PerCpuValues};
        use gpu_trace_common::counter;

        let Some(mut ebpf) =
            load_programs("deny_unfollowed_counts_the_children_a_full_deny_map_could_not_take")
        else {
            return;
        };
        let read = |ebpf: &aya::Ebpf| super::super::read_counters(ebpf, 0).unwrap();

        // A denied shell that creates one process each time it is told to, and says when it did.
        let mut root = Command::new("sh")
            .args([
                "-c",
                "read go; /bin/true; echo 1; read go; /bin/true; echo 2; read stop",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(root.stdout.take().unwrap());
        let roots: BTreeSet<u32> = [root.id()].into_iter().collect();
        super::super::follow_forks(&mut ebpf, &roots).expect("deny_fork attaches");
        assert_eq!(read(&ebpf).deny_unfollowed, Some(0));

        // Fill the deny map with ids no process has (above any pid_max).
        const FAKE: u32 = 0x8000_0000;
        let mut filled = 0u32;
        {
            let mut map: BpfHashMap<_, u32, u32> =
                BpfHashMap::try_from(ebpf.map_mut("DENY").unwrap()).unwrap();
            while map.insert(&(FAKE + filled), &1, 0).is_ok() {
                filled += 1;
                assert!(filled <= super::super::DENY_MAX, "the deny map never fills");
            }
        }
        assert_eq!(
            filled,
            super::super::DENY_MAX - 1,
            "the root and the fakes fill it"
        );

        // Full: the shell's new process is not denied, and counted.
        let step = |root: &mut std::process::Child, out: &mut BufReader<_>| {
            root.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
            read_ids(out)
        };
        assert_eq!(step(&mut root, &mut out), [1]);
        assert_eq!(read(&ebpf).deny_unfollowed, Some(1));
        let root_pid = root.id();
        let others = |ebpf: &aya::Ebpf| {
            let map: BpfHashMap<_, u32, u32> =
                BpfHashMap::try_from(ebpf.map("DENY").unwrap()).unwrap();
            map.keys()
                .map(Result::unwrap)
                .filter(|&k| k < FAKE && k != root_pid)
                .count()
        };
        assert_eq!(others(&ebpf), 0, "a process was added to a full map");

        // Room again: the next one is denied, and the count stays.
        {
            let mut map: BpfHashMap<_, u32, u32> =
                BpfHashMap::try_from(ebpf.map_mut("DENY").unwrap()).unwrap();
            map.remove(&FAKE).unwrap();
        }
        assert_eq!(step(&mut root, &mut out), [2]);
        assert_eq!(
            others(&ebpf),
            1,
            "the process created with room was not denied"
        );
        let after = read(&ebpf);
        assert_eq!(after.deny_unfollowed, Some(1));
        assert_eq!(after.denied_unread, Some(0));

        // DENIED_UNREAD: its own slot, summed over CPUs.
        let cpus = aya::util::nr_cpus().unwrap().get();
        {
            let mut array: PerCpuArray<_, u64> =
                PerCpuArray::try_from(ebpf.map_mut("COUNTERS").unwrap()).unwrap();
            let values = PerCpuValues::try_from((1..=cpus as u64).collect::<Vec<_>>()).unwrap();
            array.set(counter::DENIED_UNREAD, values, 0).unwrap();
        }
        let n = cpus as u64;
        let after = read(&ebpf);
        assert_eq!(after.denied_unread, Some(n * (n + 1) / 2));
        assert_eq!(after.deny_unfollowed, Some(1));
        assert_eq!(after.denied, 0);

        root.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
        root.wait().unwrap();
    }
}
