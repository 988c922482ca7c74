//! Parts 1 and 2: unrelated syscalls and RM-shaped ioctls, untraced and under each tracer.

use super::*;

#[derive(Default)]
pub(super) struct Samples {
    /// (setup, workload) → one result per repetition, in repetition order.
    pub(super) loops: BTreeMap<(Setup, Workload), Vec<LoopResult>>,
    /// gpu-trace runs, per setup.
    pub(super) gpu_trace: BTreeMap<Setup, Vec<GpuTraceSample>>,
    /// bpftrace runs.
    pub(super) bpftrace: Vec<BpftraceCount>,
}

/// Which of the two parts run.
#[derive(Clone, Copy)]
struct Wanted {
    /// Part 1: unrelated syscalls.
    unrelated: bool,
    /// Part 2: RM-shaped ioctls.
    rm: bool,
}

impl Wanted {
    /// The workloads `setup` runs.
    fn workloads_for(self, setup: Setup) -> Vec<Workload> {
        let mut w = Vec::new();
        // strace is too slow for part 1; like-for-like bpftrace is about reported calls.
        if self.unrelated && !matches!(setup, Setup::Strace | Setup::BpftraceFull) {
            w.extend(Workload::UNRELATED);
        }
        if self.rm && setup == Setup::BpftraceFull {
            // Like for like means the calls gpu-trace reports.
            w.push(Workload::RmEmit);
        } else if self.rm && !matches!(setup, Setup::Floor(_) | Setup::GpuTrace(Some(_))) {
            w.extend(Workload::RM);
        }
        w
    }
}

/// One gpu-trace run: its start-up hooks line, and how it ended (emitted, dropped, exit code).
pub(super) struct GpuTraceSample {
    hooks: String,
    end: GpuTraceEnd,
}

/// One bpftrace run: the RM-shaped ioctls it counted (or printed a line for, like for like),
/// and those the loops issued.
pub(super) struct BpftraceCount {
    full: bool,
    counted: u64,
    /// Lines bpftrace said it lost (its perf buffer full), like for like only.
    lost: u64,
    issued: u64,
}

pub(super) fn syscall_parts(ctx: &mut Ctx, parts: &[Part], out: &mut String) -> Result<()> {
    let want = Wanted {
        unrelated: parts.contains(&Part::Syscalls),
        rm: parts.contains(&Part::Ioctls),
    };
    let (setups, notes) = plan_setups(ctx, want);
    let samples = collect(ctx, &setups, want)?;
    for wl in Workload::UNRELATED {
        for h in Hook::ALL {
            if let Some(s) = spread(&samples.metric(Setup::Floor(h), wl, Metric::Caller)) {
                ctx.floor_cpu.insert((h, wl), s.median);
            }
        }
    }
    if want.unrelated {
        write_unrelated(&samples, &setups, out)?;
    }
    if want.rm {
        write_rm(&samples, &setups, out)?;
        write_rm_totals(ctx, &samples, out)?;
    }
    for n in notes {
        writeln!(out, "- left out: {n}")?;
    }
    print_now(out);
    Ok(())
}

/// The setups this kernel and machine allow, in run order, and what was left out (why).
fn plan_setups(ctx: &Ctx, want: Wanted) -> (Vec<Setup>, Vec<String>) {
    let (want_unrelated, want_rm) = (want.unrelated, want.rm);
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
        Some(_) => {
            setups.push(Setup::Bpftrace);
            if want_rm {
                setups.push(Setup::BpftraceFull);
            }
        }
        None => notes.push("bpftrace: not installed (apt-get install bpftrace); left out".into()),
    }
    if want_rm {
        match &ctx.strace {
            Some(_) => setups.push(Setup::Strace),
            None => notes.push("strace: not installed (apt-get install strace); left out".into()),
        }
    }
    (setups, notes)
}

/// Every setup × workload, `ctx.reps` times, the setups' order rotated per repetition.
fn collect(ctx: &mut Ctx, setups: &[Setup], want: Wanted) -> Result<Samples> {
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
            let workloads = want.workloads_for(setup);
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
                        .push(GpuTraceSample { hooks, end });
                }
                Running::Bpftrace(run) => {
                    let (counted, lost) = stop_bpftrace(run)?;
                    samples.bpftrace.push(BpftraceCount {
                        full: setup == Setup::BpftraceFull,
                        counted,
                        lost,
                        issued: rm_calls,
                    })
                }
                Running::Floor(_) | Running::Nothing => {}
            }
            if setup == Setup::Untraced {
                ctx.interference.extend(foreign_programs(ctx));
            }
        }
    }
    ctx.interference.sort();
    ctx.interference.dedup();
    Ok(samples)
}

/// Per-repetition values paired up: `f(a[i], b[i])`, and their spread.
fn paired(a: &[f64], b: &[f64], f: fn(f64, f64) -> f64) -> Option<Spread> {
    if a.is_empty() || a.len() != b.len() {
        return None;
    }
    spread(&a.iter().zip(b).map(|(x, y)| f(*x, *y)).collect::<Vec<_>>())
}

fn ratio(x: f64, y: f64) -> f64 {
    x / y
}

fn diff(x: f64, y: f64) -> f64 {
    x - y
}

impl Samples {
    /// Per-repetition values of one metric.
    fn metric(&self, setup: Setup, wl: Workload, m: Metric) -> Vec<f64> {
        self.loops
            .get(&(setup, wl))
            .map(|v| v.iter().map(|r| m.of(r)).collect())
            .unwrap_or_default()
    }

    /// The hook each gpu-trace setup ran on, as its start-up line said.
    fn hook_of(&self, setup: Setup) -> Option<Hook> {
        match setup {
            Setup::GpuTrace(Some(h)) => Some(h),
            _ => self
                .gpu_trace
                .get(&setup)?
                .first()
                .and_then(|run| Hook::from_startup_line(&run.hooks)),
        }
    }

    fn floor_of(&self, setup: Setup) -> Option<Setup> {
        self.hook_of(setup).map(Setup::Floor)
    }
}

/// Part 1's table and verdicts.
fn write_unrelated(samples: &Samples, setups: &[Setup], out: &mut String) -> Result<()> {
    let metric = |setup, wl, m| samples.metric(setup, wl, m);
    let hook_of = |setup| samples.hook_of(setup);
    let floor_of = |setup| samples.floor_of(setup);
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
        for &setup in setups {
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
        let first = runs.first().map_or("?", |run| run.hooks.as_str());
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
    Ok(())
}

/// Part 2's table and verdicts.
fn write_rm(samples: &Samples, setups: &[Setup], out: &mut String) -> Result<()> {
    let metric = |setup, wl, m| samples.metric(setup, wl, m);
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
        for &setup in setups {
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
    let bf = metric(Setup::BpftraceFull, Workload::RmEmit, Metric::Total);
    if let (Some(g), Some(b)) = (paired(&gt, &base, diff), paired(&bf, &base, diff)) {
        writeln!(
            out,
            "- added CPU time per reported call, like for like: bpftrace (same filter, same \
             reads, a line of the same fields) {:.0} ns, gpu-trace {:.0} ns: bpftrace / gpu-trace \
             = {:.1}×",
            b.median,
            g.median,
            b.median / g.median.max(0.001)
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
    Ok(())
}

/// Part 2's totals: records gpu-trace emitted and dropped, and bpftrace's count.
fn write_rm_totals(ctx: &Ctx, samples: &Samples, out: &mut String) -> Result<()> {
    // Runs that issued reported calls (the per-hook runs only ran part 1's workloads).
    for (setup, runs) in samples
        .gpu_trace
        .iter()
        .filter(|(s, _)| matches!(s, Setup::GpuTrace(None) | Setup::Baseline))
    {
        let emitted: u64 = runs.iter().map(|run| run.end.emitted).sum();
        let dropped: u64 = runs.iter().map(|run| run.end.dropped).sum();
        let codes: Vec<String> = runs
            .iter()
            .map(|run| run.end.exit_code.map_or("signal".into(), |c| c.to_string()))
            .collect();
        writeln!(
            out,
            "- {} over all repetitions: {emitted} records emitted, {dropped} dropped (kernel \
             counters, as gpu-trace reported them; exit codes {})",
            setup.label(),
            codes.join(",")
        )?;
    }
    for setup in [Setup::Bpftrace, Setup::BpftraceFull] {
        let full = setup == Setup::BpftraceFull;
        let runs: Vec<&BpftraceCount> =
            samples.bpftrace.iter().filter(|b| b.full == full).collect();
        if runs.is_empty() {
            continue;
        }
        let counted: u64 = runs.iter().map(|b| b.counted).sum();
        let lost: u64 = runs.iter().map(|b| b.lost).sum();
        let issued: u64 = runs.iter().map(|b| b.issued).sum();
        let what = if full {
            "printed a line for"
        } else {
            "counted"
        };
        writeln!(
            out,
            "- {}: {what} {counted} RM-shaped ioctls on /dev/null; the loops issued {issued}{}",
            setup.label(),
            if counted == issued {
                " (equal)".to_string()
            } else if lost > 0 {
                format!(
                    " (bpftrace reported {lost} lines lost: its perf buffer filled faster than \
                     it printed; its CPU figures are for the lines it did print)"
                )
            } else {
                " (differ: other processes on this machine issued some too, or bpftrace missed \
                 calls)"
                    .to_string()
            }
        )?;
        writeln!(
            out,
            "- its program: `{}`",
            bpftrace_program(ctx.dev_null_rdev, full)
        )?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
pub(super) enum Metric {
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
    pub(super) fn of(self, r: &LoopResult) -> f64 {
        match self {
            Self::Caller => r.cpu_ns_per_call,
            Self::Tracer => r.tracer_cpu_ns_per_call,
            Self::Total => r.cpu_ns_per_call + r.tracer_cpu_ns_per_call,
            Self::Wall => r.ns_per_call,
        }
    }
}

pub(super) fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}
