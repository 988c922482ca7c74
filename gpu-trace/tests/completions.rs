//! `gpu-trace completions SHELL`: the script each shell loads names the subcommands and the
//! options of the real CLI (not a stale copy), and an unknown shell is a usage error.

use std::process::Command;

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
