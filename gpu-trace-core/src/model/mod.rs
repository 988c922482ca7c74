//! Event model: what the driver objects are and which events their life produces.
pub mod amd;
pub mod bounded;
pub mod event;
pub mod gpus;
pub mod nvidia;
pub mod stats;
pub mod workload;
