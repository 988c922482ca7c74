//! The endpoint's connection slots, and who gives one up when they are all taken.
//!
//! A connection holds a slot from its accept to its end. Until its request head has arrived
//! (and passed the access check, when credentials are configured) it is *waiting*; then it is
//! *answering*. When every slot is taken, a new connection takes the slot of the oldest waiting
//! one, which is closed; only when all of them are answering is the new one refused. So idle,
//! slow or unauthenticated clients cannot keep a scraper out: they hold a slot only until the
//! next connection needs it.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

/// What became of a connection just accepted.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admission<T> {
    /// It has slot `id`; `evicted` is the waiting connection that gave its slot up (its id and
    /// handle), if the slots were all taken.
    Admitted { id: u64, evicted: Option<(u64, T)> },
    /// Every slot is answering a request: it is closed at once.
    Refused,
}

/// The slots; `T` is what closes a waiting connection (the server's is a `Notify`).
#[derive(Debug)]
pub(super) struct Slots<T> {
    max: usize,
    next: u64,
    /// Connections without a complete, allowed request head, by age (ids only grow).
    waiting: BTreeMap<u64, T>,
    /// Connections answering a request.
    answering: BTreeSet<u64>,
}

impl<T> Slots<T> {
    pub(super) fn new(max: usize) -> Self {
        Self {
            max,
            next: 0,
            waiting: BTreeMap::new(),
            answering: BTreeSet::new(),
        }
    }

    /// A new connection: a free slot, else the oldest waiting connection's, else refused.
    pub(super) fn admit(&mut self, handle: T) -> Admission<T> {
        let evicted = if self.waiting.len() + self.answering.len() < self.max {
            None
        } else {
            match self.waiting.pop_first() {
                Some(oldest) => Some(oldest),
                None => return Admission::Refused,
            }
        };
        let id = self.next;
        self.next += 1;
        self.waiting.insert(id, handle);
        Admission::Admitted { id, evicted }
    }

    /// Connection `id` sent an allowed request head: it keeps its slot until it ends. False if
    /// it had already given its slot up (it is being closed).
    pub(super) fn answering(&mut self, id: u64) -> bool {
        if self.waiting.remove(&id).is_none() {
            return false;
        }
        self.answering.insert(id)
    }

    /// Connection `id` ended: its slot is free (nothing if it was evicted).
    pub(super) fn release(&mut self, id: u64) {
        self.waiting.remove(&id);
        self.answering.remove(&id);
    }

    /// (waiting, answering) connections.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.waiting.len(), self.answering.len())
    }
}

/// At most one stderr line about evicted and refused connections per this time.
pub(super) const NOTICE_PERIOD: Duration = Duration::from_secs(10);

/// The stderr line about connections closed for room or refused, and about failed accepts
/// (no descriptor or memory free: new connections wait in the kernel's queue meanwhile): the
/// first at once, then at most one per [`NOTICE_PERIOD`] with the counts since the last.
#[derive(Debug, Default)]
pub(super) struct Notice {
    pub(super) evicted: u64,
    pub(super) refused: u64,
    /// Failed accepts, and the last one's error.
    pub(super) accept_failed: u64,
    pub(super) accept_error: String,
    last: Option<Instant>,
}

impl Notice {
    fn pending(&self) -> u64 {
        self.evicted + self.refused + self.accept_failed
    }

    /// When the counts not yet reported are due (`None`: nothing to report).
    pub(super) fn due(&self) -> Option<Instant> {
        if self.pending() == 0 {
            return None;
        }
        Some(self.last.map_or_else(Instant::now, |l| l + NOTICE_PERIOD))
    }

    /// The line to print at `now`, if one is due; its counts start again from 0.
    pub(super) fn take(&mut self, now: Instant, limit: usize) -> Option<String> {
        if self.pending() == 0 || self.last.is_some_and(|l| now < l + NOTICE_PERIOD) {
            return None;
        }
        let when = match self.last {
            Some(l) => format!(" in the last {} s", now.duration_since(l).as_secs()),
            None => String::new(),
        };
        let plural = |n: u64| if n == 1 { "" } else { "s" };
        let (e, r, a) = (self.evicted, self.refused, self.accept_failed);
        let mut said = Vec::new();
        if e > 0 {
            said.push(format!(
                "{e} connection{} closed{when} before sending a request, to make room for new \
                 ones",
                plural(e)
            ));
        }
        if r > 0 {
            said.push(format!(
                "{r} connection{} refused{when}, every connection answering a request",
                plural(r)
            ));
        }
        if e + r > 0 {
            let last = said.len() - 1;
            said[last].push_str(&format!(
                " (slow or idle clients; limit {limit} connections)"
            ));
        }
        if a > 0 {
            said.push(format!(
                "{a} accept{} failed{when} ({}); new connections wait in the kernel's queue until \
                 a descriptor is free (raise the open-files limit, `ulimit -n`, if this repeats)",
                plural(a),
                self.accept_error
            ));
        }
        let line = format!("gpu-trace: --metrics: {}", said.join("; "));
        self.evicted = 0;
        self.refused = 0;
        self.accept_failed = 0;
        self.last = Some(now);
        Some(line)
    }
}
