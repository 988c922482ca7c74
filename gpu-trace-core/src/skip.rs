//! The one way a test says that it could not run: [`skipped`]. Every test of the workspace that
//! skips (gpu-trace's unit and integration tests, xtask's, this crate's) calls it, so that every
//! skip reaches CI's log, where `.ci/judge-skips` judges it against `.ci/expected-skips`.
//!
//! Why not `println!`/`eprintln!`: libtest captures what those macros print (in the test's
//! thread and the threads it spawns) and drops it when the test passes, so a passing test that
//! skipped would say nothing to CI. The capture is only the macros' (`std::io::set_output_capture`
//! hooks `print!`/`eprint!`); a write through the [`std::io::stderr`] handle goes to fd 2 itself.
//! The test below runs a real test binary under the capture and checks that both hold.

use std::io::Write;

/// Writes `SKIPPED: <test>: <why>` to the process's stderr, past libtest's capture, in one write
/// (so that parallel tests' lines do not interleave). `test` names the test (the function's
/// name, as `.ci/expected-skips` matches it).
pub fn skipped(test: &str, why: impl std::fmt::Display) {
    let line = format!("SKIPPED: {test}: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use std::{path::Path, process::Command};

    const PLANTED: &str = "planted_skip_child: planted by skip::tests to see the judge fail";

    /// Run by [`a_skip_in_a_passing_test_reaches_the_log_and_fails_the_judge`] under libtest's
    /// capture: a passing test that skips, and a `println!` the capture must hold back.
    #[test]
    #[ignore = "child process body for a_skip_in_a_passing_test_reaches_the_log_and_fails_the_judge"]
    fn planted_skip_child() {
        println!("captured: libtest drops this for a passing test");
        let (test, why) = PLANTED.split_once(": ").unwrap();
        super::skipped(test, why);
    }

    /// The chain CI relies on, for real: this test binary runs its own `planted_skip_child`
    /// (captured, as `cargo test` runs it), its stdout and stderr go into one log as
    /// `cargo test 2>&1 | tee log` writes it, and `.ci/judge-skips` fails on that log unless
    /// the expected list names the skip.
    #[test]
    fn a_skip_in_a_passing_test_reaches_the_log_and_fails_the_judge() {
        let test = "a_skip_in_a_passing_test_reaches_the_log_and_fails_the_judge";
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        // One open file for both, as `2>&1` makes it: one offset, nothing overwritten.
        let file = std::fs::File::create(&log).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "skip::tests::planted_skip_child"])
            .args(["--test-threads", "1"])
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .status()
            .unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(out.success(), "the planted test passes: {text}");
        assert!(text.contains("1 passed"), "it ran: {text}");
        assert!(
            !text.contains("captured: libtest drops this"),
            "libtest's capture was on (a println! of a passing test is dropped): {text}"
        );
        assert!(
            text.contains(&format!("SKIPPED: {PLANTED}\n")),
            "the skip got past the capture: {text}"
        );

        let judge = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/judge-skips");
        let run_judge = |expected: &str| {
            let path = dir.path().join("expected");
            std::fs::write(&path, expected).unwrap();
            Command::new("python3")
                .arg(&judge)
                .arg(&log)
                .arg(&path)
                .output()
        };
        let without = match run_judge("# nothing expected\n") {
            Ok(o) => o,
            Err(e) => {
                super::skipped(test, format!("python3 cannot run .ci/judge-skips: {e}"));
                return;
            }
        };
        let report = String::from_utf8_lossy(&without.stdout);
        assert_eq!(without.status.code(), Some(1), "the judge fails: {report}");
        assert!(
            report.contains(&format!(
                "UNEXPECTED skip (not in the expected list): {PLANTED}"
            )),
            "naming the skip: {report}"
        );
        let with =
            run_judge("skip planted_skip_child: planted by * | this test plants it\n").unwrap();
        let report = String::from_utf8_lossy(&with.stdout);
        assert_eq!(with.status.code(), Some(0), "listed, it passes: {report}");
        assert!(report.contains("1 test(s) skipped"), "{report}");
    }
}
