//! `gpu-trace --api` (issue 28 item 6): driver events carry the API call open on their thread,
//! through the real binary, real uprobes and the real syscall-layer programs. A stand-in
//! `libcuda.so.1` (tests/api/fake_cuda.c) whose `cuInit` and `cuCtxCreate_v4` issue RM-shaped
//! `GPFIFO_SCHEDULE` controls on the watched device (/dev/full), a stand-in `libcudart.so.12`
//! (tests/api/fake_cudart.c) whose `cudaMalloc` calls `cuCtxCreate_v4`, and a client
//! (tests/api/join_client.c) that makes one driver call in each and one outside any API call.
//! Expected: the first SCHEDULE inside `cuInit`, the second inside `cuCtxCreate_v4` from
//! `cudaMalloc`, the third with no `api`; the recording replays the same in text.
//!
//! With `--api-calls` (tests/api/calls_client.c, which counts its own calls): one `API_CALL` per
//! call, live, replayed and as Perfetto slices on the thread's track with the driver events
//! inside them; with the stand-in built `-DRECURSE=3` (a `cuInit` that finds itself through
//! `RTLD_DEFAULT`): one `API_RECURSION`, nothing malformed.
//!
//! Without root, uprobes or a C compiler, the test prints `SKIPPED: <why>`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

mod api_support;
mod common;
mod rel_support;
use rel_support::{Traced, gpu_trace_bin, json_events};

const CLIENT: u32 = 0x5EED_0A00;

/// The stand-in libraries and the clients built in a new directory (and its canonical path);
/// `None`, after SKIPPED, where the test cannot run here.
fn build(test: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    build_with(test, &[])
}

/// [`build`], with `cuda_flags` for the stand-in `libcuda.so.1` (`-DRECURSE=N`: its `cuInit`
/// re-enters itself).
fn build_with(test: &str, cuda_flags: &[&str]) -> Option<(tempfile::TempDir, PathBuf)> {
    let clients = [
        ("join_client.c", "client"),
        ("calls_client.c", "calls_client"),
    ];
    api_support::fake_cuda(test, cuda_flags, &clients)
}

/// The client started (`preload`: in its `LD_PRELOAD`), waiting for a line; its pid.
fn start_client(root: &Path, preload: Option<&Path>) -> (Child, BufReader<ChildStdout>, u32) {
    start_program(&root.join("client"), preload)
}

/// [`start_client`] of the client's executable at `exe`.
fn start_program(exe: &Path, preload: Option<&Path>) -> (Child, BufReader<ChildStdout>, u32) {
    let mut cmd = Command::new(exe);
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    start_command(cmd)
}

/// `cmd` (a client) started, waiting for a line; its pid.
fn start_command(mut cmd: Command) -> (Child, BufReader<ChildStdout>, u32) {
    let mut client = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(client.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let pid: u32 = first.trim().strip_prefix("pid=").unwrap().parse().unwrap();
    (client, out, pid)
}

/// The probes a client of the stand-in libraries gets: three symbols (`cuInit`,
/// `cuCtxCreate_v4`, `cudaMalloc`), entry and return each, and its dynamic linker's
/// `_dl_debug_state` (libraries loaded later, docs/api.md).
fn per_target() -> usize {
    api_support::probes_per_client()
}

fn wait_probes(pid: u32, n: usize) {
    api_support::wait_links(pid, n);
}

fn links_of(pid: u32) -> usize {
    api_support::bpf_links(pid)
}

/// Lets the client make its calls and waits for it to end.
fn release(client: &mut Child, out: &mut BufReader<ChildStdout>) {
    writeln!(client.stdin.take().unwrap(), "go").unwrap();
    let mut done = String::new();
    out.read_line(&mut done).unwrap();
    assert_eq!(done.trim(), "done");
    assert!(client.wait().unwrap().success());
}

#[test]
fn driver_events_carry_the_api_call_open_on_their_thread() {
    let test = "driver_events_carry_the_api_call_open_on_their_thread";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let (mut client, mut out, pid) = start_client(&root, None);
    let rec = root.join("join.gtrace");
    let pid_arg = pid.to_string();
    let args = [
        "--watch-device",
        "/dev/full",
        "--api",
        "--pid",
        &pid_arg,
        "--format",
        "json",
        "--record",
        rec.to_str().unwrap(),
    ];
    let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
    release(&mut client, &mut out);
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert!(
        f.stderr
            .contains("--api: 1 of 1 target process(es) map a GPU API library"),
        "{}",
        f.stderr
    );

    let events = json_events(&f.stdout);
    let schedule = |object: u32| {
        let key = format!("{pid}:0x{CLIENT:08x}:0x{object:08x}");
        let found: Vec<_> = events
            .iter()
            .filter(|e| e["event"] == "SCHEDULE" && e["key"] == key.as_str())
            .collect();
        assert_eq!(found.len(), 1, "one SCHEDULE of {key} in\n{}", f.stdout);
        found[0].clone()
    };
    let in_init = schedule(0x5EED_0A01);
    assert_eq!(
        in_init["api"],
        serde_json::json!({"symbol": "cuInit", "library": "libcuda.so.1", "depth": 1}),
        "{in_init}"
    );
    let in_ctx = schedule(0x5EED_0A02);
    assert_eq!(
        in_ctx["api"],
        serde_json::json!({
            "symbol": "cuCtxCreate_v4", "library": "libcuda.so.1", "depth": 2,
            "caller": {"symbol": "cudaMalloc", "library": "libcudart.so.12"}
        }),
        "{in_ctx}"
    );
    let outside = schedule(0x5EED_0A03);
    assert!(outside.get("api").is_none(), "{outside}");

    // The recording keeps the names: its replay's text lines end with them.
    let replay = Command::new(gpu_trace_bin())
        .arg("replay")
        .arg(&rec)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&replay.stdout);
    let line = |object: u32| {
        let tsg = format!("TSG=0x{object:08x}");
        text.lines()
            .find(|l| l.contains("SCHEDULE") && l.contains(&tsg))
            .unwrap_or_else(|| panic!("no SCHEDULE of {tsg} in\n{text}"))
            .to_string()
    };
    assert!(line(0x5EED_0A01).ends_with(" api=cuInit@libcuda.so.1"));
    assert!(
        line(0x5EED_0A02).ends_with(" api=cuCtxCreate_v4@libcuda.so.1<cudaMalloc@libcudart.so.12")
    );
    assert!(!line(0x5EED_0A03).contains("api="));
}

/// `gpu-trace api` (issue 28 item 2): a library that came through the target's `LD_PRELOAD`
/// (read from /proc/PID/environ) is marked `preload` in its rows; one loaded as `DT_NEEDED`
/// is not.
#[test]
fn api_rows_mark_a_library_that_came_through_ld_preload() {
    let test = "api_rows_mark_a_library_that_came_through_ld_preload";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let cudart = root.join("libcudart.so.12");
    let (mut client, mut out, pid) = start_client(&root, Some(&cudart));
    let tracer = Command::new(gpu_trace_bin())
        .args(["api", "--format", "json", "--pid", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_probes(tracer.id(), per_target());
    release(&mut client, &mut out);
    // The target is gone: the tracer prints its final rows and ends by itself.
    let done = tracer.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let rows: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["final"] == true)
        .collect();
    let row = |sym: &str| {
        rows.iter()
            .find(|r| r["symbol"] == sym)
            .unwrap_or_else(|| panic!("no {sym} row in\n{text}"))
            .clone()
    };
    let malloc = row("cudaMalloc");
    assert_eq!(malloc["library"], cudart.to_str().unwrap(), "{malloc}");
    assert_eq!(malloc["preload"], true, "{malloc}");
    let init = row("cuInit");
    assert_eq!(init["calls"], 1, "{init}");
    assert_eq!(init["preload"], false, "{init}");
}

/// `gpu-trace api --cgroup` (issue 28 item 1's targets): the processes of a real cgroup v2
/// made here are traced, one moved into it after the start from the next rescan on, and one
/// outside it not at all.
#[test]
fn api_trace_follows_the_processes_of_a_cgroup() {
    let test = "api_trace_follows_the_processes_of_a_cgroup";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let Some(mount) = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .map(|f| PathBuf::from(f[1]))
    else {
        common::skipped(test, "no cgroup v2 mount");
        return;
    };
    let name = format!("gpu-trace-api-test-{}", std::process::id());
    let cgroup = mount.join(&name);
    if let Err(e) = std::fs::create_dir(&cgroup) {
        common::skipped(
            test,
            format!("cannot make a cgroup in {}: {e}", mount.display()),
        );
        return;
    }
    let enter = |pid: u32| std::fs::write(cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
    let (mut first, mut first_out, first_pid) = start_client(&root, None);
    enter(first_pid);
    let (mut outside, mut outside_out, outside_pid) = start_client(&root, None);
    let tracer = Command::new(gpu_trace_bin())
        .args(["api", "--format", "json", "--interval", "0.2", "--cgroup"])
        .arg(format!("/{name}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_probes(tracer.id(), per_target());
    let (mut late, mut late_out, late_pid) = start_client(&root, None);
    enter(late_pid);
    // The next rescan (0.2 s) attaches the late one's too.
    wait_probes(tracer.id(), 2 * per_target());
    release(&mut first, &mut first_out);
    release(&mut outside, &mut outside_out);
    release(&mut late, &mut late_out);
    let done = tracer.wait_with_output().unwrap();
    let _ = std::fs::remove_dir(&cgroup);
    let text = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let calls = |pid: u32, sym: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["final"] == true && r["pid"] == pid && r["symbol"] == sym)
            .map(|r| r["calls"].as_u64().unwrap())
            .sum()
    };
    for pid in [first_pid, late_pid] {
        assert_eq!(calls(pid, "cuInit"), 1, "{pid} in the cgroup:\n{text}");
        assert_eq!(calls(pid, "cudaMalloc"), 1, "{pid} in the cgroup:\n{text}");
    }
    assert_eq!(calls(outside_pid, "cuInit"), 0, "{text}");
}

/// `gpu-trace --api --comm NAME`: a process that takes the name after tracing started is
/// attached at the next rescan (each second), and its driver events carry its open calls.
#[test]
fn api_attaches_a_comm_process_started_after_the_trace() {
    let test = "api_attaches_a_comm_process_started_after_the_trace";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    // A name no other process has.
    let name = format!("gtjoin{}", std::process::id() % 1_000_000);
    let exe = root.join(&name);
    std::fs::copy(root.join("client"), &exe).unwrap();
    let args = [
        "--watch-device",
        "/dev/full",
        "--api",
        "--comm",
        &name,
        "--format",
        "json",
    ];
    let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
    let before = links_of(traced.pid());
    let (mut client, mut out, pid) = start_program(&exe, None);
    wait_probes(traced.pid(), before + per_target());
    release(&mut client, &mut out);
    let f = traced.interrupt();
    // Nothing had the name at start: the process was attached by a rescan.
    assert!(f.stderr.contains("--api: 0 of 0 target"), "{}", f.stderr);
    let key = format!("{pid}:0x{CLIENT:08x}:0x{:08x}", 0x5EED_0A02u32);
    let events = json_events(&f.stdout);
    let ev = events
        .iter()
        .find(|e| e["event"] == "SCHEDULE" && e["key"] == key.as_str())
        .unwrap_or_else(|| panic!("no SCHEDULE of {key} in\n{}", f.stdout));
    assert_eq!(ev["api"]["symbol"], "cuCtxCreate_v4", "{ev}");
    assert_eq!(ev["api"]["caller"]["symbol"], "cudaMalloc", "{ev}");
}

/// The calls client started with `n` calls to make; its pid.
fn start_calls_client(root: &Path, n: u32) -> (Child, BufReader<ChildStdout>, u32) {
    let mut cmd = Command::new(root.join("calls_client"));
    cmd.arg(n.to_string());
    start_command(cmd)
}

/// `gpu-trace --watch-device /dev/full --api --pid PID --format json EXTRA…` attached.
fn trace_api_of(test: &str, pid: u32, extra: &[&str]) -> Traced {
    let pid = pid.to_string();
    let args = [
        &["--watch-device", "/dev/full", "--api", "--pid", &pid][..],
        &["--format", "json"],
        extra,
    ]
    .concat();
    Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"))
}

/// `--api-calls` needs `--api`: a usage error (exit 2) that names it, before anything loads.
#[test]
fn api_calls_without_api_is_a_usage_error() {
    let out = Command::new(gpu_trace_bin())
        .args(["--api-calls", "--pid", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--api"), "{err}");
}

/// How many times each API function the calls client called, as it counted them itself
/// (`calls cuInit=N cudaMalloc=M`), once it has made its calls and ended.
fn release_counting(client: &mut Child, out: &mut BufReader<ChildStdout>) -> (usize, usize) {
    writeln!(client.stdin.take().unwrap(), "go").unwrap();
    let mut counts = String::new();
    out.read_line(&mut counts).unwrap();
    let count = |name: &str| -> usize {
        counts
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {counts:?}"))
            .parse()
            .unwrap()
    };
    let made = (count("cuInit"), count("cudaMalloc"));
    let mut done = String::new();
    out.read_line(&mut done).unwrap();
    assert_eq!(done.trim(), "done");
    assert!(client.wait().unwrap().success());
    made
}

/// The final `STATS` line's `malformed`.
fn malformed(stdout: &str) -> u64 {
    stdout
        .lines()
        .filter(|l| l.starts_with("{\"event\":\"STATS\""))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["final"] == true)
        .unwrap_or_else(|| panic!("no final STATS line in\n{stdout}"))["malformed"]
        .as_u64()
        .unwrap()
}

/// A JSON event without its wall-clock `time` (a replay may convert the clock differently).
fn without_time(mut v: serde_json::Value) -> serde_json::Value {
    v.as_object_mut().unwrap().remove("time");
    v
}

/// Perfetto's `ts`/`dur` (µs with three decimals) in ns.
fn ns(v: &serde_json::Value) -> u64 {
    (v.as_f64().unwrap() * 1000.0).round() as u64
}

/// `gpu-trace --api --api-calls` (issue 28 items 2 and 6): one `API_CALL` per completed call,
/// as many per symbol as the client made (it counts its own calls), each named, with its
/// caller; the driver events of the calls carry them and fall inside their time; a replay of
/// the recording prints the same API lines (names from its `API_SYMBOL` records); and the
/// Perfetto timeline has the calls as slices on the thread's track, well nested, with the
/// driver events inside them.
#[test]
fn api_calls_are_one_line_per_call_live_replayed_and_in_perfetto() {
    let test = "api_calls_are_one_line_per_call_live_replayed_and_in_perfetto";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let (mut client, mut out, pid) = start_calls_client(&root, 5);
    let rec = root.join("calls.gtrace");
    let timeline = root.join("calls.json");
    let extra = [
        "--api-calls",
        "--record",
        rec.to_str().unwrap(),
        "--perfetto",
        timeline.to_str().unwrap(),
    ];
    let traced = trace_api_of(test, pid, &extra);
    let (inits, mallocs) = release_counting(&mut client, &mut out);
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert_eq!(malformed(&f.stdout), 0, "{}", f.stdout);

    let events = json_events(&f.stdout);
    let calls: Vec<_> = events.iter().filter(|e| e["event"] == "API_CALL").collect();
    let of = |sym: &str| -> Vec<&serde_json::Value> {
        calls
            .iter()
            .copied()
            .filter(|c| c["symbol"] == sym)
            .collect()
    };
    // The stand-in cudaMalloc creates one context per call.
    for (sym, made) in [
        ("cuInit", inits),
        ("cudaMalloc", mallocs),
        ("cuCtxCreate_v4", mallocs),
    ] {
        assert_eq!(of(sym).len(), made, "{sym} calls in\n{}", f.stdout);
    }
    assert_eq!(calls.len(), inits + 2 * mallocs, "{}", f.stdout);
    for c in &calls {
        assert_eq!(
            (c["pid"] == pid, c["tid"] == pid, c["ret"] == 0),
            (true, true, true)
        );
    }
    let ctx = of("cuCtxCreate_v4");
    for c in &ctx {
        assert_eq!(c["library"], "libcuda.so.1", "{c}");
        assert_eq!(c["depth"], 1, "{c}");
        assert_eq!(
            c["caller"],
            serde_json::json!({"symbol": "cudaMalloc", "library": "libcudart.so.12"}),
            "{c}"
        );
    }
    for c in of("cuInit").iter().chain(&of("cudaMalloc")) {
        assert_eq!(c["depth"], 0, "{c}");
        assert!(c.get("caller").is_none(), "{c}");
    }
    // Each SCHEDULE made in cuCtxCreate_v4 carries it and lies inside one of its calls.
    let key = format!("{pid}:0x{CLIENT:08x}:0x{:08x}", 0x5EED_0A02u32);
    let schedules: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "SCHEDULE" && e["key"] == key.as_str())
        .collect();
    assert_eq!(schedules.len(), mallocs, "{}", f.stdout);
    for s in &schedules {
        assert_eq!(s["api"]["symbol"], "cuCtxCreate_v4", "{s}");
        let t = s["ts_ns"].as_u64().unwrap();
        let inside = ctx.iter().any(|c| {
            let end = c["ts_ns"].as_u64().unwrap();
            end - c["duration_ns"].as_u64().unwrap() <= t && t <= end
        });
        assert!(inside, "{s} is inside no cuCtxCreate_v4 call");
    }

    // The replay prints the same API lines, named from the recording alone.
    let replayed = Command::new(gpu_trace_bin())
        .args(["replay", "--format", "json"])
        .arg(&rec)
        .output()
        .unwrap();
    let replayed = String::from_utf8_lossy(&replayed.stdout);
    let api_lines = |events: &[serde_json::Value]| -> Vec<serde_json::Value> {
        events
            .iter()
            .filter(|e| e["event"] == "API_CALL")
            .map(|e| without_time(e.clone()))
            .collect()
    };
    assert_eq!(
        api_lines(&json_events(&replayed)),
        api_lines(&events),
        "{replayed}"
    );
    let text = Command::new(gpu_trace_bin())
        .arg("replay")
        .arg(&rec)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let lines: Vec<_> = text.lines().filter(|l| l.contains(" API_CALL ")).collect();
    assert_eq!(lines.len(), calls.len(), "{text}");
    assert!(
        lines.iter().any(|l| l.contains(&format!(
            " PID={pid:<6} calls_client     tid={pid} cuCtxCreate_v4@libcuda.so.1 = 0 <"
        )) && l.ends_with(" depth=1 caller=cudaMalloc@libcudart.so.12")),
        "{text}"
    );

    perfetto_nests_the_calls(&std::fs::read_to_string(&timeline).unwrap(), pid, &calls);
}

/// The timeline's slices on thread `pid`'s own track: one per call, named after its symbol,
/// well nested (each slice inside the one open when it begins), and each driver event drawn
/// there inside the slice of the call it names.
fn perfetto_nests_the_calls(text: &str, pid: u32, calls: &[&serde_json::Value]) {
    let doc: serde_json::Value = serde_json::from_str(text).unwrap();
    let on_thread: Vec<&serde_json::Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["pid"] == pid && e["tid"] == pid && e["ph"] != "M")
        .collect();
    let mut slices: Vec<(u64, u64, String)> = on_thread
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let begin = ns(&e["ts"]);
            (
                begin,
                begin + ns(&e["dur"]),
                e["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(slices.len(), calls.len(), "{text}");
    for sym in ["cuInit", "cudaMalloc", "cuCtxCreate_v4"] {
        let drawn = slices.iter().filter(|s| s.2 == sym).count();
        let made = calls.iter().filter(|c| c["symbol"] == sym).count();
        assert_eq!(drawn, made, "{sym} slices in\n{text}");
    }
    // As Perfetto's importer stacks them: by begin, the longer first on a tie.
    slices.sort_by_key(|s| (s.0, std::cmp::Reverse(s.1)));
    let mut open: Vec<&(u64, u64, String)> = Vec::new();
    for s in &slices {
        while open.last().is_some_and(|o| o.1 <= s.0) {
            open.pop();
        }
        if let Some(o) = open.last() {
            assert!(s.1 <= o.1, "{s:?} overlaps {o:?} without nesting in it");
            assert_eq!(
                (o.2.as_str(), s.2.as_str()),
                ("cudaMalloc", "cuCtxCreate_v4")
            );
        }
        open.push(s);
    }
    let instants: Vec<_> = on_thread.iter().filter(|e| e["ph"] == "i").collect();
    assert!(
        !instants.is_empty(),
        "no driver event on the thread's track"
    );
    for i in instants {
        assert_eq!(i["s"], "t", "{i}");
        let t = ns(&i["ts"]);
        let innermost = slices
            .iter()
            .filter(|s| s.0 <= t && t <= s.1)
            .min_by_key(|s| s.1 - s.0)
            .unwrap_or_else(|| panic!("{i} is inside no call's slice"));
        assert_eq!(
            innermost.2,
            i["args"]["api"]["symbol"].as_str().unwrap(),
            "{i}"
        );
    }
}

/// The seed's broken interposer (issue 28 item 3) in the main trace: a `cuInit` that finds
/// itself through `RTLD_DEFAULT` and re-enters, two calls three levels deep, is reported as
/// one `API_RECURSION` (once per thread and symbol) with `--api` alone, which prints no
/// `API_CALL`; nothing counts as malformed.
#[test]
fn a_recursing_cuinit_is_one_api_recursion_in_the_main_trace() {
    let test = "a_recursing_cuinit_is_one_api_recursion_in_the_main_trace";
    let Some((_dir, root)) = build_with(test, &["-DRECURSE=3"]) else {
        return;
    };
    let (mut client, mut out, pid) = start_calls_client(&root, 2);
    let traced = trace_api_of(test, pid, &[]);
    release_counting(&mut client, &mut out);
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert_eq!(malformed(&f.stdout), 0, "{}", f.stdout);
    let events = json_events(&f.stdout);
    let recursions: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "API_RECURSION")
        .collect();
    assert_eq!(recursions.len(), 1, "{}", f.stdout);
    let r = recursions[0];
    assert_eq!((r["pid"] == pid, r["tid"] == pid), (true, true), "{r}");
    assert_eq!(
        (&r["symbol"], &r["library"], &r["why"], &r["depth"]),
        (
            &serde_json::json!("cuInit"),
            &serde_json::json!("libcuda.so.1"),
            &serde_json::json!("re-entered"),
            &serde_json::json!(2)
        ),
        "{r}"
    );
    assert_eq!(
        r["chain"],
        serde_json::json!([{"symbol": "cuInit", "library": "libcuda.so.1"}]),
        "{r}"
    );
    assert!(
        !events.iter().any(|e| e["event"] == "API_CALL"),
        "API_CALL without --api-calls:\n{}",
        f.stdout
    );
}
