//! What the running kernel allows.
pub mod btf;
