//! The VSphereMachine reconciler (CAPI InfraMachine contract, and standalone machines of banlieue
//! VirtualMachines).
//!
//! One reconcile: read the object fresh → no controlling Machine/VirtualMachine: nothing →
//! owner view ([`crate::owner`]) → `Paused` condition, stop if paused → deletion (power off,
//! destroy, finalizer) → finalizer → wait for the infra cluster → one provisioning step
//! ([`crate::provision`]) → `spec.providerID` once provisioned → status by server-side apply on
//! `/status`, only when it changed → an Event per transition.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::banlieue::VirtualMachine;
use banlieue_api::common::{Initialization, PowerState};
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_api::infrastructure::{VSphereCluster, VSphereMachine, VSphereMachineStatus};
use banlieue_capi::contract;
use banlieue_capi::{Cluster, Machine};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{info, instrument, warn};

use banlieue_provider_runtime::secret_watch::{SecretIndex, SecretKey, secrets_api};

use crate::connection::{self, ClientCache};
use crate::error::{Error, Result};
use banlieue_provider_kit::owner::{self, BootstrapSource as Bootstrap, OwnerView};
use crate::phase::{Phase, task_ref, vm_ref};
use crate::provision::{self, DeleteStep, MachineInput, StepError};
use crate::readopt;

/// Finalizer of VSphereMachines and VSphereClusters.
pub const FINALIZER: &str = "infrastructure.banlieue.io/vsphere";
/// Field manager of every write of this provider.
pub const FIELD_MANAGER: &str = "banlieue-vsphere";
/// Requeue while waiting for something another controller does.
pub const WAIT_REQUEUE: Duration = Duration::from_secs(10);

/// Shared state of the controllers.
pub struct Context {
    /// Kubernetes client.
    pub kube: kube::Client,
    /// vSphere clients per endpoint.
    pub clients: ClientCache,
    /// Event recorder.
    pub recorder: Recorder,
    /// Reconcile metrics of both controllers (`/metrics`).
    pub metrics: banlieue_provider_runtime::metrics::Metrics,
    /// Concurrent reconciles per controller (0: unbounded).
    pub concurrency: u16,
    /// The user-data / bootstrap Secret each VSphereMachine waits for, for the Secret watch.
    pub user_data_secrets: SecretIndex<VSphereMachine>,
}

impl Context {
    /// A context reporting Events as `reporter`.
    pub fn new(kube: kube::Client, reporter: &str) -> Self {
        let recorder = Recorder::new(
            kube.clone(),
            Reporter {
                controller: reporter.to_owned(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Self {
            kube,
            clients: ClientCache::default(),
            recorder,
            metrics: Default::default(),
            concurrency: 0,
            user_data_secrets: SecretIndex::default(),
        }
    }
}

pub(crate) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn set(
    conds: &mut Vec<condition::Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    let status = if ok {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let message = message.into();
    // Keep the condition (and its lastTransitionTime) when nothing but time would change.
    if let Some(c) = condition::find(conds, type_)
        && c.status == status.as_str()
        && c.reason == reason
        && c.message == message
        && c.observed_generation == generation
    {
        return;
    }
    condition::set(
        conds,
        condition::new_condition(type_, status, reason, message, generation, now()),
    );
}

async fn write_status(
    ctx: &Context,
    api: &Api<VSphereMachine>,
    vm: &VSphereMachine,
    new: &VSphereMachineStatus,
) -> Result<()> {
    if vm.status.as_ref() == Some(new) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": VSphereMachine::api_version(&()),
        "kind": VSphereMachine::kind(&()),
        "status": new,
    });
    api.patch_status(
        &vm.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing VSphereMachine status", e))?;
    let _ = ctx;
    Ok(())
}

async fn patch_finalizers(api: &Api<VSphereMachine>, vm: &VSphereMachine, add: bool) -> Result<()> {
    let mut finalizers = vm.finalizers().to_vec();
    if add {
        finalizers.push(FINALIZER.to_owned());
    } else {
        finalizers.retain(|f| f != FINALIZER);
    }
    let patch =
        serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": vm.resource_version()}});
    api.patch(&vm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube("updating VSphereMachine finalizers", e))?;
    Ok(())
}

async fn publish(ctx: &Context, vm: &VSphereMachine, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &vm.object_ref(&())).await {
        warn!(error = %e, "cannot publish event");
    }
}

async fn read_user_data(
    kube: &kube::Client,
    ns: &str,
    source: &Bootstrap,
) -> Result<Result<Option<Vec<u8>>, String>> {
    match source {
        Bootstrap::Empty => Ok(Ok(None)),
        Bootstrap::Pending => Ok(Err("waiting for the bootstrap data Secret name".into())),
        Bootstrap::Secret { name, key } => {
            let secret = Api::<Secret>::namespaced(kube.clone(), ns)
                .get_opt(name)
                .await
                .map_err(|e| Error::kube("reading the bootstrap Secret", e))?;
            Ok(
                match secret
                    .and_then(|s| s.data)
                    .and_then(|d| d.get(key).map(|v| v.0.clone()))
                {
                    Some(data) => Ok(Some(data)),
                    None => Err(format!("bootstrap Secret {name:?} (key {key:?}) not found")),
                },
            )
        }
    }
}

/// Reconciles one VSphereMachine.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(obj: Arc<VSphereMachine>, ctx: Arc<Context>) -> Result<Action> {
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<VSphereMachine> = Api::namespaced(ctx.kube.clone(), &ns);
    let Some(vm) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube("reading VSphereMachine", e))?
    else {
        return Ok(Action::await_change());
    };
    if vm.metadata.deletion_timestamp.is_some()
        && vm.finalizers().iter().any(|f| f == FINALIZER)
        && contract::is_deleted_for_move(&vm.metadata)
    {
        // `clusterctl move` deletes the source objects once their copies exist on the target
        // cluster (the Cluster is paused meanwhile): the VM belongs to the copy now. Release the
        // object, never touch the VM.
        publish(
            &ctx,
            &vm,
            EventType::Normal,
            "ReleasedForMove",
            "clusterctl move deleted this object; its VM is kept for the copy on the target cluster".into(),
        )
        .await;
        patch_finalizers(&api, &vm, false).await?;
        return Ok(Action::await_change());
    }
    let Some(owner) = owner::controlling_owner(&vm.metadata) else {
        return Ok(Action::await_change());
    };
    let view = owner::resolve(&ctx.kube, &vm, owner).await?;
    let generation = vm.metadata.generation;
    let mut status = vm.status.clone().unwrap_or_default();
    let (p_status, p_reason, p_message) = view.paused_condition.clone();
    set(
        &mut status.conditions,
        condition::PAUSED,
        p_status == "True",
        p_reason,
        p_message,
        generation,
    );
    if view.paused.is_some() {
        write_status(&ctx, &api, &vm, &status).await?;
        return Ok(Action::await_change());
    }
    if vm.metadata.deletion_timestamp.is_some() {
        return delete(&ctx, &api, &vm, &view, status).await;
    }
    if !vm.finalizers().iter().any(|f| f == FINALIZER) {
        patch_finalizers(&api, &vm, true).await?;
        return Ok(Action::requeue(Duration::ZERO));
    }
    status.observed_generation = generation;
    let result = provision(&ctx, &vm, &view, &mut status).await;
    let action = match result {
        Ok((event, requeue)) => {
            write_status(&ctx, &api, &vm, &status).await?;
            if let Some((type_, reason, note)) = event {
                publish(&ctx, &vm, type_, reason, note).await;
            }
            requeue
        }
        Err(e) => {
            let (reason, message, retry) = match &e {
                StepError::Permanent { reason, message } => {
                    (*reason, message.clone(), provision::PERMANENT_RETRY)
                }
                StepError::Transient { reason, source } => {
                    (*reason, source.to_string(), Duration::from_secs(10))
                }
                StepError::NeedBootstrapData => ("WaitingForBootstrapData", e.to_string(), WAIT_REQUEUE),
            };
            let changed =
                condition::find(&status.conditions, condition::READY).is_none_or(|c| c.reason != reason);
            set(
                &mut status.conditions,
                condition::READY,
                false,
                reason,
                message.clone(),
                generation,
            );
            write_status(&ctx, &api, &vm, &status).await?;
            if changed {
                publish(&ctx, &vm, EventType::Warning, reason, message).await;
            }
            Action::requeue(retry)
        }
    };
    Ok(action)
}

/// The Event to publish (if any) and when to look again.
type Progress = (Option<(EventType, &'static str, String)>, Action);

async fn provision(
    ctx: &Context,
    vm: &VSphereMachine,
    view: &OwnerView<VSphereCluster>,
    status: &mut VSphereMachineStatus,
) -> Result<Progress, StepError> {
    let mut generation = vm.metadata.generation;
    let cluster = match view.infra_cluster.usable() {
        Ok(cluster) => cluster,
        Err(why) => {
        set(
            &mut status.conditions,
            condition::READY,
            false,
            "WaitingForClusterInfrastructure",
            why,
            generation,
        );
        return Ok((None, Action::requeue(WAIT_REQUEUE)));
        }
    };
    let kube_err = |e: Error| StepError::Permanent {
        reason: "KubernetesError",
        message: e.to_string(),
    };
    let endpoint = match connection::resolve(&ctx.kube, cluster, |_| {})
        .await
        .map_err(kube_err)?
    {
        Ok(e) => e,
        Err(p) => {
            return Err(StepError::Permanent {
                reason: p.reason,
                message: p.message,
            });
        }
    };
    let client = ctx.clients.client(&endpoint).map_err(|p| StepError::Permanent {
        reason: p.reason,
        message: p.message,
    })?;
    let phase = Phase::read(vm.status.as_ref()).map_err(|e| StepError::Permanent {
        reason: "InconsistentStatus",
        message: e.to_string(),
    })?;
    let uid = vm.uid().unwrap_or_default();
    let name = vm.name_any();
    let namespace = vm.namespace().unwrap_or_default();
    let input = MachineInput {
        uid: &uid,
        namespace: &namespace,
        name: &name,
        spec: &vm.spec,
        cluster,
        failure_domain: view.failure_domain.as_deref(),
    };
    let desired_power = vm.spec.power_state.unwrap_or(PowerState::On);
    let step = match provision::provision_step(&client, &input, phase.clone(), None, desired_power).await {
        Err(StepError::NeedBootstrapData) => {
            let ns = vm.namespace().unwrap_or_default();
            // Watched while needed: a Secret created or fixed meanwhile is acted on at once.
            let waited_for = match &view.bootstrap {
                Bootstrap::Secret { name, .. } => Some(SecretKey::new(ns.clone(), name.clone())),
                _ => None,
            };
            ctx.user_data_secrets.set(ObjectRef::from_obj(vm), waited_for);
            match read_user_data(&ctx.kube, &ns, &view.bootstrap)
                .await
                .map_err(kube_err)?
            {
                Ok(data) => {
                    provision::provision_step(&client, &input, phase, Some(data.as_deref()), desired_power)
                        .await?
                }
                Err(why) => {
                    set(
                        &mut status.conditions,
                        condition::READY,
                        false,
                        "WaitingForBootstrapData",
                        why,
                        generation,
                    );
                    return Ok((None, Action::requeue(WAIT_REQUEUE)));
                }
            }
        }
        other => other?,
    };
    step.phase.write(status);
    if let Some(fd) = &step.failure_domain {
        status.failure_domain = Some(fd.clone());
    } else if status.failure_domain.is_none() {
        status.failure_domain = view.failure_domain.clone();
    }
    if let Some(info) = &step.vm {
        status.addresses = provision::addresses(&name, info);
        status.power_state = info.power_state.map(|p| match p {
            banlieue_vsphere_client::VmPowerState::PoweredOn => PowerState::On,
            _ => PowerState::Off,
        });
        if let Some(host) = &info.host
            && status.node.as_deref() != Some(host.value.as_str())
        {
            status.node = Some(host.value.clone());
        }
        if let Some(uuid) = &info.bios_uuid {
            let provider_id = format!("vsphere://{uuid}");
            if vm.spec.provider_id.as_deref() != Some(provider_id.as_str()) {
                let api: Api<VSphereMachine> =
                    Api::namespaced(ctx.kube.clone(), &vm.namespace().unwrap_or_default());
                let patch = serde_json::json!({"spec": {"providerID": provider_id}});
                let patched = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| kube_err(Error::kube("setting spec.providerID", e)))?;
                // The status describes the spec including the providerID just written.
                generation = patched.metadata.generation;
                status.observed_generation = generation;
            }
            status.initialization = Initialization::provisioned(true);
        }
    }
    let why = step.waiting.clone().unwrap_or_default();
    let (ok, reason, message) = match (&step.phase, &step.failed) {
        (_, Some((reason, message))) => (false, *reason, message.clone()),
        // Provisioned is not Ready while the VM is off (`status.initialization.provisioned`
        // stays true), the same semantics as every provider.
        (Phase::Provisioned(..), None)
            if step.waiting.is_none() && status.power_state == Some(PowerState::Off) =>
        {
            let message = condition::powered_off_message(&format!("VM {name}"), vm.spec.power_state);
            (false, condition::POWERED_OFF, message)
        }
        (Phase::Provisioned(..), None) if step.waiting.is_none() => (true, "Provisioned", String::new()),
        // A provisioned VM being brought back to its spec (drift, power state).
        (Phase::Provisioned(..), None) => (false, "Updating", why),
        (phase, None) => (false, phase.reason(), why),
    };
    let changed = condition::find(&status.conditions, condition::READY).is_none_or(|c| c.reason != reason);
    set(
        &mut status.conditions,
        condition::READY,
        ok,
        reason,
        message.clone(),
        generation,
    );
    if let Some((reason, _)) = &step.failed {
        return Ok((
            changed.then_some((EventType::Warning, *reason, message)),
            Action::requeue(step.requeue),
        ));
    }
    Ok((
        step.event.clone().map(|(r, n)| (EventType::Normal, r, n)),
        Action::requeue(step.requeue),
    ))
}

async fn delete(
    ctx: &Context,
    api: &Api<VSphereMachine>,
    vm: &VSphereMachine,
    view: &OwnerView<VSphereCluster>,
    mut status: VSphereMachineStatus,
) -> Result<Action> {
    if !vm.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let generation = vm.metadata.generation;
    let Some(cluster) = view.infra_cluster.object() else {
        // Without its cluster there is no vCenter to clean up: release the object.
        warn!("infra cluster gone; removing the finalizer without deleting a VM");
        patch_finalizers(api, vm, false).await?;
        return Ok(Action::await_change());
    };
    let endpoint = match connection::resolve(&ctx.kube, cluster, |_| {}).await? {
        Ok(e) => e,
        Err(p) => {
            set(
                &mut status.conditions,
                condition::READY,
                false,
                p.reason,
                p.message,
                generation,
            );
            write_status(ctx, api, vm, &status).await?;
            return Ok(Action::requeue(provision::PERMANENT_RETRY));
        }
    };
    let client = ctx
        .clients
        .client(&endpoint)
        .map_err(|p| Error::Invalid(p.to_string()))?;
    let uid = vm.uid().unwrap_or_default();
    let mut vm_ref = status.vm_ref.as_deref().map(vm_ref);
    let task = status
        .provisioning
        .as_ref()
        .and_then(|p| p.task_id.as_deref())
        .map(task_ref);
    let (namespace, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
    let owner = readopt::Owner {
        uid: &uid,
        namespace: &namespace,
        name: &name,
    };
    let step = match (&vm_ref, task, vm.spec.provider_id.as_deref()) {
        // Created anew (clusterctl move, a restore) and deleted before its VM was adopted: the
        // VM is deleted only if it already carries this object's UID; one created for an earlier
        // object of this name is left in place (never re-marked here).
        (None, None, Some(provider_id)) => match readopt::on_deletion(&client, owner, provider_id).await {
            Ok(readopt::OnDeletion::Delete(found)) => {
                vm_ref = Some(found);
                provision::delete_step(&client, &uid, vm_ref.clone(), None).await
            }
            Ok(readopt::OnDeletion::LeftInPlace(note)) => {
                return release(ctx, api, vm, "VMLeftInPlace", note).await;
            }
            Ok(readopt::OnDeletion::Nothing(note)) => {
                // Still nothing carrying this object's UID may be left behind.
                match provision::delete_step(&client, &uid, None, None).await {
                    Ok(DeleteStep::Gone) => return release(ctx, api, vm, "Deleted", note).await,
                    other => other,
                }
            }
            Err(e) => Err(e),
        },
        (_, task, _) => provision::delete_step(&client, &uid, vm_ref.clone(), task).await,
    };
    match step {
        Ok(DeleteStep::Gone) => {
            info!("VM deleted; removing the finalizer");
            publish(
                ctx,
                vm,
                EventType::Normal,
                "Deleted",
                "VM deleted in vCenter".into(),
            )
            .await;
            patch_finalizers(api, vm, false).await?;
            Ok(Action::await_change())
        }
        Ok(DeleteStep::Wait(task, what)) => {
            status.vm_ref = status.vm_ref.take().or(vm_ref.map(|v| v.value));
            let prov = status.provisioning.get_or_insert_with(Default::default);
            prov.state = banlieue_api::common::ProvisioningState::Deleting;
            prov.task_id = Some(task.value.clone());
            set(
                &mut status.conditions,
                condition::READY,
                false,
                "Deleting",
                what,
                generation,
            );
            write_status(ctx, api, vm, &status).await?;
            Ok(Action::requeue(provision::TASK_POLL))
        }
        Err(e) => {
            set(
                &mut status.conditions,
                condition::READY,
                false,
                e.reason(),
                e.to_string(),
                generation,
            );
            write_status(ctx, api, vm, &status).await?;
            Ok(Action::requeue(Duration::from_secs(10)))
        }
    }
}

/// Publishes a Normal Event and removes the finalizer, touching nothing in vCenter.
async fn release(
    ctx: &Context,
    api: &Api<VSphereMachine>,
    vm: &VSphereMachine,
    reason: &str,
    note: String,
) -> Result<Action> {
    info!(reason, "{note}; removing the finalizer");
    publish(ctx, vm, EventType::Normal, reason, note).await;
    patch_finalizers(api, vm, false).await?;
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<VSphereMachine>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// The `controller` label of this controller's metrics.
pub const METRICS_NAME: &str = "vspheremachine";

/// The VSphereMachine a CAPI Machine's `infrastructureRef` names.
fn machine_to_infra(machine: Machine) -> Option<ObjectRef<VSphereMachine>> {
    let r = &machine.spec.infrastructure_ref;
    (r.kind == "VSphereMachine" && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
        .then(|| ObjectRef::new(&r.name).within(&machine.namespace().unwrap_or_default()))
}

/// The VSphereMachine a banlieue VirtualMachine's status names.
fn virtual_machine_to_infra(vm: VirtualMachine) -> Option<ObjectRef<VSphereMachine>> {
    let ns = vm.namespace().unwrap_or_default();
    vm.status
        .as_ref()
        .and_then(|s| s.infrastructure_ref.as_ref())
        .filter(|r| r.kind == "VSphereMachine")
        .map(|r| ObjectRef::new(&r.name).within(&ns))
}

/// Whether `cluster.x-k8s.io/v1beta2` serves Machines and Clusters (standalone mode runs without
/// Cluster API, and a watch on a kind that is not served would only fail).
async fn capi_served(client: &kube::Client) -> bool {
    client
        .list_api_group_resources(banlieue_capi::contract::CLUSTER_API_VERSION)
        .await
        .is_ok_and(|list| {
            ["clusters", "machines"]
                .iter()
                .all(|r| list.resources.iter().any(|x| x.name == *r))
        })
}

/// [`run_until`] without a shutdown signal of its own (tests stop it by aborting its task).
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    run_until(ctx, namespace, std::future::pending()).await;
}

/// Runs the VSphereMachine controller until the stream ends, for one namespace or (`None`) all.
///
/// Besides its own kind it watches what a reconcile reads, so that a change there is acted on at
/// once rather than at the next requeue: the controlling CAPI Machine (bootstrap data), the
/// CAPI Cluster (pause, infrastructure) of the labelled machines, the VSphereCluster (machines of
/// its namespace) and the banlieue VirtualMachine. CAPI's kinds are watched only when Cluster API
/// is installed when the controller starts.
/// In-flight reconciles finish once `shutdown` completes.
pub async fn run_until(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    fn api<K>(client: &kube::Client, ns: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let client = ctx.kube.clone();
    let concurrency = ctx.concurrency;
    let mut controller = Controller::new(
        api::<VSphereMachine>(&client, namespace),
        watcher::Config::default(),
    );
    let store = controller.store();
    let in_namespace = {
        let store = store.clone();
        move |cluster: VSphereCluster| {
            let ns = cluster.namespace();
            store
                .state()
                .into_iter()
                .filter(|m| m.namespace() == ns)
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        }
    };
    controller = controller
        .watches(
            api::<VSphereCluster>(&client, namespace),
            watcher::Config::default(),
            in_namespace,
        )
        .watches(
            api::<VirtualMachine>(&client, namespace),
            watcher::Config::default(),
            virtual_machine_to_infra,
        )
        .watches(
            secrets_api(client.clone(), namespace),
            watcher::Config::default(),
            ctx.user_data_secrets.mapper(),
        );
    if capi_served(&client).await {
        let labelled = move |cluster: Cluster| {
            let (name, ns) = (cluster.name_any(), cluster.namespace());
            store
                .state()
                .into_iter()
                .filter(|m| m.namespace() == ns && contract::cluster_name(&m.metadata) == Some(name.as_str()))
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        };
        controller = controller
            .watches(
                api::<Machine>(&client, namespace),
                watcher::Config::default(),
                machine_to_infra,
            )
            .watches(
                api::<Cluster>(&client, namespace),
                watcher::Config::default(),
                labelled,
            );
    } else {
        info!("Cluster API is not installed: watching VSphereMachines for standalone VirtualMachines only");
    }
    controller
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
                warn!(error = %e, "VSphereMachine reconcile error");
            }
        })
        .await;
}
