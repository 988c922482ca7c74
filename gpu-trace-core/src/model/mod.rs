//! What the core keeps across events: statistics, GPU identity and container attribution, and
//! the bounded tables the vendors' trackers use.
pub mod bounded;
pub mod gpus;
pub mod share;
pub mod stats;
pub mod workload;
