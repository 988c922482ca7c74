//! `--record-rotate`: a recording in pieces, each a complete recording that replays alone.
//!
//! [`Rotating`] writes the records it is given into piece 1, 2, … ([`piece_path`]: `FILE.0001`,
//! `FILE.0002`, …), each with the run's header, the processes alive at the piece's start as its
//! inventory ([`LiveSet`]) and, once it ends, a trailer with the kernel counters of its own
//! time. A piece is *due* ([`Rotating::due`]) after the first record that takes it to the size
//! limit, or that comes the duration limit or more after its first record (record time,
//! CLOCK_MONOTONIC); the caller then ends it with [`Rotating::rotate`] before the next record,
//! so that every record is in exactly one piece, in order. With `--record-keep N`, opening
//! piece `i` removes piece `i - N`.
//!
//! The caller supplies the files through a [`PieceStore`] (the live run: files behind a
//! writer thread; the tests: memory), and the kernel counters at each boundary: a piece's
//! trailer holds those counted between its boundaries, so that the pieces' counters add up to
//! the run's.

use std::{
    io::{self, Write},
    path::{Path, PathBuf},
};

use crate::{
    inventory::Inventory,
    live_set::LiveSet,
    model::stats::KernelCounters,
    record::{RecordError, RecordWriter, RecordingHeader, RecordingTrailer},
    state_log::{StateLog, start_header, write_state},
};

/// When a piece ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotateLimit {
    /// After the record that takes the piece (header included) to this many bytes.
    Bytes(u64),
    /// After the first record this many ns (record time) after the piece's first record.
    Nanos(u64),
}

/// Where the pieces go.
pub trait PieceStore {
    type Out: Write;
    /// Creates piece `index` (1, 2, …), empty.
    fn create(&mut self, index: u32) -> io::Result<Self::Out>;
    /// Records of piece `out` its writer could not keep (a queue that overflowed).
    fn lost(&self, _out: &Self::Out) -> u64 {
        0
    }
    /// Piece `index` is complete (trailer written): close it.
    fn close(&mut self, index: u32, out: Self::Out) -> io::Result<()>;
    /// Removes piece `index` (beyond the pieces kept).
    fn remove(&mut self, index: u32) -> io::Result<()>;
}

/// Piece `index` of the recording `path`: `path.0001`, `path.0002`, … (4 digits, more past
/// 9999), so that the pieces sort by name in their order.
pub fn piece_path(path: &Path, index: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{index:04}"));
    PathBuf::from(name)
}

/// `later - earlier`, field by field (what was counted in between).
pub fn counters_since(later: &KernelCounters, earlier: &KernelCounters) -> KernelCounters {
    let opt = |l: Option<u64>, e: Option<u64>| Some(l?.saturating_sub(e.unwrap_or(0)));
    KernelCounters {
        dropped: later.dropped.saturating_sub(earlier.dropped),
        read_failed: later.read_failed.saturating_sub(earlier.read_failed),
        ignored: later.ignored.saturating_sub(earlier.ignored),
        emitted: later.emitted.saturating_sub(earlier.emitted),
        fd_lookup_failed: later
            .fd_lookup_failed
            .saturating_sub(earlier.fd_lookup_failed),
        denied: later.denied.saturating_sub(earlier.denied),
        skipped: opt(later.skipped, earlier.skipped),
        denied_unread: opt(later.denied_unread, earlier.denied_unread),
        deny_unfollowed: opt(later.deny_unfollowed, earlier.deny_unfollowed),
    }
}

/// The open piece.
struct Piece<W: Write> {
    writer: RecordWriter<W>,
    /// Bytes written into it (header included, trailer not).
    bytes: u64,
    records: u64,
    first_ts: Option<u64>,
    /// Where its time starts: the run's start, or the first record (CLOCK_MONOTONIC ns).
    start_ns: u64,
    counters_at_start: KernelCounters,
}

/// A recording written in pieces (see the module documentation).
pub struct Rotating<S: PieceStore> {
    store: S,
    limit: RotateLimit,
    keep: Option<u32>,
    header: RecordingHeader,
    share: bool,
    live: LiveSet,
    /// The records that made the driver objects alive now: each piece's state records.
    state: StateLog,
    piece: Option<Piece<S::Out>>,
    index: u32,
    due: bool,
    /// The record that made the piece due came at this time (the next piece's start).
    due_ts: Option<u64>,
}

impl<S: PieceStore> Rotating<S> {
    /// Opens piece 1 with `header` (its inventory: the run's start-up inventory, also where
    /// the live processes start from). `share`: version 2, share samples kept
    /// ([`RecordWriter::with_share`]). `start_ns`: the run's start (CLOCK_MONOTONIC ns);
    /// `keep`: pieces kept (older ones removed), `None` all.
    pub fn new(
        mut store: S,
        header: RecordingHeader,
        share: bool,
        limit: RotateLimit,
        keep: Option<u32>,
        start_ns: u64,
    ) -> Result<Self, RecordError> {
        let base = header.inventory.clone().unwrap_or_default();
        let out = store.create(1)?;
        let state = StateLog::new();
        let piece = open(out, &header, &state, share, start_ns, Default::default())?;
        Ok(Self {
            store,
            limit,
            keep,
            live: LiveSet::new(&base),
            state,
            header: RecordingHeader {
                inventory: None,
                ..header
            },
            share,
            piece: Some(piece),
            index: 1,
            due: false,
            due_ts: None,
        })
    }

    /// One record into the open piece; [`Self::due`] says whether the piece is full now.
    pub fn record(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        let Some(piece) = self.piece.as_mut() else {
            return Ok(());
        };
        piece.writer.record(bytes)?;
        piece.bytes += 4 + bytes.len() as u64;
        piece.records += 1;
        self.live.observe(bytes);
        self.state.observe(bytes);
        let ts = crate::wire::header_of(bytes).map(|h| h.ts_ns);
        if let Some(ts) = ts {
            piece.first_ts.get_or_insert(ts);
        }
        let full = match self.limit {
            RotateLimit::Bytes(max) => piece.bytes >= max,
            RotateLimit::Nanos(max) => match (piece.first_ts, ts) {
                (Some(first), Some(ts)) => ts.saturating_sub(first) >= max,
                _ => false,
            },
        };
        if full && !self.due {
            self.due = true;
            self.due_ts = ts;
        }
        Ok(())
    }

    /// A batch of share samples into the open piece (see [`RecordWriter::share`]).
    pub fn share(
        &mut self,
        samples: &[crate::model::share::ShareSample],
    ) -> Result<bool, RecordError> {
        match self.piece.as_mut() {
            Some(p) => p.writer.share(samples),
            None => Ok(false),
        }
    }

    /// The open piece is full: [`Self::rotate`] before the next record.
    pub fn due(&self) -> bool {
        self.due
    }

    /// Whether the open piece has lasted `limit` by now (`now_ns`, CLOCK_MONOTONIC): a piece
    /// with records ends on time even when no record comes to end it.
    pub fn due_at(&mut self, now_ns: u64) -> bool {
        if let (RotateLimit::Nanos(max), Some(p)) = (self.limit, self.piece.as_ref())
            && p.records > 0
            && now_ns.saturating_sub(p.first_ts.unwrap_or(p.start_ns)) >= max
            && !self.due
        {
            self.due = true;
            self.due_ts = Some(now_ns);
        }
        self.due
    }

    /// Ends the open piece with its trailer (`counters`: the kernel's, read now) and opens the
    /// next one, whose inventory is the processes alive now; removes the piece beyond `keep`.
    /// `now_ns`: the boundary's time, when no record made the piece due.
    pub fn rotate(&mut self, counters: KernelCounters, now_ns: u64) -> Result<(), RecordError> {
        let boundary = self.due_ts.take().unwrap_or(now_ns);
        self.due = false;
        let Some(old) = self.piece.take() else {
            return Ok(());
        };
        self.end_piece(old, counters, boundary)?;
        self.index += 1;
        let header = start_header(&self.header, &self.live, &self.state, boundary);
        let out = self.store.create(self.index)?;
        let piece = open(out, &header, &self.state, self.share, boundary, counters)?;
        self.piece = Some(piece);
        if let Some(keep) = self.keep
            && self.index > keep
        {
            self.store.remove(self.index - keep)?;
        }
        Ok(())
    }

    /// Ends the last piece (`counters`: the run's, `end_ns`: its end, CLOCK_MONOTONIC); returns
    /// the store and how many pieces were written.
    pub fn finish(
        mut self,
        counters: KernelCounters,
        end_ns: u64,
    ) -> Result<(S, u32), RecordError> {
        if let Some(p) = self.piece.take() {
            self.end_piece(p, counters, end_ns)?;
        }
        Ok((self.store, self.index))
    }

    fn end_piece(
        &mut self,
        p: Piece<S::Out>,
        counters: KernelCounters,
        end_ns: u64,
    ) -> Result<(), RecordError> {
        let trailer = RecordingTrailer {
            kernel_counters: counters_since(&counters, &p.counters_at_start),
            duration_ns: end_ns.saturating_sub(p.start_ns),
            recording_lost: self.store.lost(p.writer.get_ref()),
        };
        let out = p.writer.finish(&trailer)?;
        self.store.close(self.index, out)?;
        Ok(())
    }

    /// Pieces end after a time (not a size).
    pub fn by_time(&self) -> bool {
        matches!(self.limit, RotateLimit::Nanos(_))
    }

    /// The piece being written (1, 2, …).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The open piece's writer.
    pub fn writer_mut(&mut self) -> Option<&mut S::Out> {
        self.piece.as_mut().map(|p| p.writer.get_mut())
    }

    /// The open piece's writer.
    pub fn writer(&self) -> Option<&S::Out> {
        self.piece.as_ref().map(|p| p.writer.get_ref())
    }

    /// The run's start-up inventory and what the records changed: the processes alive now.
    pub fn alive_now(&self, taken_ns: u64) -> Inventory {
        self.live.snapshot(taken_ns)
    }
}

fn open<W: Write>(
    out: W,
    header: &RecordingHeader,
    state: &StateLog,
    share: bool,
    start_ns: u64,
    counters_at_start: KernelCounters,
) -> Result<Piece<W>, RecordError> {
    let mut writer = if share {
        RecordWriter::with_share(out, header)?
    } else {
        RecordWriter::new(out, header)?
    };
    // The state records come on top of the size limit (a piece of them alone would be due at
    // once, every piece after it too).
    write_state(&mut writer, state)?;
    Ok(Piece {
        writer,
        bytes: crate::record::header_len(header)?,
        records: 0,
        first_ts: None,
        start_ns,
        counters_at_start,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::record::RecordReader;

    /// Pieces in memory: what was written per index, which were closed, which removed.
    #[derive(Default)]
    struct Memory {
        pieces: BTreeMap<u32, Vec<u8>>,
        closed: Vec<u32>,
        removed: Vec<u32>,
    }

    impl PieceStore for Memory {
        type Out = Vec<u8>;
        fn create(&mut self, index: u32) -> io::Result<Vec<u8>> {
            assert!(
                !self.pieces.contains_key(&index),
                "piece {index} made twice"
            );
            Ok(Vec::new())
        }
        fn close(&mut self, index: u32, out: Vec<u8>) -> io::Result<()> {
            self.closed.push(index);
            self.pieces.insert(index, out);
            Ok(())
        }
        fn remove(&mut self, index: u32) -> io::Result<()> {
            self.removed.push(index);
            self.pieces.remove(&index);
            Ok(())
        }
    }

    /// A GPU host's recording: its header and its records.
    pub(crate) fn fixture(name: &str) -> (RecordingHeader, Vec<Vec<u8>>) {
        let path = format!(
            "{}/../gpu-trace/tests/fixtures/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let bytes = std::fs::read(&path).unwrap();
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        let mut records = Vec::new();
        while let Some(rec) = r.next_record().unwrap() {
            records.push(rec);
        }
        (r.header, records)
    }

    /// The kernel counters after `n` records: each record counted as emitted, and one drop
    /// per 7 records (made up, so that each piece's share can be checked).
    fn counters_after(n: u64) -> KernelCounters {
        KernelCounters {
            emitted: n,
            dropped: n / 7,
            ..Default::default()
        }
    }

    struct Written {
        store: Memory,
        pieces: u32,
        /// The first record of each piece, as an index into the run's records.
        starts: Vec<usize>,
    }

    /// Writes `records` as the live run does: each record, then the rotation when due.
    fn write(
        header: &RecordingHeader,
        records: &[Vec<u8>],
        limit: RotateLimit,
        keep: Option<u32>,
    ) -> Written {
        let mut w =
            Rotating::new(Memory::default(), header.clone(), false, limit, keep, 0).unwrap();
        let mut starts = vec![0];
        for (i, rec) in records.iter().enumerate() {
            w.record(rec).unwrap();
            if w.due() {
                w.rotate(counters_after(i as u64 + 1), 0).unwrap();
                starts.push(i + 1);
            }
        }
        let end_ns = records
            .iter()
            .filter_map(|r| crate::wire::header_of(r))
            .map(|h| h.ts_ns)
            .max()
            .unwrap();
        let (store, pieces) = w
            .finish(counters_after(records.len() as u64), end_ns + 1)
            .unwrap();
        // The last piece may be empty (the last record filled the one before).
        if starts.last() == Some(&records.len()) {
            starts.pop();
        }
        Written {
            store,
            pieces,
            starts,
        }
    }

    fn read(bytes: &[u8]) -> (RecordingHeader, Vec<Vec<u8>>, Option<RecordingTrailer>) {
        let mut r = RecordReader::new(bytes).unwrap();
        let mut records = Vec::new();
        while let Some(rec) = r.next_record().unwrap() {
            records.push(rec);
        }
        (r.header, records, r.trailer)
    }

    /// The pieces, read one by one, hold the run's records in order, each once; each has its
    /// header and a trailer whose counters are its own records' (the made-up `emitted` is one
    /// per record) and whose durations add up to the run's; no piece passes the size limit
    /// (its state records apart) by more than its last record.
    #[test]
    fn pieces_hold_every_record_once_and_their_counters_add_up() {
        let (header, records) = fixture("ctx_churn.gtrace");
        const LIMIT: u64 = 8192;
        let w = write(&header, &records, RotateLimit::Bytes(LIMIT), None);
        assert!(w.pieces > 10, "{} pieces: the test must rotate", w.pieces);
        assert_eq!(w.store.closed, (1..=w.pieces).collect::<Vec<_>>());
        let mut all = Vec::new();
        let (mut emitted, mut dropped, mut duration) = (0, 0, 0);
        for (i, bytes) in &w.store.pieces {
            let (h, recs, trailer) = read(bytes);
            assert_eq!(h.host, header.host, "piece {i}: the run's header");
            let trailer = trailer.unwrap_or_else(|| panic!("piece {i} has no trailer"));
            assert_eq!(
                trailer.kernel_counters.emitted,
                recs.len() as u64,
                "piece {i}"
            );
            emitted += trailer.kernel_counters.emitted;
            dropped += trailer.kernel_counters.dropped;
            duration += trailer.duration_ns;
            let last = recs.last().map_or(0, |r| 4 + r.len() as u64);
            let trailer_len = 8 + serde_json::to_vec(&trailer).unwrap().len() as u64;
            // The state records come on top of the limit.
            let state = RecordReader::new(&bytes[..]).unwrap().state;
            let state_len: u64 = state.iter().map(|r| 4 + r.len() as u64).sum();
            assert!(
                bytes.len() as u64 - trailer_len - state_len < LIMIT + last,
                "piece {i}: {} bytes",
                bytes.len()
            );
            all.extend(recs);
        }
        assert_eq!(
            all, records,
            "the pieces hold the run's records, in order, once"
        );
        let total = counters_after(records.len() as u64);
        assert_eq!((emitted, dropped), (total.emitted, total.dropped));
        let end = records
            .iter()
            .filter_map(|r| crate::wire::header_of(r))
            .map(|h| h.ts_ns)
            .max()
            .unwrap();
        assert_eq!(
            duration,
            end + 1,
            "the pieces' durations add up to the run's"
        );
    }

    /// Each piece's inventory is the processes alive at its start: those of the run's
    /// inventory and those with a record before it, less those whose exit came before it.
    #[test]
    fn each_piece_names_the_processes_alive_at_its_start() {
        use gpu_trace_common::record_kind;
        let (header, records) = fixture("ctx_churn.gtrace");
        let w = write(&header, &records, RotateLimit::Bytes(4096), None);
        let base: Vec<u32> = (header.inventory.iter())
            .flat_map(|i| i.processes.iter().map(|p| p.pid))
            .collect();
        let mut checked_exit = false;
        for (n, &start) in w.starts.iter().enumerate() {
            let mut alive: std::collections::BTreeSet<u32> = base.iter().copied().collect();
            for rec in &records[..start] {
                let h = crate::wire::header_of(rec).unwrap();
                if h.kind == record_kind::PROCESS_EXIT {
                    alive.remove(&h.tgid);
                    checked_exit = true;
                } else if !matches!(
                    h.kind,
                    crate::user_records::user_kind::API_SYMBOL
                        | crate::user_records::user_kind::API_STATS
                ) {
                    alive.insert(h.tgid);
                }
            }
            let (h, _, _) = read(&w.store.pieces[&(n as u32 + 1)]);
            // The fixture predates the inventory: its first piece has the run's header's, none.
            let inv = h.inventory.or((n == 0).then(Inventory::default));
            let inv = inv.expect("every later piece has an inventory");
            let pids: std::collections::BTreeSet<u32> =
                inv.processes.iter().map(|p| p.pid).collect();
            assert_eq!(pids, alive, "piece {}", n + 1);
        }
        assert!(
            checked_exit,
            "the fixture has a process exit before a boundary"
        );
    }

    /// Every piece replays alone through the pipeline, its state records first: nothing
    /// malformed, and the pieces' counts of events add up exactly to the whole recording's,
    /// `TASK_DESTROY` of the tasks created in an earlier piece included (their state records
    /// count no event), and no `PRETRACE_END` where the whole recording has none.
    #[test]
    fn each_piece_replays_alone() {
        for name in ["two_streams.gtrace", "ctx_churn.gtrace"] {
            pieces_replay_alone(name);
        }
    }

    /// The counts of one replay: malformed, decode errors, then the events by kind.
    pub(crate) fn replay_counts(
        h: &RecordingHeader,
        state: &[Vec<u8>],
        recs: &[Vec<u8>],
    ) -> [u64; 10] {
        use crate::pipeline::{Pipeline, PipelineConfig};
        let config = PipelineConfig::json_for_tests(true);
        let mut p = Pipeline::new(config, Vec::new());
        p.start(h, state).unwrap();
        for r in recs {
            p.feed(r).unwrap();
        }
        let s = p.stats();
        [
            s.malformed,
            s.decode_errors,
            s.task_init,
            s.schedule,
            s.schedule_refused,
            s.work_submit,
            s.sched_update,
            s.task_destroy,
            s.task_destroy_implicit,
            s.pretrace_end,
        ]
    }

    fn pieces_replay_alone(name: &str) {
        let (header, records) = fixture(name);
        let whole = replay_counts(&header, &[], &records);
        // Tasks made and ended, in pieces apart once cut.
        assert!(
            whole[2] > 0 && whole[3] > 0 && whole[7] > 0,
            "{name}: {whole:?}"
        );
        let w = write(&header, &records, RotateLimit::Bytes(4096), None);
        assert!(w.pieces > 3);
        let mut sum = [0; 10];
        let mut carried = 0;
        for bytes in w.store.pieces.values() {
            let r = RecordReader::new(&bytes[..]).unwrap();
            assert_eq!(r.state.len() as u64, r.header.state_records);
            carried += r.state.len();
            let (h, recs, _) = read(bytes);
            let got = replay_counts(&h, &r.state, &recs);
            for (s, g) in sum.iter_mut().zip(got) {
                *s += g;
            }
        }
        assert!(carried > 0, "{name}: some piece starts with live tasks");
        assert_eq!(sum, whole, "{name}");
    }

    /// `--record-keep 3`: the oldest pieces are removed as new ones open, the last 3 stay.
    #[test]
    fn keep_removes_the_oldest_pieces() {
        let (header, records) = fixture("two_streams.gtrace");
        let w = write(&header, &records, RotateLimit::Bytes(2048), Some(3));
        assert!(w.pieces > 5);
        let kept: Vec<u32> = w.store.pieces.keys().copied().collect();
        assert_eq!(kept, (w.pieces - 2..=w.pieces).collect::<Vec<_>>());
        assert_eq!(w.store.removed, (1..=w.pieces - 3).collect::<Vec<_>>());
    }

    /// A duration limit in record time: a piece's records lie within the limit of its first,
    /// but for the last one, which passed it and ended the piece.
    #[test]
    fn a_duration_limit_ends_pieces_by_record_time() {
        let (header, records) = fixture("ctx_churn.gtrace");
        const D: u64 = 200_000_000;
        let w = write(&header, &records, RotateLimit::Nanos(D), None);
        assert!(w.pieces > 2, "{} pieces", w.pieces);
        let mut all = Vec::new();
        for (i, bytes) in &w.store.pieces {
            let (_, recs, _) = read(bytes);
            let ts: Vec<u64> = recs
                .iter()
                .map(|r| crate::wire::header_of(r).unwrap().ts_ns)
                .collect();
            let first = ts[0];
            let past = ts.iter().filter(|&&t| t - first >= D).count();
            if *i < w.pieces {
                assert_eq!(past, 1, "piece {i}: only its last record is past the limit");
                assert!(ts.last().unwrap() - first >= D, "piece {i}");
            } else {
                assert!(past <= 1, "piece {i}");
            }
            all.extend(recs);
        }
        assert_eq!(all, records);
    }

    #[test]
    fn piece_names_sort_in_order() {
        let p = Path::new("/tmp/run.gtrace");
        assert_eq!(piece_path(p, 1), Path::new("/tmp/run.gtrace.0001"));
        assert_eq!(piece_path(p, 12345), Path::new("/tmp/run.gtrace.12345"));
    }
}
