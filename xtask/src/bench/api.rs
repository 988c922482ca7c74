//! The `api` part: what the API layer (`gpu-trace api`) costs a program per call, against the
//! same program untraced and under the kernel's own bare uprobes, in one run (issue 28).
//!
//! The program is `examples/api/bench_noop.c`: N calls of a ~3 ns library function (`noop_fn`
//! in `examples/api/noop_lib.c`, linked through `DT_RPATH=$ORIGIN/lib`), timed by the program
//! itself (`ns_per_call`). Four or five configurations, rotated each repetition:
//! - untraced;
//! - a bare tracefs uprobe on `noop_fn` (what any uprobe costs on this kernel);
//! - a bare uprobe and uretprobe (the pair gpu-trace attaches per symbol);
//! - `gpu-trace api --probe libnoop.so:noop_fn -- bench_noop N`: the layer as users run it
//!   (its count of `noop_fn` must equal N, or the part fails);
//! - where the default is batched links, `gpu-trace api` again with
//!   `GPU_TRACE_UPROBE_ATTACH=per-probe` (one perf-event uprobe per symbol and direction).
//!
//! What a hit costs is the configuration's ns per call minus the untraced one; the layer's own
//! cost is its hit against the bare pair's hit (issue 28: within 10 %).
//!
//! Then attaching and removing 200 probes (issue 37 item 6): a library of 100 table-like
//! symbols (`cuMemcpy0`…`cuMemcpy99`, matched by the table's `cuMemcpy*`, the way
//! `gpu-trace/tests/api_exact.rs`'s `wide_library` builds it) and a client that calls each
//! [`ATTACH_TIMES`] times, run under `gpu-trace api --format json -- CLIENT` with each attach
//! method (`GPU_TRACE_UPROBE_ATTACH=per-probe` and `=batched`, in turn, the order rotated each
//! repetition), each run followed at once by a second one (the "run right after another" case).
//! Per run: the probes attached and the attach time (gpu-trace's first stderr line; 200 probes,
//! or the part fails), the time from the client's exit (its own `CLOCK_MONOTONIC` end, its last
//! line) to gpu-trace's exit (seen by this process), the run's wall time, when the probes were
//! gone (per-probe: the background child that removes them, adopted by this process as a
//! subreaper, ended), and gpu-trace's final counts against the client's own (any difference
//! fails the part). Before each first run every earlier run's probes are gone. Below Linux 6.10
//! the per-probe column alone, with the reason.
//!
//! No assertion on time: the figures are printed.

use std::{
    collections::{HashMap, HashSet},
    ffi::OsStr,
    fmt::Write as _,
    fs,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    thread::{self, JoinHandle},
};

use anyhow::{Context as _, Result, anyhow, bail};
use gpu_trace::{
    api::attach::{ATTACH_ENV, AttachMethod, method_allowed},
    probe::system,
};

use super::{Ctx, Spread, fmt_ns, fmt_ratio, progress, spread};

/// A configuration of the per-call table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    Untraced,
    Bare,
    BarePair,
    /// `gpu-trace api` as users run it (the kernel's default method).
    Api,
    /// `gpu-trace api` with `GPU_TRACE_UPROBE_ATTACH=per-probe` (where the default is batched).
    ApiPerProbe,
}

impl Config {
    fn label(self) -> &'static str {
        match self {
            Self::Untraced => "untraced",
            Self::Bare => "bare uprobe",
            Self::BarePair => "bare uprobe + uretprobe",
            Self::Api => "gpu-trace api",
            Self::ApiPerProbe => "gpu-trace api, GPU_TRACE_UPROBE_ATTACH=per-probe",
        }
    }
}

/// Whether this kernel allows batched links (`Err`: why not), as gpu-trace decides it.
fn batched_allowed() -> Result<(), String> {
    match method_allowed(&system::kernel_release(), Some(OsStr::new("batched"))) {
        Ok(()) => Ok(()),
        Err(AttachMethod::PerProbe(why)) => Err(why),
        Err(AttachMethod::Batched) => Ok(()),
    }
}

/// An attach method of the attach-and-detach table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    PerProbe,
    Batched,
}

impl Method {
    /// `GPU_TRACE_UPROBE_ATTACH`'s value.
    fn env(self) -> &'static str {
        match self {
            Self::PerProbe => "per-probe",
            Self::Batched => "batched",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::PerProbe => "perf-event uprobes (`per-probe`)",
            Self::Batched => "batched links (`batched`)",
        }
    }

    /// How gpu-trace's first line names it (after `… ms: `).
    fn said(self) -> &'static str {
        match self {
            Self::PerProbe => "one perf-event uprobe per symbol",
            Self::Batched => "batched uprobe links",
        }
    }
}

/// Compiles the library and the program into `dir`; returns the program.
fn build(root: &Path, dir: &Path) -> Result<std::path::PathBuf> {
    let lib = dir.join("lib");
    fs::create_dir_all(&lib)?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let exe = dir.join("bench_noop");
    let steps: [(&str, Vec<String>); 2] = [
        (
            "noop_lib.c",
            vec![
                "-shared".into(),
                "-fPIC".into(),
                "-o".into(),
                lib.join("libnoop.so").display().to_string(),
            ],
        ),
        (
            "bench_noop.c",
            vec![
                "-o".into(),
                exe.display().to_string(),
                format!("-L{}", lib.display()),
                "-lnoop".into(),
                "-Wl,--disable-new-dtags,-rpath,$ORIGIN/lib".into(),
            ],
        ),
    ];
    for (src, args) in steps {
        let src = root.join("examples/api").join(src);
        // The source before the flags: `-lnoop` must follow what needs it.
        let status = Command::new(&cc)
            .arg("-O2")
            .arg(&src)
            .args(&args)
            .status()
            .with_context(|| format!("running {cc:?} (install gcc)"))?;
        if !status.success() {
            bail!("compiling {} failed ({status})", src.display());
        }
    }
    Ok(exe)
}

/// `noop_fn`'s file offset in the library (what a tracefs uprobe names).
fn noop_offset(lib: &Path) -> Result<u64> {
    use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
    let bytes = fs::read(lib)?;
    let file = object::File::parse(&*bytes)?;
    let addr = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("noop_fn"))
        .map(|s| s.address())
        .context("noop_fn not in libnoop.so's dynamic symbols")?;
    file.segments()
        .find_map(|seg| {
            let (off, size) = seg.file_range();
            let va = seg.address();
            (va <= addr && addr < va + size).then(|| addr - va + off)
        })
        .context("noop_fn is in no loaded segment")
}

/// The tracefs uprobes of one configuration, removed on drop.
struct Uprobes<'a> {
    tracefs: &'a str,
}

impl<'a> Uprobes<'a> {
    fn add(tracefs: &'a str, lib: &Path, offset: u64, ret: bool) -> Result<Self> {
        let mut defs = format!("p:gt_bench/noop {}:{offset:#x}\n", lib.display());
        if ret {
            let _ = writeln!(defs, "r:gt_bench/noop_ret {}:{offset:#x}", lib.display());
        }
        let write = |file: &str, text: &str| {
            fs::write(format!("{tracefs}/{file}"), text)
                .with_context(|| format!("writing {tracefs}/{file}"))
        };
        let guard = Self { tracefs };
        write("uprobe_events", &defs)?;
        write("events/gt_bench/enable", "1")?;
        Ok(guard)
    }
}

impl Drop for Uprobes<'_> {
    fn drop(&mut self) {
        let _ = fs::write(format!("{}/events/gt_bench/enable", self.tracefs), "0");
        for e in ["-:gt_bench/noop_ret", "-:gt_bench/noop"] {
            let _ = fs::OpenOptions::new()
                .append(true)
                .open(format!("{}/uprobe_events", self.tracefs))
                .and_then(|mut f| std::io::Write::write_all(&mut f, e.as_bytes()));
        }
    }
}

/// One run of the per-call program.
struct CallRun {
    /// The program's own `ns_per_call`.
    ns: f64,
    /// gpu-trace's count of `noop_fn`, when it ran under it.
    count: Option<u64>,
    /// The attach method gpu-trace's first line named (empty when untraced).
    method: String,
}

fn run(cmd: &mut Command) -> Result<CallRun> {
    let out = cmd.output().context("running the benchmark program")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {text}{stderr}", out.status);
    }
    let ns = text
        .split_whitespace()
        .find_map(|f| f.strip_prefix("ns_per_call=")?.parse().ok())
        .with_context(|| format!("no ns_per_call in {text}"))?;
    let count = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("noop_fn"))
        .and_then(|l| l.split_whitespace().nth(2)?.parse().ok());
    let method = attach_line(&stderr).map(|l| l.method).unwrap_or_default();
    Ok(CallRun { ns, count, method })
}

/// gpu-trace api's first stderr line: `gpu-trace: api: N uprobes attached in K librar(y|ies)
/// for P target process(es) in T ms: METHOD`.
#[derive(Debug, PartialEq)]
struct AttachLine {
    probes: u64,
    ms: f64,
    method: String,
}

fn attach_line(stderr: &str) -> Option<AttachLine> {
    let line = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("gpu-trace: api: "))
        .find(|l| l.contains(" uprobes attached in "))?;
    let probes = line.split_whitespace().next()?.parse().ok()?;
    let (head, method) = line.split_once(" ms: ")?;
    let ms = head.rsplit(' ').next()?.parse().ok()?;
    Some(AttachLine {
        probes,
        ms,
        method: method.to_string(),
    })
}

/// `CLOCK_MONOTONIC` in ns: the clock the attach table's client prints its end on.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process as the subreaper of its descendants (`PR_SET_CHILD_SUBREAPER`) for the part:
/// the child a per-probe gpu-trace run leaves behind to remove its probes becomes this
/// process's child when gpu-trace exits, and its end (the probes gone) can be waited for.
/// Reset on drop.
struct Subreaper {
    /// The adopted children not reaped yet.
    adopted: Arc<Mutex<HashSet<i32>>>,
}

impl Subreaper {
    fn new() -> Result<Self> {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            bail!(
                "prctl(PR_SET_CHILD_SUBREAPER): {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Self {
            adopted: Default::default(),
        })
    }

    /// The children of this process not seen before — after a gpu-trace run has been waited
    /// for, the holders of its probes it left behind (it exited at `exit_ns`) — each waited for
    /// in a thread that returns the seconds from `exit_ns` to that child's end.
    fn adopt(&self, exit_ns: u64) -> Vec<JoinHandle<Result<f64>>> {
        let me = std::process::id() as i32;
        let mut new = Vec::new();
        for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // `pid (comm) state ppid …`: the comm may hold spaces and parentheses.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            if ppid == Some(me) && self.adopted.lock().unwrap().insert(pid) {
                new.push(pid);
            }
        }
        new.into_iter()
            .map(|pid| {
                let adopted = Arc::clone(&self.adopted);
                thread::spawn(move || {
                    let mut status = 0;
                    // SAFETY: waits for a child of this process; `status` is a valid int.
                    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
                    let end = mono_ns();
                    adopted.lock().unwrap().remove(&pid);
                    if r != pid {
                        bail!("waitpid({pid}): {}", std::io::Error::last_os_error());
                    }
                    Ok(end.saturating_sub(exit_ns) as f64 / 1e9)
                })
            })
            .collect()
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) };
    }
}

/// Waits for background probe holders; the first error.
fn join_all(holders: Vec<JoinHandle<Result<f64>>>) -> Result<f64> {
    let mut last = 0.0f64;
    for h in holders {
        let s = h
            .join()
            .map_err(|_| anyhow!("the thread waiting for a probe holder panicked"))??;
        last = last.max(s);
    }
    Ok(last)
}

pub(super) fn api_part(ctx: &Ctx, calls: u64, out: &mut String) -> Result<()> {
    let dir = ctx.work.join("api");
    let exe = build(&ctx.root, &dir)?;
    let lib = fs::canonicalize(dir.join("lib/libnoop.so"))?;
    let offset = noop_offset(&lib)?;
    let tracefs = system::ensure_tracefs()?;
    let mut configs = vec![
        Config::Untraced,
        Config::Bare,
        Config::BarePair,
        Config::Api,
    ];
    if batched_allowed().is_ok() {
        configs.push(Config::ApiPerProbe);
    }
    let reaper = Subreaper::new()?;
    let mut holders = Vec::new();
    let mut default_method = String::new();
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for rep in 0..ctx.reps {
        progress(format!("api: repetition {}/{}", rep + 1, ctx.reps));
        for k in 0..configs.len() {
            let i = (k + rep) % configs.len();
            let c = configs[i];
            let mut plain = Command::new(&exe);
            plain.args([calls.to_string(), "0".into()]);
            let r = match c {
                Config::Untraced => run(&mut plain)?,
                Config::Bare | Config::BarePair => {
                    let _probes = Uprobes::add(tracefs, &lib, offset, c == Config::BarePair)?;
                    run(&mut plain)?
                }
                Config::Api | Config::ApiPerProbe => {
                    let mut cmd = Command::new(&ctx.gpu_trace);
                    if c == Config::ApiPerProbe {
                        cmd.env(ATTACH_ENV, Method::PerProbe.env());
                    }
                    let r = run(cmd
                        .args(["api", "--probe", "libnoop.so:noop_fn", "--"])
                        .arg(&exe)
                        .args([calls.to_string(), "0".into()]))?;
                    holders.extend(reaper.adopt(mono_ns()));
                    if r.count != Some(calls) {
                        bail!(
                            "{} counted {:?} calls of noop_fn, the program made {calls}",
                            c.label(),
                            r.count
                        );
                    }
                    if c == Config::ApiPerProbe && !r.method.starts_with(Method::PerProbe.said()) {
                        bail!("{} ran with {:?}", c.label(), r.method);
                    }
                    if c == Config::Api && default_method.is_empty() {
                        default_method = r.method.clone();
                    }
                    r
                }
            };
            ns[i].push(r.ns);
        }
    }
    write_table(out, calls, ctx.reps, &configs, &ns, &default_method)?;
    if !holders.is_empty() {
        progress("api: waiting for the per-probe runs' probes to be removed");
    }
    join_all(holders)?;
    attach_part(ctx, &reaper, out)
}

fn write_table(
    out: &mut String,
    calls: u64,
    reps: usize,
    configs: &[Config],
    ns: &[Vec<f64>],
    default_method: &str,
) -> Result<()> {
    writeln!(
        out,
        "\n## 6. The API layer: a library call under uprobes\n\n\
         `examples/api/bench_noop.c` calls `noop_fn` (examples/api/noop_lib.c) {calls} times and \
         times itself; {reps} repetitions, configurations rotated. A hit's cost is the ns per \
         call minus the untraced one (medians [min–max]). `gpu-trace api` counted every call; \
         its default attach method here: {default_method}.\n\n\
         | configuration | ns per call | cost of a hit, ns | × untraced |\n|---|---|---|---|"
    )?;
    let base = spread(&ns[0]).map_or(0.0, |s| s.median);
    let hit = |v: &[f64]| spread(&v.iter().map(|x| x - base).collect::<Vec<_>>());
    for (c, v) in configs.iter().zip(ns) {
        let ratio = spread(v).map_or(0.0, |s| s.median / base.max(1e-9));
        writeln!(
            out,
            "| {} | {} | {} | {ratio:.1}× |",
            c.label(),
            fmt_ns(spread(v)),
            fmt_ns(hit(v))
        )?;
    }
    let pair = configs
        .iter()
        .position(|c| *c == Config::BarePair)
        .and_then(|i| hit(&ns[i]));
    writeln!(out)?;
    for (c, v) in configs.iter().zip(ns) {
        let name = match c {
            Config::Api => "gpu-trace api's hit",
            Config::ApiPerProbe => "gpu-trace api's hit with GPU_TRACE_UPROBE_ATTACH=per-probe",
            _ => continue,
        };
        if let (Some(pair), Some(layer)) = (pair, hit(v)) {
            writeln!(
                out,
                "- {name} / the bare uprobe + uretprobe's hit: {:.3} (issue 28's target: within \
                 10 %, ≤ 1.100)",
                layer.median / pair.median.max(1e-9)
            )?;
        }
    }
    Ok(())
}

/// The attach table's library: this many table-like symbols (`cuMemcpy0`…), two probes each.
const WIDE: usize = 100;

/// Calls of each of the library's symbols per run (10 with `--quick`).
const ATTACH_TIMES: u64 = 100;

/// Writes and compiles the library of [`WIDE`] `cuMemcpyN` (as `libcuda.so.1` in `dir/lib`) and
/// the client that calls each `argv[1]` times, then prints the library's own count (`calls=`)
/// and, as its last line, its end on `CLOCK_MONOTONIC` (`end_ns=`). Returns (client, library).
fn build_wide(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let libdir = dir.join("lib");
    fs::create_dir_all(&libdir)?;
    let mut lib = String::from("static long calls;\nlong gt_wide_calls(void) { return calls; }\n");
    let mut client = String::from(
        "#include <stdio.h>\n#include <stdlib.h>\n#include <time.h>\nlong gt_wide_calls(void);\n",
    );
    let mut body = String::new();
    for i in 0..WIDE {
        writeln!(lib, "int cuMemcpy{i}(void) {{ calls++; return 0; }}")?;
        writeln!(client, "int cuMemcpy{i}(void);")?;
        writeln!(body, "\t\tcuMemcpy{i}();")?;
    }
    write!(
        client,
        "int main(int argc, char **argv) {{\n\
         \tlong times = argc > 1 ? atol(argv[1]) : 1;\n\
         \tfor (long t = 0; t < times; t++) {{\n{body}\t}}\n\
         \tprintf(\"calls=%ld\\n\", gt_wide_calls());\n\
         \tstruct timespec ts;\n\
         \tclock_gettime(CLOCK_MONOTONIC, &ts);\n\
         \tprintf(\"end_ns=%lld\\n\", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);\n\
         \treturn 0;\n}}\n"
    )?;
    fs::write(dir.join("wide.c"), lib)?;
    fs::write(dir.join("wide_client.c"), client)?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let so = libdir.join("libcuda.so.1");
    let exe = dir.join("wide_client");
    let steps: [Vec<&OsStr>; 2] = [
        vec![
            "-shared".as_ref(),
            "-fPIC".as_ref(),
            "-o".as_ref(),
            so.as_os_str(),
        ],
        vec![
            "-o".as_ref(),
            exe.as_os_str(),
            "-L".as_ref(),
            libdir.as_os_str(),
            "-l:libcuda.so.1".as_ref(),
            "-Wl,--disable-new-dtags,-rpath,$ORIGIN/lib".as_ref(),
        ],
    ];
    for (src, args) in ["wide.c", "wide_client.c"].into_iter().zip(steps) {
        // The source before the flags: the library must follow what needs it.
        let status = Command::new(&cc)
            .arg("-O2")
            .arg(dir.join(src))
            .args(args)
            .status()
            .with_context(|| format!("running {cc:?} (install gcc)"))?;
        if !status.success() {
            bail!("compiling {} failed ({status})", dir.join(src).display());
        }
    }
    Ok((exe, fs::canonicalize(so)?))
}

/// One `gpu-trace api -- CLIENT` run of the attach table.
struct AttachRun {
    /// The attach time gpu-trace's first line gives.
    attach_ms: f64,
    /// From the client's own end to gpu-trace's exit.
    exit_lag_ms: f64,
    /// From starting gpu-trace to its exit.
    wall_ms: f64,
    /// The probe holders it left behind, not waited for yet.
    holders: Vec<JoinHandle<Result<f64>>>,
    /// Whether it left any (per-probe: a child that removes its probes after it exits).
    left_holders: bool,
    /// Seconds from gpu-trace's exit until its probes were gone (0: it removed them itself).
    gone_s: f64,
}

impl AttachRun {
    /// Waits for the run's probe holders.
    fn settle(&mut self) -> Result<()> {
        let holders = std::mem::take(&mut self.holders);
        if !holders.is_empty() {
            self.gone_s = join_all(holders)?;
        }
        Ok(())
    }
}

/// `gpu-trace api --format json -- CLIENT TIMES` with `method`: its figures, once its probe
/// count (200), method and final counts (the client's own) are checked.
fn attach_once(
    ctx: &Ctx,
    reaper: &Subreaper,
    (client, lib): (&Path, &Path),
    method: Method,
    times: u64,
) -> Result<AttachRun> {
    let mut cmd = Command::new(&ctx.gpu_trace);
    cmd.env(ATTACH_ENV, method.env())
        .args(["api", "--format", "json", "--"])
        .arg(client)
        .arg(times.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = mono_ns();
    let mut child = cmd.spawn().context("running gpu-trace api")?;
    let reader = |mut r: Box<dyn std::io::Read + Send>| {
        thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            String::from_utf8_lossy(&b).into_owned()
        })
    };
    let stdout = reader(Box::new(child.stdout.take().context("gpu-trace's stdout")?));
    let stderr = reader(Box::new(child.stderr.take().context("gpu-trace's stderr")?));
    let status = child.wait().context("waiting for gpu-trace")?;
    let exit_ns = mono_ns();
    let holders = reaper.adopt(exit_ns);
    let joined = |h: JoinHandle<String>| h.join().map_err(|_| anyhow!("a reader panicked"));
    let (stdout, stderr) = (joined(stdout)?, joined(stderr)?);
    let env = format!("{ATTACH_ENV}={}", method.env());
    if !status.success() {
        bail!("gpu-trace api with {env} failed ({status}): {stdout}{stderr}");
    }
    let line = attach_line(&stderr)
        .with_context(|| format!("no attach line from gpu-trace api with {env}: {stderr}"))?;
    if !line.method.starts_with(method.said()) {
        bail!("gpu-trace api with {env} attached with {}", line.method);
    }
    if line.probes != 2 * WIDE as u64 {
        bail!(
            "gpu-trace api with {env} attached {} uprobes, not {} (two per symbol of {}): \
             {stderr}",
            line.probes,
            2 * WIDE,
            lib.display()
        );
    }
    let field = |k: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
            .with_context(|| format!("no {k} line from the client: {stdout}"))
    };
    let (own, end_ns) = (field("calls=")?, field("end_ns=")?);
    check_counts(&stdout, lib, own, times).with_context(|| format!("with {env}"))?;
    Ok(AttachRun {
        attach_ms: line.ms,
        exit_lag_ms: exit_ns.saturating_sub(end_ns) as f64 / 1e6,
        wall_ms: exit_ns.saturating_sub(start) as f64 / 1e6,
        left_holders: !holders.is_empty(),
        holders,
        gone_s: 0.0,
    })
}

/// gpu-trace's final `API_STATS` for `lib` equal the client's own: `times` calls of each
/// symbol, `own` (the library's counter) in all.
fn check_counts(stdout: &str, lib: &Path, own: u64, times: u64) -> Result<()> {
    let lib = lib.to_string_lossy();
    let mut counted: HashMap<String, u64> = HashMap::new();
    for l in stdout.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value =
            serde_json::from_str(l).with_context(|| format!("gpu-trace's JSON line {l}"))?;
        if v["event"] == "API_STATS" && v["final"] == true && v["library"].as_str() == Some(&*lib) {
            let symbol = v["symbol"].as_str().unwrap_or_default().to_string();
            *counted.entry(symbol).or_default() += v["calls"].as_u64().unwrap_or(0);
        }
    }
    let total: u64 = counted.values().sum();
    let wrong: Vec<String> = (0..WIDE)
        .map(|i| format!("cuMemcpy{i}"))
        .filter_map(|s| {
            let n = counted.get(&s).copied().unwrap_or(0);
            (n != times).then(|| format!("{s} {n}"))
        })
        .collect();
    if own != WIDE as u64 * times || total != own || !wrong.is_empty() {
        bail!(
            "gpu-trace api counted {total} calls in {lib}, the client made {own} ({times} of \
             each of {WIDE} symbols); miscounted: {}",
            wrong.into_iter().take(5).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

/// Waits for every run's probe holders (a first run starts with no probes being removed).
fn settle_all(runs: &mut [[Vec<AttachRun>; 2]]) -> Result<()> {
    let pending = runs
        .iter()
        .flatten()
        .flatten()
        .any(|r| !r.holders.is_empty());
    if pending {
        progress("api: waiting for the per-probe runs' probes to be removed");
    }
    for r in runs.iter_mut().flatten().flatten() {
        r.settle()?;
    }
    Ok(())
}

/// The attach-and-detach table (issue 37 item 6).
fn attach_part(ctx: &Ctx, reaper: &Subreaper, out: &mut String) -> Result<()> {
    let dir = ctx.work.join("api-attach");
    let (client, lib) = build_wide(&dir)?;
    let times = if ctx.quick { 10 } else { ATTACH_TIMES };
    let absent = batched_allowed().err();
    let methods = if absent.is_none() {
        vec![Method::PerProbe, Method::Batched]
    } else {
        vec![Method::PerProbe]
    };
    // Per method: [first runs, runs right after].
    let mut runs: Vec<[Vec<AttachRun>; 2]> = methods.iter().map(|_| Default::default()).collect();
    for rep in 0..ctx.reps {
        for k in 0..methods.len() {
            let m = (k + rep) % methods.len();
            settle_all(&mut runs)?;
            progress(format!(
                "api: attach and detach, repetition {}/{}, {}",
                rep + 1,
                ctx.reps,
                methods[m].env()
            ));
            let files = (client.as_path(), lib.as_path());
            let first = attach_once(ctx, reaper, files, methods[m], times)?;
            let after = attach_once(ctx, reaper, files, methods[m], times)?;
            runs[m][0].push(first);
            runs[m][1].push(after);
        }
    }
    settle_all(&mut runs)?;
    write_attach_table(out, times, ctx.reps, &methods, &runs, absent.as_deref())
}

fn fmt_fig(s: Option<Spread>, digits: usize) -> String {
    match s {
        Some(s) => format!("{:.d$} [{:.d$}–{:.d$}]", s.median, s.min, s.max, d = digits),
        None => "—".into(),
    }
}

fn write_attach_table(
    out: &mut String,
    times: u64,
    reps: usize,
    methods: &[Method],
    runs: &[[Vec<AttachRun>; 2]],
    absent: Option<&str>,
) -> Result<()> {
    writeln!(
        out,
        "\n## 6b. The API layer: attaching and removing 200 probes\n\n\
         `gpu-trace api --format json -- CLIENT`: the client calls each of {WIDE} symbols \
         `cuMemcpy0`…`cuMemcpy{}` of a library `libcuda.so.1` (the table's `cuMemcpy*`: {} \
         probes, entry and return) {times} times, then prints its own end \
         (`CLOCK_MONOTONIC`). {reps} repetitions, the methods rotated; a first run starts once \
         every earlier run's probes are gone, the run right after starts as soon as the first \
         has exited. Every run attached {} probes and counted exactly the client's {} calls \
         ({times} of each symbol), or the part failed. Medians [min–max]; ratios paired per \
         repetition.\n",
        WIDE - 1,
        2 * WIDE,
        2 * WIDE,
        WIDE as u64 * times,
    )?;
    let mut header = String::from("| run | figure |");
    let mut rule = String::from("|---|---|");
    for m in methods {
        write!(header, " {} |", m.label())?;
        rule += "---|";
    }
    if methods.len() == 2 {
        header += " batched ÷ per-probe |";
        rule += "---|";
    }
    writeln!(out, "{header}\n{rule}")?;
    type Fig = fn(&AttachRun) -> f64;
    const GONE: &str = "probes gone, s after gpu-trace's exit";
    let figures: [(&str, Fig, usize); 4] = [
        ("attach, ms (gpu-trace's line)", |r| r.attach_ms, 1),
        ("client's exit → gpu-trace's exit, ms", |r| r.exit_lag_ms, 1),
        ("wall time of the run, ms", |r| r.wall_ms, 1),
        (GONE, |r| r.gone_s, 2),
    ];
    for (which, name) in ["first", "right after another"].iter().enumerate() {
        for (figure, get, digits) in figures {
            let mut row = format!("| {name} | {figure} |");
            let values: Vec<Vec<f64>> = runs
                .iter()
                .map(|r| r[which].iter().map(get).collect())
                .collect();
            for (v, r) in values.iter().zip(runs) {
                if figure == GONE && !r[which].iter().any(|r| r.left_holders) {
                    row += " 0 (removed before it exited) |";
                } else {
                    write!(row, " {} |", fmt_fig(spread(v), digits))?;
                }
            }
            if let [per, batched] = &values[..] {
                let ratios: Vec<f64> = per
                    .iter()
                    .zip(batched)
                    .filter(|(p, _)| **p > 0.0)
                    .map(|(p, b)| b / p)
                    .collect();
                let both = per.iter().chain(batched).all(|x| *x > 0.0);
                let ratio = if both {
                    fmt_ratio(spread(&ratios))
                } else {
                    "—".into()
                };
                write!(row, " {ratio} |")?;
            }
            writeln!(out, "{row}")?;
        }
    }
    if let Some(why) = absent {
        writeln!(
            out,
            "\nBatched links are not measured: this kernel does not allow them ({why})."
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attach_line_parses() {
        let stderr = "gpu-trace: api: 200 uprobes attached in 1 library for 1 target process(es) \
                      in 136 ms: batched uprobe links (one per process, library and direction)\n\
                      gpu-trace: other\n";
        let line = attach_line(stderr).unwrap();
        assert_eq!((line.probes, line.ms), (200, 136.0));
        assert!(line.method.starts_with(Method::Batched.said()));
        let per = "gpu-trace: api: 4 uprobes attached in 2 libraries for 3 target process(es) in \
                   7 ms: one perf-event uprobe per symbol (GPU_TRACE_UPROBE_ATTACH=per-probe)";
        let line = attach_line(per).unwrap();
        assert_eq!((line.probes, line.ms), (4, 7.0));
        assert!(line.method.starts_with(Method::PerProbe.said()));
        assert!(attach_line("gpu-trace: api: cannot probe x").is_none());
    }
}
