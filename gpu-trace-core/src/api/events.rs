//! `gpu-trace api`'s per-call events: `API_CALL` (one per completed call, `-v`, ltrace-like)
//! and `API_RECURSION` (a symbol re-entered on a thread through the same library, or a thread
//! past `--max-depth`), as text lines and JSON objects (docs/events.md). Library paths and
//! process names come from the traced process: text escapes them, JSON carries them as UTF-8.

use serde_json::{Value, json};

use crate::escape::{escape_text, lossy};

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
    /// The library came through `LD_PRELOAD` in this process (text `[preload]` after the
    /// library, JSON `preload`).
    pub preload: bool,
    /// The call one level out on the thread (its library is the caller's).
    pub caller: Option<Site>,
    pub duration_ns: u64,
    pub ret: u64,
    pub depth: u32,
}

/// `API_CALL` as one text line (no newline).
pub fn call_text(e: &CallEvent) -> String {
    format!(
        "API_CALL pid={} tid={} comm={} {}() = {} <{}.{:03} us> depth={} library={}{} caller={}",
        e.pid,
        e.tid,
        escape_text(&e.comm),
        escape_text(&e.site.symbol),
        e.ret as u32 as i32,
        e.duration_ns / 1000,
        e.duration_ns % 1000,
        e.depth,
        escape_text(&e.site.library),
        crate::api::stats::preload_mark(e.preload),
        e.caller
            .as_ref()
            .map_or("-".into(), |c| escape_text(&c.library).into_owned()),
    )
}

/// `SYMBOL@LIBRARY`, escaped: a call site as the main trace spells it (`api=` of the driver
/// events, `gpu-trace --api`'s `API_CALL` and `API_RECURSION` lines).
pub fn site_text(s: &Site) -> String {
    format!("{}@{}", escape_text(&s.symbol), escape_text(&s.library))
}

/// The main trace's `API_CALL` fields (after its `PID=… comm` columns, no newline):
/// `tid=T SYM@LIB = RET <DUR us> depth=D caller=SYM@LIB` (`caller=-` for an outermost call).
pub fn call_fields(e: &CallEvent) -> String {
    format!(
        "tid={} {} = {} <{}.{:03} us> depth={} caller={}",
        e.tid,
        site_text(&e.site),
        e.ret as u32 as i32,
        e.duration_ns / 1000,
        e.duration_ns % 1000,
        e.depth,
        e.caller.as_ref().map_or_else(|| "-".into(), site_text),
    )
}

/// The main trace's `API_RECURSION` fields (after its `PID=… comm` columns, no newline):
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

/// The fields every API event has, then `rest`'s, as one JSON object (no newline).
fn json_line(event: &str, pid: u32, tid: u32, comm: &str, site: &Site, rest: Value) -> String {
    let mut v = json!({
        "event": event,
        "pid": pid,
        "tid": tid,
        "comm": lossy(comm),
        "library": lossy(&site.library),
        "symbol": lossy(&site.symbol),
    });
    if let (Some(m), Value::Object(r)) = (v.as_object_mut(), rest) {
        m.extend(r);
    }
    v.to_string()
}

/// `API_CALL` as one JSON object (no newline).
pub fn call_json(e: &CallEvent) -> String {
    let rest = json!({
        "duration_ns": e.duration_ns,
        "ret": e.ret as u32 as i32,
        "depth": e.depth,
        "preload": e.preload,
        "caller_library": e.caller.as_ref().map(|c| lossy(&c.library)),
    });
    json_line("API_CALL", e.pid, e.tid, &e.comm, &e.site, rest)
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

/// `API_RECURSION` as one text line (no newline).
pub fn recursion_text(e: &RecursionEvent) -> String {
    let chain: Vec<String> = e
        .chain
        .iter()
        .map(|s| format!("{}:{}", escape_text(&s.library), escape_text(&s.symbol)))
        .collect();
    format!(
        "API_RECURSION pid={} tid={} comm={} {}() library={} depth={} why={} chain={}",
        e.pid,
        e.tid,
        escape_text(&e.comm),
        escape_text(&e.site.symbol),
        escape_text(&e.site.library),
        e.depth,
        why(e),
        chain.join(" > ")
    )
}

/// `API_RECURSION` as one JSON object (no newline).
pub fn recursion_json(e: &RecursionEvent) -> String {
    let chain: Vec<_> = e
        .chain
        .iter()
        .map(|s| json!({"library": lossy(&s.library), "symbol": lossy(&s.symbol)}))
        .collect();
    let rest = json!({
        "depth": e.depth,
        "why": why(e),
        "chain": chain,
    });
    json_line("API_RECURSION", e.pid, e.tid, &e.comm, &e.site, rest)
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

/// `API_STUCK` as text: a line, then the stack's frames indented (newline-terminated).
pub fn stuck_text(e: &StuckEvent) -> String {
    let mut out = format!(
        "API_STUCK pid={} tid={} comm={} {}() library={} open_for={}.{:03}s state={} wchan={} \
         syscall={}\n",
        e.pid,
        e.tid,
        escape_text(&e.comm),
        escape_text(&e.site.symbol),
        escape_text(&e.site.library),
        e.open_ns / 1_000_000_000,
        e.open_ns / 1_000_000 % 1000,
        escape_text(&e.state),
        escape_text(&e.wchan),
        escape_text(&e.syscall),
    );
    for f in &e.stack {
        out += &format!("    {}\n", escape_text(f));
    }
    out
}

/// `API_STUCK` as one JSON object (no newline).
pub fn stuck_json(e: &StuckEvent) -> String {
    let rest = json!({
        "open_ns": e.open_ns,
        "state": lossy(&e.state),
        "wchan": lossy(&e.wchan),
        "syscall": lossy(&e.syscall),
        "stack": e.stack.iter().map(|f| lossy(f)).collect::<Vec<_>>(),
    });
    json_line("API_STUCK", e.pid, e.tid, &e.comm, &e.site, rest)
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
            preload: false,
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
    fn call_lines_escape_untrusted_strings() {
        let e = CallEvent {
            pid: 1,
            tid: 2,
            comm: "a\u{1b}]0;x".into(),
            site: site("/tmp/\u{7}shim.so"),
            preload: true,
            caller: Some(site("/x/\u{1b}lib.so")),
            duration_ns: 12_345,
            ret: 0xffff_ffff,
            depth: 1,
        };
        let t = call_text(&e);
        assert!(!t.contains('\u{1b}') && !t.contains('\u{7}'), "{t}");
        assert!(t.contains("hipMalloc() = -1 <12.345 us> depth=1"), "{t}");
        assert!(t.contains("shim.so [preload] caller="), "{t}");
        let v: serde_json::Value = serde_json::from_str(&call_json(&e)).unwrap();
        assert_eq!(v["library"], "/tmp/\u{7}shim.so");
        assert_eq!(v["ret"], -1);
        assert_eq!(v["preload"], true);
    }

    #[test]
    fn recursion_lines_name_the_chain_outermost_first() {
        let e = RecursionEvent {
            pid: 1,
            tid: 1,
            comm: "c".into(),
            site: site("/s.so"),
            depth: 2,
            past_cap: false,
            chain: vec![site("/s.so"), site("/s.so")],
        };
        let t = recursion_text(&e);
        assert!(
            t.ends_with("why=re-entered chain=/s.so:hipMalloc > /s.so:hipMalloc"),
            "{t}"
        );
        let v: serde_json::Value = serde_json::from_str(&recursion_json(&e)).unwrap();
        assert_eq!(v["chain"].as_array().unwrap().len(), 2);
    }
}
