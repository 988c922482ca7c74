//! `--flight-recorder`: the core's window of the last records ([`FlightWindow`]), the triggers
//! the live loop sees (SIGUSR1, the pipeline's [`TriggerSink`], the kernel's `dropped`, `-- CMD`
//! ended by a signal), the hourly bound, and the dumps: written by the loop straight from the
//! window through a buffer to `DIR/.NAME.tmp` (no copy of the window in memory), renamed to
//! `DIR/NAME` once complete.

use std::{
    io::{BufWriter, Write},
    path::PathBuf,
    time::Instant,
};

use gpu_trace_core::flight::{
    FlightStats, FlightWindow, HourlyBound, Trigger, TriggerSink, Triggers, dump_name, dump_stamp,
    dumps_to_remove,
};
use gpu_trace_core::metrics::flight::FlightMetrics;

use super::{error::RunError, signals::note};
use crate::{cli::recording::RecordingArgs, loader::Tracer, record::RecordingHeader};
use gpu_trace_core::event::monotonic_ns;

/// The flight recorder of a live run.
pub(super) struct Flight {
    window: FlightWindow,
    header: RecordingHeader,
    dir: PathBuf,
    max_per_hour: u32,
    /// `--dump-keep`: this host's dumps left in `dir` at most.
    keep: Option<u32>,
    /// The names this run gave its dumps this second: a second dump in the same second must
    /// not take one (even one that failed, or that --dump-keep removed already).
    named: std::collections::HashSet<String>,
    bound: HourlyBound,
    started: Instant,
    /// Noted by the pipeline's [`TriggerSink`], SIGUSR1 and the loop's checks.
    pub(super) triggers: Triggers,
    wanted: Vec<Trigger>,
    stats: FlightStats,
    last_dropped: u64,
    /// `--metrics`: the counters the statistics' figures also go to as the run goes.
    pub(super) metrics: Option<FlightMetrics>,
}

impl Flight {
    /// The flight recorder `args` ask for (`None` without `--flight-recorder`), and the
    /// pipeline output that notices its event triggers.
    pub(super) fn new(
        args: &RecordingArgs,
        header: RecordingHeader,
    ) -> Option<(Self, Box<TriggerSink>)> {
        let window_s = args.flight_recorder?;
        let max_bytes =
            (args.flight_recorder_bytes).unwrap_or(crate::cli::recording::DEFAULT_FLIGHT_BYTES);
        let inventory = header.inventory.clone().unwrap_or_default();
        let wanted: Vec<Trigger> = std::iter::once(Trigger::Signal)
            .chain(args.dump_on.iter().map(|d| d.trigger()))
            .collect();
        let triggers = Triggers::default();
        let sink = Box::new(TriggerSink {
            triggers: triggers.clone(),
            wanted: wanted.clone(),
        });
        let flight = Self {
            window: FlightWindow::new(&inventory, (window_s * 1e9) as u64, max_bytes),
            header,
            dir: args.dump_dir.clone().unwrap_or_else(|| PathBuf::from(".")),
            max_per_hour: args.dump_max_per_hour,
            keep: args.dump_keep,
            named: std::collections::HashSet::new(),
            bound: HourlyBound::default(),
            started: Instant::now(),
            triggers,
            wanted,
            stats: FlightStats::default(),
            last_dropped: 0,
            metrics: None,
        };
        Some((flight, sink))
    }

    /// One record into the window.
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.window.push(bytes);
    }

    /// `t` came, when it is one of `--dump-on`'s (SIGUSR1 always is).
    pub(super) fn note(&self, t: Trigger) {
        if self.wanted.contains(&t) {
            self.triggers.note(t);
        }
    }

    /// A trigger waits to be served ([`Self::serve`]).
    pub(super) fn pending(&self) -> bool {
        self.triggers.pending()
    }

    /// Once a second: the kernel's counters for the dumps' trailers, and `dropped`'s growth.
    pub(super) fn tick(&mut self, tracer: &Tracer) {
        let Ok(c) = tracer.counters() else { return };
        self.window.note_counters(monotonic_ns(), c);
        if c.dropped > self.last_dropped {
            self.note(Trigger::Dropped);
        }
        self.last_dropped = c.dropped;
    }

    /// Serves the triggers that came: each counted, and dumped unless the hour's dumps were
    /// written already.
    pub(super) fn serve(&mut self, tracer: &Tracer) -> Result<(), RunError> {
        for t in self.triggers.take() {
            *self.stats.triggers.entry(t.name()).or_default() += 1;
            if let Some(m) = &self.metrics {
                m.trigger(t.name());
            }
            if !self
                .bound
                .allow(self.started.elapsed().as_secs_f64(), self.max_per_hour)
            {
                self.stats.not_written += 1;
                if let Some(m) = &self.metrics {
                    m.suppressed.inc();
                }
                crate::say!(
                    "gpu-trace: flight recorder: {} came, not dumped: {} dumps in the last \
                     hour already (--dump-max-per-hour)",
                    t.name(),
                    self.max_per_hour
                );
                continue;
            }
            self.dump(t, tracer)?;
        }
        Ok(())
    }

    /// Writes the window now, in the loop: straight from the window through a buffer to the
    /// temporary file, then renamed. No copy of the window is made (at the byte cap, a copy
    /// would double the flight recorder's memory). The loop reads no records meanwhile: the
    /// writes go to the page cache, by estimate tens of milliseconds for tens of MiB (not
    /// measured); what the ring cannot hold meanwhile is dropped and counted as ever.
    fn dump(&mut self, t: Trigger, tracer: &Tracer) -> Result<(), RunError> {
        let now = monotonic_ns();
        self.window.expire(now);
        let counters = tracer.counters()?;
        let utc = dump_stamp(&self.header, now);
        let mut name = dump_name(&self.header.host, &utc, t);
        // Two dumps of one trigger in one second: the second gets a number.
        self.named.retain(|n| n.contains(&utc));
        let mut n = 1;
        while self.named.contains(&name) || self.dir.join(&name).exists() {
            n += 1;
            name = dump_name(&self.header.host, &format!("{utc}-{n}"), t);
        }
        self.named.insert(name.clone());
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        note(format_args!(
            "flight recorder: {} came; writing the last {} records to {}",
            t.name(),
            self.window.len(),
            path.display()
        ));
        let written = std::fs::File::create(&tmp)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                (self.window)
                    .write(BufWriter::new(f), &self.header, counters, now)
                    .map_err(|e| e.to_string())
            })
            .and_then(|w| w.into_inner().map_err(|e| e.error().to_string()))
            .and_then(|mut f| f.flush().map_err(|e| e.to_string()))
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(|e| e.to_string()));
        match written {
            Ok(()) => {
                self.stats.dumps += 1;
                if let Some(m) = &self.metrics {
                    m.dumps.inc();
                }
                // After its rename: the newest `keep` are left, this one among them.
                if let Some(keep) = self.keep {
                    remove_oldest(&self.dir, &self.header.host, keep);
                }
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                self.stats.failed += 1;
                if let Some(m) = &self.metrics {
                    m.failed.inc();
                }
                crate::say!(
                    "gpu-trace: flight recorder: could not write {}: {e}; check that \
                     --dump-dir exists and has room (tracing goes on)",
                    path.display()
                );
            }
        }
        Ok(())
    }

    /// The end: returns the counts.
    pub(super) fn finish(self) -> FlightStats {
        self.stats
    }
}

/// `--dump-keep`: removes `host`'s oldest dumps in `dir` so that `keep` are left.
/// A failure is said on stderr; tracing goes on.
fn remove_oldest(dir: &std::path::Path, host: &str, keep: u32) {
    let names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => (entries.flatten())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(e) => {
            crate::say!(
                "gpu-trace: flight recorder: could not list {} for --dump-keep: {e}; older \
                 dumps stay (tracing goes on)",
                dir.display()
            );
            return;
        }
    };
    for name in dumps_to_remove(&names, host, keep as usize) {
        let path = dir.join(&name);
        // Gone already: someone else removed it.
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            crate::say!(
                "gpu-trace: flight recorder: could not remove {} (--dump-keep {keep}): {e}; \
                 check the directory's permissions (tracing goes on)",
                path.display()
            );
        }
    }
}
