//! The VSphereMachineTemplate reconciler: publishes `status.capacity` (`cpu` in vCPUs, `memory`
//! in MiB) for cluster-autoscaler's scale-from-zero. A pure function of the spec, written by
//! server-side apply on `/status` only when it changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::MachineTemplateStatus;
use banlieue_api::infrastructure::{VSphereMachineSpec, VSphereMachineTemplate};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{instrument, warn};

use crate::error::{Error, Result};
use crate::machine_controller::{Context, FIELD_MANAGER};

/// The capacity of one machine made from `spec` (pure).
pub fn capacity(spec: &VSphereMachineSpec) -> MachineTemplateStatus {
    let capacity: BTreeMap<String, Quantity> = [
        ("cpu".to_owned(), Quantity(spec.cpu.vcpus().to_string())),
        ("memory".to_owned(), Quantity(format!("{}Mi", spec.memory_mib))),
    ]
    .into();
    MachineTemplateStatus {
        capacity,
        node_info: None,
    }
}

/// Reconciles one VSphereMachineTemplate.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(obj: Arc<VSphereMachineTemplate>, ctx: Arc<Context>) -> Result<Action> {
    let want = capacity(&obj.spec.template.spec);
    if obj.status.as_ref() == Some(&want) {
        return Ok(Action::await_change());
    }
    let api: Api<VSphereMachineTemplate> =
        Api::namespaced(ctx.kube.clone(), &obj.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": VSphereMachineTemplate::api_version(&()),
        "kind": VSphereMachineTemplate::kind(&()),
        "status": want,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing VSphereMachineTemplate status", e))?;
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<VSphereMachineTemplate>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(30))
}

/// [`run_until`] without a shutdown signal of its own (tests stop it by aborting its task).
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    run_until(ctx, namespace, std::future::pending()).await;
}

/// Runs the VSphereMachineTemplate controller until the stream ends, for one namespace or
/// (`None`) all.
/// In-flight reconciles finish once `shutdown` completes.
pub async fn run_until(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<VSphereMachineTemplate> = match namespace {
        Some(ns) => Api::namespaced(ctx.kube.clone(), ns),
        None => Api::all(ctx.kube.clone()),
    };
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "VSphereMachineTemplate reconcile error");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_counts_vcpus_and_memory_in_mebibytes() {
        let spec: VSphereMachineSpec = serde_json::from_value(serde_json::json!({
            "source": {"template": "ubuntu"},
            "cpu": {"cores": 4, "sockets": 2},
            "memoryMiB": 6144,
        }))
        .unwrap();
        let json = serde_json::to_value(capacity(&spec)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"capacity": {"cpu": "8", "memory": "6144Mi"}})
        );
    }
}
