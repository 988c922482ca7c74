//! `cargo xtask gen`: what is generated from gpu-trace's own definitions rather than written by
//! hand — man pages and shell completions from the CLI definition (`gpu_trace::cli::Cli`), and
//! with `--docs`, docs/json-schema.md from the schema documented in `output/json.rs` and the
//! metric reference of docs/fleet.md from `gpu_trace::metrics::REFERENCE`.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::host::workspace_root;

#[derive(clap::Args)]
pub struct GenArgs {
    /// Directory for the man pages (`man/`) and shell completions (`completions/`).
    #[arg(long, value_name = "DIR", default_value = "target/gen")]
    pub out: PathBuf,
    /// Also rewrite docs/json-schema.md from gpu-trace-core/src/output/json.rs, and the metric
    /// reference in docs/fleet.md from gpu-trace-core/src/metrics.
    #[arg(long)]
    pub docs: bool,
}

pub fn run(args: GenArgs) -> anyhow::Result<()> {
    for path in generate(&args.out)? {
        println!("wrote {}", path.display());
    }
    if args.docs {
        let path = workspace_root().join("docs/json-schema.md");
        fs::write(&path, gpu_trace::output::json::schema_document())
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        let path = workspace_root().join("docs/fleet.md");
        let doc =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let doc = gpu_trace::metrics::splice_reference(&doc)
            .with_context(|| format!("{} lacks the metric reference markers", path.display()))?;
        fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} (metric reference)", path.display());
    }
    Ok(())
}

/// The shells completions are generated for.
pub const SHELLS: [Shell; 4] = [Shell::Bash, Shell::Zsh, Shell::Fish, Shell::Elvish];

/// Writes `man/gpu-trace.1`, one `man/gpu-trace-<subcommand>.1` per subcommand, and a completion
/// script per shell under `completions/`. Returns the files written.
pub fn generate(out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let man_dir = out.join("man");
    let comp_dir = out.join("completions");
    for dir in [&man_dir, &comp_dir] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let cmd = gpu_trace::cli::Cli::command();
    let mut written = Vec::new();

    let mut pages = vec![("gpu-trace".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        let name = format!("gpu-trace-{}", sub.get_name());
        // clap names are `&'static str`; a handful of page names leak for the life of xtask.
        let leaked: &'static str = Box::leak(name.clone().into_boxed_str());
        pages.push((name, sub.clone().name(leaked)));
    }
    for (name, page) in pages {
        let path = man_dir.join(format!("{name}.1"));
        let mut bytes = Vec::new();
        clap_mangen::Man::new(page)
            .render(&mut bytes)
            .with_context(|| format!("rendering {name}.1"))?;
        fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }

    for shell in SHELLS {
        // The binary's own script (with its fix for bash after a subcommand), under the file
        // name each shell looks for.
        use clap_complete::Generator as _;
        let path = comp_dir.join(shell.file_name(gpu_trace::cli::BIN_NAME));
        fs::write(&path, gpu_trace::cli::completion_script(shell))
            .with_context(|| format!("writing the {shell} completions to {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap()
    }

    #[test]
    fn man_pages_and_completions_cover_the_whole_cli() {
        let out = std::env::temp_dir().join(format!("xtask-gen-{}", std::process::id()));
        let written = generate(&out).unwrap();
        let cmd = gpu_trace::cli::Cli::command();

        let main = read(&out.join("man/gpu-trace.1"));
        assert!(main.starts_with(".ie \\n(.g .ds Aq"), "roff output");
        assert!(main.contains(".TH gpu-trace 1"));
        // Every option of the main command, every subcommand, the examples and exit codes.
        for arg in cmd.get_arguments().filter_map(|a| a.get_long()) {
            assert!(
                main.contains(&format!("\\-\\-{}", arg.replace('-', "\\-"))),
                "--{arg} missing from gpu-trace.1"
            );
        }
        for sub in cmd.get_subcommands() {
            assert!(
                main.contains(sub.get_name()),
                "{} missing from gpu-trace.1",
                sub.get_name()
            );
            let page = read(&out.join(format!("man/gpu-trace-{}.1", sub.get_name())));
            for arg in sub.get_arguments().filter_map(|a| a.get_long()) {
                assert!(
                    page.contains(&format!("\\-\\-{}", arg.replace('-', "\\-"))),
                    "--{arg} missing from gpu-trace-{}.1",
                    sub.get_name()
                );
            }
        }
        assert!(main.contains("Exit status"));
        assert!(
            main.contains("gpu\\-trace doctor"),
            "the examples are in the man page"
        );

        // Completions: one per shell, each knows the subcommands and the new options.
        assert_eq!(
            written
                .iter()
                .filter(|p| p.starts_with(out.join("completions")))
                .count(),
            SHELLS.len()
        );
        let bash = read(&out.join("completions/gpu-trace.bash"));
        for word in [
            "doctor",
            "replay",
            "--perfetto",
            "--timestamps",
            "--deny-pid",
        ] {
            assert!(
                bash.contains(word),
                "{word} missing from the bash completions"
            );
        }
        assert!(
            read(&out.join("completions/_gpu-trace")).contains("--perfetto"),
            "zsh"
        );
        assert!(
            read(&out.join("completions/gpu-trace.fish")).contains("perfetto"),
            "fish"
        );
        fs::remove_dir_all(out).unwrap();
    }
}
