//! README.md's first screen (issue 41 item 8): what it is, install, the first run and the common
//! tasks within its first 60 lines, in sentences a reader can take in (none over 200 characters
//! outside code blocks); the two commands it promises, set up + run (the main job) and set up +
//! test (the command `.ci/run` is, CI's entry point), kept.

use std::path::Path;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn readme() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap()
}

/// The prose of `text` (code blocks left out), cut into sentences: a paragraph, heading or list
/// item ends one; inside them a `.`, `?` or `!` followed by a space does.
fn sentences(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            prose.push('\n');
            continue;
        }
        if in_code || line.trim().is_empty() {
            prose.push('\n');
            continue;
        }
        let t = line.trim_start();
        if t.starts_with('#') || t.starts_with("- ") || t.starts_with('|') {
            prose.push('\n');
        }
        prose.push_str(t);
        prose.push(' ');
        if t.starts_with('#') {
            prose.push('\n');
        }
    }
    let mut out = Vec::new();
    for block in prose.split('\n') {
        let mut cur = String::new();
        let mut chars = block.chars().peekable();
        while let Some(c) = chars.next() {
            cur.push(c);
            if matches!(c, '.' | '?' | '!') && chars.peek() == Some(&' ') {
                out.push(std::mem::take(&mut cur).trim().to_string());
            }
        }
        if !cur.trim().is_empty() {
            out.push(cur.trim().to_string());
        }
    }
    out
}

#[test]
fn the_first_60_lines_say_what_it_is_how_to_install_run_and_use_it() {
    let text = readme();
    let first: Vec<&str> = text.lines().take(60).collect();
    let first = first.join("\n");
    for heading in ["## Install", "## First run", "## Common tasks"] {
        assert!(
            first.lines().any(|l| l == heading),
            "{heading} is not within the first 60 lines"
        );
    }
    // The common tasks' block ends within the 60 lines too.
    let tasks = &first[first.find("## Common tasks").unwrap()..];
    assert_eq!(tasks.matches("```").count(), 2, "{tasks}");
    assert!(
        tasks.contains("gpu-trace -- ") || tasks.contains(" -- python3"),
        "{tasks}"
    );
    let long: Vec<String> = sentences(&first)
        .into_iter()
        .filter(|s| s.chars().count() > 200)
        .collect();
    assert!(long.is_empty(), "sentences over 200 characters: {long:#?}");
}

#[test]
fn the_readme_keeps_its_two_commands_and_ci_runs_the_test_one() {
    let text = readme();
    let run = "./scripts/setup.sh && cargo build --release && ./target/release/gpu-trace doctor; \
               ./target/release/gpu-trace -v";
    let first: Vec<&str> = text.lines().take(60).collect();
    assert!(first.contains(&run), "the set-up-and-run command");
    assert!(
        text.lines().any(|l| l == "bash .ci/run"),
        "the set-up-and-test command"
    );
    let ci = std::fs::read_to_string(Path::new(ROOT).join(".ci/run")).unwrap();
    assert!(ci.starts_with("#!/usr/bin/env bash\n"), "{ci}");
    assert!(ci.contains("Runs the README's test command"), "{ci}");
    assert!(
        ci.contains("\n./scripts/setup.sh\n"),
        "CI sets up as the README says"
    );
    assert!(
        Path::new(ROOT).join("scripts/setup.sh").is_file(),
        "scripts/setup.sh"
    );
}

#[test]
fn sentences_are_cut_at_their_ends_and_blocks() {
    assert_eq!(
        sentences("# T\n\nOne. Two\nthree.\n\n```\nnot. prose.\n```\n- a\n- b"),
        ["# T", "One.", "Two three.", "- a", "- b"]
    );
}
