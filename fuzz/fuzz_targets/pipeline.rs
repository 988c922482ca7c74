//! A stream of records (u32 LE length, then the bytes, as in a recording) through the whole
//! pipeline: wire → decoders → NVIDIA and AMD models → text and JSON output and statistics. No
//! input may panic, and the text output never holds a control character but line feeds.
#![no_main]

use std::time::Duration;

use gpu_trace::{
    cli::{Format, Timestamps},
    output::clock::Clock,
    pipeline::{Pipeline, PipelineConfig},
};
use libfuzzer_sys::fuzz_target;

fn records(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        // A u16 length keeps the records near the real sizes (≤ 264 bytes) most of the time.
        let len = u16::from_le_bytes([data[0], data[1]]) as usize % 512;
        data = &data[2..];
        let take = len.min(data.len());
        out.push(&data[..take]);
        data = &data[take..];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let recs = records(data);
    for format in [Format::Text, Format::Json] {
        let config = PipelineConfig {
            show_container: false,
            verbose: true,
            pids: Vec::new(),
            comms: Vec::new(),
            format,
            timestamps: Timestamps::Relative,
            stats: true,
            clock: Clock::new(0),
        };
        let mut out = Vec::new();
        let mut p = Pipeline::new(config, &mut out);
        for r in &recs {
            p.feed(r).unwrap();
        }
        p.finish(Default::default(), Duration::from_secs(1))
            .unwrap();
        let text = String::from_utf8(out).expect("output is UTF-8");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "a control character reached the output"
        );
    }
});
