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

/// `PATH` with the binary under test first: the scripts ask `gpu-trace` on `PATH` for candidates.
fn path_with_binary() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_gpu-trace")).parent().unwrap();
    let mut dirs = vec![bin.to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

fn completions(shell: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["completions", shell])
        .output()
        .expect("running gpu-trace")
}

#[test]
fn each_shell_gets_a_script_that_asks_the_binary() {
    // What each script writes to hook itself into its shell, and how it asks `gpu-trace` for
    // the words at a TAB (the words themselves are the binary's: the tests below).
    for (shell, marker) in [
        ("bash", "complete -o nospace -o bashdefault -o nosort -F"),
        ("zsh", "#compdef gpu-trace"),
        (
            "fish",
            "complete --keep-order --exclusive --command gpu-trace",
        ),
    ] {
        let out = completions(shell);
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains(marker), "{shell}: no {marker:?}: {script}");
        assert!(
            script.contains("GPU_TRACE_COMPLETE=") || script.contains("GPU_TRACE_COMPLETE "),
            "{shell}: {script}"
        );
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
    bash_completes_in(script, words, Path::new("/"))
}

/// [`bash_completes`] with `dir` as the working directory.
fn bash_completes_in(script: &Path, words: &[&str], dir: &Path) -> Vec<String> {
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
        .env("PATH", path_with_binary())
        .current_dir(dir)
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

/// Values complete from the machine (issue 41): recordings for `replay` and `merge`, live
/// processes for `--pid` and `--deny-pid`, their names for `--comm`. The expected values come
/// from what the test made: files it wrote, a child it started from a copy of `sleep` under a
/// name of its own.
#[test]
fn bash_completes_values_from_the_machine() {
    const TEST: &str = "bash_completes_values_from_the_machine";
    if !shell_runs("bash", TEST) {
        return;
    }
    let (dir, script) = saved_script("bash", "gpu-trace.bash");
    let work = dir.join("values");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("older")).unwrap();
    for f in [
        "run.gtrace",
        "run.gtrace.0002",
        "notes.json",
        "run.gtrace.x",
    ] {
        std::fs::write(work.join(f), b"").unwrap();
    }
    let files = |words: &[&str]| -> Vec<String> {
        let mut got = bash_completes_in(&script, words, &work);
        got.retain(|w| !w.starts_with('-'));
        got
    };
    // (The engine offers `.` too: a directory.)
    let want = [".", "older/", "run.gtrace", "run.gtrace.0002"];
    assert_eq!(files(&["gpu-trace", "replay", ""]), want);
    assert_eq!(files(&["gpu-trace", "merge", "run.gtrace", ""]), want);
    assert_eq!(
        files(&["gpu-trace", "replay", "run.gtrace."]),
        ["run.gtrace.0002"]
    );

    // A process of a name no other has: a copy of sleep, started here, waited on after.
    let name = "gtcompl8sleep";
    let exe = work.join(name);
    std::fs::copy(which("sleep"), &exe).unwrap();
    let mut child = Command::new(&exe).arg("600").spawn().unwrap();
    let pid = child.id().to_string();
    let offered = bash_completes(&script, &["gpu-trace", "--pid", &pid]);
    let deny = bash_completes(&script, &["gpu-trace", "--deny-pid", &pid]);
    let comm = bash_completes(&script, &["gpu-trace", "--comm", "gtcompl8"]);
    let api_comm = bash_completes(&script, &["gpu-trace", "api", "--comm", "gtcompl8"]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(offered.contains(&pid), "--pid {pid}: {offered:?}");
    assert!(offered.iter().all(|p| p.starts_with(&pid)), "{offered:?}");
    assert!(deny.contains(&pid), "--deny-pid {pid}: {deny:?}");
    assert_eq!(comm, [name]);
    assert_eq!(api_comm, [name]);
}

/// The absolute path of `prog` on `PATH`.
fn which(prog: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{prog} is not on PATH"))
}

#[test]
fn fish_completes_options_after_a_subcommand() {
    const TEST: &str = "fish_completes_options_after_a_subcommand";
    if !shell_runs("fish", TEST) {
        return;
    }
    let (_, script) = saved_script("fish", "gpu-trace.fish");
    let out = Command::new("fish")
        .env("PATH", path_with_binary())
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
        .env("PATH", path_with_binary())
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
