//! Tests that kill the API layer's mutants issue 40 expected to survive, end to end with real
//! uprobes and the real binary:
//!
//! - the main trace (`gpu-trace --api`) counts failing calls as `errors`: the client's own
//!   count of non-zero returns (tests/api/exact_client.c, `errors`) is the oracle;
//! - an indirect recursion A → B → A is one `API_RECURSION why=re-entered` of A at depth 3 in
//!   the main trace (every frame open is compared, not the innermost alone);
//! - a thread past `--max-depth N` is one `API_RECURSION why=max-depth` at depth N + 1, once
//!   per thread (tests/api/mutants_client.c `depth`, which prints its threads' ids);
//! - a call stuck inside another open call is an `API_STUCK` for each of the two (every open
//!   frame is checked, not the outermost or innermost alone); the client blocks until the
//!   test has read the two records and sends it a line: no sleep sets it up.
//!
//! Only the JSON keys `event`, `pid`, `tid`, `symbol`, `library`, `why`, `depth` and the
//! `API_STATS` objects are read. Without root, the uprobe PMU or a C compiler the tests print
//! `SKIPPED: <why>` and return.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

mod api_support;
mod common;
use api_support::{c_compiler, cc, uprobes};

/// This file's stand-ins: the library's source and the client's (tests/api).
const MUTANTS: (&str, &str) = ("mutants_cuda.c", "mutants_client.c");

/// How long the stuck test waits for a record before it calls the run broken: a bound on a
/// hang, never a measurement (the records come within a second here).
const LIVENESS: Duration = Duration::from_secs(30);

/// The stand-in `libcuda.so.1` from `lib_source` and the client from `client_source` linked
/// to it, in a new directory: (the directory, the client, the library).
fn build(
    test: &str,
    lib_source: &str,
    client_source: &str,
) -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    if !uprobes(test) || !c_compiler(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let lib = cc(
        &root,
        lib_source,
        "libcuda.so.1",
        &["-shared", "-fPIC", "-ldl"],
    );
    let lib_dir = format!("-L{}", root.display());
    let rpath = format!("-Wl,-rpath,{}", root.display());
    let client = cc(
        &root,
        client_source,
        "client",
        &[&lib_dir, "-l:libcuda.so.1", &rpath, "-pthread"],
    );
    Some((dir, client, lib))
}

/// `NAME=N` fields of the line that starts with `prefix`.
fn fields(out: &str, prefix: &str) -> HashMap<String, u64> {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in {out}"));
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// The JSON lines of `out`.
fn json(out: &str) -> Vec<Value> {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Whether a record's `library` is `lib`: its path (`gpu-trace api`) or its file name (the
/// main trace).
fn is_lib(v: &Value, lib: &Path) -> bool {
    v["library"]
        .as_str()
        .is_some_and(|l| Path::new(l) == lib || Some(std::ffi::OsStr::new(l)) == lib.file_name())
}

/// The last `API_STATS` object of `symbol` in `lib`.
fn stats<'a>(lines: &'a [Value], lib: &Path, symbol: &str) -> &'a Value {
    lines
        .iter()
        .rev()
        .find(|v| v["event"] == "API_STATS" && v["symbol"] == symbol && is_lib(v, lib))
        .unwrap_or_else(|| panic!("no API_STATS of {symbol}: {lines:#?}"))
}

/// The one `API_RECURSION` of `lines`, which must be `why` for `symbol` of `lib` at `depth`.
fn only_recursion<'a>(
    lines: &'a [Value],
    lib: &Path,
    why: &str,
    symbol: &str,
    depth: u64,
) -> &'a Value {
    let recursions: Vec<&Value> = lines
        .iter()
        .filter(|v| v["event"] == "API_RECURSION")
        .collect();
    assert_eq!(recursions.len(), 1, "{recursions:#?}");
    let r = recursions[0];
    assert_eq!(
        (&r["why"], &r["symbol"], &r["depth"]),
        (&why.into(), &symbol.into(), &depth.into()),
        "{r}"
    );
    assert!(is_lib(r, lib), "{r}");
    r
}

/// `gpu-trace ARGS -- client CLIENT_ARGS`, exit 0: its stdout (the client's lines included).
fn traced(args: &[&str], client: &Path, client_args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(args)
        .arg("--")
        .arg(client)
        .args(client_args)
        .stdin(Stdio::null())
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

/// A finished run: its stdout (the client's lines included), its JSON lines, the stand-in
/// library's path.
struct Run {
    out: String,
    lines: Vec<Value>,
    lib: PathBuf,
    _dir: tempfile::TempDir,
}

/// Builds `sources` (the stand-in library's, the client's) and runs
/// `gpu-trace ARGS -- client CLIENT_ARGS`; `None` after SKIPPED where the test cannot run here.
fn run(test: &str, sources: (&str, &str), args: &[&str], client_args: &[&str]) -> Option<Run> {
    let (dir, client, lib) = build(test, sources.0, sources.1)?;
    let out = traced(args, &client, client_args);
    Some(Run {
        lines: json(&out),
        out,
        lib,
        _dir: dir,
    })
}

/// `gpu-trace --api --format json -- client CLIENT_ARGS` with tests/api_exact.rs's
/// stand-ins (exact_cuda.c, exact_client.c).
fn main_trace(test: &str, client_args: &[&str]) -> Option<Run> {
    let args = ["--api", "--format", "json"];
    run(test, ("exact_cuda.c", "exact_client.c"), &args, client_args)
}

/// The main trace's `API_STATS` count a call as an error when it returned non-zero: 300
/// failing launches among 1000, by the client's own count (the mutant counting `ret == 0`
/// gives 700).
#[test]
fn the_main_trace_counts_the_calls_that_failed_as_errors() {
    let test = "the_main_trace_counts_the_calls_that_failed_as_errors";
    let Some(Run {
        out, lines, lib, ..
    }) = main_trace(test, &["errors", "700", "300"])
    else {
        return;
    };
    let failed: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("failed="))
        .expect("the client's failed= line")
        .parse()
        .unwrap();
    let calls = fields(&out, "calls ")["cuLaunchKernel"];
    assert_eq!((failed, calls), (300, 1000), "the client's own counts");
    let row = stats(&lines, &lib, "cuLaunchKernel");
    assert_eq!(row["calls"].as_u64(), Some(calls), "{row}");
    assert_eq!(row["errors"].as_u64(), Some(failed), "{row}");
}

/// cuCtxSynchronize → cuStreamSynchronize → cuCtxSynchronize (exact_cuda.c), 100 times: one
/// `API_RECURSION why=re-entered` of cuCtxSynchronize, at depth 3 (its second frame over
/// two open ones), on the client's one thread; cuStreamSynchronize is never re-entered. The
/// mutant comparing the innermost open frame alone (cuStreamSynchronize) reports nothing.
#[test]
fn the_main_trace_reports_an_indirect_recursion_once_at_its_depth() {
    let test = "the_main_trace_reports_an_indirect_recursion_once_at_its_depth";
    let Some(Run {
        out, lines, lib, ..
    }) = main_trace(test, &["indirect", "100", "10"])
    else {
        return;
    };
    let truth = fields(&out, "calls ");
    assert_eq!(
        (truth["cuCtxSynchronize"], truth["cuStreamSynchronize"]),
        (200, 100),
        "the client's own counts"
    );
    let r = only_recursion(&lines, &lib, "re-entered", "cuCtxSynchronize", 3);
    // The client's only thread: its pid.
    assert_eq!(r["tid"], r["pid"], "{r}");
    for (symbol, calls) in [
        ("cuCtxSynchronize", truth["cuCtxSynchronize"]),
        ("cuStreamSynchronize", truth["cuStreamSynchronize"]),
    ] {
        let row = stats(&lines, &lib, symbol);
        assert_eq!(row["calls"].as_u64(), Some(calls), "{row}");
    }
}

/// Three threads each recurse 10 deep under `--max-depth 4`: each thread is one
/// `API_RECURSION why=max-depth` at depth 5 (the first call past the 4 kept frames) and one
/// `why=re-entered` at depth 2; every call is counted, the 6 past the cap of each thread
/// untimed.
#[test]
fn a_thread_past_max_depth_is_reported_once_at_the_depth_it_reached() {
    let test = "a_thread_past_max_depth_is_reported_once_at_the_depth_it_reached";
    let (threads, depth, cap) = (3u64, 10u64, 4u64);
    let args = ["api", "--format", "json", "--max-depth", &cap.to_string()];
    let client_args = ["depth", &threads.to_string(), &depth.to_string()];
    let Some(Run {
        out, lines, lib, ..
    }) = run(test, MUTANTS, &args, &client_args)
    else {
        return;
    };
    let pid = fields(&out, "client ")["pid"];
    let tids: BTreeSet<u64> = out
        .lines()
        .filter_map(|l| l.strip_prefix("thread tid="))
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(tids.len() as u64, threads, "{out}");
    assert_eq!(
        fields(&out, "calls ")["cuMemAlloc_v2"],
        threads * depth,
        "the client's own count"
    );
    // (why, tid) → the depths reported.
    let mut reported: BTreeMap<(String, u64), Vec<u64>> = BTreeMap::new();
    for r in lines.iter().filter(|v| v["event"] == "API_RECURSION") {
        assert_eq!(r["pid"], pid, "{r}");
        assert_eq!(r["symbol"], "cuMemAlloc_v2", "{r}");
        assert!(is_lib(r, &lib), "{r}");
        reported
            .entry((
                r["why"].as_str().unwrap().to_string(),
                r["tid"].as_u64().unwrap(),
            ))
            .or_default()
            .push(r["depth"].as_u64().unwrap());
    }
    let want: BTreeMap<(String, u64), Vec<u64>> = tids
        .iter()
        .flat_map(|&t| {
            [
                (("max-depth".to_string(), t), vec![cap + 1]),
                (("re-entered".to_string(), t), vec![2]),
            ]
        })
        .collect();
    assert_eq!(reported, want, "{out}");
    let row = stats(&lines, &lib, "cuMemAlloc_v2");
    assert_eq!(row["calls"].as_u64(), Some(threads * depth), "{row}");
    assert_eq!(
        row["untimed"].as_u64(),
        Some(threads * (depth - cap)),
        "{row}"
    );
}

/// Past `--max-depth 1` without re-entering anything: cuCtxSynchronize → cuStreamSynchronize
/// (the `stuck` scenario with stdin at its end, so nothing waits) is one
/// `API_RECURSION why=max-depth` of cuStreamSynchronize at depth 2, and no `re-entered`.
#[test]
fn a_thread_past_max_depth_without_recursion_is_reported_once() {
    let test = "a_thread_past_max_depth_without_recursion_is_reported_once";
    let args = ["api", "--format", "json", "--max-depth", "1"];
    let Some(Run {
        out, lines, lib, ..
    }) = run(test, MUTANTS, &args, &["stuck"])
    else {
        return;
    };
    let pid = fields(&out, "client ")["pid"];
    let truth = fields(&out, "calls ");
    assert_eq!(
        (truth["cuCtxSynchronize"], truth["cuStreamSynchronize"]),
        (1, 1),
        "the client's own counts"
    );
    let r = only_recursion(&lines, &lib, "max-depth", "cuStreamSynchronize", 2);
    assert_eq!((&r["pid"], &r["tid"]), (&pid.into(), &pid.into()), "{r}");
}

/// Whether `stuck` holds the `API_STUCK` of cuStreamSynchronize (the inner open call).
fn inner_stuck(stuck: &[Value], _: &[String]) -> bool {
    stuck.iter().any(|v| v["symbol"] == "cuStreamSynchronize")
}

/// `gpu-trace ARGS -- client stuck`: its lines until `until` (the stuck records so far, every
/// line so far) holds or [`LIVENESS`] passed, then the client released; (the stuck records,
/// every stdout line, stderr, the tracer's exit status, whether it timed out).
fn stuck_run(
    args: &[&str],
    client: &Path,
    until: impl Fn(&[Value], &[String]) -> bool,
) -> (Vec<Value>, Vec<String>, String, Option<i32>, bool) {
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(args)
        .arg("--")
        .arg(client)
        .arg("stuck")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut release = tracer.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = tracer.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let mut stderr = tracer.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut seen = Vec::new();
    let mut stuck = Vec::new();
    let mut keep = |line: String, stuck: &mut Vec<Value>| {
        if line.starts_with('{') {
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["event"] == "API_STUCK" {
                stuck.push(v);
            }
        }
        seen.push(line);
    };
    let mut timed_out = false;
    let mut seen_so_far = Vec::new();
    while !until(&stuck, &seen_so_far) {
        let Ok(line) = rx.recv_timeout(LIVENESS) else {
            timed_out = true;
            break;
        };
        seen_so_far.push(line.clone());
        keep(line, &mut stuck);
    }
    // The client may go on (also where the record never came: the run ends either way): its
    // inner call returns, then its outer one, then it ends.
    let _ = release.write_all(b"go\n");
    drop(release);
    let status = tracer.wait().unwrap();
    reader.join().unwrap();
    let err = errors.join().unwrap();
    for line in rx.try_iter() {
        keep(line, &mut stuck);
    }
    (stuck, seen, err, status.code(), timed_out)
}

/// The stuck records of a `stuck` run: each open call once, the outer first, of the client's
/// main thread in `lib`; the client's own counts say it made each call once.
fn check_stuck(stuck: &[Value], seen: &[String], lib: &Path) {
    let out = seen.join("\n");
    let pid = fields(&out, "client ")["pid"];
    let truth = fields(&out, "calls ");
    assert_eq!(
        (truth["cuCtxSynchronize"], truth["cuStreamSynchronize"]),
        (1, 1),
        "the client's own counts"
    );
    let symbols: Vec<&str> = stuck
        .iter()
        .map(|v| v["symbol"].as_str().unwrap())
        .collect();
    assert_eq!(
        symbols,
        ["cuCtxSynchronize", "cuStreamSynchronize"],
        "each open call once, the outer first: {stuck:#?}"
    );
    for v in stuck {
        assert_eq!(v["pid"], pid, "{v}");
        // The client's main thread.
        assert_eq!(v["tid"], pid, "{v}");
        assert!(is_lib(v, lib), "{v}");
    }
}

/// cuCtxSynchronize is open around cuStreamSynchronize, which waits on stdin: with
/// `--stuck-after 0.05` both calls are reported stuck, the outer one first (the frames are
/// checked outermost first), each once. A mutant that checks only the outermost open call
/// never reports cuStreamSynchronize (the test ends at its liveness bound); one that checks
/// only the innermost never reports cuCtxSynchronize.
#[test]
fn a_call_stuck_inside_another_open_call_is_reported_with_it() {
    let test = "a_call_stuck_inside_another_open_call_is_reported_with_it";
    let Some((_dir, client, lib)) = build(test, MUTANTS.0, MUTANTS.1) else {
        return;
    };
    let args = ["api", "--format", "json", "--stuck-after", "0.05"];
    let (stuck, seen, err, status, timed_out) = stuck_run(&args, &client, inner_stuck);
    assert!(
        !timed_out,
        "no API_STUCK of cuStreamSynchronize (the inner open call) within {LIVENESS:?}: \
         {seen:#?}\n{err}"
    );
    assert_eq!(status, Some(0), "{seen:#?}\n{err}");
    check_stuck(&stuck, &seen, &lib);
}

/// The same in the main trace (`gpu-trace --api`, issue 42's last trigger): both open calls
/// are an `API_STUCK` each, and with `--flight-recorder --dump-on stuck` the first one dumps
/// the window: one dump named after the trigger (`--dump-max-per-hour 1`: the second stuck
/// call is counted, not written), which replays alone; the statistics count 2 triggers.
/// The client is released only once the sums were read while both calls were open (an
/// `--interval` block's `API_STATS` of cuStreamSynchronize: counted at its entry, not timed
/// yet): the final sums still time both calls. (A call open across more reads stayed untimed
/// for good before: only a change of the count was sent again, found on the GPU host with a
/// 6 s cudaDeviceSynchronize; how many reads a call spans here depends on the clock, so the
/// unit test `a_call_timed_reads_after_its_entry_is_sent_again` in `api/attach.rs` holds that
/// case.)
#[test]
fn the_main_trace_reports_stuck_calls_and_dumps_on_them() {
    let test = "the_main_trace_reports_stuck_calls_and_dumps_on_them";
    let Some((dir, client, lib)) = build(test, MUTANTS.0, MUTANTS.1) else {
        return;
    };
    let dumps = dir.path().join("dumps");
    std::fs::create_dir(&dumps).unwrap();
    let args = [
        "--watch-device",
        "/dev/full",
        "--api",
        "--stuck-after",
        "0.05",
        "--interval",
        "1",
        "--format",
        "json",
        "--flight-recorder",
        "1h",
        "--dump-on",
        "stuck",
        "--dump-max-per-hour",
        "1",
        "--dump-dir",
        dumps.to_str().unwrap(),
    ];
    let open_sums_sent = |stuck: &[Value], lines: &[String]| {
        inner_stuck(stuck, lines)
            && json(&lines.join("\n"))
                .iter()
                .any(|v| v["event"] == "API_STATS" && v["symbol"] == "cuStreamSynchronize")
    };
    let (stuck, seen, err, status, timed_out) = stuck_run(&args, &client, open_sums_sent);
    assert!(
        !timed_out,
        "no API_STUCK and open API_STATS of cuStreamSynchronize within {LIVENESS:?}: \
         {seen:#?}\n{err}"
    );
    assert_eq!(status, Some(0), "{seen:#?}\n{err}");
    check_stuck(&stuck, &seen, &lib);
    let end = json(&seen.join("\n"))
        .into_iter()
        .find(|v| v["event"] == "STATS" && v["final"] == true)
        .unwrap_or_else(|| panic!("no final STATS: {seen:#?}"));
    let flight = &end["flight_recorder"];
    assert_eq!(
        (&flight["triggers"]["stuck"], &flight["dumps"]),
        (&2.into(), &1.into()),
        "{flight}"
    );
    let lines = json(&seen.join("\n"));
    for symbol in ["cuCtxSynchronize", "cuStreamSynchronize"] {
        let s = stats(&lines, &lib, symbol);
        assert_eq!(
            (&s["calls"], &s["untimed"], &s["final"]),
            (&1.into(), &0.into(), &true.into()),
            "{s}"
        );
    }
    let written: Vec<PathBuf> = std::fs::read_dir(&dumps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let name = written[0].file_name().unwrap().to_str().unwrap();
    assert!(name.ends_with("-stuck.gtrace"), "{name}");
    let replay = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["replay", "--format", "json"])
        .arg(&written[0])
        .output()
        .unwrap();
    assert!(
        replay.status.success(),
        "the dump replays alone: {}",
        String::from_utf8_lossy(&replay.stderr)
    );
}
