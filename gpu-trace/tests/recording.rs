//! Bounded recordings through the binary, on the real kernel (root): `--record-rotate`'s pieces
//! against the same run's live output, and the flight recorder's dumps (issue 42).
//!
//! The calls are RM-shaped `GPFIFO_SCHEDULE` controls on the watched `/dev/full` (no ioctls:
//! each fails, and is reported as a refused `SCHEDULE`), issued by this process on a TSG handle
//! of its own, so that the expected counts are the calls made here.

mod common;
mod rel_support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard},
};

use gpu_trace::{
    record::{RecordReader, RecordingHeader, RecordingTrailer},
    wire::{self, RawRecord},
};
use rel_support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A recording's header, records and trailer.
fn read(path: &Path) -> (RecordingHeader, Vec<Vec<u8>>, Option<RecordingTrailer>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = RecordReader::new(std::io::BufReader::new(file)).unwrap();
    let mut records = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        records.push(rec);
    }
    (r.header, records, r.trailer)
}

/// The schedule controls on TSG `object` of this process among `records`.
fn schedules_of(records: &[Vec<u8>], object: u32) -> usize {
    let me = std::process::id();
    records
        .iter()
        .filter(|r| match wire::parse_record(r) {
            Ok(RawRecord::NvIoctl(rec)) => {
                // NVOS54: hClient, hObject, cmd: the object is the block's second word.
                let obj = u32::from_le_bytes(rec.params[4..8].try_into().unwrap());
                rec.hdr.tgid == me && obj == object
            }
            _ => false,
        })
        .count()
}

/// `gpu-trace replay FILE --format json`: exit status and stdout.
fn replay_json(path: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(gpu_trace_bin())
        .args(["replay", path.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The SCHEDULE lines of this process on TSG `object`.
fn schedule_lines(stdout: &str, object: u32) -> usize {
    let me = std::process::id();
    json_events(stdout)
        .iter()
        .filter(|e| e["event"] == "SCHEDULE" && e["pid"] == me && e["task"]["value"] == object)
        .count()
}

/// The pieces `base.0001`, `base.0002`, … that exist, by index.
fn pieces(base: &Path) -> Vec<(u32, PathBuf)> {
    let dir = base.parent().unwrap();
    let name = base.file_name().unwrap().to_str().unwrap();
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().into_string().ok()?;
            let index = n.strip_prefix(name)?.strip_prefix('.')?.parse().ok()?;
            Some((index, e.path()))
        })
        .collect();
    found.sort();
    found
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = common::scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `--record-rotate 8K`: the pieces, read one by one, hold every call once (600 calls of
/// 264-byte records: about 20 pieces); each replays alone (exit 0), and the replays' SCHEDULE
/// lines and statistics add up to the live run's own; the pieces' kernel counters add up to
/// the live run's. With `--record-keep 2`, only the last two pieces are left.
#[test]
fn rotated_pieces_replay_alone_and_add_up_to_the_run() {
    let _serial = serial();
    let test = "rotated_pieces_replay_alone_and_add_up_to_the_run";
    if skip_unless_root(test) {
        return;
    }
    const CALLS: usize = 600;
    const TSG: u32 = 0x5EED_0042;
    for keep in [None, Some(2u32)] {
        let dir = fresh_dir(&format!("rotate-{}", keep.unwrap_or(0)));
        let base = dir.join("run.gtrace");
        let mut args = vec![
            "--watch-device",
            WATCHED,
            "--format",
            "json",
            "--record",
            base.to_str().unwrap(),
            "--record-rotate",
            "8K",
        ];
        let keep_s = keep.map(|k| k.to_string());
        if let Some(k) = keep_s.as_deref() {
            args.extend(["--record-keep", k]);
        }
        let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
        let dev = watched();
        let call = Schedule::new(0x5EED_0001, TSG);
        for _ in 0..CALLS {
            call.issue(&dev);
        }
        let f = traced.interrupt();
        let live = json_stats(&f.stdout);
        assert_eq!(
            schedule_lines(&f.stdout, TSG),
            CALLS,
            "the live run saw every call: {}",
            f.stderr
        );
        assert_eq!(live["kernel"]["dropped"], 0, "{}", f.stderr);
        let found = pieces(&base);
        assert!(!base.exists(), "the pieces, not FILE itself, are written");
        let last = found.last().expect("pieces written").0;
        assert!(
            last >= 15,
            "{last} pieces: 600 records of 268 bytes in 8 KiB pieces"
        );
        let indexes: Vec<u32> = found.iter().map(|(i, _)| *i).collect();
        if let Some(k) = keep {
            assert_eq!(indexes, (last - k + 1..=last).collect::<Vec<_>>());
            continue;
        }
        assert_eq!(indexes, (1..=last).collect::<Vec<_>>());
        let (mut records, mut lines, mut schedules, mut emitted) = (0, 0, 0, 0);
        for (i, path) in &found {
            let (h, recs, trailer) = read(path);
            let trailer = trailer.unwrap_or_else(|| panic!("piece {i} has no trailer"));
            assert!(h.inventory.is_some(), "piece {i} has an inventory");
            emitted += trailer.kernel_counters.emitted;
            records += schedules_of(&recs, TSG);
            let (status, out, err) = replay_json(path);
            assert_eq!(status, Some(0), "piece {i} replays alone: {err}");
            lines += schedule_lines(&out, TSG);
            schedules += json_stats(&out)["schedule"].as_u64().unwrap();
        }
        assert_eq!(
            records, CALLS,
            "every call's record is in exactly one piece"
        );
        assert_eq!(lines, CALLS, "the pieces' replays print every call once");
        assert_eq!(
            Some(schedules),
            live["schedule"].as_u64(),
            "the replays' SCHEDULE counts add up to the live run's"
        );
        assert_eq!(
            Some(emitted),
            live["kernel"]["emitted"].as_u64(),
            "the pieces' kernel counters add up to the run's"
        );
    }
}
