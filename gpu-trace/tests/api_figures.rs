//! `gpu-trace --api`'s call figures in the main trace (issue 28 item 2: "JSON, metrics and
//! `top` get the same figures"), through the real binary, real uprobes and a real scrape over
//! HTTP. tests/api_join.rs's stand-in `libcuda.so.1` and `libcudart.so.12` (tests/api/) under a
//! client (tests/api/figures_client.c) that calls `cuInit` and `cudaMalloc` (which calls
//! `cuCtxCreate_v4` once) a number of times of its own and prints how many calls it made.
//! Expected, for each (library, symbol): the scraped `gpu_trace_api_calls_total`, the exit
//! statistics' "API calls" table, the final `API_STATS` JSON lines and the replay of the
//! recording all give the client's own counts.
//!
//! Without root, uprobes or a C compiler, the test prints `SKIPPED: <why>`.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod api_support;
mod common;
mod rel_support;
use api_support::{c_compiler, cc, uprobes};
use common::prometheus::{free_port, http_get};
use rel_support::{Traced, gpu_trace_bin};

/// (library, symbol) → calls.
type Counts = BTreeMap<(String, String), u64>;

/// The calls of each (library, symbol) in the scrape `body` (every series summed).
fn scraped(body: &str) -> Counts {
    let mut out = Counts::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("gpu_trace_api_calls_total{") else {
            continue;
        };
        let (labels, value) = rest.rsplit_once("} ").unwrap();
        let label = |name: &str| {
            let start = labels.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            labels[start..].split('"').next().unwrap().to_string()
        };
        let v: f64 = value.trim().parse().unwrap();
        *out.entry((label("library"), label("symbol"))).or_default() += v as u64;
    }
    out
}

/// The calls of process `pid` of each (library, symbol) in the final `API_STATS` lines of
/// the JSON output `stdout`.
fn json_final(stdout: &str, pid: u32) -> Counts {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "API_STATS" && v["final"] == true && v["pid"] == pid)
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap().to_string();
            ((s("library"), s("symbol")), v["calls"].as_u64().unwrap())
        })
        .collect()
}

/// The calls of process `pid` in the "API calls" table of the text statistics `stdout`.
fn text_table(stdout: &str, pid: u32) -> Counts {
    let mut lines = stdout.lines().skip_while(|l| *l != "API calls:").skip(2);
    let mut out = Counts::new();
    for line in lines.by_ref().take_while(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f[0] == pid.to_string() {
            out.insert((f[7].to_string(), f[1].to_string()), f[2].parse().unwrap());
        }
    }
    out
}

#[test]
fn api_figures_in_metrics_stats_json_and_replay_equal_the_clients_own_counts() {
    let test = "api_figures_in_metrics_stats_json_and_replay_equal_the_clients_own_counts";
    if !uprobes(test) || !c_compiler(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let lib_dir = format!("-L{}", root.display());
    let shared = ["-shared", "-fPIC"];
    cc(&root, "fake_cuda.c", "libcuda.so.1", &shared);
    let cudart = [&shared[..], &[&lib_dir, "-l:libcuda.so.1"]].concat();
    cc(&root, "fake_cudart.c", "libcudart.so.12", &cudart);
    let rpath = format!("-Wl,-rpath,{}", root.display());
    let client_flags = [&lib_dir, "-l:libcuda.so.1", "-l:libcudart.so.12", &rpath];
    cc(&root, "figures_client.c", "client", &client_flags);

    let mut client = Command::new(root.join("client"))
        .args(["37", "23"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = client.stdin.take().unwrap();
    let mut out = BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid: u32 = line.trim().strip_prefix("pid=").unwrap().parse().unwrap();

    let rec = root.join("figures.gtrace");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // The temporary directory's path has no space.
    let line_args = format!(
        "--watch-device /dev/full --api --pid {pid} --format json --metrics {metrics} --record {}",
        rec.display()
    );
    let args: Vec<&str> = line_args.split(' ').collect();
    let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
    writeln!(input, "go").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    // The client's own counts: cuCtxCreate_v4 once per cudaMalloc (tests/api/fake_cudart.c).
    let mut own = BTreeMap::new();
    for part in line.split_whitespace() {
        let (sym, n) = part.split_once('=').unwrap();
        own.insert(sym.to_string(), n.parse::<u64>().unwrap());
    }
    let expected: Counts = [
        ("libcuda.so.1", "cuInit", own["cuInit"]),
        ("libcudart.so.12", "cudaMalloc", own["cudaMalloc"]),
        ("libcuda.so.1", "cuCtxCreate_v4", own["cudaMalloc"]),
    ]
    .into_iter()
    .map(|(l, s, n)| ((l.to_string(), s.to_string()), n))
    .collect();
    assert_eq!(own.len(), 2, "{line}");

    // The sums are read each second: the scrape reaches the counts within seconds.
    let deadline = Instant::now() + Duration::from_secs(15);
    let body = loop {
        let body = http_get(metrics, "/metrics")
            .map(|r| r.1)
            .unwrap_or_default();
        if scraped(&body) == expected || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(scraped(&body), expected, "{body}");
    assert!(!body.contains("pid=\""), "no pid label: {body}");
    assert!(body.contains("gpu_trace_api_call_seconds_total{"), "{body}");

    drop(input);
    assert!(client.wait().unwrap().success());
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert_eq!(json_final(&f.stdout, pid), expected, "{}", f.stdout);

    // The recording replays the same figures: in JSON, and in the text statistics' table.
    let replay = |format: &str| {
        let out = Command::new(gpu_trace_bin())
            .arg("replay")
            .arg(&rec)
            .arg(format!("--format={format}"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(json_final(&replay("json"), pid), expected);
    let text = replay("text");
    assert_eq!(text_table(&text, pid), expected, "{text}");
}
