//! Rendering events and statistics.
pub mod json;
pub mod text;
