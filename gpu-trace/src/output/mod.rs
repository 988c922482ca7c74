//! Rendering events and statistics: text lines, JSON lines, Perfetto timelines.
pub mod clock;
pub mod escape;
pub mod files;
pub mod json;
pub mod perfetto;
pub mod queue;
pub mod text;
pub mod top;
