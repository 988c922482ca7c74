//! `process_cpu_seconds_total` and `process_resident_memory_bytes` of gpu-trace itself, read at
//! each scrape (the names and meanings of Prometheus's process collectors).

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

use super::{CPU, RSS};

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
