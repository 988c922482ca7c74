//! The ring buffer's reader: drains it in slices, injects what userspace learns (cgroup
//! attributions, the API layer's names and sums) and feeds the pipeline and the recording.

use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use gpu_trace_common::record_kind;

use gpu_trace_common::api::{ApiKey, ApiStat};
use gpu_trace_core::api::names::ApiEvent;
use gpu_trace_core::event::monotonic_ns;

use super::{
    error::{RunError, io_err},
    outputs::sink_error,
    record::Recording,
    signals::stop_requested,
};
use crate::{
    event::Origin,
    loader::Tracer,
    pipeline::Pipeline,
    probe::{cgroup::CgroupResolver, system},
    queue::QueueWriter,
    wire::{self, RawRecord},
};

/// The ring-buffer reader of a live run: records read, the first failure of an output.
#[derive(Default)]
pub(super) struct Reader {
    pub(super) read: u64,
    pub(super) failure: Option<RunError>,
    /// Resolves the kernel's cgroup records (`None`: no cgroup2 mount here).
    pub(super) cgroups: Option<CgroupResolver>,
    /// Processes whose cgroup the pipeline knows (a `TASK_CGROUP` record, or /proc when that
    /// record was lost to a full ring).
    pub(super) attributed: std::collections::HashSet<u32>,
    /// `-- CMD`: the command and the processes it created, which the pipeline follows.
    pub(super) descendants: Option<crate::launch::Descendants>,
    /// `--api`: the probes and the names behind the kernel's `API_TAG` cookies.
    pub(super) api: Option<crate::api::attach::TraceApi>,
    /// `--api -v`: the hand-outs are shown (`API_HANDOUT`).
    pub(super) api_verbose: bool,
    /// `--api`'s `--stuck-after`, in nanoseconds.
    pub(super) stuck_after_ns: u64,
    /// `--api`: targets whose link map changed (`API_LOADED`) or that were handed an address
    /// (`API_HANDOUT`), and whether the kernel stopped them, to attach at once, in ring order.
    pub(super) loaded: Vec<crate::api::attach::ApiSignal>,
    /// gpu-trace's own process: its records are left out (its NVML thread opens the GPU and
    /// frees, at the end, RM objects it made before the programs attached).
    pub(super) own_tgid: u32,
}

/// How long one slice of reading may last before the live loop looks at signals, the deadline,
/// the ticker and the outputs again. Under a storm (any process can keep the ring non-empty) a
/// read that went on until the ring was empty would never return, and a stop would wait for
/// the storm to end.
pub(super) const DRAIN_SLICE: Duration = Duration::from_millis(50);

/// How often the live loop looks whether `-- CMD` ended (its end stops tracing this much later
/// at most).
pub(crate) const CHILD_POLL: Duration = Duration::from_millis(20);

/// Records read between two looks at the clock and at a stop request.
pub(super) const DRAIN_CHECK_EVERY: u64 = 256;

/// Whether a slice of reading left records in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drained {
    Empty,
    More,
}

impl Reader {
    pub(super) fn new(
        cgroups: Option<CgroupResolver>,
        api: Option<crate::api::attach::TraceApi>,
    ) -> Self {
        Self {
            cgroups,
            api,
            own_tgid: std::process::id(),
            ..Self::default()
        }
    }

    /// Reads the records the ring holds: all of them (`slice` `None`), or until `slice` has
    /// passed or a stop is requested, whichever comes first ([`Drained::More`] then). Records
    /// are counted even after an output failed, so that the counts stay exact; they are no
    /// longer written then.
    pub(super) fn drain(
        &mut self,
        ring: &mut RingBuf<MapData>,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
        slice: Option<Duration>,
    ) -> Drained {
        let until = slice.map(|s| Instant::now() + s);
        if let Some(d) = self.descendants.as_mut() {
            follow_changes(pipeline, d.refresh());
        }
        self.name_api_cookies(pipeline, recorder);
        let mut drained = Drained::Empty;
        let mut in_slice = 0u64;
        loop {
            in_slice += 1;
            if in_slice.is_multiple_of(DRAIN_CHECK_EVERY)
                && let Some(until) = until
                && (stop_requested() || Instant::now() >= until)
            {
                drained = Drained::More;
                break;
            }
            let Some(item) = ring.next() else { break };
            self.read += 1;
            if let Some(signal) = crate::api::attach::signal_of(&item) {
                // A live run's signal to attach, not an event: never recorded.
                self.loaded.push(signal);
                continue;
            }
            if self.failure.is_some() {
                continue;
            }
            // Parsed once: the value serves the decisions below and the pipeline; the recording
            // gets the bytes as the kernel wrote them.
            let parsed = wire::parse_record(&item);
            // Never gpu-trace itself (filtered here, not in the kernel programs: a tgid check
            // there made Linux 5.10's verifier refuse them); counted, not recorded.
            if parsed
                .as_ref()
                .is_ok_and(|r| r.header().tgid == self.own_tgid)
            {
                pipeline.left_out("own_process", 1);
                continue;
            }
            if let (Some(d), Ok(r)) = (self.descendants.as_mut(), parsed.as_ref())
                && !d.contains(r.header().tgid)
            {
                follow_changes(pipeline, d.resolve(r.header().tgid));
            }
            let (before, after) = self.attributions_around(parsed.as_ref().ok(), &item);
            // --api: a tag's names follow it (the pipeline and the recording both get them).
            let after = match (&parsed, &self.api) {
                (Ok(RawRecord::ApiTag(tag)), Some(api)) => {
                    Some(RawRecord::ApiContext(api.attacher.context(tag)))
                }
                _ => after,
            };
            let records = before
                .as_ref()
                .map(|a| (a.as_bytes(), Ok(a)))
                .into_iter()
                .chain(std::iter::once((&item[..], parsed.as_ref())))
                .chain(after.as_ref().map(|a| (a.as_bytes(), Ok(a))));
            for (bytes, record) in records {
                if !self.pass(bytes, record.ok(), pipeline, recorder) {
                    break;
                }
            }
            // A full recording piece is ended between two records, by the live loop (which
            // reads the kernel's counters for its trailer): this slice ends here.
            if recorder.needs_turn() {
                drained = Drained::More;
                break;
            }
        }
        // `-- CMD`: processes that left the followed set at its bound, once the reader is past
        // their last records.
        if let Some(d) = self.descendants.as_mut() {
            follow_changes(pipeline, d.retire());
        }
        recorder.flush();
        let _ = pipeline.flush();
        drained
    }

    /// `--api`: the names of the cookies attached since the last drain (`API_SYMBOL`), into
    /// the recording and the pipeline before any ring record that may carry them.
    pub(super) fn name_api_cookies(
        &mut self,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) {
        let Some(api) = self.api.as_mut() else {
            return;
        };
        for rec in api.attacher.take_symbol_records(monotonic_ns()) {
            let raw = RawRecord::ApiSymbol(rec);
            self.inject(&raw, pipeline, recorder);
        }
    }

    /// `--api`: the kernel's per-process call sums that changed since the last read, as
    /// `API_STATS` records into the recording and the pipeline (each second), after the names
    /// of their cookies.
    pub(super) fn send_api_sums(
        &mut self,
        tracer: &mut Tracer,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) {
        if let Some(read) = self.read_api_sums(tracer, pipeline, recorder) {
            self.send_stats(read.sums, pipeline, recorder);
        }
    }

    /// `--api`: the names of the cookies attached since the last read, then one read of the
    /// kernel's sums (`None` without `--api`).
    fn read_api_sums(
        &mut self,
        tracer: &mut Tracer,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) -> Option<crate::api::sums::Read> {
        self.api.as_ref()?;
        self.name_api_cookies(pipeline, recorder);
        let api = self.api.as_mut()?;
        Some(api.sums.read(tracer.ebpf_mut()))
    }

    /// `API_STATS` records of `sums` (those that changed since the last read) into the
    /// recording and the pipeline.
    fn send_stats(
        &mut self,
        sums: Vec<(ApiKey, ApiStat)>,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) {
        let Some(api) = self.api.as_mut() else {
            return;
        };
        for rec in api.stats_records(sums, monotonic_ns()) {
            self.inject(&RawRecord::ApiStats(rec), pipeline, recorder);
        }
    }

    /// `--api` at the run's end, from one read of the kernel's sums: the final `API_STATS`
    /// (after the names of their cookies), the hand-outs not sent yet (`-v`), then each
    /// interposer's `API_PATH` verdict (into the pipeline only, as [`Self::send_api_paths`]).
    pub(super) fn send_api_end(
        &mut self,
        tracer: &mut Tracer,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) {
        let Some(read) = self.read_api_sums(tracer, pipeline, recorder) else {
            return;
        };
        let paths = (self.api.as_ref())
            .map(|api| api.attacher.paths(&read.sums, &read.through, true))
            .unwrap_or_default();
        self.send_stats(read.sums, pipeline, recorder);
        self.send_handouts(pipeline);
        self.send_paths(pipeline, paths);
    }

    /// `--api -v`: the hand-outs seen since the last call, an `API_HANDOUT` each (without
    /// `-v` they are dropped).
    pub(super) fn send_handouts(&mut self, pipeline: &mut Pipeline<QueueWriter>) {
        let Some(api) = self.api.as_mut() else {
            return;
        };
        let handouts = api.attacher.take_handouts();
        if self.api_verbose {
            for h in handouts {
                let (pid, comm) = (h.pid, h.comm.clone());
                self.api_event(pipeline, &ApiEvent::Handout(h), (pid, pid), &comm);
            }
        }
    }

    /// `--api`: one `API_PATH` per (process, interposer) from the kernel's sums so far
    /// (`last`: the run's end; else `--interval`'s), into the pipeline — not the recording:
    /// they are made from maps a replay does not have.
    pub(super) fn send_api_paths(
        &mut self,
        tracer: &mut Tracer,
        pipeline: &mut Pipeline<QueueWriter>,
        last: bool,
    ) {
        let Some(api) = self.api.as_mut() else {
            return;
        };
        let read = api.sums.read(tracer.ebpf_mut());
        let paths = api.attacher.paths(&read.sums, &read.through, last);
        self.send_paths(pipeline, paths);
    }

    /// The interposers' `API_PATH` verdicts into the pipeline.
    fn send_paths(
        &mut self,
        pipeline: &mut Pipeline<QueueWriter>,
        paths: Vec<gpu_trace_core::api::path::ApiPath>,
    ) {
        for p in paths {
            let (pid, comm) = (p.pid, p.comm.clone());
            self.api_event(pipeline, &ApiEvent::Path(p), (pid, pid), &comm);
        }
    }

    /// `--api`: an `API_STUCK` per call of the targets open `--stuck-after` or longer, into
    /// the pipeline (a `--dump-on stuck` trigger there, served after each: every stuck call
    /// is a trigger, as every refused schedule is) — not the recording: found in a map a
    /// replay does not have.
    pub(super) fn send_stuck(
        &mut self,
        tracer: &Tracer,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) -> Result<(), RunError> {
        let Some(api) = self.api.as_mut() else {
            return Ok(());
        };
        let found = api.stuck(tracer.ebpf(), self.stuck_after_ns);
        if found.is_empty() {
            return Ok(());
        }
        for e in found {
            let (ids, comm) = ((e.pid, e.tid), e.comm.clone());
            self.api_event(pipeline, &ApiEvent::Stuck(e), ids, &comm);
            if recorder.needs_turn() {
                recorder.turn(tracer, false)?;
            }
        }
        if self.failure.is_none()
            && let Err(e) = pipeline.flush()
        {
            self.failure = Some(io_err("writing the output")(e));
        }
        Ok(())
    }

    /// An API record made here, at this moment, about thread `(pid, tid)` (`comm`).
    fn api_event(
        &mut self,
        pipeline: &mut Pipeline<QueueWriter>,
        event: &ApiEvent,
        (pid, tid): (u32, u32),
        comm: &str,
    ) {
        if self.failure.is_some() {
            return;
        }
        // Made here, not by a thread on a CPU: `[CPU??]`, JSON `null`.
        let origin = Origin::made_here(pid, tid, comm);
        if let Err(e) = pipeline.api_event(event, &origin) {
            self.failure = Some(sink_error(e));
        }
    }

    /// A record made here (not by the kernel): into the recording and the pipeline.
    pub(super) fn inject(
        &mut self,
        raw: &RawRecord,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) {
        if self.failure.is_none() {
            self.pass(raw.as_bytes(), Some(raw), pipeline, recorder);
        }
    }

    /// One record into the recording (`bytes`, as written) and the pipeline (`record`; `None`:
    /// the bytes are not a record, counted as malformed). False after a failure, which
    /// [`Self::failure`] then holds.
    pub(super) fn pass(
        &mut self,
        bytes: &[u8],
        record: Option<&RawRecord>,
        pipeline: &mut Pipeline<QueueWriter>,
        recorder: &mut Recording,
    ) -> bool {
        if let Err(e) = recorder.record(bytes) {
            self.failure = Some(e);
            return false;
        }
        let fed = match record {
            Some(r) => pipeline.feed_record(r),
            None => {
                pipeline.malformed();
                Ok(())
            }
        };
        if let Err(e) = fed {
            self.failure = Some(sink_error(e));
            return false;
        }
        true
    }

    /// The `ATTRIBUTION` records that go with ring item `item` (`parsed`, when it is a
    /// record): one after a process's cgroup record (what it resolves to follows it, in the
    /// recording too), or one before the first record of a process whose cgroup record was lost
    /// to a full ring (from /proc, once).
    pub(super) fn attributions_around(
        &mut self,
        parsed: Option<&RawRecord>,
        item: &[u8],
    ) -> (Option<RawRecord>, Option<RawRecord>) {
        // An item too malformed to parse still names its process when its header is whole.
        let hdr = match parsed {
            Some(RawRecord::TaskCgroup(tc)) => return (None, Some(self.attribution(*tc))),
            Some(r) => *r.header(),
            None => match wire::header_of(item) {
                Some(h) if h.kind != record_kind::TASK_CGROUP => h,
                _ => return (None, None),
            },
        };
        if hdr.kind == record_kind::PROCESS_EXIT {
            self.attributed.remove(&hdr.tgid);
            return (None, None);
        }
        if self.attributed.contains(&hdr.tgid) {
            return (None, None);
        }
        let path = crate::probe::cgroup::process_v2_path(hdr.tgid);
        let id = path
            .as_deref()
            .and_then(|p| self.cgroups.as_ref()?.id_of(p).ok());
        self.attributed.insert(hdr.tgid);
        let before = id.map(|cgroup_id| {
            self.attribution(gpu_trace_common::TaskCgroupRecord {
                hdr,
                cgroup_id,
                ns_pid: 0,
                _pad: 0,
            })
        });
        (before, None)
    }

    /// The `ATTRIBUTION` record of a process's cgroup record: its path and namespaced PID.
    pub(super) fn attribution(&mut self, tc: gpu_trace_common::TaskCgroupRecord) -> RawRecord {
        self.attributed.insert(tc.hdr.tgid);
        let path = self
            .cgroups
            .as_mut()
            .and_then(|r| r.path(tc.cgroup_id).map(str::to_string));
        // The kernel's reading, made at the call; /proc only where it had none (a record made
        // up from /proc above), while the process is still there.
        let ns_pid = match tc.ns_pid {
            0 => system::namespaced_pid(tc.hdr.tgid),
            n => Some(n),
        };
        RawRecord::Attribution(wire::Attribution::new(&tc, path.as_deref(), ns_pid))
    }

    /// An output failed: the run stops.
    pub(super) fn outputs_failed(
        &self,
        pipeline: &Pipeline<QueueWriter>,
        recorder: &Recording,
    ) -> bool {
        self.failure.is_some() || pipeline.output().failed() || recorder.failed()
    }
}

/// `-- CMD`: the processes that joined or left the command's set, into the pipeline's filter.
pub(super) fn follow_changes(
    pipeline: &mut Pipeline<QueueWriter>,
    changes: Vec<crate::launch::Change>,
) {
    for c in changes {
        match c {
            crate::launch::Change::Follow(pid) => pipeline.follow(pid, true),
            crate::launch::Change::Unfollow(pid) => pipeline.follow(pid, false),
        }
    }
}
