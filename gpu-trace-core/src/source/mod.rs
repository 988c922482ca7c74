//! One directory per source of events (today a vendor's driver: `nvidia`, `amd`): its records
//! decoded into typed calls, and its tracker (the driver objects it keeps and the events their
//! life produces). Every tracker is a [`Source`]; the
//! pipeline and the tests alike hand records to [`Sources`], which routes each to its source.
//!
//! A new source (another vendor, an API layer) is a directory here with a type that implements
//! [`Source`], and one field of [`Sources`] that names the record kinds it reads.
pub mod amd;
pub mod nvidia;

use std::collections::BTreeMap;

use crate::{
    event::{Event, Origin},
    inventory::InventoryProcess,
    wire::RawRecord,
};

/// What a source learned from a record that the rest of the pipeline needs besides events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fact {
    /// The record was this source's kind but not a call it could decode (counted in the
    /// statistics as a decode error).
    Malformed,
    /// RM device instance `device_instance` is the GPU the driver calls `gpu_id` (the driver's
    /// answer to a process's `GPU_GET_ID_INFO`).
    DeviceIsGpu { device_instance: u32, gpu_id: u32 },
}

/// One source of events: a vendor's tracker.
pub trait Source {
    /// Observes one of the records routed to it (never a process exit: see
    /// [`process_exited`](Self::process_exited)); appends the events it produces, in order.
    fn observe_record(
        &mut self,
        origin: Origin,
        record: &RawRecord,
        events: &mut Vec<Event>,
    ) -> Option<Fact>;
    /// The process `origin.pid` exited: its tasks end.
    fn process_exited(&mut self, origin: Origin, events: &mut Vec<Event>);
    /// Late attach: a process of the start-up inventory, which may hold driver objects made
    /// before tracing started.
    fn inventoried(&mut self, _process: &InventoryProcess) {}
    /// Tasks alive now.
    fn live_tasks(&self) -> usize;
    /// Calls that produced no event, by reason, for the statistics (zeros included).
    fn unreported(&self) -> Vec<(&'static str, u64)>;
    /// Calls and events on handles the source did not remember (its caps were reached).
    fn untracked_handles(&self) -> u64;
}

/// Every source, and which records go to which: the one way a record reaches a tracker.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    nvidia: nvidia::model::NvTracker,
    amd: amd::model::KfdTracker,
    /// `gpu-trace --api`: each thread's open API call, until its driver record.
    api_open: crate::api::open::Pending,
}

impl Sources {
    pub fn new() -> Self {
        Self::default()
    }

    /// The NVIDIA tracker (tests and tools look into its state).
    pub fn nvidia(&self) -> &nvidia::model::NvTracker {
        &self.nvidia
    }

    /// The AMD KFD tracker (tests and tools look into its state).
    pub fn amd(&self) -> &amd::model::KfdTracker {
        &self.amd
    }

    /// Every source, in the order a process exit reaches them (its NVIDIA TSGs end before its
    /// KFD queues).
    fn all(&mut self) -> [&mut dyn Source; 2] {
        [&mut self.nvidia, &mut self.amd]
    }

    fn all_ref(&self) -> [&dyn Source; 2] {
        [&self.nvidia, &self.amd]
    }

    /// Routes one record to its source (a process exit to every source); appends the events
    /// produced. Records no source reads (cgroup attribution) produce nothing.
    pub fn observe(
        &mut self,
        origin: Origin,
        record: &RawRecord,
        events: &mut Vec<Event>,
    ) -> Option<Fact> {
        match record {
            RawRecord::NvIoctl(_) => self.with_api(origin, record, events, Driver::Nvidia),
            RawRecord::NvSched(_) | RawRecord::FdClose(_) => {
                self.nvidia.observe_record(origin, record, events)
            }
            RawRecord::KfdIoctl(_) => self.with_api(origin, record, events, Driver::Amd),
            RawRecord::KfdQueue(_) | RawRecord::Deep(_) => {
                self.amd.observe_record(origin, record, events)
            }
            RawRecord::ProcessExit(_) => {
                self.api_open.process_exited(origin.pid);
                for source in self.all() {
                    source.process_exited(origin.clone(), events);
                }
                None
            }
            RawRecord::ApiContext(rec) => {
                self.api_open.note(rec);
                None
            }
            // The pipeline handles these itself (no vendor's record).
            RawRecord::TaskCgroup(_)
            | RawRecord::Attribution(_)
            | RawRecord::ApiTag(_)
            | RawRecord::ApiCall(_)
            | RawRecord::ApiRecursion(_)
            | RawRecord::ApiSymbol(_)
            | RawRecord::ApiStats(_) => None,
        }
    }

    /// A driver call's record to `driver`'s source; every event it makes carries the API call
    /// open on the thread when it was made (`--api`: the thread's waiting `API_CONTEXT`).
    fn with_api(
        &mut self,
        origin: Origin,
        record: &RawRecord,
        events: &mut Vec<Event>,
        driver: Driver,
    ) -> Option<Fact> {
        let open = self.api_open.take(&origin);
        let first = events.len();
        let fact = match driver {
            Driver::Nvidia => self.nvidia.observe_record(origin, record, events),
            Driver::Amd => self.amd.observe_record(origin, record, events),
        };
        if let Some(open) = open {
            for ev in &mut events[first..] {
                ev.api = Some(open.clone());
            }
        }
        fact
    }

    /// A state record of a recording ([`crate::state_log`]): observed as any record, but what
    /// the sources count of it is put back (its events are the caller's to drop).
    pub fn observe_state(
        &mut self,
        origin: Origin,
        record: &RawRecord,
        events: &mut Vec<Event>,
    ) -> Option<Fact> {
        let saved = (self.nvidia.counters().clone(), self.amd.counters().clone());
        let fact = self.observe(origin, record, events);
        self.nvidia.set_counters(saved.0);
        self.amd.set_counters(saved.1);
        fact
    }

    /// The events of one record ([`observe`](Self::observe) into a new `Vec`; tests).
    pub fn events_of(&mut self, record: &RawRecord) -> Vec<Event> {
        let mut events = Vec::new();
        self.observe(record.origin(), record, &mut events);
        events
    }

    /// Late attach: the processes of the start-up inventory.
    pub fn preexisting(&mut self, process: &InventoryProcess) {
        for source in self.all() {
            source.inventoried(process);
        }
    }

    /// Tasks alive now, over all sources.
    pub fn live_tasks(&self) -> usize {
        self.all_ref().iter().map(|s| s.live_tasks()).sum()
    }

    /// Calls and events on handles the sources did not remember.
    pub fn untracked_handles(&self) -> u64 {
        self.all_ref().iter().map(|s| s.untracked_handles()).sum()
    }

    /// The sources' counters of calls that produced no event, by reason (non-zero only).
    pub fn unreported(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        let untracked = ("untracked_handles", self.untracked_handles());
        for (reason, n) in self
            .all_ref()
            .iter()
            .flat_map(|s| s.unreported())
            .chain([untracked])
        {
            if n != 0 {
                *out.entry(reason).or_default() += n;
            }
        }
        out
    }
}

/// The events of one record observed by one source alone, as [`Sources::observe`] hands it
/// over (the source's unit tests).
#[cfg(test)]
pub(crate) fn observe_one(source: &mut dyn Source, record: &RawRecord) -> Vec<Event> {
    let mut events = Vec::new();
    match record {
        RawRecord::ProcessExit(_) => source.process_exited(record.origin(), &mut events),
        _ => drop(source.observe_record(record.origin(), record, &mut events)),
    }
    events
}

/// Tasks alive when tracing stopped, as the trackers' unit tests list them (`finish`): test
/// code, not in the product.
#[cfg(test)]
mod at_end {
    use serde::Serialize;

    use crate::event::{DestroyCause, Event, EventKind, Origin, TaskId};

    /// Tasks a process still held when tracing stopped (the trackers' unit tests: `finish`).
    #[derive(Clone, Debug, PartialEq, Eq, Serialize)]
    pub struct LiveAtEnd {
        /// Process id.
        pub pid: u32,
        /// Last thread name seen from the process.
        pub comm: String,
        /// `(client, task)` of each live task (`client` 0 where the source has none).
        pub tasks: Vec<(u32, TaskId)>,
    }

    impl LiveAtEnd {
        /// `TASK_DESTROY` events with [`DestroyCause::TracerExit`], one per live task, for the
        /// statistics (never printed). `ts_ns` is the time tracing stopped; the thread is the
        /// process's main thread.
        pub fn tracer_exit_events(&self, ts_ns: u64) -> Vec<Event> {
            let origin = Origin {
                ts_ns,
                cpu: 0,
                pid: self.pid,
                tid: self.pid,
                comm: self.comm.as_str().into(),
            };
            self.tasks
                .iter()
                .map(|&(client, task)| Event {
                    amd: None,
                    api: None,
                    key: None,
                    origin: origin.clone(),
                    kind: EventKind::TaskDestroy {
                        task,
                        client,
                        cause: DestroyCause::TracerExit,
                        implicit: true,
                        final_params: None,
                    },
                })
                .collect()
        }
    }
}
#[cfg(test)]
pub use at_end::LiveAtEnd;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::amd::decode::testing::{self as kfd, CreateArgs};
    use crate::source::nvidia::decode::testrec::{self, alloc, control, device_params, tsg_params};
    use gpu_trace_common::{RecordHeader, TaskRecord, nv_flags, nvidia::cmd, record_kind};

    const PID: u32 = 7;
    const FD: i32 = 5;
    const CLIENT: u32 = 0xC1D0_0001;
    const DEVICE: u32 = 0xCAF0_0001;
    const TSG: u32 = 0xCAF0_0010;

    fn nv(r: testrec::Rec) -> RawRecord {
        RawRecord::NvIoctl(r.rec)
    }

    /// A process with a TSG and a KFD queue exits: both end, its TSG first, then its queue.
    #[test]
    fn a_process_exit_ends_the_tasks_of_every_source_nvidia_first() {
        let mut s = Sources::new();
        for r in [
            alloc(PID, FD, true, 0, 0, CLIENT, 0x41, 0, &[]),
            alloc(
                PID,
                FD,
                true,
                CLIENT,
                CLIENT,
                DEVICE,
                0x80,
                0,
                &device_params(0),
            ),
            alloc(
                PID,
                FD,
                true,
                CLIENT,
                DEVICE,
                TSG,
                0xA06C,
                0,
                &tsg_params(1, 0),
            ),
        ] {
            s.events_of(&nv(r));
        }
        let queue = CreateArgs {
            queue_id: 2,
            ..CreateArgs::default()
        }
        .created(PID, 4);
        s.events_of(&RawRecord::KfdIoctl(queue));
        assert_eq!(s.live_tasks(), 2);
        let exit = RawRecord::ProcessExit(TaskRecord {
            hdr: RecordHeader {
                kind: record_kind::PROCESS_EXIT,
                ..queue.hdr
            },
            value: -1,
            _pad: 0,
        });
        let ended: Vec<(&str, bool)> = s
            .events_of(&exit)
            .iter()
            .map(|e| (e.kind.name(), e.amd.is_some()))
            .collect();
        assert_eq!(ended, [("TASK_DESTROY", false), ("TASK_DESTROY", true)]);
        assert_eq!(s.live_tasks(), 0);
    }

    /// `GPU_GET_ID_INFO_V2`'s answer names the GPU of a device instance only when the call
    /// succeeded (errno 0, RM status 0); undecodable records of either vendor are facts too.
    #[test]
    fn facts_are_handed_out_for_successful_gpu_id_answers_and_malformed_records() {
        let mut params = [0u8; 32];
        params[..4].copy_from_slice(&0x4100u32.to_le_bytes()); // gpuId
        params[8..12].copy_from_slice(&3u32.to_le_bytes()); // deviceInstance
        let answer = |status: u32, ret: i64| {
            let mut r = control(
                PID,
                FD,
                CLIENT,
                CLIENT,
                cmd::GPU_GET_ID_INFO_V2,
                status,
                &params,
            );
            r.rec.ret = ret;
            nv(r)
        };
        let fact = |r: &RawRecord| Sources::new().observe(r.origin(), r, &mut Vec::new());
        assert_eq!(
            fact(&answer(0, 0)),
            Some(Fact::DeviceIsGpu {
                device_instance: 3,
                gpu_id: 0x4100
            })
        );
        assert_eq!(fact(&answer(0x1f, 0)), None, "RM refused it");
        assert_eq!(fact(&answer(0, -22)), None, "the syscall failed");
        let mut bad = answer(0, 0);
        if let RawRecord::NvIoctl(r) = &mut bad {
            r.flags |= nv_flags::BAD_SIZE;
        }
        assert_eq!(fact(&bad), Some(Fact::Malformed));
        let mut kfd_bad = CreateArgs::default().created(PID, 4);
        kfd_bad.args_len -= 1;
        assert_eq!(fact(&RawRecord::KfdIoctl(kfd_bad)), Some(Fact::Malformed));
    }

    /// What went unreported comes from every source, non-zero reasons only.
    #[test]
    fn unreported_lists_the_non_zero_reasons_of_every_source() {
        let mut s = Sources::new();
        // A schedule request on a TSG never seen created, refused; an update of a queue never
        // seen created, refused.
        let mut sched = control(PID, FD, CLIENT, TSG, cmd::TSG_SET_TIMESLICE, 0x1f, &[0; 8]);
        sched.rec.ret = 0;
        s.events_of(&nv(sched));
        s.events_of(&RawRecord::KfdIoctl(kfd::update(
            PID, 4, 9, 4096, 30, 2, -22,
        )));
        let reasons: Vec<&str> = s.unreported().into_keys().collect();
        assert_eq!(reasons, ["unknown_handle", "unknown_queue"]);
    }

    /// A recording's state records rebuild the sources' state (their tasks) without being
    /// counted as calls of the run, by either source.
    #[test]
    fn state_records_change_the_state_but_no_count() {
        let mut s = Sources::new();
        let mut events = Vec::new();
        let client = nv(alloc(PID, FD, true, 0, 0, CLIENT, 0x41, 0, &[]));
        let queue = RawRecord::KfdIoctl(
            CreateArgs {
                queue_id: 2,
                ..CreateArgs::default()
            }
            .created(PID, 4),
        );
        for r in [&client, &queue] {
            s.observe_state(r.origin(), r, &mut events);
        }
        assert_eq!(s.live_tasks(), 1, "the queue was created");
        assert_eq!((s.nvidia.counters().calls, s.amd.counters().calls), (0, 0));
        for r in [&client, &queue] {
            s.observe(r.origin(), r, &mut events);
        }
        assert_eq!((s.nvidia.counters().calls, s.amd.counters().calls), (1, 1));
    }
}

/// Whose ioctl record [`Sources::with_api`] routes.
#[derive(Clone, Copy)]
enum Driver {
    Nvidia,
    Amd,
}
