//! GPU name and per-process GPU memory from the NVIDIA management library (NVML), for the
//! inventory. `libnvidia-ml.so.1` is loaded at run time (the `nvml-wrapper` crate opens it with
//! `libloading`): the binary does not link it, and where it is absent the inventory says so
//! once and goes on without memory figures.

use nvml_wrapper::{Nvml, enums::device::UsedGpuMemory};

use gpu_trace_core::inventory::Inventory;

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

/// Reads every GPU NVML knows. `Err`: why not (library absent, driver not loaded, ...).
pub fn query() -> Result<Vec<NvmlGpu>, String> {
    let nvml = Nvml::init().map_err(|e| format!("NVML unavailable ({e})"))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count failed ({e})"))?;
    let mut out = Vec::new();
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let Ok(pci) = dev.pci_info() else { continue };
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
        out.push(NvmlGpu {
            bus_id: pci.bus_id,
            name: dev.name().ok(),
            uuid: dev.uuid().ok(),
            processes,
        });
    }
    Ok(out)
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

/// Applies what [`query`] returned; records why not in [`Inventory::nvml_note`] (only when
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
    fn absent_library_is_an_error_not_a_crash() {
        // This machine has no NVIDIA driver: the library cannot be loaded.
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            eprintln!(
                "SKIPPED: an NVIDIA driver is present; the absent-library path is not reachable"
            );
            return;
        }
        let err = query().unwrap_err();
        assert!(err.contains("NVML unavailable"), "{err}");
    }
}
