//! The main trace's API records (`gpu-trace --api`) by name: `API_SYMBOL` records (written by
//! the live run when it attaches a probe, kept in the recording) name each attach cookie; the
//! kernel's `API_CALL` and `API_RECURSION` records and the live run's `API_STATS` records carry
//! cookies only, and become [`ApiEvent`]s here.

use std::collections::HashMap;

use gpu_trace_common::api::{API_STACK_MAX, ApiCallRecord, ApiRecursionRecord};

use super::events::{CallEvent, RecursionEvent, Site};
use super::stats::CallStats;
use crate::event::Origin;
use crate::section::Section;
use crate::user_records::{ApiStatsRecord, ApiSymbolRecord};

/// Cookies named at most (a run attaches a few hundred); past it a new one is not kept and
/// its calls are named `#N` (counted in [`Names::dropped`]).
pub const NAMES_MAX: usize = 65_536;

/// One API record of the main trace, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiEvent {
    /// One completed call (`--api-calls`).
    Call(CallEvent),
    /// A call re-entered on its thread, or a thread past the depth cap.
    Recursion(RecursionEvent),
    /// A process's calls of one library's symbol so far (the kernel's sums, read each second
    /// and at the end).
    Stats(CallStats),
    /// An interposer's verdict: on the path of the process's calls, or bypassed (at the end
    /// and each `--interval`).
    Path(super::path::ApiPath),
    /// A lookup handed a table symbol out (`-v`).
    Handout(super::path::Handout),
    /// A call open longer than `--stuck-after` (`gpu-trace api`).
    Stuck(super::events::StuckEvent),
}

impl ApiEvent {
    /// The name of its line (`API_CALL`, `API_RECURSION`, `API_PATH`, `API_HANDOUT`); `None`
    /// for a process's sums, which
    /// the statistics print rather than a line of their own.
    pub fn name(&self) -> Option<&'static str> {
        match self {
            Self::Call(_) => Some("API_CALL"),
            Self::Recursion(_) => Some("API_RECURSION"),
            Self::Path(_) => Some("API_PATH"),
            Self::Handout(_) => Some("API_HANDOUT"),
            Self::Stuck(_) => Some("API_STUCK"),
            Self::Stats(_) => None,
        }
    }

    /// The call the line is about (a recursion's: the call that re-entered; a stuck call's:
    /// the call open); `None` for a
    /// process's sums, a verdict and a hand-out.
    pub fn site(&self) -> Option<&Site> {
        match self {
            Self::Call(e) => Some(&e.site),
            Self::Recursion(e) => Some(&e.site),
            Self::Stuck(e) => Some(&e.site),
            Self::Stats(_) | Self::Path(_) | Self::Handout(_) => None,
        }
    }

    /// The whole JSON line (no newline) of a record that has no common frame (`API_PATH`,
    /// `API_HANDOUT`: the objects `gpu-trace api` writes, without `time` and the origin's
    /// fields); `None` for the others, whose [`Section`] fields follow the frame.
    pub fn own_json_line(&self) -> Option<String> {
        match self {
            Self::Path(p) => Some(p.json()),
            Self::Handout(h) => Some(h.json()),
            Self::Call(_) | Self::Recursion(_) | Self::Stuck(_) | Self::Stats(_) => None,
        }
    }

    /// Its text line is printed with `-v` only (`API_HANDOUT`: one a process and symbol,
    /// mostly at its start).
    pub fn verbose_only(&self) -> bool {
        matches!(self, Self::Handout(_))
    }

    /// The process the event is about.
    pub fn pid(&self) -> u32 {
        match self {
            Self::Call(e) => e.pid,
            Self::Recursion(e) => e.pid,
            Self::Stats(s) => s.pid,
            Self::Path(p) => p.pid,
            Self::Handout(h) => h.pid,
            Self::Stuck(e) => e.pid,
        }
    }
}

/// Each record's own fields, as its module writes them ([`CallEvent`], [`RecursionEvent`],
/// [`StuckEvent`](super::events::StuckEvent) in `events.rs`; `API_PATH`'s sentence and
/// `API_HANDOUT`'s fields in `path.rs`, whose JSON is a line of its own:
/// [`ApiEvent::own_json_line`]). Nothing for a process's sums (the statistics carry them).
impl Section for ApiEvent {
    fn text(&self, line: &mut String) {
        match self {
            Self::Call(e) => e.text(line),
            Self::Recursion(e) => e.text(line),
            Self::Stuck(e) => e.text(line),
            Self::Path(p) => line.push_str(&p.sentence()),
            Self::Handout(h) => line.push_str(&h.fields()),
            Self::Stats(_) => {}
        }
    }

    fn json(&self, out: &mut Vec<u8>) {
        match self {
            Self::Call(e) => e.json(out),
            Self::Recursion(e) => e.json(out),
            Self::Stuck(e) => e.json(out),
            Self::Path(_) | Self::Handout(_) | Self::Stats(_) => {}
        }
    }
}

/// Cookie → library and symbol, from the run's `API_SYMBOL` records.
#[derive(Clone, Debug, Default)]
pub struct Names {
    by_cookie: HashMap<u64, Site>,
    /// `API_SYMBOL` records not kept because [`NAMES_MAX`] cookies were named.
    pub dropped: u64,
}

impl Names {
    /// Keeps an `API_SYMBOL` record's names (a later record for the same cookie replaces
    /// them).
    pub fn note(&mut self, rec: &ApiSymbolRecord) {
        if self.by_cookie.len() >= NAMES_MAX && !self.by_cookie.contains_key(&rec.cookie) {
            self.dropped += 1;
            return;
        }
        let call = super::open::call(&rec.names);
        self.by_cookie.insert(
            rec.cookie,
            Site {
                library: call.library.into(),
                symbol: call.symbol.into(),
            },
        );
    }

    /// The names behind `cookie`: `#LIB`/`#SYM` (the cookie's two halves) when no
    /// `API_SYMBOL` named it (a recording cut before it).
    pub fn site(&self, cookie: u64) -> Site {
        self.by_cookie
            .get(&cookie)
            .cloned()
            .unwrap_or_else(|| Site {
                library: format!("#{}", cookie >> 32),
                symbol: format!("#{}", cookie & 0xffff_ffff),
            })
    }

    /// `API_CALL` by name (the main trace does not know the `LD_PRELOAD` mark: `gpu-trace
    /// api` does).
    pub fn call(&self, origin: &Origin, r: &ApiCallRecord) -> ApiEvent {
        ApiEvent::Call(call_event(origin, r, |c| self.site(c), None))
    }

    /// `API_RECURSION` by name.
    pub fn recursion(&self, origin: &Origin, r: &ApiRecursionRecord) -> ApiEvent {
        ApiEvent::Recursion(recursion_event(origin, r, |c| self.site(c)))
    }

    /// `API_STATS` by name.
    pub fn stats(&self, r: &ApiStatsRecord) -> ApiEvent {
        let site = self.site(r.cookie);
        ApiEvent::Stats(CallStats::new(
            r.hdr.tgid, site, false, r.count, r.errors, r.total_ns, &r.hist,
        ))
    }
}

/// A kernel `API_CALL` record made at `origin`, its cookies named by `site` (the main trace's
/// [`Names`], `gpu-trace api`'s attacher); `preload`: its library came through `LD_PRELOAD`.
pub fn call_event(
    origin: &Origin,
    r: &ApiCallRecord,
    site: impl Fn(u64) -> Site,
    preload: Option<bool>,
) -> CallEvent {
    CallEvent {
        pid: origin.pid,
        tid: origin.tid,
        comm: origin.comm.to_string(),
        site: site(r.cookie),
        preload,
        caller: (r.depth > 0).then(|| site(r.caller_cookie)),
        duration_ns: r.duration_ns,
        ret: r.ret,
        depth: r.depth,
    }
}

/// A kernel `API_RECURSION` record made at `origin`, its cookies named by `site`: the chain
/// as the kernel kept it (at most [`API_STACK_MAX`] open calls before this one).
pub fn recursion_event(
    origin: &Origin,
    r: &ApiRecursionRecord,
    site: impl Fn(u64) -> Site,
) -> RecursionEvent {
    let kept = (r.depth.saturating_sub(1) as usize).min(API_STACK_MAX);
    RecursionEvent {
        pid: origin.pid,
        tid: origin.tid,
        comm: origin.comm.to_string(),
        site: site(r.cookie),
        depth: r.depth,
        past_cap: r.past_cap != 0,
        chain: r.chain[..kept].iter().map(|&c| site(c)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RawRecord;
    use gpu_trace_common::{RecordHeader, record_kind};

    fn hdr(kind: u32) -> RecordHeader {
        RecordHeader {
            kind,
            cpu: 1,
            ts_ns: 5_000,
            tgid: 42,
            tid: 43,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
        }
    }

    fn symbol(cookie: u64, sym: &str, lib: &str) -> ApiSymbolRecord {
        ApiSymbolRecord {
            hdr: hdr(crate::user_records::user_kind::API_SYMBOL),
            cookie,
            names: super::super::open::names(sym, lib),
        }
    }

    /// Named cookies give their names (the library's file name), unnamed ones their two
    /// halves; a call at depth 0 has no caller, one deeper names the caller's site.
    #[test]
    fn calls_are_named_by_the_symbol_records_and_unnamed_cookies_by_number() {
        let mut n = Names::default();
        n.note(&symbol(
            1 << 32 | 2,
            "cuLaunchKernel",
            "/usr/lib/libcuda.so.1",
        ));
        n.note(&symbol(
            3 << 32 | 4,
            "cudaLaunchKernel",
            "/opt/libcudart.so.12",
        ));
        let call = |cookie, caller_cookie, depth| ApiCallRecord {
            hdr: hdr(record_kind::API_CALL),
            cookie,
            caller_cookie,
            duration_ns: 1500,
            ret: 0,
            depth,
            _pad: 0,
        };
        let origin = RawRecord::ApiCall(call(0, 0, 0)).origin();
        let ApiEvent::Call(e) = n.call(&origin, &call(1 << 32 | 2, 3 << 32 | 4, 1)) else {
            panic!("a call")
        };
        assert_eq!((e.pid, e.tid, e.comm.as_str()), (42, 43, "python3"));
        assert_eq!(
            (e.site.symbol.as_str(), e.site.library.as_str()),
            ("cuLaunchKernel", "libcuda.so.1")
        );
        assert_eq!(e.caller.unwrap().library, "libcudart.so.12");
        let ApiEvent::Call(e) = n.call(&origin, &call(9 << 32 | 8, 0, 0)) else {
            panic!("a call")
        };
        assert_eq!(
            (e.site.library.as_str(), e.site.symbol.as_str()),
            ("#9", "#8")
        );
        assert_eq!(e.caller, None);
    }

    /// The chain holds the calls open before the recursing one (depth − 1 of them, at most
    /// the kernel's 16), outermost first.
    #[test]
    fn recursion_chain_is_cut_to_what_the_kernel_kept() {
        let mut n = Names::default();
        n.note(&symbol(1, "hipMalloc", "/tmp/shim.so"));
        let mut chain = [0u64; API_STACK_MAX];
        chain[0] = 1;
        chain[1] = 1;
        let rec = |depth| ApiRecursionRecord {
            hdr: hdr(record_kind::API_RECURSION),
            cookie: 1,
            depth,
            past_cap: 0,
            chain,
        };
        let origin = RawRecord::ApiRecursion(rec(3)).origin();
        let ApiEvent::Recursion(e) = n.recursion(&origin, &rec(3)) else {
            panic!("a recursion")
        };
        assert_eq!(e.chain.len(), 2);
        assert!(
            e.chain
                .iter()
                .all(|s| s.symbol == "hipMalloc" && s.library == "shim.so")
        );
        let ApiEvent::Recursion(e) = n.recursion(&origin, &rec(1000)) else {
            panic!("a recursion")
        };
        assert_eq!(e.chain.len(), API_STACK_MAX);
    }

    /// Past [`NAMES_MAX`] cookies a new one is counted, not kept; a known one is renamed.
    #[test]
    fn the_table_is_bounded() {
        let mut n = Names::default();
        for c in 0..NAMES_MAX as u64 {
            n.note(&symbol(c, "cuInit", "libcuda.so.1"));
        }
        n.note(&symbol(NAMES_MAX as u64, "cuInit", "libcuda.so.1"));
        assert_eq!(n.dropped, 1);
        n.note(&symbol(0, "cuMemAlloc_v2", "libcuda.so.1"));
        assert_eq!((n.dropped, n.site(0).symbol.as_str()), (1, "cuMemAlloc_v2"));
    }
}
