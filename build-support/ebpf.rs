//! The kernel programs' build, shared by the build scripts of `gpu-trace` and `xtask`
//! (`#[path]`-included by each): aya-build, with its cargo target directory shared by every
//! build of this workspace.
//!
//! aya-build keeps the eBPF crate's cargo target directory under the calling build script's
//! `OUT_DIR`, which differs for every profile, target triple and check/build: `cargo clippy`,
//! `cargo test` and the static release build of `cargo xtask dist` each compiled `core` and the
//! kernel programs again (about a minute each on a 2-core machine). What aya-build builds
//! depends only on the BPF target (endianness and `bpf_target_arch`, from the host target) and
//! the sources: it is built in release mode whatever the outer profile. So it is given one
//! directory per BPF target, `<target-dir>/ebpf/<arch>-<endian>` (the workspace's target
//! directory, as `cargo metadata` names it: not a triple's own, which cargo tags as a cache
//! directory too), under a lock (two cargo invocations may build at once), and the objects are
//! copied into the real `OUT_DIR`.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, anyhow};

/// Builds `package` (its binary targets `bins`) and leaves each object in `OUT_DIR/<bin>`, as
/// aya-build would; `target_dir`: the workspace's target directory.
pub fn build(
    package: aya_build::Package<'_>,
    bins: &[&str],
    target_dir: &Path,
    failed: &str,
) -> anyhow::Result<()> {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let shared = shared_dir(target_dir)?;
    fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    let lock = fs::File::create(shared.join(".lock"))
        .with_context(|| format!("creating {}", shared.join(".lock").display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", shared.join(".lock").display()))?;
    // aya-build reads OUT_DIR for its target directory and its copies; a build script runs
    // single-threaded, and OUT_DIR is set back before anything else reads it.
    // SAFETY: no other thread of this build script reads or writes the environment.
    unsafe { std::env::set_var("OUT_DIR", &shared) };
    let built = aya_build::build_ebpf([package], aya_build::Toolchain::default());
    // SAFETY: as above.
    unsafe { std::env::set_var("OUT_DIR", &out_dir) };
    built.context(failed.to_owned())?;
    for bin in bins {
        let from = shared.join(bin);
        fs::copy(&from, out_dir.join(bin))
            .with_context(|| format!("copying {} into {}", from.display(), out_dir.display()))?;
    }
    Ok(())
}

/// `<target-dir>/ebpf/<arch>-<endian>`.
fn shared_dir(target_dir: &Path) -> anyhow::Result<PathBuf> {
    let var = |name: &str| std::env::var(name).map_err(|_| anyhow!("{name} not set"));
    let bpf = format!(
        "{}-{}",
        var("CARGO_CFG_TARGET_ARCH")?,
        var("CARGO_CFG_TARGET_ENDIAN")?
    );
    Ok(target_dir.join("ebpf").join(bpf))
}
