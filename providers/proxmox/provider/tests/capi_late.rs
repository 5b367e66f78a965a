//! Cluster API installed after the provider started (`banlieue_proxmox::capi_discovery`), on a
//! private real apiserver that starts with banlieue's CRDs only: the running machine controller
//! notices CAPI's CRDs and starts watching Clusters, so unpausing a Cluster (a change of the
//! Cluster alone) resumes its machine at once.
//!
//! Run: `cargo test -p banlieue-proxmox --test capi_late` (needs `tests/controlplane/build.sh`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use banlieue_api::infrastructure::ProxmoxMachine;
use banlieue_capi::{Cluster, Machine};
use banlieue_proxmox::fake::FakeConnector;
use banlieue_proxmox::fake::FakePve;
use banlieue_proxmox::machine_controller::ProxmoxMachines;
use banlieue_testenv::TestEnv;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "late";
const TIMEOUT: Duration = Duration::from_secs(60);

fn ready_reason(pm: &ProxmoxMachine) -> Option<String> {
    pm.status
        .as_ref()
        .and_then(|s| banlieue_api::condition::find(&s.conditions, "Ready"))
        .map(|c| c.reason.clone())
}

fn provisioned(pm: &ProxmoxMachine) -> bool {
    pm.status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true)
}

async fn wait_for(
    api: &Api<ProxmoxMachine>,
    what: &str,
    check: impl Fn(&ProxmoxMachine) -> bool,
) -> Result<ProxmoxMachine> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(pm) = api.get_opt("m1").await?
            && check(&pm)
        {
            return Ok(pm);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "timed out waiting for m1 to be {what}: {:#?}",
                api.get_opt("m1").await?.map(|p| p.status)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A paused CAPI Cluster (infrastructure provisioned), its ProxmoxCluster, a Machine with
/// bootstrap data and its ProxmoxMachine.
async fn capi_objects(client: &kube::Client) -> Result<()> {
    let pp = PostParams::default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    for (name, data) in [
        (
            "pve",
            json!({"tokenID": "root@pam!banlieue", "secret": "00000000-1111-2222-3333-444444444444"}),
        ),
        (
            "m1-bootstrap",
            json!({"value": "#cloud-config\n", "format": "cloud-config"}),
        ),
    ] {
        secrets
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data}))?,
            )
            .await?;
    }
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NS);
    let cluster = clusters
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c1"},
                "spec": {"paused": true, "infrastructureRef": {
                    "apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxCluster", "name": "c1"}},
            }))?,
        )
        .await?;
    clusters
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"initialization": {"infrastructureProvisioned": true}}})),
        )
        .await?;
    Api::<banlieue_api::infrastructure::ProxmoxCluster>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
                "metadata": {"name": "c1", "ownerReferences": [{
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "c1",
                    "uid": cluster.uid().context("cluster uid")?}]},
                "spec": {
                    "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                    "endpoint": "https://pve.invalid:8006",
                    "credentialsRef": {"name": "pve"},
                },
            }))?,
        )
        .await?;
    let machine = Api::<Machine>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "m1", "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
                "spec": {
                    "clusterName": "c1",
                    "bootstrap": {"dataSecretName": "m1-bootstrap"},
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxMachine", "name": "m1"},
                },
            }))?,
        )
        .await?;
    Api::<ProxmoxMachine>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
                "metadata": {
                    "name": "m1",
                    "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
                    "ownerReferences": [{
                        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "m1",
                        "uid": machine.uid().context("machine uid")?,
                        "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": {"source": {"vmid": 9000}, "cpu": {"cores": 1}, "memoryMiB": 1024},
            }))?,
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_installed_after_start_is_watched_without_a_restart() -> Result<()> {
    let env = TestEnv::builder()
        .crds(banlieue_api::crds::all())
        .controller_manager(false)
        .start()
        .await?;
    let client = env.client().await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    let pve = FakePve::new(1);
    let mut ctx = banlieue_provider_kit::machine::MachineContext::new(
        client.clone(),
        ProxmoxMachines {
            connector: FakeConnector(pve.clone()),
            reservations: Default::default(),
            seed_storage: "local".into(),
        },
        "banlieue-proxmox-test",
    );
    ctx.capi_discovery_interval = Duration::from_millis(500);
    let ctx = Arc::new(ctx);
    let controller = tokio::spawn(async move {
        banlieue_provider_kit::machine::run(ctx, Some(NS), 2, std::future::pending()).await;
    });
    // The controller runs without CAPI (standalone only); then CAPI's CRDs are installed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.install_crd_files([
        banlieue_capi::crds::file("cluster.x-k8s.io_clusters.yaml"),
        banlieue_capi::crds::file("cluster.x-k8s.io_machines.yaml"),
    ])
    .await?;
    capi_objects(&client).await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), NS);
    wait_for(&machines, "paused", |pm| {
        pm.status
            .as_ref()
            .and_then(|s| banlieue_api::condition::find(&s.conditions, "Paused"))
            .is_some_and(|c| c.status == "True")
    })
    .await?;
    // Give discovery time to notice CAPI (several intervals), then unpause: only a watch on
    // Clusters brings the paused machine back (a paused reconcile waits for a change).
    tokio::time::sleep(Duration::from_secs(3)).await;
    Api::<Cluster>::namespaced(client.clone(), NS)
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await?;
    let pm = wait_for(&machines, "provisioned after the unpause", provisioned).await?;
    assert_eq!(ready_reason(&pm).as_deref(), Some("Provisioned"));
    assert_eq!(pve.vms().len(), 1, "exactly one VM");
    controller.abort();
    Ok(())
}
