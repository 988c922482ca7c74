//! Per-process GPU share, sampled while tracing: NVML's process utilization samples
//! (`nvmlDeviceGetProcessUtilization`, through `nvml-wrapper`) read on a thread of their own
//! every `--share-interval`, handed to the live loop over a bounded channel.
//!
//! AMD: KFD offers no per-process utilization sample (its sysfs `proc/<pid>` entries give VRAM
//! and, on some kernels, per-queue busy time that is not exported per process in a form
//! comparable to NVML's): nothing is sampled there, and nothing is invented.
//!
//! Test-only: [`REPLAY_ENV`] names a capture of NVML samples (`nvml.jsonl`, as written by
//! `examples/gpu-host-share-capture.py`) replayed one line per period instead of asking NVML,
//! so that the outputs can be checked on a machine without a GPU.

use std::{
    sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError},
    thread,
    time::Duration,
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
    /// Opens NVML (before the programs attach: its start-up calls are not traced).
    pub fn open() -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML unavailable ({e})"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count failed ({e})"))?;
        let gpus = (0..count)
            .map(|i| {
                let uuid = nvml.device_by_index(i).ok().and_then(|d| d.uuid().ok());
                (i, uuid, 0)
            })
            .collect();
        Ok(Self { nvml, gpus })
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

/// The sampler to use: the test stand-in when [`REPLAY_ENV`] is set, else NVML. `Err`: the
/// line to print (tracing goes on without shares).
pub fn open() -> Result<Box<dyn ShareSampler>, String> {
    match std::env::var(REPLAY_ENV) {
        Ok(path) => Ok(Box::new(ReplaySampler::open(&path)?)),
        Err(_) => Ok(Box::new(NvmlSampler::open()?)),
    }
}

/// The sampling thread, as the live loop holds it. Dropping it stops the thread at once (it
/// waits on the stop channel between polls); it is never joined, so a slow NVML call cannot
/// delay gpu-trace's exit.
pub struct ShareThread {
    pub samples: Receiver<Vec<ShareSample>>,
    _stop: SyncSender<()>,
}

/// Starts polling `sampler` every `period`; a sampler that fails says so once on stderr and
/// stops.
pub fn start(mut sampler: Box<dyn ShareSampler>, period: Duration) -> std::io::Result<ShareThread> {
    let (tx, samples) = std::sync::mpsc::sync_channel(QUEUE);
    let (stop, stopped) = std::sync::mpsc::sync_channel::<()>(0);
    thread::Builder::new()
        .name("gpu-trace-share".into())
        .spawn(move || sample_loop(sampler.as_mut(), period, &tx, &stopped))?;
    Ok(ShareThread {
        samples,
        _stop: stop,
    })
}

fn sample_loop(
    sampler: &mut dyn ShareSampler,
    period: Duration,
    tx: &SyncSender<Vec<ShareSample>>,
    stopped: &Receiver<()>,
) {
    loop {
        match sampler.poll() {
            Ok(batch) if batch.is_empty() => {}
            Ok(batch) => match tx.try_send(batch) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => return,
            },
            Err(why) => {
                eprintln!("gpu-trace: GPU share sampling stopped: {why}; tracing goes on");
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
    /// The batches waiting now.
    pub fn take(&self) -> Vec<ShareSample> {
        self.samples.try_iter().flatten().collect()
    }
}
