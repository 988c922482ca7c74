//! deploy/grafana/gpu-trace.json: valid JSON with a `schemaVersion`, the `$namespace`, `$pod`
//! and `$UUID` variables, and every panel's query checked by a real `promtool` (Debian's): as a
//! recording rule (`promtool check rules`: it parses) and against series written here
//! (`promtool test rules`: with the variables set to one pod, each query returns that pod's
//! values, worked out below by hand from the series). Without promtool: `SKIPPED: why`.

mod common;

use std::{collections::BTreeMap, fs, path::Path, process::Command};

const PROMTOOL: &str = "/usr/bin/promtool";
const U0: &str = "GPU-68238f7a-fa6f-b6b8-6132-63c29858a94f";

fn dashboard() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/gpu-trace.json");
    serde_json::from_str(&fs::read_to_string(path).unwrap()).expect("the dashboard is JSON")
}

/// Each panel's title and query, with Grafana's variables set as a user picking the pod
/// `ml-team/trainer-0` and every GPU would have them.
fn queries(d: &serde_json::Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for p in d["panels"].as_array().expect("panels") {
        let title = p["title"].as_str().expect("a title").to_string();
        let targets = p["targets"].as_array().expect("targets");
        assert_eq!(targets.len(), 1, "{title}");
        let expr = targets[0]["expr"].as_str().expect("an expr");
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$namespace", "ml-team")
            .replace("$pod", "trainer-0")
            .replace("$UUID", ".*");
        assert!(!expr.contains('$'), "{title}: a variable left: {expr}");
        out.insert(title, expr);
    }
    out
}

/// One input series of the test: a task-labelled series of `name` with `extra` labels.
fn series(name: &str, pod: (&str, &str), extra: &str, values: &str) -> String {
    let (ns, pod) = pod;
    format!(
        "      - series: '{name}{{job=\"gpu-trace\",instance=\"node-a\",gpu=\"0\",UUID=\"{U0}\",\
         comm=\"python3\",container=\"cuda\",pod=\"{pod}\",namespace=\"{ns}\",{extra}}}'\n        \
         values: \"{values}\"\n"
    )
}

#[test]
fn the_dashboard_is_valid_and_each_query_returns_the_pods_values() {
    let test = "the_dashboard_is_valid_and_each_query_returns_the_pods_values";
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().is_some(), "no schemaVersion");
    assert!(d["uid"].as_str().is_some(), "no uid");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for v in ["namespace", "pod", "UUID"] {
        assert!(vars.contains(&v), "no ${v} variable: {vars:?}");
    }
    let queries = queries(&d);
    // Expected, from the series below (1-minute steps, evaluated at 10m, 5m windows: a counter
    // growing by N a minute has rate N/60 and 5-minute increase 5 N).
    let trainer = "{namespace=\"ml-team\", pod=\"trainer-0\"}";
    let expected: BTreeMap<&str, (String, &str)> = [
        ("Schedules/s by pod", (trainer.to_string(), "1")),
        (
            "Refused schedules/s",
            (
                "{namespace=\"ml-team\", pod=\"trainer-0\", comm=\"python3\"}".to_string(),
                "0.5",
            ),
        ),
        (
            "GPU share by pod",
            (
                format!("{{namespace=\"ml-team\", pod=\"trainer-0\", UUID=\"{U0}\"}}"),
                "0.25",
            ),
        ),
        ("Live TSGs / queues by pod", (trainer.to_string(), "5")),
        (
            "Dropped records (raise --ring-size)",
            ("{instance=\"node-a\"}".to_string(), "50"),
        ),
        // All observations in the (0.00016, 0.00064] bucket: 0.00016 + 0.99 × 0.00048.
        (
            "TASK_INIT to first SCHEDULE, p99",
            (format!("{{UUID=\"{U0}\"}}"), "0.0006352"),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        queries.keys().map(String::as_str).collect::<Vec<_>>(),
        expected.keys().copied().collect::<Vec<_>>(),
        "a panel without an expected value, or one gone"
    );
    if !Path::new(PROMTOOL).exists() {
        common::skipped(
            test,
            format!("{PROMTOOL} is not installed (apt-get install prometheus)"),
        );
        return;
    }
    let dir = common::scratch().join("dashboard");
    fs::create_dir_all(&dir).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in queries.values().enumerate() {
        rules += &format!("      - record: dashboard:panel{i}\n        expr: '{expr}'\n");
    }
    promtool("check", &dir.join("rules.yml"), &rules);

    let trainer_pod = ("ml-team", "trainer-0");
    let other_pod = ("web", "web-1");
    let uid = "pod_uid=\"11111111-2222-4333-8444-555555555501\"";
    let mut input = String::new();
    for (pod, event, values) in [
        (trainer_pod, "SCHEDULE", "0+60x15"),
        (trainer_pod, "TASK_INIT", "0+600x15"),
        (other_pod, "SCHEDULE", "0+120x15"),
    ] {
        let extra = format!("event=\"{event}\",engine=\"GRAPHICS\",{uid}");
        input += &series("gpu_trace_events_total", pod, &extra, values);
    }
    let extra = format!("engine=\"GRAPHICS\",{uid}");
    input += &series(
        "gpu_trace_schedules_refused_total",
        trainer_pod,
        &extra,
        "0+30x15",
    );
    input += &series(
        "gpu_trace_schedules_refused_total",
        other_pod,
        &extra,
        "0+90x15",
    );
    input += &series("gpu_trace_gpu_share_ratio", trainer_pod, uid, "0.25x15");
    input += &series("gpu_trace_gpu_share_ratio", other_pod, uid, "0.5x15");
    input += &series("gpu_trace_live_tasks", trainer_pod, &extra, "2x15");
    let copy = format!("engine=\"COPY\",{uid}");
    input += &series("gpu_trace_live_tasks", trainer_pod, &copy, "3x15");
    input += &series("gpu_trace_live_tasks", other_pod, &copy, "7x15");
    input += "      - series: 'gpu_trace_dropped_records_total{job=\"gpu-trace\",instance=\"node-a\"}'\n        values: \"0+10x15\"\n";
    for (le, values) in [
        ("0.00016", "0x15"),
        ("0.00064", "0+10x15"),
        ("+Inf", "0+10x15"),
    ] {
        input += &format!(
            "      - series: 'gpu_trace_schedule_latency_seconds_bucket{{job=\"gpu-trace\",\
             instance=\"node-a\",gpu=\"0\",UUID=\"{U0}\",engine=\"GRAPHICS\",le=\"{le}\"}}'\n        \
             values: \"{values}\"\n"
        );
    }
    let mut tests = String::new();
    for (title, expr) in &queries {
        let (labels, value) = &expected[title.as_str()];
        tests += &format!(
            "      - expr: '{expr}'\n        eval_time: 10m\n        exp_samples:\n          \
             - labels: '{labels}'\n            value: {value}\n"
        );
    }
    let unit = format!(
        "rule_files:\n  - rules.yml\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    \
         input_series:\n{input}    promql_expr_test:\n{tests}"
    );
    promtool("test", &dir.join("test.yml"), &unit);
}

/// Writes `text` to `file` and runs `promtool VERB rules FILE`, which must succeed.
fn promtool(verb: &str, file: &Path, text: &str) {
    fs::write(file, text).unwrap();
    let out = Command::new(PROMTOOL)
        .args([verb, "rules"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
