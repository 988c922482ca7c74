//! Rendering events and statistics: text lines, JSON lines, Perfetto timelines, `top` frames.
pub mod clock;
pub mod json;
pub mod perfetto;
pub mod share;
pub mod stats_json;
pub mod stats_text;
pub mod text;
pub mod top;

use std::{cell::RefCell, io, rc::Rc};

use crate::{
    inventory::Inventory,
    model::stats::KernelCounters,
    model::stats::Stats,
    sink::{ApiEnriched, Enriched, RunEnd, ShareBatch, Sink, SinkError, Unreported},
};
use json::JsonSink;
use text::TextSink;
pub use text::TimestampMode;

/// One writer that several outputs write to in turn (`gpu-trace merge`: every node's lines,
/// or every node's timeline, into one file). Each write goes through at once: the outputs
/// write whole lines, so lines of different outputs never mix.
pub struct Shared<W>(Rc<RefCell<W>>);

impl<W> Shared<W> {
    pub fn new(out: W) -> Self {
        Self(Rc::new(RefCell::new(out)))
    }

    /// `f` of the writer (e.g. whether it failed).
    pub fn with<T>(&self, f: impl FnOnce(&W) -> T) -> T {
        f(&self.0.borrow())
    }

    /// The writer back, once every other handle is gone (else this handle again).
    pub fn into_inner(self) -> Result<W, Self> {
        Rc::try_unwrap(self.0)
            .map(RefCell::into_inner)
            .map_err(Self)
    }
}

impl<W> Clone for Shared<W> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<W: io::Write> io::Write for Shared<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.borrow_mut().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

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

    /// The output writer itself, for what a caller writes between two events.
    pub fn out_mut(&mut self) -> &mut W {
        match self {
            Self::Text(s) => s.out_mut(),
            Self::Json(s) => s.out_mut(),
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

    /// `gpu-trace merge`: every line names node `host` (text: a `host=` field at its end;
    /// JSON: a first `host` key).
    pub fn set_host(&mut self, host: &str) {
        match self {
            Self::Text(s) => s.set_host(host),
            Self::Json(s) => s.set_host(host),
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

/// The outputs of a run, built by the caller from the flags: any number of sinks (`--metrics`,
/// `--perfetto`, …, in the order given) and last the event lines (text or JSON, into `W`), whose
/// writer the caller gets back at the end. Each call reaches every output in turn, so the
/// pipeline names none of them; adding an output is one sink and one line where they are built.
pub struct Outputs<W> {
    others: Vec<Box<dyn Sink>>,
    lines: Lines<W>,
}

impl<W: io::Write> Outputs<W> {
    pub fn new(lines: Lines<W>) -> Self {
        Self {
            others: Vec::new(),
            lines,
        }
    }

    /// One more output, before the lines.
    pub fn push(&mut self, sink: Box<dyn Sink>) {
        self.others.push(sink);
    }

    /// The lines' writer (live runs check their output queue through it).
    pub fn out(&self) -> &W {
        self.lines.out()
    }

    /// The lines' writer itself, for what a caller writes between two events.
    pub fn out_mut(&mut self) -> &mut W {
        self.lines.out_mut()
    }

    pub fn into_out(self) -> W {
        self.lines.into_out()
    }

    /// `gpu-trace merge`: see [`Lines::set_host`].
    pub fn set_host(&mut self, host: &str) {
        self.lines.set_host(host);
    }

    /// Where the text lines' `--interval` blocks go (standard error: the event stream stays
    /// one line per event); JSON's go with the events.
    pub fn set_side(&mut self, side: Box<dyn io::Write>) {
        self.lines.set_side(side);
    }

    fn each(&mut self) -> impl Iterator<Item = &mut dyn Sink> {
        (self.others.iter_mut().map(|s| &mut **s as &mut dyn Sink))
            .chain(std::iter::once(&mut self.lines as &mut dyn Sink))
    }

    /// Ends every output, also past one that fails (a broken output still lets the timeline
    /// close, and the reverse): each failure, in the outputs' order.
    pub fn finish_each(&mut self, end: &RunEnd<'_>) -> Vec<SinkError> {
        self.each().filter_map(|s| s.finish(end).err()).collect()
    }
}

impl<W: io::Write> Sink for Outputs<W> {
    fn inventory(&mut self, inv: &Inventory, selected: &Inventory) -> Result<(), SinkError> {
        self.each().try_for_each(|s| s.inventory(inv, selected))
    }

    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        for s in &mut self.others {
            s.event(ev)?;
        }
        // Last and static: the one call every event makes.
        self.lines.event(ev)
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        self.each().try_for_each(|s| s.api(ev))
    }

    fn shares(&mut self, batch: &ShareBatch<'_>) -> Result<(), SinkError> {
        self.each().try_for_each(|s| s.shares(batch))
    }

    fn process_exited(&mut self, pid: u32) {
        self.each().for_each(|s| s.process_exited(pid));
    }

    fn kernel(&mut self, counters: &KernelCounters, unreported: &Unreported) {
        self.each().for_each(|s| s.kernel(counters, unreported));
    }

    fn periodic(&mut self, stats: &Stats) -> Result<(), SinkError> {
        self.each().try_for_each(|s| s.periodic(stats))
    }

    fn flush(&mut self, stats: &Stats, untracked: u64) -> Result<(), SinkError> {
        self.each().try_for_each(|s| s.flush(stats, untracked))
    }

    fn finish(&mut self, end: &RunEnd<'_>) -> Result<(), SinkError> {
        self.finish_each(end).into_iter().next().map_or(Ok(()), Err)
    }
}
