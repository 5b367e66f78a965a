//! The VSphereCluster reconciler (CAPI InfraCluster contract and standalone mode).
//!
//! A VSphereCluster owned by a CAPI `Cluster` or (standalone) by a banlieue `Provider` gets the
//! finalizer, a login check against vCenter, its datacenter and failure domains (compute
//! clusters) checked, `status.failureDomains`, `status.version`, `Ready` and
//! `status.initialization.provisioned`. Anything else is left alone.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::{FailureDomain, Initialization};
use banlieue_api::condition;
use banlieue_api::infrastructure::{VSphereCluster, VSphereClusterStatus};
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
    if vsc.status.as_ref() != Some(&status) {
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
    }
    Ok(Action::requeue(requeue))
}

async fn check(ctx: &Context, vsc: &VSphereCluster, status: &mut VSphereClusterStatus) -> Result<Duration> {
    let generation = vsc.metadata.generation;
    let endpoint = match connection::resolve(&ctx.kube, vsc).await? {
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

/// Runs the VSphereCluster controller until the stream ends, for one namespace or (`None`) all.
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    let api: Api<VSphereCluster> = match namespace {
        Some(ns) => Api::namespaced(ctx.kube.clone(), ns),
        None => Api::all(ctx.kube.clone()),
    };
    Controller::new(api, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "VSphereCluster reconcile error");
            }
        })
        .await;
}
