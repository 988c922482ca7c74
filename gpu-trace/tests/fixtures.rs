//! Decoder and model tests on real bytes captured on the GPU host (see fixtures/README.md).
//!
//! The expectations are what the workloads are known to make the driver do (PyTorch two-stream
//! matmul: shared/docs/platforms.md), not what this code happened to print.

use std::{collections::BTreeMap, fs::File, io::BufReader, path::PathBuf, process::Command};

use gpu_trace::{
    model::{
        event::{DestroyCause, Engine, Event, EventKind, Interleave, TaskId, ValueSource},
        nvidia::NvTracker,
    },
    nvidia::decode::{self, ControlParams, RmCall, split_token},
    record::RecordReader,
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
    let mut tracker = NvTracker::new();
    recs.iter().flat_map(|r| tracker.observe_raw(r)).collect()
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
    // Allocs arrive as NVOS64 (0xc030462b) with paramsSize 0, as platforms.md says.
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

#[test]
fn replay_prints_exactly_what_the_live_run_printed() {
    for name in ["two_streams", "ctx_churn"] {
        let live = std::fs::read_to_string(fixture(&format!("{name}.live.txt"))).unwrap();
        let path = fixture(&format!("{name}.gtrace"));
        let replayed = replay(&[path.to_str().unwrap(), "-v"]);
        assert_eq!(replayed, live, "{name}");
    }
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
    assert_eq!(lines.len(), 4 + 4 + 20 + 4 + 1);
    assert_eq!(lines.last().unwrap()["event"], "STATS");
    assert_eq!(lines.last().unwrap()["kernel"]["dropped"], 0);
}

// ---------------------------------------------------------------------------------------------
// Late attach and MPS (tests/fixtures/h100_r3, README.md there): recordings made by the build
// before this feature. Expected events derived by hand from the raw records (the `RmCall`s
// named in the comments), not from what the code prints.

/// The events of an h100_r3 recording, and the tracker after it.
fn late_events(name: &str) -> (Vec<Event>, NvTracker) {
    let mut tracker = NvTracker::new();
    let evs = records(&format!("h100_r3/{name}"))
        .iter()
        .flat_map(|r| tracker.observe_raw(r))
        .collect();
    (evs, tracker)
}

/// late_attach: PID 441 (python3, started 5 s before the tracer) issued one traced call, on fd
/// 8: `RM_FREE client=0xc1d0001c parent=0x5c000002 object=0x5c000094`, status 0. Client
/// 0xc1d0001c was never allocated in the recording: the process made it before tracing. Its
/// exit came from thread 466 (cuda-EvtHandlr) at 39576703496 ns. PIDs 478 and 480 (the capture
/// script's nvidia-smi) allocate and free a client and a device: no TSG, no event.
#[test]
fn late_attach_exit_ends_the_pretrace_tsgs_with_an_unknown_count() {
    let (evs, tracker) = late_events("late_attach.gtrace");
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
    assert_eq!(tracker.counters().untracked_frees, 3);
    // Of those, 441's is a call of a pre-trace client that gave no event: named.
    assert_eq!(tracker.counters().pretrace_calls, 1);
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
        .arg(fixture("h100_r3/late_attach.gtrace"))
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
        .arg(fixture("h100_r3/mps.gtrace"))
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
