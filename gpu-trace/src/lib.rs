//! gpu-trace: trace how GPU drivers schedule work for Linux processes.
//!
//! Two crates. The pure core, `gpu-trace-core` (no aya, tokio or clap; re-exported here under
//! the same names): [`wire`] (ring-buffer bytes → typed records), [`event`] (the events
//! reported), [`source`] (per-vendor decoding and trackers), [`model`] (statistics, attribution), [`output`] (text, JSON,
//! Perfetto, `top` frames), [`metrics`] (the Prometheus registry), [`pipeline`] (records →
//! events → outputs, shared by live runs and replay), [`record`] (the recording format) and the
//! inventory's data (`gpu_trace_core::inventory`, which [`probe::inventory`] fills).
//!
//! This crate, the parts that touch the system:
//! - [`probe`]: what the running kernel allows (BTF offsets, attach types, tracefs, privileges),
//!   and every read of /proc and /sys;
//! - [`targets`]: every kernel function, tracepoint and LSM hook gpu-trace attaches to, and
//!   its programs (one table for the loader, doctor and the benchmark);
//! - [`loader`]: loading the kernel programs and attaching the best hook per event;
//! - [`cli`]: the command line (clap), adapted to the core's types;
//! - [`run`]: the live loop (tokio) and replay, one concern per file, tying the core to the kernel and the CLI;
//! - [`metrics`]'s HTTP server and ring-buffer fill reader; [`top`], the terminal view;
//! - [`doctor`]: `gpu-trace doctor`, what this machine allows and why not;
//! - [`api`]: `gpu-trace api`, the GPU API layer (so far `--resolve`);
//! - [`launch`]: starting a command to trace (`-- CMD`) and following its children.
// Every line to stderr goes through `say!` (below): `eprintln!` panics on a closed stderr.
#![deny(clippy::print_stderr)]

/// `eprintln!` that never panics: a line to stderr, dropped when it cannot be written. With
/// `gpu-trace … 2>&1 | head`, stderr is a closed pipe once head has gone, and `eprintln!`
/// would stop the run with a panic (exit 101) at its next note, leaving whatever it had not
/// finished (a recording's trailer, a held process); stdout's end decides when a run stops.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod api;
pub mod cli;
pub mod doctor;
pub mod flags;
pub mod launch;
pub mod loader;
pub mod metrics;
pub mod probe;
pub mod queue;
pub mod run;
pub mod targets;
pub mod top;

/// A test-only variable (`GPU_TRACE_TEST_*`: a lowered bound, a stand-in, a shortened wait),
/// read in debug builds only — what `cargo test` runs. A release build never reads one, so no
/// environment can change what an installed gpu-trace does.
pub fn test_var(name: &str) -> Option<std::ffi::OsString> {
    debug_assert!(name.starts_with("GPU_TRACE_TEST_"), "{name}");
    if cfg!(debug_assertions) {
        std::env::var_os(name)
    } else {
        None
    }
}

pub use gpu_trace_core::{escape, event, model, output, pipeline, record, sink, source, wire};
