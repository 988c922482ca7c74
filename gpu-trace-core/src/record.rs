//! The recording format written by `--record FILE` and read by `gpu-trace replay FILE`.
//!
//! ```text
//! magic     8 bytes  "GPUTRACE"
//! version   u32 LE   FORMAT_VERSION
//! hdr_len   u32 LE   length of the JSON header that follows
//! header    JSON     RecordingHeader (host, kernel, driver, clock offset, hooks, ...)
//! records   repeated: u32 LE length (> 0), then the ring-buffer record bytes, as the kernel
//!           programs wrote them (gpu-trace-common wire types)
//! trailer   u32 LE 0, then u32 LE length and a JSON RecordingTrailer (kernel counters at the
//!           end of the run); absent when the recording was cut short
//! ```
//!
//! Version 2 (written only by runs that sample the GPU share, `--share-interval`; the others
//! still write version 1, so that older readers replay them): among the records, a length with
//! its top bit set ([`SHARE_FLAG`]) announces a batch of NVML share samples, that many bytes
//! (without the bit) of JSON (`[ShareSample, ...]`), in the order the live run got them. A
//! reader of version 1 only refuses a version-2 file (its version check), never misreads it.
//! A recording that starts in the middle of a run (a `--record-rotate` piece, a
//! `--flight-recorder` dump) begins with *state records* (as many as its header's
//! `state_records`): the records that made the driver objects alive at its start
//! ([`crate::state_log`]), which [`RecordReader`] hands apart ([`RecordReader::state`]).
//! Replaying feeds the same bytes through the same decoder, model and output as the live run,
//! so it prints what the live run printed.

use std::io::{self, BufRead, Read, Write};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::model::stats::KernelCounters;

pub const MAGIC: &[u8; 8] = b"GPUTRACE";
pub const FORMAT_VERSION: u32 = 2;
/// The version of recordings without share samples (what older readers read).
pub const FORMAT_VERSION_PLAIN: u32 = 1;
/// Version 2: the top bit of a record length marks a batch of share samples.
pub const SHARE_FLAG: u32 = 1 << 31;

/// One item of a recording: a ring-buffer record, or (version 2) a batch of share samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Record(Vec<u8>),
    Share(Vec<crate::model::share::ShareSample>),
}
/// Records larger than this are refused as corrupt (the largest wire record is 264 bytes).
const MAX_RECORD: u32 = 64 * 1024;

#[derive(Debug, Error)]
pub enum RecordError {
    #[error("I/O error on the recording: {0}")]
    Io(#[from] io::Error),
    #[error("not a gpu-trace recording (bad magic); record one with `gpu-trace --record FILE`")]
    BadMagic,
    #[error(
        "recording format version {0} is not supported by this gpu-trace (it reads {FORMAT_VERSION_PLAIN} to {FORMAT_VERSION}); replay it with the gpu-trace that recorded it"
    )]
    Version(u32),
    #[error("recording header is not valid JSON: {0}")]
    Header(#[source] serde_json::Error),
    #[error("recording trailer is not valid JSON: {0}")]
    Trailer(#[source] serde_json::Error),
    #[error("corrupt recording: a share-sample batch is not valid JSON: {0}")]
    Share(#[source] serde_json::Error),
    #[error("corrupt recording: record length {0} at byte {1}")]
    BadLength(u32, u64),
}

/// Describes where and how a recording was made.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordingHeader {
    pub tool_version: String,
    pub host: String,
    pub kernel: String,
    pub driver: Option<String>,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC in ns at the start, to print wall-clock times.
    pub realtime_offset_ns: i128,
    /// Which hook served which event.
    pub hooks: Vec<String>,
    /// The command line of the recording run.
    pub argv: Vec<String>,
    /// The start-up inventory (late attach): processes that had a GPU open when tracing
    /// started. Absent in recordings made before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<crate::inventory::Inventory>,
    /// A recording that starts in the middle of a run (a `--record-rotate` piece, a
    /// `--flight-recorder` dump): its first this many records are *state records*, not events
    /// of its time: the records that made the driver objects alive at its start
    /// ([`crate::state_log`]). [`RecordReader`] hands them apart ([`RecordReader::state`]);
    /// replay feeds them to the trackers alone, counting nothing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub state_records: u64,
    /// The inventory's processes whose driver objects alive at the start are all among the
    /// state records (traced from their start): replay does not take them as pre-trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_pids: Vec<u32>,
}

/// Written when the run ends cleanly.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordingTrailer {
    pub kernel_counters: KernelCounters,
    pub duration_ns: u64,
    /// Records left out of this recording because its reader did not keep up (a FIFO or pipe
    /// that stalled); replay warns when not 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recording_lost: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The bytes a recording's start takes with `header` (magic, version, the JSON header).
pub fn header_len(header: &RecordingHeader) -> Result<u64, RecordError> {
    let json = serde_json::to_vec(header).map_err(RecordError::Header)?;
    Ok(16 + json.len() as u64)
}

pub struct RecordWriter<W: Write> {
    out: W,
    version: u32,
}

impl<W: Write> RecordWriter<W> {
    /// A version-1 recording (no share samples).
    pub fn new(out: W, header: &RecordingHeader) -> Result<Self, RecordError> {
        Self::with_version(out, header, FORMAT_VERSION_PLAIN)
    }

    /// A version-2 recording: it may hold share samples ([`Self::share`]).
    pub fn with_share(out: W, header: &RecordingHeader) -> Result<Self, RecordError> {
        Self::with_version(out, header, FORMAT_VERSION)
    }

    fn with_version(
        mut out: W,
        header: &RecordingHeader,
        version: u32,
    ) -> Result<Self, RecordError> {
        let json = serde_json::to_vec(header).map_err(RecordError::Header)?;
        out.write_all(MAGIC)?;
        out.write_all(&version.to_le_bytes())?;
        out.write_all(&(json.len() as u32).to_le_bytes())?;
        out.write_all(&json)?;
        Ok(Self { out, version })
    }

    /// A batch of share samples (version 2 only; a version-1 writer leaves them out, and says
    /// so: `Ok(false)`).
    pub fn share(
        &mut self,
        samples: &[crate::model::share::ShareSample],
    ) -> Result<bool, RecordError> {
        if self.version < FORMAT_VERSION {
            return Ok(false);
        }
        // A sample's JSON is under 200 bytes: 256 of them stay under the record limit.
        for chunk in samples.chunks(256) {
            let json = serde_json::to_vec(chunk).map_err(RecordError::Share)?;
            self.out
                .write_all(&(json.len() as u32 | SHARE_FLAG).to_le_bytes())?;
            self.out.write_all(&json)?;
        }
        Ok(true)
    }

    pub fn record(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        self.out.write_all(&(bytes.len() as u32).to_le_bytes())?;
        self.out.write_all(bytes)?;
        Ok(())
    }

    /// Flushes the records written so far.
    pub fn flush(&mut self) -> Result<(), RecordError> {
        Ok(self.out.flush()?)
    }

    /// The writer the records go to.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// The writer the records go to.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    pub fn finish(mut self, trailer: &RecordingTrailer) -> Result<W, RecordError> {
        let json = serde_json::to_vec(trailer).map_err(RecordError::Trailer)?;
        self.out.write_all(&0u32.to_le_bytes())?;
        self.out.write_all(&(json.len() as u32).to_le_bytes())?;
        self.out.write_all(&json)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

pub struct RecordReader<R: BufRead> {
    input: R,
    pub header: RecordingHeader,
    /// The state records ([`RecordingHeader::state_records`]), read with the header; the
    /// records [`Self::next_record`] hands out come after them.
    pub state: Vec<Vec<u8>>,
    pub trailer: Option<RecordingTrailer>,
    offset: u64,
    /// The file's format version.
    pub version: u32,
}

fn read_u32(input: &mut impl Read) -> Result<Option<u32>, io::Error> {
    let mut buf = [0u8; 4];
    match input.read_exact(&mut buf) {
        Ok(()) => Ok(Some(u32::from_le_bytes(buf))),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Fills `buf`; `false` when the input ended first (a recording cut short).
fn read_all_or_eof(input: &mut impl Read, buf: &mut [u8]) -> Result<bool, io::Error> {
    match input.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

impl<R: BufRead> RecordReader<R> {
    pub fn new(mut input: R) -> Result<Self, RecordError> {
        let mut magic = [0u8; 8];
        // A file too short for the magic is not a recording; any other read error (EISDIR, EIO)
        // is reported as itself.
        input.read_exact(&mut magic).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => RecordError::BadMagic,
            _ => RecordError::Io(e),
        })?;
        if &magic != MAGIC {
            return Err(RecordError::BadMagic);
        }
        let version = read_u32(&mut input)?.ok_or(RecordError::BadMagic)?;
        if !(FORMAT_VERSION_PLAIN..=FORMAT_VERSION).contains(&version) {
            return Err(RecordError::Version(version));
        }
        let len = read_u32(&mut input)?.ok_or(RecordError::BadMagic)?;
        if len > MAX_RECORD * 16 {
            return Err(RecordError::BadLength(len, 12));
        }
        let mut json = vec![0u8; len as usize];
        input.read_exact(&mut json)?;
        let header: RecordingHeader = serde_json::from_slice(&json).map_err(RecordError::Header)?;
        let mut reader = Self {
            input,
            header,
            state: Vec::new(),
            trailer: None,
            offset: 16 + len as u64,
            version,
        };
        while (reader.state.len() as u64) < reader.header.state_records {
            match reader.next_item()? {
                Some(Item::Record(r)) => reader.state.push(r),
                Some(Item::Share(_)) => {}
                None => break,
            }
        }
        Ok(reader)
    }

    /// The next record's bytes, or `None` at the end (the trailer, if any, is then in
    /// `self.trailer`).
    ///
    /// A recording cut short (the tracer was killed, the disk filled up) ends at any byte: an
    /// incomplete last record or trailer is the end of the recording, not an error, so that
    /// everything written before the cut can still be replayed.
    pub fn next_record(&mut self) -> Result<Option<Vec<u8>>, RecordError> {
        loop {
            match self.next_item()? {
                Some(Item::Record(r)) => return Ok(Some(r)),
                Some(Item::Share(_)) => {}
                None => return Ok(None),
            }
        }
    }

    /// The next item: a record, or (version 2) a batch of share samples; `None` at the end,
    /// as [`Self::next_record`].
    pub fn next_item(&mut self) -> Result<Option<Item>, RecordError> {
        let Some(len) = read_u32(&mut self.input)? else {
            return Ok(None);
        };
        if len == 0 {
            if let Some(tlen) = read_u32(&mut self.input)? {
                if tlen > MAX_RECORD {
                    return Err(RecordError::BadLength(tlen, self.offset));
                }
                let mut json = vec![0u8; tlen as usize];
                if read_all_or_eof(&mut self.input, &mut json)? {
                    self.trailer =
                        Some(serde_json::from_slice(&json).map_err(RecordError::Trailer)?);
                }
            }
            return Ok(None);
        }
        let share = self.version >= FORMAT_VERSION && len & SHARE_FLAG != 0;
        let len = if share { len & !SHARE_FLAG } else { len };
        if len > MAX_RECORD {
            return Err(RecordError::BadLength(len, self.offset));
        }
        let mut bytes = vec![0u8; len as usize];
        if !read_all_or_eof(&mut self.input, &mut bytes)? {
            return Ok(None);
        }
        self.offset += 4 + len as u64;
        if share {
            let samples = serde_json::from_slice(&bytes).map_err(RecordError::Share)?;
            return Ok(Some(Item::Share(samples)));
        }
        Ok(Some(Item::Record(current_layout(bytes))))
    }
}

/// A record as an earlier version's recording holds it, in today's layout: `TASK_CGROUP`'s
/// first layout (48 bytes, before `ns_pid`; the project's own H200 recordings have it)
/// widened with `ns_pid` 0 (not known). Any other item as it is: the wire format itself stays
/// exact ([`crate::wire::parse_record`] refuses every other length).
fn current_layout(mut bytes: Vec<u8>) -> Vec<u8> {
    use gpu_trace_common::{TaskCgroupRecord, record_kind};
    const FIRST: usize = std::mem::offset_of!(TaskCgroupRecord, ns_pid);
    if bytes.len() == FIRST && bytes.get(..4) == Some(&record_kind::TASK_CGROUP.to_le_bytes()[..]) {
        bytes.resize(size_of::<TaskCgroupRecord>(), 0);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> RecordingHeader {
        RecordingHeader {
            tool_version: "0.1.0".into(),
            host: "h".into(),
            kernel: "6.18".into(),
            driver: Some("nvidia 580".into()),
            realtime_offset_ns: 1_700_000_000_000_000_000,
            hooks: vec!["ioctl+close → raw_tp/sys_exit".into()],
            argv: vec!["gpu-trace".into()],
            inventory: None,
            ..Default::default()
        }
    }

    fn sample(pid: u32) -> crate::model::share::ShareSample {
        crate::model::share::ShareSample {
            gpu: 0,
            uuid: Some("GPU-1".into()),
            pid,
            ts_us: 1_795_711_117_879_126,
            sm: 87,
            mem: 6,
            enc: 0,
            dec: 0,
        }
    }

    /// Version 2 keeps the share batches in place among the records; `next_record` (what a
    /// caller that knows no samples reads) skips them; a version-1 writer leaves them out, so
    /// that its file stays readable by version-1 readers.
    #[test]
    fn share_batches_round_trip_in_version_2_only() {
        let mut w = RecordWriter::with_share(Vec::new(), &header()).unwrap();
        w.record(&[1, 2, 3]).unwrap();
        let batch: Vec<_> = (0..300).map(sample).collect();
        assert!(w.share(&batch).unwrap());
        w.record(&[4]).unwrap();
        let bytes = w.finish(&RecordingTrailer::default()).unwrap();
        assert_eq!(bytes[8..12], 2u32.to_le_bytes());
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        assert_eq!(r.next_item().unwrap(), Some(Item::Record(vec![1, 2, 3])));
        // 300 samples: two batches (256 + 44), each under the record limit.
        assert_eq!(
            r.next_item().unwrap(),
            Some(Item::Share(batch[..256].to_vec()))
        );
        assert_eq!(
            r.next_item().unwrap(),
            Some(Item::Share(batch[256..].to_vec()))
        );
        assert_eq!(r.next_item().unwrap(), Some(Item::Record(vec![4])));
        assert_eq!(r.next_item().unwrap(), None);
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        assert_eq!(r.next_record().unwrap(), Some(vec![1, 2, 3]));
        assert_eq!(r.next_record().unwrap(), Some(vec![4]));

        let mut w = RecordWriter::new(Vec::new(), &header()).unwrap();
        assert!(!w.share(&batch).unwrap());
        w.record(&[5]).unwrap();
        let bytes = w.finish(&RecordingTrailer::default()).unwrap();
        assert_eq!(bytes[8..12], 1u32.to_le_bytes());
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        assert_eq!(r.next_item().unwrap(), Some(Item::Record(vec![5])));
        assert_eq!(r.next_item().unwrap(), None);
    }

    /// A `TASK_CGROUP` of the first layout (48 bytes, before `ns_pid`) reads back in today's
    /// layout with `ns_pid` 0, and parses; the wire format refuses the 48 bytes themselves;
    /// a 48-byte item of another kind is left as it is.
    #[test]
    fn a_first_layout_task_cgroup_reads_back_widened() {
        use gpu_trace_common::{RecordHeader, TaskCgroupRecord, record_kind, zerocopy::IntoBytes};
        let rec = TaskCgroupRecord {
            hdr: RecordHeader {
                kind: record_kind::TASK_CGROUP,
                cpu: 1,
                ts_ns: 5,
                tgid: 4242,
                tid: 4242,
                comm: [0; 16],
            },
            cgroup_id: 0x1234,
            ns_pid: 7,
            _pad: 0,
        };
        let first = &rec.as_bytes()[..48];
        assert!(crate::wire::parse_record(first).is_err());
        let mut other = first.to_vec();
        other[0] = record_kind::PROCESS_EXIT as u8;
        let mut w = RecordWriter::new(Vec::new(), &header()).unwrap();
        w.record(first).unwrap();
        w.record(&other).unwrap();
        let bytes = w.finish(&RecordingTrailer::default()).unwrap();
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        let widened = r.next_record().unwrap().unwrap();
        assert_eq!(widened.len(), 56);
        match crate::wire::parse_record(&widened) {
            Ok(crate::wire::RawRecord::TaskCgroup(t)) => {
                assert_eq!((t.hdr.tgid, t.cgroup_id, t.ns_pid), (4242, 0x1234, 0));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.next_record().unwrap(), Some(other));
    }

    #[test]
    fn round_trip_keeps_header_records_and_trailer() {
        let mut w = RecordWriter::new(Vec::new(), &header()).unwrap();
        w.record(&[1, 2, 3]).unwrap();
        w.record(&[9; 264]).unwrap();
        let trailer = RecordingTrailer {
            kernel_counters: KernelCounters {
                dropped: 3,
                read_failed: 1,
                ..Default::default()
            },
            duration_ns: 5,
            recording_lost: 0,
        };
        let bytes = w.finish(&trailer).unwrap();
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        assert_eq!(r.header, header());
        assert_eq!(r.next_record().unwrap(), Some(vec![1, 2, 3]));
        assert_eq!(r.next_record().unwrap(), Some(vec![9; 264]));
        assert_eq!(r.next_record().unwrap(), None);
        assert_eq!(r.trailer, Some(trailer));
    }

    #[test]
    fn deny_counters_round_trip_and_are_unknown_in_older_trailers() {
        // A trailer written before the deny counters existed: not known, not 0.
        let old = r#"{"kernel_counters":{"dropped":1,"read_failed":0,"ignored":0,"emitted":5,"fd_lookup_failed":0,"denied":2,"skipped":0},"duration_ns":9}"#;
        let t: RecordingTrailer = serde_json::from_str(old).unwrap();
        assert_eq!(t.kernel_counters.denied, 2);
        assert_eq!(t.kernel_counters.denied_unread, None);
        assert_eq!(t.kernel_counters.deny_unfollowed, None);
        // Written by this version: kept through the recording, 0 included.
        let trailer = RecordingTrailer {
            kernel_counters: KernelCounters {
                denied: 4,
                denied_unread: Some(3),
                deny_unfollowed: Some(0),
                ..Default::default()
            },
            duration_ns: 5,
            recording_lost: 0,
        };
        let bytes = RecordWriter::new(Vec::new(), &header())
            .unwrap()
            .finish(&trailer)
            .unwrap();
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        assert_eq!(r.next_record().unwrap(), None);
        assert_eq!(r.trailer, Some(trailer));
    }

    #[test]
    fn cut_short_recording_reads_without_trailer() {
        let mut w = RecordWriter::new(Vec::new(), &header()).unwrap();
        w.record(&[7; 40]).unwrap();
        let mut bytes = w.out;
        bytes.extend_from_slice(&[40, 0]); // half a length field
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        assert_eq!(r.next_record().unwrap(), Some(vec![7; 40]));
        assert_eq!(r.next_record().unwrap(), None);
        assert_eq!(r.trailer, None);
    }

    #[test]
    fn recording_cut_inside_a_record_or_the_trailer_replays_what_was_complete() {
        let mut w = RecordWriter::new(Vec::new(), &header()).unwrap();
        w.record(&[7; 40]).unwrap();
        w.record(&[8; 48]).unwrap();
        let full = w.finish(&RecordingTrailer::default()).unwrap();
        let trailer_json = serde_json::to_vec(&RecordingTrailer::default())
            .unwrap()
            .len();
        let first_record_end = full.len() - (4 + 48) - 8 - trailer_json;
        // Every cut after the first record: the first record comes back, then the end, no error.
        for cut in first_record_end..full.len() {
            let mut r = RecordReader::new(&full[..cut]).unwrap();
            assert_eq!(r.next_record().unwrap(), Some(vec![7; 40]), "cut at {cut}");
            let second = r.next_record().unwrap();
            if second.is_some() {
                assert_eq!(second, Some(vec![8; 48]), "cut at {cut}");
                assert_eq!(r.next_record().unwrap(), None, "cut at {cut}");
            }
            assert_eq!(
                r.trailer, None,
                "cut at {cut}: an incomplete trailer is no trailer"
            );
        }
    }

    #[test]
    fn a_bad_trailer_is_called_a_trailer() {
        let mut bytes = RecordWriter::new(Vec::new(), &header()).unwrap().out;
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(b"{x}");
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        let err = r.next_record().unwrap_err();
        assert!(matches!(err, RecordError::Trailer(_)), "{err:?}");
        assert!(err.to_string().starts_with("recording trailer"), "{err}");
    }

    #[test]
    fn rejects_foreign_files_and_corrupt_lengths() {
        assert!(matches!(
            RecordReader::new(&b"NOTATRACE......."[..]),
            Err(RecordError::BadMagic)
        ));
        let mut bytes = RecordWriter::new(Vec::new(), &header()).unwrap().out;
        bytes.extend_from_slice(&(MAX_RECORD + 1).to_le_bytes());
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        assert!(matches!(r.next_record(), Err(RecordError::BadLength(..))));
        // A version newer than this reader's (version 2 is read since the share samples).
        let mut v3 = MAGIC.to_vec();
        v3.extend_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            RecordReader::new(&v3[..]),
            Err(RecordError::Version(3))
        ));
    }
}
