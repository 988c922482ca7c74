//! The GPU share figures as JSON lines: a `GPU_SHARE` line per NVML sample and, at the end, a
//! `GPU_SHARE_STATS` line (schema: docs/json-schema.md). Text output prints a line per sample
//! with `-v` only (several a second would drown the scheduling events,
//! [`super::text::TextSink`]); its statistics block gets the share lines
//! ([`ShareModel::render_lines`]).

use serde::Serialize;

use crate::{
    escape,
    model::{
        share::{ShareModel, ShareSample},
        workload::Attribution,
    },
    section::{Section as _, field},
};

/// RFC 3339 UTC with microseconds of a wall-clock µs count.
fn utc_micros(ts_us: u64) -> String {
    let secs = i64::try_from(ts_us / 1_000_000).unwrap_or(i64::MAX);
    let nanos = u32::try_from(ts_us % 1_000_000).unwrap_or(0) * 1000;
    chrono::DateTime::from_timestamp(secs, nanos).map_or_else(
        || ts_us.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    )
}

/// The `{"event":"GPU_SHARE",...}` line of one sample (no newline): the frame (`event`,
/// `time`, `ts_us`, `pid`, `comm`), the sample's own fields (its [`Section`]), `cgroup` when
/// known. `comm` is the process name as gpu-trace knows it (untrusted: written terminal-safe).
pub fn share_json(s: &ShareSample, comm: Option<&str>, a: Option<&Attribution>) -> String {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"event\":\"GPU_SHARE\"");
    // When the driver took the sample (RFC 3339, UTC, µs).
    field(&mut out, "time", &utc_micros(s.ts_us));
    field(&mut out, "ts_us", &s.ts_us);
    field(&mut out, "pid", &s.pid);
    field(&mut out, "comm", &comm);
    s.json(&mut out);
    if let Some(a) = a {
        field(&mut out, "cgroup", &a.json_fields());
    }
    out.push(b'}');
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[derive(Serialize)]
struct ChangeLine {
    at_us: u64,
    before_params: Option<String>,
    after_params: String,
    share_before: Option<f64>,
    share_after: Option<f64>,
}

#[derive(Serialize)]
struct ProcessShareLine {
    gpu: u32,
    pid: u32,
    share_mean: f64,
    share_max: f64,
    samples: u64,
    points: u64,
    params: Option<String>,
    changes: Vec<ChangeLine>,
}

#[derive(Serialize)]
struct ShareStatsLine {
    event: &'static str,
    window_s: f64,
    processes: Vec<ProcessShareLine>,
    not_kept: u64,
}

/// The `{"event":"GPU_SHARE_STATS",...}` line (no newline): per GPU and process the share over
/// the run (`share_mean`), the largest over windows of `window_us` (`share_max`), the
/// parameters in force and the share before/after each change.
pub fn share_stats_json(m: &ShareModel, window_us: u64) -> String {
    let mut processes = Vec::new();
    for gpu in m.gpus() {
        for pid in m.pids(gpu) {
            let Some((whole, max)) = m.run_share(gpu, pid, window_us) else {
                continue;
            };
            let changes = m
                .around_changes(gpu, pid)
                .into_iter()
                .map(|c| ChangeLine {
                    at_us: c.at_us,
                    before_params: c.before_params,
                    after_params: c.after_params,
                    share_before: c.before.map(|s| s.ratio),
                    share_after: c.after.map(|s| s.ratio),
                })
                .collect();
            processes.push(ProcessShareLine {
                gpu,
                pid,
                share_mean: whole.ratio,
                share_max: max,
                samples: whole.samples,
                points: whole.points,
                params: m.params_now(pid).map(str::to_string),
                changes,
            });
        }
    }
    let line = ShareStatsLine {
        event: "GPU_SHARE_STATS",
        window_s: window_us as f64 / 1e6,
        processes,
        not_kept: m.not_kept,
    };
    let mut out = Vec::with_capacity(512);
    escape::write_json(&mut out, &line);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::workload::CgroupFields;

    /// The line as the serde struct wrote it before the sample wrote its own fields.
    #[derive(Serialize)]
    struct ShareLine<'a> {
        event: &'static str,
        time: String,
        ts_us: u64,
        pid: u32,
        comm: Option<&'a str>,
        gpu: u32,
        uuid: Option<&'a str>,
        sm: u32,
        mem: u32,
        enc: u32,
        dec: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        cgroup: Option<CgroupFields<'a>>,
    }

    fn serde_line(s: &ShareSample, comm: Option<&str>, a: Option<&Attribution>) -> String {
        let line = ShareLine {
            event: "GPU_SHARE",
            time: utc_micros(s.ts_us),
            ts_us: s.ts_us,
            pid: s.pid,
            comm,
            gpu: s.gpu,
            uuid: s.uuid.as_deref(),
            sm: s.sm,
            mem: s.mem,
            enc: s.enc,
            dec: s.dec,
            cgroup: a.map(Attribution::json_fields),
        };
        let mut out = Vec::new();
        escape::write_json(&mut out, &line);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_share_line_is_the_serde_line_byte_for_byte() {
        let hostile = Attribution::new(
            7,
            Some("/system.slice/docker-\u{1b}[31m.scope".into()),
            Some(3),
        );
        for uuid in [None, Some("GPU-\u{202e}1234".to_string())] {
            let s = ShareSample {
                gpu: 1,
                uuid,
                pid: 532,
                ts_us: 1_714_597_224_561_798,
                sm: 87,
                mem: 31,
                enc: 0,
                dec: 2,
            };
            for comm in [None, Some("py\u{1b}thon"), Some("ok")] {
                for a in [None, Some(&hostile)] {
                    assert_eq!(share_json(&s, comm, a), serde_line(&s, comm, a));
                }
            }
        }
    }
}
