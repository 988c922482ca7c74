//! Part: the knee (highest sustained rate without drops), and what happens past it.

use super::*;

pub(super) struct KneeStep {
    pub(super) achieved: f64,
    pub(super) issued: u64,
    pub(super) end: GpuTraceEnd,
}

pub(super) fn knee_step(
    ctx: &Ctx,
    rate: Option<f64>,
    seconds: f64,
    threads: usize,
) -> Result<KneeStep> {
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

pub(super) fn knee_part(ctx: &Ctx, seconds: f64, ncpu: usize, out: &mut String) -> Result<()> {
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
         \"accounted\" checks emitted + dropped = calls issued + the generator's exit notice + \
         its cgroup record, in every run. Load average at \
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
            // `emitted` counts every record kind: the generator's process-exit notice and its
            // cgroup record (tried once per process) too.
            .filter(|s| s.end.emitted + s.end.dropped != s.issued + 2)
            .map(|s| {
                format!(
                    "issued {} + 1 exit notice + 1 cgroup record vs emitted {} + dropped {}",
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
