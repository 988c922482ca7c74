//! The report as text (the verdicts and what the exit status means first, then the table) and
//! as JSON.

use std::fmt::Write as _;

use super::rows::{Report, exit};

impl Report {
    /// The verdicts first (with any warning and what the exit status means), then the table,
    /// as text.
    pub fn render_text(&self) -> String {
        let check_w = self
            .rows
            .iter()
            .map(|r| r.check.chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "gpu-trace doctor: what this machine allows (kernel {}, {})",
            self.kernel, self.arch
        );
        let _ = writeln!(out);
        for (name, v) in [("tracing", &self.tracing), ("--deny-pid", &self.deny)] {
            let _ = writeln!(
                out,
                "{name:<10}  {}  {}",
                if v.ok { "yes" } else { "no " },
                v.why
            );
            if let Some(fix) = &v.fix {
                let _ = writeln!(out, "{:13}fix: {fix}", "");
            }
        }
        for warning in &self.warnings {
            let _ = writeln!(out, "WARNING: {warning}");
        }
        let meaning = match self.exit_code {
            exit::READY => "tracing and --deny-pid can both work",
            exit::NO_DENY => "tracing can work, --deny-pid cannot",
            _ => "tracing cannot work",
        };
        let _ = writeln!(out, "exit status {}: {meaning}", self.exit_code);
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<6}  {:<check_w$}  {:<3}  WHY",
            "VENDOR", "CHECK", "OK"
        );
        let indent = 6 + 2 + check_w + 2 + 3 + 2;
        let mut last_scope = None;
        for r in &self.rows {
            if last_scope.is_some_and(|s| s != r.scope) {
                let _ = writeln!(out);
            }
            last_scope = Some(r.scope);
            let _ = writeln!(
                out,
                "{:<6}  {:<check_w$}  {:<3}  {}",
                r.scope.label(),
                r.check,
                r.status.label(),
                r.why
            );
            if let Some(fix) = &r.fix {
                let _ = writeln!(out, "{:indent$}fix: {fix}", "");
            }
        }
        out
    }

    /// The report as one JSON object (for scripts and tests).
    pub fn render_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the report serializes")
    }
}
