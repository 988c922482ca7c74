//! Statistics of a trace: event counts, per-process counts, and the health counters of the
//! kernel side and of the userspace reader. Printed at the end of a trace
//! ([`Stats::render_text`], or `output::json::stats_json`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::model::event::{DestroyCause, Event, EventKind};

/// Counters kept by the kernel programs, read from their map at the end of the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelCounters {
    /// Records lost because the ring buffer was full.
    pub dropped: u64,
    /// Records sent without their driver arguments because reading user memory failed.
    pub read_failed: u64,
    /// Driver calls seen but not of interest (other ioctl commands, classes).
    pub ignored: u64,
    /// Records written to the ring buffer.
    pub emitted: u64,
    /// Calls whose file descriptor could not be resolved to its file.
    pub fd_lookup_failed: u64,
    /// Scheduling requests refused by `--deny-pid` (BPF LSM).
    #[serde(default)]
    pub denied: u64,
}

/// Event counts of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// The `comm` of the first event seen from the process.
    pub comm: String,
    /// `TASK_INIT` events.
    pub task_init: u64,
    /// `SCHEDULE` events, allowed or not.
    pub schedule: u64,
    /// `SCHEDULE` events the driver refused (`allowed=no`).
    pub schedule_refused: u64,
    /// `WORK_SUBMIT` events.
    pub work_submit: u64,
    /// `TASK_DESTROY` events.
    pub task_destroy: u64,
}

/// Statistics of a whole trace. The event counts come from [`Stats::record`]; the other
/// counters are set by whoever knows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `TASK_INIT` events.
    pub task_init: u64,
    /// `SCHEDULE` events, allowed or not.
    pub schedule: u64,
    /// `SCHEDULE` events the driver refused (`allowed=false`).
    pub schedule_refused: u64,
    /// `WORK_SUBMIT` events.
    pub work_submit: u64,
    /// `TASK_DESTROY` events (not counting [`DestroyCause::TracerExit`]).
    pub task_destroy: u64,
    /// Of [`task_destroy`](Self::task_destroy), those that were implicit (fd close, exit).
    pub task_destroy_implicit: u64,
    /// The kernel side's counters.
    pub kernel: KernelCounters,
    /// Records that userspace could not parse (short, unknown kind).
    pub malformed: u64,
    /// Driver calls whose arguments could not be decoded.
    pub decode_errors: u64,
    /// Objects still alive when tracing stopped. [`Stats::record`] counts the
    /// [`DestroyCause::TracerExit`] events here; set it directly only if those are not recorded.
    pub live_at_exit: u64,
    /// Samples the ring buffer reader reports lost, if it reports any. Live runs: records the
    /// kernel counted as sent (`emitted`) that userspace never read (0 since the shutdown
    /// drains the ring after detaching; `Some` only when not 0).
    pub lost_samples: Option<u64>,
    /// Output lines (standard output or `-o`) dropped because the reader did not keep up.
    pub output_lost: u64,
    /// Records of `--record` dropped because the recording's reader did not keep up.
    pub recording_lost: u64,
    /// Driver calls of interest that produced no event, by reason (e.g. `schedule_disable`,
    /// `schedule_unreadable`, `unknown_handle`): set from the trackers' counters at the end, so
    /// that nothing the tracer saw disappears without a count. Zero entries are left out.
    pub unreported: std::collections::BTreeMap<&'static str, u64>,
    /// How long the trace ran; when `None`, the span from the first to the last event is shown.
    pub elapsed: Option<Duration>,
    first_ts_ns: Option<u64>,
    last_ts_ns: Option<u64>,
    processes: BTreeMap<u32, ProcessStats>,
}

impl Stats {
    /// Empty statistics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one event.
    pub fn record(&mut self, ev: &Event) {
        if let EventKind::TaskDestroy {
            cause: DestroyCause::TracerExit,
            ..
        } = ev.kind
        {
            self.live_at_exit += 1;
            return;
        }
        let ts = ev.origin.ts_ns;
        self.first_ts_ns = Some(self.first_ts_ns.map_or(ts, |t| t.min(ts)));
        self.last_ts_ns = Some(self.last_ts_ns.map_or(ts, |t| t.max(ts)));
        let proc = self
            .processes
            .entry(ev.origin.pid)
            .or_insert_with(|| ProcessStats {
                comm: ev.origin.comm.clone(),
                ..ProcessStats::default()
            });
        match ev.kind {
            EventKind::TaskInit { .. } => {
                self.task_init += 1;
                proc.task_init += 1;
            }
            EventKind::Schedule { allowed, .. } => {
                self.schedule += 1;
                proc.schedule += 1;
                if !allowed {
                    self.schedule_refused += 1;
                    proc.schedule_refused += 1;
                }
            }
            EventKind::WorkSubmit { .. } => {
                self.work_submit += 1;
                proc.work_submit += 1;
            }
            EventKind::TaskDestroy { implicit, .. } => {
                self.task_destroy += 1;
                proc.task_destroy += 1;
                if implicit {
                    self.task_destroy_implicit += 1;
                }
            }
        }
    }

    /// All events counted by [`record`](Self::record) (not the tracer-exit ones).
    pub fn events(&self) -> u64 {
        self.task_init + self.schedule + self.work_submit + self.task_destroy
    }

    /// The per-process counts, by ascending pid.
    pub fn processes(&self) -> impl Iterator<Item = (u32, &ProcessStats)> {
        self.processes.iter().map(|(&pid, p)| (pid, p))
    }

    /// The counts of one process.
    pub fn process(&self, pid: u32) -> Option<&ProcessStats> {
        self.processes.get(&pid)
    }

    /// [`elapsed`](Self::elapsed), else the span between the first and the last event recorded
    /// (zero without events).
    pub fn duration(&self) -> Duration {
        self.elapsed
            .unwrap_or_else(|| match (self.first_ts_ns, self.last_ts_ns) {
                (Some(first), Some(last)) => Duration::from_nanos(last - first),
                _ => Duration::ZERO,
            })
    }

    /// The statistics block printed at the end of a text trace (ends with a newline).
    ///
    /// ```text
    /// --- gpu-trace statistics (12.3 s) ---
    /// task_init           4
    /// schedule            4   (refused 0)
    /// work_submit        20
    /// task_destroy        4   (implicit 4)
    /// dropped             0
    /// read_failed         0
    ///
    /// PID      COMM             TASK_INIT SCHEDULE WORK_SUBMIT TASK_DESTROY
    /// 637320   python3                  4        4          20            4
    /// ```
    ///
    /// The event counts, `dropped` and `read_failed` are always printed; the other counters only
    /// when not zero (`lost_samples` when reported).
    pub fn render_text(&self) -> String {
        let mut rows: Vec<(&str, u64, String)> = vec![
            ("task_init", self.task_init, String::new()),
            (
                "schedule",
                self.schedule,
                format!("(refused {})", self.schedule_refused),
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
            ("emitted", self.kernel.emitted),
            ("ignored", self.kernel.ignored),
            ("fd_lookup_failed", self.kernel.fd_lookup_failed),
            ("denied", self.kernel.denied),
            ("malformed", self.malformed),
            ("decode_errors", self.decode_errors),
            ("live_at_exit", self.live_at_exit),
            ("output_lost", self.output_lost),
            ("recording_lost", self.recording_lost),
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
        rows.extend(
            self.unreported
                .iter()
                .filter(|&(_, &v)| v != 0)
                .map(|(&k, &v)| (k, v, String::new())),
        );
        let width = rows
            .iter()
            .map(|(_, v, _)| v.to_string().len())
            .max()
            .unwrap_or(0)
            .max(4);

        let mut out = String::new();
        let _ = writeln!(
            out,
            "--- gpu-trace statistics ({:.1} s) ---",
            self.duration().as_secs_f64()
        );
        for (label, value, note) in &rows {
            let line = format!("{label:<16} {value:>width$}   {note}");
            let _ = writeln!(out, "{}", line.trim_end());
        }
        if self.kernel.dropped > 0 {
            let _ = writeln!(
                out,
                "warning: {} events were dropped because the ring buffer was full; \
                 raise --ring-size",
                self.kernel.dropped
            );
        }
        if !self.processes.is_empty() {
            out.push('\n');
            let _ = writeln!(
                out,
                "{:<8} {:<16} {:>9} {:>8} {:>11} {:>12}",
                "PID", "COMM", "TASK_INIT", "SCHEDULE", "WORK_SUBMIT", "TASK_DESTROY"
            );
            for (pid, p) in self.processes() {
                let _ = writeln!(
                    out,
                    "{:<8} {:<16} {:>9} {:>8} {:>11} {:>12}",
                    pid,
                    crate::output::escape::escape_text(&p.comm),
                    p.task_init,
                    p.schedule,
                    p.work_submit,
                    p.task_destroy
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Origin, TaskId, ValueSource};

    fn ev(ts_ns: u64, pid: u32, comm: &str, kind: EventKind) -> Event {
        Event {
            amd: None,
            origin: Origin {
                ts_ns,
                cpu: 0,
                pid,
                tid: pid,
                comm: comm.to_string(),
            },
            kind,
        }
    }

    fn init() -> EventKind {
        EventKind::TaskInit {
            task: TaskId::HwTsg(1),
            client: 1,
            engine: None,
            engine_type: None,
            timeslice_us: None,
            timeslice_source: ValueSource::DriverDefault,
            interleave: None,
            interleave_source: ValueSource::DriverDefault,
            runlist: None,
            gpu: None,
        }
    }

    fn schedule(allowed: bool) -> EventKind {
        EventKind::Schedule {
            task: TaskId::HwTsg(1),
            client: 1,
            channels: None,
            timeslice_us: None,
            interleave: None,
            allowed,
            rm_status: Some(if allowed { 0 } else { 0x1f }),
            errno: 0,
            via_channel: false,
        }
    }

    fn submit() -> EventKind {
        EventKind::WorkSubmit {
            task: TaskId::HwTsg(1),
            client: 1,
            channel_handle: 2,
            chid: None,
            runlist: None,
            token: 3,
            gpu: None,
        }
    }

    fn destroy(cause: DestroyCause) -> EventKind {
        EventKind::TaskDestroy {
            task: TaskId::HwTsg(1),
            client: 1,
            cause,
            implicit: cause.is_implicit(),
        }
    }

    /// python3 (pid 637320): 4 inits, 4 schedules, 20 submits, 4 implicit destroys, over
    /// 12.3 s; other (pid 42): one refused schedule and one explicit destroy.
    fn sample() -> Stats {
        let mut s = Stats::new();
        let base = 1_000_000_000_000;
        let mut t = base;
        for _ in 0..4 {
            s.record(&ev(t, 637320, "python3", init()));
            s.record(&ev(t + 1, 637320, "python3", schedule(true)));
            for _ in 0..5 {
                s.record(&ev(t + 2, 637320, "pt_main_thread", submit()));
            }
            t += 1_000;
        }
        for _ in 0..4 {
            s.record(&ev(
                base + 12_300_000_000,
                637320,
                "cuda-EvtHandlr",
                destroy(DestroyCause::ProcessExit),
            ));
        }
        s.record(&ev(base + 5, 42, "other", schedule(false)));
        s.record(&ev(base + 6, 42, "other", destroy(DestroyCause::Free)));
        s
    }

    #[test]
    fn unreported_calls_are_printed_by_reason_only_when_non_zero() {
        let mut stats = Stats::new();
        stats.unreported.insert("schedule_disable", 2);
        stats.unreported.insert("unknown_handle", 0);
        let text = stats.render_text();
        let line = text
            .lines()
            .find(|l| l.starts_with("schedule_disable"))
            .expect(&text);
        assert!(line.trim_end().ends_with(" 2"), "{line}");
        assert!(!text.contains("unknown_handle"), "{text}");
    }

    #[test]
    fn counts_events_and_processes() {
        let s = sample();
        assert_eq!(s.task_init, 4);
        assert_eq!(s.schedule, 5);
        assert_eq!(s.schedule_refused, 1);
        assert_eq!(s.work_submit, 20);
        assert_eq!(s.task_destroy, 5);
        assert_eq!(s.task_destroy_implicit, 4);
        assert_eq!(s.events(), 34);
        assert_eq!(s.live_at_exit, 0);
        let p = s.process(637320).unwrap();
        assert_eq!(p.comm, "python3", "first seen comm is kept");
        assert_eq!((p.task_init, p.schedule, p.schedule_refused), (4, 4, 0));
        assert_eq!((p.work_submit, p.task_destroy), (20, 4));
        let o = s.process(42).unwrap();
        assert_eq!((o.schedule, o.schedule_refused, o.task_destroy), (1, 1, 1));
        let pids: Vec<u32> = s.processes().map(|(pid, _)| pid).collect();
        assert_eq!(pids, [42, 637320]);
        assert_eq!(s.duration(), Duration::from_nanos(12_300_000_000));
    }

    #[test]
    fn tracer_exit_counts_as_live_at_exit() {
        let mut s = Stats::new();
        s.record(&ev(1, 7, "a", destroy(DestroyCause::TracerExit)));
        assert_eq!(s.task_destroy, 0);
        assert_eq!(s.live_at_exit, 1);
        assert!(s.process(7).is_none());
        assert_eq!(s.duration(), Duration::ZERO);
    }

    #[test]
    fn renders_the_block() {
        let s = sample();
        let expected = "\
--- gpu-trace statistics (12.3 s) ---
task_init           4
schedule            5   (refused 1)
work_submit        20
task_destroy        5   (implicit 4)
dropped             0
read_failed         0

PID      COMM             TASK_INIT SCHEDULE WORK_SUBMIT TASK_DESTROY
42       other                    0        1           0            1
637320   python3                  4        4          20            4
";
        assert_eq!(s.render_text(), expected);
    }

    #[test]
    fn renders_optional_counters_and_drop_warning() {
        let mut s = Stats {
            elapsed: Some(Duration::from_millis(2_040)),
            malformed: 2,
            decode_errors: 3,
            live_at_exit: 4,
            lost_samples: Some(0),
            ..Stats::default()
        };
        s.kernel = KernelCounters {
            dropped: 123_456,
            read_failed: 1,
            ignored: 9,
            emitted: 1_000_000,
            fd_lookup_failed: 5,
            denied: 0,
        };
        let text = s.render_text();
        let expected = "\
--- gpu-trace statistics (2.0 s) ---
task_init              0
schedule               0   (refused 0)
work_submit            0
task_destroy           0   (implicit 0)
dropped           123456
read_failed            1
emitted          1000000
ignored                9
fd_lookup_failed       5
malformed              2
decode_errors          3
live_at_exit           4
lost_samples           0
warning: 123456 events were dropped because the ring buffer was full; raise --ring-size
";
        assert_eq!(text, expected);
    }

    #[test]
    fn empty_stats_still_print_dropped_and_read_failed() {
        let text = Stats::new().render_text();
        assert!(text.starts_with("--- gpu-trace statistics (0.0 s) ---\n"));
        assert!(text.contains("\ndropped             0\n"), "{text}");
        assert!(text.contains("\nread_failed         0\n"), "{text}");
        assert!(!text.contains("PID"));
        assert!(!text.contains("ring-size"));
        assert!(text.lines().all(|l| l.trim_end() == l));
    }
}
