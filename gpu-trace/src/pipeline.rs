//! Records in, text or JSON out: parse → decode → track → filter → print, and statistics.
//! Pure with respect to the kernel: live runs and `replay` share it, so a replay prints what the
//! live run printed.

use std::{collections::HashMap, io::Write, time::Duration};

use crate::{
    amd::decode::{self as amd_decode, KfdCall},
    cli::{Format, Timestamps},
    metrics::Metrics,
    model::{
        amd::{KfdInput, KfdTracker},
        event::Event,
        nvidia::{NvInput, NvTracker},
        stats::{KernelCounters, Stats},
    },
    nvidia::decode::{self, RmCall},
    output::{
        clock::Clock,
        json,
        perfetto::PerfettoWriter,
        text::{TextFormatter, TimestampMode},
    },
    session::Summary,
    wire::{self, RawRecord},
};

/// What to show and how.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub verbose: bool,
    /// Only these processes (empty: all).
    pub pids: Vec<u32>,
    /// Only these thread or process names (empty: all).
    pub comms: Vec<String>,
    pub format: Format,
    pub timestamps: Timestamps,
    /// Print the statistics block at the end.
    pub stats: bool,
    pub clock: Clock,
}

pub struct Pipeline<W: Write> {
    config: PipelineConfig,
    text: TextFormatter,
    tracker: NvTracker,
    /// AMD KFD queues (records of kind `KFD_IOCTL`; process exits go to both trackers).
    amd: KfdTracker,
    stats: Stats,
    /// First `comm` seen per process: `--comm` matches it as the process name, so that a
    /// process's events from other threads (e.g. `cuda-EvtHandlr`) are kept.
    process_names: HashMap<u32, String>,
    first_ts: Option<u64>,
    last_ts: Option<u64>,
    out: W,
    /// `--perfetto`: the timeline, written alongside the output.
    perfetto: Option<PerfettoWriter<Box<dyn Write>>>,
    /// `--metrics`: the same events as Prometheus metrics.
    metrics: Option<Metrics>,
}

impl<W: Write> Pipeline<W> {
    pub fn new(config: PipelineConfig, out: W) -> Self {
        let text = TextFormatter {
            timestamps: match config.timestamps {
                Timestamps::Wall => TimestampMode::Wall,
                Timestamps::Relative => TimestampMode::Relative,
            },
            verbose: config.verbose,
        };
        Self {
            config,
            text,
            tracker: NvTracker::default(),
            amd: KfdTracker::default(),
            stats: Stats::new(),
            process_names: HashMap::new(),
            first_ts: None,
            last_ts: None,
            out,
            perfetto: None,
            metrics: None,
        }
    }

    /// Also counts every selected event in `metrics` (`--metrics`).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The metrics, when `--metrics` is on (the live loop refreshes the kernel's counters).
    pub fn metrics_mut(&mut self) -> Option<&mut Metrics> {
        self.metrics.as_mut()
    }

    /// Also writes every selected event to a Perfetto timeline (`--perfetto`).
    pub fn with_perfetto(mut self, writer: PerfettoWriter<Box<dyn Write>>) -> Self {
        self.perfetto = Some(writer);
        self
    }

    /// Feeds one ring-buffer record; prints the events it produces.
    pub fn feed(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let record = match wire::parse_record(bytes) {
            Ok(r) => r,
            Err(_) => {
                self.stats.malformed += 1;
                return Ok(());
            }
        };
        let origin = record.origin();
        self.first_ts.get_or_insert(origin.ts_ns);
        self.last_ts = Some(origin.ts_ns);
        self.process_names
            .entry(origin.pid)
            .or_insert_with(|| origin.comm.clone());
        let input = match record {
            RawRecord::NvIoctl(rec) => {
                let call = decode::decode(&rec);
                if matches!(call, RmCall::Malformed { .. }) {
                    self.stats.decode_errors += 1;
                }
                NvInput::Call {
                    fd: decode::fd(&rec),
                    errno: decode::errno(&rec),
                    call,
                }
            }
            RawRecord::ProcessExit(_) => NvInput::ProcessExit,
            RawRecord::FdClose(t) => NvInput::FdClose { fd: t.value },
            RawRecord::NvSched(rec) => NvInput::Sched(crate::nvidia::gpu_ext::decode(&rec)),
            RawRecord::KfdIoctl(rec) => {
                let call = amd_decode::decode(&rec);
                if matches!(call, KfdCall::Malformed { .. }) {
                    self.stats.decode_errors += 1;
                }
                let input = KfdInput::Call {
                    fd: amd_decode::fd(&rec),
                    errno: amd_decode::errno(&rec),
                    call,
                };
                let events = self.amd.observe(origin, input);
                return self.emit_selected(&events);
            }
            RawRecord::KfdQueue(rec) => {
                let events = self
                    .amd
                    .observe(origin, KfdInput::QueueBuilt(amd_decode::decode_queue(&rec)));
                return self.emit_selected(&events);
            }
            RawRecord::Deep(rec) => {
                let events = self
                    .amd
                    .observe(origin, KfdInput::Deep(amd_decode::decode_deep(&rec)));
                return self.emit_selected(&events);
            }
        };
        let pid = origin.pid;
        let exit_origin = matches!(record, RawRecord::ProcessExit(_)).then(|| origin.clone());
        let mut events = self.tracker.observe(origin, input);
        if let Some(o) = exit_origin {
            // The process's KFD queues end with it too (after its NVIDIA TSGs).
            events.extend(self.amd.observe(o, KfdInput::ProcessExit));
        }
        for event in &events {
            if self.selected(event) {
                self.emit(event)?;
            }
        }
        if matches!(record, RawRecord::ProcessExit(_)) {
            self.process_names.remove(&pid);
        }
        Ok(())
    }

    /// Emits the events that pass the filters.
    fn emit_selected(&mut self, events: &[Event]) -> std::io::Result<()> {
        for event in events {
            if self.selected(event) {
                self.emit(event)?;
            }
        }
        Ok(())
    }

    fn selected(&self, event: &Event) -> bool {
        let o = &event.origin;
        let pid_ok = self.config.pids.is_empty() || self.config.pids.contains(&o.pid);
        let comm_ok = self.config.comms.is_empty()
            || self.config.comms.iter().any(|c| {
                *c == o.comm || self.process_names.get(&o.pid).is_some_and(|name| name == c)
            });
        pid_ok && comm_ok
    }

    fn emit(&mut self, event: &Event) -> std::io::Result<()> {
        self.stats.record(event);
        let name = self
            .process_names
            .get(&event.origin.pid)
            .map_or(event.origin.comm.as_str(), String::as_str);
        if let Some(metrics) = self.metrics.as_mut() {
            metrics.observe(event, name, None);
        }
        if let Some(perfetto) = self.perfetto.as_mut() {
            perfetto.event(event, name, self.first_ts.unwrap_or(event.origin.ts_ns))?;
        }
        let line = match self.config.format {
            Format::Text => self.text.format_event(event, &self.config.clock),
            Format::Json => Some(json::event_json(event, &self.config.clock)),
        };
        if let Some(line) = line {
            writeln!(self.out, "{line}")?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        if let Some(metrics) = self.metrics.as_mut() {
            metrics.sync_stats(&self.stats);
        }
        self.out.flush()
    }

    /// Time between the first and the last record seen.
    pub fn span(&self) -> Duration {
        match (self.first_ts, self.last_ts) {
            (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
            _ => Duration::ZERO,
        }
    }

    /// Ends the run: prints the statistics (with the kernel's counters) and returns the summary.
    pub fn finish(
        mut self,
        counters: KernelCounters,
        duration: Duration,
    ) -> std::io::Result<Summary> {
        self.stats.kernel = counters;
        self.stats.elapsed = Some(duration);
        if let Some(metrics) = self.metrics.as_mut() {
            metrics.set_kernel(&counters);
            metrics.sync_stats(&self.stats);
        }
        self.stats.live_at_exit = (self.tracker.live_tasks() + self.amd.live_tasks()) as u64;
        let nv = self.tracker.counters();
        let kfd = self.amd.counters();
        self.stats.unreported = [
            ("schedule_disable", nv.schedule_disable),
            ("schedule_unreadable", nv.schedule_unreadable),
            ("unreadable_params", nv.unreadable_params),
            ("unknown_handle", nv.unknown_handle),
            ("replaced_handles", nv.replaced_handles),
            ("failed_tsg_allocs", nv.failed_tsg_allocs),
            ("unknown_queue", kfd.unknown_queue),
            ("replaced_queues", kfd.replaced_queues),
            ("deep_unmatched", kfd.deep_unmatched),
            ("gpu_ext_unmatched", nv.gpu_ext_unmatched),
            ("gpu_ext_outside_ioctl", nv.gpu_ext_outside_ioctl),
            ("deep_unknown", kfd.deep_unknown),
            ("kfd_release_no_queues", kfd.kfd_releases_without_queues),
        ]
        .into_iter()
        .filter(|&(_, v)| v != 0)
        .collect();
        if let Some(perfetto) = self.perfetto.take() {
            let other = [
                ("tool", format!("gpu-trace {}", env!("CARGO_PKG_VERSION"))),
                ("clock", "CLOCK_MONOTONIC (ts in microseconds)".to_string()),
                (
                    "realtime_offset_ns",
                    self.config.clock.offset_ns().to_string(),
                ),
                ("dropped", counters.dropped.to_string()),
            ];
            perfetto.finish(self.last_ts.unwrap_or(0), &other)?;
        }
        if self.config.stats {
            match self.config.format {
                Format::Text => write!(self.out, "{}", self.stats.render_text())?,
                Format::Json => writeln!(self.out, "{}", json::stats_json(&self.stats))?,
            }
        }
        self.out.flush()?;
        Ok(Summary {
            events: self.stats.events(),
            dropped: counters.dropped,
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}
