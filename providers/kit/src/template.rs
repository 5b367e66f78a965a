//! The InfraMachineTemplate reconciler, for every hypervisor: publishes `status.capacity`
//! (`cpu` in vCPUs = sockets × cores, `memory` in Mi) so that cluster-autoscaler can scale a
//! MachineDeployment up from zero. A pure function of the template's spec, written by
//! server-side apply on `/status` only when it changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::{Cpu, MachineTemplateStatus};
use banlieue_api::infrastructure::kinds::InfraMachineTemplate;
use banlieue_provider_runtime::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::controller::{Action, Controller};
use kube::{Api, ResourceExt};
use tracing::{instrument, warn};

use crate::error::{Error, Result};

/// The capacity of one machine of `cpu` and `memory_mib`.
pub fn capacity(cpu: &Cpu, memory_mib: u64) -> MachineTemplateStatus {
    let capacity: BTreeMap<String, Quantity> = [
        ("cpu".to_owned(), Quantity(cpu.vcpus().to_string())),
        ("memory".to_owned(), Quantity(format!("{memory_mib}Mi"))),
    ]
    .into();
    MachineTemplateStatus {
        capacity,
        node_info: None,
    }
}

/// Shared state of a template controller.
pub struct TemplateContext {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The field manager of the provider's writes.
    pub field_manager: &'static str,
    /// The provider's metrics registry.
    pub metrics: Metrics,
    /// Only templates labelled `cluster.x-k8s.io/watch-filter=<this>` (CAPI's `--watch-filter`).
    pub watch_filter: Option<String>,
}

/// Reconciles one template: no write when the capacity is already published.
#[instrument(skip_all, fields(kind = %T::kind(&()), namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<T: InfraMachineTemplate>(obj: Arc<T>, ctx: Arc<TemplateContext>) -> Result<Action> {
    let want = capacity(obj.cpu(), obj.memory_mib());
    let api: Api<T> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    crate::status::write_status(
        &api,
        &*obj,
        obj.capacity_status(),
        &want,
        ctx.field_manager,
        &ctx.metrics,
    )
    .await?;
    Ok(Action::await_change())
}

fn error_policy<T: InfraMachineTemplate>(_obj: Arc<T>, err: &Error, _ctx: Arc<TemplateContext>) -> Action {
    warn!(error = %err, "template reconcile failed");
    Action::requeue(Duration::from_secs(30))
}

/// Runs the template controller of kind `T` until `shutdown`, for one namespace or (`None`) all.
pub async fn run<T: InfraMachineTemplate>(
    ctx: Arc<TemplateContext>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let metrics = ctx.metrics.clone();
    let controller = Controller::new(
        crate::drive::api::<T>(&ctx.client, namespace),
        crate::drive::primary_watch(ctx.watch_filter.as_deref()),
    );
    crate::drive::drive(
        controller,
        0,
        shutdown,
        metrics,
        reconcile::<T>,
        error_policy::<T>,
        ctx,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::infrastructure::{LibvirtMachineTemplate, VSphereMachineTemplate};

    #[test]
    fn capacity_counts_sockets_times_cores_and_memory_in_mebibytes() {
        let status = capacity(
            &Cpu {
                cores: 4,
                sockets: Some(2),
            },
            6144,
        );
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"capacity": {"cpu": "8", "memory": "6144Mi"}})
        );
        assert_eq!(capacity(&Cpu::cores(3), 512).capacity["cpu"].0, "3");
    }

    #[test]
    fn every_hypervisors_template_is_read_the_same_way() {
        let libvirt: LibvirtMachineTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachineTemplate",
            "metadata": {"name": "t"},
            "spec": {"template": {"spec": {"source": {"volume": "base.qcow2", "pool": "default"}, "cpu": {"cores": 3, "sockets": 2}, "memoryMiB": 3072}}}
        }))
        .unwrap();
        assert_eq!(
            capacity(libvirt.cpu(), libvirt.memory_mib()).capacity["cpu"].0,
            "6"
        );
        let vsphere: VSphereMachineTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachineTemplate",
            "metadata": {"name": "t"},
            "spec": {"template": {"spec": {"source": {"template": "ubuntu"}, "cpu": {"cores": 2}, "memoryMiB": 2048}}}
        }))
        .unwrap();
        assert_eq!(
            capacity(vsphere.cpu(), vsphere.memory_mib()).capacity["memory"].0,
            "2048Mi"
        );
    }
}
