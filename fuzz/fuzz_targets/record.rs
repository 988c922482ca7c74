//! A recording file (`--record`): the reader must end or fail cleanly on any bytes, with memory
//! bounded by its length checks.
#![no_main]

use gpu_trace::record::RecordReader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut reader) = RecordReader::new(data) else {
        return;
    };
    // Each record consumes at least its 4-byte length: the loop ends.
    while let Ok(Some(record)) = reader.next_record() {
        assert!(!record.is_empty());
    }
});
