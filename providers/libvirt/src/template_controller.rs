//! The LibvirtMachineTemplate reconciler: publishes `status.capacity` (`cpu` = vCPUs,
//! `memory` in Mi) so that cluster-autoscaler can scale a MachineDeployment up from zero. A pure
//! function of the template's spec; written by server-side apply on `/status` only on change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::MachineTemplateStatus;
use banlieue_api::infrastructure::{LibvirtMachineSpec, LibvirtMachineTemplate};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{instrument, warn};

use crate::error::{Error, Result};
use crate::machine_controller::FIELD_MANAGER;

/// The capacity of one machine made from `spec`: `cpu` (sockets × cores) and `memory` (MiB).
pub fn capacity(spec: &LibvirtMachineSpec) -> MachineTemplateStatus {
    let vcpus = u64::from(spec.cpu.sockets.unwrap_or(1)) * u64::from(spec.cpu.cores);
    let capacity: BTreeMap<String, Quantity> = [
        ("cpu".to_owned(), Quantity(vcpus.to_string())),
        ("memory".to_owned(), Quantity(format!("{}Mi", spec.memory_mib))),
    ]
    .into();
    MachineTemplateStatus {
        capacity,
        node_info: None,
    }
}

/// Shared state of the template controller.
pub struct TemplateContext {
    /// Kubernetes client.
    pub client: kube::Client,
}

/// Reconciles one LibvirtMachineTemplate: no write when the capacity is already published.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(obj: Arc<LibvirtMachineTemplate>, ctx: Arc<TemplateContext>) -> Result<Action> {
    let want = capacity(&obj.spec.template.spec);
    if obj.status.as_ref() == Some(&want) {
        return Ok(Action::await_change());
    }
    let api: Api<LibvirtMachineTemplate> =
        Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": LibvirtMachineTemplate::api_version(&()),
        "kind": LibvirtMachineTemplate::kind(&()),
        "status": want,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing LibvirtMachineTemplate status", e))?;
    Ok(Action::await_change())
}

/// Error policy: retry after 30 s.
pub fn error_policy(_obj: Arc<LibvirtMachineTemplate>, err: &Error, _ctx: Arc<TemplateContext>) -> Action {
    warn!(error = %err, "template reconcile failed");
    Action::requeue(Duration::from_secs(30))
}

/// Runs the template controller until `shutdown`.
pub async fn run(
    ctx: Arc<TemplateContext>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<LibvirtMachineTemplate> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_counts_sockets_times_cores_and_memory_in_mebibytes() {
        let spec: LibvirtMachineSpec = serde_json::from_value(serde_json::json!({
            "source": {"volume": "base.qcow2", "pool": "default"},
            "cpu": {"cores": 3, "sockets": 2},
            "memoryMiB": 3072
        }))
        .unwrap();
        let status = capacity(&spec);
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"capacity": {"cpu": "6", "memory": "3072Mi"}})
        );
        let mut one_socket = spec.clone();
        one_socket.cpu.sockets = None;
        assert_eq!(capacity(&one_socket).capacity["cpu"].0, "3");
    }
}
