//! `--metrics`: the metrics core is `gpu_trace_core::metrics` (pure: events and statistics into
//! a `prometheus-client` registry); here are the parts that touch the system: the HTTP server
//! ([`server`]), who may read it ([`access`]), the ring buffer's fill read from the kernel's pages ([`ring`]),
//! and gpu-trace's own CPU time and memory ([`process`]).
// The core's metrics that xtask (which depends on this crate alone) and the tests name through
// `gpu_trace::metrics`; this crate's own code imports them from `gpu_trace_core::metrics`.
pub use gpu_trace_core::metrics::{Metrics, MetricsConfig, encode};

pub mod access;
pub mod process;
pub mod ring;
pub mod server;
