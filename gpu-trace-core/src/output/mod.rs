//! Rendering events and statistics: text lines, JSON lines, Perfetto timelines, `top` frames.
pub mod clock;
pub mod files;
pub mod json;
pub mod perfetto;
pub mod share;
pub mod text;
pub mod top;

use std::io;

use crate::{
    inventory::Inventory,
    model::stats::Stats,
    sink::{ApiEnriched, Enriched, RunEnd, ShareBatch, Sink, SinkError},
};
use json::JsonSink;
use text::TextSink;
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

/// The event lines: text or JSON (`--format`), into the output writer `W`.
pub enum Lines<W> {
    Text(TextSink<W>),
    Json(JsonSink<W>),
}

impl<W: io::Write> Lines<W> {
    /// The output writer (live runs check their output queue through it).
    pub fn out(&self) -> &W {
        match self {
            Self::Text(s) => s.out(),
            Self::Json(s) => s.out(),
        }
    }

    /// Text: where the `--interval` blocks go; JSON writes them with the events.
    pub fn set_side(&mut self, side: Box<dyn io::Write>) {
        if let Self::Text(text) = self {
            text.set_side(side);
        }
    }

    pub fn into_out(self) -> W {
        match self {
            Self::Text(s) => s.into_out(),
            Self::Json(s) => s.into_out(),
        }
    }

    fn sink(&mut self) -> &mut dyn Sink {
        match self {
            Self::Text(s) => s,
            Self::Json(s) => s,
        }
    }
}

impl<W: io::Write> Sink for Lines<W> {
    fn inventory(&mut self, inv: &Inventory, selected: &Inventory) -> Result<(), SinkError> {
        self.sink().inventory(inv, selected)
    }

    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        // Matched here rather than through `sink()`: the per-event call stays static.
        match self {
            Self::Text(s) => s.event(ev),
            Self::Json(s) => s.event(ev),
        }
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        self.sink().api(ev)
    }

    fn shares(&mut self, batch: &ShareBatch<'_>) -> Result<(), SinkError> {
        self.sink().shares(batch)
    }

    fn periodic(&mut self, stats: &Stats) -> Result<(), SinkError> {
        self.sink().periodic(stats)
    }

    fn flush(&mut self, stats: &Stats, untracked: u64) -> Result<(), SinkError> {
        self.sink().flush(stats, untracked)
    }

    fn finish(&mut self, end: &RunEnd<'_>) -> Result<(), SinkError> {
        self.sink().finish(end)
    }
}
