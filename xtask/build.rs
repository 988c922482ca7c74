//! Builds the benchmark's floor programs (`test/bench-ebpf`, crate `gpu-trace-bench-ebpf`) with
//! the nightly toolchain and bpf-linker, and leaves the object in OUT_DIR for
//! `include_bytes!` (`src/bench/floor.rs`). Needs the set-up in the README, as gpu-trace's own
//! build.rs does, and shares its way of building (`build-support/ebpf.rs`).
use anyhow::Context as _;

#[path = "../build-support/ebpf.rs"]
mod ebpf;

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root_dir = format!("{manifest_dir}/../test/bench-ebpf");
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    ebpf::build(
        aya_build::Package {
            name: "gpu-trace-bench-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        },
        &["bench-floor"],
        metadata.target_directory.as_std_path(),
        "building the benchmark's floor programs (test/bench-ebpf) failed: they need the nightly \
         toolchain with rust-src and bpf-linker (see the README's set-up)",
    )
}
