//! The options of bounded recordings (issue 42): `--record-rotate`/`--record-keep` (a
//! recording in pieces) and the flight recorder (`--flight-recorder` and its triggers), with
//! their own small parsers of sizes and times.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// Default `--flight-recorder-bytes`: 16 MiB, so that gpu-trace stays under 64 MiB resident
/// with the flight recorder on under a hostile load (docs/performance.md, part 7).
pub const DEFAULT_FLIGHT_BYTES: u64 = 16 << 20;

/// The help heading of these options.
pub const HEADING: &str = "Bounded recordings";

#[derive(Clone, Debug, Default, Args)]
pub struct RecordingArgs {
    /// With --record FILE: write it in pieces FILE.0001, FILE.0002, …, each a complete
    /// recording that replays alone; a piece ends after the record that takes it to SIZE
    /// (bytes, or with K, M, G: 64M) or that comes TIME after its first record (10m, 1h).
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "SIZE|TIME", value_parser = parse_rotate, requires = "record")]
    #[arg(help_heading = HEADING)]
    pub record_rotate: Option<Rotate>,

    /// With --record-rotate: keep the last N pieces; an older one is removed when a new one
    /// starts (default: keep all).
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..),
          requires = "record_rotate")]
    #[arg(help_heading = HEADING)]
    pub record_keep: Option<u32>,

    /// Keep the last TIME of records in memory; write them on SIGUSR1 or a --dump-on trigger.
    ///
    /// At most --flight-recorder-bytes, written only when a trigger comes, as a recording that
    /// replays alone: DIR/gpu-trace-HOST-YYYYmmddTHHMMSSZ-TRIGGER.gtrace (--dump-dir).
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "TIME", value_parser = parse_window)]
    #[arg(help_heading = HEADING)]
    pub flight_recorder: Option<f64>,

    /// With --flight-recorder: the most bytes of records kept in memory (K, M, G; default
    /// 16M; each record counts its length and 16 bytes of index); the oldest go first.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "flight_recorder")]
    #[arg(help_heading = HEADING)]
    pub flight_recorder_bytes: Option<u64>,

    /// With --flight-recorder: where dumps are written (default: the current directory).
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "DIR", requires = "flight_recorder")]
    #[arg(help_heading = HEADING)]
    pub dump_dir: Option<PathBuf>,

    /// With --flight-recorder: also dump on these (comma-separated): refused (a SCHEDULE the
    /// driver refused), recursion (API_RECURSION, with --api), stuck (API_STUCK: a traced
    /// call open past --stuck-after, with --api), dropped (records lost to a full ring),
    /// signal-exit (`-- CMD` ended by a signal). SIGUSR1 and POST /dump always dump.
    #[arg(hide_short_help = true)]
    #[arg(
        long,
        value_name = "LIST",
        value_parser = parse_dump_on,
        value_delimiter = ',',
        requires = "flight_recorder"
    )]
    #[arg(help_heading = HEADING)]
    pub dump_on: Vec<DumpOn>,

    /// With --flight-recorder: at most N dumps in any hour; later triggers are counted, not
    /// written (default 6).
    #[arg(hide_short_help = true)]
    #[arg(
        long,
        value_name = "N",
        default_value_t = 6,
        requires = "flight_recorder"
    )]
    #[arg(help_heading = HEADING)]
    pub dump_max_per_hour: u32,

    /// With --flight-recorder: keep this host's last N dumps in --dump-dir; the oldest are
    /// removed when a new one is written (default: keep all). N times --flight-recorder-bytes
    /// bounds the directory.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..),
          requires = "flight_recorder")]
    #[arg(help_heading = HEADING)]
    pub dump_keep: Option<u32>,
}

/// `--record-rotate`: a size or a time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rotate {
    Bytes(u64),
    Seconds(f64),
}

/// A `--dump-on` trigger (SIGUSR1 always dumps). `recursion` and `stuck` need `--api`
/// ([`DumpOn::needs_api`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub enum DumpOn {
    Refused,
    Recursion,
    Stuck,
    Dropped,
    SignalExit,
}

impl DumpOn {
    /// The core's trigger.
    pub fn trigger(self) -> gpu_trace_core::flight::Trigger {
        use gpu_trace_core::flight::Trigger;
        match self {
            DumpOn::Refused => Trigger::Refused,
            DumpOn::Recursion => Trigger::Recursion,
            DumpOn::Stuck => Trigger::Stuck,
            DumpOn::Dropped => Trigger::Dropped,
            DumpOn::SignalExit => Trigger::SignalExit,
        }
    }
}

/// One `--dump-on` trigger.
pub fn parse_dump_on(s: &str) -> Result<DumpOn, String> {
    DumpOn::from_str(s.trim(), true).map_err(|_| {
        format!(
            "`{s}` is not a --dump-on trigger: give refused, recursion, stuck, dropped or \
             signal-exit"
        )
    })
}

/// A `--dump-on` trigger that only `--api`'s records can fire, refused without it (a trigger
/// that can never fire would be a silent promise): the usage error's words.
pub fn dump_on_without_api(dump_on: &[DumpOn], api: bool) -> Option<String> {
    let needs = dump_on
        .iter()
        .find(|d| matches!(d, DumpOn::Recursion | DumpOn::Stuck))?;
    let name = DumpOn::to_possible_value(needs)?.get_name().to_string();
    (!api).then(|| {
        format!(
            "`--dump-on {name}` fires on an API record ({}), which only --api traces: add --api",
            if *needs == DumpOn::Stuck {
                "API_STUCK"
            } else {
                "API_RECURSION"
            }
        )
    })
}

/// A size: bytes, or a number with K, M, G (powers of 1024; `KiB`, `MB`… read the same);
/// at least 4096 bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || {
        format!("`{s}` is not a size: give bytes (1048576) or a number with K, M or G (64M, 1G)")
    };
    let t = s.trim();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: u64 = t[..end].parse().map_err(|_| bad())?;
    let unit = t[end..].trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches("IB").trim_end_matches('B');
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Err(bad()),
    };
    let bytes = n
        .checked_shl(shift)
        .filter(|b| b >> shift == n)
        .ok_or_else(bad)?;
    if bytes < 4096 {
        return Err(format!("`{s}`: a size must be at least 4096 bytes (4K)"));
    }
    Ok(bytes)
}

/// A time with a unit: `ms`, `s`, `m`, `h` (`500ms`, `90s`, `10m`, `1h`); > 0, at most a day.
fn parse_unit_time(s: &str) -> Option<f64> {
    let t = s.trim();
    let end = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let n: f64 = t[..end].parse().ok()?;
    let scale = match &t[end..] {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Some(n * scale).filter(|v| v.is_finite() && *v > 0.0 && *v <= 86_400.0)
}

/// `--record-rotate`: a time with its unit (`10m`), else a size (`64M`).
pub fn parse_rotate(s: &str) -> Result<Rotate, String> {
    if let Some(secs) = parse_unit_time(s) {
        return Ok(Rotate::Seconds(secs));
    }
    parse_size(s).map(Rotate::Bytes).map_err(|_| {
        format!(
            "`{s}` is neither a size nor a time: give a size (64M, 1G, 1048576 bytes) or a \
             time with its unit (90s, 10m, 1h; at most 24h)"
        )
    })
}

/// `--flight-recorder`: a time with its unit (`30s`, `5m`), or seconds.
pub fn parse_window(s: &str) -> Result<f64, String> {
    parse_unit_time(s)
        .or_else(|| {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0 && *v <= 86_400.0)
        })
        .ok_or_else(|| {
            format!("`{s}` is not a window: give a time (30s, 5m, 1h; at most 24h) or seconds")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_as_documented() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("8192"), Ok(8192));
        for bad in ["", "1", "4095", "M", "1T", "-4M", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_rotate("10m"), Ok(Rotate::Seconds(600.0)));
        assert_eq!(parse_rotate("10M"), Ok(Rotate::Bytes(10 << 20)));
        assert_eq!(parse_rotate("1h"), Ok(Rotate::Seconds(3600.0)));
        assert!(parse_rotate("25h").is_err());
        assert_eq!(parse_window("30s"), Ok(30.0));
        assert_eq!(parse_window("2"), Ok(2.0));
        assert!(parse_window("0").is_err());
    }
}
