//! Part: userspace pipeline throughput on the GPU-host recordings.

use super::{
    against::{Before, head_commit},
    figures::{Figure, Figures, Kept},
    *,
};

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

/// The outputs measured, in table order: (label, format, `-v`).
const OUTPUTS: [(&str, Format, bool); 4] = [
    ("text", Format::Text, false),
    ("text -v", Format::Text, true),
    ("json", Format::Json, false),
    ("json -v", Format::Json, true),
];

/// What the pipeline part does besides measuring (`--against`, `--save`, `--emit`, the margin).
pub(super) struct PipelineOpts {
    pub records: usize,
    pub against: Option<String>,
    pub save: bool,
    pub emit: Option<PathBuf>,
    /// The noise margin, a fraction.
    pub margin: f64,
}

/// One pass of all records through the pipeline in one configuration.
struct Sample {
    records_per_cpu_s: f64,
    events_per_cpu_s: f64,
    records_per_wall_s: f64,
    events: u64,
}

fn measure_once(
    records: &[Vec<u8>],
    clock: &Clock,
    format: Format,
    verbose: bool,
) -> Result<Sample> {
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
    for r in records {
        p.feed(r)?;
    }
    let summary = p.finish(KernelCounters::default(), Duration::from_secs(1))?;
    let cpu_s = (thread_cpu_ns() - cpu0) as f64 / 1e9;
    let wall_s = started.elapsed().as_secs_f64();
    Ok(Sample {
        records_per_cpu_s: records.len() as f64 / cpu_s,
        events_per_cpu_s: summary.events as f64 / cpu_s,
        records_per_wall_s: records.len() as f64 / wall_s,
        events: summary.events,
    })
}

/// Every repetition of every output, and with `--against` REV's figures of each repetition.
struct Measured {
    /// Per output (in [`OUTPUTS`] order), one sample per repetition.
    samples: Vec<Vec<Sample>>,
    before: Vec<Vec<Figure>>,
}

/// The repetitions on one pinned thread; REV's run alternates before and after this build's
/// outputs from one repetition to the next.
fn measure(
    ctx: &Ctx,
    records: &[Vec<u8>],
    clock: &Clock,
    before: Option<&Before>,
) -> Result<Measured> {
    let (cpu, reps, root) = (ctx.cpu, ctx.reps, ctx.root.as_path());
    thread::scope(|s| {
        s.spawn(|| -> Result<Measured> {
            pin_to_cpu(cpu);
            let mut m = Measured {
                samples: OUTPUTS.iter().map(|_| Vec::new()).collect(),
                before: Vec::new(),
            };
            for rep in 0..reps {
                let run_before = |m: &mut Measured| -> Result<()> {
                    if let Some(b) = before {
                        progress(format!("pipeline: repetition {}, {}", rep + 1, b.rev));
                        m.before.push(b.run_once(root, records.len())?);
                    }
                    Ok(())
                };
                if rep % 2 == 0 {
                    run_before(&mut m)?;
                }
                for (i, &(_, format, verbose)) in OUTPUTS.iter().enumerate() {
                    m.samples[i].push(measure_once(records, clock, format, verbose)?);
                }
                if rep % 2 == 1 {
                    run_before(&mut m)?;
                }
            }
            Ok(m)
        })
        .join()
        .map_err(|_| anyhow!("the pipeline thread panicked"))?
    })
}

/// `3.15 M/s [3.01 M/s–3.20 M/s]`: what the table prints of a spread of rates, and what
/// [`figures::parse_human`] reads back.
fn rate_range(s: Spread) -> String {
    format!(
        "{} [{}–{}]",
        fmt_rate(s.median),
        fmt_rate(s.min),
        fmt_rate(s.max)
    )
}

pub(super) fn pipeline_part(ctx: &Ctx, opts: &PipelineOpts, out: &mut String) -> Result<()> {
    if opts.save && cfg!(debug_assertions) {
        bail!("--save keeps measurements: run without --quick (a release build)");
    }
    let before = match &opts.against {
        Some(rev) => Some(Before::prepare(ctx, rev)?),
        None => None,
    };
    // What is measured, taken before measuring.
    let (commit, load) = (head_commit(&ctx.root), load_average());
    progress(format!("pipeline: {} records per run", opts.records));
    let (records, clock, distinct) = replicated_records(&ctx.root, opts.records)?;
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
    let measured = measure(ctx, &records, &clock, before.as_ref())?;
    drop(records);
    let mut now = Figures {
        commit,
        cpu: cpu_model(),
        date: command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        load,
        records: n,
        reps: ctx.reps,
        figures: Vec::new(),
    };
    for ((label, ..), samples) in OUTPUTS.iter().zip(&measured.samples) {
        let of =
            |f: fn(&Sample) -> f64| spread(&samples.iter().map(f).collect::<Vec<_>>()).unwrap();
        let r = of(|s| s.records_per_cpu_s);
        writeln!(
            out,
            "| {label} | {} | {} | {} | {} |",
            rate_range(r),
            rate_range(of(|s| s.events_per_cpu_s)),
            rate_range(of(|s| s.records_per_wall_s)),
            samples.last().map_or(0, |s| s.events)
        )?;
        now.figures.push(Figure {
            output: label.to_string(),
            records_per_cpu_s: r.median,
            min: r.min,
            max: r.max,
        });
    }
    if cfg!(debug_assertions) {
        writeln!(
            out,
            "\n- xtask is a debug build here (--quick): these rates are not measurements; they \
             are neither compared with nor saved as the kept figures"
        )?;
    } else if let Some(r) = now.get("text -v") {
        writeln!(
            out,
            "\n- text -v: {} per CPU-second → target ≥ 2 M records/s: {}",
            fmt_rate(r.records_per_cpu_s),
            verdict(r.records_per_cpu_s >= 2e6)
        )?;
    }
    if let Some(b) = &before {
        writeln!(out, "{}", before_after(b, &measured, &now)?)?;
    }
    kept_figures(ctx, opts, &now, out)?;
    if let Some(path) = &opts.emit {
        let json = serde_json::to_string_pretty(&now).expect("figures serialize");
        fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    print_now(out);
    Ok(())
}

/// This run against the kept figures, and with `--save` this run kept in their place.
fn kept_figures(ctx: &Ctx, opts: &PipelineOpts, now: &Figures, out: &mut String) -> Result<()> {
    if cfg!(debug_assertions) {
        return Ok(());
    }
    let path = ctx.root.join(figures::KEPT_FILE);
    let mut kept = Kept::load(&path)?;
    let (report, drops) = figures::report(&kept, figures::KEPT_FILE, now, opts.margin);
    out.push_str(&report);
    if drops != 0 {
        progress(format!(
            "pipeline: {drops} figure(s) dropped against {} (DROP lines above)",
            figures::KEPT_FILE
        ));
    }
    if opts.save {
        kept.keep(now.clone());
        kept.save(&path)?;
        writeln!(
            out,
            "\nKept these figures in {} for this CPU (commit it).",
            figures::KEPT_FILE
        )?;
    }
    Ok(())
}

/// The `--against` table: REV's figures and this build's, repetition by repetition, and their
/// ratio paired per repetition.
fn before_after(b: &Before, m: &Measured, now: &Figures) -> Result<String> {
    let mut s = String::new();
    writeln!(
        s,
        "\n### Before/after: {} ({}) against this tree ({}), same records, interleaved\n",
        b.rev, b.commit, now.commit
    )?;
    if cfg!(debug_assertions) {
        writeln!(
            s,
            "This tree's side is a debug build here (--quick) and {}'s a release build: the \
             ratios below say nothing about the change.\n",
            b.rev
        )?;
    }
    if !b.emits {
        writeln!(
            s,
            "{}'s xtask has no `--emit`: its figures were read from the table it printed \
             (three significant digits).\n",
            b.rev
        )?;
    }
    writeln!(
        s,
        "| output | before records/CPU-s | after records/CPU-s | after/before |"
    )?;
    writeln!(s, "|---|---|---|---|")?;
    for (i, (label, ..)) in OUTPUTS.iter().enumerate() {
        let mut before = Vec::new();
        let mut ratios = Vec::new();
        for (rep, figures) in m.before.iter().enumerate() {
            let Some(f) = figures.iter().find(|f| f.output == *label) else {
                continue;
            };
            before.push(f.records_per_cpu_s);
            ratios.push(m.samples[i][rep].records_per_cpu_s / f.records_per_cpu_s);
        }
        let after: Vec<f64> = m.samples[i].iter().map(|s| s.records_per_cpu_s).collect();
        let before = spread(&before).map_or("— (not measured there)".into(), rate_range);
        writeln!(
            s,
            "| {label} | {before} | {} | {} |",
            rate_range(spread(&after).unwrap()),
            fmt_ratio(spread(&ratios))
        )?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What revisions without `--emit` print is what [`figures::parse_human`] reads: the row
    /// this module writes reads back to its median and range (at the table's precision).
    #[test]
    fn the_printed_row_reads_back() {
        let r = spread(&[3.154e6, 2.991e6, 3.3e6]).unwrap();
        let e = spread(&[400e3, 420e3]).unwrap();
        let out = format!(
            "## 4. Userspace\n\n| output | a | b | c | d |\n|---|---|---|---|---|\n\
             | json -v | {} | {} | {} | 12 |\n",
            rate_range(r),
            rate_range(e),
            rate_range(r)
        );
        let f = figures::parse_human(&out);
        assert_eq!(f.len(), 1, "{out}");
        assert_eq!(f[0].output, "json -v");
        for (got, want) in [
            (f[0].records_per_cpu_s, 3.15e6),
            (f[0].min, 2.99e6),
            (f[0].max, 3.30e6),
        ] {
            assert!((got - want).abs() < 1.0, "{got} != {want}");
        }
    }
}
