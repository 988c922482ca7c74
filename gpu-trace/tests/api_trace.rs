//! `gpu-trace api` tracing (issue 28) on Debian's real HIP runtime (`libamdhip64.so.5`) with
//! real uprobes and the real binary: a C client (tests/api/count_client.c) and a correct
//! `RTLD_NEXT` shim (tests/api/shim_next.c) print their own call counts, and gpu-trace's
//! per-symbol counts must equal them; the kernel's own run counts of the programs show that a
//! process not traced pays nothing; the seed's recursive shim (tests/api/shim_recursive.c) is
//! reported as API_RECURSION while the tracer stays responsive to SIGINT.
//!
//! Without the HIP runtime, a C compiler, uprobes or root, the tests print `SKIPPED: <why>`.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod api_support;
mod common;
use api_support::{cc, toolchain, uprobes};

/// The built client and shim; `None` after SKIPPED where the test cannot run here.
fn prepare(test: &str) -> Option<(tempfile::TempDir, PathBuf, PathBuf, PathBuf)> {
    if !uprobes(test) {
        return None;
    }
    let (hip, dir, root) = toolchain(test)?;
    let client = cc(&root, "count_client.c", "client", &["-l:libamdhip64.so.5"]);
    let shim = cc(&root, "shim_next.c", "shim_next.so", &["-shared", "-fPIC"]);
    cc(
        &root,
        "shim_recursive.c",
        "shim_recursive.so",
        &["-shared", "-fPIC"],
    );
    Some((dir, client, shim, hip))
}

/// `pid=N` and `NAME=N` fields of a line the client or the shim printed.
fn fields(line: &str) -> HashMap<String, u64> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

#[test]
fn api_trace_counts_equal_the_programs_own_and_untargeted_processes_pay_nothing() {
    let test = "api_trace_counts_equal_the_programs_own_and_untargeted_processes_pay_nothing";
    let Some((_dir, client, shim, hip)) = prepare(test) else {
        return;
    };
    // The traced command: 25 hipMalloc calls through the shim, then 2 s of sleep, exit 7.
    // LD_PRELOAD is in gpu-trace's environment: the command inherits it, and gpu-trace knows
    // the shim before the command runs.
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--bpf-stats", "--"])
        .arg(&client)
        .args(["25", "2", "7"])
        .env("LD_PRELOAD", &shim)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(tracer.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let own = fields(&first);
    assert_eq!(own.get("hipMalloc"), Some(&25), "the client said {first:?}");
    let target = own["pid"];
    // While the target sleeps (its probes attached): the same client and shim, not traced,
    // 400 calls.
    let other = Command::new(&client)
        .arg("400")
        .env("LD_PRELOAD", &shim)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&other.stdout).contains("hipMalloc=400"));
    let status = wait_live(&mut tracer, "gpu-trace did not end with its command");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut tracer.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(
        status.code(),
        Some(7),
        "the command's exit status passes through; {err}"
    );

    let shim_said = err
        .lines()
        .map(fields)
        .find(|f| f.get("pid") == Some(&target))
        .unwrap_or_else(|| panic!("no count from the target's shim in {err}"));
    let rows: Vec<Value> = rest
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let calls = |lib: &Path, sym: &str| -> u64 {
        let lib = lib.to_string_lossy();
        rows.iter()
            .filter(|r| r["pid"] == target && r["symbol"] == sym && r["library"] == *lib)
            .map(|r| r["calls"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(calls(&shim, "hipMalloc"), shim_said["hipMalloc"], "{rest}");
    assert_eq!(calls(&hip, "hipMalloc"), own["hipMalloc"], "{rest}");
    assert_eq!(calls(&hip, "hipInit"), own["hipInit"], "{rest}");
    assert!(
        rows.iter()
            .all(|r| r["pid"] == target && r["final"] == true),
        "{rest}"
    );
    // The programs ran once per traced call and return: the untargeted client's 801 calls
    // cost nothing.
    let traced = shim_said["hipMalloc"] + own["hipMalloc"] + own["hipInit"];
    let stats = err
        .lines()
        .find_map(|l| l.strip_prefix("gpu-trace: bpf-stats "))
        .unwrap_or_else(|| panic!("no bpf-stats line in {err}"));
    let runs = fields(stats);
    assert_eq!(runs["runs"], traced, "{stats}");
    assert_eq!(
        stats,
        format!("api_entry runs={traced} api_return runs={traced}")
    );
}

#[test]
fn api_trace_of_a_process_without_a_gpu_library_says_so() {
    let test = "api_trace_of_a_process_without_a_gpu_library_says_so";
    if prepare(test).is_none() {
        return;
    }
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--pid", &sleeper.id().to_string()])
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no target maps a library that defines a GPU API symbol"),
        "{err}"
    );
}

#[test]
fn api_trace_reports_a_recursing_shim_and_ends_on_sigint() {
    let test = "api_trace_reports_a_recursing_shim_and_ends_on_sigint";
    let Some((_dir, client, shim, _hip)) = prepare(test) else {
        return;
    };
    let recursive = shim.with_file_name("shim_recursive.so");
    // One hipMalloc (which re-enters itself 1000 times in the shim), then 60 s of sleep.
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--"])
        .arg(&client)
        .args(["1", "60"])
        .env("LD_PRELOAD", &recursive)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(tracer.stdout.take().unwrap());
    let mut target = None;
    let mut recursion = None;
    let mut lines = out.lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.starts_with("client ") {
            target = fields(&line).get("pid").copied();
        } else if line.starts_with('{') {
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["event"] == "API_RECURSION" && v["why"] == "re-entered" {
                recursion = Some(v);
            }
        }
        if target.is_some() && recursion.is_some() {
            break;
        }
    }
    let target = target.expect("the client's line");
    let v = recursion.expect("an API_RECURSION record");
    assert_eq!(v["pid"], target);
    assert_eq!(v["symbol"], "hipMalloc");
    assert_eq!(v["library"], recursive.to_string_lossy().as_ref());
    assert_eq!(v["depth"], 2);
    // The main trace's shape (one JSON shape per record kind): when and on which CPU.
    assert!(v["time"].is_string() && v["cpu"].is_u64(), "{v}");
    assert!(v["tid"].is_u64() && v["ts_ns"].is_u64(), "{v}");
    assert_eq!(
        v["chain"][0]["library"],
        recursive.to_string_lossy().as_ref()
    );
    // The client sleeps on, traced: SIGINT ends the tracer with the counts.
    // SAFETY: our own child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let status = wait_live(&mut tracer, "the tracer did not end on SIGINT");
    // SAFETY: the client, which SIGINT to the tracer alone left running (it holds the pipe).
    unsafe { libc::kill(target as i32, libc::SIGKILL) };
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    // The command goes on untraced, as the main trace leaves it: the status is gpu-trace's own.
    assert_eq!(status.code(), Some(0), "the main trace's rule");
    assert!(
        rest.iter()
            .any(|l| l.contains("\"hipInit\"") && l.contains("\"final\":true")),
        "{rest:?}"
    );
    // Reported once per (thread, symbol): no second re-entry record.
    assert!(!rest.iter().any(|l| l.contains("re-entered")), "{rest:?}");
}

#[test]
fn api_trace_reports_a_call_stuck_in_a_shim_with_its_stack() {
    let test = "api_trace_reports_a_call_stuck_in_a_shim_with_its_stack";
    let Some((_dir, client, _shim, _hip)) = prepare(test) else {
        return;
    };
    let root = client.parent().unwrap();
    let sync = cc(
        root,
        "sync_client.c",
        "sync_client",
        &["-l:libamdhip64.so.5"],
    );
    let block = cc(root, "shim_block.c", "shim_block.so", &["-shared", "-fPIC"]);
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--stuck-after", "1", "--"])
        .arg(&sync)
        .env("LD_PRELOAD", &block)
        .env("SHIM_BLOCK_SECONDS", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(tracer.stdout.take().unwrap()).lines();
    let mut target = None;
    let mut stuck = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.starts_with("client ") {
            target = fields(&line).get("pid").copied();
        } else if line.contains("\"API_STUCK\"") {
            stuck = Some(serde_json::from_str::<Value>(&line).unwrap());
            break;
        }
    }
    let target = target.expect("the client's line");
    // SAFETY: our own child; then the client, left running by SIGINT to the tracer alone.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let status = tracer.wait().unwrap();
    unsafe { libc::kill(target as i32, libc::SIGKILL) };
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let v = stuck.expect("an API_STUCK record");
    let block = block.to_string_lossy();
    assert_eq!(v["pid"], target);
    assert_eq!(v["symbol"], "hipDeviceSynchronize");
    assert_eq!(v["library"], block.as_ref());
    // Found by userspace: a time, no CPU.
    assert!(v["time"].is_string() && v["cpu"].is_null(), "{v}");
    assert!(v["open_ns"].as_u64().unwrap() >= 1_000_000_000, "{v}");
    // Asleep in the shim's sleep(): state S, in a system call.
    assert_eq!(v["state"], "S", "{v}");
    assert!(!v["syscall"].as_str().unwrap().is_empty(), "{v}");
    let stack: Vec<&str> = v["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        stack
            .iter()
            .any(|f| f.starts_with(block.as_ref()) && f.contains("shim_wait")),
        "the stack names the shim: {stack:#?}"
    );
    // Once per call.
    assert!(
        !rest.iter().any(|l| l.contains("\"API_STUCK\"")),
        "{rest:?}"
    );
    // The client goes on untraced (SIGINT reached the tracer alone): gpu-trace's own status.
    assert_eq!(status.code(), Some(0));
}

#[test]
fn api_trace_attaches_a_library_dlopened_later_at_the_next_rescan() {
    let test = "api_trace_attaches_a_library_dlopened_later_at_the_next_rescan";
    let Some((_dir, client, _shim, hip)) = prepare(test) else {
        return;
    };
    let root = client.parent().unwrap();
    let late = cc(root, "dlopen_client.c", "dlopen_client", &["-ldl"]);
    // A copy of the runtime under a path no ld.so cache lists: gpu-trace cannot attach it
    // before exec, only when a rescan finds it mapped.
    let copy = root.join("libamdhip64.so.5");
    std::fs::copy(&hip, &copy).unwrap();
    // dlopen after 1 s, 3 s for the rescan (every 0.2 s), then 9 calls.
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--format", "json", "--interval", "0.2", "--"])
        .arg(&late)
        .arg(&copy)
        .args(["3", "9"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let own = fields(text.lines().find(|l| l.starts_with("client ")).unwrap());
    let copy = copy.to_string_lossy();
    let counted: u64 = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| {
            r["final"] == true
                && r["pid"] == own["pid"]
                && r["symbol"] == "hipInit"
                && r["library"] == copy.as_ref()
        })
        .map(|r| r["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, own["hipInit"], "{text}");
}

/// How long a run that should end is waited for before the test calls it hung: a bound on a
/// hang, never a measurement (these runs end within seconds here).
const LIVENESS: Duration = Duration::from_secs(120);

/// [`common::wait_live`] with [`LIVENESS`].
fn wait_live(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    common::wait_live(child, LIVENESS, what)
}

/// A subreaper between the test and gpu-trace (Python's `prctl(PR_SET_CHILD_SUBREAPER)`): it
/// runs the command, and once it ended lists on stderr each process left as its child —
/// re-parented to it because its parent exited while it ran: `harness: exit N` then
/// `harness: orphan PID` lines. gpu-trace's holder of the probes (loader/hold.rs) waits for
/// gpu-trace's exit before it removes them, so it is such an orphan exactly when gpu-trace
/// left the removal to it and did not wait for it.
const SUBREAPER: &str = r#"
import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("harness: prctl: errno %d" % ctypes.get_errno())
code = subprocess.call(sys.argv[1:])
print("harness: exit %d" % code, file=sys.stderr, flush=True)
me = str(os.getpid())
for pid in os.listdir("/proc"):
    try:
        stat = open("/proc/%s/stat" % pid).read()
    except (OSError, ValueError):
        continue
    if pid.isdigit() and stat.rsplit(")", 1)[1].split()[1] == me:
        print("harness: orphan %s" % pid, file=sys.stderr, flush=True)
"#;

/// Runs gpu-trace `args` then `client 1 0 0` with `shim` preloaded and the probes attached one
/// perf event each (`GPU_TRACE_UPROBE_ATTACH=per-probe`: the attach whose removal the kernel
/// makes slow), under [`SUBREAPER`], until its standard output shows a line starting with
/// `mark`; returns the rest of the output, gpu-trace's exit code and stderr (the harness's
/// lines included).
fn run_until(args: &[&str], client: &Path, shim: &Path, mark: &str) -> (String, i32, String) {
    let mut tracer = Command::new("python3")
        .args(["-c", SUBREAPER, env!("CARGO_BIN_EXE_gpu-trace")])
        .args(args)
        .arg(client)
        .args(["1", "0", "0"])
        .env("LD_PRELOAD", shim)
        .env("GPU_TRACE_UPROBE_ATTACH", "per-probe")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(tracer.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with(mark) {
        line.clear();
        assert_ne!(out.read_line(&mut line).unwrap(), 0, "no line {mark:?}");
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = wait_live(&mut tracer, "gpu-trace under the harness did not end");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut tracer.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the harness: {status:?}: {err}");
    let code = (err.lines())
        .find_map(|l| l.strip_prefix("harness: exit "))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no exit line from the harness: {err}"));
    (rest, code, err)
}

/// The probes the attach line says went on (`… N uprobes attached …`): a run with none would
/// leave nothing to remove, and a holder behind proves nothing.
fn attached(err: &str) -> usize {
    (err.lines())
        .find_map(|l| {
            let (before, _) = l.split_once(" uprobes attached")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no attach line: {err}"))
}

/// The orphans the harness listed (see [`SUBREAPER`]).
fn orphans(err: &str) -> usize {
    err.lines()
        .filter(|l| l.starts_with("harness: orphan "))
        .count()
}

/// gpu-trace api ends once its results are out: the probes' removal (over ten seconds here
/// for the HIP table and the shim, one perf-event uprobe at a time) is left to a holder that
/// outlives it. Checked as a state, not a time: the holder is left behind as an orphan (it
/// waits for gpu-trace's exit before it removes anything), one, and gpu-trace exited 0 with
/// the table printed.
#[test]
fn api_trace_ends_once_its_results_are_out_not_after_the_probes_are_removed() {
    let test = "api_trace_ends_once_its_results_are_out_not_after_the_probes_are_removed";
    let Some((_dir, client, shim, _hip)) = prepare(test) else {
        return;
    };
    // The client needs libamdhip64 (DT_NEEDED, found through ldconfig's cache) and the shim is
    // preloaded: gpu-trace attaches both libraries' table symbols before the command runs,
    // about a hundred probes.
    let (_, code, err) = run_until(&["api", "--"], &client, &shim, "API calls (at exit)");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("per-probe"), "the attach method: {err}");
    assert!(attached(&err) > 0, "{err}");
    assert_eq!(orphans(&err), 1, "one holder left behind: {err}");
}

/// `gpu-trace --api -- CMD` (the main trace): once the command has ended, the results come
/// and gpu-trace exits, leaving the probes' removal to a holder that outlives it (an orphan of
/// the harness, as above), and its metrics port is free for the next run at once (the holder
/// closed everything but the kernel objects). Before, the statistics waited for the removal.
#[test]
fn main_trace_with_api_ends_without_waiting_for_the_probes_removal() {
    let test = "main_trace_with_api_ends_without_waiting_for_the_probes_removal";
    let Some((_dir, client, shim, _hip)) = prepare(test) else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let args = ["--api", "--metrics", &metrics, "--"];
    let (rest, code, err) = run_until(&args, &client, &shim, "client pid=");
    assert_eq!(code, 0, "{err}");
    assert!(rest.contains("gpu-trace statistics"), "{rest}");
    assert!(err.contains("per-probe"), "the attach method: {err}");
    assert!(attached(&err) > 0, "{err}");
    assert_eq!(orphans(&err), 1, "one holder left behind: {err}");
    std::net::TcpListener::bind(&metrics)
        .unwrap_or_else(|e| panic!("the metrics port is still held after the exit: {e}"));
}

#[test]
fn api_trace_is_not_starved_by_a_low_soft_open_file_limit() {
    use std::os::unix::process::CommandExt as _;
    let test = "api_trace_is_not_starved_by_a_low_soft_open_file_limit";
    let Some((_dir, client, _shim, _hip)) = prepare(test) else {
        return;
    };
    // Two descriptors per probed symbol: the HIP table alone needs about a hundred, more than
    // a soft limit of 64 allows (libcuda and libcudart need a few hundred). The
    // hard limit is left as it is: gpu-trace raises the soft one to it.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-trace"));
    cmd.args(["api", "--"]).arg(&client).args(["1", "0", "0"]);
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            if lim.rlim_max < 1024 {
                return Err(std::io::Error::other("hard limit below 1024"));
            }
            lim.rlim_cur = 64;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("cannot probe"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(" hipMalloc "), "{text}");
}

/// `gpu-trace api -v`'s text lines take the main trace's shape: the driver lines' head (time,
/// `[CPUnn]`, name, `PID=`, process name), then `tid=T SYMBOL@LIBRARY = RET <DUR us> depth=D
/// caller=…`, one line per call the client made (its own count), the shim's `[preload]` mark.
#[test]
fn api_trace_text_lines_have_the_main_traces_shape() {
    let test = "api_trace_text_lines_have_the_main_traces_shape";
    let Some((_dir, client, shim, hip)) = prepare(test) else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "-v", "--"])
        .arg(&client)
        .args(["5", "0"])
        .env("LD_PRELOAD", &shim)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let own = text
        .lines()
        .map(fields)
        .find(|f| f.contains_key("hipMalloc"))
        .unwrap_or_else(|| panic!("the client's line in {text}"));
    let (pid, calls) = (own["pid"], own["hipMalloc"]);
    let (shim, hip) = (shim.to_string_lossy(), hip.to_string_lossy());
    // `HH:MM:SS.ffffff [CPUnn] API_CALL     PID=<pid>` then the fields.
    let head = |l: &str| -> Option<String> {
        let (time, rest) = l.split_once(' ')?;
        let ok = time.len() == 15
            && time.as_bytes()[2] == b':'
            && time.as_bytes()[8] == b'.'
            && rest.starts_with("[CPU")
            && rest[4..6].bytes().all(|b| b.is_ascii_digit())
            && rest[6..].starts_with("] API_CALL     PID=");
        ok.then(|| rest[25..].to_string())
    };
    let lines: Vec<String> = text.lines().filter_map(head).collect();
    let of = |lib: &str| {
        lines
            .iter()
            .filter(|l| {
                l.starts_with(&format!("{pid} ")) && l.contains(&format!(" hipMalloc@{lib} = "))
            })
            .collect::<Vec<_>>()
    };
    // The shim's outermost calls (preloaded), and the runtime's, called by the shim.
    let outer = of(&shim);
    assert_eq!(outer.len() as u64, calls, "{text}");
    assert!(
        outer
            .iter()
            .all(|l| l.contains(" depth=0 caller=- [preload]")),
        "{outer:#?}"
    );
    let inner = of(&hip);
    assert_eq!(inner.len() as u64, calls, "{text}");
    let caller = format!(" depth=1 caller=hipMalloc@{shim}");
    assert!(inner.iter().all(|l| l.ends_with(&caller)), "{inner:#?}");
}

/// Issue 41, item 5: an attach that runs past a second says how far it got on stderr, in both
/// commands, before the line that sums it up; not under `-q`. The test hook makes the first
/// line due at the first probe (no attach lasting a second, no clock read here).
#[test]
fn attach_progress_is_said_on_stderr_in_both_commands_and_not_under_quiet() {
    let test = "attach_progress_is_said_on_stderr_in_both_commands_and_not_under_quiet";
    let Some((_dir, client, shim, _hip)) = prepare(test) else {
        return;
    };
    let stderr_of = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
            .args(args)
            .arg(&client)
            .args(["1", "0", "0"])
            .env("LD_PRELOAD", &shim)
            .env("GPU_TRACE_TEST_PROGRESS_AT_ONCE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{:?}: {err}", out.status);
        err
    };
    for (args, who) in [
        (&["api", "--"][..], "api"),
        (&["--watch-device", "/dev/full", "--api", "--"][..], "--api"),
    ] {
        let err = stderr_of(args);
        let progress = format!("gpu-trace: {who}: attaching: ");
        let at = err
            .find(&progress)
            .unwrap_or_else(|| panic!("no {progress:?} line: {err}"));
        let line = err[at..].lines().next().unwrap();
        assert!(line.contains(" uprobes so far"), "{line}");
        let summary = err
            .find("uprobes attached")
            .unwrap_or_else(|| panic!("no summary line: {err}"));
        assert!(at < summary, "progress after the summary: {err}");
    }
    let quiet = stderr_of(&["-q", "--watch-device", "/dev/full", "--api", "--"]);
    assert!(!quiet.contains("attaching:"), "{quiet}");
}
