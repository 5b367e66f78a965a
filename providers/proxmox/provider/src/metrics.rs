//! Prometheus metrics named like controller-runtime's, rendered in the text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram buckets of `controller_runtime_reconcile_time_seconds` (controller-runtime's).
const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Default)]
struct PerController {
    success: u64,
    errors: BTreeMap<String, u64>,
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Reconcile counters and durations per controller, and Kubernetes writes per kind.
#[derive(Debug, Default)]
pub struct Metrics(
    Mutex<BTreeMap<String, PerController>>,
    Mutex<BTreeMap<String, u64>>,
);

impl Metrics {
    /// Counts one Kubernetes write (`status`, `finalizer`, `spec`).
    pub fn count_write(&self, what: &str) {
        *self
            .1
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(what.to_owned())
            .or_default() += 1;
    }

    /// Kubernetes writes so far, all kinds.
    pub fn writes(&self) -> u64 {
        self.1.lock().unwrap_or_else(|e| e.into_inner()).values().sum()
    }

    /// Records one reconcile of `controller` that took `took`, failed with `error` (a metric label) or not.
    pub fn record(&self, controller: &str, took: Duration, error: Option<&str>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let c = map.entry(controller.to_owned()).or_default();
        match error {
            None => c.success += 1,
            Some(label) => *c.errors.entry(label.to_owned()).or_default() += 1,
        }
        let secs = took.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                c.buckets[i] += 1;
            }
        }
        c.count += 1;
        c.sum += secs;
    }

    /// Total reconciles of `controller` (successes and errors).
    pub fn total(&self, controller: &str) -> u64 {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(controller).map_or(0, |c| c.count)
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        out.push_str(
            "# HELP controller_runtime_reconcile_total Total number of reconciliations per controller\n",
        );
        out.push_str("# TYPE controller_runtime_reconcile_total counter\n");
        for (name, c) in map.iter() {
            let errors: u64 = c.errors.values().sum();
            let _ = writeln!(
                out,
                "controller_runtime_reconcile_total{{controller=\"{name}\",result=\"success\"}} {}",
                c.success
            );
            let _ = writeln!(
                out,
                "controller_runtime_reconcile_total{{controller=\"{name}\",result=\"error\"}} {errors}"
            );
        }
        out.push_str("# HELP controller_runtime_reconcile_errors_total Total number of reconciliation errors per controller\n");
        out.push_str("# TYPE controller_runtime_reconcile_errors_total counter\n");
        for (name, c) in map.iter() {
            let errors: u64 = c.errors.values().sum();
            let _ = writeln!(
                out,
                "controller_runtime_reconcile_errors_total{{controller=\"{name}\"}} {errors}"
            );
        }
        out.push_str("# HELP controller_runtime_reconcile_time_seconds Length of time per reconciliation per controller\n");
        out.push_str("# TYPE controller_runtime_reconcile_time_seconds histogram\n");
        for (name, c) in map.iter() {
            for (i, le) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "controller_runtime_reconcile_time_seconds_bucket{{controller=\"{name}\",le=\"{le}\"}} {}",
                    c.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "controller_runtime_reconcile_time_seconds_bucket{{controller=\"{name}\",le=\"+Inf\"}} {}",
                c.count
            );
            let _ = writeln!(
                out,
                "controller_runtime_reconcile_time_seconds_sum{{controller=\"{name}\"}} {}",
                c.sum
            );
            let _ = writeln!(
                out,
                "controller_runtime_reconcile_time_seconds_count{{controller=\"{name}\"}} {}",
                c.count
            );
        }
        out.push_str(
            "# HELP banlieue_kubernetes_writes_total Writes to the Kubernetes API by kind of write\n",
        );
        out.push_str("# TYPE banlieue_kubernetes_writes_total counter\n");
        for (what, n) in self.1.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "banlieue_kubernetes_writes_total{{write=\"{what}\"}} {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_controller_runtime_names_with_counts() {
        let m = Metrics::default();
        m.record("proxmoxmachine", Duration::from_millis(20), None);
        m.record("proxmoxmachine", Duration::from_secs(3), Some("kube"));
        let text = m.render();
        assert!(
            text.contains(
                "controller_runtime_reconcile_total{controller=\"proxmoxmachine\",result=\"success\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("controller_runtime_reconcile_errors_total{controller=\"proxmoxmachine\"} 1"),
            "{text}"
        );
        assert!(text.contains("controller_runtime_reconcile_time_seconds_bucket{controller=\"proxmoxmachine\",le=\"0.025\"} 1"), "{text}");
        assert!(
            text.contains(
                "controller_runtime_reconcile_time_seconds_bucket{controller=\"proxmoxmachine\",le=\"5\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("controller_runtime_reconcile_time_seconds_count{controller=\"proxmoxmachine\"} 2"),
            "{text}"
        );
        assert_eq!(m.total("proxmoxmachine"), 2);
    }
}
