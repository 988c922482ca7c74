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
    json_rows(stdout, pid, true)
}

/// The calls of process `pid` of each (library, symbol) in the `API_STATS` lines of the JSON
/// output `stdout` whose `final` is `final_` (the last line of each wins).
fn json_rows(stdout: &str, pid: u32, final_: bool) -> Counts {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "API_STATS" && v["final"] == final_ && v["pid"] == pid)
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

/// The stand-in libraries and the client built in a new directory (and its canonical path);
/// `None`, after SKIPPED, where the test cannot run here.
fn build(test: &str) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    if !uprobes(test) || !c_compiler(test) {
        return None;
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
    Some((dir, root))
}

/// The client, started and waiting for its go.
struct Client {
    child: std::process::Child,
    input: Option<std::process::ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
    pid: u32,
}

impl Client {
    /// `args`: the calls of cuInit and of cudaMalloc, and `exit` to end right after them.
    fn start(root: &std::path::Path, args: &[&str]) -> Self {
        let mut child = Command::new(root.join("client"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let pid = line.trim().strip_prefix("pid=").unwrap().parse().unwrap();
        Client {
            child,
            input,
            out,
            pid,
        }
    }

    /// Lets it make its calls; the calls of each (library, symbol) by its own counts
    /// (cuCtxCreate_v4 once per cudaMalloc, tests/api/fake_cudart.c).
    fn go(&mut self) -> Counts {
        writeln!(self.input.as_mut().unwrap(), "go").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        let mut own = BTreeMap::new();
        for part in line.split_whitespace() {
            let (sym, n) = part.split_once('=').unwrap();
            own.insert(sym.to_string(), n.parse::<u64>().unwrap());
        }
        assert_eq!(own.len(), 2, "{line}");
        [
            ("libcuda.so.1", "cuInit", own["cuInit"]),
            ("libcudart.so.12", "cudaMalloc", own["cudaMalloc"]),
            ("libcuda.so.1", "cuCtxCreate_v4", own["cudaMalloc"]),
        ]
        .into_iter()
        .map(|(l, s, n)| ((l.to_string(), s.to_string()), n))
        .collect()
    }

    /// Lets it end; waits for it.
    fn end(mut self) {
        drop(self.input.take());
        assert!(self.child.wait().unwrap().success());
    }
}

#[test]
fn api_figures_in_metrics_stats_json_and_replay_equal_the_clients_own_counts() {
    let test = "api_figures_in_metrics_stats_json_and_replay_equal_the_clients_own_counts";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let mut client = Client::start(&root, &["37", "23"]);
    let pid = client.pid;
    let rec = root.join("figures.gtrace");
    let lines = root.join("figures.jsonl");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // The temporary directory's path has no space.
    let line_args = format!(
        "--watch-device /dev/full --api --pid {pid} --format json --interval 0.25 --metrics {metrics} \
         --record {} -o {}",
        rec.display(),
        lines.display()
    );
    let args: Vec<&str> = line_args.split(' ').collect();
    let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
    let expected = client.go();

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

    // A periodic block (--interval) after that read has the same figures, not final: waited
    // for in the output file (each block is written out as it is made).
    let written = || std::fs::read_to_string(&lines).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(15);
    while json_rows(&written(), pid, false) != expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    client.end();
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let out = written();
    assert_eq!(json_final(&out, pid), expected, "{out}");
    assert_eq!(json_rows(&out, pid, false), expected, "{out}");

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

/// A `--comm` target that makes its calls and exits before its sums are read (the next
/// second's read, or the one at the end, comes after its exit record, which makes the
/// pipeline forget its name): the records carry the name the rescan read while it ran, so
/// its final figures are still selected and equal its own counts.
#[test]
fn a_comm_target_that_exited_before_the_read_keeps_its_figures() {
    let test = "a_comm_target_that_exited_before_the_read_keeps_its_figures";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let mut client = Client::start(&root, &["5", "3", "exit"]);
    let pid = client.pid;
    let args = [
        "--watch-device=/dev/full",
        "--api",
        "--comm=client",
        "--format=json",
    ];
    let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
    let expected = client.go();
    // Exited and reaped: its exit record is in the ring now, and the run's end reads the ring
    // to the last record before it reads the sums (`drain_after_detach`): no wait needed.
    client.end();
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert_eq!(
        json_final(&f.stdout, pid),
        expected,
        "{}\n{}",
        f.stdout,
        f.stderr
    );
}
