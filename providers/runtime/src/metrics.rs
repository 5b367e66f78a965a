//! Prometheus metrics named like controller-runtime's (so existing dashboards work), rendered
//! in the text exposition format:
//!
//! - `controller_runtime_reconcile_total{controller,result="success"|"error"}` (counter)
//! - `controller_runtime_reconcile_errors_total{controller}` (counter)
//! - `controller_runtime_reconcile_time_seconds{controller}` (histogram, controller-runtime's
//!   buckets)
//! - `controller_runtime_active_workers{controller}` (gauge: reconciles in flight)
//! - `banlieue_kubernetes_writes_total{write}` (counter: writes to the Kubernetes API by kind)

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Histogram buckets of `controller_runtime_reconcile_time_seconds` (controller-runtime's).
pub const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A writer of the Prometheus text format: one `family` header, then its samples.
#[derive(Debug, Default)]
pub struct Exposition(String);

impl Exposition {
    /// Starts metric family `name` (`kind`: `counter`, `gauge`, `histogram`).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
        self
    }

    /// One sample of `name` with `labels` (values escaped as the format requires).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.0, "{k}=\"{v}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
        self
    }

    /// The text.
    pub fn finish(self) -> String {
        self.0
    }
}

/// Writes the two reconcile counter families of controller-runtime for `(controller,
/// successes, errors)` rows (for callers that keep their own counters).
pub fn write_reconcile_counters(out: &mut Exposition, rows: &[(&str, u64, u64)]) {
    out.family(
        "controller_runtime_reconcile_total",
        "counter",
        "Total number of reconciliations per controller",
    );
    for (name, success, errors) in rows {
        out.sample(
            "controller_runtime_reconcile_total",
            &[("controller", name), ("result", "success")],
            success,
        );
        out.sample(
            "controller_runtime_reconcile_total",
            &[("controller", name), ("result", "error")],
            errors,
        );
    }
    out.family(
        "controller_runtime_reconcile_errors_total",
        "counter",
        "Total number of reconciliation errors per controller",
    );
    for (name, _, errors) in rows {
        out.sample(
            "controller_runtime_reconcile_errors_total",
            &[("controller", name)],
            errors,
        );
    }
}

#[derive(Debug, Default)]
struct PerController {
    success: u64,
    errors: BTreeMap<String, u64>,
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
    active: u64,
}

#[derive(Debug, Default)]
struct Inner {
    controllers: Mutex<BTreeMap<String, PerController>>,
    writes: Mutex<BTreeMap<String, u64>>,
}

/// Reconcile counters and durations per controller, and Kubernetes writes per kind. Cloning
/// shares the counters, so every controller of a process records into one registry.
#[derive(Clone, Debug, Default)]
pub struct Metrics(Arc<Inner>);

/// Decrements the active-workers gauge when a reconcile ends (or is cancelled).
struct Active<'a>(&'a Metrics, &'a str);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        let mut map = self.0.controllers();
        if let Some(c) = map.get_mut(self.1) {
            c.active = c.active.saturating_sub(1);
        }
    }
}

impl Metrics {
    fn controllers(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PerController>> {
        self.0.controllers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn writes_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.0.writes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one Kubernetes write (`status`, `finalizer`, `spec`, …).
    pub fn count_write(&self, what: &str) {
        *self.writes_map().entry(what.to_owned()).or_default() += 1;
    }

    /// Kubernetes writes so far, all kinds.
    pub fn writes(&self) -> u64 {
        self.writes_map().values().sum()
    }

    /// Records one reconcile of `controller` that took `took`, failed with `error` (a metric
    /// label) or not.
    pub fn record(&self, controller: &str, took: Duration, error: Option<&str>) {
        let mut map = self.controllers();
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

    /// Runs one reconcile of `controller`, counting it as active while it runs and recording
    /// its duration and result (`label` names an error for the metrics).
    pub async fn observe<T, E>(
        &self,
        controller: &str,
        label: impl FnOnce(&E) -> &'static str,
        reconcile: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.controllers()
            .entry(controller.to_owned())
            .or_default()
            .active += 1;
        let active = Active(self, controller);
        let started = std::time::Instant::now();
        let result = reconcile.await;
        drop(active);
        self.record(controller, started.elapsed(), result.as_ref().err().map(label));
        result
    }

    /// Total reconciles of `controller` (successes and errors).
    pub fn total(&self, controller: &str) -> u64 {
        self.controllers().get(controller).map_or(0, |c| c.count)
    }

    /// Failed reconciles of `controller`.
    pub fn errors(&self, controller: &str) -> u64 {
        self.controllers()
            .get(controller)
            .map_or(0, |c| c.errors.values().sum())
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Exposition::default();
        {
            let map = self.controllers();
            let rows: Vec<(&str, u64, u64)> = map
                .iter()
                .map(|(name, c)| (name.as_str(), c.success, c.errors.values().sum()))
                .collect();
            write_reconcile_counters(&mut out, &rows);
            let h = "controller_runtime_reconcile_time_seconds";
            out.family(h, "histogram", "Length of time per reconciliation per controller");
            for (name, c) in map.iter() {
                for (i, le) in BUCKETS.iter().enumerate() {
                    out.sample(
                        &format!("{h}_bucket"),
                        &[("controller", name), ("le", &le.to_string())],
                        c.buckets[i],
                    );
                }
                out.sample(
                    &format!("{h}_bucket"),
                    &[("controller", name), ("le", "+Inf")],
                    c.count,
                );
                out.sample(&format!("{h}_sum"), &[("controller", name)], c.sum);
                out.sample(&format!("{h}_count"), &[("controller", name)], c.count);
            }
            let a = "controller_runtime_active_workers";
            out.family(a, "gauge", "Number of currently used workers per controller");
            for (name, c) in map.iter() {
                out.sample(a, &[("controller", name)], c.active);
            }
        }
        let w = "banlieue_kubernetes_writes_total";
        out.family(w, "counter", "Writes to the Kubernetes API by kind of write");
        for (what, n) in self.writes_map().iter() {
            out.sample(w, &[("write", what)], n);
        }
        out.finish()
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
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Exposition::default();
        out.sample("m", &[("l", "a\"b\\c\nd")], 1);
        assert_eq!(out.finish(), "m{l=\"a\\\"b\\\\c\\nd\"} 1\n");
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
