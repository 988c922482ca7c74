//! The live loop's tokio handlers of SIGINT and SIGTERM; the flags they and the rest of the
//! binary read (a stop was requested, `-q`) are [`crate::flags`]'s, re-exported here.

use tokio::signal::unix::SignalKind;

pub(super) use crate::flags::{QUIET, note};
pub use crate::flags::{install_stop_signals, quiet, set_quiet, stop_requested};

use super::error::{RunError, io_err};

/// SIGINT and SIGTERM as the live loop waits for them (tokio's handlers).
pub(crate) struct StopSignals {
    pub(super) interrupt: tokio::signal::unix::Signal,
    pub(super) terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub(crate) fn install() -> Result<Self, RunError> {
        Ok(Self {
            interrupt: tokio::signal::unix::signal(SignalKind::interrupt())
                .map_err(io_err("installing the SIGINT handler"))?,
            terminate: tokio::signal::unix::signal(SignalKind::terminate())
                .map_err(io_err("installing the SIGTERM handler"))?,
        })
    }

    /// Returns when a SIGINT or a SIGTERM came.
    pub(crate) async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
