//! Objects tests create as CAPI would write them, shared by the test suites that run a provider
//! against the Proxmox simulator (as a process or as a Pod).

use anyhow::Context;
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxMachine};
use banlieue_capi::{Cluster, Machine};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// In namespace `ns`: the credentials Secret `pve`, a CAPI Cluster `c1` whose infrastructure is
/// marked provisioned (as CAPI would) with its ProxmoxCluster `c1` on the simulator (trusting
/// it by `tls`, a `spec.tls` value), and a Machine `m1` with its bootstrap Secret and
/// ProxmoxMachine `m1` (cloned from template 9000).
pub async fn capi_proxmox_machine(
    client: &kube::Client,
    ns: &str,
    sim: &banlieue_pve_sim::SimHandle,
    tls: Value,
) -> anyhow::Result<()> {
    let pp = PostParams::default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for secret in [
        json!({"metadata": {"name": "pve"},
               "stringData": {"tokenID": sim.token_id(), "secret": sim.token_secret()}}),
        json!({"metadata": {"name": "m1-bootstrap"}, "type": "cluster.x-k8s.io/secret",
               "stringData": {"value": "#cloud-config\nruncmd: [[echo, hi]]\n", "format": "cloud-config"}}),
    ] {
        secrets.create(&pp, &serde_json::from_value(secret)?).await?;
    }
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    let cluster = clusters
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c1"},
                "spec": {"infrastructureRef": {
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
    let owner = |kind: &str, name: &str, uid: Option<String>| -> anyhow::Result<Value> {
        Ok(
            json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind, "name": name,
                   "uid": uid.with_context(|| format!("{kind} {name} has no uid"))?,
                   "controller": true, "blockOwnerDeletion": true}]),
        )
    };
    Api::<ProxmoxCluster>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
                "metadata": {"name": "c1", "ownerReferences": owner("Cluster", "c1", cluster.uid())?},
                "spec": {
                    "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                    "endpoint": sim.url(),
                    "credentialsRef": {"name": "pve"},
                    "tls": tls,
                },
            }))?,
        )
        .await?;
    let machine = Api::<Machine>::namespaced(client.clone(), ns)
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
    Api::<ProxmoxMachine>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
                "metadata": {
                    "name": "m1",
                    "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
                    "ownerReferences": owner("Machine", "m1", machine.uid())?,
                },
                "spec": {"source": {"vmid": 9000}, "cpu": {"cores": 2}, "memoryMiB": 2048},
            }))?,
        )
        .await?;
    Ok(())
}
