//! Property-based fuzzing of every decoder: ring-buffer records ([`wire::parse_record`]), record
//! streams ([`wire::records_from_stream`]), RM calls ([`decode::decode`]), recording files
//! ([`RecordReader`]) and the whole [`Pipeline`] (parse → decode → model → text/JSON output).
//!
//! Properties: nothing panics on any input; decoding is total and deterministic; what parses
//! re-serializes to the same bytes; a record is refused exactly when its kind or length is wrong;
//! an RM call is `Malformed` exactly when the kernel flagged it or its block is too short; a
//! recording cut at any byte replays the records written before the cut, without an error.
//!
//! Seeds: besides random bytes, real records captured on the GPU host (`tests/fixtures/*.gtrace`),
//! mutated. Bounded for `cargo test` (debug build): about 10 s of CPU, 20 s on a busy 2-core
//! machine; the two fuzz test files together take about a minute there. Run longer with
//! `GPU_TRACE_FUZZ_SCALE=N` (N times the cases), e.g.
//! `GPU_TRACE_FUZZ_SCALE=50 cargo test --release -p gpu-trace --test fuzz_decoders`.
//! Failures are shrunk and saved in `tests/corpus/fuzz_decoders.txt`, which every later run
//! replays first (commit that file with the fix).

mod common;
mod rel_support;

use std::{
    fs::File,
    io::{BufReader, Read},
    path::PathBuf,
    sync::OnceLock,
};

use gpu_trace::{
    cli::Format,
    pipeline::Pipeline,
    record::{RecordReader, RecordWriter, RecordingHeader, RecordingTrailer},
    source::nvidia::decode::{
        self, AllocParams, ControlParams, MalformedReason, RmCall, Unreadable,
    },
    wire::{self, RawRecord},
};
use gpu_trace_common::{
    NV_PARAMS_MAX, NV_SUB_MAX, NvIoctlRecord, RecordHeader, nv_flags,
    nvidia::{class, cmd, escape},
    record_kind,
};
use proptest::prelude::*;

fn config(base: u32) -> ProptestConfig {
    rel_support::fuzz_config(
        base,
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/corpus/fuzz_decoders.txt"
        ),
    )
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The bytes of the real recordings.
fn recordings() -> &'static [Vec<u8>] {
    static R: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    R.get_or_init(|| {
        ["two_streams.gtrace", "ctx_churn.gtrace"]
            .iter()
            .map(|n| {
                let mut b = Vec::new();
                File::open(fixture(n)).unwrap().read_to_end(&mut b).unwrap();
                b
            })
            .collect()
    })
}

/// The records of the real recordings (seeds).
fn real_records() -> &'static [Vec<u8>] {
    static R: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    R.get_or_init(|| {
        let mut out = Vec::new();
        for bytes in recordings() {
            let mut r = RecordReader::new(&bytes[..]).unwrap();
            while let Some(rec) = r.next_record().unwrap() {
                out.push(rec);
            }
        }
        assert!(out.len() > 100, "the fixtures hold real records");
        out
    })
}

/// Bytes: random, or a real record with a few bytes changed, or a real record cut or extended.
fn record_bytes() -> impl Strategy<Value = Vec<u8>> {
    let n = real_records().len();
    prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..600),
        // A valid tag, random body of about the right length.
        2 => (prop_oneof![Just(record_kind::NV_IOCTL), Just(record_kind::PROCESS_EXIT), Just(record_kind::FD_CLOSE), any::<u32>()],
              prop_oneof![Just(264usize), Just(48usize), 0usize..300])
            .prop_flat_map(|(kind, len)| prop::collection::vec(any::<u8>(), len).prop_map(move |mut b| {
                if b.len() >= 4 { b[..4].copy_from_slice(&kind.to_le_bytes()); }
                b
            })),
        4 => (0..n, prop::collection::vec((any::<usize>(), any::<u8>()), 0..8), prop_oneof![3 => Just(None), 1 => (0usize..300).prop_map(Some)])
            .prop_map(|(i, edits, resize)| {
                let mut b = real_records()[i].clone();
                for (at, v) in edits { let l = b.len(); b[at % l] = v; }
                if let Some(len) = resize { b.resize(len, 0xAB); }
                b
            }),
    ]
}

/// An NvIoctlRecord with every field drawn, biased towards the values the decoder branches on.
fn nv_record() -> impl Strategy<Value = NvIoctlRecord> {
    let escape =
        prop_oneof![4 => prop::sample::select(rel_support::ESCAPES.to_vec()), 1 => any::<u32>()];
    let size = prop_oneof![Just(16u32), Just(32), Just(48), Just(20000), any::<u32>()];
    let len = prop_oneof![
        Just(0u32),
        Just(3),
        Just(4),
        Just(8),
        Just(16),
        Just(20),
        Just(32),
        Just(48),
        Just(136),
        any::<u32>()
    ];
    let flags = prop_oneof![3 => Just(0u32), 3 => 0u32..128, 1 => any::<u32>()];
    let classes = prop::sample::select(vec![
        class::KEPLER_CHANNEL_GROUP_A,
        class::HOPPER_CHANNEL_GPFIFO_A,
        class::BLACKWELL_CHANNEL_GPFIFO_B,
        class::NV01_DEVICE_0,
        class::NV01_ROOT_CLIENT,
        class::NV01_ROOT,
        0x3E,
    ]);
    let cmds = prop::sample::select(vec![
        cmd::TSG_GPFIFO_SCHEDULE,
        cmd::CHANNEL_GPFIFO_SCHEDULE,
        cmd::TSG_SET_TIMESLICE,
        cmd::TSG_GET_TIMESLICE,
        cmd::TSG_PREEMPT,
        cmd::TSG_GET_INFO,
        cmd::TSG_SET_INTERLEAVE_LEVEL,
        cmd::CHANNEL_SET_INTERLEAVE_LEVEL,
        cmd::CHANNEL_GET_WORK_SUBMIT_TOKEN,
        0x2080_0101,
    ]);
    (
        (any::<i64>(), escape, size, flags, len.clone(), len),
        (
            prop::collection::vec(any::<u8>(), NV_PARAMS_MAX),
            prop::collection::vec(any::<u8>(), NV_SUB_MAX),
        ),
        (
            classes,
            cmds,
            any::<bool>(),
            any::<bool>(),
            any::<[u8; 16]>(),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(
                (ret, esc, size, flags, params_len, sub_len),
                (p, s),
                (cl, cm, set_class, set_flags, comm, tgid),
            )| {
                let mut params = [0u8; NV_PARAMS_MAX];
                params.copy_from_slice(&p);
                let mut sub = [0u8; NV_SUB_MAX];
                sub.copy_from_slice(&s);
                // Often a class/command the decoder knows, at its offset; FINN flags sometimes.
                if set_class {
                    params[12..16].copy_from_slice(&cl.to_le_bytes());
                    params[8..12].copy_from_slice(&cm.to_le_bytes());
                }
                // FINN-serialized or plain, in the flags of the block the escape names.
                if set_flags {
                    let finn = params[0] & 1 != 0;
                    if esc == escape::RM_CONTROL {
                        params[12..16]
                            .copy_from_slice(&(if finn { 0x4u32 } else { 0 }).to_le_bytes());
                    } else {
                        params[36..40]
                            .copy_from_slice(&(if finn { 0x1u32 } else { 0 }).to_le_bytes());
                    }
                }
                NvIoctlRecord {
                    hdr: RecordHeader {
                        kind: record_kind::NV_IOCTL,
                        cpu: 1,
                        ts_ns: 5,
                        tgid,
                        tid: tgid,
                        comm,
                    },
                    ret,
                    fd: 3,
                    ioctl_cmd: 0xC000_4600 | (esc & 0xff),
                    rdev: 195 << 20,
                    escape: esc,
                    param_size: size,
                    flags,
                    params_len,
                    sub_len,
                    params,
                    sub,
                }
            },
        )
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// What the decoder must say for the flags and lengths, independent of its code: the kernel's
/// failure flags win in this order, then the escape, then the captured length.
fn expected_malformed(r: &NvIoctlRecord) -> Option<MalformedReason> {
    let f = r.flags;
    if f & nv_flags::XFER_READ_FAILED != 0 {
        return Some(MalformedReason::XferReadFailed);
    }
    if f & nv_flags::XFER_OVERSIZE != 0 {
        return Some(MalformedReason::XferOversize);
    }
    if f & nv_flags::BAD_SIZE != 0 {
        return Some(MalformedReason::BadSize);
    }
    if f & nv_flags::PARAMS_READ_FAILED != 0 {
        return Some(MalformedReason::ParamsReadFailed);
    }
    // The escapes (nv-ioctl-numbers.h) and their blocks' sizes: NVOS00 16, NVOS54 32, NVOS64 48
    // (alloc with a 48-byte block), NVOS21 32.
    let need = match r.escape {
        0x29 => 16,
        0x2A => 32,
        0x2B if r.param_size == 48 => 48,
        0x2B => 32,
        _ => return Some(MalformedReason::UnknownEscape),
    };
    ((r.params_len as usize).min(NV_PARAMS_MAX) < need).then_some(MalformedReason::ShortParams)
}

/// Why sub-parameters needing `need` bytes are unusable, if they are.
fn expected_unreadable(r: &NvIoctlRecord, need: usize, finn: bool) -> Option<Unreadable> {
    if finn {
        Some(Unreadable::FinnSerialized)
    } else if r.flags & nv_flags::SUB_READ_FAILED != 0 {
        Some(Unreadable::ReadFailed)
    } else if r.flags & nv_flags::SUB_TRUNCATED != 0 {
        Some(Unreadable::Truncated)
    } else if (r.sub_len as usize).min(NV_SUB_MAX) < need {
        Some(Unreadable::Short)
    } else {
        None
    }
}

/// What `parse_record` must do with `bytes`: the NVIDIA and task kinds are accepted exactly at
/// their sizes (`NvIoctlRecord` 264 bytes, `TaskRecord` 48: the kernel's structs); what is
/// accepted re-serializes to the same bytes with the same kind. Other kinds (other vendors'
/// records) only have to round-trip when accepted.
fn check_parse(
    bytes: &[u8],
    parsed: Result<RawRecord, wire::WireError>,
) -> Result<(), TestCaseError> {
    let kind = bytes
        .get(..4)
        .map(|t| u32::from_le_bytes(t.try_into().unwrap()));
    let want_len = match kind {
        Some(record_kind::NV_IOCTL) => Some(264),
        Some(record_kind::PROCESS_EXIT | record_kind::FD_CLOSE) => Some(48),
        _ => None,
    };
    match parsed {
        Ok(rec) => {
            if want_len.is_some() {
                prop_assert_eq!(Some(bytes.len()), want_len);
            }
            prop_assert_eq!(rec.as_bytes(), bytes);
            prop_assert_eq!(Some(rec.header().kind), kind);
        }
        Err(e) => prop_assert!(
            want_len != Some(bytes.len()),
            "a {}-byte record of kind {:?} refused: {}",
            bytes.len(),
            kind,
            e
        ),
    }
    Ok(())
}

/// The control commands gpu-trace decodes, with the size of their parameter struct and where
/// its fields are, written from the RM SDK headers (`ctrl/ctrla06c.h`, `ctrl/ctrla06f/*.h`,
/// `ctrl/ctrlc36f.h`) with literal numbers: not gpu-trace's `cmd::*` constants or its
/// `control_capture_len`, so that a wrong number or size there fails this test.
const CONTROL_ABI: [(u32, usize); 9] = [
    (0xA06C_0101, 3), // NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: NvBool bEnable, bSkipSubmit, bSkipEnable
    (0xA06F_0103, 3), // NVA06F_CTRL_CMD_GPFIFO_SCHEDULE: the same struct
    (0xA06C_0103, 8), // NVA06C_CTRL_CMD_SET_TIMESLICE: NvU64 timesliceUs
    (0xA06C_0104, 8), // NVA06C_CTRL_CMD_GET_TIMESLICE: the same struct
    (0xA06C_0105, 8), // NVA06C_CTRL_CMD_PREEMPT: NvBool bWait @0, bManualTimeout @1, NvU32 timeoutUs @4
    (0xA06C_0106, 4), // NVA06C_CTRL_CMD_GET_INFO: NvU32 tsgID
    (0xA06C_0107, 4), // NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL: NvU32 tsgInterleaveLevel
    (0xA06F_0109, 4), // NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL: NvU32 channelInterleaveLevel
    (0xC36F_0108, 4), // NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: NvU32 workSubmitToken
];

/// The control's parameters as the ABI lays them out, read by hand from `s` (at least the
/// struct's size).
fn abi_control(command: u32, s: &[u8]) -> ControlParams {
    let u64_at = |at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap());
    match command {
        0xA06C_0101 | 0xA06F_0103 => ControlParams::Schedule {
            enable: s[0] != 0,
            skip_submit: s[1] != 0,
            skip_enable: s[2] != 0,
        },
        0xA06C_0103 | 0xA06C_0104 => ControlParams::Timeslice { us: u64_at(0) },
        0xA06C_0105 => ControlParams::Preempt {
            wait: s[0] != 0,
            manual_timeout: s[1] != 0,
            timeout_us: u32_at(s, 4),
        },
        0xA06C_0106 => ControlParams::TsgInfo {
            tsg_id: u32_at(s, 0),
        },
        0xA06C_0107 | 0xA06F_0109 => ControlParams::Interleave {
            level: u32_at(s, 0),
        },
        0xC36F_0108 => ControlParams::WorkSubmitToken {
            token: u32_at(s, 0),
        },
        other => panic!("{other:#x} is not in CONTROL_ABI"),
    }
}

/// RM classes whose allocation parameters gpu-trace reads, from the SDK's `class/*.h`.
const TSG_CLASS: u32 = 0xA06C; // KEPLER_CHANNEL_GROUP_A
const DEVICE_CLASS: u32 = 0x0080; // NV01_DEVICE_0
const CLIENT_CLASSES: [u32; 3] = [0x0000, 0x0001, 0x0041]; // NV01_ROOT, _NON_PRIV, _CLIENT
const CHANNEL_CLASSES: [u32; 11] = [
    0xA06F, 0xA16F, 0xA26F, 0xB06F, 0xC06F, 0xC36F, 0xC46F, 0xC56F, 0xC86F, 0xC96F, 0xCA6F,
];

/// The allocation parameters as the ABI lays them out, with the bytes needed to read them:
/// `NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS` (nvos.h: hObjectError @0, hObjectEccError @4,
/// hVASpace @8, engineType @12: 16 bytes), `NV0080_ALLOC_PARAMETERS` (deviceId @0: 4),
/// `NV_CHANNEL_ALLOC_PARAMS` (alloc_channel.h: hObjectError @0, gpFifoEntries @16, flags @20,
/// hContextShare @24, hVASpace @28, engineType @128, cid @132: 136). `None`: not read.
fn abi_alloc_need(class: u32) -> Option<usize> {
    match class {
        TSG_CLASS => Some(16),
        DEVICE_CLASS => Some(4),
        c if CHANNEL_CLASSES.contains(&c) => Some(136),
        _ => None,
    }
}

fn abi_alloc(class: u32, s: &[u8]) -> AllocParams {
    match class {
        TSG_CLASS => AllocParams::Tsg {
            h_object_error: u32_at(s, 0),
            h_vaspace: u32_at(s, 8),
            engine_type: u32_at(s, 12),
        },
        DEVICE_CLASS => AllocParams::Device {
            device_id: u32_at(s, 0),
        },
        _ => AllocParams::Channel {
            h_object_error: u32_at(s, 0),
            gpfifo_entries: u32_at(s, 16),
            flags: u32_at(s, 20),
            h_context_share: u32_at(s, 24),
            h_vaspace: u32_at(s, 28),
            engine_type: u32_at(s, 128),
            cid: u32_at(s, 132),
        },
    }
}

/// What `decode` must say of `r`, derived from the flags, the lengths and the ABI tables above:
/// `Malformed` exactly when the kernel flagged the call or its block is too short; the block's
/// fields at the NVOS offsets; the sub-parameters unreadable for the first reason that applies,
/// else exactly the ABI's fields read by hand from the captured bytes.
fn check_decode(r: &NvIoctlRecord, call: RmCall) -> Result<(), TestCaseError> {
    match (expected_malformed(r), call) {
        (
            Some(reason),
            RmCall::Malformed {
                reason: got,
                escape,
            },
        ) => {
            prop_assert_eq!(reason, got);
            prop_assert_eq!(escape, r.escape);
        }
        (Some(reason), other) => {
            prop_assert!(false, "expected Malformed({:?}), got {:?}", reason, other)
        }
        (None, RmCall::Malformed { reason, .. }) => {
            prop_assert!(false, "unexpected Malformed({:?})", reason)
        }
        (
            None,
            RmCall::Free {
                client,
                object,
                status,
                ..
            },
        ) => {
            prop_assert_eq!(r.escape, 0x29); // NV_ESC_RM_FREE: NVOS00 hRoot @0, hObjectOld @8, status @12
            prop_assert_eq!(
                (client, object, status),
                (
                    u32_at(&r.params, 0),
                    u32_at(&r.params, 8),
                    u32_at(&r.params, 12)
                )
            );
        }
        (
            None,
            RmCall::Control {
                client,
                object,
                cmd: c,
                status,
                finn_serialized,
                params,
            },
        ) => {
            // NV_ESC_RM_CONTROL: NVOS54 hClient @0, hObject @4, cmd @8, flags @12, status @28.
            prop_assert_eq!(r.escape, 0x2A);
            prop_assert_eq!(
                (client, object, c, status),
                (
                    u32_at(&r.params, 0),
                    u32_at(&r.params, 4),
                    u32_at(&r.params, 8),
                    u32_at(&r.params, 28)
                )
            );
            prop_assert_eq!(finn_serialized, u32_at(&r.params, 12) & 0x4 != 0);
            let want = match CONTROL_ABI.iter().find(|&&(k, _)| k == c) {
                None => ControlParams::NotDecoded,
                Some(&(_, need)) => match expected_unreadable(r, need, finn_serialized) {
                    Some(reason) => ControlParams::Unreadable { reason },
                    None => abi_control(c, &r.sub[..need]),
                },
            };
            prop_assert_eq!(params, want, "control {:#x}", c);
        }
        (
            None,
            RmCall::Alloc {
                client,
                parent,
                handle,
                class: cl,
                status,
                nvos64,
                finn_serialized,
                params,
            },
        ) => {
            // NV_ESC_RM_ALLOC: NVOS21 (32 bytes) or NVOS64 (48): hRoot @0, hObjectParent @4,
            // hObjectNew @8, hClass @12; status @28 (NVOS21) or @40 (NVOS64, flags @36).
            prop_assert_eq!(r.escape, 0x2B);
            prop_assert_eq!(nvos64, r.param_size == 48);
            let st = if nvos64 { 40 } else { 28 };
            prop_assert_eq!(
                (client, parent, handle, cl, status),
                (
                    u32_at(&r.params, 0),
                    u32_at(&r.params, 4),
                    u32_at(&r.params, 8),
                    u32_at(&r.params, 12),
                    u32_at(&r.params, st)
                )
            );
            prop_assert_eq!(finn_serialized, nvos64 && u32_at(&r.params, 36) & 0x1 != 0);
            let want = match abi_alloc_need(cl) {
                None if CLIENT_CLASSES.contains(&cl) => AllocParams::Client,
                None => AllocParams::NotDecoded,
                Some(need) => match expected_unreadable(r, need, finn_serialized) {
                    Some(reason) => AllocParams::Unreadable { reason },
                    None => abi_alloc(cl, &r.sub[..need]),
                },
            };
            prop_assert_eq!(params, want, "class {:#x}", cl);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(5000))]

    /// parse_record: total; refuses exactly the wrong kinds and lengths; round-trips.
    #[test]
    fn parse_record_is_total_and_round_trips(bytes in record_bytes()) {
        check_parse(&bytes, wire::parse_record(&bytes))?;
    }

    /// decode: total, and what it says follows the flags, the lengths and the ABI (see
    /// [`check_decode`]).
    #[test]
    fn decode_is_total_and_classifies_by_flags_and_lengths(r in nv_record()) {
        let errno = decode::errno(&r);
        prop_assert!(errno <= 0);
        prop_assert_eq!(errno == 0, r.ret >= 0);
        // Through the wire format, the same record.
        let parsed = wire::parse_record(wire::nv_ioctl_bytes(&r)).unwrap();
        prop_assert_eq!(parsed, RawRecord::NvIoctl(r));
        check_decode(&r, decode::decode(&r))?;
    }

    /// records_from_stream: total; what it accepts re-serializes to the same bytes; a stream of
    /// good records cut anywhere is refused with the offset of the cut item.
    #[test]
    fn record_streams_are_total_and_round_trip(
        items in prop::collection::vec(record_bytes(), 0..6),
        junk in prop::collection::vec(any::<u8>(), 0..12),
        cut in any::<usize>(),
    ) {
        let mut stream = Vec::new();
        for i in &items {
            wire::append_to_stream(&mut stream, i);
        }
        stream.extend_from_slice(&junk);
        if let Ok(recs) = wire::records_from_stream(&stream) {
            let mut again = Vec::new();
            for r in &recs {
                wire::append_to_stream(&mut again, r.as_bytes());
            }
            prop_assert_eq!(again, stream.clone());
        }
        // Only good records, then a cut.
        let good: Vec<RawRecord> = items.iter().filter_map(|b| wire::parse_record(b).ok()).collect();
        let mut s = Vec::new();
        for r in &good {
            wire::append_to_stream(&mut s, r.as_bytes());
        }
        prop_assert_eq!(wire::records_from_stream(&s).unwrap(), good.clone());
        if !s.is_empty() {
            let at = cut % s.len();
            let res = wire::records_from_stream(&s[..at]);
            // A cut at an item boundary is a shorter valid stream; anywhere else an error.
            let mut boundary = 0usize;
            let mut boundaries = vec![0usize];
            for r in &good {
                boundary += 4 + r.as_bytes().len();
                boundaries.push(boundary);
            }
            match boundaries.iter().position(|&b| b == at) {
                Some(k) => prop_assert_eq!(res.unwrap(), good[..k].to_vec()),
                None => {
                    let truncated = matches!(res, Err(wire::WireError::TruncatedStream { .. }));
                    prop_assert!(truncated, "cut at {}: {:?}", at, res);
                }
            }
        }
    }

    /// RecordReader: a real recording cut at any byte replays the records completely written
    /// before the cut, then ends without an error (a killed tracer leaves such files).
    #[test]
    fn recordings_cut_anywhere_replay_what_was_written(which in 0usize..2, cut in any::<usize>()) {
        let bytes = &recordings()[which];
        let mut full = RecordReader::new(&bytes[..]).unwrap();
        let mut all = Vec::new();
        while let Some(r) = full.next_record().unwrap() {
            all.push(r);
        }
        let at = cut % (bytes.len() + 1);
        match RecordReader::new(&bytes[..at]) {
            // Cut inside the header: refused, clearly.
            Err(e) => prop_assert!(at < 16 + 4096, "header error at byte {}: {}", at, e),
            Ok(mut r) => {
                let mut got = Vec::new();
                loop {
                    match r.next_record() {
                        Ok(Some(rec)) => got.push(rec),
                        Ok(None) => break,
                        Err(e) => return Err(TestCaseError::fail(format!("cut at {at}/{}: {e}", bytes.len()))),
                    }
                }
                prop_assert!(got.len() <= all.len());
                prop_assert_eq!(&got[..], &all[..got.len()]);
                if at == bytes.len() {
                    prop_assert_eq!(got.len(), all.len());
                    prop_assert!(r.trailer.is_some());
                } else {
                    prop_assert!(r.trailer.is_none());
                }
            }
        }
    }

    /// RecordReader on damaged files: never panics, never allocates without bound, and every
    /// record it returns has a length within the format's limit.
    #[test]
    fn damaged_recordings_never_panic(
        which in 0usize..2,
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..16),
        garbage in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = recordings()[which].clone();
        for (at, v) in edits {
            let l = bytes.len();
            bytes[at % l] = v;
        }
        bytes.extend_from_slice(&garbage);
        if let Ok(mut r) = RecordReader::new(&bytes[..]) {
            let mut n = 0usize;
            while let Ok(Some(rec)) = r.next_record() {
                prop_assert!(rec.len() <= 64 * 1024);
                n += 1;
                prop_assert!(n <= bytes.len() / 5 + 1);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(600))]

    /// The whole pipeline on any sequence of records, good, damaged or foreign: no panic, every
    /// input is accounted for, and the JSON output has one line per counted event, then STATS.
    #[test]
    fn pipeline_accounts_for_every_input(items in prop::collection::vec(record_bytes(), 0..60), json in any::<bool>()) {
        let mut out = Vec::new();
        let mut p = Pipeline::new(rel_support::pipeline_config(if json { Format::Json } else { Format::Text }), &mut out);
        let mut parsed = 0u64;
        for b in &items {
            p.feed(b).unwrap();
            parsed += u64::from(wire::parse_record(b).is_ok());
        }
        prop_assert_eq!(p.stats().malformed, items.len() as u64 - parsed);
        let summary = p.finish(Default::default(), std::time::Duration::ZERO).unwrap();
        let text = String::from_utf8(out).unwrap();
        if json {
            let lines: Vec<&str> = text.lines().collect();
            prop_assert_eq!(lines.len() as u64, summary.events + 1);
            for l in &lines {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                prop_assert!(v["event"].is_string());
            }
        } else {
            prop_assert!(text.contains("--- gpu-trace statistics"));
        }
    }
}

/// JSON output lines, one per event, then STATS: the pipeline's own output, parsed back.
#[test]
fn pipeline_json_output_has_one_line_per_event_on_real_records() {
    let mut out = Vec::new();
    {
        let mut p = Pipeline::new(rel_support::pipeline_config(Format::Json), &mut out);
        for r in real_records() {
            p.feed(r).unwrap();
        }
        let s = p
            .finish(Default::default(), std::time::Duration::ZERO)
            .unwrap();
        assert!(s.events > 10);
    }
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let stats: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    let counted = [
        "task_init",
        "schedule",
        "sched_update",
        "work_submit",
        "task_destroy",
    ]
    .iter()
    .map(|k| stats[k].as_u64().unwrap())
    .sum::<u64>();
    assert_eq!(lines.len() as u64 - 1, counted);
}

/// A recording written by RecordWriter and cut at every byte of its last record and trailer:
/// each cut replays the records before it (the behaviour the fuzzer checks on real files).
#[test]
fn every_cut_of_a_small_recording_replays() {
    let mut w = RecordWriter::new(Vec::new(), &RecordingHeader::default()).unwrap();
    let rec = rel_support::free_rec(
        rel_support::header(record_kind::NV_IOCTL, 1, 7, 7, "x"),
        1,
        2,
    );
    w.record(wire::nv_ioctl_bytes(&rec)).unwrap();
    w.record(wire::nv_ioctl_bytes(&rec)).unwrap();
    let full = w.finish(&RecordingTrailer::default()).unwrap();
    let header_len = full.len()
        - 2 * (4 + 264)
        - 8
        - serde_json::to_vec(&RecordingTrailer::default())
            .unwrap()
            .len();
    for cut in header_len..=full.len() {
        let mut r = RecordReader::new(BufReader::new(&full[..cut])).unwrap();
        let mut n = 0;
        while let Some(b) = r
            .next_record()
            .unwrap_or_else(|e| panic!("cut at {cut}: {e}"))
        {
            assert_eq!(b, wire::nv_ioctl_bytes(&rec));
            n += 1;
        }
        let want = if cut >= header_len + 2 * 268 {
            2
        } else if cut >= header_len + 268 {
            1
        } else {
            0
        };
        assert_eq!(n, want, "cut at {cut}");
    }
}

// ---------------------------------------------------------------------------------------------
// The checkers can fail: each is fed a decoder's answer with a planted bug and must refuse it.

fn hdr() -> RecordHeader {
    rel_support::header(record_kind::NV_IOCTL, 1, 7, 7, "x")
}

/// A planted bug in `decode` (a wrong answer for a correct record) is reported by the checker.
fn refused(r: &NvIoctlRecord, planted: RmCall) -> String {
    match check_decode(r, planted) {
        Ok(()) => panic!("the checker accepted {planted:?} for {r:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn decode_checker_accepts_the_abi_answer_and_refuses_planted_bugs() {
    // GPFIFO_SCHEDULE of TSG 0x5c000010: bEnable 1, bSkipSubmit 0, bSkipEnable 1.
    let sched = rel_support::control_rec(
        hdr(),
        0xC1D0_0001,
        0x5C00_0010,
        0xA06C_0101,
        0,
        &[1, 0, 1],
        0,
    );
    let ctl = |client, object, params| RmCall::Control {
        client,
        object,
        cmd: 0xA06C_0101,
        status: 0,
        finn_serialized: false,
        params,
    };
    let with = |params| ctl(0xC1D0_0001, 0x5C00_0010, params);
    let params = ControlParams::Schedule {
        enable: true,
        skip_submit: false,
        skip_enable: true,
    };
    let right = with(params);
    check_decode(&sched, right).unwrap();
    assert_eq!(decode::decode(&sched), right, "the decoder agrees");
    // A flag misread.
    refused(
        &sched,
        with(ControlParams::Schedule {
            enable: true,
            skip_submit: false,
            skip_enable: false,
        }),
    );
    // Readable parameters reported as unreadable, or not decoded.
    refused(
        &sched,
        with(ControlParams::Unreadable {
            reason: Unreadable::Short,
        }),
    );
    refused(&sched, with(ControlParams::NotDecoded));
    // The block's fields swapped.
    refused(&sched, ctl(0x5C00_0010, 0xC1D0_0001, params));
    // A good call reported as malformed.
    refused(
        &sched,
        RmCall::Malformed {
            escape: 0x2A,
            reason: MalformedReason::ShortParams,
        },
    );
    // Two bytes captured of a 3-byte struct: only `Short` is right.
    let mut short = sched;
    short.sub_len = 2;
    check_decode(
        &short,
        with(ControlParams::Unreadable {
            reason: Unreadable::Short,
        }),
    )
    .unwrap();
    refused(&short, right);
    // A kernel-flagged failed read must be Malformed with that reason, never decoded.
    let mut failed = sched;
    failed.flags = nv_flags::PARAMS_READ_FAILED;
    refused(&failed, right);
    refused(
        &failed,
        RmCall::Malformed {
            escape: 0x2A,
            reason: MalformedReason::ShortParams,
        },
    );
    check_decode(
        &failed,
        RmCall::Malformed {
            escape: 0x2A,
            reason: MalformedReason::ParamsReadFailed,
        },
    )
    .unwrap();

    // TSG alloc (NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, engineType 1 = GR0 at byte 12).
    let tsg_params: Vec<u8> = [0xCAF0_0001u32, 0, 0xCAF0_0002, 1, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let alloc = rel_support::alloc_rec(
        hdr(),
        3,
        0xC1D0_0001,
        0xC1D0_0002,
        0x5C00_0010,
        0xA06C,
        Some(&tsg_params),
    );
    let tsg = |nvos64, h_vaspace| RmCall::Alloc {
        client: 0xC1D0_0001,
        parent: 0xC1D0_0002,
        handle: 0x5C00_0010,
        class: 0xA06C,
        status: 0,
        nvos64,
        finn_serialized: false,
        params: AllocParams::Tsg {
            h_object_error: 0xCAF0_0001,
            h_vaspace,
            engine_type: 1,
        },
    };
    let right = tsg(true, 0xCAF0_0002);
    check_decode(&alloc, right).unwrap();
    assert_eq!(decode::decode(&alloc), right, "the decoder agrees");
    // hObjectEccError (byte 4) read as hVASpace.
    refused(&alloc, tsg(true, 0));
    // Read as NVOS21 (status at 28 instead of 40).
    refused(&alloc, tsg(false, 0xCAF0_0002));
}
#[test]
fn parse_checker_refuses_planted_bugs() {
    let rec = rel_support::free_rec(hdr(), 1, 2);
    let bytes = wire::nv_ioctl_bytes(&rec).to_vec();
    check_parse(&bytes, wire::parse_record(&bytes)).unwrap();
    // A good 264-byte NV_IOCTL record refused.
    assert!(check_parse(&bytes, wire::parse_record(&[])).is_err());
    // Accepted, but as another record (one field changed).
    let mut other = rec;
    other.ret = -25;
    assert!(check_parse(&bytes, Ok(RawRecord::NvIoctl(other))).is_err());
    // A record one byte short accepted.
    assert!(check_parse(&bytes[..263], Ok(RawRecord::NvIoctl(rec))).is_err());
}
