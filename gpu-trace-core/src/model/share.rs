//! Per-process GPU share from the driver's utilization samples (NVML
//! `nvmlDeviceGetProcessUtilization`), beside the scheduling parameters in force.
//!
//! What a sample is: the driver samples the GPU periodically (about every 200 ms on an H100,
//! driver 580) and each sample names the process that held the timeslice then, with its SM
//! utilization over the sampling period (about 99 % for a busy time-sliced process). So a
//! process's share over a window is the SM-weighted sum of the samples naming it divided by the
//! number of sampling points on that GPU in the window — not the mean of its `sm` values (which
//! stays near 99 % for every busy process). The share is therefore quantised by the sampling
//! period: with 5 samples a second, a one-second window can only read 0, 20, 40 ... %.

use std::collections::BTreeMap;

use crate::event::{Event, EventKind, Interleave, SchedChange};
use crate::section::{Section, field};

/// One NVML process utilization sample.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShareSample {
    /// NVML device index.
    pub gpu: u32,
    /// NVML device UUID, when known.
    pub uuid: Option<String>,
    pub pid: u32,
    /// When the driver took the sample, µs of the CPU's real-time clock.
    pub ts_us: u64,
    /// SM (kernel) utilization over the sampling period, %.
    pub sm: u32,
    /// Memory-controller utilization, %.
    pub mem: u32,
    /// Encoder utilization, %.
    pub enc: u32,
    /// Decoder utilization, %.
    pub dec: u32,
}

/// A `GPU_SHARE` line's own fields (after its frame: the time, the process; `output::share`,
/// `output::text`): text `gpu=N sm=P% mem=P% enc=P% dec=P%`, JSON `gpu`, `uuid`, `sm`, `mem`,
/// `enc`, `dec`.
impl Section for ShareSample {
    fn text(&self, line: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(
            line,
            "gpu={} sm={}% mem={}% enc={}% dec={}%",
            self.gpu, self.sm, self.mem, self.enc, self.dec
        );
    }

    fn json(&self, out: &mut Vec<u8>) {
        field(out, "gpu", &self.gpu);
        field(out, "uuid", &self.uuid);
        field(out, "sm", &self.sm);
        field(out, "mem", &self.mem);
        field(out, "enc", &self.enc);
        field(out, "dec", &self.dec);
    }
}

/// Samples kept for the windowed figures; beyond this the run's totals still count them.
pub const MAX_KEPT_SAMPLES: usize = 1 << 20;
/// Processes whose scheduling parameters are followed (the tracer's bound per distinct PID,
/// `model/bounded.rs`); later ones are not followed.
pub const MAX_FOLLOWED_PROCESSES: usize = 65_536;
/// Parameter changes kept per process (before/after in the statistics); later ones are not.
pub const MAX_CHANGES_PER_PROCESS: usize = 64;

/// A scheduling parameter change of a process (a `SCHEDULE` or `SCHED_UPDATE`), in wall µs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ParamChange {
    at_us: u64,
    /// What was in force before (`timeslice=1024 us interleave=MEDIUM`), `None`: unknown.
    before: Option<String>,
    after: String,
}

/// One process's share over a window of one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Share {
    /// Share of the GPU's sampling points, 0.0..=1.0 (SM-weighted).
    pub ratio: f64,
    /// Samples naming the process.
    pub samples: u64,
    /// Sampling points of the GPU in the window.
    pub points: u64,
}

/// What the figures need of a sample (16 bytes, where a [`ShareSample`] with its UUID string
/// is about seven times that): the million kept samples stay within 16 MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    ts_us: u64,
    pid: u32,
    sm: u32,
}

const _: () = assert!(size_of::<Kept>() == 16);

/// The samples of a run, with the processes' scheduling parameters.
///
/// Per GPU the samples are kept in time order (NVML's timestamps; one arriving out of order is
/// inserted in place), so a window is a binary search and a slice, not a scan of the run: the
/// live path asks for the recent window after every batch, and a run's statistics for every
/// window of every process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareModel {
    per_gpu: BTreeMap<u32, Vec<Kept>>,
    /// Per GPU: the processes its samples named.
    pids: BTreeMap<u32, std::collections::BTreeSet<u32>>,
    kept: usize,
    /// Samples not kept (over [`MAX_KEPT_SAMPLES`]).
    pub not_kept: u64,
    /// Per process: the parameters in force now, and their changes.
    params: BTreeMap<u32, (String, Vec<ParamChange>)>,
    uuids: BTreeMap<u32, String>,
    /// Per process: the timeslice and interleave last set (allowed) on any of its tasks.
    current: BTreeMap<u32, (Option<u64>, Option<Interleave>)>,
}

impl ShareModel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether any sample came.
    pub fn is_empty(&self) -> bool {
        self.kept == 0
    }

    pub fn add(&mut self, s: &ShareSample) {
        if let Some(u) = &s.uuid {
            self.uuids.entry(s.gpu).or_insert_with(|| u.clone());
        }
        if self.kept >= MAX_KEPT_SAMPLES {
            self.not_kept += 1;
            return;
        }
        let k = Kept {
            ts_us: s.ts_us,
            pid: s.pid,
            sm: s.sm,
        };
        let v = self.per_gpu.entry(s.gpu).or_default();
        if v.last().is_none_or(|l| l.ts_us <= k.ts_us) {
            v.push(k);
        } else {
            let at = v.partition_point(|x| x.ts_us <= k.ts_us);
            v.insert(at, k);
        }
        self.pids.entry(s.gpu).or_default().insert(s.pid);
        self.kept += 1;
    }

    /// `gpu`'s samples in `[from_us, to_us)`, in time order.
    fn range(&self, gpu: u32, from_us: u64, to_us: u64) -> &[Kept] {
        let Some(v) = self.per_gpu.get(&gpu) else {
            return &[];
        };
        let lo = v.partition_point(|k| k.ts_us < from_us);
        let hi = v.partition_point(|k| k.ts_us < to_us).max(lo);
        &v[lo..hi]
    }

    /// Process `pid`'s scheduling parameters are `label` from `at_us` (wall µs) on; the first
    /// label is the starting point, a different later one a change.
    pub fn params(&mut self, pid: u32, at_us: u64, label: String) {
        match self.params.get_mut(&pid) {
            None => {
                self.params.insert(pid, (label, Vec::new()));
            }
            Some((now, changes)) if *now != label => {
                if changes.len() >= MAX_CHANGES_PER_PROCESS {
                    *now = label;
                    return;
                }
                changes.push(ParamChange {
                    at_us,
                    before: Some(std::mem::replace(now, label.clone())),
                    after: label,
                });
            }
            Some(_) => {}
        }
    }

    /// Follows the scheduling parameters of the event's process (`TASK_INIT`, an allowed
    /// `SCHEDULE` or `SCHED_UPDATE` of the timeslice or interleave); `wall_us`: the event's time,
    /// asked for only when the parameters change.
    pub fn observe(&mut self, ev: &Event, wall_us: impl FnOnce() -> u64) {
        let pid = ev.origin.pid;
        let now = self.current.get(&pid).copied().unwrap_or_default();
        let next = match &ev.kind {
            EventKind::TaskInit {
                timeslice_us,
                interleave,
                ..
            } => (timeslice_us.or(now.0), interleave.or(now.1)),
            EventKind::Schedule {
                timeslice_us,
                interleave,
                allowed: true,
                ..
            } => (timeslice_us.or(now.0), interleave.or(now.1)),
            EventKind::SchedUpdate {
                change: SchedChange::Timeslice { new_us, .. },
                allowed: true,
                ..
            } => (Some(*new_us), now.1),
            EventKind::SchedUpdate {
                change: SchedChange::Interleave { new, .. },
                allowed: true,
                ..
            } => (now.0, new.or(now.1)),
            _ => return,
        };
        // Most events repeat the parameters in force: nothing to record, nothing allocated.
        if self.current.get(&pid) == Some(&next) {
            return;
        }
        if !self.current.contains_key(&pid) && self.current.len() >= MAX_FOLLOWED_PROCESSES {
            return;
        }
        self.current.insert(pid, next);
        let ts = next.0.map_or("?".to_string(), |t| t.to_string());
        let il = next
            .1
            .map_or("UNKNOWN".to_string(), |i| format!("{i:?}").to_uppercase());
        self.params(pid, wall_us(), format!("timeslice={ts} us interleave={il}"));
    }

    /// The GPUs sampled, in index order.
    pub fn gpus(&self) -> Vec<u32> {
        self.per_gpu.keys().copied().collect()
    }

    /// The processes sampled on `gpu`, in pid order.
    pub fn pids(&self, gpu: u32) -> Vec<u32> {
        self.pids
            .get(&gpu)
            .map_or_else(Vec::new, |p| p.iter().copied().collect())
    }

    /// `pid`'s share of `gpu` over `[from_us, to_us)`; `None`: no sampling point in it.
    pub fn share(&self, gpu: u32, pid: u32, from_us: u64, to_us: u64) -> Option<Share> {
        let mut acc = Window::default();
        for k in self.range(gpu, from_us, to_us) {
            acc.add(k, pid);
        }
        acc.share()
    }

    /// Each process's share of each GPU over the `window_us` up to the GPU's newest sample:
    /// `(gpu, pid, ratio)`, for every process sampled on that GPU (0 when the window does not
    /// name it).
    pub fn recent(&self, window_us: u64) -> Vec<(u32, u32, f64)> {
        let mut out = Vec::new();
        for gpu in self.gpus() {
            let Some((_, end)) = self.span(gpu) else {
                continue;
            };
            let window = self.range(gpu, end.saturating_sub(window_us), end);
            let mut points = 0u64;
            let mut sm: BTreeMap<u32, u64> = BTreeMap::new();
            for (i, k) in window.iter().enumerate() {
                if i == 0 || window[i - 1].ts_us != k.ts_us {
                    points += 1;
                }
                *sm.entry(k.pid).or_default() += u64::from(k.sm.min(100));
            }
            if points == 0 {
                continue;
            }
            for pid in self.pids(gpu) {
                let s = sm.get(&pid).copied().unwrap_or(0);
                out.push((gpu, pid, s as f64 / (100.0 * points as f64)));
            }
        }
        out
    }

    /// The sampled time span of `gpu` (first and one past the last sample).
    fn span(&self, gpu: u32) -> Option<(u64, u64)> {
        let v = self.per_gpu.get(&gpu)?;
        Some((v.first()?.ts_us, v.last()?.ts_us + 1))
    }

    /// `pid`'s share of `gpu` over the run, and its largest share over windows of `window_us`
    /// (from the first sample of the GPU on): one pass over the GPU's samples.
    pub fn run_share(&self, gpu: u32, pid: u32, window_us: u64) -> Option<(Share, f64)> {
        let (first, end) = self.span(gpu)?;
        let window_us = window_us.max(1);
        let (mut whole, mut win) = (Window::default(), Window::default());
        let mut win_ix = 0u64;
        let mut max = 0.0f64;
        for k in self.range(gpu, first, end) {
            let ix = (k.ts_us - first) / window_us;
            if ix != win_ix {
                max = max.max(win.share().map_or(0.0, |s| s.ratio));
                win = Window::default();
                win_ix = ix;
            }
            whole.add(k, pid);
            win.add(k, pid);
        }
        max = max.max(win.share().map_or(0.0, |s| s.ratio));
        Some((whole.share()?, max))
    }

    /// `pid`'s share of `gpu` before and after each change of its parameters (each side up to
    /// the neighbouring change): `(before label, after label, at, before, after)`.
    pub fn around_changes(&self, gpu: u32, pid: u32) -> Vec<ChangeShare> {
        let Some((first, end)) = self.span(gpu) else {
            return Vec::new();
        };
        let changes = self.params.get(&pid).map_or(&[][..], |(_, c)| c.as_slice());
        changes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let from = if i == 0 { first } else { changes[i - 1].at_us };
                let to = changes.get(i + 1).map_or(end, |n| n.at_us);
                ChangeShare {
                    at_us: c.at_us,
                    before_params: c.before.clone(),
                    after_params: c.after.clone(),
                    before: self.share(gpu, pid, from, c.at_us),
                    after: self.share(gpu, pid, c.at_us, to),
                }
            })
            .collect()
    }

    /// The parameters in force for `pid` at the end, when known.
    pub fn params_now(&self, pid: u32) -> Option<&str> {
        self.params.get(&pid).map(|(p, _)| p.as_str())
    }

    /// The statistics block's lines: per GPU, per process, the share over the run and the
    /// largest over `window_us`, the parameters in force, before/after each change.
    pub fn render_lines(&self, window_us: u64) -> Vec<String> {
        let mut out = Vec::new();
        if self.is_empty() {
            return out;
        }
        out.push(format!(
            "GPU share (NVML samples; share = SM-weighted fraction of the GPU's sampling points, largest over {} s windows):",
            window_us as f64 / 1e6
        ));
        for gpu in self.gpus() {
            let uuid = self.uuids.get(&gpu).map_or("", String::as_str);
            out.push(format!("  gpu {gpu} {uuid}").trim_end().to_string());
            for pid in self.pids(gpu) {
                out.extend(self.process_lines(gpu, pid, window_us));
            }
        }
        if self.not_kept > 0 {
            out.push(format!(
                "  {} samples over the {MAX_KEPT_SAMPLES} kept were not counted",
                self.not_kept
            ));
        }
        out
    }

    fn process_lines(&self, gpu: u32, pid: u32, window_us: u64) -> Vec<String> {
        let mut out = Vec::new();
        let Some((whole, max)) = self.run_share(gpu, pid, window_us) else {
            return out;
        };
        let params = self.params_now(pid).unwrap_or("parameters not seen");
        out.push(format!(
            "    pid {pid}: share mean {} max {} ({} samples of {} sampling points); {params}",
            percent(whole.ratio),
            percent(max),
            whole.samples,
            whole.points
        ));
        for c in self.around_changes(gpu, pid) {
            out.push(format!(
                "      after {} -> {}: share {} -> {}",
                c.before_params.as_deref().unwrap_or("?"),
                c.after_params,
                c.before.map_or("-".into(), |s| percent(s.ratio)),
                c.after.map_or("-".into(), |s| percent(s.ratio)),
            ));
        }
        out
    }
}

/// A window's sampling points (distinct timestamps, counted as the samples come in time order)
/// and one process's SM-weighted samples in it.
#[derive(Default)]
struct Window {
    points: u64,
    last_ts: Option<u64>,
    sm: u64,
    samples: u64,
}

impl Window {
    fn add(&mut self, k: &Kept, pid: u32) {
        if self.last_ts != Some(k.ts_us) {
            self.points += 1;
            self.last_ts = Some(k.ts_us);
        }
        if k.pid == pid {
            self.sm += u64::from(k.sm.min(100));
            self.samples += 1;
        }
    }

    fn share(&self) -> Option<Share> {
        (self.points > 0).then(|| Share {
            ratio: self.sm as f64 / (100.0 * self.points as f64),
            samples: self.samples,
            points: self.points,
        })
    }
}

/// A process's share on each side of one parameter change.
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeShare {
    pub at_us: u64,
    pub before_params: Option<String>,
    pub after_params: String,
    pub before: Option<Share>,
    pub after: Option<Share>,
}

/// One line of a capture written by `examples/gpu-host-share-capture.py` (`nvml.jsonl`): the
/// samples one `nvmlDeviceGetProcessUtilization` call returned on GPU `gpu`. `Err`: not such a
/// line.
pub fn parse_capture_line(line: &str, gpu: u32) -> Result<Vec<ShareSample>, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let list = v
        .get("samples")
        .and_then(|s| s.as_array())
        .ok_or("no \"samples\" array")?;
    let field = |s: &serde_json::Value, k: &str| -> Result<u64, String> {
        s.get(k)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| format!("sample without a numeric \"{k}\""))
    };
    let small = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    list.iter()
        .map(|s| {
            Ok(ShareSample {
                gpu,
                uuid: None,
                pid: small(field(s, "pid")?),
                ts_us: field(s, "ts_us")?,
                sm: small(field(s, "sm")?),
                mem: small(field(s, "mem")?),
                enc: small(field(s, "enc")?),
                dec: small(field(s, "dec")?),
            })
        })
        .collect()
}

/// `0.2834` → `28.3 %`.
pub fn percent(ratio: f64) -> String {
    format!("{:.1} %", ratio * 100.0)
}

#[cfg(test)]
#[path = "share_tests.rs"]
mod tests;
