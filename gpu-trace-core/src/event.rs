//! The events gpu-trace reports, vendor-neutral. Produced by the trackers in `model`, consumed
//! by `output`. A field a backend cannot know is `None` and is printed as `?`.

use compact_str::CompactString;
use serde::Serialize;

/// CLOCK_MONOTONIC now, in ns (the clock of `bpf_ktime_get_ns`, so of [`Origin::ts_ns`]); 0 if
/// it cannot be read. The one reading of it for every record, recording and label userspace
/// times.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Where an event happened: the calling thread at the time of the driver call.
///
/// Serializes as `ts_ns`, `cpu`, `pid`, `tid`, `comm` (UTF-8, bytes that are not UTF-8 as
/// U+FFFD) and, only where that is not the exact name, `comm_bytes` (the bytes as an array).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// The CPU the thread ran on; [`Origin::NO_CPU`] for a record userspace made about a
    /// process (an interposer's verdict, a stuck call): text `[CPU??]`, JSON `null`.
    pub cpu: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name (`comm`) of the caller, every byte kept: print it as [`Origin::comm`]
    /// (a [`Comm`], which escapes itself), never raw.
    pub comm: CompactString,
}

impl Origin {
    /// [`Origin::cpu`] of a record no thread made on a CPU.
    pub const NO_CPU: u32 = u32::MAX;

    /// The origin of a record userspace makes now about process `pid`'s thread `tid` (an
    /// interposer's verdict, a hand-out, a stuck call): no CPU (`[CPU??]`, JSON `null`),
    /// stamped with CLOCK_MONOTONIC now. The one constructor for both commands.
    pub fn made_here(pid: u32, tid: u32, comm: &str) -> Self {
        Self {
            ts_ns: monotonic_ns(),
            cpu: Self::NO_CPU,
            pid,
            tid,
            comm: comm.into(),
        }
    }

    /// The CPU, `None` for [`Origin::NO_CPU`].
    pub fn cpu(&self) -> Option<u32> {
        (self.cpu != Self::NO_CPU).then_some(self.cpu)
    }

    /// The caller's thread name, as an untrusted [`Comm`].
    pub fn comm(&self) -> Comm<'_> {
        Comm(&self.comm)
    }
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let comm = self.comm().json();
        let mut st = s.serialize_struct("Origin", 5 + usize::from(comm.comm_bytes.is_some()))?;
        st.serialize_field("ts_ns", &self.ts_ns)?;
        st.serialize_field("cpu", &self.cpu())?;
        st.serialize_field("pid", &self.pid)?;
        st.serialize_field("tid", &self.tid)?;
        st.serialize_field("comm", &comm.comm)?;
        if let Some(bytes) = &comm.comm_bytes {
            st.serialize_field("comm_bytes", bytes)?;
        }
        st.end()
    }
}

/// A name a traced process chose (its thread or process name, `comm`), every byte kept
/// ([`crate::escape::decode_lossless`]): untrusted, so it is never written raw. It shows itself
/// text-safe (`Display`: [`crate::escape::escape_text`], honouring width and alignment) and as
/// JSON fields ([`Comm::json`]: `comm` lossy, and `comm_bytes` where that is not exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm<'a>(pub &'a str);

impl<'a> Comm<'a> {
    /// The JSON fields of the name: `comm` (UTF-8, U+FFFD for a byte that was not) and, only
    /// where that is not the exact name, `comm_bytes` (the bytes).
    pub fn json(self) -> CommFields<'a> {
        let exact = crate::escape::is_exact(self.0);
        CommFields {
            comm: crate::escape::lossy(self.0),
            comm_bytes: (!exact).then(|| crate::escape::raw_bytes(self.0)),
        }
    }
}

impl std::fmt::Display for Comm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&crate::escape::escape_text(self.0))
    }
}

/// [`Comm::json`]: serializes as `comm` and, where not exact, `comm_bytes` (flatten it into a
/// line).
#[derive(Clone, Debug, Serialize)]
pub struct CommFields<'a> {
    pub comm: std::borrow::Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm_bytes: Option<std::borrow::Cow<'a, [u8]>>,
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
    /// Late attach: the RM handle of a TSG (or, when even the channel is unknown, of the
    /// channel) this tracer never saw created, in a process whose RM client was made before
    /// tracing started. Printed like [`RmHandle`](Self::RmHandle) plus `[pre-trace]`.
    PreTrace(u32),
    /// The RM handle of a TSG this process never created although its RM client was seen made:
    /// one shared into it by another process (the MPS server's TSG under MPS, CUDA IPC).
    /// Printed like [`RmHandle`](Self::RmHandle) plus `[shared]`.
    Shared(u32),
    /// No single task: [`EventKind::PretraceEnd`] (printed as `?`).
    Unknown,
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

/// Where a value came from: seen in this process's own driver calls, the driver's documented
/// default for an object that was never told otherwise, or read by a deep hook inside the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueSource {
    /// The process's own call: an accepted `SET_*` request, or what a `GET_*` returned.
    Observed,
    /// The driver's default for a new object; no call changed it since.
    DriverDefault,
    /// Reported by a gpu_ext scheduling hook inside the driver (what RM itself holds).
    DriverHook,
}

/// The identity of one task (TSG / KFD queue) that is unique within a run: its process, its RM
/// client (NVIDIA), its RM handle (NVIDIA) or queue id (AMD), and a generation that counts the
/// tasks this run saw created with the same three (1 for the first). Printed as
/// `PID:0xCLIENT:0xHANDLE` (NVIDIA) or `PID:kfd:QUEUE` (AMD), with `#N` appended from the
/// second generation on: see [`TaskKey`]'s `Display`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskKey {
    /// Process id.
    pub pid: u32,
    /// RM client handle; `None` for AMD KFD queues.
    pub client: Option<u32>,
    /// RM handle of the TSG (NVIDIA) or KFD queue id (AMD).
    pub object: u32,
    /// 1 for the first task with these three in the run, 2 for the next, ...
    pub generation: u32,
}

impl std::fmt::Display for TaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.client {
            Some(c) => write!(f, "{}:0x{c:08x}:0x{:08x}", self.pid, self.object)?,
            None => write!(f, "{}:kfd:{}", self.pid, self.object)?,
        }
        if self.generation > 1 {
            write!(f, "#{}", self.generation)?;
        }
        Ok(())
    }
}

impl Serialize for TaskKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.text().as_str())
    }
}

impl TaskKey {
    /// The Display form written on the stack digit by digit (at most
    /// `PID:0xCLIENT:0xHANDLE#N`, 43 bytes), without `core::fmt`: digits, `0x`, hex letters,
    /// `:`, `kfd` and `#` only.
    pub fn text(&self) -> KeyText {
        let mut key = KeyText {
            buf: [0; 48],
            len: 0,
        };
        key.dec(self.pid);
        match self.client {
            Some(c) => {
                key.push(b":");
                key.push(&hex8(c));
                key.push(b":");
                key.push(&hex8(self.object));
            }
            None => {
                key.push(b":kfd:");
                key.dec(self.object);
            }
        }
        if self.generation > 1 {
            key.push(b"#");
            key.dec(self.generation);
        }
        key
    }
}

/// [`TaskKey`]'s text as it is built (ASCII only; 48 bytes hold the longest).
pub struct KeyText {
    buf: [u8; 48],
    len: usize,
}

impl KeyText {
    /// The bytes written (ASCII).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever pushed.
        std::str::from_utf8(self.as_bytes()).unwrap_or("?")
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn dec(&mut self, v: u32) {
        self.push(itoa::Buffer::new().format(v).as_bytes());
    }
}

/// `0x` and eight lowercase hex digits (`{v:#010x}`).
fn hex8(v: u32) -> [u8; 10] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = *b"0x00000000";
    for (i, b) in buf[2..].iter_mut().enumerate() {
        *b = HEX[((v >> (28 - 4 * i)) & 0xf) as usize];
    }
    buf
}

/// Whether a TSG is on the runlist as far as its `GPFIFO_SCHEDULE` requests go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// No accepted `GPFIFO_SCHEDULE` since the TSG was created.
    Unscheduled,
    /// Enabled (`bEnable=1` accepted).
    Enabled,
    /// Disabled and taken off the runlist (`bEnable=0` accepted).
    Disabled,
}

/// What a [`EventKind::SchedUpdate`] asks to change. `old` is the value the tracker held just
/// before the request (`None`: not known); `new` the value requested, which is the task's value
/// from then on only when the request was allowed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum SchedChange {
    /// NVIDIA `NVA06C_CTRL_CMD_SET_TIMESLICE`.
    Timeslice {
        old_us: Option<u64>,
        /// Where `old_us` came from (`None` when it is not known).
        old_source: Option<ValueSource>,
        new_us: u64,
    },
    /// NVIDIA `NVA06C` (TSG) or `NVA06F` (channel) `SET_INTERLEAVE_LEVEL`.
    Interleave {
        old: Option<Interleave>,
        old_source: Option<ValueSource>,
        /// `None` for a raw level outside 0..=2 (the driver refuses it).
        new: Option<Interleave>,
        /// The raw level requested.
        new_raw: u32,
    },
    /// NVIDIA `NVA06C_CTRL_CMD_PREEMPT`: the TSG is preempted off the engine (it stays on the
    /// runlist).
    Preempt {
        /// `bWait`: the call returns only once the preemption completed.
        wait: bool,
        /// `bManualTimeout`: `timeout_us` replaces the driver's preemption timeout.
        manual_timeout: bool,
        timeout_us: u32,
    },
    /// NVIDIA `GPFIFO_SCHEDULE` that disables the TSG (`bEnable=0`), or enables it again after a
    /// disable (the enable also prints its `SCHEDULE`).
    RunState {
        /// `None`: a TSG this tracer did not see created.
        old: Option<RunState>,
        new: RunState,
        skip_submit: bool,
        skip_enable: bool,
    },
    /// AMD `UPDATE_QUEUE`: priority and percentage (the `amd` detail holds the queue's
    /// parameters as the call leaves them).
    AmdQueue {
        old_priority: Option<u32>,
        new_priority: u32,
        old_percentage: Option<u32>,
        new_percentage: u32,
    },
    /// AMD `SET_CU_MASK`: the number of CU mask bits.
    CuMask {
        old_bits: Option<u32>,
        new_bits: u32,
    },
}

impl SchedChange {
    /// The name of the change in text and statistics (`timeslice`, `interleave`, `preempt`,
    /// `run_state`, `amd_queue`, `cu_mask`).
    pub fn what(&self) -> &'static str {
        match self {
            Self::Timeslice { .. } => "timeslice",
            Self::Interleave { .. } => "interleave",
            Self::Preempt { .. } => "preempt",
            Self::RunState { .. } => "run_state",
            Self::AmdQueue { .. } => "amd_queue",
            Self::CuMask { .. } => "cu_mask",
        }
    }
}

/// A TSG's scheduling parameters, each value with where it came from: the one group the model's
/// table keeps per TSG, its snapshots show and a `TASK_DESTROY` reports ([`FinalParams`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SchedParams {
    pub timeslice_us: Option<u64>,
    pub timeslice_source: ValueSource,
    pub interleave: Option<Interleave>,
    pub interleave_source: ValueSource,
    pub runlist: Option<u32>,
    /// Enabled / disabled by `GPFIFO_SCHEDULE`.
    pub run_state: RunState,
}

/// A TSG's scheduling parameters when it ended (NVIDIA `TASK_DESTROY`, JSON and statistics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalParams {
    pub sched: SchedParams,
    /// Channels of the TSG at its end.
    pub channels: u32,
}

/// JSON: the fields in the order the schema documents (docs/json-schema.md), `channels`
/// between the interleave and the runlist as before the group had a type of its own.
impl Serialize for FinalParams {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let p = &self.sched;
        let mut st = s.serialize_struct("FinalParams", 7)?;
        st.serialize_field("timeslice_us", &p.timeslice_us)?;
        st.serialize_field("timeslice_source", &p.timeslice_source)?;
        st.serialize_field("interleave", &p.interleave)?;
        st.serialize_field("interleave_source", &p.interleave_source)?;
        st.serialize_field("channels", &self.channels)?;
        st.serialize_field("runlist", &p.runlist)?;
        st.serialize_field("run_state", &p.run_state)?;
        st.end()
    }
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
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub origin: Origin,
    pub kind: EventKind,
    /// AMD KFD events only: the queue's properties. `None` for NVIDIA events, whose text and
    /// JSON lines do not change. Renders itself (`source::amd::render`): its text fields in
    /// place of the kind's, an `amd` object in JSON.
    pub amd: Option<AmdDetail>,
    /// The run-unique identity of the task ([`TaskKey`]); `None` where there is none (a refused
    /// AMD `CREATE_QUEUE`). JSON only.
    pub key: Option<TaskKey>,
    /// `gpu-trace --api`: the API call open on the thread when the driver call was made
    /// (`None` without `--api`, or outside any traced call: the lines do not change). Text
    /// `api=SYMBOL@LIBRARY<CALLER@LIBRARY` at the end, JSON an `api` object.
    pub api: Option<ApiOpen>,
}

/// One API call by name: a symbol of a library (its file name), as the traced process's maps
/// and the symbol table named them (untrusted: printed escaped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiCall {
    pub symbol: CompactString,
    pub library: CompactString,
}

impl Serialize for ApiCall {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("ApiCall", 2)?;
        st.serialize_field("symbol", &crate::escape::lossy(&self.symbol))?;
        st.serialize_field("library", &crate::escape::lossy(&self.library))?;
        st.end()
    }
}

impl std::fmt::Display for ApiCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}@{}",
            crate::escape::escape_text(&self.symbol),
            crate::escape::escape_text(&self.library)
        )
    }
}

/// The API calls open on a thread when it made a driver call ([`Event::api`]): the innermost
/// and the one outside it. JSON `{"symbol", "library", "depth", "caller"?}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiOpen {
    pub call: ApiCall,
    /// The call one level out, if any.
    pub caller: Option<ApiCall>,
    /// Calls open on the thread.
    pub depth: u32,
}

impl Serialize for ApiOpen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("ApiOpen", 4)?;
        st.serialize_field("symbol", &crate::escape::lossy(&self.call.symbol))?;
        st.serialize_field("library", &crate::escape::lossy(&self.call.library))?;
        st.serialize_field("depth", &self.depth)?;
        if let Some(c) = &self.caller {
            st.serialize_field("caller", c)?;
        }
        st.end()
    }
}

/// The section after a driver event's own fields: text ` api=SYMBOL@LIBRARY<CALLER@LIBRARY`,
/// JSON an `api` object.
impl crate::section::Section for ApiOpen {
    fn text(&self, line: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(line, "{self}");
    }

    fn json(&self, out: &mut Vec<u8>) {
        crate::section::field(out, "api", self);
    }
}

/// Text: ` api=SYMBOL@LIBRARY` and `<CALLER@LIBRARY` where there is one.
impl std::fmt::Display for ApiOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, " api={}", self.call)?;
        if let Some(c) = &self.caller {
            write!(f, "<{c}")?;
        }
        Ok(())
    }
}

/// Which number an event's `gpu` is: its vendor's choice ([`Event::gpu_numbering`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuNumbering {
    /// NVIDIA: RM's device instance, which the run maps to the GPU as nvidia-smi names it
    /// (JSON `gpu` the nvidia-smi index, `rm_device` the instance; `gpu_device`).
    RmDevice,
    /// The driver's own id, written as it is (AMD: the KFD `gpu_id`); no `rm_device`.
    Driver,
}

/// The engine an event's task runs on, whichever vendor names it: NVIDIA's engine (a
/// `TASK_INIT`'s) or AMD's queue type (every event of a queue). The statistics and the metrics
/// label by it ([`Event::engine`]) and name no vendor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskEngine {
    Nvidia(Engine),
    Amd(AmdQueueType),
}

impl TaskEngine {
    /// Every engine, in a fixed order: [`Self::id`] is the position from 1 (0: none).
    pub const ALL: [TaskEngine; 14] = [
        TaskEngine::Nvidia(Engine::Graphics),
        TaskEngine::Nvidia(Engine::Copy),
        TaskEngine::Nvidia(Engine::Nvdec),
        TaskEngine::Nvidia(Engine::Nvenc),
        TaskEngine::Nvidia(Engine::Nvjpeg),
        TaskEngine::Nvidia(Engine::Ofa),
        TaskEngine::Nvidia(Engine::Sec2),
        TaskEngine::Nvidia(Engine::Other),
        TaskEngine::Amd(AmdQueueType::Compute),
        TaskEngine::Amd(AmdQueueType::ComputeAql),
        TaskEngine::Amd(AmdQueueType::Sdma),
        TaskEngine::Amd(AmdQueueType::SdmaXgmi),
        TaskEngine::Amd(AmdQueueType::SdmaByEngId),
        TaskEngine::Amd(AmdQueueType::Unknown),
    ];

    /// The JSON output's name (`GRAPHICS`, `COMPUTE_AQL`, …).
    pub fn name(self) -> &'static str {
        match self {
            TaskEngine::Nvidia(e) => match e {
                Engine::Graphics => "GRAPHICS",
                Engine::Copy => "COPY",
                Engine::Nvdec => "NVDEC",
                Engine::Nvenc => "NVENC",
                Engine::Nvjpeg => "NVJPEG",
                Engine::Ofa => "OFA",
                Engine::Sec2 => "SEC2",
                Engine::Other => "OTHER",
            },
            TaskEngine::Amd(q) => match q {
                AmdQueueType::Compute => "COMPUTE",
                AmdQueueType::ComputeAql => "COMPUTE_AQL",
                AmdQueueType::Sdma => "SDMA",
                AmdQueueType::SdmaXgmi => "SDMA_XGMI",
                AmdQueueType::SdmaByEngId => "SDMA_BY_ENG_ID",
                AmdQueueType::Unknown => "UNKNOWN",
            },
        }
    }

    /// A small number for it (a label's slot): its position in [`Self::ALL`] from 1 (a match,
    /// not a search: the metrics ask it for every event).
    pub fn id(self) -> u8 {
        match self {
            TaskEngine::Nvidia(e) => e as u8 + 1,
            TaskEngine::Amd(q) => Engine::Other as u8 + 2 + q as u8,
        }
    }
}

impl Event {
    /// The engine of the event's task where its vendor says it ([`TaskEngine`]).
    pub fn engine(&self) -> Option<TaskEngine> {
        match &self.kind {
            EventKind::TaskInit {
                engine: Some(e), ..
            } => Some(TaskEngine::Nvidia(*e)),
            _ => (self.amd.as_ref()?.queue_type).map(TaskEngine::Amd),
        }
    }

    /// The GPU number a `TASK_INIT` or `WORK_SUBMIT` names, else the vendor detail's (AMD's
    /// `gpu_id` on every event of a queue); its numbering is [`Self::gpu_numbering`].
    pub fn gpu_number(&self) -> Option<u32> {
        let own = match &self.kind {
            EventKind::TaskInit { gpu, .. } | EventKind::WorkSubmit { gpu, .. } => *gpu,
            _ => None,
        };
        own.or_else(|| self.amd.as_ref()?.gpu_id)
    }

    /// Which number the event's `gpu` is: the vendor detail's choice, RM's device instance
    /// where there is no detail (NVIDIA).
    #[inline]
    pub fn gpu_numbering(&self) -> GpuNumbering {
        self.amd
            .as_ref()
            .map_or(GpuNumbering::RmDevice, AmdDetail::gpu_numbering)
    }

    /// The RM client the event names (NVIDIA), 0 where none.
    pub fn client(&self) -> u32 {
        match self.kind {
            EventKind::TaskInit { client, .. }
            | EventKind::Schedule { client, .. }
            | EventKind::WorkSubmit { client, .. }
            | EventKind::TaskDestroy { client, .. }
            | EventKind::SchedUpdate { client, .. }
            | EventKind::MpsShared { client, .. } => client,
            EventKind::PretraceEnd { client, .. } => client.unwrap_or(0),
        }
    }

    /// The identity fields of the event, in output order: `key` (run-unique, see
    /// docs/events.md), `tsg` (the text output's TSG column), `handle` (NVIDIA: the TSG's RM
    /// handle in hex) and `client_hex` (the RM client in hex).
    pub fn identity(&self) -> Identity {
        Identity {
            key: self.key,
            tsg: self.kind.task().label(),
            handle: self
                .key
                .filter(|k| k.client.is_some())
                .map(|k| Hex8(k.object)),
            client_hex: Hex8(self.client()),
        }
    }
}

/// [`Event::identity`]: serializes as `key`, `tsg`, `handle`, `client_hex`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Identity {
    pub key: Option<TaskKey>,
    pub tsg: TaskLabel,
    pub handle: Option<Hex8>,
    pub client_hex: Hex8,
}

/// A 32-bit value as `0x` and 8 hex digits (text and JSON spelling of RM handles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hex8(pub u32);

impl std::fmt::Display for Hex8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "0x{:08x}", self.0)
    }
}

impl Hex8 {
    /// `0x` and eight lowercase hex digits, as bytes.
    pub fn text(self) -> [u8; 10] {
        hex8(self.0)
    }
}

impl Serialize for Hex8 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let buf = hex8(self.0);
        s.serialize_str(std::str::from_utf8(&buf).map_err(serde::ser::Error::custom)?)
    }
}

/// How a [`TaskId`] is shown (the text output's TSG column, JSON's `tsg`): `0x5c000015` (RM
/// handle), `12` (hardware TSG id or KFD queue id), `?`. Honours width and alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLabel {
    buf: [u8; 10],
    len: u8,
}

impl TaskLabel {
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, `x`, hex letters and `?` are ever written.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or("?")
    }
}

impl std::fmt::Display for TaskLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for TaskLabel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl TaskId {
    /// How the task is shown ([`TaskLabel`]).
    pub fn label(self) -> TaskLabel {
        // At most 10 bytes: `0x` and 8 hex digits, or a u32's 10 decimal digits (written
        // directly: the label is on every text line and in every JSON line).
        let mut label = TaskLabel {
            buf: [0; 10],
            len: 0,
        };
        let text: &[u8] = match self {
            TaskId::HwTsg(n) | TaskId::KfdQueue(n) => {
                let mut digits = itoa::Buffer::new();
                let d = digits.format(n).as_bytes();
                label.buf[..d.len()].copy_from_slice(d);
                label.len = d.len() as u8;
                return label;
            }
            TaskId::RmHandle(h) | TaskId::PreTrace(h) | TaskId::Shared(h) => &hex8(h),
            TaskId::KfdNoQueue | TaskId::Unknown => b"?",
        };
        label.buf[..text.len()].copy_from_slice(text);
        label.len = text.len() as u8;
        label
    }
}

/// `errno` and, after a non-zero one that has a name, `errno_name` (an event's errno fields).
fn errno_fields<S: serde::Serializer>(errno: &i32, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap as _;
    let name = errno_name(*errno);
    let mut m = s.serialize_map(Some(1 + usize::from(name.is_some())))?;
    m.serialize_entry("errno", errno)?;
    if let Some(name) = name {
        m.serialize_entry("errno_name", name)?;
    }
    m.end()
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

/// What happened. Serializes as the kind's own fields (without its name: the JSON line puts
/// `event` first and the common fields between the two), in the documented order; a non-zero
/// `errno` with a name is followed by `errno_name`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
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
        /// The GPU's number in the driver's calls, when seen: NVIDIA RM's device instance
        /// (`deviceId` of the parent device object; not nvidia-smi's index, which the pipeline
        /// resolves: `model::gpus`), AMD's KFD `gpu_id`. Written by the outputs, not by serde
        /// (JSON `gpu` and `rm_device`: [`EventKind::driver_gpu`]).
        #[serde(skip)]
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
        #[serde(flatten, serialize_with = "errno_fields")]
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
        /// As `TaskInit`'s `gpu`: the driver's number of the GPU (RM device instance, KFD
        /// `gpu_id`).
        #[serde(skip)]
        gpu: Option<u32>,
    },
    /// The task ended.
    TaskDestroy {
        task: TaskId,
        client: u32,
        cause: DestroyCause,
        implicit: bool,
        /// NVIDIA: the TSG's parameters at its end, when it was tracked (JSON only; the text
        /// line does not change).
        #[serde(rename = "final", skip_serializing_if = "Option::is_none")]
        final_params: Option<FinalParams>,
    },
    /// A request that changes how a task is scheduled (timeslice, interleave, preemption,
    /// disable / re-enable; AMD queue priority, percentage, CU mask), allowed or refused.
    SchedUpdate {
        task: TaskId,
        client: u32,
        change: SchedChange,
        /// The driver accepted the request.
        allowed: bool,
        /// RM status code returned (0 = NV_OK); `None` when the syscall itself failed, and for AMD.
        rm_status: Option<u32>,
        /// Negative errno of the ioctl syscall (0 on success).
        #[serde(flatten, serialize_with = "errno_fields")]
        errno: i32,
        /// NVIDIA: the request was sent to a channel (`NVA06F`) of the TSG.
        via_channel: bool,
    },
    /// Late attach: the driver objects a process made before tracing started (RM clients and
    /// the TSGs under them, none of which this tracer saw created) ended, because the process
    /// closed the fd they were allocated on, freed their RM client, or exited. How many TSGs
    /// there were is unknown (`tsgs` is always `None`: never a guess).
    PretraceEnd {
        /// The RM client freed (cause `parent_free`), when that is what ended them.
        client: Option<u32>,
        /// The fd closed (cause `fd_close`).
        fd: Option<i32>,
        cause: DestroyCause,
        /// Number of TSGs that ended: unknown.
        tsgs: Option<u32>,
    },
    /// MPS: a client's TSG that it did not create (its channels run in the MPS server's TSG)
    /// related to the server's TSG on the same runlist. Once per client TSG handle.
    MpsShared {
        /// The TSG handle in the client's RM client ([`TaskId::Shared`]).
        task: TaskId,
        client: u32,
        /// The MPS server process.
        server_pid: u32,
        /// The server's TSG on that runlist.
        server_task: TaskId,
        /// The runlist both are on (from the client's work-submit token).
        runlist: u32,
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
            Self::SchedUpdate { .. } => "SCHED_UPDATE",
            Self::PretraceEnd { .. } => "PRETRACE_END",
            Self::MpsShared { .. } => "MPS_SHARED",
        }
    }

    /// The text output prints it with `-v` only (`WORK_SUBMIT`: one per channel, numerous).
    #[inline]
    pub fn verbose_only(&self) -> bool {
        matches!(self, Self::WorkSubmit { .. })
    }

    /// The driver's own number of the task's GPU, for the kinds that carry one (`TASK_INIT`,
    /// `WORK_SUBMIT`; the inner `None`: not seen): NVIDIA RM's device instance, AMD's KFD
    /// `gpu_id`. `None` for the other kinds.
    pub fn driver_gpu(&self) -> Option<Option<u32>> {
        match self {
            Self::TaskInit { gpu, .. } | Self::WorkSubmit { gpu, .. } => Some(*gpu),
            _ => None,
        }
    }

    pub fn task(&self) -> TaskId {
        match self {
            Self::TaskInit { task, .. }
            | Self::Schedule { task, .. }
            | Self::WorkSubmit { task, .. }
            | Self::TaskDestroy { task, .. }
            | Self::SchedUpdate { task, .. }
            | Self::MpsShared { task, .. } => *task,
            Self::PretraceEnd { .. } => TaskId::Unknown,
        }
    }
}

/// The symbolic name of an errno (either sign) on Linux, e.g. `ENOTTY` for 25 or -25; `None`
/// for 0 and numbers not listed here.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    if errno == 0 {
        return None;
    }
    let names = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::ESRCH, "ESRCH"),
        (libc::EINTR, "EINTR"),
        (libc::EIO, "EIO"),
        (libc::ENXIO, "ENXIO"),
        (libc::E2BIG, "E2BIG"),
        (libc::EBADF, "EBADF"),
        (libc::ECHILD, "ECHILD"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EACCES, "EACCES"),
        (libc::EFAULT, "EFAULT"),
        (libc::EBUSY, "EBUSY"),
        (libc::EEXIST, "EEXIST"),
        (libc::ENODEV, "ENODEV"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENFILE, "ENFILE"),
        (libc::EMFILE, "EMFILE"),
        (libc::ENOTTY, "ENOTTY"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::EPIPE, "EPIPE"),
        (libc::ERANGE, "ERANGE"),
        (libc::EDEADLK, "EDEADLK"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::ENODATA, "ENODATA"),
        (libc::ETIME, "ETIME"),
        (libc::EOVERFLOW, "EOVERFLOW"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ETIMEDOUT, "ETIMEDOUT"),
        (libc::ECANCELED, "ECANCELED"),
    ];
    let e = i32::try_from(errno.unsigned_abs()).ok()?;
    names.iter().find(|&&(n, _)| n == e).map(|&(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine's label is the JSON output's name of the vendor's own value (serde's, an
    /// independent spelling), each engine's slot is its own, and a slot names its engine back.
    #[test]
    fn task_engine_names_are_the_json_names_and_slots_are_distinct() {
        let mut slots = std::collections::HashSet::new();
        for e in TaskEngine::ALL {
            let json = match e {
                TaskEngine::Nvidia(x) => serde_json::to_value(x),
                TaskEngine::Amd(x) => serde_json::to_value(x),
            };
            assert_eq!(json.unwrap(), e.name(), "{e:?}");
            assert!(e.id() >= 1 && slots.insert(e.id()), "{e:?}");
            assert_eq!(TaskEngine::ALL[e.id() as usize - 1], e);
        }
    }

    /// The JSON `key` (written digit by digit) is the Display form, for NVIDIA and AMD keys,
    /// the first generation and later ones, the widest numbers included.
    #[test]
    fn task_key_json_is_its_display_form() {
        let values = [0, 1, 9, 10, 0xabc, 0x5c00_0001, 99_999, u32::MAX];
        for &pid in &values {
            for client in [None, Some(0), Some(0xc1d0_0001), Some(u32::MAX)] {
                for &object in &values {
                    for generation in [0, 1, 2, 10, u32::MAX] {
                        let key = TaskKey {
                            pid,
                            client,
                            object,
                            generation,
                        };
                        let json = serde_json::to_string(&key).unwrap();
                        assert_eq!(json, format!("\"{key}\""));
                    }
                }
            }
        }
    }
}
