//! `gpu-trace --api -- CMD` (issue 28 items 1 and 6): the command is traced from its first
//! call, and the processes it creates are targets too. The command is tests/api/launch_client.c
//! linked (DT_NEEDED, RPATH) to the stand-in `libcuda.so.1`/`libcudart.so.12` of
//! tests/api_join.rs, whose calls issue RM-shaped `GPFIFO_SCHEDULE` controls on the watched
//! device (/dev/full). The client calls at once: only probes attached before its exec see
//! them. Started by a shell that forks it, it is found among the command's processes at a
//! rescan (it then waits until its probes are in before it calls). Without targets `--api` is
//! a usage error.
//!
//! Without root, uprobes or a C compiler, the tests print `SKIPPED: <why>`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod api_support;
mod common;
mod rel_support;
use rel_support::{gpu_trace_bin, json_events};

const CLIENT: u32 = 0x5EED_0A00;

/// The stand-in libraries and the client in a new directory (and its canonical path).
fn build(test: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    api_support::fake_cuda(test, &[], &[("launch_client.c", "client")])
}

/// Runs `gpu-trace --watch-device /dev/full --api --format json -- command…` to its end; the
/// `api` object of each of the client's three SCHEDULEs (`Null` where none), and stderr.
/// `go`: a file created once the tracer holds `links` probes (the client waits for it).
fn traced(command: &[&str], go: Option<(&Path, usize)>) -> ([serde_json::Value; 3], String) {
    let mut tracer = Command::new(gpu_trace_bin())
        .args([
            "--watch-device",
            "/dev/full",
            "--api",
            "--format",
            "json",
            "--",
        ])
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some((go, links)) = go {
        // As api_support::wait_links, but a run that never gets there shows its stderr (what
        // it attached, and whether it followed the command's processes).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let held = api_support::bpf_links(tracer.id());
            if held == links {
                break;
            }
            if held > links || std::time::Instant::now() > deadline {
                let _ = tracer.kill();
                let out = tracer.wait_with_output().unwrap();
                panic!(
                    "gpu-trace holds {held} probes, not {links}:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::fs::write(go, "").unwrap();
    }
    let out = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let events = json_events(&stdout);
    let api = |object: u32| {
        let suffix = format!(":0x{CLIENT:08x}:0x{object:08x}");
        let found: Vec<_> = events
            .iter()
            .filter(|e| {
                e["event"] == "SCHEDULE" && e["key"].as_str().is_some_and(|k| k.ends_with(&suffix))
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one SCHEDULE of {suffix} in\n{stdout}\n{stderr}"
        );
        found[0].get("api").cloned().unwrap_or_default()
    };
    (
        [api(0x5EED_0A01), api(0x5EED_0A02), api(0x5EED_0A03)],
        stderr,
    )
}

fn expected() -> [serde_json::Value; 3] {
    [
        serde_json::json!({"symbol": "cuInit", "library": "libcuda.so.1", "depth": 1}),
        serde_json::json!({
            "symbol": "cuCtxCreate_v4", "library": "libcuda.so.1", "depth": 2,
            "caller": {"symbol": "cudaMalloc", "library": "libcudart.so.12"}
        }),
        serde_json::Value::Null,
    ]
}

/// The command's first calls, made before any rescan could attach, carry their API call:
/// the probes of its start-up libraries went on before its exec.
#[test]
fn api_tags_a_launched_commands_first_calls() {
    let test = "api_tags_a_launched_commands_first_calls";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let client = root.join("client");
    let (api, stderr) = traced(&[client.to_str().unwrap()], None);
    assert_eq!(api, expected(), "{stderr}");
    assert!(
        stderr.contains("symbols of the command's start-up libraries before its exec"),
        "{stderr}"
    );
}

/// A process the command creates (the shell forks the client, which calls once the tracer
/// holds its probes: the shell's and the client's, `api_support::probes_per_client`) is
/// attached at a rescan: its calls carry their API call too.
#[test]
fn api_follows_the_processes_a_launched_command_creates() {
    let test = "api_follows_the_processes_a_launched_command_creates";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let go = root.join("go");
    let script = format!("{} {}; true", root.join("client").display(), go.display());
    // The shell's: its dynamic linker's probe and its libc's lookups.
    let links = 1 + api_support::libc_lookups() + api_support::probes_per_client();
    let (api, stderr) = traced(&["sh", "-c", &script], Some((&go, links)));
    assert_eq!(api, expected(), "{stderr}");
}

/// `--api` without `--pid`, `--comm` or `-- CMD` says what to give, with the usage exit
/// status, before loading anything.
#[test]
fn api_without_targets_is_a_usage_error() {
    let out = Command::new(gpu_trace_bin())
        .args(["--watch-device", "/dev/full", "--api"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--api needs --pid, --comm or `-- CMD`"),
        "{stderr}"
    );
}
