//! What `--metrics` costs the pipeline: records per CPU-second through `Pipeline` (text -v into
//! a sink) without and with the metrics attached, interleaved repetitions on the calling thread,
//! and what one scrape (encoding the registry) costs afterwards.
//!
//! Used by `cargo xtask fleet --cost`; meant to join the pipeline part of `cargo xtask bench`
//! (call [`measure`] on the pinned thread with the same replicated records, and append
//! [`render`]'s table).

use std::{
    io,
    time::{Duration, Instant},
};

use anyhow::Result;
use gpu_trace::{
    cli::{Format, Timestamps},
    metrics::{Metrics, MetricsConfig},
    model::stats::KernelCounters,
    output::clock::Clock,
    pipeline::{Pipeline, PipelineConfig},
};

/// The measurements: per repetition, records per CPU-second without and with metrics.
pub struct MetricsCost {
    pub records: usize,
    pub without: Vec<f64>,
    pub with: Vec<f64>,
    /// CPU time of one scrape (encoding the registry after a whole run), and its size.
    pub scrape: Duration,
    pub scrape_bytes: usize,
}

/// CPU time of the calling thread (user + system), in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage`; it was zeroed before, so it is initialised either way.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr());
        ru.assume_init()
    };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

fn config(clock: &Clock) -> PipelineConfig {
    PipelineConfig {
        show_container: false,
        verbose: true,
        pids: Vec::new(),
        comms: Vec::new(),
        format: Format::Text,
        timestamps: Timestamps::Wall,
        stats: true,
        clock: clock.clone(),
    }
}

/// Feeds `records` through the pipeline `reps` times each way, alternating.
pub fn measure(records: &[Vec<u8>], clock: &Clock, reps: usize) -> Result<MetricsCost> {
    let mut without = Vec::new();
    let mut with = Vec::new();
    let mut scrape = Duration::ZERO;
    let mut scrape_bytes = 0;
    for _ in 0..reps {
        for metrics_on in [false, true] {
            let cpu0 = thread_cpu_ns();
            let mut p = Pipeline::new(config(clock), io::sink());
            let registry = if metrics_on {
                let m = Metrics::new(MetricsConfig::default());
                let r = m.registry();
                p = p.with_output(Box::new(m));
                Some(r)
            } else {
                None
            };
            for r in records {
                p.feed(r)?;
            }
            p.flush()?;
            p.finish(KernelCounters::default(), Duration::from_secs(1))?;
            let rate = records.len() as f64 / ((thread_cpu_ns() - cpu0) as f64 / 1e9);
            match registry {
                Some(reg) => {
                    with.push(rate);
                    let t0 = Instant::now();
                    let body = gpu_trace::metrics::encode(&reg);
                    scrape = t0.elapsed();
                    scrape_bytes = body.len();
                }
                None => without.push(rate),
            }
        }
    }
    Ok(MetricsCost {
        records: records.len(),
        without,
        with,
        scrape,
        scrape_bytes,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The Markdown table of `cost`.
pub fn render(cost: &MetricsCost) -> String {
    let (a, b) = (median(&cost.without), median(&cost.with));
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{:.2} M [{:.2}–{:.2}]", median(v) / 1e6, lo / 1e6, hi / 1e6)
    };
    format!(
        "| pipeline (text -v, {} records, {} reps) | records/CPU-s, median [min–max] |\n\
         |---|---|\n\
         | without --metrics | {} |\n\
         | with --metrics | {} |\n\n\
         With metrics: {:.1} % of the rate without. One scrape after the run: {:.0} µs, {} bytes.\n",
        cost.records,
        cost.without.len(),
        range(&cost.without),
        range(&cost.with),
        100.0 * b / a,
        cost.scrape.as_secs_f64() * 1e6,
        cost.scrape_bytes
    )
}
