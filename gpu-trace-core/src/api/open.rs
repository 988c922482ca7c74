//! The driver events' tie to the API layer (issue 28 item 6, `gpu-trace --api`): a thread's
//! `API_CONTEXT` record (its open calls' names, resolved by userspace from the kernel's
//! `API_TAG`) waits here until that thread's driver record with the same header time, whose
//! events then carry it ([`crate::event::ApiOpen`]).

use std::collections::HashMap;

use gpu_trace_common::api::API_NAME_MAX;

use crate::user_records::{ApiContextRecord, ApiNames};

use crate::event::{ApiCall, ApiOpen, Origin};

/// Threads with a context waiting at once; past it a new one is dropped (and counted).
pub const PENDING_MAX: usize = 65_536;

/// The contexts waiting for their driver record, one per thread.
#[derive(Clone, Debug, Default)]
pub struct Pending {
    /// tid → (pid, header time, the context).
    by_tid: HashMap<u32, (u32, u64, ApiOpen)>,
    /// Contexts dropped because [`PENDING_MAX`] threads had one waiting.
    pub dropped: u64,
}

impl Pending {
    /// Keeps `rec`'s context for its thread's next driver record (a newer one replaces it).
    pub fn note(&mut self, rec: &ApiContextRecord) {
        let tid = rec.hdr.tid;
        if self.by_tid.len() >= PENDING_MAX && !self.by_tid.contains_key(&tid) {
            self.dropped += 1;
            return;
        }
        self.by_tid
            .insert(tid, (rec.hdr.tgid, rec.hdr.ts_ns, decode(rec)));
    }

    /// The context of the driver record made at `origin`: the thread's waiting one when its
    /// time is the record's (the kernel sends both with one header); any other waiting for the
    /// thread is stale (its driver record was lost to a full ring) and is dropped.
    pub fn take(&mut self, origin: &Origin) -> Option<ApiOpen> {
        let (_, ts, open) = self.by_tid.remove(&origin.tid)?;
        (ts == origin.ts_ns).then_some(open)
    }

    /// The process `pid` exited: its threads' contexts go.
    pub fn process_exited(&mut self, pid: u32) {
        self.by_tid.retain(|_, (p, _, _)| *p != pid);
    }
}

/// A name of the record (NUL padded, at most [`API_NAME_MAX`] bytes), every byte kept.
fn name(bytes: &[u8; API_NAME_MAX]) -> compact_str::CompactString {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    crate::escape::decode_lossless(&bytes[..end]).into()
}

pub(crate) fn call(n: &ApiNames) -> ApiCall {
    ApiCall {
        symbol: name(&n.symbol),
        library: name(&n.library),
    }
}

/// The context an `API_CONTEXT` record carries.
pub fn decode(rec: &ApiContextRecord) -> ApiOpen {
    ApiOpen {
        call: call(&rec.inner),
        caller: (rec.has_outer != 0).then(|| call(&rec.outer)),
        depth: rec.depth,
    }
}

/// The names as an `API_CONTEXT` record carries them: the library's file name only, each cut
/// to [`API_NAME_MAX`] bytes (at a character boundary).
pub fn names(symbol: &str, library: &str) -> ApiNames {
    let file = library.rsplit('/').next().unwrap_or(library);
    ApiNames {
        symbol: padded(symbol),
        library: padded(file),
    }
}

fn padded(s: &str) -> [u8; API_NAME_MAX] {
    let mut end = s.len().min(API_NAME_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = [0u8; API_NAME_MAX];
    out[..end].copy_from_slice(&s.as_bytes()[..end]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_trace_common::RecordHeader;

    fn rec(tid: u32, ts_ns: u64, outer: bool) -> ApiContextRecord {
        ApiContextRecord {
            hdr: RecordHeader {
                kind: crate::user_records::user_kind::API_CONTEXT,
                cpu: 0,
                ts_ns,
                tgid: 10,
                tid,
                comm: [0; 16],
            },
            depth: 1 + u32::from(outer),
            has_outer: u32::from(outer),
            inner: names("cuCtxCreate_v4", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            outer: if outer {
                names("cudaMalloc", "/opt/libcudart.so.12")
            } else {
                names("", "")
            },
        }
    }

    fn at(tid: u32, ts_ns: u64) -> Origin {
        Origin {
            ts_ns,
            cpu: 0,
            pid: 10,
            tid,
            comm: "x".into(),
        }
    }

    #[test]
    fn a_context_goes_to_the_driver_record_of_its_thread_and_time_only() {
        let mut p = Pending::default();
        p.note(&rec(11, 500, true));
        assert_eq!(p.take(&at(12, 500)), None, "another thread");
        let open = p.take(&at(11, 500)).expect("same thread and time");
        assert_eq!(open.call.symbol, "cuCtxCreate_v4");
        assert_eq!(open.call.library, "libcuda.so.1");
        let caller = open.caller.expect("outer call");
        assert_eq!(
            (caller.symbol.as_str(), caller.library.as_str()),
            ("cudaMalloc", "libcudart.so.12")
        );
        assert_eq!(p.take(&at(11, 500)), None, "taken once");
        // A context whose driver record was lost: the thread's next record does not get it.
        p.note(&rec(11, 600, false));
        assert_eq!(p.take(&at(11, 700)), None);
        assert_eq!(p.take(&at(11, 600)), None, "dropped as stale");
    }

    #[test]
    fn the_context_prints_innermost_first_escaped_and_as_a_json_object() {
        let open = decode(&rec(11, 500, true));
        assert_eq!(
            open.to_string(),
            " api=cuCtxCreate_v4@libcuda.so.1<cudaMalloc@libcudart.so.12"
        );
        let v = serde_json::to_value(&open).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"symbol": "cuCtxCreate_v4", "library": "libcuda.so.1", "depth": 2,
                "caller": {"symbol": "cudaMalloc", "library": "libcudart.so.12"}})
        );
        let hostile = decode(&ApiContextRecord {
            inner: names("cu\u{1b}[31mInit", "lib\ncuda"),
            ..rec(1, 1, false)
        });
        let text = hostile.to_string();
        assert!(!text.contains('\u{1b}') && !text.contains('\n'), "{text}");
        assert_eq!(serde_json::to_value(&hostile).unwrap()["depth"], 1);
        assert!(
            serde_json::to_value(&hostile)
                .unwrap()
                .get("caller")
                .is_none()
        );
    }

    #[test]
    fn names_are_cut_at_a_character_boundary_and_exits_forget_contexts() {
        let long = "é".repeat(40);
        let n = names(&long, "lib");
        let open = decode(&ApiContextRecord {
            inner: n,
            ..rec(1, 1, false)
        });
        assert_eq!(open.call.symbol, "é".repeat(32));
        assert_eq!(open.caller, None);
        let mut p = Pending::default();
        p.note(&rec(11, 5, false));
        p.process_exited(10);
        assert_eq!(p.take(&at(11, 5)), None);
    }
}
