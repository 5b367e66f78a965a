//! The banlieue controller on a cluster where only some providers are installed (what
//! `clusterctl init --infrastructure banlieue-proxmox` gives): it must not depend on the other
//! providers' kinds, must say so when a VirtualMachine needs a kind that is not installed, and
//! must pick a provider up when it is installed later — watches included.
//!
//! Run: `cargo test -p banlieue-controllers --test partial_install` (needs the control plane
//! binaries in `tests/controlplane/bin`).

use std::time::Duration;

use anyhow::Context as _;
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::condition;
use banlieue_api::infrastructure::ProxmoxMachine;
use banlieue_controllers::controller::{Metrics, run_with_discovery_interval};
use banlieue_testenv::{TestEnv, install_crds};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = String::new();
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what} (last error: {last})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(vm: &VirtualMachine) -> Option<(String, String, String)> {
    let c = condition::find(&vm.status.as_ref()?.conditions, condition::READY)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn provider_writes(api: &Api<ProxmoxMachine>, name: &str, reason: &str) -> anyhow::Result<()> {
    let pp = PatchParams::apply("fake-proxmox-provider").force();
    api.patch_status(
        name,
        &pp,
        &Patch::Apply(
            json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
            "status": {
                "initialization": {"provisioned": true},
                "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}],
                "powerState": "On", "node": "pve1", "vmid": 101,
                "conditions": [{"type": "Ready", "status": "True", "reason": reason,
                    "message": "the VM runs", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            }}),
        ),
    )
    .await
    .context("provider writes status")?;
    Ok(())
}

#[tokio::test]
async fn a_provider_installed_later_is_picked_up_and_missing_kinds_break_nothing() -> anyhow::Result<()> {
    // banlieue's own kinds only: no provider installed yet.
    let core: Vec<_> = banlieue_api::crds::all()
        .into_iter()
        .filter(|c| c.spec.group == banlieue_api::BANLIEUE_GROUP)
        .collect();
    let env = TestEnv::builder().crds(core).start().await?;
    let client = env.client().await?;
    let ns = env.namespace("partial").await?;
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(run_with_discovery_interval(
        client.clone(),
        Some(ns.name().to_owned()),
        async move {
            let _ = stopped.await;
        },
        std::sync::Arc::new(Metrics::default()),
        Duration::from_secs(1),
    ));

    let provider: Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": format!("{}-pve", ns.name())},
        "spec": {"backend": "proxmox", "endpoint": "https://pve.example:8006",
                 "credentialsRef": {"name": "pve", "namespace": "banlieue-system"}},
    }))?;
    Api::<Provider>::all(client.clone())
        .create(&PostParams::default(), &provider)
        .await?;
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns.name());
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "vm1"},
        "spec": {"providerRef": {"name": provider.metadata.name}, "source": {"proxmox": {"vmid": 9000}},
                 "cpu": {"cores": 1}, "memoryMiB": 512},
    }))?;
    vms.create(&PostParams::default(), &vm).await?;

    // The kind is not installed: said so, with what to do.
    let message = eventually("Ready=False ProviderKindNotInstalled", || async {
        match ready(&vms.get("vm1").await?) {
            Some((s, r, m)) if s == "False" && r == "ProviderKindNotInstalled" => Ok(Some(m)),
            other => anyhow::bail!("Ready is {other:?}"),
        }
    })
    .await?;
    assert!(
        message.contains("ProxmoxMachine is not installed") && message.contains("banlieue-proxmox"),
        "{message}"
    );
    // Installing a provider needs a human: phase Failed until then.
    assert_eq!(
        vms.get("vm1").await?.status.and_then(|s| s.phase),
        Some(banlieue_api::banlieue::VirtualMachinePhase::Failed)
    );

    // The Proxmox provider gets installed: the machine is created, and its status reaches the
    // VirtualMachine through the watch the restarted controller now has.
    let proxmox: Vec<_> = banlieue_api::crds::all()
        .into_iter()
        .filter(|c| {
            c.spec.group == banlieue_api::INFRASTRUCTURE_GROUP && c.spec.names.kind.starts_with("Proxmox")
        })
        .collect();
    install_crds(&client, &proxmox, Duration::from_secs(30)).await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), ns.name());
    eventually("the ProxmoxMachine", || async {
        Ok(machines.get_opt("vm1").await?)
    })
    .await?;
    provider_writes(&machines, "vm1", "Running").await?;
    eventually("Ready=True mirrored", || async {
        Ok(ready(&vms.get("vm1").await?).filter(|(s, _, _)| s == "True"))
    })
    .await?;
    // A later change is mirrored well before any resync: only a watch delivers it.
    provider_writes(&machines, "vm1", "StillRunning").await?;
    eventually("the provider's new reason mirrored", || async {
        Ok(ready(&vms.get("vm1").await?).filter(|(_, r, _)| r == "StillRunning"))
    })
    .await?;

    // Deletion works although the libvirt and vSphere kinds are still not installed.
    vms.delete("vm1", &DeleteParams::default()).await?;
    // The provider's part: its finalizer, written by the controller with the machine, goes once
    // the hypervisor VM is gone.
    eventually("the ProxmoxMachine being deleted", || async {
        Ok(match machines.get_opt("vm1").await? {
            None => Some(()),
            Some(m) => m.metadata.deletion_timestamp.is_some().then_some(()),
        })
    })
    .await?;
    if machines.get_opt("vm1").await?.is_some() {
        machines
            .patch(
                "vm1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await?;
    }
    eventually("the ProxmoxMachine deleted", || async {
        Ok(machines.get_opt("vm1").await?.is_none().then_some(()))
    })
    .await?;
    eventually("the VirtualMachine gone", || async {
        Ok(vms.get_opt("vm1").await?.is_none().then_some(()))
    })
    .await?;

    let _ = stop.send(());
    tokio::time::timeout(WAIT, controller).await??;
    Api::<Provider>::all(client)
        .delete(
            &provider.metadata.name.unwrap_or_default(),
            &DeleteParams::default(),
        )
        .await?;
    Ok(())
}
