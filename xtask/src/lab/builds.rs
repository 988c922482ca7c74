//! The binaries the guest runs: a static gpu-trace and the static test client (their ELF
//! headers are checked with `crate::elf`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::{arch::Arch, run_quiet};
use anyhow::{Context as _, Result};

/// The static gpu-trace for the guest (the guest has no libc): `cargo xtask dist`'s static musl
/// build for its architecture (cross-linked with rust-lld for another one, the kernel programs
/// built for its register layout). One build serves `dist --check` and every lab run, so CI
/// builds the release binary once per architecture, not once per stage.
pub(super) fn guest_gpu_trace(root: &Path, arch: Arch) -> Result<PathBuf> {
    eprintln!(
        "lab: the static gpu-trace for {} (dist's musl build)",
        arch.machine()
    );
    crate::dist::static_binary_for(root, arch.machine())
}

/// The guest's test clients: (name under `/bin`, the built file).
pub(super) type Clients = Vec<(&'static str, PathBuf)>;

/// `lab-client` (`lab/client.c`, static, for the guest's architecture) and, on x86-64, the
/// 32-bit `lab-client32` (`lab/client32.c`) whose calls take the compat ioctl path.
pub(super) fn build_clients(root: &Path, out_dir: &Path, arch: Arch) -> Result<Clients> {
    let mut clients = vec![("lab-client", build_client(root, out_dir, arch)?)];
    if arch == Arch::X86_64 {
        clients.push(("lab-client32", build_client32(root, out_dir)?));
    }
    Ok(clients)
}

/// `lab/client32.c` for i386 without a 32-bit libc (freestanding, its own system calls), by the
/// host's gcc, which builds 32-bit code without gcc-multilib as long as nothing links a libc.
fn build_client32(root: &Path, out_dir: &Path) -> Result<PathBuf> {
    let out = out_dir.join("lab-client32");
    let cc = Arch::X86_64.cc();
    run_quiet(
        Command::new(&cc)
            .args([
                "-m32",
                "-ffreestanding",
                "-nostdlib",
                "-static",
                "-fno-pie",
                "-no-pie",
                "-fno-stack-protector",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-o",
            ])
            .arg(&out)
            .arg(root.join("lab/client32.c")),
    )
    .with_context(|| format!("building the 32-bit test client with {cc} -m32 (needs gcc)"))?;
    Ok(out)
}

fn build_client(root: &Path, out_dir: &Path, arch: Arch) -> Result<PathBuf> {
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
