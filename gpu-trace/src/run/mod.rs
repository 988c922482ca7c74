//! Live tracing and replay: the loops around [`Pipeline`], one concern per file.
//!
//! Live ([`live`]): load and attach ([`Tracer`]) what [`plan`] chose, report the hooks on stderr
//! ([`report`]), read the ring buffer as it fills ([`reader`]), stop on Ctrl-C, SIGTERM or
//! `--duration` ([`signals`]), drain what is left, then print the statistics with the kernel's
//! counters through the outputs ([`outputs`]); `--record` ([`record`]), the late-attach inventory
//! ([`late_attach`]) and NVML's share sampler ([`share`]) beside it. Both live commands wait in
//! one event loop ([`event_loop`]), each with its pieces: the main trace's ([`live`]) and
//! `gpu-trace api`'s ([`api`]). Replay ([`replay`]): the same pipeline over a recording;
//! [`merge`](mod@merge): over several nodes' recordings at once.

mod api;
mod error;
pub(crate) mod event_loop;
mod files;
mod flight;
mod late_attach;
mod live;
mod merge;
mod outputs;
mod plan;
mod reader;
mod record;
mod replay;
mod report;
mod rotate;
mod share;
mod signals;

pub use crate::pipeline::Summary;
pub use api::run_api;
pub use error::{RunError, detect_vendor};
pub use late_attach::kernel_tracking;
pub use live::{run_live, run_live_with};
pub use merge::merge;
pub use outputs::check_paths;
pub use replay::{replay, replay_with};
pub use report::{Viewer, pid_warnings, print_report, still_runs};
pub use signals::{install_stop_signals, quiet, set_quiet, stop_requested};

#[cfg(test)]
mod tests;
