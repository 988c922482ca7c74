//! Deep hooks on a gpu_ext-patched NVIDIA driver: where a loaded module defines
//! `nv_gpu_sched_task_init` (and its three siblings, `gpu_trace_common::nvidia::gpu_ext`),
//! attach to each hook, a trampoline through the module's BTF first, else a kprobe. The stock
//! NVIDIA driver has none of these functions: then nothing is attached and the start-up report
//! says so. What the hooks carry is added to the events of the RM calls that caused them
//! (`source/nvidia/model.rs`), never reported twice.

use aya::Ebpf;
use gpu_trace_common::nvidia::gpu_ext::{FUNCTIONS, OLD_NAMES};

use super::super::{
    DeepAttach,
    module_hooks::{ModuleHooks, ModuleTargets},
    trampoline::Trampoline,
};
use crate::{
    probe::{btf::Btf, kallsyms::ModuleSymbols},
    targets::{DeepTarget, GPU_EXT},
};

/// Finds the module with the gpu_ext hooks, if one is loaded, and reads its BTF (split on
/// `vmlinux`).
pub fn prepare(vmlinux: &Btf) -> Result<ModuleTargets, String> {
    let module = ModuleSymbols::module_defining(FUNCTIONS[0])
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "no loaded module defines {} (the stock NVIDIA driver has no gpu_ext hooks; the \
                 syscall layer sees what it sees)",
                FUNCTIONS[0]
            )
        })?;
    ModuleTargets::read(&module, vmlinux)
}

/// Attaches a program to every hook function `targets` defines.
pub fn attach(ebpf: &mut Ebpf, targets: &ModuleTargets, out: &mut ModuleHooks, via: DeepAttach) {
    let a = targets.attacher(ebpf, via);
    let list: Vec<DeepTarget> = GPU_EXT
        .into_iter()
        .map(|t| DeepTarget {
            // A fork version that names the function differently.
            func: match OLD_NAMES.iter().find(|(new, _)| *new == t.func) {
                Some((_, old)) if !targets.defines(t.func) && targets.defines(old) => old,
                _ => t.func,
            },
            ..t
        })
        .collect();
    a.attach_each(ebpf, out, "NVIDIA gpu_ext hooks", Trampoline::Entry, &list);
}
