//! `gpu-trace completions SHELL`: the script each shell loads names the subcommands and the
//! options of the real CLI (not a stale copy), and an unknown shell is a usage error; loaded into
//! a real bash, zsh and fish, it completes an option after a subcommand
//! (`gpu-trace replay --perf<TAB>` gives `--perfetto`), which clap_complete's bash script did not
//! do for a hyphenated binary name.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

fn completions(shell: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["completions", shell])
        .output()
        .expect("running gpu-trace")
}

#[test]
fn each_shell_gets_a_script_naming_the_real_subcommands_and_options() {
    // What each generator writes to hook itself into its shell.
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef gpu-trace"),
        ("fish", "complete -c gpu-trace"),
    ] {
        let out = completions(shell);
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        for word in ["replay", "doctor", "completions", "deny-pid", "ring-size"] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    let out = completions("tcsh");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash"));
}

/// The script for `shell`, saved under `name` in a fresh directory of its own.
fn saved_script(shell: &str, name: &str) -> (PathBuf, PathBuf) {
    let out = completions(shell);
    assert!(out.status.success(), "{shell}: {out:?}");
    let dir = common::scratch().join(shell);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, out.stdout).unwrap();
    (dir, path)
}

/// Whether `shell` runs here; if not, says so as a skip of `test`.
fn shell_runs(shell: &str, test: &str) -> bool {
    match Command::new(shell).args(["-c", "true"]).status() {
        Ok(s) if s.success() => true,
        other => {
            common::skipped(
                test,
                format!("{shell} cannot run here ({other:?}); install it (scripts/setup.sh does)"),
            );
            false
        }
    }
}

/// What bash's completion offers for the command line `words` (the cursor at the end of the
/// last word), by the function the script registered for `gpu-trace` with `complete -F`, called
/// as bash's programmable completion calls it.
fn bash_completes(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let prog = format!(
        r#"source '{script}' || exit 9
spec=$(complete -p gpu-trace) || exit 8
fn=${{spec#*-F }}; fn=${{fn%% *}}
COMP_WORDS=({words})
COMP_CWORD={cword}
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
"$fn" gpu-trace "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        script = script.display(),
        words = quoted.join(" "),
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &prog])
        .output()
        .unwrap();
    assert!(out.status.success(), "bash: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_options_after_a_subcommand() {
    const TEST: &str = "bash_completes_options_after_a_subcommand";
    if !shell_runs("bash", TEST) {
        return;
    }
    let (_, script) = saved_script("bash", "gpu-trace.bash");
    // The top level worked before; after a subcommand, nothing did.
    assert_eq!(
        bash_completes(&script, &["gpu-trace", "--perf"]),
        ["--perfetto"]
    );
    assert_eq!(
        bash_completes(&script, &["gpu-trace", "replay", "--perf"]),
        ["--perfetto"]
    );
    assert_eq!(
        bash_completes(&script, &["gpu-trace", "top", "--deny-c"]),
        ["--deny-cgroup", "--deny-container"]
    );
    // An option's values, after a subcommand.
    assert_eq!(
        bash_completes(&script, &["gpu-trace", "replay", "--format", ""]),
        ["text", "json"]
    );
    assert_eq!(
        bash_completes(&script, &["gpu-trace", "completions", "fi"]),
        ["fish"]
    );
}

#[test]
fn fish_completes_options_after_a_subcommand() {
    const TEST: &str = "fish_completes_options_after_a_subcommand";
    if !shell_runs("fish", TEST) {
        return;
    }
    let (_, script) = saved_script("fish", "gpu-trace.fish");
    let out = Command::new("fish")
        .args(["--no-config", "-c"])
        .arg(format!(
            "source '{}'; and complete -C 'gpu-trace replay --perf'",
            script.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "fish: {out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let offered: Vec<&str> = stdout
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(offered, ["--perfetto"], "{stdout}");
}

#[test]
fn zsh_completes_options_after_a_subcommand() {
    const TEST: &str = "zsh_completes_options_after_a_subcommand";
    if !shell_runs("zsh", TEST) {
        return;
    }
    // An interactive zsh on a pseudo-terminal (zsh/zpty) with the script in $fpath and compinit
    // run, as a user has it; TAB after `gpu-trace replay --perf`, then a key whose widget
    // writes the edited line to a file.
    let (dir, _) = saved_script("zsh", "_gpu-trace");
    let line_file = dir.join("line");
    let _ = std::fs::remove_file(&line_file);
    let setup = format!(
        "fpath=('{dir}' $fpath); autoload -Uz compinit; compinit -u -D; \
         dump() {{ print -r -- \"$BUFFER\" > '{line}' }}; zle -N dump; bindkey '^X' dump",
        dir = dir.display(),
        line = line_file.display(),
    );
    let driver = format!(
        r#"zmodload zsh/zpty || exit 9
zpty z env HOME='{home}' zsh -f -i || exit 8
zpty -w z {setup}
zpty -w -n z $'gpu-trace replay --perf\t'
sleep 1
zpty -w -n z $'\C-x'
for i in {{1..100}}; do [[ -s '{line}' ]] && break; sleep 0.1; done
zpty -d z
"#,
        home = dir.display(),
        setup = shell_quote(&setup),
        line = line_file.display(),
    );
    let started = Instant::now();
    let out = Command::new("zsh")
        .args(["-f", "-c", &driver])
        .output()
        .unwrap();
    assert!(out.status.success(), "zsh: {out:?}");
    let line = std::fs::read_to_string(&line_file).unwrap_or_else(|e| {
        panic!(
            "the zsh line was not written ({e}) after {:?}: {out:?}",
            started.elapsed()
        )
    });
    assert!(
        line.starts_with("gpu-trace replay --perfetto"),
        "zsh completed the line to {line:?}"
    );
}

/// `s` as one single-quoted shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
