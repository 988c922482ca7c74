//! Per-process GPU share, sampled while tracing: NVML's process utilization samples
//! (`nvmlDeviceGetProcessUtilization`, through `nvml-wrapper`) read on a thread of their own
//! every `--share-interval`, handed to the live loop over a bounded channel. A poll that has
//! not returned after [`POLL_LIMIT`] ends sampling (one line; the thread is left to itself,
//! never joined).
//!
//! AMD: KFD offers no per-process utilization sample (its sysfs `proc/<pid>` entries give VRAM
//! and, on some kernels, per-queue busy time that is not exported per process in a form
//! comparable to NVML's): nothing is sampled there, and nothing is invented.
//!
//! Test-only: [`REPLAY_ENV`] names a capture of NVML samples (`nvml.jsonl`, as written by
//! `examples/gpu-host-share-capture.py`) replayed one line per period instead of asking NVML,
//! so that the outputs can be checked on a machine without a GPU. Debug builds only: the
//! release binary ignores it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread,
    time::{Duration, Instant},
};

use gpu_trace_core::model::share::{ShareSample, parse_capture_line};
use nvml_wrapper::{Nvml, error::NvmlError};

/// Test-only: a capture file replayed in place of NVML (see the module documentation).
pub const REPLAY_ENV: &str = "GPU_TRACE_TEST_SHARE_REPLAY";

/// Batches waiting for the live loop; beyond this, new ones are dropped (and counted).
const QUEUE: usize = 64;

/// Where share samples come from.
pub trait ShareSampler: Send {
    /// The samples taken since the last call. `Err`: sampling cannot go on (said once).
    fn poll(&mut self) -> Result<Vec<ShareSample>, String>;
}

/// NVML: each GPU's samples newer than the last one seen.
pub struct NvmlSampler {
    nvml: Nvml,
    /// `(index, uuid, newest timestamp seen)`.
    gpus: Vec<(u32, Option<String>, u64)>,
}

impl NvmlSampler {
    /// Samples the GPUs [`crate::probe::nvml::start`] counted, with the library it kept open
    /// (started before the programs attach: its start-up calls are not traced).
    pub fn new(nvml: Nvml, devices: Vec<(u32, Option<String>)>) -> Self {
        let gpus = devices.into_iter().map(|(i, uuid)| (i, uuid, 0)).collect();
        Self { nvml, gpus }
    }
}

impl ShareSampler for NvmlSampler {
    fn poll(&mut self) -> Result<Vec<ShareSample>, String> {
        let mut out = Vec::new();
        for (index, uuid, last_seen) in &mut self.gpus {
            let dev = self
                .nvml
                .device_by_index(*index)
                .map_err(|e| format!("NVML lost GPU {index} ({e})"))?;
            let samples = match dev.process_utilization_stats(*last_seen) {
                Ok(s) => s,
                // No sample yet (nothing ran since `last_seen`).
                Err(NvmlError::NotFound) => continue,
                Err(e) => {
                    return Err(format!(
                        "NVML refused process utilization on GPU {index} ({e})"
                    ));
                }
            };
            for s in samples {
                *last_seen = (*last_seen).max(s.timestamp);
                out.push(ShareSample {
                    gpu: *index,
                    uuid: uuid.clone(),
                    pid: s.pid,
                    ts_us: s.timestamp,
                    sm: s.sm_util,
                    mem: s.mem_util,
                    enc: s.enc_util,
                    dec: s.dec_util,
                });
            }
        }
        Ok(out)
    }
}

/// Test-only stand-in: the lines of a capture, one per poll, then nothing.
pub struct ReplaySampler {
    lines: std::vec::IntoIter<String>,
}

impl ReplaySampler {
    pub fn open(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the share capture {path} ({e})"))?;
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        Ok(Self {
            lines: lines.into_iter(),
        })
    }
}

impl ShareSampler for ReplaySampler {
    fn poll(&mut self) -> Result<Vec<ShareSample>, String> {
        match self.lines.next() {
            Some(line) => parse_capture_line(&line, 0).map_err(|e| format!("share capture: {e}")),
            None => Ok(Vec::new()),
        }
    }
}

/// Test-only: the capture [`REPLAY_ENV`] names, if set ([`crate::test_var`]: a release build
/// never lets an environment variable swap NVML for a file).
pub fn replay_capture() -> Option<String> {
    crate::test_var(REPLAY_ENV)?.into_string().ok()
}

/// How long one poll of the sampler may take before sampling is given up (the poll is left to
/// itself on the sampling thread).
pub const POLL_LIMIT: Duration = Duration::from_secs(2);

/// A poll that did not return within [`POLL_LIMIT`].
#[derive(Debug, thiserror::Error)]
#[error(
    "NVML ({lib}) did not answer a sample within {secs} s",
    lib = crate::probe::nvml::LIBRARY,
    secs = POLL_LIMIT.as_secs()
)]
pub struct Stalled;

/// The sampling thread, as the live loop holds it. Dropping it stops the thread at once (it
/// waits on the stop channel between polls); it is never joined, so a slow NVML call cannot
/// delay gpu-trace's exit.
pub struct ShareThread {
    pub samples: Receiver<Vec<ShareSample>>,
    _stop: SyncSender<()>,
    /// When the poll under way started, in ms since `since`, plus one; 0 between polls.
    busy: Arc<AtomicU64>,
    since: Instant,
}

/// Starts polling `sampler` every `period`; a sampler that fails says so once on stderr and
/// stops.
pub fn start(mut sampler: Box<dyn ShareSampler>, period: Duration) -> std::io::Result<ShareThread> {
    let (tx, samples) = std::sync::mpsc::sync_channel(QUEUE);
    let (stop, stopped) = std::sync::mpsc::sync_channel::<()>(0);
    let (busy, since) = (Arc::new(AtomicU64::new(0)), Instant::now());
    let polling = Polling {
        busy: Arc::clone(&busy),
        since,
    };
    thread::Builder::new()
        .name("gpu-trace-share".into())
        .spawn(move || sample_loop(sampler.as_mut(), period, &tx, &stopped, &polling))?;
    Ok(ShareThread {
        samples,
        _stop: stop,
        busy,
        since,
    })
}

/// The sampling thread's side of [`ShareThread::busy`].
struct Polling {
    busy: Arc<AtomicU64>,
    since: Instant,
}

impl Polling {
    fn poll(&self, sampler: &mut dyn ShareSampler) -> Result<Vec<ShareSample>, String> {
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.busy.store(now + 1, Ordering::Relaxed);
        let answer = sampler.poll();
        self.busy.store(0, Ordering::Relaxed);
        answer
    }
}

fn sample_loop(
    sampler: &mut dyn ShareSampler,
    period: Duration,
    tx: &SyncSender<Vec<ShareSample>>,
    stopped: &Receiver<()>,
    polling: &Polling,
) {
    loop {
        match polling.poll(sampler) {
            Ok(batch) if batch.is_empty() => {}
            Ok(batch) => match tx.try_send(batch) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => return,
            },
            Err(why) => {
                crate::say!("gpu-trace: GPU share sampling stopped: {why}; tracing goes on");
                return;
            }
        }
        match stopped.recv_timeout(period) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

impl ShareThread {
    /// The batches waiting now; `Err` when a poll has been under way longer than
    /// [`POLL_LIMIT`] (the caller drops the thread, which is never waited for).
    pub fn take(&self) -> Result<Vec<ShareSample>, Stalled> {
        let batches: Vec<ShareSample> = self.samples.try_iter().flatten().collect();
        let started = self.busy.load(Ordering::Relaxed);
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        let limit = u64::try_from(POLL_LIMIT.as_millis()).unwrap_or(u64::MAX);
        if started != 0 && now.saturating_sub(started - 1) > limit {
            return Err(Stalled);
        }
        Ok(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in `libnvidia-ml.so.1` with one GPU whose driver holds samples at 100, 200 and
    /// 300 µs, and a fourth at 400 µs from the first read of samples on (taken after it). Its
    /// `nvmlDeviceGetProcessUtilization` keeps NVML's contract: only the samples newer than
    /// `lastSeenTimeStamp`; with no buffer, their count (`INSUFFICIENT_SIZE`); none newer,
    /// `NOT_FOUND`.
    const STAND_IN: &str = r#"
typedef struct { unsigned pid; unsigned long long ts; unsigned sm, mem, enc, dec; } sample;
static const sample all[4] = {
    {11, 100, 90, 1, 0, 0}, {12, 200, 80, 2, 0, 0}, {11, 300, 70, 3, 0, 0}, {12, 400, 60, 4, 0, 0},
};
static int reads;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **dev) { *dev = (void *)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetProcessUtilization(void *dev, sample *out, unsigned *count,
                                    unsigned long long last_seen) {
    unsigned n = 0, held = reads ? 4 : 3;
    (void)dev;
    for (unsigned i = 0; i < held; i++)
        if (all[i].ts > last_seen) {
            if (out && n < *count)
                out[n] = all[i];
            n++;
        }
    if (n == 0)
        return 6; /* NVML_ERROR_NOT_FOUND */
    if (!out || *count < n) {
        *count = n;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    *count = n;
    reads++;
    return 0;
}
"#;

    // Each poll returns only what the previous polls did not: the samples at 100, 200 and 300,
    // then the one taken since (400), then nothing. A sampler that never advanced its last
    // seen time would hand all of them out again on every poll, and the share figures would
    // count them twice.
    #[test]
    fn a_poll_returns_only_the_samples_newer_than_the_last_poll() {
        let test = "a_poll_returns_only_the_samples_newer_than_the_last_poll";
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("nvml.c");
        let lib = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(&src, STAND_IN).unwrap();
        let Ok(built) = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
        else {
            gpu_trace_core::skip::skipped(test, "no C compiler (cc) to build a stand-in NVML");
            return;
        };
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
        let mut sampler = NvmlSampler::new(nvml, vec![(0, Some("GPU-test".into()))]);
        let seen = |batch: Vec<ShareSample>| -> Vec<(u32, u64, u32)> {
            batch.iter().map(|s| (s.pid, s.ts_us, s.sm)).collect()
        };
        assert_eq!(
            seen(sampler.poll().unwrap()),
            [(11, 100, 90), (12, 200, 80), (11, 300, 70)]
        );
        assert_eq!(seen(sampler.poll().unwrap()), [(12, 400, 60)]);
        assert_eq!(seen(sampler.poll().unwrap()), []);
    }
}
