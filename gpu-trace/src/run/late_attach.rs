//! Late attach: the processes that had a GPU open before tracing, walked once after attaching and
//! tracked in the kernel from then on.

use std::{path::Path, sync::atomic::Ordering};

use gpu_trace_core::{
    inventory::{GpuNode, Inventory, render_text_named},
    model::workload::Attribution,
};

use super::{
    plan::CgroupSelection,
    signals::{QUIET, note},
};
use crate::{
    cli::{OutputArgs, TraceArgs},
    probe::inventory::{self, WalkOptions},
};

/// The processes that have a GPU open already ([`take_inventory`]); under
/// `--cgroup`/`--container`, only those inside (the others are not traced, before or after);
/// with `-- CMD` (`launched`), only the command.
pub(super) fn traced_inventory(
    args: &TraceArgs,
    amd: bool,
    nvml: Option<Result<Vec<crate::probe::nvml::NvmlGpu>, String>>,
    subtrees: &CgroupSelection,
    launched: Option<&(crate::launch::Launched, crate::launch::Descendants)>,
) -> Inventory {
    let mut inventory = take_inventory(&args.watch_device, amd, nvml);
    if let Some((command, _)) = launched {
        // `-- CMD`: the command's processes only; none had a GPU open before it started.
        inventory.processes.retain(|p| p.pid == command.pid);
    }
    if !subtrees.filter.is_empty() {
        inventory.processes.retain(|p| {
            p.cgroup
                .as_deref()
                .is_some_and(|c| subtrees.filter.iter().any(|s| s.contains(c)))
        });
    }
    inventory
}

/// The inventory processes to put in the kernel's `TRACKED` map, with their bits: those the
/// `--pid`/`--comm` filters select (the others' `close()` and exit records would only be
/// filtered out again, and would compete for the ring buffer).
pub fn kernel_tracking(inv: &Inventory, filters: &crate::cli::OutputArgs) -> Vec<(u32, u32)> {
    inv.processes
        .iter()
        .filter(|p| filters.pids.is_empty() || filters.pids.contains(&p.pid))
        .filter(|p| filters.comms.is_empty() || filters.comms.contains(&p.comm))
        .map(|p| {
            let nv = if p.uses_nvidia() {
                crate::loader::TRACK_NV
            } else {
                0
            };
            let kfd = if p.uses_kfd() {
                crate::loader::TRACK_KFD
            } else {
                0
            };
            (p.pid, nv | kfd)
        })
        .filter(|&(_, bits)| bits != 0)
        .collect()
}

/// Walks `/proc` for processes with a device of the traced vendor open (and the watched node),
/// adding NVML's figures (`nvml`: queried before attaching) where the library is present.
pub(super) fn take_inventory(
    watch_device: &Option<std::path::PathBuf>,
    amd: bool,
    nvml: Option<Result<Vec<crate::probe::nvml::NvmlGpu>, String>>,
) -> Inventory {
    use std::os::unix::fs::MetadataExt;
    let opts = WalkOptions {
        nvidia: !amd,
        kfd: amd,
        watched_rdev: watch_device
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.rdev()),
        self_pid: Some(std::process::id()),
    };
    let taken_ns = gpu_trace_core::event::monotonic_ns();
    let mut inv = inventory::walk(Path::new("/proc"), &opts);
    inv.taken_ns = taken_ns;
    if amd {
        // --watch-device with --vendor amd stands for /dev/kfd.
        for p in &mut inv.processes {
            for f in &mut p.fds {
                if f.1 == GpuNode::Watched {
                    f.1 = GpuNode::Kfd;
                }
            }
        }
    }
    if let Some(nvml) = nvml {
        crate::probe::nvml::enrich(&mut inv, nvml);
    }
    inv
}

/// The inventory on standard error, before the first event (standard output, or `-o`, holds
/// only events and statistics in text mode).
/// The start-up inventory on stderr: the processes the `--pid`/`--comm`/`--pod`/`--namespace`
/// filters select (the `--cgroup` filter was applied to the walk), their pods named as the
/// event lines name them (`live`: from the node's directory; replay: only with `--pods-dir`),
/// without command lines under `--quiet`.
pub(super) fn announce_inventory(inv: &Inventory, filters: &OutputArgs, live: bool) {
    let mut shown = inv.selected(&filters.pids, &filters.comms);
    let mut dir =
        super::outputs::pods_dir(filters, live).map(crate::probe::pods::PodDirectory::new);
    let mut names = |uid: &str, id: Option<&str>| dir.as_mut().and_then(|d| d.lookup(uid, id));
    if !(filters.pods.is_empty() && filters.namespaces.is_empty()) {
        shown.processes.retain(|p| {
            let path = p.cgroup.clone().filter(|c| c.starts_with('/'));
            let mut a = Attribution::new(0, path, None);
            if let Some((uid, _)) = &a.workload.pod {
                let id = a.workload.container.as_ref().map(|(_, id)| id.as_str());
                a.names = names(uid, id);
            }
            a.in_pods(&filters.pods, &filters.namespaces)
        });
    }
    for line in render_text_named(&shown, !filters.quiet, &mut names) {
        // Under -q only what could not be read, a warning.
        match line.trim_start().strip_prefix("(not inventoried: ") {
            Some(why) if QUIET.load(Ordering::SeqCst) => crate::say!(
                "gpu-trace: warning: not inventoried: {}",
                why.strip_suffix(')').unwrap_or(why)
            ),
            _ => note(line),
        }
    }
}
