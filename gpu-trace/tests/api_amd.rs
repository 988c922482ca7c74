//! `gpu-trace --vendor amd --api` (issue 28 item 6 on AMD): a KFD call made inside a traced
//! API call carries it, as NVIDIA's do. A stand-in `libamdhip64.so.5` (tests/api/fake_hip.c)
//! whose `hipStreamCreate` issues a KFD-shaped `CREATE_QUEUE` on /dev/null, watched as if it
//! were /dev/kfd (the call fails with ENOTTY: a refused SCHEDULE, the KFD path's only event
//! without an amdgpu driver), and a client (tests/api/hip_client.c) that calls it at once and
//! then makes the same ioctl outside any API call. Real binary, real uprobes, the real
//! syscall-layer programs.
//!
//! Without root, uprobes or a C compiler, the test prints `SKIPPED: <why>`.

use std::process::Command;

mod api_support;
mod common;
mod rel_support;
use api_support::{c_compiler, cc, uprobes};
use rel_support::{gpu_trace_bin, json_events};

#[test]
fn amd_events_carry_the_api_call_open_on_their_thread() {
    let test = "amd_events_carry_the_api_call_open_on_their_thread";
    if !uprobes(test) || !c_compiler(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    cc(
        &root,
        "fake_hip.c",
        "libamdhip64.so.5",
        &["-shared", "-fPIC"],
    );
    let lib_dir = format!("-L{}", root.display());
    let rpath = format!("-Wl,-rpath,{}", root.display());
    let client = cc(
        &root,
        "hip_client.c",
        "client",
        &[&lib_dir, "-l:libamdhip64.so.5", &rpath],
    );
    let out = Command::new(gpu_trace_bin())
        .args(["--vendor", "amd", "--watch-device", "/dev/null", "--api"])
        .args(["--format", "json", "--"])
        .arg(&client)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let schedules: Vec<_> = json_events(&stdout)
        .into_iter()
        .filter(|e| e["event"] == "SCHEDULE" && e["comm"] == "client")
        .collect();
    assert_eq!(schedules.len(), 2, "{stdout}\n{stderr}");
    for s in &schedules {
        assert_eq!(s["errno_name"], "ENOTTY", "{s}");
    }
    assert_eq!(
        schedules[0]["api"],
        serde_json::json!({"symbol": "hipStreamCreate", "library": "libamdhip64.so.5", "depth": 1}),
        "{stdout}"
    );
    assert!(schedules[1].get("api").is_none(), "{stdout}");
}
