//! The NVIDIA driver's own entry points: where a loaded module defines `nvidia_unlocked_ioctl`
//! (the `nvidia` module; in the lab, its stand-in), hook its ioctl handler at exit and its
//! release handler `nvidia_close` at entry, a trampoline through the module's BTF first, else
//! kprobes. Each one attached takes its part away from the syscall layer
//! (`gpu_trace_common::nv_entry_bits`); with both, the syscall layer is not attached at all and
//! no other system call on the machine runs a gpu-trace program.
//!
//! Not used where the syscall layer must see what the driver never does: `--deny-*` refuses
//! calls before they reach the driver (and shows them refused), `--watch-device` traces a
//! device that is not the driver's.

use aya::Ebpf;
use gpu_trace_common::nv_entry_bits;

use super::super::{
    DeepAttach,
    module_hooks::{ModuleHooks, ModuleTargets},
    trampoline::Trampoline,
};
use crate::{
    probe::{btf::Btf, kallsyms::ModuleSymbols},
    targets::{NV_IOCTL_ENTRY, NV_RELEASE_ENTRY, NVIDIA_ENTRY},
};

/// The start-up report's names of the two events.
pub const IOCTL_EVENT: &str = "NVIDIA ioctls";
pub const RELEASE_EVENT: &str = "NVIDIA file release";

/// Finds the module that defines the NVIDIA ioctl entry point and reads its BTF (split on
/// `vmlinux`).
pub fn prepare(vmlinux: &Btf) -> Result<ModuleTargets, String> {
    let module = ModuleSymbols::module_defining(NVIDIA_ENTRY)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "no loaded module defines {NVIDIA_ENTRY} (the NVIDIA driver is not loaded); the \
                 syscall layer serves RM ioctls"
            )
        })?;
    ModuleTargets::read(&module, vmlinux)
}

/// Attaches the entry-point programs `targets` allows; returns the `nv_entry_bits` of what
/// they serve.
pub fn attach(
    ebpf: &mut Ebpf,
    targets: &ModuleTargets,
    out: &mut ModuleHooks,
    via: DeepAttach,
) -> u32 {
    let a = targets.attacher(ebpf, via);
    let mut bits = 0;
    if !a
        .attach_each(ebpf, out, IOCTL_EVENT, Trampoline::Exit, &[NV_IOCTL_ENTRY])
        .is_empty()
    {
        bits |= nv_entry_bits::IOCTL;
    }
    if !a
        .attach_each(
            ebpf,
            out,
            RELEASE_EVENT,
            Trampoline::Entry,
            &[NV_RELEASE_ENTRY],
        )
        .is_empty()
    {
        bits |= nv_entry_bits::RELEASE;
    }
    bits
}
