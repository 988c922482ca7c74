//! `gpu_trace_gpu_share_ratio`: each process's GPU share over the last window (NVML samples,
//! [`crate::model::share`]), labelled like the task metrics but without `engine` and never by
//! pid (`gpu`, `UUID`, `comm`, `container`, `pod`, `namespace`, `pod_uid`; processes with the same labels are summed). Served
//! only once a sample came: a run without samples serves exactly what it served before.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};

use super::{MetricDoc, Metrics, Workload};
use crate::event::GpuNumbering;

/// The reference entry (docs/fleet.md).
pub const SHARE: MetricDoc = MetricDoc {
    name: "gpu_trace_gpu_share_ratio",
    kind: "gauge",
    labels: "gpu, UUID, comm, container, container_user (a user's container only), pod, namespace, pod_uid",
    help: "GPU share of the processes with these labels over the last share window (--interval, else 10 s): the SM-weighted fraction of NVML's sampling points naming them, 0 to 1 (NVIDIA with NVML only; see docs/events.md, GPU share).",
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[allow(non_snake_case)]
pub(super) struct ShareLabels {
    gpu: String,
    UUID: String,
    comm: String,
    container: String,
    #[prometheus(flatten)]
    container_user: super::UserLabel,
    pod: String,
    namespace: String,
    pod_uid: String,
}

/// The share gauges as last set; empty: nothing served.
#[derive(Clone, Debug, Default)]
pub(super) struct ShareCollector(Arc<Mutex<BTreeMap<ShareLabels, f64>>>);

impl prometheus_client::collector::Collector for ShareCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::gauge::ConstGauge;
        let values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if values.is_empty() {
            return Ok(());
        }
        let help = SHARE.help.trim_end_matches('.');
        let kind = ConstGauge::new(0.0f64).metric_type();
        let mut m = encoder.encode_descriptor(SHARE.name, help, None, kind)?;
        for (labels, v) in values.iter() {
            ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
        }
        Ok(())
    }
}

impl Workload {
    /// The `container`, `container_user`, `pod`, `namespace` and `pod_uid` label values of a
    /// process's attribution: the names only when the node said them (a container's short id
    /// otherwise); `container_user` only for a container in a user's delegated subtree.
    pub fn of(a: &crate::model::workload::Attribution) -> Self {
        let names = a.names.as_ref();
        let container = names.and_then(|n| n.container.as_deref());
        Self {
            container: (container.or(a.workload.short_container_id()))
                .unwrap_or("")
                .to_string(),
            pod: names.map_or(String::new(), |n| n.pod.clone()),
            namespace: names.map_or(String::new(), |n| n.namespace.clone()),
            pod_uid: (a.workload.pod.as_ref()).map_or(String::new(), |(uid, _)| uid.clone()),
            container_user: (a.workload.container.as_ref())
                .and(a.workload.user)
                .map_or(String::new(), |uid| uid.to_string()),
        }
    }
}

impl Metrics {
    /// Sets the share gauges to `shares`: `(gpu, process name, workload, ratio)` per process;
    /// those with the same labels are summed. Label values go through the same caps as the
    /// task metrics'.
    pub fn set_shares(&mut self, shares: &[(u32, String, Option<Workload>, f64)]) {
        let mut values = BTreeMap::new();
        for (gpu, comm, workload, ratio) in shares {
            // NVML's index is nvidia-smi's: the GPU the events named by it, when they did.
            let named = super::gpu_key(Some(*gpu), None);
            let gpu = match self.gpus.contains(&named) {
                true => self.gpus.slot(&named, || unreachable!("contained")),
                // Labelled by that number as it is (the path of a number that is not RM's).
                false => self.gpu_slot(Some(*gpu), None, GpuNumbering::Driver),
            };
            let key = self.key_on(gpu, 0, comm, workload.as_ref());
            self.share_keys.insert(key, self.now_ns);
            let l = self.labels_of(key);
            let labels = ShareLabels {
                gpu: l.gpu,
                UUID: l.UUID,
                comm: l.comm,
                container: l.container,
                container_user: l.container_user,
                pod: l.pod,
                namespace: l.namespace,
                pod_uid: l.pod_uid,
            };
            *values.entry(labels).or_insert(0.0) += ratio;
        }
        *self.share.0.lock().unwrap_or_else(|e| e.into_inner()) = values;
    }
}
