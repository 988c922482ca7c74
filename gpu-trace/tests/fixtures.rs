//! Decoder and model tests on real bytes captured on the GPU host (see fixtures/README.md).
//!
//! The expectations are what the workloads make the driver do, derived in fixtures/README.md
//! ("What the workloads ask of the driver"), not what this code happened to print; the first
//! test counts those calls in the raw record bytes by the ABI's offsets alone, without
//! gpu-trace's decoder or model.

use std::{collections::BTreeMap, fs::File, io::BufReader, path::PathBuf, process::Command};

use gpu_trace::{
    event::{DestroyCause, Engine, Event, EventKind, Interleave, TaskId, ValueSource},
    record::RecordReader,
    source::{
        Sources,
        nvidia::decode::{self, ControlParams, RmCall, split_token},
    },
    wire::{self, RawRecord},
};
use gpu_trace_common::nvidia::cmd;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn records(name: &str) -> Vec<RawRecord> {
    let mut reader = RecordReader::new(BufReader::new(File::open(fixture(name)).unwrap())).unwrap();
    let mut out = Vec::new();
    while let Some(bytes) = reader.next_record().unwrap() {
        out.push(wire::parse_record(&bytes).unwrap());
    }
    assert!(
        reader.trailer.is_some(),
        "{name}: the live run ended cleanly"
    );
    out
}

fn events(recs: &[RawRecord]) -> Vec<Event> {
    let mut sources = Sources::new();
    recs.iter().flat_map(|r| sources.events_of(r)).collect()
}

fn count(evs: &[Event], pid: u32, name: &str) -> usize {
    evs.iter()
        .filter(|e| e.origin.pid == pid && e.kind.name() == name)
        .count()
}

/// The PyTorch process of a capture: the one that created TSGs.
fn torch_pid(evs: &[Event]) -> u32 {
    evs.iter()
        .find(|e| e.kind.name() == "TASK_INIT")
        .unwrap()
        .origin
        .pid
}

/// The RM calls of one capture, counted from the raw record bytes with the kernel record's and
/// the ABI's byte offsets only (no gpu-trace decoder): see fixtures/README.md.
#[derive(Debug, Default, PartialEq, Eq)]
struct RawCounts {
    /// Accepted `RM_ALLOC`s of `KEPLER_CHANNEL_GROUP_A` (0xA06C): TSGs.
    tsg_allocs: usize,
    /// Accepted `RM_ALLOC`s of `HOPPER_CHANNEL_GPFIFO_A` (0xC86F): channels.
    channel_allocs: usize,
    /// Accepted `GET_WORK_SUBMIT_TOKEN` controls (0xC36F0108).
    tokens: usize,
    /// Accepted `NVA06C` `GPFIFO_SCHEDULE` controls (0xA06C0101) with `bEnable` = 1.
    schedules: usize,
    /// `NVA06C` `SET_TIMESLICE` controls (0xA06C0103): their `timesliceUs`.
    timeslices: Vec<u64>,
    /// Accepted `RM_FREE`s of a handle an accepted TSG alloc returned.
    tsg_frees: usize,
}

fn raw_counts(name: &str) -> RawCounts {
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let mut reader = RecordReader::new(BufReader::new(File::open(fixture(name)).unwrap())).unwrap();
    let mut c = RawCounts::default();
    let mut tsg_handles = std::collections::BTreeSet::new();
    while let Some(b) = reader.next_record().unwrap() {
        // The kernel's NvIoctlRecord (kind 1, 264 bytes): header 40 bytes (kind @0), ret (i64)
        // @40, escape @60, the RM parameter block @80 (48 bytes), the class/control parameters
        // @128 (136 bytes).
        if u32_at(&b, 0) != 1 {
            continue;
        }
        assert_eq!(b.len(), 264);
        let ret = i64::from_le_bytes(b[40..48].try_into().unwrap());
        let (escape, block, sub) = (u32_at(&b, 60), &b[80..128], &b[128..264]);
        match escape {
            // NV_ESC_RM_ALLOC, NVOS64: hObjectNew @8, hClass @12, status @40.
            0x2B if ret == 0 && u32_at(block, 40) == 0 => match u32_at(block, 12) {
                0xA06C => {
                    c.tsg_allocs += 1;
                    tsg_handles.insert(u32_at(block, 8));
                }
                0xC86F => c.channel_allocs += 1,
                _ => {}
            },
            // NV_ESC_RM_CONTROL, NVOS54: cmd @8, status @28.
            0x2A => {
                let ok = ret == 0 && u32_at(block, 28) == 0;
                match u32_at(block, 8) {
                    0xC36F_0108 if ok => c.tokens += 1,
                    0xA06C_0101 if ok && sub[0] == 1 => c.schedules += 1,
                    0xA06C_0103 => c
                        .timeslices
                        .push(u64::from_le_bytes(sub[..8].try_into().unwrap())),
                    _ => {}
                }
            }
            // NV_ESC_RM_FREE, NVOS00: hObjectOld @8, status @12.
            0x29 if ret == 0
                && u32_at(block, 12) == 0
                && tsg_handles.contains(&u32_at(block, 8)) =>
            {
                c.tsg_frees += 1
            }
            _ => {}
        }
    }
    c
}

/// The calls fixtures/README.md derives for each workload are in the raw bytes.
#[test]
fn raw_records_hold_the_calls_the_workloads_make() {
    assert_eq!(
        raw_counts("two_streams.gtrace"),
        RawCounts {
            tsg_allocs: 4,
            channel_allocs: 20,
            tokens: 20,
            schedules: 4,
            timeslices: vec![2048],
            tsg_frees: 0,
        }
    );
    let churn = raw_counts("ctx_churn.gtrace");
    assert_eq!(
        (
            churn.tsg_allocs,
            churn.channel_allocs,
            churn.tokens,
            churn.schedules,
            churn.tsg_frees
        ),
        (12, 60, 60, 12, 12),
        "{churn:?}"
    );
}

#[test]
fn two_streams_decodes_to_what_pytorch_asks_of_the_driver() {
    let recs = records("two_streams.gtrace");
    let evs = events(&recs);
    let pid = torch_pid(&evs);

    // 4 TSGs: the first on GR0, the others on copy engines.
    let inits: Vec<&Event> = evs
        .iter()
        .filter(|e| e.origin.pid == pid && e.kind.name() == "TASK_INIT")
        .collect();
    assert_eq!(inits.len(), 4);
    let engines: Vec<Option<Engine>> = inits
        .iter()
        .map(|e| match &e.kind {
            EventKind::TaskInit {
                engine,
                timeslice_us,
                timeslice_source,
                interleave,
                ..
            } => {
                assert_eq!(*timeslice_us, Some(1024));
                assert_eq!(*timeslice_source, ValueSource::DriverDefault);
                assert_eq!(*interleave, Some(Interleave::Medium));
                *engine
            }
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        engines,
        [
            Some(Engine::Graphics),
            Some(Engine::Copy),
            Some(Engine::Copy),
            Some(Engine::Copy)
        ]
    );

    // One allowed SCHEDULE per TSG, with 8/4/4/4 channels.
    let scheds: Vec<(TaskId, Option<u32>, bool)> = evs
        .iter()
        .filter(|e| e.origin.pid == pid)
        .filter_map(|e| match &e.kind {
            EventKind::Schedule {
                task,
                channels,
                allowed,
                ..
            } => Some((*task, *channels, *allowed)),
            _ => None,
        })
        .collect();
    assert_eq!(scheds.len(), 4);
    assert_eq!(
        scheds.iter().map(|s| s.1).collect::<Vec<_>>(),
        [Some(8), Some(4), Some(4), Some(4)]
    );
    assert!(scheds.iter().all(|s| s.2));
    let init_tasks: Vec<TaskId> = inits.iter().map(|e| e.kind.task()).collect();
    assert_eq!(scheds.iter().map(|s| s.0).collect::<Vec<_>>(), init_tasks);

    // 20 work-submit tokens, each = runlist << 16 | ChID, grouped by TSG as the channels are.
    let mut per_task: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
    for e in evs.iter().filter(|e| e.origin.pid == pid) {
        if let EventKind::WorkSubmit {
            task,
            token,
            chid,
            runlist,
            gpu,
            ..
        } = &e.kind
        {
            assert_eq!(Some(token & 0xfff), *chid);
            assert_eq!(Some((token >> 16) & 0x7f), *runlist);
            assert_eq!(*gpu, Some(0));
            per_task
                .entry(format!("{task:?}"))
                .or_default()
                .push((runlist.unwrap(), chid.unwrap()));
        }
    }
    assert_eq!(per_task.values().map(Vec::len).sum::<usize>(), 20);
    let mut sizes: Vec<usize> = per_task.values().map(Vec::len).collect();
    sizes.sort();
    assert_eq!(sizes, [4, 4, 4, 8]);
    // All channels of one TSG sit on one runlist; different TSGs on different runlists.
    let runlists: Vec<u32> = per_task.values().map(|v| v[0].0).collect();
    assert!(
        per_task
            .values()
            .all(|v| v.iter().all(|(r, _)| *r == v[0].0))
    );
    let mut distinct = runlists.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{runlists:?}");

    // CUDA does not free its TSGs: all four end when the process exits, from its last thread.
    let destroys: Vec<&Event> = evs
        .iter()
        .filter(|e| e.origin.pid == pid && e.kind.name() == "TASK_DESTROY")
        .collect();
    assert_eq!(destroys.len(), 4);
    for d in &destroys {
        assert!(matches!(
            d.kind,
            EventKind::TaskDestroy {
                cause: DestroyCause::ProcessExit,
                implicit: true,
                ..
            }
        ));
    }
    let mut destroyed: Vec<TaskId> = destroys.iter().map(|e| e.kind.task()).collect();
    let mut created = init_tasks.clone();
    destroyed.sort_by_key(|t| format!("{t:?}"));
    created.sort_by_key(|t| format!("{t:?}"));
    assert_eq!(destroyed, created);
}

#[test]
fn two_streams_raw_calls_match_the_documented_abi() {
    let recs = records("two_streams.gtrace");
    let calls: Vec<(u32, RmCall)> = recs
        .iter()
        .filter_map(|r| match r {
            RawRecord::NvIoctl(n) => Some((n.ioctl_cmd, decode::decode(n))),
            _ => None,
        })
        .collect();
    // Every RM call of the capture decodes; none is malformed or unreadable.
    assert!(
        calls
            .iter()
            .all(|(_, c)| !matches!(c, RmCall::Malformed { .. }))
    );
    // Allocs arrive as NVOS64 (0xc030462b) with paramsSize 0 (fixtures/README.md).
    let allocs: Vec<&(u32, RmCall)> = calls
        .iter()
        .filter(|(_, c)| matches!(c, RmCall::Alloc { .. }))
        .collect();
    assert!(
        allocs
            .iter()
            .all(|(ioctl, c)| *ioctl == 0xC030_462B
                && matches!(c, RmCall::Alloc { nvos64: true, .. }))
    );
    let hopper_channels = allocs
        .iter()
        .filter(|(_, c)| {
            matches!(
                c,
                RmCall::Alloc {
                    class: 0xC86F,
                    status: 0,
                    ..
                }
            )
        })
        .count();
    assert_eq!(hopper_channels, 20);
    // The one SET_TIMESLICE: 2048 µs on the GR TSG, accepted.
    let timeslices: Vec<&RmCall> = calls
        .iter()
        .map(|(_, c)| c)
        .filter(|c| {
            matches!(
                c,
                RmCall::Control {
                    cmd: cmd::TSG_SET_TIMESLICE,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(timeslices.len(), 1);
    assert!(matches!(
        timeslices[0],
        RmCall::Control {
            status: 0,
            params: ControlParams::Timeslice { us: 2048 },
            ..
        }
    ));
    // Schedules enable the TSG and skip nothing.
    let schedules = calls
        .iter()
        .filter(|(_, c)| {
            matches!(
                c,
                RmCall::Control {
                    cmd: cmd::TSG_GPFIFO_SCHEDULE,
                    params: ControlParams::Schedule {
                        enable: true,
                        skip_submit: false,
                        skip_enable: false
                    },
                    ..
                }
            )
        })
        .count();
    assert_eq!(schedules, 4);
    // Tokens split into runlist/ChID; the H200 (GH100 HAL) sets no doorbell bit.
    for (_, c) in &calls {
        if let RmCall::Control {
            params: ControlParams::WorkSubmitToken { token },
            ..
        } = c
        {
            assert!(!split_token(*token).runlist_doorbell);
        }
    }
}

#[test]
fn context_churn_frees_its_tsgs_explicitly() {
    let evs = events(&records("ctx_churn.gtrace"));
    let pid = torch_pid(&evs);
    // 3 rounds × 4 TSGs, each created, scheduled and freed by RM_FREE (not at exit).
    assert_eq!(count(&evs, pid, "TASK_INIT"), 12);
    assert_eq!(count(&evs, pid, "SCHEDULE"), 12);
    assert_eq!(count(&evs, pid, "WORK_SUBMIT"), 60);
    let destroys: Vec<&Event> = evs
        .iter()
        .filter(|e| e.origin.pid == pid && e.kind.name() == "TASK_DESTROY")
        .collect();
    assert_eq!(destroys.len(), 12);
    assert!(destroys.iter().all(|d| matches!(
        d.kind,
        EventKind::TaskDestroy {
            cause: DestroyCause::Free,
            implicit: false,
            ..
        }
    )));
    // Every TSG is destroyed after it was created, and before the next round creates more.
    let order: Vec<&str> = evs
        .iter()
        .filter(|e| e.origin.pid == pid && matches!(e.kind.name(), "TASK_INIT" | "TASK_DESTROY"))
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(
        order,
        [["TASK_INIT"; 4], ["TASK_DESTROY"; 4]].concat().repeat(3)
    );
}

fn replay(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .arg("replay")
        .args(args)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The event lines of a text output (everything before the statistics block).
fn event_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| !l.starts_with("--- gpu-trace statistics"))
        .collect()
}

#[test]
fn replay_prints_exactly_what_the_live_run_printed() {
    // The live runs were made by a build without SCHED_UPDATE: every other event line of the
    // replay is byte for byte what the live run printed, in the same order, but for `gpu=`:
    // that build printed RM's device instance there, this one nvidia-smi's index, which these
    // recordings (made before recordings listed the host's GPUs) do not know: `gpu=?`.
    for name in ["two_streams", "ctx_churn"] {
        let live = std::fs::read_to_string(fixture(&format!("{name}.live.txt"))).unwrap();
        let live: Vec<String> = event_lines(&live)
            .into_iter()
            .map(|l| {
                (l.split(' '))
                    .map(|w| match w.strip_prefix("gpu=") {
                        Some(_) => "gpu=?",
                        None => w,
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let path = fixture(&format!("{name}.gtrace"));
        let replayed = replay(&[path.to_str().unwrap(), "-v"]);
        let without_updates: Vec<&str> = event_lines(&replayed)
            .into_iter()
            .filter(|l| !l.contains(" SCHED_UPDATE "))
            .collect();
        assert_eq!(without_updates, live, "{name}");
    }
}

/// The raw scheduling-update calls of a capture, in record order: (cpu, pid, client, object,
/// command, RM status, parameters).
fn raw_updates(name: &str) -> Vec<(u32, u32, u32, u32, u32, u32, ControlParams)> {
    records(name)
        .iter()
        .filter_map(|r| match r {
            RawRecord::NvIoctl(n) => match decode::decode(n) {
                RmCall::Control {
                    client,
                    object,
                    cmd,
                    status,
                    params,
                    ..
                } if matches!(
                    cmd,
                    cmd::TSG_SET_TIMESLICE
                        | cmd::TSG_PREEMPT
                        | cmd::TSG_SET_INTERLEAVE_LEVEL
                        | cmd::CHANNEL_SET_INTERLEAVE_LEVEL
                ) || matches!(params, ControlParams::Schedule { enable: false, .. }) =>
                {
                    Some((n.hdr.cpu, n.hdr.tgid, client, object, cmd, status, params))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[test]
fn two_streams_prints_the_2048_us_timeslice_of_the_graphics_tsg() {
    // The raw call (decoded field by field from the record, cf. docs/driver-abi.md part A):
    // NVA06C_CTRL_CMD_SET_TIMESLICE (0xa06c0103) on hObject 0x5c000015 of client 0xc1d0001c,
    // timesliceUs = 2048, status NV_OK, from pid 427 on CPU 15, at ts_ns 35106805687. The TSG
    // 0x5c000015 is the one allocated with engineType 1 (GRAPHICS); nothing set its timeslice
    // before, so the old value is the driver default of 1024 µs. Wall clock: the recording's
    // realtime_offset_ns 1795307914845658056 + 35106805687 = 2026-11-22T00:39:09.952463 UTC.
    assert_eq!(
        raw_updates("two_streams.gtrace"),
        [(
            15,
            427,
            0xc1d0_001c,
            0x5c00_0015,
            cmd::TSG_SET_TIMESLICE,
            0,
            ControlParams::Timeslice { us: 2048 }
        )]
    );
    let path = fixture("two_streams.gtrace");
    let text = replay(&[path.to_str().unwrap()]); // default output, no -v
    let updates: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" SCHED_UPDATE PID="))
        .collect();
    assert_eq!(
        updates,
        [
            "00:39:09.952463 [CPU15] SCHED_UPDATE PID=427    python3          TSG=0x5c000015 timeslice=1024 us -> 2048 us allowed=yes"
        ]
    );
    // It comes after the TSG's SCHEDULE (PyTorch sets it once the TSG is on the runlist).
    let lines = event_lines(&text);
    let at = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap();
    assert!(at("SCHEDULE     PID=427    python3          TSG=0x5c000015") < at("SCHED_UPDATE"));

    // JSON: the TSG's TASK_DESTROY carries the final 2048 µs (observed), its 8 channels and
    // the runlist of its tokens (0x0000000a >> 16 = 0); the other TSGs keep the default.
    let json = replay(&[path.to_str().unwrap(), "--format", "json"]);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let destroys: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["event"] == "TASK_DESTROY")
        .collect();
    assert_eq!(destroys.len(), 4);
    let gr = destroys.iter().find(|v| v["tsg"] == "0x5c000015").unwrap();
    assert_eq!(gr["key"], "427:0xc1d0001c:0x5c000015");
    assert_eq!(gr["handle"], "0x5c000015");
    assert_eq!(gr["client_hex"], "0xc1d0001c");
    assert_eq!(
        gr["final"],
        serde_json::json!({"timeslice_us": 2048, "timeslice_source": "observed",
            "interleave": "MEDIUM", "interleave_source": "driver_default", "channels": 8,
            "runlist": 0, "run_state": "enabled"})
    );
    for d in destroys.iter().filter(|v| v["tsg"] != "0x5c000015") {
        assert_eq!(d["final"]["timeslice_us"], 1024, "{d}");
        assert_eq!(d["final"]["timeslice_source"], "driver_default", "{d}");
        assert_eq!(d["final"]["channels"], 4, "{d}");
    }
    // Every event of a TSG carries the same key; the four keys differ.
    let mut keys: Vec<&str> = lines
        .iter()
        .filter(|v| v["event"] == "TASK_INIT")
        .map(|v| v["key"].as_str().unwrap())
        .collect();
    keys.dedup();
    assert_eq!(keys.len(), 4);
    let stats = lines.last().unwrap();
    assert_eq!(stats["event"], "STATS");
    assert_eq!(stats["final"], true);
    assert_eq!(
        (stats["sched_update"].clone(), stats["preempt"].clone()),
        (1.into(), 0.into())
    );
    let task = stats["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["key"] == "427:0xc1d0001c:0x5c000015")
        .unwrap();
    assert_eq!(
        (
            task["timeslice_us"].clone(),
            task["param_changes"].clone(),
            task["engine"].clone()
        ),
        (2048.into(), 1.into(), "GRAPHICS".into())
    );
}

#[test]
fn ctx_churn_prints_every_preemption_and_timeslice_change() {
    // Raw calls, per round (3 rounds, each on that round's GRAPHICS TSG: 0x5c000015, 0x5c000088,
    // 0x5c000108 of client 0xc1d0001c... of pid 480): one SET_TIMESLICE 2048 after the
    // schedules, then two NVA06C_CTRL_CMD_PREEMPT (0xa06c0105) during teardown with bWait=1,
    // bManualTimeout=0, timeoutUs=0, all status NV_OK, all on CPU 8. Times: the recording's
    // realtime_offset_ns 1795307914845658039 + each record's ts_ns, in UTC.
    let preempt = ControlParams::Preempt {
        wait: true,
        manual_timeout: false,
        timeout_us: 0,
    };
    let ts = ControlParams::Timeslice { us: 2048 };
    let mut want = Vec::new();
    for tsg in [0x5c00_0015, 0x5c00_0088, 0x5c00_0108] {
        want.push((8, 480, 0xc1d0_0028, tsg, cmd::TSG_SET_TIMESLICE, 0, ts));
        want.push((8, 480, 0xc1d0_0028, tsg, cmd::TSG_PREEMPT, 0, preempt));
        want.push((8, 480, 0xc1d0_0028, tsg, cmd::TSG_PREEMPT, 0, preempt));
    }
    assert_eq!(raw_updates("ctx_churn.gtrace"), want);
    let path = fixture("ctx_churn.gtrace");
    let text = replay(&[path.to_str().unwrap()]);
    let updates: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" SCHED_UPDATE PID="))
        .collect();
    let p = "[CPU08] SCHED_UPDATE PID=480    python3          TSG=";
    let set = "timeslice=1024 us -> 2048 us allowed=yes";
    let pre = "preempt wait=yes timeout=default allowed=yes";
    assert_eq!(
        updates,
        [
            format!("00:39:20.952449 {p}0x5c000015 {set}"),
            format!("00:39:20.961367 {p}0x5c000015 {pre}"),
            format!("00:39:20.962117 {p}0x5c000015 {pre}"),
            format!("00:39:21.126123 {p}0x5c000088 {set}"),
            format!("00:39:21.134535 {p}0x5c000088 {pre}"),
            format!("00:39:21.135244 {p}0x5c000088 {pre}"),
            format!("00:39:21.300671 {p}0x5c000108 {set}"),
            format!("00:39:21.308736 {p}0x5c000108 {pre}"),
            format!("00:39:21.309441 {p}0x5c000108 {pre}"),
        ]
    );
    // Statistics: 9 updates, 6 of them preemptions, 2 per GRAPHICS TSG.
    assert!(
        text.contains("\nsched_update        9   (refused 0, preempt 6)\n"),
        "{text}"
    );
    let json = replay(&[path.to_str().unwrap(), "--format", "json"]);
    let stats: serde_json::Value = serde_json::from_str(json.lines().last().unwrap()).unwrap();
    let per_tsg: Vec<(String, u64, u64)> = stats["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["engine"] == "GRAPHICS")
        .map(|t| {
            (
                t["key"].as_str().unwrap().to_string(),
                t["preemptions"].as_u64().unwrap(),
                t["timeslice_us"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        per_tsg,
        [
            ("480:0xc1d00028:0x5c000015".to_string(), 2, 2048),
            ("480:0xc1d00028:0x5c000088".to_string(), 2, 2048),
            ("480:0xc1d00028:0x5c000108".to_string(), 2, 2048),
        ]
    );
    // 4 TSGs live at a time on RM's device 0, never more (each round frees its 4 before the
    // next). The recording predates the inventory's GPUs: nvidia-smi's index is not known.
    assert_eq!(
        stats["gpus"],
        serde_json::json!([{"gpu": null, "rm_device": 0, "live": 0, "max_live": 4}])
    );
}

#[test]
fn prio_stream_makes_no_interleave_or_preempt_call() {
    // PyTorch with a priority -1 stream (h100_late_mps/prio): CUDA maps stream priorities inside its
    // own channel use; the RM calls are the same as two_streams' — four schedules and one
    // SET_TIMESLICE 2048 on the GRAPHICS TSG, no SET_INTERLEAVE_LEVEL, no PREEMPT, no disable.
    let raw = raw_updates("h100_late_mps/prio.gtrace");
    assert_eq!(raw.len(), 1, "{raw:?}");
    assert_eq!(
        (raw[0].3, raw[0].4, raw[0].6),
        (
            0x5c00_0015,
            cmd::TSG_SET_TIMESLICE,
            ControlParams::Timeslice { us: 2048 }
        )
    );
}

#[test]
fn replay_filters_and_formats() {
    let path = fixture("two_streams.gtrace");
    let path = path.to_str().unwrap();
    // Without -v no WORK_SUBMIT; with an unrelated --comm nothing but the statistics.
    let plain = replay(&[path]);
    assert!(!plain.contains("WORK_SUBMIT  PID=") && plain.contains("SCHEDULE     PID="));
    let none = replay(&[path, "--comm", "nosuchprocess"]);
    assert!(
        !none.contains("TASK_INIT    PID=") && none.contains("task_init           0"),
        "{none}"
    );
    // The exiting thread is cuda-EvtHandlr, but --comm python3 keeps the process's destroys.
    let by_comm = replay(&[path, "--comm", "python3"]);
    assert_eq!(by_comm.matches("TASK_DESTROY PID=").count(), 4);
    // JSON: one object per line, the last one the statistics.
    let json = replay(&[path, "-v", "--format", "json"]);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4 + 4 + 1 + 20 + 4 + 1);
    assert_eq!(lines.last().unwrap()["event"], "STATS");
    assert_eq!(lines.last().unwrap()["kernel"]["dropped"], 0);
}

#[test]
fn interval_adds_periodic_statistics_without_touching_the_event_stream() {
    let path = fixture("ctx_churn.gtrace");
    let path = path.to_str().unwrap();
    // Replay counts --interval in the recording's time: one periodic STATS per 0.2 s boundary
    // the records cross, from the first record to the last.
    let ts: Vec<u64> = records("ctx_churn.gtrace")
        .iter()
        .map(|r| r.origin().ts_ns)
        .collect();
    let span = ts.last().unwrap() - ts[0];
    let periodic = (span / 200_000_000) as usize;
    assert!(periodic >= 2, "the capture spans {span} ns");

    let plain = replay(&[path, "--format", "json"]);
    let with = replay(&[path, "--format", "json", "--interval", "0.2"]);
    let (stats, events): (Vec<&str>, Vec<&str>) = with
        .lines()
        .partition(|l| l.starts_with("{\"event\":\"STATS\""));
    // The events are exactly those without --interval, in order; then the final STATS.
    let plain_lines: Vec<&str> = plain.lines().collect();
    assert_eq!(events, plain_lines[..plain_lines.len() - 1]);
    assert_eq!(stats.len(), periodic + 1);
    let parsed: Vec<serde_json::Value> = stats
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (i, s) in parsed.iter().enumerate() {
        let last = i == periodic;
        assert_eq!(s["final"], last, "{s}");
        if !last {
            // (i + 1) × 200 ms, in seconds.
            let ms = s["duration_s"].as_f64().unwrap() * 1000.0;
            assert_eq!(ms.round() as usize, 200 * (i + 1), "{s}");
        }
    }
    // Counts only grow, up to the final ones.
    let inits: Vec<u64> = parsed
        .iter()
        .map(|s| s["task_init"].as_u64().unwrap())
        .collect();
    assert!(inits.windows(2).all(|w| w[0] <= w[1]), "{inits:?}");
    assert_eq!(*inits.last().unwrap(), 12);

    // Text: the blocks go to standard error; standard output is what it is without --interval.
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["replay", path, "--interval", "0.2"])
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), replay(&[path]));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err.matches("--- gpu-trace statistics so far (").count(),
        periodic,
        "{err}"
    );
}
// ---------------------------------------------------------------------------------------------
// Late attach and MPS (tests/fixtures/h100_late_mps, README.md there): recordings made by the build
// before this feature. Expected events derived by hand from the raw records (the `RmCall`s
// named in the comments), not from what the code prints.

/// The events of an h100_late_mps recording, and the trackers after it.
fn late_events(name: &str) -> (Vec<Event>, Sources) {
    let mut sources = Sources::new();
    let evs = records(&format!("h100_late_mps/{name}"))
        .iter()
        .flat_map(|r| sources.events_of(r))
        .collect();
    (evs, sources)
}

/// late_attach: PID 441 (python3, started 5 s before the tracer) issued one traced call, on fd
/// 8: `RM_FREE client=0xc1d0001c parent=0x5c000002 object=0x5c000094`, status 0. Client
/// 0xc1d0001c was never allocated in the recording: the process made it before tracing. Its
/// exit came from thread 466 (cuda-EvtHandlr) at 39576703496 ns. PIDs 478 and 480 (the capture
/// script's nvidia-smi) allocate and free a client and a device: no TSG, no event.
#[test]
fn late_attach_exit_ends_the_pretrace_tsgs_with_an_unknown_count() {
    let (evs, sources) = late_events("late_attach.gtrace");
    assert_eq!(evs.len(), 1, "{evs:#?}");
    let e = &evs[0];
    assert_eq!(e.origin.pid, 441);
    assert_eq!(e.origin.tid, 466);
    assert_eq!(e.origin.ts_ns, 39_576_703_496);
    assert_eq!(
        e.kind,
        EventKind::PretraceEnd {
            client: None,
            fd: None,
            cause: DestroyCause::ProcessExit,
            tsgs: None,
        }
    );
    // The free of an object never seen created is counted, not dropped silently (441's, and
    // each nvidia-smi's free of its 0xa5590010).
    assert_eq!(sources.nvidia().counters().untracked_frees, 3);
    // Of those, 441's is a call of a pre-trace client that gave no event: named.
    assert_eq!(sources.nvidia().counters().pretrace_calls, 1);
}

/// mps_late: the same job (PID 558) under a running MPS server: one traced call (`RM_FREE
/// client=0xc1d00036 object=0x5c000081` on fd 8, client never allocated in the recording),
/// then its exit (thread 575, 63579943371 ns).
#[test]
fn mps_late_client_exit_is_reported() {
    let (evs, _) = late_events("mps_late.gtrace");
    assert_eq!(evs.len(), 1, "{evs:#?}");
    assert_eq!(evs[0].origin.pid, 558);
    assert_eq!(evs[0].origin.ts_ns, 63_579_943_371);
    assert!(matches!(
        evs[0].kind,
        EventKind::PretraceEnd {
            cause: DestroyCause::ProcessExit,
            tsgs: None,
            ..
        }
    ));
}

/// mps: the server (PID 538, comm nvidia-cuda-mps) allocates TSG 0x5c000015 (engine type 1,
/// graphics) whose channel's token is 10 (runlist 0), and copy TSGs whose tokens put them on
/// runlists 1, 3 and 10. Each client (PIDs 500, 501) allocates, in its own RM client,
/// channels 0x5c00001d and 0x5c000023 under parent 0x5c00000f, a TSG handle it never
/// allocated (the server's TSG, duplicated into the client), gets tokens 14/15 (500) and
/// 22/25 (501), all runlist 0, and schedules both channels (`NVA06F GPFIFO_SCHEDULE`).
#[test]
fn mps_client_channels_are_in_a_shared_tsg_related_to_the_servers() {
    let (evs, _) = late_events("mps.gtrace");
    for (pid, tokens) in [(500u32, [14u32, 15]), (501, [22, 25])] {
        let submits: Vec<(TaskId, u32, Option<u32>)> = evs
            .iter()
            .filter(|e| e.origin.pid == pid)
            .filter_map(|e| match e.kind {
                EventKind::WorkSubmit {
                    task,
                    token,
                    runlist,
                    ..
                } if tokens.contains(&token) => Some((task, token, runlist)),
                _ => None,
            })
            .collect();
        assert_eq!(
            submits,
            vec![
                (TaskId::Shared(0x5c00_000f), tokens[0], Some(0)),
                (TaskId::Shared(0x5c00_000f), tokens[1], Some(0)),
            ]
        );
        let channel_schedules: Vec<(TaskId, Option<u32>)> = evs
            .iter()
            .filter(|e| e.origin.pid == pid)
            .filter_map(|e| match e.kind {
                EventKind::Schedule {
                    task,
                    channels,
                    via_channel: true,
                    ..
                } => Some((task, channels)),
                _ => None,
            })
            .collect();
        assert_eq!(
            channel_schedules,
            vec![(TaskId::Shared(0x5c00_000f), None); 2]
        );
        let links: Vec<&EventKind> = evs
            .iter()
            .filter(|e| e.origin.pid == pid && e.kind.name() == "MPS_SHARED")
            .map(|e| &e.kind)
            .collect();
        assert_eq!(
            links,
            vec![&EventKind::MpsShared {
                task: TaskId::Shared(0x5c00_000f),
                client: if pid == 500 { 0xc1d0_002c } else { 0xc1d0_002e },
                server_pid: 538,
                server_task: TaskId::RmHandle(0x5c00_0015),
                runlist: 0,
            }]
        );
    }
    // Nothing predates this recording.
    assert!(!evs.iter().any(|e| e.kind.name() == "PRETRACE_END"));
    assert_eq!(
        evs.iter().filter(|e| e.kind.name() == "MPS_SHARED").count(),
        2
    );
}

/// The text line of the late job's end, as `replay` prints it.
#[test]
fn replay_prints_the_pretrace_end_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["replay", "--no-stats"])
        .arg(fixture("h100_late_mps/late_attach.gtrace"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    // Everything after the wall-clock time and the CPU (`[CPU15]`).
    let (_, rest) = lines[0].split_once(" [CPU15] ").expect(lines[0]);
    assert_eq!(
        rest,
        "PRETRACE_END PID=441    cuda-EvtHandlr   TSG=?    tsgs=? cause=process_exit (TSGs created before tracing started)"
    );
}

/// `--comm nvidia-cuda-mps-server` (22 characters) warns and matches what the kernel keeps,
/// `nvidia-cuda-mps`: the server (PID 538) allocated four TSGs in mps.gtrace (engine types 1,
/// 11, 12, 13: one graphics, three copy).
#[test]
fn long_comm_filter_matches_the_kernels_truncation() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["replay", "--no-stats", "--comm", "nvidia-cuda-mps-server"])
        .arg(fixture("h100_late_mps/mps.gtrace"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr
            .matches("warning: --comm \"nvidia-cuda-mps-server\"")
            .count(),
        1,
        "{stderr}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let inits: Vec<&str> = text.lines().filter(|l| l.contains("TASK_INIT")).collect();
    assert_eq!(inits.len(), 4, "{text}");
    assert!(inits.iter().all(|l| l.contains("PID=538 ")), "{text}");
}
