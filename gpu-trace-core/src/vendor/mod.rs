//! One directory per vendor: its records decoded into typed calls, and its tracker (the driver
//! objects it keeps and the events their life produces). Every tracker is a [`Source`]; the
//! pipeline and the tests alike hand records to [`Sources`], which routes each to its source.
//!
//! A new source (another vendor, an API layer) is a directory here with a type that implements
//! [`Source`], and one field of [`Sources`] that names the record kinds it reads.
pub mod amd;
pub mod nvidia;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    event::{DestroyCause, Event, EventKind, Origin, TaskId},
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
    /// Ends tracing: the tasks still alive, per process (ascending pid), and forgets all state.
    fn finish(&mut self) -> Vec<LiveAtEnd>;
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
            RawRecord::NvIoctl(_) | RawRecord::NvSched(_) | RawRecord::FdClose(_) => {
                self.nvidia.observe_record(origin, record, events)
            }
            RawRecord::KfdIoctl(_) | RawRecord::KfdQueue(_) | RawRecord::Deep(_) => {
                self.amd.observe_record(origin, record, events)
            }
            RawRecord::ProcessExit(_) => {
                for source in self.all() {
                    source.process_exited(origin.clone(), events);
                }
                None
            }
            RawRecord::TaskCgroup(_) | RawRecord::Attribution(_) => None,
        }
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

    /// Ends tracing: the tasks still alive, over all sources.
    pub fn finish(&mut self) -> Vec<LiveAtEnd> {
        self.all().into_iter().flat_map(|s| s.finish()).collect()
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

/// Tasks a process still held when tracing stopped.
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
            comm: self.comm.clone(),
        };
        self.tasks
            .iter()
            .map(|&(client, task)| Event {
                amd: None,
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
