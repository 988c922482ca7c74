//! The human-readable output: one line per event.
//!
//! ```text
//! 23:00:24.561798 [CPU01] TASK_INIT    PID=637320 python3          TSG=1    engine=COPY     timeslice=1024 us interleave=UNKNOWN runlist=0
//! 23:00:24.591625 [CPU01] SCHEDULE     PID=637320 python3          TSG=1    channels=8 timeslice=1024 us interleave=LOW allowed=yes
//! 23:00:24.600000 [CPU01] WORK_SUBMIT  PID=637320 python3          TSG=1    channel=2 token=1073741826 gpu=0 runlist=0
//! 23:00:24.650000 [CPU01] SCHED_UPDATE PID=637320 python3          TSG=1    timeslice=1024 us -> 2048 us allowed=yes
//! 23:00:25.727580 [CPU01] TASK_DESTROY PID=637320 cuda-EvtHandlr   TSG=1    cause=process_exit (implicit)
//! ```
//!
//! A value that is not known prints as `?` (without its unit), except the interleave level of a
//! `TASK_INIT`, which prints as `UNKNOWN` (the allocation does not carry one). Lines carry no
//! trailing spaces. An NVIDIA `gpu=` is the GPU's index as `nvidia-smi` shows it (what `--gpu`
//! takes), `?` until the run knows which GPU the task's RM device instance is (the driver's own
//! number is in the JSON output only, `rm_device`). AMD KFD events keep the same columns, with the queue id in the TSG column,
//! and their own fields (their detail's section, `source::amd::render`). The line is a
//! frame (time, CPU, name, PID, thread, TSG column) around the record's sections
//! ([`crate::section`]): this module names no vendor and no record kind's fields.

use std::fmt::{Display, Write as _};

use chrono::{Local, TimeZone, Timelike};

use crate::event::Event;
use crate::event_section::EventFields;
use crate::model::gpus::GpuIdentity;
use crate::model::stats::Stats;
pub use crate::output::clock::Clock;
use crate::section::Section as _;
use crate::sink::{ApiEnriched, Enriched, RunEnd, ShareBatch, ShareEnriched, Sink, SinkError};

/// How the time at the start of each line is shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimestampMode {
    /// Local wall-clock time, `%H:%M:%S%.6f`.
    #[default]
    Wall,
    /// Seconds since the start of the trace (see [`Clock::relative_ns`]), right-aligned to the
    /// width of the wall-clock form.
    Relative,
}

/// Formats events as text lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextFormatter {
    /// Wall-clock or relative timestamps.
    pub timestamps: TimestampMode,
    /// Also print the `WORK_SUBMIT` events (one per channel, numerous).
    pub verbose: bool,
}

/// Width of the wall-clock timestamp (`23:00:24.561798`); relative ones are padded to it.
const TIME_WIDTH: usize = 15;

impl TextFormatter {
    /// The line for `ev` (no newline), or `None` when this formatter does not print it
    /// (`WORK_SUBMIT` unless [`verbose`](Self::verbose)). Wall-clock times are local time.
    pub fn format_event(&self, ev: &Event, clock: &Clock) -> Option<String> {
        self.format_event_in_tz(ev, clock, &Local)
    }

    /// Like [`format_event`](Self::format_event), with wall-clock times in the time zone `tz`.
    /// The GPU of the event is not known here: an NVIDIA `gpu=` prints `?` (see
    /// [`format_event_on`](Self::format_event_on)).
    pub fn format_event_in_tz<Tz>(&self, ev: &Event, clock: &Clock, tz: &Tz) -> Option<String>
    where
        Tz: TimeZone,
        Tz::Offset: Display,
    {
        self.format_event_on(ev, None, clock, tz)
    }

    /// Like [`format_event_in_tz`](Self::format_event_in_tz), for an event on GPU `gpu` (as the
    /// pipeline named it: its nvidia-smi index is what `gpu=` prints).
    pub fn format_event_on<Tz>(
        &self,
        ev: &Event,
        gpu: Option<&GpuIdentity>,
        clock: &Clock,
        tz: &Tz,
    ) -> Option<String>
    where
        Tz: TimeZone,
        Tz::Offset: Display,
    {
        let mut line = String::with_capacity(160);
        self.write_event_cached(ev, gpu, clock, tz, &mut line, &mut SecondCache::default())
            .then_some(line)
    }

    /// Appends the line for `ev` (no newline) to `line`; false (nothing appended) when this
    /// formatter does not print it. Wall-clock times in the time zone `tz`, the wall-clock
    /// second kept in `seconds` for the next line; `gpu` as in
    /// [`format_event_on`](Self::format_event_on).
    fn write_event_cached<Tz>(
        &self,
        ev: &Event,
        gpu: Option<&GpuIdentity>,
        clock: &Clock,
        tz: &Tz,
        line: &mut String,
        seconds: &mut SecondCache,
    ) -> bool
    where
        Tz: TimeZone,
        Tz::Offset: Display,
    {
        if ev.kind.verbose_only() && !self.verbose {
            return false;
        }
        let start = line.len();
        // ` [CPU{:02}] {:<12} PID={:<6} {:<16} TSG={:<4} `, without `write!` (the text line is
        // most of the text output's cost).
        let o = &ev.origin;
        self.write_head(line, clock, tz, seconds, o, ev.kind.name());
        line.push_str(" TSG=");
        push_left(line, ev.kind.task().label().as_str(), 4);
        line.push(' ');
        EventFields::new(ev, gpu).text(line);
        let end = start + line[start..].trim_end().len();
        line.truncate(end);
        if let Some(api) = &ev.api {
            api.text(line);
        }
        true
    }
}

impl TextFormatter {
    /// The columns every line starts with: the time, ` [CPUnn] `, the event's name padded to
    /// 12, ` PID=` padded to 6, and the thread's name (escaped) padded to 16.
    fn write_head<Tz: TimeZone<Offset: Display>>(
        &self,
        line: &mut String,
        clock: &Clock,
        tz: &Tz,
        seconds: &mut SecondCache,
        o: &crate::event::Origin,
        name: &str,
    ) {
        match self.timestamps {
            TimestampMode::Wall => write_wall(line, clock, tz, o.ts_ns, seconds),
            TimestampMode::Relative => {
                let rel = format_relative(clock.relative_ns(o.ts_ns));
                let _ = write!(line, "{rel:>TIME_WIDTH$}");
            }
        }
        match o.cpu() {
            Some(cpu) => {
                line.push_str(" [CPU");
                push_zero_padded(line, cpu, 2);
                line.push_str("] ");
            }
            None => line.push_str(" [CPU??] "),
        }
        push_left(line, name, 12);
        line.push_str(" PID=");
        push_left(line, itoa::Buffer::new().format(o.pid), 6);
        line.push(' ');
        push_left(line, &crate::escape::escape_text(&o.comm), 16);
    }

    /// Appends the line of an API record of the main trace (`gpu-trace --api`; no newline) in
    /// the driver lines' columns, the API fields in place of the TSG's:
    ///
    /// ```text
    /// 23:00:24.561798 [CPU01] API_CALL     PID=4242   python3          tid=4243 cuCtxCreate_v4@libcuda.so.1 = 0 <12.345 us> depth=1 caller=cudaMalloc@libcudart.so.12
    /// 23:00:24.561798 [CPU01] API_RECURSION PID=4242   python3          tid=4243 cuInit@shim.so why=re-entered depth=2 chain=cuInit@shim.so
    /// ```
    ///
    /// False (nothing appended) for a process's sums (`API_STATS`: the statistics print them).
    pub fn write_api<Tz: TimeZone<Offset: Display>>(
        &self,
        ev: &ApiEnriched<'_>,
        clock: &Clock,
        tz: &Tz,
        line: &mut String,
    ) -> bool {
        self.write_api_cached(ev, clock, tz, line, &mut SecondCache::default())
    }

    /// [`write_api`](Self::write_api), the wall-clock second kept in `seconds`.
    fn write_api_cached<Tz: TimeZone<Offset: Display>>(
        &self,
        ev: &ApiEnriched<'_>,
        clock: &Clock,
        tz: &Tz,
        line: &mut String,
        seconds: &mut SecondCache,
    ) -> bool {
        let Some(name) = ev.event.name() else {
            return false;
        };
        if ev.event.verbose_only() && !self.verbose {
            return false;
        }
        self.write_head(line, clock, tz, seconds, ev.origin, name);
        line.push(' ');
        ev.event.text(line);
        true
    }
}

impl TextFormatter {
    /// `-v`: the line of one NVML share sample, e.g.
    /// `23:00:25.104012 [CPU??] GPU_SHARE    PID=637320 python3          gpu=0 sm=87% mem=31% enc=0% dec=0%`
    /// (no CPU: the driver took the sample, not a thread of the process). Its time is the
    /// sample's own, on the events' clock.
    fn write_share_cached<Tz: TimeZone<Offset: Display>>(
        &self,
        s: &ShareEnriched<'_>,
        clock: &Clock,
        tz: &Tz,
        line: &mut String,
        seconds: &mut SecondCache,
    ) {
        let sample = s.sample;
        let mono = i128::from(sample.ts_us) * 1000 - clock.offset_ns();
        let ts_ns = u64::try_from(mono.max(0)).unwrap_or(u64::MAX);
        let wall = i64::try_from(sample.ts_us)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_micros);
        match (self.timestamps, wall) {
            // From the sample's own real time: a capture replayed after a reboot is older than
            // the events' clock can say.
            (TimestampMode::Wall, Some(t)) => {
                let _ = write!(line, "{}", t.with_timezone(tz).format("%H:%M:%S%.6f"));
            }
            (TimestampMode::Wall, None) => write_wall(line, clock, tz, ts_ns, seconds),
            (TimestampMode::Relative, _) => {
                let rel = format_relative(clock.relative_ns(ts_ns));
                let _ = write!(line, "{rel:>TIME_WIDTH$}");
            }
        }
        line.push_str(" [CPU??] ");
        push_left(line, "GPU_SHARE", 12);
        line.push_str(" PID=");
        push_left(line, itoa::Buffer::new().format(sample.pid), 6);
        line.push(' ');
        push_left(
            line,
            &crate::escape::escape_text(s.process.unwrap_or("?")),
            16,
        );
        line.push(' ');
        sample.text(line);
    }
}

/// The last wall-clock second a [`TextSink`] wrote (`HH:MM:SS`, by its Unix second): the lines
/// of one second convert the time to the time zone once. (A time zone's offset changes on a
/// whole second.)
#[derive(Clone, Copy, Debug, Default)]
struct SecondCache(Option<(i128, [u8; 8])>);

/// Appends `%H:%M:%S%.6f` of the monotonic `ts_ns` in `tz`.
fn write_wall<Tz>(line: &mut String, clock: &Clock, tz: &Tz, ts_ns: u64, seconds: &mut SecondCache)
where
    Tz: TimeZone,
    Tz::Offset: Display,
{
    const NS: i128 = 1_000_000_000;
    let ns = clock.realtime_ns(ts_ns);
    let (unix_sec, frac) = (ns.div_euclid(NS), ns.rem_euclid(NS) as u32);
    if let Some((sec, hms)) = seconds.0
        && sec == unix_sec
        && let Ok(hms) = std::str::from_utf8(&hms)
    {
        line.push_str(hms);
        line.push('.');
        push_zero_padded(line, frac / 1000, 6);
        return;
    }
    let t = clock.in_tz(ts_ns, tz);
    // The fields directly, not `format("%H:%M:%S%.6f")`, which parses its format string for
    // every line (≈ 10 % of the pipeline: docs/performance.md, part 4). Same text, a leap
    // second included (chrono shows it as :60).
    let (sec, nanos) = match t.nanosecond() {
        n if n >= 1_000_000_000 => (t.second() + 1, n - 1_000_000_000),
        n => (t.second(), n),
    };
    // `{:02}:{:02}:{:02}.{:06}`, digit by digit.
    let start = line.len();
    push_zero_padded(line, t.hour(), 2);
    line.push(':');
    push_zero_padded(line, t.minute(), 2);
    line.push(':');
    push_zero_padded(line, sec, 2);
    // Kept only for an ordinary second (not a leap second, nor a time chrono cannot hold).
    seconds.0 = <[u8; 8]>::try_from(&line.as_bytes()[start..])
        .ok()
        .filter(|_| t.nanosecond() == frac)
        .map(|hms| (unix_sec, hms));
    line.push('.');
    push_zero_padded(line, nanos / 1000, 6);
}

/// Appends `v` in decimal with at least `width` digits, zeros in front (`{v:0width$}`).
fn push_zero_padded(line: &mut String, v: u32, width: usize) {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(v);
    line.extend(std::iter::repeat_n('0', width.saturating_sub(digits.len())));
    line.push_str(digits);
}

/// Appends `s` left-aligned in `width` characters (`{s:<width$}`: spaces after it).
fn push_left(line: &mut String, s: &str, width: usize) {
    line.push_str(s);
    let chars = if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    };
    line.extend(std::iter::repeat_n(' ', width.saturating_sub(chars)));
}

/// The text sink: one line per event (with the container field where it applies), the
/// statistics block at the end, and with `--interval` the blocks so far on a side writer
/// (standard error) so that the event stream stays one line per event.
pub struct TextSink<W> {
    formatter: TextFormatter,
    clock: Clock,
    /// `--show-container`: a `container=` field on every line.
    show_container: bool,
    out: W,
    side: Option<Box<dyn std::io::Write>>,
    /// The line being written (kept to reuse its allocation).
    line: String,
    seconds: SecondCache,
    /// `gpu-trace merge`: ` host=NAME`, ending every line of this node's.
    host: Option<String>,
}

impl<W: std::io::Write> TextSink<W> {
    pub fn new(formatter: TextFormatter, clock: Clock, show_container: bool, out: W) -> Self {
        Self {
            formatter,
            clock,
            show_container,
            out,
            side: None,
            line: String::with_capacity(256),
            seconds: SecondCache::default(),
            host: None,
        }
    }

    /// `gpu-trace merge`: every line ends with ` host=NAME` (after the container fields).
    pub fn set_host(&mut self, host: &str) {
        self.host = Some(format!(" host={}", crate::escape::escape_text(host)));
    }

    /// Where the `--interval` blocks go.
    pub fn set_side(&mut self, side: Box<dyn std::io::Write>) {
        self.side = Some(side);
    }

    pub fn out(&self) -> &W {
        &self.out
    }

    /// The writer itself, for what a caller writes between two events.
    pub fn out_mut(&mut self) -> &mut W {
        &mut self.out
    }

    pub fn into_out(self) -> W {
        self.out
    }
}

impl<W: std::io::Write> Sink for TextSink<W> {
    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        let line = &mut self.line;
        line.clear();
        if !self.formatter.write_event_cached(
            ev.event,
            ev.gpu,
            &self.clock,
            &Local,
            line,
            &mut self.seconds,
        ) {
            return Ok(());
        }
        end_line(line, ev.cgroup, self.show_container, self.host.as_deref());
        self.out
            .write_all(line.as_bytes())
            .map_err(SinkError::Output)
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        let line = &mut self.line;
        line.clear();
        if !self
            .formatter
            .write_api_cached(ev, &self.clock, &Local, line, &mut self.seconds)
        {
            return Ok(());
        }
        end_line(line, ev.cgroup, self.show_container, self.host.as_deref());
        self.out
            .write_all(line.as_bytes())
            .map_err(SinkError::Output)
    }

    /// `-v`: a `GPU_SHARE` line per sample (without it, several a second would drown the
    /// scheduling events; the statistics block has the share figures either way).
    fn shares(&mut self, batch: &ShareBatch<'_>) -> Result<(), SinkError> {
        if !self.formatter.verbose {
            return Ok(());
        }
        for s in batch.samples {
            let line = &mut self.line;
            line.clear();
            (self.formatter).write_share_cached(s, &self.clock, &Local, line, &mut self.seconds);
            end_line(line, s.cgroup, self.show_container, self.host.as_deref());
            self.out
                .write_all(line.as_bytes())
                .map_err(SinkError::Output)?;
        }
        Ok(())
    }

    fn periodic(&mut self, stats: &Stats) -> Result<(), SinkError> {
        let Some(side) = self.side.as_mut() else {
            return Ok(());
        };
        let block = stats.render_text_titled(self.formatter.verbose, "gpu-trace statistics so far");
        side.write_all(block.as_bytes())
            .and_then(|()| side.flush())
            .map_err(SinkError::Output)
    }

    fn flush(&mut self, _stats: &Stats, _untracked: u64) -> Result<(), SinkError> {
        self.out.flush().map_err(SinkError::Output)
    }

    fn finish(&mut self, end: &RunEnd<'_>) -> Result<(), SinkError> {
        if let Some(text) = end.stats_text {
            self.out
                .write_all(text.as_bytes())
                .map_err(SinkError::Output)?;
        }
        self.out.flush().map_err(SinkError::Output)
    }
}

/// The container fields (`--show-container`: `container=?` when not known), the node's
/// `host=` field (`gpu-trace merge`) and the newline.
fn end_line(
    line: &mut String,
    cgroup: Option<&crate::model::workload::Attribution>,
    show_container: bool,
    host: Option<&str>,
) {
    match cgroup {
        Some(a) => line.push_str(&a.text_fields(show_container)),
        None if show_container => line.push_str(" container=?"),
        None => {}
    }
    if let Some(host) = host {
        line.push_str(host);
    }
    line.push('\n');
}

/// `S.ffffff` seconds, with a `-` for negative values.
fn format_relative(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let abs = ns.unsigned_abs();
    format!(
        "{sign}{}.{:06}",
        abs / 1_000_000_000,
        (abs % 1_000_000_000) / 1_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{
        DestroyCause, Engine, EventKind, Interleave, Origin, RunState, SchedChange, TaskId,
        ValueSource,
    };
    use chrono::{FixedOffset, NaiveDate, Utc};

    /// Monotonic time of the first sample line.
    const T0: u64 = 5_000_000_000_000;

    /// A clock and time zone under which `T0` is 23:00:24.561798 (2024-05-01, UTC+02:00).
    fn fixed() -> (Clock, FixedOffset) {
        let tz = FixedOffset::east_opt(2 * 3600).unwrap();
        let wall = tz
            .with_ymd_and_hms(2024, 5, 1, 23, 0, 24)
            .unwrap()
            .timestamp_nanos_opt()
            .unwrap()
            + 561_798_000;
        (Clock::new(i128::from(wall) - i128::from(T0)), tz)
    }

    fn origin(ts_ns: u64, comm: &str) -> Origin {
        Origin {
            ts_ns,
            cpu: 1,
            pid: 637320,
            tid: 637320,
            comm: comm.into(),
        }
    }

    fn task_init() -> Event {
        Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0, "python3"),
            kind: EventKind::TaskInit {
                task: TaskId::HwTsg(1),
                client: 0xc1d0_0001,
                engine: Some(Engine::Copy),
                engine_type: Some(0x0d),
                timeslice_us: Some(1024),
                timeslice_source: ValueSource::DriverDefault,
                interleave: None,
                interleave_source: ValueSource::DriverDefault,
                runlist: Some(0),
                gpu: Some(0),
            },
        }
    }

    fn schedule() -> Event {
        Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0 + 29_827_000, "python3"),
            kind: EventKind::Schedule {
                task: TaskId::HwTsg(1),
                client: 0xc1d0_0001,
                channels: Some(8),
                timeslice_us: Some(1024),
                interleave: Some(Interleave::Low),
                allowed: true,
                rm_status: Some(0),
                errno: 0,
                via_channel: false,
            },
        }
    }

    fn work_submit() -> Event {
        Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0 + 38_202_000, "python3"),
            kind: EventKind::WorkSubmit {
                task: TaskId::HwTsg(1),
                client: 0xc1d0_0001,
                channel_handle: 0x5c00_0010,
                chid: Some(2),
                runlist: Some(0),
                token: 1_073_741_826,
                gpu: Some(0),
            },
        }
    }

    fn task_destroy() -> Event {
        Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0 + 1_165_782_000, "cuda-EvtHandlr"),
            kind: EventKind::TaskDestroy {
                final_params: None,
                task: TaskId::HwTsg(1),
                client: 0xc1d0_0001,
                cause: DestroyCause::ProcessExit,
                implicit: true,
            },
        }
    }

    fn wall(verbose: bool) -> TextFormatter {
        TextFormatter {
            timestamps: TimestampMode::Wall,
            verbose,
        }
    }

    /// The line of `ev` on the GPU nvidia-smi shows as 0 (RM's device instance 0).
    fn line(ev: &Event) -> String {
        let (clock, tz) = fixed();
        let gpu = GpuIdentity {
            index: 0,
            uuid: None,
            bus_id: "0000:00:06.0".into(),
            rm_device: 0,
        };
        wall(true)
            .format_event_on(ev, Some(&gpu), &clock, &tz)
            .unwrap()
    }

    const SAMPLE_INIT: &str = "23:00:24.561798 [CPU01] TASK_INIT    PID=637320 python3          TSG=1    engine=COPY     timeslice=1024 us interleave=UNKNOWN runlist=0";
    const SAMPLE_SCHEDULE: &str = "23:00:24.591625 [CPU01] SCHEDULE     PID=637320 python3          TSG=1    channels=8 timeslice=1024 us interleave=LOW allowed=yes";
    const SAMPLE_SUBMIT: &str = "23:00:24.600000 [CPU01] WORK_SUBMIT  PID=637320 python3          TSG=1    channel=2 token=1073741826 gpu=0";
    const SAMPLE_DESTROY: &str =
        "23:00:25.727580 [CPU01] TASK_DESTROY PID=637320 cuda-EvtHandlr   TSG=1";

    #[test]
    fn sample_task_init() {
        assert_eq!(line(&task_init()), SAMPLE_INIT);
    }

    #[test]
    fn sample_schedule() {
        assert_eq!(line(&schedule()), SAMPLE_SCHEDULE);
    }

    #[test]
    fn sample_work_submit_plus_runlist() {
        let l = line(&work_submit());
        assert!(l.starts_with(SAMPLE_SUBMIT), "{l}");
        assert_eq!(l, format!("{SAMPLE_SUBMIT} runlist=0"));
    }

    #[test]
    fn sample_task_destroy_plus_cause() {
        let l = line(&task_destroy());
        assert!(l.starts_with(SAMPLE_DESTROY), "{l}");
        assert_eq!(
            l,
            format!("{SAMPLE_DESTROY}    cause=process_exit (implicit)")
        );
        let mut ev = task_destroy();
        ev.kind = EventKind::TaskDestroy {
            final_params: None,
            task: TaskId::HwTsg(1),
            client: 1,
            cause: DestroyCause::Free,
            implicit: false,
        };
        assert_eq!(line(&ev), format!("{SAMPLE_DESTROY}    cause=free"));
    }

    #[test]
    fn local_time_zone_is_used_by_default() {
        // Choose the offset so that T0 is 23:00:24.561798 local time, whatever TZ is.
        let local = NaiveDate::from_ymd_opt(2024, 5, 1)
            .unwrap()
            .and_hms_micro_opt(23, 0, 24, 561_798)
            .unwrap()
            .and_local_timezone(Local)
            .earliest()
            .unwrap();
        let wall_ns = local.with_timezone(&Utc).timestamp_nanos_opt().unwrap();
        let clock = Clock::new(i128::from(wall_ns) - i128::from(T0));
        let f = wall(false);
        assert_eq!(f.format_event(&task_init(), &clock).unwrap(), SAMPLE_INIT);
        assert_eq!(
            f.format_event(&schedule(), &clock).unwrap(),
            SAMPLE_SCHEDULE
        );
    }

    #[test]
    fn work_submit_only_when_verbose() {
        let (clock, tz) = fixed();
        assert_eq!(
            wall(false).format_event_in_tz(&work_submit(), &clock, &tz),
            None
        );
        assert!(
            wall(true)
                .format_event_in_tz(&work_submit(), &clock, &tz)
                .is_some()
        );
        for ev in [task_init(), schedule(), task_destroy()] {
            assert!(wall(false).format_event_in_tz(&ev, &clock, &tz).is_some());
        }
    }

    #[test]
    fn unknown_values_print_question_marks() {
        let mut init = task_init();
        init.kind = EventKind::TaskInit {
            task: TaskId::RmHandle(0x5c00_0002),
            client: 1,
            engine: None,
            engine_type: None,
            timeslice_us: None,
            timeslice_source: ValueSource::Observed,
            interleave: Some(Interleave::High),
            interleave_source: ValueSource::Observed,
            runlist: None,
            gpu: None,
        };
        assert_eq!(
            line(&init),
            "23:00:24.561798 [CPU01] TASK_INIT    PID=637320 python3          TSG=0x5c000002 \
             engine=?        timeslice=? interleave=HIGH runlist=?"
        );

        let mut sched = schedule();
        sched.kind = EventKind::Schedule {
            task: TaskId::KfdQueue(12345),
            client: 0,
            channels: None,
            timeslice_us: None,
            interleave: None,
            allowed: true,
            rm_status: None,
            errno: 0,
            via_channel: false,
        };
        assert_eq!(
            line(&sched),
            "23:00:24.591625 [CPU01] SCHEDULE     PID=637320 python3          TSG=12345 \
             channels=? timeslice=? interleave=? allowed=yes"
        );

        let mut submit = work_submit();
        submit.kind = EventKind::WorkSubmit {
            task: TaskId::HwTsg(7),
            client: 1,
            channel_handle: 2,
            chid: None,
            runlist: None,
            token: 0,
            gpu: None,
        };
        // The GPU not known to the run: `gpu=?`.
        let (clock, tz) = fixed();
        let l = wall(true).format_event_in_tz(&submit, &clock, &tz).unwrap();
        assert!(
            l.ends_with("TSG=7    channel=? token=0 gpu=? runlist=?"),
            "{l}"
        );
    }

    /// `gpu=` is nvidia-smi's index of the GPU the pipeline named, not RM's device instance the
    /// event carries (which may differ: RM numbers GPUs in the order it initialized them), and
    /// `?` when the GPU is not known, whatever the instance.
    #[test]
    fn gpu_is_nvidia_smi_s_index_not_the_rm_device_instance() {
        let (clock, tz) = fixed();
        let submit = work_submit();
        assert!(matches!(
            submit.kind,
            EventKind::WorkSubmit { gpu: Some(0), .. }
        ));
        let second = GpuIdentity {
            index: 1,
            uuid: Some("GPU-b".into()),
            bus_id: "0000:41:00.0".into(),
            rm_device: 0,
        };
        let on = |gpu| {
            wall(true)
                .format_event_on(&submit, gpu, &clock, &tz)
                .unwrap()
        };
        assert_eq!(
            on(Some(&second)),
            format!("{} runlist=0", SAMPLE_SUBMIT.replace("gpu=0", "gpu=1"))
        );
        assert_eq!(
            on(None),
            format!("{} runlist=0", SAMPLE_SUBMIT.replace("gpu=0", "gpu=?"))
        );
        // The other lines have no `gpu=` field, known GPU or not.
        for ev in [task_init(), schedule(), task_destroy()] {
            let l = wall(true)
                .format_event_on(&ev, Some(&second), &clock, &tz)
                .unwrap();
            assert!(!l.contains("gpu="), "{l}");
        }
    }

    #[test]
    fn engines_and_interleave_levels() {
        for (engine, name) in [
            (Engine::Graphics, "GRAPHICS"),
            (Engine::Nvdec, "NVDEC   "),
            (Engine::Nvenc, "NVENC   "),
            (Engine::Nvjpeg, "NVJPEG  "),
            (Engine::Ofa, "OFA     "),
            (Engine::Sec2, "SEC2    "),
            (Engine::Other, "OTHER   "),
        ] {
            let mut ev = task_init();
            if let EventKind::TaskInit {
                engine: e,
                interleave,
                ..
            } = &mut ev.kind
            {
                *e = Some(engine);
                *interleave = Some(Interleave::Medium);
            }
            let l = line(&ev);
            assert!(
                l.contains(&format!(
                    " engine={name} timeslice=1024 us interleave=MEDIUM "
                )),
                "{l}"
            );
        }
    }

    fn denied(rm_status: Option<u32>, errno: i32, via_channel: bool) -> String {
        let mut ev = schedule();
        ev.kind = EventKind::Schedule {
            task: TaskId::HwTsg(1),
            client: 1,
            channels: Some(1),
            timeslice_us: Some(2048),
            interleave: Some(Interleave::Medium),
            allowed: false,
            rm_status,
            errno,
            via_channel,
        };
        let l = line(&ev);
        let (_, fields) = l.split_once("TSG=1    ").unwrap();
        fields.to_string()
    }

    #[test]
    fn refused_schedules() {
        let base = "channels=1 timeslice=2048 us interleave=MEDIUM allowed=no";
        assert_eq!(denied(None, -1, false), format!("{base} errno=EPERM"));
        assert_eq!(denied(None, -14, false), format!("{base} errno=EFAULT"));
        assert_eq!(denied(None, -22, false), format!("{base} errno=EINVAL"));
        assert_eq!(denied(None, -25, false), format!("{base} errno=ENOTTY"));
        assert_eq!(denied(None, -95, false), format!("{base} errno=95"));
        assert_eq!(
            denied(Some(0x1f), 0, false),
            format!("{base} status=0x0000001f")
        );
        assert_eq!(denied(Some(0), 0, false), base);
        assert_eq!(
            denied(Some(0x56), 0, true),
            format!("{base} (channel) status=0x00000056")
        );
        assert_eq!(
            denied(None, -1, true),
            format!("{base} (channel) errno=EPERM")
        );
    }

    /// The line of a `SCHED_UPDATE` of TSG 1 (all of it: the prefix is the sample's).
    fn update(
        change: SchedChange,
        rm_status: Option<u32>,
        errno: i32,
        via_channel: bool,
    ) -> String {
        let mut ev = schedule();
        ev.kind = EventKind::SchedUpdate {
            task: TaskId::RmHandle(0x5c00_0015),
            client: 1,
            change,
            allowed: rm_status == Some(0) && errno == 0,
            rm_status,
            errno,
            via_channel,
        };
        line(&ev)
    }

    #[test]
    fn sched_update_lines() {
        let head =
            "23:00:24.591625 [CPU01] SCHED_UPDATE PID=637320 python3          TSG=0x5c000015";
        let cases = [
            (
                SchedChange::Timeslice {
                    old_us: Some(1024),
                    old_source: Some(ValueSource::DriverDefault),
                    new_us: 2048,
                },
                Some(0),
                0,
                false,
                "timeslice=1024 us -> 2048 us allowed=yes",
            ),
            (
                SchedChange::Timeslice {
                    old_us: None,
                    old_source: None,
                    new_us: 5000,
                },
                Some(0x1f),
                0,
                false,
                "timeslice=? -> 5000 us allowed=no status=0x0000001f",
            ),
            (
                SchedChange::Interleave {
                    old: Some(Interleave::Medium),
                    old_source: Some(ValueSource::Observed),
                    new: Some(Interleave::High),
                    new_raw: 2,
                },
                Some(0),
                0,
                true,
                "interleave=MEDIUM -> HIGH allowed=yes (channel)",
            ),
            (
                SchedChange::Interleave {
                    old: Some(Interleave::Low),
                    old_source: Some(ValueSource::Observed),
                    new: None,
                    new_raw: 7,
                },
                None,
                -22,
                false,
                "interleave=LOW -> INVALID(7) allowed=no errno=EINVAL",
            ),
            (
                SchedChange::Preempt {
                    wait: true,
                    manual_timeout: false,
                    timeout_us: 0,
                },
                Some(0),
                0,
                false,
                "preempt wait=yes timeout=default allowed=yes",
            ),
            (
                SchedChange::Preempt {
                    wait: false,
                    manual_timeout: true,
                    timeout_us: 1000,
                },
                Some(0),
                0,
                false,
                "preempt wait=no timeout=1000 us allowed=yes",
            ),
            (
                SchedChange::RunState {
                    old: Some(RunState::Enabled),
                    new: RunState::Disabled,
                    skip_submit: true,
                    skip_enable: false,
                },
                Some(0),
                0,
                false,
                "run_state=enabled -> disabled skip_submit allowed=yes",
            ),
            (
                SchedChange::RunState {
                    old: None,
                    new: RunState::Disabled,
                    skip_submit: false,
                    skip_enable: true,
                },
                None,
                -1,
                true,
                "run_state=? -> disabled skip_enable allowed=no (channel) errno=EPERM",
            ),
        ];
        for (change, status, errno, channel, fields) in cases {
            assert_eq!(
                update(change, status, errno, channel),
                format!("{head} {fields}")
            );
        }
    }

    #[test]
    fn allowed_channel_schedule() {
        let mut ev = schedule();
        if let EventKind::Schedule { via_channel, .. } = &mut ev.kind {
            *via_channel = true;
        }
        assert_eq!(line(&ev), format!("{SAMPLE_SCHEDULE} (channel)"));
    }

    /// UTC, a half-hour zone east and a zone west.
    fn zones() -> [FixedOffset; 3] {
        [
            FixedOffset::east_opt(0).unwrap(),
            FixedOffset::east_opt(5 * 3600 + 1800).unwrap(),
            FixedOffset::west_opt(3 * 3600).unwrap(),
        ]
    }

    #[test]
    fn wall_time_matches_chrono_formatting_over_many_instants() {
        // The hand-written time fields must print what `%H:%M:%S%.6f` prints, in every zone.
        let zones = zones();
        let mut ts: u64 = 1_765_000_000_123_456_789;
        for i in 0..3000u64 {
            ts = ts.wrapping_add(i * 7_919_000_013 % 86_400_000_000_000 + 999);
            let clock = Clock::new(0);
            let mut ev = task_destroy();
            ev.origin.ts_ns = ts;
            for tz in &zones {
                let line = wall(false).format_event_in_tz(&ev, &clock, tz).unwrap();
                let want = clock.in_tz(ts, tz).format("%H:%M:%S%.6f").to_string();
                assert_eq!(&line[..15], want, "ts {ts}");
            }
        }
    }

    #[test]
    fn wall_time_kept_per_second_matches_chrono_within_across_and_back() {
        // TextSink converts a second once (SecondCache): steps inside a second, across one and
        // backwards must print what `%H:%M:%S%.6f` prints.
        let zones = zones();
        let steps: [i64; 8] = [
            1,
            250_000_000,
            999_999_000,
            -1_000,
            1_000_000_000,
            -3_000_000_000,
            60_000_000_123,
            3_599_999_999_999,
        ];
        for tz in &zones {
            let (clock, mut seconds) = (Clock::new(0), SecondCache::default());
            let mut ts: u64 = 1_765_000_000_999_999_000;
            for i in 0..2000usize {
                ts = ts.wrapping_add_signed(steps[(i * 7 + i / 5) % steps.len()]);
                let mut ev = task_destroy();
                ev.origin.ts_ns = ts;
                let mut line = String::new();
                assert!(wall(false).write_event_cached(
                    &ev,
                    None,
                    &clock,
                    tz,
                    &mut line,
                    &mut seconds
                ));
                let want = clock.in_tz(ts, tz).format("%H:%M:%S%.6f").to_string();
                assert_eq!(&line[..15], want, "ts {ts}");
            }
        }
    }

    #[test]
    fn relative_timestamps() {
        let clock = Clock::new(0);
        let f = TextFormatter {
            timestamps: TimestampMode::Relative,
            verbose: true,
        };
        let first = f.format_event(&task_init(), &clock).unwrap();
        assert!(
            first.starts_with("       0.000000 [CPU01] TASK_INIT "),
            "{first}"
        );
        let later = f.format_event(&task_destroy(), &clock).unwrap();
        assert!(
            later.starts_with("       1.165782 [CPU01] TASK_DESTROY "),
            "{later}"
        );
        let mut early = schedule();
        early.origin.ts_ns = T0 - 1_500;
        let l = f.format_event(&early, &clock).unwrap();
        assert!(l.starts_with("      -0.000001 [CPU01] SCHEDULE "), "{l}");
    }

    #[test]
    fn no_trailing_whitespace() {
        for ev in [task_init(), schedule(), work_submit(), task_destroy()] {
            let l = line(&ev);
            assert_eq!(l.trim_end(), l);
            assert!(!l.contains('\n'));
        }
    }

    /// `gpu-trace --api`'s lines: the driver lines' time, CPU, name, PID and thread-name
    /// columns, then the API fields; names from the traced process escaped; a process's sums
    /// print nothing here (the statistics do).
    #[test]
    fn api_lines_take_the_driver_lines_columns_and_escape_names() {
        use crate::api::{events::samples, names::ApiEvent};
        let (clock, tz) = fixed();
        let f = TextFormatter::default();
        let line = |event: &ApiEvent| {
            let origin = samples::origin_of(event, T0, 1);
            let ev = ApiEnriched {
                event,
                origin: &origin,
                process: "python3",
                cgroup: None,
            };
            let mut line = String::new();
            f.write_api(&ev, &clock, &tz, &mut line).then_some(line)
        };
        assert_eq!(
            line(&ApiEvent::Call(samples::call("python3", "libcuda.so.1"))).unwrap(),
            "23:00:24.561798 [CPU01] API_CALL     PID=4242   python3          tid=4243 \
             cuCtxCreate_v4@libcuda.so.1 = 0 <12.345 us> depth=1 caller=cudaMalloc@libcudart.so.12"
        );
        assert_eq!(
            line(&ApiEvent::Recursion(samples::recursion("python3"))).unwrap(),
            "23:00:24.561798 [CPU01] API_RECURSION PID=4242   python3          tid=4243 \
             cuInit@shim.so why=re-entered depth=2 chain=cuInit@shim.so"
        );
        let hostile = line(&ApiEvent::Call(samples::call(
            "py\u{1b}]0;x\u{7}",
            "/tmp/\u{202e}\u{1b}[2Jlib.so",
        )))
        .unwrap();
        assert!(
            !hostile.contains(['\u{1b}', '\u{7}', '\u{202e}']),
            "{hostile:?}"
        );
        let stats = ApiEvent::Stats(crate::api::stats::CallStats {
            pid: 4242,
            library: "libcuda.so.1".into(),
            preload: false,
            symbol: "cuInit".into(),
            calls: 1,
            errors: 0,
            total_ns: 1,
            hist: vec![0; 40],
        });
        assert_eq!(line(&stats), None);
    }

    /// A record made in userspace (a stuck call, a verdict) has no CPU: `[CPU??]`, not a
    /// CPU number it did not run on; a stuck call's frames follow on lines of their own.
    #[test]
    fn a_stuck_call_has_no_cpu_and_its_frames_follow() {
        use crate::api::{
            events::{StuckEvent, samples},
            names::ApiEvent,
        };
        let (clock, tz) = fixed();
        let event = ApiEvent::Stuck(StuckEvent {
            pid: 4242,
            tid: 4243,
            comm: "python3".into(),
            site: samples::site("cuStreamSynchronize", "libcuda.so.1"),
            open_ns: 5_000_000_000,
            state: "S".into(),
            wchan: "futex_wait_queue".into(),
            syscall: "202".into(),
            stack: vec!["libcuda.so.1+0x1000 cuStreamSynchronize+0x10".into()],
        });
        let mut origin = samples::origin_of(&event, T0, 1);
        origin.cpu = crate::event::Origin::NO_CPU;
        let ev = ApiEnriched {
            event: &event,
            origin: &origin,
            process: "python3",
            cgroup: None,
        };
        let mut line = String::new();
        assert!(TextFormatter::default().write_api(&ev, &clock, &tz, &mut line));
        assert_eq!(
            line,
            "23:00:24.561798 [CPU??] API_STUCK    PID=4242   python3          tid=4243 \
             cuStreamSynchronize@libcuda.so.1 open_for=5.000s state=S wchan=futex_wait_queue \
             syscall=202\n    libcuda.so.1+0x1000 cuStreamSynchronize+0x10"
        );
    }
}
