//! Secrets never leak (issue 18), in a test binary of its own: its TRACE logs are captured
//! with a thread-scoped subscriber, which only sees everything when no other test of the
//! binary runs beside it.

#[path = "../../client/tests/support/vcsim.rs"]
mod vcsim_support;

#[path = "scenarios/standalone.rs"]
mod standalone;

use std::time::Duration;

use anyhow::{Result, ensure};
use banlieue_api::infrastructure::VSphereCluster;
use banlieue_api::standalone::infra_cluster_name;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use standalone::*;
use vcsim_support::{PASSWORD, Vcsim};

/// At the most verbose log level (the provider's, the Kubernetes client's, the HTTP and SOAP
/// stack's), a machine's life leaves neither the vCenter password nor the bootstrap data in a
/// log line, an Event, a status or a metric: neither as written nor base64-encoded (the user
/// data travels base64-encoded in the VM's guestinfo).
#[tokio::test]
async fn no_secret_value_reaches_a_log_line_an_event_a_status_or_a_metric() -> Result<()> {
    use banlieue_scenarios::leaks::{VerboseLogs, assert_no_secret};
    let logs = VerboseLogs::capture();
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&sim, "vs-secrets", PASSWORD).await?;
    s.machine("web-1", TEMPLATE).await?;
    let m = s
        .wait_machine("web-1", "WaitingForGuest", |m| {
            state(m).as_deref() == Some("WaitingForGuest")
        })
        .await?;
    let cluster = Api::<VSphereCluster>::namespaced(s.kube.clone(), &s.ns)
        .get(&infra_cluster_name(&s.provider))
        .await?;
    s.machines().delete("web-1", &DeleteParams::default()).await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.machines().get_opt("web-1").await?.is_some() {
        ensure!(tokio::time::Instant::now() < deadline, "web-1 was not deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = logs.text();
    ensure!(
        logs.contains("reconcil") && logs.lines().count() > 100,
        "the verbose logs were captured ({} lines)",
        logs.lines().count()
    );
    let events = Api::<Event>::namespaced(s.kube.clone(), &s.ns)
        .list(&ListParams::default())
        .await?;
    let outputs = [
        ("logs", logs),
        ("events", serde_json::to_string(&events.items)?),
        ("machine status", serde_json::to_string(&m.status)?),
        ("cluster status", serde_json::to_string(&cluster.status)?),
        ("metrics", s.metrics.render()),
    ];
    ensure!(
        outputs[4].1.contains("vspheremachine"),
        "the metrics were recorded: {}",
        outputs[4].1
    );
    assert_no_secret(&outputs, &[PASSWORD, "#cloud-config\nhostname: web-1\n"]);
    Ok(())
}
