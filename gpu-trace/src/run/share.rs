//! NVML: started before the programs attach (so gpu-trace does not trace its own GPU opens), and
//! the share sampler's thread.

use std::time::Duration;

use super::signals::note;
use crate::cli::TraceArgs;

/// NVML's figures for the inventory: `None` on AMD; `Err`: why not.
pub(super) type NvmlFigures = Option<Result<Vec<crate::probe::nvml::NvmlGpu>, String>>;

/// NVML, started once (NVIDIA): the inventory's GPU names and per-process memory, and the GPU
/// share sampler (`--share-interval`; `None`: said once on stderr, tracing goes on, or
/// `--no-share`). Bounded by [`crate::probe::nvml::START_LIMIT`]: a library that does not
/// answer, or reports an absurd device count, is said once on stderr, even with `--no-share`.
pub(super) fn start_nvml(
    args: &TraceArgs,
    amd: bool,
) -> (
    NvmlFigures,
    Option<Box<dyn crate::probe::share::ShareSampler>>,
) {
    use crate::probe::{nvml, share};
    if amd {
        if !args.no_share {
            note("GPU share: not sampled on AMD (KFD has no per-process utilization samples)");
        }
        return (None, None);
    }
    let replay = share::replay_capture();
    let keep = !args.no_share && replay.is_none();
    let (figures, nvml) = match nvml::start(keep) {
        Ok(started) => {
            let sampler = started
                .nvml
                .map(|n| share::NvmlSampler::new(n, started.devices));
            (Ok(started.gpus), Ok(sampler))
        }
        Err(why) => {
            if why.is_broken() {
                crate::say!("gpu-trace: {why}: GPU shares and UUIDs are not sampled this run");
            }
            (Err(why.to_string()), Err(why))
        }
    };
    let sampler = (!args.no_share)
        .then(|| open_share_sampler(replay, nvml))
        .flatten();
    (Some(figures), sampler)
}

/// The share sampler: the test stand-in when [`crate::probe::share::REPLAY_ENV`] names a
/// capture, else NVML's; `None` said once on stderr (unless [`start_nvml`] said it already).
pub(super) fn open_share_sampler(
    replay: Option<String>,
    nvml: Result<Option<crate::probe::share::NvmlSampler>, crate::probe::nvml::StartError>,
) -> Option<Box<dyn crate::probe::share::ShareSampler>> {
    let why = match (replay, nvml) {
        (Some(path), _) => match crate::probe::share::ReplaySampler::open(&path) {
            Ok(s) => return Some(Box::new(s)),
            Err(why) => why,
        },
        (None, Ok(Some(s))) => return Some(Box::new(s)),
        (None, Ok(None)) => return None,
        (None, Err(why)) if why.is_broken() => return None,
        (None, Err(why)) => why.to_string(),
    };
    crate::say!(
        "gpu-trace: warning: GPU share not sampled: {why}; tracing goes on (--no-share silences \
         this)"
    );
    None
}

/// Starts the sampler's thread (a thread that cannot start: said once, tracing goes on).
pub(super) fn start_share_sampler(
    sampler: Option<Box<dyn crate::probe::share::ShareSampler>>,
    period_s: f64,
) -> Option<crate::probe::share::ShareThread> {
    let period = Duration::from_secs_f64(period_s);
    match crate::probe::share::start(sampler?, period) {
        Ok(t) => Some(t),
        Err(e) => {
            crate::say!(
                "gpu-trace: GPU share not sampled: no thread for it ({e}); tracing goes on"
            );
            None
        }
    }
}
