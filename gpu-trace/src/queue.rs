//! Output that never blocks the control path.
//!
//! A live run writes its output (standard output or `-o`) and its recording through a
//! [`QueueWriter`]: writes go to memory, whole lines (or whole records) are handed in chunks to
//! a writer thread through a bounded queue, and the thread does the blocking `write(2)`s. When the
//! reader stalls (`| sleep 10`, a FIFO nobody drains, a full disk that blocks), the queue fills
//! and later chunks are dropped and counted ([`QueueWriter::lost`]) instead of blocking: Ctrl-C,
//! SIGTERM and `--duration` are always served, and the run ends with the statistics. A write
//! error (a closed pipe: `EPIPE`) stops the thread and is reported by [`QueueWriter::failed`].

use std::{
    io::{self, Write},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{self, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// Bytes gathered before a chunk is handed over (lines mode).
const CHUNK: usize = 64 * 1024;
/// Chunks the queue holds: at most 16 MiB waiting for a slow reader.
const DEPTH: usize = 256;

/// How the data splits into units that are kept or lost whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Units {
    /// Text or JSON lines: chunks end at a line feed.
    Lines,
    /// The writer calls [`QueueWriter::mark_unit`] after each unit (a recording's records);
    /// chunks are handed over at `flush()`, so they hold whole units.
    Marked,
}

/// What a full queue does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// Drop the chunk and count its units (live runs: the control path never waits).
    Drop,
    /// Wait for room (replay: nothing is lost, a slow reader slows the replay down).
    Block,
}

#[derive(Default)]
struct Shared {
    /// Units dropped because the queue was full.
    lost: AtomicU64,
    /// Chunks the thread has written (progress, for the final wait).
    written: AtomicU64,
    failed: AtomicBool,
    error: Mutex<Option<io::Error>>,
}

pub struct QueueWriter {
    pending: Vec<u8>,
    /// Units in `pending` (`Units::Marked`).
    marked: u64,
    units: Units,
    overflow: Overflow,
    tx: Option<SyncSender<(Vec<u8>, u64)>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl QueueWriter {
    /// Starts the writer thread over `out`. `on_failure` is called (from that thread) when a
    /// write fails, so that the control loop can wake up.
    pub fn new(
        out: Box<dyn Write + Send>,
        units: Units,
        overflow: Overflow,
        on_failure: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        let (tx, rx) = mpsc::sync_channel::<(Vec<u8>, u64)>(DEPTH);
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        let wake = on_failure;
        let thread = std::thread::Builder::new()
            .name("gpu-trace-out".into())
            .spawn(move || {
                let mut out = out;
                for (chunk, _) in rx {
                    if let Err(e) = out.write_all(&chunk).and_then(|()| out.flush()) {
                        *thread_shared
                            .error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner()) = Some(e);
                        thread_shared.failed.store(true, Ordering::SeqCst);
                        wake();
                        return;
                    }
                    thread_shared.written.fetch_add(1, Ordering::SeqCst);
                }
            })
            .ok();
        Self {
            pending: Vec::new(),
            marked: 0,
            units,
            overflow,
            tx: Some(tx),
            shared,
            thread,
        }
    }

    /// Units (lines, or recording flushes) dropped because the reader did not keep up.
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::SeqCst)
    }

    /// The writer thread stopped on a write error.
    pub fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst)
    }

    pub fn take_error(&self) -> Option<io::Error> {
        self.shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// One more complete unit was written (`Units::Marked`).
    pub fn mark_unit(&mut self) {
        self.marked += 1;
    }

    fn count_units(&mut self, chunk: &[u8]) -> u64 {
        match self.units {
            Units::Lines => chunk.iter().filter(|&&b| b == b'\n').count() as u64,
            Units::Marked => std::mem::take(&mut self.marked),
        }
    }

    /// Hands the complete units of `pending` to the thread, or counts them lost.
    fn hand_over(&mut self, all: bool) {
        let end = match self.units {
            _ if all => self.pending.len(),
            Units::Lines => match self.pending.iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => return,
            },
            Units::Marked => self.pending.len(),
        };
        if end == 0 {
            return;
        }
        let rest = self.pending.split_off(end);
        let chunk = std::mem::replace(&mut self.pending, rest);
        let units = self.count_units(&chunk);
        let Some(tx) = &self.tx else { return };
        if self.overflow == Overflow::Block {
            let _ = tx.send((chunk, units)); // Err: the thread failed, reported by `failed()`
            return;
        }
        match tx.try_send((chunk, units)) {
            Ok(()) => {}
            Err(TrySendError::Full((_, n))) => {
                self.shared.lost.fetch_add(n, Ordering::SeqCst);
            }
            Err(TrySendError::Disconnected(_)) => {} // failed: reported by `failed()`
        }
    }

    /// Hands over what is left and waits for the thread to write it. `Overflow::Drop`: only as
    /// long as it makes progress: it gives up when no chunk was written for `stall` (the reader
    /// is gone or stopped).
    pub fn close(mut self, stall: Duration) -> Closed {
        let complete = self.close_inner(stall);
        Closed {
            complete: complete && !self.failed(),
            lost: self.lost(),
            error: self.take_error(),
        }
    }

    fn close_inner(&mut self, stall: Duration) -> bool {
        let Some(tx) = self.tx.take() else {
            return false;
        };
        if self.overflow == Overflow::Block {
            let chunk = std::mem::take(&mut self.pending);
            if !chunk.is_empty() {
                let _ = tx.send((chunk, 0));
            }
            drop(tx);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
            return true;
        }
        let mut last = (self.shared.written.load(Ordering::SeqCst), Instant::now());
        let mut progressed = |shared: &Shared| {
            let w = shared.written.load(Ordering::SeqCst);
            if w != last.0 {
                last = (w, Instant::now());
            }
            last.1.elapsed() < stall
        };
        // The final chunk (the statistics) waits for room instead of being dropped.
        let mut chunk = std::mem::take(&mut self.pending);
        while !chunk.is_empty() && !self.failed() {
            match tx.try_send((chunk, 0)) {
                Ok(()) => break,
                Err(TrySendError::Full((c, _))) => {
                    chunk = c;
                    if !progressed(&self.shared) {
                        let n = self.count_units(&chunk);
                        self.shared.lost.fetch_add(n, Ordering::SeqCst);
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Disconnected(_)) => break,
            }
        }
        drop(tx);
        let Some(thread) = self.thread.take() else {
            return false;
        };
        while !thread.is_finished() {
            if !progressed(&self.shared) {
                return false; // the thread stays blocked in write(2); the process exits anyway
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = thread.join();
        true
    }
}

/// How a [`QueueWriter`] ended.
#[derive(Debug)]
pub struct Closed {
    /// Everything written reached the output (`lost` may still be > 0: dropped earlier).
    pub complete: bool,
    /// Units dropped because the reader did not keep up.
    pub lost: u64,
    /// The write error that stopped the writer thread.
    pub error: Option<io::Error>,
}

impl Write for QueueWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if self.units == Units::Lines && self.pending.len() >= CHUNK {
            self.hand_over(false);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.hand_over(false);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that blocks until told to go on, then records what it got.
    struct Gate {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, cv) = &*self.open;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_reader_never_blocks_the_writer_and_losses_are_whole_lines() {
        let open = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let got = Arc::new(Mutex::new(Vec::new()));
        let gate = Gate {
            open: open.clone(),
            got: got.clone(),
        };
        let mut q = QueueWriter::new(
            Box::new(gate),
            Units::Lines,
            Overflow::Drop,
            Arc::new(|| {}),
        );
        let line = format!("{}\n", "x".repeat(99)); // 100 bytes
        let lines = (DEPTH + 10) * CHUNK / 100;
        let started = Instant::now();
        for _ in 0..lines {
            q.write_all(line.as_bytes()).unwrap();
        }
        q.flush().unwrap();
        // Nothing was written (the gate is shut), yet all writes returned.
        assert!(got.lock().unwrap().is_empty());
        let lost = q.lost();
        assert!(lost > 0, "the queue overflowed");
        crate::say!(
            "{lines} lines written in {:?}, {lost} lost",
            started.elapsed()
        );
        *open.0.lock().unwrap() = true;
        open.1.notify_all();
        let closed = q.close(Duration::from_secs(10));
        assert!(closed.complete && closed.error.is_none(), "{closed:?}");
        assert_eq!(closed.lost, lost);
        let got = got.lock().unwrap();
        assert_eq!(got.len() % 100, 0, "only whole lines");
        assert_eq!(
            got.len() as u64 / 100 + lost,
            lines as u64,
            "every line written or counted"
        );
    }

    #[test]
    fn a_closed_pipe_is_reported_not_raised() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let woke = Arc::new(AtomicBool::new(false));
        let w = woke.clone();
        let mut q = QueueWriter::new(
            Box::new(Broken),
            Units::Lines,
            Overflow::Drop,
            Arc::new(move || w.store(true, Ordering::SeqCst)),
        );
        writeln!(q, "one").unwrap();
        q.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !q.failed() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(q.failed());
        assert!(woke.load(Ordering::SeqCst));
        writeln!(q, "two").unwrap();
        let closed = q.close(Duration::from_secs(1));
        assert!(!closed.complete);
        assert_eq!(
            closed.error.map(|e| e.kind()),
            Some(io::ErrorKind::BrokenPipe)
        );
    }
}
