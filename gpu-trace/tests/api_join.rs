//! `gpu-trace --api` (issue 28 item 6): driver events carry the API call open on their thread,
//! through the real binary, real uprobes and the real syscall-layer programs. A stand-in
//! `libcuda.so.1` (tests/api/fake_cuda.c) whose `cuInit` and `cuCtxCreate_v4` issue RM-shaped
//! `GPFIFO_SCHEDULE` controls on the watched device (/dev/full), a stand-in `libcudart.so.12`
//! (tests/api/fake_cudart.c) whose `cudaMalloc` calls `cuCtxCreate_v4`, and a client
//! (tests/api/join_client.c) that makes one driver call in each and one outside any API call.
//! Expected: the first SCHEDULE inside `cuInit`, the second inside `cuCtxCreate_v4` from
//! `cudaMalloc`, the third with no `api`; the recording replays the same in text.
//!
//! Without root, uprobes or a C compiler, the test prints `SKIPPED: <why>`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
mod rel_support;
use common::skipped;
use rel_support::{Traced, gpu_trace_bin, json_events};

const CLIENT: u32 = 0x5EED_0A00;

#[test]
fn driver_events_carry_the_api_call_open_on_their_thread() {
    let test = "driver_events_carry_the_api_call_open_on_their_thread";
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        skipped(test, "needs root (uprobes and BPF programs)");
        return;
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe").exists() {
        skipped(test, "the kernel has no uprobe PMU (CONFIG_UPROBE_EVENTS)");
        return;
    }
    if Command::new("cc").arg("--version").output().is_err() {
        skipped(test, "no C compiler (cc)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api");
    let cc = |args: &[&str]| {
        let st = Command::new("cc").current_dir(&root).args(args).status();
        assert!(st.unwrap().success(), "cc {args:?}");
    };
    let c = |f: &str| src.join(f).to_string_lossy().into_owned();
    let rpath = format!("-Wl,-rpath,{}", root.display());
    cc(&["-shared", "-fPIC", "-o", "libcuda.so.1", &c("fake_cuda.c")]);
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        "libcudart.so.12",
        &c("fake_cudart.c"),
        "-L.",
        "-l:libcuda.so.1",
    ]);
    cc(&[
        "-o",
        "client",
        &c("join_client.c"),
        "-L.",
        "-l:libcuda.so.1",
        "-l:libcudart.so.12",
        &rpath,
    ]);

    let mut client = Command::new(root.join("client"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(client.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let pid: u32 = first.trim().strip_prefix("pid=").unwrap().parse().unwrap();
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
    writeln!(client.stdin.take().unwrap(), "go").unwrap();
    let mut done = String::new();
    out.read_line(&mut done).unwrap();
    assert_eq!(done.trim(), "done");
    assert!(client.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(300));
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
