//! Developer tasks: `cargo xtask <task>`. Each task lives in its own module.
use clap::{Parser, Subcommand};

mod lab;

#[derive(Parser)]
#[command(name = "xtask", about = "gpu-trace developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Boot a stock Debian kernel in QEMU (amdgpu loaded, no GPU) and check gpu-trace on it:
    /// kprobes, module BTF, fentry, BPF LSM. See docs/lab.md.
    Lab(lab::LabArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Lab(args) => lab::run(args),
    }
}
