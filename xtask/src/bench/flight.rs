//! `flight`: what `--flight-recorder` costs in memory under a hostile load, and what a scrape
//! costs with many series (issue 42).
//!
//! - **Memory.** gpu-trace (default hook, `--watch-device /dev/null`) without and with
//!   `--flight-recorder 10m` (its default byte cap), under [`PROCESSES`] processes of
//!   `bench/syscall_loop.c`'s `rm-handles` at once (RM-shaped calls on a new handle every four
//!   calls, never freed: distinct handles, a storm, many processes); with the flight recorder,
//!   a SIGUSR1 dump at the end (its serialized copy counts). The figure is gpu-trace's peak
//!   resident memory (`VmHWM` of /proc/PID/status) read just before it is stopped, and with
//!   the flight recorder its ratio to the run without, paired by repetition. The untraced
//!   baseline of the other parts has no gpu-trace process, so it is no RSS comparison: the
//!   ratio is against gpu-trace itself without `--flight-recorder`.
//! - **Scrape.** The library's `Metrics` with [`SERIES`] share-gauge series (distinct process
//!   names) and as many `--api` call-counter label sets (three counters each): the CPU time of
//!   encoding the registry (what `GET /metrics` does besides the socket), and its size.

use super::*;
use gpu_trace::{
    event::Origin,
    metrics::{Metrics, MetricsConfig},
    sink::{ApiEnriched, Sink},
};

/// Load processes at once.
const PROCESSES: usize = 8;
/// Series of each kind in the scrape measurement.
const SERIES: usize = 5000;

pub(super) fn flight_part(ctx: &Ctx, out: &mut String) -> Result<()> {
    let iters = ctx.iters;
    writeln!(
        out,
        "\n## Flight recorder: gpu-trace's peak RSS under {PROCESSES} processes × {iters} \
         `rm-handles` calls (distinct handles, never freed), median [min–max] of {} runs\n",
        ctx.reps
    )?;
    writeln!(
        out,
        "The RSS is gpu-trace's own: the untraced baseline of the other parts runs no gpu-trace, \
         so it is no RSS comparison; the ratio is against gpu-trace without --flight-recorder \
         (paired by repetition).\n"
    )?;
    writeln!(
        out,
        "| gpu-trace | peak RSS (MiB) | × without | records emitted | dropped |\n\
         |---|---|---|---|---|"
    )?;
    let mut without: Vec<f64> = Vec::new();
    for flight in [false, true] {
        let mut rss = Vec::new();
        let (mut emitted, mut dropped) = (Vec::new(), Vec::new());
        for rep in 0..ctx.reps {
            let (peak, end) = run_once(ctx, flight, rep)?;
            rss.push(peak as f64 / 1024.0);
            emitted.push(end.emitted as f64);
            dropped.push(end.dropped as f64);
        }
        let label = if flight {
            format!(
                "--flight-recorder 10m ({} MiB cap), a SIGUSR1 dump at the end",
                gpu_trace::cli::recording::DEFAULT_FLIGHT_BYTES >> 20
            )
        } else {
            "without --flight-recorder".to_string()
        };
        let ratio = if flight {
            let r: Vec<f64> = rss.iter().zip(&without).map(|(w, o)| w / o).collect();
            fmt_ratio(spread(&r))
        } else {
            without = rss.clone();
            "1×".to_string()
        };
        let med = |v: &[f64]| spread(v).map_or(0.0, |s| s.median);
        writeln!(
            out,
            "| {label} | {} | {ratio} | {:.0} | {:.0} |",
            fmt_ns(spread(&rss)),
            med(&emitted),
            med(&dropped)
        )?;
    }
    print_now(out);
    scrape_part(ctx, out)
}

/// One run: gpu-trace started, the load, (a dump), its peak RSS in KiB and its end.
fn run_once(ctx: &Ctx, flight: bool, rep: usize) -> Result<(u64, GpuTraceEnd)> {
    let tag = format!("flight-{flight}-{rep}");
    let dumps = ctx.work.join(format!("dumps-{tag}"));
    let _ = fs::remove_dir_all(&dumps);
    fs::create_dir_all(&dumps)?;
    let output = ctx.work.join(format!("gpu-trace-{tag}.out"));
    let mut cmd = Command::new(&ctx.gpu_trace);
    stops_with_us(&mut cmd);
    cmd.args(["-v", "--watch-device", "/dev/null", "-o"])
        .arg(&output);
    if flight {
        cmd.args(["--flight-recorder", "10m", "--dump-dir"])
            .arg(&dumps);
    }
    let mut child = (cmd.stdin(Stdio::null()).stdout(Stdio::null()))
        .stderr(Stdio::piped())
        .spawn()
        .context("starting gpu-trace")?;
    let mut stderr = LineReader::spawn(child.stderr.take().unwrap());
    let hooks = stderr.wait_for("hooks:", Duration::from_secs(60))?;
    let loads: Vec<Child> = (0..PROCESSES)
        .map(|_| {
            Command::new(&ctx.loop_bin)
                .args(["rm-handles", "--iters", &ctx.iters.to_string()])
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<io::Result<_>>()
        .context("running syscall_loop")?;
    for mut l in loads {
        l.wait()?;
    }
    if flight {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGUSR1) };
        stderr.wait_for("flight recorder: signal came", Duration::from_secs(60))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while fs::read_dir(&dumps)?
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with("gpu-trace-"))
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(20));
        }
    }
    let peak = peak_rss_kib(child.id())?;
    let run = GpuTraceRun {
        child,
        stderr,
        output,
        hooks,
    };
    let end = stop_gpu_trace(run)?;
    let _ = fs::remove_dir_all(&dumps);
    Ok((peak, end))
}

/// `VmHWM` of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    (status.lines())
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmHWM in /proc/{pid}/status"))
}

/// The scrape's CPU time with many series (see the module documentation).
fn scrape_part(ctx: &Ctx, out: &mut String) -> Result<()> {
    let mut m = Metrics::new(MetricsConfig {
        max_comms: 2 * SERIES,
        max_label_sets: 4 * SERIES,
        ..MetricsConfig::default()
    });
    let shares: Vec<_> = (0..SERIES)
        .map(|i| (0u32, format!("proc-{i}"), None, 0.5))
        .collect();
    m.set_shares(&shares);
    for i in 0..SERIES {
        let row = gpu_trace_core::api::stats::CallStats {
            pid: 1000 + i as u32,
            library: "/usr/lib/libcuda.so.1".into(),
            preload: false,
            symbol: format!("cuSymbol{}", i % 64),
            calls: 10,
            errors: 1,
            total_ns: 1000,
            hist: Vec::new(),
        };
        let event = gpu_trace_core::api::names::ApiEvent::Stats(row);
        let origin = Origin {
            ts_ns: 1,
            cpu: 0,
            pid: 1000 + i as u32,
            tid: 1000 + i as u32,
            comm: Default::default(),
        };
        let process = format!("proc-{i}");
        let ev = ApiEnriched {
            event: &event,
            origin: &origin,
            process: &process,
            cgroup: None,
        };
        m.api(&ev).map_err(|e| anyhow!("{e}"))?;
    }
    let mut cpu = Vec::new();
    let mut bytes = 0;
    for _ in 0..ctx.reps.max(3) {
        let start = thread_cpu_ns();
        let text = m.encode();
        cpu.push((thread_cpu_ns() - start) as f64 / 1e6);
        bytes = text.len();
    }
    let series = m.encode().lines().filter(|l| !l.starts_with('#')).count();
    writeln!(
        out,
        "\n## Scrape with many series: encoding the registry (CPU ms, median [min–max])\n\n\
         | series | bytes | CPU ms |\n|---|---|---|\n| {series} | {bytes} | {} |",
        fmt_ns(spread(&cpu))
    )?;
    print_now(out);
    Ok(())
}
