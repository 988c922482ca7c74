//! The process-wide flags every part of the binary reads: a stop was requested (SIGINT or
//! SIGTERM, noted from the start by [`install_stop_signals`]) and `-q` (warnings only). At the
//! ground floor, so that the API layer, the loader and the run loop all read the same ones
//! without importing the run loop (`run/signals.rs` keeps the loop's tokio handlers).

use std::{
    io,
    sync::atomic::{AtomicBool, Ordering},
};

pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

/// Installs SIGINT and SIGTERM handlers that only note the request ([`stop_requested`]). A live
/// run calls this first, before anything is validated, opened or attached, so that a signal
/// that comes during start-up ends the run cleanly as soon as it can instead of being lost.
pub fn install_stop_signals() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the action only stores to an atomic, which is async-signal-safe.
        unsafe {
            signal_hook_registry::register(signal, || STOP.store(true, Ordering::SeqCst))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// `-q`: warnings only.

pub(crate) static QUIET: AtomicBool = AtomicBool::new(false);

/// `-q` on the command line: from now on stderr gets warnings and errors only, besides the
/// line that says tracing started (`tracing …; hooks: …`, which scripts wait for) and where
/// `--metrics` serves; the start-up notes (what runs, what is not used, the inventory) are left
/// out.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::SeqCst);
}

/// Whether `-q` was given ([`set_quiet`]): for the start-up lines printed outside this module.
pub fn quiet() -> bool {
    QUIET.load(Ordering::SeqCst)
}

/// A start-up note on stderr, after `gpu-trace: `, unless `-q` ([`set_quiet`]).
pub(crate) fn note(line: impl std::fmt::Display) {
    if !QUIET.load(Ordering::SeqCst) {
        crate::say!("gpu-trace: {line}");
    }
}

/// A SIGINT or SIGTERM came (after [`install_stop_signals`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------------
// `POST /dump` on the metrics endpoint: a dump asked for, as SIGUSR1 asks.

static DUMP_REQUEST: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The metrics endpoint's `POST /dump` came (authenticated): the live loop dumps the flight
/// recorder's window as on SIGUSR1 (one request waiting at most: more before the loop takes it
/// are one dump).
pub fn request_dump() {
    DUMP_REQUEST.notify_one();
}

/// Returns when a dump was asked for over HTTP ([`request_dump`]).
pub async fn dump_requested() {
    DUMP_REQUEST.notified().await;
}
