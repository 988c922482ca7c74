//! The processes alive at a point of a record stream, as an [`Inventory`]: what a recording
//! that starts there (a `--record-rotate` piece, a `--flight-recorder` dump) carries in its
//! header so that it replays alone.
//!
//! A [`LiveSet`] starts from the run's own start-up inventory and is fed every record before
//! that point, in order: a process is alive from its first record (or the inventory) until its
//! `PROCESS_EXIT` record. For each it keeps what the late-attach inventory holds and the records
//! said: its first `comm`, its cgroup path (an `ATTRIBUTION` record), and the GPU fds its driver
//! calls went through (the NVIDIA node from the record's device number, `/dev/kfd`). Replaying
//! a recording that starts there treats these processes as late attach treats processes that
//! had a GPU open before tracing ([`crate::pipeline::Pipeline::inventory`]): the driver objects
//! they made before the recording's first record are pre-trace objects, their end
//! `PRETRACE_END` (docs/recording.md says what that leaves out).

use std::collections::BTreeMap;

use gpu_trace_common::nvidia::NV_MAJOR;

use crate::{
    inventory::{GpuNode, Inventory, InventoryProcess},
    wire::RawRecord,
};

/// GPU fds kept per process (a process with more keeps its first ones).
const MAX_FDS: usize = 64;

/// The processes alive at a point of a record stream (see the module documentation).
#[derive(Clone, Debug, Default)]
pub struct LiveSet {
    /// The run's start-up inventory (its GPUs and counts are every snapshot's).
    base: Inventory,
    alive: BTreeMap<u32, InventoryProcess>,
    /// The processes of the start-up inventory still alive (the others were traced from their
    /// start).
    from_base: std::collections::BTreeSet<u32>,
}

impl LiveSet {
    /// The processes of the run's start-up inventory, alive at its start.
    pub fn new(base: &Inventory) -> Self {
        let alive: BTreeMap<u32, InventoryProcess> =
            base.processes.iter().map(|p| (p.pid, p.clone())).collect();
        Self {
            base: Inventory {
                processes: Vec::new(),
                ..base.clone()
            },
            from_base: alive.keys().copied().collect(),
            alive,
        }
    }

    /// One more record of the stream (`bytes` not a record: nothing changes).
    pub fn observe(&mut self, bytes: &[u8]) {
        if let Ok(record) = crate::wire::parse_record(bytes) {
            self.observe_record(&record);
        }
    }

    /// [`Self::observe`] of a parsed record.
    pub fn observe_record(&mut self, record: &RawRecord) {
        let hdr = record.header();
        let pid = hdr.tgid;
        if let RawRecord::ProcessExit(_) = record {
            self.alive.remove(&pid);
            self.from_base.remove(&pid);
            return;
        }
        // Userspace's records about a process (API sums, names) do not make it alive.
        if matches!(record, RawRecord::ApiSymbol(_) | RawRecord::ApiStats(_)) || pid == 0 {
            return;
        }
        let p = self.alive.entry(pid).or_insert_with(|| InventoryProcess {
            pid,
            comm: comm_of(&hdr.comm),
            cmdline: Vec::new(),
            exe: None,
            cgroup: None,
            gpus: Vec::new(),
            fds: Vec::new(),
            mps: None,
        });
        let fd = match record {
            RawRecord::NvIoctl(r) => Some((r.fd, nv_node(r.rdev))),
            RawRecord::KfdIoctl(r) => Some((r.fd, GpuNode::Kfd)),
            RawRecord::Attribution(a) => {
                if let Some(path) = a.path() {
                    p.cgroup = Some(path);
                }
                None
            }
            _ => None,
        };
        if let Some((fd, node)) = fd.filter(|&(fd, _)| fd >= 0)
            && p.fds.len() < MAX_FDS
            && !p.fds.iter().any(|&(f, _)| f == fd)
        {
            p.fds.push((fd, node));
            p.fds.sort_unstable();
        }
    }

    /// The processes alive now, as the inventory of a recording that starts here; `taken_ns`:
    /// the time it stands for (the first record's, CLOCK_MONOTONIC).
    pub fn snapshot(&self, taken_ns: u64) -> Inventory {
        Inventory {
            taken_ns,
            processes: self.alive.values().cloned().collect(),
            ..self.base.clone()
        }
    }

    /// The processes alive now that were traced from their start (not of the start-up
    /// inventory), ascending.
    pub fn traced(&self) -> impl Iterator<Item = u32> + '_ {
        (self.alive.keys().copied()).filter(|p| !self.from_base.contains(p))
    }

    /// How many processes are alive now.
    pub fn len(&self) -> usize {
        self.alive.len()
    }

    /// No process is alive now.
    pub fn is_empty(&self) -> bool {
        self.alive.is_empty()
    }
}

/// The node an NVIDIA record's device number is: `/dev/nvidiactl` (minor 255), `/dev/nvidiaN`,
/// or (another major: `--watch-device`) the watched node.
fn nv_node(rdev: u32) -> GpuNode {
    let (major, minor) = (rdev >> 20, rdev & 0xf_ffff);
    match (major, minor) {
        (NV_MAJOR, 255) => GpuNode::NvCtl,
        (NV_MAJOR, m) => GpuNode::NvGpu(m),
        _ => GpuNode::Watched,
    }
}

fn comm_of(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::nvidia::decode::testrec::{header, raw};
    use gpu_trace_common::{TaskRecord, record_kind, zerocopy::IntoBytes};

    fn exit(pid: u32) -> Vec<u8> {
        TaskRecord {
            hdr: header(record_kind::PROCESS_EXIT, 9, pid, pid, "x"),
            value: -1,
            _pad: 0,
        }
        .as_bytes()
        .to_vec()
    }

    /// A process is alive from its first record to its exit; its fd on the NVIDIA control node
    /// is kept as the inventory's control fd; the start-up inventory's processes are alive
    /// until their own exit.
    #[test]
    fn processes_live_from_first_record_to_exit() {
        let base = Inventory {
            processes: vec![InventoryProcess {
                pid: 7,
                comm: "old".into(),
                cmdline: vec![],
                exe: None,
                cgroup: None,
                gpus: vec![],
                fds: vec![(3, GpuNode::NvCtl)],
                mps: None,
            }],
            ..Default::default()
        };
        let mut live = LiveSet::new(&base);
        let hdr = header(record_kind::NV_IOCTL, 5, 42, 42, "cuda");
        let mut rec = raw(hdr, 0xC020_462A, &[0; 32], None, 0);
        rec.fd = 11;
        rec.rdev = (NV_MAJOR << 20) | 255;
        live.observe(rec.as_bytes());
        let inv = live.snapshot(99);
        assert_eq!(inv.taken_ns, 99);
        let pids: Vec<u32> = inv.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [7, 42]);
        assert_eq!(inv.processes[1].fds, [(11, GpuNode::NvCtl)]);
        assert_eq!(inv.processes[1].control_fds(), [11]);
        assert!(inv.processes[1].uses_nvidia());
        live.observe(&exit(7));
        live.observe(&exit(42));
        assert!(live.snapshot(100).processes.is_empty());
    }
}
