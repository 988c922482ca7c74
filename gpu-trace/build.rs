//! Builds the kernel programs (`gpu-trace-ebpf`) with the nightly toolchain and bpf-linker, and
//! leaves the object in OUT_DIR, named after its binary target (`OUT_DIR/gpu-trace-ebpf`), for
//! `include_bytes!`. Needs the set-up in the README. The build itself is shared by every
//! profile and target of one BPF target (`build-support/ebpf.rs`).
use anyhow::{Context as _, anyhow};

#[path = "../build-support/ebpf.rs"]
mod ebpf;

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata {
        packages,
        target_directory,
        ..
    } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let package = packages
        .into_iter()
        .find(|p| p.name.as_str() == "gpu-trace-ebpf")
        .ok_or_else(|| anyhow!("gpu-trace-ebpf package not found in the workspace"))?;
    let root_dir = package
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", package.manifest_path))?;
    ebpf::build(
        aya_build::Package {
            name: package.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        },
        &["gpu-trace-ebpf"],
        target_directory.as_std_path(),
        "building the kernel programs failed: they need the nightly toolchain with rust-src and \
         bpf-linker (see the README's set-up)",
    )
}
