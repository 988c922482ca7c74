//! `process_cpu_seconds_total` and `process_resident_memory_bytes` of gpu-trace itself, read at
//! each scrape (the names and meanings of Prometheus's process collectors). Here rather than in
//! the pure core, which reads nothing of the system: [`metrics`] makes the core's metrics with
//! this collector added.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

use gpu_trace_core::metrics::{CPU, Metrics, MetricsConfig, RSS};

/// Reads the process's CPU time and resident memory when scraped.
#[derive(Debug)]
pub struct ProcessCollector;

/// User plus system CPU seconds of this process (`getrusage(RUSAGE_SELF)`).
pub fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into the pointer it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: initialised by the successful call above (and zeroed before it).
    let ru = unsafe { ru.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// Resident memory in bytes (`/proc/self/statm`), if readable.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cpu = ConstCounter::new(cpu_seconds());
        let name = CPU.name.strip_suffix("_total").unwrap_or(CPU.name);
        let m = encoder.encode_descriptor(name, CPU.help, None, cpu.metric_type())?;
        cpu.encode(m)?;
        if let Some(bytes) = resident_bytes() {
            let rss = ConstGauge::new(bytes as i64);
            let m = encoder.encode_descriptor(RSS.name, RSS.help, None, rss.metric_type())?;
            rss.encode(m)?;
        }
        Ok(())
    }
}

/// The core's metrics with gpu-trace's own process's CPU time and memory (what `--metrics`
/// serves).
pub fn metrics(config: MetricsConfig) -> Metrics {
    Metrics::with_collectors(config, vec![Box::new(ProcessCollector)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--metrics` serves carries the process's CPU time and resident memory, read at
    /// the scrape.
    #[test]
    fn the_served_metrics_carry_the_process_s_cpu_time_and_memory() {
        let text = metrics(MetricsConfig::default()).encode();
        let sample = |series: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .map(|v| v.parse::<f64>().expect("a number"))
        };
        let cpu = sample("process_cpu_seconds_total").expect("cpu seconds");
        assert!(cpu > 0.0, "{cpu}");
        let rss = sample("process_resident_memory_bytes").expect("resident memory");
        assert!(rss > 1e6, "{rss}");
        // Under the names and types the reference documents (docs/fleet.md).
        for d in [CPU, RSS] {
            let family = d.name.strip_suffix("_total").unwrap_or(d.name);
            let want = format!("# TYPE {family} {}", d.kind);
            assert!(text.lines().any(|l| l == want), "{want}: {text}");
        }
    }
}
