//! The API layer's pure part (issue 28): GPU runtime calls as the dynamic linker binds them.
//! - [`symbols`]: the table of GPU API entry points (built-in families and `--probe`s);
//! - [`resolve`]: binding order + definitions → which library's copy each call reaches, and
//!   the warnings (recursing interposers, preload leaks);
//! - [`events`]: per-call `API_CALL` and `API_RECURSION` lines and JSON;
//! - [`interposer`]: lookup overrides and probable hidden hooks of a library (`--resolve`);
//! - [`render`]: `gpu-trace api --resolve`'s text and JSON;
//! - [`stats`]: the traced calls' counts, times and latency histograms (text and JSON);
//! - [`open`]: the driver events' tie to the API call open on their thread (`gpu-trace --api`);
//! - [`names`]: the main trace's API records (calls, recursions, sums) named by cookie;
//! - [`path`]: interposers on the call path or bypassed (`API_PATH`), hand-outs (`API_HANDOUT`).
pub mod events;
pub mod interposer;
pub mod names;
pub mod open;
pub mod path;
pub mod render;
pub mod resolve;
pub mod stats;
pub mod symbols;
