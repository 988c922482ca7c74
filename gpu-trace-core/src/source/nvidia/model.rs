//! The NVIDIA object model: which RM objects (clients, devices, TSGs, channels) each process
//! holds, and the events their lives produce.
//!
//! Input: decoded RM calls ([`RmCall`], with the syscall's errno and fd), plus the process-exit
//! and fd-close notices of the kernel programs. Output: [`Event`]s.
//!
//! Rules:
//! - Objects are tracked per `(pid, RM client handle)`: handles are only unique inside a client,
//!   and clients only inside a process as far as this tracer is concerned.
//! - `TASK_INIT` when an alloc of `KEPLER_CHANNEL_GROUP_A` succeeds (errno 0, status `NV_OK`).
//!   New TSGs get the driver defaults (timeslice 1024 µs, interleave MEDIUM), marked
//!   [`ValueSource::DriverDefault`] until a successful `SET_TIMESLICE`/`GET_TIMESLICE` or
//!   `SET_INTERLEAVE_LEVEL` (TSG- or channel-level) says otherwise.
//! - `SCHEDULE` on `GPFIFO_SCHEDULE` with `bEnable=1`, TSG-level or channel-level (then reported
//!   for the channel's TSG), allowed or not. A request on an object this tracer never saw created
//!   (the process started before tracing) is still reported, under the handle it was sent to,
//!   with unknown (`None`) channel count, timeslice and interleave.
//! - `WORK_SUBMIT` on a successful `GET_WORK_SUBMIT_TOKEN`; the token's runlist becomes the TSG's.
//! - The TSG's id is its RM handle until `GET_INFO` returned its hardware TSG id.
//! - `TASK_DESTROY` on a successful `RM_FREE` of the TSG, of its device or of its client; and,
//!   implicitly, when the process closes the fd its RM client was allocated on (or, where that
//!   allocation was not seen, the fd the TSG was allocated on) and when the process exits.
//! - Objects alive when tracing stops are not events: [`NvTracker::finish`] lists them.
//!
//! - gpu_ext-patched drivers (deep hooks on `nv_gpu_sched_*`): a hook that ran inside an
//!   `ioctl` is kept per thread and added to the event of that thread's next traced RM call on
//!   the same fd — `task_init` gives the TSG its hardware id (the `TSG=` column) and the driver's
//!   real default timeslice, `bind` gives a `SCHEDULE` the driver's channel count, timeslice and
//!   interleave and the TSG its runlist. Hooks are never events on their own: one that no call
//!   takes up is counted (`gpu_ext_unmatched`), as are hooks outside an `ioctl`
//!   (`gpu_ext_outside_ioctl`: UVM's internal channels, teardown at `close()` or exit).
//!
//! Limits: a `close()` of one of several duplicates of an fd does not release the driver's
//! objects, but looks the same as the last `close()` here; objects a child inherits through
//! `fork` are not followed.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::bounded::{Generations, PidMap};

use gpu_trace_common::nvidia::{class, cmd};
use serde::Serialize;

use crate::event::{
    DestroyCause, Event, EventKind, FinalParams, Origin, RunState, SchedChange, SchedParams,
    TaskId, TaskKey, ValueSource,
};
use crate::source::nvidia::decode::{
    self, AllocParams, ControlParams, DEFAULT_INTERLEAVE, DEFAULT_TIMESLICE_US, MalformedReason,
    RmCall, Unreadable,
};
use crate::source::nvidia::gpu_ext::{GxCall, GxHook};

/// One input of the tracker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvInput {
    /// A completed RM ioctl.
    Call {
        /// File descriptor the ioctl was issued on.
        fd: i32,
        /// The syscall's negative errno (0 on success).
        errno: i32,
        /// The decoded call.
        call: RmCall,
    },
    /// The process (the whole thread group) exited.
    ProcessExit,
    /// The process closed a file descriptor.
    FdClose {
        /// The closed fd.
        fd: i32,
    },
    /// A gpu_ext scheduling hook ran (deep hook on a patched driver).
    Sched(GxCall),
}

/// What the tracker saw that produced no event, for the statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NvTrackerCounters {
    /// Well-formed RM calls observed.
    pub calls: u64,
    /// Of those, calls that failed (errno != 0 or RM status != `NV_OK`).
    pub failed_calls: u64,
    /// Of those, TSG allocations (no `TASK_INIT` was reported for them).
    pub failed_tsg_allocs: u64,
    /// Records that were not decodable RM calls.
    pub malformed: u64,
    /// [`malformed`](Self::malformed) by reason.
    pub malformed_by_reason: BTreeMap<MalformedReason, u64>,
    /// Calls of interest whose class/control parameters could not be decoded.
    pub unreadable_params: u64,
    /// [`unreadable_params`](Self::unreadable_params) by reason.
    pub unreadable_by_reason: BTreeMap<Unreadable, u64>,
    /// `GPFIFO_SCHEDULE` requests not reported because their parameters were unreadable (so
    /// `bEnable` is unknown).
    pub schedule_unreadable: u64,
    /// `GPFIFO_SCHEDULE` with `bEnable=0` (disable / remove from the runlist): not reported.
    pub schedule_disable: u64,
    /// Calls on TSGs or channels this tracer never saw created (reported under their handle
    /// where an event is due).
    pub unknown_handle: u64,
    /// Successful `RM_FREE`s of objects that are not tracked (memory, other classes, or objects
    /// created before tracing).
    pub untracked_frees: u64,
    /// Successful allocations that reused a handle still tracked as alive (a free was missed).
    pub replaced_handles: u64,
    /// gpu_ext hooks that ran inside an `ioctl` but that no traced RM call of the same thread
    /// and fd took up (or whose context could not be read).
    pub gpu_ext_unmatched: u64,
    /// Late attach: successful calls on an RM client made before tracing started that
    /// produced no event (frees of objects never seen created, controls that only update state
    /// not known here).
    pub pretrace_calls: u64,
    /// gpu_ext hooks that ran outside an `ioctl` (kernel-internal users such as UVM, teardown
    /// at `close()` or exit): not tied to a call, not reported.
    pub gpu_ext_outside_ioctl: u64,
    /// Calls on handles never seen created that were not remembered because the caps of
    /// [`bounded`](crate::model::bounded) were reached (still reported; their key's generation is 1).
    pub untracked_handles: u64,
}

#[cfg(test)]
pub use crate::source::LiveAtEnd;

/// What the tracker knows about one live TSG ([`NvTracker::task`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskSnapshot {
    /// How events name the TSG now.
    pub task: TaskId,
    /// Parent (device) handle.
    pub parent: u32,
    /// The fd the alloc came through.
    pub fd: i32,
    /// NV2080 engine type from the alloc parameters, when they were readable.
    pub engine_type: Option<u32>,
    /// Current scheduling parameters (the runlist once a work-submit token of one of its
    /// channels or a gpu_ext hook named it).
    #[serde(flatten)]
    pub sched: SchedParams,
    /// Channel handles.
    pub channels: Vec<u32>,
    /// GPU index (`deviceId` of the parent device), when seen.
    pub gpu: Option<u32>,
}

#[derive(Clone, Debug)]
struct Tsg {
    /// Parent (device) handle.
    parent: u32,
    /// The fd the alloc came through.
    fd: i32,
    engine_type: Option<u32>,
    sched: SchedParams,
    hw_id: Option<u32>,
    channels: BTreeSet<u32>,
    /// Run-unique identity ([`TaskKey`]).
    key: TaskKey,
}

impl Tsg {
    fn task(&self, handle: u32) -> TaskId {
        match self.hw_id {
            Some(id) => TaskId::HwTsg(id),
            None => TaskId::RmHandle(handle),
        }
    }

    fn final_params(&self) -> FinalParams {
        FinalParams {
            sched: self.sched,
            channels: u32::try_from(self.channels.len()).unwrap_or(u32::MAX),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Channel {
    /// TSG handle, or the device handle for a channel without a TSG of its own.
    parent: u32,
}

#[derive(Clone, Debug, Default)]
struct Client {
    /// The fd the client was allocated on, when that was seen.
    fd: Option<i32>,
    /// Device handle → `deviceId`.
    devices: BTreeMap<u32, Option<u32>>,
    tsgs: BTreeMap<u32, Tsg>,
    /// Change it through [`Client::add_channel`], [`Client::remove_channel`] and
    /// [`Client::drop_channels_under`], which keep `channel_parents` in step.
    channels: BTreeMap<u32, Channel>,
    /// How many of `channels` each parent handle has (none: absent), so that freeing an object
    /// looks its channels up instead of scanning every channel of the client.
    channel_parents: BTreeMap<u32, u32>,
}

impl Client {
    /// The TSG handle a channel belongs to, if both are known.
    fn tsg_of_channel(&self, channel: u32) -> Option<u32> {
        let parent = self.channels.get(&channel)?.parent;
        self.tsgs.contains_key(&parent).then_some(parent)
    }

    fn gpu_of(&self, parent: u32) -> Option<u32> {
        self.devices.get(&parent).copied().flatten()
    }

    /// Removes a TSG and its channels.
    fn remove_tsg(&mut self, handle: u32) -> Option<Tsg> {
        let tsg = self.tsgs.remove(&handle)?;
        for &ch in &tsg.channels {
            self.remove_channel(ch);
        }
        Some(tsg)
    }

    /// Records channel `handle` under `parent`; returns the channel it replaces.
    fn add_channel(&mut self, handle: u32, parent: u32) -> Option<Channel> {
        let old = self.channels.insert(handle, Channel { parent });
        if let Some(o) = &old {
            self.unindex(o.parent);
        }
        *self.channel_parents.entry(parent).or_default() += 1;
        old
    }

    fn remove_channel(&mut self, handle: u32) -> Option<Channel> {
        let ch = self.channels.remove(&handle)?;
        self.unindex(ch.parent);
        Some(ch)
    }

    fn unindex(&mut self, parent: u32) {
        if let std::collections::btree_map::Entry::Occupied(mut e) =
            self.channel_parents.entry(parent)
        {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// Forgets the channels whose parent is `parent` (a scan only where there are some).
    fn drop_channels_under(&mut self, parent: u32) {
        if self.channel_parents.remove(&parent).is_some() {
            self.channels.retain(|_, ch| ch.parent != parent);
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Process {
    comm: compact_str::CompactString,
    clients: BTreeMap<u32, Client>,
    /// Late attach: the process made driver objects before tracing started (it was in the
    /// start-up inventory, or one of its RM calls named a client never seen allocated).
    pretrace: Option<PreTrace>,
    /// MPS: client TSG handles already related to the server's ([`EventKind::MpsShared`]).
    mps_linked: BTreeSet<(u32, u32)>,
}

/// What is known of the objects a process made before tracing started.
#[derive(Clone, Debug, Default)]
struct PreTrace {
    /// fds those objects may hang on (`/dev/nvidiactl` fds of the inventory, fds of calls on
    /// unseen clients): their `close()` ends them.
    fds: BTreeSet<i32>,
    /// A [`EventKind::PretraceEnd`] was reported already.
    ended: bool,
}

fn pretrace_end(
    origin: &Origin,
    client: Option<u32>,
    fd: Option<i32>,
    cause: DestroyCause,
) -> Event {
    Event {
        amd: None,
        api: None,
        // Not one task: the unknown set of TSGs a pre-trace process held.
        key: None,
        origin: origin.clone(),
        kind: EventKind::PretraceEnd {
            client,
            fd,
            cause,
            tsgs: None,
        },
    }
}

/// The NVIDIA state machine: object tables of every traced process.
#[derive(Clone, Debug, Default)]
pub struct NvTracker {
    procs: PidMap<Process>,
    counters: NvTrackerCounters,
    /// gpu_ext hooks that ran inside an `ioctl` on fd `.1` in process `.0`, by thread, waiting
    /// for that call's record.
    pending: PidMap<(u32, u64, Vec<GxHook>)>,
    /// Generation of the last task seen per `(pid, client, handle)`, for [`TaskKey`] (capped:
    /// see [`bounded`](crate::model::bounded)).
    generations: Generations<(u32, u32)>,
    /// MPS server processes (`nvidia-cuda-mps-server`): named by the inventory, or a process
    /// whose `comm` is `nvidia-cuda-mps` (the kernel's 15-character cut of both MPS programs)
    /// that creates a TSG (the control daemon creates none).
    mps_servers: BTreeSet<u32>,
}

/// `comm` of both `nvidia-cuda-mps-server` and `nvidia-cuda-mps-control`.
pub const MPS_COMM: &str = "nvidia-cuda-mps";

/// The system call a gpu_ext hook can be tied to (records number them as x86-64 does, on
/// every architecture).
const SYS_IOCTL: u32 = gpu_trace_common::wire_syscall::IOCTL;

/// The first hook that `want` accepts.
fn take_hook(hooks: &mut Vec<GxHook>, want: impl Fn(&GxHook) -> bool) -> Option<GxHook> {
    let at = hooks.iter().position(want)?;
    Some(hooks.remove(at))
}

fn destroy(origin: &Origin, client: u32, handle: u32, t: &Tsg, cause: DestroyCause) -> Event {
    Event {
        amd: None,
        api: None,
        key: Some(t.key),
        origin: origin.clone(),
        kind: EventKind::TaskDestroy {
            task: t.task(handle),
            client,
            cause,
            implicit: cause.is_implicit(),
            final_params: Some(t.final_params()),
        },
    }
}

/// An `RM_ALLOC` as the object table takes it: the client, the parent, the new handle, its
/// class and the class parameters.
struct AllocArgs {
    client: u32,
    parent: u32,
    handle: u32,
    class: u32,
    params: AllocParams,
}

/// An `RM_CONTROL` as the object table takes it: its outcome (errno of the syscall, RM status),
/// the client, the object it was sent to, the command and its parameters.
struct ControlArgs {
    errno: i32,
    status: u32,
    client: u32,
    object: u32,
    command: u32,
    params: ControlParams,
}

impl NvTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Late attach: process `pid` (from the start-up inventory) holds driver objects made
    /// before tracing started, on `control_fds` (its `/dev/nvidiactl` fds). Its exit, and the
    /// `close()` of one of those fds, produce [`EventKind::PretraceEnd`]. `mps_server`: the
    /// process is `nvidia-cuda-mps-server`.
    pub fn preexisting(&mut self, pid: u32, comm: &str, control_fds: &[i32], mps_server: bool) {
        let proc = self.procs.entry(pid).or_default();
        if proc.comm.is_empty() {
            proc.comm = comm.into();
        }
        proc.pretrace
            .get_or_insert_with(PreTrace::default)
            .fds
            .extend(control_fds.iter().copied());
        if mps_server {
            self.mps_servers.insert(pid);
        }
    }

    /// Whether `pid` holds objects made before tracing started (see [`preexisting`](Self::preexisting)).
    pub fn is_pretrace(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.pretrace.is_some())
    }

    /// A successful call on an RM client this tracer never saw allocated in the process: the
    /// process made it before tracing started. Returns whether the call is one.
    fn note_unseen_client(&mut self, origin: &Origin, fd: i32, errno: i32, call: &RmCall) -> bool {
        let (client, status) = match *call {
            // A client's own allocation names no existing client (hRoot is 0 or the new one).
            RmCall::Alloc { class, .. } if class::is_client(class) => return false,
            RmCall::Alloc { client, status, .. }
            | RmCall::Control { client, status, .. }
            | RmCall::Free { client, status, .. } => (client, status),
            RmCall::Malformed { .. } => return false,
        };
        if client == 0 || !decode::succeeded(errno, status) {
            return false;
        }
        let proc = self.procs.entry(origin.pid).or_default();
        if proc.comm.is_empty() {
            proc.comm.clone_from(&origin.comm);
        }
        let unseen = proc.clients.get(&client).is_none_or(|c| c.fd.is_none());
        if unseen {
            proc.pretrace
                .get_or_insert_with(PreTrace::default)
                .fds
                .insert(fd);
        }
        unseen
    }

    /// How an event names a TSG or channel that is not a TSG of ours. In a late-attached
    /// process (or on an RM client never seen allocated): [`TaskId::PreTrace`] of the channel's
    /// parent when the channel is known, else of the handle itself. In a client seen allocated:
    /// [`TaskId::Shared`] of the parent of a channel whose allocation was seen naming a parent
    /// this process never created (MPS: the server's TSG); `None` otherwise (a channel on a
    /// device, a handle freed or never seen: named by its handle as before).
    fn unseen_task(
        &self,
        pid: u32,
        client: u32,
        object: u32,
        channel_level: bool,
    ) -> Option<TaskId> {
        let proc = self.procs.get(&pid);
        let c = proc.and_then(|p| p.clients.get(&client));
        let parent = c
            .and_then(|c| c.channels.get(&object))
            .filter(|_| channel_level)
            .map(|ch| ch.parent)
            .filter(|p| !c.is_some_and(|c| c.devices.contains_key(p)));
        let client_seen = c.is_some_and(|c| c.fd.is_some());
        let handle = parent.unwrap_or(object);
        if c.is_some_and(|c| c.tsgs.contains_key(&handle)) {
            // A TSG of ours named where a channel was expected: not an unseen object.
            return None;
        }
        if proc.is_some_and(|p| p.pretrace.is_some()) || !client_seen {
            return Some(TaskId::PreTrace(handle));
        }
        parent.map(TaskId::Shared)
    }

    /// MPS: relates a client's shared TSG, now known to be on `runlist`, to the MPS server's
    /// TSG on that runlist when exactly one server TSG is there (once per handle).
    fn mps_link(
        &mut self,
        origin: &Origin,
        client: u32,
        task: TaskId,
        runlist: u32,
    ) -> Option<Event> {
        let TaskId::Shared(handle) = task else {
            return None;
        };
        let mut found = Vec::new();
        for &spid in &self.mps_servers {
            let Some(p) = self.procs.get(&spid) else {
                continue;
            };
            for c in p.clients.values() {
                for (&h, t) in &c.tsgs {
                    if t.sched.runlist == Some(runlist) {
                        found.push((spid, t.task(h)));
                    }
                }
            }
        }
        let [(server_pid, server_task)] = found[..] else {
            return None;
        };
        let proc = self.procs.get_mut(&origin.pid)?;
        if !proc.mps_linked.insert((client, handle)) {
            return None;
        }
        Some(Event {
            amd: None,
            api: None,
            // A relation between two tasks (client's view, server's TSG), not a task's event.
            key: None,
            origin: origin.clone(),
            kind: EventKind::MpsShared {
                task,
                client,
                server_pid,
                server_task,
                runlist,
            },
        })
    }

    /// The counters so far.
    /// Puts the counters back to `c` (a state record's calls are not counted).
    pub(crate) fn set_counters(&mut self, c: NvTrackerCounters) {
        self.counters = c;
    }

    pub fn counters(&self) -> &NvTrackerCounters {
        &self.counters
    }

    /// TSGs currently alive, over all processes.
    pub fn live_tasks(&self) -> usize {
        self.procs
            .values()
            .flat_map(|p| p.clients.values())
            .map(|c| c.tsgs.len())
            .sum()
    }

    /// The state of the live TSG `handle` of RM client `client` in process `pid`.
    pub fn task(&self, pid: u32, client: u32, handle: u32) -> Option<TaskSnapshot> {
        let c = self.client(pid, client)?;
        let t = c.tsgs.get(&handle)?;
        Some(TaskSnapshot {
            task: t.task(handle),
            parent: t.parent,
            fd: t.fd,
            engine_type: t.engine_type,
            sched: t.sched,
            channels: t.channels.iter().copied().collect(),
            gpu: c.gpu_of(t.parent),
        })
    }

    /// Observes one input; returns the events it produces, in order.
    pub fn observe(&mut self, origin: Origin, input: NvInput) -> Vec<Event> {
        match input {
            NvInput::Sched(call) => {
                self.hook_ran(&origin, call);
                Vec::new()
            }
            NvInput::ProcessExit => {
                let pid = origin.pid;
                let left: u64 = self
                    .pending
                    .values()
                    .filter(|p| p.0 == pid)
                    .map(|p| p.2.len() as u64)
                    .sum();
                self.pending.retain(|_, p| p.0 != pid);
                self.counters.gpu_ext_unmatched += left;
                self.process_exit(&origin)
            }
            NvInput::FdClose { fd } => self.fd_close(&origin, fd),
            NvInput::Call {
                call: RmCall::Malformed { reason, .. },
                ..
            } => {
                self.counters.malformed += 1;
                *self.counters.malformed_by_reason.entry(reason).or_default() += 1;
                Vec::new()
            }
            NvInput::Call { fd, errno, call } => self.call(&origin, fd, errno, call),
        }
    }

    /// A well-formed RM call, with the gpu_ext hooks that ran inside it.
    fn call(&mut self, origin: &Origin, fd: i32, errno: i32, call: RmCall) -> Vec<Event> {
        let mut hooks = self.take_hooks(origin, fd);
        self.counters.calls += 1;
        let unseen = self.note_unseen_client(origin, fd, errno, &call);
        if let Some(status) = call.status()
            && !decode::succeeded(errno, status)
        {
            self.counters.failed_calls += 1;
        }
        let events = match call {
            RmCall::Alloc {
                client,
                parent,
                handle,
                class,
                status,
                params,
                ..
            } => {
                let ok = decode::succeeded(errno, status);
                let args = AllocArgs {
                    client,
                    parent,
                    handle,
                    class,
                    params,
                };
                self.alloc_with_hooks(origin, fd, ok, args, &mut hooks)
            }
            RmCall::Control {
                client,
                object,
                cmd,
                status,
                params,
                ..
            } => {
                let args = ControlArgs {
                    errno,
                    status,
                    client,
                    object,
                    command: cmd,
                    params,
                };
                self.control_with_hooks(origin, args, &mut hooks)
            }
            RmCall::Free {
                client,
                object,
                status,
                ..
            } => {
                // Destroy hooks confirm the free; they change nothing that is printed.
                hooks.retain(|h| !matches!(h, GxHook::TaskDestroy { .. }));
                self.count_unused(&hooks, false);
                if decode::succeeded(errno, status) {
                    self.free(origin, client, object)
                } else {
                    Vec::new()
                }
            }
            RmCall::Malformed { .. } => unreachable!("handled by observe"),
        };
        if unseen && events.is_empty() {
            // Named in the statistics, not dropped silently.
            self.counters.pretrace_calls += 1;
        }
        events
    }

    /// An `RM_ALLOC`; a gpu_ext `task_init` hook of it gives the new TSG its hardware id.
    fn alloc_with_hooks(
        &mut self,
        origin: &Origin,
        fd: i32,
        ok: bool,
        args: AllocArgs,
        hooks: &mut Vec<GxHook>,
    ) -> Vec<Event> {
        let (client, handle, class) = (args.client, args.handle, args.class);
        let init = take_hook(hooks, |h| matches!(h, GxHook::TaskInit { .. }));
        let used = init.is_some() && ok && class == class::KEPLER_CHANNEL_GROUP_A;
        self.count_unused(hooks, init.is_some() && !used);
        let mut events = self.alloc(origin, fd, ok, args);
        if let (
            true,
            Some(GxHook::TaskInit {
                tsg_id,
                default_timeslice_us,
                ..
            }),
        ) = (used, init)
        {
            self.apply_task_init(
                origin,
                client,
                handle,
                tsg_id,
                default_timeslice_us,
                &mut events,
            );
        }
        events
    }

    /// An `RM_CONTROL`; gpu_ext `bind` and `token_request` hooks of it add the driver's own
    /// values to its event.
    fn control_with_hooks(
        &mut self,
        origin: &Origin,
        args: ControlArgs,
        hooks: &mut Vec<GxHook>,
    ) -> Vec<Event> {
        let (client, object, cmd) = (args.client, args.object, args.command);
        let bind = take_hook(hooks, |h| matches!(h, GxHook::Bind { .. }));
        let used = bind.is_some() && cmd == cmd::TSG_GPFIFO_SCHEDULE;
        let token = take_hook(hooks, |h| matches!(h, GxHook::TokenRequest { .. }));
        let token_used = token.is_some() && cmd == cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN;
        self.count_unused(
            hooks,
            (bind.is_some() && !used) || (token.is_some() && !token_used),
        );
        let mut events = self.control(origin, args);
        if let (
            true,
            Some(GxHook::Bind {
                tsg_id,
                runlist_id,
                channel_count,
                timeslice_us,
                interleave,
                ..
            }),
        ) = (used, bind)
        {
            self.apply_bind(
                origin,
                client,
                object,
                (tsg_id, runlist_id, channel_count, timeslice_us, interleave),
                &mut events,
            );
        }
        if let (true, Some(GxHook::TokenRequest { tsg_id, .. })) = (token_used, token) {
            self.apply_token(origin, client, object, tsg_id, &mut events);
        }
        events
    }

    /// A gpu_ext hook ran: kept for the thread's ioctl, or counted.
    fn hook_ran(&mut self, origin: &Origin, call: GxCall) {
        match (call.hook, call.syscall) {
            (Some(hook), Some((SYS_IOCTL, fd))) => {
                let entry = self
                    .pending
                    .entry(origin.tid)
                    .or_insert_with(|| (origin.pid, fd, Vec::new()));
                if entry.1 != fd {
                    // The thread's previous ioctl was not traced: its hooks stay unclaimed.
                    self.counters.gpu_ext_unmatched += entry.2.len() as u64;
                    *entry = (origin.pid, fd, Vec::new());
                }
                entry.2.push(hook);
            }
            (Some(_), _) => self.counters.gpu_ext_outside_ioctl += 1,
            (None, _) => self.counters.gpu_ext_unmatched += 1,
        }
    }

    /// The hooks that ran inside this call (same thread, same fd).
    fn take_hooks(&mut self, origin: &Origin, fd: i32) -> Vec<GxHook> {
        if self.pending.is_empty() {
            // No gpu_ext hook waits (the common case: an unpatched driver).
            return Vec::new();
        }
        match self.pending.remove(&origin.tid) {
            Some((_, at, hooks)) if i64::try_from(at).ok() == Some(i64::from(fd)) => hooks,
            Some((_, _, hooks)) => {
                self.counters.gpu_ext_unmatched += hooks.len() as u64;
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// Counts the hooks of a call that it did not use (`taken_unused`: one more, taken out of
    /// `rest` but not applied).
    fn count_unused(&mut self, rest: &[GxHook], taken_unused: bool) {
        self.counters.gpu_ext_unmatched += rest.len() as u64 + u64::from(taken_unused);
    }

    /// `task_init` of the TSG just allocated: its hardware id names it from now on, and the
    /// driver's default timeslice replaces the assumed one.
    fn apply_task_init(
        &mut self,
        origin: &Origin,
        client: u32,
        handle: u32,
        tsg_id: u64,
        default_timeslice_us: u64,
        events: &mut [Event],
    ) {
        let Some(t) = self.client_mut(origin, client).tsgs.get_mut(&handle) else {
            return;
        };
        t.hw_id = u32::try_from(tsg_id).ok();
        t.sched.timeslice_us = Some(default_timeslice_us);
        t.sched.timeslice_source = ValueSource::DriverHook;
        let task = t.task(handle);
        for e in events.iter_mut() {
            if let EventKind::TaskInit {
                task: tk,
                timeslice_us,
                timeslice_source,
                ..
            } = &mut e.kind
            {
                *tk = task;
                *timeslice_us = Some(default_timeslice_us);
                *timeslice_source = ValueSource::DriverHook;
            }
        }
    }

    /// `token_request` of a channel: its TSG's hardware id, where not known yet (a TSG created
    /// before tracing, or by a driver whose `task_init` did not run in a traced call).
    fn apply_token(
        &mut self,
        origin: &Origin,
        client: u32,
        channel: u32,
        tsg_id: u64,
        events: &mut [Event],
    ) {
        let Some(hw) = u32::try_from(tsg_id).ok().filter(|&id| id != 0) else {
            return;
        };
        let c = self.client_mut(origin, client);
        let Some(h) = c.tsg_of_channel(channel) else {
            return;
        };
        let Some(t) = c.tsgs.get_mut(&h) else { return };
        t.hw_id = t.hw_id.or(Some(hw));
        let task = t.task(h);
        for e in events.iter_mut() {
            if let EventKind::WorkSubmit { task: tk, .. } = &mut e.kind {
                *tk = task;
            }
        }
    }

    /// `bind` of a scheduled TSG: what RM itself holds when the request reaches it.
    fn apply_bind(
        &mut self,
        origin: &Origin,
        client: u32,
        object: u32,
        (tsg_id, runlist, channel_count, timeslice, interleave): (
            u64,
            u32,
            u32,
            u64,
            Option<crate::event::Interleave>,
        ),
        events: &mut [Event],
    ) {
        let hw = u32::try_from(tsg_id).ok();
        let task = match self.client_mut(origin, client).tsgs.get_mut(&object) {
            Some(t) => {
                t.hw_id = t.hw_id.or(hw);
                t.sched.runlist = Some(runlist);
                t.sched.timeslice_us = Some(timeslice);
                t.sched.timeslice_source = ValueSource::DriverHook;
                if interleave.is_some() {
                    t.sched.interleave = interleave;
                    t.sched.interleave_source = ValueSource::DriverHook;
                }
                t.task(object)
            }
            // A TSG created before tracing: the hook still names it.
            None => hw.map_or(TaskId::RmHandle(object), TaskId::HwTsg),
        };
        for e in events.iter_mut() {
            if let EventKind::Schedule {
                task: tk,
                channels,
                timeslice_us,
                interleave: il,
                ..
            } = &mut e.kind
            {
                *tk = task;
                *channels = Some(channel_count);
                *timeslice_us = Some(timeslice);
                if interleave.is_some() {
                    *il = interleave;
                }
            }
        }
    }

    /// Ends tracing: returns the TSGs still alive, per process (ascending pid; processes
    /// without live TSGs are left out), and forgets all state (unit tests).
    #[cfg(test)]
    pub fn finish(&mut self) -> Vec<LiveAtEnd> {
        let mut out: Vec<LiveAtEnd> = self
            .procs
            .drain()
            .filter_map(|(pid, p)| {
                let tasks: Vec<(u32, TaskId)> = p
                    .clients
                    .iter()
                    .flat_map(|(&ch, c)| c.tsgs.iter().map(move |(&h, t)| (ch, t.task(h))))
                    .collect();
                (!tasks.is_empty()).then_some(LiveAtEnd {
                    pid,
                    comm: p.comm.into(),
                    tasks,
                })
            })
            .collect();
        out.sort_by_key(|l| l.pid);
        out
    }

    fn count_unreadable(&mut self, reason: Unreadable) {
        self.counters.unreadable_params += 1;
        *self
            .counters
            .unreadable_by_reason
            .entry(reason)
            .or_default() += 1;
    }

    fn client_mut(&mut self, origin: &Origin, client: u32) -> &mut Client {
        let proc = self.procs.entry(origin.pid).or_default();
        proc.comm.clone_from(&origin.comm);
        proc.clients.entry(client).or_default()
    }

    fn client(&self, pid: u32, client: u32) -> Option<&Client> {
        self.procs.get(&pid)?.clients.get(&client)
    }

    fn alloc(&mut self, origin: &Origin, fd: i32, ok: bool, call: AllocArgs) -> Vec<Event> {
        let AllocArgs {
            client,
            parent,
            handle,
            class,
            params,
        } = call;
        if !ok {
            if class == class::KEPLER_CHANNEL_GROUP_A {
                self.counters.failed_tsg_allocs += 1;
            }
            return Vec::new();
        }
        if let AllocParams::Unreadable { reason } = params {
            self.count_unreadable(reason);
        }
        if class::is_client(class) {
            // The new client's handle is hObjectNew.
            let proc = self.procs.entry(origin.pid).or_default();
            proc.comm.clone_from(&origin.comm);
            let old = proc.clients.insert(
                handle,
                Client {
                    fd: Some(fd),
                    ..Client::default()
                },
            );
            if old.is_some_and(|c| !c.tsgs.is_empty()) {
                self.counters.replaced_handles += 1;
            }
            return Vec::new();
        }
        match class {
            class::NV01_DEVICE_0 => {
                let device_id = match params {
                    AllocParams::Device { device_id } => Some(device_id),
                    _ => None,
                };
                self.client_mut(origin, client)
                    .devices
                    .insert(handle, device_id);
                Vec::new()
            }
            class::KEPLER_CHANNEL_GROUP_A => {
                self.alloc_tsg(origin, fd, client, parent, handle, params)
            }
            c if class::is_channel(c) => {
                let cl = self.client_mut(origin, client);
                if let Some(old) = cl.add_channel(handle, parent)
                    && let Some(t) = cl.tsgs.get_mut(&old.parent)
                {
                    t.channels.remove(&handle);
                }
                if let Some(t) = cl.tsgs.get_mut(&parent) {
                    t.channels.insert(handle);
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// A successful alloc of a TSG (`KEPLER_CHANNEL_GROUP_A`): `TASK_INIT`.
    fn alloc_tsg(
        &mut self,
        origin: &Origin,
        fd: i32,
        client: u32,
        parent: u32,
        handle: u32,
        params: AllocParams,
    ) -> Vec<Event> {
        let engine_type = match params {
            AllocParams::Tsg { engine_type, .. } => Some(engine_type),
            _ => None,
        };
        let generation = self
            .generations
            .get(origin.pid, (client, handle))
            .map_or(1, |g| g + 1);
        self.generations
            .set(origin.pid, (client, handle), generation, true);
        let key = TaskKey {
            pid: origin.pid,
            client: Some(client),
            object: handle,
            generation,
        };
        if origin.comm == MPS_COMM {
            self.mps_servers.insert(origin.pid);
        }
        let c = self.client_mut(origin, client);
        let tsg = Tsg {
            parent,
            fd,
            engine_type,
            sched: SchedParams {
                timeslice_us: Some(DEFAULT_TIMESLICE_US),
                timeslice_source: ValueSource::DriverDefault,
                interleave: Some(DEFAULT_INTERLEAVE),
                interleave_source: ValueSource::DriverDefault,
                runlist: None,
                run_state: RunState::Unscheduled,
            },
            hw_id: None,
            channels: BTreeSet::new(),
            key,
        };
        let gpu = c.gpu_of(parent);
        let replaced = c.remove_tsg(handle).is_some();
        // Channels still recorded under this handle belonged to an earlier object with
        // the same handle (one created before tracing, whose free was not seen as a
        // TSG's): the new TSG starts without them.
        c.drop_channels_under(handle);
        let kind = EventKind::TaskInit {
            task: tsg.task(handle),
            client,
            engine: engine_type.map(decode::engine_of),
            engine_type,
            timeslice_us: tsg.sched.timeslice_us,
            timeslice_source: tsg.sched.timeslice_source,
            interleave: tsg.sched.interleave,
            interleave_source: tsg.sched.interleave_source,
            runlist: tsg.sched.runlist,
            gpu,
        };
        c.tsgs.insert(handle, tsg);
        if replaced {
            self.counters.replaced_handles += 1;
        }
        vec![Event {
            amd: None,
            api: None,
            key: Some(key),
            origin: origin.clone(),
            kind,
        }]
    }

    fn control(&mut self, origin: &Origin, call: ControlArgs) -> Vec<Event> {
        let ControlArgs {
            errno,
            status,
            client,
            object,
            command,
            params,
        } = call;
        let ok = decode::succeeded(errno, status);
        if let ControlParams::Unreadable { reason } = params {
            self.count_unreadable(reason);
        }
        let is_schedule = matches!(
            command,
            cmd::TSG_GPFIFO_SCHEDULE | cmd::CHANNEL_GPFIFO_SCHEDULE
        );
        if is_schedule {
            return self.schedule(
                origin,
                ControlArgs {
                    errno,
                    status,
                    client,
                    object,
                    command,
                    params,
                },
            );
        }
        let pid = origin.pid;
        // The TSG the control is about: the object itself for NVA06C controls, the channel's TSG
        // for channel controls.
        let channel_level = matches!(
            command,
            cmd::CHANNEL_SET_INTERLEAVE_LEVEL | cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN
        );
        let known = self.client(pid, client).and_then(|c| {
            if channel_level {
                c.tsg_of_channel(object)
            } else {
                c.tsgs.contains_key(&object).then_some(object)
            }
        });
        // Requests that change how the TSG is scheduled: reported allowed or not.
        let change = self.sched_change(pid, client, known, command, params);
        if let Some(change) = change {
            if ok {
                self.update_tsg(pid, client, known, |t| match change {
                    SchedChange::Timeslice { new_us, .. } => {
                        t.sched.timeslice_us = Some(new_us);
                        t.sched.timeslice_source = ValueSource::Observed;
                    }
                    SchedChange::Interleave { new, .. } => {
                        t.sched.interleave = new;
                        t.sched.interleave_source = ValueSource::Observed;
                    }
                    _ => {}
                });
            } else if known.is_none() {
                self.counters.unknown_handle += 1;
            }
            return vec![self.update_event(
                origin,
                client,
                (object, known),
                change,
                (errno, status),
                channel_level,
            )];
        }
        if !ok {
            return Vec::new();
        }
        match (command, params) {
            (cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN, ControlParams::WorkSubmitToken { token }) => {
                self.work_submit(origin, client, (object, known), token)
            }
            (cmd::TSG_GET_TIMESLICE, ControlParams::Timeslice { us }) => {
                self.update_tsg(pid, client, known, |t| {
                    t.sched.timeslice_us = Some(us);
                    t.sched.timeslice_source = ValueSource::Observed;
                });
                Vec::new()
            }
            (cmd::TSG_GET_INFO, ControlParams::TsgInfo { tsg_id }) => {
                self.update_tsg(pid, client, known, |t| t.hw_id = Some(tsg_id));
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// The scheduling change a control requests (timeslice, interleave level, preemption), with
    /// the values of TSG `known` before it; `None` for other controls.
    fn sched_change(
        &self,
        pid: u32,
        client: u32,
        known: Option<u32>,
        command: u32,
        params: ControlParams,
    ) -> Option<SchedChange> {
        match (command, params) {
            (cmd::TSG_SET_TIMESLICE, ControlParams::Timeslice { us }) => {
                let t = self.tsg(pid, client, known);
                Some(SchedChange::Timeslice {
                    old_us: t.and_then(|t| t.sched.timeslice_us),
                    old_source: t.map(|t| t.sched.timeslice_source),
                    new_us: us,
                })
            }
            (
                cmd::TSG_SET_INTERLEAVE_LEVEL | cmd::CHANNEL_SET_INTERLEAVE_LEVEL,
                ControlParams::Interleave { level },
            ) => {
                let t = self.tsg(pid, client, known);
                Some(SchedChange::Interleave {
                    old: t.and_then(|t| t.sched.interleave),
                    old_source: t.map(|t| t.sched.interleave_source),
                    new: decode::interleave_of(level),
                    new_raw: level,
                })
            }
            (
                cmd::TSG_PREEMPT,
                ControlParams::Preempt {
                    wait,
                    manual_timeout,
                    timeout_us,
                },
            ) => Some(SchedChange::Preempt {
                wait,
                manual_timeout,
                timeout_us,
            }),
            _ => None,
        }
    }

    /// A successful `GET_WORK_SUBMIT_TOKEN` on channel `object` (of TSG `known`, when tracked):
    /// `WORK_SUBMIT`, and the MPS relation its runlist reveals.
    fn work_submit(
        &mut self,
        origin: &Origin,
        client: u32,
        (object, known): (u32, Option<u32>),
        token: u32,
    ) -> Vec<Event> {
        let pid = origin.pid;
        let fields = decode::split_token(token);
        let key = self.key_of(pid, client, known.unwrap_or(object));
        let c = self.client_mut(origin, client);
        let channel_known = c.channels.contains_key(&object);
        let (task, gpu) = match known {
            Some(h) => {
                let t = c.tsgs.get_mut(&h).expect("known TSG");
                t.sched.runlist = Some(fields.runlist);
                let parent = t.parent;
                let task = t.task(h);
                (task, c.gpu_of(parent))
            }
            None => {
                // A channel with no TSG of ours: a channel created before tracing, one
                // in a TSG shared from another process (MPS), or one parented directly
                // to a device.
                let gpu = c.channels.get(&object).and_then(|ch| c.gpu_of(ch.parent));
                let task = self
                    .unseen_task(pid, client, object, true)
                    .unwrap_or(TaskId::RmHandle(object));
                (task, gpu)
            }
        };
        if !channel_known {
            self.counters.unknown_handle += 1;
        }
        let mut out = vec![Event {
            amd: None,
            api: None,
            key: Some(key),
            origin: origin.clone(),
            kind: EventKind::WorkSubmit {
                task,
                client,
                channel_handle: object,
                chid: Some(fields.chid),
                runlist: Some(fields.runlist),
                token,
                gpu,
            },
        }];
        out.extend(self.mps_link(origin, client, task, fields.runlist));
        out
    }

    /// The tracked TSG `tsg` of `client` in process `pid`.
    fn tsg(&self, pid: u32, client: u32, tsg: Option<u32>) -> Option<&Tsg> {
        self.client(pid, client)?.tsgs.get(&tsg?)
    }

    /// The [`TaskKey`] of the TSG (or, for one this tracer did not see created, the object)
    /// `handle`: the generation of the last one seen, 1 for one never seen.
    fn key_of(&mut self, pid: u32, client: u32, handle: u32) -> TaskKey {
        if let Some(t) = self.tsg(pid, client, Some(handle)) {
            return t.key;
        }
        let generation = match self.generations.get(pid, (client, handle)) {
            Some(g) => g,
            None => {
                if !self.generations.set(pid, (client, handle), 1, false) {
                    self.counters.untracked_handles += 1;
                }
                1
            }
        };
        TaskKey {
            pid,
            client: Some(client),
            object: handle,
            generation,
        }
    }

    /// A `SCHED_UPDATE` of the TSG `known` (the handle the request was sent to, `object`, when
    /// the TSG is not tracked), with the TSG's state after the request.
    fn update_event(
        &mut self,
        origin: &Origin,
        client: u32,
        (object, known): (u32, Option<u32>),
        change: SchedChange,
        (errno, status): (i32, u32),
        via_channel: bool,
    ) -> Event {
        let task = self
            .tsg(origin.pid, client, known)
            .map_or(TaskId::RmHandle(object), |t| {
                t.task(known.unwrap_or(object))
            });
        let kind = EventKind::SchedUpdate {
            task,
            client,
            change,
            allowed: decode::succeeded(errno, status),
            rm_status: (errno == 0).then_some(status),
            errno,
            via_channel,
        };
        self.call_event(origin, client, known.unwrap_or(object), kind)
    }

    /// An event of a call on the TSG `handle` (or the untracked object of that handle), with
    /// its key; the process's name is refreshed.
    fn call_event(&mut self, origin: &Origin, client: u32, handle: u32, kind: EventKind) -> Event {
        let key = self.key_of(origin.pid, client, handle);
        if let Some(p) = self.procs.get_mut(&origin.pid) {
            p.comm.clone_from(&origin.comm);
        }
        Event {
            amd: None,
            api: None,
            key: Some(key),
            origin: origin.clone(),
            kind,
        }
    }

    fn update_tsg(&mut self, pid: u32, client: u32, tsg: Option<u32>, f: impl FnOnce(&mut Tsg)) {
        let t = tsg.and_then(|h| {
            self.procs
                .get_mut(&pid)?
                .clients
                .get_mut(&client)?
                .tsgs
                .get_mut(&h)
        });
        match t {
            Some(t) => f(t),
            None => self.counters.unknown_handle += 1,
        }
    }

    fn schedule(&mut self, origin: &Origin, call: ControlArgs) -> Vec<Event> {
        let ControlArgs {
            errno,
            status,
            client,
            object,
            command,
            params,
        } = call;
        let via_channel = command == cmd::CHANNEL_GPFIFO_SCHEDULE;
        let known = self.client(origin.pid, client).and_then(|c| {
            if via_channel {
                c.tsg_of_channel(object)
            } else {
                c.tsgs.contains_key(&object).then_some(object)
            }
        });
        let ControlParams::Schedule {
            enable,
            skip_submit,
            skip_enable,
        } = params
        else {
            self.counters.schedule_unreadable += 1;
            // Refused before the driver saw it (`--deny-*` refuses a denied process's
            // GPFIFO_SCHEDULE whose bEnable it cannot read, e.g. FINN-serialized, with EPERM):
            // whatever bEnable was, nothing was scheduled; report the refusal.
            const EPERM: i32 = 1;
            if errno == -EPERM {
                return vec![self.schedule_event(
                    origin,
                    client,
                    object,
                    known,
                    (errno, status),
                    via_channel,
                )];
            }
            return Vec::new();
        };
        let ok = decode::succeeded(errno, status);
        let old = self
            .tsg(origin.pid, client, known)
            .map(|t| t.sched.run_state);
        let new = if enable {
            RunState::Enabled
        } else {
            RunState::Disabled
        };
        // A disable, and an enable after a disable, change the TSG's run state.
        let update =
            (!enable || old == Some(RunState::Disabled)).then_some(SchedChange::RunState {
                old,
                new,
                skip_submit,
                skip_enable,
            });
        if !enable {
            self.counters.schedule_disable += 1;
        }
        if ok && let Some(h) = known {
            self.update_tsg(origin.pid, client, Some(h), |t| t.sched.run_state = new);
        }
        let mut events = Vec::new();
        if enable {
            events.push(self.schedule_event(
                origin,
                client,
                object,
                known,
                (errno, status),
                via_channel,
            ));
        } else if known.is_none() {
            self.counters.unknown_handle += 1;
        }
        if let Some(change) = update {
            events.push(self.update_event(
                origin,
                client,
                (object, known),
                change,
                (errno, status),
                via_channel,
            ));
        }
        events
    }

    /// The `SCHEDULE` of an enable request.
    fn schedule_event(
        &mut self,
        origin: &Origin,
        client: u32,
        object: u32,
        known: Option<u32>,
        (errno, status): (i32, u32),
        via_channel: bool,
    ) -> Event {
        let found = self.tsg(origin.pid, client, known).map(|t| {
            (
                t.task(known.unwrap_or(object)),
                u32::try_from(t.channels.len()).unwrap_or(u32::MAX),
                t.sched.timeslice_us,
                t.sched.interleave,
            )
        });
        let (task, channels, timeslice_us, interleave) = match found {
            Some((task, n, ts, il)) => (task, Some(n), ts, il),
            None => {
                self.counters.unknown_handle += 1;
                let task = self
                    .unseen_task(origin.pid, client, object, via_channel)
                    .unwrap_or(TaskId::RmHandle(object));
                (task, None, None, None)
            }
        };
        let kind = EventKind::Schedule {
            task,
            client,
            channels,
            timeslice_us,
            interleave,
            allowed: decode::succeeded(errno, status),
            rm_status: (errno == 0).then_some(status),
            errno,
            via_channel,
        };
        self.call_event(origin, client, known.unwrap_or(object), kind)
    }

    fn free(&mut self, origin: &Origin, client: u32, object: u32) -> Vec<Event> {
        let Some(proc) = self.procs.get_mut(&origin.pid) else {
            self.counters.untracked_frees += 1;
            return Vec::new();
        };
        proc.comm.clone_from(&origin.comm);
        if object == client {
            // Freeing the client frees everything under it.
            let removed = proc.clients.remove(&client);
            let unseen = removed.as_ref().is_none_or(|c| c.fd.is_none());
            let mut out: Vec<Event> = removed
                .iter()
                .flat_map(|c| c.tsgs.iter())
                .map(|(&h, t)| destroy(origin, client, h, t, DestroyCause::ParentFree))
                .collect();
            match &mut proc.pretrace {
                // A client made before tracing: whatever TSGs it held end now.
                Some(pre) if unseen => {
                    pre.ended = true;
                    out.push(pretrace_end(
                        origin,
                        Some(client),
                        None,
                        DestroyCause::ParentFree,
                    ));
                }
                _ if removed.is_none() => self.counters.untracked_frees += 1,
                _ => {}
            }
            return out;
        }
        let Some(c) = proc.clients.get_mut(&client) else {
            self.counters.untracked_frees += 1;
            return Vec::new();
        };
        if let Some(t) = c.remove_tsg(object) {
            return vec![destroy(origin, client, object, &t, DestroyCause::Free)];
        }
        if c.devices.remove(&object).is_some() {
            let under: Vec<u32> = c
                .tsgs
                .iter()
                .filter(|(_, t)| t.parent == object)
                .map(|(&h, _)| h)
                .collect();
            c.drop_channels_under(object);
            return under
                .into_iter()
                .filter_map(|h| {
                    let t = c.remove_tsg(h)?;
                    Some(destroy(origin, client, h, &t, DestroyCause::ParentFree))
                })
                .collect();
        }
        if let Some(ch) = c.remove_channel(object) {
            if let Some(t) = c.tsgs.get_mut(&ch.parent) {
                t.channels.remove(&object);
            }
            return Vec::new();
        }
        // An object this tracer did not see created (e.g. a TSG from before tracing): RM frees
        // its children with it, so its channels must not outlive it here either.
        c.drop_channels_under(object);
        self.counters.untracked_frees += 1;
        Vec::new()
    }

    fn fd_close(&mut self, origin: &Origin, fd: i32) -> Vec<Event> {
        let Some(proc) = self.procs.get_mut(&origin.pid) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (&ch, c) in proc.clients.iter_mut() {
            match c.fd {
                Some(cfd) if cfd == fd => {
                    // The driver frees the clients allocated on the file being released.
                    out.extend(
                        c.tsgs
                            .iter()
                            .map(|(&h, t)| destroy(origin, ch, h, t, DestroyCause::FdClose)),
                    );
                    gone.push(ch);
                }
                Some(_) => {}
                None => {
                    // The client's allocation was not seen: use the fd each TSG came through.
                    let hit: Vec<u32> = c
                        .tsgs
                        .iter()
                        .filter(|(_, t)| t.fd == fd)
                        .map(|(&h, _)| h)
                        .collect();
                    for h in hit {
                        if let Some(t) = c.remove_tsg(h) {
                            out.push(destroy(origin, ch, h, &t, DestroyCause::FdClose));
                        }
                    }
                }
            }
        }
        for ch in gone {
            proc.clients.remove(&ch);
        }
        if let Some(pre) = &mut proc.pretrace
            && pre.fds.remove(&fd)
        {
            pre.ended = true;
            out.push(pretrace_end(origin, None, Some(fd), DestroyCause::FdClose));
        }
        out
    }

    fn process_exit(&mut self, origin: &Origin) -> Vec<Event> {
        self.generations.forget_process(origin.pid);
        let Some(proc) = self.procs.remove(&origin.pid) else {
            return Vec::new();
        };
        self.mps_servers.remove(&origin.pid);
        let mut out: Vec<Event> = proc
            .clients
            .iter()
            .flat_map(|(&ch, c)| {
                c.tsgs
                    .iter()
                    .map(move |(&h, t)| destroy(origin, ch, h, t, DestroyCause::ProcessExit))
            })
            .collect();
        if let Some(pre) = proc.pretrace
            && (!pre.fds.is_empty() || !pre.ended)
        {
            out.push(pretrace_end(origin, None, None, DestroyCause::ProcessExit));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Engine, Interleave};
    use crate::source::nvidia::decode::testrec::{self, *};
    use crate::wire::{self, RawRecord, append_to_stream, records_from_stream};
    use gpu_trace_common::{RecordHeader, TaskRecord, nv_flags, record_kind};

    const CLIENT: u32 = 0xC1D0_0001;
    const DEVICE: u32 = 0xCAF0_0001;
    const DEVICE2: u32 = 0xCAF0_0002;
    const TSG: u32 = 0xCAF0_0010;
    const TSG2: u32 = 0xCAF0_0011;
    const CH1: u32 = 0xCAF0_0020;
    const CH2: u32 = 0xCAF0_0021;
    const CH3: u32 = 0xCAF0_0030;
    const CTL_FD: i32 = 5;

    /// Builds records and replays them through the wire format exactly as a captured fixture
    /// would be: serialized, framed into a record stream, parsed back, decoded, observed.
    struct Script {
        recs: Vec<RawRecord>,
        ts: u64,
    }

    impl Script {
        fn new() -> Self {
            Self {
                recs: Vec::new(),
                ts: 1000,
            }
        }

        fn stamp(&mut self, mut r: testrec::Rec, tid: u32) -> &mut Self {
            self.ts += 10;
            r.rec.hdr.ts_ns = self.ts;
            r.rec.hdr.tid = tid;
            self.recs.push(RawRecord::NvIoctl(r.rec));
            self
        }

        fn push(&mut self, r: testrec::Rec) -> &mut Self {
            let tid = r.rec.hdr.tgid;
            self.stamp(r, tid)
        }

        fn task(&mut self, kind: u32, pid: u32, tid: u32, value: i32) -> &mut Self {
            self.ts += 10;
            let mut comm = [0u8; 16];
            comm[..4].copy_from_slice(b"exit");
            let hdr = RecordHeader {
                kind,
                cpu: 1,
                ts_ns: self.ts,
                tgid: pid,
                tid,
                comm,
            };
            let t = TaskRecord {
                hdr,
                value,
                _pad: 0,
            };
            self.recs.push(if kind == record_kind::FD_CLOSE {
                RawRecord::FdClose(t)
            } else {
                RawRecord::ProcessExit(t)
            });
            self
        }

        fn exit(&mut self, pid: u32, tid: u32) -> &mut Self {
            self.task(record_kind::PROCESS_EXIT, pid, tid, -1)
        }

        /// A gpu_ext hook record (`crate::source::nvidia::gpu_ext::testing`).
        fn hook(&mut self, mut r: gpu_trace_common::NvSchedRecord) -> &mut Self {
            self.ts += 10;
            r.hdr.ts_ns = self.ts;
            self.recs.push(RawRecord::NvSched(r));
            self
        }

        fn close(&mut self, pid: u32, fd: i32) -> &mut Self {
            self.task(record_kind::FD_CLOSE, pid, pid, fd)
        }

        /// The records as a fixture file would hold them.
        fn stream(&self) -> Vec<u8> {
            let mut s = Vec::new();
            for r in &self.recs {
                append_to_stream(&mut s, r.as_bytes());
            }
            s
        }

        fn run(&self, t: &mut NvTracker) -> Vec<Event> {
            let recs = records_from_stream(&self.stream()).expect("stream parses");
            assert_eq!(recs.len(), self.recs.len());
            recs.iter()
                .flat_map(|r| crate::source::observe_one(t, r))
                .collect()
        }
    }

    /// Client, device (deviceId `dev_id`) and a TSG on engine `engine`, with two channels, as
    /// CUDA does it (NVOS64 allocs through the ctl fd).
    fn setup(s: &mut Script, pid: u32, dev_id: u32, engine: u32) {
        s.push(alloc(pid, CTL_FD, true, 0, 0, CLIENT, 0x41, 0, &[]))
            .push(alloc(
                pid,
                CTL_FD,
                true,
                CLIENT,
                CLIENT,
                DEVICE,
                0x80,
                0,
                &device_params(dev_id),
            ))
            .push(tsg(pid, DEVICE, TSG, engine))
            .push(alloc(
                pid,
                CTL_FD,
                true,
                CLIENT,
                TSG,
                CH1,
                0xC86F,
                0,
                &channel_params(engine, 0, 1),
            ))
            .push(alloc(
                pid,
                CTL_FD,
                true,
                CLIENT,
                TSG,
                CH2,
                0xC86F,
                0,
                &channel_params(engine, 0, 2),
            ));
    }

    /// A TSG alloc (NVOS64, through the ctl fd) that succeeded.
    fn tsg(pid: u32, parent: u32, handle: u32, engine: u32) -> testrec::Rec {
        alloc(
            pid,
            CTL_FD,
            true,
            CLIENT,
            parent,
            handle,
            0xA06C,
            0,
            &tsg_params(engine, 0),
        )
    }

    /// A control on `object` of `CLIENT`, through the ctl fd.
    fn ctl(pid: u32, object: u32, command: u32, status: u32, params: &[u8]) -> testrec::Rec {
        control(pid, CTL_FD, CLIENT, object, command, status, params)
    }

    fn sched(pid: u32, object: u32, enable: bool) -> testrec::Rec {
        ctl(
            pid,
            object,
            cmd::TSG_GPFIFO_SCHEDULE,
            0,
            &schedule_params(enable, false, false),
        )
    }

    fn kinds(evs: &[Event]) -> Vec<&'static str> {
        evs.iter().map(|e| e.kind.name()).collect()
    }

    fn destroys(evs: &[Event]) -> Vec<(u32, TaskId, DestroyCause, bool)> {
        evs.iter()
            .filter_map(|e| match e.kind {
                EventKind::TaskDestroy {
                    task,
                    cause,
                    implicit,
                    ..
                } => Some((e.origin.pid, task, cause, implicit)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn gpu_ext_hooks_name_the_tsg_and_fill_the_schedule_from_rm() {
        use crate::source::nvidia::gpu_ext::testing as gx;
        let fd = CTL_FD as u64;
        let mut s = Script::new();
        // task_init runs inside the TSG alloc (before its sys_exit record).
        s.push(alloc(100, CTL_FD, true, 0, 0, CLIENT, 0x41, 0, &[]))
            .push(alloc(
                100,
                CTL_FD,
                true,
                CLIENT,
                CLIENT,
                DEVICE,
                0x80,
                0,
                &device_params(0),
            ))
            .hook(gx::task_init(100, fd, 3, 2048))
            .push(tsg(100, DEVICE, TSG, 0x1))
            .push(alloc(
                100,
                CTL_FD,
                true,
                CLIENT,
                TSG,
                CH1,
                0xC86F,
                0,
                &channel_params(1, 0, 1),
            ))
            .hook(gx::record(
                100,
                gpu_trace_common::nvidia::gpu_ext::hook::TOKEN_REQUEST,
                fd,
                &gx::ctx(&[(0, 5, 4), (8, 3, 8), (16, 0x000d_0005, 4)]),
            ))
            .push(ctl(
                100,
                CH1,
                cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                0,
                &u32_params(0x000d_0005),
            ))
            .hook(gx::bind(100, fd, 3, 13, 8, 5000, 2))
            .push(sched(100, TSG, true))
            .hook(gx::task_destroy(100, fd, 3))
            .push(free(100, CTL_FD, CLIENT, DEVICE, TSG, 0));
        let mut t = NvTracker::new();
        let ev = s.run(&mut t);
        assert_eq!(
            kinds(&ev),
            ["TASK_INIT", "WORK_SUBMIT", "SCHEDULE", "TASK_DESTROY"]
        );
        assert_eq!(
            ev[1].kind.task(),
            TaskId::HwTsg(3),
            "the token's TSG: the token hook is taken up"
        );
        let ev: Vec<Event> = ev
            .into_iter()
            .filter(|e| e.kind.name() != "WORK_SUBMIT")
            .collect();
        let EventKind::TaskInit {
            task,
            timeslice_us,
            timeslice_source,
            ..
        } = ev[0].kind
        else {
            panic!()
        };
        assert_eq!(
            (task, timeslice_us, timeslice_source),
            (TaskId::HwTsg(3), Some(2048), ValueSource::DriverHook)
        );
        let EventKind::Schedule {
            task,
            channels,
            timeslice_us,
            interleave,
            ..
        } = ev[1].kind
        else {
            panic!()
        };
        // RM's own count (8) wins over the channels this tracer saw allocated (1).
        assert_eq!(
            (task, channels, timeslice_us, interleave),
            (
                TaskId::HwTsg(3),
                Some(8),
                Some(5000),
                Some(Interleave::High)
            )
        );
        assert_eq!(
            destroys(&ev),
            [(100, TaskId::HwTsg(3), DestroyCause::Free, false)]
        );
        assert_eq!(
            (
                t.counters().gpu_ext_unmatched,
                t.counters().gpu_ext_outside_ioctl
            ),
            (0, 0)
        );
    }

    /// A `task_init` hook is a TSG alloc's only when the alloc succeeded: one inside a failed
    /// TSG alloc, or inside a channel alloc, is counted, and no task takes its id. A thread's
    /// hooks of an ioctl on another fd are counted when a hook of the next ioctl comes.
    #[test]
    fn gpu_ext_task_init_hooks_are_taken_by_successful_tsg_allocs_only() {
        use crate::source::nvidia::gpu_ext::testing as gx;
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        let failed = alloc(
            100,
            CTL_FD,
            true,
            CLIENT,
            DEVICE,
            TSG2,
            0xA06C,
            0x1f,
            &tsg_params(1, 0),
        );
        s.hook(gx::task_init(100, CTL_FD as u64, 4, 1024))
            .push(failed)
            .hook(gx::task_init(100, CTL_FD as u64, 5, 1024))
            .push(alloc(
                100,
                CTL_FD,
                true,
                CLIENT,
                TSG,
                0xCAF0_0077,
                0xC86F,
                0,
                &channel_params(1, 0, 1),
            ));
        let mut t = NvTracker::new();
        let ev = s.run(&mut t);
        assert!(
            ev.iter()
                .all(|e| !matches!(e.kind.task(), TaskId::HwTsg(_))),
            "{ev:?}"
        );
        assert_eq!(t.counters().gpu_ext_unmatched, 2);
        // Two hooks of an ioctl on fd 9, then one of the ctl fd's TSG alloc: the two counted,
        // the third taken.
        let mut t = NvTracker::new();
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.hook(gx::task_init(100, 9, 6, 1024))
            .hook(gx::task_init(100, 9, 7, 1024))
            .hook(gx::task_init(100, CTL_FD as u64, 8, 1024))
            .push(tsg(100, DEVICE, 0xCAF0_0088, 0x1));
        let ev: Vec<Event> = (s.run(&mut t).into_iter())
            .filter(|e| e.key.is_some_and(|k| k.object == 0xCAF0_0088))
            .collect();
        assert_eq!(ev[0].kind.task(), TaskId::HwTsg(8));
        assert_eq!(t.counters().gpu_ext_unmatched, 2);
    }

    #[test]
    fn gpu_ext_hooks_of_other_calls_are_counted_never_merged() {
        use crate::source::nvidia::gpu_ext::testing as gx;
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        // A task_init from an ioctl on another fd (UVM's), then a TSG alloc on the ctl fd: not
        // this TSG's hook.
        s.hook(gx::task_init(100, 9, 4, 1024))
            .push(tsg(100, DEVICE, TSG2, 0x1));
        // A hook outside any ioctl (teardown at close()).
        let mut outside = gx::task_destroy(100, 0, 4);
        outside.syscall_nr = 3;
        s.hook(outside);
        // A bind hook followed by a TSG alloc (wrong kind for that call).
        s.hook(gx::bind(100, CTL_FD as u64, 4, 1, 1, 1024, 1))
            .push(tsg(100, DEVICE, 0xCAF0_0099, 0x1));
        let mut t = NvTracker::new();
        let ev = s.run(&mut t);
        for e in &ev {
            assert!(
                !matches!(e.kind.task(), TaskId::HwTsg(_)),
                "no hook was this call's: {e:?}"
            );
        }
        assert_eq!(
            (
                t.counters().gpu_ext_unmatched,
                t.counters().gpu_ext_outside_ioctl
            ),
            (2, 1)
        );
    }

    #[test]
    fn cuda_like_lifecycle_with_implicit_exit_teardown() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(ctl(
            100,
            CH1,
            cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
            0,
            &u32_params(0x0003_0005),
        ))
        .push(ctl(100, TSG, cmd::TSG_SET_TIMESLICE, 0, &u64_params(2048)))
        .push(sched(100, TSG, true))
        .exit(100, 101);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(
            kinds(&evs),
            [
                "TASK_INIT",
                "WORK_SUBMIT",
                "SCHED_UPDATE",
                "SCHEDULE",
                "TASK_DESTROY"
            ]
        );
        let evs: Vec<Event> = evs
            .into_iter()
            .filter(|e| e.kind.name() != "SCHED_UPDATE")
            .collect();
        assert_eq!(
            evs[0].kind,
            EventKind::TaskInit {
                task: TaskId::RmHandle(TSG),
                client: CLIENT,
                engine: Some(Engine::Graphics),
                engine_type: Some(1),
                timeslice_us: Some(1024),
                timeslice_source: ValueSource::DriverDefault,
                interleave: Some(Interleave::Medium),
                interleave_source: ValueSource::DriverDefault,
                runlist: None,
                gpu: Some(0),
            }
        );
        assert_eq!(evs[0].origin.comm, "cuda");
        assert_eq!(
            evs[1].kind,
            EventKind::WorkSubmit {
                task: TaskId::RmHandle(TSG),
                client: CLIENT,
                channel_handle: CH1,
                chid: Some(5),
                runlist: Some(3),
                token: 0x0003_0005,
                gpu: Some(0),
            }
        );
        assert_eq!(
            evs[2].kind,
            EventKind::Schedule {
                task: TaskId::RmHandle(TSG),
                client: CLIENT,
                channels: Some(2),
                timeslice_us: Some(2048),
                interleave: Some(Interleave::Medium),
                allowed: true,
                rm_status: Some(0),
                errno: 0,
                via_channel: false,
            }
        );
        // The destroy's final parameters: the 2048 µs set by the process, the default
        // interleave, both channels, the token's runlist 3 (0x0003_0005 >> 16), enabled.
        assert_eq!(
            evs[3].kind,
            EventKind::TaskDestroy {
                final_params: Some(FinalParams {
                    sched: SchedParams {
                        timeslice_us: Some(2048),
                        timeslice_source: ValueSource::Observed,
                        interleave: Some(Interleave::Medium),
                        interleave_source: ValueSource::DriverDefault,
                        runlist: Some(3),
                        run_state: RunState::Enabled,
                    },
                    channels: 2,
                }),
                task: TaskId::RmHandle(TSG),
                client: CLIENT,
                cause: DestroyCause::ProcessExit,
                implicit: true,
            }
        );
        // The implicit destroy carries the exiting thread's origin.
        assert_eq!(
            (evs[3].origin.tid, evs[3].origin.comm.as_str()),
            (101, "exit")
        );
        assert_eq!(evs[3].origin.ts_ns, s.ts);
        assert_eq!(t.live_tasks(), 0);
        assert!(t.finish().is_empty());
    }

    #[test]
    fn fd_close_tears_down_the_clients_of_that_fd() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.close(100, 6); // another fd: nothing
        let mut t = NvTracker::new();
        assert_eq!(kinds(&s.run(&mut t)), ["TASK_INIT"]);
        assert_eq!(t.live_tasks(), 1);

        let mut s2 = Script::new();
        s2.close(100, CTL_FD);
        let evs = s2.run(&mut t);
        assert_eq!(
            destroys(&evs),
            [(100, TaskId::RmHandle(TSG), DestroyCause::FdClose, true)]
        );
        assert_eq!(t.live_tasks(), 0);
        // The client went with the fd: its objects are unknown now, and a call that names it
        // (successfully, as far as this script says) names a client never seen allocated.
        let mut s3 = Script::new();
        s3.push(sched(100, TSG, true));
        let evs = s3.run(&mut t);
        let EventKind::Schedule { task, channels, .. } = evs[0].kind else {
            panic!()
        };
        assert_eq!((task, channels), (TaskId::PreTrace(TSG), None));
    }

    #[test]
    fn fd_close_without_seen_client_uses_the_tsg_fd() {
        // The client and device were allocated before tracing started.
        let mut s = Script::new();
        s.push(alloc(
            100,
            8,
            true,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0,
            &tsg_params(0x9, 0),
        ))
        .push(alloc(
            100,
            9,
            true,
            CLIENT,
            DEVICE,
            TSG2,
            0xA06C,
            0,
            &tsg_params(0x9, 0),
        ))
        .close(100, 8);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        // The client predates tracing: what else hung on fd 8 ends with it (PRETRACE_END).
        assert_eq!(
            kinds(&evs),
            ["TASK_INIT", "TASK_INIT", "TASK_DESTROY", "PRETRACE_END"]
        );
        let EventKind::TaskInit { gpu, engine, .. } = evs[0].kind else {
            panic!()
        };
        assert_eq!((gpu, engine), (None, Some(Engine::Copy)));
        assert_eq!(
            destroys(&evs),
            [(100, TaskId::RmHandle(TSG), DestroyCause::FdClose, true)]
        );
        assert_eq!(t.live_tasks(), 1);
    }

    #[test]
    fn device_free_destroys_its_tsgs_only() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(alloc(
            100,
            CTL_FD,
            true,
            CLIENT,
            CLIENT,
            DEVICE2,
            0x80,
            0,
            &device_params(1),
        ))
        .push(tsg(100, DEVICE, TSG2, 0x9))
        .push(tsg(100, DEVICE2, 0xCAF0_0012, 0x1))
        // A channel without a TSG of its own, parented to the device.
        .push(alloc(
            100,
            CTL_FD,
            true,
            CLIENT,
            DEVICE,
            CH3,
            0xC86F,
            0,
            &channel_params(1, 0, 3),
        ))
        .push(ctl(
            100,
            CH3,
            cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
            0,
            &u32_params(0x0004_0003),
        ))
        .push(free(100, CTL_FD, CLIENT, CLIENT, DEVICE, 0));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        let EventKind::TaskInit { gpu, .. } = evs[2].kind else {
            panic!()
        };
        assert_eq!(gpu, Some(1));
        let EventKind::WorkSubmit { task, gpu, .. } = evs[3].kind else {
            panic!()
        };
        assert_eq!((task, gpu), (TaskId::RmHandle(CH3), Some(0)));
        assert_eq!(t.counters().unknown_handle, 0);
        assert_eq!(
            destroys(&evs),
            [
                (100, TaskId::RmHandle(TSG), DestroyCause::ParentFree, false),
                (100, TaskId::RmHandle(TSG2), DestroyCause::ParentFree, false),
            ]
        );
        assert_eq!(t.live_tasks(), 1);
        // The freed TSG's channels went with it.
        let mut s2 = Script::new();
        s2.push(ctl(
            100,
            CH1,
            cmd::CHANNEL_GPFIFO_SCHEDULE,
            0,
            &schedule_params(true, false, false),
        ));
        let evs = s2.run(&mut t);
        let EventKind::Schedule { task, channels, .. } = evs[0].kind else {
            panic!()
        };
        assert_eq!((task, channels), (TaskId::RmHandle(CH1), None));
        // The device's own channel went with the device.
        let mut s3 = Script::new();
        s3.push(ctl(
            100,
            CH3,
            cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
            0,
            &u32_params(0x0004_0003),
        ));
        let evs = s3.run(&mut t);
        let EventKind::WorkSubmit { gpu, .. } = evs[0].kind else {
            panic!()
        };
        assert_eq!(gpu, None);
        assert_eq!(t.counters().unknown_handle, 2);
    }

    #[test]
    fn client_free_destroys_everything_under_it() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(tsg(100, DEVICE, TSG2, 0x9))
            .push(free(100, CTL_FD, CLIENT, 0, CLIENT, 0))
            .exit(100, 100);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        // Both by the free; nothing left for the exit.
        assert_eq!(
            destroys(&evs),
            [
                (100, TaskId::RmHandle(TSG), DestroyCause::ParentFree, false),
                (100, TaskId::RmHandle(TSG2), DestroyCause::ParentFree, false),
            ]
        );
    }

    #[test]
    fn explicit_free_and_failed_free() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(free(100, CTL_FD, CLIENT, DEVICE, TSG, 0x1F)) // refused: nothing
            .push(free(100, CTL_FD, CLIENT, DEVICE, TSG, 0))
            .push(free(100, CTL_FD, CLIENT, DEVICE, 0xDEAD_0001, 0)); // some memory object
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(
            destroys(&evs),
            [(100, TaskId::RmHandle(TSG), DestroyCause::Free, false)]
        );
        assert_eq!(t.counters().failed_calls, 1);
        assert_eq!(t.counters().untracked_frees, 1);
        assert_eq!(t.live_tasks(), 0);
    }

    /// Only channel classes count among a TSG's channels: another object allocated under it
    /// (an address space, FERMI_VASPACE_A 0x90F1, here) does not.
    #[test]
    fn objects_under_a_tsg_that_are_not_channels_are_not_counted_as_channels() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(alloc(
            100,
            CTL_FD,
            true,
            CLIENT,
            TSG,
            0xCAF0_0055,
            0x90F1,
            0,
            &[],
        ))
        .push(sched(100, TSG, true));
        let evs = s.run(&mut NvTracker::new());
        let EventKind::Schedule { channels, .. } = evs[1].kind else {
            panic!("{evs:?}")
        };
        assert_eq!(channels, Some(2));
    }

    /// Frees of what was never seen are counted (`untracked_frees`), no event: an object of a
    /// process never seen, and a free naming no client (handle 0, which no call's client
    /// check marks as made before tracing) in a process never seen and in a known one.
    #[test]
    fn frees_of_what_was_never_seen_are_counted() {
        let mut t = NvTracker::new();
        let mut s = Script::new();
        s.push(free(555, CTL_FD, CLIENT, DEVICE, TSG, 0))
            .push(free(556, CTL_FD, 0, 0, 0, 0));
        assert!(s.run(&mut t).is_empty());
        assert_eq!(t.counters().untracked_frees, 2);
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(free(100, CTL_FD, 0, 0, 0, 0));
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["TASK_INIT"]);
        assert_eq!(t.counters().untracked_frees, 3);
        assert!(!t.is_pretrace(100));
        // A client seen allocated: its TSG ends, nothing is untracked.
        let mut s = Script::new();
        s.push(free(100, CTL_FD, CLIENT, CLIENT, CLIENT, 0));
        assert_eq!(kinds(&s.run(&mut t)), ["TASK_DESTROY"]);
        assert_eq!(t.counters().untracked_frees, 3);
    }

    /// Calls on handles never seen created are named by a remembered generation up to the
    /// per-process cap ([`MAX_HANDLES_PER_PROCESS`](crate::model::bounded::MAX_HANDLES_PER_PROCESS));
    /// past it, each such call is counted (`untracked_handles`) and still reported.
    #[test]
    fn calls_on_unseen_handles_past_the_cap_are_counted_and_still_reported() {
        let cap = crate::model::bounded::MAX_HANDLES_PER_PROCESS as u32;
        let mut t = NvTracker::new();
        let mut s = Script::new();
        for h in 0..cap + 3 {
            s.push(sched(300, 0x5C00_0000 + h, true));
        }
        let evs = s.run(&mut t);
        assert_eq!(evs.len(), cap as usize + 3);
        assert!(evs.iter().all(|e| e.kind.name() == "SCHEDULE"));
        assert_eq!(t.counters().untracked_handles, 3);
    }

    #[test]
    fn channel_free_only_removes_the_channel() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(free(100, CTL_FD, CLIENT, TSG, CH2, 0))
            .push(sched(100, TSG, true));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["TASK_INIT", "SCHEDULE"]);
        let EventKind::Schedule { channels, .. } = evs[1].kind else {
            panic!()
        };
        assert_eq!(channels, Some(1));
        assert_eq!(t.live_tasks(), 1);
    }

    #[test]
    fn failed_allocs_produce_nothing() {
        let mut s = Script::new();
        s.push(alloc(
            100,
            CTL_FD,
            true,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0x1B,
            &tsg_params(1, 0),
        ));
        let mut efault = tsg(100, DEVICE, TSG2, 1);
        efault.rec.ret = -14;
        s.push(efault);
        s.push(sched(100, TSG, true));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["SCHEDULE"]);
        let EventKind::Schedule { task, channels, .. } = evs[0].kind else {
            panic!()
        };
        // The client was never seen allocated: the TSG predates tracing.
        assert_eq!((task, channels), (TaskId::PreTrace(TSG), None));
        assert_eq!(t.counters().failed_tsg_allocs, 2);
        assert_eq!(t.counters().failed_calls, 2);
        assert_eq!(t.live_tasks(), 0);
    }

    #[test]
    fn refused_schedules() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        // RM refused it.
        s.push(ctl(
            100,
            TSG,
            cmd::TSG_GPFIFO_SCHEDULE,
            0x1B,
            &schedule_params(true, false, false),
        ));
        // The syscall was denied (LSM: -EPERM); the block still holds status 0.
        let mut denied = sched(100, TSG, true);
        denied.rec.ret = -1;
        s.push(denied);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        let sched: Vec<_> = evs
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Schedule {
                    allowed,
                    rm_status,
                    errno,
                    channels,
                    ..
                } => Some((allowed, rm_status, errno, channels)),
                _ => None,
            })
            .collect();
        assert_eq!(
            sched,
            [(false, Some(0x1B), 0, Some(2)), (false, None, -1, Some(2))]
        );
        assert_eq!(t.counters().failed_calls, 2);
    }

    /// The `change` of every `SCHED_UPDATE` with its verdict.
    fn updates(evs: &[Event]) -> Vec<(TaskId, SchedChange, bool)> {
        evs.iter()
            .filter_map(|e| match &e.kind {
                EventKind::SchedUpdate {
                    task,
                    change,
                    allowed,
                    ..
                } => Some((*task, change.clone(), *allowed)),
                _ => None,
            })
            .collect()
    }

    /// `NVA06C_CTRL_PREEMPT_PARAMS`: bWait @0, bManualTimeout @1, timeoutUs @4.
    fn preempt_params(wait: bool, manual: bool, timeout_us: u32) -> Vec<u8> {
        let mut p = vec![u8::from(wait), u8::from(manual), 0, 0];
        p.extend_from_slice(&timeout_us.to_le_bytes());
        p
    }

    #[test]
    fn scheduling_requests_are_updates_with_old_new_and_verdict() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(ctl(100, TSG, cmd::TSG_SET_TIMESLICE, 0, &u64_params(2048)))
            // NV_ERR_INVALID_ARGUMENT: the TSG keeps 2048.
            .push(ctl(
                100,
                TSG,
                cmd::TSG_SET_TIMESLICE,
                0x1F,
                &u64_params(5000),
            ))
            // On a channel: reported for its TSG.
            .push(ctl(
                100,
                CH1,
                cmd::CHANNEL_SET_INTERLEAVE_LEVEL,
                0,
                &u32_params(2),
            ))
            // Level 9 does not exist; RM refuses it.
            .push(ctl(
                100,
                TSG,
                cmd::TSG_SET_INTERLEAVE_LEVEL,
                0x1F,
                &u32_params(9),
            ))
            .push(ctl(
                100,
                TSG,
                cmd::TSG_PREEMPT,
                0,
                &preempt_params(false, true, 500),
            ))
            // GET_TIMESLICE reads, it requests nothing: no event, but the value is taken.
            .push(ctl(100, TSG, cmd::TSG_GET_TIMESLICE, 0, &u64_params(2000)))
            // A TSG this tracer never saw created: reported under its handle, old unknown.
            .push(ctl(
                100,
                0xCAF0_0077,
                cmd::TSG_SET_TIMESLICE,
                0,
                &u64_params(100),
            ));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        let task = TaskId::RmHandle(TSG);
        assert_eq!(
            updates(&evs),
            [
                (
                    task,
                    SchedChange::Timeslice {
                        old_us: Some(1024),
                        old_source: Some(ValueSource::DriverDefault),
                        new_us: 2048
                    },
                    true
                ),
                (
                    task,
                    SchedChange::Timeslice {
                        old_us: Some(2048),
                        old_source: Some(ValueSource::Observed),
                        new_us: 5000
                    },
                    false
                ),
                (
                    task,
                    SchedChange::Interleave {
                        old: Some(Interleave::Medium),
                        old_source: Some(ValueSource::DriverDefault),
                        new: Some(Interleave::High),
                        new_raw: 2
                    },
                    true
                ),
                (
                    task,
                    SchedChange::Interleave {
                        old: Some(Interleave::High),
                        old_source: Some(ValueSource::Observed),
                        new: None,
                        new_raw: 9
                    },
                    false
                ),
                (
                    task,
                    SchedChange::Preempt {
                        wait: false,
                        manual_timeout: true,
                        timeout_us: 500
                    },
                    true
                ),
                (
                    TaskId::RmHandle(0xCAF0_0077),
                    SchedChange::Timeslice {
                        old_us: None,
                        old_source: None,
                        new_us: 100
                    },
                    true
                ),
            ]
        );
        // The verdict fields: RM's status for the refused ones, the channel flag.
        let verdicts: Vec<(Option<u32>, i32, bool)> = evs
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::SchedUpdate {
                    rm_status,
                    errno,
                    via_channel,
                    ..
                } => Some((rm_status, errno, via_channel)),
                _ => None,
            })
            .collect();
        assert_eq!(
            verdicts,
            [
                (Some(0), 0, false),
                (Some(0x1F), 0, false),
                (Some(0), 0, true),
                (Some(0x1F), 0, false),
                (Some(0), 0, false),
                (Some(0), 0, false),
            ]
        );
        let snap = t.task(100, CLIENT, TSG).unwrap();
        assert_eq!(
            (snap.sched.timeslice_us, snap.sched.interleave),
            (Some(2000), Some(Interleave::High))
        );
        assert_eq!(t.counters().unknown_handle, 1);
    }

    #[test]
    fn every_event_of_a_tsg_has_its_run_unique_key() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(sched(100, TSG, true))
            .push(ctl(100, TSG, cmd::TSG_GET_INFO, 0, &u32_params(5)))
            .push(ctl(
                100,
                TSG,
                cmd::TSG_PREEMPT,
                0,
                &preempt_params(true, false, 0),
            ))
            .push(free(100, CTL_FD, CLIENT, DEVICE, TSG, 0))
            // The same handle again in the same client: a new task, generation 2.
            .push(tsg(100, DEVICE, TSG, 0x1))
            .exit(100, 100);
        // Another process with the same client and TSG handles.
        setup(&mut s, 200, 0, 0x1);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        let keys: Vec<(&str, String)> = evs
            .iter()
            .map(|e| (e.kind.name(), e.key.unwrap().to_string()))
            .collect();
        let k1 = format!("100:0x{CLIENT:08x}:0x{TSG:08x}");
        let k2 = format!("{k1}#2");
        let k3 = format!("200:0x{CLIENT:08x}:0x{TSG:08x}");
        assert_eq!(
            keys,
            [
                ("TASK_INIT", k1.clone()),
                ("SCHEDULE", k1.clone()),
                // Named by its hardware id now, same key.
                ("SCHED_UPDATE", k1.clone()),
                ("TASK_DESTROY", k1),
                ("TASK_INIT", k2.clone()),
                ("TASK_DESTROY", k2),
                ("TASK_INIT", k3),
            ]
        );
        assert_eq!(evs[2].kind.task(), TaskId::HwTsg(5));
    }

    #[test]
    fn disable_and_re_enable_are_updates_not_schedules() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(sched(100, TSG, true))
            .push(sched(100, TSG, false))
            .push(sched(100, TSG, true))
            // A refused disable (NV_ERR_INSUFFICIENT_PERMISSIONS) leaves the TSG enabled: the
            // enable after it is a plain SCHEDULE.
            .push(ctl(
                100,
                TSG,
                cmd::TSG_GPFIFO_SCHEDULE,
                0x1B,
                &schedule_params(false, true, false),
            ))
            .push(sched(100, TSG, true));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(
            kinds(&evs),
            [
                "TASK_INIT",
                "SCHEDULE",
                "SCHED_UPDATE",
                "SCHEDULE",
                "SCHED_UPDATE",
                "SCHED_UPDATE",
                "SCHEDULE"
            ]
        );
        let rs = |old, new, skip_submit| SchedChange::RunState {
            old,
            new,
            skip_submit,
            skip_enable: false,
        };
        let task = TaskId::RmHandle(TSG);
        assert_eq!(
            updates(&evs),
            [
                (
                    task,
                    rs(Some(RunState::Enabled), RunState::Disabled, false),
                    true
                ),
                (
                    task,
                    rs(Some(RunState::Disabled), RunState::Enabled, false),
                    true
                ),
                (
                    task,
                    rs(Some(RunState::Enabled), RunState::Disabled, true),
                    false
                ),
            ]
        );
        assert_eq!(t.counters().schedule_disable, 2);
    }

    #[test]
    fn unreadable_schedule_is_counted_not_reported() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        let mut r = sched(100, TSG, true);
        r.rec.params[12] = 0x4; // FINN-serialized
        s.push(r);
        let mut r = sched(100, TSG, true);
        r.rec.flags |= nv_flags::SUB_READ_FAILED;
        s.push(r);
        let mut t = NvTracker::new();
        assert_eq!(kinds(&s.run(&mut t)), ["TASK_INIT"]);
        assert_eq!(t.counters().schedule_unreadable, 2);
        assert_eq!(t.counters().unreadable_params, 2);
        assert_eq!(
            t.counters()
                .unreadable_by_reason
                .get(&Unreadable::FinnSerialized),
            Some(&1)
        );
    }

    /// A FINN-serialized GPFIFO_SCHEDULE refused with EPERM (`--deny-*` fails closed on it):
    /// a refused SCHEDULE, still counted unreadable; one that reached the driver stays silent.
    #[test]
    fn refused_unreadable_schedule_is_reported_refused() {
        for via_channel in [false, true] {
            let mut s = Script::new();
            setup(&mut s, 100, 0, 0x1);
            let mut r = if via_channel {
                ctl(
                    100,
                    CH1,
                    cmd::CHANNEL_GPFIFO_SCHEDULE,
                    0,
                    &schedule_params(true, false, false),
                )
            } else {
                sched(100, TSG, true)
            };
            r.rec.params[12] = 0x4; // FINN-serialized
            r.rec.ret = -1; // EPERM
            s.push(r);
            let mut r = sched(100, TSG, true);
            r.rec.params[12] = 0x4;
            s.push(r);
            let mut t = NvTracker::new();
            let evs = s.run(&mut t);
            assert_eq!(kinds(&evs), ["TASK_INIT", "SCHEDULE"]);
            let EventKind::Schedule {
                allowed,
                errno,
                rm_status,
                via_channel: v,
                channels,
                ..
            } = evs[1].kind
            else {
                unreachable!()
            };
            assert!(!allowed);
            assert_eq!((errno, rm_status, v), (-1, None, via_channel));
            assert_eq!(channels, Some(2));
            assert_eq!(t.counters().schedule_unreadable, 2);
            assert_eq!(
                t.counters()
                    .unreadable_by_reason
                    .get(&Unreadable::FinnSerialized),
                Some(&2)
            );
        }
    }

    /// An inventory process: `close()` of one of its control fds, then its exit; each ends
    /// what hung there, with an unknown count. A TSG it creates while traced ends as usual.
    #[test]
    fn inventory_process_ends_with_pretrace_end_at_close_and_exit() {
        let mut t = NvTracker::new();
        t.preexisting(100, "python3", &[8, 17], false);
        assert!(t.is_pretrace(100));
        let mut s = Script::new();
        s.close(100, 3) // not a control fd: nothing
            .close(100, 17)
            .exit(100, 100);
        let evs = s.run(&mut t);
        let ends: Vec<(Option<i32>, DestroyCause, Option<u32>)> = evs
            .iter()
            .map(|e| match e.kind {
                EventKind::PretraceEnd {
                    fd, cause, tsgs, ..
                } => (fd, cause, tsgs),
                ref k => panic!("{k:?}"),
            })
            .collect();
        assert_eq!(
            ends,
            [
                (Some(17), DestroyCause::FdClose, None),
                (None, DestroyCause::ProcessExit, None)
            ]
        );
        assert!(
            !t.is_pretrace(100),
            "the pid starts from nothing after the exit"
        );

        // All its control fds closed before the exit: nothing more at the exit.
        t.preexisting(101, "python3", &[8], false);
        let mut s = Script::new();
        s.close(101, 8).exit(101, 101);
        assert_eq!(kinds(&s.run(&mut t)), ["PRETRACE_END"]);
    }

    /// A call on a client never seen allocated makes the process late-attached (fd of the
    /// call); freeing that client ends its objects; its TSG-level schedule is `[pre-trace]`.
    #[test]
    fn calls_on_an_unseen_client_mark_the_process_pretrace() {
        let mut t = NvTracker::new();
        let mut s = Script::new();
        s.push(sched(300, TSG, true))
            .push(free(300, CTL_FD, CLIENT, CLIENT, CLIENT, 0))
            .exit(300, 300);
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["SCHEDULE", "PRETRACE_END", "PRETRACE_END"]);
        assert_eq!(evs[0].kind.task(), TaskId::PreTrace(TSG));
        assert_eq!(
            evs[1].kind,
            EventKind::PretraceEnd {
                client: Some(CLIENT),
                fd: None,
                cause: DestroyCause::ParentFree,
                tsgs: None
            }
        );
        // The free gave an event; the schedule too: no pre-trace call went unnamed.
        assert_eq!(t.counters().pretrace_calls, 0);
        // A failed call proves nothing.
        let mut s = Script::new();
        s.push(free(301, CTL_FD, CLIENT, CLIENT, CLIENT, 0x1F))
            .exit(301, 301);
        assert!(s.run(&mut t).is_empty());
    }

    /// In a late-attached process, a handle never seen created is `[pre-trace]` in a client
    /// allocated while tracing too (the process's objects of before may be named there).
    #[test]
    fn unseen_handles_of_a_late_attached_process_are_pretrace_in_any_client() {
        const NEW_CLIENT: u32 = 0xC1D0_0777;
        let mut t = NvTracker::new();
        let mut s = Script::new();
        s.push(sched(300, TSG, true))
            .push(alloc(300, CTL_FD, true, 0, 0, NEW_CLIENT, 0x41, 0, &[]))
            .push(control(
                300,
                CTL_FD,
                NEW_CLIENT,
                TSG + 1,
                cmd::TSG_GPFIFO_SCHEDULE,
                0,
                &schedule_params(true, false, false),
            ));
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["SCHEDULE", "SCHEDULE"]);
        assert_eq!(evs[1].kind.task(), TaskId::PreTrace(TSG + 1));
    }

    /// Calls of a late-attached process that give no event are counted (`pretrace_calls`),
    /// each; freeing a client it allocated while tracing is no `PRETRACE_END`; a client handle
    /// allocated again while its TSGs live is counted (`replaced_handles`).
    #[test]
    fn late_attached_calls_without_events_and_replaced_clients_are_counted() {
        const NEW_CLIENT: u32 = 0xC1D0_0777;
        let mut t = NvTracker::new();
        let mut s = Script::new();
        let device = |h| {
            alloc(
                300,
                CTL_FD,
                true,
                CLIENT,
                CLIENT,
                h,
                0x80,
                0,
                &device_params(0),
            )
        };
        s.push(device(0xCAF0_0101)).push(device(0xCAF0_0102));
        assert!(s.run(&mut t).is_empty());
        assert_eq!(t.counters().pretrace_calls, 2);
        let mut s = Script::new();
        s.push(alloc(300, CTL_FD, true, 0, 0, NEW_CLIENT, 0x41, 0, &[]))
            .push(free(300, CTL_FD, NEW_CLIENT, NEW_CLIENT, NEW_CLIENT, 0));
        assert!(
            s.run(&mut t).is_empty(),
            "a client of the run: no PRETRACE_END"
        );
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(alloc(100, CTL_FD, true, 0, 0, CLIENT, 0x41, 0, &[]));
        s.run(&mut t);
        assert_eq!(t.counters().replaced_handles, 1);
    }

    /// A client's index of channels by parent stays in step with its channels (what a free
    /// looks up instead of scanning every channel).
    #[test]
    fn the_channel_index_follows_the_channels() {
        let mut c = Client::default();
        for (h, parent) in [(1, 10), (2, 10), (3, 20)] {
            c.add_channel(h, parent);
        }
        c.remove_channel(1);
        assert_eq!(c.channel_parents, BTreeMap::from([(10, 1), (20, 1)]));
        c.remove_channel(2);
        assert_eq!(c.channel_parents, BTreeMap::from([(20, 1)]));
        c.drop_channels_under(20);
        assert!(c.channel_parents.is_empty() && c.channels.is_empty());
    }

    /// A process's exit counts its threads' gpu_ext hooks no ioctl took, and only its own;
    /// a control without hooks counts none.
    #[test]
    fn hooks_left_at_exit_are_counted_per_process() {
        use crate::source::nvidia::gpu_ext::testing as gx;
        let mut t = NvTracker::new();
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(sched(100, TSG, true));
        s.hook(gx::task_init(100, 9, 6, 1024))
            .hook(gx::task_init(200, 9, 7, 1024))
            .hook(gx::task_init(200, 9, 8, 1024))
            .exit(100, 100);
        s.run(&mut t);
        assert_eq!(t.counters().gpu_ext_unmatched, 1);
        let mut s = Script::new();
        s.exit(200, 200);
        s.run(&mut t);
        assert_eq!(t.counters().gpu_ext_unmatched, 3);
        // A token hook inside a call that is not a token request: counted, no WORK_SUBMIT.
        let mut s = Script::new();
        setup(&mut s, 300, 0, 0x1);
        s.hook(gx::record(
            300,
            gpu_trace_common::nvidia::gpu_ext::hook::TOKEN_REQUEST,
            CTL_FD as u64,
            &gx::ctx(&[(0, 0x21, 4), (8, 5, 8), (16, 0x000d_0021, 4)]),
        ))
        .push(sched(300, TSG, true));
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["TASK_INIT", "SCHEDULE"]);
        assert_eq!(t.counters().gpu_ext_unmatched, 4);
    }

    /// MPS: a client channel under a TSG handle the client never created is `[shared]`; its
    /// token relates it to the server's TSG on that runlist — not when two server TSGs are
    /// there.
    #[test]
    fn mps_client_channels_relate_to_the_single_server_tsg_on_their_runlist() {
        const SERVER: u32 = 538;
        const SERVER_TSG: u32 = 0x5c00_0015;
        const FOREIGN: u32 = 0x5c00_000f;
        // The server's comm is what the kernel keeps of nvidia-cuda-mps-server.
        let mps = |mut r: testrec::Rec| {
            r.rec.hdr.comm = [0; 16];
            r.rec.hdr.comm[..15].copy_from_slice(MPS_COMM.as_bytes());
            r
        };
        // A graphics channel `ch` under `parent`, through the ctl fd.
        let channel = |pid: u32, parent: u32, ch: u32| {
            alloc(
                pid,
                CTL_FD,
                true,
                CLIENT,
                parent,
                ch,
                0xC86F,
                0,
                &channel_params(1, 0, 1),
            )
        };
        let server_tsg = |s: &mut Script, tsg_handle: u32, ch: u32, token: u32| {
            s.stamp(mps(tsg(SERVER, DEVICE, tsg_handle, 1)), SERVER)
                .stamp(mps(channel(SERVER, tsg_handle, ch)), SERVER)
                .stamp(
                    mps(ctl(
                        SERVER,
                        ch,
                        cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                        0,
                        &u32_params(token),
                    )),
                    SERVER,
                );
        };
        let client = |s: &mut Script, pid: u32, token: u32| {
            s.push(alloc(pid, CTL_FD, true, 0, 0, CLIENT, 0x41, 0, &[]))
                .push(channel(pid, FOREIGN, CH1))
                .push(ctl(
                    pid,
                    CH1,
                    cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                    0,
                    &u32_params(token),
                ))
                .push(ctl(
                    pid,
                    CH1,
                    cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                    0,
                    &u32_params(token),
                ));
        };
        let mut s = Script::new();
        s.push(mps(alloc(SERVER, CTL_FD, true, 0, 0, CLIENT, 0x41, 0, &[])));
        server_tsg(&mut s, SERVER_TSG, CH2, 10); // runlist 0, chid 10
        client(&mut s, 500, 14); // runlist 0
        let mut t = NvTracker::new();
        let evs: Vec<Event> = s
            .run(&mut t)
            .into_iter()
            .filter(|e| e.origin.pid == 500)
            .collect();
        assert_eq!(kinds(&evs), ["WORK_SUBMIT", "MPS_SHARED", "WORK_SUBMIT"]);
        assert_eq!(evs[0].kind.task(), TaskId::Shared(FOREIGN));
        assert_eq!(
            evs[1].kind,
            EventKind::MpsShared {
                task: TaskId::Shared(FOREIGN),
                client: CLIENT,
                server_pid: SERVER,
                server_task: TaskId::RmHandle(SERVER_TSG),
                runlist: 0,
            }
        );
        // A second server TSG on runlist 0: the relation is ambiguous and not made.
        let mut s = Script::new();
        s.push(mps(alloc(SERVER, CTL_FD, true, 0, 0, CLIENT, 0x41, 0, &[])));
        server_tsg(&mut s, SERVER_TSG, CH2, 10);
        server_tsg(&mut s, TSG2, CH3, 11);
        client(&mut s, 500, 14);
        let mut t = NvTracker::new();
        assert!(!s.run(&mut t).iter().any(|e| e.kind.name() == "MPS_SHARED"));
    }

    #[test]
    fn unknown_handles_are_reported_not_invented() {
        let mut s = Script::new();
        s.push(sched(300, TSG, true))
            .push(ctl(
                300,
                CH1,
                cmd::CHANNEL_GPFIFO_SCHEDULE,
                0,
                &schedule_params(true, false, false),
            ))
            .push(ctl(
                300,
                CH1,
                cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                0,
                &u32_params(0x0001_0007),
            ))
            .push(ctl(300, TSG, cmd::TSG_GET_INFO, 0, &u32_params(9)));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["SCHEDULE", "SCHEDULE", "WORK_SUBMIT"]);
        // Client CLIENT was never seen allocated: everything named predates tracing.
        assert_eq!(
            evs[0].kind,
            EventKind::Schedule {
                task: TaskId::PreTrace(TSG),
                client: CLIENT,
                channels: None,
                timeslice_us: None,
                interleave: None,
                allowed: true,
                rm_status: Some(0),
                errno: 0,
                via_channel: false,
            }
        );
        let EventKind::Schedule {
            task, via_channel, ..
        } = evs[1].kind
        else {
            panic!()
        };
        assert_eq!((task, via_channel), (TaskId::PreTrace(CH1), true));
        assert_eq!(
            evs[2].kind,
            EventKind::WorkSubmit {
                task: TaskId::PreTrace(CH1),
                client: CLIENT,
                channel_handle: CH1,
                chid: Some(7),
                runlist: Some(1),
                token: 0x0001_0007,
                gpu: None,
            }
        );
        assert_eq!(t.counters().unknown_handle, 4);
        assert_eq!(t.live_tasks(), 0);
    }

    #[test]
    fn channel_level_schedule_reports_the_tsg() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(ctl(
            100,
            CH2,
            cmd::CHANNEL_GPFIFO_SCHEDULE,
            0,
            &schedule_params(true, false, false),
        ));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        let EventKind::Schedule {
            task,
            via_channel,
            channels,
            allowed,
            ..
        } = evs[1].kind
        else {
            panic!()
        };
        assert_eq!(
            (task, via_channel, channels, allowed),
            (TaskId::RmHandle(TSG), true, Some(2), true)
        );
        assert_eq!(t.counters().unknown_handle, 0);
    }

    #[test]
    fn processes_with_colliding_handles_are_separate() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        setup(&mut s, 200, 1, 0x9);
        s.push(free(200, CTL_FD, CLIENT, TSG, CH2, 0)) // only 200's channel
            .push(ctl(100, TSG, cmd::TSG_GET_INFO, 0, &u32_params(4)))
            .exit(100, 100)
            .push(sched(200, TSG, true))
            .push(ctl(
                200,
                CH1,
                cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                0,
                &u32_params(0x0002_0009),
            ));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(
            kinds(&evs),
            [
                "TASK_INIT",
                "TASK_INIT",
                "TASK_DESTROY",
                "SCHEDULE",
                "WORK_SUBMIT"
            ]
        );
        assert_eq!(
            destroys(&evs),
            [(100, TaskId::HwTsg(4), DestroyCause::ProcessExit, true)]
        );
        let EventKind::Schedule { task, channels, .. } = evs[3].kind else {
            panic!()
        };
        assert_eq!(
            (evs[3].origin.pid, task, channels),
            (200, TaskId::RmHandle(TSG), Some(1))
        );
        let EventKind::WorkSubmit { gpu, .. } = evs[4].kind else {
            panic!()
        };
        assert_eq!(gpu, Some(1));
        assert_eq!(t.live_tasks(), 1);
        let live = t.finish();
        assert_eq!(
            live,
            [LiveAtEnd {
                pid: 200,
                comm: "cuda".into(),
                tasks: vec![(CLIENT, TaskId::RmHandle(TSG))]
            }]
        );
        assert_eq!(t.live_tasks(), 0);
    }

    #[test]
    fn get_info_switches_the_task_id() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(sched(100, TSG, true))
            .push(ctl(100, TSG, cmd::TSG_GET_INFO, 0x57, &u32_params(99))) // failed
            .push(sched(100, TSG, true))
            .push(ctl(100, TSG, cmd::TSG_GET_INFO, 0, &u32_params(12)))
            .push(sched(100, TSG, true))
            .push(ctl(
                100,
                CH2,
                cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                0,
                &u32_params(0x0003_0006),
            ))
            .push(free(100, CTL_FD, CLIENT, DEVICE, TSG, 0));
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        let tasks: Vec<_> = evs.iter().map(|e| e.kind.task()).collect();
        assert_eq!(
            tasks,
            [
                TaskId::RmHandle(TSG),
                TaskId::RmHandle(TSG),
                TaskId::RmHandle(TSG),
                TaskId::HwTsg(12),
                TaskId::HwTsg(12),
                TaskId::HwTsg(12),
            ]
        );
    }

    #[test]
    fn timeslice_and_interleave_update_later_schedules() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        let sched_ts = |s: &mut Script| {
            s.push(sched(100, TSG, true));
        };
        sched_ts(&mut s); // defaults
        s.push(ctl(
            100,
            TSG,
            cmd::TSG_SET_TIMESLICE,
            0x1F,
            &u64_params(5000),
        )); // refused
        sched_ts(&mut s);
        s.push(ctl(100, TSG, cmd::TSG_SET_TIMESLICE, 0, &u64_params(2048)))
            .push(ctl(
                100,
                TSG,
                cmd::TSG_SET_INTERLEAVE_LEVEL,
                0,
                &u32_params(2),
            ));
        sched_ts(&mut s);
        s.push(ctl(
            100,
            CH1,
            cmd::CHANNEL_SET_INTERLEAVE_LEVEL,
            0,
            &u32_params(0),
        ))
        .push(ctl(100, TSG, cmd::TSG_GET_TIMESLICE, 0, &u64_params(4096)));
        sched_ts(&mut s);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        let got: Vec<_> = evs
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Schedule {
                    timeslice_us,
                    interleave,
                    ..
                } => Some((timeslice_us, interleave)),
                _ => None,
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some(1024), Some(Interleave::Medium)),
                (Some(1024), Some(Interleave::Medium)),
                (Some(2048), Some(Interleave::High)),
                (Some(4096), Some(Interleave::Low)),
            ]
        );
        // A new TSG on the same handle (after a free) starts from the driver defaults again.
        let mut s2 = Script::new();
        s2.push(free(100, CTL_FD, CLIENT, DEVICE, TSG, 0))
            .push(tsg(100, DEVICE, TSG, 1))
            .push(sched(100, TSG, true));
        let evs = s2.run(&mut t);
        let EventKind::Schedule {
            timeslice_us,
            interleave,
            channels,
            ..
        } = evs[2].kind
        else {
            panic!()
        };
        assert_eq!(
            (timeslice_us, interleave, channels),
            (Some(1024), Some(Interleave::Medium), Some(0))
        );
    }

    #[test]
    fn observed_values_are_marked_in_the_tracker_state() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(ctl(100, TSG, cmd::TSG_SET_TIMESLICE, 0, &u64_params(2048)));
        let mut t = NvTracker::new();
        s.run(&mut t);
        assert_eq!(
            t.task(100, CLIENT, TSG),
            Some(TaskSnapshot {
                task: TaskId::RmHandle(TSG),
                parent: DEVICE,
                fd: CTL_FD,
                engine_type: Some(1),
                sched: SchedParams {
                    timeslice_us: Some(2048),
                    timeslice_source: ValueSource::Observed,
                    interleave: Some(Interleave::Medium),
                    interleave_source: ValueSource::DriverDefault,
                    runlist: None,
                    run_state: RunState::Unscheduled,
                },
                channels: vec![CH1, CH2],
                gpu: Some(0),
            })
        );
        // A refused SET_INTERLEAVE_LEVEL changes nothing; an accepted one is observed.
        let mut s2 = Script::new();
        s2.push(ctl(
            100,
            TSG,
            cmd::TSG_SET_INTERLEAVE_LEVEL,
            0x1B,
            &u32_params(2),
        ));
        s2.run(&mut t);
        let snap = t.task(100, CLIENT, TSG).unwrap();
        assert_eq!(
            (snap.sched.interleave, snap.sched.interleave_source),
            (Some(Interleave::Medium), ValueSource::DriverDefault)
        );
        let mut s3 = Script::new();
        s3.push(ctl(
            100,
            TSG,
            cmd::TSG_SET_INTERLEAVE_LEVEL,
            0,
            &u32_params(1),
        ));
        s3.run(&mut t);
        let snap = t.task(100, CLIENT, TSG).unwrap();
        assert_eq!(
            (snap.sched.interleave, snap.sched.interleave_source),
            (Some(Interleave::Medium), ValueSource::Observed)
        );
        assert_eq!(t.task(100, CLIENT, TSG2), None);
        assert_eq!(t.task(200, CLIENT, TSG), None);
    }

    #[test]
    fn work_submit_token_sets_the_runlist() {
        let mut s = Script::new();
        setup(&mut s, 100, 2, 0x1);
        // GB20x token: bit 30 set.
        s.push(ctl(
            100,
            CH2,
            cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
            0,
            &u32_params(0x400B_0123),
        ))
        .push(ctl(
            100,
            CH1,
            cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
            0x1B,
            &u32_params(0),
        )); // failed
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["TASK_INIT", "WORK_SUBMIT"]);
        let EventKind::WorkSubmit {
            chid,
            runlist,
            gpu,
            channel_handle,
            ..
        } = evs[1].kind
        else {
            panic!()
        };
        assert_eq!(
            (chid, runlist, gpu, channel_handle),
            (Some(0x123), Some(0xB), Some(2), CH2)
        );
        assert_eq!(t.task(100, CLIENT, TSG).unwrap().sched.runlist, Some(0xB));
    }

    #[test]
    fn malformed_records_are_counted() {
        let mut s = Script::new();
        let mut r = sched(100, TSG, true);
        r.rec.flags = nv_flags::XFER | nv_flags::XFER_READ_FAILED;
        r.rec.escape = 0;
        s.push(r);
        let mut r = free(100, CTL_FD, CLIENT, DEVICE, TSG, 0);
        r.rec.flags = nv_flags::BAD_SIZE;
        s.push(r);
        let mut r = free(100, CTL_FD, CLIENT, DEVICE, TSG, 0);
        r.rec.flags = nv_flags::BAD_SIZE;
        s.push(r);
        let mut t = NvTracker::new();
        assert!(s.run(&mut t).is_empty());
        let c = t.counters();
        assert_eq!((c.malformed, c.calls), (3, 0));
        assert_eq!(
            c.malformed_by_reason.get(&MalformedReason::BadSize),
            Some(&2)
        );
        assert_eq!(
            c.malformed_by_reason.get(&MalformedReason::XferReadFailed),
            Some(&1)
        );
    }

    #[test]
    fn finish_lists_live_tasks_and_tracer_exit_events() {
        let mut s = Script::new();
        setup(&mut s, 100, 0, 0x1);
        s.push(tsg(100, DEVICE, TSG2, 0x9)).push(ctl(
            100,
            TSG2,
            cmd::TSG_GET_INFO,
            0,
            &u32_params(3),
        ));
        let mut t = NvTracker::new();
        s.run(&mut t);
        let live = t.finish();
        assert_eq!(live.len(), 1);
        assert_eq!(
            live[0].tasks,
            [(CLIENT, TaskId::RmHandle(TSG)), (CLIENT, TaskId::HwTsg(3))]
        );
        let evs = live[0].tracer_exit_events(5_000);
        assert_eq!(destroys(&evs).len(), 2);
        assert!(evs.iter().all(|e| matches!(
            e.kind,
            EventKind::TaskDestroy {
                cause: DestroyCause::TracerExit,
                implicit: true,
                ..
            }
        ) && e.origin.ts_ns == 5_000
            && e.origin.pid == 100));
        assert!(t.finish().is_empty());
    }

    #[test]
    fn nvos21_allocs_and_xfer_calls_are_tracked_too() {
        let mut s = Script::new();
        s.push(alloc(
            100,
            CTL_FD,
            false,
            CLIENT,
            DEVICE,
            TSG,
            0xA06C,
            0,
            &tsg_params(0x13, 0),
        ));
        let mut r = sched(100, TSG, true);
        r.rec.flags |= nv_flags::XFER;
        r.rec.ioctl_cmd = 0xC010_46D3;
        s.push(r);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(kinds(&evs), ["TASK_INIT", "SCHEDULE"]);
        let EventKind::TaskInit { engine, .. } = evs[0].kind else {
            panic!()
        };
        assert_eq!(engine, Some(Engine::Nvdec));
        let EventKind::Schedule { channels, .. } = evs[1].kind else {
            panic!()
        };
        assert_eq!(channels, Some(0));
    }

    #[test]
    fn origin_of_call_events_is_the_caller() {
        let mut s = Script::new();
        s.stamp(tsg(100, DEVICE, TSG, 1), 107);
        let mut t = NvTracker::new();
        let evs = s.run(&mut t);
        assert_eq!(
            evs[0].origin,
            Origin {
                ts_ns: 1010,
                cpu: 0,
                pid: 100,
                tid: 107,
                comm: "cuda".into()
            }
        );
        // and the wire layer agrees with the record.
        assert_eq!(wire::origin(s.recs[0].header()), evs[0].origin);
    }
}
