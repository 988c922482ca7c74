//! Start-up attach progress on stderr (issue 41, item 5): attaching that runs past a second
//! (PyTorch's runtimes with perf-event uprobes, hundreds of processes under `--comm`) says how
//! far it got, a line each second, in both commands (`gpu-trace api`, the main trace's
//! `--api`); not under `-q`. The line after the attach (probes, libraries, processes, time)
//! is each command's own.

use std::time::{Duration, Instant};

/// Progress lines start after this much attaching, then come this often.
pub const EVERY: Duration = Duration::from_secs(1);

/// Test-only: attach progress from the first probe on ([`after`]), so that a test sees the
/// line without an attach that lasts a second.
pub const AT_ONCE_ENV: &str = "GPU_TRACE_TEST_PROGRESS_AT_ONCE";

/// When the first line is due: [`EVERY`], or at once where [`AT_ONCE_ENV`] is set (a test
/// variable: [`crate::test_var`]).
pub fn after() -> Duration {
    if crate::test_var(AT_ONCE_ENV).is_some() {
        Duration::ZERO
    } else {
        EVERY
    }
}

/// One start-up attach as it goes: when it began, when the next line is due, the target
/// processes read of those known.
pub struct Progress {
    /// The command's prefix on stderr (`api`, `--api`).
    who: &'static str,
    started: Instant,
    next: Instant,
    /// Target processes read, of those known so far (0 of 0: the command before its exec).
    read: usize,
    targets: usize,
}

impl Progress {
    /// Attaching began at `now`; the first line is due `after` it.
    pub fn new(who: &'static str, now: Instant, after: Duration) -> Self {
        Self {
            who,
            started: now,
            next: now + after,
            read: 0,
            targets: 0,
        }
    }

    /// `n` more target processes to read.
    pub fn targets(&mut self, n: usize) {
        self.targets += n;
    }

    /// One more target process read.
    pub fn read_one(&mut self) {
        self.read += 1;
    }

    /// Whether a line is due at `now` (then the next one is due a second later).
    pub fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + EVERY;
        true
    }

    /// The line at `now`, with the libraries and probes attached so far.
    pub fn line(&self, now: Instant, libraries: usize, probes: usize) -> String {
        let read = if self.targets > 0 {
            format!(
                ", {} of {} target process(es) read",
                self.read, self.targets
            )
        } else {
            String::new()
        };
        format!(
            "gpu-trace: {}: attaching: {libraries} librar{}, {probes} uprobes so far{read} ({} s)",
            self.who,
            if libraries == 1 { "y" } else { "ies" },
            now.saturating_duration_since(self.started).as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_due_past_the_threshold_then_each_second() {
        let t0 = Instant::now();
        let mut p = Progress::new("api", t0, EVERY);
        assert!(!p.due(t0));
        assert!(!p.due(t0 + Duration::from_millis(999)));
        assert!(p.due(t0 + Duration::from_millis(1000)));
        assert!(!p.due(t0 + Duration::from_millis(1500)));
        assert!(p.due(t0 + Duration::from_millis(2000)));
    }

    #[test]
    fn a_threshold_of_zero_is_due_at_the_first_probe() {
        let t0 = Instant::now();
        let mut p = Progress::new("--api", t0, Duration::ZERO);
        assert!(p.due(t0));
        assert!(!p.due(t0));
    }

    #[test]
    fn the_line_says_libraries_probes_processes_and_time() {
        let t0 = Instant::now();
        let mut p = Progress::new("api", t0, EVERY);
        assert_eq!(
            p.line(t0 + Duration::from_millis(1200), 1, 200),
            "gpu-trace: api: attaching: 1 library, 200 uprobes so far (1 s)"
        );
        p.targets(12);
        p.read_one();
        p.read_one();
        assert_eq!(
            p.line(t0 + Duration::from_secs(3), 2, 900),
            "gpu-trace: api: attaching: 2 libraries, 900 uprobes so far, 2 of 12 target \
             process(es) read (3 s)"
        );
    }
}
