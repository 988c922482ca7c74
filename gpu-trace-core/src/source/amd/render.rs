//! How an AMD KFD event renders its detail ([`AmdDetail`]): its text fields in place of the
//! kind's (the TSG column holds the queue id), its JSON `amd` object, and its GPU numbering
//! (the KFD `gpu_id`, written as it is: no `rm_device`, no nvidia-smi index).

use std::fmt::Write as _;

use crate::event::{AmdDetail, AmdQueueType, AmdVia, EventKind, GpuNumbering, SchedChange};
use crate::event_fields::{Errno, Opt, write_change, write_fields};
use crate::section::{Section, field};

impl AmdDetail {
    /// An AMD event's `gpu` is the KFD `gpu_id` as the driver gave it.
    #[inline]
    pub fn gpu_numbering(&self) -> GpuNumbering {
        GpuNumbering::Driver
    }
}

/// The fields of an AMD event: its kind's as the detail spells them.
pub struct AmdFields<'a> {
    kind: &'a EventKind,
    detail: &'a AmdDetail,
}

impl<'a> AmdFields<'a> {
    #[inline]
    pub fn new(kind: &'a EventKind, detail: &'a AmdDetail) -> Self {
        Self { kind, detail }
    }
}

impl Section for AmdFields<'_> {
    fn text(&self, line: &mut String) {
        write_text(line, self.kind, self.detail);
    }

    /// The `amd` object (the kind's own fields and `gpu` come before it).
    fn json(&self, out: &mut Vec<u8>) {
        field(out, "amd", self.detail);
    }
}

/// The fields of an AMD KFD event (the TSG column holds the queue id):
///
/// ```text
/// TASK_INIT    … TSG=2    type=COMPUTE_AQL priority=7 percent=100 ring=1048576 gpu=48879 doorbell=0xefbbc00000000010
/// WORK_SUBMIT  … TSG=2    doorbell=0xefbbc00000000010 offset=16 gpu=48879
/// SCHEDULE     … TSG=2    via=create type=COMPUTE_AQL priority=7 percent=100 ring=1048576 gpu=48879 active=yes allowed=yes
/// SCHEDULE     … TSG=?    via=create type=COMPUTE_AQL priority=7 percent=100 ring=1048576 gpu=48879 active=yes allowed=no errno=EINVAL
/// SCHED_UPDATE … TSG=2    via=update priority=7 -> 2 percent=100 -> 30 ring=4096 active=yes allowed=yes
/// SCHED_UPDATE … TSG=2    via=cu_mask cu_mask=? -> 64 priority=2 percent=30 ring=4096 active=yes allowed=yes
/// TASK_DESTROY … TSG=2    cause=free
/// ```
///
/// `TASK_INIT` adds `xcc=N` when `pm4_target_xcc` is not 0 and `sdma_engine=N` for
/// `SDMA_BY_ENG_ID` queues, and, where the deep hooks ran, `hw_doorbell=`, `vmid=`,
/// `driver_active=` and `mqd_init=` (what only the driver's own functions show).
/// `TASK_DESTROY` prints as for NVIDIA.
fn write_text(line: &mut String, kind: &EventKind, a: &AmdDetail) {
    match kind {
        EventKind::TaskInit { .. } => write_task_init(line, a),
        EventKind::WorkSubmit { token, .. } => {
            let _ = write!(
                line,
                "doorbell={} offset={token} gpu={}",
                hex(a.doorbell_offset),
                Opt(a.gpu_id)
            );
        }
        EventKind::Schedule { allowed, errno, .. }
        | EventKind::SchedUpdate { allowed, errno, .. } => {
            write_request(line, kind, a);
            let active = a.active.map(|v| if v { "yes" } else { "no" });
            let _ = write!(
                line,
                " active={} allowed={}",
                Opt(active),
                if *allowed { "yes" } else { "no" }
            );
            if !*allowed && *errno != 0 {
                let _ = write!(line, " errno={}", Errno(*errno));
            }
        }
        EventKind::TaskDestroy { .. }
        | EventKind::PretraceEnd { .. }
        | EventKind::MpsShared { .. } => write_fields(line, kind, None),
    }
}

/// `0xN`, or `?`.
fn hex(v: Option<u64>) -> String {
    v.map_or_else(|| "?".to_string(), |v| format!("0x{v:x}"))
}

/// The queue's type, or `?`.
fn queue_type(a: &AmdDetail) -> &'static str {
    a.queue_type.map_or("?", amd_queue_type_name)
}

/// `priority=P percent=N ring=R`.
fn write_params(line: &mut String, a: &AmdDetail) {
    let _ = write!(
        line,
        "priority={} percent={} ring={}",
        Opt(a.priority),
        Opt(a.percentage),
        Opt(a.ring_size)
    );
}

/// `TASK_INIT`'s fields ([`write_text`]).
fn write_task_init(line: &mut String, a: &AmdDetail) {
    let _ = write!(line, "type={} ", queue_type(a));
    write_params(line, a);
    let _ = write!(
        line,
        " gpu={} doorbell={}",
        Opt(a.gpu_id),
        hex(a.doorbell_offset)
    );
    if let Some(xcc) = a.pm4_target_xcc.filter(|&x| x != 0) {
        let _ = write!(line, " xcc={xcc}");
    }
    if a.queue_type == Some(AmdQueueType::SdmaByEngId) {
        let _ = write!(line, " sdma_engine={}", Opt(a.sdma_engine_id));
    }
    // What only the deep hooks see, when they ran.
    if let Some(db) = a.hw_doorbell {
        let _ = write!(line, " hw_doorbell={db}");
    }
    if let Some(vmid) = a.vmid {
        let _ = write!(line, " vmid={vmid}");
    }
    if let Some(active) = a.driver_active {
        let _ = write!(line, " driver_active={}", if active { "yes" } else { "no" });
    }
    if let Some(addr) = a.mqd_init_addr {
        let _ = write!(line, " mqd_init=0x{addr:x}");
    }
}

/// A `SCHEDULE`'s or `SCHED_UPDATE`'s request: `via=…` and what it asks ([`write_text`]; the
/// verdict follows).
fn write_request(line: &mut String, kind: &EventKind, a: &AmdDetail) {
    match (kind, a.via) {
        (
            EventKind::SchedUpdate {
                change: change @ SchedChange::AmdQueue { .. },
                ..
            },
            _,
        ) => {
            line.push_str("via=update ");
            write_change(line, change);
            let _ = write!(line, " ring={}", Opt(a.ring_size));
        }
        (EventKind::SchedUpdate { change, .. }, _) => {
            line.push_str("via=cu_mask ");
            write_change(line, change);
            line.push(' ');
            write_params(line, a);
        }
        (_, Some(AmdVia::Create)) => {
            let _ = write!(line, "via=create type={} ", queue_type(a));
            write_params(line, a);
            let _ = write!(line, " gpu={}", Opt(a.gpu_id));
        }
        // An UPDATE_QUEUE that made a queue created inactive active.
        _ => {
            line.push_str("via=update ");
            write_params(line, a);
        }
    }
}

fn amd_queue_type_name(t: AmdQueueType) -> &'static str {
    match t {
        AmdQueueType::Compute => "COMPUTE",
        AmdQueueType::ComputeAql => "COMPUTE_AQL",
        AmdQueueType::Sdma => "SDMA",
        AmdQueueType::SdmaXgmi => "SDMA_XGMI",
        AmdQueueType::SdmaByEngId => "SDMA_BY_ENG_ID",
        AmdQueueType::Unknown => "UNKNOWN",
    }
}
