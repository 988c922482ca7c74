//! One ring-buffer record as the kernel would hand it over: parse it, decode it with the decoder
//! of its kind, and print its thread name the way the text output does (must never panic; the
//! escaped name holds no control character and gives back the exact bytes).
#![no_main]

use gpu_trace::{
    escape,
    source::amd::decode as amd,
    source::nvidia::{decode as nv, gpu_ext},
    wire::{self, RawRecord},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(record) = wire::parse_record(data) else {
        return;
    };
    let origin = record.origin();
    let shown = escape::escape_text(&origin.comm);
    assert!(!shown.chars().any(char::is_control));
    let raw = escape::raw_bytes(&origin.comm);
    assert_eq!(escape::unescape_text(&shown).as_deref(), Some(&raw[..]));
    let header = record.header();
    let end = header.comm.iter().position(|&b| b == 0).unwrap_or(16);
    assert_eq!(&raw[..], &header.comm[..end]);
    match &record {
        RawRecord::NvIoctl(r) => {
            let _ = nv::decode(r);
            let _ = (nv::fd(r), nv::errno(r));
        }
        RawRecord::KfdIoctl(r) => {
            let _ = amd::decode(r);
        }
        RawRecord::KfdQueue(r) => {
            let _ = amd::decode_queue(r);
        }
        RawRecord::Deep(r) => {
            let _ = amd::decode_deep(r);
        }
        RawRecord::NvSched(r) => {
            let _ = gpu_ext::decode(r);
        }
        RawRecord::ProcessExit(_) | RawRecord::FdClose(_) => {}
    }
});
