//! Which GPU an NVIDIA event is on, in the names a user matches with `nvidia-smi`: its index,
//! UUID and PCI bus id (issue 18).
//!
//! RM names a GPU in a process's calls by its *device instance* (`deviceId` of the
//! `NV01_DEVICE_0` object the task hangs under). That is not the device minor, nor CUDA's
//! index, nor guaranteed to follow PCI order. The driver says which GPU an instance is when a
//! process asks `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` (CUDA does, for every GPU it uses): the
//! answer pairs the instance with a `gpuId`, which RM builds from the GPU's PCI address
//! (`((domain & 0xffff) << 16) | (bus << 8) | device`). The bus id then names the GPU in the
//! driver's `/proc/driver/nvidia/gpus/*/information` (UUID, minor) and in NVML; nvidia-smi's
//! index is the GPU's rank in PCI bus order.
//!
//! Without such an answer (a process that started before tracing and asked before), an
//! instance is resolved only on a host with exactly one GPU, where it cannot be another.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// One GPU as `/proc/driver/nvidia/gpus/*/information` describes it (the start-up inventory's
/// `gpus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Device minor (`/dev/nvidiaN`).
    pub minor: u32,
    /// PCI bus id (`Bus Location`).
    pub bus_id: Option<String>,
    pub uuid: Option<String>,
    /// `Model` (or the name NVML reports).
    pub name: Option<String>,
}

/// A GPU as `nvidia-smi` names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuIdentity {
    /// nvidia-smi's index: the rank in PCI bus order.
    pub index: u32,
    /// `GPU-…`, when the driver or NVML said.
    pub uuid: Option<String>,
    /// `0000:00:06.0`.
    pub bus_id: String,
    /// RM's device instance (`deviceId`) the events name it by.
    pub rm_device: u32,
}

/// One GPU of the host, with its PCI address.
#[derive(Clone, Debug)]
struct Known {
    pci: (u32, u8, u8),
    bus_id: String,
    uuid: Option<String>,
    index: u32,
}

/// The host's GPUs and what the traced processes' calls said about RM's device instances.
#[derive(Clone, Debug, Default)]
pub struct GpuDirectory {
    gpus: Vec<Known>,
    /// Device instance → gpuId, from `GET_ID_INFO_V2` answers.
    instances: HashMap<u32, u32>,
}

/// `(domain, bus, device)` of a PCI bus id such as `0000:00:06.0` (also NVML's 8-digit
/// domain form, `00000000:00:06.0`).
pub fn parse_bus_id(bus_id: &str) -> Option<(u32, u8, u8)> {
    let mut parts = bus_id.trim().split(':');
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u8::from_str_radix(parts.next()?, 16).ok()?;
    let dev_fn = parts.next()?;
    let device = u8::from_str_radix(dev_fn.split('.').next()?, 16).ok()?;
    parts.next().is_none().then_some((domain, bus, device))
}

/// The PCI address RM encodes in a `gpuId` (`gpuGenerate32BitId`: the domain's low 16 bits).
pub fn pci_of_gpu_id(gpu_id: u32) -> (u32, u8, u8) {
    (gpu_id >> 16, (gpu_id >> 8) as u8, gpu_id as u8)
}

impl GpuDirectory {
    /// The GPUs the start-up inventory found (driver's /proc, NVML).
    pub fn new(gpus: &[GpuInfo]) -> Self {
        let mut known: Vec<Known> = gpus
            .iter()
            .filter_map(|g| {
                let bus_id = g.bus_id.clone()?;
                Some(Known {
                    pci: parse_bus_id(&bus_id)?,
                    bus_id,
                    uuid: g.uuid.clone(),
                    index: 0,
                })
            })
            .collect();
        known.sort_by_key(|k| k.pci);
        known.dedup_by_key(|k| k.pci);
        for (i, k) in known.iter_mut().enumerate() {
            k.index = i as u32;
        }
        Self {
            gpus: known,
            instances: HashMap::new(),
        }
    }

    /// A process's `GET_ID_INFO_V2` answered: `device_instance` is the GPU `gpu_id` encodes.
    pub fn learn(&mut self, device_instance: u32, gpu_id: u32) {
        self.instances.insert(device_instance, gpu_id);
    }

    /// The GPU behind RM device instance `rm_device`, when known.
    pub fn resolve(&self, rm_device: u32) -> Option<GpuIdentity> {
        let k = match self.instances.get(&rm_device) {
            Some(&gpu_id) => {
                // Domains above 0xffff are cut by RM's encoding: match the low 16 bits.
                let (d, b, dev) = pci_of_gpu_id(gpu_id);
                self.gpus
                    .iter()
                    .find(|k| (k.pci.0 & 0xffff, k.pci.1, k.pci.2) == (d, b, dev))?
            }
            None => match self.gpus.as_slice() {
                [only] => only,
                _ => return None,
            },
        };
        Some(k.identity(rm_device))
    }

    /// nvidia-smi's index of the GPU at PCI bus id `bus_id` (any of its spellings), when it is
    /// one of the GPUs known.
    pub fn index_of_bus(&self, bus_id: &str) -> Option<u32> {
        let pci = parse_bus_id(bus_id)?;
        self.gpus.iter().find(|k| k.pci == pci).map(|k| k.index)
    }

    /// Every GPU known (the RM device instance unknown: 0), in nvidia-smi's order.
    pub fn all(&self) -> Vec<GpuIdentity> {
        self.gpus.iter().map(|k| k.identity(0)).collect()
    }
}

impl Known {
    fn identity(&self, rm_device: u32) -> GpuIdentity {
        GpuIdentity {
            index: self.index,
            uuid: self.uuid.clone(),
            bus_id: self.bus_id.clone(),
            rm_device,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(minor: u32, bus: &str, uuid: &str) -> GpuInfo {
        GpuInfo {
            minor,
            bus_id: Some(bus.into()),
            uuid: Some(uuid.into()),
            name: None,
        }
    }

    #[test]
    fn bus_ids_and_gpu_ids_name_the_same_pci_address() {
        assert_eq!(parse_bus_id("0000:00:06.0"), Some((0, 0, 6)));
        assert_eq!(parse_bus_id("00000000:3b:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(parse_bus_id("0001:c1:1f.0"), Some((1, 0xc1, 0x1f)));
        assert_eq!(parse_bus_id("nonsense"), None);
        assert_eq!(parse_bus_id("0000:00:06.0:9"), None);
        // The H100 host: GET_ID_INFO_V2 answered gpuId 0x6 for its GPU at 0000:00:06.0
        // (examples/rm_ids_shim.c, examples/outputs/gpu-host-checks/gpus/).
        assert_eq!(pci_of_gpu_id(0x6), (0, 0, 6));
        // 0000:2d:00.0 → 0x2d00; domain 1, bus 0xc1, device 0x1f → 0x0001c11f.
        assert_eq!(pci_of_gpu_id(0x2d00), (0, 0x2d, 0));
        assert_eq!(pci_of_gpu_id(0x0001_c11f), (1, 0xc1, 0x1f));
    }

    #[test]
    fn instances_resolve_by_the_driver_s_answer_not_by_order() {
        // Minors listed out of bus order; RM's instance 0 is the GPU on bus 0x41 (initialized
        // first), instance 1 the one on bus 0x07.
        let mut d = GpuDirectory::new(&[
            gpu(1, "0000:41:00.0", "GPU-b"),
            gpu(0, "0000:07:00.0", "GPU-a"),
        ]);
        assert_eq!(d.resolve(0), None, "two GPUs, no answer yet: unknown");
        d.learn(0, 0x4100);
        d.learn(1, 0x0700);
        let g0 = d.resolve(0).unwrap();
        assert_eq!(
            (g0.index, g0.uuid.as_deref(), g0.bus_id.as_str()),
            (1, Some("GPU-b"), "0000:41:00.0")
        );
        let g1 = d.resolve(1).unwrap();
        assert_eq!((g1.index, g1.uuid.as_deref()), (0, Some("GPU-a")));
        // nvidia-smi's index by bus id (the inventory's /proc answers), in either spelling;
        // a bus no GPU is on: none.
        assert_eq!(d.index_of_bus("00000000:41:00.0"), Some(1));
        assert_eq!(d.index_of_bus("0000:07:00.0"), Some(0));
        assert_eq!(d.index_of_bus("0000:99:00.0"), None);
        // An answer naming a GPU the inventory did not list: unknown, not a guess.
        d.learn(2, 0x9900);
        assert_eq!(d.resolve(2), None);
    }

    #[test]
    fn one_gpu_is_the_only_answer() {
        let d = GpuDirectory::new(&[gpu(0, "0000:00:06.0", "GPU-038161f7")]);
        let g = d.resolve(0).unwrap();
        assert_eq!((g.index, g.rm_device), (0, 0));
        assert_eq!(GpuDirectory::new(&[]).resolve(0), None);
    }
}
