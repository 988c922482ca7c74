//! `--help` and `-h` fit an 80-column terminal: no line longer than 80 columns, and every line
//! break falls on whitespace (the words of the help wrapped at 80 columns are exactly those of
//! the same help on a wide terminal, so no word was cut in two); the everyday options come first
//! and kernel internals last.

use std::process::Command;

/// Every help screen of the CLI: the main command's and each subcommand's, long and short.
const SCREENS: &[&[&str]] = &[
    &["--help"],
    &["-h"],
    &["replay", "--help"],
    &["replay", "-h"],
    &["top", "--help"],
    &["top", "-h"],
    &["doctor", "--help"],
    &["doctor", "-h"],
    &["completions", "--help"],
    &["help", "replay"],
];

/// `gpu-trace ARGS` as a terminal of `columns` columns shows it (standard output is a pipe, so
/// clap takes the width from COLUMNS).
fn help(args: &[&str], columns: usize) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(args)
        .env("COLUMNS", columns.to_string())
        .output()
        .expect("running gpu-trace");
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_fits_80_columns_without_breaking_a_word() {
    for args in SCREENS {
        let narrow = help(args, 80);
        for line in narrow.lines() {
            assert!(
                line.chars().count() <= 80,
                "`gpu-trace {}` at 80 columns has a line of {} columns:\n{line}",
                args.join(" "),
                line.chars().count()
            );
        }
        let wide = help(args, 1000);
        // Wider where there was anything to wrap (a screen that fits 80 columns is the same).
        assert!(
            narrow == wide || wide.lines().any(|l| l.chars().count() > 80),
            "`gpu-trace {}`: the wide help is not wider (is COLUMNS read at all?)",
            args.join(" ")
        );
        let narrow_words: Vec<&str> = narrow.split_whitespace().collect();
        let wide_words: Vec<&str> = wide.split_whitespace().collect();
        if let Some(i) = (0..narrow_words.len().max(wide_words.len()))
            .find(|&i| narrow_words.get(i) != wide_words.get(i))
        {
            panic!(
                "`gpu-trace {}`: wrapping at 80 columns changed the words at word {i}: {:?} \
                 instead of {:?}",
                args.join(" "),
                &narrow_words[i.saturating_sub(3)..(i + 3).min(narrow_words.len())],
                &wide_words[i.saturating_sub(3)..(i + 3).min(wide_words.len())],
            );
        }
    }
}

/// Where `needle` first starts in `help`, which must hold it.
fn at(help: &str, needle: &str) -> usize {
    help.find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the help:\n{help}"))
}

#[test]
fn everyday_options_come_first_and_kernel_internals_last() {
    for args in [&["--help"][..], &["top", "--help"]] {
        let h = help(args, 80);
        let order = [
            "-p, --pid",
            "-c, --comm",
            "-v, --verbose",
            "--format",
            "-o, --output",
            "-d, --duration",
            "--interval",
            "\nOutput:",
            "--perfetto",
            "\nContainers:",
            "--container <ID>",
            "\nRefusing GPU work:",
            "--deny-pid",
            "\nMetrics:",
            "--metrics <ADDR>",
            "\nKernel internals:",
            "--ring-size",
            "--syscall-hook",
        ];
        let places: Vec<usize> = order.iter().map(|n| at(&h, n)).collect();
        for (pair, names) in places.windows(2).zip(order.windows(2)) {
            assert!(
                pair[0] < pair[1],
                "`gpu-trace {}`: {:?} should come before {:?}:\n{h}",
                args.join(" "),
                names[0],
                names[1]
            );
        }
    }
    let replay = help(&["replay", "--help"], 80);
    assert!(at(&replay, "-p, --pid") < at(&replay, "\nOutput:"));
    assert!(
        !replay.contains("Kernel internals"),
        "replay loads no programs"
    );
}

/// `-h` is a short screen (issue 41: git's and cargo's two sizes): at most 40 lines at 80
/// columns for the main command, `top` and `api`, the everyday options in their order, and the
/// way to the rest; `--help` still names every option `-h` leaves out.
#[test]
fn short_help_is_one_screen_and_long_help_has_the_rest() {
    for args in [&["-h"][..], &["top", "-h"], &["api", "-h"]] {
        let h = help(args, 80);
        let lines = h.lines().count();
        assert!(
            lines <= 40,
            "`gpu-trace {}`: {lines} lines:\n{h}",
            args.join(" ")
        );
    }
    let short = help(&["-h"], 80);
    let everyday = [
        "-p, --pid",
        "-c, --comm",
        "-v, --verbose",
        "--format",
        "-o, --output",
        "-d, --duration",
        "--record <FILE>",
        "\n      --api ",
        "--perfetto <FILE>",
        "--metrics <ADDR>",
    ];
    let places: Vec<usize> = everyday.iter().map(|n| at(&short, n)).collect();
    assert!(places.windows(2).all(|w| w[0] < w[1]), "{short}");
    assert!(
        short.contains("gpu-trace --help"),
        "the way to the rest: {short}"
    );
    let long = help(&["--help"], 80);
    for rest in [
        "--interval",
        "--container <ID>",
        "--deny-pid",
        "--flight-recorder",
        "--record-rotate",
        "--ring-size",
        "--syscall-hook",
        "--api-sums",
        "--metrics-expire",
        "--user",
    ] {
        assert!(
            !short.contains(rest),
            "`-h` should leave out {rest}:\n{short}"
        );
        at(&long, rest);
    }
}
