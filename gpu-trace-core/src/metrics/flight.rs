//! `--flight-recorder`'s counters: `gpu_trace_flight_triggers_total` (by `trigger`),
//! `gpu_trace_flight_dumps_total`, `gpu_trace_flight_dumps_suppressed_total` (the per-hour
//! bound) and `gpu_trace_flight_dumps_failed_total`: the figures of the statistics'
//! `flight_recorder` block, as the run goes. The live run's flight recorder counts into a
//! [`FlightMetrics`] handle ([`super::Metrics::flight`]); without `--flight-recorder` the
//! counters stay 0 and no trigger series exists.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{
    FLIGHT_DUMPS as DUMPS, FLIGHT_FAILED as FAILED, FLIGHT_SUPPRESSED as SUPPRESSED,
    FLIGHT_TRIGGERS as TRIGGERS, MetricDoc, family_name,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TriggerLabel {
    trigger: &'static str,
}

/// The flight recorder's counters (clones count into the same series).
#[derive(Clone, Debug, Default)]
pub struct FlightMetrics {
    triggers: Family<TriggerLabel, Counter>,
    /// Dumps written.
    pub dumps: Counter,
    /// Triggers past `--dump-max-per-hour`.
    pub suppressed: Counter,
    /// Dumps that could not be written.
    pub failed: Counter,
}

impl FlightMetrics {
    /// The counters, registered in `r`.
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        let help = |d: &MetricDoc| d.help.trim_end_matches('.');
        r.register(family_name(&TRIGGERS), help(&TRIGGERS), m.triggers.clone());
        for (d, c) in [
            (&DUMPS, &m.dumps),
            (&SUPPRESSED, &m.suppressed),
            (&FAILED, &m.failed),
        ] {
            r.register(family_name(d), help(d), c.clone());
        }
        m
    }

    /// Trigger `name` (`flight::Trigger::name`) came.
    pub fn trigger(&self, name: &'static str) {
        self.triggers
            .get_or_create(&TriggerLabel { trigger: name })
            .inc();
    }
}
