//! Objects tests create as CAPI would write them, shared by the test suites that run a provider
//! (as a process or as a Pod) against a simulated hypervisor.

use anyhow::Context;
use banlieue_capi::{Cluster, Machine};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A banlieue infrastructure kind (`ProxmoxCluster`, `VSphereMachine`, …).
pub fn infrastructure_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        banlieue_api::INFRASTRUCTURE_GROUP,
        "v1alpha1",
        kind,
    ))
}

/// An owner reference to the CAPI object `kind`/`name` as its controller.
fn owned_by(kind: &str, name: &str, uid: Option<String>) -> anyhow::Result<Value> {
    Ok(
        json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind, "name": name,
               "uid": uid.with_context(|| format!("{kind} {name} has no uid"))?,
               "controller": true, "blockOwnerDeletion": true}]),
    )
}

/// In namespace `ns`: a CAPI Cluster `c1` whose infrastructure is marked provisioned (as CAPI
/// would) and the infrastructure cluster `c1` of kind `cluster_kind` with `spec`, owned by it.
pub async fn capi_cluster(
    client: &kube::Client,
    ns: &str,
    cluster_kind: &str,
    spec: Value,
) -> anyhow::Result<()> {
    let pp = PostParams::default();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    let cluster = clusters
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c1"},
                "spec": {"infrastructureRef": {
                    "apiGroup": banlieue_api::INFRASTRUCTURE_GROUP, "kind": cluster_kind, "name": "c1"}},
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
    let resource = infrastructure_resource(cluster_kind);
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": resource.api_version, "kind": cluster_kind,
                "metadata": {"name": "c1", "ownerReferences": owned_by("Cluster", "c1", cluster.uid())?},
                "spec": spec,
            }))?,
        )
        .await?;
    Ok(())
}

/// In namespace `ns`, for the Cluster `c1` of [`capi_cluster`]: a Machine `m1` with its
/// bootstrap Secret `m1-bootstrap` and the infrastructure machine `m1` of kind `machine_kind`
/// with `spec`, owned by it. Returns the infrastructure machine's UID.
pub async fn capi_machine(
    client: &kube::Client,
    ns: &str,
    machine_kind: &str,
    spec: Value,
) -> anyhow::Result<String> {
    let pp = PostParams::default();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "m1-bootstrap"}, "type": "cluster.x-k8s.io/secret",
                "stringData": {"value": "#cloud-config\nruncmd: [[echo, hi]]\n", "format": "cloud-config"},
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
                        "apiGroup": banlieue_api::INFRASTRUCTURE_GROUP, "kind": machine_kind, "name": "m1"},
                },
            }))?,
        )
        .await?;
    let resource = infrastructure_resource(machine_kind);
    let created = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": resource.api_version, "kind": machine_kind,
                "metadata": {
                    "name": "m1",
                    "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
                    "ownerReferences": owned_by("Machine", "m1", machine.uid())?,
                },
                "spec": spec,
            }))?,
        )
        .await?;
    created.uid().context("the infrastructure machine has no uid")
}

/// In namespace `ns`: the credentials Secret `pve`, [`capi_cluster`] with a ProxmoxCluster on the
/// simulator (trusting it by `tls`, a `spec.tls` value) and [`capi_machine`] with a
/// ProxmoxMachine cloned from template 9000.
pub async fn capi_proxmox_machine(
    client: &kube::Client,
    ns: &str,
    sim: &banlieue_pve_sim::SimHandle,
    tls: Value,
) -> anyhow::Result<()> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "pve"},
                "stringData": {"tokenID": sim.token_id(), "secret": sim.token_secret()},
            }))?,
        )
        .await?;
    capi_cluster(
        client,
        ns,
        "ProxmoxCluster",
        json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "endpoint": sim.url(),
            "credentialsRef": {"name": "pve"},
            "tls": tls,
        }),
    )
    .await?;
    capi_machine(
        client,
        ns,
        "ProxmoxMachine",
        json!({"source": {"vmid": 9000}, "cpu": {"cores": 2}, "memoryMiB": 2048}),
    )
    .await?;
    Ok(())
}
