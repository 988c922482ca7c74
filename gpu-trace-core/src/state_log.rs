//! The driver objects alive at a point of a record stream, as the records that made them: what a
//! recording that starts there (a `--record-rotate` piece, a `--flight-recorder` dump) carries
//! as its *state records* ([`RecordingHeader::state_records`](crate::record::RecordingHeader))
//! so that replaying it alone knows the tasks created before its first record (their end is a
//! `TASK_DESTROY`, as in one unrotated recording, not a `PRETRACE_END`).
//!
//! A [`StateLog`] is fed every record before that point, in order, and keeps, in their order:
//! - NVIDIA: each successful `RM_ALLOC` of an object the tracker follows (a client, a device, a
//!   TSG, a channel; not memory) while it is alive: until a successful `RM_FREE` of
//!   it, of an object above it or of its client, the `close()` of the fd its client was
//!   allocated on (or, where that allocation was not seen, of the fd the object was allocated
//!   on), or its process's exit; and of each such object the last successful `RM_CONTROL` of
//!   each command (a TSG's timeslice, interleave, hardware id, runlist, schedule);
//! - AMD: each successful `CREATE_QUEUE` until its `DESTROY_QUEUE` or its process's exit, and
//!   the queue's last successful `UPDATE_QUEUE` and `SET_CU_MASK`;
//! - every `API_SYMBOL` (the names behind `--api`'s cookies).
//!
//! Replay feeds the state records to the trackers alone ([`crate::pipeline::Pipeline::start`]):
//! no event is written or counted for them. At most [`MAX_STATE`] records are kept: past it a
//! new object's records are not, and its process is left out of [`StateLog::complete`] (replay
//! treats it as pre-trace, its ends as `PRETRACE_END`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use gpu_trace_common::nvidia::class;

use crate::{
    source::{amd, nvidia},
    wire::RawRecord,
};

/// State records kept at most.
pub const MAX_STATE: usize = 65_536;

/// One NVIDIA object alive: its parent, the fd it was allocated on, its `RM_ALLOC` record and
/// its last control record of each command.
#[derive(Clone, Debug)]
struct NvObject {
    parent: u32,
    fd: i32,
    alloc: u64,
    controls: BTreeMap<u32, u64>,
}

/// One RM client of a process: the fd of its own allocation (when seen) and its objects.
#[derive(Clone, Debug, Default)]
struct NvClient {
    fd: Option<i32>,
    objects: HashMap<u32, NvObject>,
    children: HashMap<u32, HashSet<u32>>,
}

/// One KFD queue alive: its `CREATE_QUEUE` record and its last update records.
#[derive(Clone, Debug)]
struct KfdQueue {
    create: u64,
    /// 0: `UPDATE_QUEUE`, 1: `SET_CU_MASK`.
    updates: [Option<u64>; 2],
}

/// The records that made the driver objects alive now (see the module documentation).
#[derive(Clone, Debug, Default)]
pub struct StateLog {
    /// Sequence number → record, in stream order.
    records: BTreeMap<u64, Box<[u8]>>,
    next: u64,
    /// (pid, client handle) → its objects.
    nv: HashMap<(u32, u32), NvClient>,
    /// (pid, queue id) → the queue.
    kfd: HashMap<(u32, u32), KfdQueue>,
    /// Processes some of whose objects were not kept ([`MAX_STATE`]).
    incomplete: BTreeSet<u32>,
}

impl StateLog {
    /// An empty log (the run's start: nothing made yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// One more record of the stream (`bytes` not a record: nothing changes).
    pub fn observe(&mut self, bytes: &[u8]) {
        let Ok(record) = crate::wire::parse_record(bytes) else {
            return;
        };
        let pid = record.header().tgid;
        match &record {
            RawRecord::NvIoctl(r) => self.nv_call(pid, r, bytes),
            RawRecord::KfdIoctl(r) => self.kfd_call(pid, r, bytes),
            RawRecord::FdClose(t) => self.fd_close(pid, t.value),
            RawRecord::ProcessExit(_) => {
                self.nv
                    .retain(|&(p, _), c| p != pid || drop_client(&mut self.records, c));
                let gone: Vec<u64> = (self.kfd.iter())
                    .filter(|((p, _), _)| *p == pid)
                    .flat_map(|(_, q)| queue_records(q))
                    .collect();
                self.kfd.retain(|&(p, _), _| p != pid);
                self.forget(&gone);
                self.incomplete.remove(&pid);
            }
            RawRecord::ApiSymbol(_) => {
                self.keep(pid, bytes);
            }
            _ => {}
        }
    }

    /// The records kept, in stream order.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        self.records.values().map(|r| &r[..])
    }

    /// How many records are kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// No record is kept.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Whether every driver object process `pid` made in the stream is in the log (not cut by
    /// [`MAX_STATE`]).
    pub fn complete(&self, pid: u32) -> bool {
        !self.incomplete.contains(&pid)
    }

    /// Keeps `bytes` as the next record; `None` (and `pid` incomplete) past [`MAX_STATE`].
    fn keep(&mut self, pid: u32, bytes: &[u8]) -> Option<u64> {
        if self.records.len() >= MAX_STATE {
            self.incomplete.insert(pid);
            return None;
        }
        let seq = self.next;
        self.next += 1;
        self.records.insert(seq, bytes.into());
        Some(seq)
    }

    fn forget(&mut self, seqs: &[u64]) {
        for s in seqs {
            self.records.remove(s);
        }
    }

    fn nv_call(&mut self, pid: u32, r: &gpu_trace_common::NvIoctlRecord, bytes: &[u8]) {
        let (errno, fd) = (nvidia::decode::errno(r), nvidia::decode::fd(r));
        let call = nvidia::decode::decode(r);
        if !call
            .status()
            .is_some_and(|s| nvidia::decode::succeeded(errno, s))
        {
            return;
        }
        // A call on a client whose allocation was not seen: the process made it before tracing
        // (the trackers take it as pre-trace; so does replay of a recording from here).
        let client_of = match call {
            nvidia::decode::RmCall::Alloc { class, .. } if class::is_client(class) => None,
            nvidia::decode::RmCall::Alloc { client, .. }
            | nvidia::decode::RmCall::Control { client, .. }
            | nvidia::decode::RmCall::Free { client, .. } => Some(client),
            nvidia::decode::RmCall::Malformed { .. } => None,
        };
        if let Some(client) = client_of.filter(|&c| c != 0)
            && self.nv.get(&(pid, client)).is_none_or(|c| c.fd.is_none())
        {
            self.incomplete.insert(pid);
        }
        match call {
            nvidia::decode::RmCall::Alloc { class, handle, .. } if class::is_client(class) => {
                self.nv_client(pid, handle, fd, bytes)
            }
            // Only the objects the tracker follows (devices, TSGs, channels): not memory.
            nvidia::decode::RmCall::Alloc {
                client,
                parent,
                handle,
                class,
                ..
            } if class == class::NV01_DEVICE_0
                || class == class::KEPLER_CHANNEL_GROUP_A
                || class::is_channel(class) =>
            {
                self.nv_alloc(pid, (client, parent, handle), fd, bytes)
            }
            nvidia::decode::RmCall::Alloc { .. } => {}
            nvidia::decode::RmCall::Control {
                client,
                object,
                cmd,
                ..
            } => {
                let known =
                    (self.nv.get(&(pid, client))).is_some_and(|c| c.objects.contains_key(&object));
                if !known {
                    return;
                }
                let Some(seq) = self.keep(pid, bytes) else {
                    return;
                };
                let c = self.nv.get_mut(&(pid, client)).expect("the client");
                let o = c.objects.get_mut(&object).expect("the object");
                if let Some(old) = o.controls.insert(cmd, seq) {
                    self.records.remove(&old);
                }
            }
            nvidia::decode::RmCall::Free { client, object, .. } => {
                self.nv_free(pid, client, object)
            }
            nvidia::decode::RmCall::Malformed { .. } => {}
        }
    }

    /// A successful allocation of the RM client `handle` on `fd`: a client of that handle
    /// still alive goes (its free was missed).
    fn nv_client(&mut self, pid: u32, handle: u32, fd: i32, bytes: &[u8]) {
        self.nv_free(pid, handle, handle);
        let Some(seq) = self.keep(pid, bytes) else {
            return;
        };
        let c = self.nv.entry((pid, handle)).or_default();
        c.fd = Some(fd);
        let o = NvObject {
            parent: 0,
            fd,
            alloc: seq,
            controls: BTreeMap::new(),
        };
        c.objects.insert(handle, o);
    }

    /// A successful `RM_ALLOC` of `handle` under `parent` in `client`.
    fn nv_alloc(&mut self, pid: u32, (client, parent, handle): (u32, u32, u32), fd: i32, b: &[u8]) {
        // A handle reused while still alive: its old records go (a free was missed).
        if self
            .nv
            .get(&(pid, client))
            .is_some_and(|c| c.objects.contains_key(&handle))
        {
            self.nv_free(pid, client, handle);
        }
        let Some(seq) = self.keep(pid, b) else { return };
        let c = self.nv.entry((pid, client)).or_default();
        c.objects.insert(
            handle,
            NvObject {
                parent,
                fd,
                alloc: seq,
                controls: BTreeMap::new(),
            },
        );
        c.children.entry(parent).or_default().insert(handle);
    }

    /// A successful `RM_FREE` of `object` in `client`: it and everything under it go (all of the
    /// client when `object` is the client).
    fn nv_free(&mut self, pid: u32, client: u32, object: u32) {
        if object == client {
            if let Some(mut c) = self.nv.remove(&(pid, client)) {
                drop_client(&mut self.records, &mut c);
            }
            return;
        }
        let Some(c) = self.nv.get_mut(&(pid, client)) else {
            return;
        };
        let mut stack = vec![object];
        while let Some(h) = stack.pop() {
            if let Some(kids) = c.children.remove(&h) {
                stack.extend(kids);
            }
            if let Some(o) = c.objects.remove(&h) {
                if let Some(siblings) = c.children.get_mut(&o.parent) {
                    siblings.remove(&h);
                }
                drop_object(&mut self.records, &o);
            }
        }
    }

    /// `close(fd)` in process `pid`: the clients allocated on it go, and where a client's own
    /// allocation was not seen, its objects allocated on it.
    fn fd_close(&mut self, pid: u32, fd: i32) {
        let records = &mut self.records;
        self.nv.retain(|&(p, _), c| {
            if p != pid {
                return true;
            }
            if c.fd == Some(fd) {
                return drop_client(records, c);
            }
            if c.fd.is_none() {
                let gone: Vec<u32> = (c.objects.iter())
                    .filter(|(_, o)| o.fd == fd)
                    .map(|(&h, _)| h)
                    .collect();
                for h in gone {
                    if let Some(o) = c.objects.remove(&h) {
                        drop_object(records, &o);
                    }
                }
            }
            true
        });
    }

    fn kfd_call(&mut self, pid: u32, r: &gpu_trace_common::KfdIoctlRecord, bytes: &[u8]) {
        if amd::decode::errno(r) != 0 {
            return;
        }
        use amd::decode::KfdCall;
        let (queue_id, update) = match amd::decode::decode(r) {
            KfdCall::CreateQueue(c) => {
                if let Some(old) = self.kfd.remove(&(pid, c.queue_id)) {
                    self.forget(&queue_records(&old).collect::<Vec<_>>());
                }
                if let Some(create) = self.keep(pid, bytes) {
                    let q = KfdQueue {
                        create,
                        updates: [None; 2],
                    };
                    self.kfd.insert((pid, c.queue_id), q);
                }
                return;
            }
            KfdCall::DestroyQueue { queue_id } => {
                if let Some(old) = self.kfd.remove(&(pid, queue_id)) {
                    self.forget(&queue_records(&old).collect::<Vec<_>>());
                }
                return;
            }
            KfdCall::UpdateQueue(u) => (u.queue_id, 0),
            KfdCall::SetCuMask { queue_id, .. } => (queue_id, 1),
            KfdCall::Malformed { .. } => return,
        };
        if !self.kfd.contains_key(&(pid, queue_id)) {
            return;
        }
        let Some(seq) = self.keep(pid, bytes) else {
            return;
        };
        let q = self.kfd.get_mut(&(pid, queue_id)).expect("the queue");
        if let Some(old) = q.updates[update].replace(seq) {
            self.records.remove(&old);
        }
    }
}

/// Removes the records of client `c`'s objects; `false` (for `retain`).
fn drop_client(records: &mut BTreeMap<u64, Box<[u8]>>, c: &mut NvClient) -> bool {
    for o in c.objects.values() {
        drop_object(records, o);
    }
    c.objects.clear();
    false
}

/// Removes the records of object `o`: its allocation and its controls.
fn drop_object(records: &mut BTreeMap<u64, Box<[u8]>>, o: &NvObject) {
    records.remove(&o.alloc);
    for s in o.controls.values() {
        records.remove(s);
    }
}

fn queue_records(q: &KfdQueue) -> impl Iterator<Item = u64> + '_ {
    std::iter::once(q.create).chain(q.updates.iter().flatten().copied())
}

/// The header of a recording that starts at this point of a run (`run`: the run's header):
/// the processes alive here (`live`) as its inventory, taken at `taken_ns`, and `state`'s
/// records announced as its state records.
pub fn start_header(
    run: &crate::record::RecordingHeader,
    live: &crate::live_set::LiveSet,
    state: &StateLog,
    taken_ns: u64,
) -> crate::record::RecordingHeader {
    crate::record::RecordingHeader {
        inventory: Some(live.snapshot(taken_ns)),
        state_records: state.len() as u64,
        state_pids: live.traced().filter(|&p| state.complete(p)).collect(),
        ..run.clone()
    }
}

/// Writes `state`'s records (after a [`start_header`]'s header); returns their bytes.
pub fn write_state<W: std::io::Write>(
    w: &mut crate::record::RecordWriter<W>,
    state: &StateLog,
) -> Result<u64, crate::record::RecordError> {
    let mut bytes = 0;
    for r in state.records() {
        w.record(r)?;
        bytes += 4 + r.len() as u64;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::nvidia::decode::testrec::{self, alloc, free};
    use gpu_trace_common::{TaskRecord, record_kind, zerocopy::IntoBytes};

    const C: u32 = 0xc1d0_0001;

    fn bytes(r: testrec::Rec) -> Vec<u8> {
        r.rec.as_bytes().to_vec()
    }

    fn task(kind: u32, pid: u32, value: i32) -> Vec<u8> {
        let hdr = testrec::header(kind, 9, pid, pid, "p");
        TaskRecord {
            hdr,
            value,
            _pad: 0,
        }
        .as_bytes()
        .to_vec()
    }

    /// Process `pid`'s client on `fd`, a device, two TSGs and a memory object under it.
    fn made(pid: u32, fd: i32) -> Vec<Vec<u8>> {
        vec![
            bytes(alloc(pid, fd, true, 0, 0, C, class::NV01_ROOT, 0, &[])),
            bytes(alloc(pid, fd, true, C, C, 2, class::NV01_DEVICE_0, 0, &[])),
            bytes(alloc(pid, fd, true, C, 2, 10, 0xA06C, 0, &[])),
            bytes(alloc(pid, fd, true, C, 2, 11, 0xA06C, 0, &[])),
            bytes(alloc(pid, fd, true, C, 2, 12, 0x003E, 0, &[])),
        ]
    }

    fn log(records: &[Vec<u8>]) -> StateLog {
        let mut l = StateLog::new();
        for r in records {
            l.observe(r);
        }
        l
    }

    /// What is kept is the records that made the objects alive, in order: not memory, not a
    /// failed call; a freed TSG's record goes, a freed device takes its TSGs with it; a
    /// `close()` of the client's fd, or the process's exit, takes the whole client.
    #[test]
    fn the_log_keeps_the_records_of_the_objects_alive() {
        let m = made(7, 3);
        let l = log(&m);
        let kept: Vec<Vec<u8>> = l.records().map(<[u8]>::to_vec).collect();
        assert_eq!(
            kept,
            m[..4],
            "client, device, two TSGs; not the memory object"
        );
        assert!(l.complete(7));
        let mut failed = m.clone();
        failed.push(bytes(alloc(7, 3, true, C, 2, 13, 0xA06C, 0x1f, &[])));
        assert_eq!(log(&failed).len(), 4, "a failed alloc makes nothing");
        let mut tsg_freed = m.clone();
        tsg_freed.push(bytes(free(7, 3, C, 2, 10, 0)));
        let kept: Vec<Vec<u8>> = log(&tsg_freed).records().map(<[u8]>::to_vec).collect();
        assert_eq!(kept, [&m[..2], &m[3..4]].concat(), "TSG 10 freed");
        let mut device_freed = m.clone();
        device_freed.push(bytes(free(7, 3, C, C, 2, 0)));
        assert_eq!(log(&device_freed).len(), 1, "the client alone");
        for end in [
            task(record_kind::FD_CLOSE, 7, 3),
            task(record_kind::PROCESS_EXIT, 7, -1),
        ] {
            let mut ended = m.clone();
            ended.extend(made(8, 4));
            ended.push(end);
            let kept: Vec<Vec<u8>> = log(&ended).records().map(<[u8]>::to_vec).collect();
            assert_eq!(kept, made(8, 4)[..4], "process 8's stay");
        }
        let mut other_fd = m.clone();
        other_fd.push(task(record_kind::FD_CLOSE, 7, 5));
        assert_eq!(log(&other_fd).len(), 4, "another fd's close ends nothing");
    }

    /// A call on a client whose allocation was not seen (made before tracing): the process is
    /// not complete (replay takes it as pre-trace), until it exits.
    #[test]
    fn a_client_made_before_tracing_leaves_its_process_incomplete() {
        let pre = bytes(alloc(9, 3, true, C, C, 2, class::NV01_DEVICE_0, 0, &[]));
        let mut l = log(&[pre]);
        assert!(!l.complete(9));
        l.observe(&task(record_kind::PROCESS_EXIT, 9, 0));
        assert!(l.complete(9) && l.is_empty());
    }
}
