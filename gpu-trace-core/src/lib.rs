//! gpu-trace's pure core: what happens to a record after the kernel wrote it. No aya, tokio or
//! clap here (the `gpu-trace` crate loads the kernel programs, reads the ring buffer, parses the
//! command line and serves HTTP); everything below is plain data and functions, so that a
//! recording replays through exactly the code a live run uses, and tests need no kernel.
//!
//! Layers, one module each, in the order a record goes through them:
//! - [`wire`]: ring-buffer bytes → typed records (the layouts are `gpu-trace-common`'s);
//! - [`nvidia`], [`amd`]: per-vendor decoding of driver calls;
//! - [`model`]: object tables and the events they produce, statistics, GPU and container
//!   attribution;
//! - [`output`]: text, JSON lines, Perfetto timelines, the `top` view's frames;
//! - [`metrics`]: Prometheus metrics of the same events (the registry; `gpu-trace` serves it);
//! - [`pipeline`]: records → decoded calls → events → outputs (shared by live runs and replay);
//! - [`record`]: the recording file format (`--record`, `replay`);
//! - [`inventory`]: what the start-up inventory found (processes with a GPU open before
//!   tracing), as data.
pub mod api;
pub mod event;
pub mod inventory;
pub mod metrics;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod record;
pub mod vendor;
pub mod wire;
