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

/// The dump files in `dir` (complete ones: a dump is renamed into place once written).
fn dumps_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gtrace"))
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("gpu-trace-")
        })
        .collect();
    found.sort();
    found
}

/// `--flight-recorder 1h --flight-recorder-bytes 8K --dump-on refused --dump-max-per-hour 1`
/// beside `--record FILE` of the same run: 100 frees (records, no event), then 3 schedules,
/// each refused (a trigger). One dump, named after the trigger; it holds exactly the window
/// the rule gives over the full recording up to the first schedule (the longest run of the
/// last records that fits in 8 KiB, each record with its index entry), its header's inventory names this process (alive at the
/// window's start), and it replays alone with that one schedule; STATS counts 3 triggers, 1
/// dump and 2 not written.
#[test]
fn a_refused_schedule_dumps_exactly_its_window() {
    let _serial = serial();
    let test = "a_refused_schedule_dumps_exactly_its_window";
    if skip_unless_root(test) {
        return;
    }
    const TSG: u32 = 0x5EED_0043;
    const CAP: u64 = 8192;
    let dir = fresh_dir("flight-refused");
    let full = dir.join("full.rec");
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--format",
        "json",
        "--record",
        full.to_str().unwrap(),
        "--flight-recorder",
        "1h",
        "--flight-recorder-bytes",
        "8K",
        "--dump-on",
        "refused",
        "--dump-max-per-hour",
        "1",
        "--dump-dir",
        dir.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let dev = watched();
    for i in 0..100 {
        free(&dev, 0x5EED_0002, 0x5EED_1000 + i);
    }
    let call = Schedule::new(0x5EED_0002, TSG);
    for _ in 0..3 {
        call.issue(&dev);
    }
    let f = traced.interrupt();
    let stats = json_stats(&f.stdout);
    let flight = &stats["flight_recorder"];
    assert_eq!(flight["triggers"]["refused"], 3, "{}", f.stderr);
    assert_eq!(flight["dumps"], 1, "{}", f.stderr);
    assert_eq!(flight["not_written"], 2, "{}", f.stderr);
    let dumps = dumps_in(&dir);
    assert_eq!(dumps.len(), 1, "{dumps:?}");
    let name = dumps[0].file_name().unwrap().to_str().unwrap();
    assert!(name.ends_with("-refused.gtrace"), "{name}");
    let (_, all, _) = read(&full);
    let (h, window, trailer) = read(&dumps[0]);
    assert!(trailer.is_some(), "the dump has its trailer");
    // The first schedule's record in the full recording: the dump ends there.
    let me = std::process::id();
    let k = (0..all.len())
        .find(|&i| schedules_of(&all[i..=i], TSG) == 1)
        .expect("the schedule is recorded");
    let mut s = 0;
    // Each record counts its length and its index entry.
    let entry = gpu_trace_core::flight::INDEX_ENTRY;
    while all[s..=k]
        .iter()
        .map(|r| r.len() as u64 + entry)
        .sum::<u64>()
        > CAP
    {
        s += 1;
    }
    assert!(
        s > 0,
        "the 100 frees fill more than 8 KiB: the window lost its oldest"
    );
    assert_eq!(window, all[s..=k], "the dump holds exactly its window");
    let inv = h.inventory.expect("a dump has an inventory");
    assert!(
        inv.processes.iter().any(|p| p.pid == me),
        "this process was alive at the window's start"
    );
    let (status, out, err) = replay_json(&dumps[0]);
    assert_eq!(status, Some(0), "the dump replays alone: {err}");
    assert_eq!(schedule_lines(&out, TSG), 1);
}

/// `--dump-keep 2` with three refused schedules, each a trigger and a dump (the window is
/// the whole run): three dumps were written, two are left, and they are the newest — the
/// dumps ending at the second and the third schedule (they hold 2 and 3 of them).
#[test]
fn dump_keep_leaves_the_newest_dumps() {
    let _serial = serial();
    let test = "dump_keep_leaves_the_newest_dumps";
    if skip_unless_root(test) {
        return;
    }
    const TSG: u32 = 0x5EED_0045;
    let dir = fresh_dir("flight-keep");
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--format",
        "json",
        "--flight-recorder",
        "1h",
        "--dump-on",
        "refused",
        "--dump-max-per-hour",
        "10",
        "--dump-keep",
        "2",
        "--dump-dir",
        dir.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let dev = watched();
    let call = Schedule::new(0x5EED_0004, TSG);
    for _ in 0..3 {
        call.issue(&dev);
    }
    let f = traced.interrupt();
    let stats = json_stats(&f.stdout);
    assert_eq!(stats["flight_recorder"]["dumps"], 3, "{}", f.stderr);
    let dumps = dumps_in(&dir);
    assert_eq!(dumps.len(), 2, "{dumps:?}");
    let mut held: Vec<usize> = dumps
        .iter()
        .map(|d| schedules_of(&read(d).1, TSG))
        .collect();
    held.sort();
    assert_eq!(held, [2, 3], "{dumps:?}");
}

/// SIGUSR1 dumps the window (no --dump-on needed) and tracing goes on: the dump appears while
/// gpu-trace runs, replays alone, and holds the schedules made before the signal (each once).
#[test]
fn sigusr1_dumps_and_tracing_goes_on() {
    let _serial = serial();
    let test = "sigusr1_dumps_and_tracing_goes_on";
    if skip_unless_root(test) {
        return;
    }
    const TSG: u32 = 0x5EED_0044;
    let dir = fresh_dir("flight-usr1");
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--format",
        "json",
        "--flight-recorder",
        "10m",
        "--dump-dir",
        dir.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let dev = watched();
    let call = Schedule::new(0x5EED_0003, TSG);
    for _ in 0..5 {
        call.issue(&dev);
    }
    traced.signal(libc::SIGUSR1);
    // Waiting for the effect (the file renamed into place), not setting the scenario up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dumps_in(&dir).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Still tracing after the dump.
    for _ in 0..2 {
        call.issue(&dev);
    }
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert_eq!(
        schedule_lines(&f.stdout, TSG),
        7,
        "tracing went on after the dump"
    );
    let stats = json_stats(&f.stdout);
    assert_eq!(stats["flight_recorder"]["triggers"]["signal"], 1);
    assert_eq!(stats["flight_recorder"]["dumps"], 1);
    let dumps = dumps_in(&dir);
    assert_eq!(dumps.len(), 1, "{dumps:?}");
    assert!(dumps[0].to_str().unwrap().ends_with("-signal.gtrace"));
    let (_, recs, _) = read(&dumps[0]);
    let held = schedules_of(&recs, TSG);
    assert!(held <= 5, "only what came before the signal: {held}");
    let (status, out, err) = replay_json(&dumps[0]);
    assert_eq!(status, Some(0), "{err}");
    assert_eq!(schedule_lines(&out, TSG), held);
}

/// `POST /dump` on `--metrics` with `--dump-token-file` dumps the window as SIGUSR1 does, through
/// a real HTTP client (std's TcpStream): a wrong token is answered 401 and dumps nothing, the
/// token 202; the one dump holds the schedules made before it and replays alone with them. A
/// second request past `--dump-max-per-hour 1` is counted and not written: the scrape's
/// `gpu_trace_flight_*` counters and the final STATS say 2 triggers, 1 dump, 1 suppressed.
#[test]
fn post_dump_with_the_token_dumps_the_window() {
    let _serial = serial();
    let test = "post_dump_with_the_token_dumps_the_window";
    if skip_unless_root(test) {
        return;
    }
    const TSG: u32 = 0x5EED_0046;
    let dir = fresh_dir("flight-http");
    let token = dir.join("token");
    std::fs::write(&token, "sesame-42\n").unwrap();
    let dumps = dir.join("dumps");
    std::fs::create_dir(&dumps).unwrap();
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--format",
        "json",
        "--flight-recorder",
        "10m",
        "--dump-dir",
        dumps.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:0",
        "--dump-token-file",
        token.to_str().unwrap(),
        "--dump-max-per-hour",
        "1",
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let addr = (traced.stderr_so_far().iter())
        .find_map(|l| l.split("metrics at http://").nth(1))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address: {:?}", traced.stderr_so_far()))
        .to_string();
    let exchange = |head: String| {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        let mut r = String::new();
        let _ = c.read_to_string(&mut r);
        r
    };
    let post = |auth: &str| {
        exchange(format!(
            "POST /dump HTTP/1.0\r\nAuthorization: Bearer {auth}\r\n\r\n"
        ))
    };
    // The scrape's line of `series`, once it reads `want` (waiting for the state, not a time).
    let scraped = |series: &str, want: &str| {
        let line = format!("\n{series} {want}\n");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let t = exchange("GET /metrics HTTP/1.0\r\n\r\n".into());
            if t.contains(&line) || std::time::Instant::now() > deadline {
                return t.contains(&line);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let dev = watched();
    let call = Schedule::new(0x5EED_0003, TSG);
    for _ in 0..3 {
        call.issue(&dev);
    }
    let r = post("sesame-4");
    assert!(r.starts_with("HTTP/1.0 401"), "{r}");
    let r = post("sesame-42");
    assert!(r.starts_with("HTTP/1.0 202"), "{r}");
    // Waiting for the effect (the file renamed into place), not setting the scenario up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dumps_in(&dumps).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        scraped("gpu_trace_flight_dumps_total", "1"),
        "the dump counted"
    );
    // A second request within the hour: counted, suppressed by --dump-max-per-hour 1.
    let r = post("sesame-42");
    assert!(r.starts_with("HTTP/1.0 202"), "{r}");
    assert!(scraped("gpu_trace_flight_dumps_suppressed_total", "1"));
    assert!(scraped(
        r#"gpu_trace_flight_triggers_total{trigger="signal"}"#,
        "2"
    ));
    assert!(scraped("gpu_trace_flight_dumps_total", "1"));
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let stats = json_stats(&f.stdout);
    let flight = &stats["flight_recorder"];
    assert_eq!(flight["triggers"]["signal"], 2, "{}", f.stderr);
    assert_eq!(
        (&flight["dumps"], &flight["not_written"]),
        (&1.into(), &1.into())
    );
    let found = dumps_in(&dumps);
    assert_eq!(found.len(), 1, "{found:?}");
    let (_, recs, _) = read(&found[0]);
    assert_eq!(
        schedules_of(&recs, TSG),
        3,
        "the schedules before the request"
    );
    let (status, out, err) = replay_json(&found[0]);
    assert_eq!(status, Some(0), "{err}");
    assert_eq!(schedule_lines(&out, TSG), 3);
}

/// `--dump-on signal-exit` with `-- CMD`: a command killed by a signal dumps the window
/// before gpu-trace ends (with the command's status, 128 + 9); one that exits normally does
/// not.
#[test]
fn a_command_killed_by_a_signal_dumps() {
    let _serial = serial();
    let test = "a_command_killed_by_a_signal_dumps";
    if skip_unless_root(test) {
        return;
    }
    for (script, code, dumped) in [("kill -KILL $$", 137, 1), ("exit 3", 3, 0)] {
        let dir = fresh_dir("flight-exit");
        let out = Command::new(gpu_trace_bin())
            .args([
                "--watch-device",
                WATCHED,
                "-q",
                "--flight-recorder",
                "1m",
                "--dump-on",
                "signal-exit",
                "--dump-dir",
                dir.to_str().unwrap(),
                "--",
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{script}: {stderr}");
        let dumps = dumps_in(&dir);
        assert_eq!(dumps.len(), dumped, "{script}: {dumps:?} {stderr}");
        for d in dumps {
            assert!(d.to_str().unwrap().ends_with("-signal-exit.gtrace"));
            let (status, _, err) = replay_json(&d);
            assert_eq!(status, Some(0), "{err}");
        }
    }
}
