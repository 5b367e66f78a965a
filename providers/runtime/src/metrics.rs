//! Prometheus metrics named like controller-runtime's (so existing dashboards work), kept and
//! rendered by the `prometheus-client` crate in the classic text format (0.0.4):
//!
//! - `controller_runtime_reconcile_total{controller,result="success"|"error"}` (counter)
//! - `controller_runtime_reconcile_errors_total{controller}` (counter)
//! - `controller_runtime_reconcile_time_seconds{controller}` (histogram, controller-runtime's
//!   buckets)
//! - `controller_runtime_active_workers{controller}` (gauge: reconciles in flight)
//! - `banlieue_kubernetes_writes_total{write}` (counter: writes to the Kubernetes API by kind)
//!
//! Counters are registered without their `_total` suffix: the encoder adds it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Histogram buckets of `controller_runtime_reconcile_time_seconds` (controller-runtime's).
pub const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Labels: one label name and its value.
type Labels = [(&'static str, String); 1];
/// Labels of the reconcile counter: controller and result.
type ResultLabels = [(&'static str, String); 2];

fn controller(name: &str) -> Labels {
    [("controller", name.to_owned())]
}

fn result(name: &str, ok: bool) -> ResultLabels {
    let result = if ok { "success" } else { "error" };
    [("controller", name.to_owned()), ("result", result.to_owned())]
}

/// The two reconcile counter families of controller-runtime, registered in `registry`.
fn reconcile_counters(registry: &mut Registry) -> (Family<ResultLabels, Counter>, Family<Labels, Counter>) {
    let (total, errors) = (Family::default(), Family::default());
    registry.register(
        "controller_runtime_reconcile",
        "Total number of reconciliations per controller",
        Family::clone(&total),
    );
    registry.register(
        "controller_runtime_reconcile_errors",
        "Total number of reconciliation errors per controller",
        Family::clone(&errors),
    );
    (total, errors)
}

fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_text::encode(&mut out, registry);
    out
}

/// A one-off exposition of counts kept elsewhere (the banlieue controller's counters).
#[derive(Debug, Default)]
pub struct Snapshot(Registry);

impl Snapshot {
    /// Adds controller-runtime's reconcile counters of `name`.
    pub fn reconciles(&mut self, name: &str, success: u64, errors: u64) -> &mut Self {
        let (total, failed) = reconcile_counters(&mut self.0);
        total.get_or_create(&result(name, true)).inc_by(success);
        total.get_or_create(&result(name, false)).inc_by(errors);
        failed.get_or_create(&controller(name)).inc_by(errors);
        self
    }

    /// Adds counter `name` (without `_total`) with one sample per `(value of label, count)`.
    pub fn counter(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        rows: &[(&str, u64)],
    ) -> &mut Self {
        let family = Family::<Labels, Counter>::default();
        for (value, n) in rows {
            family.get_or_create(&[(label, (*value).to_owned())]).inc_by(*n);
        }
        self.0.register(name, help, family);
        self
    }

    /// The text.
    pub fn render(&self) -> String {
        render(&self.0)
    }
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

#[derive(Debug)]
struct Inner {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<Labels, Counter>,
    time: HistogramFamily,
    active: Family<Labels, Gauge>,
    writes: Family<Labels, Counter>,
    writes_total: AtomicU64,
}

impl Default for Inner {
    fn default() -> Self {
        let mut registry = Registry::default();
        let (reconciles, errors) = reconcile_counters(&mut registry);
        let time: HistogramFamily = Family::new_with_constructor(|| Histogram::new(BUCKETS));
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            time.clone(),
        );
        let active = Family::<Labels, Gauge>::default();
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            active.clone(),
        );
        let writes = Family::<Labels, Counter>::default();
        registry.register(
            "banlieue_kubernetes_writes",
            "Writes to the Kubernetes API by kind of write",
            writes.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            time,
            active,
            writes,
            writes_total: AtomicU64::new(0),
        }
    }
}

/// Reconcile counters and durations per controller, and Kubernetes writes per kind. Cloning
/// shares the counters, so every controller of a process records into one registry.
#[derive(Clone, Debug, Default)]
pub struct Metrics(Arc<Inner>);

/// Decrements the active-workers gauge when a reconcile ends (or is cancelled).
struct Active(Gauge);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    /// Counts one Kubernetes write (`status`, `finalizer`, `spec`, …).
    pub fn count_write(&self, what: &str) {
        self.0.writes.get_or_create(&[("write", what.to_owned())]).inc();
        self.0.writes_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Kubernetes writes so far, all kinds.
    pub fn writes(&self) -> u64 {
        self.0.writes_total.load(Ordering::Relaxed)
    }

    /// Records one reconcile of `controller` that took `took`, failed with `error` (a metric
    /// label) or not.
    pub fn record(&self, name: &str, took: Duration, error: Option<&str>) {
        // Both results and the error counter are shown (at 0) once a controller reconciled,
        // as controller-runtime does.
        for ok in [true, false] {
            let counter = self.0.reconciles.get_or_create(&result(name, ok));
            if ok == error.is_none() {
                counter.inc();
            }
        }
        let errors = self.0.errors.get_or_create(&controller(name));
        if error.is_some() {
            errors.inc();
        }
        drop(errors);
        self.0
            .time
            .get_or_create(&controller(name))
            .observe(took.as_secs_f64());
        // Shown (at 0) for every controller that reconciled, not only while one runs.
        drop(self.0.active.get_or_create(&controller(name)));
    }

    /// Runs one reconcile of `controller`, counting it as active while it runs and recording
    /// its duration and result (`label` names an error for the metrics).
    pub async fn observe<T, E>(
        &self,
        name: &str,
        label: impl FnOnce(&E) -> &'static str,
        reconcile: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let gauge = self.0.active.get_or_create_owned(&controller(name));
        gauge.inc();
        let active = Active(gauge);
        let started = std::time::Instant::now();
        let result = reconcile.await;
        drop(active);
        self.record(name, started.elapsed(), result.as_ref().err().map(label));
        result
    }

    /// Total reconciles of `controller` (successes and errors).
    pub fn total(&self, name: &str) -> u64 {
        let count = |ok| self.0.reconciles.get(&result(name, ok)).map_or(0, |c| c.get());
        count(true) + count(false)
    }

    /// Failed reconciles of `controller`.
    pub fn errors(&self, name: &str) -> u64 {
        self.0.errors.get(&controller(name)).map_or(0, |c| c.get())
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        render(&self.0.registry)
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
        m.count_write("status");
        let text = m.render();
        for line in [
            "controller_runtime_reconcile_total{controller=\"proxmoxmachine\",result=\"success\"} 1\n",
            "controller_runtime_reconcile_total{controller=\"proxmoxmachine\",result=\"error\"} 1\n",
            "controller_runtime_reconcile_errors_total{controller=\"proxmoxmachine\"} 1\n",
            "controller_runtime_reconcile_time_seconds_bucket{controller=\"proxmoxmachine\",le=\"0.025\"} 1\n",
            "controller_runtime_reconcile_time_seconds_bucket{controller=\"proxmoxmachine\",le=\"5\"} 2\n",
            "controller_runtime_reconcile_time_seconds_bucket{controller=\"proxmoxmachine\",le=\"+Inf\"} 2\n",
            "controller_runtime_reconcile_time_seconds_count{controller=\"proxmoxmachine\"} 2\n",
            "controller_runtime_active_workers{controller=\"proxmoxmachine\"} 0\n",
            "banlieue_kubernetes_writes_total{write=\"status\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert_eq!(m.total("proxmoxmachine"), 2);
        assert_eq!(m.errors("proxmoxmachine"), 1);
        assert_eq!(m.writes(), 1);
    }

    #[test]
    fn every_family_is_declared_once_even_with_several_controllers() {
        let m = Metrics::default();
        let clone = m.clone();
        m.record("a", Duration::ZERO, None);
        clone.record("b", Duration::ZERO, None);
        let text = m.render();
        assert_eq!(
            text.matches("# TYPE controller_runtime_reconcile_total counter")
                .count(),
            1,
            "{text}"
        );
        assert!(text.contains("controller_runtime_reconcile_total{controller=\"b\",result=\"success\"} 1"));
        // A controller without errors shows them at 0 (every family is there from the start).
        assert!(
            text.contains("controller_runtime_reconcile_total{controller=\"b\",result=\"error\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("controller_runtime_reconcile_errors_total{controller=\"b\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let text = Snapshot::default()
            .counter("m", "help", "l", &[("a\"b\\c\nd", 1)])
            .render();
        assert!(text.contains("m_total{l=\"a\\\"b\\\\c\\nd\"} 1\n"), "{text}");
    }

    #[tokio::test]
    async fn observe_counts_results_and_active_workers() {
        let m = Metrics::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let m2 = m.clone();
        let running = tokio::spawn(async move {
            m2.observe("c", |_: &&str| "boom", async move {
                let _ = rx.await;
                Err::<(), _>("failed")
            })
            .await
        });
        while !m
            .render()
            .contains("controller_runtime_active_workers{controller=\"c\"} 1")
        {
            tokio::task::yield_now().await;
        }
        tx.send(()).expect("running");
        assert_eq!(running.await.expect("joins"), Err("failed"));
        let ok: Result<u8, &str> = m.observe("c", |_| "x", async { Ok(7) }).await;
        assert_eq!(ok, Ok(7));
        let text = m.render();
        assert!(
            text.contains("controller_runtime_active_workers{controller=\"c\"} 0"),
            "{text}"
        );
        assert_eq!((m.total("c"), m.errors("c")), (2, 1));
    }
}
