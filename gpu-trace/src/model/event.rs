//! The events gpu-trace reports, vendor-neutral. Produced by the trackers in `model`, consumed
//! by `output`. A field a backend cannot know is `None` and is printed as `?`.

use serde::Serialize;

/// Where an event happened: the calling thread at the time of the driver call.
///
/// Serializes as `ts_ns`, `cpu`, `pid`, `tid`, `comm` (UTF-8, bytes that are not UTF-8 as
/// U+FFFD) and, only where that is not the exact name, `comm_bytes` (the bytes as an array).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    pub cpu: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name (`comm`) of the caller, every byte kept: print it through
    /// [`crate::output::escape`], never raw.
    pub comm: String,
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use crate::output::escape;
        use serde::ser::SerializeStruct as _;
        let exact = escape::is_exact(&self.comm);
        let mut st = s.serialize_struct("Origin", if exact { 5 } else { 6 })?;
        st.serialize_field("ts_ns", &self.ts_ns)?;
        st.serialize_field("cpu", &self.cpu)?;
        st.serialize_field("pid", &self.pid)?;
        st.serialize_field("tid", &self.tid)?;
        st.serialize_field("comm", &escape::lossy(&self.comm))?;
        if !exact {
            st.serialize_field("comm_bytes", &escape::raw_bytes(&self.comm))?;
        }
        st.end()
    }
}

/// How a task (TSG / KFD queue) is identified in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum TaskId {
    /// Hardware TSG id (from `NVA06C_CTRL_CMD_GET_INFO` when the process asked for it, or from a
    /// gpu_ext-patched driver's scheduling hooks).
    HwTsg(u32),
    /// The RM object handle of the TSG (what the ioctl layer always knows).
    RmHandle(u32),
    /// AMD KFD queue id.
    KfdQueue(u32),
    /// AMD: a `CREATE_QUEUE` the driver refused, so no queue id exists (printed as `?`).
    KfdNoQueue,
}

/// Engine a TSG was created for (NV2080_ENGINE_TYPE_* of the alloc parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Engine {
    Graphics,
    Copy,
    Nvdec,
    Nvenc,
    Nvjpeg,
    Ofa,
    Sec2,
    Other,
}

/// NVIDIA interleave level (`NVA06C_CTRL_INTERLEAVE_LEVEL_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Interleave {
    Low,
    Medium,
    High,
}

/// Where a value came from: seen in this process's own driver calls, or the driver's documented
/// default for an object that was never told otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueSource {
    Observed,
    DriverDefault,
}

/// Why a task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DestroyCause {
    /// `RM_FREE` of the TSG itself.
    Free,
    /// `RM_FREE` of an ancestor (device or client) that took the TSG with it.
    ParentFree,
    /// Implicit: the process closed the fd its RM client was allocated on.
    FdClose,
    /// Implicit: the process exited with the object still alive.
    ProcessExit,
    /// Implicit: the tracer ended while the object was alive (only in the statistics, never
    /// printed as an event).
    TracerExit,
    /// AMD: the driver tore down the process's queues (`pqm_uninit`, seen by a deep hook):
    /// observed, not inferred.
    KfdRelease,
}

impl DestroyCause {
    pub fn is_implicit(self) -> bool {
        matches!(self, Self::FdClose | Self::ProcessExit | Self::TracerExit)
    }
}

/// One reported event.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    #[serde(flatten)]
    pub origin: Origin,
    #[serde(flatten)]
    pub kind: EventKind,
    /// AMD KFD events only: the queue's properties. `None` for NVIDIA events, whose text and
    /// JSON lines do not change. Rendered after the common fields (text) and as an `amd`
    /// object (JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amd: Option<AmdDetail>,
}

/// AMD KFD queue type (`KFD_IOC_QUEUE_TYPE_*` of `CREATE_QUEUE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AmdQueueType {
    /// PM4 compute queue.
    Compute,
    /// AQL compute queue (HIP/HSA dispatch queues).
    ComputeAql,
    /// SDMA (copy) queue.
    Sdma,
    /// SDMA queue on an XGMI engine.
    SdmaXgmi,
    /// SDMA queue on the engine named by `sdma_engine_id`.
    SdmaByEngId,
    /// A value this tracer does not know (the driver refuses it).
    Unknown,
}

/// Which KFD call a `SCHEDULE` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AmdVia {
    /// `CREATE_QUEUE` (the queue is created active, or the driver refused it).
    Create,
    /// `UPDATE_QUEUE` (ring, percentage, priority).
    Update,
    /// `SET_CU_MASK`.
    CuMask,
}

/// What the ioctl layer knows of an AMD KFD queue at the time of an event. A field is `None`
/// when it was not seen (e.g. a queue created before tracing started).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AmdDetail {
    /// `SCHEDULE` only: the call that produced it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<AmdVia>,
    pub queue_type: Option<AmdQueueType>,
    /// The raw `queue_type` value.
    pub queue_type_raw: Option<u32>,
    /// 0..=15 (the driver maps 0–6 / 7–10 / 11–15 to low / medium / high pipe priority).
    pub priority: Option<u32>,
    /// Queue percentage (bits 7:0 of `queue_percentage`); 0 makes the queue inactive.
    pub percentage: Option<u32>,
    /// `pm4_target_xcc` (bits 15:8 of `queue_percentage`).
    pub pm4_target_xcc: Option<u32>,
    /// Ring size in bytes (after the driver's clamp to at least 1024).
    pub ring_size: Option<u32>,
    /// Whether the driver treats the queue as active as far as these arguments go (ring
    /// address and size and percentage non-zero; eviction and suspension are not visible here).
    pub active: Option<bool>,
    /// KFD `gpu_id` (`/sys/class/kfd/kfd/topology/nodes/*/gpu_id`).
    pub gpu_id: Option<u32>,
    /// `doorbell_offset` returned by `CREATE_QUEUE`: the mmap offset of the queue's doorbell.
    pub doorbell_offset: Option<u64>,
    /// `sdma_engine_id` (96-byte `CREATE_QUEUE` only).
    pub sdma_engine_id: Option<u32>,
    /// `SET_CU_MASK`: number of CU mask bits the process set.
    pub cu_mask_bits: Option<u32>,
    /// Deep hook (the DQM's `create_queue_*`): the doorbell's absolute dword index in the doorbell BAR.
    pub hw_doorbell: Option<u32>,
    /// Deep hook (the DQM's `create_queue_*`): the VMID the driver gave the queue (0 until the
    /// hardware scheduler maps the process).
    pub vmid: Option<u32>,
    /// Deep hook (the DQM's `create_queue_*`): whether the driver itself made the queue active (its
    /// own `is_active`, which also reflects eviction and suspension).
    pub driver_active: Option<bool>,
    /// Deep hook (`init_mqd`): address of the `init_mqd` copy (one per GPU generation) that
    /// built the queue's hardware descriptor.
    pub mqd_init_addr: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventKind {
    /// A TSG / queue was created (the driver accepted the allocation).
    TaskInit {
        task: TaskId,
        /// RM client handle (NVIDIA) or 0.
        client: u32,
        engine: Option<Engine>,
        /// Raw engine type value from the alloc parameters.
        engine_type: Option<u32>,
        timeslice_us: Option<u64>,
        timeslice_source: ValueSource,
        interleave: Option<Interleave>,
        interleave_source: ValueSource,
        runlist: Option<u32>,
        /// GPU index (NVIDIA `deviceId` of the parent device object), when seen.
        gpu: Option<u32>,
    },
    /// The task was put on the runlist / made active: the admission point.
    Schedule {
        task: TaskId,
        client: u32,
        /// Channels of the TSG known at this moment.
        channels: Option<u32>,
        timeslice_us: Option<u64>,
        interleave: Option<Interleave>,
        /// The driver accepted the request (RM status NV_OK and the syscall succeeded).
        allowed: bool,
        /// RM status code returned (0 = NV_OK); `None` when the syscall itself failed.
        rm_status: Option<u32>,
        /// Negative errno of the ioctl syscall (0 on success), e.g. -EPERM when denied.
        errno: i32,
        /// The request came as a channel-level schedule (`NVA06F`) rather than a TSG one.
        via_channel: bool,
    },
    /// A work-submit token was handed out (NVIDIA) / a doorbell assigned (AMD).
    WorkSubmit {
        task: TaskId,
        client: u32,
        /// RM handle of the channel.
        channel_handle: u32,
        /// Hardware channel id decoded from the token.
        chid: Option<u32>,
        runlist: Option<u32>,
        token: u32,
        gpu: Option<u32>,
    },
    /// The task ended.
    TaskDestroy {
        task: TaskId,
        client: u32,
        cause: DestroyCause,
        implicit: bool,
    },
}

impl EventKind {
    /// The name printed in the text output.
    pub fn name(&self) -> &'static str {
        match self {
            Self::TaskInit { .. } => "TASK_INIT",
            Self::Schedule { .. } => "SCHEDULE",
            Self::WorkSubmit { .. } => "WORK_SUBMIT",
            Self::TaskDestroy { .. } => "TASK_DESTROY",
        }
    }

    pub fn task(&self) -> TaskId {
        match self {
            Self::TaskInit { task, .. }
            | Self::Schedule { task, .. }
            | Self::WorkSubmit { task, .. }
            | Self::TaskDestroy { task, .. } => *task,
        }
    }
}
