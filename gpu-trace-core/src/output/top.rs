//! `gpu-trace top`: what the live view shows, computed from two snapshots of the statistics
//! (pure: no terminal here; `gpu-trace`'s `top` module draws it).
//!
//! Per process: live tasks (TSGs / queues) by engine, schedules and refusals per second since the
//! last frame, scheduling updates per second, the timeslice its newest live task runs with, the
//! latest `TASK_INIT` → first allowed `SCHEDULE` latency, and its container or pod. Per GPU: live
//! and most-live tasks, with nvidia-smi's index and UUID where known. The tracer's health:
//! records dropped and emitted.

use std::collections::BTreeMap;

use crate::model::stats::{KernelCounters, Stats};

/// Sort orders of the process table (`s` cycles through them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortBy {
    /// Schedules per second, then live tasks (busiest first).
    #[default]
    ScheduleRate,
    /// Live tasks, then schedules per second.
    Live,
    /// Ascending pid.
    Pid,
}

impl SortBy {
    pub fn next(self) -> Self {
        match self {
            Self::ScheduleRate => Self::Live,
            Self::Live => Self::Pid,
            Self::Pid => Self::ScheduleRate,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::ScheduleRate => "SCHED/s",
            Self::Live => "LIVE",
            Self::Pid => "PID",
        }
    }
}

/// One process row.
#[derive(Clone, PartialEq)]
pub struct ProcessRow {
    pub pid: u32,
    /// Escaped for the terminal.
    pub comm: String,
    /// Container / pod label, where known.
    pub group: Option<String>,
    /// Live tasks by engine label (`GRAPHICS` 2, `COPY` 3, ...).
    pub live: BTreeMap<String, u64>,
    pub live_total: u64,
    pub schedules_per_s: f64,
    pub refused_per_s: f64,
    pub updates_per_s: f64,
    /// Totals since the start.
    pub schedules: u64,
    pub refused: u64,
    /// Timeslice of the newest live task, µs.
    pub timeslice_us: Option<u64>,
    /// Latest `TASK_INIT` → first allowed `SCHEDULE`, µs.
    pub init_to_schedule_us: Option<u64>,
    /// GPU share over the last [`SHARE_WINDOW_US`] (NVML samples, summed over its GPUs),
    /// 0..1; `None`: no sample names it.
    pub gpu_share: Option<f64>,
    /// The process exited (its `process_exit`, or gone from the host live): shown dimmed
    /// and marked `x` until it expires ([`TopModel::expire_s`]).
    pub exited: bool,
    /// `--api`: the process's GPU API calls per second between the last two reads of its sums
    /// ([`Stats::api_rate`]); `None`: no API figures for it.
    pub api_per_s: Option<f64>,
}

impl ProcessRow {
    /// A row of `pid` named `comm` without any task, event or share.
    pub fn idle(pid: u32, comm: &str) -> Self {
        Self {
            pid,
            comm: comm.into(),
            group: None,
            live: BTreeMap::new(),
            live_total: 0,
            schedules_per_s: 0.0,
            refused_per_s: 0.0,
            updates_per_s: 0.0,
            schedules: 0,
            refused: 0,
            timeslice_us: None,
            init_to_schedule_us: None,
            gpu_share: None,
            exited: false,
            api_per_s: None,
        }
    }
}

// Debug by hand: the share fields show only when there is a share, so that a frame of a run
// without NVML samples reads as it did before they existed (the golden frames).
impl std::fmt::Debug for ProcessRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ProcessRow");
        d.field("pid", &self.pid)
            .field("comm", &self.comm)
            .field("group", &self.group)
            .field("live", &self.live)
            .field("live_total", &self.live_total)
            .field("schedules_per_s", &self.schedules_per_s)
            .field("refused_per_s", &self.refused_per_s)
            .field("updates_per_s", &self.updates_per_s)
            .field("schedules", &self.schedules)
            .field("refused", &self.refused)
            .field("timeslice_us", &self.timeslice_us)
            .field("init_to_schedule_us", &self.init_to_schedule_us);
        if let Some(share) = self.gpu_share {
            d.field("gpu_share", &share);
        }
        if self.exited {
            d.field("exited", &true);
        }
        if let Some(api) = self.api_per_s {
            d.field("api_per_s", &api);
        }
        d.finish()
    }
}

impl std::fmt::Debug for GpuRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("GpuRow");
        d.field("gpu", &self.gpu)
            .field("rm_device", &self.rm_device)
            .field("uuid", &self.uuid)
            .field("live", &self.live)
            .field("max_live", &self.max_live);
        if let Some(share) = self.share {
            d.field("share", &share);
        }
        d.finish()
    }
}

/// The window of `top`'s share columns.
pub const SHARE_WINDOW_US: u64 = 5_000_000;

/// One GPU row.
#[derive(Clone, PartialEq)]
pub struct GpuRow {
    /// The GPU as users name it: nvidia-smi's index (`None`: not known), AMD's KFD `gpu_id`.
    pub gpu: Option<u32>,
    /// The driver's own number, RM's device instance (AMD: its `gpu_id`; `None`: not seen).
    pub rm_device: Option<u32>,
    /// nvidia-smi's UUID, where known.
    pub uuid: Option<String>,
    pub live: u64,
    pub max_live: u64,
    /// Sum of the processes' GPU shares over the last [`SHARE_WINDOW_US`] (NVML index =
    /// nvidia-smi's), 0..1; `None`: no sample.
    pub share: Option<f64>,
}

/// One frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub elapsed_s: f64,
    pub processes: Vec<ProcessRow>,
    pub gpus: Vec<GpuRow>,
    pub dropped: u64,
    pub emitted: u64,
    pub events: u64,
    pub sort: SortBy,
}

/// The counts a rate is computed from, per process, at the previous frame.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    schedule: u64,
    refused: u64,
    updates: u64,
    /// All its events (a dead pid with new events was reused).
    events: u64,
}

/// A process's live tasks by engine, and (creation time, timeslice) of its newest.
type LiveTasks = (BTreeMap<String, u64>, Option<(u64, Option<u64>)>);

/// Orders the process rows by `by`.
pub fn sort_rows(processes: &mut [ProcessRow], by: SortBy) {
    match by {
        SortBy::ScheduleRate => processes.sort_by(|a, b| {
            b.schedules_per_s
                .total_cmp(&a.schedules_per_s)
                .then(b.live_total.cmp(&a.live_total))
                .then(a.pid.cmp(&b.pid))
        }),
        SortBy::Live => processes.sort_by(|a, b| {
            b.live_total
                .cmp(&a.live_total)
                .then(b.schedules_per_s.total_cmp(&a.schedules_per_s))
                .then(a.pid.cmp(&b.pid))
        }),
        SortBy::Pid => processes.sort_by_key(|p| p.pid),
    }
}

impl Frame {
    /// The same frame sorted by `by` (a key press between two frames).
    pub fn resort(&mut self, by: SortBy) {
        self.sort = by;
        sort_rows(&mut self.processes, by);
    }
}

/// How long an exited process stays on the screen by default, seconds (`top --expire`).
pub const DEFAULT_EXPIRE_S: f64 = 10.0;

/// Turns successive statistics into frames.
#[derive(Debug)]
pub struct TopModel {
    previous: BTreeMap<u32, Counts>,
    previous_s: f64,
    pub sort: SortBy,
    /// Seconds an exited process stays on the screen (dimmed, marked `x`) before its row goes;
    /// 0 keeps it. Its counts stay in the statistics.
    pub expire_s: f64,
    /// Exited processes: the frame time each was first seen exited.
    dead_since: BTreeMap<u32, f64>,
    /// Exited processes the last frame no longer shows ([`expired`](Self::expired)).
    expired: u64,
}

impl Default for TopModel {
    fn default() -> Self {
        Self {
            previous: BTreeMap::new(),
            previous_s: 0.0,
            sort: SortBy::default(),
            expire_s: DEFAULT_EXPIRE_S,
            dead_since: BTreeMap::new(),
            expired: 0,
        }
    }
}

fn total_events(p: &crate::model::stats::ProcessStats) -> u64 {
    p.task_init + p.schedule + p.work_submit + p.task_destroy + p.sched_update
}

/// Per process: its live tasks, and (creation, latency) of its latest task with a
/// `TASK_INIT` → first allowed `SCHEDULE` latency.
#[allow(clippy::type_complexity)]
fn live_and_latency(stats: &Stats) -> (BTreeMap<u32, LiveTasks>, BTreeMap<u32, (u64, u64)>) {
    let mut live: BTreeMap<u32, LiveTasks> = BTreeMap::new();
    let mut latency: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for t in stats.tasks() {
        if let (Some(init), Some(l)) = (t.init_ns, t.init_to_schedule_ns()) {
            let e = latency.entry(t.pid).or_insert((init, l));
            if init >= e.0 {
                *e = (init, l);
            }
        }
        if t.end_ns.is_some() {
            continue;
        }
        let e = live.entry(t.pid).or_default();
        *e.0.entry(t.engine.clone().unwrap_or_else(|| "?".into()))
            .or_default() += 1;
        // The newest live task (by creation) gives the timeslice shown.
        let born = t.init_ns.unwrap_or(0);
        if e.1.is_none_or(|(b, _)| born >= b) {
            e.1 = Some((born, t.timeslice_us));
        }
    }
    (live, latency)
}

impl TopModel {
    /// The frame for `stats` at `elapsed_s` seconds of tracing; rates are against the previous
    /// call (the first frame's rates are over the time since the start). A process is exited
    /// when the statistics saw its exit ([`ProcessStats::exited_ns`]).
    ///
    /// [`ProcessStats::exited_ns`]: crate::model::stats::ProcessStats::exited_ns
    pub fn frame(
        &mut self,
        stats: &Stats,
        elapsed_s: f64,
        counters: Option<KernelCounters>,
    ) -> Frame {
        self.frame_with(stats, elapsed_s, counters, &|_| false)
    }

    /// [`frame`](Self::frame), where `gone(pid)` also says a process exited (live: no
    /// /proc/PID). A pid seen exited stays so until it has new events (asked again then).
    pub fn frame_with(
        &mut self,
        stats: &Stats,
        elapsed_s: f64,
        counters: Option<KernelCounters>,
        gone: &dyn Fn(u32) -> bool,
    ) -> Frame {
        let dt = (elapsed_s - self.previous_s).max(1e-3);
        let (mut live, latency) = live_and_latency(stats);
        let shares = stats.share.recent(SHARE_WINDOW_US);
        let share_of = |f: &dyn Fn(u32, u32) -> bool| {
            let v: Vec<f64> = shares
                .iter()
                .filter(|&&(g, p, _)| f(g, p))
                .map(|s| s.2)
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>())
        };
        let api_pids: std::collections::BTreeSet<u32> = stats.api_rows().map(|r| r.pid).collect();
        let mut now = BTreeMap::new();
        let mut processes: Vec<ProcessRow> = stats
            .processes()
            .map(|(pid, p)| {
                let c = Counts {
                    schedule: p.schedule,
                    refused: p.schedule_refused,
                    updates: p.sched_update,
                    events: total_events(p),
                };
                now.insert(pid, c);
                let before = self.previous.get(&pid).copied().unwrap_or_default();
                let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
                let quiet = self.previous.contains_key(&pid) && before.events == c.events;
                let exited = p.exited_ns.is_some()
                    || (quiet && self.dead_since.contains_key(&pid))
                    || gone(pid);
                // An exited process has no live task, whatever the tracer could not end one by
                // one (an MPS client's channels on the server's TSG: no TASK_DESTROY names them).
                let (by_engine, newest) = live.remove(&pid).filter(|_| !exited).unwrap_or_default();
                ProcessRow {
                    pid,
                    comm: crate::event::Comm(&p.comm).to_string(),
                    group: stats.row_label_of(pid).map(str::to_string),
                    live_total: by_engine.values().sum(),
                    live: by_engine,
                    schedules_per_s: rate(c.schedule, before.schedule),
                    refused_per_s: rate(c.refused, before.refused),
                    updates_per_s: rate(c.updates, before.updates),
                    schedules: c.schedule,
                    refused: c.refused,
                    timeslice_us: newest.and_then(|(_, ts)| ts),
                    init_to_schedule_us: latency.get(&pid).map(|&(_, l)| l / 1000),
                    gpu_share: share_of(&|_, p| p == pid),
                    exited,
                    api_per_s: stats.api_rate(pid),
                }
            })
            .collect();
        // `--api`: processes whose API calls made no driver event (yet).
        for &pid in &api_pids {
            if !processes.iter().any(|p| p.pid == pid) {
                let comm = stats
                    .api_process_name(pid)
                    .map(|n| crate::event::Comm(n).to_string());
                processes.push(ProcessRow {
                    group: stats.row_label_of(pid).map(str::to_string),
                    api_per_s: stats.api_rate(pid),
                    ..ProcessRow::idle(pid, comm.as_deref().unwrap_or("?"))
                });
            }
        }
        // Processes NVML names that made no traced call (started before tracing, or not
        // selected by the hooks): their share still shows.
        for &(_, pid, _) in &shares {
            if !processes.iter().any(|p| p.pid == pid) {
                processes.push(ProcessRow {
                    group: stats.row_label_of(pid).map(str::to_string),
                    gpu_share: share_of(&|_, p| p == pid),
                    ..ProcessRow::idle(pid, "?")
                });
            }
        }
        self.expired = self.expire(&mut processes, elapsed_s);
        sort_rows(&mut processes, self.sort);
        self.previous = now;
        self.previous_s = elapsed_s;
        let gpus = stats
            .gpu_concurrency()
            .map(|(driver, c)| GpuRow {
                gpu: stats.shown_gpu(driver),
                rm_device: driver,
                uuid: driver
                    .and_then(|g| stats.gpu_name(g))
                    .and_then(|(_, uuid)| uuid.clone()),
                live: c.live,
                max_live: c.max_live,
                share: driver
                    .and_then(|g| stats.gpu_name(g))
                    .and_then(|&(index, _)| share_of(&|g, _| g == index)),
            })
            .collect();
        let k = counters.unwrap_or(stats.kernel);
        Frame {
            elapsed_s,
            processes,
            gpus,
            dropped: k.dropped,
            emitted: k.emitted,
            events: stats.events(),
            sort: self.sort,
        }
    }

    /// Exited processes the last frame no longer shows ([`expire_s`](Self::expire_s); still
    /// in the statistics).
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// Notes when each exited process was first seen so, and takes out the rows exited for
    /// [`expire_s`](Self::expire_s) or longer: their count.
    fn expire(&mut self, processes: &mut Vec<ProcessRow>, now_s: f64) -> u64 {
        let before = processes.len();
        let dead_since = &mut self.dead_since;
        let expire_s = self.expire_s;
        processes.retain(|p| {
            if !p.exited {
                dead_since.remove(&p.pid);
                return true;
            }
            let since = *dead_since.entry(p.pid).or_insert(now_s);
            !(expire_s > 0.0 && now_s - since >= expire_s)
        });
        (before - processes.len()) as u64
    }
}

// ---------------------------------------------------------------------------------------------
// The view's state (scrolling, filter, help) and its columns: pure, so that the keys and the
// layout are tested as values; `gpu-trace`'s `top` module reads the terminal and draws.

/// A key, as the view knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Up,
    Down,
    Left,
    Right,
    PageUp,
    PageDown,
    Home,
    End,
    Enter,
    Esc,
    Backspace,
    F1,
    Char(char),
}

/// What a key asks of the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The view changed: draw it again.
    Redraw,
    /// Next sort order.
    Sort,
    Quit,
    /// Not a view key (replay's `n`, `p`, space, →, Enter).
    Other,
}

/// Scrolling, filter and help of the process table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// First row shown (of the filtered rows).
    pub offset: usize,
    /// Rows whose pid, comm or container contain this (case-insensitive); empty: all.
    pub filter: String,
    /// The filter being typed after `/` (Enter applies, Esc drops it).
    pub editing: Option<String>,
    /// The key help is shown over the table.
    pub help: bool,
}

/// The rows of a frame shown in a table of some height.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Indices into the filtered rows: `start..end`.
    pub start: usize,
    pub end: usize,
    /// Rows that pass the filter.
    pub matching: usize,
}

impl Window {
    /// Rows below the window.
    pub fn below(&self) -> usize {
        self.matching - self.end
    }
}

/// At most this many characters of filter text (it is typed by hand).
const MAX_FILTER: usize = 64;

impl View {
    /// Applies `key`; `page` is the number of rows the table shows.
    pub fn key(&mut self, key: Key, page: usize) -> Action {
        if let Some(text) = self.editing.as_mut() {
            match key {
                Key::Enter => {
                    self.filter = self.editing.take().unwrap_or_default();
                    self.offset = 0;
                }
                Key::Esc => {
                    self.editing = None;
                    self.filter.clear();
                    self.offset = 0;
                }
                Key::Backspace => {
                    text.pop();
                }
                Key::Char(c) if !c.is_control() && text.chars().count() < MAX_FILTER => {
                    text.push(c)
                }
                _ => {}
            }
            return Action::Redraw;
        }
        let page = page.max(1);
        if self.help {
            // Any key closes the help (as in htop), and does nothing else.
            self.help = false;
            return Action::Redraw;
        }
        match key {
            Key::Char('?' | 'h') | Key::F1 => self.help = true,
            Key::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                self.offset = 0;
            }
            Key::Esc | Key::Char('q') => return Action::Quit,
            Key::Char('s') => return Action::Sort,
            Key::Char('/') => self.editing = Some(self.filter.clone()),
            Key::Up | Key::Char('k') => self.offset = self.offset.saturating_sub(1),
            Key::Down | Key::Char('j') => self.offset = self.offset.saturating_add(1),
            Key::PageUp => self.offset = self.offset.saturating_sub(page),
            Key::PageDown => self.offset = self.offset.saturating_add(page),
            Key::Home | Key::Char('g') => self.offset = 0,
            Key::End | Key::Char('G') => self.offset = usize::MAX,
            _ => return Action::Other,
        }
        Action::Redraw
    }

    /// Whether `row` passes the filter (the one being typed, while it is).
    pub fn matches(&self, row: &ProcessRow) -> bool {
        let f = self.editing.as_ref().unwrap_or(&self.filter).to_lowercase();
        f.is_empty()
            || row.pid.to_string().contains(&f)
            || row.comm.to_lowercase().contains(&f)
            || row
                .group
                .as_ref()
                .is_some_and(|g| g.to_lowercase().contains(&f))
    }

    /// The rows of `frame` that pass the filter, in its order.
    pub fn rows<'a>(&self, frame: &'a Frame) -> Vec<&'a ProcessRow> {
        frame.processes.iter().filter(|p| self.matches(p)).collect()
    }

    /// The window of `matching` rows in `height` lines; the offset is kept within the rows
    /// (End scrolls to the last page).
    pub fn window(&mut self, matching: usize, height: usize) -> Window {
        self.offset = self.offset.min(matching.saturating_sub(height));
        Window {
            start: self.offset,
            end: (self.offset + height).min(matching),
            matching,
        }
    }
}

/// The sort line: the current order and the others `s` goes through, the current marked.
pub fn sort_line(sort: SortBy) -> String {
    let mut keys = Vec::new();
    let mut s = SortBy::default();
    for _ in 0..3 {
        keys.push(if s == sort {
            format!("[{}]", s.name())
        } else {
            s.name().to_string()
        });
        s = s.next();
    }
    format!("sorted by {}   s: {}", sort.name(), keys.join(" "))
}

/// The line under the table: rows shown of how many, "+N more", the filter, exited rows
/// (`expired`: [`TopModel::expired`]).
pub fn status_line(frame: &Frame, view: &View, w: &Window, expire_s: f64, expired: u64) -> String {
    let mut parts = Vec::new();
    if w.matching == 0 {
        parts.push("no rows".to_string());
    } else {
        parts.push(format!("rows {}-{} of {}", w.start + 1, w.end, w.matching));
    }
    if w.below() > 0 {
        parts.push(format!("+{} more (Down/PgDn)", w.below()));
    }
    if w.start > 0 {
        parts.push(format!("{} above (Up/PgUp)", w.start));
    }
    if let Some(t) = &view.editing {
        parts.push(format!("filter: {t}_ (Enter applies, Esc clears)"));
    } else if !view.filter.is_empty() {
        parts.push(format!("filter: {} (Esc clears)", view.filter));
    }
    let exited = frame.processes.iter().filter(|p| p.exited).count();
    if exited > 0 || expired > 0 {
        let keep = if expire_s > 0.0 {
            format!("shown {expire_s} s")
        } else {
            "kept".to_string()
        };
        parts.push(format!("x exited: {exited} ({keep}), {expired} expired"));
    }
    parts.push("?: help".into());
    parts.join("   ")
}

/// The help overlay's lines (`stepping`: `replay --top`).
pub fn help_lines(stepping: bool) -> Vec<&'static str> {
    let mut lines = vec![
        "Keys",
        "  Up/Down, j/k      scroll one row",
        "  PgUp/PgDn         scroll one page",
        "  Home/End, g/G     first / last rows",
        "  s                 sort: SCHED/s, LIVE, PID (the current one in [ ])",
        "  /                 filter: pid, comm or container; Enter applies, Esc clears",
        "  ?, h, F1          this help (any key closes it)",
        "  q, Esc, Ctrl-C    quit (Esc first clears the filter)",
    ];
    if stepping {
        lines.extend([
            "  n, space, Right   next second of the recording (also Enter)",
            "  p                 play (a second per second) / pause",
        ]);
    }
    lines.extend([
        "",
        "Rows",
        "  S = x             the process exited (dimmed); gone after --expire s",
        "  REFUSED/s red     the driver refused schedules since the last frame",
        "  LIVE              live tasks by engine (cut to 3 letters, or the total,",
        "                    when narrow); narrow terminals drop CONTAINER/POD,",
        "                    TIMESLICE, UPD/s and INIT→SCHED first",
        "  API/s             --api: the process's GPU API calls per second between",
        "                    the tracer's last two reads (all libraries and",
        "                    symbols; shown only when the run has API figures)",
    ]);
    lines
}

/// The process table's columns, in the order they are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Pid,
    State,
    Comm,
    Group,
    Live,
    SchedRate,
    RefusedRate,
    UpdRate,
    Schedules,
    Refused,
    Share,
    Timeslice,
    Latency,
    /// `--api`: API calls per second (only in [`layout_for`] with `api`).
    Api,
}

impl Column {
    /// Every column, in display order.
    pub const ALL: [Column; 13] = [
        Self::Pid,
        Self::State,
        Self::Comm,
        Self::Group,
        Self::Live,
        Self::SchedRate,
        Self::RefusedRate,
        Self::UpdRate,
        Self::Schedules,
        Self::Refused,
        Self::Share,
        Self::Timeslice,
        Self::Latency,
    ];

    /// Which columns stay when the terminal is narrow: first ones first.
    const PRIORITY: [Column; 13] = [
        Self::Pid,
        Self::State,
        Self::Comm,
        Self::Live,
        Self::SchedRate,
        Self::RefusedRate,
        Self::Schedules,
        Self::Refused,
        Self::Share,
        Self::Group,
        Self::Timeslice,
        Self::UpdRate,
        Self::Latency,
    ];

    pub fn header(self) -> &'static str {
        match self {
            Self::Pid => "PID",
            Self::State => "S",
            Self::Comm => "COMM",
            Self::Group => "CONTAINER/POD",
            Self::Live => "LIVE",
            Self::SchedRate => "SCHED/s",
            Self::RefusedRate => "REFUSED/s",
            Self::UpdRate => "UPD/s",
            Self::Schedules => "SCHEDULES",
            Self::Refused => "REFUSED",
            Self::Share => "GPU%",
            Self::Timeslice => "TIMESLICE",
            Self::Latency => "INIT→SCHED us",
            Self::Api => "API/s",
        }
    }

    /// Columns wide (never less than the header: no header is cut). `Live` takes what is
    /// left beyond this.
    pub fn width(self) -> u16 {
        match self {
            Self::Pid => 7,
            Self::State => 1,
            Self::Comm => 15,
            Self::Group => 16,
            Self::Live => 12,
            Self::SchedRate => 7,
            Self::RefusedRate => 9,
            Self::UpdRate => 5,
            Self::Schedules => 9,
            Self::Refused => 7,
            Self::Share => 5,
            Self::Timeslice => 9,
            Self::Latency => 13,
            Self::Api => 7,
        }
    }

    /// The column `sort` orders by.
    pub fn of_sort(sort: SortBy) -> Self {
        match sort {
            SortBy::ScheduleRate => Self::SchedRate,
            SortBy::Live => Self::Live,
            SortBy::Pid => Self::Pid,
        }
    }

    /// The cell of `row` in a column `width` wide: the live tasks by engine, else with the
    /// engines cut to 3 letters (`COP:3 GRA:1`), else their total; the others as they are.
    pub fn cell_in(self, p: &ProcessRow, width: u16) -> String {
        let full = self.cell(p);
        if self != Self::Live || full.chars().count() <= usize::from(width) {
            return full;
        }
        let short = p
            .live
            .iter()
            .map(|(e, n)| format!("{}:{n}", e.chars().take(3).collect::<String>()))
            .collect::<Vec<_>>()
            .join(" ");
        if short.chars().count() <= usize::from(width) {
            short
        } else {
            p.live_total.to_string()
        }
    }

    /// The cell of `row`.
    pub fn cell(self, p: &ProcessRow) -> String {
        let opt = |v: Option<u64>| v.map_or_else(|| "?".into(), |v| v.to_string());
        match self {
            Self::Pid => p.pid.to_string(),
            Self::State => if p.exited { "x" } else { "" }.into(),
            Self::Comm => p.comm.clone(),
            Self::Group => p.group.clone().unwrap_or_else(|| "-".into()),
            Self::Live if p.live.is_empty() => "0".into(),
            Self::Live => p
                .live
                .iter()
                .map(|(e, n)| format!("{e}:{n}"))
                .collect::<Vec<_>>()
                .join(" "),
            Self::SchedRate => format!("{:.1}", p.schedules_per_s),
            Self::RefusedRate => format!("{:.1}", p.refused_per_s),
            Self::UpdRate => format!("{:.1}", p.updates_per_s),
            Self::Schedules => p.schedules.to_string(),
            Self::Refused => p.refused.to_string(),
            Self::Share => percent(p.gpu_share),
            Self::Timeslice => opt(p.timeslice_us),
            Self::Latency => opt(p.init_to_schedule_us),
            Self::Api => p.api_per_s.map_or_else(|| "-".into(), compact_rate),
        }
    }
}

/// A share column: `33.0`, `-` without samples.
pub fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}", v * 100.0))
}

/// The columns that fit `width` terminal columns (one space between two), dropped by
/// [`Column::PRIORITY`] from the last; in display order.
pub fn columns(width: u16) -> Vec<Column> {
    layout(width).into_iter().map(|(c, _)| c).collect()
}

/// [`columns`] with the width each gets: [`Column::width`], `Live` what is left over.
pub fn layout(width: u16) -> Vec<(Column, u16)> {
    layout_for(width, false)
}

/// A rate that fits the `API/s` column (7 wide): one decimal below 1000, whole numbers below
/// a million, then millions (`12.3M`): a launch-bound process makes 10^5 calls a second.
fn compact_rate(v: f64) -> String {
    if v < 1000.0 {
        format!("{v:.1}")
    } else if v < 1e6 {
        format!("{v:.0}")
    } else {
        format!("{:.1}M", v / 1e6)
    }
}

/// Whether `frame` has API figures (`--api`): [`layout_for`] then adds the `API/s` column.
pub fn has_api(frame: &Frame) -> bool {
    frame.processes.iter().any(|p| p.api_per_s.is_some())
}

/// [`layout`], with the `API/s` column after `REFUSED` when `api` (kept before `GPU%` when
/// narrow).
pub fn layout_for(width: u16, api: bool) -> Vec<(Column, u16)> {
    let with_api = |list: &[Column]| {
        let mut v = list.to_vec();
        if api {
            let at = v
                .iter()
                .position(|&c| c == Column::Refused)
                .map_or(0, |i| i + 1);
            v.insert(at, Column::Api);
        }
        v
    };
    let mut kept: Vec<Column> = Vec::new();
    let mut used = 0u16;
    for c in with_api(&Column::PRIORITY) {
        let need = c.width() + u16::from(!kept.is_empty());
        if used + need <= width {
            used += need;
            kept.push(c);
        }
    }
    let spare = width - used;
    with_api(&Column::ALL)
        .into_iter()
        .filter(|c| kept.contains(c))
        .map(|c| (c, c.width() + if c == Column::Live { spare } else { 0 }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{
        DestroyCause, Engine, Event, EventKind, Origin, TaskId, TaskKey, ValueSource,
    };

    fn ev(ts_ms: u64, pid: u32, handle: u32, kind: EventKind) -> Event {
        Event {
            origin: Origin {
                ts_ns: ts_ms * 1_000_000,
                cpu: 0,
                pid,
                tid: pid,
                comm: compact_str::format_compact!("p{pid}"),
            },
            kind,
            amd: None,
            api: None,
            key: Some(TaskKey {
                pid,
                client: Some(1),
                object: handle,
                generation: 1,
            }),
        }
    }

    fn init(handle: u32, engine: Engine, ts: u64) -> EventKind {
        EventKind::TaskInit {
            task: TaskId::RmHandle(handle),
            client: 1,
            engine: Some(engine),
            engine_type: None,
            timeslice_us: Some(ts),
            timeslice_source: ValueSource::DriverDefault,
            interleave: None,
            interleave_source: ValueSource::DriverDefault,
            runlist: None,
            gpu: Some(0),
        }
    }

    fn schedule(handle: u32, allowed: bool) -> EventKind {
        EventKind::Schedule {
            task: TaskId::RmHandle(handle),
            client: 1,
            channels: None,
            timeslice_us: None,
            interleave: None,
            allowed,
            rm_status: Some(0),
            errno: if allowed { 0 } else { -1 },
            via_channel: false,
        }
    }

    fn api_row(pid: u32, symbol: &str, calls: u64) -> crate::api::stats::CallStats {
        crate::api::stats::CallStats::for_test(pid, symbol, calls)
    }

    /// `--api`: a process's API/s is the growth of its calls (all symbols summed) between the
    /// last two reads, by the reads' times (not the frames'); a process with API figures but no driver event has a row; the
    /// `API/s` column shows only when a row has API figures (a run without `--api` keeps its
    /// screen).
    #[test]
    fn api_rate_is_the_growth_of_the_calls_between_two_reads() {
        const S: u64 = 1_000_000_000;
        let mut s = Stats::new();
        s.record(&ev(1, 10, 1, schedule(1, true)));
        let mut m = TopModel::default();
        let f0 = m.frame(&s, 1.0, None);
        assert_eq!(f0.processes[0].api_per_s, None);
        assert!(!has_api(&f0));
        assert!(
            !layout_for(200, has_api(&f0))
                .iter()
                .any(|&(c, _)| c == Column::Api)
        );
        // The first read: figures, no rate yet.
        s.record_api(&api_row(10, "cuInit", 5), 10 * S);
        s.record_api(&api_row(10, "cuLaunchKernel", 100), 10 * S);
        s.record_api(&api_row(30, "cuInit", 1), 10 * S);
        let f1 = m.frame(&s, 2.0, None);
        let row = |f: &Frame, pid| f.processes.iter().find(|p| p.pid == pid).unwrap().clone();
        assert_eq!(row(&f1, 10).api_per_s, Some(0.0));
        assert_eq!(row(&f1, 30).comm, "?");
        // Two reads 2 s apart: 40 more calls of process 10 → 20/s, whatever the frames'
        // times (two frames inside one read interval, or one frame over two reads).
        s.record_api(&api_row(10, "cuLaunchKernel", 140), 12 * S);
        let f2 = m.frame(&s, 2.1, None);
        let f3 = m.frame(&s, 5.0, None);
        assert_eq!(row(&f2, 10).api_per_s, Some(20.0));
        assert_eq!(row(&f3, 10).api_per_s, Some(20.0));
        assert_eq!(Column::Api.cell(&row(&f2, 10)), "20.0");
        // A launch-bound process's rate fits the column whole (seen cut to `138238.`).
        for (v, text) in [
            (999.94, "999.9"),
            (138_238.4, "138238"),
            (12_345_678.0, "12.3M"),
        ] {
            let p = ProcessRow {
                api_per_s: Some(v),
                ..row(&f2, 10)
            };
            let cell = Column::Api.cell(&p);
            assert_eq!(cell, text);
            assert!(cell.len() <= usize::from(Column::Api.width()));
        }
        // A read that found no growth (the row sent once more) brings it to 0.
        s.record_api(&api_row(10, "cuLaunchKernel", 140), 13 * S);
        assert_eq!(row(&m.frame(&s, 6.0, None), 10).api_per_s, Some(0.0));
        assert!(has_api(&f2));
        let cols = columns_of(layout_for(200, true));
        let at = |c| cols.iter().position(|&x| x == c).unwrap();
        assert_eq!(at(Column::Api), at(Column::Refused) + 1);
        assert_eq!(columns_of(layout_for(200, false)), columns(200));

        // Named by its API records once they carry a name (escaped as every comm).
        s.name_api_process(30, "cuda\x1bjob");
        s.name_api_process(31, "not-kept");
        assert_eq!(s.api_process_name(31), None);
        let named = m.frame(&s, 7.0, None);
        assert_eq!(row(&named, 30).comm, "cuda\\x1bjob");
    }

    fn columns_of(l: Vec<(Column, u16)>) -> Vec<Column> {
        l.into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn rates_live_tasks_latency_and_sorting() {
        let mut s = Stats::new();
        // Process 10: a GRAPHICS TSG (1024 µs) scheduled 3 ms after creation, a COPY TSG
        // (2048 µs, newer) scheduled 1 ms after; process 20: one refused schedule of a TSG
        // that then ends.
        s.record(&ev(100, 10, 0xa, init(0xa, Engine::Graphics, 1024)));
        s.record(&ev(103, 10, 0xa, schedule(0xa, true)));
        s.record(&ev(200, 10, 0xb, init(0xb, Engine::Copy, 2048)));
        s.record(&ev(201, 10, 0xb, schedule(0xb, true)));
        s.record(&ev(300, 20, 0xc, init(0xc, Engine::Graphics, 1024)));
        s.record(&ev(301, 20, 0xc, schedule(0xc, false)));
        s.record(&ev(
            302,
            20,
            0xc,
            EventKind::TaskDestroy {
                task: TaskId::RmHandle(0xc),
                client: 1,
                cause: DestroyCause::Free,
                implicit: false,
                final_params: None,
            },
        ));
        let mut m = TopModel::default();
        let f = m.frame(&s, 2.0, None);
        assert_eq!(f.processes.len(), 2);
        let p10 = f.processes.iter().find(|p| p.pid == 10).unwrap();
        assert_eq!(p10.live_total, 2);
        assert_eq!(p10.live.get("GRAPHICS"), Some(&1));
        assert_eq!(p10.live.get("COPY"), Some(&1));
        // 2 schedules in the first 2 s.
        assert_eq!(p10.schedules_per_s, 1.0);
        assert_eq!(p10.timeslice_us, Some(2048), "the newest live task's");
        assert_eq!(
            p10.init_to_schedule_us,
            Some(1000),
            "the latest task's latency"
        );
        let p20 = f.processes.iter().find(|p| p.pid == 20).unwrap();
        assert_eq!(
            (p20.live_total, p20.refused, p20.refused_per_s),
            (0, 1, 0.5)
        );
        // Busiest first: both 1 schedule/s... 10 has 1.0, 20 0.5.
        assert_eq!(f.processes[0].pid, 10);

        // Next frame, one more schedule of 20 in 0.5 s: its rate is over that interval.
        s.record(&ev(2100, 20, 0xd, schedule(0xd, true)));
        let f = m.frame(&s, 2.5, None);
        let p20 = f.processes.iter().find(|p| p.pid == 20).unwrap();
        assert_eq!(p20.schedules_per_s, 2.0);
        assert_eq!(f.processes[0].pid, 20, "now the busiest");
        m.sort = SortBy::Live;
        let f = m.frame(&s, 3.5, None);
        assert_eq!(f.processes[0].pid, 10, "most live tasks first");
        assert_eq!(
            f.processes[0].schedules_per_s, 0.0,
            "nothing in the last second"
        );
        m.sort = m.sort.next();
        let f = m.frame(&s, 4.5, None);
        assert_eq!(
            f.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
            [10, 20]
        );
    }

    fn destroy(handle: u32, cause: DestroyCause) -> EventKind {
        EventKind::TaskDestroy {
            task: TaskId::RmHandle(handle),
            client: 1,
            cause,
            implicit: cause.is_implicit(),
            final_params: None,
        }
    }

    /// An MPS client's channel on the server's TSG (keyed by the channel, as the tracer does).
    fn shared_submit(channel: u32) -> EventKind {
        EventKind::WorkSubmit {
            task: TaskId::Shared(0x5c00000f),
            client: 1,
            channel_handle: channel,
            chid: Some(14),
            runlist: Some(0),
            token: 14,
            gpu: None,
        }
    }

    /// Issue 30: an exited MPS client showed `LIVE ?:2` for ever: its channels on the server's
    /// TSG get no TASK_DESTROY (the server owns the TSG), so the statistics keep them live.
    /// Once the process's exit is seen (its own TSGs' `process_exit`), it has no live task, its
    /// row is marked exited, and after `expire_s` of frames it is no longer shown (still in the
    /// statistics); a new event of the pid (reused) brings it back alive.
    #[test]
    fn an_exited_mps_client_has_no_live_tasks_and_expires() {
        let mut s = Stats::new();
        s.record(&ev(100, 500, 0x1d, shared_submit(0x1d)));
        s.record(&ev(101, 500, 0x23, shared_submit(0x23)));
        s.record(&ev(102, 500, 0x27, init(0x27, Engine::Copy, 1024)));
        s.record(&ev(103, 500, 0x27, schedule(0x27, true)));
        s.record(&ev(104, 538, 0x15, init(0x15, Engine::Graphics, 1024)));
        let mut m = TopModel::default();
        let f = m.frame(&s, 1.0, None);
        let p = f.processes.iter().find(|p| p.pid == 500).unwrap();
        assert_eq!((p.live_total, p.exited), (3, false), "{p:?}");

        s.record(&ev(
            2000,
            500,
            0x27,
            destroy(0x27, DestroyCause::ProcessExit),
        ));
        let f = m.frame(&s, 2.0, None);
        let p = f.processes.iter().find(|p| p.pid == 500).unwrap();
        assert!(p.exited, "{p:?}");
        assert_eq!((p.live_total, p.live.len()), (0, 0), "{p:?}");
        assert_eq!(p.timeslice_us, None);
        assert_eq!(p.schedules, 1, "its totals stay");
        let server = f.processes.iter().find(|p| p.pid == 538).unwrap();
        assert_eq!((server.live_total, server.exited), (1, false));
        assert!(format!("{f:#?}").contains("exited: true"));

        // Still shown 9.9 s after it was first seen exited, gone at 10 s.
        let f = m.frame(&s, 11.9, None);
        assert!(f.processes.iter().any(|p| p.pid == 500));
        assert_eq!(m.expired(), 0);
        let f = m.frame(&s, 12.0, None);
        assert!(f.processes.iter().all(|p| p.pid != 500), "{f:#?}");
        assert_eq!(m.expired(), 1);
        assert_eq!(
            s.process(500).unwrap().schedule,
            1,
            "kept in the statistics"
        );

        // The pid reused: alive again.
        s.record(&ev(20_000, 500, 0x31, schedule(0x31, false)));
        let f = m.frame(&s, 20.0, None);
        let p = f.processes.iter().find(|p| p.pid == 500).unwrap();
        assert!(!p.exited, "{p:?}");
        assert_eq!(m.expired(), 0);
    }

    /// A process in a pod the node named: its row shows `NAMESPACE/NAME` first (where the
    /// narrow column shows it), the `/` filter finds it by name and by container id; a pod not
    /// named keeps the statistics' label (runtime, short id, UID).
    #[test]
    fn a_named_pods_row_shows_its_name_and_the_filter_finds_it() {
        use crate::model::workload::{Attribution, PodNames};
        const UID: &str = "11111111-2222-4333-8444-555555555501";
        let id = "c1c1c1c1aaaa000000000000000000000000000000000000000000000000c1c1";
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
            UID.replace('-', "_")
        );
        let mut s = Stats::new();
        s.record(&ev(100, 7, 0xa, schedule(0xa, true)));
        s.record(&ev(100, 8, 0xb, schedule(0xb, true)));
        let mut named = Attribution::new(1, Some(path.clone()), None);
        named.names = Some(PodNames {
            namespace: "ml-team".into(),
            pod: "trainer-0".into(),
            container: Some("cuda".into()),
        });
        s.set_group(7, named.group().unwrap(), named.row_label());
        let unnamed = Attribution::new(2, Some(path), None);
        s.set_group(8, unnamed.group().unwrap(), unnamed.row_label());
        let f = TopModel::default().frame(&s, 1.0, None);
        let row = |pid: u32| f.processes.iter().find(|p| p.pid == pid).unwrap();
        let cell = Column::Group.cell_in(row(7), Column::Group.width());
        assert!(cell.starts_with("ml-team/trainer"), "{cell}");
        assert_eq!(
            row(7).group.as_deref(),
            Some("ml-team/trainer-0 containerd c1c1c1c1aaaa")
        );
        assert_eq!(
            row(8).group.as_deref(),
            Some(&*format!("containerd c1c1c1c1aaaa pod {UID} (burstable)"))
        );
        // The statistics' label names the pod as well (kept apart from top's shorter one).
        assert_eq!(
            s.group_of(7),
            Some("containerd c1c1c1c1aaaa pod ml-team/trainer-0 (burstable)")
        );
        let mut v = View::default();
        for (text, want) in [
            ("trainer-0", vec![7]),
            ("ML-TEAM", vec![7]),
            ("c1c1", vec![7, 8]),
        ] {
            v.filter = text.into();
            let pids: Vec<u32> = v.rows(&f).iter().map(|p| p.pid).collect();
            assert_eq!(pids, want, "{text}");
        }
    }

    #[test]
    fn expire_0_keeps_exited_rows_and_gone_marks_them() {
        let mut s = Stats::new();
        s.record(&ev(100, 7, 0xa, schedule(0xa, false)));
        s.record(&ev(100, 8, 0xb, schedule(0xb, false)));
        let mut m = TopModel {
            expire_s: 0.0,
            ..TopModel::default()
        };
        // Live: 7 has no /proc entry any more. It stays exited while it has no new events,
        // without asking again.
        let f = m.frame_with(&s, 1.0, None, &|pid| pid == 7);
        let exited = |f: &Frame| -> Vec<u32> {
            f.processes
                .iter()
                .filter(|p| p.exited)
                .map(|p| p.pid)
                .collect()
        };
        assert_eq!(exited(&f), [7]);
        let f = m.frame_with(&s, 1000.0, None, &|_| false);
        assert_eq!(
            (exited(&f), m.expired(), f.processes.len()),
            (vec![7], 0, 2)
        );
    }

    #[test]
    fn keys_scroll_filter_help_sort_and_quit() {
        let mut v = View::default();
        // 50 rows in a table of 20.
        assert_eq!(
            v.window(50, 20),
            Window {
                start: 0,
                end: 20,
                matching: 50
            }
        );
        assert_eq!(v.key(Key::Down, 20), Action::Redraw);
        assert_eq!(v.key(Key::Char('j'), 20), Action::Redraw);
        assert_eq!(v.window(50, 20).start, 2);
        v.key(Key::Char('k'), 20);
        v.key(Key::PageDown, 20);
        assert_eq!(v.window(50, 20).start, 21);
        v.key(Key::PageDown, 20);
        let w = v.window(50, 20);
        assert_eq!(
            (w.start, w.end, w.below()),
            (30, 50, 0),
            "never past the last page"
        );
        v.key(Key::Home, 20);
        assert_eq!(v.window(50, 20).start, 0);
        v.key(Key::End, 20);
        assert_eq!(v.window(50, 20).start, 30);
        v.key(Key::PageUp, 20);
        assert_eq!(v.window(50, 20).start, 10);
        v.key(Key::Up, 20);
        assert_eq!(v.window(50, 20).start, 9);
        // Fewer rows than lines: no scrolling.
        v.key(Key::Char('G'), 20);
        assert_eq!(
            v.window(5, 20),
            Window {
                start: 0,
                end: 5,
                matching: 5
            }
        );

        // Help: ?, h, F1 show it; any key closes it and does nothing else (not q, not Esc).
        for k in [Key::Char('?'), Key::Char('h'), Key::F1] {
            v.key(k, 20);
            assert!(v.help);
            assert_eq!(v.key(Key::Char('q'), 20), Action::Redraw);
            assert!(!v.help);
        }
        v.key(Key::F1, 20);
        assert_eq!(v.key(Key::Esc, 20), Action::Redraw);
        assert!(!v.help);
        v.key(Key::Char('?'), 20);
        assert_eq!(
            v.key(Key::Char('s'), 20),
            Action::Redraw,
            "closes, does not sort"
        );
    }

    #[test]
    fn the_filter_is_typed_applied_and_cleared() {
        let mut v = View::default();
        // Filter: typed after /, shown while typed, applied by Enter, cleared by Esc.
        let row = |pid: u32, comm: &str, group: Option<&str>| ProcessRow {
            group: group.map(str::to_string),
            ..ProcessRow::idle(pid, comm)
        };
        let frame = Frame {
            elapsed_s: 1.0,
            processes: vec![
                row(4242, "python3", None),
                row(17, "Trainer", Some("pod-a")),
                row(99, "bash", Some("ctr-B")),
            ],
            gpus: Vec::new(),
            dropped: 0,
            emitted: 0,
            events: 0,
            sort: SortBy::Pid,
        };
        let pids = |v: &View| v.rows(&frame).iter().map(|p| p.pid).collect::<Vec<_>>();
        v.key(Key::End, 20);
        assert_eq!(v.key(Key::Char('/'), 20), Action::Redraw);
        for c in "TRAIN".chars() {
            assert_eq!(
                v.key(Key::Char(c), 20),
                Action::Redraw,
                "typed, not a command"
            );
        }
        assert_eq!(pids(&v), [17], "comm, case-insensitive, while typing");
        v.key(Key::Backspace, 20);
        v.key(Key::Enter, 20);
        assert_eq!(
            (v.filter.as_str(), v.editing.as_ref(), v.offset),
            ("TRAI", None, 0)
        );
        v.key(Key::Char('/'), 20);
        v.key(Key::Esc, 20);
        assert_eq!(pids(&v), [4242, 17, 99], "Esc while typing clears it");
        for (text, want) in [("42", vec![4242]), ("ctr-b", vec![99]), ("nomatch", vec![])] {
            v.key(Key::Char('/'), 20);
            for c in text.chars() {
                v.key(Key::Char(c), 20);
            }
            v.key(Key::Enter, 20);
            assert_eq!(pids(&v), want, "{text}");
            assert_eq!(v.key(Key::Char('/'), 20), Action::Redraw);
            v.key(Key::Esc, 20);
        }
        v.filter = "bash".into();
        assert_eq!(
            v.key(Key::Esc, 20),
            Action::Redraw,
            "Esc clears an applied filter"
        );
        assert!(v.filter.is_empty());

        assert_eq!(v.key(Key::Char('s'), 20), Action::Sort);
        assert_eq!(v.key(Key::Char('n'), 20), Action::Other);
        assert_eq!(v.key(Key::Right, 20), Action::Other);
        assert_eq!(v.key(Key::Char('q'), 20), Action::Quit);
        assert_eq!(v.key(Key::Esc, 20), Action::Quit);
    }

    #[test]
    fn columns_fit_the_width_by_priority_and_headers_are_never_cut() {
        let width = |cols: &[Column]| -> u16 {
            cols.iter().map(|c| c.width()).sum::<u16>() + cols.len() as u16 - 1
        };
        for c in Column::ALL {
            assert!(
                c.header().chars().count() <= usize::from(c.width()),
                "{c:?}"
            );
        }
        assert_eq!(columns(200), Column::ALL);
        let at80 = columns(80);
        assert!(width(&at80) <= 80);
        use Column::*;
        assert_eq!(
            at80,
            [
                Pid,
                State,
                Comm,
                Live,
                SchedRate,
                RefusedRate,
                Schedules,
                Refused,
                Share
            ]
        );
        for w in 40..200 {
            let cols = columns(w);
            assert!(width(&cols) <= w, "{w}: {cols:?}");
            assert!(
                cols.starts_with(&[Column::Pid, Column::State, Column::Comm]),
                "{w}"
            );
        }
    }

    #[test]
    fn sort_and_status_lines() {
        assert_eq!(
            sort_line(SortBy::Live),
            "sorted by LIVE   s: SCHED/s [LIVE] PID"
        );
        let mut m = TopModel::default();
        let mut s = Stats::new();
        for pid in 1..=30 {
            s.record(&ev(100, pid, 1, schedule(1, true)));
        }
        s.record(&ev(100, 31, 1, init(1, Engine::Copy, 1024)));
        s.record(&ev(101, 31, 1, destroy(1, DestroyCause::ProcessExit)));
        let f = m.frame(&s, 1.0, None);
        let mut v = View::default();
        let w = v.window(v.rows(&f).len(), 10);
        assert_eq!(
            status_line(&f, &v, &w, 10.0, 0),
            "rows 1-10 of 31   +21 more (Down/PgDn)   x exited: 1 (shown 10 s), 0 expired   ?: help"
        );
        v.key(Key::PageDown, 10);
        v.filter = "p".into();
        let w = v.window(v.rows(&f).len(), 10);
        assert_eq!(
            status_line(&f, &v, &w, 0.0, 0),
            "rows 11-20 of 31   +11 more (Down/PgDn)   10 above (Up/PgUp)   filter: p (Esc clears)   x exited: 1 (kept), 0 expired   ?: help"
        );
        let x = f.processes.iter().find(|p| p.pid == 31).unwrap();
        assert_eq!(
            (Column::State.cell(x), Column::Live.cell(x)),
            ("x".into(), "0".into())
        );
        for p in &f.processes {
            for c in Column::ALL {
                assert_eq!(c.cell_in(p, 200), c.cell(p));
            }
        }
    }

    #[test]
    fn live_is_cut_on_purpose_when_narrow() {
        let mut s = Stats::new();
        s.record(&ev(100, 538, 0x15, init(0x15, Engine::Graphics, 1024)));
        for h in [0x22, 0x27, 0x2c] {
            s.record(&ev(101, 538, h, init(h, Engine::Copy, 1024)));
        }
        let f = TopModel::default().frame(&s, 1.0, None);
        let p = &f.processes[0];
        assert_eq!(Column::Live.cell_in(p, 17), "COPY:3 GRAPHICS:1");
        assert_eq!(Column::Live.cell_in(p, 16), "COP:3 GRA:1");
        assert_eq!(Column::Live.cell_in(p, 10), "4");
        // At 80 columns LIVE gets what the others leave: all 80 used.
        let l = layout(80);
        let used: u16 = l.iter().map(|&(_, w)| w).sum::<u16>() + l.len() as u16 - 1;
        assert_eq!(used, 80);
        assert!(l.contains(&(Column::Live, 12)), "{l:?}");
    }
}
