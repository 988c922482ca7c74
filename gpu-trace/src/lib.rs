//! gpu-trace: trace how GPU drivers schedule work for Linux processes.
//!
//! Layers, one module each:
//! - [`probe`]: what the running kernel allows (BTF offsets, attach types, tracefs, privileges);
//! - [`targets`]: every kernel function, tracepoint and LSM hook gpu-trace attaches to, and
//!   its programs (one table for the loader, doctor and the benchmark);
//! - [`loader`]: loading the kernel programs and attaching the best hook per event;
//! - [`wire`]: ring-buffer bytes → typed records (shared with `gpu-trace-common`);
//! - [`nvidia`], [`amd`]: per-vendor decoding of driver calls (pure code);
//! - [`model`]: object tables and the events they produce, statistics;
//! - [`output`]: text and JSON rendering;
//! - [`metrics`]: Prometheus metrics of the same events (`--metrics`), and their HTTP server;
//! - [`pipeline`]: records → decoded calls → events → output (shared by live runs and replay);
//! - [`cli`]: the command line;
//! - [`record`]: the recording file format (`--record`, `replay`);
//! - [`session`]: the live loop that ties them together;
//! - [`doctor`]: `gpu-trace doctor`, what this machine allows and why not;
//! - `bench_support` (feature `bench`, which only xtask turns on): what `cargo xtask bench` needs
//!   from the kernel side (the floor programs' own object, BPF program statistics).
pub mod amd;
#[cfg(feature = "bench")]
pub mod bench_support;
pub mod cli;
pub mod doctor;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod nvidia;
pub mod output;
pub mod pipeline;
pub mod probe;
pub mod record;
pub mod session;
pub mod targets;
pub mod top;
pub mod wire;
