//! Pod names where people look (issue 41, item 2), through `gpu-trace replay --pods-dir` only
//! (no live trace): the MPS recording's two clients put in two pods of one namespace
//! (`ml-team/trainer-0`, `ml-team/trainer-1`), its MPS server left on the host.
//!
//! - text lines of a pod's process carry `pod=NAME namespace=NS` (the UID without
//!   `--pods-dir`; JSON keeps `pod_uid` beside the names); the host process's lines are those of
//!   the recording as it was; the statistics' table names the pods;
//! - `--pod` and `--namespace` keep exactly the lines of the pods they name: the expected lines
//!   are derived from the `cgroup` objects of an unfiltered JSON replay, not from the filtered
//!   output; a value that names no pod is warned about at the end.

#[allow(unused_imports)] // `skipped`: nothing here needs what a machine may lack
mod common;

use std::{
    collections::BTreeSet,
    fs,
    io::BufReader,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use common::pods::{
    CONTAINER_ID, CONTAINER2_ID, POD_UID, POD2_UID, in_cgroups, kubelet_tree, pod_cgroup,
};
use gpu_trace::record::RecordReader;
use serde_json::Value;

/// The MPS recording: clients 500 and 501, the MPS server 538.
const MPS: &str = "h100_late_mps/mps.gtrace";
const TRAINER_0: u32 = 500;
const TRAINER_1: u32 = 501;
const SERVER: u32 = 538;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The recording with its clients in the two pods, written once; and the kubelet tree.
fn setup() -> &'static (PathBuf, PathBuf) {
    static FILES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    FILES.get_or_init(|| {
        let mut reader =
            RecordReader::new(BufReader::new(fs::File::open(fixture(MPS)).unwrap())).unwrap();
        let mut records = Vec::new();
        while let Some(b) = reader.next_record().unwrap() {
            records.push(b);
        }
        let (p0, p1) = (
            pod_cgroup(POD_UID, CONTAINER_ID),
            pod_cgroup(POD2_UID, CONTAINER2_ID),
        );
        let placed = in_cgroups(&records, &[(TRAINER_0, &p0), (TRAINER_1, &p1)]);
        let file = common::scratch().join("mps_in_pods.gtrace");
        let mut w =
            gpu_trace::record::RecordWriter::new(fs::File::create(&file).unwrap(), &reader.header)
                .unwrap();
        for r in &placed {
            w.record(r).unwrap();
        }
        w.finish(&reader.trailer.unwrap_or_default()).unwrap();
        let pods = kubelet_tree(&common::scratch().join("kubelet"));
        (file, pods)
    })
}

/// `gpu-trace replay FILE ARGS…`: its standard output and error (it must succeed).
fn replay(file: &Path, args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .arg("replay")
        .arg(file)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{args:?}: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// The event lines of a JSON replay (no `INVENTORY`, no `STATS`), parsed.
fn events(jsonl: &str) -> Vec<Value> {
    jsonl
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| !["INVENTORY", "STATS"].contains(&e["event"].as_str().unwrap_or("")))
        .collect()
}

/// The text event lines of process `pid`.
fn text_lines_of(text: &str, pid: u32) -> Vec<&str> {
    let tag = format!("PID={pid} ");
    text.lines()
        .filter(|l| l.split_whitespace().any(|w| w == tag.trim_end()))
        .collect()
}

#[test]
fn text_lines_of_a_pods_process_name_its_pod_and_namespace() {
    let (file, pods) = setup();
    let dir = pods.to_str().unwrap();
    let (named, _) = replay(file, &["--pods-dir", dir]);
    let id0 = &CONTAINER_ID[..12];
    let id1 = &CONTAINER2_ID[..12];
    for (pid, tail) in [
        (
            TRAINER_0,
            format!(" container={id0} pod=trainer-0 namespace=ml-team"),
        ),
        (
            TRAINER_1,
            format!(" container={id1} pod=trainer-1 namespace=ml-team"),
        ),
    ] {
        let lines = text_lines_of(&named, pid);
        assert!(lines.len() > 10, "{pid}: {named}");
        for l in &lines {
            assert!(l.ends_with(&tail), "{pid}: {l:?} should end with {tail:?}");
        }
    }
    // The statistics' per-container table names the pods too.
    assert!(
        named.contains(&format!(
            "containerd {id0} pod ml-team/trainer-0 (burstable)"
        )),
        "{named}"
    );
    // Without --pods-dir (a recording's pods are another node's), the UID, as before.
    let (plain, _) = replay(file, &[]);
    for l in text_lines_of(&plain, TRAINER_0) {
        assert!(
            l.ends_with(&format!(" container={id0} pod={POD_UID}")),
            "{l:?}"
        );
    }
    // The host process's lines are the recording's own, field for field (no field added).
    let (original, _) = replay(&fixture(MPS), &[]);
    let host = text_lines_of(&original, SERVER);
    assert!(host.len() > 5, "{original}");
    assert_eq!(text_lines_of(&named, SERVER), host);
    // JSON keeps the UID beside the names.
    let (jsonl, _) = replay(file, &["--pods-dir", dir, "--format", "json"]);
    let mine: Vec<Value> = (events(&jsonl).into_iter())
        .filter(|e| e["pid"] == TRAINER_0)
        .collect();
    assert!(!mine.is_empty());
    for e in &mine {
        let cg = &e["cgroup"];
        assert_eq!(
            (&cg["pod_uid"], &cg["pod_name"], &cg["namespace"]),
            (
                &Value::from(POD_UID),
                &Value::from("trainer-0"),
                &Value::from("ml-team")
            ),
            "{e}"
        );
    }
}

/// The lines of an unfiltered JSON replay (with the pods named) whose `cgroup` passes `keep`,
/// and the same replay's lines with `filter`: equal, and not all nor none of the lines.
fn filtered_equals_derived(filter: &[&str], keep: impl Fn(&Value) -> bool) -> usize {
    let (file, pods) = setup();
    let dir = pods.to_str().unwrap();
    let (all, _) = replay(file, &["--pods-dir", dir, "--format", "json"]);
    let all = events(&all);
    let want: Vec<&Value> = all.iter().filter(|e| keep(&e["cgroup"])).collect();
    let mut args = vec!["--pods-dir", dir, "--format", "json"];
    args.extend(filter);
    let (got, stderr) = replay(file, &args);
    let got = events(&got);
    assert!(!want.is_empty() && want.len() < all.len(), "{filter:?}");
    assert_eq!(got.iter().collect::<Vec<_>>(), want, "{filter:?}");
    assert!(!stderr.contains("named no pod"), "{filter:?}: {stderr}");
    got.len()
}

#[test]
fn pod_keeps_exactly_the_lines_of_that_pod() {
    let pod = |name: &'static str| move |cg: &Value| cg["pod_name"] == name;
    let n0 = filtered_equals_derived(&["--pod", "trainer-0"], pod("trainer-0"));
    let n1 = filtered_equals_derived(&["--pod", "trainer-1"], pod("trainer-1"));
    // By UID, the same lines as by name; two pods, the lines of both.
    assert_eq!(
        filtered_equals_derived(&["--pod", POD_UID], pod("trainer-0")),
        n0
    );
    let both = filtered_equals_derived(&["--pod", "trainer-0", "--pod", "trainer-1"], |cg| {
        cg["pod_name"] == "trainer-0" || cg["pod_name"] == "trainer-1"
    });
    assert_eq!(both, n0 + n1);
    // Text: exactly those lines of the unfiltered text replay.
    let (file, pods) = setup();
    let dir = pods.to_str().unwrap();
    let (all, _) = replay(file, &["--pods-dir", dir, "--no-stats"]);
    let (got, _) = replay(
        file,
        &["--pods-dir", dir, "--no-stats", "--pod", "trainer-0"],
    );
    let want: Vec<&str> = text_lines_of(&all, TRAINER_0);
    assert_eq!(got.lines().collect::<Vec<_>>(), want);
}

#[test]
fn namespace_keeps_exactly_the_lines_of_its_pods() {
    let in_ml_team = |cg: &Value| cg["namespace"] == "ml-team";
    let n = filtered_equals_derived(&["--namespace", "ml-team"], in_ml_team);
    let pids: BTreeSet<u64> = {
        let (file, pods) = setup();
        let dir = pods.to_str().unwrap();
        let (out, _) = replay(
            file,
            &[
                "--pods-dir",
                dir,
                "--format",
                "json",
                "--namespace",
                "ml-team",
            ],
        );
        events(&out)
            .iter()
            .map(|e| e["pid"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        pids,
        BTreeSet::from([u64::from(TRAINER_0), u64::from(TRAINER_1)])
    );
    // With --pod too, both must match.
    let one = filtered_equals_derived(&["--namespace", "ml-team", "--pod", "trainer-1"], |cg| {
        cg["namespace"] == "ml-team" && cg["pod_name"] == "trainer-1"
    });
    assert!(one < n);
}

#[test]
fn a_pod_or_namespace_that_names_no_pod_is_warned_about() {
    let (file, pods) = setup();
    let dir = pods.to_str().unwrap();
    let (out, stderr) = replay(
        file,
        &[
            "--pods-dir",
            dir,
            "--format",
            "json",
            "--pod",
            "nosuch",
            "--namespace",
            "other",
        ],
    );
    assert!(events(&out).is_empty(), "{out}");
    assert!(
        stderr.contains(
            "gpu-trace: warning: --pod nosuch named no pod of the run (the traced processes' \
             pods: ml-team/trainer-0 (11111111-2222-4333-8444-555555555501), \
             ml-team/trainer-1 (11111111-2222-4333-8444-555555555504))\n"
        ),
        "{stderr}"
    );
    // `other/web-1` is in the directory but none of its processes was traced.
    assert!(
        stderr.contains("gpu-trace: warning: --namespace other named no pod's namespace"),
        "{stderr}"
    );
    // Without --pods-dir, a replay names no pod: the warning says where names come from.
    let (out, stderr) = replay(file, &["--namespace", "ml-team"]);
    assert!(text_lines_of(&out, TRAINER_0).is_empty(), "{out}");
    assert!(
        stderr.contains("--namespace ml-team named no pod's namespace of the run")
            && stderr.contains("(a replay names pods only with --pods-dir DIR)"),
        "{stderr}"
    );
    // Matched: no warning.
    let (_, stderr) = replay(file, &["--pods-dir", dir, "--pod", "trainer-0"]);
    assert!(!stderr.contains("warning: --pod"), "{stderr}");
}

/// The start-up inventory's text (stderr) names the pods of the processes it lists as the event
/// lines do, and `--pod` selects its processes (text and the JSON `INVENTORY` line) as it
/// selects events.
#[test]
fn the_inventory_names_pods_and_pod_selects_its_processes() {
    use gpu_trace_core::inventory::{GpuNode, InventoryProcess};
    let (_, pods) = setup();
    let dir = pods.to_str().unwrap();
    let mut reader = RecordReader::new(BufReader::new(
        fs::File::open(fixture("h100_live/two_streams_live.gtrace")).unwrap(),
    ))
    .unwrap();
    let mut header = reader.header.clone();
    let process = |pid: u32, comm: &str, cgroup: String| InventoryProcess {
        pid,
        comm: comm.into(),
        cmdline: vec![comm.into()],
        exe: None,
        cgroup: Some(cgroup),
        gpus: Vec::new(),
        fds: vec![(3, GpuNode::NvCtl)],
        mps: None,
    };
    let inv = header.inventory.as_mut().unwrap();
    inv.processes = vec![
        process(7001, "trainer", pod_cgroup(POD_UID, CONTAINER_ID)),
        process(7002, "daemon", "/system.slice/gpu-daemon.service".into()),
    ];
    let file = common::scratch().join("inventory_in_pods.gtrace");
    let mut w =
        gpu_trace::record::RecordWriter::new(fs::File::create(&file).unwrap(), &header).unwrap();
    while let Some(b) = reader.next_record().unwrap() {
        w.record(&b).unwrap();
    }
    w.finish(&reader.trailer.unwrap_or_default()).unwrap();
    let line = |stderr: &str, pid: u32| {
        let tag = format!("gpu-trace:   PID {pid} ");
        stderr
            .lines()
            .find(|l| l.starts_with(&tag))
            .map(str::to_string)
    };
    let id = &CONTAINER_ID[..12];
    let (_, stderr) = replay(&file, &["--pods-dir", dir, "--no-stats"]);
    let trainer = line(&stderr, 7001).unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        trainer.contains(&format!(
            " container=containerd:{id} pod=trainer-0 namespace=ml-team cgroup="
        )),
        "{trainer}"
    );
    assert!(
        line(&stderr, 7002).is_some_and(|l| !l.contains("pod=")),
        "{stderr}"
    );
    // Without --pods-dir, the UID.
    let (_, stderr) = replay(&file, &["--no-stats"]);
    assert!(
        line(&stderr, 7001).is_some_and(|l| l.contains(&format!(" pod={POD_UID} cgroup="))),
        "{stderr}"
    );
    // --pod: only the pod's process, on stderr and in the JSON line.
    let (out, stderr) = replay(
        &file,
        &[
            "--pods-dir",
            dir,
            "--no-stats",
            "--format",
            "json",
            "--pod",
            "trainer-0",
        ],
    );
    assert!(
        line(&stderr, 7001).is_some() && line(&stderr, 7002).is_none(),
        "{stderr}"
    );
    let inventory: Value = (out.lines())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "INVENTORY")
        .unwrap();
    let pids: Vec<&Value> = (inventory["processes"].as_array().unwrap().iter())
        .map(|p| &p["pid"])
        .collect();
    assert_eq!(pids, [&Value::from(7001)], "{inventory}");
}

/// `gpu-trace merge` names no pods (one node's directory names no other node's): `--pod` and
/// `--namespace` are refused as usage errors, not left to match nothing.
#[test]
fn merge_refuses_pod_and_namespace() {
    let (file, _) = setup();
    for flag in ["--pod", "--namespace"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
            .arg("merge")
            .args([file, file])
            .args([flag, "x"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(
            stderr.contains("merge does not take --pod or --namespace"),
            "{flag}: {stderr}"
        );
    }
}
