//! The ProxmoxMachineTemplate reconciler: publishes `status.capacity` (CPU, memory) for
//! cluster-autoscaler's scale-from-zero. Pure function of the spec; written only on change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::MachineTemplateStatus;
use banlieue_api::infrastructure::{ProxmoxMachineSpec, ProxmoxMachineTemplate};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};

use crate::error::{Error, Result};
use crate::machine_controller::FIELD_MANAGER;

/// The capacity of one machine made from `spec`: `cpu` (vCPUs) and `memory` (MiB).
pub fn capacity(spec: &ProxmoxMachineSpec) -> MachineTemplateStatus {
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

/// Shared state of the template controller.
pub struct TemplateContext {
    /// Kubernetes client.
    pub client: kube::Client,
}

/// Reconciles one ProxmoxMachineTemplate.
pub async fn reconcile(obj: Arc<ProxmoxMachineTemplate>, ctx: Arc<TemplateContext>) -> Result<Action> {
    let want = capacity(&obj.spec.template.spec);
    if obj.status.as_ref() == Some(&want) {
        return Ok(Action::await_change());
    }
    let api: Api<ProxmoxMachineTemplate> =
        Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": ProxmoxMachineTemplate::api_version(&()),
        "kind": ProxmoxMachineTemplate::kind(&()),
        "status": want,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing ProxmoxMachineTemplate status", e))?;
    Ok(Action::await_change())
}

/// Error policy: retry after 30 s.
pub fn error_policy(_obj: Arc<ProxmoxMachineTemplate>, _err: &Error, _ctx: Arc<TemplateContext>) -> Action {
    Action::requeue(Duration::from_secs(30))
}

/// Runs the template controller until `shutdown`.
pub async fn run(
    ctx: Arc<TemplateContext>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<ProxmoxMachineTemplate> = match namespace {
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
    use banlieue_api::common::Cpu;
    use banlieue_api::infrastructure::ProxmoxTemplateSource;

    #[test]
    fn capacity_counts_vcpus_and_memory_in_mebibytes() {
        let spec = ProxmoxMachineSpec {
            provider_id: None,
            provider_ref: None,
            source: ProxmoxTemplateSource::default(),
            target_node: None,
            allowed_nodes: vec![],
            storage: None,
            clone_mode: None,
            pool: None,
            cpu: Cpu {
                cores: 4,
                sockets: Some(2),
            },
            memory_mib: 6144,
            disks: vec![],
            networks: vec![],
            tags: vec![],
            vmid_range: None,
            readiness_checks: None,
            power_state: None,
        };
        let status = capacity(&spec);
        assert_eq!(status.capacity["cpu"].0, "8");
        assert_eq!(status.capacity["memory"].0, "6144Mi");
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"capacity": {"cpu": "8", "memory": "6144Mi"}})
        );
    }
}
