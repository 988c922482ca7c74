//! The binaries the guest runs: a static gpu-trace and the static test client.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::{arch::Arch, run_quiet};
use anyhow::{Context as _, Result, ensure};

const HOST_TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// `cargo build --release --target x86_64-unknown-linux-gnu` with `+crt-static`: glibc linked
/// statically (the musl target is not installable here). The flag goes in the per-target
/// variable so that build scripts and the eBPF build are not affected.
fn build_static_gpu_trace(root: &Path) -> Result<PathBuf> {
    eprintln!("lab: building a static gpu-trace (release)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args([
            "build",
            "--release",
            "--target",
            HOST_TRIPLE,
            "-p",
            "gpu-trace",
            "--bin",
            "gpu-trace",
        ])
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        )
        .status()?;
    ensure!(
        status.success(),
        "building the static gpu-trace failed (see the cargo output above)"
    );
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    Ok(target.join(HOST_TRIPLE).join("release/gpu-trace"))
}

/// The static gpu-trace for the guest: on x86-64 the glibc build above; on another
/// architecture `cargo xtask dist`'s static musl build for it (cross-linked with rust-lld, the
/// kernel programs built for its register layout).
pub(super) fn guest_gpu_trace(root: &Path, arch: Arch) -> Result<PathBuf> {
    if arch == Arch::X86_64 {
        return build_static_gpu_trace(root);
    }
    eprintln!(
        "lab: building a static gpu-trace for {} (dist's musl build)",
        arch.machine()
    );
    crate::dist::static_binary_for(root, arch.machine())
}

pub(super) fn build_client(root: &Path, out_dir: &Path, arch: Arch) -> Result<PathBuf> {
    let out = out_dir.join(format!("lab-client-{}", arch.machine()));
    let cc = arch.cc();
    run_quiet(
        Command::new(&cc)
            .args(["-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&out)
            .arg(root.join("lab/client.c")),
    )
    .with_context(|| {
        format!(
            "building the static test client with {cc} (needs gcc and libc6-dev's libc.a; for \
             arm64, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross)"
        )
    })?;
    Ok(out)
}

/// `uname -m`'s name of an ELF file's machine (`e_machine`), where the lab knows it.
pub(super) fn elf_machine(bytes: &[u8]) -> Option<&'static str> {
    match u16::from_le_bytes([*bytes.get(18)?, *bytes.get(19)?]) {
        62 => Some("x86_64"),
        183 => Some("aarch64"),
        _ => None,
    }
}

/// True when the ELF file has no program interpreter (PT_INTERP), i.e. is statically linked.
pub(crate) fn is_static_elf(bytes: &[u8]) -> Result<bool> {
    ensure!(
        bytes.len() >= 64 && &bytes[..4] == b"\x7fELF",
        "not an ELF file"
    );
    ensure!(
        bytes[4] == 2 && bytes[5] == 1,
        "not a little-endian 64-bit ELF file"
    );
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let phoff = u64_at(32) as usize;
    let phentsize = u16_at(54) as usize;
    let phnum = u16_at(56) as usize;
    ensure!(
        phoff + phnum * phentsize <= bytes.len() && phentsize >= 4,
        "truncated ELF program headers"
    );
    const PT_INTERP: u32 = 3;
    Ok(!(0..phnum).any(|i| u32_at(phoff + i * phentsize) == PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header with `phnum` program headers of the given types.
    fn elf(types: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56 * types.len()];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            b[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        b
    }

    #[test]
    fn static_elf_has_no_interpreter() {
        assert!(is_static_elf(&elf(&[1, 1, 4])).unwrap());
        assert!(!is_static_elf(&elf(&[6, 3, 1])).unwrap());
        assert!(is_static_elf(b"#!/bin/sh\n").is_err());
    }
}
