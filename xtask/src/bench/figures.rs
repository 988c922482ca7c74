//! The pipeline part's figures kept between runs (`bench/figures/pipeline.json`), and each new
//! run compared against them: a figure that falls by more than the noise margin is a `DROP:` line.
//!
//! The kept file holds one entry per CPU model (figures from another processor say nothing about
//! this one); `cargo xtask bench --only pipeline --save` replaces this machine's entry.

use std::{fmt::Write as _, fs, path::Path};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

/// Where the kept figures live, relative to the repository root.
pub(super) const KEPT_FILE: &str = "bench/figures/pipeline.json";

/// The default noise margin: a figure is a drop when it falls by more than this fraction of
/// the kept one. Well under the falls worth catching (JSON `-v` fell by 56 % unnoticed), and
/// over the run-to-run movement of the medians at a similar load; at another load the figures
/// move more (docs/performance.md), which the report points out.
pub(super) const NOISE_MARGIN: f64 = 0.15;

/// One output's throughput in one run: the median and range of records per CPU-second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Figure {
    /// The output, as the table row names it (`text`, `text -v`, `json`, `json -v`).
    pub output: String,
    pub records_per_cpu_s: f64,
    pub min: f64,
    pub max: f64,
}

/// What one run of the pipeline part measured, and where: what `--emit` writes and what the
/// kept file holds per machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Figures {
    /// `git rev-parse HEAD` of the measured tree, `+modified` when it had uncommitted changes.
    pub commit: String,
    /// `/proc/cpuinfo`'s model name: figures are compared only between runs on the same model.
    pub cpu: String,
    pub date: String,
    /// The load average (1, 5, 15 min) when the part started: the figures move with it.
    #[serde(default)]
    pub load: String,
    /// Records fed through the pipeline per run, and repetitions.
    pub records: usize,
    pub reps: usize,
    pub figures: Vec<Figure>,
}

impl Figures {
    pub fn get(&self, output: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.output == output)
    }
}

/// The kept file: the latest figures of each CPU model they were measured on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Kept {
    pub machines: Vec<Figures>,
}

impl Kept {
    /// The kept file at `path`; empty when there is none yet.
    pub fn load(path: &Path) -> Result<Self> {
        match fs::read_to_string(path) {
            Ok(s) => serde_json::from_str(&s).with_context(|| {
                format!(
                    "{} is not a kept-figures file: fix it or delete it and run with --save",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut s = serde_json::to_string_pretty(self).expect("figures serialize");
        s.push('\n');
        fs::write(path, s).with_context(|| format!("writing {}", path.display()))
    }

    pub fn for_cpu(&self, cpu: &str) -> Option<&Figures> {
        self.machines.iter().find(|m| m.cpu == cpu)
    }

    /// Keeps `now` as its CPU's figures, in place of the ones kept before.
    pub fn keep(&mut self, now: Figures) {
        match self.machines.iter_mut().find(|m| m.cpu == now.cpu) {
            Some(m) => *m = now,
            None => self.machines.push(now),
        }
    }
}

/// One figure of this run beside the kept one.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Change {
    pub output: String,
    pub kept: f64,
    pub now: f64,
    /// `now` fell by more than the margin.
    pub drop: bool,
}

impl Change {
    pub fn percent(&self) -> f64 {
        (self.now / self.kept - 1.0) * 100.0
    }

    /// `DROP: json -v 3.42 M -> 1.50 M records/CPU-s (-56 %)`, or `ok:` when it did not drop.
    pub fn line(&self) -> String {
        format!(
            "{}: {} {:.2} M -> {:.2} M records/CPU-s ({:+.0} %)",
            if self.drop { "DROP" } else { "ok" },
            self.output,
            self.kept / 1e6,
            self.now / 1e6,
            self.percent()
        )
    }
}

/// Each figure of `now` that `kept` also has, compared (median against median); a drop is a
/// fall by more than `margin` (a fraction) of the kept figure.
pub(super) fn compare(kept: &Figures, now: &Figures, margin: f64) -> Vec<Change> {
    now.figures
        .iter()
        .filter_map(|f| {
            let k = kept.get(&f.output)?;
            Some(Change {
                output: f.output.clone(),
                kept: k.records_per_cpu_s,
                now: f.records_per_cpu_s,
                drop: f.records_per_cpu_s < k.records_per_cpu_s * (1.0 - margin),
            })
        })
        .collect()
}

/// The Markdown of the comparison with the kept figures (`kept_path` as shown), and the number
/// of drops.
pub(super) fn report(kept: &Kept, kept_path: &str, now: &Figures, margin: f64) -> (String, usize) {
    let mut s = String::new();
    let Some(before) = kept.for_cpu(&now.cpu) else {
        let _ = writeln!(
            s,
            "\nNo kept figures for this CPU ({}) in {kept_path}: run with `--save` to keep \
             these.",
            now.cpu
        );
        return (s, 0);
    };
    let changes = compare(before, now, margin);
    let drops = changes.iter().filter(|c| c.drop).count();
    let _ = writeln!(
        s,
        "\nAgainst the kept figures ({kept_path}: {}, {}, load {}, {} records × {} reps; now load \
         {}; a drop is a fall of more than {:.0} %):\n\n```",
        before.commit,
        before.date,
        before.load,
        before.records,
        before.reps,
        now.load,
        margin * 100.0
    );
    for c in &changes {
        let _ = writeln!(s, "{}", c.line());
    }
    let _ = writeln!(s, "```");
    if drops != 0 {
        let _ = writeln!(
            s,
            "\n{drops} figure(s) dropped. The figures move with the load: re-run on a quiet \
             machine, or measure the change itself with `--against {}` (both sides share the \
             load); if the drop is real and accepted, keep the new figures with `--save`.",
            before.commit.trim_end_matches("+modified")
        );
    }
    (s, drops)
}

/// Records per second as the pipeline table prints it (`3.15 M/s`, `950 k/s`), back to a
/// number.
pub(super) fn parse_rate(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let n: f64 = it.next()?.parse().ok()?;
    match it.next()? {
        "M/s" => Some(n * 1e6),
        "k/s" => Some(n * 1e3),
        _ => None,
    }
}

/// The figures in the human output of the pipeline part (section 4's table: `| text -v |
/// 3.15 M/s [3.01 M/s–3.20 M/s] | …`), for revisions that have no `--emit`: median, min and
/// max per output, at the table's precision (three digits).
pub(super) fn parse_human(out: &str) -> Vec<Figure> {
    let Some(start) = out.find("## 4.") else {
        return Vec::new();
    };
    let mut figures = Vec::new();
    for line in out[start..].lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        // "", output, records/CPU-s, events/CPU-s, records/wall-s, events per run, ""
        let [_, output, rate, ..] = cols[..] else {
            continue;
        };
        let Some((median, range)) = rate.split_once(" [") else {
            continue;
        };
        let Some((min, max)) = range.trim_end_matches(']').split_once('–') else {
            continue;
        };
        if let (Some(median), Some(min), Some(max)) =
            (parse_rate(median), parse_rate(min), parse_rate(max))
        {
            figures.push(Figure {
                output: output.to_string(),
                records_per_cpu_s: median,
                min,
                max,
            });
        }
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(output: &str, rate: f64) -> Figure {
        Figure {
            output: output.into(),
            records_per_cpu_s: rate,
            min: rate * 0.9,
            max: rate * 1.1,
        }
    }

    fn figures(cpu: &str, rates: &[(&str, f64)]) -> Figures {
        Figures {
            commit: "0123456789ab".into(),
            cpu: cpu.into(),
            date: "2026-11-26 17:00 UTC".into(),
            load: "0.50 0.40 0.30".into(),
            records: 2_000_000,
            reps: 11,
            figures: rates.iter().map(|&(o, r)| figure(o, r)).collect(),
        }
    }

    #[test]
    fn a_fall_past_the_margin_is_a_drop_and_within_it_is_not() {
        let kept = figures(
            "cpu",
            &[("text -v", 3.15e6), ("json -v", 3.42e6), ("text", 4.0e6)],
        );
        let now = figures(
            "cpu",
            &[
                ("text -v", 3.15e6 * 0.86),
                ("json -v", 1.50e6),
                ("text", 5.0e6),
                ("json", 2.0e6),
            ],
        );
        let changes = compare(&kept, &now, 0.15);
        // `json` is new: nothing to compare it with.
        assert_eq!(
            changes
                .iter()
                .map(|c| (c.output.as_str(), c.drop))
                .collect::<Vec<_>>(),
            [("text -v", false), ("json -v", true), ("text", false)]
        );
        assert_eq!(
            changes[1].line(),
            "DROP: json -v 3.42 M -> 1.50 M records/CPU-s (-56 %)"
        );
        assert_eq!(
            changes[2].line(),
            "ok: text 4.00 M -> 5.00 M records/CPU-s (+25 %)"
        );
        // Just past the margin.
        let now = figures("cpu", &[("text -v", 3.15e6 * 0.84)]);
        assert!(compare(&kept, &now, 0.15)[0].drop);
        assert!(!compare(&kept, &now, 0.20)[0].drop);
    }

    #[test]
    fn the_report_compares_only_with_the_same_cpu_and_counts_drops() {
        let mut kept = Kept::default();
        kept.keep(figures("other", &[("json -v", 9e6)]));
        let now = figures("this", &[("json -v", 1.5e6)]);
        let (text, drops) = report(&kept, KEPT_FILE, &now, NOISE_MARGIN);
        assert_eq!(drops, 0);
        assert!(
            text.contains("No kept figures for this CPU (this)"),
            "{text}"
        );
        kept.keep(figures("this", &[("json -v", 3.42e6)]));
        let (text, drops) = report(&kept, KEPT_FILE, &now, NOISE_MARGIN);
        assert_eq!(drops, 1);
        assert!(
            text.contains("DROP: json -v 3.42 M -> 1.50 M records/CPU-s (-56 %)"),
            "{text}"
        );
        assert!(text.contains("--against 0123456789ab"), "{text}");
    }

    #[test]
    fn the_kept_file_round_trips_and_save_replaces_only_this_cpus_entry() {
        let dir = std::env::temp_dir().join(format!("xtask-figures-{}", std::process::id()));
        let path = dir.join("bench/figures/pipeline.json");
        let _ = fs::remove_dir_all(&dir);
        // No file yet: nothing kept.
        assert_eq!(Kept::load(&path).unwrap(), Kept::default());
        let mut kept = Kept::default();
        kept.keep(figures("a", &[("text", 1e6)]));
        kept.keep(figures("b", &[("text", 2e6)]));
        kept.save(&path).unwrap();
        let mut back = Kept::load(&path).unwrap();
        assert_eq!(back, kept);
        back.keep(figures("a", &[("text", 3e6)]));
        back.save(&path).unwrap();
        let back = Kept::load(&path).unwrap();
        assert_eq!(back.machines.len(), 2);
        assert_eq!(back.for_cpu("a").unwrap().figures[0].records_per_cpu_s, 3e6);
        assert_eq!(back.for_cpu("b").unwrap().figures[0].records_per_cpu_s, 2e6);
        // A file that is not one says what to do.
        fs::write(&path, "{").unwrap();
        let err = format!("{:#}", Kept::load(&path).unwrap_err());
        assert!(err.contains("run with --save"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The human output of revisions without `--emit`: the table as `cargo xtask bench --only
    /// pipeline` printed it before this module existed (b47ee89).
    #[test]
    fn figures_are_read_back_from_the_human_table() {
        let out = "# gpu-trace bench\n\n- command: `cargo xtask bench --only pipeline`\n\n\
            ## 4. Userspace: decode + model + output, one core\n\n\
            The 1234 records of tests/fixtures/{ctx_churn,two_streams}.gtrace …\n\n\
            | output | records/CPU-s | events/CPU-s | records/wall-s | events per run |\n\
            |---|---|---|---|---|\n\
            | text | 4.13 M/s [3.77 M/s–4.68 M/s] | 557 k/s [509 k/s–632 k/s] | 3.90 M/s [3.50 M/s–4.20 M/s] | 270000 |\n\
            | text -v | 3.15 M/s [950 k/s–3.20 M/s] | 425 k/s [128 k/s–432 k/s] | 3.00 M/s [900 k/s–3.10 M/s] | 270000 |\n\
            | json -v | 1.50 M/s [1.40 M/s–1.60 M/s] | 202 k/s [189 k/s–216 k/s] | 1.45 M/s [1.30 M/s–1.55 M/s] | 270000 |\n\n\
            - text -v: 3.15 M/s per CPU-second → target ≥ 2 M records/s: met\n";
        let f = parse_human(out);
        let got: Vec<(&str, f64, f64, f64)> = f
            .iter()
            .map(|f| (f.output.as_str(), f.records_per_cpu_s, f.min, f.max))
            .collect();
        let close = |a: f64, b: f64| (a - b).abs() < 1.0;
        let want = [
            ("text", 4.13e6, 3.77e6, 4.68e6),
            ("text -v", 3.15e6, 950e3, 3.20e6),
            ("json -v", 1.50e6, 1.40e6, 1.60e6),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                g.0 == w.0 && close(g.1, w.1) && close(g.2, w.2) && close(g.3, w.3),
                "{g:?} != {w:?}"
            );
        }
        assert!(parse_human("no table here").is_empty());
    }
}
