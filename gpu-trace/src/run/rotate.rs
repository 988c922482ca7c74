//! `--record-rotate`: the pieces of a recording as files, each behind its own writer thread
//! ([`QueueWriter`]: a slow disk never blocks the ring buffer), for the core's
//! [`Rotating`](gpu_trace_core::rotate::Rotating) writer.

use std::{
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

use gpu_trace_core::rotate::{PieceStore, piece_path};

use super::outputs::OUTPUT_STALL;
use crate::queue::{Overflow, QueueWriter, Units};

/// The pieces `FILE.0001`, `FILE.0002`, … of `--record FILE`.
pub(super) struct PieceFiles {
    base: PathBuf,
    on_failure: Arc<dyn Fn() + Send + Sync>,
    /// Records lost by the closed pieces' queues.
    pub(super) lost: u64,
}

impl PieceFiles {
    /// `on_failure`: called from a piece's writer thread when a write fails (the live loop
    /// wakes up and stops).
    pub(super) fn new(base: &Path, on_failure: Arc<dyn Fn() + Send + Sync>) -> Self {
        Self {
            base: base.to_path_buf(),
            on_failure,
            lost: 0,
        }
    }
}

impl PieceStore for PieceFiles {
    type Out = QueueWriter;

    fn create(&mut self, index: u32) -> io::Result<QueueWriter> {
        let path = piece_path(&self.base, index);
        let file = std::fs::File::create(&path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("creating the recording piece {}: {e}", path.display()),
            )
        })?;
        Ok(QueueWriter::new(
            Box::new(file),
            Units::Marked,
            Overflow::Drop,
            self.on_failure.clone(),
        ))
    }

    fn lost(&self, out: &QueueWriter) -> u64 {
        out.lost()
    }

    fn close(&mut self, index: u32, out: QueueWriter) -> io::Result<()> {
        let closed = out.close(OUTPUT_STALL);
        self.lost += closed.lost;
        if closed.complete {
            return Ok(());
        }
        let path = piece_path(&self.base, index);
        Err(closed.error.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the disk stopped taking the recording piece {}; it is cut short",
                    path.display()
                ),
            )
        }))
    }

    fn remove(&mut self, index: u32) -> io::Result<()> {
        match std::fs::remove_file(piece_path(&self.base, index)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}
