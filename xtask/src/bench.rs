//! `cargo xtask bench`: what tracing costs, measured side by side in one run, printed as
//! Markdown tables of medians over repeated runs with their spread (min–max). Needs root.
//!
//! Parts (docs/performance.md explains each and records results):
//! - `syscalls`: unrelated syscalls (getppid, FIONREAD on a pipe, RM-shaped ioctls on an
//!   unwatched fd) untraced, under an empty BPF program on each hook gpu-trace can use (the
//!   kernel's floor), under gpu-trace on each hook, and under bpftrace (context);
//! - `ioctls`: a storm of RM-shaped ioctls on a watched device (`/dev/null`), untraced, under
//!   gpu-trace, under bpftrace counting the same calls, and under `strace -f -e trace=ioctl`;
//! - `bpf`: the kernel's own statistics of the programs (instructions, JIT size, ns per run);
//! - `pipeline`: userspace decode + model + output throughput on the GPU-host recordings;
//! - `knee`: the highest event rate gpu-trace sustains with zero drops at the default ring size,
//!   and what happens past it.
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
    bench_support::{self, Floor, ProgramStats, RunTimeStats},
    cli::{Format, Timestamps},
    loader::SyscallHook,
    model::stats::KernelCounters,
    output::clock::Clock,
    pipeline::{Pipeline, PipelineConfig},
    probe::system,
    record::RecordReader,
};

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
    /// Records fed through the pipeline per run (default 2000000; 100000 with --quick).
    #[arg(long)]
    pipeline_records: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Syscalls,
    Ioctls,
    Bpf,
    Pipeline,
    Knee,
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

/// One pipeline-throughput row: label, records/CPU-s, events/CPU-s, records/wall-s per
/// repetition, and events per run.
type PipelineRow = (String, Vec<f64>, Vec<f64>, Vec<f64>, u64);

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
    /// Programs seen during untraced runs that were not there at the start.
    interference: Vec<String>,
    /// Part 1's median CPU ns per call under each empty program, per workload (for the
    /// program-cost view of the 1.05× target in part 3).
    floor_cpu: BTreeMap<(Hook, Workload), f64>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "cargo xtask bench loads BPF programs and must run as root: sudo -E cargo xtask bench"
        );
    }
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
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

    let gpu_trace = match &args.gpu_trace {
        Some(p) => p.clone(),
        None => build_gpu_trace(&root, target)?,
    };
    if !gpu_trace.exists() {
        bail!(
            "{} does not exist: build gpu-trace or pass --gpu-trace PATH",
            gpu_trace.display()
        );
    }
    let loop_bin = match &args.loop_bin {
        Some(p) => p.clone(),
        None => compile_loop(&root, &work)?,
    };
    let parts: Vec<Part> = if args.only.is_empty() {
        vec![
            Part::Syscalls,
            Part::Ioctls,
            Part::Bpf,
            Part::Pipeline,
            Part::Knee,
        ]
    } else {
        args.only.clone()
    };
    let ncpu = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut ctx = Ctx {
        root: root.clone(),
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
        baseline_progs: bench_support::loaded_program_stats()?
            .iter()
            .map(|p| p.id)
            .collect(),
        interference: Vec::new(),
        floor_cpu: BTreeMap::new(),
    };

    let mut out = String::new();
    writeln!(out, "{}", machine_header(&ctx, &args, ncpu))?;
    print_now(&mut out);
    if parts.contains(&Part::Syscalls) || parts.contains(&Part::Ioctls) {
        syscall_parts(&mut ctx, &parts, &mut out)?;
    }
    if parts.contains(&Part::Bpf) {
        bpf_part(&ctx, &mut out)?;
    }
    if parts.contains(&Part::Pipeline) {
        let records = args
            .pipeline_records
            .unwrap_or(if ctx.quick { 100_000 } else { 2_000_000 });
        pipeline_part(&ctx, records, &mut out)?;
    }
    if parts.contains(&Part::Knee) {
        let seconds = args
            .knee_seconds
            .unwrap_or(if ctx.quick { 0.5 } else { 2.0 });
        knee_part(&ctx, seconds, ncpu, &mut out)?;
    }
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

/// Set when xtask re-ran itself as a release build.
const NO_REEXEC: &str = "XTASK_BENCH_RELEASE";

/// The pipeline part measures gpu-trace's library as compiled into xtask: `cargo xtask` builds a
/// debug binary, so build xtask in release and run that instead, with the same arguments.
fn reexec_release(root: &Path, target: &Path) -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    progress("building xtask in release (cargo build --release -p xtask) and running that");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "xtask"])
        .env("CARGO_TARGET_DIR", target)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("building xtask in release failed ({status}); fix the build");
    }
    let err = Command::new(target.join("release/xtask"))
        .args(std::env::args_os().skip(1))
        .env(NO_REEXEC, "1")
        .exec();
    Err(anyhow!(err).context("running the release build of xtask"))
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

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
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

fn machine_header(ctx: &Ctx, args: &BenchArgs, ncpu: usize) -> String {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
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
    let _ = writeln!(s, "- gpu-trace: {}", ctx.gpu_trace.display());
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

// ---------------------------------------------------------------------------------------------
// Workload and tracer processes
// ---------------------------------------------------------------------------------------------

fn run_loop(ctx: &Ctx, wl: Workload, iters: u64, strace: bool) -> Result<LoopResult> {
    let mut cmd = if strace {
        let mut c = Command::new(ctx.strace.as_ref().context("strace is not installed")?);
        c.args(["-f", "-e", "trace=ioctl", "-o", "/dev/null"])
            .arg(&ctx.loop_bin);
        c
    } else {
        Command::new(&ctx.loop_bin)
    };
    cmd.args([
        wl.mode(),
        "--iters",
        &iters.to_string(),
        "--cpu",
        &ctx.cpu.to_string(),
    ]);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("running syscall_loop")?;
    let mut text = String::new();
    child.stdout.take().unwrap().read_to_string(&mut text)?;
    // wait4 rather than Child::wait: the CPU time of the whole process tree (strace + loop).
    let mut status = 0;
    // SAFETY: zeroed rusage filled by the kernel.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: our own child, valid pointers.
    let rc = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    if rc < 0 {
        bail!("waiting for syscall_loop: {}", io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!(
            "syscall_loop {} failed (wait status {status:#x})",
            wl.mode()
        );
    }
    let mut r = parse_loop_line(text.lines().last().unwrap_or_default())?;
    if strace {
        // strace's CPU: the tree's CPU minus the loop's own (timed region; the loop's start-up
        // and warm-up are counted as strace's, a small overestimate).
        let tv = |t: libc::timeval| t.tv_sec as f64 * 1e9 + t.tv_usec as f64 * 1e3;
        let tree = tv(usage.ru_utime) + tv(usage.ru_stime);
        let own = r.cpu_ns_per_call * r.calls as f64;
        r.tracer_cpu_ns_per_call = (tree - own).max(0.0) / (r.calls + r.warmup) as f64;
    }
    Ok(r)
}

/// Lines a child writes on one of its pipes, gathered by a thread.
struct LineReader {
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl LineReader {
    fn spawn(pipe: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `needle`; fails when the pipe closes or after `timeout`.
    fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return Ok(line);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("timed out waiting for {needle:?}; got: {:?}", self.seen)
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("exited before {needle:?}; it said: {:?}", self.seen)
                }
            }
        }
    }

    /// Everything up to the end of the pipe.
    fn rest(mut self) -> Vec<String> {
        while let Ok(line) = self.rx.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(line);
        }
        self.seen
    }
}

fn interrupt_and_wait(child: &mut Child, what: &str) -> Result<ExitStatus> {
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not stop within 20 s of SIGINT (killed)");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// gpu-trace running in the background.
struct GpuTraceRun {
    child: Child,
    stderr: LineReader,
    output: PathBuf,
    hooks: String,
}

/// What a gpu-trace run reported at its end.
#[derive(Clone, Debug, Default)]
struct GpuTraceEnd {
    emitted: u64,
    dropped: u64,
    exit_code: Option<i32>,
    stderr: Vec<String>,
}

fn start_gpu_trace(
    ctx: &Ctx,
    bin: &Path,
    hook: Option<Hook>,
    pid: Option<u32>,
    tag: &str,
) -> Result<GpuTraceRun> {
    let output = ctx.work.join(format!("gpu-trace-{tag}.out"));
    let mut cmd = Command::new(bin);
    cmd.args(["--watch-device", "/dev/null", "-o"]).arg(&output);
    if let Some(h) = hook {
        cmd.args(["--syscall-hook", h.cli()]);
    }
    if let Some(pid) = pid {
        cmd.args(["--pid", &pid.to_string()]);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut stderr = LineReader::spawn(child.stderr.take().unwrap());
    let hooks = match stderr.wait_for("hooks:", Duration::from_secs(60)) {
        Ok(line) => line,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.context("gpu-trace did not start"));
        }
    };
    Ok(GpuTraceRun {
        child,
        stderr,
        output,
        hooks,
    })
}

fn stop_gpu_trace(mut run: GpuTraceRun) -> Result<GpuTraceEnd> {
    let status = interrupt_and_wait(&mut run.child, "gpu-trace")?;
    let stderr = run.stderr.rest();
    let text = fs::read_to_string(&run.output)
        .with_context(|| format!("reading {}", run.output.display()))?;
    let _ = fs::remove_file(&run.output);
    let stat = |key: &str| -> u64 {
        text.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some(key))
                    .then(|| it.next().and_then(|v| v.parse().ok()))
                    .flatten()
            })
            .next_back()
            .unwrap_or(0)
    };
    if !text.contains("gpu-trace statistics") {
        bail!("gpu-trace ended ({status}) without its statistics block; stderr: {stderr:?}");
    }
    Ok(GpuTraceEnd {
        emitted: stat("emitted"),
        dropped: stat("dropped"),
        exit_code: status.code(),
        stderr,
    })
}

/// bpftrace counting the RM-shaped ioctls on the watched device, as gpu-trace filters them.
struct BpftraceRun {
    child: Child,
    stdout: LineReader,
}

fn bpftrace_program(rdev: u32) -> String {
    format!(
        "tracepoint:syscalls:sys_enter_ioctl /(args->cmd & 0xff) == 0x29 || (args->cmd & 0xff) == 0x2a \
         || (args->cmd & 0xff) == 0x2b || (args->cmd & 0xff) == 0xd3/ {{ \
         $f = *(curtask->files->fdt->fd + args->fd); \
         if ($f->f_inode->i_rdev == {rdev:#x}) {{ @calls[args->cmd] = count(); }} }}"
    )
}

fn start_bpftrace(ctx: &Ctx) -> Result<BpftraceRun> {
    let bin = ctx.bpftrace.as_ref().context("bpftrace is not installed")?;
    let mut child = Command::new(bin)
        .args(["-e", &bpftrace_program(ctx.dev_null_rdev)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting bpftrace")?;
    let mut stdout = LineReader::spawn(child.stdout.take().unwrap());
    if let Err(e) = stdout.wait_for("Attaching", Duration::from_secs(60)) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e.context("bpftrace did not start"));
    }
    // bpftrace prints "Attaching" just before it attaches.
    thread::sleep(Duration::from_millis(500));
    Ok(BpftraceRun { child, stdout })
}

/// Stops bpftrace; returns the calls it counted.
fn stop_bpftrace(mut run: BpftraceRun) -> Result<u64> {
    interrupt_and_wait(&mut run.child, "bpftrace")?;
    Ok(run
        .stdout
        .rest()
        .iter()
        .filter(|l| l.starts_with("@calls["))
        .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
        .sum())
}

enum Running {
    Nothing,
    Floor(#[allow(dead_code)] Floor),
    GpuTrace(GpuTraceRun),
    Bpftrace(BpftraceRun),
}

impl Running {
    /// The tracer's process, when it has one.
    fn pid(&self) -> Option<u32> {
        match self {
            Self::GpuTrace(r) => Some(r.child.id()),
            Self::Bpftrace(r) => Some(r.child.id()),
            Self::Nothing | Self::Floor(_) => None,
        }
    }
}

/// CPU time (ns) of every thread of a process (`/proc/PID/task/*/schedstat`, first field).
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn start(ctx: &Ctx, setup: Setup) -> Result<Running> {
    Ok(match setup {
        Setup::Untraced | Setup::Strace => Running::Nothing,
        Setup::Floor(h) => Running::Floor(Floor::attach(h.syscall_hook())?),
        Setup::GpuTrace(h) => {
            Running::GpuTrace(start_gpu_trace(ctx, &ctx.gpu_trace, h, None, "bench")?)
        }
        Setup::Baseline => {
            let bin = ctx.baseline.as_ref().context("no --baseline binary")?;
            Running::GpuTrace(start_gpu_trace(ctx, bin, None, None, "baseline")?)
        }
        Setup::Bpftrace => Running::Bpftrace(start_bpftrace(ctx)?),
    })
}

/// New BPF programs (not ours: called while nothing of ours is loaded).
fn foreign_programs(ctx: &Ctx) -> Vec<String> {
    bench_support::loaded_program_stats()
        .map(|progs| {
            progs
                .into_iter()
                .filter(|p| !ctx.baseline_progs.contains(&p.id))
                .map(|p| format!("{} (id {})", p.name, p.id))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Parts 1 and 2: syscalls and ioctls
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Samples {
    /// (setup, workload) → one result per repetition, in repetition order.
    loops: BTreeMap<(Setup, Workload), Vec<LoopResult>>,
    /// gpu-trace runs: hooks line, emitted, dropped.
    gpu_trace: BTreeMap<Setup, Vec<(String, GpuTraceEnd)>>,
    /// bpftrace runs: (counted, issued).
    bpftrace: Vec<(u64, u64)>,
}

fn syscall_parts(ctx: &mut Ctx, parts: &[Part], out: &mut String) -> Result<()> {
    let want_unrelated = parts.contains(&Part::Syscalls);
    let want_rm = parts.contains(&Part::Ioctls);
    let mut setups = vec![Setup::Untraced];
    let mut notes = Vec::new();
    if want_unrelated {
        for h in Hook::ALL {
            // Refused hooks are reported and left out (gpu-trace cannot use them either).
            match Floor::attach(h.syscall_hook()) {
                Ok(floor) => {
                    drop(floor);
                    setups.push(Setup::Floor(h));
                }
                Err(e) => notes.push(format!("{}: {e}", h.attach())),
            }
        }
    }
    setups.push(Setup::GpuTrace(None));
    if ctx.baseline.is_some() {
        setups.push(Setup::Baseline);
    }
    if want_unrelated {
        for h in Hook::ALL {
            if setups.contains(&Setup::Floor(h)) {
                setups.push(Setup::GpuTrace(Some(h)));
            }
        }
    }
    match &ctx.bpftrace {
        Some(_) => setups.push(Setup::Bpftrace),
        None => notes.push("bpftrace: not installed (apt-get install bpftrace); left out".into()),
    }
    if want_rm {
        match &ctx.strace {
            Some(_) => setups.push(Setup::Strace),
            None => notes.push("strace: not installed (apt-get install strace); left out".into()),
        }
    }
    let workloads_for = |setup: Setup| -> Vec<Workload> {
        let mut w = Vec::new();
        if want_unrelated && setup != Setup::Strace {
            w.extend(Workload::UNRELATED);
        }
        if want_rm && !matches!(setup, Setup::Floor(_) | Setup::GpuTrace(Some(_))) {
            w.extend(Workload::RM);
        }
        w
    };

    let mut samples = Samples::default();
    for rep in 0..ctx.reps {
        progress(format!(
            "syscalls/ioctls: repetition {}/{}",
            rep + 1,
            ctx.reps
        ));
        let n = setups.len();
        for i in 0..n {
            let setup = setups[(i + rep) % n];
            let workloads = workloads_for(setup);
            if workloads.is_empty() {
                continue;
            }
            if setup == Setup::Untraced {
                ctx.interference.extend(foreign_programs(ctx));
            }
            let running =
                start(ctx, setup).with_context(|| format!("starting {}", setup.label()))?;
            let mut rm_calls = 0;
            for wl in workloads {
                let iters = if setup == Setup::Strace {
                    strace_iters(ctx.iters)
                } else {
                    ctx.iters
                };
                let tracer_before = running.pid().map(process_cpu_ns);
                let mut r = run_loop(ctx, wl, iters, setup == Setup::Strace)?;
                if let (Some(pid), Some(before)) = (running.pid(), tracer_before) {
                    let used = process_cpu_ns(pid).saturating_sub(before);
                    r.tracer_cpu_ns_per_call = used as f64 / (r.calls + r.warmup) as f64;
                }
                if matches!(wl, Workload::RmEmit | Workload::RmIgnored) {
                    rm_calls += r.calls + r.warmup;
                }
                samples.loops.entry((setup, wl)).or_default().push(r);
            }
            match running {
                Running::GpuTrace(run) => {
                    let hooks = run.hooks.clone();
                    let end = stop_gpu_trace(run)?;
                    samples
                        .gpu_trace
                        .entry(setup)
                        .or_default()
                        .push((hooks, end));
                }
                Running::Bpftrace(run) => samples.bpftrace.push((stop_bpftrace(run)?, rm_calls)),
                Running::Floor(_) | Running::Nothing => {}
            }
            if setup == Setup::Untraced {
                ctx.interference.extend(foreign_programs(ctx));
            }
        }
    }
    ctx.interference.sort();
    ctx.interference.dedup();

    // Per-repetition values of one metric, and paired ratios.
    let metric = |setup: Setup, wl: Workload, m: Metric| -> Vec<f64> {
        samples
            .loops
            .get(&(setup, wl))
            .map(|v| v.iter().map(|r| m.of(r)).collect())
            .unwrap_or_default()
    };
    let paired = |a: &[f64], b: &[f64], f: fn(f64, f64) -> f64| -> Option<Spread> {
        if a.is_empty() || a.len() != b.len() {
            return None;
        }
        spread(&a.iter().zip(b).map(|(x, y)| f(*x, *y)).collect::<Vec<_>>())
    };
    for wl in Workload::UNRELATED {
        for h in Hook::ALL {
            if let Some(s) = spread(&metric(Setup::Floor(h), wl, Metric::Caller)) {
                ctx.floor_cpu.insert((h, wl), s.median);
            }
        }
    }
    let ratio = |x: f64, y: f64| x / y;
    let diff = |x: f64, y: f64| x - y;
    // The hook each gpu-trace setup ran on, as its start-up line said.
    let hook_of = |setup: Setup| -> Option<Hook> {
        match setup {
            Setup::GpuTrace(Some(h)) => Some(h),
            _ => samples
                .gpu_trace
                .get(&setup)?
                .first()
                .and_then(|(line, _)| Hook::from_startup_line(line)),
        }
    };
    let floor_of = |setup: Setup| -> Option<Setup> { hook_of(setup).map(Setup::Floor) };

    if want_unrelated {
        writeln!(out, "\n## 1. Unrelated syscalls while tracing\n")?;
        writeln!(
            out,
            "CPU time of the calling thread per call (user + system; time preempted by other \
             processes is not counted, so a busy machine does not inflate it). \"vs floor\" \
             compares with the empty program on the same hook (target for gpu-trace ≤ 1.05×).\n"
        )?;
        writeln!(
            out,
            "| workload | setup | CPU ns/call | vs untraced | vs floor |"
        )?;
        writeln!(out, "|---|---|---|---|---|")?;
        for wl in Workload::UNRELATED {
            let base = metric(Setup::Untraced, wl, Metric::Caller);
            for &setup in &setups {
                let m = metric(setup, wl, Metric::Caller);
                if m.is_empty() {
                    continue;
                }
                let vs_floor = floor_of(setup)
                    .map(|f| fmt_ratio(paired(&m, &metric(f, wl, Metric::Caller), ratio)))
                    .unwrap_or_else(|| "—".into());
                let vs_base = if setup == Setup::Untraced {
                    "1".into()
                } else {
                    fmt_ratio(paired(&m, &base, ratio))
                };
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} |",
                    wl.label(),
                    setup.label(),
                    fmt_ns(spread(&m)),
                    vs_base,
                    vs_floor
                )?;
            }
        }
        writeln!(out)?;
        let default_hook = hook_of(Setup::GpuTrace(None));
        for wl in Workload::UNRELATED {
            let (Some(h), m) = (
                default_hook,
                metric(Setup::GpuTrace(None), wl, Metric::Caller),
            ) else {
                continue;
            };
            if let Some(r) = paired(&m, &metric(Setup::Floor(h), wl, Metric::Caller), ratio) {
                writeln!(
                    out,
                    "- {}: gpu-trace / floor ({}) = {:.3}× → target ≤ 1.05×: {}",
                    wl.label(),
                    h.short(),
                    r.median,
                    verdict(r.median <= 1.05)
                )?;
            }
        }
        // Which hook the default run chose, and whether it is of the cheapest class the kernel
        // allows: a program at sys_exit (raw_tp or tp_btf, the same floor) rather than the
        // classic tracepoints (entry and exit). Which of the two costs less is part 3's question.
        if let Some(runs) = samples.gpu_trace.get(&Setup::GpuTrace(None)) {
            let first = runs.first().map_or("?", |(h, _)| h.as_str());
            writeln!(
                out,
                "- default run says: `{}`",
                first.trim_start_matches("gpu-trace: ")
            )?;
            let sys_exit_allowed = [Hook::RawTp, Hook::TpBtf]
                .iter()
                .any(|h| setups.contains(&Setup::Floor(*h)));
            let ok = match default_hook {
                Some(Hook::RawTp | Hook::TpBtf) => true,
                Some(Hook::Tracepoint) => !sys_exit_allowed,
                None => false,
            };
            writeln!(
                out,
                "- cheapest hook class this kernel allows: {} → chosen by default: {}",
                if sys_exit_allowed {
                    "sys_exit (raw_tp or tp_btf)"
                } else {
                    "classic tracepoints"
                },
                if ok { "yes" } else { "NO" }
            )?;
        }
    }

    if want_rm {
        writeln!(
            out,
            "\n## 2. RM-shaped ioctls on a watched device (/dev/null)\n"
        )?;
        writeln!(
            out,
            "/dev/null has no ioctls: each call returns ENOTTY after the tracer has read it, so \
             the untraced call is far cheaper here than a real RM call (microseconds: see \
             bench/gpu-host-bench.py). caller CPU: the calling thread; tracer CPU: the tracer's \
             own process while the loop ran (gpu-trace draining and decoding, bpftrace, strace), \
             per call; added: caller + tracer − untraced caller. Wall time counts preemption by \
             other processes and is noisy on a shared machine.\n"
        )?;
        writeln!(
            out,
            "| workload | setup | caller CPU ns | tracer CPU ns | added CPU ns | CPU vs untraced | wall ns | wall vs untraced |"
        )?;
        writeln!(out, "|---|---|---|---|---|---|---|---|")?;
        for wl in Workload::RM {
            let base = metric(Setup::Untraced, wl, Metric::Caller);
            let base_wall = metric(Setup::Untraced, wl, Metric::Wall);
            for &setup in &setups {
                let total = metric(setup, wl, Metric::Total);
                if total.is_empty() {
                    continue;
                }
                let wall = metric(setup, wl, Metric::Wall);
                let untraced = setup == Setup::Untraced;
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    wl.label(),
                    setup.label(),
                    fmt_ns(spread(&metric(setup, wl, Metric::Caller))),
                    fmt_ns(spread(&metric(setup, wl, Metric::Tracer))),
                    if untraced {
                        "0".into()
                    } else {
                        fmt_ns(paired(&total, &base, diff))
                    },
                    if untraced {
                        "1".into()
                    } else {
                        fmt_ratio(paired(&total, &base, ratio))
                    },
                    fmt_ns(spread(&wall)),
                    if untraced {
                        "1".into()
                    } else {
                        fmt_ratio(paired(&wall, &base_wall, ratio))
                    },
                )?;
            }
        }
        writeln!(out)?;
        let base = metric(Setup::Untraced, Workload::RmEmit, Metric::Caller);
        let gt = metric(Setup::GpuTrace(None), Workload::RmEmit, Metric::Total);
        if let Some(r) = paired(&gt, &base, ratio) {
            writeln!(
                out,
                "- RM storm, gpu-trace CPU / untraced = {:.3}× → target ≤ 1.10×: {} (on /dev/null, \
                 where the untraced call costs {:.0} ns; the target is about real RM calls)",
                r.median,
                verdict(r.median <= 1.10),
                spread(&base).map_or(0.0, |s| s.median)
            )?;
        }
        let st = metric(Setup::Strace, Workload::RmEmit, Metric::Total);
        if let (Some(g), Some(s)) = (paired(&gt, &base, diff), paired(&st, &base, diff)) {
            let x = s.median / g.median.max(0.001);
            writeln!(
                out,
                "- added CPU time, strace / gpu-trace = {:.1}× ({:.0} ns vs {:.0} ns per call) → target ≥ 5×: {}",
                x,
                s.median,
                g.median,
                verdict(x >= 5.0)
            )?;
        }
        let (gw, sw, bw) = (
            metric(Setup::GpuTrace(None), Workload::RmEmit, Metric::Wall),
            metric(Setup::Strace, Workload::RmEmit, Metric::Wall),
            metric(Setup::Untraced, Workload::RmEmit, Metric::Wall),
        );
        if let (Some(g), Some(s)) = (paired(&gw, &bw, diff), paired(&sw, &bw, diff)) {
            writeln!(
                out,
                "- added wall time, strace / gpu-trace = {:.1}× ({:.0} ns vs {:.0} ns per call)",
                s.median / g.median.max(0.001),
                s.median,
                g.median
            )?;
        }
    }
    // Runs that issued reported calls (the per-hook runs only ran part 1's workloads).
    for (setup, runs) in samples
        .gpu_trace
        .iter()
        .filter(|(s, _)| want_rm && matches!(s, Setup::GpuTrace(None) | Setup::Baseline))
    {
        let emitted: u64 = runs.iter().map(|(_, e)| e.emitted).sum();
        let dropped: u64 = runs.iter().map(|(_, e)| e.dropped).sum();
        let codes: Vec<String> = runs
            .iter()
            .map(|(_, e)| e.exit_code.map_or("signal".into(), |c| c.to_string()))
            .collect();
        writeln!(
            out,
            "- {} over all repetitions: {emitted} records emitted, {dropped} dropped (kernel \
             counters, as gpu-trace reported them; exit codes {})",
            setup.label(),
            codes.join(",")
        )?;
    }
    if !samples.bpftrace.is_empty() && want_rm {
        let counted: u64 = samples.bpftrace.iter().map(|(c, _)| c).sum();
        let issued: u64 = samples.bpftrace.iter().map(|(_, i)| i).sum();
        writeln!(
            out,
            "- bpftrace counted {counted} RM-shaped ioctls on /dev/null; the loops issued {issued}{}",
            if counted == issued {
                " (equal)"
            } else {
                " (differ: other processes on this machine issued some too, or bpftrace missed calls)"
            }
        )?;
        writeln!(
            out,
            "- bpftrace program: `{}`",
            bpftrace_program(ctx.dev_null_rdev)
        )?;
    }
    for n in notes {
        writeln!(out, "- left out: {n}")?;
    }
    print_now(out);
    Ok(())
}

#[derive(Clone, Copy)]
enum Metric {
    /// CPU time of the calling thread per call.
    Caller,
    /// CPU time of the tracer's process per call.
    Tracer,
    /// Both.
    Total,
    /// Wall time per call.
    Wall,
}

impl Metric {
    fn of(self, r: &LoopResult) -> f64 {
        match self {
            Self::Caller => r.cpu_ns_per_call,
            Self::Tracer => r.tracer_cpu_ns_per_call,
            Self::Total => r.cpu_ns_per_call + r.tracer_cpu_ns_per_call,
            Self::Wall => r.ns_per_call,
        }
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

// ---------------------------------------------------------------------------------------------
// Part: the BPF programs themselves
// ---------------------------------------------------------------------------------------------

fn bpf_part(ctx: &Ctx, out: &mut String) -> Result<()> {
    writeln!(out, "\n## 3. The kernel programs (bpf_prog_info)\n")?;
    writeln!(
        out,
        "The syscall-exit program's own time per run, from the kernel's run-time statistics \
         (BPF_ENABLE_STATS, on only for this part: the kernel then reads the clock twice around \
         every run, which the empty program's figure shows). Medians [min–max] over the \
         repetitions; \"added\" is paired with the empty program on the same hook. \
         \"runs/call\" above 1: other processes' syscalls ran the program during the loop (it \
         sees every syscall of the machine).\n"
    )?;
    let _stats = RunTimeStats::enable()?;
    let iters = (ctx.iters / 4).max(1000);
    let mut setups = Vec::new();
    for h in [Hook::RawTp, Hook::TpBtf] {
        if Floor::attach(h.syscall_hook()).is_ok() {
            setups.extend([Setup::Floor(h), Setup::GpuTrace(Some(h))]);
        }
    }
    if ctx.baseline.is_some() {
        setups.push(Setup::Baseline);
    }
    const WORKLOADS: [Workload; 5] = [
        Workload::Getppid,
        Workload::IoctlPipe,
        Workload::IoctlUnwatched,
        Workload::RmIgnored,
        Workload::RmEmit,
    ];
    let hot_names = [
        "sys_exit_raw",
        "sys_exit_btf",
        bench_support::FLOOR_RAW_TP,
        bench_support::FLOOR_TP_BTF,
    ];
    // (setup, workload) → (ns per run, runs per call), one per repetition.
    let mut runs: BTreeMap<(Setup, Workload), Vec<(f64, f64)>> = BTreeMap::new();
    let mut sizes: BTreeMap<String, ProgramStats> = BTreeMap::new();
    // The hook each setup's syscall-exit program ran on (from the program's name).
    let mut hook_by_setup: BTreeMap<Setup, Hook> = BTreeMap::new();
    for rep in 0..ctx.reps {
        progress(format!("bpf: repetition {}/{}", rep + 1, ctx.reps));
        for i in 0..setups.len() {
            let setup = setups[(i + rep) % setups.len()];
            let before_ids: HashSet<u32> = bench_support::loaded_program_stats()?
                .iter()
                .map(|p| p.id)
                .collect();
            let running = start(ctx, setup)?;
            let ours: Vec<ProgramStats> = bench_support::loaded_program_stats()?
                .into_iter()
                .filter(|p| !before_ids.contains(&p.id))
                .collect();
            for p in &ours {
                sizes.insert(format!("{} ({})", p.name, setup.label()), p.clone());
            }
            let ids: HashSet<u32> = ours
                .iter()
                .filter(|p| hot_names.contains(&p.name.as_str()))
                .map(|p| p.id)
                .collect();
            if let Some(p) = ours.iter().find(|p| ids.contains(&p.id)) {
                let hook = if p.name.ends_with("_btf") {
                    Hook::TpBtf
                } else {
                    Hook::RawTp
                };
                hook_by_setup.insert(setup, hook);
            }
            let snap = || -> Result<Option<ProgramStats>> {
                Ok(bench_support::loaded_program_stats()?
                    .into_iter()
                    .find(|p| ids.contains(&p.id)))
            };
            for wl in WORKLOADS {
                let a = snap()?;
                let r = run_loop(ctx, wl, iters, false)?;
                let b = snap()?;
                if let (Some(a), Some(b)) = (a, b) {
                    let n = b.run_count - a.run_count;
                    let ns = (b.run_time_ns - a.run_time_ns) as f64 / n.max(1) as f64;
                    runs.entry((setup, wl))
                        .or_default()
                        .push((ns, n as f64 / (r.calls + r.warmup) as f64));
                }
            }
            if let Running::GpuTrace(run) = running {
                stop_gpu_trace(run)?;
            }
        }
    }
    writeln!(
        out,
        "| workload | syscall-exit program of | ns per run | added vs empty program | runs/call |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    for wl in WORKLOADS {
        for &setup in &setups {
            let Some(v) = runs.get(&(setup, wl)) else {
                continue;
            };
            let ns: Vec<f64> = v.iter().map(|x| x.0).collect();
            let per: Vec<f64> = v.iter().map(|x| x.1).collect();
            let floor = match setup {
                Setup::GpuTrace(_) | Setup::Baseline => {
                    hook_by_setup.get(&setup).map(|h| Setup::Floor(*h))
                }
                _ => None,
            };
            let added = floor
                .and_then(|f| runs.get(&(f, wl)))
                .filter(|f| f.len() == ns.len())
                .and_then(|f| spread(&ns.iter().zip(f).map(|(a, b)| a - b.0).collect::<Vec<_>>()));
            writeln!(
                out,
                "| {} | {} | {} | {} | {:.2} |",
                wl.label(),
                setup.label(),
                fmt_ns(spread(&ns)),
                if floor.is_some() {
                    fmt_ns(added)
                } else {
                    "—".into()
                },
                spread(&per).map_or(0.0, |s| s.median)
            )?;
        }
    }
    // What each program adds on unrelated syscalls, and the cheaper hook by that measure.
    let added = |setup: Setup, wl: Workload| -> Option<f64> {
        let floor = Setup::Floor(*hook_by_setup.get(&setup)?);
        let (a, b) = (runs.get(&(setup, wl))?, runs.get(&(floor, wl))?);
        (a.len() == b.len())
            .then(|| spread(&a.iter().zip(b).map(|(x, y)| x.0 - y.0).collect::<Vec<_>>()))?
            .map(|s| s.median)
    };
    writeln!(out)?;
    for setup in setups
        .iter()
        .copied()
        .filter(|s| matches!(s, Setup::GpuTrace(_) | Setup::Baseline))
    {
        let (Some(g), Some(f)) = (
            added(setup, Workload::Getppid),
            added(setup, Workload::IoctlPipe),
        ) else {
            continue;
        };
        writeln!(
            out,
            "- {}: the program adds {g:.1} ns to getppid() and {f:.1} ns to ioctl(FIONREAD) over the \
             empty program (medians)",
            setup.label()
        )?;
        // The 1.05× target seen through the program's own cost: less noisy than part 1's
        // syscall timings on a busy machine.
        let Some(&hook) = hook_by_setup.get(&setup) else {
            continue;
        };
        for wl in Workload::UNRELATED {
            let (Some(add), Some(floor)) = (added(setup, wl), ctx.floor_cpu.get(&(hook, wl)))
            else {
                continue;
            };
            let r = (floor + add) / floor;
            writeln!(
                out,
                "- {}, {}: (floor {floor:.0} ns + program {add:.1} ns) / floor = {r:.3}× → target ≤ 1.05×: {}",
                wl.label(),
                hook.short(),
                verdict(r <= 1.05)
            )?;
        }
    }
    if let (Some(raw), Some(btf)) = (
        added(Setup::GpuTrace(Some(Hook::RawTp)), Workload::IoctlPipe),
        added(Setup::GpuTrace(Some(Hook::TpBtf)), Workload::IoctlPipe),
    ) {
        let cheaper = if btf + 1.0 < raw { "tp_btf" } else { "raw_tp" };
        writeln!(
            out,
            "- cheapest syscall hook by program cost on ordinary ioctls: {cheaper}"
        )?;
    }
    writeln!(
        out,
        "\n| program (setup) | BPF insns after verifier | JIT bytes | insns verified |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    for (name, p) in sizes {
        writeln!(
            out,
            "| {name} | {} | {} | {} |",
            p.xlated_bytes.map_or("?".into(), |b| (b / 8).to_string()),
            p.jited_bytes,
            p.verified_insns.map_or("?".into(), |n| n.to_string())
        )?;
    }
    print_now(out);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Part: userspace pipeline throughput
// ---------------------------------------------------------------------------------------------

/// The records of the GPU-host recordings, replicated to at least `want`, timestamps shifted so
/// that time moves forward across copies.
fn replicated_records(root: &Path, want: usize) -> Result<(Vec<Vec<u8>>, Clock, usize)> {
    let mut base = Vec::new();
    let mut offset = None;
    for name in ["ctx_churn.gtrace", "two_streams.gtrace"] {
        let path = root.join("gpu-trace/tests/fixtures").join(name);
        let file = fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut reader = RecordReader::new(io::BufReader::new(file))?;
        offset.get_or_insert(reader.header.realtime_offset_ns);
        while let Some(rec) = reader.next_record()? {
            base.push(rec);
        }
    }
    if base.is_empty() {
        bail!("the fixtures hold no records");
    }
    let ts = |r: &[u8]| u64::from_le_bytes(r[8..16].try_into().unwrap());
    let (lo, hi) = base
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), r| (lo.min(ts(r)), hi.max(ts(r))));
    let span = hi - lo + 1_000_000;
    let mut all = Vec::with_capacity(want + base.len());
    let mut copy = 0u64;
    while all.len() < want {
        for r in &base {
            let mut r = r.clone();
            // RecordHeader.ts_ns is at bytes 8..16 of every record (gpu-trace-common).
            let t = ts(&r) + copy * span;
            r[8..16].copy_from_slice(&t.to_le_bytes());
            all.push(r);
        }
        copy += 1;
    }
    Ok((all, Clock::new(offset.unwrap_or(0)), base.len()))
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn pipeline_part(ctx: &Ctx, want: usize, out: &mut String) -> Result<()> {
    progress(format!("pipeline: {want} records per run"));
    let (records, clock, distinct) = replicated_records(&ctx.root, want)?;
    let n = records.len();
    let bytes: usize = records.iter().map(Vec::len).sum();
    writeln!(
        out,
        "\n## 4. Userspace: decode + model + output, one core\n"
    )?;
    writeln!(
        out,
        "The {distinct} records of tests/fixtures/{{ctx_churn,two_streams}}.gtrace (real H200 \
         captures), replicated to {n} records ({:.0} MB), fed through `Pipeline` into io::sink \
         from memory, on one pinned thread. Rates per second of that thread's CPU time (what one \
         core sustains; target ≥ 2 M records/s), and per second of wall time (lower when other \
         processes share the core).\n",
        bytes as f64 / 1e6
    )?;
    writeln!(
        out,
        "| output | records/CPU-s | events/CPU-s | records/wall-s | events per run |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    let handle = {
        let cpu = ctx.cpu;
        let reps = ctx.reps;
        thread::spawn(move || -> Result<Vec<PipelineRow>> {
            pin_to_cpu(cpu);
            let mut results = Vec::new();
            for (label, format, verbose) in [
                ("text", Format::Text, false),
                ("text -v", Format::Text, true),
                ("json -v", Format::Json, true),
            ] {
                let mut rec_rates = Vec::new();
                let mut ev_rates = Vec::new();
                let mut wall_rates = Vec::new();
                let mut events = 0;
                for _ in 0..reps {
                    let config = PipelineConfig {
                        verbose,
                        pids: Vec::new(),
                        comms: Vec::new(),
                        format,
                        timestamps: Timestamps::Wall,
                        stats: true,
                        clock: clock.clone(),
                    };
                    let started = Instant::now();
                    let cpu0 = thread_cpu_ns();
                    let mut p = Pipeline::new(config, io::sink());
                    for r in &records {
                        p.feed(r)?;
                    }
                    let summary = p.finish(KernelCounters::default(), Duration::from_secs(1))?;
                    let cpu_s = (thread_cpu_ns() - cpu0) as f64 / 1e9;
                    let wall_s = started.elapsed().as_secs_f64();
                    events = summary.events;
                    rec_rates.push(records.len() as f64 / cpu_s);
                    ev_rates.push(summary.events as f64 / cpu_s);
                    wall_rates.push(records.len() as f64 / wall_s);
                }
                results.push((label.to_string(), rec_rates, ev_rates, wall_rates, events));
            }
            Ok(results)
        })
    };
    let results = handle
        .join()
        .map_err(|_| anyhow!("the pipeline thread panicked"))??;
    let mut text_rate = None;
    let range = |s: Spread| {
        format!(
            "{} [{}–{}]",
            fmt_rate(s.median),
            fmt_rate(s.min),
            fmt_rate(s.max)
        )
    };
    for (label, rec, ev, wall, events) in results {
        let (r, e, w) = (
            spread(&rec).unwrap(),
            spread(&ev).unwrap(),
            spread(&wall).unwrap(),
        );
        if label == "text -v" {
            text_rate = Some(r.median);
        }
        writeln!(
            out,
            "| {label} | {} | {} | {} | {events} |",
            range(r),
            range(e),
            range(w)
        )?;
    }
    if cfg!(debug_assertions) {
        writeln!(
            out,
            "\n- xtask is a debug build here (--quick): these rates are not measurements"
        )?;
    } else if let Some(r) = text_rate {
        writeln!(
            out,
            "\n- text -v: {} per CPU-second → target ≥ 2 M records/s: {}",
            fmt_rate(r),
            verdict(r >= 2e6)
        )?;
    }
    print_now(out);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Part: the knee (highest sustained rate without drops)
// ---------------------------------------------------------------------------------------------

struct KneeStep {
    achieved: f64,
    issued: u64,
    end: GpuTraceEnd,
}

fn knee_step(ctx: &Ctx, rate: Option<f64>, seconds: f64, threads: usize) -> Result<KneeStep> {
    let mut cmd = Command::new(&ctx.loop_bin);
    cmd.args([
        "rm-emit",
        "--threads",
        &threads.to_string(),
        "--wait-stdin",
        "1",
    ]);
    match rate {
        Some(r) => cmd.args([
            "--rate",
            &format!("{r:.0}"),
            "--seconds",
            &seconds.to_string(),
        ]),
        // Unlimited: as many calls as ≈ `seconds` allow at ~1 µs per traced call.
        None => cmd.args([
            "--iters",
            &((seconds * 1e6) as u64 / threads as u64)
                .max(1000)
                .to_string(),
        ]),
    };
    let mut gen_proc = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the generator")?;
    let mut stdin: ChildStdin = gen_proc.stdin.take().unwrap();
    let mut stdout = LineReader::spawn(gen_proc.stdout.take().unwrap());
    let ready = stdout.wait_for("ready pid=", Duration::from_secs(10))?;
    let pid: u32 = ready
        .trim()
        .trim_start_matches("ready pid=")
        .parse()
        .context("generator pid")?;
    // Only the generator's calls: other users of the machine must not count here.
    let tracer = start_gpu_trace(ctx, &ctx.gpu_trace, None, Some(pid), "knee")?;
    stdin.write_all(b"g")?;
    drop(stdin);
    let status = gen_proc.wait()?;
    let line = stdout.rest().into_iter().rfind(|l| l.starts_with("calls="));
    // Let gpu-trace drain what is in the ring before it stops.
    thread::sleep(Duration::from_millis(300));
    let end = stop_gpu_trace(tracer)?;
    if !status.success() {
        bail!("the generator failed: {status}");
    }
    let r = parse_loop_line(&line.context("the generator printed no result")?)?;
    let achieved = r.calls as f64 / (r.elapsed_ns.max(1) as f64 / 1e9);
    Ok(KneeStep {
        achieved,
        issued: r.calls + r.warmup,
        end,
    })
}

fn knee_part(ctx: &Ctx, seconds: f64, ncpu: usize, out: &mut String) -> Result<()> {
    let threads = ncpu.clamp(2, 8);
    let (rates, reps): (Vec<Option<f64>>, usize) = if ctx.quick {
        (vec![Some(50e3), Some(400e3), None], 1)
    } else {
        let r = [
            50e3, 100e3, 150e3, 200e3, 250e3, 300e3, 400e3, 500e3, 700e3, 1e6,
        ];
        (r.into_iter().map(Some).chain([None]).collect(), 3)
    };
    writeln!(
        out,
        "\n## 5. Sustained event rate at the default ring size ({} KiB)\n",
        gpu_trace::loader::DEFAULT_RING_BYTES / 1024
    )?;
    writeln!(
        out,
        "{threads} generator threads issue reported RM-shaped ioctls on /dev/null at a target rate \
         for {seconds} s, {reps} times per rate (each call is one 264-byte record, and one call \
         in four prints a line); gpu-trace runs as users run it (text output to a file, `--pid` \
         of the generator so that nothing else counts), started afresh for each run. \
         \"accounted\" checks emitted + dropped = calls issued + the generator's exit notice, \
         in every run. Load average at \
         the start of this part: {}.\n",
        load_average()
    )?;
    writeln!(
        out,
        "| target | achieved (median) | runs without drops | dropped per run | accounted | gpu-trace exit codes |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    let mut best_clean: Option<f64> = None;
    // Every run clean at this rate and at every lower rate tried.
    let mut clean_through: Option<f64> = None;
    let mut first_drop: Option<f64> = None;
    let mut drop_msg = None;
    for rate in rates {
        let mut steps = Vec::new();
        for rep in 0..reps {
            progress(format!(
                "knee: {} ({}/{reps})",
                rate.map_or("unlimited".into(), fmt_rate),
                rep + 1
            ));
            steps.push(knee_step(ctx, rate, seconds, threads)?);
        }
        let achieved = spread(&steps.iter().map(|s| s.achieved).collect::<Vec<_>>()).unwrap();
        let clean = steps.iter().filter(|s| s.end.dropped == 0).count();
        let mismatches: Vec<String> = steps
            .iter()
            // `emitted` counts every record kind: the generator's process-exit notice too.
            .filter(|s| s.end.emitted + s.end.dropped != s.issued + 1)
            .map(|s| {
                format!(
                    "issued {} + 1 exit notice vs emitted {} + dropped {}",
                    s.issued, s.end.emitted, s.end.dropped
                )
            })
            .collect();
        writeln!(
            out,
            "| {} | {} | {clean}/{reps} | {} | {} | {} |",
            rate.map_or("unlimited".into(), fmt_rate),
            fmt_rate(achieved.median),
            steps
                .iter()
                .map(|s| s.end.dropped.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            if mismatches.is_empty() {
                "yes".to_string()
            } else {
                format!("MISMATCH: {}", mismatches.join("; "))
            },
            steps
                .iter()
                .map(|s| s.end.exit_code.map_or("signal".into(), |c| c.to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
        if clean == reps {
            best_clean = Some(best_clean.map_or(achieved.min, |b: f64| b.max(achieved.min)));
            if first_drop.is_none() {
                clean_through = Some(achieved.min);
            }
        } else {
            first_drop.get_or_insert(achieved.median);
            drop_msg = drop_msg.or_else(|| {
                steps
                    .iter()
                    .flat_map(|s| &s.end.stderr)
                    .find(|l| l.contains("dropped"))
                    .cloned()
            });
        }
    }
    writeln!(out)?;
    if let Some(c) = clean_through {
        writeln!(
            out,
            "- zero drops in every run at every rate up to {} → target ≥ 200 k/s: {}",
            fmt_rate(c),
            verdict(c >= 200e3)
        )?;
    }
    if let Some(b) = best_clean.filter(|b| Some(*b) != clean_through) {
        writeln!(
            out,
            "- highest rate with zero drops in every run (some lower rate dropped once): {}",
            fmt_rate(b)
        )?;
    }
    match (first_drop, drop_msg) {
        (Some(r), Some(msg)) => writeln!(
            out,
            "- first drops at about {}; gpu-trace then says: `{msg}`",
            fmt_rate(r)
        )?,
        (Some(r), None) => writeln!(out, "- first drops at about {}", fmt_rate(r))?,
        (None, _) => writeln!(out, "- no drops at any rate tried")?,
    }
    print_now(out);
    Ok(())
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
