//! The binaries the guest runs: a static gpu-trace and the static test client (their ELF
//! headers are checked with `crate::elf`).

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
