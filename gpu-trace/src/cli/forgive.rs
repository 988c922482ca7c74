//! Parsing the command line the way a user would want to be answered: clap's errors where they
//! are right, and where `-- CMD` makes them wrong or mute, better ones.
//!
//! Because `gpu-trace` takes a command after `--`, clap reads a bare word where a subcommand
//! would go as a stray positional and says only "unexpected argument": no "did you mean" for a
//! mistyped subcommand (`replya`), no hint for a command typed without `--` (`gpu-trace sleep
//! 1`). Its tip for an unknown option, "to pass '-x' as a value, use '-- -x'", would start a
//! command named `-x`. This module answers those three, refuses the tracing options `top`
//! would ignore, and answers options typed before a subcommand (gpu-trace's own, which the
//! subcommand never reads) with the line that has them after it.

use std::ffi::OsString;

use clap::{
    ArgMatches, CommandFactory as _, FromArgMatches as _,
    builder::StyledStr,
    error::{ContextKind, ContextValue, ErrorKind},
    parser::ValueSource,
};

use super::Cli;

/// The command line of this process, parsed; a usage error is printed and exits 2 (help and
/// version exit 0), as `Cli::parse` does.
pub fn parse() -> Cli {
    clap_complete::CompleteEnv::with_factory(Cli::command)
        .var(super::complete::VAR)
        .complete();
    parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

/// `args` (the program name first) parsed, or the error to print.
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let mut cmd = Cli::command();
    let matches = match cmd.try_get_matches_from_mut(&args) {
        Ok(m) => m,
        Err(e) => return Err(forgive(e, &args, &cmd)),
    };
    if let Some((name, _)) = matches.subcommand() {
        options_before_subcommand(&matches, name, &args, &mut cmd)?;
    }
    if let Some(top) = matches.subcommand_matches("top") {
        refuse_ignored_by_top(top, &mut cmd)?;
    }
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
}

/// Where on the command line the subcommand would be: the index in `args` of the first word
/// that is neither an option nor an option's value, before any `--`.
fn subcommand_slot(cmd: &clap::Command, args: &[OsString]) -> Option<usize> {
    let takes_value_long = |name: &str| {
        cmd.get_arguments()
            .find(|a| {
                a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|v| v.contains(&name))
            })
            .is_some_and(|a| a.get_action().takes_values())
    };
    let takes_value_short = |c: char| {
        cmd.get_arguments()
            .find(|a| a.get_short() == Some(c))
            .is_some_and(|a| a.get_action().takes_values())
    };
    let mut i = 1;
    while i < args.len() {
        let word = args[i].to_string_lossy();
        if word == "--" {
            return None;
        }
        if let Some(long) = word.strip_prefix("--") {
            if !long.contains('=') && takes_value_long(long) {
                i += 1;
            }
        } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            for (at, c) in shorts.char_indices() {
                if takes_value_short(c) {
                    // The value is the rest of this word, or the next word.
                    if at + c.len_utf8() == shorts.len() {
                        i += 1;
                    }
                    break;
                }
            }
        } else {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// clap's error for `args`, made right for this command line (module docs).
fn forgive(e: clap::Error, args: &[OsString], cmd: &clap::Command) -> clap::Error {
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(invalid)) = e.get(ContextKind::InvalidArg).cloned() else {
        return e;
    };
    let slot = subcommand_slot(cmd, args);
    if let Some(i) = slot.filter(|&i| args[i].to_string_lossy() == invalid.as_str()) {
        return unknown_subcommand(cmd, args, i);
    }
    // An unknown option of gpu-trace itself or of `api`, whose trailing words are a command to
    // start: `-- -x` would start a command named `-x`, so that tip goes.
    let sub = slot.map(|i| args[i].to_string_lossy().into_owned());
    if matches!(sub.as_deref(), None | Some("api"))
        && let Some(ContextValue::StyledStrs(tips)) = e.get(ContextKind::Suggested).cloned()
    {
        let kept: Vec<StyledStr> = tips
            .into_iter()
            .filter(|t| !t.to_string().starts_with("to pass '"))
            .collect();
        // The same error without that tip (a context cannot be taken out, only left behind).
        let mut again = clap::Error::new(ErrorKind::UnknownArgument).with_cmd(cmd);
        for (kind, value) in e.context() {
            if kind != ContextKind::Suggested {
                again.insert(kind, value.clone());
            }
        }
        if !kept.is_empty() {
            again.insert(ContextKind::Suggested, ContextValue::StyledStrs(kept));
        }
        return again;
    }
    e
}

/// `gpu-trace WORD …` where WORD is no subcommand: the subcommands it resembles, and when WORD
/// is a program on PATH (or a path to one), the same line with `--` before it.
fn unknown_subcommand(cmd: &clap::Command, args: &[OsString], i: usize) -> clap::Error {
    let word = args[i].to_string_lossy().into_owned();
    let names: Vec<&str> = cmd
        .get_subcommands()
        .map(|s| s.get_name())
        .filter(|&n| n != "help")
        .collect();
    let similar: Vec<String> = names
        .iter()
        .filter(|n| resembles(&word, n))
        .map(|n| n.to_string())
        .collect();
    let mut e = clap::Error::new(ErrorKind::InvalidSubcommand).with_cmd(cmd);
    e.insert(ContextKind::InvalidSubcommand, ContextValue::String(word));
    let mut tips = Vec::new();
    if crate::launch::resolve_command(&args[i]).is_ok() {
        let mut line = vec![crate::cli::BIN_NAME.to_string()];
        line.extend(args[1..i].iter().map(shell_word));
        line.push("--".into());
        line.extend(args[i..].iter().map(shell_word));
        tips.push(StyledStr::from(format!(
            "did you mean `{}`? (the command to start and trace goes after `--`)",
            line.join(" ")
        )));
    } else if similar.is_empty() {
        tips.push(StyledStr::from(format!(
            "subcommands: {}; to start and trace a command: gpu-trace [OPTIONS] -- CMD",
            names.join(", ")
        )));
    }
    if !similar.is_empty() {
        e.insert(
            ContextKind::SuggestedSubcommand,
            ContextValue::Strings(similar),
        );
    }
    e.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    let usage = cmd.clone().render_usage();
    e.insert(ContextKind::Usage, ContextValue::StyledStr(usage));
    e
}

/// Whether `word` looks like a mistyping of `name`: one or two edits away (transposed letters
/// count as one), or its start (three letters or more).
fn resembles(word: &str, name: &str) -> bool {
    let allowed = if name.len() <= 4 { 1 } else { 2 };
    (word.len() >= 3 && name.starts_with(word)) || edits(word, name) <= allowed
}

/// The optimal string alignment distance of `a` and `b` (insertions, deletions, substitutions
/// and transpositions of neighbours, each 1).
fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// `gpu-trace -v replay FILE`: clap takes the options before a subcommand as gpu-trace's own (live
/// tracing's), which the subcommand never reads, so they would be ignored without a word. The
/// same words moved after the subcommand's name: a "did you mean" with that line when it parses,
/// else the subcommand's own error for them (`doctor` takes no `--duration`).
fn options_before_subcommand(
    matches: &ArgMatches,
    name: &str,
    args: &[OsString],
    cmd: &mut clap::Command,
) -> Result<(), clap::Error> {
    let given = cmd
        .get_arguments()
        .any(|a| matches.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine));
    let Some(slot) = subcommand_slot(cmd, args).filter(|&i| i > 1 && given) else {
        return Ok(());
    };
    let mut moved = vec![args[0].clone(), args[slot].clone()];
    moved.extend_from_slice(&args[1..slot]);
    moved.extend_from_slice(&args[slot + 1..]);
    parse_from(&moved)?;
    let before: Vec<String> = args[1..slot].iter().map(shell_word).collect();
    let mut line = vec![crate::cli::BIN_NAME.to_string()];
    line.extend(moved[1..].iter().map(shell_word));
    let why = format!(
        "`{}` before `{name}` would be ignored: a subcommand's options go after its name\n\n  \
         tip: did you mean `{}`?",
        before.join(" "),
        line.join(" ")
    );
    let sub = cmd
        .find_subcommand_mut(name)
        .expect("clap matched this subcommand");
    Err(sub.error(ErrorKind::ArgumentConflict, why))
}

/// `word` as a shell would need it typed: as is when it is plain, else in single quotes.
fn shell_word(word: &OsString) -> String {
    let w = word.to_string_lossy();
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        w.into_owned()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// The tracing options `top` takes but would ignore: (id, as written, why). The view owns the
/// terminal: these shape event lines and statistics, which `top` writes only to `-o FILE`.
const SHAPE_EVENTS: &[(&str, &str)] = &[
    ("format", "--format"),
    ("verbose", "-v/--verbose"),
    ("timestamps", "--timestamps"),
    ("no_stats", "--no-stats"),
    ("show_container", "--show-container"),
];

/// `gpu-trace top` with an option it would silently ignore: a usage error that says why.
fn refuse_ignored_by_top(top: &ArgMatches, cmd: &mut clap::Command) -> Result<(), clap::Error> {
    let given = |id: &str| top.value_source(id) == Some(ValueSource::CommandLine);
    let why = if given("interval") {
        Some(
            "`gpu-trace top` redraws its view every second instead of printing statistics: \
             leave --interval out (with -o FILE, the file gets the statistics at the end)"
                .to_string(),
        )
    } else if given("quiet") {
        Some(
            "`gpu-trace top` prints no events or statistics on the terminal anyway (only to \
             -o FILE): leave -q/--quiet out"
                .to_string(),
        )
    } else if !given("output") {
        SHAPE_EVENTS
            .iter()
            .find(|(id, _)| given(id))
            .map(|(_, shown)| {
                format!(
                    "`gpu-trace top` shows its view instead of event lines: {shown} shapes only \
                     the events it writes to -o FILE; add -o FILE, or leave {shown} out"
                )
            })
    } else {
        None
    };
    match why {
        Some(why) => {
            let top_cmd = cmd
                .find_subcommand_mut("top")
                .expect("the top subcommand exists");
            Err(top_cmd.error(ErrorKind::ArgumentConflict, why))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(args: &[&str]) -> String {
        let mut all = vec!["gpu-trace"];
        all.extend_from_slice(args);
        match parse_from(all) {
            Ok(_) => panic!("{args:?} parsed"),
            Err(e) => e.render().to_string(),
        }
    }

    #[test]
    fn the_subcommand_slot_skips_options_and_their_values() {
        let cmd = Cli::command();
        let os = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            subcommand_slot(&cmd, &os(&["gpu-trace", "replya"])),
            Some(1)
        );
        assert_eq!(
            subcommand_slot(
                &cmd,
                &os(&["gpu-trace", "-p", "5", "--comm=x", "-v", "topp"])
            ),
            Some(5)
        );
        assert_eq!(
            subcommand_slot(&cmd, &os(&["gpu-trace", "-p5", "x"])),
            Some(2)
        );
        assert_eq!(
            subcommand_slot(&cmd, &os(&["gpu-trace", "-vp", "5", "x"])),
            Some(3)
        );
        assert_eq!(
            subcommand_slot(&cmd, &os(&["gpu-trace", "-v", "--", "x"])),
            None
        );
    }

    #[test]
    fn mistyped_words_resemble_their_subcommand_only() {
        assert!(resembles("replya", "replay"));
        assert!(resembles("topp", "top"));
        assert!(resembles("docter", "doctor"));
        assert!(resembles("comp", "completions"));
        assert!(!resembles("sleep", "replay"));
        assert!(!resembles("true", "top"));
        assert_eq!(edits("replya", "replay"), 1);
        assert_eq!(edits("", "top"), 3);
    }

    #[test]
    fn an_unknown_option_gets_no_tip_that_would_start_a_command() {
        let e = err(&["-x"]);
        assert!(!e.contains("-- -x"), "{e}");
        let e = err(&["api", "--no-such"]);
        assert!(!e.contains("-- --no-such"), "{e}");
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word(&"sleep".into()), "sleep");
        assert_eq!(shell_word(&"./a.py".into()), "./a.py");
        assert_eq!(shell_word(&"a b".into()), "'a b'");
        assert_eq!(shell_word(&"it's".into()), r"'it'\''s'");
    }
}
