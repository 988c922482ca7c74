//! Stress and bad-input tests on the real kernel programs: garbage and FINN-serialized calls on a
//! watched fd, ioctl storms that overflow a small ring buffer, and exact per-process counts from
//! many processes and threads. Through the library (records, kernel counters, the pipeline) and
//! through the `gpu-trace` binary (JSON statistics, exit codes).
//!
//! The calls go to `/dev/full` (see `rel_support`): it has no ioctls, so every call fails with
//! -ENOTTY after the programs have read its parameters. Such failed calls never create a TSG, but
//! a refused `GPFIFO_SCHEDULE` is still a SCHEDULE event (`allowed=no`), which is what the
//! binary's event counts are checked with.
//!
//! Needs root; without it each test prints `SKIPPED: <why>`. Rates are printed, never asserted.

mod common;
mod rel_support;

use std::{
    collections::BTreeMap,
    ffi::c_void,
    os::fd::AsRawFd,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use gpu_trace::{
    cli::Format,
    event::EventKind,
    model::stats::KernelCounters,
    pipeline::Pipeline,
    source::Sources,
    source::nvidia::decode::{
        self, AllocParams, ControlParams, NVOS54_FLAGS_FINN_SERIALIZED,
        NVOS64_FLAGS_FINN_SERIALIZED, RmCall, Unreadable,
    },
    wire::{self, RawRecord},
};
use gpu_trace_common::{
    NvIoctlRecord, nv_flags,
    nvidia::{class, cmd},
};
use rel_support::*;

/// The ioctl numbers (`_IOC_NR`) of the RM escapes gpu-trace traces, written here from the
/// driver's ABI (`kernel-open/common/inc/nv-ioctl-numbers.h`: `NV_ESC_RM_FREE` 0x29,
/// `NV_ESC_RM_CONTROL` 0x2A, `NV_ESC_RM_ALLOC` 0x2B; `NV_ESC_IOCTL_XFER_CMD` =
/// `NV_IOCTL_BASE` 200 + 11 = 211 = 0xD3), not taken from the kernel filter under test
/// (`ioctl_nr_is_candidate`), so that a wrong filter fails the conservation checks below.
const RM_ESCAPE_NRS: [u32; 4] = [0x29, 0x2A, 0x2B, 0xD3];

/// Whether `cmd` carries one of [`RM_ESCAPE_NRS`]. The driver ignores `_IOC_TYPE`, `_IOC_DIR`
/// and `_IOC_SIZE` when it dispatches (`nvidia_ioctl` switches on `_IOC_NR` alone).
fn is_rm_escape(cmd: u32) -> bool {
    RM_ESCAPE_NRS.contains(&(cmd & 0xff))
}

/// One tracer at a time in this binary: the tests count kernel-wide counters and drops.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn delta(a: &KernelCounters, b: &KernelCounters) -> KernelCounters {
    KernelCounters {
        dropped: b.dropped - a.dropped,
        read_failed: b.read_failed - a.read_failed,
        ignored: b.ignored - a.ignored,
        emitted: b.emitted - a.emitted,
        fd_lookup_failed: b.fd_lookup_failed - a.fd_lookup_failed,
        ..*b
    }
}

fn nv_of(items: &[Vec<u8>]) -> Vec<NvIoctlRecord> {
    items
        .iter()
        .filter_map(
            |b| match wire::parse_record(b).expect("kernel records parse") {
                RawRecord::NvIoctl(n) => Some(n),
                _ => None,
            },
        )
        .collect()
}

/// A small deterministic PRNG (xorshift64*), so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Bad input.

#[test]
fn finn_unknown_classes_and_garbage_are_counted_never_events() {
    let _serial = serial();
    let test = "finn_unknown_classes_and_garbage_are_counted_never_events";
    let Some((tracer, mut ring)) = load(test, 1 << 24) else {
        return;
    };
    let before = tracer.counters().unwrap();
    let dev = watched();
    let fd = dev.as_raw_fd();
    let tid = gettid();

    // FINN-serialized control (GPFIFO_SCHEDULE, NVOS54 flags 0x4): bEnable cannot be read from a
    // serialized buffer, so no SCHEDULE may be reported.
    let sched = [1u8, 0, 0];
    let finn_ctl = Nvos54 {
        h_client: 0xF1AA_0001,
        h_object: 0xF1AA_0010,
        cmd: cmd::TSG_GPFIFO_SCHEDULE,
        flags: NVOS54_FLAGS_FINN_SERIALIZED,
        params: sched.as_ptr() as u64,
        params_size: 3,
        status: 0,
    };
    assert_eq!(ioctl(fd, CONTROL, (&raw const finn_ctl).cast()), -ENOTTY);
    // FINN-serialized TSG alloc (NVOS64 flags 0x1).
    let tsg_params: [u32; 5] = [0, 0, 0, 1, 0];
    let finn_alloc = Nvos64 {
        h_root: 0xF1AA_0001,
        h_parent: 0xF1AA_0002,
        h_new: 0xF1AA_0010,
        h_class: class::KEPLER_CHANNEL_GROUP_A,
        p_alloc: tsg_params.as_ptr() as u64,
        flags: NVOS64_FLAGS_FINN_SERIALIZED,
        ..Default::default()
    };
    assert_eq!(ioctl(fd, ALLOC64, (&raw const finn_alloc).cast()), -ENOTTY);
    // Not of interest, counted as ignored, never sent: an unknown class, an unknown control,
    // an XFER-wrapped unknown escape.
    let unknown_class = Nvos64 {
        h_class: 0x1234,
        ..finn_alloc
    };
    assert_eq!(
        ioctl(fd, ALLOC64, (&raw const unknown_class).cast()),
        -ENOTTY
    );
    let unknown_cmd = Nvos54 {
        cmd: 0x2080_0101,
        flags: 0,
        ..finn_ctl
    };
    assert_eq!(ioctl(fd, CONTROL, (&raw const unknown_cmd).cast()), -ENOTTY);
    let xfer_unknown = Xfer {
        cmd: 0x99,
        size: 16,
        ptr: (&raw const unknown_cmd) as u64,
    };
    assert_eq!(ioctl(fd, XFER, (&raw const xfer_unknown).cast()), -ENOTTY);
    let specific_candidates = 5u64;

    // Garbage: random commands of NVIDIA's ioctl type (half of them with an RM escape number)
    // and random arguments: NULL, small and kernel addresses, random bytes, XFER wrappers of
    // random bytes.
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut junk = vec![0u8; 1 << 16];
    for b in junk.iter_mut() {
        *b = rng.next() as u8;
    }
    let mut xfers: Vec<Xfer> = Vec::new();
    const GARBAGE: usize = 4000;
    let mut calls = Vec::with_capacity(GARBAGE);
    for _ in 0..GARBAGE {
        let nr = if rng.below(2) == 0 {
            RM_ESCAPE_NRS[rng.below(4) as usize]
        } else {
            rng.below(256) as u32
        };
        let cmd = (rng.next() as u32 & 0xFFFF_0000) | 0x4600 | nr;
        let arg: u64 = match rng.below(5) {
            0 => 0,
            1 => 0x10 + rng.below(0x1000),
            2 => 0xFFFF_8880_0000_0000 + rng.below(1 << 20),
            3 => junk.as_ptr() as u64 + rng.below(junk.len() as u64 - 512),
            _ => {
                let ptr = if rng.below(4) == 0 {
                    rng.next()
                } else {
                    junk.as_ptr() as u64 + rng.below(junk.len() as u64 - 512)
                };
                let size = [16u32, 32, 48, 20000, rng.next() as u32][rng.below(5) as usize];
                let esc = if rng.below(2) == 0 {
                    [0x29u32, 0x2A, 0x2B][rng.below(3) as usize]
                } else {
                    rng.next() as u32
                };
                xfers.push(Xfer {
                    cmd: esc,
                    size,
                    ptr,
                });
                u64::MAX // patched below, once `xfers` stops moving
            }
        };
        assert!(safe_cmd(cmd));
        calls.push((cmd, arg, xfers.len()));
    }
    let mut garbage_candidates = 0u64;
    for &(cmd, arg, xfer_count) in &calls {
        let arg = if arg == u64::MAX {
            (&raw const xfers[xfer_count - 1]) as u64
        } else {
            arg
        };
        garbage_candidates += u64::from(is_rm_escape(cmd));
        assert_eq!(ioctl(fd, cmd, arg as *const c_void), -ENOTTY);
    }

    let after = tracer.counters().unwrap();
    let d = delta(&before, &after);
    let items = drain_until(&mut ring, |items| items.len() as u64 >= d.emitted);
    let recs: Vec<NvIoctlRecord> = nv_of(&items)
        .into_iter()
        .filter(|r| r.hdr.tid == tid)
        .collect();
    eprintln!(
        "{test}: {GARBAGE} garbage calls, {garbage_candidates} with an RM escape number; kernel: {d:?}; {} records",
        recs.len()
    );

    // Every call with a candidate number is accounted for: sent, or ignored; none lost. The
    // kernel also sent this process's cgroup record, once, before its first record (issue 14).
    assert_eq!(d.dropped, 0);
    assert_eq!(d.fd_lookup_failed, 0);
    assert_eq!(
        d.emitted + d.ignored,
        specific_candidates + garbage_candidates + 1,
        "{d:?}"
    );
    let cgroup_records = items
        .iter()
        .filter(|b| matches!(wire::parse_record(b), Ok(RawRecord::TaskCgroup(_))))
        .count() as u64;
    assert_eq!(cgroup_records, 1, "one cgroup record for this process");
    assert_eq!(
        recs.len() as u64 + cgroup_records,
        d.emitted,
        "every record sent arrives"
    );
    // Failed reads are counted once per record that carries a read-failure flag.
    let read_failures = recs
        .iter()
        .filter(|r| {
            r.flags
                & (nv_flags::XFER_READ_FAILED
                    | nv_flags::PARAMS_READ_FAILED
                    | nv_flags::SUB_READ_FAILED)
                != 0
        })
        .count() as u64;
    assert_eq!(d.read_failed, read_failures);
    assert!(
        read_failures > 100,
        "the garbage exercised failed reads: {read_failures}"
    );

    // The FINN calls arrive, flagged as unreadable; the ignored ones never arrive.
    let finn: Vec<RmCall> = recs.iter().take(2).map(decode::decode).collect();
    assert!(
        matches!(
            finn[0],
            RmCall::Control {
                finn_serialized: true,
                params: ControlParams::Unreadable {
                    reason: Unreadable::FinnSerialized
                },
                ..
            }
        ),
        "{:?}",
        finn[0]
    );
    assert!(
        matches!(
            finn[1],
            RmCall::Alloc {
                finn_serialized: true,
                class: class::KEPLER_CHANNEL_GROUP_A,
                params: AllocParams::Unreadable {
                    reason: Unreadable::FinnSerialized
                },
                ..
            }
        ),
        "{:?}",
        finn[1]
    );
    for r in &recs[2..] {
        if let RmCall::Alloc {
            class: 0x1234,
            client: 0xF1AA_0001,
            ..
        }
        | RmCall::Control {
            cmd: 0x2080_0101,
            client: 0xF1AA_0001,
            ..
        } = decode::decode(r)
        {
            panic!("an ignored call was sent: {r:?}");
        }
    }

    // Through the pipeline: no event at all from any of it; the malformed ones are counted.
    let mut out = Vec::new();
    let mut p = Pipeline::new(pipeline_config(Format::Json), &mut out);
    let mut sources = Sources::new();
    let mut malformed = 0u64;
    for r in &recs {
        p.feed(wire::nv_ioctl_bytes(r)).unwrap();
        let evs = sources.events_of(&RawRecord::NvIoctl(*r));
        assert!(evs.is_empty(), "garbage became events: {evs:?} from {r:?}");
        malformed += u64::from(matches!(decode::decode(r), RmCall::Malformed { .. }));
    }
    assert_eq!(p.stats().events(), 0);
    assert_eq!(p.stats().decode_errors, malformed);
    assert_eq!(sources.nvidia().counters().malformed, malformed);
    assert_eq!(
        sources.nvidia().counters().calls + malformed,
        recs.len() as u64
    );
    assert!(
        sources.nvidia().counters().schedule_unreadable >= 1,
        "the FINN schedule is counted as unreadable"
    );
    eprintln!(
        "{test}: malformed {malformed}, tracker counters {:?}",
        sources.nvidia().counters()
    );

    // Had the driver accepted the FINN-serialized TSG alloc (ret 0, status NV_OK), the TSG is
    // real and reported, but with an unknown engine: never with values read from a serialized
    // buffer as if it were the plain struct.
    let mut ok_finn = recs[1];
    ok_finn.ret = 0;
    let evs = Sources::new().events_of(&RawRecord::NvIoctl(ok_finn));
    match &evs[..] {
        [e] => match &e.kind {
            EventKind::TaskInit {
                engine,
                engine_type,
                ..
            } => assert_eq!((engine, engine_type), (&None, &None)),
            k => panic!("{k:?}"),
        },
        other => panic!("an accepted TSG alloc is one TASK_INIT: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes for the storms.

/// Child body: `REL_THREADS` threads named `w<REL_PROC>-<t>`, each issuing `REL_CALLS` calls on
/// the watched device: `REL_MODE` = `free` (RM_FREE only), `sched` (alternately a refused
/// GPFIFO_SCHEDULE and an RM_FREE), or `mix` (schedule, free, TSG alloc, XFER-wrapped TSG
/// alloc, in turn). Waits for a byte on stdin before starting when `REL_WAIT` is set.
#[test]
#[ignore = "child process body for the stress tests"]
fn storm_child() {
    let threads = env_num("REL_THREADS", 1);
    let calls = env_num("REL_CALLS", 1);
    let proc_ix = env_num("REL_PROC", 0);
    let mode = std::env::var("REL_MODE").unwrap_or_else(|_| "free".into());
    if std::env::var("REL_WAIT").is_ok() {
        let mut b = [0u8; 1];
        let _ = std::io::Read::read(&mut std::io::stdin(), &mut b);
    }
    let dev = std::sync::Arc::new(watched());
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let dev = dev.clone();
            let mode = mode.clone();
            std::thread::Builder::new()
                .name(format!("w{proc_ix}-{t}"))
                .spawn(move || {
                    let object = 0x5C00_0000 | ((proc_ix as u32) << 8) | t as u32;
                    let s = Schedule::new(0xC1D0_0000 | proc_ix as u32, object);
                    let tsg_params: [u32; 5] = [0, 0, 0, 1, 0];
                    let alloc = Nvos64 {
                        h_root: 0xC1D0_0000 | proc_ix as u32,
                        h_parent: 0xCAF0_0001,
                        h_new: object,
                        h_class: class::KEPLER_CHANNEL_GROUP_A,
                        p_alloc: tsg_params.as_ptr() as u64,
                        ..Default::default()
                    };
                    let xfer = Xfer {
                        cmd: 0x2B,
                        size: 48,
                        ptr: (&raw const alloc) as u64,
                    };
                    let fd = dev.as_raw_fd();
                    for i in 0..calls {
                        let kind = match mode.as_str() {
                            "free" => 1,
                            "sched" => i % 2,
                            _ => i % 4,
                        };
                        let rc = match kind {
                            0 => s.issue(&dev),
                            1 => free(&dev, 0xC1D0_0000, object),
                            2 => ioctl(fd, ALLOC64, (&raw const alloc).cast()),
                            _ => ioctl(fd, XFER, (&raw const xfer).cast()),
                        };
                        assert_eq!(rc, -ENOTTY);
                    }
                })
                .unwrap()
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Starts `procs` storm children; returns them (by process index).
fn storm(procs: u64, threads: u64, calls: u64, mode: &str) -> Vec<std::process::Child> {
    (0..procs)
        .map(|p| {
            child("storm_child")
                .env("REL_THREADS", threads.to_string())
                .env("REL_CALLS", calls.to_string())
                .env("REL_PROC", p.to_string())
                .env("REL_MODE", mode)
                .spawn()
                .unwrap()
        })
        .collect()
}

fn wait_all(children: Vec<std::process::Child>) -> Vec<u32> {
    children
        .into_iter()
        .map(|mut c| {
            let pid = c.id();
            assert!(c.wait().unwrap().success(), "storm child {pid} failed");
            pid
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 3. Overload.

#[test]
fn storm_overflowing_a_small_ring_is_counted_and_the_reader_recovers() {
    let _serial = serial();
    let test = "storm_overflowing_a_small_ring_is_counted_and_the_reader_recovers";
    let Some((tracer, mut ring)) = load(test, 4096) else {
        return;
    };
    let before = tracer.counters().unwrap();
    let (procs, threads, calls) = (4u64, 2u64, 5000u64);
    let started = Instant::now();
    // Nobody reads during the storm: the 4 KiB ring (15 records) overflows.
    let pids = wait_all(storm(procs, threads, calls, "free"));
    let storm_time = started.elapsed();
    let items = drain_until(&mut ring, |_| true);
    let mid = tracer.counters().unwrap();
    let d = delta(&before, &mid);
    let nv = nv_of(&items);
    let issued = procs * threads * calls;
    let received = nv.iter().filter(|r| pids.contains(&r.hdr.tgid)).count() as u64;
    let tasks = items.len() as u64 - nv.len() as u64;
    eprintln!(
        "{test}: {issued} calls from {procs}x{threads} threads in {storm_time:?} ({:.0}/s) into a 4 KiB ring: \
         received {received} ioctl + {tasks} close/exit records, kernel {d:?}",
        issued as f64 / storm_time.as_secs_f64()
    );
    assert!(d.dropped > 0, "the storm must overflow a 4 KiB ring: {d:?}");
    assert_eq!(
        d.emitted,
        items.len() as u64,
        "every record sent (calls, close and exit notices) was read"
    );
    // Conservation: each call is received or counted as dropped; the only other drops are close
    // and exit notices of the storm processes (a few per process).
    let lost = issued - received;
    assert!(
        d.dropped >= lost,
        "{lost} calls lost but only {} drops counted",
        d.dropped
    );
    assert!(
        d.dropped - lost <= procs * 16,
        "{} drops beyond the {lost} lost calls",
        d.dropped - lost
    );

    // Still responsive: new calls after the storm all arrive, nothing more is dropped.
    let dev = watched();
    let tid = gettid();
    for i in 0..10 {
        free(&dev, 0x5EED_0000, 0x5EED_0000 + i);
    }
    let after_items = drain_until(&mut ring, |items| {
        nv_of(items).iter().filter(|r| r.hdr.tid == tid).count() >= 10
    });
    let markers: Vec<u32> = nv_of(&after_items)
        .iter()
        .filter(|r| r.hdr.tid == tid)
        .map(|r| match decode::decode(r) {
            RmCall::Free { object, .. } => object,
            c => panic!("{c:?}"),
        })
        .collect();
    assert_eq!(
        markers,
        (0..10).map(|i| 0x5EED_0000 + i).collect::<Vec<_>>()
    );
    let end = tracer.counters().unwrap();
    assert_eq!(
        end.dropped, mid.dropped,
        "no drops once the reader keeps up"
    );
    drop((ring, tracer));

    // The same storm, still unread, into a 16 MiB ring (--ring-size 16777216): memory buys
    // headroom, nothing is lost.
    let Some((tracer, mut ring)) = load(test, 1 << 24) else {
        return;
    };
    let before = tracer.counters().unwrap();
    let pids = wait_all(storm(procs, threads, calls, "free"));
    let items = drain_until(&mut ring, |_| true);
    let d = delta(&before, &tracer.counters().unwrap());
    let received = nv_of(&items)
        .iter()
        .filter(|r| pids.contains(&r.hdr.tgid))
        .count() as u64;
    eprintln!("{test}: same storm into a 16 MiB ring: received {received}, kernel {d:?}");
    assert_eq!((d.dropped, received), (0, issued));
}

#[test]
fn cli_reports_drops_in_json_and_exits_4_and_keeps_up_after_the_storm() {
    let _serial = serial();
    let test = "cli_reports_drops_in_json_and_exits_4_and_keeps_up_after_the_storm";
    if skip_unless_root(test) {
        return;
    }
    let recording = common::scratch().join("drops.gtrace");
    let recording_s = recording.to_str().unwrap();
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let traced = match Traced::start(&[
        "--watch-device",
        WATCHED,
        "--ring-size",
        "4096",
        "--format",
        "json",
        "-v",
        "--record",
        recording_s,
        "--metrics",
        &metrics,
    ]) {
        Ok(t) => t,
        Err(e) => panic!("{test}: {e}"),
    };
    let started = Instant::now();
    let pids = wait_all(storm(4, 2, 20_000, "sched"));
    let storm_time = started.elapsed();
    // After the storm: 20 refused schedules on a distinctive TSG, from this thread, each once
    // the reader has emptied the ring (a burst of more than 15 would overflow the 4 KiB ring by
    // itself): the state read from the ring's fill gauge, not a pause.
    let dev = watched();
    let marker = Schedule::new(0x5EED_0001, 0x5EED_00F0);
    // Each scrape closes a socket, and this process's closes are records once its first
    // marker made it a traced NVIDIA user: counted for the conservation below.
    let (mut scrapes_before, mut scrapes_after) = (0, 0);
    for i in 0..20 {
        let n = wait_ring_read(port);
        if i == 0 {
            scrapes_before += n;
        } else {
            scrapes_after += n;
        }
        marker.issue(&dev);
    }
    let f = traced.interrupt();
    let stats = json_stats(&f.stdout);
    let dropped = stats["kernel"]["dropped"].as_u64().unwrap();
    eprintln!(
        "{test}: 160000 calls (80000 schedules) in {storm_time:?}; STATS kernel {}; exit {:?}",
        stats["kernel"], f.status
    );
    assert!(
        dropped > 0,
        "a 4 KiB ring must overflow: {}",
        stats["kernel"]
    );
    assert_eq!(
        f.status.code(),
        Some(4),
        "exit code 4 when records were dropped: {}",
        f.stderr
    );
    assert!(
        f.stderr.contains("dropped") && f.stderr.contains("--ring-size"),
        "stderr says what to do: {}",
        f.stderr
    );
    let events = json_events(&f.stdout);
    let me = std::process::id();
    let markers = events
        .iter()
        .filter(|e| {
            e["event"] == "SCHEDULE" && e["pid"] == me && e["task"]["value"] == 0x5EED_00F0u32
        })
        .count();
    assert_eq!(markers, 20, "every call after the storm is reported");
    // Conservation in the kernel: every one of the 4 × 2 × 20 000 storm calls and the 20 markers
    // (all RM escapes on the watched device, each of interest: a schedule or a free) was either
    // counted as emitted or as dropped, and so was every other record the programs tried to
    // send: per storm process its cgroup record (tried once), the close() of /dev/full and its
    // exit notice (those two only for a process with a record sent, so tracked), and this
    // process's cgroup record and close(): at most 4 × 3 + 2 more; and the closes of the
    // scrapes' sockets once this process was traced (those after its first marker, and at
    // most those before it too). Nothing else touches /dev/full meanwhile.
    let emitted = stats["kernel"]["emitted"].as_u64().unwrap();
    let calls = 4 * 2 * 20_000 + 20;
    let (low, high) = (
        calls + 5 + scrapes_after,
        calls + 4 * 3 + 2 + scrapes_after + scrapes_before,
    );
    assert!(
        (low..=high).contains(&(emitted + dropped)),
        "emitted + dropped = {calls} calls + 5 to 14 cgroup/close/exit records + {scrapes_after} \
         (up to {}) scrapes' closes: {}",
        scrapes_after + scrapes_before,
        stats["kernel"]
    );
    // Per process, never more than was issued, and the table agrees with the event lines.
    let mut storm_lines = 0;
    for pid in pids {
        let lines = events
            .iter()
            .filter(|e| e["event"] == "SCHEDULE" && e["pid"] == pid)
            .count() as u64;
        let row = json_process(&stats, pid).map_or(0, |p| p["schedule"].as_u64().unwrap());
        assert!(
            lines <= 2 * 10_000 && row == lines,
            "pid {pid}: {lines} lines, row {row}"
        );
        storm_lines += lines;
    }
    // Not vacuous: the ring is empty when the storm starts and every storm thread's first call is
    // a schedule, so at least the first one fits and is reported; and the total of the table is
    // the storm's lines plus the markers.
    assert!(storm_lines >= 1, "no storm schedule reported at all");
    assert!(
        storm_lines < emitted,
        "{storm_lines} lines, {emitted} records"
    );
    assert_eq!(
        stats["schedule"].as_u64().unwrap(),
        storm_lines + 20,
        "the STATS total is the storm's lines plus the 20 markers"
    );

    // The recording of this run: its replay exits 4 too, with the live run's drop count (from
    // the recording's trailer) and the same events.
    let out = std::process::Command::new(gpu_trace_bin())
        .args(["replay", recording_s, "--format", "json", "-v"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&recording);
    let replayed = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(4),
        "replay of a run with drops: {stderr}"
    );
    assert!(
        stderr.contains("dropped") && stderr.contains("--ring-size"),
        "{stderr}"
    );
    let replay_stats = json_stats(&replayed);
    assert_eq!(replay_stats["kernel"]["dropped"], dropped);
    assert_eq!(replay_stats["schedule"], stats["schedule"]);
}

// ---------------------------------------------------------------------------------------------
// 4. Exact counts.

#[test]
fn exact_counts_per_process_and_thread_under_stress() {
    let _serial = serial();
    let test = "exact_counts_per_process_and_thread_under_stress";
    // 32 MiB: room for every record even if the reader fell behind, so that drops would be a bug.
    let Some((tracer, mut ring)) = load(test, 1 << 25) else {
        return;
    };
    let before = tracer.counters().unwrap();
    let (procs, threads, calls) = (4u64, 4u64, 2000u64);
    let started = Instant::now();
    let children = storm(procs, threads, calls, "mix");
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    // Read while they run.
    let mut items = Vec::new();
    let mut running = children;
    while !running.is_empty() {
        while let Some(item) = ring.next() {
            items.push(item.to_vec());
        }
        running.retain_mut(|c| match c.try_wait().unwrap() {
            Some(s) => {
                assert!(s.success());
                false
            }
            None => true,
        });
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = started.elapsed();
    items.extend(drain_until(&mut ring, |_| true));
    let d = delta(&before, &tracer.counters().unwrap());
    let issued = procs * threads * calls;
    eprintln!(
        "{test}: {issued} calls from {procs} processes x {threads} threads in {elapsed:?} ({:.0} calls/s traced); kernel {d:?}",
        issued as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(d.dropped, 0, "a 32 MiB ring holds every record");

    let nv = nv_of(&items);
    // Per process and call kind, per thread and name: exactly what was issued.
    let mut per_kind: BTreeMap<(u32, &str), u64> = BTreeMap::new();
    let mut per_tid: BTreeMap<(u32, u32), (u64, String)> = BTreeMap::new();
    for r in nv.iter().filter(|r| pids.contains(&r.hdr.tgid)) {
        let kind = match decode::decode(r) {
            RmCall::Control {
                cmd: cmd::TSG_GPFIFO_SCHEDULE,
                ..
            } => "schedule",
            RmCall::Free { .. } => "free",
            RmCall::Alloc {
                class: class::KEPLER_CHANNEL_GROUP_A,
                ..
            } if decode::via_xfer(r) => "alloc_xfer",
            RmCall::Alloc {
                class: class::KEPLER_CHANNEL_GROUP_A,
                ..
            } => "alloc",
            other => panic!("unexpected call {other:?}"),
        };
        *per_kind.entry((r.hdr.tgid, kind)).or_default() += 1;
        let e = per_tid
            .entry((r.hdr.tgid, r.hdr.tid))
            .or_insert((0, wire::comm_to_string(&r.hdr.comm)));
        e.0 += 1;
        assert_eq!(
            e.1,
            wire::comm_to_string(&r.hdr.comm),
            "one name per thread"
        );
    }
    for (p, &pid) in pids.iter().enumerate() {
        for kind in ["schedule", "free", "alloc", "alloc_xfer"] {
            assert_eq!(
                per_kind.get(&(pid, kind)).copied().unwrap_or(0),
                threads * calls / 4,
                "pid {pid} {kind}"
            );
        }
        let mut names: Vec<String> = per_tid
            .iter()
            .filter(|((tg, _), _)| *tg == pid)
            .map(|(_, (n, comm))| {
                assert_eq!(*n, calls, "pid {pid} thread {comm}");
                comm.clone()
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            (0..threads)
                .map(|t| format!("w{p}-{t}"))
                .collect::<Vec<_>>()
        );
    }
    // `emitted` counts every record kind (calls and the close/exit notices).
    assert_eq!(d.emitted, items.len() as u64);

    // Through the pipeline: one refused SCHEDULE per schedule call, per process; nothing else.
    let mut p = Pipeline::new(pipeline_config(Format::Json), std::io::sink());
    for b in &items {
        p.feed(b).unwrap();
    }
    for &pid in &pids {
        let s = p.stats().process(pid).expect("every process has events");
        assert_eq!(
            (s.schedule, s.schedule_refused),
            (threads * calls / 4, threads * calls / 4)
        );
        assert_eq!((s.task_init, s.work_submit, s.task_destroy), (0, 0, 0));
    }
}

#[test]
fn cli_counts_every_schedule_per_process_exactly() {
    let _serial = serial();
    let test = "cli_counts_every_schedule_per_process_exactly";
    if skip_unless_root(test) {
        return;
    }
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--ring-size",
        "16777216",
        "--format",
        "json",
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let (procs, threads, calls) = (4u64, 4u64, 2000u64);
    let started = Instant::now();
    let pids = wait_all(storm(procs, threads, calls, "sched"));
    let elapsed = started.elapsed();
    let f = traced.interrupt();
    let stats = json_stats(&f.stdout);
    eprintln!(
        "{test}: {} calls in {elapsed:?}; STATS kernel {}",
        procs * threads * calls,
        stats["kernel"]
    );
    assert_eq!(stats["kernel"]["dropped"], 0, "no drops with a 16 MiB ring");
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let events = json_events(&f.stdout);
    let want = threads * calls / 2;
    for pid in pids {
        let row =
            json_process(&stats, pid).unwrap_or_else(|| panic!("pid {pid} missing from STATS"));
        assert_eq!(row["schedule"].as_u64(), Some(want), "pid {pid}: {row}");
        assert_eq!(
            row["schedule_refused"].as_u64(),
            Some(want),
            "pid {pid}: {row}"
        );
        let lines = events
            .iter()
            .filter(|e| e["event"] == "SCHEDULE" && e["pid"] == pid)
            .count() as u64;
        assert_eq!(lines, want, "pid {pid}: event lines");
        // Each thread's events carry its own name.
        for t in 0..threads {
            let p = events.iter().find(|e| e["pid"] == pid).unwrap()["comm"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(p.starts_with('w'), "{p}");
            let n = events
                .iter()
                .filter(|e| {
                    e["pid"] == pid && e["comm"].as_str().unwrap().ends_with(&format!("-{t}"))
                })
                .count() as u64;
            assert_eq!(n, calls / 2, "pid {pid} thread {t}");
        }
    }
}
