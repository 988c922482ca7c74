//! Converting event timestamps (CLOCK_MONOTONIC nanoseconds, `bpf_ktime_get_ns`) to wall-clock
//! time, and to time relative to the start of the trace.

use std::io;
use std::sync::OnceLock;

use chrono::{DateTime, Local, TimeZone, Utc};

const NS_PER_SEC: i128 = 1_000_000_000;

/// Maps CLOCK_MONOTONIC nanoseconds to wall-clock time with a fixed offset
/// (CLOCK_REALTIME − CLOCK_MONOTONIC), and remembers the start of the trace for relative
/// timestamps.
///
/// The start is the first timestamp asked for relatively ([`Clock::relative_ns`]) unless it was
/// set before with [`Clock::with_start`] or [`Clock::set_start`].
#[derive(Clone, Debug)]
pub struct Clock {
    offset_ns: i128,
    start_ns: OnceLock<u64>,
}

impl Clock {
    /// A clock whose wall time is `monotonic + realtime_minus_monotonic_ns`.
    pub fn new(realtime_minus_monotonic_ns: i128) -> Self {
        Self {
            offset_ns: realtime_minus_monotonic_ns,
            start_ns: OnceLock::new(),
        }
    }

    /// The offset of the running system, from `clock_gettime(CLOCK_REALTIME)` read between two
    /// `clock_gettime(CLOCK_MONOTONIC)` calls (the midpoint of those is used).
    ///
    /// # Errors
    ///
    /// The error of `clock_gettime`, should it fail.
    pub fn from_system() -> io::Result<Self> {
        let mono_before = clock_ns(libc::CLOCK_MONOTONIC)?;
        let real = clock_ns(libc::CLOCK_REALTIME)?;
        let mono_after = clock_ns(libc::CLOCK_MONOTONIC)?;
        let mono = mono_before + (mono_after - mono_before) / 2;
        Ok(Self::new(real - mono))
    }

    /// Sets the start of the trace (for relative timestamps) and returns the clock.
    pub fn with_start(self, start_ns: u64) -> Self {
        self.set_start(start_ns);
        self
    }

    /// Sets the start of the trace unless it is already set; returns the start in effect.
    pub fn set_start(&self, start_ns: u64) -> u64 {
        *self.start_ns.get_or_init(|| start_ns)
    }

    /// The start of the trace, if set yet.
    pub fn start_ns(&self) -> Option<u64> {
        self.start_ns.get().copied()
    }

    /// CLOCK_REALTIME − CLOCK_MONOTONIC, in nanoseconds.
    pub fn offset_ns(&self) -> i128 {
        self.offset_ns
    }

    /// Wall-clock nanoseconds since the Unix epoch of a monotonic timestamp.
    pub fn realtime_ns(&self, mono_ns: u64) -> i128 {
        i128::from(mono_ns) + self.offset_ns
    }

    /// Nanoseconds since the start of the trace (negative for a timestamp before it). The first
    /// call sets the start when none was set.
    pub fn relative_ns(&self, mono_ns: u64) -> i128 {
        let start = self.set_start(mono_ns);
        i128::from(mono_ns) - i128::from(start)
    }

    /// Wall-clock time of a monotonic timestamp, in UTC (the Unix epoch if out of range).
    pub fn utc(&self, mono_ns: u64) -> DateTime<Utc> {
        let ns = self.realtime_ns(mono_ns);
        let secs = ns.div_euclid(NS_PER_SEC);
        let nanos = ns.rem_euclid(NS_PER_SEC);
        i64::try_from(secs)
            .ok()
            .zip(u32::try_from(nanos).ok())
            .and_then(|(s, n)| DateTime::from_timestamp(s, n))
            .unwrap_or_default()
    }

    /// Wall-clock time of a monotonic timestamp in the local time zone.
    pub fn local(&self, mono_ns: u64) -> DateTime<Local> {
        self.in_tz(mono_ns, &Local)
    }

    /// Wall-clock time of a monotonic timestamp in the time zone `tz`.
    pub fn in_tz<Tz: TimeZone>(&self, mono_ns: u64, tz: &Tz) -> DateTime<Tz> {
        self.utc(mono_ns).with_timezone(tz)
    }
}

fn clock_ns(clock: libc::clockid_t) -> io::Result<i128> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(clock, &raw mut ts) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i128::from(ts.tv_sec) * NS_PER_SEC + i128::from(ts.tv_nsec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{FixedOffset, Timelike};

    #[test]
    fn fixed_offset_maps_to_utc() {
        // 2024-05-01T21:00:24.561798123Z, with the monotonic clock at 1000 s.
        let wall_ns: i128 = 1_714_597_224_561_798_123;
        let mono: u64 = 1_000_000_000_000;
        let clock = Clock::new(wall_ns - i128::from(mono));
        assert_eq!(clock.realtime_ns(mono), wall_ns);
        let utc = clock.utc(mono);
        assert_eq!(utc.timestamp(), 1_714_597_224);
        assert_eq!(utc.nanosecond(), 561_798_123);
        let plus2 = clock.in_tz(mono, &FixedOffset::east_opt(2 * 3600).unwrap());
        assert_eq!(plus2.format("%H:%M:%S%.6f").to_string(), "23:00:24.561798");
    }

    #[test]
    fn negative_offset_before_epoch_is_floor_divided() {
        let clock = Clock::new(-1_500_000_000);
        let t = clock.utc(0);
        assert_eq!(t.timestamp(), -2);
        assert_eq!(t.nanosecond(), 500_000_000);
    }

    #[test]
    fn first_relative_timestamp_is_the_start() {
        let clock = Clock::new(0);
        assert_eq!(clock.start_ns(), None);
        assert_eq!(clock.relative_ns(5_000), 0);
        assert_eq!(clock.relative_ns(7_500), 2_500);
        assert_eq!(clock.relative_ns(4_000), -1_000);
        let preset = Clock::new(0).with_start(1_000);
        assert_eq!(preset.relative_ns(3_000), 2_000);
        assert_eq!(preset.set_start(9), 1_000);
    }

    #[test]
    fn system_clock_is_plausible() {
        let clock = Clock::from_system().unwrap();
        let now_mono = u64::try_from(clock_ns(libc::CLOCK_MONOTONIC).unwrap()).unwrap();
        let diff = (clock.utc(now_mono) - Utc::now()).num_milliseconds().abs();
        assert!(diff < 1_000, "system clock mapping off by {diff} ms");
    }
}
