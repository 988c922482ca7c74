//! The one event loop of both live commands (the main trace and `top`, and `gpu-trace api`):
//! it waits on the ring buffer, SIGINT and SIGTERM, the deadline, an output's failure and the
//! command's periodic pieces, and hands each what is due. A command plugs in through
//! [`Turns`]: how it reads the ring, what each of its pieces does (the main trace: statistics,
//! the command's end, `--api`'s rescans, rotation, metrics; `gpu-trace api`: the targets'
//! end, the interval's rescans and tables, the stuck calls), what it does after each turn.

use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;
use tokio::time::Interval;

use super::{
    error::{RunError, io_err},
    signals::stop_requested,
};
pub(crate) use super::{
    reader::{CHILD_POLL, Drained},
    signals::StopSignals,
};

/// What a piece (or a read) asks of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Go on.
    Go,
    /// Go on, and the ring still held records when the piece's read ended: the runtime serves
    /// its timers and signals before the next slice.
    More,
    /// Tracing ends (the command ended, the targets are gone, the output closed).
    Stop,
}

/// What a command plugs into the loop.
pub(crate) trait Turns {
    /// Names its periodic pieces.
    type Piece: Copy;

    /// Whether an output failed: the loop ends before its next turn.
    fn failed(&self) -> bool;

    /// The ring holds records: one slice of reading.
    fn read(&mut self, ring: &mut RingBuf<MapData>) -> Result<Drained, RunError>;

    /// `piece` is due (`ring`: for a piece that reads what the ring holds first).
    fn piece(&mut self, piece: Self::Piece, ring: &mut RingBuf<MapData>) -> Result<Flow, RunError>;

    /// SIGUSR1 or `POST /dump` came (only where the loop was given SIGUSR1; `ring`: to read
    /// what it holds first).
    fn usr1(&mut self, _ring: &mut RingBuf<MapData>) -> Result<Flow, RunError> {
        Ok(Flow::Go)
    }

    /// After each turn, whatever ended it.
    fn after_turn(&mut self) -> Result<(), RunError> {
        Ok(())
    }
}

/// What the loop waits on besides the ring and the pieces.
pub(crate) struct Waits<'a> {
    pub(crate) signals: &'a mut StopSignals,
    pub(crate) usr1: Option<&'a mut tokio::signal::unix::Signal>,
    /// `--duration`'s end.
    pub(crate) deadline: Option<Instant>,
    /// Notified when an output fails (the loop condition sees it).
    pub(crate) wake: Option<&'a tokio::sync::Notify>,
}

impl<'a> Waits<'a> {
    pub(crate) fn new(
        signals: &'a mut StopSignals,
        usr1: Option<&'a mut tokio::signal::unix::Signal>,
        deadline: Option<Instant>,
        wake: Option<&'a tokio::sync::Notify>,
    ) -> Self {
        Self {
            signals,
            usr1,
            deadline,
            wake,
        }
    }
}

/// `ring`, registered with tokio to be read when it holds records.
pub(crate) fn watch(ring: RingBuf<MapData>) -> Result<AsyncFd<RingBuf<MapData>>, RunError> {
    // SAFETY: the ring buffer owns its map fd and keeps it open for as long as the AsyncFd
    // that owns the ring buffer lives; nothing else closes it.
    unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| io_err("polling the ring buffer")(e.into()))
}

/// A piece every `every`, the first at once.
pub(crate) fn every<P>(piece: P, every: Duration) -> (P, Interval) {
    (piece, tokio::time::interval(every))
}

/// A piece every `every`, the first after `first`.
pub(crate) fn every_after<P>(piece: P, first: Duration, every: Duration) -> (P, Interval) {
    let start = tokio::time::Instant::now() + first;
    (piece, tokio::time::interval_at(start, every))
}

/// Turns until a stop signal, the deadline, an output's failure or a piece's
/// [`Flow::Stop`]. A stop requested before the loop's handlers existed is not lost; the
/// deadline is also looked at between turns (under a storm its timer is served only between
/// two slices of reading).
pub(crate) async fn run<T: Turns>(
    ring: &mut AsyncFd<RingBuf<MapData>>,
    mut waits: Waits<'_>,
    mut pieces: Vec<(T::Piece, Interval)>,
    turns: &mut T,
) -> Result<(), RunError> {
    let deadline = waits.deadline;
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
    let mut last = pieces.len().saturating_sub(1);
    while !stop_requested() && !past_deadline() && !turns.failed() {
        let mut flow = Flow::Go;
        tokio::select! {
            () = waits.signals.recv() => break,
            _ = &mut sleep => break,
            piece = due(&mut pieces, &mut last) => flow = turns.piece(piece, ring.get_mut())?,
            () = notified(waits.wake) => {} // an output failed: the loop condition sees it
            () = signal(waits.usr1.as_deref_mut()) => flow = turns.usr1(ring.get_mut())?,
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(io_err("waiting for the ring buffer"))?;
                if turns.read(guard.get_inner_mut())? == Drained::More {
                    flow = Flow::More;
                } else {
                    // Still ready while records are left: the next turn reads on.
                    guard.clear_ready();
                }
            }
        }
        if flow == Flow::Stop {
            break;
        }
        turns.after_turn()?;
        if flow == Flow::More {
            // Let the runtime serve its timers and signals before the next slice.
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// A piece that is due (never, without pieces), looked for from the one after the last that
/// was (`last`), so that a piece always due (a short period behind under a storm) does not
/// keep the others waiting: each has its turn, as each had its branch.
async fn due<P: Copy>(pieces: &mut [(P, Interval)], last: &mut usize) -> P {
    let n = pieces.len();
    std::future::poll_fn(|cx| {
        for i in (1..=n).map(|k| (*last + k) % n) {
            let (piece, interval) = &mut pieces[i];
            if interval.poll_tick(cx).is_ready() {
                *last = i;
                return std::task::Poll::Ready(*piece);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

async fn notified(wake: Option<&tokio::sync::Notify>) {
    match wake {
        Some(w) => w.notified().await,
        None => std::future::pending().await,
    }
}

/// SIGUSR1, or an authenticated `POST /dump` on the metrics endpoint (asked for the same way);
/// never where the loop was not given SIGUSR1.
async fn signal(s: Option<&mut tokio::signal::unix::Signal>) {
    match s {
        Some(s) => tokio::select! {
            _ = s.recv() => {}
            () = crate::flags::dump_requested() => {}
        },
        None => std::future::pending().await,
    }
}
