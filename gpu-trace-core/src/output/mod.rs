//! Rendering events and statistics: text lines, JSON lines, Perfetto timelines, `top` frames.
pub mod clock;
pub mod escape;
pub mod files;
pub mod json;
pub mod perfetto;
pub mod queue;
pub mod text;
pub mod top;

pub use text::TimestampMode;

/// The event lines' format (`--format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// One aligned line per event.
    #[default]
    Text,
    /// One JSON object per line (schema: docs/json-schema.md).
    Json,
}
