//! The API layer's per-call events, the same in `gpu-trace api` and the main trace's `--api`:
//! `API_CALL` (one per completed call), `API_RECURSION` (a symbol re-entered on a thread
//! through the same library, or a thread past `--max-depth`) and `API_STUCK` (a call open
//! longer than `--stuck-after`). Each is a [`Section`]: it renders its own text fields here
//! (after the line's time, CPU, name and `PID=… comm` columns, which `output::text` writes as
//! for every event) and its own JSON fields (after the frame `output::json` writes as for every
//! event: `event`, `time`, the origin's fields; docs/events.md). Library paths and process names
//! come from the traced process: text escapes them, JSON carries them as UTF-8.

use std::borrow::Cow;

use serde::Serialize;

use crate::escape::{self, escape_text};
use crate::section::{Section, field, splice_object};

/// ` [preload]` after a library path that came through `LD_PRELOAD` (text outputs: the call
/// lines and the call tables).
pub fn preload_mark(preload: bool) -> &'static str {
    if preload { " [preload]" } else { "" }
}

/// A library and symbol (a traced attach point).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub library: String,
    pub symbol: String,
}

/// One completed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallEvent {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub site: Site,
    /// The library came through `LD_PRELOAD` in this process (text `[preload]` at the end,
    /// JSON `preload`); `None` where the run does not know (the main trace: its recording
    /// names libraries, not how they were loaded).
    pub preload: Option<bool>,
    /// The call one level out on the thread.
    pub caller: Option<Site>,
    pub duration_ns: u64,
    pub ret: u64,
    pub depth: u32,
}

/// `SYMBOL@LIBRARY`, escaped: a call site as the lines spell it (`api=` of the driver events,
/// `API_CALL`, `API_RECURSION`, `API_STUCK`).
pub fn site_text(s: &Site) -> String {
    format!("{}@{}", escape_text(&s.symbol), escape_text(&s.library))
}

/// `API_CALL`'s fields (after the `PID=… comm` columns, no newline):
/// `tid=T SYM@LIB = RET <DUR us> depth=D caller=SYM@LIB` (`caller=-` for an outermost call),
/// then ` [preload]` for a library that came through `LD_PRELOAD`.
pub fn call_fields(e: &CallEvent) -> String {
    format!(
        "tid={} {} = {} <{}.{:03} us> depth={} caller={}{}",
        e.tid,
        site_text(&e.site),
        e.ret as u32 as i32,
        e.duration_ns / 1000,
        e.duration_ns % 1000,
        e.depth,
        e.caller.as_ref().map_or_else(|| "-".into(), site_text),
        preload_mark(e.preload == Some(true)),
    )
}

/// `API_RECURSION`'s fields (after the `PID=… comm` columns, no newline):
/// `tid=T SYM@LIB why=re-entered|max-depth depth=D chain=SYM@LIB > SYM@LIB …` (outermost
/// first).
pub fn recursion_fields(e: &RecursionEvent) -> String {
    let chain: Vec<String> = e.chain.iter().map(site_text).collect();
    format!(
        "tid={} {} why={} depth={} chain={}",
        e.tid,
        site_text(&e.site),
        why(e),
        e.depth,
        if chain.is_empty() {
            "-".to_string()
        } else {
            chain.join(" > ")
        }
    )
}

/// `re-entered` or `max-depth`.
pub fn why(e: &RecursionEvent) -> &'static str {
    if e.past_cap {
        "max-depth"
    } else {
        "re-entered"
    }
}

/// A recursion or a thread past the depth cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecursionEvent {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub site: Site,
    pub depth: u32,
    /// Past `--max-depth` rather than re-entered.
    pub past_cap: bool,
    /// The thread's open calls, outermost first (as many as the kernel keeps).
    pub chain: Vec<Site>,
}

/// A call open longer than `--stuck-after`, with what /proc said about its thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckEvent {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub site: Site,
    /// How long the call had been open when seen.
    pub open_ns: u64,
    /// `stat`'s state letter, `wchan`, `syscall`'s first field.
    pub state: String,
    pub wchan: String,
    pub syscall: String,
    /// The scanned user stack, innermost first (`path+0xoff symbol+0xoff`).
    pub stack: Vec<String>,
}

/// `API_STUCK`'s fields (after the `PID=… comm` columns):
/// `tid=T SYM@LIB open_for=S.MMMs state=S wchan=W syscall=N`, then the stack's frames, each
/// on a line of its own, indented (no newline after the last).
pub fn stuck_fields(e: &StuckEvent) -> String {
    let mut out = format!(
        "tid={} {} open_for={}.{:03}s state={} wchan={} syscall={}",
        e.tid,
        site_text(&e.site),
        e.open_ns / 1_000_000_000,
        e.open_ns / 1_000_000 % 1000,
        escape_text(&e.state),
        escape_text(&e.wchan),
        escape_text(&e.syscall),
    );
    for f in &e.stack {
        out.push_str("\n    ");
        out.push_str(&escape_text(f));
    }
    out
}

/// A call site as JSON, `symbol` then `library` (names from the traced process: UTF-8 shown
/// lossily; [`escape::write_json`] writes them terminal-safe).
#[derive(Serialize)]
struct SiteJson<'a> {
    symbol: Cow<'a, str>,
    library: Cow<'a, str>,
}

impl<'a> SiteJson<'a> {
    fn of(site: &'a Site) -> Self {
        Self {
            symbol: escape::lossy(&site.symbol),
            library: escape::lossy(&site.library),
        }
    }
}

/// `API_CALL`: [`call_fields`]; JSON `symbol`, `library`, `duration_ns`, `ret`, `depth`,
/// `caller` (an inner call's), `preload` (where known).
impl Section for CallEvent {
    fn text(&self, line: &mut String) {
        line.push_str(&call_fields(self));
    }

    fn json(&self, out: &mut Vec<u8>) {
        splice_object(out, &SiteJson::of(&self.site));
        field(out, "duration_ns", &self.duration_ns);
        field(out, "ret", &(self.ret as u32 as i32));
        field(out, "depth", &self.depth);
        if let Some(c) = &self.caller {
            field(out, "caller", &SiteJson::of(c));
        }
        if let Some(preload) = self.preload {
            field(out, "preload", &preload);
        }
    }
}

/// `API_RECURSION`: [`recursion_fields`]; JSON `symbol`, `library`, `why`, `depth`, `chain`.
impl Section for RecursionEvent {
    fn text(&self, line: &mut String) {
        line.push_str(&recursion_fields(self));
    }

    fn json(&self, out: &mut Vec<u8>) {
        splice_object(out, &SiteJson::of(&self.site));
        field(out, "why", why(self));
        field(out, "depth", &self.depth);
        let chain: Vec<SiteJson<'_>> = self.chain.iter().map(SiteJson::of).collect();
        field(out, "chain", &chain);
    }
}

/// `API_STUCK`: [`stuck_fields`]; JSON `symbol`, `library`, `open_ns`, `state`, `wchan`,
/// `syscall`, `stack`.
impl Section for StuckEvent {
    fn text(&self, line: &mut String) {
        line.push_str(&stuck_fields(self));
    }

    fn json(&self, out: &mut Vec<u8>) {
        splice_object(out, &SiteJson::of(&self.site));
        field(out, "open_ns", &self.open_ns);
        field(out, "state", &escape::lossy(&self.state));
        field(out, "wchan", &escape::lossy(&self.wchan));
        field(out, "syscall", &escape::lossy(&self.syscall));
        let stack: Vec<_> = self.stack.iter().map(|f| escape::lossy(f)).collect();
        field(out, "stack", &stack);
    }
}

/// API events for the output modules' tests.
#[cfg(test)]
pub(crate) mod samples {
    use super::*;

    pub fn site(symbol: &str, library: &str) -> Site {
        Site {
            library: library.into(),
            symbol: symbol.into(),
        }
    }

    /// `cuCtxCreate_v4@LIBRARY` from `cudaMalloc@libcudart.so.12`, pid 4242, tid 4243,
    /// 12.345 µs, returning 0.
    pub fn call(comm: &str, library: &str) -> CallEvent {
        CallEvent {
            pid: 4242,
            tid: 4243,
            comm: comm.into(),
            site: site("cuCtxCreate_v4", library),
            preload: None,
            caller: Some(site("cudaMalloc", "libcudart.so.12")),
            duration_ns: 12_345,
            ret: 0,
            depth: 1,
        }
    }

    /// The record origin the pipeline would give `event` (its process, thread and thread
    /// name; a process's sums: the process as its thread, no name), made at `ts_ns` on `cpu`.
    pub fn origin_of(
        event: &crate::api::names::ApiEvent,
        ts_ns: u64,
        cpu: u32,
    ) -> crate::event::Origin {
        use crate::api::names::ApiEvent;
        let (tid, comm) = match event {
            ApiEvent::Call(e) => (e.tid, e.comm.as_str()),
            ApiEvent::Recursion(e) => (e.tid, e.comm.as_str()),
            ApiEvent::Stats(s) => (s.pid, ""),
            ApiEvent::Path(p) => (p.pid, p.comm.as_str()),
            ApiEvent::Handout(h) => (h.pid, h.comm.as_str()),
            ApiEvent::Stuck(e) => (e.tid, e.comm.as_str()),
        };
        crate::event::Origin {
            ts_ns,
            cpu,
            pid: event.pid(),
            tid,
            comm: comm.into(),
        }
    }

    /// `cuInit@shim.so` re-entered on pid 4242's thread 4243.
    pub fn recursion(comm: &str) -> RecursionEvent {
        RecursionEvent {
            pid: 4242,
            tid: 4243,
            comm: comm.into(),
            site: site("cuInit", "shim.so"),
            depth: 2,
            past_cap: false,
            chain: vec![site("cuInit", "shim.so")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(lib: &str) -> Site {
        Site {
            library: lib.into(),
            symbol: "hipMalloc".into(),
        }
    }

    #[test]
    fn call_fields_escape_untrusted_strings_and_mark_a_preload() {
        let mut e = CallEvent {
            pid: 1,
            tid: 2,
            comm: "a\u{1b}]0;x".into(),
            site: site("/tmp/\u{7}shim.so"),
            preload: Some(true),
            caller: Some(site("/x/\u{1b}lib.so")),
            duration_ns: 12_345,
            ret: 0xffff_ffff,
            depth: 1,
        };
        let t = call_fields(&e);
        assert!(!t.contains('\u{1b}') && !t.contains('\u{7}'), "{t}");
        assert!(
            t.contains("= -1 <12.345 us> depth=1 caller=hipMalloc@"),
            "{t}"
        );
        assert!(t.ends_with(" [preload]"), "{t}");
        e.preload = Some(false);
        assert!(!call_fields(&e).contains("preload"));
        e.preload = None;
        assert!(!call_fields(&e).contains("preload"));
    }

    #[test]
    fn recursion_fields_name_the_chain_outermost_first() {
        let e = RecursionEvent {
            pid: 1,
            tid: 1,
            comm: "c".into(),
            site: site("/s.so"),
            depth: 2,
            past_cap: false,
            chain: vec![site("/s.so"), site("/t.so")],
        };
        let t = recursion_fields(&e);
        assert!(
            t.ends_with("why=re-entered depth=2 chain=hipMalloc@/s.so > hipMalloc@/t.so"),
            "{t}"
        );
    }

    #[test]
    fn stuck_fields_indent_each_frame_on_its_own_line_escaped() {
        let e = StuckEvent {
            pid: 1,
            tid: 3,
            comm: "c".into(),
            site: site("/s.so"),
            open_ns: 2_345_000_000,
            state: "S".into(),
            wchan: "futex_wait_queue".into(),
            syscall: "202".into(),
            stack: vec!["/s.so+0x10 f+0x4".into(), "/x\u{1b}[2J+0x0".into()],
        };
        let t = stuck_fields(&e);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "tid=3 hipMalloc@/s.so open_for=2.345s state=S wchan=futex_wait_queue syscall=202"
        );
        assert_eq!(lines[1], "    /s.so+0x10 f+0x4");
        assert!(lines[2].starts_with("    /x") && !lines[2].contains('\u{1b}'));
        assert_eq!(lines.len(), 3);
    }
}
