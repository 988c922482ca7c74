//! Helpers shared by the integration tests.

use std::io::Write;

/// Says loudly that a test could not run (or could only partly run), and why. Written straight
/// to the process's stderr, past libtest's output capture, so that it shows in `cargo test`
/// output even when the test passes; `.ci/run` collects these lines.
pub fn skipped(test: &str, why: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
}
