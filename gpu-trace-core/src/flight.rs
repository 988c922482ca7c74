//! `--flight-recorder`: the last TIME of records in memory, written only when a trigger comes,
//! as a recording that replays alone.
//!
//! [`FlightWindow`] keeps the records it is given, in order, and lets the oldest go: a record
//! leaves the front of the window while it is older than the newest record's time less the
//! window (the records' own clock, CLOCK_MONOTONIC; at a dump, the time of the dump) or while
//! the records kept take more than the byte cap (each record counts its length plus its index
//! entry, [`INDEX_ENTRY`] bytes). So the window
//! is the longest run of the last records whose first record is within the window and whose
//! bytes fit the cap (records of several CPUs come a little out of time order: one older than
//! the window may stay behind a newer first one). The records
//! that leave are fed to a [`LiveSet`] started from the run's inventory, so that the window's
//! start always knows the processes alive there: a dump's header carries them as its inventory
//! (replay treats them as late attach does, as for a `--record-rotate` piece). A dump
//! ([`FlightWindow::write`]) is the run's header with that inventory, the window's records, and
//! a trailer with the kernel counters counted since the sample of them nearest before the
//! window's start ([`FlightWindow::note_counters`]).
//!
//! [`TriggerSink`] is the pipeline's output that notices the events that trigger a dump (a
//! refused `SCHEDULE`, `API_RECURSION`, `API_STUCK`), for the live loop to take
//! ([`Triggers::take`]).

use std::{
    collections::VecDeque,
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

use crate::{
    api::names::ApiEvent,
    event::EventKind,
    live_set::LiveSet,
    model::stats::KernelCounters,
    record::{RecordError, RecordWriter, RecordingHeader, RecordingTrailer},
    rotate::counters_since,
    sink::{ApiEnriched, Enriched, RunEnd, Sink, SinkError},
    state_log::{StateLog, start_header, write_state},
};

/// What made a dump, as its file name and the statistics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Trigger {
    /// SIGUSR1.
    Signal,
    /// A `SCHEDULE` the driver refused (or `--deny-*` did).
    Refused,
    /// An `API_RECURSION`.
    Recursion,
    /// An `API_STUCK`.
    Stuck,
    /// Records lost to a full ring buffer (the kernel's `dropped` grew).
    Dropped,
    /// `-- CMD` ended by a signal.
    SignalExit,
}

impl Trigger {
    pub const ALL: [Trigger; 6] = [
        Trigger::Signal,
        Trigger::Refused,
        Trigger::Recursion,
        Trigger::Stuck,
        Trigger::Dropped,
        Trigger::SignalExit,
    ];

    /// Its name in file names, the statistics and `--dump-on`.
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Signal => "signal",
            Trigger::Refused => "refused",
            Trigger::Recursion => "recursion",
            Trigger::Stuck => "stuck",
            Trigger::Dropped => "dropped",
            Trigger::SignalExit => "signal-exit",
        }
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

pub use crate::model::stats::FlightStats;

/// The triggers the pipeline's [`TriggerSink`] noticed, shared with the live loop.
#[derive(Clone, Debug, Default)]
pub struct Triggers(Arc<AtomicU32>);

impl Triggers {
    /// Notes `t`.
    pub fn note(&self, t: Trigger) {
        self.0.fetch_or(t.bit(), Ordering::Relaxed);
    }

    /// A trigger was noted and not taken yet.
    pub fn pending(&self) -> bool {
        self.0.load(Ordering::Relaxed) != 0
    }

    /// The triggers noted since the last call, in [`Trigger::ALL`]'s order.
    pub fn take(&self) -> Vec<Trigger> {
        let bits = self.0.swap(0, Ordering::Relaxed);
        Trigger::ALL
            .into_iter()
            .filter(|t| bits & t.bit() != 0)
            .collect()
    }
}

/// The pipeline output that notes the events that trigger a dump, among `wanted` (the
/// events the `--pid`/`--comm` filters select).
pub struct TriggerSink {
    pub triggers: Triggers,
    pub wanted: Vec<Trigger>,
}

impl TriggerSink {
    fn note(&self, t: Trigger) {
        if self.wanted.contains(&t) {
            self.triggers.note(t);
        }
    }
}

impl Sink for TriggerSink {
    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        if let EventKind::Schedule { allowed: false, .. } = ev.event.kind {
            self.note(Trigger::Refused);
        }
        Ok(())
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        match ev.event {
            ApiEvent::Recursion(_) => self.note(Trigger::Recursion),
            ApiEvent::Stuck(_) => self.note(Trigger::Stuck),
            _ => {}
        }
        Ok(())
    }

    fn finish(&mut self, _end: &RunEnd<'_>) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Bytes of one chunk of the window's records (a record longer than this gets a chunk of its
/// own).
const CHUNK: usize = 64 << 10;

/// What a record costs the byte cap besides its own bytes: its entry in the index (time,
/// length).
pub const INDEX_ENTRY: u64 = std::mem::size_of::<(u64, u32)>() as u64;

/// The last records of a run (see the module documentation).
///
/// The records' bytes lie one after another in chunks of [`CHUNK`] bytes (no allocation per
/// record; a record never straddles two chunks, so a chunk's tail may stay unused), with an
/// index of (time, length) per record. Each record counts its length plus its index entry
/// ([`INDEX_ENTRY`]) against the byte cap; besides, at most the unused tail of each chunk and
/// the front chunk's consumed part (a chunk or two in all) are held.
pub struct FlightWindow {
    window_ns: u64,
    max_bytes: u64,
    /// The records' bytes, oldest first; the first record starts at `front` in `chunks[0]`.
    chunks: VecDeque<Vec<u8>>,
    front: usize,
    /// A chunk emptied at the front, kept for the next one needed.
    spare: Option<Vec<u8>>,
    /// (time, length) of each record, oldest first.
    index: VecDeque<(u64, u32)>,
    bytes: u64,
    newest_ns: u64,
    /// The processes alive at the window's start.
    start: LiveSet,
    /// The records that made the driver objects alive at the window's start.
    state: StateLog,
    /// The kernel counters sampled over time (time, counters), oldest first: the window's
    /// start and later, and the one sample just before it.
    counters: VecDeque<(u64, KernelCounters)>,
}

impl FlightWindow {
    /// A window of `window_ns` (record time) and at most `max_bytes` of records, over a run
    /// whose start-up inventory is `inventory`.
    pub fn new(inventory: &crate::inventory::Inventory, window_ns: u64, max_bytes: u64) -> Self {
        Self {
            window_ns,
            max_bytes,
            chunks: VecDeque::new(),
            front: 0,
            spare: None,
            index: VecDeque::new(),
            bytes: 0,
            newest_ns: 0,
            start: LiveSet::new(inventory),
            state: StateLog::new(),
            counters: VecDeque::new(),
        }
    }

    /// One more record (as the recording gets it); the oldest leave as the window says.
    pub fn push(&mut self, bytes: &[u8]) {
        let ts = crate::wire::header_of(bytes).map_or(self.newest_ns, |h| h.ts_ns);
        self.newest_ns = self.newest_ns.max(ts);
        let fits = (self.chunks.back()).is_some_and(|c| c.capacity() - c.len() >= bytes.len());
        if !fits {
            let chunk = match self.spare.take() {
                Some(c) if c.capacity() >= bytes.len() => c,
                _ => Vec::with_capacity(CHUNK.max(bytes.len())),
            };
            self.chunks.push_back(chunk);
        }
        let last = self.chunks.back_mut().expect("a chunk");
        last.extend_from_slice(bytes);
        self.index.push_back((ts, bytes.len() as u32));
        self.bytes += bytes.len() as u64 + INDEX_ENTRY;
        self.expire(self.newest_ns);
    }

    /// Lets the records older than `now_ns` less the window go (and any over the byte cap).
    pub fn expire(&mut self, now_ns: u64) {
        let oldest = now_ns.saturating_sub(self.window_ns);
        while let Some(&(ts, len)) = self.index.front() {
            if ts >= oldest && self.bytes <= self.max_bytes {
                break;
            }
            self.index.pop_front();
            let len = len as usize;
            // A record that did not fit the rest of its predecessor's chunk starts the next.
            if self.front + len > self.chunks[0].len() {
                self.next_chunk();
            }
            let rec = &self.chunks[0][self.front..self.front + len];
            self.start.observe(rec);
            self.state.observe(rec);
            self.front += len;
            self.bytes -= len as u64 + INDEX_ENTRY;
        }
        if self.index.is_empty() {
            while !self.chunks.is_empty() {
                self.next_chunk();
            }
        }
        let start = self.index.front().map_or(now_ns, |(ts, _)| *ts);
        // Keep the last sample at or before the window's start, and those after it.
        while self.counters.len() > 1 && self.counters[1].0 <= start {
            self.counters.pop_front();
        }
    }

    /// Lets the front chunk go (its records are gone), keeping it as the spare.
    fn next_chunk(&mut self) {
        if let Some(mut c) = self.chunks.pop_front() {
            c.clear();
            if c.capacity() == CHUNK {
                self.spare = Some(c);
            }
        }
        self.front = 0;
    }

    /// The kernel's counters as read at `now_ns` (once a second while tracing).
    pub fn note_counters(&mut self, now_ns: u64, counters: KernelCounters) {
        self.counters.push_back((now_ns, counters));
        let start = self.index.front().map_or(now_ns, |(ts, _)| *ts);
        while self.counters.len() > 1 && self.counters[1].0 <= start {
            self.counters.pop_front();
        }
    }

    /// The records in the window, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        let (mut chunk, mut at) = (0, self.front);
        self.index.iter().map(move |&(_, len)| {
            let len = len as usize;
            if at + len > self.chunks[chunk].len() {
                (chunk, at) = (chunk + 1, 0);
            }
            let rec = &self.chunks[chunk][at..at + len];
            at += len;
            rec
        })
    }

    /// Records in the window.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// No record in the window.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The bytes the window's records count against the cap: their lengths plus their index
    /// entries ([`INDEX_ENTRY`] each).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Writes the window as a recording to `out`: `header` (the run's) with the processes
    /// alive at the window's start as its inventory, the records, a trailer with the kernel
    /// counters `now` (read at `now_ns`) less the sample nearest before the window's start, and
    /// the window's time. The window itself is left as it is (recording goes on).
    pub fn write<W: Write>(
        &self,
        out: W,
        header: &RecordingHeader,
        now: KernelCounters,
        now_ns: u64,
    ) -> Result<W, RecordError> {
        let start_ns = self.index.front().map_or(now_ns, |(ts, _)| *ts);
        let header = start_header(header, &self.start, &self.state, start_ns);
        let mut w = RecordWriter::new(out, &header)?;
        write_state(&mut w, &self.state)?;
        for rec in self.records() {
            w.record(rec)?;
        }
        let before = self.counters.front().map(|(_, c)| *c).unwrap_or_default();
        w.finish(&RecordingTrailer {
            kernel_counters: counters_since(&now, &before),
            duration_ns: now_ns.saturating_sub(start_ns),
            recording_lost: 0,
        })
    }
}

/// A dump's file name: `gpu-trace-HOST-YYYYmmddTHHMMSSZ-TRIGGER.gtrace` (`utc`: the time in
/// that form; the host's characters other than letters, digits, `.` and `-` become `_`).
pub fn dump_name(host: &str, utc: &str, trigger: Trigger) -> String {
    format!("{}{utc}-{}.gtrace", dump_prefix(host), trigger.name())
}

/// `gpu-trace-HOST-`: what every dump name of `host` starts with.
fn dump_prefix(host: &str) -> String {
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("gpu-trace-{host}-")
}

/// `--dump-keep N`: of the file names in the dump directory (`names`), the dumps of `host` to
/// remove so that N are left: all but the newest N, by the time in their names (and, within
/// one second, their number: `STAMP-TRIGGER` is the first, `STAMP-2-TRIGGER` the second).
/// Only names [`dump_name`] makes for `host` count (another host's dumps, `node-1`'s beside
/// `node`'s, and anything else there are left alone).
pub fn dumps_to_remove(names: &[String], host: &str, keep: usize) -> Vec<String> {
    let prefix = dump_prefix(host);
    let is_stamp = |s: &str| {
        let b = s.as_bytes();
        b.len() >= 16
            && b[..8].iter().all(u8::is_ascii_digit)
            && b[8] == b'T'
            && b[9..15].iter().all(u8::is_ascii_digit)
            && b[15] == b'Z'
    };
    let mut mine: Vec<(&str, u64, &String)> = (names.iter())
        .filter(|n| n.ends_with(".gtrace"))
        .filter_map(|n| {
            let rest = n.strip_prefix(&prefix).filter(|r| is_stamp(r))?;
            let (stamp, after) = rest.split_at(16);
            // `-N-` after the stamp: the N-th dump of that second; none: the first.
            let nth = (after.strip_prefix('-')?.split('-').next())
                .filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|w| w.parse().ok())
                .unwrap_or(1);
            Some((stamp, nth, n))
        })
        .collect();
    mine.sort();
    let excess = mine.len().saturating_sub(keep);
    mine.into_iter()
        .take(excess)
        .map(|(_, _, n)| n.clone())
        .collect()
}

/// The UTC time of `mono_ns` (CLOCK_MONOTONIC) as a dump's name has it (`YYYYmmddTHHMMSSZ`),
/// through the run's clock offset (`header`).
pub fn dump_stamp(header: &RecordingHeader, mono_ns: u64) -> String {
    crate::output::clock::Clock::new(header.realtime_offset_ns)
        .utc(mono_ns)
        .format("%Y%m%dT%H%M%SZ")
        .to_string()
}

/// At most `max` dumps in any hour: whether one may be written at `now_s` (seconds on any
/// monotonic clock), noting it if so.
#[derive(Clone, Debug, Default)]
pub struct HourlyBound {
    written: VecDeque<f64>,
}

impl HourlyBound {
    pub fn allow(&mut self, now_s: f64, max: u32) -> bool {
        while self.written.front().is_some_and(|&t| now_s - t >= 3600.0) {
            self.written.pop_front();
        }
        if self.written.len() >= max as usize {
            return false;
        }
        self.written.push_back(now_s);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{record::RecordReader, source::nvidia::decode::testrec::header};
    use gpu_trace_common::{TaskRecord, record_kind, zerocopy::IntoBytes};

    /// A 48-byte record of process `pid` at `ts`.
    fn rec(kind: u32, ts: u64, pid: u32) -> Vec<u8> {
        TaskRecord {
            hdr: header(kind, ts, pid, pid, "p"),
            value: 3,
            _pad: 0,
        }
        .as_bytes()
        .to_vec()
    }

    /// The window as the documentation says, derived apart: the longest suffix of `all[..=k]`
    /// whose first record is within the window of the newest time and whose bytes (each its
    /// length and its index entry) fit the cap.
    fn expected(all: &[Vec<u8>], k: usize, window: u64, cap: u64) -> Vec<Vec<u8>> {
        let ts = |r: &Vec<u8>| crate::wire::header_of(r).unwrap().ts_ns;
        let newest = all[..=k].iter().map(ts).max().unwrap();
        let fits = |i: usize| {
            ts(&all[i]) >= newest.saturating_sub(window)
                && (all[i..=k].iter())
                    .map(|r| r.len() as u64 + INDEX_ENTRY)
                    .sum::<u64>()
                    <= cap
        };
        let s = (0..=k).find(|&i| fits(i)).unwrap_or(k + 1);
        all[s..=k].to_vec()
    }

    /// Records come in with times out of order (several CPUs); at every point the window
    /// holds exactly the records the rule selects.
    #[test]
    fn the_window_holds_exactly_its_records() {
        let times = [
            10, 20, 15, 40, 41, 39, 100, 101, 150, 149, 160, 300, 301, 302, 303,
        ];
        let all: Vec<Vec<u8>> = (times.iter().enumerate())
            .map(|(i, &t)| rec(record_kind::FD_CLOSE, t, 100 + i as u32 % 3))
            .collect();
        let each = 48 + INDEX_ENTRY;
        for (window, cap) in [(50, 1 << 20), (1000, each * 4), (60, each * 3)] {
            let mut w = FlightWindow::new(&Default::default(), window, cap);
            for (k, r) in all.iter().enumerate() {
                w.push(r);
                let got: Vec<Vec<u8>> = w.records().map(<[u8]>::to_vec).collect();
                assert_eq!(got, expected(&all, k, window, cap), "{window} {cap} at {k}");
                assert!(w.bytes() <= cap);
            }
        }
    }

    /// Records of many lengths over many chunks (a record never straddles two): at every
    /// point checked the window holds exactly the records the rule selects, byte for byte,
    /// and the chunks held are those the cap needs and two more at most.
    #[test]
    fn the_window_holds_exactly_its_records_across_chunks() {
        let all: Vec<Vec<u8>> = (0..6000u64)
            .map(|i| {
                let ts = i * 10 + (i * 7919) % 25;
                let mut r = rec(record_kind::FD_CLOSE, ts, 100 + i as u32 % 5);
                r.extend((0..(i * 37) % 217).map(|b| (b ^ i) as u8));
                r
            })
            .collect();
        let ts = |r: &Vec<u8>| crate::wire::header_of(r).unwrap().ts_ns;
        for (window, cap) in [(20_000, 150_000), (1 << 40, 300_000), (5_000, 1 << 30)] {
            let mut w = FlightWindow::new(&Default::default(), window, cap);
            let mut newest = 0;
            for (k, r) in all.iter().enumerate() {
                w.push(r);
                newest = newest.max(ts(r));
                assert!(w.bytes() <= cap);
                if k % 211 != 0 && k != all.len() - 1 {
                    continue;
                }
                // The longest suffix whose bytes fit, then its first record within the window.
                let mut j = k + 1;
                let mut sum = 0;
                while j > 0 && sum + all[j - 1].len() as u64 + INDEX_ENTRY <= cap {
                    j -= 1;
                    sum += all[j].len() as u64 + INDEX_ENTRY;
                }
                let s = (j..=k)
                    .find(|&i| ts(&all[i]) >= newest.saturating_sub(window))
                    .unwrap_or(k + 1);
                let got: Vec<&[u8]> = w.records().collect();
                assert_eq!(got.len(), k + 1 - s, "{window} {cap} at {k}");
                assert!(got.iter().zip(&all[s..=k]).all(|(g, a)| *g == &a[..]));
            }
            if cap < 1 << 20 {
                assert!(w.chunks.len() <= (cap as usize).div_ceil(CHUNK) + 2);
            }
        }
    }

    /// A dump replays alone: its inventory is the processes alive at the window's start (the
    /// one whose exit left the window with it is not), its records the window's, its trailer
    /// the counters since the sample before the window.
    #[test]
    fn a_dump_carries_the_processes_alive_at_its_start() {
        let mut w = FlightWindow::new(&Default::default(), 100, 1 << 20);
        w.note_counters(0, KernelCounters::default());
        w.push(&rec(record_kind::FD_CLOSE, 10, 1));
        w.push(&rec(record_kind::FD_CLOSE, 20, 2));
        w.push(&rec(record_kind::PROCESS_EXIT, 30, 2));
        let at_50 = KernelCounters {
            emitted: 3,
            ..Default::default()
        };
        w.note_counters(50, at_50);
        w.push(&rec(record_kind::FD_CLOSE, 200, 3));
        let now = KernelCounters {
            emitted: 7,
            dropped: 1,
            ..Default::default()
        };
        let bytes = w.write(Vec::new(), &Default::default(), now, 210).unwrap();
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        let pids: Vec<u32> = (r.header.inventory.as_ref().unwrap().processes.iter())
            .map(|p| p.pid)
            .collect();
        assert_eq!(pids, [1], "process 2 exited before the window's start");
        assert_eq!(
            r.next_record().unwrap(),
            Some(rec(record_kind::FD_CLOSE, 200, 3))
        );
        assert_eq!(r.next_record().unwrap(), None);
        let t = r.trailer.unwrap();
        assert_eq!(
            (t.kernel_counters.emitted, t.kernel_counters.dropped),
            (4, 1)
        );
        assert_eq!(t.duration_ns, 10);
    }

    /// A dump of a GPU host's recording replays alone, its state records first: the tasks
    /// created before its window end in it as `TASK_DESTROY`s, not `PRETRACE_END`s, and its
    /// counts of events are the whole recording's less those of the records before the window
    /// (each replayed alone).
    #[test]
    fn a_dump_replays_alone_with_the_tasks_made_before_its_window() {
        use crate::rotate::tests::{fixture, replay_counts};
        let (header, records) = fixture("two_streams.gtrace");
        let ts: Vec<u64> = (records.iter())
            .map(|r| crate::wire::header_of(r).unwrap().ts_ns)
            .collect();
        let newest = *ts.iter().max().unwrap();
        let whole = replay_counts(&header, &[], &records);
        let mut checked = 0;
        for k in (1..records.len()).step_by(records.len() / 16 + 1) {
            let mut w = FlightWindow::new(&Default::default(), newest - ts[k], 1 << 30);
            for r in &records {
                w.push(r);
            }
            let bytes = w
                .write(Vec::new(), &header, KernelCounters::default(), newest)
                .unwrap();
            let mut r = RecordReader::new(&bytes[..]).unwrap();
            let mut window = Vec::new();
            while let Some(rec) = r.next_record().unwrap() {
                window.push(rec);
            }
            let before = &records[..records.len() - window.len()];
            assert_eq!(
                window,
                records[before.len()..],
                "the window is the last records"
            );
            let got = replay_counts(&r.header, &r.state, &window);
            let prefix = replay_counts(&header, &[], before);
            let expected: Vec<u64> = whole.iter().zip(prefix).map(|(w, p)| w - p).collect();
            assert_eq!(got.to_vec(), expected, "window from record {k}");
            checked += usize::from(!r.state.is_empty() && got[7] > 0);
        }
        assert!(checked > 0, "some dump ends tasks made before its window");
    }

    #[test]
    fn the_hourly_bound_counts_the_last_hour() {
        let mut b = HourlyBound::default();
        assert!(b.allow(0.0, 2));
        assert!(b.allow(10.0, 2));
        assert!(!b.allow(20.0, 2));
        assert!(b.allow(3600.0, 2), "the first left the hour");
        assert!(!b.allow(3605.0, 2));
    }

    #[test]
    fn triggers_are_taken_once() {
        let t = Triggers::default();
        t.note(Trigger::Refused);
        t.note(Trigger::Signal);
        t.note(Trigger::Refused);
        assert_eq!(t.take(), [Trigger::Signal, Trigger::Refused]);
        assert!(t.take().is_empty());
        assert_eq!(
            dump_name("node 1", "20260101T000000Z", Trigger::SignalExit),
            "gpu-trace-node_1-20260101T000000Z-signal-exit.gtrace"
        );
    }

    /// `--dump-keep 2` over five dumps of `node`: its two newest stay (by the time in their
    /// names, then their number within a second — `-refused` is the first of its second,
    /// `-2-`, `-10-` later ones — not the order listed nor the names' sort); another host's
    /// dumps (`node-1`, whose names also start with `gpu-trace-node-`), a dump being written
    /// (`.NAME.tmp`) and other files stay.
    #[test]
    fn dump_keep_removes_this_host_s_oldest_dumps_only() {
        let names: Vec<String> = [
            "gpu-trace-node-20260101T000003Z-10-dropped.gtrace",
            "gpu-trace-node-20260101T000001Z-signal.gtrace",
            "gpu-trace-node-1-20250101T000000Z-signal.gtrace",
            ".gpu-trace-node-20250101T000000Z-signal.gtrace.tmp",
            "gpu-trace-node-20260101T000003Z-refused.gtrace",
            "gpu-trace-node-20260101T000003Z-2-signal-exit.gtrace",
            "gpu-trace-node-20260101T000002Z-signal.gtrace",
            "notes.txt",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            dumps_to_remove(&names, "node", 2),
            [
                "gpu-trace-node-20260101T000001Z-signal.gtrace",
                "gpu-trace-node-20260101T000002Z-signal.gtrace",
                "gpu-trace-node-20260101T000003Z-refused.gtrace",
            ]
        );
        assert_eq!(dumps_to_remove(&names, "node", 5), Vec::<String>::new());
        assert_eq!(dumps_to_remove(&names, "node", 1).len(), 4);
        assert_eq!(
            dumps_to_remove(&names, "node-1", 0),
            ["gpu-trace-node-1-20250101T000000Z-signal.gtrace"]
        );
        // The names dump_name makes are those dumps_to_remove counts, in their order.
        let first = dump_name("node 1", "20260101T000000Z", Trigger::Signal);
        let second = dump_name("node 1", "20260101T000000Z-2", Trigger::SignalExit);
        assert_eq!(
            dumps_to_remove(&[second.clone(), first.clone()], "node 1", 1),
            [first]
        );
    }
}
