//! Rendering events and statistics.
pub mod clock;
pub mod json;
pub mod text;
