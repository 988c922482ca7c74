//! Builds the kernel programs (`gpu-trace-ebpf`) with the nightly toolchain and bpf-linker, and
//! leaves the object in OUT_DIR, named after its binary target (`OUT_DIR/gpu-trace-ebpf`), for
//! `include_bytes!`. Needs the set-up in the README.
use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "gpu-trace-ebpf")
        .ok_or_else(|| anyhow!("gpu-trace-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context(
        "building the kernel programs failed: they need the nightly toolchain with rust-src and \
         bpf-linker (see the README's set-up)",
    )
}
