//! Property-based fuzzing of the NVIDIA object model ([`NvTracker`]): random sequences of RM
//! calls, fd closes and process exits over a small space of pids, fds and handles (so that
//! handles collide, objects are reused, freed twice, freed by the wrong process, ...), with the
//! tracker's invariants checked after every step.
//!
//! Bounded for `cargo test` (debug build): about 25 s of CPU, 45 s on a busy 2-core machine.
//! Run longer with
//! `GPU_TRACE_FUZZ_SCALE=N` (N times the cases), e.g.
//! `GPU_TRACE_FUZZ_SCALE=50 cargo test --release -p gpu-trace --test fuzz_model`.
//! Failures are shrunk and saved in `tests/corpus/fuzz_model.txt`, which every later run
//! replays first (commit that file with the fix).

mod common;
mod rel_support;

use std::collections::{BTreeMap, BTreeSet};

use gpu_trace::{
    event::{DestroyCause, Event, EventKind, Origin, RunState, SchedChange, TaskId},
    source::nvidia::{
        decode::{AllocParams, ControlParams, MalformedReason, RmCall, Unreadable, status},
        model::{NvInput, NvTracker, TaskSnapshot},
    },
};
use gpu_trace_common::nvidia::{class, cmd};
use proptest::prelude::*;

fn config(base: u32) -> ProptestConfig {
    rel_support::fuzz_config(
        base,
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/fuzz_model.txt"),
    )
}

const PIDS: [u32; 3] = [100, 101, 102];
const FDS: [i32; 3] = [3, 4, 5];
const CLIENTS: [u32; 2] = [0xC1D0_0001, 0xC1D0_0002];
/// Device, TSG and channel handles all come from here, so that kinds collide too.
const OBJECTS: [u32; 6] = [
    0x5C00_0001,
    0x5C00_0002,
    0x5C00_0003,
    0x5C00_0004,
    0x5C00_0005,
    0x5C00_0006,
];

#[derive(Clone, Copy, Debug)]
enum AllocKind {
    Client,
    Device,
    Tsg,
    Channel,
    Other,
}

#[derive(Clone, Copy, Debug)]
enum CtlKind {
    TsgSchedule,
    ChannelSchedule,
    Token,
    GetInfo,
    SetTimeslice,
    TsgInterleave,
    ChannelInterleave,
    Preempt,
    Unknown,
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        pid: usize,
        fd: usize,
        client: usize,
        parent: usize,
        handle: usize,
        kind: AllocKind,
        errno: i32,
        status: u32,
        params: AllocParams,
    },
    Control {
        pid: usize,
        client: usize,
        object: usize,
        kind: CtlKind,
        errno: i32,
        status: u32,
        params: ControlParams,
    },
    Free {
        pid: usize,
        client: usize,
        object: usize,
        errno: i32,
        status: u32,
    },
    Close {
        pid: usize,
        fd: usize,
    },
    Exit {
        pid: usize,
    },
    Malformed {
        pid: usize,
        reason: MalformedReason,
    },
}

fn outcome() -> impl Strategy<Value = (i32, u32)> {
    prop_oneof![
        6 => Just((0, status::NV_OK)),
        1 => Just((0, status::NV_ERR_INVALID_ARGUMENT)),
        1 => Just((-25, 0)),
        1 => Just((-1, status::NV_ERR_INSUFFICIENT_PERMISSIONS)),
    ]
}

fn unreadable() -> impl Strategy<Value = Unreadable> {
    prop_oneof![
        Just(Unreadable::ReadFailed),
        Just(Unreadable::Truncated),
        Just(Unreadable::FinnSerialized),
        Just(Unreadable::Short)
    ]
}

fn alloc_kind() -> impl Strategy<Value = AllocKind> {
    prop_oneof![
        1 => Just(AllocKind::Client),
        1 => Just(AllocKind::Device),
        3 => Just(AllocKind::Tsg),
        3 => Just(AllocKind::Channel),
        1 => Just(AllocKind::Other),
    ]
}

/// Alloc parameters: the ones the decoder gives for the class (most of the time), or anything.
fn alloc_params(kind: AllocKind) -> BoxedStrategy<AllocParams> {
    let matching: BoxedStrategy<AllocParams> = match kind {
        AllocKind::Client => Just(AllocParams::Client).boxed(),
        AllocKind::Device => (0u32..3)
            .prop_map(|device_id| AllocParams::Device { device_id })
            .boxed(),
        AllocKind::Tsg => (0u32..0x60)
            .prop_map(|engine_type| AllocParams::Tsg {
                h_object_error: 0,
                h_vaspace: 0,
                engine_type,
            })
            .boxed(),
        AllocKind::Channel => (any::<u32>(), 0u32..0x60, 0u32..16)
            .prop_map(|(flags, engine_type, cid)| AllocParams::Channel {
                h_object_error: 0,
                gpfifo_entries: 1024,
                flags,
                h_context_share: 0,
                h_vaspace: 0,
                engine_type,
                cid,
            })
            .boxed(),
        AllocKind::Other => Just(AllocParams::NotDecoded).boxed(),
    };
    prop_oneof![
        8 => matching,
        1 => unreadable().prop_map(|reason| AllocParams::Unreadable { reason }),
        1 => prop_oneof![Just(AllocParams::Client), Just(AllocParams::NotDecoded), Just(AllocParams::Device { device_id: 7 })],
    ]
    .boxed()
}

fn ctl_kind() -> impl Strategy<Value = CtlKind> {
    prop_oneof![
        3 => Just(CtlKind::TsgSchedule),
        1 => Just(CtlKind::ChannelSchedule),
        3 => Just(CtlKind::Token),
        1 => Just(CtlKind::GetInfo),
        1 => Just(CtlKind::SetTimeslice),
        1 => Just(CtlKind::TsgInterleave),
        1 => Just(CtlKind::ChannelInterleave),
        1 => Just(CtlKind::Preempt),
        1 => Just(CtlKind::Unknown),
    ]
}

fn ctl_params(kind: CtlKind) -> BoxedStrategy<ControlParams> {
    let matching: BoxedStrategy<ControlParams> = match kind {
        CtlKind::TsgSchedule | CtlKind::ChannelSchedule => {
            (any::<bool>(), any::<bool>(), any::<bool>())
                .prop_map(
                    |(enable, skip_submit, skip_enable)| ControlParams::Schedule {
                        enable,
                        skip_submit,
                        skip_enable,
                    },
                )
                .boxed()
        }
        CtlKind::Token => any::<u32>()
            .prop_map(|token| ControlParams::WorkSubmitToken { token })
            .boxed(),
        CtlKind::GetInfo => (0u32..8)
            .prop_map(|tsg_id| ControlParams::TsgInfo { tsg_id })
            .boxed(),
        CtlKind::SetTimeslice => any::<u64>()
            .prop_map(|us| ControlParams::Timeslice { us })
            .boxed(),
        CtlKind::TsgInterleave | CtlKind::ChannelInterleave => (0u32..4)
            .prop_map(|level| ControlParams::Interleave { level })
            .boxed(),
        CtlKind::Preempt => Just(ControlParams::Preempt {
            wait: true,
            manual_timeout: false,
            timeout_us: 0,
        })
        .boxed(),
        CtlKind::Unknown => Just(ControlParams::NotDecoded).boxed(),
    };
    prop_oneof![
        8 => matching,
        1 => unreadable().prop_map(|reason| ControlParams::Unreadable { reason }),
        1 => prop_oneof![
            Just(ControlParams::NotDecoded),
            Just(ControlParams::Schedule { enable: true, skip_submit: false, skip_enable: false }),
            Just(ControlParams::WorkSubmitToken { token: 0x0001_0005 }),
            Just(ControlParams::TsgInfo { tsg_id: 3 }),
        ],
    ]
    .boxed()
}

fn malformed_reason() -> impl Strategy<Value = MalformedReason> {
    prop_oneof![
        Just(MalformedReason::XferReadFailed),
        Just(MalformedReason::XferOversize),
        Just(MalformedReason::BadSize),
        Just(MalformedReason::ParamsReadFailed),
        Just(MalformedReason::ShortParams),
        Just(MalformedReason::UnknownEscape),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let pid = 0..PIDS.len();
    let obj = 0..OBJECTS.len();
    let cl = 0..CLIENTS.len();
    prop_oneof![
        8 => (pid.clone(), 0..FDS.len(), cl.clone(), 0..OBJECTS.len() + 1, obj.clone(), alloc_kind(), outcome())
            .prop_flat_map(|(pid, fd, client, parent, handle, kind, (errno, status))| {
                alloc_params(kind).prop_map(move |params| Op::Alloc { pid, fd, client, parent, handle, kind, errno, status, params })
            }),
        8 => (pid.clone(), cl.clone(), obj.clone(), ctl_kind(), outcome()).prop_flat_map(|(pid, client, object, kind, (errno, status))| {
            ctl_params(kind).prop_map(move |params| Op::Control { pid, client, object, kind, errno, status, params })
        }),
        3 => (pid.clone(), cl, 0..OBJECTS.len() + 1, outcome())
            .prop_map(|(pid, client, object, (errno, status))| Op::Free { pid, client, object, errno, status }),
        1 => (pid.clone(), 0..FDS.len()).prop_map(|(pid, fd)| Op::Close { pid, fd }),
        1 => pid.clone().prop_map(|pid| Op::Exit { pid }),
        1 => (pid, malformed_reason()).prop_map(|(pid, reason)| Op::Malformed { pid, reason }),
    ]
}

/// The object index `OBJECTS.len()` stands for the client handle itself (free of the client,
/// device parented to the client).
fn object(client: u32, i: usize) -> u32 {
    OBJECTS.get(i).copied().unwrap_or(client)
}

fn to_input(op: &Op, step: u64) -> (Origin, NvInput) {
    let (pid, input) = match *op {
        Op::Alloc {
            pid,
            fd,
            client,
            parent,
            handle,
            kind,
            errno,
            status,
            params,
        } => {
            let c = CLIENTS[client];
            let (class, handle) = match kind {
                AllocKind::Client => (class::NV01_ROOT_CLIENT, c),
                AllocKind::Device => (class::NV01_DEVICE_0, OBJECTS[handle]),
                AllocKind::Tsg => (class::KEPLER_CHANNEL_GROUP_A, OBJECTS[handle]),
                AllocKind::Channel => (class::HOPPER_CHANNEL_GPFIFO_A, OBJECTS[handle]),
                AllocKind::Other => (0x003E, OBJECTS[handle]),
            };
            let call = RmCall::Alloc {
                client: c,
                parent: object(c, parent),
                handle,
                class,
                status,
                nvos64: true,
                finn_serialized: matches!(
                    params,
                    AllocParams::Unreadable {
                        reason: Unreadable::FinnSerialized
                    }
                ),
                params,
            };
            (
                pid,
                NvInput::Call {
                    fd: FDS[fd],
                    errno,
                    call,
                },
            )
        }
        Op::Control {
            pid,
            client,
            object: o,
            kind,
            errno,
            status,
            params,
        } => {
            let command = match kind {
                CtlKind::TsgSchedule => cmd::TSG_GPFIFO_SCHEDULE,
                CtlKind::ChannelSchedule => cmd::CHANNEL_GPFIFO_SCHEDULE,
                CtlKind::Token => cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
                CtlKind::GetInfo => cmd::TSG_GET_INFO,
                CtlKind::SetTimeslice => cmd::TSG_SET_TIMESLICE,
                CtlKind::TsgInterleave => cmd::TSG_SET_INTERLEAVE_LEVEL,
                CtlKind::ChannelInterleave => cmd::CHANNEL_SET_INTERLEAVE_LEVEL,
                CtlKind::Preempt => cmd::TSG_PREEMPT,
                CtlKind::Unknown => 0x2080_0101,
            };
            let call = RmCall::Control {
                client: CLIENTS[client],
                object: OBJECTS[o],
                cmd: command,
                status,
                finn_serialized: matches!(
                    params,
                    ControlParams::Unreadable {
                        reason: Unreadable::FinnSerialized
                    }
                ),
                params,
            };
            (
                pid,
                NvInput::Call {
                    fd: FDS[0],
                    errno,
                    call,
                },
            )
        }
        Op::Free {
            pid,
            client,
            object: o,
            errno,
            status,
        } => {
            let c = CLIENTS[client];
            (
                pid,
                NvInput::Call {
                    fd: FDS[0],
                    errno,
                    call: RmCall::Free {
                        client: c,
                        parent: c,
                        object: object(c, o),
                        status,
                    },
                },
            )
        }
        Op::Close { pid, fd } => (pid, NvInput::FdClose { fd: FDS[fd] }),
        Op::Exit { pid } => (pid, NvInput::ProcessExit),
        Op::Malformed { pid, reason } => (
            pid,
            NvInput::Call {
                fd: FDS[0],
                errno: 0,
                call: RmCall::Malformed {
                    escape: 0x2B,
                    reason,
                },
            },
        ),
    };
    let p = PIDS[pid];
    // Threads with different names: the tid and comm vary with the step.
    let origin = Origin {
        ts_ns: 1_000 + step,
        cpu: (step % 2) as u32,
        pid: p,
        tid: p + (step % 3) as u32,
        comm: format!("thr{}", step % 3).into(),
    };
    (origin, input)
}

/// Every live TSG of process `pid`, by (client, handle).
fn live_of(t: &NvTracker, pid: u32) -> BTreeMap<(u32, u32), TaskSnapshot> {
    let mut out = BTreeMap::new();
    for &c in &CLIENTS {
        for &h in &OBJECTS {
            if let Some(s) = t.task(pid, c, h) {
                out.insert((c, h), s);
            }
        }
    }
    out
}

fn live_total(t: &NvTracker) -> usize {
    PIDS.iter().map(|&p| live_of(t, p).len()).sum()
}

fn ok(errno: i32, status: u32) -> bool {
    errno == 0 && status == status::NV_OK
}

/// `task` names an object this tracer never saw created (late attach, a TSG shared from another
/// process) and is no live TSG of client `c`.
fn not_ours<V>(before: &BTreeMap<(u32, u32), V>, c: u32, task: TaskId) -> bool {
    match task {
        TaskId::PreTrace(h) | TaskId::Shared(h) => !before.contains_key(&(c, h)),
        _ => false,
    }
}

/// Runs the ops, checking the invariants after each; returns a description of the first
/// violation.
fn check(ops: &[Op]) -> Result<(), String> {
    check_with(ops, |_, _| {})
}

/// [`check`], with the tracker's events passed through `plant` (step, events) before they are
/// checked: the checker's own tests plant a bug there (an event lost, doubled or altered) and
/// assert that the checker reports it.
fn check_with(ops: &[Op], mut plant: impl FnMut(usize, &mut Vec<Event>)) -> Result<(), String> {
    let mut t = NvTracker::new();
    let mut inits: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut destroys: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut calls_in = 0u64;
    for (step, op) in ops.iter().enumerate() {
        let (origin, input) = to_input(op, step as u64);
        let pid = origin.pid;
        let before = live_of(&t, pid);
        let live_before = t.live_tasks();
        let counters_before = t.counters().clone();
        if matches!(input, NvInput::Call { .. }) {
            calls_in += 1;
        }
        let pretrace_before = t.is_pretrace(pid);
        let mut events = t.observe(origin.clone(), input.clone());
        plant(step, &mut events);
        let pretrace_after = t.is_pretrace(pid);
        // Late attach: PRETRACE_END, at most one per input, only in a process that holds objects
        // made before tracing, never with a TSG count, and with the cause of the input.
        let (pre_ends, events): (Vec<Event>, Vec<Event>) = events
            .into_iter()
            .partition(|e| matches!(e.kind, EventKind::PretraceEnd { .. }));
        if let Some(e) = pre_ends.first() {
            let fits = match (op, &e.kind) {
                (
                    Op::Free {
                        client, object: o, ..
                    },
                    EventKind::PretraceEnd {
                        client: Some(ec),
                        fd: None,
                        cause: DestroyCause::ParentFree,
                        tsgs: None,
                    },
                ) => {
                    pretrace_after
                        && object(CLIENTS[*client], *o) == CLIENTS[*client]
                        && *ec == CLIENTS[*client]
                }
                (
                    Op::Close { fd, .. },
                    EventKind::PretraceEnd {
                        client: None,
                        fd: Some(efd),
                        cause: DestroyCause::FdClose,
                        tsgs: None,
                    },
                ) => pretrace_before && *efd == FDS[*fd],
                (
                    Op::Exit { .. },
                    EventKind::PretraceEnd {
                        client: None,
                        fd: None,
                        cause: DestroyCause::ProcessExit,
                        tsgs: None,
                    },
                ) => pretrace_before,
                _ => false,
            };
            if !fits || pre_ends.len() > 1 || e.origin != origin {
                return Err(format!(
                    "bad PRETRACE_END {pre_ends:?} for step {step}: {op:?}"
                ));
            }
        }
        let after = live_of(&t, pid);
        let counters = t.counters().clone();
        let ctx = || {
            format!(
                "step {step}: {op:?}\n  events: {events:#?}\n  before: {before:?}\n  after: {after:?}"
            )
        };

        // The tracker's own count agrees with what it answers per TSG.
        if t.live_tasks() != live_total(&t) {
            return Err(format!(
                "live_tasks() {} but {} TSGs answer task()\n{}",
                t.live_tasks(),
                live_total(&t),
                ctx()
            ));
        }
        for e in &events {
            if e.origin != origin {
                return Err(format!("event with another origin\n{}", ctx()));
            }
        }
        let count = |name: &str| events.iter().filter(|e| e.kind.name() == name).count();
        let (n_init, n_destroy) = (count("TASK_INIT"), count("TASK_DESTROY"));
        // Conservation: TSGs appear only with TASK_INIT and disappear with TASK_DESTROY, except
        // a handle reused while still alive (a missed free), which is counted.
        let expected = live_before + n_init;
        let now = t.live_tasks();
        if now + n_destroy > expected {
            return Err(format!(
                "live {live_before} → {now} with {n_init} TASK_INIT, {n_destroy} TASK_DESTROY\n{}",
                ctx()
            ));
        }
        if now + n_destroy < expected
            && counters.replaced_handles == counters_before.replaced_handles
        {
            return Err(format!(
                "TSGs vanished without TASK_DESTROY or a replaced-handle count\n{}",
                ctx()
            ));
        }
        // Counters only grow.
        for (name, a, b) in [
            ("calls", counters_before.calls, counters.calls),
            ("malformed", counters_before.malformed, counters.malformed),
            (
                "unknown_handle",
                counters_before.unknown_handle,
                counters.unknown_handle,
            ),
            (
                "replaced_handles",
                counters_before.replaced_handles,
                counters.replaced_handles,
            ),
        ] {
            if b < a {
                return Err(format!("counter {name} went down\n{}", ctx()));
            }
        }
        if counters.calls + counters.malformed != calls_in {
            return Err(format!(
                "calls {} + malformed {} != {calls_in} calls fed\n{}",
                counters.calls,
                counters.malformed,
                ctx()
            ));
        }

        // Every TASK_DESTROY names a TSG of this process that was alive and is not any more.
        let destroyed_ok = |e: &Event| match e.kind {
            EventKind::TaskDestroy { task, client, .. } => before
                .iter()
                .any(|(&(c, h), s)| c == client && s.task == task && !after.contains_key(&(c, h))),
            _ => true,
        };
        if let Some(e) = events.iter().find(|e| !destroyed_ok(e)) {
            return Err(format!(
                "TASK_DESTROY of a TSG that was not alive: {e:?}\n{}",
                ctx()
            ));
        }

        // Which inputs may produce which events.
        match op {
            Op::Malformed { .. } => {
                if !events.is_empty() {
                    return Err(format!("a malformed record produced events\n{}", ctx()));
                }
            }
            Op::Alloc {
                kind,
                errno,
                status,
                client,
                handle,
                ..
            } => {
                let want = usize::from(ok(*errno, *status) && matches!(kind, AllocKind::Tsg));
                if events.len() != want || n_init != want {
                    return Err(format!(
                        "alloc must give {want} TASK_INIT and nothing else\n{}",
                        ctx()
                    ));
                }
                if want == 1 {
                    let key = (CLIENTS[*client], OBJECTS[*handle]);
                    match after.get(&key) {
                        Some(s) if s.task == TaskId::RmHandle(key.1) && s.channels.is_empty() => {}
                        other => {
                            return Err(format!(
                                "new TSG {key:x?} not tracked as new: {other:?}\n{}",
                                ctx()
                            ));
                        }
                    }
                    match &events[0].kind {
                        EventKind::TaskInit { task, client, .. }
                            if *task == TaskId::RmHandle(key.1) && *client == key.0 => {}
                        k => return Err(format!("TASK_INIT names another TSG: {k:?}\n{}", ctx())),
                    }
                    *inits.entry((pid, key.0)).or_default() += 1;
                }
            }
            Op::Control {
                kind,
                errno,
                status,
                params,
                object: o,
                client,
                ..
            } => {
                let any_schedule = matches!(kind, CtlKind::TsgSchedule | CtlKind::ChannelSchedule)
                    && matches!(params, ControlParams::Schedule { .. });
                let sched =
                    any_schedule && matches!(params, ControlParams::Schedule { enable: true, .. });
                let token = matches!(kind, CtlKind::Token)
                    && ok(*errno, *status)
                    && matches!(params, ControlParams::WorkSubmitToken { .. });
                // Requests that change scheduling: one SCHED_UPDATE each, allowed or not.
                let param_update = matches!(
                    (kind, params),
                    (CtlKind::SetTimeslice, ControlParams::Timeslice { .. })
                        | (
                            CtlKind::TsgInterleave | CtlKind::ChannelInterleave,
                            ControlParams::Interleave { .. }
                        )
                        | (CtlKind::Preempt, ControlParams::Preempt { .. })
                );
                let c = CLIENTS[*client];
                let obj = OBJECTS[*o];
                // The TSG the request is about, as it stood before.
                let target = before.iter().find(|&(&(bc, h), s)| {
                    bc == c
                        && match kind {
                            CtlKind::ChannelSchedule | CtlKind::ChannelInterleave => {
                                s.channels.contains(&obj)
                            }
                            _ => h == obj,
                        }
                });
                let disabled_before =
                    target.is_some_and(|(_, s)| s.sched.run_state == RunState::Disabled);
                let want_updates =
                    usize::from(param_update || (any_schedule && (!sched || disabled_before)));
                let updates: Vec<&Event> = events
                    .iter()
                    .filter(|e| e.kind.name() == "SCHED_UPDATE")
                    .collect();
                if updates.len() != want_updates {
                    return Err(format!(
                        "control must give {want_updates} SCHED_UPDATE\n{}",
                        ctx()
                    ));
                }
                for u in &updates {
                    let EventKind::SchedUpdate {
                        allowed,
                        client: uc,
                        change,
                        ..
                    } = &u.kind
                    else {
                        unreachable!()
                    };
                    if *allowed != ok(*errno, *status) || *uc != c {
                        return Err(format!("bad SCHED_UPDATE\n{}", ctx()));
                    }
                    // An accepted timeslice is the TSG's from then on.
                    if let (SchedChange::Timeslice { new_us, .. }, true, Some((k, _))) =
                        (change, *allowed, target)
                        && after.get(k).map(|s| s.sched.timeslice_us) != Some(Some(*new_us))
                    {
                        return Err(format!("timeslice not applied\n{}", ctx()));
                    }
                }
                let events: Vec<Event> = events
                    .iter()
                    .filter(|e| e.kind.name() != "SCHED_UPDATE")
                    .cloned()
                    .collect();
                // A schedule request whose bEnable could not be read and that failed with
                // EPERM (how `--deny-*` refuses what it cannot read): one refused SCHEDULE.
                let refused_unread =
                    matches!(kind, CtlKind::TsgSchedule | CtlKind::ChannelSchedule)
                        && !matches!(params, ControlParams::Schedule { .. })
                        && *errno == -1;
                let want = usize::from(sched || token || refused_unread);
                if events.len() != want {
                    return Err(format!("control must give {want} event(s)\n{}", ctx()));
                }
                if let Some(e) = events.first() {
                    match &e.kind {
                        EventKind::Schedule {
                            task,
                            client,
                            channels,
                            allowed,
                            ..
                        } => {
                            if !(sched || refused_unread)
                                || *allowed != ok(*errno, *status)
                                || *client != c
                            {
                                return Err(format!("bad SCHEDULE\n{}", ctx()));
                            }
                            // Known TSG: its channel count at that moment; unknown: the handle,
                            // or (late attach, shared TSGs) a handle that is no live TSG here.
                            let fits = match channels {
                                Some(n) => before.iter().any(|(&(bc, _), s)| {
                                    bc == c && s.task == *task && s.channels.len() == *n as usize
                                }),
                                None => {
                                    *task == TaskId::RmHandle(obj) || not_ours(&before, c, *task)
                                }
                            };
                            if !fits {
                                return Err(format!(
                                    "SCHEDULE does not match a live TSG\n{}",
                                    ctx()
                                ));
                            }
                        }
                        EventKind::WorkSubmit {
                            task,
                            channel_handle,
                            token: tok,
                            ..
                        } => {
                            let ControlParams::WorkSubmitToken { token: want_tok } = params else {
                                unreachable!()
                            };
                            let fits = *task == TaskId::RmHandle(obj)
                                || not_ours(&before, c, *task)
                                || before.iter().any(|(&(bc, _), s)| {
                                    bc == c && s.task == *task && s.channels.contains(&obj)
                                });
                            if !token || *channel_handle != obj || tok != want_tok || !fits {
                                return Err(format!("bad WORK_SUBMIT\n{}", ctx()));
                            }
                        }
                        _ => return Err(format!("control produced {}\n{}", e.kind.name(), ctx())),
                    }
                }
            }
            Op::Free {
                errno,
                status,
                client,
                ..
            } => {
                if !ok(*errno, *status) && !events.is_empty() {
                    return Err(format!("a failed free produced events\n{}", ctx()));
                }
                for e in &events {
                    match e.kind {
                        EventKind::TaskDestroy {
                            client: ec,
                            cause: DestroyCause::Free | DestroyCause::ParentFree,
                            implicit: false,
                            ..
                        } if ec == CLIENTS[*client] => {}
                        _ => return Err(format!("free produced {e:?}\n{}", ctx())),
                    }
                }
            }
            Op::Close { .. } => {
                for e in &events {
                    if !matches!(
                        e.kind,
                        EventKind::TaskDestroy {
                            cause: DestroyCause::FdClose,
                            implicit: true,
                            ..
                        }
                    ) {
                        return Err(format!("close produced {e:?}\n{}", ctx()));
                    }
                }
            }
            Op::Exit { .. } => {
                // Every TSG of the process ends, once, and nothing of it is left (PID reuse
                // starts from nothing).
                if !after.is_empty() || events.len() != before.len() {
                    return Err(format!(
                        "exit must end all {} TSGs of the process\n{}",
                        before.len(),
                        ctx()
                    ));
                }
                if events.iter().any(|e| {
                    !matches!(
                        e.kind,
                        EventKind::TaskDestroy {
                            cause: DestroyCause::ProcessExit,
                            implicit: true,
                            ..
                        }
                    )
                }) {
                    return Err(format!(
                        "exit produced something else than implicit TASK_DESTROYs\n{}",
                        ctx()
                    ));
                }
            }
        }
        for e in &events {
            if let EventKind::TaskDestroy { client, .. } = e.kind {
                let d = destroys.entry((pid, client)).or_default();
                *d += 1;
                if *d > inits.get(&(pid, client)).copied().unwrap_or(0) {
                    return Err(format!(
                        "more TASK_DESTROY than TASK_INIT for pid {pid} client {client:#x}\n{}",
                        ctx()
                    ));
                }
            }
        }
    }
    // (What is alive at the end: the tracker's unit tests list it, `finish`.)
    Ok(())
}

proptest! {
    #![proptest_config(config(2500))]

    #[test]
    fn tracker_invariants_hold_for_any_sequence(ops in prop::collection::vec(op(), 1..120)) {
        if let Err(why) = check(&ops) {
            prop_assert!(false, "{}", why);
        }
    }
}

/// A TSG alloc of `handle` (accepted), a schedule of the first TSG, the exit of the process.
fn known_good_ops() -> Vec<Op> {
    let tsg = |handle| Op::Alloc {
        pid: 0,
        fd: 0,
        client: 0,
        parent: 0,
        handle,
        kind: AllocKind::Tsg,
        errno: 0,
        status: 0,
        params: AllocParams::Tsg {
            h_object_error: 0,
            h_vaspace: 0,
            engine_type: 1,
        },
    };
    vec![
        tsg(1),
        tsg(1),
        Op::Control {
            pid: 0,
            client: 0,
            object: 1,
            kind: CtlKind::TsgSchedule,
            errno: 0,
            status: 0,
            params: ControlParams::Schedule {
                enable: true,
                skip_submit: false,
                skip_enable: false,
            },
        },
        Op::Exit { pid: 0 },
    ]
}

/// A sequence whose second TASK_INIT replaces a live TSG is accepted only because the tracker
/// counts the replaced handle.
#[test]
fn checker_accepts_a_known_good_sequence_and_counts_replacements() {
    let ops = known_good_ops();
    check(&ops).unwrap();
    let mut t = NvTracker::new();
    for (i, op) in ops.iter().take(2).enumerate() {
        let (o, input) = to_input(op, i as u64);
        t.observe(o, input);
    }
    assert_eq!(t.counters().replaced_handles, 1);
    assert_eq!(t.live_tasks(), 1);
}

/// The checker can fail: each planted bug in the tracker's output (on the known-good sequence:
/// steps 0 and 1 TSG allocs of the same handle, step 2 its schedule, step 3 the exit) is
/// reported, with the violation it is.
#[test]
fn checker_reports_each_planted_bug() {
    let ops = known_good_ops();
    type Plant = fn(usize, &mut Vec<Event>);
    let cases: [(&str, Plant, &str); 7] = [
        (
            "the TASK_INIT of an accepted TSG alloc is lost",
            |step, evs| {
                if step == 0 {
                    evs.clear();
                }
            },
            "live 0 → 1 with 0 TASK_INIT",
        ),
        (
            "a refused-looking SCHEDULE for an accepted request",
            |step, evs| {
                if step == 2
                    && let EventKind::Schedule { allowed, .. } = &mut evs[0].kind
                {
                    *allowed = false;
                }
            },
            "bad SCHEDULE",
        ),
        (
            "the SCHEDULE names another client",
            |step, evs| {
                if step == 2
                    && let EventKind::Schedule { client, .. } = &mut evs[0].kind
                {
                    *client ^= 1;
                }
            },
            "bad SCHEDULE",
        ),
        (
            "an event carries another process's origin",
            |step, evs| {
                if step == 2 {
                    evs[0].origin.pid += 1;
                }
            },
            "event with another origin",
        ),
        (
            "the exit's TASK_DESTROY is doubled",
            |step, evs| {
                if step == 3 {
                    let e = evs[0].clone();
                    evs.push(e);
                }
            },
            "TASK_DESTROY",
        ),
        (
            "the exit's TASK_DESTROY is lost",
            |step, evs| {
                if step == 3 {
                    evs.clear();
                }
            },
            "TSGs vanished without TASK_DESTROY",
        ),
        (
            "the schedule is reported twice",
            |step, evs| {
                if step == 2 {
                    let e = evs[0].clone();
                    evs.push(e);
                }
            },
            "control must give 1 event",
        ),
    ];
    let mut wrong = Vec::new();
    for (what, plant, want) in cases {
        match check_with(&ops, plant) {
            Ok(()) => wrong.push(format!("{what}: the checker accepted it")),
            Err(why) if !why.contains(want) => wrong.push(format!(
                "{what}: reported as {}",
                why.lines().next().unwrap()
            )),
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Distinct handles used by the generator are really distinct (else collisions would be all the
/// fuzzer tests).
#[test]
fn handle_space_is_small_but_distinct() {
    let all: BTreeSet<u32> = OBJECTS.iter().chain(CLIENTS.iter()).copied().collect();
    assert_eq!(all.len(), OBJECTS.len() + CLIENTS.len());
}

/// Found by the fuzzer (seed in tests/corpus/fuzz_model.txt): a channel recorded under a handle
/// that later becomes a new TSG's (its first owner was never seen as a TSG, e.g. created before
/// tracing) was counted as the new TSG's: its work-submit token was reported for the new TSG,
/// and set that TSG's runlist.
#[test]
fn a_channel_left_from_an_earlier_object_is_not_given_to_a_new_tsg() {
    let ops = [
        // A channel under 0x5C000001, which this tracer never saw created.
        Op::Alloc {
            pid: 0,
            fd: 0,
            client: 0,
            parent: 0,
            handle: 4,
            kind: AllocKind::Channel,
            errno: 0,
            status: 0,
            params: AllocParams::Channel {
                h_object_error: 0,
                gpfifo_entries: 8,
                flags: 0,
                h_context_share: 0,
                h_vaspace: 0,
                engine_type: 1,
                cid: 0,
            },
        },
        // A new TSG gets the handle 0x5C000001.
        Op::Alloc {
            pid: 0,
            fd: 0,
            client: 0,
            parent: 1,
            handle: 0,
            kind: AllocKind::Tsg,
            errno: 0,
            status: 0,
            params: AllocParams::NotDecoded,
        },
        // The old channel's token.
        Op::Control {
            pid: 0,
            client: 0,
            object: 4,
            kind: CtlKind::Token,
            errno: 0,
            status: 0,
            params: ControlParams::WorkSubmitToken { token: 0x0003_0007 },
        },
    ];
    let mut t = NvTracker::new();
    let mut evs = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let (o, input) = to_input(op, i as u64);
        evs = t.observe(o, input);
    }
    match &evs[..] {
        [e] => match e.kind {
            EventKind::WorkSubmit {
                task,
                channel_handle,
                ..
            } => {
                assert_eq!(channel_handle, OBJECTS[4]);
                // Client 0 was never seen allocated: the channel predates tracing.
                assert_eq!(
                    task,
                    TaskId::PreTrace(OBJECTS[4]),
                    "reported under the channel, not the new TSG"
                );
            }
            ref k => panic!("{k:?}"),
        },
        other => panic!("{other:?}"),
    }
    let tsg = t.task(PIDS[0], CLIENTS[0], OBJECTS[0]).unwrap();
    assert_eq!(
        (tsg.sched.runlist, tsg.channels.len()),
        (None, 0),
        "the new TSG is untouched"
    );
    check(&ops).unwrap();
}
