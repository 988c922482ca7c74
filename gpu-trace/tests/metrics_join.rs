//! Metrics that join the stack operators run (issue 30, item 5):
//!
//! 1. Every committed recording through the pipeline with `--metrics` on: no event series sits
//!    at zero, and the event series are exactly the label sets of the same run's JSON lines,
//!    each with their count (derived here from the JSON lines, without the metrics module).
//! 2. A recording of a PyTorch run put in a Kubernetes pod, with a kubelet-shaped
//!    `/var/log/pods` tree: the JSON lines name the pod, its namespace and container, and the
//!    series carry them with the GPU's UUID (dcgm-exporter's `UUID` label).
//! 3. A real Prometheus (Debian's /usr/bin/prometheus) scrapes those series from the real
//!    metrics server; otherwise `SKIPPED: why`.

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::BufReader,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use common::{
    pods::{CONTAINER_ID, POD_UID, in_cgroups, kubelet_tree, pod_cgroup},
    prometheus::{PROMETHEUS, free_port, query, start_prometheus, wait_for},
};
use gpu_trace::{
    cli::Format,
    metrics::{Metrics, MetricsConfig, encode},
    output::{TimestampMode, clock::Clock},
    pipeline::{Pipeline, PipelineConfig},
    probe::pods::PodDirectory,
    record::RecordReader,
    wire,
};
use prometheus_client::registry::Registry;

/// Every committed recording: the `.gtrace` files under tests/fixtures (and one level below).
fn recordings() -> Vec<String> {
    let root = fixture("");
    let mut out = Vec::new();
    for dir in std::iter::once(root.clone()).chain(
        fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir()),
    ) {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "gtrace") {
                out.push(p.strip_prefix(&root).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// The H100 recording's GPU (its inventory; `nvidia-smi -L` on that host).
const H100_UUID: &str = "GPU-68238f7a-fa6f-b6b8-6132-63c29858a94f";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A recording: its header's inventory and clock, and its records.
struct Recording {
    header: gpu_trace::record::RecordingHeader,
    records: Vec<Vec<u8>>,
}

fn load(name: &str) -> Recording {
    let file = fs::File::open(fixture(name)).unwrap();
    let mut reader = RecordReader::new(BufReader::new(file)).unwrap();
    let mut records = Vec::new();
    while let Some(b) = reader.next_record().unwrap() {
        records.push(b);
    }
    Recording {
        header: reader.header.clone(),
        records,
    }
}

/// The records with the first process put in a Kubernetes pod (containerd, systemd driver):
/// its kernel cgroup record and their resolution first, as a live run in that pod has them.
fn in_a_pod(rec: &Recording) -> Vec<Vec<u8>> {
    let path = pod_cgroup(POD_UID, CONTAINER_ID);
    in_cgroups(&rec.records, &[(pid_of(rec), &path)])
}

/// The process with the most records (the PyTorch process).
fn pid_of(rec: &Recording) -> u32 {
    let mut n: HashMap<u32, usize> = HashMap::new();
    for r in &rec.records {
        if let Some(h) = wire::header_of(r) {
            *n.entry(h.tgid).or_default() += 1;
        }
    }
    n.into_iter().max_by_key(|&(_, c)| c).unwrap().0
}

/// The JSON lines (with -v) and the metrics registry of `records`, with pods named from `pods`.
fn run(rec: &Recording, records: &[Vec<u8>], pods: Option<&Path>) -> (String, Arc<Registry>) {
    let pods = pods.map(PodDirectory::new);
    run_with(rec, records, pods, |_| {})
}

/// [`run`] with `resolver`, calling `between(i)` before record `i`.
fn run_with(
    rec: &Recording,
    records: &[Vec<u8>],
    resolver: Option<PodDirectory>,
    mut between: impl FnMut(usize),
) -> (String, Arc<Registry>) {
    let config = PipelineConfig {
        verbose: true,
        pids: Vec::new(),
        comms: Vec::new(),
        format: Format::Json,
        timestamps: TimestampMode::Wall,
        stats: true,
        clock: Clock::new(rec.header.realtime_offset_ns),
        show_container: false,
    };
    let metrics = Metrics::new(MetricsConfig::default());
    let registry = metrics.registry();
    let mut p = Pipeline::new(config, Vec::new()).with_output(Box::new(metrics));
    if let Some(r) = resolver {
        p = p.with_pod_names(Box::new(r));
    }
    if let Some(inv) = &rec.header.inventory {
        p.inventory(inv).unwrap();
    }
    for (i, r) in records.iter().enumerate() {
        between(i);
        p.feed(r).unwrap();
    }
    p.flush().unwrap();
    let f = p.finish_all(Default::default(), Duration::from_secs(1));
    (String::from_utf8(f.out).unwrap(), registry)
}

/// The labels and value of each `name{…} V` sample line.
fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let mut m = BTreeMap::new();
            for pair in labels.split("\",") {
                let (k, v) = pair.split_once("=\"")?;
                m.insert(k.to_string(), v.trim_end_matches('"').to_string());
            }
            Some((m, value.parse().ok()?))
        })
        .collect()
}

/// (event, gpu, engine, process name) → count, from the JSON lines alone: a task's events count
/// under the GPU and engine of its TASK_INIT when it was seen created, else under the GPU the
/// line names (`gpu_device.index`, else `?` for an RM device instance, else its own `gpu`) and
/// no engine; a process's name is the
/// first `comm` seen of it (the inventory's, else its first record's, `names`); a TASK_DESTROY
/// at the tracer's exit is not an event.
fn expected_series(
    jsonl: &str,
    names: HashMap<u64, String>,
) -> BTreeMap<(String, String, String, String), u64> {
    let lines: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut tasks: HashMap<String, (String, String)> = HashMap::new();
    let mut counts = BTreeMap::new();
    for l in &lines {
        let event = l["event"].as_str().unwrap();
        if ["INVENTORY", "STATS"].contains(&event) || l["cause"] == "tracer_exit" {
            continue;
        }
        let pid = l["pid"].as_u64().unwrap();
        let id = format!("{pid}/{}/{}", l["client"], l["task"]);
        // nvidia-smi's index where the line names the GPU; an RM device instance without it
        // is `?` (not an index), no number at all the empty label.
        let own = match l.get("gpu_device") {
            Some(d) => text(&d["index"]),
            None if l["rm_device"].is_u64() => "?".to_string(),
            None => text(&l["gpu"]),
        };
        let (gpu, engine) = match event {
            "TASK_INIT" => {
                let labels = (own, text(&l["engine"]));
                tasks.insert(id.clone(), labels.clone());
                labels
            }
            "PRETRACE_END" => (own, String::new()),
            _ => tasks.get(&id).cloned().unwrap_or((own, String::new())),
        };
        if event == "TASK_DESTROY" {
            tasks.remove(&id);
        }
        let key = (event.to_string(), gpu, engine, names[&pid].clone());
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

#[test]
fn no_event_series_sits_at_zero_and_each_is_a_label_set_of_the_json_lines() {
    let mut all = 0;
    let names = recordings();
    // The 13 of tests/fixtures/README.md at least.
    assert!(names.len() >= 13, "{names:?}");
    for name in &names {
        let rec = load(name);
        let (jsonl, metrics) = run(&rec, &rec.records, None);
        let text = encode(&metrics);
        let events = samples(&text, "gpu_trace_events_total");
        let zero: Vec<_> = events.iter().filter(|(_, v)| *v == 0.0).collect();
        assert!(zero.is_empty(), "{name}: series at zero: {zero:#?}");
        let got: BTreeMap<(String, String, String, String), u64> = events
            .iter()
            .map(|(l, v)| {
                let key = (
                    l["event"].clone(),
                    l["gpu"].clone(),
                    l["engine"].clone(),
                    l["comm"].clone(),
                );
                (key, *v as u64)
            })
            .collect();
        assert_eq!(got.len(), events.len(), "{name}: label sets repeated");
        // Each process's name in the recording's inventory, else its first record's thread
        // name (the raw header, not the pipeline's).
        let mut names = HashMap::new();
        for p in rec.header.inventory.iter().flat_map(|i| &i.processes) {
            names.insert(u64::from(p.pid), p.comm.clone());
        }
        for r in &rec.records {
            let Some(h) = wire::header_of(r) else {
                continue;
            };
            names
                .entry(u64::from(h.tgid))
                .or_insert_with(|| wire::comm_to_string(&h.comm));
        }
        let want = expected_series(&jsonl, names);
        assert_eq!(got, want, "{name}");
        all += got.len();
        // The other per-task series only once they have a value: refusals at the first one.
        for (l, v) in samples(&text, "gpu_trace_schedules_refused_total") {
            assert!(v > 0.0, "{name}: refusals at zero: {l:?}");
        }
    }
    assert!(all > names.len(), "{all}");
}

#[test]
fn pods_are_named_from_the_kubelet_log_tree_with_the_gpu_uuid() {
    let rec = load("h100_live/two_streams_live.gtrace");
    let records = in_a_pod(&rec);
    let pods = kubelet_tree(&common::scratch().join("named"));
    let (jsonl, metrics) = run(&rec, &records, Some(&pods));
    let pid = pid_of(&rec);
    let mine: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["pid"] == pid && e["event"] != "STATS")
        .collect();
    assert!(mine.len() > 10, "{jsonl}");
    for e in &mine {
        let cg = &e["cgroup"];
        assert_eq!(cg["pod_uid"], POD_UID, "{e}");
        assert_eq!(cg["pod_name"], "trainer-0", "{e}");
        assert_eq!(cg["namespace"], "ml-team", "{e}");
        assert_eq!(cg["container_name"], "cuda", "{e}");
    }
    let text = encode(&metrics);
    let events = samples(&text, "gpu_trace_events_total");
    assert!(!events.is_empty());
    for (l, _) in &events {
        assert_eq!(l["UUID"], H100_UUID, "{l:?}");
        assert_eq!(l["gpu"], "0", "{l:?}");
        assert_eq!(l["pod"], "trainer-0", "{l:?}");
        assert_eq!(l["namespace"], "ml-team", "{l:?}");
        assert_eq!(l["container"], "cuda", "{l:?}");
        assert_eq!(l["pod_uid"], POD_UID, "{l:?}");
    }
    // Without the tree, nothing is named and the JSON lines have no such field.
    let (jsonl, metrics) = run(&rec, &records, Some(&common::scratch().join("absent")));
    assert!(!jsonl.contains("pod_name") && !jsonl.contains("\"namespace\""));
    let text = encode(&metrics);
    for (l, _) in samples(&text, "gpu_trace_events_total") {
        assert_eq!((l["pod"].as_str(), l["namespace"].as_str()), ("", ""));
        assert_eq!(l["pod_uid"], POD_UID);
        assert_eq!(l["container"], &CONTAINER_ID[..12]);
    }
}

// ---------------------------------------------------------------------------------------------
// A real Prometheus.

#[test]
fn a_real_prometheus_scrapes_uuid_pod_and_namespace_and_no_zero_series() {
    let test = "a_real_prometheus_scrapes_uuid_pod_and_namespace_and_no_zero_series";
    if !Path::new(PROMETHEUS).exists() {
        common::skipped(
            test,
            format!("{PROMETHEUS} is not installed (apt-get install prometheus)"),
        );
        return;
    }
    let rec = load("h100_live/two_streams_live.gtrace");
    let pods = kubelet_tree(&common::scratch().join("prom-tree"));
    let (jsonl, metrics) = run(&rec, &in_a_pod(&rec), Some(&pods));
    // The pod's events: its process's JSON lines (a TASK_DESTROY at the tracer's exit is none).
    let pid = pid_of(&rec);
    let want = jsonl
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["pid"] == pid && e["event"] != "STATS" && e["cause"] != "tracer_exit")
        .count();
    let server = gpu_trace::metrics::server::MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
    )
    .expect("the metrics server on loopback");
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let prom = start_prometheus(server.addr, listen);
    let q = format!(
        "sum by (UUID, pod, namespace, container, pod_uid) \
         (gpu_trace_events_total{{UUID=\"{H100_UUID}\",pod=\"trainer-0\",namespace=\"ml-team\"}})"
    );
    let got = wait_for(listen, &q, |r| !r.is_empty());
    let zero = query(listen, "gpu_trace_events_total == 0");
    let total = query(listen, "count(gpu_trace_events_total)");
    let log = fs::read_to_string(prom.dir.join("prometheus.log")).unwrap_or_default();
    drop(prom);
    assert_eq!(got.len(), 1, "{got:?}\n{log}");
    let (labels, value) = &got[0];
    assert_eq!(labels["container"], "cuda");
    assert_eq!(labels["pod_uid"], POD_UID);
    assert_eq!(*value, want as f64);
    assert!(zero.is_empty(), "series at zero: {zero:?}");
    let text = encode(&metrics);
    let served = samples(&text, "gpu_trace_events_total").len() as f64;
    assert_eq!(total.first().map(|t| t.1), Some(served), "{total:?}");
}

/// `gpu-trace replay --pods-dir DIR` names the pods from DIR; without it, replay names none (a
/// recording's pods are another node's), whatever this machine's /var/log/pods holds.
#[test]
fn replay_names_pods_only_with_pods_dir() {
    let rec = load("h100_live/two_streams_live.gtrace");
    let file = common::scratch().join("in_a_pod.gtrace");
    let mut w = gpu_trace::record::RecordWriter::new(fs::File::create(&file).unwrap(), &rec.header)
        .unwrap();
    for r in in_a_pod(&rec) {
        w.record(&r).unwrap();
    }
    w.finish(&Default::default()).unwrap();
    let pods = kubelet_tree(&common::scratch().join("replay-tree"));
    let replay = |extra: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
            .arg("replay")
            .arg(&file)
            .args(["--format", "json", "--no-stats"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let named = replay(&["--pods-dir".as_ref(), pods.as_os_str()]);
    let pid = pid_of(&rec);
    let mine: Vec<serde_json::Value> = named
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["pid"] == pid)
        .collect();
    assert!(!mine.is_empty(), "{named}");
    for e in &mine {
        assert_eq!(e["cgroup"]["pod_name"], "trainer-0", "{e}");
        assert_eq!(e["cgroup"]["namespace"], "ml-team", "{e}");
    }
    let plain = replay(&[]);
    assert!(
        plain.contains(POD_UID) && !plain.contains("pod_name"),
        "{plain}"
    );
}

/// A pod whose directory appears after its process was attributed (the kubelet was slow, or the
/// reread was rate-limited) is named at its process's later events, not never.
#[test]
fn a_pod_whose_directory_comes_late_is_named_at_later_events() {
    let rec = load("h100_live/two_streams_live.gtrace");
    let records = in_a_pod(&rec);
    let pid = pid_of(&rec);
    let root = common::scratch().join("late-tree");
    // The directory appears at several points of the run (most of the records come before
    // the process's first event): at least one falls between its events.
    let mut between_events = 0;
    for tenth in 1..10 {
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("pods")).unwrap();
        let resolver = PodDirectory::new(root.join("pods")).with_min_reread(Duration::ZERO);
        let at = records.len() * tenth / 10;
        let (jsonl, _) = run_with(&rec, &records, Some(resolver), |i| {
            if i == at {
                kubelet_tree(&root);
            }
        });
        let named: Vec<bool> = jsonl
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["pid"] == pid && e["event"] != "STATS")
            .map(|e| e["cgroup"]["pod_name"] == "trainer-0")
            .collect();
        // Named from some event on (the first after the directory came), never unnamed again.
        let first = named
            .iter()
            .position(|&n| n)
            .expect("named at a later event");
        assert!(named[first..].iter().all(|&n| n), "{tenth}/10: {named:?}");
        if first > 0 {
            between_events += 1;
        }
    }
    assert!(
        between_events > 0,
        "the directory never came between two events"
    );
}
