//! `gpu-trace api`'s call counts: per process, library and symbol, the calls the kernel added
//! up (count, errors, total time, log2 latency histogram), as a text table for a person and one
//! JSON object per row (docs/api.md). Library paths and names come from the traced process:
//! text escapes them, JSON carries them as UTF-8.

use std::fmt::Write as _;

use serde_json::json;

use super::events::{Site, preload_mark};
use crate::escape::{escape_text, lossy};

/// One process's calls of one symbol of one library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallStats {
    pub pid: u32,
    /// The library's path as /proc/PID/maps shows it (`decode_lossless` form).
    pub library: String,
    /// The library came through `LD_PRELOAD` in this process (text `[preload]` after the
    /// path, JSON `preload`).
    pub preload: bool,
    pub symbol: String,
    pub calls: u64,
    /// Calls that returned a status other than 0 (CUresult, cudaError_t, hipError_t).
    pub errors: u64,
    pub total_ns: u64,
    /// Bucket `i`: calls of `2^(i-1) ≤ ns < 2^i` (bucket 0: 0 ns).
    pub hist: Vec<u64>,
}

impl CallStats {
    /// Process `pid`'s calls of `site` (named from the cookie by the run's attacher or by the
    /// recording's `API_SYMBOL`s), from the kernel's sums of that cookie: the one constructor
    /// for both commands (`gpu-trace api`'s table, read from the maps, and the main trace's
    /// statistics, from `API_STATS` records). `preload`: its library came through `LD_PRELOAD`
    /// in that process (known to `gpu-trace api`'s attacher only).
    pub fn new(
        pid: u32,
        site: Site,
        preload: bool,
        calls: u64,
        errors: u64,
        total_ns: u64,
        hist: &[u64],
    ) -> Self {
        Self {
            pid,
            library: site.library,
            preload,
            symbol: site.symbol,
            calls,
            errors,
            total_ns,
            hist: hist.to_vec(),
        }
    }

    /// The upper bound (ns) of the bucket that holds the `q`-quantile call (0 without calls).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let want = (self.timed() as f64 * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.hist.iter().enumerate() {
            seen += n;
            if seen >= want {
                return if i == 0 { 0 } else { 1u64 << i.min(63) };
            }
        }
        0
    }

    /// A row of libcuda's `symbol` for the tests: `calls` calls of 1 µs each (all timed:
    /// bucket 10 of the histogram), none failed.
    #[cfg(test)]
    pub(crate) fn for_test(pid: u32, symbol: &str, calls: u64) -> Self {
        let mut hist = vec![0; 40];
        hist[10] = calls;
        let site = Site {
            library: "libcuda.so.1".into(),
            symbol: symbol.into(),
        };
        Self::new(pid, site, false, calls, 0, calls * 1000, &hist)
    }

    /// Calls whose duration is known (the histogram's): a call is counted at its entry, and
    /// timed when its return is matched to it.
    pub fn timed(&self) -> u64 {
        self.hist.iter().sum()
    }

    /// Calls counted without a duration: their return was not seen (past the kernel's 64
    /// nested return probes, left by longjmp or an exception, past the kept frames) or they
    /// are still open.
    pub fn untimed(&self) -> u64 {
        self.calls.saturating_sub(self.timed())
    }

    /// The mean duration of the timed calls.
    fn mean_ns(&self) -> u64 {
        self.total_ns.checked_div(self.timed()).unwrap_or(0)
    }
}

/// Sorts the rows: by process, then library, then symbol.
pub fn sort(rows: &mut [CallStats]) {
    rows.sort_by(|a, b| (a.pid, &a.library, &a.symbol).cmp(&(b.pid, &b.library, &b.symbol)));
}

/// The text table (a header, one line per row); `title` goes first.
pub fn text(title: &str, rows: &[CallStats]) -> String {
    let mut out = format!("{title}\n");
    if rows.is_empty() {
        out += "  (no completed calls)\n";
        return out;
    }
    let _ = writeln!(
        out,
        "{:>8} {:<24} {:>10} {:>8} {:>12} {:>10} {:>10}  LIBRARY",
        "PID", "SYMBOL", "CALLS", "ERRORS", "TOTAL_US", "MEAN_US", "P99_US<"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>8} {:<24} {:>10} {:>8} {:>12} {:>10} {:>10}  {}{}",
            r.pid,
            escape_text(&r.symbol),
            r.calls,
            r.errors,
            r.total_ns / 1000,
            r.mean_ns() / 1000,
            r.quantile_ns(0.99).div_ceil(1000),
            escape_text(&r.library),
            preload_mark(r.preload)
        );
    }
    let untimed: u64 = rows.iter().map(CallStats::untimed).sum();
    if untimed > 0 {
        let _ = writeln!(
            out,
            "  ({untimed} calls counted without a duration: open now, or their return was not \
             seen — past the kernel's 64 nested return probes, a longjmp or an exception)"
        );
    }
    out
}

/// One row as a JSON object (one line, no newline); `final_` marks the last read at exit.
pub fn json(r: &CallStats, final_: bool) -> String {
    json!({
        "event": "API_STATS",
        "final": final_,
        "pid": r.pid,
        "library": lossy(&r.library),
        "preload": r.preload,
        "symbol": lossy(&r.symbol),
        "calls": r.calls,
        "untimed": r.untimed(),
        "errors": r.errors,
        "total_ns": r.total_ns,
        "mean_ns": r.mean_ns(),
        "p50_ns_below": r.quantile_ns(0.5),
        "p99_ns_below": r.quantile_ns(0.99),
        "hist_log2_ns": r.hist,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(hist: Vec<u64>) -> CallStats {
        CallStats {
            pid: 7,
            library: "/opt/x\u{1b}[31m/libamdhip64.so.5".into(),
            preload: false,
            symbol: "hipMalloc".into(),
            calls: hist.iter().sum(),
            errors: 1,
            total_ns: 3000,
            hist,
        }
    }

    #[test]
    fn quantiles_are_the_bucket_upper_bounds() {
        // 10 calls: 9 in [512, 1024) (bucket 10), 1 in [2^19, 2^20) (bucket 20).
        let mut h = vec![0; 40];
        h[10] = 9;
        h[20] = 1;
        let r = row(h);
        assert_eq!(r.quantile_ns(0.5), 1024);
        assert_eq!(r.quantile_ns(0.9), 1024);
        assert_eq!(r.quantile_ns(0.99), 1 << 20);
        assert_eq!(row(vec![0; 40]).quantile_ns(0.5), 0);
    }

    #[test]
    fn text_escapes_the_library_path_and_json_keeps_it() {
        let mut h = vec![0; 40];
        h[3] = 2;
        let r = row(h);
        let t = text("t", std::slice::from_ref(&r));
        assert!(!t.contains('\u{1b}'), "{t}");
        assert!(t.contains("hipMalloc"));
        let v: serde_json::Value = serde_json::from_str(&json(&r, true)).unwrap();
        assert_eq!(v["library"], "/opt/x\u{1b}[31m/libamdhip64.so.5");
        assert_eq!(v["calls"], 2);
        assert_eq!(v["mean_ns"], 1500);
        assert_eq!(v["preload"], false);
        assert!(!t.contains("[preload]"), "{t}");
    }

    #[test]
    fn a_preloaded_library_is_marked_in_text_and_json() {
        let r = CallStats {
            preload: true,
            ..row(vec![1; 40])
        };
        let t = text("t", std::slice::from_ref(&r));
        assert!(
            t.lines()
                .nth(2)
                .unwrap()
                .ends_with("libamdhip64.so.5 [preload]"),
            "{t}"
        );
        let v: serde_json::Value = serde_json::from_str(&json(&r, false)).unwrap();
        assert_eq!(v["preload"], true);
    }
}
