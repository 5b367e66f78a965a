//! The LibvirtMachine reconciler (CAPI InfraMachine contract, and standalone machines of
//! banlieue VirtualMachines).
//!
//! One reconcile: read the object fresh (GET, never a stale cache entry) → controlling owner
//! (none of ours: left alone) → owner view ([`crate::owner`]) → `Paused` condition, stop if
//! paused (deletion included) → deletion → finalizer → wait for the infra cluster and the
//! bootstrap data → provisioning ([`crate::provision`]) → `spec.providerID` → status by
//! server-side apply on `/status` (only when changed) → Events.
//!
//! The Secrets a reconcile reads (the hosts' credentials, the user-data / bootstrap data Secret
//! while it is needed) are watched: one created or fixed after the fact is acted on within
//! seconds ([`crate::secrets`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_api::banlieue::VirtualMachine;
use banlieue_api::common::{Initialization, PowerState};
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine, LibvirtMachineStatus};
use banlieue_capi::contract;
use banlieue_capi::{Cluster, Machine};
use banlieue_provider_runtime::secret_watch::{SecretIndex, SecretKey, secrets_api};
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

use crate::desired::Settings;
use crate::error::{Error, Result};
use crate::hosts::{self, Connector};
use banlieue_provider_kit::owner::{self, BootstrapSource, InfraCluster};
use crate::phase::Phase;
use crate::provision::{self, MachineInput, StepError};
use crate::readopt;
use banlieue_provider_kit::secrets::ReadSecrets;
use crate::xml::Owner;

/// Finalizer of LibvirtMachines and LibvirtClusters.
pub const FINALIZER: &str = "infrastructure.banlieue.io/libvirt";
/// Field manager of every write of this provider.
pub const FIELD_MANAGER: &str = "banlieue-libvirt";
/// Requeue while waiting for something another controller does (or for a Secret: those are
/// also watched).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(15);

/// Shared state of the LibvirtMachine controller.
pub struct MachineContext<C: Connector> {
    /// Kubernetes client.
    pub client: kube::Client,
    /// Opens libvirt connections.
    pub connector: C,
    /// Provider-wide settings (domain type, serial logs, kernel boot).
    pub settings: Settings,
    /// Event recorder.
    pub recorder: Recorder,
    failures: Mutex<HashMap<String, u32>>,
    /// Kubernetes writes by kind (`status`, `spec`, `finalizer`), for benchmarks and metrics.
    pub writes: Mutex<HashMap<&'static str, u64>>,
    /// Reconcile metrics (`/metrics`); share one registry per process by replacing it.
    pub metrics: banlieue_provider_runtime::metrics::Metrics,
    /// The Secrets each LibvirtMachine's last reconcile read, for the Secret watch.
    pub secrets: SecretIndex<LibvirtMachine>,
    /// Requeue while waiting for the infra cluster, the bootstrap data or hosts ([`WAIT_REQUEUE`]).
    pub wait_requeue: Duration,
}

impl<C: Connector> MachineContext<C> {
    /// A context reporting Events as `reporter`.
    pub fn new(client: kube::Client, connector: C, settings: Settings, reporter: &str) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: reporter.to_owned(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Self {
            client,
            connector,
            settings,
            recorder,
            failures: Mutex::default(),
            writes: Mutex::default(),
            metrics: Default::default(),
            secrets: SecretIndex::default(),
            wait_requeue: WAIT_REQUEUE,
        }
    }

    fn count_write(&self, kind: &'static str) {
        self.metrics.count_write(kind);
        *self
            .writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    /// Total Kubernetes writes so far.
    pub fn total_writes(&self) -> u64 {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }

    fn backoff(&self, uid: &str) -> Duration {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(uid.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        Duration::from_secs(1u64 << (*n).min(8)).min(Duration::from_secs(300))
    }

    fn reset_backoff(&self, uid: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn ready(
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> condition::Condition {
    condition::new_condition(condition::READY, status, reason, message, generation, now())
}

async fn write_status<C: Connector>(
    ctx: &MachineContext<C>,
    api: &Api<LibvirtMachine>,
    lm: &LibvirtMachine,
    new: &LibvirtMachineStatus,
) -> Result<()> {
    if lm.status.clone().unwrap_or_default() == *new {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": LibvirtMachine::api_version(&()),
        "kind": LibvirtMachine::kind(&()),
        "status": new,
    });
    api.patch_status(
        &lm.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing LibvirtMachine status", e))?;
    ctx.count_write("status");
    Ok(())
}

async fn patch_finalizers<C: Connector>(
    ctx: &MachineContext<C>,
    api: &Api<LibvirtMachine>,
    lm: &LibvirtMachine,
    add: bool,
) -> Result<()> {
    let mut finalizers = lm.finalizers().to_vec();
    if add {
        finalizers.push(FINALIZER.to_owned());
    } else {
        finalizers.retain(|f| f != FINALIZER);
    }
    // Guarded by resourceVersion: a concurrent change fails the patch and the reconcile retries.
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": lm.resource_version()}
    });
    api.patch(&lm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube("updating LibvirtMachine finalizers", e))?;
    ctx.count_write("finalizer");
    Ok(())
}

async fn publish(recorder: &Recorder, lm: &LibvirtMachine, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &lm.object_ref(&())).await {
        warn!(error = %e, "cannot publish event");
    }
}

/// The user data at `key` of the Secret `namespace/name` (`secret`: `None` when it does not
/// exist), or the `Ready` reason and message why not: `UserDataSecretNotFound` (a
/// VirtualMachine's, `for_vm`) or `BootstrapDataSecretNotFound` (a CAPI Machine's) naming
/// namespace/name and key; `BootstrapDataInvalid` when the key is missing.
fn user_data_of(
    secret: Option<Secret>,
    for_vm: bool,
    namespace: &str,
    name: &str,
    key: &str,
) -> std::result::Result<Vec<u8>, (&'static str, String)> {
    let Some(secret) = secret else {
        let reason = if for_vm {
            "UserDataSecretNotFound"
        } else {
            "BootstrapDataSecretNotFound"
        };
        return Err((
            reason,
            format!("Secret {namespace}/{name} (key {key:?}) not found; the VM is created once it exists"),
        ));
    };
    secret
        .data
        .and_then(|mut d| d.remove(key))
        .map(|bytes| bytes.0)
        .ok_or_else(|| {
            (
                "BootstrapDataInvalid",
                format!("Secret {namespace}/{name} has no key {key:?}"),
            )
        })
}

/// Reconciles one LibvirtMachine.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<C: Connector>(
    obj: Arc<LibvirtMachine>,
    ctx: Arc<MachineContext<C>>,
) -> Result<Action> {
    let res = reconcile_inner(&obj, &ctx).await;
    match &res {
        Ok(_) => ctx.reset_backoff(obj.uid().as_deref().unwrap_or_default()),
        Err(e) => warn!(error = %e, "reconcile failed"),
    }
    res
}

/// Error policy: exponential backoff per object (1 s … 5 min).
pub fn error_policy<C: Connector>(
    obj: Arc<LibvirtMachine>,
    _err: &Error,
    ctx: Arc<MachineContext<C>>,
) -> Action {
    Action::requeue(ctx.backoff(obj.uid().as_deref().unwrap_or_default()))
}

/// The domain uuid of a machine: the one recorded in status, else its UID.
fn domain_uuid(lm: &LibvirtMachine) -> String {
    lm.status
        .as_ref()
        .and_then(|s| s.domain_uuid.clone())
        .unwrap_or_else(|| lm.uid().unwrap_or_default())
}

/// Removes the finalizer of a machine being deleted: it is released, its Secrets are no longer
/// watched.
async fn release<C: Connector>(
    ctx: &MachineContext<C>,
    api: &Api<LibvirtMachine>,
    lm: &LibvirtMachine,
    read: &ReadSecrets<LibvirtMachine>,
) -> Result<()> {
    patch_finalizers(ctx, api, lm, false).await?;
    read.forget();
    Ok(())
}

/// Reads the user data of the owner's bootstrap source (its Secret recorded in `read` first: a
/// missing one is watched), or the `Ready` reason and message why it cannot be read yet.
async fn read_user_data<C: Connector>(
    ctx: &MachineContext<C>,
    view: &owner::OwnerView<LibvirtCluster>,
    namespace: &str,
    read: &ReadSecrets<LibvirtMachine>,
) -> Result<std::result::Result<Vec<u8>, (&'static str, String)>> {
    let BootstrapSource::Secret { name, key } = &view.bootstrap else {
        return Ok(Ok(Vec::new()));
    };
    read.record([SecretKey::new(namespace, name.clone())]);
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading bootstrap Secret {namespace}/{name}"), e))?;
    let for_vm = matches!(view.owner, owner::Owner::VirtualMachine(_));
    Ok(user_data_of(secret, for_vm, namespace, name, key))
}

async fn reconcile_inner<C: Connector>(obj: &LibvirtMachine, ctx: &MachineContext<C>) -> Result<Action> {
    // Whatever this reconcile returns, the watch then follows exactly the Secrets it read.
    let read = ReadSecrets::new(&ctx.secrets, ObjectRef::from_obj(obj));
    let namespace = obj.namespace().unwrap_or_default();
    let api: Api<LibvirtMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(lm) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube("reading LibvirtMachine", e))?
    else {
        return Ok(Action::await_change());
    };
    let deleting = lm.meta().deletion_timestamp.is_some();
    let has_finalizer = lm.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if deleting && contract::is_deleted_for_move(&lm.metadata) {
        // `clusterctl move` deletes the source objects once their copies exist on the target
        // cluster (the Cluster is paused meanwhile): the domain belongs to the copy now.
        // Release the object, never touch the domain.
        publish(
            &ctx.recorder,
            &lm,
            EventType::Normal,
            "ReleasedForMove",
            "clusterctl move deleted this object; its domain is kept for the copy on the target cluster"
                .to_owned(),
        )
        .await;
        release(ctx, &api, &lm, &read).await?;
        return Ok(Action::await_change());
    }
    let Some(owner_ref) = owner::controlling_owner(&lm.metadata) else {
        // Not ours to act on (no finalizer, no writes).
        return Ok(Action::await_change());
    };
    let view = owner::resolve(&ctx.client, &lm, owner_ref).await?;
    let generation = lm.metadata.generation;
    let mut status = lm.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let (flag, reason, message) = view.paused_condition.clone();
    condition::set(
        &mut status.conditions,
        condition::new_condition(
            condition::PAUSED,
            if flag == "True" {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason,
            message,
            generation,
            now(),
        ),
    );
    if view.paused.is_some() {
        write_status(ctx, &api, &lm, &status).await?;
        return Ok(Action::await_change());
    }
    let me = Owner {
        uid: lm.uid().unwrap_or_default(),
        namespace: namespace.clone(),
        name: lm.name_any(),
    };
    if deleting {
        return delete(ctx, &api, &lm, status, &view.infra_cluster, &me, &read).await;
    }
    if !has_finalizer {
        patch_finalizers(ctx, &api, &lm, true).await?;
    }
    let wait = |status: &mut LibvirtMachineStatus, reason: &str, message: String| {
        condition::set(
            &mut status.conditions,
            ready(ConditionStatus::False, reason, message, generation),
        );
    };
    let lvc = match &view.infra_cluster {
        InfraCluster::Ready(c) => c.clone(),
        InfraCluster::NotProvisioned(_) => {
            wait(
                &mut status,
                "WaitingForClusterInfrastructure",
                "the LibvirtCluster is not provisioned yet".into(),
            );
            write_status(ctx, &api, &lm, &status).await?;
            return Ok(Action::requeue(ctx.wait_requeue));
        }
        InfraCluster::Missing(message) => {
            wait(&mut status, "WaitingForCluster", message.clone());
            write_status(ctx, &api, &lm, &status).await?;
            return Ok(Action::requeue(ctx.wait_requeue));
        }
    };
    // Created anew with a providerID (clusterctl move, a restore): the domain exists and is
    // adopted, its bootstrap data is never needed again.
    let readopting = matches!(Phase::read(lm.status.as_ref()), Ok(p) if provision::readopts(&p, &lm.spec));
    if view.bootstrap == BootstrapSource::Pending && !readopting {
        wait(
            &mut status,
            "WaitingForBootstrapData",
            "the owner's bootstrap data Secret is not set yet".into(),
        );
        write_status(ctx, &api, &lm, &status).await?;
        return Ok(Action::requeue(ctx.wait_requeue));
    }
    let phase = match Phase::read(lm.status.as_ref()) {
        Ok(p) => p,
        Err(e) => {
            wait(&mut status, "InconsistentStatus", e.to_string());
            write_status(ctx, &api, &lm, &status).await?;
            return Ok(Action::requeue(provision::PERMANENT_RETRY));
        }
    };
    let host_specs = match hosts::resolve(&ctx.client, &lvc, &read).await? {
        Ok(h) => h,
        Err(e) => {
            wait(&mut status, e.reason, e.message);
            write_status(ctx, &api, &lm, &status).await?;
            return Ok(Action::requeue(ctx.wait_requeue));
        }
    };
    let user_data = if phase.needs_bootstrap_data() && !readopting {
        match read_user_data(ctx, &view, &namespace, &read).await? {
            Ok(bytes) => Some(bytes),
            Err((reason, message)) => {
                wait(&mut status, reason, message);
                write_status(ctx, &api, &lm, &status).await?;
                return Ok(Action::requeue(ctx.wait_requeue));
            }
        }
    } else {
        None
    };
    let hosts = hosts::connect_all(&ctx.connector, &host_specs);
    let uuid = domain_uuid(&lm);
    let input = MachineInput {
        owner: &me,
        spec: &lm.spec,
        uuid: &uuid,
        failure_domain: view.failure_domain.as_deref(),
        settings: &ctx.settings,
        power: lm.spec.power_state.unwrap_or_default(),
        shutdown_requested_at: lm
            .status
            .as_ref()
            .and_then(|s| s.provisioning.as_ref())
            .filter(|p| p.task_id.as_deref() == Some(crate::update::SHUTDOWN_TASK))
            .and_then(|p| p.task_started_at.as_ref())
            .map(|t| t.0),
    };
    match provision::provision(&hosts, &input, phase, user_data.as_deref()).await {
        Ok(step) => {
            let mut generation = generation;
            if let Some(p) = &step.phase {
                p.write(&mut status);
                status.failure_domain = p.host().map(str::to_owned);
            }
            if let Some(p) = status.provisioning.as_mut() {
                p.message.clone_from(&step.waiting);
                // A pending ACPI shutdown is remembered (forced power-off after a timeout).
                p.task_id = step
                    .shutdown_requested_at
                    .map(|_| crate::update::SHUTDOWN_TASK.to_owned());
                p.task_started_at = step.shutdown_requested_at.map(Time);
            }
            if let Some(done) = &step.provisioned {
                if lm.spec.provider_id.as_deref() != Some(done.provider_id.as_str()) {
                    let patch = serde_json::json!({"spec": {"providerID": done.provider_id}});
                    let patched = api
                        .patch(&lm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(|e| Error::kube("setting spec.providerID", e))?;
                    ctx.count_write("spec");
                    generation = patched.metadata.generation;
                    status.observed_generation = generation;
                    for c in &mut status.conditions {
                        c.observed_generation = generation;
                    }
                }
                if !done.addresses.is_empty() {
                    status.addresses.clone_from(&done.addresses);
                }
                status.initialization = Initialization::provisioned(true);
                status.power_state = Some(done.power_state);
            }
            let provisioned = step.provisioned.is_some();
            let powered_off = step
                .provisioned
                .as_ref()
                .is_some_and(|done| done.power_state == PowerState::Off);
            // Provisioned is not Ready while the domain is off (the same semantics as every
            // provider: `status.initialization.provisioned` stays true, `Ready` says why not).
            let (ready_status, reason, message) = if powered_off {
                let domain = format!(
                    "domain {}",
                    crate::desired::domain_name(&lm.namespace().unwrap_or_default(), &lm.name_any())
                );
                (
                    ConditionStatus::False,
                    condition::POWERED_OFF,
                    condition::powered_off_message(&domain, lm.spec.power_state),
                )
            } else {
                (
                    ConditionStatus::from(provisioned),
                    step.phase.as_ref().map_or("Unknown", Phase::reason),
                    step.waiting.clone().unwrap_or_default(),
                )
            };
            condition::set(
                &mut status.conditions,
                ready(ready_status, reason, message, generation),
            );
            write_status(ctx, &api, &lm, &status).await?;
            for (reason, note) in step.events {
                info!(reason, %note, "transition");
                publish(&ctx.recorder, &lm, EventType::Normal, reason, note).await;
            }
            Ok(Action::requeue(step.requeue.max(Duration::from_millis(50))))
        }
        Err(StepError::Permanent { reason, message }) => {
            let changed = condition::set(
                &mut status.conditions,
                ready(ConditionStatus::False, reason, message.clone(), generation),
            );
            write_status(ctx, &api, &lm, &status).await?;
            if changed {
                publish(&ctx.recorder, &lm, EventType::Warning, reason, message).await;
            }
            Ok(Action::requeue(provision::PERMANENT_RETRY))
        }
        Err(e) => {
            condition::set(
                &mut status.conditions,
                ready(ConditionStatus::False, e.reason(), e.to_string(), generation),
            );
            write_status(ctx, &api, &lm, &status).await?;
            Err(e.into())
        }
    }
}

async fn delete<C: Connector>(
    ctx: &MachineContext<C>,
    api: &Api<LibvirtMachine>,
    lm: &LibvirtMachine,
    mut status: LibvirtMachineStatus,
    infra: &InfraCluster<LibvirtCluster>,
    me: &Owner,
    read: &ReadSecrets<LibvirtMachine>,
) -> Result<Action> {
    let generation = lm.metadata.generation;
    // Created anew (clusterctl move, a restore) and deleted before its domain was adopted: the
    // providerID names the domain. It is deleted only if it already carries this object's UID;
    // one created for an earlier object of this name is left in place (never re-marked here).
    // A providerID that does not parse names no domain: nothing to delete.
    let adopting = match lm.status.as_ref().and_then(|s| s.node.as_ref()) {
        Some(_) => None,
        None => lm
            .spec
            .provider_id
            .as_deref()
            .and_then(readopt::ProviderId::parse),
    };
    // Never placed: nothing exists on any host.
    let Some(host) = lm
        .status
        .as_ref()
        .and_then(|s| s.node.clone())
        .or_else(|| adopting.as_ref().map(|p| p.host.clone()))
    else {
        release(ctx, api, lm, read).await?;
        return Ok(Action::await_change());
    };
    let specs = match infra.object() {
        Some(lvc) => hosts::resolve(&ctx.client, lvc, read).await?,
        None => Err(hosts::HostsError {
            reason: "DeletionFailed",
            message: "the LibvirtCluster is gone: cannot reach the libvirt host to delete the domain".into(),
        }),
    };
    let spec = match specs {
        Ok(specs) => specs.into_iter().find(|h| h.name == host),
        Err(e) => {
            condition::set(
                &mut status.conditions,
                ready(ConditionStatus::False, "DeletionFailed", e.message, generation),
            );
            write_status(ctx, api, lm, &status).await?;
            return Ok(Action::requeue(provision::PERMANENT_RETRY));
        }
    };
    let Some(spec) = spec else {
        if adopting.is_some() {
            // Never adopted, and its providerID names a host the cluster does not have.
            publish(
                &ctx.recorder,
                lm,
                EventType::Normal,
                "Deleted",
                format!(
                    "spec.providerID names host {host:?}, which is not a failure domain of the LibvirtCluster: nothing deleted"
                ),
            )
            .await;
            release(ctx, api, lm, read).await?;
            return Ok(Action::await_change());
        }
        condition::set(
            &mut status.conditions,
            ready(
                ConditionStatus::False,
                "DeletionFailed",
                format!("host {host:?} is no longer a failure domain of the LibvirtCluster"),
                generation,
            ),
        );
        write_status(ctx, api, lm, &status).await?;
        return Ok(Action::requeue(provision::PERMANENT_RETRY));
    };
    let hv = ctx.connector.connect(&spec.uri);
    let mut uuid = domain_uuid(lm);
    if let Some(id) = &adopting {
        let released = match readopt::on_deletion(&*hv, me, &host, &id.uuid).await {
            Ok(readopt::OnDeletion::Delete(d)) => {
                uuid = d.uuid;
                None
            }
            Ok(readopt::OnDeletion::LeftInPlace(note)) => Some(("VMLeftInPlace", note)),
            Ok(readopt::OnDeletion::Nothing(note)) => Some(("Deleted", note)),
            Err(e) => {
                condition::set(
                    &mut status.conditions,
                    ready(ConditionStatus::False, "Deleting", e.to_string(), generation),
                );
                write_status(ctx, api, lm, &status).await?;
                return Err(e.into());
            }
        };
        if let Some((reason, note)) = released {
            // Nothing of this object's on the host: release it, touch nothing.
            publish(&ctx.recorder, lm, EventType::Normal, reason, note).await;
            release(ctx, api, lm, read).await?;
            return Ok(Action::await_change());
        }
    }
    match provision::delete(&*hv, me, &lm.spec, &uuid).await {
        Ok(note) => {
            publish(&ctx.recorder, lm, EventType::Normal, "Deleted", note).await;
            release(ctx, api, lm, read).await?;
            Ok(Action::await_change())
        }
        Err(e) => {
            let p = status.provisioning.get_or_insert_with(Default::default);
            p.state = banlieue_api::common::ProvisioningState::Deleting;
            p.message = Some(e.to_string());
            condition::set(
                &mut status.conditions,
                ready(ConditionStatus::False, "Deleting", e.to_string(), generation),
            );
            write_status(ctx, api, lm, &status).await?;
            Err(e.into())
        }
    }
}

fn machine_to_infra(machine: Machine) -> Option<ObjectRef<LibvirtMachine>> {
    let r = &machine.spec.infrastructure_ref;
    (r.kind == "LibvirtMachine" && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
        .then(|| ObjectRef::new(&r.name).within(&machine.namespace().unwrap_or_default()))
}

/// Runs the LibvirtMachine controller until `shutdown`.
pub async fn run<C: Connector>(
    ctx: Arc<MachineContext<C>>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
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
    let controller = Controller::new(
        api::<LibvirtMachine>(&client, namespace),
        watcher::Config::default(),
    );
    let store = controller.store();
    let store2 = store.clone();
    // A Cluster change (pause, infrastructure) concerns its labelled machines; an infra
    // cluster change (provisioned) concerns every machine of its namespace.
    let cluster_to_machines = move |cluster: Cluster| {
        let (name, ns) = (cluster.name_any(), cluster.namespace());
        store
            .state()
            .into_iter()
            .filter(|m| m.namespace() == ns && contract::cluster_name(&m.metadata) == Some(name.as_str()))
            .map(|m| ObjectRef::from_obj(&*m))
            .collect::<Vec<_>>()
    };
    let lvc_to_machines = move |lvc: LibvirtCluster| {
        let ns = lvc.namespace();
        store2
            .state()
            .into_iter()
            .filter(|m| m.namespace() == ns)
            .map(|m| ObjectRef::from_obj(&*m))
            .collect::<Vec<_>>()
    };
    let vm_to_machine = |vm: VirtualMachine| {
        let ns = vm.namespace().unwrap_or_default();
        vm.status
            .as_ref()
            .and_then(|s| s.infrastructure_ref.as_ref())
            .filter(|r| r.kind == "LibvirtMachine")
            .map(|r| ObjectRef::new(&r.name).within(&ns))
    };
    controller
        .watches(
            api::<Machine>(&client, namespace),
            watcher::Config::default(),
            machine_to_infra,
        )
        .watches(
            api::<Cluster>(&client, namespace),
            watcher::Config::default(),
            cluster_to_machines,
        )
        .watches(
            api::<LibvirtCluster>(&client, namespace),
            watcher::Config::default(),
            lvc_to_machines,
        )
        .watches(
            api::<VirtualMachine>(&client, namespace),
            watcher::Config::default(),
            vm_to_machine,
        )
        // A created or fixed credentials or user-data Secret concerns the machines that read it.
        .watches(
            secrets_api(client.clone(), namespace),
            watcher::Config::default(),
            ctx.secrets.mapper(),
        )
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            |obj, ctx: Arc<MachineContext<C>>| {
                let metrics = ctx.metrics.clone();
                async move {
                    let reconciled = reconcile(obj, ctx);
                    metrics
                        .observe(METRICS_NAME, Error::metric_label, reconciled)
                        .await
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}

/// The `controller` label of this controller's metrics.
pub const METRICS_NAME: &str = "libvirtmachine";

#[cfg(test)]
mod user_data_tests {
    use super::*;

    #[test]
    fn a_missing_secret_and_a_missing_key_are_told_apart() {
        let (reason, message) = user_data_of(None, true, "team-a", "web-user-data", "userdata").unwrap_err();
        assert_eq!(reason, "UserDataSecretNotFound");
        assert!(
            message.contains("team-a/web-user-data") && message.contains("\"userdata\""),
            "{message}"
        );
        assert_eq!(
            user_data_of(None, false, "ns", "m1-bootstrap", "value")
                .unwrap_err()
                .0,
            "BootstrapDataSecretNotFound"
        );
        // A VirtualMachine's user data under the default key is still user data.
        assert_eq!(
            user_data_of(None, true, "ns", "web-user-data", "value")
                .unwrap_err()
                .0,
            "UserDataSecretNotFound"
        );
        let empty = Secret::default();
        assert_eq!(
            user_data_of(Some(empty), true, "ns", "s", "userdata")
                .unwrap_err()
                .0,
            "BootstrapDataInvalid"
        );
        let full = Secret {
            data: Some(
                [(
                    "userdata".to_owned(),
                    k8s_openapi::ByteString(b"#cloud-config".to_vec()),
                )]
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            user_data_of(Some(full), true, "ns", "s", "userdata").unwrap(),
            b"#cloud-config"
        );
    }
}
