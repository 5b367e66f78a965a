//! The VSphereCluster reconciler (CAPI InfraCluster contract and standalone mode).
//!
//! A VSphereCluster owned by a CAPI `Cluster` or (standalone) by a banlieue `Provider` gets the
//! finalizer, a login check against vCenter, its datacenter and failure domains (compute
//! clusters) checked, `status.failureDomains`, `status.version`, `Ready` and
//! `status.initialization.provisioned`. Anything else is left alone. Deletion holds the finalizer
//! while a VSphereMachine of the cluster remains (they need its endpoint to destroy their VMs).

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::{FailureDomain, Initialization};
use banlieue_api::condition;
use banlieue_api::infrastructure::{VSphereCluster, VSphereClusterStatus, VSphereMachine};
use banlieue_api::standalone;
use banlieue_capi::contract;
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{instrument, warn};

use crate::connection::{self, reason_of};
use crate::error::{Error, Result};
use crate::machine_controller::{Context, FIELD_MANAGER, FINALIZER, now};

/// Re-check of a ready cluster (vCenter reachability, credentials).
pub const RESYNC: Duration = Duration::from_secs(300);
/// Re-check of a deleting cluster waiting for its machines.
pub const MACHINE_WAIT: Duration = Duration::from_secs(5);

fn owned_by_cluster_or_provider(vsc: &VSphereCluster) -> bool {
    vsc.owner_references().iter().any(|o| {
        let g = contract::group_of(&o.api_version);
        (g == standalone::CAPI_GROUP && o.kind == standalone::CAPI_CLUSTER_KIND)
            || (g == standalone::OWNER_GROUP && o.kind == standalone::PROVIDER_KIND)
    })
}

fn set_ready(
    status: &mut VSphereClusterStatus,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    let message = message.into();
    let st = if ok {
        condition::ConditionStatus::True
    } else {
        condition::ConditionStatus::False
    };
    if let Some(c) = condition::find(&status.conditions, condition::READY)
        && c.status == st.as_str()
        && c.reason == reason
        && c.message == message
        && c.observed_generation == generation
    {
        return;
    }
    condition::set(
        &mut status.conditions,
        condition::new_condition(condition::READY, st, reason, message, generation, now()),
    );
}

/// Reconciles one VSphereCluster.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(obj: Arc<VSphereCluster>, ctx: Arc<Context>) -> Result<Action> {
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<VSphereCluster> = Api::namespaced(ctx.kube.clone(), &ns);
    let Some(vsc) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube("reading VSphereCluster", e))?
    else {
        return Ok(Action::await_change());
    };
    if !owned_by_cluster_or_provider(&vsc) || contract::has_paused_annotation(&vsc.metadata) {
        return Ok(Action::await_change());
    }
    let has_finalizer = vsc.finalizers().iter().any(|f| f == FINALIZER);
    if vsc.metadata.deletion_timestamp.is_some() {
        if has_finalizer {
            // Machines need this cluster's endpoint and credentials to destroy their VMs: hold
            // the finalizer until none of them remains.
            let remaining = machines_of(&ctx.kube, &vsc).await?;
            if !remaining.is_empty() {
                let generation = vsc.metadata.generation;
                let mut status = vsc.status.clone().unwrap_or_default();
                set_ready(
                    &mut status,
                    false,
                    "WaitingForMachines",
                    waiting_message(&remaining),
                    generation,
                );
                write_status(&api, &vsc, &status).await?;
                return Ok(Action::requeue(MACHINE_WAIT));
            }
            let finalizers: Vec<String> = vsc
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": vsc.resource_version()}});
            api.patch(&vsc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::kube("removing the VSphereCluster finalizer", e))?;
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        let mut finalizers = vsc.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": vsc.resource_version()}});
        api.patch(&vsc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("adding the VSphereCluster finalizer", e))?;
        return Ok(Action::requeue(Duration::ZERO));
    }
    let generation = vsc.metadata.generation;
    let mut status = vsc.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let requeue = check(&ctx, &vsc, &mut status).await?;
    write_status(&api, &vsc, &status).await?;
    Ok(Action::requeue(requeue))
}

/// Status by server-side apply on `/status`, only when it changed.
async fn write_status(
    api: &Api<VSphereCluster>,
    vsc: &VSphereCluster,
    status: &VSphereClusterStatus,
) -> Result<()> {
    if vsc.status.as_ref() == Some(status) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": VSphereCluster::api_version(&()),
        "kind": VSphereCluster::kind(&()),
        "status": status,
    });
    api.patch_status(
        &vsc.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing VSphereCluster status", e))?;
    Ok(())
}

/// Whether `vsm` takes its vCenter from `vsc`: a standalone machine through its Provider
/// (`banlieue-<provider>`), a CAPI machine through the cluster-name label of the CAPI Cluster
/// owning `vsc` (pure).
pub fn belongs_to(vsm: &VSphereMachine, vsc: &VSphereCluster) -> bool {
    let name = vsc.name_any();
    if let Some(p) = &vsm.spec.provider_ref {
        return standalone::infra_cluster_name(&p.name) == name;
    }
    let capi_cluster = vsc.owner_references().iter().find(|o| {
        contract::group_of(&o.api_version) == standalone::CAPI_GROUP
            && o.kind == standalone::CAPI_CLUSTER_KIND
    });
    match (capi_cluster, contract::cluster_name(&vsm.metadata)) {
        (Some(owner), Some(label)) => owner.name == label,
        _ => false,
    }
}

/// Names of the VSphereMachines in `vsc`'s namespace that still need it.
async fn machines_of(kube: &kube::Client, vsc: &VSphereCluster) -> Result<Vec<String>> {
    let machines: Api<VSphereMachine> = Api::namespaced(kube.clone(), &vsc.namespace().unwrap_or_default());
    let mut names: Vec<String> = machines
        .list(&Default::default())
        .await
        .map_err(|e| Error::kube("listing VSphereMachines", e))?
        .items
        .iter()
        .filter(|m| belongs_to(m, vsc))
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    Ok(names)
}

/// The `Ready` message while deletion waits for machines (pure): how many and which (at most
/// ten names).
pub fn waiting_message(remaining: &[String]) -> String {
    let shown: Vec<&str> = remaining.iter().take(10).map(String::as_str).collect();
    let more = remaining.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "deleting: waiting for {} VSphereMachine(s) to delete their VMs: {}{tail}",
        remaining.len(),
        shown.join(", ")
    )
}

async fn check(ctx: &Context, vsc: &VSphereCluster, status: &mut VSphereClusterStatus) -> Result<Duration> {
    let generation = vsc.metadata.generation;
    let endpoint = match connection::resolve(&ctx.kube, vsc, &ctx.cluster_secrets).await? {
        Ok(e) => e,
        Err(p) => {
            set_ready(status, false, p.reason, p.message, generation);
            return Ok(RESYNC);
        }
    };
    let client = match ctx.clients.client(&endpoint) {
        Ok(c) => c,
        Err(p) => {
            set_ready(status, false, p.reason, p.message, generation);
            return Ok(RESYNC);
        }
    };
    let fail = |status: &mut VSphereClusterStatus, e: banlieue_vsphere_client::Error| {
        let retry = if e.class() == banlieue_vsphere_client::ErrorClass::Transient {
            Duration::from_secs(15)
        } else {
            RESYNC
        };
        set_ready(status, false, reason_of(&e), e.to_string(), generation);
        retry
    };
    if let Err(e) = client.login_if_needed().await {
        return Ok(fail(status, e));
    }
    status.version = client.service_content().await.ok().map(|c| c.api_version.clone());
    if let Some(dc) = &vsc.spec.datacenter {
        match client.find_by_inventory_path(&format!("/{dc}")).await {
            Err(e) => return Ok(fail(status, e)),
            Ok(None) => {
                set_ready(
                    status,
                    false,
                    "DatacenterNotFound",
                    format!("datacenter {dc:?} not found in vCenter"),
                    generation,
                );
                return Ok(RESYNC);
            }
            Ok(Some(_)) => {}
        }
    }
    let mut domains = Vec::new();
    for fd in &vsc.spec.failure_domains {
        let path = if fd.compute_cluster.starts_with('/') {
            fd.compute_cluster.clone()
        } else {
            format!(
                "/{}/host/{}",
                vsc.spec.datacenter.as_deref().unwrap_or_default(),
                fd.compute_cluster
            )
        };
        match client.find_by_inventory_path(&path).await {
            Err(e) => return Ok(fail(status, e)),
            Ok(None) => {
                set_ready(
                    status,
                    false,
                    "FailureDomainNotFound",
                    format!("failure domain {:?}: compute cluster {path:?} not found", fd.name),
                    generation,
                );
                return Ok(RESYNC);
            }
            Ok(Some(_)) => domains.push(FailureDomain {
                name: fd.name.clone(),
                control_plane: Some(fd.control_plane.unwrap_or(true)),
                attributes: (!fd.attributes.is_empty()).then(|| fd.attributes.clone()),
            }),
        }
    }
    status.failure_domains = domains;
    status.initialization = Initialization::provisioned(true);
    set_ready(status, true, "Ready", "", generation);
    Ok(RESYNC)
}

fn error_policy(_obj: Arc<VSphereCluster>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// The `controller` label of this controller's metrics.
pub const METRICS_NAME: &str = "vspherecluster";

/// [`run_until`] without a shutdown signal of its own (tests stop it by aborting its task).
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    run_until(ctx, namespace, std::future::pending()).await;
}

/// Runs the VSphereCluster controller until the stream ends, for one namespace or (`None`) all.
/// In-flight reconciles finish once `shutdown` completes.
pub async fn run_until(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<VSphereCluster> = match namespace {
        Some(ns) => Api::namespaced(ctx.kube.clone(), ns),
        None => Api::all(ctx.kube.clone()),
    };
    let concurrency = ctx.concurrency;
    // A created or fixed credentials / CA bundle Secret concerns the clusters referencing it.
    Controller::new(api, watcher::Config::default())
        .watches(
            banlieue_provider_runtime::secret_watch::secrets_api(ctx.kube.clone(), namespace),
            watcher::Config::default(),
            ctx.cluster_secrets.mapper(),
        )
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            |obj, ctx: Arc<Context>| {
                let metrics = ctx.metrics.clone();
                async move {
                    metrics
                        .observe(METRICS_NAME, Error::metric_label, reconcile(obj, ctx))
                        .await
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "VSphereCluster reconcile error");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::ProviderReference;
    use banlieue_api::infrastructure::{VSphereClusterSpec, VSphereMachineSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn machine(provider: Option<&str>, cluster_label: Option<&str>) -> VSphereMachine {
        let spec: VSphereMachineSpec = serde_json::from_value(serde_json::json!({
            "source": {"template": "t"}, "cpu": {"cores": 1}, "memoryMiB": 512,
        }))
        .unwrap();
        let mut m = VSphereMachine::new("m", spec);
        m.spec.provider_ref = provider.map(|p| ProviderReference { name: p.into() });
        if let Some(l) = cluster_label {
            m.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".to_owned(), l.to_owned())].into());
        }
        m
    }

    fn cluster(name: &str, capi_owner: Option<&str>) -> VSphereCluster {
        let mut c = VSphereCluster::new(name, VSphereClusterSpec::default());
        c.metadata.owner_references = capi_owner.map(|o| {
            vec![OwnerReference {
                api_version: "cluster.x-k8s.io/v1beta2".into(),
                kind: "Cluster".into(),
                name: o.into(),
                uid: "u".into(),
                ..OwnerReference::default()
            }]
        });
        c
    }

    #[test]
    fn machines_belong_through_their_provider_or_capi_cluster() {
        let standalone = cluster("banlieue-vc", None);
        assert!(belongs_to(&machine(Some("vc"), None), &standalone));
        assert!(!belongs_to(&machine(Some("other"), None), &standalone));
        assert!(!belongs_to(&machine(None, Some("vc")), &standalone));
        let capi = cluster("prod-infra", Some("prod"));
        assert!(belongs_to(&machine(None, Some("prod")), &capi));
        assert!(!belongs_to(&machine(None, Some("dev")), &capi));
        assert!(!belongs_to(&machine(None, None), &capi));
    }

    #[test]
    fn the_waiting_message_counts_and_names_the_machines() {
        let names: Vec<String> = (0..12).map(|i| format!("m{i:02}")).collect();
        assert_eq!(
            waiting_message(&names[..2]),
            "deleting: waiting for 2 VSphereMachine(s) to delete their VMs: m00, m01"
        );
        let long = waiting_message(&names);
        assert!(
            long.starts_with("deleting: waiting for 12 VSphereMachine(s)"),
            "{long}"
        );
        assert!(long.ends_with("m09 and 2 more"), "{long}");
    }
}
