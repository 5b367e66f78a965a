//! The controller's `/metrics` exposition (metric names as controller-runtime's so existing
//! dashboards work, plus the controller's API writes by target). The endpoint itself
//! (`/metrics`, `/healthz`, `/readyz`) is `banlieue-provider-runtime`'s.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use banlieue_provider_runtime::http::Probe;
use banlieue_provider_runtime::metrics::Snapshot;

use crate::controller::{Metrics, MetricsSnapshot};

/// Name of the controller in metric labels.
pub const CONTROLLER_LABEL: &str = "virtualmachine";

/// The Prometheus text exposition of `m`.
pub fn render(m: &MetricsSnapshot) -> String {
    let success = m.reconciles.saturating_sub(m.errors);
    Snapshot::default()
        .reconciles(CONTROLLER_LABEL, success, m.errors)
        .counter(
            "banlieue_controller_writes",
            "API writes by the banlieue controller, by target",
            "target",
            &[
                ("infrastructure_machine", m.machine_applies),
                ("virtualmachine_status", m.status_writes),
                ("infrastructure_cluster", m.cluster_applies),
                ("virtualmachine_finalizer", m.finalizer_writes),
                ("infrastructure_machine_delete", m.machine_deletes),
            ],
        )
        .render()
}

/// The endpoint's view of the controller: ready once its caches are filled, counters as above.
#[derive(Debug)]
pub struct Endpoint(pub Arc<Metrics>);

impl Probe for Endpoint {
    fn ready(&self) -> bool {
        self.0.ready.load(Ordering::Relaxed)
    }

    fn metrics(&self) -> String {
        render(&self.0.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_controller_runtime_names_from_the_counters() {
        let text = render(&MetricsSnapshot {
            reconciles: 10,
            errors: 3,
            machine_applies: 4,
            status_writes: 7,
            cluster_applies: 1,
            finalizer_writes: 5,
            machine_deletes: 2,
        });
        for line in [
            "controller_runtime_reconcile_total{controller=\"virtualmachine\",result=\"success\"} 7\n",
            "controller_runtime_reconcile_total{controller=\"virtualmachine\",result=\"error\"} 3\n",
            "controller_runtime_reconcile_errors_total{controller=\"virtualmachine\"} 3\n",
            "banlieue_controller_writes_total{target=\"infrastructure_machine\"} 4\n",
            "banlieue_controller_writes_total{target=\"virtualmachine_status\"} 7\n",
            "banlieue_controller_writes_total{target=\"infrastructure_cluster\"} 1\n",
            "banlieue_controller_writes_total{target=\"virtualmachine_finalizer\"} 5\n",
            "banlieue_controller_writes_total{target=\"infrastructure_machine_delete\"} 2\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn ready_follows_the_controller() {
        let metrics = Arc::new(Metrics::default());
        let endpoint = Endpoint(metrics.clone());
        assert!(!endpoint.ready());
        metrics.ready.store(true, Ordering::Relaxed);
        assert!(endpoint.ready());
    }
}
