//! Developer tasks: `cargo xtask <task>`. Each task lives in its own module.
use clap::{Parser, Subcommand};

mod bench;
mod bench_metrics;
mod dist;
mod elf;
mod fleet;
mod r#gen;
mod host;
mod lab;

#[derive(Parser)]
#[command(name = "xtask", about = "gpu-trace developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Measure what tracing costs (root): syscalls, RM ioctls vs bpftrace and strace, the BPF
    /// programs, userspace throughput, the drop-free event rate. See docs/performance.md.
    Bench(bench::BenchArgs),
    /// Boot a stock Debian kernel in QEMU (amdgpu loaded, no GPU) and check gpu-trace on it:
    /// kprobes, module BTF, fentry, BPF LSM. See docs/lab.md.
    Lab(lab::LabArgs),
    /// Generate man pages and shell completions from the CLI definition (into target/gen by
    /// default); with --docs also docs/json-schema.md from the code.
    Gen(r#gen::GenArgs),
    /// Build what installs without a toolchain: a static (musl) gpu-trace with man pages and
    /// completions, as a tarball and a .deb under target/dist with SHA256SUMS (--arch host: this
    /// machine's architecture only); --check installs both into a fresh Debian root (root,
    /// debootstrap) and runs them there.
    Dist(dist::DistArgs),
    /// Check the fleet deployment (docs/fleet.md): deploy/daemonset.yaml against the Kubernetes
    /// schema and Pod Security's baseline controls, the PodMonitor and ServiceMonitor against
    /// it, deploy/*.yml with promtool, and the FROM scratch image built with podman and run with
    /// runc (version, a replay, a live start with the DaemonSet's privileges).
    Fleet(fleet::FleetArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Bench(args) => bench::run(args),
        Task::Lab(args) => lab::run(args),
        Task::Gen(args) => r#gen::run(args),
        Task::Dist(args) => dist::run(args),
        Task::Fleet(args) => fleet::run(args),
    }
}
