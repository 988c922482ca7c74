//! The AMD KFD queue model: which queues each process holds, and the events their lives produce.
//!
//! Input: decoded KFD calls ([`KfdCall`], with the syscall's errno and fd), plus the
//! process-exit notices of the kernel programs. Output: [`Event`]s, each with an
//! [`AmdDetail`] (NVIDIA-only fields are `None`).
//!
//! Rules:
//! - Queues are tracked per `(pid, queue id)`: KFD hands out queue ids per process (per
//!   `kfd_process`, across all its GPUs).
//! - A successful `CREATE_QUEUE` produces, in order: `TASK_INIT` (queue id, type, priority,
//!   percentage, ring size, gpu_id, doorbell offset), `WORK_SUBMIT` (the doorbell assigned to the
//!   queue: user space rings it by writing to the mmapped doorbell page, which never enters the
//!   kernel, so this is the only submission-related event the ioctl layer can show) and, when
//!   the queue is created active (ring address and non-zero percentage), `SCHEDULE via=create
//!   allowed=yes`.
//! - A refused `CREATE_QUEUE` (negative errno) produces no `TASK_INIT` — no queue exists — but a
//!   `SCHEDULE via=create allowed=no` with the errno, under the task id
//!   [`TaskId::KfdNoQueue`]: it is the admission point, and the request's parameters are known.
//! - `UPDATE_QUEUE` and `SET_CU_MASK` change scheduling parameters: each produces a
//!   `SCHED_UPDATE` (`via=update` with priority and percentage old → new / `via=cu_mask` with
//!   the CU mask bits old → new), `allowed=yes` when the call succeeded, `allowed=no` with the
//!   errno otherwise. They are not `SCHEDULE`s: `SCHEDULE` is the admission point only
//!   (`CREATE_QUEUE`). A call on a queue this tracer never saw created (the process started
//!   before tracing) is still reported, with what the call itself says (old values `?`).
//! - A successful `DESTROY_QUEUE` produces `TASK_DESTROY cause=free`, also for queues created
//!   before tracing (the command names a queue, unambiguously).
//! - When the process exits, each queue still alive ends with an implicit
//!   `TASK_DESTROY cause=process_exit`.
//! - Closing `/dev/kfd` ends nothing: the driver's per-process state (`kfd_process`, with its
//!   queues) belongs to the process's address space, and `kfd_release` only drops the file's
//!   reference; the queues go when the address space does (exit, or `execve`).
//! - Queues alive when tracing stops are not events: [`KfdTracker::finish`] lists them.
//!
//! - Deep hooks (where the kernel lets gpu-trace attach to the driver's functions):
//!   - the driver's queue record (the DQM's `create_queue_*`) and the `init_mqd*` copy that ran arrive
//!     before the `CREATE_QUEUE` result of the same thread; they are kept per thread and added
//!     to that `TASK_INIT` (`hw_doorbell`, `vmid`, `driver_active`, `mqd_init`), never reported
//!     on their own. What is left over when the thread's next KFD call is not a successful
//!     create is counted (`deep_unmatched`).
//!   - `pqm_uninit` ends every queue of its process with `TASK_DESTROY cause=kfd_release`
//!     (not implicit: the driver's teardown itself was seen). Whichever of it and the process
//!     exit comes first ends the queues; the other finds none, so nothing ends twice.
//!
//! Limits: `execve` tears a process's queues down without a notice this tracer sees (a later
//! `CREATE_QUEUE` reusing a live id is counted as `replaced_queues`); queues restored by CRIU
//! (`AMDKFD_IOC_CRIU_OP`) and evictions/restores by the driver are not seen.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::event::{
    AmdDetail, AmdVia, DestroyCause, Event, EventKind, Origin, SchedChange, TaskId, TaskKey,
    ValueSource,
};
use crate::model::bounded::{Generations, PidMap};
#[cfg(test)]
use crate::source::LiveAtEnd;
use crate::source::amd::decode::{
    self, CreateQueue, DeepStep, KfdCall, KfdMalformed, QueueBuilt, QueueParams, UpdateQueue,
};

/// One input of the tracker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KfdInput {
    /// A completed KFD ioctl.
    Call {
        /// File descriptor the ioctl was issued on.
        fd: i32,
        /// The syscall's negative errno (0 on success).
        errno: i32,
        call: KfdCall,
    },
    /// The process (the whole thread group) exited.
    ProcessExit,
    /// Deep hook: the driver's queue manager built a queue (before the `CREATE_QUEUE` result).
    QueueBuilt(QueueBuilt),
    /// Deep hook: a driver-internal step.
    Deep(DeepStep),
}

/// What the tracker saw that produced no event, for the statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KfdTrackerCounters {
    /// Well-formed KFD calls observed.
    pub calls: u64,
    /// Of those, calls that failed (negative errno).
    pub failed_calls: u64,
    /// Of those, `CREATE_QUEUE`s (reported as refused `SCHEDULE`s, no `TASK_INIT`).
    pub failed_creates: u64,
    /// Records that were not decodable KFD calls.
    pub malformed: u64,
    /// [`malformed`](Self::malformed) by reason.
    pub malformed_by_reason: BTreeMap<KfdMalformed, u64>,
    /// Calls on queue ids this tracer never saw created.
    pub unknown_queue: u64,
    /// Successful `CREATE_QUEUE`s that returned an id still tracked as alive (its end was not
    /// seen, e.g. after `execve`).
    pub replaced_queues: u64,
    /// Deep-hook records (queue built, MQD init) that no successful `CREATE_QUEUE` of the same
    /// thread took up.
    pub deep_unmatched: u64,
    /// Driver teardowns (`pqm_uninit`) of processes with no queue this tracer knew of (no
    /// event to report: e.g. a process that opened `/dev/kfd` but created no queue).
    pub kfd_releases_without_queues: u64,
    /// Deep-hook records of a kind this version does not know.
    pub deep_unknown: u64,
    /// Events on queue ids never seen created that were not remembered because the caps of
    /// [`bounded`](crate::model::bounded) were reached (still reported; their key's generation is 1).
    pub untracked_handles: u64,
}

/// A live queue, as far as the ioctl layer knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Queue {
    detail: AmdDetail,
}

#[derive(Clone, Debug, Default)]
struct Process {
    comm: compact_str::CompactString,
    queues: BTreeMap<u32, Queue>,
}

/// The AMD KFD state machine: the queues of every traced process.
#[derive(Clone, Debug, Default)]
pub struct KfdTracker {
    procs: PidMap<Process>,
    counters: KfdTrackerCounters,
    /// Deep-hook findings waiting for their thread's `CREATE_QUEUE` result, by thread id.
    pending: PidMap<Pending>,
    /// Generation of the last queue seen per `(pid, queue id)`, for [`TaskKey`] (capped: see
    /// [`bounded`](crate::model::bounded)).
    generations: Generations<u32>,
}

/// What the deep hooks saw inside a thread's `CREATE_QUEUE` before it returned.
#[derive(Clone, Copy, Debug, Default)]
struct Pending {
    /// The thread's process.
    pid: u32,
    built: Option<QueueBuilt>,
    mqd_addr: Option<u64>,
}

/// A snapshot of a live queue (tests, tools).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueSnapshot {
    pub queue_id: u32,
    pub detail: AmdDetail,
}

/// An event; its [`TaskKey`] is set by [`KfdTracker::observe`].
fn event(origin: &Origin, kind: EventKind, detail: AmdDetail) -> Event {
    Event {
        origin: origin.clone(),
        kind,
        amd: Some(detail),
        api: None,
        key: None,
    }
}

impl KfdTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts the counters back to `c` (a state record's calls are not counted).
    pub(crate) fn set_counters(&mut self, c: KfdTrackerCounters) {
        self.counters = c;
    }

    pub fn counters(&self) -> &KfdTrackerCounters {
        &self.counters
    }

    /// Queues currently alive, over all processes.
    pub fn live_tasks(&self) -> usize {
        self.procs.values().map(|p| p.queues.len()).sum()
    }

    /// The live queue `queue_id` of process `pid`.
    pub fn queue(&self, pid: u32, queue_id: u32) -> Option<QueueSnapshot> {
        let q = self.procs.get(&pid)?.queues.get(&queue_id)?;
        Some(QueueSnapshot {
            queue_id,
            detail: q.detail.clone(),
        })
    }

    /// Observes one input; returns the events it produces, in order.
    pub fn observe(&mut self, origin: Origin, input: KfdInput) -> Vec<Event> {
        let exited = matches!(input, KfdInput::ProcessExit).then_some(origin.pid);
        let mut events = self.observe_input(origin, input);
        for e in &mut events {
            let TaskId::KfdQueue(queue) = e.kind.task() else {
                continue;
            };
            let pid = e.origin.pid;
            let created = matches!(e.kind, EventKind::TaskInit { .. });
            let g = match self.generations.get(pid, queue) {
                Some(g) if created => g + 1,
                Some(g) => g,
                None => 1,
            };
            if !self.generations.set(pid, queue, g, created) {
                self.counters.untracked_handles += 1;
            }
            e.key = Some(TaskKey {
                pid,
                client: None,
                object: queue,
                generation: g,
            });
        }
        if let Some(pid) = exited {
            // After the keys of its last events: its queue ids are forgotten.
            self.generations.forget_process(pid);
        }
        events
    }

    fn observe_input(&mut self, origin: Origin, input: KfdInput) -> Vec<Event> {
        match input {
            KfdInput::ProcessExit => {
                self.process_exit(&origin, origin.pid, DestroyCause::ProcessExit)
            }
            KfdInput::QueueBuilt(b) => {
                self.pending_of(&origin).built = Some(b);
                Vec::new()
            }
            KfdInput::Deep(DeepStep::MqdInit { addr, .. }) => {
                self.pending_of(&origin).mqd_addr = Some(addr);
                Vec::new()
            }
            KfdInput::Deep(DeepStep::Release { owner }) => {
                let events = self.process_exit(&origin, owner, DestroyCause::KfdRelease);
                if events.is_empty() {
                    self.counters.kfd_releases_without_queues += 1;
                }
                events
            }
            KfdInput::Deep(DeepStep::Unknown { .. }) => {
                self.counters.deep_unknown += 1;
                Vec::new()
            }
            KfdInput::Call {
                call: KfdCall::Malformed { reason, .. },
                ..
            } => {
                self.counters.malformed += 1;
                *self.counters.malformed_by_reason.entry(reason).or_default() += 1;
                Vec::new()
            }
            KfdInput::Call { errno, call, .. } => {
                self.counters.calls += 1;
                if errno != 0 {
                    self.counters.failed_calls += 1;
                }
                if !matches!(call, KfdCall::CreateQueue(_))
                    && self.pending.remove(&origin.tid).is_some()
                {
                    self.counters.deep_unmatched += 1;
                }
                match call {
                    KfdCall::CreateQueue(c) => self.create(&origin, errno, &c),
                    KfdCall::DestroyQueue { queue_id } => self.destroy(&origin, errno, queue_id),
                    KfdCall::UpdateQueue(u) => self.update(&origin, errno, &u),
                    KfdCall::SetCuMask {
                        queue_id,
                        num_cu_mask,
                        ..
                    } => self.cu_mask(&origin, errno, queue_id, num_cu_mask),
                    KfdCall::Malformed { .. } => unreachable!("handled above"),
                }
            }
        }
    }

    /// Ends tracing: the queues still alive, per process (ascending pid; processes without
    /// live queues left out; `client` is 0), and forgets all state.
    #[cfg(test)]
    pub fn finish(&mut self) -> Vec<LiveAtEnd> {
        let mut out: Vec<LiveAtEnd> = self
            .procs
            .drain()
            .filter(|(_, p)| !p.queues.is_empty())
            .map(|(pid, p)| LiveAtEnd {
                pid,
                comm: p.comm.into(),
                tasks: p.queues.keys().map(|&q| (0, TaskId::KfdQueue(q))).collect(),
            })
            .collect();
        out.sort_by_key(|l| l.pid);
        out
    }

    fn process_mut(&mut self, origin: &Origin) -> &mut Process {
        let p = self.procs.entry(origin.pid).or_default();
        p.comm.clone_from(&origin.comm);
        p
    }

    fn create(&mut self, origin: &Origin, errno: i32, c: &CreateQueue) -> Vec<Event> {
        let deep = self.pending.remove(&origin.tid);
        let mut requested = AmdDetail {
            queue_type: Some(decode::queue_type_of(c.queue_type)),
            queue_type_raw: Some(c.queue_type),
            gpu_id: Some(c.gpu_id),
            sdma_engine_id: c.sdma_engine_id,
            ..AmdDetail::default()
        };
        set_params(&mut requested, &c.params, errno == 0);
        if errno != 0 {
            if deep.is_some() {
                self.counters.deep_unmatched += 1;
            }
            self.counters.failed_creates += 1;
            // The driver copies the caller's own input back on failure: queue_id and
            // doorbell_offset mean nothing.
            let detail = AmdDetail {
                via: Some(AmdVia::Create),
                ..requested
            };
            return vec![event(
                origin,
                schedule(TaskId::KfdNoQueue, false, errno),
                detail,
            )];
        }
        let task = TaskId::KfdQueue(c.queue_id);
        let mut detail = AmdDetail {
            doorbell_offset: Some(c.doorbell_offset),
            ..requested
        };
        if let Some(deep) = deep {
            self.enrich(&mut detail, c.queue_id, deep);
        }
        let proc = self.process_mut(origin);
        if proc
            .queues
            .insert(
                c.queue_id,
                Queue {
                    detail: detail.clone(),
                },
            )
            .is_some()
        {
            self.counters.replaced_queues += 1;
        }
        let mut events = vec![
            event(
                origin,
                EventKind::TaskInit {
                    task,
                    client: 0,
                    engine: None,
                    engine_type: None,
                    timeslice_us: None,
                    timeslice_source: ValueSource::DriverDefault,
                    interleave: None,
                    interleave_source: ValueSource::DriverDefault,
                    runlist: None,
                    gpu: Some(c.gpu_id),
                },
                detail.clone(),
            ),
            event(
                origin,
                EventKind::WorkSubmit {
                    task,
                    client: 0,
                    channel_handle: 0,
                    chid: None,
                    runlist: None,
                    // The doorbell's byte offset in the process's doorbell pages (the low bits
                    // of the mmap offset; 0 before SOC15).
                    token: decode::split_doorbell(c.doorbell_offset).offset_in_process as u32,
                    gpu: Some(c.gpu_id),
                },
                detail.clone(),
            ),
        ];
        if c.params.active() {
            events.push(event(
                origin,
                schedule(task, true, 0),
                AmdDetail {
                    via: Some(AmdVia::Create),
                    ..detail
                },
            ));
        }
        events
    }

    fn pending_of(&mut self, origin: &Origin) -> &mut Pending {
        let p = self.pending.entry(origin.tid).or_default();
        p.pid = origin.pid;
        p
    }

    /// Adds what the deep hooks saw inside this create to its detail, if it is about the same
    /// queue; otherwise counts it as unmatched.
    fn enrich(&mut self, detail: &mut AmdDetail, queue_id: u32, deep: Pending) {
        let mut matched = deep.mqd_addr.is_some() || deep.built.is_some();
        if let Some(b) = deep.built {
            match (b.ret == 0, b.props) {
                (true, Some(p)) if p.queue_id == queue_id => {
                    detail.hw_doorbell = Some(p.hw_doorbell);
                    detail.vmid = Some(p.vmid);
                    detail.driver_active = Some(p.active);
                }
                (true, None) => {}
                _ => matched = false,
            }
        }
        detail.mqd_init_addr = deep.mqd_addr;
        if !matched {
            self.counters.deep_unmatched += 1;
        }
    }

    fn destroy(&mut self, origin: &Origin, errno: i32, queue_id: u32) -> Vec<Event> {
        if errno != 0 {
            return Vec::new();
        }
        let known = self.process_mut(origin).queues.remove(&queue_id);
        if known.is_none() {
            self.counters.unknown_queue += 1;
        }
        let detail = known.map(|q| q.detail).unwrap_or_default();
        vec![event(
            origin,
            EventKind::TaskDestroy {
                task: TaskId::KfdQueue(queue_id),
                client: 0,
                cause: DestroyCause::Free,
                implicit: false,
                final_params: None,
            },
            detail,
        )]
    }

    fn update(&mut self, origin: &Origin, errno: i32, u: &UpdateQueue) -> Vec<Event> {
        self.change(origin, errno, u.queue_id, AmdVia::Update, |d| {
            let change = SchedChange::AmdQueue {
                old_priority: d.priority,
                new_priority: u.params.queue_priority,
                old_percentage: d.percentage,
                new_percentage: u.params.percentage(),
            };
            set_params(d, &u.params, errno == 0);
            change
        })
    }

    fn cu_mask(&mut self, origin: &Origin, errno: i32, queue_id: u32, bits: u32) -> Vec<Event> {
        self.change(origin, errno, queue_id, AmdVia::CuMask, |d| {
            let change = SchedChange::CuMask {
                old_bits: d.cu_mask_bits,
                new_bits: bits,
            };
            d.cu_mask_bits = Some(bits);
            change
        })
    }

    /// A call that changes a queue's scheduling parameters: a `SCHED_UPDATE` with the queue's
    /// state as `apply` leaves it (what the call carries over what was known); the tracked
    /// queue keeps that state only if the call succeeded.
    fn change(
        &mut self,
        origin: &Origin,
        errno: i32,
        queue_id: u32,
        via: AmdVia,
        apply: impl FnOnce(&mut AmdDetail) -> SchedChange,
    ) -> Vec<Event> {
        let proc = self.process_mut(origin);
        let known = proc.queues.get_mut(&queue_id);
        let was_known = known.is_some();
        let mut detail = known.as_ref().map(|q| q.detail.clone()).unwrap_or_default();
        let was_active = detail.active;
        let change = apply(&mut detail);
        if errno == 0
            && let Some(q) = known
        {
            q.detail = detail.clone();
        }
        if !was_known {
            self.counters.unknown_queue += 1;
        }
        detail.via = Some(via);
        let mut events = Vec::new();
        if errno == 0 && was_active == Some(false) && detail.active == Some(true) {
            // A queue created inactive becomes active: its admission point, as a create of an
            // active queue would have been.
            events.push(event(
                origin,
                schedule(TaskId::KfdQueue(queue_id), true, 0),
                detail.clone(),
            ));
        }
        events.push(event(
            origin,
            EventKind::SchedUpdate {
                task: TaskId::KfdQueue(queue_id),
                client: 0,
                change,
                allowed: errno == 0,
                rm_status: None,
                errno,
                via_channel: false,
            },
            detail,
        ));
        events
    }

    /// Ends every queue of process `pid`: at its exit (implicit) or at the driver's teardown
    /// (`kfd_release`, which may run on another thread: the events carry the owner's pid and
    /// name).
    fn process_exit(&mut self, origin: &Origin, pid: u32, cause: DestroyCause) -> Vec<Event> {
        if cause == DestroyCause::ProcessExit {
            // Leftovers of this process's threads: their creates will not come now.
            let before = self.pending.len();
            self.pending.retain(|_, p| p.pid != pid);
            self.counters.deep_unmatched += (before - self.pending.len()) as u64;
        }
        let Some(proc) = self.procs.remove(&pid) else {
            return Vec::new();
        };
        let origin = if origin.pid == pid {
            origin.clone()
        } else {
            Origin {
                pid,
                tid: pid,
                comm: proc.comm.clone(),
                ..origin.clone()
            }
        };
        proc.queues
            .into_iter()
            .map(|(queue_id, q)| {
                event(
                    &origin,
                    EventKind::TaskDestroy {
                        task: TaskId::KfdQueue(queue_id),
                        client: 0,
                        cause,
                        implicit: cause.is_implicit(),
                        final_params: None,
                    },
                    q.detail,
                )
            })
            .collect()
    }
}

/// Sets the fields of `d` that `CREATE_QUEUE` and `UPDATE_QUEUE` both carry. The ring size is
/// the one the driver uses when the call succeeded (at least 1024), else the one asked for.
fn set_params(d: &mut AmdDetail, p: &QueueParams, ok: bool) {
    d.priority = Some(p.queue_priority);
    d.percentage = Some(p.percentage());
    d.pm4_target_xcc = Some(p.pm4_target_xcc());
    d.ring_size = Some(if ok {
        p.effective_ring_size()
    } else {
        p.ring_size
    });
    d.active = Some(p.active());
}

/// A `SCHEDULE` of a KFD queue: no channels, timeslice or interleave at this layer; no RM status.
fn schedule(task: TaskId, allowed: bool, errno: i32) -> EventKind {
    EventKind::Schedule {
        task,
        client: 0,
        channels: None,
        timeslice_us: None,
        interleave: None,
        allowed,
        rm_status: None,
        errno,
        via_channel: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::AmdQueueType;
    use crate::source::amd::decode::testing::{self, CreateArgs, soc15_doorbell};
    use crate::source::observe_one;
    use crate::wire::RawRecord;
    use gpu_trace_common::{KfdIoctlRecord, amd::cmd};

    const EINVAL: i32 = -22;
    const EPERM: i32 = -1;

    fn run(tracker: &mut KfdTracker, recs: &[KfdIoctlRecord]) -> Vec<Event> {
        recs.iter()
            .flat_map(|r| observe_one(tracker, &RawRecord::KfdIoctl(*r)))
            .collect()
    }

    fn exit(tracker: &mut KfdTracker, pid: u32) -> Vec<Event> {
        let origin = Origin {
            ts_ns: 9,
            cpu: 0,
            pid,
            tid: pid,
            comm: "hip_app".into(),
        };
        tracker.observe(origin, KfdInput::ProcessExit)
    }

    /// Task, cause and implicitness of a `TASK_DESTROY`.
    fn ended(ev: &Event) -> (TaskId, DestroyCause, bool) {
        match ev.kind {
            EventKind::TaskDestroy {
                task,
                cause,
                implicit,
                ..
            } => (task, cause, implicit),
            ref other => panic!("not a TASK_DESTROY: {other:?}"),
        }
    }

    fn names(events: &[Event]) -> Vec<&'static str> {
        events.iter().map(|e| e.kind.name()).collect()
    }

    fn created(pid: u32, queue_id: u32) -> KfdIoctlRecord {
        CreateArgs {
            queue_id,
            doorbell_offset: soc15_doorbell(0xbeef, 8 * u64::from(queue_id)),
            ..CreateArgs::default()
        }
        .created(pid, 4)
    }

    #[test]
    fn successful_create_inits_assigns_a_doorbell_and_schedules() {
        let mut t = KfdTracker::new();
        let ev = run(&mut t, &[created(100, 2)]);
        assert_eq!(names(&ev), ["TASK_INIT", "WORK_SUBMIT", "SCHEDULE"]);
        let EventKind::TaskInit {
            task,
            gpu,
            runlist,
            timeslice_us,
            ..
        } = ev[0].kind
        else {
            panic!()
        };
        assert_eq!(task, TaskId::KfdQueue(2));
        assert_eq!((gpu, runlist, timeslice_us), (Some(0xbeef), None, None));
        let d = ev[0].amd.as_ref().unwrap();
        assert_eq!(d.queue_type, Some(AmdQueueType::ComputeAql));
        assert_eq!(d.queue_type_raw, Some(2));
        assert_eq!(
            (d.priority, d.percentage, d.pm4_target_xcc),
            (Some(7), Some(100), Some(0))
        );
        assert_eq!(d.ring_size, Some(0x10_0000));
        assert_eq!(d.gpu_id, Some(0xbeef));
        assert_eq!(d.doorbell_offset, Some(soc15_doorbell(0xbeef, 16)));
        assert_eq!(d.sdma_engine_id, Some(0));
        assert_eq!(d.active, Some(true));
        assert_eq!(d.via, None);
        let EventKind::WorkSubmit { token, gpu, .. } = ev[1].kind else {
            panic!()
        };
        assert_eq!((token, gpu), (16, Some(0xbeef)));
        let EventKind::Schedule {
            allowed,
            errno,
            task,
            ..
        } = ev[2].kind
        else {
            panic!()
        };
        assert_eq!((allowed, errno, task), (true, 0, TaskId::KfdQueue(2)));
        assert_eq!(ev[2].amd.as_ref().unwrap().via, Some(AmdVia::Create));
        assert_eq!(t.live_tasks(), 1);
        assert_eq!(t.queue(100, 2).unwrap().detail, *d);
    }

    #[test]
    fn deep_hook_findings_enrich_the_create_of_the_same_thread_once() {
        use gpu_trace_common::deep_hook;
        let mut t = KfdTracker::new();
        // Inside the CREATE_QUEUE of pid 100: the MQD copy runs, the DQM's create_queue returns, then
        // the handler (or the syscall) reports the create.
        let mut ev = observe_one(
            &mut t,
            &RawRecord::Deep(testing::deep(
                100,
                deep_hook::INIT_MQD,
                2,
                0xffff_ffff_c0a1_0000,
            )),
        );
        ev.extend(observe_one(
            &mut t,
            &RawRecord::KfdQueue(testing::queue_built(100, 2, 0x1002)),
        ));
        assert!(
            ev.is_empty(),
            "deep findings are not events on their own: {ev:?}"
        );
        let ev = run(&mut t, &[created(100, 2)]);
        assert_eq!(names(&ev), ["TASK_INIT", "WORK_SUBMIT", "SCHEDULE"]);
        let d = ev[0].amd.as_ref().unwrap();
        assert_eq!(
            (d.hw_doorbell, d.vmid, d.driver_active, d.mqd_init_addr),
            (
                Some(0x1002),
                Some(0),
                Some(true),
                Some(0xffff_ffff_c0a1_0000)
            )
        );
        // Taken up once: the next create of that thread has none of it.
        let ev = run(&mut t, &[created(100, 3)]);
        assert_eq!(ev[0].amd.as_ref().unwrap().hw_doorbell, None);
        assert_eq!(t.counters().deep_unmatched, 0);
    }

    /// The MQD copy alone (no DQM record) is the create's too; findings of a process whose
    /// creates never came are counted at its exit, each.
    #[test]
    fn an_mqd_copy_alone_enriches_its_create_and_leftovers_count_at_exit() {
        use gpu_trace_common::deep_hook;
        let mut t = KfdTracker::new();
        let mqd = |pid, tid| {
            let mut r = testing::deep(pid, deep_hook::INIT_MQD, 2, 0xffff_ffff_c0a1_0000);
            r.hdr.tid = tid;
            RawRecord::Deep(r)
        };
        observe_one(&mut t, &mqd(100, 100));
        let ev = run(&mut t, &[created(100, 2)]);
        let d = ev[0].amd.as_ref().unwrap();
        assert_eq!(
            (d.mqd_init_addr, d.hw_doorbell),
            (Some(0xffff_ffff_c0a1_0000), None)
        );
        assert_eq!(t.counters().deep_unmatched, 0);
        // Two threads of pid 100 and one of pid 200 saw a copy; pid 100 exits.
        for (pid, tid) in [(100, 101), (100, 102), (200, 201)] {
            observe_one(&mut t, &mqd(pid, tid));
        }
        exit(&mut t, 100);
        assert_eq!(t.counters().deep_unmatched, 2);
        exit(&mut t, 200);
        assert_eq!(t.counters().deep_unmatched, 3);
    }

    /// A DQM record whose queue properties could not be read is still the create's (not
    /// counted as unmatched; no doorbell claimed); a deep record of no hook this tracker
    /// knows is counted, no event.
    #[test]
    fn unreadable_queue_properties_and_unknown_deep_hooks() {
        let mut t = KfdTracker::new();
        let mut built = testing::queue_built(100, 2, 0x1002);
        built.flags = gpu_trace_common::kfd_queue_flags::PROPS_READ_FAILED;
        observe_one(&mut t, &RawRecord::KfdQueue(built));
        let ev = run(&mut t, &[created(100, 2)]);
        assert_eq!(ev[0].amd.as_ref().unwrap().hw_doorbell, None);
        assert_eq!(t.counters().deep_unmatched, 0);
        let unknown = testing::deep(100, 0x7777, 0, 0);
        assert!(observe_one(&mut t, &RawRecord::Deep(unknown)).is_empty());
        assert!(observe_one(&mut t, &RawRecord::Deep(unknown)).is_empty());
        assert_eq!(t.counters().deep_unknown, 2);
    }

    /// Calls on queues never seen created get a remembered generation up to the per-process
    /// cap; past it each is counted (`untracked_handles`) and still reported.
    #[test]
    fn calls_on_unseen_queues_past_the_cap_are_counted_and_still_reported() {
        let cap = crate::model::bounded::MAX_HANDLES_PER_PROCESS as u32;
        let mut t = KfdTracker::new();
        let updates: Vec<_> = (0..cap + 2)
            .map(|q| testing::update(100, 4, q, 4096, 30, 2, -22))
            .collect();
        let ev = run(&mut t, &updates);
        assert_eq!(ev.len(), cap as usize + 2);
        assert_eq!(t.counters().untracked_handles, 2);
    }

    #[test]
    fn deep_findings_not_taken_up_are_counted_not_attached_elsewhere() {
        let mut t = KfdTracker::new();
        // Another queue's record (ids differ), then a refused create, then a destroy.
        observe_one(
            &mut t,
            &RawRecord::KfdQueue(testing::queue_built(100, 9, 0x1009)),
        );
        let ev = run(&mut t, &[created(100, 2)]);
        assert_eq!(ev[0].amd.as_ref().unwrap().hw_doorbell, None);
        observe_one(
            &mut t,
            &RawRecord::KfdQueue(testing::queue_built(100, 3, 0x1003)),
        );
        let refused = testing::record(
            100,
            4,
            cmd::CREATE_QUEUE,
            EINVAL.into(),
            &CreateArgs::default().bytes(),
        );
        run(&mut t, &[refused]);
        observe_one(
            &mut t,
            &RawRecord::KfdQueue(testing::queue_built(100, 4, 0x1004)),
        );
        run(&mut t, &[testing::destroy(100, 4, 2, 0)]);
        assert_eq!(t.counters().deep_unmatched, 3);
    }

    #[test]
    fn driver_teardown_ends_the_owners_queues_once_whoever_runs_it() {
        use gpu_trace_common::deep_hook;
        let mut t = KfdTracker::new();
        run(&mut t, &[created(100, 2), created(100, 3)]);
        // pqm_uninit on a worker thread (pid 7): the owner is the record's value.
        let mut worker = testing::deep(7, deep_hook::KFD_RELEASE, 100, 0);
        worker.hdr.comm = *b"kworker/u4:2\0\0\0\0";
        let ev = observe_one(&mut t, &RawRecord::Deep(worker));
        assert_eq!(names(&ev), ["TASK_DESTROY", "TASK_DESTROY"]);
        for e in &ev {
            assert_eq!(e.origin.pid, 100, "reported for the owner, not the worker");
            assert_eq!(e.origin.tid, 100);
            assert_eq!(e.origin.comm, "hip_app");
            let (_, cause, implicit) = ended(e);
            assert_eq!((cause, implicit), (DestroyCause::KfdRelease, false));
        }
        // The process exit that follows ends nothing more; a teardown of a process without
        // queues is counted.
        assert!(exit(&mut t, 100).is_empty());
        assert!(
            observe_one(
                &mut t,
                &RawRecord::Deep(testing::deep(7, deep_hook::KFD_RELEASE, 555, 0))
            )
            .is_empty()
        );
        assert_eq!(t.counters().kfd_releases_without_queues, 1);
        // Exit first, teardown later: the exit ends them (implicit), the teardown finds none.
        run(&mut t, &[created(200, 1)]);
        assert_eq!(ended(&exit(&mut t, 200)[0]).1, DestroyCause::ProcessExit);
        assert!(
            observe_one(
                &mut t,
                &RawRecord::Deep(testing::deep(7, deep_hook::KFD_RELEASE, 200, 0))
            )
            .is_empty()
        );
    }

    #[test]
    fn an_inactive_create_is_not_a_schedule_until_updated() {
        let mut t = KfdTracker::new();
        // Percentage 0: the driver creates the queue inactive.
        let rec = CreateArgs {
            queue_id: 1,
            percentage: 0,
            ring_size: 1024,
            ..CreateArgs::default()
        }
        .created(7, 4);
        let ev = run(&mut t, &[rec]);
        assert_eq!(names(&ev), ["TASK_INIT", "WORK_SUBMIT"]);
        assert_eq!(ev[0].amd.as_ref().unwrap().active, Some(false));
        let ev = run(&mut t, &[testing::update(7, 4, 1, 0, 50, 12, 0)]);
        assert_eq!(names(&ev), ["SCHEDULE", "SCHED_UPDATE"]);
        for e in &ev {
            let d = e.amd.as_ref().unwrap();
            assert_eq!(d.via, Some(AmdVia::Update));
            assert_eq!(
                (d.percentage, d.priority, d.active),
                (Some(50), Some(12), Some(true))
            );
        }
        let EventKind::SchedUpdate { change, .. } = &ev[1].kind else {
            panic!()
        };
        // CreateArgs' default priority is the value it was created with; percentage 0 → 50.
        let SchedChange::AmdQueue {
            old_percentage,
            new_percentage,
            new_priority,
            ..
        } = change
        else {
            panic!("{change:?}")
        };
        assert_eq!(
            (*old_percentage, *new_percentage, *new_priority),
            (Some(0), 50, 12)
        );
        let d = ev[1].amd.as_ref().unwrap();
        assert_eq!(
            d.ring_size,
            Some(1024),
            "ring size 0 means the driver's minimum"
        );
        assert_eq!(
            d.queue_type,
            Some(AmdQueueType::ComputeAql),
            "kept from the create"
        );
        let q = t.queue(7, 1).unwrap().detail;
        assert_eq!(
            (q.percentage, q.priority, q.via),
            (Some(50), Some(12), None)
        );
        // A second update of an active queue is no new admission.
        let ev = run(&mut t, &[testing::update(7, 4, 1, 0, 60, 12, 0)]);
        assert_eq!(names(&ev), ["SCHED_UPDATE"]);
    }

    #[test]
    fn a_refused_create_reports_the_errno_and_no_task() {
        let mut t = KfdTracker::new();
        // What the lab's kernel does without a GPU: EINVAL at the gpu_id lookup. The driver
        // copies the caller's input back, so queue_id holds whatever the caller left there.
        let rec = CreateArgs {
            queue_id: 77,
            ring_size: 100,
            ..CreateArgs::default()
        };
        let rec = testing::record(5, 4, cmd::CREATE_QUEUE, i64::from(EINVAL), &rec.bytes());
        let ev = run(&mut t, &[rec]);
        assert_eq!(names(&ev), ["SCHEDULE"]);
        let EventKind::Schedule {
            task,
            allowed,
            errno,
            rm_status,
            ..
        } = ev[0].kind
        else {
            panic!()
        };
        assert_eq!(
            (task, allowed, errno, rm_status),
            (TaskId::KfdNoQueue, false, EINVAL, None)
        );
        let d = ev[0].amd.as_ref().unwrap();
        assert_eq!(d.via, Some(AmdVia::Create));
        assert_eq!(
            (d.gpu_id, d.ring_size, d.doorbell_offset),
            (Some(0xbeef), Some(100), None)
        );
        assert_eq!(t.live_tasks(), 0);
        assert_eq!(t.counters().failed_creates, 1);
        assert_eq!(t.counters().failed_calls, 1);
        // Its process exiting ends nothing.
        assert!(exit(&mut t, 5).is_empty());
    }

    #[test]
    fn destroy_ends_the_queue_once() {
        let mut t = KfdTracker::new();
        run(&mut t, &[created(1, 0), created(1, 1)]);
        let ev = run(&mut t, &[testing::destroy(1, 4, 0, 0)]);
        assert_eq!(names(&ev), ["TASK_DESTROY"]);
        assert_eq!(
            ended(&ev[0]),
            (TaskId::KfdQueue(0), DestroyCause::Free, false)
        );
        assert_eq!(ev[0].amd.as_ref().unwrap().gpu_id, Some(0xbeef));
        assert_eq!(t.live_tasks(), 1);
        // A refused destroy changes nothing.
        assert!(run(&mut t, &[testing::destroy(1, 4, 1, i64::from(EINVAL))]).is_empty());
        assert_eq!(t.live_tasks(), 1);
        // The process exits with queue 1 alive: implicit end, and only that one.
        let ev = exit(&mut t, 1);
        assert_eq!(ev.len(), 1);
        assert_eq!(
            ended(&ev[0]),
            (TaskId::KfdQueue(1), DestroyCause::ProcessExit, true)
        );
        assert_eq!(t.live_tasks(), 0);
        assert!(
            exit(&mut t, 1).is_empty(),
            "a second exit notice ends nothing"
        );
    }

    #[test]
    fn closing_the_fd_ends_nothing() {
        // Through the dispatcher, as the pipeline hands records over: the close of the
        // process's `/dev/kfd` fd reaches no KFD queue.
        let mut s = crate::source::Sources::new();
        let create = created(3, 0);
        assert_eq!(s.events_of(&RawRecord::KfdIoctl(create)).len(), 3);
        let close = gpu_trace_common::TaskRecord {
            hdr: gpu_trace_common::RecordHeader {
                kind: gpu_trace_common::record_kind::FD_CLOSE,
                ..create.hdr
            },
            value: create.fd,
            _pad: 0,
        };
        assert!(s.events_of(&RawRecord::FdClose(close)).is_empty());
        assert_eq!(s.amd().live_tasks(), 1);
    }

    #[test]
    fn update_and_cu_mask_report_allowed_or_the_errno() {
        let mut t = KfdTracker::new();
        run(&mut t, &[created(1, 3)]);
        let ev = run(
            &mut t,
            &[
                testing::update(1, 4, 3, 4096, 30, 2, 0),
                testing::update(1, 4, 3, 4096, 101, 2, i64::from(EINVAL)),
                testing::cu_mask(1, 4, 3, 64, 0),
                testing::cu_mask(1, 4, 3, 33, i64::from(EINVAL)),
                testing::cu_mask(1, 4, 3, 64, i64::from(EPERM)),
            ],
        );
        assert_eq!(names(&ev), ["SCHED_UPDATE"; 5]);
        let verdicts: Vec<(bool, i32, Option<AmdVia>)> = ev
            .iter()
            .map(|e| match e.kind {
                EventKind::SchedUpdate { allowed, errno, .. } => {
                    (allowed, errno, e.amd.as_ref().unwrap().via)
                }
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            verdicts,
            [
                (true, 0, Some(AmdVia::Update)),
                (false, EINVAL, Some(AmdVia::Update)),
                (true, 0, Some(AmdVia::CuMask)),
                (false, EINVAL, Some(AmdVia::CuMask)),
                (false, EPERM, Some(AmdVia::CuMask)),
            ]
        );
        // Only the successful calls changed the queue.
        let q = t.queue(1, 3).unwrap().detail;
        assert_eq!(
            (q.percentage, q.priority, q.ring_size, q.cu_mask_bits),
            (Some(30), Some(2), Some(4096), Some(64))
        );
        // The CU mask event carries the queue's current parameters.
        let d = ev[2].amd.as_ref().unwrap();
        assert_eq!(
            (d.cu_mask_bits, d.percentage, d.queue_type),
            (Some(64), Some(30), Some(AmdQueueType::ComputeAql))
        );
        assert_eq!(t.counters().failed_calls, 3);
        assert_eq!(t.counters().unknown_queue, 0);
    }

    #[test]
    fn calls_on_queues_created_before_tracing_are_still_reported() {
        let mut t = KfdTracker::new();
        let ev = run(
            &mut t,
            &[
                testing::cu_mask(9, 4, 5, 32, 0),
                testing::update(9, 4, 5, 2048, 10, 1, 0),
                testing::destroy(9, 4, 5, 0),
            ],
        );
        assert_eq!(names(&ev), ["SCHED_UPDATE", "SCHED_UPDATE", "TASK_DESTROY"]);
        let d = ev[0].amd.as_ref().unwrap();
        assert_eq!(
            (d.cu_mask_bits, d.queue_type, d.priority),
            (Some(32), None, None)
        );
        assert_eq!(ev[1].amd.as_ref().unwrap().priority, Some(1));
        assert_eq!(ev[2].kind.task(), TaskId::KfdQueue(5));
        assert_eq!(t.counters().unknown_queue, 3);
        assert_eq!(t.live_tasks(), 0, "nothing is invented for unknown queues");
    }

    #[test]
    fn many_processes_with_the_same_queue_ids_are_kept_apart() {
        let mut t = KfdTracker::new();
        for pid in 1..=50 {
            run(&mut t, &[created(pid, 0), created(pid, 1)]);
        }
        assert_eq!(t.live_tasks(), 100);
        // Process 7 destroys its queue 0; process 8 exits.
        let ev = run(&mut t, &[testing::destroy(7, 4, 0, 0)]);
        assert_eq!(ev[0].origin.pid, 7);
        assert!(t.queue(7, 0).is_none() && t.queue(8, 0).is_some() && t.queue(7, 1).is_some());
        let ev = exit(&mut t, 8);
        assert_eq!(ev.len(), 2);
        assert!(ev.iter().all(|e| e.origin.pid == 8));
        assert_eq!(t.live_tasks(), 97);
        let live = t.finish();
        assert_eq!(live.len(), 49);
        assert!(live.windows(2).all(|w| w[0].pid < w[1].pid));
        assert_eq!(
            live.iter().find(|l| l.pid == 7).unwrap().tasks,
            [(0, TaskId::KfdQueue(1))]
        );
        assert_eq!(t.live_tasks(), 0);
    }

    #[test]
    fn a_reused_live_id_is_counted() {
        let mut t = KfdTracker::new();
        run(&mut t, &[created(1, 0), created(1, 0)]);
        assert_eq!(t.counters().replaced_queues, 1);
        assert_eq!(t.live_tasks(), 1);
    }

    #[test]
    fn malformed_records_are_counted_not_reported() {
        let mut t = KfdTracker::new();
        let mut rec = testing::destroy(1, 4, 0, 0);
        rec.flags = gpu_trace_common::amd::kfd_flags::ARGS_READ_FAILED;
        rec.args_len = 0;
        assert!(run(&mut t, &[rec]).is_empty());
        assert_eq!(t.counters().malformed, 1);
        assert_eq!(
            t.counters().malformed_by_reason[&KfdMalformed::ArgsReadFailed],
            1
        );
        assert_eq!(t.counters().calls, 0);
    }

    #[test]
    fn nvidia_records_are_not_ours() {
        let mut t = KfdTracker::new();
        let nv = gpu_trace_common::NvIoctlRecord {
            hdr: testing::destroy(1, 4, 0, 0).hdr,
            ret: 0,
            fd: 3,
            ioctl_cmd: 0,
            rdev: 0,
            escape: 0,
            param_size: 0,
            flags: 0,
            params_len: 0,
            sub_len: 0,
            params: [0; gpu_trace_common::NV_PARAMS_MAX],
            sub: [0; gpu_trace_common::NV_SUB_MAX],
        };
        assert!(observe_one(&mut t, &RawRecord::NvIoctl(nv)).is_empty());
    }
}
