//! `cargo xtask bench`: what tracing costs, measured side by side in one run, printed as
//! Markdown tables of medians over repeated runs with their spread (min–max). Needs root.
//!
//! Parts (docs/performance.md explains each and records results):
//! - `syscalls`: unrelated syscalls (getppid, FIONREAD on a pipe, RM-shaped ioctls on an
//!   unwatched fd) untraced, under an empty BPF program on each hook gpu-trace can use (the
//!   kernel's floor), under gpu-trace on each hook, and under bpftrace (context);
//! - `ioctls`: a storm of RM-shaped ioctls on a watched device (`/dev/null`), untraced, under
//!   gpu-trace, under bpftrace counting the same calls, under bpftrace doing what gpu-trace does
//!   for each reported call (same filter, same reads, one line of the same fields), and under
//!   `strace -f -e trace=ioctl`;
//! - `bpf`: the kernel's own statistics of the programs (instructions, JIT size, ns per run);
//! - `pipeline`: userspace decode + model + output throughput on the GPU-host recordings;
//! - `knee`: the highest event rate gpu-trace sustains with zero drops at the default ring size,
//!   and what happens past it;
//! - `api`: a library call untraced, under a bare uprobe (and uretprobe), and under
//!   `gpu-trace api` (the API layer's cost per hit, issue 28); 200 probes attached and removed
//!   with each attach method, a run and one right after it (issue 37);
//! - `flight` (only with `--only flight`): gpu-trace's peak RSS with and without
//!   `--flight-recorder` under a hostile load, and a scrape's CPU time with many series.
//!
//! The workloads are the C program `bench/syscall_loop.c`, compiled here with `cc -O2`; gpu-trace
//! is the real binary, started in the background as a user would.

use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
    fs,
    io::{self, BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use gpu_trace::{
    cli::{Format, Timestamps},
    loader::SyscallHook,
    model::stats::KernelCounters,
    output::clock::Clock,
    pipeline::{Pipeline, PipelineConfig},
    probe::system,
    record::RecordReader,
};

use crate::host::{find_in_path, is_root, workspace_root};

mod against;
mod api;
mod bpf;
mod figures;
mod flight;
mod floor;
mod knee;
mod pipeline;
mod process;
mod syscalls;

use bpf::*;
use floor::{Floor, ProgramStats, RunTimeStats};
use knee::*;
use pipeline::*;
use process::*;
use syscalls::*;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// A short end-to-end run (2 repetitions, small loops): checks that every part works; its
    /// numbers are not measurements.
    #[arg(long)]
    quick: bool,
    /// Repetitions of each configuration (default 11; 2 with --quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Calls per syscall loop (default 1000000; 50000 with --quick). strace runs get 1/20.
    #[arg(long)]
    iters: Option<u64>,
    /// The gpu-trace binary to measure (default: `cargo build --release -p gpu-trace` and use it).
    #[arg(long, value_name = "PATH")]
    gpu_trace: Option<PathBuf>,
    /// The repository (for bench/ and the fixtures; default: this checkout, else the current
    /// directory). For running a copied xtask binary on another machine.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// A prebuilt bench/syscall_loop.c (default: compile it with cc), for machines without cc.
    #[arg(long, value_name = "PATH")]
    loop_bin: Option<PathBuf>,
    /// Also measure this other gpu-trace binary (default hook), e.g. the build before a change.
    #[arg(long, value_name = "PATH")]
    baseline: Option<PathBuf>,
    /// Run only these parts (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Seconds per rate step of the knee search (default 2; 0.5 with --quick).
    #[arg(long)]
    knee_seconds: Option<f64>,
    /// Calls of the API part's library function per run (default 200000; 20000 with --quick).
    #[arg(long)]
    api_calls: Option<u64>,
    /// Records fed through the pipeline per run (default 2000000; 100000 with --quick).
    #[arg(long)]
    pipeline_records: Option<usize>,
    /// Pipeline part: also run this revision's pipeline bench (built from a git worktree of it
    /// under target/), interleaved with this tree's on the same records, and print after/before.
    #[arg(long, value_name = "REV")]
    against: Option<String>,
    /// Pipeline part: keep this run's figures in bench/figures/pipeline.json (this CPU's entry),
    /// for later runs to be compared with.
    #[arg(long)]
    save: bool,
    /// Pipeline part: also write this run's figures as JSON to PATH (what `--against` reads).
    #[arg(long, value_name = "PATH")]
    emit: Option<PathBuf>,
    /// Pipeline part: a figure more than PCT % below the kept one is reported as a DROP.
    #[arg(long, value_name = "PCT", default_value_t = figures::NOISE_MARGIN * 100.0)]
    noise_margin: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Syscalls,
    Ioctls,
    Bpf,
    Pipeline,
    Knee,
    Api,
    /// `--flight-recorder`'s peak RSS under a hostile load, and a scrape with many series (not
    /// in the default set: `--only flight`).
    Flight,
}

impl Part {
    /// The parts run without `--only` (all but `flight`).
    const DEFAULT: [Part; 6] = [
        Part::Syscalls,
        Part::Ioctls,
        Part::Bpf,
        Part::Pipeline,
        Part::Knee,
        Part::Api,
    ];
}

/// One system call per iteration of `bench/syscall_loop.c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Workload {
    Getppid,
    IoctlPipe,
    IoctlUnwatched,
    RmEmit,
    RmIgnored,
}

impl Workload {
    const UNRELATED: [Self; 3] = [Self::Getppid, Self::IoctlPipe, Self::IoctlUnwatched];
    const RM: [Self; 2] = [Self::RmEmit, Self::RmIgnored];

    fn mode(self) -> &'static str {
        match self {
            Self::Getppid => "getppid",
            Self::IoctlPipe => "ioctl-pipe",
            Self::IoctlUnwatched => "ioctl-unwatched",
            Self::RmEmit => "rm-emit",
            Self::RmIgnored => "rm-ignored",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Getppid => "getppid()",
            Self::IoctlPipe => "ioctl(FIONREAD) on a pipe",
            Self::IoctlUnwatched => "RM-shaped ioctl on /dev/zero (unwatched)",
            Self::RmEmit => "RM storm: alloc/schedule/token/free, each reported",
            Self::RmIgnored => "RM control gpu-trace reads and ignores",
        }
    }
}

/// What runs around the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Setup {
    Untraced,
    Floor(Hook),
    GpuTrace(Option<Hook>),
    /// `--baseline`: another gpu-trace binary, default hook (to compare a change).
    Baseline,
    Bpftrace,
    /// bpftrace doing per reported call what gpu-trace does (like for like).
    BpftraceFull,
    Strace,
}

/// `SyscallHook` with an order, for table keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Hook {
    RawTp,
    TpBtf,
    Tracepoint,
}

impl Hook {
    const ALL: [Self; 3] = [Self::RawTp, Self::TpBtf, Self::Tracepoint];

    fn syscall_hook(self) -> SyscallHook {
        match self {
            Self::RawTp => SyscallHook::RawTp,
            Self::TpBtf => SyscallHook::TpBtf,
            Self::Tracepoint => SyscallHook::Tracepoint,
        }
    }

    fn cli(self) -> &'static str {
        match self {
            Self::RawTp => "raw-tp",
            Self::TpBtf => "tp-btf",
            Self::Tracepoint => "tracepoint",
        }
    }

    fn attach(self) -> &'static str {
        match self {
            Self::RawTp => "raw_tp/sys_exit",
            Self::TpBtf => "tp_btf/sys_exit",
            Self::Tracepoint => "tracepoint/syscalls:sys_{enter,exit}_{ioctl,close}",
        }
    }

    /// The syscall hook a gpu-trace start-up line reports (`hooks: ioctl+close → …`).
    fn from_startup_line(line: &str) -> Option<Self> {
        let syscall = line.split("ioctl+close → ").nth(1)?;
        Self::ALL
            .into_iter()
            .find(|h| syscall.starts_with(h.attach()))
    }

    fn short(self) -> &'static str {
        match self {
            Self::RawTp => "raw_tp",
            Self::TpBtf => "tp_btf",
            Self::Tracepoint => "tracepoint",
        }
    }
}

impl Setup {
    fn label(self) -> String {
        match self {
            Self::Untraced => "untraced".into(),
            Self::Floor(h) => format!("empty program, {}", h.short()),
            Self::GpuTrace(None) => "gpu-trace (default hook)".into(),
            Self::GpuTrace(Some(h)) => format!("gpu-trace --syscall-hook {}", h.cli()),
            Self::Baseline => "baseline gpu-trace (--baseline)".into(),
            Self::Bpftrace => "bpftrace, counting".into(),
            Self::BpftraceFull => "bpftrace, same reads and fields".into(),
            Self::Strace => "strace -f -e trace=ioctl".into(),
        }
    }
}

/// The line `syscall_loop` prints.
#[derive(Clone, Copy, Debug, Default)]
struct LoopResult {
    calls: u64,
    warmup: u64,
    elapsed_ns: u64,
    ns_per_call: f64,
    cpu_ns_per_call: f64,
    /// CPU time the tracer's own process spent per call while the loop ran (0 without one).
    tracer_cpu_ns_per_call: f64,
}

fn parse_loop_line(line: &str) -> Result<LoopResult> {
    let mut r = LoopResult::default();
    for field in line.split_whitespace() {
        let Some((k, v)) = field.split_once('=') else {
            continue;
        };
        match k {
            "calls" => r.calls = v.parse()?,
            "warmup" => r.warmup = v.parse()?,
            "elapsed_ns" => r.elapsed_ns = v.parse()?,
            "ns_per_call" => r.ns_per_call = v.parse()?,
            "cpu_ns_per_call" => r.cpu_ns_per_call = v.parse()?,
            _ => {}
        }
    }
    if r.calls == 0 {
        bail!("syscall_loop printed no result: {line:?}");
    }
    Ok(r)
}

/// Median and range of a set of numbers.
#[derive(Clone, Copy, Debug)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(values: &[f64]) -> Option<Spread> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[n - 1],
    })
}

fn fmt_ns(s: Option<Spread>) -> String {
    match s {
        Some(s) => format!("{:.1} [{:.1}–{:.1}]", s.median, s.min, s.max),
        None => "—".into(),
    }
}

fn fmt_ratio(s: Option<Spread>) -> String {
    match s {
        Some(s) => format!("{:.3}× [{:.3}–{:.3}]", s.median, s.min, s.max),
        None => "—".into(),
    }
}

fn fmt_rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2} M/s", per_s / 1e6)
    } else {
        format!("{:.0} k/s", per_s / 1e3)
    }
}

/// Everything the parts share.
struct Ctx {
    root: PathBuf,
    loop_bin: PathBuf,
    gpu_trace: PathBuf,
    baseline: Option<PathBuf>,
    work: PathBuf,
    bpftrace: Option<PathBuf>,
    strace: Option<PathBuf>,
    reps: usize,
    iters: u64,
    quick: bool,
    cpu: usize,
    dev_null_rdev: u32,
    /// BPF program ids loaded before the bench started (other users of the machine).
    baseline_progs: HashSet<u32>,
    /// Programs seen during untraced runs that were not there at the start and that no setup
    /// of this bench loaded.
    interference: Vec<String>,
    /// The programs the bench's own setups loaded (gpu-trace, bpftrace, the floor), by id: the
    /// kernel frees them a moment after their process ends, and they are not interference.
    own_progs: std::cell::RefCell<HashSet<u32>>,
    /// Part 1's median CPU ns per call under each empty program, per workload (for the
    /// program-cost view of the 1.05× target in part 3).
    floor_cpu: BTreeMap<(Hook, Workload), f64>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask bench loads BPF programs and must run as root: sudo -E cargo xtask bench"
        );
    }
    let built_in = workspace_root();
    let root = match &args.root {
        Some(r) => r.clone(),
        None if built_in.join("bench").is_dir() => built_in,
        None => std::env::current_dir()?,
    };
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    // <target>/<profile>/xtask
    let target = exe
        .parent()
        .and_then(Path::parent)
        .context("xtask binary is not in a target dir")?;
    if cfg!(debug_assertions) && !args.quick && std::env::var_os(NO_REEXEC).is_none() {
        return reexec_release(&root, target);
    }
    let work = target.join("xtask-bench");
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let parts: Vec<Part> = if args.only.is_empty() {
        Part::DEFAULT.to_vec()
    } else {
        args.only.clone()
    };
    // The pipeline part measures the library compiled into xtask: it needs neither binary.
    let binaries = parts.iter().any(|p| *p != Part::Pipeline);
    let gpu_trace = match &args.gpu_trace {
        Some(p) => p.clone(),
        None if !binaries => PathBuf::new(),
        None => build_gpu_trace(&root, target)?,
    };
    if binaries && !gpu_trace.exists() {
        bail!(
            "{} does not exist: build gpu-trace or pass --gpu-trace PATH",
            gpu_trace.display()
        );
    }
    let loop_bin = match &args.loop_bin {
        Some(p) => p.clone(),
        None if !binaries => PathBuf::new(),
        None => compile_loop(&root, &work)?,
    };
    let ncpu = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut ctx = new_ctx(&args, root.clone(), (loop_bin, gpu_trace, work), ncpu)?;

    let mut out = String::new();
    writeln!(out, "{}", machine_header(&ctx, &args, ncpu))?;
    print_now(&mut out);
    run_parts(&mut ctx, &args, &parts, ncpu, &mut out)?;
    writeln!(out, "\nload average at the end: {}", load_average())?;
    if !ctx.interference.is_empty() {
        writeln!(
            out,
            "\nWARNING: other BPF programs appeared during untraced runs (another user of this \
             machine): {}. Their hooks add to every syscall: re-run on a quiet machine.",
            ctx.interference.join(", ")
        )?;
    }
    print_now(&mut out);
    Ok(())
}

/// The context of a run: the binaries (`loop_bin`, `gpu_trace`), the work directory, the counts
/// `args` give, and the BPF programs loaded before it.
fn new_ctx(
    args: &BenchArgs,
    root: PathBuf,
    (loop_bin, gpu_trace, work): (PathBuf, PathBuf, PathBuf),
    ncpu: usize,
) -> Result<Ctx> {
    Ok(Ctx {
        root,
        loop_bin,
        gpu_trace,
        baseline: args.baseline.clone(),
        work,
        bpftrace: find_in_path("bpftrace"),
        strace: find_in_path("strace"),
        reps: args.reps.unwrap_or(if args.quick { 2 } else { 11 }).max(1),
        iters: args
            .iters
            .unwrap_or(if args.quick { 50_000 } else { 1_000_000 })
            .max(1000),
        quick: args.quick,
        cpu: ncpu - 1,
        dev_null_rdev: system::char_device_kernel_dev(Path::new("/dev/null"))?,
        baseline_progs: floor::loaded_program_stats()?
            .iter()
            .map(|p| p.id)
            .collect(),
        interference: Vec::new(),
        own_progs: Default::default(),
        floor_cpu: BTreeMap::new(),
    })
}

/// The parts asked for, in their order, each appending its tables to `out`.
fn run_parts(
    ctx: &mut Ctx,
    args: &BenchArgs,
    parts: &[Part],
    ncpu: usize,
    out: &mut String,
) -> Result<()> {
    if parts.contains(&Part::Syscalls) || parts.contains(&Part::Ioctls) {
        syscall_parts(ctx, parts, out)?;
    }
    if parts.contains(&Part::Bpf) {
        bpf_part(ctx, out)?;
    }
    if parts.contains(&Part::Pipeline) {
        let opts = PipelineOpts {
            records: args
                .pipeline_records
                .unwrap_or(if ctx.quick { 100_000 } else { 2_000_000 }),
            against: args.against.clone(),
            save: args.save,
            emit: args.emit.clone(),
            margin: args.noise_margin / 100.0,
        };
        pipeline_part(ctx, &opts, out)?;
    }
    if parts.contains(&Part::Knee) {
        let seconds = args
            .knee_seconds
            .unwrap_or(if ctx.quick { 0.5 } else { 2.0 });
        knee_part(ctx, seconds, ncpu, out)?;
    }
    if parts.contains(&Part::Api) {
        let calls = args
            .api_calls
            .unwrap_or(if ctx.quick { 20_000 } else { 200_000 });
        api::api_part(ctx, calls, out)?;
        print_now(out);
    }
    if parts.contains(&Part::Flight) {
        flight::flight_part(ctx, out)?;
    }
    Ok(())
}

/// Set when xtask re-ran itself as a release build.
const NO_REEXEC: &str = "XTASK_BENCH_RELEASE";

/// The pipeline part measures gpu-trace's library as compiled into xtask: `cargo xtask` builds a
/// debug binary, so build xtask in release and run that instead, with the same arguments.
fn reexec_release(root: &Path, target: &Path) -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    progress("building xtask in release (cargo build --release -p xtask) and running that");
    cargo_build_xtask(root, target)?;
    let err = Command::new(target.join("release/xtask"))
        .args(std::env::args_os().skip(1))
        .env(NO_REEXEC, "1")
        .exec();
    Err(anyhow!(err).context("running the release build of xtask"))
}

/// `cargo build --release -p xtask` of the checkout in `dir`, into `target`.
pub(super) fn cargo_build_xtask(dir: &Path, target: &Path) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(dir)
        .args(["build", "--release", "-p", "xtask"])
        .env("CARGO_TARGET_DIR", target)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!(
            "cargo build --release -p xtask in {} failed ({status}); fix the build",
            dir.display()
        );
    }
    Ok(())
}

/// Prints what has been collected so far (the tables appear part by part).
fn print_now(out: &mut String) {
    print!("{out}");
    let _ = io::stdout().flush();
    out.clear();
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("bench: {}", msg.as_ref());
}

fn build_gpu_trace(root: &Path, target: &Path) -> Result<PathBuf> {
    progress("building gpu-trace (cargo build --release -p gpu-trace)");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args([
            "build",
            "--release",
            "-p",
            "gpu-trace",
            "--bin",
            "gpu-trace",
        ])
        .env("CARGO_TARGET_DIR", target)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("building gpu-trace failed ({status}); fix the build, or pass --gpu-trace PATH");
    }
    Ok(target.join("release/gpu-trace"))
}

fn compile_loop(root: &Path, work: &Path) -> Result<PathBuf> {
    let src = root.join("bench/syscall_loop.c");
    let bin = work.join("syscall_loop");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-Wall", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .with_context(|| format!("running {cc:?} (install gcc: apt-get install gcc)"))?;
    if !status.success() {
        bail!("compiling {} failed ({status})", src.display());
    }
    Ok(bin)
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "?".into())
}

/// The processor's model name (`/proc/cpuinfo`).
fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

fn machine_header(ctx: &Ctx, args: &BenchArgs, ncpu: usize) -> String {
    let cpu = cpu_model();
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        argv.push("bench".into());
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# gpu-trace bench{}",
        if args.quick {
            " (--quick: a smoke run, not a measurement)"
        } else {
            ""
        }
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "- command: `cargo xtask {}`", argv.join(" "));
    let _ = writeln!(
        s,
        "- date: {}",
        command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
    );
    let _ = writeln!(
        s,
        "- host: {}, kernel {}",
        system::host_name(),
        system::kernel_release()
    );
    let _ = writeln!(
        s,
        "- CPU: {cpu}, {ncpu} CPUs; workloads pinned to CPU {}",
        ctx.cpu
    );
    let _ = writeln!(s, "- load average at the start: {}", load_average());
    if ctx.gpu_trace.as_os_str().is_empty() {
        let _ = writeln!(
            s,
            "- gpu-trace: the library compiled into this xtask (pipeline part)"
        );
    } else {
        let _ = writeln!(s, "- gpu-trace: {}", ctx.gpu_trace.display());
    }
    if let Some(b) = &ctx.baseline {
        let _ = writeln!(s, "- baseline gpu-trace: {}", b.display());
    }
    let _ = writeln!(
        s,
        "- bpftrace: {}; strace: {}",
        ctx.bpftrace
            .as_ref()
            .map_or("not installed (apt-get install bpftrace)".into(), |p| {
                command_line(&p.to_string_lossy(), &["--version"])
            }),
        ctx.strace
            .as_ref()
            .map_or("not installed (apt-get install strace)".into(), |p| {
                command_line(&p.to_string_lossy(), &["--version"])
                    .lines()
                    .next()
                    .unwrap_or("?")
                    .to_string()
            }),
    );
    let _ = writeln!(
        s,
        "- {} repetitions, configurations interleaved (rotated each repetition); {} calls per loop \
         (strace: {}). Figures are medians [min–max]; ratios are paired per repetition.",
        ctx.reps,
        ctx.iters,
        strace_iters(ctx.iters)
    );
    let baseline = ctx.baseline_progs.len();
    if baseline != 0 {
        let _ = writeln!(
            s,
            "- {baseline} BPF programs were already loaded at the start (other users of the machine)"
        );
    }
    s
}

fn strace_iters(iters: u64) -> u64 {
    (iters / 20).max(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_median_and_range() {
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = spread(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        assert!(spread(&[]).is_none());
    }

    #[test]
    fn loop_lines_parse() {
        let r = parse_loop_line(
            "calls=2000 warmup=1000 elapsed_ns=5 ns_per_call=12.50 cpu_ns_per_call=11.25",
        )
        .unwrap();
        assert_eq!((r.calls, r.warmup, r.elapsed_ns), (2000, 1000, 5));
        assert_eq!((r.ns_per_call, r.cpu_ns_per_call), (12.5, 11.25));
        assert!(parse_loop_line("ready pid=1").is_err());
    }
}
