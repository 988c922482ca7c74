//! Interposers on the call path (issue 39): for one process and one interposer — a library other
//! than the real provider that exports a table symbol, defines a lookup function (`dlsym`,
//! `cuGetProcAddress*`, …) or handed out a table symbol — whether the calls of its family went
//! through it. `through`: calls that entered the interposer's copy of a symbol (exported or a
//! hidden hook handed out); `total`: calls that reached the real provider's copy. Pure: the run
//! counts, this decides and renders (`API_PATH` in text and JSON), and `API_HANDOUT` lines.

use std::fmt::Write as _;

use serde_json::json;

use crate::escape::{escape_text, json_terminal_safe};

/// One symbol of an interposer's family: its calls through the interposer and at the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSymbol {
    pub symbol: String,
    pub through: u64,
    pub total: u64,
}

/// The answer for one interposer of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every symbol the process called entered the interposer at least as often as it reached
    /// the real provider.
    OnPath,
    /// Some did, some did not.
    Partial,
    /// None entered it while the provider served calls.
    Bypassed,
    /// Neither it nor the provider served a call of its family.
    Idle,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Self::OnPath => "on_path",
            Self::Partial => "partial",
            Self::Bypassed => "bypassed",
            Self::Idle => "idle",
        }
    }
}

/// The verdict of `symbols` (any order): only symbols with a call count.
pub fn verdict(symbols: &[PathSymbol]) -> Verdict {
    let called: Vec<&PathSymbol> = symbols
        .iter()
        .filter(|s| s.through > 0 || s.total > 0)
        .collect();
    if called.is_empty() {
        Verdict::Idle
    } else if called.iter().all(|s| s.through == 0) {
        Verdict::Bypassed
    } else if called.iter().all(|s| s.through >= s.total) {
        Verdict::OnPath
    } else {
        Verdict::Partial
    }
}

/// One `API_PATH` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiPath {
    pub pid: u32,
    pub comm: String,
    pub library: String,
    pub preload: bool,
    /// Called symbols first (most calls first), then the others by name.
    pub symbols: Vec<PathSymbol>,
    /// Calls to the interposer's own lookup functions (`dlsym`, `cuGetProcAddress*`, …).
    pub lookups: u64,
    /// Of them, lookups of a table symbol.
    pub api_lookups: u64,
    /// Its own lookup functions' names (`dlsym`, …), empty when it defines none.
    pub overrides: Vec<String>,
    /// `interval` records come with `--interval`; the last one is `final`.
    pub last: bool,
}

impl ApiPath {
    pub fn verdict(&self) -> Verdict {
        verdict(&self.symbols)
    }

    /// (through, total): the calls that went through it, and those that reached the real
    /// providers (at least as many), over its symbols.
    pub fn calls(&self) -> (u64, u64) {
        let through = self.symbols.iter().map(|s| s.through).sum();
        let total = self.symbols.iter().map(|s| s.total.max(s.through)).sum();
        (through, total)
    }

    /// The JSON line.
    pub fn json(&self) -> String {
        let symbols: Vec<_> = self
            .symbols
            .iter()
            .filter(|s| s.through > 0 || s.total > 0)
            .map(|s| json!({"symbol": s.symbol, "through": s.through, "total": s.total}))
            .collect();
        let v = json!({
            "event": "API_PATH",
            "pid": self.pid,
            "comm": self.comm,
            "library": self.library,
            "preload": self.preload,
            "verdict": self.verdict().name(),
            "symbols": symbols,
            "lookups": self.lookups,
            "api_lookups": self.api_lookups,
            "overrides": self.overrides,
            "final": self.last,
        });
        json_terminal_safe(v.to_string())
    }

    /// The sentence: `PATH pid 4242 libvgpu.so (LD_PRELOAD): bypassed — 0 of 4001 calls
    /// (cuLaunchKernel, cuMemAlloc_v2) passed through it; its dlsym saw 93 lookups, none for a
    /// GPU API symbol`.
    pub fn text(&self) -> String {
        format!("PATH pid {} {}", self.pid, self.sentence())
    }

    /// The sentence after `PATH pid N ` (the main trace's line puts its own head before it).
    pub fn sentence(&self) -> String {
        let (through, total) = self.calls();
        let mut s = format!(
            "{}{}: {} — {through} of {total} calls",
            escape_text(&self.library),
            if self.preload { " (LD_PRELOAD)" } else { "" },
            self.verdict().name(),
        );
        let called: Vec<&str> = self
            .symbols
            .iter()
            .filter(|s| s.through > 0 || s.total > 0)
            .map(|s| s.symbol.as_str())
            .collect();
        if !called.is_empty() {
            let shown: Vec<String> = called
                .iter()
                .take(4)
                .map(|n| escape_text(n).into_owned())
                .collect();
            let more = if called.len() > 4 { ", …" } else { "" };
            let _ = write!(s, " ({}{more})", shown.join(", "));
        }
        s.push_str(" passed through it");
        if !self.overrides.is_empty() {
            let _ = write!(
                s,
                "; its {} saw {} lookup{}",
                self.overrides.join("/"),
                self.lookups,
                if self.lookups == 1 { "" } else { "s" }
            );
            if self.api_lookups == 0 {
                s.push_str(", none for a GPU API symbol");
            } else {
                let _ = write!(s, ", {} for GPU API symbols", self.api_lookups);
            }
        }
        s
    }
}

/// One `API_HANDOUT`: a lookup handed out a table symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handout {
    pub pid: u32,
    pub comm: String,
    /// The name asked for.
    pub symbol: String,
    /// The lookup that answered (`dlsym`, `cuGetProcAddress_v2`, …) and its library.
    pub lookup: String,
    pub lookup_library: String,
    /// What was handed out: the library holding it (`None`: no file mapping) and the offset in
    /// that file.
    pub library: Option<String>,
    pub offset: u64,
    pub address: u64,
    /// The function's own name from the library's symbol table, when it has one.
    pub function: Option<String>,
    /// Not the library's export of `symbol` (a hook no dynamic symbol table shows): probed.
    pub hidden: bool,
}

impl Handout {
    pub fn text(&self) -> String {
        format!(
            "API_HANDOUT  PID={} {} {}",
            self.pid,
            escape_text(&self.comm),
            self.fields()
        )
    }

    /// What follows the process in its line: `SYMBOL -> LIBRARY+OFFSET (FUNCTION) … by
    /// LOOKUP@LIBRARY`.
    pub fn fields(&self) -> String {
        let mut s = format!("{} -> ", escape_text(&self.symbol));
        match &self.library {
            Some(l) => {
                let _ = write!(s, "{}+{:#x}", escape_text(l), self.offset);
            }
            None => {
                let _ = write!(s, "{:#x} (no file)", self.address);
            }
        }
        if let Some(f) = &self.function {
            let _ = write!(s, " ({})", escape_text(f));
        }
        if self.hidden {
            s.push_str(" hidden");
        }
        let _ = write!(
            s,
            " by {}@{}",
            escape_text(&self.lookup),
            escape_text(&self.lookup_library)
        );
        s
    }

    pub fn json(&self) -> String {
        let v = json!({
            "event": "API_HANDOUT",
            "pid": self.pid,
            "comm": self.comm,
            "symbol": self.symbol,
            "lookup": self.lookup,
            "lookup_library": self.lookup_library,
            "library": self.library,
            "offset": self.offset,
            "address": self.address,
            "function": self.function,
            "hidden": self.hidden,
        });
        json_terminal_safe(v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(symbol: &str, through: u64, total: u64) -> PathSymbol {
        PathSymbol {
            symbol: symbol.into(),
            through,
            total,
        }
    }

    #[test]
    fn the_verdict_follows_the_counts() {
        assert_eq!(verdict(&[]), Verdict::Idle);
        assert_eq!(verdict(&[sym("a", 0, 0)]), Verdict::Idle);
        assert_eq!(
            verdict(&[sym("a", 1000, 1000), sym("b", 100, 100)]),
            Verdict::OnPath
        );
        // A hook that answers without calling the provider is on the path too.
        assert_eq!(verdict(&[sym("a", 5, 0)]), Verdict::OnPath);
        assert_eq!(
            verdict(&[sym("a", 0, 1000), sym("b", 0, 100)]),
            Verdict::Bypassed
        );
        assert_eq!(
            verdict(&[sym("a", 1000, 1000), sym("b", 0, 100)]),
            Verdict::Partial
        );
        // Some of one symbol's calls went around it.
        assert_eq!(verdict(&[sym("a", 900, 1000)]), Verdict::Partial);
        // A symbol nobody called does not count.
        assert_eq!(
            verdict(&[sym("a", 1000, 1000), sym("c", 0, 0)]),
            Verdict::OnPath
        );
    }

    #[test]
    fn api_path_text_and_json() {
        let p = ApiPath {
            pid: 4242,
            comm: "python3".into(),
            library: "/opt/libvgpu.so".into(),
            preload: true,
            symbols: vec![sym("cuLaunchKernel", 0, 4000), sym("cuMemAlloc_v2", 0, 1)],
            lookups: 93,
            api_lookups: 0,
            overrides: vec!["dlsym".into()],
            last: true,
        };
        assert_eq!(
            p.text(),
            "PATH pid 4242 /opt/libvgpu.so (LD_PRELOAD): bypassed — 0 of 4001 calls \
             (cuLaunchKernel, cuMemAlloc_v2) passed through it; its dlsym saw 93 lookups, none \
             for a GPU API symbol"
        );
        let v: serde_json::Value = serde_json::from_str(&p.json()).unwrap();
        assert_eq!(v["event"], "API_PATH");
        assert_eq!(v["verdict"], "bypassed");
        assert_eq!(v["symbols"][0]["total"], 4000);
        assert_eq!(v["lookups"], 93);
        assert_eq!(v["preload"], true);
    }

    #[test]
    fn a_handout_line_escapes_what_the_process_gave() {
        let h = Handout {
            pid: 7,
            comm: "x\u{1b}[2J".into(),
            symbol: "cuLaunchKernel".into(),
            lookup: "dlsym".into(),
            lookup_library: "/s/libshim.so".into(),
            library: Some("/s/libshim.so".into()),
            offset: 0x1139,
            address: 0x7f00_0000_1139,
            function: Some("hook_launch".into()),
            hidden: true,
        };
        let t = h.text();
        assert!(!t.contains('\u{1b}'), "{t}");
        assert!(
            t.ends_with(
                "cuLaunchKernel -> /s/libshim.so+0x1139 (hook_launch) hidden by dlsym@/s/libshim.so"
            ),
            "{t}"
        );
    }
}
