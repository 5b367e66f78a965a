//! Secrets never leak (issue 18), for libvirt, in a test binary of its own: its TRACE logs are
//! captured with a thread-scoped subscriber, which only sees everything when no other test of
//! the binary runs beside it.

#![cfg(feature = "libvirt")]

#[path = "scenarios/standalone.rs"]
mod standalone;

use anyhow::Result;
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine};
use banlieue_api::standalone::infra_cluster_name;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use standalone::*;

/// What the libvirt provider is trusted with: an SSH private key for a remote host (from a
/// credentials Secret) and a machine's bootstrap data.
const PRIVATE_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-leak-canary-7f3e\n-----END OPENSSH PRIVATE KEY-----\n";
const USER_DATA: &str = "#cloud-config\nruncmd:\n- echo join-token-4b9d1c\n";

/// At the most verbose log level (the provider's, the Kubernetes client's, libvirt's calls), a
/// machine's life on the local host and a remote host's SSH connection attempt leave neither
/// the private key nor the bootstrap data in a log line, an Event, a status or a metric:
/// neither as written nor base64-encoded.
#[tokio::test]
async fn no_secret_value_reaches_a_log_line_an_event_a_status_or_a_metric() -> Result<()> {
    use banlieue_scenarios::leaks::{VerboseLogs, assert_no_secret};
    let logs = VerboseLogs::capture();
    let (s, _ns) = Standalone::new("lv-secrets").await?;

    // A remote host reached by SSH with a key from a Secret (nothing listens on port 1).
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "lab-ssh"},
        "stringData": {"ssh-privatekey": PRIVATE_KEY, "known_hosts": "[127.0.0.1]:1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB\n"},
    }))?;
    s.api::<Secret>().create(&PostParams::default(), &secret).await?;
    let provider = s.provider_object().await?;
    let remote: LibvirtCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtCluster",
        "metadata": {"name": "remote", "ownerReferences": [owner_ref(&provider)]},
        "spec": {"hosts": [{"name": "kvm1", "uri": "qemu+ssh://root@127.0.0.1:1/system",
                            "credentialsRef": {"name": "lab-ssh"}}]},
    }))?;
    s.api::<LibvirtCluster>()
        .create(&PostParams::default(), &remote)
        .await?;
    let clusters = s.api::<LibvirtCluster>();
    let remote = eventually("the remote host tried", || async {
        let c = clusters.get("remote").await?;
        let tried = c.status.as_ref().is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "LibvirtConnected" && c.reason == "Unreachable")
        });
        Ok(tried.then_some(c))
    })
    .await?;

    // A machine with bootstrap data on the local host, provisioned and deleted.
    s.machine("web-1", USER_DATA).await?;
    let machine = s.provisioned("web-1").await?;
    let local = clusters.get(&infra_cluster_name(&s.provider)).await?;
    s.api::<LibvirtMachine>()
        .delete("web-1", &DeleteParams::default())
        .await?;
    let machines = s.api::<LibvirtMachine>();
    eventually("web-1 deleted", || async {
        Ok(machines.get_opt("web-1").await?.is_none().then_some(()))
    })
    .await?;

    let logs = logs.text();
    anyhow::ensure!(
        logs.contains("reconcil") && logs.lines().count() > 100,
        "the verbose logs were captured ({} lines)",
        logs.lines().count()
    );
    anyhow::ensure!(
        logs.contains("lab-ssh"),
        "the logs mention the Secret by name, so they cover its use"
    );
    let events = s.api::<Event>().list(&ListParams::default()).await?;
    let outputs = [
        ("logs", logs),
        ("events", serde_json::to_string(&events.items)?),
        ("machine status", serde_json::to_string(&machine.status)?),
        ("local cluster status", serde_json::to_string(&local.status)?),
        ("remote cluster status", serde_json::to_string(&remote.status)?),
        ("metrics", s.metrics.render()),
    ];
    anyhow::ensure!(
        outputs[5].1.contains("libvirtmachine"),
        "the metrics were recorded: {}",
        outputs[5].1
    );
    assert_no_secret(
        &outputs,
        &[
            "b3BlbnNzaC1rZXktdjEAAAAA-leak-canary-7f3e",
            PRIVATE_KEY,
            "echo join-token-4b9d1c",
            USER_DATA,
        ],
    );
    Ok(())
}
