//! Developer tasks: `cargo xtask <task>`. Each task lives in its own module.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "gpu-trace developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {}
}
