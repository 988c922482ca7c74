//! Ring-buffer bytes → typed records, and back.
//!
//! The kernel programs write `#[repr(C)]` records from `gpu-trace-common`; every record starts
//! with a [`RecordHeader`] whose first `u32` is a [`record_kind`] tag. This module checks the tag
//! and the length, and copies the bytes out (ring-buffer items and slices of recording files
//! carry no alignment guarantee). The records derive zerocopy's `FromBytes` and `IntoBytes`
//! (`gpu-trace-common`'s `wire` feature): that they have no padding and that every bit pattern is
//! a valid record is checked when they compile, not asserted here by hand.
//!
//! It also serializes records back to bytes (recording files, test fixtures) and reads a
//! *record stream*: records concatenated, each preceded by its length as a little-endian `u32`
//! (see [`records_from_stream`] and [`append_to_stream`]). Captured fixtures use that format.

use compact_str::CompactString;
use std::mem::{offset_of, size_of};

use gpu_trace_common::{
    DeepRecord, KfdIoctlRecord, KfdQueueRecord, NvIoctlRecord, NvSchedRecord, RecordHeader,
    TaskCgroupRecord, TaskRecord,
    api::{ApiCallRecord, ApiRecursionRecord, ApiTagRecord},
    record_kind,
    zerocopy::{FromBytes, IntoBytes},
};

use crate::user_records::{
    ATTRIBUTION_PATH_MAX, ApiContextRecord, ApiStatsRecord, ApiSymbolRecord, AttributionHead,
    user_kind,
};
use thiserror::Error;

use crate::event::Origin;

/// One decoded ring-buffer item.
// Records are short-lived (parsed, decoded, dropped); boxing the ioctl record would only add an
// allocation per record.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawRecord {
    /// A completed ioctl on a watched NVIDIA device ([`record_kind::NV_IOCTL`]).
    NvIoctl(NvIoctlRecord),
    /// The last thread of a tracked process exited ([`record_kind::PROCESS_EXIT`]).
    ProcessExit(TaskRecord),
    /// A tracked process closed a file descriptor ([`record_kind::FD_CLOSE`]).
    FdClose(TaskRecord),
    /// A completed ioctl on `/dev/kfd` ([`record_kind::KFD_IOCTL`]).
    KfdIoctl(KfdIoctlRecord),
    /// The KFD queue manager built a queue ([`record_kind::KFD_QUEUE`], deep hook).
    KfdQueue(KfdQueueRecord),
    /// A driver-internal step ([`record_kind::DEEP`], deep hook).
    Deep(DeepRecord),
    /// A gpu_ext scheduling hook of a patched NVIDIA driver ran ([`record_kind::NV_SCHED`]).
    NvSched(NvSchedRecord),
    /// The cgroup a process runs in ([`record_kind::TASK_CGROUP`]).
    TaskCgroup(TaskCgroupRecord),
    /// What userspace resolved a [`RawRecord::TaskCgroup`] to ([`user_kind::ATTRIBUTION`]).
    Attribution(Attribution),
    /// The API calls open on a thread, by cookie, before its driver record
    /// ([`record_kind::API_TAG`], `gpu-trace --api`).
    ApiTag(ApiTagRecord),
    /// What userspace resolved a [`RawRecord::ApiTag`] to: the calls' names
    /// ([`user_kind::API_CONTEXT`]).
    ApiContext(ApiContextRecord),
    /// One completed API call ([`record_kind::API_CALL`], `--api-calls`).
    ApiCall(ApiCallRecord),
    /// An API call re-entered on a thread, or a thread past the depth cap
    /// ([`record_kind::API_RECURSION`]).
    ApiRecursion(ApiRecursionRecord),
    /// The names behind an attach cookie ([`user_kind::API_SYMBOL`], userspace).
    ApiSymbol(ApiSymbolRecord),
    /// A process's calls of one cookie so far ([`user_kind::API_STATS`], userspace).
    ApiStats(ApiStatsRecord),
}

/// A [`user_kind::ATTRIBUTION`] record: its head and the cgroup path that follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attribution {
    pub head: AttributionHead,
    /// The whole record, head and path.
    bytes: Vec<u8>,
}

impl Attribution {
    /// Builds the record for `task_cgroup`'s process: `path` (cut to
    /// [`ATTRIBUTION_PATH_MAX`] bytes; `None`: not resolved) and its namespaced PID.
    pub fn new(task_cgroup: &TaskCgroupRecord, path: Option<&str>, ns_pid: Option<u32>) -> Self {
        let path = path.map_or(&[][..], |p| {
            &p.as_bytes()[..p.len().min(ATTRIBUTION_PATH_MAX)]
        });
        let head = AttributionHead {
            hdr: RecordHeader {
                kind: user_kind::ATTRIBUTION,
                ..task_cgroup.hdr
            },
            cgroup_id: task_cgroup.cgroup_id,
            ns_pid: ns_pid.unwrap_or(0),
            path_len: path.len() as u32,
        };
        let mut bytes = head.as_bytes().to_vec();
        bytes.extend_from_slice(path);
        Self { head, bytes }
    }

    /// The cgroup path (relative to the cgroup2 root), `None` when it was not resolved. Bytes
    /// that are not UTF-8 are kept as `crate::escape` describes.
    pub fn path(&self) -> Option<String> {
        let path = &self.bytes[size_of::<AttributionHead>()..];
        (!path.is_empty()).then(|| crate::escape::decode_lossless(path))
    }

    /// The process's PID in its own PID namespace, when that is not the host's.
    pub fn ns_pid(&self) -> Option<u32> {
        (self.head.ns_pid != 0).then_some(self.head.ns_pid)
    }
}

/// Why bytes could not be read as a record or a record stream.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the 4-byte type tag.
    #[error("record of {len} bytes is too short to hold a type tag")]
    NoTag {
        /// Bytes available.
        len: usize,
    },
    /// The type tag is not one of [`record_kind`].
    #[error("unknown record kind {kind} ({len} bytes)")]
    UnknownKind {
        /// The tag read.
        kind: u32,
        /// Bytes in the record.
        len: usize,
    },
    /// The record's length does not match its kind's layout.
    #[error("record of kind {kind} has {len} bytes, expected {expected}")]
    BadLength {
        /// The tag read.
        kind: u32,
        /// Bytes in the record.
        len: usize,
        /// The size of the kind's `#[repr(C)]` struct.
        expected: usize,
    },
    /// A record stream ended inside a length prefix or a record.
    #[error("record stream truncated at byte {offset}: need {need} more bytes, have {have}")]
    TruncatedStream {
        /// Offset in the stream where the incomplete item starts.
        offset: usize,
        /// Bytes the item needs.
        need: usize,
        /// Bytes left in the stream.
        have: usize,
    },
    /// A record inside a stream is malformed.
    #[error("record at byte {offset} of the stream: {source}")]
    InStream {
        /// Offset of the record's length prefix in the stream.
        offset: usize,
        /// What was wrong with the record.
        #[source]
        source: Box<WireError>,
    },
}

/// The header of a record (its kind and process) without parsing the rest; `None` when the
/// bytes are too short to hold one.
pub fn header_of(bytes: &[u8]) -> Option<RecordHeader> {
    RecordHeader::read_from_prefix(bytes).ok().map(|(h, _)| h)
}

/// A record of kind `kind` whose layout is `T`: exactly `size_of::<T>()` bytes, copied out.
#[inline(always)]
fn read<T: FromBytes>(kind: u32, bytes: &[u8]) -> Result<T, WireError> {
    T::read_from_bytes(bytes).map_err(|_| WireError::BadLength {
        kind,
        len: bytes.len(),
        expected: size_of::<T>(),
    })
}

/// Parses one ring-buffer item (or one record of a recording file).
///
/// The length must equal the size of the kind's struct exactly: a mismatch means userspace and
/// the kernel programs disagree on the layout.
#[inline]
pub fn parse_record(bytes: &[u8]) -> Result<RawRecord, WireError> {
    let Some(tag) = bytes.get(..4) else {
        return Err(WireError::NoTag { len: bytes.len() });
    };
    let kind = u32::from_le_bytes([tag[0], tag[1], tag[2], tag[3]]);
    Ok(match kind {
        record_kind::NV_IOCTL => RawRecord::NvIoctl(read(kind, bytes)?),
        record_kind::PROCESS_EXIT => RawRecord::ProcessExit(read(kind, bytes)?),
        record_kind::FD_CLOSE => RawRecord::FdClose(read(kind, bytes)?),
        record_kind::KFD_IOCTL => RawRecord::KfdIoctl(read(kind, bytes)?),
        record_kind::KFD_QUEUE => RawRecord::KfdQueue(read(kind, bytes)?),
        record_kind::DEEP => RawRecord::Deep(read(kind, bytes)?),
        record_kind::NV_SCHED => RawRecord::NvSched(read(kind, bytes)?),
        record_kind::TASK_CGROUP => RawRecord::TaskCgroup(read(kind, bytes)?),
        user_kind::ATTRIBUTION => RawRecord::Attribution(attribution(bytes)?),
        record_kind::API_TAG => RawRecord::ApiTag(read(kind, bytes)?),
        user_kind::API_CONTEXT => RawRecord::ApiContext(read(kind, bytes)?),
        record_kind::API_CALL => RawRecord::ApiCall(read(kind, bytes)?),
        record_kind::API_RECURSION => RawRecord::ApiRecursion(read(kind, bytes)?),
        user_kind::API_SYMBOL => RawRecord::ApiSymbol(read(kind, bytes)?),
        user_kind::API_STATS => RawRecord::ApiStats(read(kind, bytes)?),
        _ => {
            return Err(WireError::UnknownKind {
                kind,
                len: bytes.len(),
            });
        }
    })
}

/// An `ATTRIBUTION` record: its head, then `path_len` (at most [`ATTRIBUTION_PATH_MAX`]) bytes.
fn attribution(bytes: &[u8]) -> Result<Attribution, WireError> {
    let kind = user_kind::ATTRIBUTION;
    let head = size_of::<AttributionHead>();
    let Ok((h, _)) = AttributionHead::read_from_prefix(bytes) else {
        return Err(WireError::BadLength {
            kind,
            len: bytes.len(),
            expected: head,
        });
    };
    let expected = head + (h.path_len as usize).min(ATTRIBUTION_PATH_MAX + 1);
    if bytes.len() != expected || h.path_len as usize > ATTRIBUTION_PATH_MAX {
        return Err(WireError::BadLength {
            kind,
            len: bytes.len(),
            expected,
        });
    }
    Ok(Attribution {
        head: h,
        bytes: bytes.to_vec(),
    })
}

// Every record starts with its header, whose first field is the type tag: `parse_record` reads
// the tag before it knows the layout. (The sizes are asserted in `gpu-trace-common`.)
const _: () = assert!(offset_of!(RecordHeader, kind) == 0);
const _: () = assert!(offset_of!(NvIoctlRecord, hdr) == 0);
const _: () = assert!(offset_of!(TaskRecord, hdr) == 0);
const _: () = assert!(offset_of!(KfdIoctlRecord, hdr) == 0);
const _: () = assert!(offset_of!(KfdQueueRecord, hdr) == 0);
const _: () = assert!(offset_of!(DeepRecord, hdr) == 0);
const _: () = assert!(offset_of!(NvSchedRecord, hdr) == 0);
const _: () = assert!(offset_of!(TaskCgroupRecord, hdr) == 0);
const _: () = assert!(offset_of!(AttributionHead, hdr) == 0);
const _: () = assert!(offset_of!(ApiTagRecord, hdr) == 0);
const _: () = assert!(offset_of!(ApiContextRecord, hdr) == 0);
const _: () = assert!(offset_of!(ApiCallRecord, hdr) == 0);
const _: () = assert!(offset_of!(ApiRecursionRecord, hdr) == 0);
const _: () = assert!(offset_of!(ApiSymbolRecord, hdr) == 0);
const _: () = assert!(offset_of!(ApiStatsRecord, hdr) == 0);

/// The bytes of a [`KfdQueueRecord`], as the kernel programs write them.
pub fn kfd_queue_bytes(rec: &KfdQueueRecord) -> &[u8] {
    rec.as_bytes()
}

/// The bytes of an [`NvSchedRecord`], as the kernel programs write them.
pub fn nv_sched_bytes(rec: &NvSchedRecord) -> &[u8] {
    rec.as_bytes()
}

/// The bytes of a [`DeepRecord`], as the kernel programs write them.
pub fn deep_bytes(rec: &DeepRecord) -> &[u8] {
    rec.as_bytes()
}

/// The bytes of a [`KfdIoctlRecord`], as the kernel programs write them.
pub fn kfd_ioctl_bytes(rec: &KfdIoctlRecord) -> &[u8] {
    rec.as_bytes()
}

/// The bytes of an [`NvIoctlRecord`], as the kernel programs write them.
pub fn nv_ioctl_bytes(rec: &NvIoctlRecord) -> &[u8] {
    rec.as_bytes()
}

/// The bytes of a [`TaskRecord`], as the kernel programs write them.
pub fn task_bytes(rec: &TaskRecord) -> &[u8] {
    rec.as_bytes()
}

impl RawRecord {
    /// The record's bytes, as the kernel programs write them ([`parse_record`] reads them back).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::NvIoctl(r) => nv_ioctl_bytes(r),
            Self::ProcessExit(r) | Self::FdClose(r) => task_bytes(r),
            Self::KfdIoctl(r) => kfd_ioctl_bytes(r),
            Self::KfdQueue(r) => kfd_queue_bytes(r),
            Self::Deep(r) => deep_bytes(r),
            Self::NvSched(r) => nv_sched_bytes(r),
            Self::TaskCgroup(r) => r.as_bytes(),
            Self::Attribution(a) => &a.bytes,
            Self::ApiTag(r) => r.as_bytes(),
            Self::ApiContext(r) => r.as_bytes(),
            Self::ApiCall(r) => r.as_bytes(),
            Self::ApiRecursion(r) => r.as_bytes(),
            Self::ApiSymbol(r) => r.as_bytes(),
            Self::ApiStats(r) => r.as_bytes(),
        }
    }

    /// The common header.
    pub fn header(&self) -> &RecordHeader {
        match self {
            Self::NvIoctl(r) => &r.hdr,
            Self::ProcessExit(r) | Self::FdClose(r) => &r.hdr,
            Self::KfdIoctl(r) => &r.hdr,
            Self::KfdQueue(r) => &r.hdr,
            Self::Deep(r) => &r.hdr,
            Self::NvSched(r) => &r.hdr,
            Self::TaskCgroup(r) => &r.hdr,
            Self::Attribution(a) => &a.head.hdr,
            Self::ApiTag(r) => &r.hdr,
            Self::ApiContext(r) => &r.hdr,
            Self::ApiCall(r) => &r.hdr,
            Self::ApiRecursion(r) => &r.hdr,
            Self::ApiSymbol(r) => &r.hdr,
            Self::ApiStats(r) => &r.hdr,
        }
    }

    /// Where the record was produced: time, CPU, process, thread and thread name.
    pub fn origin(&self) -> Origin {
        origin(self.header())
    }
}

/// An [`Origin`] from a record header.
pub fn origin(hdr: &RecordHeader) -> Origin {
    Origin {
        ts_ns: hdr.ts_ns,
        cpu: hdr.cpu,
        pid: hdr.tgid,
        tid: hdr.tid,
        comm: comm_inline(&hdr.comm),
    }
}

/// The last thread name decoded, by its raw bytes: consecutive records of one thread (the
/// usual case) reuse it instead of decoding the name again ([`CommCache::origin`]).
#[derive(Clone, Debug, Default)]
pub struct CommCache {
    raw: Option<[u8; 16]>,
    name: CompactString,
}

impl CommCache {
    /// [`origin`] of `hdr`, its name decoded only when it differs from the last one's.
    pub fn origin(&mut self, hdr: &RecordHeader) -> Origin {
        if self.raw != Some(hdr.comm) {
            self.name = comm_inline(&hdr.comm);
            self.raw = Some(hdr.comm);
        }
        Origin {
            ts_ns: hdr.ts_ns,
            cpu: hdr.cpu,
            pid: hdr.tgid,
            tid: hdr.tid,
            comm: self.name.clone(),
        }
    }
}

/// A `comm` field as text: up to the first NUL, every byte kept (bytes that are not UTF-8 are
/// carried as described in [`crate::escape`]; print it through that module).
pub fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    match std::str::from_utf8(&comm[..end]) {
        // Every record names its thread: ASCII, the usual case, is the text itself.
        Ok(ascii) if ascii.is_ascii() => ascii.to_owned(),
        _ => crate::escape::decode_lossless(comm),
    }
}

/// [`comm_to_string`] held inline (no allocation for the usual ASCII name of at most 15
/// bytes): the [`Origin::comm`] of every record.
pub fn comm_inline(comm: &[u8]) -> CompactString {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    match std::str::from_utf8(&comm[..end]) {
        Ok(ascii) if ascii.is_ascii() => CompactString::new(ascii),
        _ => crate::escape::decode_lossless(comm).into(),
    }
}

/// Appends one record to a record stream: its length as a little-endian `u32`, then its bytes.
pub fn append_to_stream(stream: &mut Vec<u8>, record_bytes: &[u8]) {
    let len = u32::try_from(record_bytes.len()).expect("record larger than 4 GiB");
    stream.extend_from_slice(&len.to_le_bytes());
    stream.extend_from_slice(record_bytes);
}

/// Reads a record stream: records concatenated, each preceded by its length as a
/// little-endian `u32`. This is the fixture format for captured records; an empty input is an
/// empty stream.
pub fn records_from_stream(bytes: &[u8]) -> Result<Vec<RawRecord>, WireError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let Some(prefix) = rest.get(..4) else {
            return Err(WireError::TruncatedStream {
                offset: at,
                need: 4,
                have: rest.len(),
            });
        };
        let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        let Some(body) = rest[4..].get(..len) else {
            return Err(WireError::TruncatedStream {
                offset: at,
                need: 4 + len,
                have: rest.len(),
            });
        };
        let rec = parse_record(body).map_err(|e| WireError::InStream {
            offset: at,
            source: Box::new(e),
        })?;
        out.push(rec);
        at += 4 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_trace_common::nv_flags;

    fn header(kind: u32) -> RecordHeader {
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"python");
        RecordHeader {
            kind,
            cpu: 3,
            ts_ns: 0x1122_3344_5566_7788,
            tgid: 4242,
            tid: 4243,
            comm,
        }
    }

    fn nv_record() -> NvIoctlRecord {
        let mut params = [0u8; gpu_trace_common::NV_PARAMS_MAX];
        params[12..16].copy_from_slice(&0xA06Cu32.to_le_bytes());
        let mut sub = [0u8; gpu_trace_common::NV_SUB_MAX];
        sub[12] = 1;
        NvIoctlRecord {
            hdr: header(record_kind::NV_IOCTL),
            ret: -1,
            fd: 7,
            ioctl_cmd: 0xC030_462B,
            rdev: gpu_trace_common::kernel_dev(195, 255),
            escape: 0x2B,
            param_size: 48,
            flags: nv_flags::SUB_TRUNCATED,
            params_len: 48,
            sub_len: 20,
            params,
            sub,
        }
    }

    /// The byte layout the kernel writes, built field by field from the documented offsets (not
    /// through the struct), so that the parser is checked against the layout itself.
    fn nv_record_bytes_by_hand() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&record_kind::NV_IOCTL.to_le_bytes()); // kind @0
        b.extend_from_slice(&3u32.to_le_bytes()); // cpu @4
        b.extend_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes()); // ts_ns @8
        b.extend_from_slice(&4242u32.to_le_bytes()); // tgid @16
        b.extend_from_slice(&4243u32.to_le_bytes()); // tid @20
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"python");
        b.extend_from_slice(&comm); // comm @24
        b.extend_from_slice(&(-1i64).to_le_bytes()); // ret @40
        b.extend_from_slice(&7i32.to_le_bytes()); // fd @48
        b.extend_from_slice(&0xC030_462Bu32.to_le_bytes()); // ioctl_cmd @52
        b.extend_from_slice(&((195u32 << 20) | 255).to_le_bytes()); // rdev @56
        b.extend_from_slice(&0x2Bu32.to_le_bytes()); // escape @60
        b.extend_from_slice(&48u32.to_le_bytes()); // param_size @64
        b.extend_from_slice(&nv_flags::SUB_TRUNCATED.to_le_bytes()); // flags @68
        b.extend_from_slice(&48u32.to_le_bytes()); // params_len @72
        b.extend_from_slice(&20u32.to_le_bytes()); // sub_len @76
        let mut params = [0u8; 48];
        params[12..16].copy_from_slice(&0xA06Cu32.to_le_bytes());
        b.extend_from_slice(&params); // params @80
        let mut sub = [0u8; 136];
        sub[12] = 1;
        b.extend_from_slice(&sub); // sub @128
        b
    }

    #[test]
    fn parses_hand_laid_nv_ioctl_bytes() {
        let bytes = nv_record_bytes_by_hand();
        assert_eq!(bytes.len(), 264);
        let RawRecord::NvIoctl(rec) = parse_record(&bytes).unwrap() else {
            panic!("wrong kind");
        };
        assert_eq!(rec.hdr.cpu, 3);
        assert_eq!(rec.hdr.ts_ns, 0x1122_3344_5566_7788);
        assert_eq!(rec.hdr.tgid, 4242);
        assert_eq!(rec.hdr.tid, 4243);
        assert_eq!(rec.ret, -1);
        assert_eq!(rec.fd, 7);
        assert_eq!(rec.ioctl_cmd, 0xC030_462B);
        assert_eq!(rec.escape, 0x2B);
        assert_eq!(rec.param_size, 48);
        assert_eq!(rec.flags, nv_flags::SUB_TRUNCATED);
        assert_eq!(rec.params_len, 48);
        assert_eq!(rec.sub_len, 20);
        assert_eq!(&rec.params[12..16], &0xA06Cu32.to_le_bytes());
        assert_eq!(rec.sub[12], 1);
        assert_eq!(rec, nv_record());
    }

    #[test]
    fn serializes_to_the_kernel_layout() {
        assert_eq!(
            nv_ioctl_bytes(&nv_record()),
            nv_record_bytes_by_hand().as_slice()
        );
        let task = TaskRecord {
            hdr: header(record_kind::FD_CLOSE),
            value: 9,
            _pad: 0,
        };
        let bytes = task_bytes(&task);
        assert_eq!(bytes.len(), 48);
        assert_eq!(&bytes[..4], &record_kind::FD_CLOSE.to_le_bytes());
        assert_eq!(&bytes[40..44], &9i32.to_le_bytes());
    }

    #[test]
    fn parses_unaligned_input() {
        let bytes = nv_record_bytes_by_hand();
        let mut shifted = vec![0u8; 1];
        shifted.extend_from_slice(&bytes);
        // The record now starts at an odd address.
        assert_eq!(
            parse_record(&shifted[1..]).unwrap(),
            RawRecord::NvIoctl(nv_record())
        );
    }

    /// zerocopy reads a header from any prefix of at least its size, at any address; a shorter
    /// one is no header, and an attribution shorter than its head is a bad length, not a panic.
    #[test]
    fn headers_read_from_unaligned_prefixes_and_short_items_are_refused() {
        let bytes = nv_record_bytes_by_hand();
        let mut shifted = vec![0u8; 3];
        shifted.extend_from_slice(&bytes);
        let h = header_of(&shifted[3..]).expect("a whole header");
        assert_eq!((h.kind, h.tgid, h.tid), (record_kind::NV_IOCTL, 4242, 4243));
        assert_eq!(header_of(&shifted[3..42]), None);
        let mut short = user_kind::ATTRIBUTION.to_le_bytes().to_vec();
        short.resize(55, 0);
        assert_eq!(
            parse_record(&short),
            Err(WireError::BadLength {
                kind: user_kind::ATTRIBUTION,
                len: 55,
                expected: 56
            })
        );
    }

    #[test]
    fn task_records_by_kind() {
        let exit = TaskRecord {
            hdr: header(record_kind::PROCESS_EXIT),
            value: -1,
            _pad: 0,
        };
        let close = TaskRecord {
            hdr: header(record_kind::FD_CLOSE),
            value: 12,
            _pad: 0,
        };
        assert_eq!(
            parse_record(task_bytes(&exit)).unwrap(),
            RawRecord::ProcessExit(exit)
        );
        assert_eq!(
            parse_record(task_bytes(&close)).unwrap(),
            RawRecord::FdClose(close)
        );
    }

    /// The API layer's records of the main trace (the kernel's calls and recursions, the
    /// userspace names and sums) parse back to themselves and refuse any other length.
    #[test]
    fn api_call_recursion_symbol_and_stats_records_round_trip() {
        use gpu_trace_common::api::{API_HIST_BUCKETS, API_STACK_MAX};
        let mut hist = [0u64; API_HIST_BUCKETS];
        hist[11] = 7;
        let records = [
            RawRecord::ApiCall(ApiCallRecord {
                hdr: header(record_kind::API_CALL),
                cookie: 1 << 32 | 5,
                caller_cookie: 2 << 32 | 6,
                duration_ns: 1234,
                ret: 0xffff_ffff_0000_0002,
                depth: 1,
                _pad: 0,
            }),
            RawRecord::ApiRecursion(ApiRecursionRecord {
                hdr: header(record_kind::API_RECURSION),
                cookie: 3,
                depth: 4,
                past_cap: 0,
                chain: [3; API_STACK_MAX],
            }),
            RawRecord::ApiSymbol(ApiSymbolRecord {
                hdr: header(user_kind::API_SYMBOL),
                cookie: 3,
                names: crate::api::open::names("hipMalloc", "/tmp/shim.so"),
            }),
            RawRecord::ApiStats(ApiStatsRecord {
                hdr: header(user_kind::API_STATS),
                cookie: 3,
                count: 7,
                errors: 1,
                total_ns: 9000,
                hist,
            }),
        ];
        let sizes = [80, 184, 176, 392];
        for (raw, size) in records.iter().zip(sizes) {
            let bytes = raw.as_bytes();
            assert_eq!(bytes.len(), size);
            assert_eq!(parse_record(bytes).as_ref(), Ok(raw));
            assert_eq!(raw.header().tgid, 4242);
            assert!(parse_record(&bytes[..size - 1]).is_err());
            let mut long = bytes.to_vec();
            long.push(0);
            assert!(parse_record(&long).is_err());
        }
    }

    #[test]
    fn api_tag_and_context_records_round_trip_and_need_their_exact_length() {
        let tag = ApiTagRecord {
            hdr: header(record_kind::API_TAG),
            inner: 3 << 32 | 7,
            outer: 1 << 32 | 2,
            depth: 2,
            _pad: 0,
        };
        let raw = RawRecord::ApiTag(tag);
        assert_eq!(raw.as_bytes().len(), 64);
        assert_eq!(parse_record(raw.as_bytes()), Ok(raw.clone()));
        assert_eq!(raw.header().tid, 4243);
        let ctx = ApiContextRecord {
            hdr: header(user_kind::API_CONTEXT),
            depth: 1,
            has_outer: 0,
            inner: crate::api::open::names("cuInit", "/lib/libcuda.so.1"),
            outer: crate::api::open::names("", ""),
        };
        let raw = RawRecord::ApiContext(ctx);
        assert_eq!(parse_record(raw.as_bytes()), Ok(raw.clone()));
        let short = &raw.as_bytes()[..raw.as_bytes().len() - 1];
        assert!(matches!(
            parse_record(short),
            Err(WireError::BadLength {
                kind: user_kind::API_CONTEXT,
                ..
            })
        ));
    }

    /// The ATTRIBUTION record, laid out by hand (head 56 bytes, then the path), read back: the
    /// path and the namespaced PID as written, `None` for an unresolved path and a host PID; a
    /// path past the cap is cut to it, and a length past the cap is refused.
    #[test]
    fn attribution_records_carry_their_path_and_namespaced_pid() {
        let by_hand = |ns_pid: u32, path: &[u8]| {
            let mut b = header(user_kind::ATTRIBUTION).as_bytes().to_vec(); // hdr @0
            b.extend_from_slice(&0xC6_0000_0042u64.to_le_bytes()); // cgroup_id @40
            b.extend_from_slice(&ns_pid.to_le_bytes()); // ns_pid @48
            b.extend_from_slice(&(path.len() as u32).to_le_bytes()); // path_len @52
            b.extend_from_slice(path);
            b
        };
        let path = "/kubepods.slice/pod-1/cri-containerd-ab.scope";
        let bytes = by_hand(7, path.as_bytes());
        assert_eq!(bytes.len(), 56 + path.len());
        let RawRecord::Attribution(a) = parse_record(&bytes).unwrap() else {
            panic!("not an attribution");
        };
        assert_eq!(a.head.cgroup_id, 0xC6_0000_0042);
        assert_eq!(a.path().as_deref(), Some(path));
        assert_eq!(a.ns_pid(), Some(7));
        assert_eq!(a.head.hdr.tgid, 4242);

        let RawRecord::Attribution(none) = parse_record(&by_hand(0, b"")).unwrap() else {
            panic!("not an attribution");
        };
        assert_eq!(none.path(), None);
        assert_eq!(none.ns_pid(), None);

        // Built from the kernel's record: the same bytes as by hand.
        let task = TaskCgroupRecord {
            hdr: header(record_kind::TASK_CGROUP),
            cgroup_id: 0xC6_0000_0042,
            ns_pid: 7,
            _pad: 0,
        };
        assert_eq!(Attribution::new(&task, Some(path), Some(7)).bytes, bytes);
        let long = "/x".repeat(ATTRIBUTION_PATH_MAX);
        let cut = Attribution::new(&task, Some(&long), None);
        assert_eq!(cut.path().map(|p| p.len()), Some(ATTRIBUTION_PATH_MAX));
        assert_eq!(cut.ns_pid(), None);
        let mut over = by_hand(0, &vec![b'a'; ATTRIBUTION_PATH_MAX + 1]);
        assert!(matches!(
            parse_record(&over),
            Err(WireError::BadLength { .. })
        ));
        over.truncate(56 + 3);
        assert!(
            parse_record(&over).is_err(),
            "a path shorter than its length"
        );
    }

    #[test]
    fn rejects_unknown_kind_and_bad_lengths() {
        let mut bytes = nv_record_bytes_by_hand();
        bytes[0] = 99;
        assert_eq!(
            parse_record(&bytes),
            Err(WireError::UnknownKind { kind: 99, len: 264 })
        );
        let bytes = nv_record_bytes_by_hand();
        assert_eq!(
            parse_record(&bytes[..263]),
            Err(WireError::BadLength {
                kind: record_kind::NV_IOCTL,
                len: 263,
                expected: 264
            })
        );
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            parse_record(&long),
            Err(WireError::BadLength { len: 265, .. })
        ));
        // A task record's length is not an ioctl record's.
        let mut task = task_bytes(&TaskRecord {
            hdr: header(record_kind::PROCESS_EXIT),
            value: 0,
            _pad: 0,
        })
        .to_vec();
        task[..4].copy_from_slice(&record_kind::NV_IOCTL.to_le_bytes());
        assert!(matches!(
            parse_record(&task),
            Err(WireError::BadLength { expected: 264, .. })
        ));
        assert_eq!(parse_record(&[1, 0]), Err(WireError::NoTag { len: 2 }));
    }

    #[test]
    fn comm_is_nul_trimmed_and_lossless() {
        assert_eq!(comm_to_string(b"python\0\0\0\0\0\0\0\0\0\0"), "python");
        assert_eq!(comm_to_string(b"0123456789abcdef"), "0123456789abcdef");
        let odd = comm_to_string(b"a\xffb\0junk");
        assert_eq!(&*crate::escape::raw_bytes(&odd), b"a\xffb");
        assert_ne!(odd, comm_to_string(b"a\xfeb"));
        assert_eq!(comm_to_string(&[0u8; 16]), "");
        // Valid UTF-8 that is not ASCII takes the lossless path too: a character of the range
        // that carries raw bytes stays itself (its four bytes), not the byte it would stand for.
        let carried = "\u{10FF85}".as_bytes();
        let back = comm_to_string(carried);
        assert_eq!(&*crate::escape::raw_bytes(&back), carried);
    }

    #[test]
    fn comm_cache_gives_each_record_its_own_name() {
        let mut cache = CommCache::default();
        let mut hdr = nv_record().hdr;
        for name in [
            &b"python"[..],
            b"python",
            b"cuda-EvtHandlr",
            b"a\xffb",
            b"python",
        ] {
            hdr.comm = [0; 16];
            hdr.comm[..name.len()].copy_from_slice(name);
            hdr.tid += 1;
            let o = cache.origin(&hdr);
            assert_eq!(o, origin(&hdr));
            assert_eq!(o.comm, comm_to_string(&hdr.comm));
        }
    }

    #[test]
    fn origin_from_header() {
        let o = RawRecord::NvIoctl(nv_record()).origin();
        assert_eq!(
            o,
            Origin {
                ts_ns: 0x1122_3344_5566_7788,
                cpu: 3,
                pid: 4242,
                tid: 4243,
                comm: "python".into()
            }
        );
    }

    #[test]
    fn stream_round_trip() {
        let recs = vec![
            RawRecord::NvIoctl(nv_record()),
            RawRecord::FdClose(TaskRecord {
                hdr: header(record_kind::FD_CLOSE),
                value: 5,
                _pad: 0,
            }),
            RawRecord::ProcessExit(TaskRecord {
                hdr: header(record_kind::PROCESS_EXIT),
                value: -1,
                _pad: 0,
            }),
        ];
        let mut stream = Vec::new();
        for r in &recs {
            append_to_stream(&mut stream, r.as_bytes());
        }
        assert_eq!(stream.len(), 3 * 4 + 264 + 48 + 48);
        assert_eq!(&stream[..4], &264u32.to_le_bytes());
        assert_eq!(records_from_stream(&stream).unwrap(), recs);
        assert_eq!(records_from_stream(&[]).unwrap(), vec![]);
    }

    #[test]
    fn deep_hook_records_round_trip_and_check_their_length() {
        use crate::source::amd::decode::testing as amd;
        use crate::source::nvidia::gpu_ext::testing as gx;
        for rec in [
            RawRecord::KfdQueue(amd::queue_built(7, 2, 0x1002)),
            RawRecord::Deep(amd::deep(7, gpu_trace_common::deep_hook::KFD_RELEASE, 7, 0)),
            RawRecord::NvSched(gx::task_init(7, 3, 5, 1024)),
        ] {
            let bytes = rec.as_bytes().to_vec();
            assert_eq!(parse_record(&bytes).unwrap(), rec);
            assert_eq!(rec.header().tgid, 7);
            let kind = rec.header().kind;
            assert_eq!(
                parse_record(&bytes[..bytes.len() - 4]),
                Err(WireError::BadLength {
                    kind,
                    len: bytes.len() - 4,
                    expected: bytes.len()
                })
            );
        }
    }

    #[test]
    fn stream_errors_point_at_the_item() {
        let mut stream = Vec::new();
        append_to_stream(&mut stream, &nv_record_bytes_by_hand());
        let good = stream.len();
        // Truncated length prefix.
        let mut s = stream.clone();
        s.extend_from_slice(&[48, 0]);
        assert_eq!(
            records_from_stream(&s),
            Err(WireError::TruncatedStream {
                offset: good,
                need: 4,
                have: 2
            })
        );
        // Truncated body.
        let mut s = stream.clone();
        s.extend_from_slice(&48u32.to_le_bytes());
        s.extend_from_slice(&[2, 0, 0, 0]);
        assert_eq!(
            records_from_stream(&s),
            Err(WireError::TruncatedStream {
                offset: good,
                need: 52,
                have: 8
            })
        );
        // A well-framed but unknown record.
        let mut s = stream.clone();
        append_to_stream(&mut s, &[77, 0, 0, 0, 0, 0, 0, 0]);
        let err = records_from_stream(&s).unwrap_err();
        assert_eq!(
            err,
            WireError::InStream {
                offset: good,
                source: Box::new(WireError::UnknownKind { kind: 77, len: 8 })
            }
        );
    }
}
