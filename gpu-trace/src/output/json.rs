//! JSON lines output: one object per event, then one `STATS` object.
//!
//! # Schema
//!
//! Every line is one JSON object. The field names and value spellings below are stable; new
//! fields may be added, existing ones are not renamed or removed. A value the tracer could not
//! know is `null` (what the text output prints as `?`).
//!
//! ## Common fields of every event
//!
//! | field    | type    | meaning |
//! |----------|---------|---------|
//! | `event`  | string  | `"TASK_INIT"`, `"SCHEDULE"`, `"WORK_SUBMIT"` or `"TASK_DESTROY"` (always the first field) |
//! | `time`   | string  | wall-clock time, RFC 3339 in UTC with microseconds: `"2024-05-01T21:00:24.561798Z"` |
//! | `ts_ns`  | integer | CLOCK_MONOTONIC nanoseconds of the driver call (`bpf_ktime_get_ns`) |
//! | `cpu`    | integer | CPU the call ran on |
//! | `pid`    | integer | process id (tgid) |
//! | `tid`    | integer | thread id |
//! | `comm`   | string  | thread name of the caller (bytes that are not UTF-8 shown as U+FFFD) |
//! | `comm_bytes` | array of integers | only when `comm` is not the exact name (it was not UTF-8): the name's bytes |
//! | `task`   | object  | `{"kind": K, "value": N}`: K is `"hw_tsg"` (hardware TSG id), `"rm_handle"` (RM object handle of the TSG) or `"kfd_queue"` (AMD KFD queue id); N an unsigned 32-bit integer. `{"kind": "kfd_no_queue"}` (no `value`): an AMD `CREATE_QUEUE` the driver refused |
//! | `client` | integer | RM client handle (NVIDIA), 0 otherwise |
//!
//! ## `TASK_INIT`: a TSG / queue was created
//!
//! | field               | type            | meaning |
//! |---------------------|-----------------|---------|
//! | `engine`            | string or null  | `"GRAPHICS"`, `"COPY"`, `"NVDEC"`, `"NVENC"`, `"NVJPEG"`, `"OFA"`, `"SEC2"`, `"OTHER"` |
//! | `engine_type`       | integer or null | raw `NV2080_ENGINE_TYPE_*` value of the allocation |
//! | `timeslice_us`      | integer or null | timeslice in microseconds |
//! | `timeslice_source`  | string          | `"observed"` (set by the process) or `"driver_default"` |
//! | `interleave`        | string or null  | `"LOW"`, `"MEDIUM"`, `"HIGH"` |
//! | `interleave_source` | string          | `"observed"` or `"driver_default"` |
//! | `runlist`           | integer or null | runlist id |
//! | `gpu`               | integer or null | GPU index (NVIDIA `deviceId`) |
//!
//! ## `SCHEDULE`: the task was put on the runlist (the admission point)
//!
//! | field          | type            | meaning |
//! |----------------|-----------------|---------|
//! | `channels`     | integer or null | channels of the TSG known at this moment |
//! | `timeslice_us` | integer or null | timeslice in microseconds |
//! | `interleave`   | string or null  | `"LOW"`, `"MEDIUM"`, `"HIGH"` |
//! | `allowed`      | boolean         | the driver accepted the request |
//! | `rm_status`    | integer or null | RM status returned (0 = `NV_OK`); null when the syscall itself failed |
//! | `errno`        | integer         | negative errno of the ioctl syscall, 0 on success (e.g. -1 for `EPERM`) |
//! | `via_channel`  | boolean         | the request was a channel-level schedule (`NVA06F`) |
//!
//! ## `WORK_SUBMIT`: a work-submit token was handed out / a doorbell assigned
//!
//! | field            | type            | meaning |
//! |------------------|-----------------|---------|
//! | `channel_handle` | integer         | RM handle of the channel |
//! | `chid`           | integer or null | hardware channel id |
//! | `runlist`        | integer or null | runlist id |
//! | `token`          | integer         | the work-submit token |
//! | `gpu`            | integer or null | GPU index |
//!
//! ## `TASK_DESTROY`: the task ended
//!
//! | field      | type    | meaning |
//! |------------|---------|---------|
//! | `cause`    | string  | `"free"` (freed itself), `"parent_free"` (an ancestor was freed), `"fd_close"` (its fd was closed), `"process_exit"` (its process exited), `"kfd_release"` (AMD: the driver tore the process's queues down, seen by a deep hook), `"tracer_exit"` (still alive when tracing stopped) |
//! | `implicit` | boolean | the driver object was not freed explicitly |
//!
//! ## `amd`: AMD KFD events only
//!
//! Events from `/dev/kfd` carry the fields above (NVIDIA-only ones `null`; `client` 0; `gpu` is
//! the KFD `gpu_id`; `WORK_SUBMIT`'s `token` is the doorbell's byte offset in the process's
//! doorbell pages) and, last, an `amd` object. NVIDIA events have no `amd` key.
//!
//! | field             | type            | meaning |
//! |-------------------|-----------------|---------|
//! | `via`             | string          | `SCHEDULE` only: `"create"`, `"update"` (`UPDATE_QUEUE`) or `"cu_mask"` (`SET_CU_MASK`) |
//! | `queue_type`      | string or null  | `"COMPUTE"`, `"COMPUTE_AQL"`, `"SDMA"`, `"SDMA_XGMI"`, `"SDMA_BY_ENG_ID"`, `"UNKNOWN"` |
//! | `queue_type_raw`  | integer or null | raw `KFD_IOC_QUEUE_TYPE_*` |
//! | `priority`        | integer or null | queue priority, 0–15 |
//! | `percentage`      | integer or null | queue percentage, 0–100 (0: inactive) |
//! | `pm4_target_xcc`  | integer or null | bits 15:8 of `queue_percentage` |
//! | `ring_size`       | integer or null | ring size in bytes |
//! | `active`          | boolean or null | ring address and percentage non-zero |
//! | `gpu_id`          | integer or null | KFD `gpu_id` |
//! | `doorbell_offset` | integer or null | mmap offset of the queue's doorbell returned by `CREATE_QUEUE` |
//! | `sdma_engine_id`  | integer or null | `sdma_engine_id` (96-byte `CREATE_QUEUE` only) |
//! | `cu_mask_bits`    | integer or null | bits of the CU mask set with `SET_CU_MASK` |
//! | `hw_doorbell`     | integer or null | `TASK_INIT`, deep hook on the DQM's `create_queue_*` only: the doorbell's absolute dword index in the doorbell BAR |
//! | `vmid`            | integer or null | `TASK_INIT`, deep hook on the DQM's `create_queue_*` only: the VMID the driver gave the queue (0 until the hardware scheduler maps the process) |
//! | `driver_active`   | boolean or null | `TASK_INIT`, deep hook on the DQM's `create_queue_*` only: the driver's own `is_active` |
//! | `mqd_init_addr`   | integer or null | `TASK_INIT`, deep hook on `init_mqd` only: address of the `init_mqd` copy (one per GPU generation) that built the queue's hardware descriptor |
//!
//! ## `STATS`: the last line
//!
//! | field                   | type            | meaning |
//! |-------------------------|-----------------|---------|
//! | `event`                 | string          | `"STATS"` |
//! | `duration_s`            | number          | seconds traced |
//! | `task_init`             | integer         | `TASK_INIT` events |
//! | `schedule`              | integer         | `SCHEDULE` events |
//! | `schedule_refused`      | integer         | of those, refused (`allowed` false) |
//! | `work_submit`           | integer         | `WORK_SUBMIT` events |
//! | `task_destroy`          | integer         | `TASK_DESTROY` events |
//! | `task_destroy_implicit` | integer         | of those, implicit |
//! | `kernel`                | object          | counters of the kernel programs: `dropped` (ring buffer full), `read_failed` (driver arguments unreadable), `ignored` (calls not of interest), `emitted` (records sent), `fd_lookup_failed` (fd not resolved), `denied` (schedules refused by `--deny-pid`); all integers |
//! | `malformed`             | integer         | records userspace could not parse |
//! | `decode_errors`         | integer         | driver calls whose arguments could not be decoded |
//! | `live_at_exit`          | integer         | tasks still alive when tracing stopped |
//! | `unreported`            | object          | driver calls of interest that produced no event, by reason (`schedule_disable`, `schedule_unreadable`, `unreadable_params`, `unknown_handle`, `replaced_handles`, `failed_tsg_allocs`, `unknown_queue`, `replaced_queues`, `deep_unmatched`, `deep_unknown`, `kfd_release_no_queues`); only non-zero reasons; integers |
//! | `lost_samples`          | integer or null | live runs: records the kernel sent (`emitted`) that were never read; null when none were lost |
//! | `output_lost`           | integer         | only when not 0: output lines dropped because the output's reader did not keep up (a stalled pipe, FIFO or disk) |
//! | `recording_lost`        | integer         | only when not 0: records of `--record` dropped because the recording's reader did not keep up |
//! | `processes`             | array           | one object per process, by ascending pid: `pid`, `comm` (first seen; `comm_bytes` as in events), `task_init`, `schedule`, `schedule_refused`, `work_submit`, `task_destroy` |

use chrono::SecondsFormat;
use serde::Serialize;

use crate::model::event::Event;
use crate::model::stats::{KernelCounters, Stats};
use crate::output::clock::Clock;

/// The JSON line of an event (no newline): `event`, `time`, the origin fields, then the fields
/// of the event's kind, as described in the [module documentation](self).
///
/// # Panics
///
/// Never: the event types always serialize.
pub fn event_json(ev: &Event, clock: &Clock) -> String {
    // Serializing these types cannot fail: no maps with non-string keys, no fallible impls.
    let origin = serde_json::to_string(&ev.origin).expect("Origin serializes");
    let kind = serde_json::to_string(&ev.kind).expect("EventKind serializes");
    let time = clock
        .utc(ev.origin.ts_ns)
        .to_rfc3339_opts(SecondsFormat::Micros, true);

    // `kind` is `{"event":"NAME"` followed by `}` or `,<fields>}` (the tag comes first);
    // `origin` is `{<fields>}`. Splice them so that `event` leads and `time` follows it.
    let tag = format!("{{\"event\":\"{}\"", ev.kind.name());
    let origin_fields = origin
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .filter(|s| !s.is_empty());
    match (kind.strip_prefix(tag.as_str()), origin_fields) {
        (Some(rest), Some(origin_fields)) => {
            let line = format!("{tag},\"time\":\"{time}\",{origin_fields}{rest}");
            match &ev.amd {
                None => line,
                Some(amd) => {
                    // AMD events: the `amd` object goes last, before the closing brace.
                    let amd = serde_json::to_string(amd).expect("AmdDetail serializes");
                    format!("{},\"amd\":{amd}}}", &line[..line.len() - 1])
                }
            }
        }
        _ => {
            // Not the expected shape: fall back to a map (keys then come sorted).
            let mut value = serde_json::to_value(ev).expect("Event serializes");
            if let Some(map) = value.as_object_mut() {
                map.insert("time".into(), time.into());
            }
            value.to_string()
        }
    }
}

#[derive(Serialize)]
struct StatsLine<'a> {
    event: &'static str,
    duration_s: f64,
    task_init: u64,
    schedule: u64,
    schedule_refused: u64,
    work_submit: u64,
    task_destroy: u64,
    task_destroy_implicit: u64,
    kernel: KernelCounters,
    malformed: u64,
    decode_errors: u64,
    live_at_exit: u64,
    unreported: std::collections::BTreeMap<&'static str, u64>,
    lost_samples: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    output_lost: u64,
    #[serde(skip_serializing_if = "is_zero")]
    recording_lost: u64,
    processes: Vec<ProcessLine<'a>>,
}

#[derive(Serialize)]
struct ProcessLine<'a> {
    pid: u32,
    comm: std::borrow::Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    comm_bytes: Option<std::borrow::Cow<'a, [u8]>>,
    task_init: u64,
    schedule: u64,
    schedule_refused: u64,
    work_submit: u64,
    task_destroy: u64,
}

/// The final `{"event":"STATS", ...}` line (no newline), as described in the
/// [module documentation](self).
///
/// # Panics
///
/// Never: the statistics always serialize.
pub fn stats_json(stats: &Stats) -> String {
    let k = &stats.kernel;
    let line = StatsLine {
        event: "STATS",
        duration_s: stats.duration().as_secs_f64(),
        task_init: stats.task_init,
        schedule: stats.schedule,
        schedule_refused: stats.schedule_refused,
        work_submit: stats.work_submit,
        task_destroy: stats.task_destroy,
        task_destroy_implicit: stats.task_destroy_implicit,
        kernel: *k,
        malformed: stats.malformed,
        decode_errors: stats.decode_errors,
        live_at_exit: stats.live_at_exit,
        unreported: stats
            .unreported
            .iter()
            .filter(|&(_, &v)| v != 0)
            .map(|(&k, &v)| (k, v))
            .collect(),
        lost_samples: stats.lost_samples,
        output_lost: stats.output_lost,
        recording_lost: stats.recording_lost,
        processes: stats
            .processes()
            .map(|(pid, p)| ProcessLine {
                pid,
                comm: super::escape::lossy(&p.comm),
                comm_bytes: (!super::escape::is_exact(&p.comm))
                    .then(|| super::escape::raw_bytes(&p.comm)),
                task_init: p.task_init,
                schedule: p.schedule,
                schedule_refused: p.schedule_refused,
                work_submit: p.work_submit,
                task_destroy: p.task_destroy,
            })
            .collect(),
    };
    serde_json::to_string(&line).expect("STATS serializes")
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The marker line after which docs/json-schema.md holds this module's documentation.
pub const SCHEMA_DOC_MARKER: &str = "<!-- generated from gpu-trace/src/output/json.rs -->";

/// docs/json-schema.md: this module's documentation (the schema above) as Markdown, under a
/// short header. `cargo xtask gen --docs` writes it; a test checks that the file is current.
pub fn schema_document() -> String {
    let mut out = String::from(
        "# JSON lines schema (`--format json`)\n\n\
         This file is generated from the documentation of `gpu-trace/src/output/json.rs` by\n\
         `cargo xtask gen --docs`; a test (`gpu-trace/tests/outputs.rs`) fails when the two differ.\n\n",
    );
    out.push_str(SCHEMA_DOC_MARKER);
    out.push('\n');
    for line in include_str!("json.rs")
        .lines()
        .take_while(|l| l.starts_with("//!"))
    {
        let text = line.strip_prefix("//!").unwrap_or_default();
        out.push_str(text.strip_prefix(' ').unwrap_or(text));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{
        DestroyCause, Engine, EventKind, Interleave, Origin, TaskId, ValueSource,
    };
    use crate::model::stats::KernelCounters;
    use serde_json::{Value, json};
    use std::time::Duration;

    const T0: u64 = 5_000_000_000_000;
    /// 2024-05-01T21:00:24.561798123Z
    const WALL0: i128 = 1_714_597_224_561_798_123;

    fn clock() -> Clock {
        Clock::new(WALL0 - i128::from(T0))
    }

    fn origin(ts_ns: u64) -> Origin {
        Origin {
            ts_ns,
            cpu: 1,
            pid: 637320,
            tid: 637321,
            comm: "py\"th\\on3".to_string(),
        }
    }

    fn parse(line: &str) -> Value {
        assert!(!line.contains('\n'), "one line: {line}");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    fn common(v: &Value, event: &str, ts_ns: u64) {
        assert_eq!(v["event"], event);
        assert_eq!(v["ts_ns"], ts_ns);
        assert_eq!(v["cpu"], 1);
        assert_eq!(v["pid"], 637320);
        assert_eq!(v["tid"], 637321);
        assert_eq!(v["comm"], "py\"th\\on3");
    }

    #[test]
    fn task_init_fields() {
        let ev = Event {
            amd: None,
            origin: origin(T0),
            kind: EventKind::TaskInit {
                task: TaskId::HwTsg(1),
                client: 0xc1d0_0001,
                engine: Some(Engine::Copy),
                engine_type: Some(13),
                timeslice_us: Some(1024),
                timeslice_source: ValueSource::DriverDefault,
                interleave: None,
                interleave_source: ValueSource::Observed,
                runlist: Some(0),
                gpu: None,
            },
        };
        let line = event_json(&ev, &clock());
        assert!(
            line.starts_with(
                r#"{"event":"TASK_INIT","time":"2024-05-01T21:00:24.561798Z","ts_ns":5000000000000,"#
            ),
            "{line}"
        );
        let v = parse(&line);
        common(&v, "TASK_INIT", T0);
        assert_eq!(v["time"], "2024-05-01T21:00:24.561798Z");
        assert_eq!(v["task"], json!({"kind": "hw_tsg", "value": 1}));
        assert_eq!(v["client"], 0xc1d0_0001u32);
        assert_eq!(v["engine"], "COPY");
        assert_eq!(v["engine_type"], 13);
        assert_eq!(v["timeslice_us"], 1024);
        assert_eq!(v["timeslice_source"], "driver_default");
        assert_eq!(v["interleave"], Value::Null);
        assert_eq!(v["interleave_source"], "observed");
        assert_eq!(v["runlist"], 0);
        assert_eq!(v["gpu"], Value::Null);
        let mut k = keys(&v);
        k.sort_unstable();
        assert_eq!(
            k,
            [
                "client",
                "comm",
                "cpu",
                "engine",
                "engine_type",
                "event",
                "gpu",
                "interleave",
                "interleave_source",
                "pid",
                "runlist",
                "task",
                "tid",
                "time",
                "timeslice_source",
                "timeslice_us",
                "ts_ns",
            ]
        );
    }

    #[test]
    fn schedule_fields() {
        let ev = Event {
            amd: None,
            origin: origin(T0 + 29_827_000),
            kind: EventKind::Schedule {
                task: TaskId::RmHandle(0x5c00_0002),
                client: 7,
                channels: Some(8),
                timeslice_us: None,
                interleave: Some(Interleave::Low),
                allowed: false,
                rm_status: None,
                errno: -1,
                via_channel: true,
            },
        };
        let v = parse(&event_json(&ev, &clock()));
        common(&v, "SCHEDULE", T0 + 29_827_000);
        assert_eq!(v["time"], "2024-05-01T21:00:24.591625Z");
        assert_eq!(
            v["task"],
            json!({"kind": "rm_handle", "value": 0x5c00_0002u32})
        );
        assert_eq!(v["channels"], 8);
        assert_eq!(v["timeslice_us"], Value::Null);
        assert_eq!(v["interleave"], "LOW");
        assert_eq!(v["allowed"], false);
        assert_eq!(v["rm_status"], Value::Null);
        assert_eq!(v["errno"], -1);
        assert_eq!(v["via_channel"], true);
        assert_eq!(keys(&v).len(), 16);
    }

    #[test]
    fn work_submit_and_destroy_fields() {
        let submit = Event {
            amd: None,
            origin: origin(T0),
            kind: EventKind::WorkSubmit {
                task: TaskId::KfdQueue(3),
                client: 0,
                channel_handle: 0x5c00_0010,
                chid: Some(2),
                runlist: None,
                token: 1_073_741_826,
                gpu: Some(0),
            },
        };
        let v = parse(&event_json(&submit, &clock()));
        common(&v, "WORK_SUBMIT", T0);
        assert_eq!(v["task"], json!({"kind": "kfd_queue", "value": 3}));
        assert_eq!(v["channel_handle"], 0x5c00_0010u32);
        assert_eq!(v["chid"], 2);
        assert_eq!(v["runlist"], Value::Null);
        assert_eq!(v["token"], 1_073_741_826u32);
        assert_eq!(v["gpu"], 0);

        for (cause, name) in [
            (DestroyCause::Free, "free"),
            (DestroyCause::ParentFree, "parent_free"),
            (DestroyCause::FdClose, "fd_close"),
            (DestroyCause::ProcessExit, "process_exit"),
            (DestroyCause::KfdRelease, "kfd_release"),
            (DestroyCause::TracerExit, "tracer_exit"),
        ] {
            let ev = Event {
                amd: None,
                origin: origin(T0),
                kind: EventKind::TaskDestroy {
                    task: TaskId::HwTsg(1),
                    client: 1,
                    cause,
                    implicit: cause.is_implicit(),
                },
            };
            let line = event_json(&ev, &clock());
            assert!(
                line.starts_with(r#"{"event":"TASK_DESTROY","time":"#),
                "{line}"
            );
            let v = parse(&line);
            common(&v, "TASK_DESTROY", T0);
            assert_eq!(v["cause"], name);
            assert_eq!(v["implicit"], cause.is_implicit());
            assert_eq!(keys(&v).len(), 11);
        }
    }

    #[test]
    fn stats_line() {
        let mut stats = Stats::new();
        stats.record(&Event {
            amd: None,
            origin: origin(T0),
            kind: EventKind::Schedule {
                task: TaskId::HwTsg(1),
                client: 1,
                channels: None,
                timeslice_us: None,
                interleave: None,
                allowed: false,
                rm_status: Some(0x1f),
                errno: 0,
                via_channel: false,
            },
        });
        stats.kernel = KernelCounters {
            dropped: 1,
            read_failed: 2,
            ignored: 3,
            emitted: 4,
            fd_lookup_failed: 5,
            denied: 0,
        };
        stats.malformed = 6;
        stats.decode_errors = 7;
        stats.live_at_exit = 8;
        stats.elapsed = Some(Duration::from_millis(12_300));
        let line = stats_json(&stats);
        assert!(line.starts_with(r#"{"event":"STATS","#), "{line}");
        let v = parse(&line);
        assert_eq!(
            v,
            json!({
                "event": "STATS",
                "duration_s": 12.3,
                "task_init": 0,
                "schedule": 1,
                "schedule_refused": 1,
                "work_submit": 0,
                "task_destroy": 0,
                "task_destroy_implicit": 0,
                "kernel": {
                    "dropped": 1,
                    "read_failed": 2,
                    "ignored": 3,
                    "emitted": 4,
                    "fd_lookup_failed": 5,
                    "denied": 0
                },
                "malformed": 6,
                "decode_errors": 7,
                "live_at_exit": 8,
                "unreported": {},
                "lost_samples": null,
                "processes": [{
                    "pid": 637320,
                    "comm": "py\"th\\on3",
                    "task_init": 0,
                    "schedule": 1,
                    "schedule_refused": 1,
                    "work_submit": 0,
                    "task_destroy": 0
                }]
            })
        );
        stats.lost_samples = Some(9);
        assert_eq!(parse(&stats_json(&stats))["lost_samples"], 9);
    }
}
