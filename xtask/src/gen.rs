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

    // The pages: gpu-trace(1) and one per subcommand but `help` (its text is the pages').
    let cmd = cmd.disable_help_subcommand(true);
    let mut pages = vec![(gpu_trace::cli::BIN_NAME.to_string(), None, cmd.clone())];
    for sub in cmd.get_subcommands() {
        pages.push((
            format!("{}-{}", gpu_trace::cli::BIN_NAME, sub.get_name()),
            Some(sub.get_name().to_string()),
            sub.clone(),
        ));
    }
    let names: Vec<String> = pages.iter().map(|(name, ..)| name.clone()).collect();
    for (name, sub, page) in pages {
        let path = man_dir.join(format!("{name}.1"));
        let bytes = man_page(&name, sub.as_deref(), page, &names)
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

/// The man page `name`(1) of `cmd` (the subcommand `sub`, or gpu-trace itself): clap_mangen's
/// NAME, DESCRIPTION, option and SUBCOMMANDS sections, with a SYNOPSIS that names each option's
/// argument, and the command's [`Epilogue`](gpu_trace::cli::Epilogue) as OUTPUT FORMAT,
/// EXAMPLES, EXIT STATUS and SEE ALSO sections (not clap_mangen's EXTRA). `pages` are the pages
/// shipped: SEE ALSO names those only.
fn man_page(
    name: &str,
    sub: Option<&str>,
    cmd: clap::Command,
    pages: &[String],
) -> anyhow::Result<Vec<u8>> {
    use roff::{Roff, bold, italic, roman};

    let epilogue = gpu_trace::cli::epilogue(sub)
        .with_context(|| format!("cli::epilogue has no text for the subcommand {sub:?}"))?;
    // clap_mangen prints the after-help text under EXTRA; the epilogue has its own sections.
    // Clap names are `&'static str`: a handful of page names leak for the life of xtask.
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    let mut cmd = cmd
        .name(leaked)
        .after_help(None::<&str>)
        .after_long_help(None::<&str>);
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone());

    // Each of clap_mangen's render calls writes the preamble that makes `'` an apostrophe;
    // the page needs it once.
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    let preamble_len = out
        .windows(4)
        .position(|w| w == b".TH ")
        .context("clap_mangen's title has no .TH")?;
    // Appends a section rendered with the preamble, without it.
    let body = |render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| {
        let mut buf = Vec::new();
        render(&mut buf)?;
        anyhow::Ok(buf[preamble_len..].to_vec())
    };
    let roff_body = |roff: &Roff| roff.render().as_bytes()[preamble_len..].to_vec();

    out.extend(body(&|b| man.render_name_section(b))?);

    // SYNOPSIS: the options as --help groups them, each with its argument's name.
    let mut synopsis = Roff::new();
    synopsis.control("SH", ["SYNOPSIS"]);
    let display = match sub {
        None => gpu_trace::cli::BIN_NAME.to_string(),
        Some(sub) => format!("{} {sub}", gpu_trace::cli::BIN_NAME),
    };
    synopsis.text(synopsis_line(&display, &cmd));
    if sub.is_none() {
        for s in cmd.get_subcommands() {
            synopsis.control("br", []);
            let mut line = vec![bold(format!("{display} {}", s.get_name())), roman(" ")];
            if s.get_arguments()
                .any(|a| !a.is_positional() && a.get_id() != "help")
            {
                line.push(roman("["));
                line.push(italic("options"));
                line.push(roman("] "));
            }
            for p in s.get_positionals() {
                line.push(italic(value_name(p)));
                line.push(roman(" "));
            }
            line.push(roman(format!(
                "(see {}-{}(1))",
                gpu_trace::cli::BIN_NAME,
                s.get_name()
            )));
            synopsis.text(line);
        }
    }
    out.extend(roff_body(&synopsis));

    out.extend(body(&|b| man.render_description_section(b))?);
    if cmd.get_arguments().next().is_some() {
        out.extend(body(&|b| man.render_options_section(b))?);
    }
    if cmd.has_subcommands() {
        out.extend(body(&|b| man.render_subcommands_section(b))?);
    }

    let mut tail = Roff::new();
    if let Some((_, title, text)) = epilogue.notes {
        tail.control("SH", [title]);
        let mut chars = text.chars();
        let first = chars.next().map(|c| c.to_uppercase().to_string());
        tail.text([roman(first.unwrap_or_default() + chars.as_str())]);
    }
    tail.control("SH", ["EXAMPLES"]);
    let mut task = String::new();
    let mut in_commands = false;
    for line in epilogue.examples.lines() {
        if let Some(command) = line.strip_prefix("      ") {
            if !in_commands {
                tail.control("PP", []);
                tail.text([roman(std::mem::take(&mut task))]);
                tail.control("RS", ["4"]);
                tail.control("nf", []);
                in_commands = true;
            }
            tail.text([bold(command)]);
        } else {
            if in_commands {
                tail.control("fi", []);
                tail.control("RE", []);
                in_commands = false;
            }
            if !task.is_empty() {
                task.push(' ');
            }
            task.push_str(line.trim());
        }
    }
    if in_commands {
        tail.control("fi", []);
        tail.control("RE", []);
    }
    tail.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in epilogue.exit_status {
        tail.control("TP", []);
        tail.text([bold(code.to_string())]);
        tail.text([roman(*meaning)]);
    }
    tail.control("SH", ["SEE ALSO"]);
    let mut also = Vec::new();
    for page in pages.iter().filter(|p| p.as_str() != name) {
        if !also.is_empty() {
            also.push(roman(", "));
        }
        also.push(bold(page.as_str()));
        also.push(roman("(1)"));
    }
    also.push(roman(". "));
    also.push(roman(epilogue.see_also));
    tail.text(also);
    out.extend(roff_body(&tail));

    if cmd.get_version().is_some() {
        out.extend(body(&|b| man.render_version_section(b))?);
    }
    Ok(out)
}

/// An argument's value name as `--help` shows it (`PID`, `FILE`).
fn value_name(arg: &clap::Arg) -> String {
    arg.get_value_names()
        .map(|v| v.join(" "))
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase())
}

/// `gpu-trace [-p|--pid PID]... [--format FORMAT] ... FILE`, in the order of `--help`: the
/// options without a heading, then each heading's, each by its display order.
fn synopsis_line(display: &str, cmd: &clap::Command) -> Vec<roff::Inline> {
    use roff::{bold, italic, roman};

    let mut opts: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
        .collect();
    let mut headings: Vec<Option<&str>> = vec![None];
    for a in &opts {
        if !headings.contains(&a.get_help_heading()) {
            headings.push(a.get_help_heading());
        }
    }
    opts.sort_by_key(|a| {
        (
            headings.iter().position(|h| *h == a.get_help_heading()),
            a.get_display_order(),
        )
    });
    let mut line = vec![bold(display), roman(" ")];
    for a in opts {
        line.push(roman("["));
        match (a.get_short(), a.get_long()) {
            (Some(short), Some(long)) => {
                line.push(bold(format!("-{short}")));
                line.push(roman("|"));
                line.push(bold(format!("--{long}")));
            }
            (Some(short), None) => line.push(bold(format!("-{short}"))),
            (None, Some(long)) => line.push(bold(format!("--{long}"))),
            (None, None) => continue,
        }
        if a.get_action().takes_values() {
            line.push(roman(" "));
            line.push(italic(value_name(a)));
        }
        line.push(roman("]"));
        if matches!(
            a.get_action(),
            clap::ArgAction::Append | clap::ArgAction::Count
        ) {
            line.push(roman("..."));
        }
        line.push(roman(" "));
    }
    for p in cmd.get_positionals() {
        let required = p.is_required_set();
        line.push(roman(if required { "" } else { "[" }));
        line.push(italic(value_name(p)));
        line.push(roman(if required { " " } else { "] " }));
    }
    if cmd.has_subcommands() {
        line.push(roman("["));
        line.push(italic("command"));
        line.push(roman("]"));
    }
    line
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
        assert!(main.contains(".SH \"EXIT STATUS\""));
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

    /// The text of section `title` of a roff page (up to the next `.SH`).
    fn section<'a>(page: &'a str, title: &str) -> &'a str {
        let head = format!("\n.SH {title}\n");
        let start = page
            .find(&head)
            .unwrap_or_else(|| panic!("no section {title}:\n{page}"))
            + head.len();
        let end = page[start..]
            .find("\n.SH ")
            .map_or(page.len(), |e| start + e);
        &page[start..end]
    }

    #[test]
    fn man_pages_have_a_synopsis_examples_and_exit_status_and_name_only_shipped_pages() {
        let out = std::env::temp_dir().join(format!("xtask-gen-man-{}", std::process::id()));
        generate(&out).unwrap();
        let cmd = gpu_trace::cli::Cli::command();
        // The exit codes of docs/cli.md#exit-codes, per page.
        let mut pages = vec![("gpu-trace".to_string(), cmd.clone(), vec![0, 1, 2, 3, 4])];
        for (sub, codes) in [
            ("replay", vec![0, 1, 2, 4]),
            ("top", vec![0, 1, 2, 3, 4]),
            ("doctor", vec![0, 2, 3, 5]),
            ("completions", vec![0, 1, 2]),
        ] {
            let c = cmd.find_subcommand(sub).unwrap().clone();
            pages.push((format!("gpu-trace-{sub}"), c, codes));
        }
        let shipped: Vec<String> = fs::read_dir(out.join("man"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(shipped.len(), pages.len(), "{shipped:?}");
        for (name, cmd, codes) in &pages {
            let page = read(&out.join(format!("man/{name}.1")));
            assert!(!page.contains(".SH EXTRA"), "{name}: an EXTRA section");

            // SYNOPSIS: each option with the name of its argument.
            let synopsis = section(&page, "SYNOPSIS");
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                let value = arg
                    .get_value_names()
                    .map(|v| v.join(" "))
                    .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
                let want = match arg.get_long() {
                    Some(long) if arg.get_action().takes_values() => {
                        format!("\\fB\\-\\-{}\\fR \\fI{value}\\fR", long.replace('-', "\\-"))
                    }
                    Some(long) => format!("\\fB\\-\\-{}\\fR", long.replace('-', "\\-")),
                    None => format!("\\fI{value}\\fR"),
                };
                assert!(synopsis.contains(&want), "{name}: {want} not in {synopsis}");
            }

            // EXAMPLES: commands, in bold, without fill.
            let examples = section(&page, "EXAMPLES");
            assert!(
                examples.contains(".nf\n\\fBsudo gpu\\-trace")
                    || examples.contains(".nf\n\\fBgpu\\-trace"),
                "{name}: {examples}"
            );

            // EXIT STATUS: every code, and no other.
            let exit = section(&page, "\"EXIT STATUS\"");
            let listed: Vec<u8> = exit
                .split(".TP\n\\fB")
                .skip(1)
                .map(|item| item[..item.find("\\fR").unwrap()].parse().unwrap())
                .collect();
            assert_eq!(&listed, codes, "{name}: {exit}");

            // Every page a page names, NAME(1), is shipped.
            let plain = page
                .replace("\\fB", "")
                .replace("\\fR", "")
                .replace("\\fI", "")
                .replace("\\-", "-");
            for (at, _) in plain.match_indices("(1)") {
                let before = &plain[..at];
                let start = before
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .map_or(0, |i| i + 1);
                let referred = format!("{}.1", &before[start..]);
                assert!(
                    shipped.contains(&referred),
                    "{name} refers to {referred}, which is not shipped ({shipped:?})"
                );
            }

            // groff formats it without a warning (where groff is installed).
            if let Ok(groff) = std::process::Command::new("groff")
                .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
                .arg(out.join(format!("man/{name}.1")))
                .output()
            {
                assert!(groff.status.success(), "{name}: {groff:?}");
                assert!(
                    groff.stderr.is_empty(),
                    "{name}: groff: {}",
                    String::from_utf8_lossy(&groff.stderr)
                );
            }
        }
        fs::remove_dir_all(out).unwrap();
    }
}
