//! The users' side of the output, on the real GPU-host recordings (tests/fixtures):
//! - `--perfetto`: the timeline is checked the way Perfetto's JSON importer reads it (see
//!   [`import_like_perfetto`]) and against the events the JSON lines output reports;
//! - `-o FILE` writes exactly what standard output would, for every format, in replay as in live
//!   runs (same `OutputArgs`);
//! - docs/json-schema.md is the schema of json.rs and names every field the output carries.
//!
//! Perfetto's own trace processor could not be run here: the PyPI `perfetto` package downloads
//! its `trace_processor_shell` binary at run time, which this machine cannot reach, and no
//! package ships it (see docs/cli.md). The structural check below follows the importer's source
//! (json_trace_tokenizer.cc, json_trace_parser_impl.cc) rule by rule instead.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

mod common;
use common::skipped;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn gpu_trace(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(args)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpu-trace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A fresh path per call (tests run in parallel threads and may ask for the same name).
fn tmp(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    common::scratch().join(format!("{n}-{name}"))
}

/// A slice as the importer builds it.
#[derive(Debug)]
struct Slice {
    pid: u64,
    tid: u64,
    name: String,
    begin: f64,
    end: f64,
    args: Value,
    /// Instants and zero-length complete events nested in it: (name, ts, args).
    instants: Vec<(String, f64, Value)>,
    /// Flow fields of those (in the same order): (bind_id, flow_in, flow_out), for `X` events
    /// that carry them.
    flows: Vec<Option<(u64, bool, bool)>>,
}

/// Slices, process names by pid, thread names by tid.
type Imported = (Vec<Slice>, BTreeMap<u64, String>, BTreeMap<u64, String>);

/// What Perfetto's JSON importer would build from `text`, or the first rule it breaks:
/// - the file is one JSON object whose first key is `traceEvents` (older importers stop at the
///   first key they do not know; only `traceEvents`, `otherData`, `displayTimeUnit`,
///   `systemTraceEvents` and `metadata` are known);
/// - every event is an object without arrays anywhere (the tokenizer's key extraction fails on
///   an array value), with a string `ph`, a numeric `ts` unless it is metadata, numeric `pid`
///   and `tid`;
/// - `M` events are `process_name` / `thread_name` with a string `args.name`;
/// - per thread track (pid, tid), sorted by `ts` (stable: the sorter keeps file order on ties),
///   `B`/`E` form a stack and an `E` names the slice it ends; thread-scoped instants (`s: "t"`)
///   land on the track, nested in the open slice; at the end no slice is left open;
/// - `X` events have a numeric `dur`; gpu-trace writes only zero-length ones, nested like
///   instants; their flow fields (v2: `bind_id`, `flow_in`, `flow_out`) are bound to them, and
///   across the trace in `ts` order a flow must begin (`flow_out` alone) before any event takes
///   it in (`flow_in`), else the importer counts `flow_end_without_start`/`flow_step_without_start`.
fn import_like_perfetto(text: &str) -> Result<Imported, String> {
    let first_key = text.trim_start().trim_start_matches('{').trim_start();
    if !first_key.starts_with("\"traceEvents\"") {
        return Err("traceEvents is not the first key".into());
    }
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let top = doc.as_object().ok_or("not an object")?;
    for key in top.keys() {
        if ![
            "traceEvents",
            "otherData",
            "displayTimeUnit",
            "systemTraceEvents",
            "metadata",
        ]
        .contains(&key.as_str())
        {
            return Err(format!("unknown top-level key {key}"));
        }
    }
    let events = top["traceEvents"]
        .as_array()
        .ok_or("traceEvents is not an array")?;
    fn has_array(v: &Value) -> bool {
        match v {
            Value::Array(_) => true,
            Value::Object(m) => m.values().any(has_array),
            _ => false,
        }
    }
    let mut processes = BTreeMap::new();
    let mut threads = BTreeMap::new();
    // (pid, tid) → (ts, position in the file, event)
    type Track<'a> = Vec<(f64, usize, &'a Value)>;
    let mut tracks: BTreeMap<(u64, u64), Track> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        if has_array(e) {
            return Err(format!("event {i} holds an array: {e}"));
        }
        let ph = e["ph"].as_str().ok_or(format!("event {i}: no ph"))?;
        let pid = e["pid"]
            .as_u64()
            .ok_or(format!("event {i}: no numeric pid"))?;
        let tid = e["tid"]
            .as_u64()
            .ok_or(format!("event {i}: no numeric tid"))?;
        if ph == "M" && e["name"] == "process_labels" {
            // Late attach: a process of the start-up inventory (Chrome's labels metadata).
            e["args"]["labels"]
                .as_str()
                .ok_or(format!("event {i}: process_labels without args.labels"))?;
            continue;
        }
        if ph == "M" {
            let name = e["args"]["name"]
                .as_str()
                .ok_or(format!("event {i}: metadata without args.name"))?;
            match e["name"].as_str() {
                Some("process_name") => processes.insert(pid, name.to_string()),
                Some("thread_name") => {
                    if threads.contains_key(&tid) {
                        return Err(format!(
                            "tid {tid} named twice (thread names are keyed by tid)"
                        ));
                    }
                    threads.insert(tid, name.to_string())
                }
                other => return Err(format!("event {i}: unknown metadata {other:?}")),
            };
            continue;
        }
        let ts = e["ts"]
            .as_f64()
            .ok_or(format!("event {i}: no numeric ts"))?;
        if ph == "C" {
            // A counter: a name and numeric series values (Chrome's counter events).
            e["name"]
                .as_str()
                .ok_or(format!("event {i}: counter without a name"))?;
            let args = e["args"]
                .as_object()
                .ok_or(format!("event {i}: counter without args"))?;
            if args.is_empty() || !args.values().all(Value::is_number) {
                return Err(format!("event {i}: counter values are not numbers"));
            }
            continue;
        }
        if ph == "X" && !e["dur"].is_number() {
            return Err(format!("event {i}: X without a numeric dur"));
        }
        if !["B", "E", "i", "X"].contains(&ph) {
            return Err(format!("event {i}: unexpected phase {ph}"));
        }
        tracks.entry((pid, tid)).or_default().push((ts, i, e));
    }
    let mut slices = Vec::new();
    // (ts, position in the file, bind_id, flow_in)
    let mut flow_events: Vec<(f64, usize, u64, bool)> = Vec::new();
    for ((pid, tid), mut evs) in tracks {
        evs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut stack: Vec<Slice> = Vec::new();
        for (ts, i, e) in evs {
            let name = e["name"].as_str().unwrap_or("[No name]").to_string();
            match e["ph"].as_str().unwrap() {
                "B" => stack.push(Slice {
                    pid,
                    tid,
                    name,
                    begin: ts,
                    end: f64::NAN,
                    args: e["args"].clone(),
                    instants: vec![],
                    flows: vec![],
                }),
                "E" => {
                    let mut s = stack
                        .pop()
                        .ok_or(format!("event {i}: E without an open slice on {pid}/{tid}"))?;
                    if s.name != name {
                        return Err(format!("event {i}: E for {name} ends {}", s.name));
                    }
                    s.end = ts;
                    for (k, v) in e["args"].as_object().into_iter().flatten() {
                        s.args[k] = v.clone(); // the importer merges E args into the slice
                    }
                    slices.push(s);
                }
                "i" => {
                    if e["s"] != "t" {
                        return Err(format!(
                            "event {i}: instant not thread-scoped on a task track"
                        ));
                    }
                    let open = stack
                        .last_mut()
                        .ok_or(format!("event {i}: instant {name} outside any slice"))?;
                    open.instants.push((name, ts, e["args"].clone()));
                    open.flows.push(None);
                }
                "X" => {
                    if e["dur"].as_f64() != Some(0.0) {
                        return Err(format!("event {i}: X of non-zero length"));
                    }
                    let open = stack
                        .last_mut()
                        .ok_or(format!("event {i}: point {name} outside any slice"))?;
                    open.instants.push((name, ts, e["args"].clone()));
                    let flow = e["bind_id"]
                        .as_u64()
                        .map(|id| (id, e["flow_in"] == true, e["flow_out"] == true));
                    if let Some((id, _, _)) = flow {
                        flow_events.push((ts, i, id, e["flow_in"] == true));
                    }
                    open.flows.push(flow);
                }
                _ => unreachable!(),
            }
        }
        if let Some(s) = stack.pop() {
            return Err(format!("slice {} on {pid}/{tid} never ends", s.name));
        }
    }
    flow_events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut begun = BTreeSet::new();
    for (_, i, id, flow_in) in flow_events {
        if flow_in && !begun.contains(&id) {
            return Err(format!(
                "event {i}: flow_in of flow {id} before any flow_out"
            ));
        }
        begun.insert(id);
    }
    Ok((slices, processes, threads))
}

/// The counter tracks of a timeline: name → (ts, value) in file order.
fn counters(text: &str) -> BTreeMap<String, Vec<(f64, u64)>> {
    let doc: Value = serde_json::from_str(text).unwrap();
    let mut out: BTreeMap<String, Vec<(f64, u64)>> = BTreeMap::new();
    for e in doc["traceEvents"].as_array().unwrap() {
        if e["ph"] == "C" {
            out.entry(e["name"].as_str().unwrap().to_string())
                .or_default()
                .push((
                    e["ts"].as_f64().unwrap(),
                    e["args"]
                        .as_object()
                        .unwrap()
                        .values()
                        .next()
                        .unwrap()
                        .as_u64()
                        .unwrap(),
                ));
        }
    }
    out
}

/// The slices in GPU track groups, and those of the traced processes.
fn process_slices(all: &[Slice]) -> (Vec<&Slice>, Vec<&Slice>) {
    all.iter()
        .partition(|s| s.pid >= u64::from(gpu_trace::output::perfetto::GPU_GROUP_PID_BASE))
}

fn json_lines(gtrace: &Path) -> Vec<Value> {
    gpu_trace(&["replay", gtrace.to_str().unwrap(), "-v", "--format", "json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn perfetto_of(gtrace: &str, extra: &[&str]) -> String {
    let out = tmp(&format!(
        "{}.{}.json",
        gtrace.replace('/', "_"),
        extra.join("_")
    ));
    let path = fixture(gtrace);
    let mut args = vec![
        "replay",
        path.to_str().unwrap(),
        "--perfetto",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    gpu_trace(&args);
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn perfetto_timeline_of_two_streams_imports_and_matches_the_events() {
    let text = perfetto_of("two_streams.gtrace", &[]);
    let (all_slices, mut processes, threads) = import_like_perfetto(&text).unwrap();
    let lines = json_lines(&fixture("two_streams.gtrace"));
    let events: Vec<&Value> = lines.iter().filter(|l| l["event"] != "STATS").collect();
    use gpu_trace::output::perfetto::{GPU_GROUP_PID_BASE, GPU_PID};

    // A track group per process, named after it, one for the GPUs' counters and one per GPU.
    assert_eq!(
        processes.remove(&u64::from(GPU_PID)),
        Some("GPUs".to_string())
    );
    assert_eq!(
        processes.remove(&u64::from(GPU_GROUP_PID_BASE)),
        Some("GPU ? (RM device 0)".to_string()),
        "the fixture's TSGs are all on RM device 0 (its README); the recording does not list \
         the host's GPUs, so nvidia-smi's index is not known"
    );
    let pids: BTreeSet<u64> = events.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(processes.keys().copied().collect::<BTreeSet<_>>(), pids);
    assert_eq!(processes.values().collect::<Vec<_>>(), ["python3"]);
    let (on_gpu, slices) = process_slices(&all_slices);
    assert_eq!(slices.len(), 4);
    // Tracks are slots, reused: as many as TSGs were alive at once (the fixture's README: the
    // 4 TSGs of the PyTorch process live together until it exits), in the process's group and
    // in the GPU's.
    assert_eq!(threads.len(), 8, "{threads:?}");
    for s in all_slices.iter() {
        assert!(
            threads[&s.tid].starts_with("TSG slot "),
            "{}",
            threads[&s.tid]
        );
    }
    // The GPU's group shows each lifetime again, named by its owner, at the same times.
    assert_eq!(on_gpu.len(), 4);
    for s in &slices {
        let name = format!("python3 {}: {}", s.pid, s.name);
        let g = on_gpu.iter().find(|g| g.name == name).unwrap();
        assert_eq!((g.begin, g.end), (s.begin, s.end), "{name}");
    }
    // RM device 0's live-task counter climbs to 4 and returns to 0 with the TSGs' ends.
    let c = counters(&text);
    let live = &c["live tasks GPU ? (RM device 0)"];
    assert_eq!(live.iter().map(|&(_, n)| n).max(), Some(4));
    assert_eq!(live.last().map(|&(_, n)| n), Some(0));

    let mut flow_ids = Vec::new();
    // One slice per TASK_INIT → TASK_DESTROY, with both events' fields, at their timestamps.
    let inits: Vec<&&Value> = events
        .iter()
        .filter(|e| e["event"] == "TASK_INIT")
        .collect();
    assert_eq!(inits.len(), slices.len());
    for init in &inits {
        let handle = init["task"]["value"].as_u64().unwrap();
        let s = slices
            .iter()
            .find(|s| s.name == format!("TSG 0x{handle:08x} {}", init["engine"].as_str().unwrap()))
            .unwrap();
        let destroy = events
            .iter()
            .find(|e| e["event"] == "TASK_DESTROY" && e["task"] == init["task"])
            .unwrap();
        assert_eq!(s.pid, init["pid"].as_u64().unwrap());
        assert_eq!(
            (s.begin * 1000.0).round() as u64,
            init["ts_ns"].as_u64().unwrap()
        );
        assert_eq!(
            (s.end * 1000.0).round() as u64,
            destroy["ts_ns"].as_u64().unwrap()
        );
        assert!(s.end > s.begin);
        assert_eq!(s.args["task_init"]["engine"], init["engine"]);
        assert_eq!(s.args["task_init"]["timeslice_us"], 1024);
        assert_eq!(s.args["task_destroy"]["cause"], "process_exit");
        assert_eq!(s.args["task_destroy"]["comm"], "cuda-EvtHandlr");
        // Its TASK_INIT, SCHEDULE, SCHED_UPDATE and WORK_SUBMIT events are points inside it,
        // with their fields, chained in time order by one flow: the first begins it, each
        // next one takes it in and passes it on.
        let mine: Vec<&&Value> = events
            .iter()
            .filter(|e| {
                matches!(
                    e["event"].as_str(),
                    Some("TASK_INIT" | "SCHEDULE" | "SCHED_UPDATE" | "WORK_SUBMIT")
                ) && e["task"] == init["task"]
            })
            .collect();
        assert_eq!(s.instants.len(), mine.len());
        assert_eq!(s.instants[0].0, "TASK_INIT");
        let ids: BTreeSet<u64> = s.flows.iter().map(|f| f.unwrap().0).collect();
        assert_eq!(ids.len(), 1, "one flow per lifetime");
        flow_ids.push(*ids.first().unwrap());
        assert_eq!(s.flows[0].map(|f| (f.1, f.2)), Some((false, true)));
        assert!(
            s.flows[1..]
                .iter()
                .all(|f| f.map(|f| (f.1, f.2)) == Some((true, true)))
        );
        for (name, ts, args) in &s.instants {
            assert!(*ts >= s.begin && *ts <= s.end);
            let e = mine
                .iter()
                .find(|e| e["ts_ns"] == args["ts_ns"] && e["event"] == name.as_str())
                .unwrap();
            for (k, v) in e.as_object().unwrap() {
                if !["event", "pid"].contains(&k.as_str()) {
                    assert_eq!(&args[k], v, "{name} arg {k}");
                }
            }
        }
    }
    let instants: usize = slices.iter().map(|s| s.instants.len()).sum();
    assert_eq!(
        instants,
        4 + 4 + 1 + 20,
        "4 TASK_INIT, 4 SCHEDULE, the SET_TIMESLICE's SCHED_UPDATE and 20 WORK_SUBMIT"
    );
    flow_ids.sort();
    flow_ids.dedup();
    assert_eq!(flow_ids.len(), 4, "each lifetime its own flow");
    // schedules/s of RM device 0: at every point, the SCHEDULEs of the JSON output in the second up to
    // it, (ts − 1 s, ts] (the last point of a timestamp is the value); it steps at each
    // SCHEDULE (the first point is the first SCHEDULE, never earlier) and a second after each,
    // ending at 0.
    let rate = &c["schedules/s GPU ? (RM device 0)"];
    let ns = |ts: f64| (ts * 1000.0).round() as u64;
    let scheds: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "SCHEDULE")
        .map(|e| e["ts_ns"].as_u64().unwrap())
        .collect();
    assert_eq!(scheds.len(), 4);
    assert_eq!(ns(rate[0].0), *scheds.iter().min().unwrap(), "{rate:?}");
    for (i, &(ts, n)) in rate.iter().enumerate() {
        if rate.get(i + 1).is_some_and(|next| next.0 == ts) {
            continue;
        }
        let t = ns(ts);
        let want = scheds
            .iter()
            .filter(|&&s| s <= t && s + 1_000_000_000 > t)
            .count() as u64;
        assert_eq!(n, want, "at {ts} µs: {rate:?}");
    }
    assert_eq!(rate.len(), 2 * 4, "a step up and a step down per SCHEDULE");
    assert_eq!(
        c["schedules/s GPU ? (RM device 0)"].last().map(|&(_, n)| n),
        Some(0)
    );
}

#[test]
fn a_live_gpu_host_run_s_timeline_and_lines_are_what_its_recording_replays_to() {
    // One live run on the H100 (fixtures/README.md): JSON lines, timeline and recording at once.
    let live_pf: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("h100_live/two_streams_live.perfetto.json")).unwrap(),
    )
    .unwrap();
    let text = perfetto_of("h100_live/two_streams_live.gtrace", &[]);
    let replayed: Value = serde_json::from_str(&text).unwrap();
    // The live file was written before two changes of issue 30 (item 7): slices named with
    // their engine (`TSG 0x5c000015 GRAPHICS`, was `TSG 0x5c000015`) and the schedules/s
    // counter stepped at each SCHEDULE (was binned per second), and before issue 41 put RM's
    // device instance in the args as `rm_device` beside `gpu` (then that instance, now
    // nvidia-smi's index: both 0 on this one-GPU host). Apart from those, event for event.
    let before_issue_30 = |v: &Value| -> Vec<Value> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                !e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("schedules/s "))
            })
            .map(|e| {
                let mut e = e.clone();
                if let Some(args) = e["args"].as_object_mut() {
                    args.remove("rm_device");
                    for inner in args.values_mut() {
                        if let Some(o) = inner.as_object_mut() {
                            o.remove("rm_device");
                        }
                    }
                }
                if let Some(n) = e["name"].as_str() {
                    for engine in [" GRAPHICS", " COPY"] {
                        if let Some(old) = n.strip_suffix(engine) {
                            e["name"] = Value::from(old);
                            break;
                        }
                    }
                }
                e
            })
            .collect()
    };
    assert_eq!(
        before_issue_30(&replayed["traceEvents"]),
        before_issue_30(&live_pf["traceEvents"]),
        "event for event"
    );
    let (all, processes, _) = import_like_perfetto(&text).unwrap();
    let (on_gpu, slices) = process_slices(&all);
    // The live JSON lines: 4 TASK_INIT, each a lifetime in its process and in GPU 0's group,
    // its points chained by one flow that starts at the TASK_INIT.
    let live_lines: Vec<Value> =
        std::fs::read_to_string(fixture("h100_live/two_streams_live.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let inits = live_lines
        .iter()
        .filter(|l| l["event"] == "TASK_INIT")
        .count();
    assert_eq!((inits, slices.len(), on_gpu.len()), (4, 4, 4));
    assert!(processes.values().any(|n| n == "GPU 0"), "{processes:?}");
    for s in &slices {
        assert_eq!(s.instants[0].0, "TASK_INIT", "{}", s.name);
        assert_eq!(s.flows[0].map(|f| (f.1, f.2)), Some((false, true)));
        assert!(s.flows[1..].iter().all(|f| f.is_some_and(|f| f.1 && f.2)));
    }
    // And the JSON lines replay to what the live run printed, but for the `rm_device` that
    // issue 41 added after it (RM's device instance, the live run's `gpu`; `gpu` is now
    // nvidia-smi's index, the same 0 on this one-GPU host); byte for byte without it.
    let path = fixture("h100_live/two_streams_live.gtrace");
    let replayed_lines = gpu_trace(&["replay", path.to_str().unwrap(), "--format", "json", "-v"]);
    let live_text = std::fs::read_to_string(fixture("h100_live/two_streams_live.jsonl")).unwrap();
    assert_eq!(replayed_lines.lines().count(), live_text.lines().count());
    for (replayed, live) in replayed_lines.lines().zip(live_text.lines()) {
        let live_v: Value = serde_json::from_str(live).unwrap();
        let mut r: Value = serde_json::from_str(replayed).unwrap();
        if let Some(rm) = r.as_object_mut().unwrap().remove("rm_device") {
            assert_eq!(rm, live_v["gpu"], "{replayed}");
            let cut = format!(",\"rm_device\":{rm}");
            assert_eq!(replayed.replacen(&cut, "", 1), live);
        } else if live_v["event"] == "STATS" {
            // Its GPU numbers renamed: `gpu` was RM's instance (now `rm_device`) and `index`
            // nvidia-smi's (now `gpu`), in the per-GPU, per-runlist and per-task rows.
            assert_eq!(r, stats_renumbered(live_v), "{replayed}");
        } else {
            assert_eq!(replayed, live);
        }
    }
}

/// A `STATS` line written before issue 41 in its numbering: each row's `gpu` (RM's device
/// instance) as `rm_device`, nvidia-smi's index (the per-GPU rows' `index`) as `gpu`.
fn stats_renumbered(mut v: Value) -> Value {
    let mut index_of = std::collections::HashMap::new();
    for row in v["gpus"].as_array_mut().unwrap() {
        let o = row.as_object_mut().unwrap();
        let rm = o.remove("gpu").unwrap();
        let index = o.remove("index").unwrap_or(Value::Null);
        index_of.insert(rm.to_string(), index.clone());
        o.insert("gpu".into(), index);
        o.insert("rm_device".into(), rm);
    }
    for rows in ["runlists", "tasks"] {
        for row in v[rows].as_array_mut().unwrap() {
            let o = row.as_object_mut().unwrap();
            let rm = o.remove("gpu").unwrap();
            let index = index_of
                .get(&rm.to_string())
                .cloned()
                .unwrap_or(Value::Null);
            o.insert("gpu".into(), index);
            o.insert("rm_device".into(), rm);
        }
    }
    v
}

#[test]
fn perfetto_timeline_of_context_churn_has_twelve_freed_lifetimes() {
    let (all, _, threads) = import_like_perfetto(&perfetto_of("ctx_churn.gtrace", &[])).unwrap();
    let (on_gpu, slices) = process_slices(&all);
    assert_eq!(slices.len(), 12);
    assert_eq!(on_gpu.len(), 12, "each lifetime again in its GPU's group");
    // Three rounds of 4 TSGs one after another (the fixture's README): 4 tracks, each holding
    // one lifetime of every round, in the process's group and in the GPU's.
    assert_eq!(threads.len(), 8, "tracks reused across rounds: {threads:?}");
    for tid in threads.keys() {
        assert_eq!(all.iter().filter(|s| s.tid == *tid).count(), 3);
    }
    assert!(
        slices
            .iter()
            .all(|s| s.args["task_destroy"]["cause"] == "free")
    );
    // Rounds do not overlap: every lifetime ends before the next round's begin.
    let mut by_begin: Vec<&Slice> = slices.clone();
    by_begin.sort_by(|a, b| a.begin.total_cmp(&b.begin));
    for round in by_begin.chunks(4).collect::<Vec<_>>().windows(2) {
        let end = round[0].iter().map(|s| s.end).fold(f64::MIN, f64::max);
        let next = round[1].iter().map(|s| s.begin).fold(f64::MAX, f64::min);
        assert!(end <= next, "round ends at {end}, next begins at {next}");
    }
}

#[test]
fn perfetto_honours_the_filters() {
    let (slices, processes, _) = import_like_perfetto(&perfetto_of(
        "two_streams.gtrace",
        &["--comm", "nosuchprocess"],
    ))
    .unwrap();
    assert!(slices.is_empty() && processes.is_empty());
    let (all, ..) =
        import_like_perfetto(&perfetto_of("two_streams.gtrace", &["--comm", "python3"])).unwrap();
    let (_, slices) = process_slices(&all);
    assert_eq!(
        slices.len(),
        4,
        "the exiting thread is cuda-EvtHandlr, the process is python3"
    );
}

#[test]
fn the_importer_check_rejects_what_perfetto_would() {
    let ok = r#"{"traceEvents":[{"ph":"B","ts":1,"pid":1,"tid":2,"name":"a"},{"ph":"E","ts":2,"pid":1,"tid":2,"name":"a"}]}"#;
    assert_eq!(import_like_perfetto(ok).unwrap().0.len(), 1);
    for (bad, why) in [
        (
            r#"{"otherData":{},"traceEvents":[]}"#,
            "traceEvents is not the first key",
        ),
        (
            r#"{"traceEvents":[{"ph":"B","ts":1,"pid":1,"tid":2,"name":"a"}]}"#,
            "never ends",
        ),
        (
            r#"{"traceEvents":[{"ph":"i","s":"t","ts":1,"pid":1,"tid":2,"name":"a"}]}"#,
            "outside any slice",
        ),
        (
            r#"{"traceEvents":[{"ph":"B","ts":1,"pid":1,"tid":2,"name":"a","args":{"x":[1]}}]}"#,
            "holds an array",
        ),
        (
            r#"{"traceEvents":[{"ph":"B","ts":1,"pid":1,"tid":2,"name":"a"},{"ph":"E","ts":2,"pid":1,"tid":2,"name":"b"}]}"#,
            "ends a",
        ),
        (
            r#"{"traceEvents":[{"ph":"E","ts":2,"pid":1,"tid":2,"name":"a"},{"ph":"B","ts":1,"pid":1,"tid":3,"name":"a"}]}"#,
            "E without",
        ),
        (
            r#"{"traceEvents":[{"ph":"B","ts":1,"pid":1,"tid":2,"name":"a"},{"ph":"X","ts":1,"pid":1,"tid":2,"name":"p"},{"ph":"E","ts":2,"pid":1,"tid":2,"name":"a"}]}"#,
            "X without a numeric dur",
        ),
        (
            // The step comes first in time: Perfetto would find no flow to continue.
            r#"{"traceEvents":[{"ph":"B","ts":1,"pid":1,"tid":2,"name":"a"},{"ph":"X","ts":3,"dur":0,"pid":1,"tid":2,"name":"p","bind_id":7,"flow_out":true},{"ph":"X","ts":2,"dur":0,"pid":1,"tid":2,"name":"q","bind_id":7,"flow_in":true,"flow_out":true},{"ph":"E","ts":4,"pid":1,"tid":2,"name":"a"}]}"#,
            "before any flow_out",
        ),
    ] {
        let err = import_like_perfetto(bad).unwrap_err();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn dash_o_writes_what_stdout_would_for_every_format() {
    let path = fixture("two_streams.gtrace");
    let path = path.to_str().unwrap();
    for format in ["text", "json"] {
        for timestamps in ["wall", "relative"] {
            let args = [
                "replay",
                path,
                "-v",
                "--format",
                format,
                "--timestamps",
                timestamps,
            ];
            let stdout = gpu_trace(&args);
            let file = tmp(&format!("out.{format}.{timestamps}"));
            let mut with_o = args.to_vec();
            with_o.extend(["-o", file.to_str().unwrap()]);
            assert_eq!(gpu_trace(&with_o), "", "-o leaves standard output empty");
            assert_eq!(
                std::fs::read_to_string(&file).unwrap(),
                stdout,
                "{format} {timestamps}"
            );
        }
    }
    // --perfetto alongside -o: both files, the same timeline as without -o.
    let out = tmp("both.txt");
    let pf = tmp("both.json");
    gpu_trace(&[
        "replay",
        path,
        "-o",
        out.to_str().unwrap(),
        "--perfetto",
        pf.to_str().unwrap(),
    ]);
    assert!(std::fs::read_to_string(out).unwrap().contains("TASK_INIT"));
    assert_eq!(
        std::fs::read_to_string(pf).unwrap(),
        perfetto_of("two_streams.gtrace", &[])
    );
}

#[test]
fn relative_timestamps_start_at_zero() {
    let path = fixture("two_streams.gtrace");
    let text = gpu_trace(&["replay", path.to_str().unwrap(), "--timestamps", "relative"]);
    let first = text.lines().next().unwrap();
    assert!(first.trim_start().starts_with("0.000000 [CPU"), "{first}");
}

#[test]
fn every_field_the_json_output_carries_is_documented() {
    let doc = std::fs::read_to_string(repo_file("docs/json-schema.md")).unwrap();
    let mut keys: HashMap<String, String> = HashMap::new();
    fn collect(v: &Value, keys: &mut HashMap<String, String>, context: &str) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    keys.entry(k.clone()).or_insert_with(|| context.to_string());
                    collect(v, keys, context);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| collect(v, keys, context)),
            _ => {}
        }
    }
    for name in [
        "two_streams.gtrace",
        "ctx_churn.gtrace",
        "h100_late_mps/late_attach.gtrace",
        "h100_late_mps/mps.gtrace",
    ] {
        for line in json_lines(&fixture(name)) {
            collect(&line, &mut keys, line["event"].as_str().unwrap());
        }
    }
    for (key, context) in keys {
        // As a field (`key`) or inside a documented literal ({"key": …}).
        let documented = doc.contains(&format!("`{key}`")) || doc.contains(&format!("\"{key}\":"));
        assert!(
            documented,
            "field {key} (in {context}) is not in docs/json-schema.md"
        );
    }
}

#[test]
fn docs_architecture_md_maps_every_source_file() {
    // Its module map names each file (or a sibling's row names it: "`dir/a.rs`, `b.rs`").
    let doc = std::fs::read_to_string(repo_file("docs/architecture.md")).unwrap();
    let root = repo_file("");
    let out = Command::new("git")
        .args(["ls-files", "*.rs"])
        .current_dir(&root)
        .output()
        .unwrap();
    if !out.status.success() {
        common::skipped(
            "docs_architecture_md_maps_every_source_file",
            "not a git checkout (git ls-files failed)",
        );
        return;
    }
    let missing: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|f| {
            [
                "gpu-trace/src/",
                "gpu-trace-core/src/",
                "gpu-trace-common/src/",
                "gpu-trace-ebpf/src/",
                "xtask/src/",
            ]
            .iter()
            .any(|d| f.starts_with(d))
        })
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap();
            !doc.contains(&format!("`{f}`")) && !doc.contains(&format!(", `{name}`"))
        })
        .map(str::to_string)
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's module map lacks {missing:?}"
    );
}

#[test]
fn docs_cli_md_covers_every_option_and_subcommand() {
    use clap::CommandFactory as _;
    let doc = std::fs::read_to_string(repo_file("docs/cli.md")).unwrap();
    let cmd = gpu_trace::cli::Cli::command();
    let mut missing = Vec::new();
    for c in std::iter::once(&cmd).chain(cmd.get_subcommands()) {
        if c.get_name() != "gpu-trace" && !doc.contains(&format!("gpu-trace {}", c.get_name())) {
            missing.push(format!("subcommand {}", c.get_name()));
        }
        for long in c
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| !["help", "version"].contains(l))
        {
            if !doc.contains(&format!("`--{long}")) {
                missing.push(format!("--{long} ({})", c.get_name()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/cli.md does not document: {missing:?}"
    );
}

#[test]
fn a_live_run_writes_complete_output_and_timeline_files() {
    let test = "a_live_run_writes_complete_output_and_timeline_files";
    if let Err(e) = gpu_trace::probe::system::check_privileges() {
        skipped(test, format!("needs root (loads the kernel programs): {e}"));
        return;
    }
    // Whether this kernel can trace at all is decided here, by the library's own load, not by the
    // binary's exit status: a binary that exits 3 ("cannot trace here") where the library loads
    // is a bug this test must catch, not a reason to skip.
    match gpu_trace::loader::Tracer::load(&gpu_trace::loader::LoadOptions::default()) {
        Ok(t) => drop(t),
        Err(e @ gpu_trace::loader::LoadError::NoHook { .. }) => {
            skipped(test, format!("this kernel cannot trace: {e}"));
            return;
        }
        Err(e) => panic!("{test}: the library cannot load its programs as root: {e}"),
    }
    let out = tmp("live.jsonl");
    let pf = tmp("live.perfetto.json");
    let run = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args([
            "--watch-device",
            "/dev/null",
            "--duration",
            "1",
            "--format",
            "json",
            "-o",
        ])
        .arg(&out)
        .arg("--perfetto")
        .arg(&pf)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "the library loads its programs here, so the binary must trace ({}): {stderr}",
        run.status
    );
    assert!(
        run.stdout.is_empty(),
        "-o takes everything off standard output"
    );
    let lines = std::fs::read_to_string(&out).unwrap();
    let last: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "STATS");
    let text = std::fs::read_to_string(&pf).unwrap();
    import_like_perfetto(&text).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["otherData"]["dropped"], "0");
    assert!(
        doc["otherData"]["tool"]
            .as_str()
            .unwrap()
            .starts_with("gpu-trace ")
    );
}

/// A GPU-host recording as another node's: its header's host and realtime offset rewritten
/// (the offset moved by `shift_ns`), the records and trailer as they are. Returns the path and
/// the new offset.
fn as_node(gtrace: &str, host: &str, shift_ns: i128) -> (PathBuf, i128) {
    use gpu_trace_core::record::{Item, RecordReader, RecordWriter};
    let bytes = std::fs::read(fixture(gtrace)).unwrap();
    let mut r = RecordReader::new(&bytes[..]).unwrap();
    let mut header = r.header.clone();
    header.host = host.to_string();
    header.realtime_offset_ns += shift_ns;
    let mut w = RecordWriter::with_share(Vec::new(), &header).unwrap();
    while let Some(item) = r.next_item().unwrap() {
        match item {
            Item::Record(b) => w.record(&b).unwrap(),
            Item::Share(s) => assert!(w.share(&s).unwrap()),
        }
    }
    let path = tmp(&format!("{host}.gtrace"));
    std::fs::write(&path, w.finish(r.trailer.as_ref().unwrap()).unwrap()).unwrap();
    (path, header.realtime_offset_ns)
}

/// The lines of a text output before its statistics block, and the block.
fn events_and_block(text: &str) -> (Vec<&str>, &str) {
    let at = text.find("--- gpu-trace statistics").unwrap();
    (text[..at].lines().collect(), &text[at..])
}

/// `gpu-trace merge` of two nodes (the GPU-host recordings, their host and clock rewritten:
/// B's real times 0.4 s after A's), as text: each node's lines (their `host=` field taken off)
/// are exactly the lines `gpu-trace replay` prints for its recording alone, in the same order —
/// every event of both once — and its statistics block is replay's, titled with the node; the
/// event lines are in wall-clock order (the time each line prints, under TZ=UTC) and really
/// interleaved; the table at the end adds the nodes' events up.
#[test]
fn merge_of_two_nodes_is_each_node_s_replay_interleaved_by_real_time() {
    for gtrace in ["two_streams.gtrace", "ctx_churn.gtrace"] {
        let (a, _) = as_node(gtrace, "node-a", 0);
        let (b, _) = as_node(gtrace, "node-b", 400_000_123);
        let merged = gpu_trace(&["merge", a.to_str().unwrap(), b.to_str().unwrap(), "-v"]);
        let (mut merged_events, tail) = events_and_block(&merged);
        let mut totals = 0;
        for (host, path) in [("node-a", &a), ("node-b", &b)] {
            let alone = gpu_trace(&["replay", path.to_str().unwrap(), "-v"]);
            let (events, block) = events_and_block(&alone);
            let suffix = format!(" host={host}");
            let mine: Vec<&str> = merged_events
                .iter()
                .filter_map(|l| l.strip_suffix(&suffix))
                .collect();
            assert_eq!(mine, events, "{gtrace} {host}");
            let titled = block.replacen(
                "--- gpu-trace statistics (",
                &format!("--- gpu-trace statistics of {host} ("),
                1,
            );
            assert!(tail.contains(&titled), "{gtrace} {host}:\n{tail}");
            totals += events.len();
        }
        // Nothing else: every line is one of the two nodes'.
        assert_eq!(merged_events.len(), totals);
        merged_events.retain(|l| l.as_bytes().get(2) == Some(&b':'));
        assert_eq!(
            merged_events.len(),
            totals,
            "every event line starts with its time"
        );
        let times: Vec<&str> = merged_events.iter().map(|l| &l[..15]).collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "{gtrace}: {times:?}"
        );
        let switches = merged_events
            .windows(2)
            .filter(|w| w[0].ends_with("node-a") != w[1].ends_with("node-a"))
            .count();
        assert!(
            switches >= 2,
            "{gtrace}: the nodes' events did not interleave"
        );
        let all = tail
            .lines()
            .find(|l| l.starts_with("all "))
            .unwrap_or_else(|| panic!("no `all` row:\n{tail}"));
        assert_eq!(
            all.split_whitespace().nth(1),
            Some(totals.to_string().as_str()),
            "{all}"
        );
    }
}

/// As JSON: each node's `STATS` line is its replay's with a `host` key first, and
/// `MERGE_STATS` has each node's event count as its replay's lines show it.
#[test]
fn merge_json_has_each_node_s_replay_statistics() {
    let (a, _) = as_node("two_streams.gtrace", "node-a", 0);
    let (b, _) = as_node("ctx_churn.gtrace", "node-b", -3_000_000_000);
    let merged = gpu_trace(&[
        "merge",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "-v",
        "--format",
        "json",
    ]);
    let lines: Vec<Value> = merged
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        merged
            .lines()
            .all(|l| l.starts_with("{\"host\":\"node-")
                || l.starts_with("{\"event\":\"MERGE_STATS\""))
    );
    let table = lines.last().unwrap();
    assert_eq!(table["event"], "MERGE_STATS");
    let mut total = 0;
    for (i, (host, path)) in [("node-a", &a), ("node-b", &b)].into_iter().enumerate() {
        let alone = json_lines(path);
        let mut stats = lines
            .iter()
            .find(|l| l["event"] == "STATS" && l["host"] == host)
            .unwrap()
            .clone();
        stats.as_object_mut().unwrap().remove("host");
        assert_eq!(&stats, alone.last().unwrap(), "{host}");
        let events = alone.iter().filter(|l| l["ts_ns"].is_u64()).count() as u64;
        assert_eq!(table["nodes"][i]["host"], host);
        assert_eq!(table["nodes"][i]["events"], events, "{host}");
        total += events;
    }
    assert_eq!(table["all"]["events"], total);
}

/// The merged Perfetto timeline passes the importer's rules (as the single-recording ones
/// do: thread ids unique, slices nested, flows begun before taken in), keeps the nodes apart
/// (each node's processes, GPU groups and counters are groups of their own, named with the
/// node; no flow id is shared), and puts each lifetime at its real time less the file's base
/// (the smaller offset), derived from the replays' `ts_ns` and the headers' offsets.
#[test]
fn merged_perfetto_timeline_imports_and_keeps_the_nodes_apart() {
    let (a, off_a) = as_node("two_streams.gtrace", "node-a", 0);
    let (b, off_b) = as_node("two_streams.gtrace", "node-b", 400_000_123);
    let out = tmp("merged.json");
    gpu_trace(&[
        "merge",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--perfetto",
        out.to_str().unwrap(),
        "-o",
        "/dev/null",
    ]);
    let text = std::fs::read_to_string(&out).unwrap();
    let (slices, processes, _threads) = import_like_perfetto(&text).unwrap();
    let mut names: Vec<&str> = processes.values().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        [
            // two_streams lists no GPU: nvidia-smi's index is not known (RM's device is).
            "node-a: GPU ? (RM device 0)",
            "node-a: GPUs",
            "node-a: python3 pid 427",
            "node-b: GPU ? (RM device 0)",
            "node-b: GPUs",
            "node-b: python3 pid 427",
        ]
    );
    let doc: Value = serde_json::from_str(&text).unwrap();
    let base = off_a.min(off_b);
    assert_eq!(doc["otherData"]["realtime_base_ns"], base.to_string());
    let events = json_lines(&a);
    let inits: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "TASK_INIT")
        .collect();
    let mut flows: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for (host, offset) in [("node-a", off_a), ("node-b", off_b)] {
        let pid = processes
            .iter()
            .find(|(_, n)| *n == &format!("{host}: python3 pid 427"))
            .map(|(p, _)| *p)
            .unwrap();
        let mine: Vec<&Slice> = slices.iter().filter(|s| s.pid == pid).collect();
        assert_eq!(mine.len(), inits.len(), "{host}");
        for init in &inits {
            let handle = init["task"]["value"].as_u64().unwrap();
            let s = mine
                .iter()
                .find(|s| s.name.starts_with(&format!("TSG 0x{handle:08x}")))
                .unwrap();
            let real = i128::from(init["ts_ns"].as_u64().unwrap()) + offset - base;
            assert_eq!(
                (s.begin * 1000.0).round() as i128,
                real,
                "{host} {}",
                s.name
            );
            for f in s.flows.iter().flatten() {
                flows.entry(host).or_default().insert(f.0);
            }
        }
    }
    assert!(flows["node-a"].is_disjoint(&flows["node-b"]), "{flows:?}");
    assert_eq!(flows["node-a"].len(), inits.len());
}
