//! Part: userspace pipeline throughput on the GPU-host recordings.

use super::*;

/// One pipeline-throughput row: the rates per repetition, and the events of one run.
struct PipelineRow {
    label: &'static str,
    records_per_cpu_s: Vec<f64>,
    events_per_cpu_s: Vec<f64>,
    records_per_wall_s: Vec<f64>,
    events: u64,
}

/// The records of the GPU-host recordings, replicated to at least `want`, timestamps shifted so
/// that time moves forward across copies.
pub(super) fn replicated_records(root: &Path, want: usize) -> Result<(Vec<Vec<u8>>, Clock, usize)> {
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

pub(super) fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

pub(super) fn pipeline_part(ctx: &Ctx, want: usize, out: &mut String) -> Result<()> {
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
                        show_container: false,
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
                results.push(PipelineRow {
                    label,
                    records_per_cpu_s: rec_rates,
                    events_per_cpu_s: ev_rates,
                    records_per_wall_s: wall_rates,
                    events,
                });
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
    for PipelineRow {
        label,
        records_per_cpu_s: rec,
        events_per_cpu_s: ev,
        records_per_wall_s: wall,
        events,
    } in results
    {
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
