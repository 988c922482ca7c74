//! gpu-trace's pure core: what happens to a record after the kernel wrote it. No aya, tokio or
//! clap here (the `gpu-trace` crate loads the kernel programs, reads the ring buffer, parses the
//! command line and serves HTTP); everything below is plain data and functions, so that a
//! recording replays through exactly the code a live run uses, and tests need no kernel.
//!
//! The path of a record, one module each, ground floor first:
//! - [`event`] (the vocabulary every layer shares: what is reported, the task keys) and
//!   [`escape`] (untrusted strings made safe for a terminal and JSON);
//! - [`wire`]: ring-buffer bytes → typed records, parsed once (the layouts are
//!   `gpu-trace-common`'s);
//! - [`source`]: one directory per source (`source/nvidia`, `source/amd`), each a decoder and a
//!   tracker behind one trait, [`source::Source`]; [`source::Sources`] routes each record to
//!   its source and a process exit to all of them;
//! - [`model`]: what is kept across events: statistics, GPU identity, container attribution,
//!   the bounded tables the trackers use;
//! - [`sink`]: the [`sink::Sink`] trait and the enriched event every output receives;
//!   [`output`] (text, JSON lines, Perfetto timelines, `top` frames) and [`metrics`]
//!   (Prometheus) are the sinks;
//! - [`pipeline`]: parse → sources → enrich → sinks (shared by live runs and replay);
//! - [`record`]: the recording file format (`--record`, `replay`); [`merge`]: several
//!   nodes' recordings replayed on one timeline (`gpu-trace merge`);
//! - [`api`]: the GPU API layer's pure part (the symbol table; which library serves each call);
//! - [`inventory`]: what the start-up inventory found (processes with a GPU open before
//!   tracing), as data.
//!
//! And [`skip`]: the one way the workspace's tests say that they could not run.
pub mod api;
pub mod escape;
pub mod event;
pub mod event_fields;
pub mod event_section;
pub mod flight;
pub mod inventory;
pub mod live_set;
pub mod merge;
pub mod metrics;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod record;
pub mod rotate;
pub mod section;
pub mod sink;
pub mod skip;
pub mod source;
pub mod state_log;
pub mod user_records;
pub mod wire;
