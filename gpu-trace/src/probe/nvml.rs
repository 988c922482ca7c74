//! GPU name and per-process GPU memory from the NVIDIA management library (NVML), for the
//! inventory. `libnvidia-ml.so.1` is loaded at run time (the `nvml-wrapper` crate opens it with
//! `libloading`, by name: the dynamic loader's search, `LD_LIBRARY_PATH` included): the binary
//! does not link it, and where it is absent the inventory says so once and goes on without
//! memory figures.
//!
//! NVML is started once per run, on a thread of its own with a time limit ([`START_LIMIT`]):
//! `nvmlInit_v2`, the device count and each GPU's names and processes. A library that does not
//! answer in time is abandoned on that thread (never joined: the process exits anyway), and a
//! device count above [`MAX_GPUS`] is a broken library, not a loop of 2^31 calls; either costs
//! one line on stderr, never the start, the signals or the exit.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
        mpsc,
    },
    thread,
    time::Duration,
};

use nvml_wrapper::{Nvml, enums::device::UsedGpuMemory, error::NvmlError};

use gpu_trace_core::inventory::Inventory;

/// The library opened, by name.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

/// How long NVML's start (init, device count, each GPU's names and processes) may take.
pub const START_LIMIT: Duration = Duration::from_secs(2);

/// More GPUs than this in one host: a broken library (the largest hosts have 16).
pub const MAX_GPUS: u32 = 64;

/// What NVML reported for one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvmlGpu {
    /// PCI bus id as NVML writes it (`00000000:00:06.0`).
    pub bus_id: String,
    pub name: Option<String>,
    pub uuid: Option<String>,
    /// `(pid, used bytes)` of the compute and graphics processes; `None`: not available.
    pub processes: Vec<(u32, Option<u64>)>,
}

/// Why NVML gave nothing this run.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Library absent, driver not loaded, no permission...
    #[error("NVML unavailable ({0})")]
    Unavailable(NvmlError),
    #[error("NVML device count failed ({0})")]
    Count(NvmlError),
    #[error("NVML ({LIBRARY}) reports {0} GPUs, more than {MAX_GPUS}: a broken library")]
    TooMany(u32),
    /// `call` had not returned when the time limit passed.
    #[error("NVML ({LIBRARY}) did not answer {call} within {} s", limit.as_secs_f64())]
    Wedged { call: &'static str, limit: Duration },
    /// The thread ended without an answer (a panic in the library's wrapper) during this call.
    #[error("NVML ({LIBRARY}) failed inside {0}")]
    Failed(&'static str),
    #[error("no thread for NVML ({0})")]
    Thread(std::io::Error),
}

impl StartError {
    /// A library that answers nonsense or not at all (said on stderr even with `--no-share`),
    /// as opposed to one that is absent or refuses.
    pub fn is_broken(&self) -> bool {
        matches!(
            self,
            Self::TooMany(_) | Self::Wedged { .. } | Self::Failed(_)
        )
    }
}

/// NVML, started: the inventory's figures, and the library kept open for the share sampler
/// when asked for.
pub struct Started {
    pub gpus: Vec<NvmlGpu>,
    /// `(index, uuid)` of every GPU NVML counted.
    pub devices: Vec<(u32, Option<String>)>,
    /// `Some` when [`start`] was asked to keep it.
    pub nvml: Option<Nvml>,
}

/// The NVML calls in the order [`start`] makes them; [`Stage`] holds the index of the one
/// under way, for the message when it does not return.
const CALLS: [&str; 3] = [
    "nvmlInit_v2",
    "nvmlDeviceGetCount_v2",
    "the GPUs' names and processes",
];

/// Which of [`CALLS`] the NVML thread is in.
#[derive(Default)]
pub struct Stage(AtomicU8);

impl Stage {
    fn enter(&self, call: usize) {
        self.0.store(call as u8, Ordering::Relaxed);
    }

    fn call(&self) -> &'static str {
        CALLS[usize::from(self.0.load(Ordering::Relaxed)).min(CALLS.len() - 1)]
    }
}

/// Starts NVML within [`START_LIMIT`]: every GPU's figures, and the open library when `keep`.
pub fn start(keep: bool) -> Result<Started, StartError> {
    bounded(START_LIMIT, move |stage| open(stage, keep))
}

/// Runs `work` on a thread of its own and waits `limit` for it; past that the thread is left
/// to itself (never joined) and the answer is [`StartError::Wedged`] with its [`Stage`].
pub fn bounded<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce(&Stage) -> Result<T, StartError> + Send + 'static,
) -> Result<T, StartError> {
    let stage = Arc::new(Stage::default());
    let (tx, rx) = mpsc::sync_channel(1);
    let seen = Arc::clone(&stage);
    thread::Builder::new()
        .name("gpu-trace-nvml".into())
        .spawn(move || {
            let _ = tx.send(work(&seen));
        })
        .map_err(StartError::Thread)?;
    match rx.recv_timeout(limit) {
        Ok(answer) => answer,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(StartError::Wedged {
            call: stage.call(),
            limit,
        }),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(StartError::Failed(stage.call())),
    }
}

/// The NVML thread's work (see [`start`]).
fn open(stage: &Stage, keep: bool) -> Result<Started, StartError> {
    stage.enter(0);
    let nvml = Nvml::init().map_err(StartError::Unavailable)?;
    stage.enter(1);
    let count = nvml.device_count().map_err(StartError::Count)?;
    if count > MAX_GPUS {
        return Err(StartError::TooMany(count));
    }
    stage.enter(2);
    let mut gpus = Vec::new();
    let mut devices = Vec::new();
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            devices.push((i, None));
            continue;
        };
        let uuid = dev.uuid().ok();
        devices.push((i, uuid.clone()));
        let Ok(pci) = dev.pci_info() else { continue };
        gpus.push(NvmlGpu {
            bus_id: pci.bus_id,
            name: dev.name().ok(),
            uuid,
            processes: processes(&dev),
        });
    }
    Ok(Started {
        gpus,
        devices,
        nvml: keep.then_some(nvml),
    })
}

/// The compute and graphics processes on `dev`, each once.
fn processes(dev: &nvml_wrapper::Device<'_>) -> Vec<(u32, Option<u64>)> {
    let mut processes = Vec::new();
    for list in [
        dev.running_compute_processes(),
        dev.running_graphics_processes(),
    ]
    .into_iter()
    .flatten()
    {
        for p in list {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            if !processes.iter().any(|&(pid, _)| pid == p.pid) {
                processes.push((p.pid, used));
            }
        }
    }
    processes
}

/// A PCI bus id in one form: domain as a number, the rest lower case (`/proc` writes a 4-digit
/// domain, NVML an 8-digit one).
fn bus_key(bus_id: &str) -> Option<(u32, String)> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        rest.to_ascii_lowercase(),
    ))
}

/// Adds NVML's GPU names and per-process memory to the inventory (matched by PCI bus id).
pub fn apply(inv: &mut Inventory, gpus: &[NvmlGpu]) {
    let find = |bus: &Option<String>| {
        let key = bus.as_deref().and_then(bus_key)?;
        gpus.iter()
            .find(|g| bus_key(&g.bus_id).as_ref() == Some(&key))
    };
    for g in &mut inv.gpus {
        if let Some(n) = find(&g.bus_id)
            && n.name.is_some()
        {
            g.name.clone_from(&n.name);
        }
    }
    for p in &mut inv.processes {
        for g in &mut p.gpus {
            let Some(n) = find(&g.bus_id) else { continue };
            if n.name.is_some() {
                g.name.clone_from(&n.name);
            }
            if g.uuid.is_none() {
                g.uuid.clone_from(&n.uuid);
            }
            g.memory_bytes = n
                .processes
                .iter()
                .find(|&&(pid, _)| pid == p.pid)
                .and_then(|&(_, b)| b);
        }
    }
}

/// Applies what [`start`] returned; records why not in [`Inventory::nvml_note`] (only when
/// there was a GPU to say something about).
pub fn enrich(inv: &mut Inventory, nvml: Result<Vec<NvmlGpu>, String>) {
    match nvml {
        Ok(gpus) => apply(inv, &gpus),
        Err(_) if inv.gpus.is_empty() && inv.processes.iter().all(|p| p.gpus.is_empty()) => {}
        Err(why) => inv.nvml_note = Some(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::inventory::test_process;
    use gpu_trace_core::inventory::{GpuInfo, GpuNode};

    #[test]
    fn memory_is_matched_by_bus_id_across_domain_widths() {
        // facts.txt: nvidia-smi writes 00000000:00:06.0, /proc writes 0000:00:06.0;
        // late_facts.txt: PID 441 used 666 MiB.
        let mut inv = Inventory {
            gpus: vec![GpuInfo {
                minor: 0,
                bus_id: Some("0000:00:06.0".into()),
                uuid: Some("GPU-a62f238f-2a5a-7342-8f19-17c8eaf33997".into()),
                name: Some("NVIDIA H100 80GB HBM3".into()),
            }],
            processes: vec![test_process(441, "python3", vec![(11, GpuNode::NvGpu(0))])],
            ..Inventory::default()
        };
        let nvml = [NvmlGpu {
            bus_id: "00000000:00:06.0".into(),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            uuid: Some("GPU-a62f238f-2a5a-7342-8f19-17c8eaf33997".into()),
            processes: vec![(440, Some(1)), (441, Some(666 << 20))],
        }];
        apply(&mut inv, &nvml);
        let g = &inv.processes[0].gpus[0];
        assert_eq!(g.memory_bytes, Some(666 * 1024 * 1024));
        assert_eq!(g.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(
            g.uuid.as_deref(),
            Some("GPU-a62f238f-2a5a-7342-8f19-17c8eaf33997")
        );
        // Another bus: nothing applied.
        let mut other = inv.clone();
        other.processes[0].gpus[0].memory_bytes = None;
        other.processes[0].gpus[0].bus_id = Some("0000:00:07.0".into());
        apply(&mut other, &nvml);
        assert_eq!(other.processes[0].gpus[0].memory_bytes, None);
    }

    #[test]
    fn a_call_that_never_returns_is_abandoned_at_the_limit_and_named() {
        let (_keep, never) = mpsc::channel::<()>();
        // The call never returns: that `bounded` returns at all is that it did not wait for it.
        let err = bounded(Duration::from_millis(50), move |stage| {
            stage.enter(1);
            let _ = never.recv();
            Ok(())
        })
        .unwrap_err();
        assert!(err.is_broken());
        assert_eq!(
            err.to_string(),
            "NVML (libnvidia-ml.so.1) did not answer nvmlDeviceGetCount_v2 within 0.05 s"
        );
        // An answer in time is the answer.
        assert_eq!(bounded(Duration::from_secs(5), |_| Ok(7)).unwrap(), 7);
    }

    #[test]
    fn an_absurd_device_count_is_a_broken_library() {
        let err = StartError::TooMany(1 << 31);
        assert!(err.is_broken());
        assert_eq!(
            err.to_string(),
            "NVML (libnvidia-ml.so.1) reports 2147483648 GPUs, more than 64: a broken library"
        );
    }

    #[test]
    fn absent_library_is_an_error_not_a_crash() {
        // This machine has no NVIDIA driver: the library cannot be loaded.
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            gpu_trace_core::skip::skipped(
                "absent_library_is_an_error_not_a_crash",
                "an NVIDIA driver is present; the absent-library path is not reachable",
            );
            return;
        }
        let err = start(false).err().expect("no library here");
        assert!(matches!(err, StartError::Unavailable(_)), "{err}");
        assert!(!err.is_broken());
    }
}
