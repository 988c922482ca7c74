//! `--api`'s call figures as counters: `gpu_trace_api_calls_total`,
//! `gpu_trace_api_call_errors_total` and `gpu_trace_api_call_seconds_total`, labelled `comm`,
//! `container`, `pod`, `namespace`, `pod_uid`, `library` and `symbol` — never by pid, like every
//! other series (processes with the same labels are summed). The pipeline hands each process's
//! sums so far (`API_STATS`); what a process added since its last sums is added to its labels'
//! counters, so the counters only go up and a process that exited keeps what it added. Served
//! only once a call was counted: a run without `--api` serves exactly what it served before.
//!
//! Bounded: at most [`MAX_ROWS`] (process, library, symbol) rows are followed (a new row past
//! it is not counted: [`ApiCollector::rows_dropped`]), and at most
//! [`super::MetricsConfig::max_label_sets`] label sets; the rows of a new one past it count
//! under `library`, `symbol` and `comm` `__overflow__`.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

use super::{MetricDoc, OVERFLOW, Workload, family_name, sanitize_label};
use crate::api::stats::CallStats;

/// (process, library, symbol) rows followed at most.
pub const MAX_ROWS: usize = 65_536;

const API_LABELS: &str = "comm, container, container_user (a user's container only), pod, namespace, pod_uid, library, symbol";

/// The reference entries (docs/fleet.md).
pub const CALLS: MetricDoc = MetricDoc {
    name: "gpu_trace_api_calls_total",
    kind: "counter",
    labels: API_LABELS,
    help: "GPU API calls completed by the processes with these labels (--api; the kernel's per-process sums, read each second and at the end).",
};
/// See [`CALLS`].
pub const ERRORS: MetricDoc = MetricDoc {
    name: "gpu_trace_api_call_errors_total",
    kind: "counter",
    labels: API_LABELS,
    help: "Of gpu_trace_api_calls_total, the calls that returned a status other than 0 (CUresult, cudaError_t, hipError_t).",
};
/// See [`CALLS`]: the calls that passed through an interposer (`API_PATH`).
pub const INTERPOSER: MetricDoc = MetricDoc {
    name: "gpu_trace_api_interposer_calls_total",
    kind: "counter",
    labels: "comm, container, container_user (a user's container only), pod, namespace, pod_uid, library, verdict",
    help: "GPU API calls that entered an interposer (a library other than the runtime that exports, looks up or hands out its symbols) in the processes with these labels, under its latest verdict: on_path, partial, bypassed or idle (--api; API_PATH, at the end and each --interval).",
};
/// (process, interposer) rows followed at most for [`INTERPOSER`].
pub const MAX_PATH_ROWS: usize = 4096;

/// See [`CALLS`].
pub const SECONDS: MetricDoc = MetricDoc {
    name: "gpu_trace_api_call_seconds_total",
    kind: "counter",
    labels: API_LABELS,
    help: "Time spent in the calls of gpu_trace_api_calls_total, entry to return.",
};

/// Who made the calls, the first labels of every API series (never a pid: the processes
/// with the same labels are summed).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct Who {
    comm: String,
    container: String,
    #[prometheus(flatten)]
    container_user: super::UserLabel,
    pod: String,
    namespace: String,
    pod_uid: String,
}

impl Who {
    /// Process `process` (its name), running in `workload` (none known: `None`).
    fn of(process: &str, workload: Option<&Workload>) -> Self {
        let w = workload.cloned().unwrap_or_default();
        Self {
            comm: sanitize_label(process),
            container: sanitize_label(&w.container),
            container_user: super::UserLabel::of(&w),
            pod: sanitize_label(&w.pod),
            namespace: sanitize_label(&w.namespace),
            pod_uid: sanitize_label(&w.pod_uid),
        }
    }

    /// A label set past the cap: `comm` `__overflow__`, no workload.
    fn overflow() -> Self {
        Self {
            comm: OVERFLOW.into(),
            ..Self::default()
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ApiLabels {
    #[prometheus(flatten)]
    who: Who,
    library: String,
    symbol: String,
}

/// Calls, errors, nanoseconds.
type Figures = [u64; 3];

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct PathLabels {
    #[prometheus(flatten)]
    who: Who,
    library: String,
    verdict: String,
}

/// [`INTERPOSER`]: per (process, interposer) its labels (with the latest verdict) and the calls
/// through it so far, summed by label set when served; empty: nothing served.
#[derive(Clone, Debug, Default)]
pub(super) struct PathCollector(Arc<Mutex<PathRows>>);

/// (process, interposer's path) → its labels, calls through it, and whether it is served (a row
/// whose calls did not grow for the expiry is not, until they grow) with when they last grew.
type PathRows = HashMap<(u32, String), PathRow>;

#[derive(Clone, Debug)]
struct PathRow {
    labels: PathLabels,
    through: u64,
    shown: bool,
    grew_ns: u64,
}

impl PathCollector {
    /// An `API_PATH`: process `process` (where it runs: `workload`) and its interposer's
    /// calls so far. A row past [`MAX_PATH_ROWS`], or a label set past `max_label_sets`,
    /// counts under `comm` and `library` `__overflow__` without workload labels, as the call
    /// counters' overflow does.
    pub fn set(
        &self,
        path: &crate::api::path::ApiPath,
        process: &str,
        workload: Option<&Workload>,
        (max_label_sets, now_ns): (usize, u64),
    ) {
        let (through, _) = path.calls();
        let mut labels = PathLabels {
            who: Who::of(process, workload),
            library: sanitize_label(&path.library),
            verdict: path.verdict().name().to_string(),
        };
        let mut rows = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (path.pid, path.library.clone());
        let old = rows.get(&key).map(|r| (r.through, r.shown, r.grew_ns));
        // An expired row stays out until its calls grow.
        if old.is_some_and(|(t, shown, _)| !shown && t >= through) {
            return;
        }
        let sets: std::collections::HashSet<&PathLabels> = (rows.values())
            .filter(|r| r.shown)
            .map(|r| &r.labels)
            .collect();
        if (old.is_none() && rows.len() >= MAX_PATH_ROWS)
            || (!sets.contains(&labels) && sets.len() >= max_label_sets)
        {
            labels.who = Who::overflow();
            labels.library = OVERFLOW.into();
        }
        let grew_ns = match old {
            Some((t, true, at)) if t == through => at,
            _ => now_ns,
        };
        let row = PathRow {
            labels,
            through,
            shown: true,
            grew_ns,
        };
        rows.insert(key, row);
    }

    /// Takes out of the scrape the rows whose calls did not grow since `before_ns`; returns how
    /// many label sets left it.
    fn expire(&self, before_ns: u64) -> u64 {
        let mut rows = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone = std::collections::BTreeSet::new();
        for r in rows
            .values_mut()
            .filter(|r| r.shown && r.grew_ns <= before_ns)
        {
            r.shown = false;
            gone.insert(r.labels.clone());
        }
        for r in rows.values().filter(|r| r.shown) {
            gone.remove(&r.labels);
        }
        gone.len() as u64
    }
}

impl prometheus_client::collector::Collector for PathCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if rows.is_empty() {
            return Ok(());
        }
        let mut sums: BTreeMap<&PathLabels, u64> = BTreeMap::new();
        for r in rows.values().filter(|r| r.shown) {
            *sums.entry(&r.labels).or_default() += r.through;
        }
        if sums.is_empty() {
            return Ok(());
        }
        let help = INTERPOSER.help.trim_end_matches('.');
        let kind = ConstCounter::new(0u64).metric_type();
        let mut m = encoder.encode_descriptor(family_name(&INTERPOSER), help, None, kind)?;
        for (labels, v) in sums {
            ConstCounter::new(v).encode(m.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// The counters as last set; empty: nothing served.
#[derive(Clone, Debug, Default)]
pub(super) struct ApiCollector(Arc<Mutex<BTreeMap<ApiLabels, Figures>>>);

/// What the metrics know of the rows (the pipeline's thread only).
#[derive(Debug, Default)]
pub(super) struct ApiRows {
    /// Per (process, library, symbol): its label set and the sums last seen.
    rows: HashMap<(u32, String, String), (ApiLabels, Figures)>,
    /// New rows not followed because [`MAX_ROWS`] were.
    pub rows_dropped: u64,
    pub collector: ApiCollector,
    /// [`INTERPOSER`].
    pub paths: PathCollector,
    /// When each served label set's counters last grew (or it came), for the expiry.
    grew_ns: HashMap<ApiLabels, u64>,
}

impl ApiRows {
    /// A process's sums so far (`process`: its name; `workload`: where it runs); adds what
    /// they grew by to its labels' counters. `max_label_sets`: the cap on label sets.
    pub fn add(
        &mut self,
        row: &CallStats,
        process: &str,
        workload: Option<&Workload>,
        (max_label_sets, now_ns): (usize, u64),
    ) {
        let key = (row.pid, row.library.clone(), row.symbol.clone());
        let now = [row.calls, row.errors, row.total_ns];
        let mut totals = self.collector.0.lock().unwrap_or_else(|e| e.into_inner());
        let full = self.rows.len() >= MAX_ROWS;
        let (labels, last) = match self.rows.get_mut(&key) {
            Some((labels, last)) => (labels.clone(), Some(std::mem::replace(last, now))),
            None if full => {
                self.rows_dropped += 1;
                return;
            }
            None => {
                let labels = labels(row, process, workload);
                self.rows.insert(key, (labels.clone(), now));
                (labels, None)
            }
        };
        // Sums that went down are a new row of the kernel's (a pid reused): all of it.
        let grew: Figures = std::array::from_fn(|i| match last {
            Some(l) if now[i] >= l[i] => now[i] - l[i],
            _ => now[i],
        });
        // An expired label set stays out of the scrape until its rows grow.
        if last.is_some() && grew == [0; 3] {
            return;
        }
        // A label set not served (new, or expired) takes room under the cap, or counts under
        // the overflow labels.
        let labels = if !totals.contains_key(&labels) && totals.len() >= max_label_sets {
            overflow()
        } else {
            labels
        };
        let sum = totals.entry(labels.clone()).or_default();
        for i in 0..3 {
            sum[i] = sum[i].saturating_add(grew[i]);
        }
        self.grew_ns.insert(labels, now_ns);
    }

    /// Takes out of the scrape the label sets (of the call counters and of the interposer
    /// counter) whose counters did not grow since `before_ns`, giving their room back under
    /// the cap; a row that grows later counts from 0 under its label set. Returns how many
    /// label sets left.
    pub fn expire(&mut self, before_ns: u64) -> u64 {
        let doomed: Vec<ApiLabels> = (self.grew_ns.iter())
            .filter(|(_, t)| **t <= before_ns)
            .map(|(l, _)| l.clone())
            .collect();
        let mut totals = self.collector.0.lock().unwrap_or_else(|e| e.into_inner());
        for l in &doomed {
            totals.remove(l);
            self.grew_ns.remove(l);
        }
        doomed.len() as u64 + self.paths.expire(before_ns)
    }
}

fn labels(row: &CallStats, process: &str, workload: Option<&Workload>) -> ApiLabels {
    ApiLabels {
        who: Who::of(process, workload),
        library: sanitize_label(&row.library),
        symbol: sanitize_label(&row.symbol),
    }
}

fn overflow() -> ApiLabels {
    ApiLabels {
        who: Who::overflow(),
        library: OVERFLOW.into(),
        symbol: OVERFLOW.into(),
    }
}

impl prometheus_client::collector::Collector for ApiCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if values.is_empty() {
            return Ok(());
        }
        for (i, doc) in [CALLS, ERRORS, SECONDS].iter().enumerate() {
            let help = doc.help.trim_end_matches('.');
            let kind = ConstCounter::new(0u64).metric_type();
            let mut m = encoder.encode_descriptor(family_name(doc), help, None, kind)?;
            for (labels, v) in values.iter() {
                let family = m.encode_family(labels)?;
                if i == 2 {
                    ConstCounter::new(v[2] as f64 / 1e9).encode(family)?;
                } else {
                    ConstCounter::new(v[i]).encode(family)?;
                }
            }
        }
        Ok(())
    }
}
