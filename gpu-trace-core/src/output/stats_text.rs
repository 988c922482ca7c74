//! The statistics block as text: the end of a text trace and `--interval`'s blocks. The model
//! ([`crate::model::stats`]) counts; this renders.

use std::fmt::Write as _;

use crate::api::stats::CallStats;
use crate::escape::escape_text;
use crate::event::Interleave;
use crate::model::stats::{
    MAX_LIVE_TASKS, MAX_LIVE_TASKS_PER_PROCESS, MAX_TASKS_KEPT, MAX_TASKS_PRINTED, Stats,
};

impl Stats {
    /// The statistics block printed at the end of a text trace (ends with a newline);
    /// `verbose` (`-v`) adds the diagnostics section (kernel-internal counters).
    ///
    /// ```text
    /// --- gpu-trace statistics (12.3 s) ---
    /// task_init           4
    /// schedule            4   (refused 0)
    /// sched_update        1   (refused 0, preempt 0)
    /// work_submit        20
    /// task_destroy        4   (implicit 4)
    /// dropped             0
    /// read_failed         0
    ///
    /// PID      COMM             TASK_INIT SCHEDULE SCHED_UPDATE PREEMPT WORK_SUBMIT TASK_DESTROY
    /// 637320   python3                  4        4            1       0          20            4
    ///
    /// ENGINE         TASKS SCHEDULE SCHED_UPDATE PREEMPT
    /// GRAPHICS           1        1            1       0
    ///
    /// GPU  RUNLIST MAX_LIVE
    /// 0    *              4
    /// 0    13             1
    ///
    /// TASK                          ENGINE      LIFE_MS  SCHED_MS SUBMIT_MS TIMESLICE INTERLEAVE PREEMPT CHANGES END
    /// 427:0xc1d0001c:0x5c000015     GRAPHICS   1256.557    59.112    30.123      2048 MEDIUM           0       1 process_exit
    /// ```
    ///
    /// The event counts, `dropped` and `read_failed` are always printed; the other counters only
    /// when not zero (`lost_samples` when reported). `LIFE_MS` is `TASK_INIT` → `TASK_DESTROY`,
    /// `SCHED_MS` `TASK_INIT` → first allowed `SCHEDULE`, `SUBMIT_MS` `TASK_INIT` → first
    /// `WORK_SUBMIT`, `TIMESLICE` in µs; `-` where not known (or not yet: `END` is `alive`).
    /// At most [`MAX_TASKS_PRINTED`] tasks are listed (JSON lists them all).
    pub fn render_text(&self, verbose: bool) -> String {
        self.render_text_titled(verbose, "gpu-trace statistics")
    }

    /// [`render_text`](Self::render_text) under another title (the periodic blocks of
    /// `--interval`).
    pub fn render_text_titled(&self, verbose: bool, title: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "--- {title} ({:.1} s) ---",
            self.duration().as_secs_f64()
        );
        write_rows(&mut out, &self.summary_rows());
        if self.kernel.dropped > 0 {
            let _ = writeln!(
                out,
                "warning: {} events were dropped because the ring buffer was full; \
                 raise --ring-size",
                self.kernel.dropped
            );
        }
        if let Some(warning) = self.kernel.deny_unfollowed_warning() {
            let _ = writeln!(out, "{warning}");
        }
        self.render_processes(&mut out);
        self.render_groups(&mut out);
        self.render_api(&mut out);
        self.render_tasks(&mut out);
        if verbose {
            self.render_diagnostics(&mut out);
        }
        out
    }

    /// The counts at the top of the block: label, value (`?` where not known), note.
    fn summary_rows(&self) -> Vec<(&'static str, String, String)> {
        let mut rows: Vec<(&str, u64, String)> = vec![
            ("task_init", self.task_init, String::new()),
            (
                "schedule",
                self.schedule,
                format!("(refused {})", self.schedule_refused),
            ),
            (
                "sched_update",
                self.sched_update,
                format!(
                    "(refused {}, preempt {})",
                    self.sched_update_refused, self.preempt
                ),
            ),
            ("work_submit", self.work_submit, String::new()),
            (
                "task_destroy",
                self.task_destroy,
                format!("(implicit {})", self.task_destroy_implicit),
            ),
            ("dropped", self.kernel.dropped, String::new()),
            ("read_failed", self.kernel.read_failed, String::new()),
        ];
        let optional = [
            ("fd_lookup_failed", self.kernel.fd_lookup_failed),
            ("denied", self.kernel.denied),
            ("skipped", self.kernel.skipped.unwrap_or(0)),
            ("denied_unread", self.kernel.denied_unread.unwrap_or(0)),
            ("deny_unfollowed", self.kernel.deny_unfollowed.unwrap_or(0)),
            ("malformed", self.malformed),
            ("decode_errors", self.decode_errors),
            ("live_at_exit", self.live_at_exit),
            ("pretrace_end", self.pretrace_end),
            ("mps_shared", self.mps_shared),
            ("output_lost", self.output_lost),
            ("recording_lost", self.recording_lost),
            ("api_rows_dropped", self.api_dropped),
        ];
        rows.extend(
            optional
                .into_iter()
                .filter(|&(_, v)| v != 0)
                .map(|(k, v)| (k, v, String::new())),
        );
        if let Some(lost) = self.lost_samples {
            rows.push(("lost_samples", lost, String::new()));
        }
        if let Some(f) = &self.flight {
            rows.push(("dumps", f.dumps, flight_note(f)));
        }
        rows.extend(
            self.unreported
                .iter()
                .filter(|&(_, &v)| v != 0)
                .map(|(&k, &v)| (k, v, String::new())),
        );
        // Not known (a recording without its trailer): `?`, not a 0 that reads as "none".
        rows.into_iter()
            .map(|(label, value, note)| {
                if self.kernel_unknown && matches!(label, "dropped" | "read_failed") {
                    let why = "(unknown: the recording ends without its trailer)";
                    (label, "?".to_string(), why.to_string())
                } else {
                    (label, value.to_string(), note)
                }
            })
            .collect()
    }

    /// The per-process table of [`render_text`](Self::render_text).
    fn render_processes(&self, out: &mut String) {
        if self.processes.is_empty() {
            return;
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "{:<8} {:<16} {:>9} {:>8} {:>12} {:>7} {:>11} {:>12}",
            "PID",
            "COMM",
            "TASK_INIT",
            "SCHEDULE",
            "SCHED_UPDATE",
            "PREEMPT",
            "WORK_SUBMIT",
            "TASK_DESTROY"
        );
        for (pid, p) in self.processes() {
            let _ = writeln!(
                out,
                "{:<8} {:<16} {:>9} {:>8} {:>12} {:>7} {:>11} {:>12}",
                pid,
                crate::event::Comm(&p.comm),
                p.task_init,
                p.schedule,
                p.sched_update,
                p.preempt,
                p.work_submit,
                p.task_destroy
            );
        }
    }

    /// `--api`: the API calls table of [`render_text`](Self::render_text) (the rows of each
    /// process together), only when there is a row; then the interposers' verdicts and the
    /// hand-outs per process, when there are some.
    fn render_api(&self, out: &mut String) {
        if !self.api.is_empty() {
            out.push('\n');
            let rows: Vec<CallStats> = self.api.values().cloned().collect();
            out.push_str(&crate::api::stats::text("API calls:", &rows));
        }
        if !self.api_paths.is_empty() {
            out.push_str("\nAPI interposers (on the path or bypassed):\n");
            for p in self.api_paths.values() {
                let _ = writeln!(out, "  {}", p.text());
            }
        }
        if !self.handouts.is_empty() {
            out.push_str("\nAPI hand-outs (lookups that answered with a GPU API entry point):\n");
            for (pid, tally) in &self.handouts {
                let _ = write!(out, "  pid {pid}: {}, hidden {}", tally.count, tally.hidden);
                for (i, h) in tally.shown.iter().enumerate() {
                    let lib = h.library.as_deref().unwrap_or("?");
                    let lib = lib.rsplit('/').next().unwrap_or(lib);
                    let sep = if i == 0 { ": " } else { ", " };
                    let _ = write!(
                        out,
                        "{sep}{} -> {}",
                        escape_text(&h.symbol),
                        escape_text(lib)
                    );
                    if let Some(f) = &h.function {
                        let _ = write!(out, " ({})", escape_text(f));
                    }
                }
                out.push('\n');
            }
        }
    }

    /// The per-container / pod table of [`render_text`](Self::render_text).
    fn render_groups(&self, out: &mut String) {
        let groups = self.groups();
        if groups.is_empty() {
            return;
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "{:<60} {:>5} {:>9} {:>8} {:>12} {:>11} {:>12}",
            "CONTAINER / POD",
            "PROCS",
            "TASK_INIT",
            "SCHEDULE",
            "SCHED_UPDATE",
            "WORK_SUBMIT",
            "TASK_DESTROY"
        );
        for (group, n, p) in groups {
            let _ = writeln!(
                out,
                "{:<60} {:>5} {:>9} {:>8} {:>12} {:>11} {:>12}",
                group.unwrap_or("(not in a container)"),
                n,
                p.task_init,
                p.schedule,
                p.sched_update,
                p.work_submit,
                p.task_destroy
            );
        }
    }

    /// `-v`: the kernel side's diagnostics.
    fn render_diagnostics(&self, out: &mut String) {
        out.push_str("\ndiagnostics (kernel side)\n");
        let mut rows = vec![
            ("emitted", self.kernel.emitted, String::new()),
            ("ignored", self.kernel.ignored, String::new()),
        ];
        // The deny counters when known and 0 (not zero: printed above), so that -v tells a
        // 0 from "not known" (a recording made before they were counted).
        for (label, value) in [
            ("denied_unread", self.kernel.denied_unread),
            ("deny_unfollowed", self.kernel.deny_unfollowed),
        ] {
            if value == Some(0) {
                rows.push((label, 0, String::new()));
            }
        }
        write_rows(out, &rows);
    }

    /// The engine, concurrency and task tables of [`render_text`](Self::render_text).
    fn render_tasks(&self, out: &mut String) {
        if !self.engines.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<14} {:>5} {:>8} {:>12} {:>7}",
                "ENGINE", "TASKS", "SCHEDULE", "SCHED_UPDATE", "PREEMPT"
            );
            for (name, e) in self.engines() {
                let _ = writeln!(
                    out,
                    "{:<14} {:>5} {:>8} {:>12} {:>7}",
                    name, e.task_init, e.schedule, e.sched_update, e.preempt
                );
            }
        }
        if !self.gpus.is_empty() {
            let _ = writeln!(out, "\n{:<4} {:<7} {:>8}", "GPU", "RUNLIST", "MAX_LIVE");
            let opt = |v: Option<u32>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
            for (gpu, c) in self.gpu_concurrency() {
                // The GPU as users name it (nvidia-smi's index, `?` where not known; AMD's
                // gpu_id), then its UUID where known.
                let shown = opt(self.shown_gpu(gpu));
                let uuid = gpu
                    .and_then(|g| self.gpu_names.get(&g))
                    .and_then(|(_, uuid)| uuid.as_deref())
                    .map_or_else(String::new, |u| format!("   {u}"));
                let _ = writeln!(out, "{shown:<4} {:<7} {:>8}{uuid}", "*", c.max_live);
                for ((_, r), c) in self.runlist_concurrency().filter(|((g, _), _)| *g == gpu) {
                    let _ = writeln!(out, "{shown:<4} {:<7} {:>8}", r, c.max_live);
                }
            }
        }
        let total = self.ended_tasks.len() + self.live_tasks.len();
        if total == 0 {
            return;
        }
        let ms = |v: Option<u64>| {
            v.map_or_else(
                || "-".to_string(),
                |ns| format!("{}.{:03}", ns / 1_000_000, (ns / 1_000) % 1_000),
            )
        };
        let _ = writeln!(
            out,
            "\n{:<29} {:<10} {:>9} {:>9} {:>9} {:>9} {:<10} {:>7} {:>7} END",
            "TASK",
            "ENGINE",
            "LIFE_MS",
            "SCHED_MS",
            "SUBMIT_MS",
            "TIMESLICE",
            "INTERLEAVE",
            "PREEMPT",
            "CHANGES"
        );
        for t in self.tasks().take(MAX_TASKS_PRINTED) {
            let interleave = t.interleave.map_or("-", |i| match i {
                Interleave::Low => "LOW",
                Interleave::Medium => "MEDIUM",
                Interleave::High => "HIGH",
            });
            let end = t.end_cause.map_or_else(
                || "alive".to_string(),
                |c| {
                    serde_json::to_value(c)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                },
            );
            let _ = writeln!(
                out,
                "{:<29} {:<10} {:>9} {:>9} {:>9} {:>9} {:<10} {:>7} {:>7} {end}",
                t.key.to_string(),
                t.engine.as_deref().unwrap_or("?"),
                ms(t.lifetime_ns()),
                ms(t.init_to_schedule_ns()),
                ms(t.init_to_submit_ns()),
                t.timeslice_us
                    .map_or_else(|| "-".to_string(), |v| v.to_string()),
                interleave,
                t.preemptions,
                t.param_changes,
            );
        }
        let more = total.saturating_sub(MAX_TASKS_PRINTED);
        if more > 0 {
            let _ = writeln!(out, "... {more} more tasks (--format json lists them)");
        }
        if self.tasks_omitted > 0 {
            let _ = writeln!(
                out,
                "({} events of tasks beyond the {MAX_TASKS_KEPT} ended / {MAX_LIVE_TASKS} live \
                 ({MAX_LIVE_TASKS_PER_PROCESS} per process) ones followed are not in this table)",
                self.tasks_omitted
            );
        }
    }
}

/// `label value note` rows, values right-aligned to a common width (at least 4).
fn write_rows<V: std::fmt::Display>(out: &mut String, rows: &[(&str, V, String)]) {
    let width = rows
        .iter()
        .map(|(_, v, _)| v.to_string().len())
        .max()
        .unwrap_or(0)
        .max(4);
    for (label, value, note) in rows {
        let line = format!("{label:<16} {value:>width$}   {note}");
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// The statistics block's note of the flight recorder: the triggers by name, what was not
/// written.
fn flight_note(f: &crate::model::stats::FlightStats) -> String {
    let triggers: Vec<String> = (f.triggers.iter())
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    format!(
        "(flight recorder; triggers: {}; not written {} (--dump-max-per-hour); failed {})",
        if triggers.is_empty() {
            "none".to_string()
        } else {
            triggers.join(", ")
        },
        f.not_written,
        f.failed
    )
}
