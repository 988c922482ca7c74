//! Workload and tracer processes: the `syscall_loop` workload, gpu-trace and bpftrace started
//! and stopped as a user would, and the CPU time they use.

use super::*;

pub(super) fn run_loop(ctx: &Ctx, wl: Workload, iters: u64, strace: bool) -> Result<LoopResult> {
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
pub(super) struct LineReader {
    pub(super) rx: mpsc::Receiver<String>,
    pub(super) seen: Vec<String>,
}

impl LineReader {
    pub(super) fn spawn(pipe: impl Read + Send + 'static) -> Self {
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
    pub(super) fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<String> {
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
    pub(super) fn rest(mut self) -> Vec<String> {
        while let Ok(line) = self.rx.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(line);
        }
        self.seen
    }
}

pub(super) fn interrupt_and_wait(child: &mut Child, what: &str) -> Result<ExitStatus> {
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
pub(super) struct GpuTraceRun {
    pub(super) child: Child,
    pub(super) stderr: LineReader,
    pub(super) output: PathBuf,
    pub(super) hooks: String,
}

/// What a gpu-trace run reported at its end.
#[derive(Clone, Debug, Default)]
pub(super) struct GpuTraceEnd {
    pub(super) emitted: u64,
    pub(super) dropped: u64,
    pub(super) exit_code: Option<i32>,
    pub(super) stderr: Vec<String>,
}

pub(super) fn start_gpu_trace(
    ctx: &Ctx,
    bin: &Path,
    hook: Option<Hook>,
    pid: Option<u32>,
    tag: &str,
) -> Result<GpuTraceRun> {
    let output = ctx.work.join(format!("gpu-trace-{tag}.out"));
    let mut cmd = Command::new(bin);
    stops_with_us(&mut cmd);
    // -v: the statistics then include the kernel side's `emitted` (diagnostics section).
    cmd.args(["-v", "--watch-device", "/dev/null", "-o"])
        .arg(&output);
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

pub(super) fn stop_gpu_trace(mut run: GpuTraceRun) -> Result<GpuTraceEnd> {
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

/// bpftrace on the RM-shaped ioctls of the watched device, filtered as gpu-trace filters them:
/// counting them, or (`full`) doing per call what gpu-trace does.
pub(super) struct BpftraceRun {
    pub(super) child: Child,
    /// Where bpftrace writes (`-o`): its "Attaching" line, then its output.
    out: PathBuf,
    full: bool,
}

/// The RM escapes gpu-trace reads (RM_FREE, RM_CONTROL, RM_ALLOC, IOCTL_XFER), as a bpftrace
/// predicate on `args->cmd`.
fn rm_escape_filter() -> String {
    use gpu_trace_common::nvidia::escape;
    [
        escape::RM_FREE,
        escape::RM_CONTROL,
        escape::RM_ALLOC,
        escape::IOCTL_XFER_CMD,
    ]
    .iter()
    .map(|e| format!("(args->cmd & 0xff) == {e:#x}"))
    .collect::<Vec<_>>()
    .join(" || ")
}

/// The program of a bpftrace run: like for like (`full`), else counting.
pub(super) fn bpftrace_program(rdev: u32, full: bool) -> String {
    if full {
        bpftrace_full_program(rdev)
    } else {
        bpftrace_count_program(rdev)
    }
}

/// Counting only: the filter (escape numbers, then the fd's device through the fd table).
fn bpftrace_count_program(rdev: u32) -> String {
    format!(
        "tracepoint:syscalls:sys_enter_ioctl /{}/ {{ \
         $f = *(curtask->files->fdt->fd + args->fd); \
         if ($f->f_inode->i_rdev == {rdev:#x}) {{ @calls[args->cmd] = count(); }} }}",
        rm_escape_filter()
    )
}

/// Like for like: the same filter; at syscall exit (results copied back) the 48 bytes of the
/// RM parameter block and 32 bytes of the parameters it points to (controls and allocations,
/// where gpu-trace reads a prefix of at most 32 bytes for these calls), both from user memory;
/// one line per call with what gpu-trace's record carries (pid, tid, comm, command, return
/// value, the two blocks). gpu-trace writes its record to a ring buffer and decodes it in
/// userspace; bpftrace formats the line through its perf buffer.
fn bpftrace_full_program(rdev: u32) -> String {
    use gpu_trace_common::nvidia::{escape, off};
    format!(
        "tracepoint:syscalls:sys_enter_ioctl /{filter}/ {{ \
         $f = *(curtask->files->fdt->fd + args->fd); \
         if ($f->f_inode->i_rdev == {rdev:#x}) {{ @arg[tid] = args->arg; @cmd[tid] = args->cmd; }} }} \
         tracepoint:syscalls:sys_exit_ioctl /@arg[tid]/ {{ \
         $p = @arg[tid]; $c = @cmd[tid]; delete(@arg[tid]); delete(@cmd[tid]); \
         $e = $c & 0xff; $sub = (uint64)0; \
         if ($e == {control:#x}) {{ $sub = *(uint64 *)uptr($p + {control_ptr}); }} \
         if ($e == {alloc:#x}) {{ $sub = *(uint64 *)uptr($p + {alloc_ptr}); }} \
         printf(\"rm pid=%d tid=%d comm=%s cmd=%x ret=%d block=%r sub=%r\\n\", pid, tid, comm, \
         $c, args->ret, buf(uptr($p), 48), buf(uptr($sub), 32)); }}",
        filter = rm_escape_filter(),
        control = escape::RM_CONTROL,
        alloc = escape::RM_ALLOC,
        control_ptr = off::CONTROL_PARAMS_PTR,
        alloc_ptr = off::ALLOC_PARAMS_PTR,
    )
}

pub(super) fn start_bpftrace(ctx: &Ctx, full: bool) -> Result<BpftraceRun> {
    let bin = ctx.bpftrace.as_ref().context("bpftrace is not installed")?;
    let out = std::env::temp_dir().join(format!(
        "gpu-trace-bench-bpftrace-{}-{}.out",
        std::process::id(),
        if full { "full" } else { "count" }
    ));
    let _ = fs::remove_file(&out);
    let program = bpftrace_program(ctx.dev_null_rdev, full);
    let mut cmd = Command::new(bin);
    stops_with_us(&mut cmd);
    let mut child = cmd
        .arg("-o")
        .arg(&out)
        .args(["-e", &program])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Where it says what it lost.
        .stderr(fs::File::create(out.with_extension("err")).context("creating bpftrace's log")?)
        .spawn()
        .context("starting bpftrace")?;
    // bpftrace prints "Attaching" just before it attaches.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !fs::read_to_string(&out).is_ok_and(|t| t.contains("Attaching")) {
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("bpftrace did not start (program: {program})");
        }
        thread::sleep(Duration::from_millis(100));
    }
    thread::sleep(Duration::from_millis(500));
    Ok(BpftraceRun { child, out, full })
}

/// Stops bpftrace; returns the calls it counted (or, like for like, the lines it printed), and
/// the lines it said it lost (`Lost N events`).
pub(super) fn stop_bpftrace(mut run: BpftraceRun) -> Result<(u64, u64)> {
    interrupt_and_wait(&mut run.child, "bpftrace")?;
    let text = fs::read_to_string(&run.out).context("reading bpftrace's output")?
        + &fs::read_to_string(run.out.with_extension("err")).unwrap_or_default();
    let _ = fs::remove_file(&run.out);
    let _ = fs::remove_file(run.out.with_extension("err"));
    let lost = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("Lost ")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let counted = if run.full {
        text.lines().filter(|l| l.starts_with("rm pid=")).count() as u64
    } else {
        text.lines()
            .filter(|l| l.starts_with("@calls["))
            .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
            .sum()
    };
    Ok((counted, lost))
}

pub(super) enum Running {
    Nothing,
    Floor(#[allow(dead_code)] Floor),
    GpuTrace(GpuTraceRun),
    Bpftrace(BpftraceRun),
}

impl Running {
    /// The tracer's process, when it has one.
    pub(super) fn pid(&self) -> Option<u32> {
        match self {
            Self::GpuTrace(r) => Some(r.child.id()),
            Self::Bpftrace(r) => Some(r.child.id()),
            Self::Nothing | Self::Floor(_) => None,
        }
    }
}

/// CPU time (ns) of every thread of a process (`/proc/PID/task/*/schedstat`, first field).
pub(super) fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

pub(super) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A tracer the bench starts gets SIGINT (its clean stop) when the bench's thread that started
/// it ends, however the bench ends (Ctrl-C, `kill`, a panic): no program stays attached
/// behind a killed bench.
pub(super) fn stops_with_us(cmd: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: sigaction(2) (through signal), prctl(2) and getppid(2) are async-signal-safe;
    // nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // A bench started in the background of a shell inherits SIGINT ignored, and so
            // would the tracer: the signal would then do nothing.
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have ended before the prctl: then no signal would come.
            if libc::getppid() == 1 {
                libc::raise(libc::SIGINT);
            }
            Ok(())
        });
    }
}

/// The BPF programs a process holds open (`prog_id` in its file descriptors' fdinfo).
pub(super) fn programs_of(pid: u32) -> HashSet<u32> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return HashSet::new();
    };
    fds.filter_map(Result::ok)
        .filter_map(|f| fs::read_to_string(f.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

pub(super) fn start(ctx: &Ctx, setup: Setup) -> Result<Running> {
    let running = start_setup(ctx, setup)?;
    let holder = running.pid().unwrap_or_else(std::process::id);
    ctx.own_progs.borrow_mut().extend(programs_of(holder));
    Ok(running)
}

fn start_setup(ctx: &Ctx, setup: Setup) -> Result<Running> {
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
        Setup::Bpftrace => Running::Bpftrace(start_bpftrace(ctx, false)?),
        Setup::BpftraceFull => Running::Bpftrace(start_bpftrace(ctx, true)?),
    })
}

/// How long an untraced run waits for the kernel to free the programs of the setup before it.
const OWN_PROGRAMS_GONE: Duration = Duration::from_secs(5);

/// Called before and after an untraced run (nothing of ours running): waits until the programs
/// the bench's earlier setups loaded are freed, then lists the programs that are loaded now and
/// were neither there at the start nor ours; ours still loaded after the wait are listed too,
/// marked as such (they would make the untraced run a traced one).
pub(super) fn foreign_programs(ctx: &Ctx) -> Vec<String> {
    let deadline = Instant::now() + OWN_PROGRAMS_GONE;
    loop {
        let Ok(progs) = floor::loaded_program_stats() else {
            return Vec::new();
        };
        let own = ctx.own_progs.borrow();
        let lingering = progs.iter().any(|p| own.contains(&p.id));
        if !lingering || Instant::now() > deadline {
            return progs
                .into_iter()
                .filter(|p| !ctx.baseline_progs.contains(&p.id))
                .map(|p| match own.contains(&p.id) {
                    true => format!(
                        "{} (id {}, the bench's own, still loaded {}s after its setup ended)",
                        p.name,
                        p.id,
                        OWN_PROGRAMS_GONE.as_secs()
                    ),
                    false => format!("{} (id {})", p.name, p.id),
                })
                .collect();
        }
        drop(own);
        thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child started with [`stops_with_us`] gets SIGINT when the thread that started it ends
    /// (as when the bench is killed); one started without it would live on.
    #[test]
    fn a_tracer_the_bench_started_stops_when_the_bench_ends() {
        let pid = thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            stops_with_us(&mut cmd);
            let child = cmd.spawn().expect("spawn sleep");
            let pid = child.id();
            // Not waited for: the thread ends with its child running.
            std::mem::forget(child);
            pid
        })
        .join()
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let alive = |pid: u32| {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        while alive(pid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let gone = !alive(pid);
        // Reap it (a zombie of this test process).
        // SAFETY: waitpid on our own child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        assert!(gone, "the child outlived the thread that started it");
    }
}
