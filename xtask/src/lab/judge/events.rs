//! gpu-trace's JSON lines as the guest handed them back (a run's `<run>.jsonl` block), read once
//! into typed values (docs/json-schema.md). Only the fields the checks judge are typed; each
//! event keeps its whole line (`raw`) for the checks that compare events as a whole and for the
//! failures that quote them (an event prints as its JSON value).

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

/// The task an event names (`task`: `{kind, value}`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub(in crate::lab) struct Task {
    pub kind: Option<String>,
    pub value: Option<u64>,
}

/// AMD's section of an event (`amd`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub(in crate::lab) struct Amd {
    pub via: Option<String>,
    pub gpu_id: Option<u64>,
    pub queue_type: Option<String>,
    pub priority: Option<u64>,
    pub percentage: Option<u64>,
    pub ring_size: Option<u64>,
    pub sdma_engine_id: Option<u64>,
}

/// The process's cgroup (`cgroup`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub(in crate::lab) struct Cgroup {
    pub path: Option<String>,
}

/// The typed fields of one event line.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub(in crate::lab) struct Fields {
    pub event: String,
    pub pid: Option<i64>,
    pub comm: Option<String>,
    pub task: Task,
    pub allowed: Option<bool>,
    pub errno: Option<i64>,
    pub client: Option<u64>,
    pub engine: Option<String>,
    pub cause: Option<String>,
    pub rm_status: Option<i64>,
    pub channels: Option<u64>,
    pub timeslice_us: Option<u64>,
    pub timeslice_source: Option<String>,
    pub interleave: Option<String>,
    pub token: Option<i64>,
    pub channel_handle: Option<u64>,
    pub via_channel: Option<bool>,
    pub amd: Option<Amd>,
    pub cgroup: Option<Cgroup>,
}

/// One event line: its typed fields, and the line as JSON.
#[derive(Clone, PartialEq)]
pub(in crate::lab) struct Event {
    pub f: Fields,
    pub raw: Value,
}

impl std::ops::Deref for Event {
    type Target = Fields;
    fn deref(&self) -> &Fields {
        &self.f
    }
}

/// An event prints as its line's JSON value (`{:?}` as `serde_json::Value` does).
impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.raw, f)
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.raw, f)
    }
}

impl Event {
    /// `EVENT kind=value` (its task), for a check's detail.
    pub fn brief(&self) -> String {
        format!(
            "{} {}={}",
            self.raw["event"].as_str().unwrap_or("?"),
            self.raw["task"]["kind"].as_str().unwrap_or("?"),
            self.raw["task"]["value"]
        )
    }

    pub fn is(&self, event: &str) -> bool {
        self.f.event == event
    }
}

/// The kernel's counters of the `STATS` line (`kernel`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(in crate::lab) struct Kernel {
    pub emitted: Option<u64>,
    pub ignored: Option<u64>,
    pub dropped: Option<u64>,
    pub read_failed: Option<u64>,
    pub denied: Option<u64>,
}

/// What gpu-trace saw and did not report (`unreported`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(in crate::lab) struct Unreported {
    pub kfd_release_no_queues: Option<u64>,
    pub gpu_ext_unmatched: Option<u64>,
}

/// The `STATS` line at exit.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(in crate::lab) struct Stats {
    pub kernel: Kernel,
    pub unreported: Unreported,
}

/// A run's output: its events (the `STATS` line among them, in order), the `STATS` line typed,
/// and the lines that are not gpu-trace's JSON objects.
#[derive(Clone, Debug, Default)]
pub(in crate::lab) struct Output {
    pub events: Vec<Event>,
    pub stats: Option<Stats>,
    pub bad: Vec<String>,
}

impl Output {
    pub fn parse(text: &str) -> Self {
        let mut out = Output::default();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let typed = serde_json::from_str::<Value>(l)
                .ok()
                .filter(Value::is_object)
                .and_then(|raw| {
                    let f = Fields::deserialize(&raw).ok()?;
                    Some(Event { f, raw })
                });
            match typed {
                Some(e) => {
                    if out.stats.is_none() && e.is("STATS") {
                        out.stats = Stats::deserialize(&e.raw).ok();
                    }
                    out.events.push(e)
                }
                None => out.bad.push(l.to_owned()),
            }
        }
        out
    }

    /// The events of process `pid`, in order (the STATS line and process-less lines left out).
    pub fn of(&self, pid: Option<i64>) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| !e.is("STATS") && e.pid == pid)
            .collect()
    }

    /// A kernel counter of the STATS line (none without one).
    pub fn kernel(&self, counter: impl Fn(&Kernel) -> Option<u64>) -> Option<u64> {
        self.stats.as_ref().and_then(|s| counter(&s.kernel))
    }

    pub fn unreported(&self, counter: impl Fn(&Unreported) -> Option<u64>) -> Option<u64> {
        self.stats.as_ref().and_then(|s| counter(&s.unreported))
    }
}
