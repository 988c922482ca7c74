//! The API layer's counts are exact whatever the calls do (issue 37): a recursion past the
//! kernel's 64 nested return probes, an indirect recursion, a call left by `longjmp`, a
//! thread attached while it is inside a call loop. A stand-in `libcuda.so.1`
//! (tests/api/exact_cuda.c) counts its own entries; the client (tests/api/exact_client.c)
//! prints those counts at its end: they are the oracle, never gpu-trace's own output.
//!
//! A call is counted at its entry and timed when its return is matched to it by the stack
//! pointer; the default `--max-depth` keeps 16 frames per thread, so in a recursion N deep
//! the calls past the 16th are counted untimed: `untimed` is knowable exactly.
//!
//! Without root, the uprobe PMU or a C compiler the tests print `SKIPPED: <why>` and return.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

mod api_support;
mod common;
use api_support::{c_compiler, cc, uprobes};

/// The frames `gpu-trace api` keeps per thread by default (`--max-depth`).
const KEPT: u64 = 16;

/// The stand-in library and the client built in a new directory.
fn build(test: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    if !uprobes(test) || !c_compiler(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    cc(
        &root,
        "exact_cuda.c",
        "libcuda.so.1",
        &["-shared", "-fPIC", "-ldl"],
    );
    let lib_dir = format!("-L{}", root.display());
    let rpath = format!("-Wl,-rpath,{}", root.display());
    let client = cc(
        &root,
        "exact_client.c",
        "client",
        &[&lib_dir, "-l:libcuda.so.1", &rpath],
    );
    Some((dir, client))
}

/// `NAME=N` fields of the client's "calls …" line.
fn client_counts(out: &str) -> HashMap<String, u64> {
    let line = out
        .lines()
        .find(|l| l.starts_with("calls "))
        .unwrap_or_else(|| panic!("no client line in {out}"));
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// The final API_STATS rows of `lib`, by symbol; and the API_RECURSION records.
fn final_rows(out: &str, lib: &Path) -> (HashMap<String, Value>, Vec<Value>) {
    let mut rows = HashMap::new();
    let mut recursions = Vec::new();
    for v in out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
    {
        if v["event"] == "API_STATS" && v["final"] == true && v["library"] == lib.to_str().unwrap()
        {
            rows.insert(v["symbol"].as_str().unwrap().to_string(), v);
        } else if v["event"] == "API_RECURSION" {
            recursions.push(v);
        }
    }
    (rows, recursions)
}

/// `gpu-trace api --format json -- client ARGS`: its stdout (the client's line included).
fn traced(client: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--"])
        .arg(client)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Each symbol's `calls` equals the client's own count (a symbol the client never called has
/// no row), and its `untimed` the count `untimed` gives.
fn assert_exact(out: &str, lib: &Path, untimed: &[(&str, u64)]) {
    let truth = client_counts(out);
    let (rows, _) = final_rows(out, lib);
    for (symbol, calls) in &truth {
        let got = rows.get(symbol).map_or(0, |r| r["calls"].as_u64().unwrap());
        assert_eq!(
            got, *calls,
            "{symbol}: gpu-trace {got}, the client {calls}\n{out}"
        );
    }
    for (symbol, want) in untimed {
        let row = &rows[*symbol];
        assert_eq!(
            row["untimed"].as_u64(),
            Some(*want),
            "{symbol} untimed: {row}"
        );
    }
}

fn lib_of(client: &Path) -> PathBuf {
    client.with_file_name("libcuda.so.1")
}

#[test]
fn a_recursion_64_deep_100_times_then_1000_calls_are_all_counted() {
    let test = "a_recursion_64_deep_100_times_then_1000_calls_are_all_counted";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    let out = traced(&client, &["recurse", "64", "100", "1000"]);
    let truth = client_counts(&out);
    assert_eq!(truth["cuMemAlloc_v2"], 6400, "the client's own count");
    // Past the 16 kept frames, 48 of each 64 are counted untimed; every launch is timed.
    assert_exact(
        &out,
        &lib_of(&client),
        &[("cuMemAlloc_v2", 100 * (64 - KEPT)), ("cuLaunchKernel", 0)],
    );
    let (_, recursions) = final_rows(&out, &lib_of(&client));
    let re_entered = recursions
        .iter()
        .filter(|r| r["symbol"] == "cuMemAlloc_v2" && r["why"] == "re-entered")
        .count();
    assert_eq!(
        re_entered, 1,
        "reported once per (thread, symbol): {recursions:?}"
    );
}

#[test]
fn a_recursion_1000_deep_then_1000_calls_are_all_counted() {
    let test = "a_recursion_1000_deep_then_1000_calls_are_all_counted";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    let out = traced(&client, &["recurse", "1000", "1", "1000"]);
    assert_eq!(client_counts(&out)["cuMemAlloc_v2"], 1000);
    assert_exact(
        &out,
        &lib_of(&client),
        &[("cuMemAlloc_v2", 1000 - KEPT), ("cuLaunchKernel", 0)],
    );
}

#[test]
fn an_indirect_recursion_is_reported_and_counted() {
    let test = "an_indirect_recursion_is_reported_and_counted";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    let out = traced(&client, &["indirect", "100", "1000"]);
    // Each cuCtxSynchronize → cuStreamSynchronize → cuCtxSynchronize: 200 and 100.
    assert_exact(
        &out,
        &lib_of(&client),
        &[
            ("cuCtxSynchronize", 0),
            ("cuStreamSynchronize", 0),
            ("cuLaunchKernel", 0),
        ],
    );
    let (_, recursions) = final_rows(&out, &lib_of(&client));
    assert!(
        recursions
            .iter()
            .any(|r| r["symbol"] == "cuCtxSynchronize" && r["why"] == "re-entered"),
        "A → B → A is a re-entry of A: {recursions:?}"
    );
}

#[test]
fn calls_left_by_longjmp_are_counted_and_later_calls_are_exact() {
    let test = "calls_left_by_longjmp_are_counted_and_later_calls_are_exact";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    let out = traced(&client, &["longjmp", "100", "1000"]);
    // The 100 calls never return: counted, untimed; the launches after them all timed.
    assert_exact(
        &out,
        &lib_of(&client),
        &[("cuMemcpyHtoD_v2", 100), ("cuLaunchKernel", 0)],
    );
}

#[test]
fn attaching_to_a_thread_inside_a_call_loop_counts_every_later_call() {
    let test = "attaching_to_a_thread_inside_a_call_loop_counts_every_later_call";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    let mut target = Command::new(&client)
        .args(["loop", "1000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target_out = BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    target_out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = target.id();
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--interval", "20ms"])
        .args(["--pid", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Attached and counting (a read shows launches made inside the loop the client was in
    // all along: waiting for it, not for time, so a loaded machine cannot leave the window
    // empty): then the client stops looping and makes its 1000 allocations.
    let mut out = BufReader::new(tracer.stdout.take().unwrap());
    let mut stdout = String::new();
    loop {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "tracer ended: {stdout}");
        stdout += &l;
        if l.contains("\"symbol\":\"cuLaunchKernel\"") {
            break;
        }
    }
    // SAFETY: our own child.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let mut rest = String::new();
    target_out.read_to_string(&mut rest).unwrap();
    assert!(target.wait().unwrap().success());
    out.read_to_string(&mut stdout).unwrap();
    assert!(tracer.wait().unwrap().success());
    let (rows, recursions) = final_rows(&stdout, &lib_of(&client));
    let truth = client_counts(&rest);
    assert_eq!(truth["cuMemAlloc_v2"], 1000);
    assert_eq!(
        rows["cuMemAlloc_v2"]["calls"].as_u64(),
        Some(1000),
        "every call after the attach: {stdout}"
    );
    assert_eq!(rows["cuMemAlloc_v2"]["untimed"].as_u64(), Some(0));
    let launches = rows["cuLaunchKernel"]["calls"].as_u64().unwrap();
    assert!(
        launches > 0 && launches <= truth["cuLaunchKernel"],
        "launches after the attach, at most the client's {}: {launches}",
        truth["cuLaunchKernel"]
    );
    assert!(
        recursions.is_empty(),
        "no false API_RECURSION: {recursions:?}"
    );
}

/// `dlopen_client HIP 0 1000`: loads the HIP runtime after start and calls `hipInit` 1000
/// times at once; `(process, the client's own count, gpu-trace's final hipInit calls)`.
/// `wrapped`: the command is a script that `exec`s the client through `/usr/bin/env sh`
/// (a version manager's shim, e.g. pyenv's `python3`: three programs in one process).
fn dlopen_at_once(test: &str, main_trace: bool, wrapped: bool) -> Option<(u64, u64)> {
    if !uprobes(test) {
        return None;
    }
    let (hip, _dir, root) = api_support::toolchain(test)?;
    let mut client = cc(&root, "dlopen_client.c", "dlopen_client", &["-ldl"]);
    if wrapped {
        let shim = root.join("shim");
        let script = format!("#!/usr/bin/env sh\nexec {} \"$@\"\n", client.display());
        std::fs::write(&shim, script).unwrap();
        std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        client = shim;
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-trace"));
    if main_trace {
        cmd.args(["--api", "--format", "json", "--"]);
    } else {
        cmd.args(["api", "--format", "json", "--"]);
    }
    let out = cmd
        .arg(&client)
        .arg(&hip)
        .args(["0", "1000"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("client "))
        .unwrap_or_else(|| panic!("no client line: {stdout}{stderr}"));
    let own: u64 = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("hipInit="))
        .unwrap()
        .parse()
        .unwrap();
    // The last API_STATS of hipInit in the runtime (the final read comes last).
    let got = stdout
        .lines()
        .rev()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| {
            v["event"] == "API_STATS"
                && v["symbol"] == "hipInit"
                && v["library"]
                    .as_str()
                    .is_some_and(|l| l.contains("libamdhip64"))
        })
        .map_or(0, |v| v["calls"].as_u64().unwrap());
    Some((own, got))
}

#[test]
fn a_library_dlopened_and_called_at_once_is_counted_from_its_first_call() {
    let test = "a_library_dlopened_and_called_at_once_is_counted_from_its_first_call";
    if let Some((own, got)) = dlopen_at_once(test, false, false) {
        assert_eq!(own, 1000);
        assert_eq!(got, own, "gpu-trace api -- CMD");
    }
}

#[test]
fn the_main_trace_counts_a_library_dlopened_and_called_at_once() {
    let test = "the_main_trace_counts_a_library_dlopened_and_called_at_once";
    if let Some((own, got)) = dlopen_at_once(test, true, false) {
        assert_eq!(own, 1000);
        assert_eq!(got, own, "gpu-trace --api -- CMD");
    }
}

/// The command is a wrapper script (`#!/usr/bin/env sh` that `exec`s the client): the dynamic
/// linker is found through the interpreters, and the client's first call is counted.
#[test]
fn a_command_behind_a_wrapper_script_is_counted_from_its_first_call() {
    let test = "a_command_behind_a_wrapper_script_is_counted_from_its_first_call";
    if let Some((own, got)) = dlopen_at_once(test, false, true) {
        assert_eq!(own, 1000);
        assert_eq!(got, own, "gpu-trace api -- SCRIPT");
    }
}

#[test]
fn calls_that_fail_are_counted_as_errors_end_to_end() {
    let test = "calls_that_fail_are_counted_as_errors_end_to_end";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    let out = traced(&client, &["errors", "700", "300"]);
    // The client's own count of the calls that returned non-zero.
    let failed: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("failed="))
        .expect("the client's failed= line")
        .parse()
        .unwrap();
    assert_eq!(failed, 300);
    assert_exact(&out, &lib_of(&client), &[("cuLaunchKernel", 0)]);
    let (rows, _) = final_rows(&out, &lib_of(&client));
    assert_eq!(
        rows["cuLaunchKernel"]["errors"].as_u64(),
        Some(failed),
        "{out}"
    );
}

/// A library of `n` table symbols (`cuMemcpy0` … `cuMemcpy{n-1}`, matched by `cuMemcpy*`) and a
/// client that calls each `times` times, printing `calls=N` (its own count).
fn wide_library(root: &Path, n: usize) -> PathBuf {
    let mut lib = String::from("static long calls;\nlong gt_wide_calls(void) { return calls; }\n");
    let mut client =
        String::from("#include <stdio.h>\n#include <stdlib.h>\nlong gt_wide_calls(void);\n");
    let mut body = String::new();
    for i in 0..n {
        lib += &format!("int cuMemcpy{i}(void) {{ calls++; return 0; }}\n");
        client += &format!("int cuMemcpy{i}(void);\n");
        body += &format!("        cuMemcpy{i}();\n");
    }
    client += &format!(
        "int main(int argc, char **argv) {{\n    for (long t = 0; t < atol(argv[1]); t++) {{\n{body}    }}\n    printf(\"calls=%ld\\n\", gt_wide_calls());\n    return 0;\n}}\n"
    );
    std::fs::write(root.join("wide.c"), lib).unwrap();
    std::fs::write(root.join("wide_client.c"), client).unwrap();
    let run = |args: &[&str]| {
        let ok = Command::new("cc").args(args).status().unwrap().success();
        assert!(ok, "cc {args:?}");
    };
    let dir = root.display().to_string();
    run(&[
        "-shared",
        "-fPIC",
        "-o",
        &format!("{dir}/libcuda.so.1"),
        &format!("{dir}/wide.c"),
    ]);
    let bin = root.join("wide_client");
    run(&[
        "-o",
        bin.to_str().unwrap(),
        &format!("{dir}/wide_client.c"),
        &format!("-L{dir}"),
        "-l:libcuda.so.1",
        &format!("-Wl,-rpath,{dir}"),
    ]);
    bin
}

/// The attach method a run of this kernel takes by default: batched links from Linux 6.10
/// (read from `uname -r` here, not from gpu-trace).
fn batched_expected() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut nums = release
        .trim()
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    (nums.next().unwrap(), nums.next().unwrap()) >= (6, 10)
}

/// Two runs of `wide_library`'s 100 symbols (200 probes), the second started as soon as the
/// first ended; each exact. `method`: `GPU_TRACE_UPROBE_ATTACH`; the run says which method it
/// used, and the links it held during the run were of that kind.
fn two_runs(test: &str, method: Option<&str>) {
    if !uprobes(test) || !c_compiler(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let client = wide_library(&root, 100);
    let batched = method != Some("per-probe") && batched_expected();
    for run in ["first", "second"] {
        // The second starts as soon as the first has ended.
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-trace"));
        if let Some(m) = method {
            cmd.env("GPU_TRACE_UPROBE_ATTACH", m);
        }
        let out = cmd
            .args(["api", "--format", "json", "--"])
            .arg(&client)
            .arg("10")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        let said = if batched {
            ": batched uprobe links (one per process, library and direction)"
        } else {
            ": one perf-event uprobe per symbol ("
        };
        assert!(stderr.contains(said), "{run}: {said:?} in {stderr}");
        let own: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("calls="))
            .expect("the client's line")
            .parse()
            .unwrap();
        assert_eq!(own, 1000);
        let (rows, _) = final_rows(&out, &lib_of(&client));
        assert_eq!(rows.len(), 100, "{run}: a row per symbol: {out}");
        let total: u64 = rows.values().map(|r| r["calls"].as_u64().unwrap()).sum();
        assert_eq!(total, own, "{run} run");
        assert!(rows.values().all(|r| r["calls"] == 10), "{run}: {out}");
    }
}

#[test]
fn two_runs_of_200_probes_back_to_back_are_both_exact() {
    two_runs("two_runs_of_200_probes_back_to_back_are_both_exact", None);
}

/// The fallback below Linux 6.10 (or where the kernel refuses batched links), chosen here by
/// the environment: as exact.
#[test]
fn two_runs_of_200_per_probe_uprobes_are_both_exact() {
    two_runs(
        "two_runs_of_200_per_probe_uprobes_are_both_exact",
        Some("per-probe"),
    );
}

/// The kernel's sums hold `--api-sums` (process, symbol) pairs: a run with more at once counts
/// the calls past it as not counted and says how many, so the table's calls and the warning's
/// add up to the client's own count (nothing lost silently). 20 symbols × 10 calls in one
/// process, sums of 8.
#[test]
fn calls_past_a_full_sums_map_are_counted_as_not_counted() {
    let test = "calls_past_a_full_sums_map_are_counted_as_not_counted";
    if !uprobes(test) || !c_compiler(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let client = wide_library(&root, 20);
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--api-sums", "8", "--"])
        .arg(&client)
        .arg("10")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stderr}");
    let own: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("calls="))
        .expect("the client's line")
        .parse()
        .unwrap();
    assert_eq!(own, 200);
    let (rows, _) = final_rows(&stdout, &lib_of(&client));
    let counted: u64 = rows.values().map(|r| r["calls"].as_u64().unwrap()).sum();
    // At most 8 pairs: the other 12 symbols' calls are not in the table.
    assert!(rows.len() <= 8, "{stdout}");
    let said: u64 = stderr
        .lines()
        .find_map(|l| l.split("warning: ").nth(1)?.strip_suffix_with_calls())
        .unwrap_or_else(|| panic!("no warning of calls not counted: {stderr}"));
    assert_eq!(counted + said, own, "{stdout}{stderr}");
    assert!(said >= 120, "12 symbols × 10 calls at least: {said}");
}

/// `N API calls were not counted` → N.
trait NotCounted {
    fn strip_suffix_with_calls(&self) -> Option<u64>;
}

impl NotCounted for str {
    fn strip_suffix_with_calls(&self) -> Option<u64> {
        let (n, rest) = self.split_once(' ')?;
        rest.starts_with("API calls were not counted")
            .then(|| n.parse().ok())
            .flatten()
    }
}

/// Once the kernel's sums are half full, the entries of processes that ended move out of the
/// kernel after they were read, and every later process is counted exactly: four clients
/// traced by `--pid`, each let go by the test only once a read began after the previous one
/// exited; `--api-sums 2` (one pair each: without the move, the third and the fourth would
/// find it full).
#[test]
fn ended_processes_sums_leave_room_for_later_ones() {
    use std::io::Write as _;
    let test = "ended_processes_sums_leave_room_for_later_ones";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    // Each client waits for a line on stdin (GT_WAIT), makes 5 cuLaunchKernel calls (3 that
    // succeed, 2 that fail) and prints its own count.
    let mut clients: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&client)
                .args(["errors", "3", "2"])
                .env("GT_WAIT", "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-trace"));
    cmd.args(["api", "--api-sums", "2", "--interval", "20ms"]);
    for c in &clients {
        cmd.args(["--pid", &c.id().to_string()]);
    }
    let mut tracer = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(tracer.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("uprobes attached") {
        said.clear();
        assert!(err.read_line(&mut said).unwrap() > 0, "gpu-trace ended");
    }
    let mut lines = BufReader::new(tracer.stdout.take().unwrap()).lines();
    let mut own = Vec::new();
    let last = clients.len() - 1;
    for (i, c) in clients.iter_mut().enumerate() {
        writeln!(c.stdin.take().unwrap(), "go").unwrap();
        let out = c.wait_with_output_ref();
        own.push(out);
        // Exited and reaped: two tables after that, the second's read began after it (after
        // the last one the tracer ends by itself: its targets are gone).
        let mut tables = 0;
        while i < last && tables < 2 {
            let line = lines.next().expect("gpu-trace's tables").unwrap();
            tables += usize::from(line == "API calls so far:");
        }
    }
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = tracer.wait().unwrap();
    let mut stderr = String::new();
    err.read_to_string(&mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        own.iter().all(|c| c.contains("cuLaunchKernel=5 ")),
        "{own:?}"
    );
    // The final table: one cuLaunchKernel row per client, 5 calls and 2 errors each.
    let at_exit = rest
        .iter()
        .position(|l| l == "API calls (at exit):")
        .unwrap_or_else(|| panic!("no final table: {rest:#?}"));
    let rows: Vec<Vec<&str>> = rest[at_exit + 1..]
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 3 && f[1] == "cuLaunchKernel")
        .collect();
    assert_eq!(rows.len(), 4, "a row per client: {rest:#?}\n{stderr}");
    assert!(
        rows.iter().all(|f| f[2] == "5" && f[3] == "2"),
        "{rows:?}\n{stderr}"
    );
    assert!(!stderr.contains("not counted"), "{stderr}");
}

/// A child's whole standard output once it exited.
trait Finish {
    fn wait_with_output_ref(&mut self) -> String;
}

impl Finish for std::process::Child {
    fn wait_with_output_ref(&mut self) -> String {
        let mut out = String::new();
        self.stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(self.wait().unwrap().success());
        out
    }
}

/// `gpu-trace api -- sh -c 'A; B'`: the processes the command creates are traced too (the
/// shell's two children, each exact): each client waits for a line (GT_WAIT) that the test
/// writes once gpu-trace said it attached to it.
#[test]
fn the_processes_the_command_creates_are_traced_too() {
    use std::io::Write as _;
    let test = "the_processes_the_command_creates_are_traced_too";
    let Some((_dir, client)) = build(test) else {
        return;
    };
    let c = client.display();
    let script = format!("GT_WAIT=1 {c} errors 3 2; GT_WAIT=1 {c} errors 4 1");
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--", "sh", "-c"])
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut go = tracer.stdin.take().unwrap();
    let mut err = BufReader::new(tracer.stderr.take().unwrap());
    let mut said = String::new();
    let mut children = Vec::new();
    while children.len() < 2 {
        let mut l = String::new();
        assert!(
            err.read_line(&mut l).unwrap() > 0,
            "gpu-trace ended: {said}"
        );
        said += &l;
        // `gpu-trace: api: pid P (client): N more uprobes attached`
        if let Some(rest) = l.strip_prefix("gpu-trace: api: pid ")
            && let Some((pid, rest)) = rest.split_once(' ')
            && rest.starts_with("(client):")
        {
            children.push(pid.parse::<u64>().unwrap());
            writeln!(go, "go").unwrap();
        }
    }
    let out = tracer.wait_with_output().unwrap();
    assert!(out.status.success(), "{said}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["event"] == "API_STATS" && v["final"] == true)
        .filter(|v| v["symbol"] == "cuLaunchKernel")
        .collect();
    let row = |pid: u64| {
        rows.iter()
            .find(|v| v["pid"] == pid)
            .unwrap_or_else(|| panic!("no row of child {pid}: {stdout}"))
    };
    // The clients' own counts: 3 + 2 and 4 + 1 calls; 2 and 1 failed.
    let (a, b) = (row(children[0]), row(children[1]));
    assert_eq!(
        (a["calls"].as_u64(), a["errors"].as_u64()),
        (Some(5), Some(2))
    );
    assert_eq!(
        (b["calls"].as_u64(), b["errors"].as_u64()),
        (Some(5), Some(1))
    );
    assert!(
        stdout.contains("cuLaunchKernel=5 ") && stdout.matches("calls cuMemAlloc").count() == 2,
        "{stdout}"
    );
}

/// A process gpu-trace held (`-- CMD`) is let go for good at the end: one that loads a library
/// after the tracer ended — its `_dl_debug_state` probe still on, removed in the background
/// (per-probe uprobes) — is not stopped by it. Before, it stayed stopped (SIGSTOP) for ever.
#[test]
fn a_held_command_is_not_stopped_after_the_tracer_ended() {
    use std::io::Write as _;
    let test = "a_held_command_is_not_stopped_after_the_tracer_ended";
    if !uprobes(test) || !c_compiler(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let lib = cc(&root, "nop.c", "libnop.so", &["-shared", "-fPIC"]);
    let late = cc(&root, "late_dlopen.c", "late", &["-ldl"]);
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .env("GPU_TRACE_UPROBE_ATTACH", "per-probe")
        .args(["api", "--"])
        .arg(&late)
        .arg(&lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut go = tracer.stdin.take().unwrap();
    let mut out = BufReader::new(tracer.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line, "ready\n",
        "the command started (held at its start-up, let go)"
    );
    // SIGINT to gpu-trace alone: it ends, the command goes on untraced.
    // SAFETY: our own child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    assert!(tracer.wait().unwrap().success());
    // Now the command loads a library: its link map changes under the probe still on.
    writeln!(go, "go").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    // A liveness bound (not a measurement): a stopped command never writes its line.
    let rest = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("the command did not go on after the tracer ended (stopped?)"));
    assert!(rest.contains("loaded 1"), "{rest}");
}
