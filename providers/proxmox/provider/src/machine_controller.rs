//! The ProxmoxMachine reconciler (CAPI InfraMachine contract).
//!
//! Order of one reconcile (CAPD's, see `CAPI-CONTRACT.md`): read the object fresh from the
//! apiserver → no owner Machine: nothing → fetch the Machine and the Cluster → `Paused`
//! condition, stop if paused (deletion included) → deletion → finalizer → wait for the
//! Cluster's infrastructure → wait for `dataSecretName` → one provisioning step
//! ([`crate::provision`]) → `spec.providerID` once provisioned → status by server-side apply on
//! `/status` with one field manager, only when it changed → an Event per transition.
//!
//! The object is read with a GET rather than from the watch cache so that a step never runs on
//! a status older than the one the previous step wrote (the cache may lag behind our own write;
//! running the VMID allocation twice on a stale status could clone twice).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_api::common::Initialization;
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxMachine, ProxmoxMachineStatus};
use banlieue_capi::bootstrap::{BOOTSTRAP_VALUE_KEY, BootstrapData, BootstrapFormat};
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

use crate::credentials::{Connector, read_connection};
use crate::error::{Error, Result};
use banlieue_provider_kit::owner::{self, BootstrapSource, InfraCluster, OwnerView};
use crate::phase::Phase;
use crate::provision::{self, DeleteStep, MachineInput, StepError, VmidReservations};
use crate::readopt;
use banlieue_provider_runtime::secret_watch::{SecretIndex, SecretKey};

/// Finalizer of ProxmoxMachines (and ProxmoxClusters).
pub const FINALIZER: &str = "infrastructure.banlieue.io/proxmox";
/// Field manager of every write of this provider.
pub const FIELD_MANAGER: &str = "banlieue-proxmox";
/// Condition type: a provisioned VM matches the spec (power state, CPU, memory, disks,
/// networks, tags); False with the action in progress (`PoweringOff`, `Reconfiguring`, …).
pub const VM_UP_TO_DATE: &str = "VMUpToDate";
/// Requeue while waiting for an IPAM provider to allocate a claimed address.
pub const IPAM_POLL: Duration = Duration::from_secs(2);
/// Requeue while waiting on something CAPI does (cluster infrastructure, bootstrap data).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(15);

/// Shared state of the ProxmoxMachine controller.
pub struct MachineContext<C: Connector> {
    /// Kubernetes client.
    pub client: kube::Client,
    /// Builds hypervisor handles from ProxmoxCluster settings.
    pub connector: C,
    /// In-process VMID reservations.
    pub reservations: VmidReservations,
    /// Storage (content `iso`) for seed ISOs.
    pub seed_storage: String,
    /// Event recorder.
    pub recorder: Recorder,
    /// Consecutive transient failures per object UID (for backoff).
    failures: Mutex<HashMap<String, u32>>,
    /// Counters for `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// How often discovery is asked whether Cluster API got installed, while it is not
    /// ([`banlieue_provider_kit::capi`]).
    pub capi_discovery_interval: Duration,
    /// The user-data / bootstrap Secret each not yet provisioned machine reads, for the Secret
    /// watch.
    pub user_data_secrets: SecretIndex<ProxmoxMachine>,
}

impl<C: Connector> MachineContext<C> {
    /// A context reporting Events as `reporter`.
    pub fn new(client: kube::Client, connector: C, seed_storage: impl Into<String>, reporter: &str) -> Self {
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
            reservations: VmidReservations::default(),
            seed_storage: seed_storage.into(),
            recorder,
            failures: Mutex::new(HashMap::new()),
            metrics: crate::metrics::Metrics::default(),
            capi_discovery_interval: banlieue_provider_kit::capi::CAPI_DISCOVERY_INTERVAL,
            user_data_secrets: SecretIndex::default(),
        }
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

/// Builds the `Ready` condition.
fn ready(
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> condition::Condition {
    condition::new_condition(condition::READY, status, reason, message, generation, now())
}

/// Sets the `Paused` condition per the contract (from the owner view).
fn set_paused(status: &mut ProxmoxMachineStatus, view: &OwnerView<ProxmoxCluster>, pm: &ProxmoxMachine) {
    let (flag, reason, message) = &view.paused_condition;
    let flag = if *flag == "True" {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    condition::set(
        &mut status.conditions,
        condition::new_condition(
            condition::PAUSED,
            flag,
            reason,
            message.clone(),
            pm.metadata.generation,
            now(),
        ),
    );
}

/// Reads the user data the owner view points at: a CAPI bootstrap Secret (`value` + `format`),
/// a VirtualMachine's user-data Secret key (cloud-config), or nothing (an empty `user-data`).
async fn read_bootstrap<C: Connector>(
    ctx: &MachineContext<C>,
    namespace: &str,
    source: &BootstrapSource,
) -> Result<Option<BootstrapData>> {
    let (name, key) = match source {
        BootstrapSource::Pending => return Ok(None),
        BootstrapSource::Empty => {
            return Ok(Some(BootstrapData {
                format: BootstrapFormat::CloudConfig,
                value: Vec::new(),
            }));
        }
        BootstrapSource::Secret { name, key } => (name, key),
    };
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading bootstrap Secret {name}"), e))?
        .ok_or_else(|| Error::Missing {
            kind: "Secret",
            namespace: namespace.to_owned(),
            name: name.clone(),
        })?;
    if key == BOOTSTRAP_VALUE_KEY {
        return BootstrapData::from_secret(&secret)
            .map(Some)
            .map_err(|e| Error::Bootstrap(e.to_string()));
    }
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| v.clone().into_bytes())
        })
        .ok_or_else(|| Error::Bootstrap(format!("Secret {namespace}/{name} has no key {key:?}")))?;
    Ok(Some(BootstrapData {
        format: BootstrapFormat::CloudConfig,
        value,
    }))
}

/// Whether the user data must be readable before this reconcile calls Proxmox (inputs before
/// side effects): while provisioning has not cloned anything yet (node, VMID, clone) and when
/// the seed is built (Configure). Not for a machine created anew with a providerID that
/// re-adopts its VM (clusterctl move, a restore), nor once the clone runs (its later phases
/// never read it).
pub fn user_data_needed(phase: &Phase, has_provider_id: bool) -> bool {
    match phase {
        Phase::SelectNode => !has_provider_id,
        Phase::AllocateVmid { .. } | Phase::Clone(_) => true,
        other => other.needs_bootstrap_data(),
    }
}

/// The `Ready` reason, message and requeue for bootstrap data that cannot be read: the Secret
/// is missing (`UserDataSecretNotFound` for a VirtualMachine's user data (`for_vm`),
/// `BootstrapDataSecretNotFound` for a CAPI Machine's bootstrap Secret; both name
/// namespace/name and key; a short requeue besides the Secret watch), unreadable (`UserDataSecretUnreadable`, the
/// API error) or unusable (`BootstrapDataInvalid`: missing key, unknown format).
fn bootstrap_unusable(
    namespace: &str,
    source: &BootstrapSource,
    for_vm: bool,
    err: &Error,
) -> (&'static str, String, Duration) {
    let (name, key) = match source {
        BootstrapSource::Secret { name, key } => (name.as_str(), key.as_str()),
        BootstrapSource::Empty | BootstrapSource::Pending => ("", ""),
    };
    match err {
        Error::Missing { .. } => (
            if for_vm {
                "UserDataSecretNotFound"
            } else {
                "BootstrapDataSecretNotFound"
            },
            format!("Secret {namespace}/{name} (key {key:?}) not found; the VM is created once it exists"),
            WAIT_REQUEUE,
        ),
        Error::Bootstrap(message) => (
            "BootstrapDataInvalid",
            message.clone(),
            provision::PERMANENT_RETRY,
        ),
        other => (
            "UserDataSecretUnreadable",
            format!("Secret {namespace}/{name} (key {key:?}): {other}"),
            WAIT_REQUEUE,
        ),
    }
}

/// Applies `new` to `/status` if it differs from the object's; returns whether it wrote.
async fn write_status<C: Connector>(
    ctx: &MachineContext<C>,
    api: &Api<ProxmoxMachine>,
    pm: &ProxmoxMachine,
    new: &ProxmoxMachineStatus,
) -> Result<bool> {
    let old = pm.status.clone().unwrap_or_default();
    if old == *new {
        return Ok(false);
    }
    let patch = serde_json::json!({
        "apiVersion": ProxmoxMachine::api_version(&()),
        "kind": ProxmoxMachine::kind(&()),
        "status": new,
    });
    api.patch_status(
        &pm.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing ProxmoxMachine status", e))?;
    ctx.metrics.count_write("status");
    Ok(true)
}

async fn patch_finalizers<C: Connector>(
    ctx: &MachineContext<C>,
    api: &Api<ProxmoxMachine>,
    pm: &ProxmoxMachine,
    add: bool,
) -> Result<()> {
    let mut finalizers = pm.finalizers().to_vec();
    if add {
        finalizers.push(FINALIZER.to_owned());
    } else {
        finalizers.retain(|f| f != FINALIZER);
    }
    // Guarded by resourceVersion: a concurrent change makes this fail and the reconcile retries.
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": pm.resource_version()}
    });
    api.patch(&pm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube("updating ProxmoxMachine finalizers", e))?;
    ctx.metrics.count_write("finalizer");
    Ok(())
}

async fn publish(recorder: &Recorder, pm: &ProxmoxMachine, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &pm.object_ref(&())).await {
        warn!(error = %e, "cannot publish event");
    }
}

/// Reconciles one ProxmoxMachine.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<C: Connector>(
    obj: Arc<ProxmoxMachine>,
    ctx: Arc<MachineContext<C>>,
) -> Result<Action> {
    let started = std::time::Instant::now();
    let res = reconcile_inner(&obj, &ctx).await;
    ctx.metrics.record(
        "proxmoxmachine",
        started.elapsed(),
        res.as_ref().err().map(Error::metric_label),
    );
    match &res {
        Ok(_) => ctx.reset_backoff(obj.uid().as_deref().unwrap_or_default()),
        Err(e) => warn!(error = %e, "reconcile failed"),
    }
    res
}

/// The error policy: back off exponentially per object (1 s … 5 min).
pub fn error_policy<C: Connector>(
    obj: Arc<ProxmoxMachine>,
    _err: &Error,
    ctx: Arc<MachineContext<C>>,
) -> Action {
    Action::requeue(ctx.backoff(obj.uid().as_deref().unwrap_or_default()))
}

async fn reconcile_inner<C: Connector>(obj: &ProxmoxMachine, ctx: &MachineContext<C>) -> Result<Action> {
    let namespace = obj.namespace().unwrap_or_default();
    let api: Api<ProxmoxMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(pm) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube("reading ProxmoxMachine", e))?
    else {
        return Ok(Action::await_change());
    };
    let uid = pm.uid().unwrap_or_default();
    let deleting = pm.meta().deletion_timestamp.is_some();
    let has_finalizer = pm.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if deleting && contract::is_deleted_for_move(&pm.metadata) {
        // `clusterctl move` deletes the source objects once their copies exist on the target
        // cluster: the VM belongs to the copy now. Release the object, never touch the VM.
        publish(
            &ctx.recorder,
            &pm,
            EventType::Normal,
            "ReleasedForMove",
            "clusterctl move deleted this object; its VM is kept for the copy on the target cluster"
                .to_owned(),
        )
        .await;
        patch_finalizers(ctx, &api, &pm, false).await?;
        return Ok(Action::await_change());
    }

    // The controlling owner (a CAPI Machine or a banlieue VirtualMachine), resolved into one
    // view; everything after this is the same for both. No such owner: leave the object alone.
    let Some(owner) = owner::controlling_owner(&pm.metadata) else {
        return Ok(Action::await_change());
    };
    let view = owner::resolve(&ctx.client, &pm, owner).await?;
    if !view.owner_exists && !deleting {
        // CAPI has not created (or has deleted) the Machine; a deleted VirtualMachine's machine
        // is deleted by the garbage collector. Nothing to do until then.
        return Ok(Action::await_change());
    }
    let mut status = pm.status.clone().unwrap_or_default();
    let mut generation = pm.metadata.generation;
    status.observed_generation = generation;
    set_paused(&mut status, &view, &pm);
    if view.paused.is_some() {
        // Paused: neither provision nor delete (clusterctl move deletes paused source objects).
        write_status(ctx, &api, &pm, &status).await?;
        return Ok(Action::await_change());
    }
    let pxc = match &view.infra_cluster {
        InfraCluster::Missing(message) => {
            if deleting && pm.status.as_ref().and_then(|s| s.vmid).is_none() {
                patch_finalizers(ctx, &api, &pm, false).await?;
                return Ok(Action::await_change());
            }
            if deleting {
                return delete(ctx, &api, &pm, status, None).await;
            }
            condition::set(
                &mut status.conditions,
                ready(
                    ConditionStatus::False,
                    "WaitingForCluster",
                    message.clone(),
                    generation,
                ),
            );
            write_status(ctx, &api, &pm, &status).await?;
            return Ok(Action::requeue(WAIT_REQUEUE));
        }
        InfraCluster::NotProvisioned(pxc) | InfraCluster::Ready(pxc) => pxc.as_ref().clone(),
    };
    if deleting {
        return delete(ctx, &api, &pm, status, Some(&pxc)).await;
    }
    if !has_finalizer {
        patch_finalizers(ctx, &api, &pm, true).await?;
    }
    if matches!(view.infra_cluster, InfraCluster::NotProvisioned(_)) {
        let message = match &view.owner {
            owner::Owner::Machine(_) => "the Cluster's infrastructure is not provisioned yet".to_owned(),
            owner::Owner::VirtualMachine(_) => format!(
                "ProxmoxCluster {} (of Provider {}) is not provisioned yet",
                pxc.name_any(),
                pm.spec
                    .provider_ref
                    .as_ref()
                    .map(|p| p.name.as_str())
                    .unwrap_or_default()
            ),
        };
        condition::set(
            &mut status.conditions,
            ready(
                ConditionStatus::False,
                "WaitingForClusterInfrastructure",
                message,
                generation,
            ),
        );
        write_status(ctx, &api, &pm, &status).await?;
        return Ok(Action::requeue(WAIT_REQUEUE));
    }
    if view.bootstrap == BootstrapSource::Pending {
        condition::set(
            &mut status.conditions,
            ready(
                ConditionStatus::False,
                "WaitingForBootstrapData",
                "the Machine's spec.bootstrap.dataSecretName is not set yet",
                generation,
            ),
        );
        write_status(ctx, &api, &pm, &status).await?;
        return Ok(Action::requeue(WAIT_REQUEUE));
    }

    let phase = match Phase::read(pm.status.as_ref()) {
        Ok(phase) => phase,
        Err(e) => {
            condition::set(
                &mut status.conditions,
                ready(
                    ConditionStatus::False,
                    "InconsistentStatus",
                    e.to_string(),
                    generation,
                ),
            );
            write_status(ctx, &api, &pm, &status).await?;
            return Ok(Action::requeue(provision::PERMANENT_RETRY));
        }
    };
    let (hv, allowed_nodes) = match hypervisor(ctx, &pxc).await {
        Ok(found) => found,
        Err(e @ (Error::Credentials(_) | Error::Provider { .. })) => {
            let reason = match &e {
                Error::Provider { reason, .. } => reason,
                _ => "ProxmoxCredentialsInvalid",
            };
            let message = match e {
                Error::Provider { message, .. } | Error::Credentials(message) => message,
                _ => String::new(),
            };
            condition::set(
                &mut status.conditions,
                ready(ConditionStatus::False, reason, message, generation),
            );
            write_status(ctx, &api, &pm, &status).await?;
            return Ok(Action::requeue(provision::PERMANENT_RETRY));
        }
        Err(e) => return Err(e),
    };
    // Inputs before side effects: until the VM is provisioned, the bootstrap / user data must
    // be readable before any Proxmox call (no clone while its Secret is missing); the Secret
    // watch brings the machine back within seconds once it appears.
    let needs_user_data = user_data_needed(&phase, pm.spec.provider_id.is_some());
    let user_data_secret = match &view.bootstrap {
        BootstrapSource::Secret { name, .. } if needs_user_data => {
            Some(SecretKey::new(namespace.clone(), name.clone()))
        }
        _ => None,
    };
    ctx.user_data_secrets
        .set(ObjectRef::from_obj(&pm), user_data_secret);
    let bootstrap = if !needs_user_data {
        None
    } else {
        match read_bootstrap(ctx, &namespace, &view.bootstrap).await {
            Ok(data) => data,
            Err(e) => {
                let for_vm = matches!(view.owner, owner::Owner::VirtualMachine(_));
                let (reason, message, retry) = bootstrap_unusable(&namespace, &view.bootstrap, for_vm, &e);
                condition::set(
                    &mut status.conditions,
                    ready(ConditionStatus::False, reason, message, generation),
                );
                write_status(ctx, &api, &pm, &status).await?;
                return match (e, retry) {
                    (e @ Error::Kube { .. }, _) => Err(e),
                    (_, retry) => Ok(Action::requeue(retry)),
                };
            }
        }
    };
    // Addresses from IPAM pools: claims are created as soon as provisioning starts; the seed
    // (built in Configure) waits for their allocation.
    let mut pool_addresses = crate::ipam::PoolAddresses::new();
    if !phase.is_provisioned() && !crate::ipam::pool_requests(&pm.spec).is_empty() {
        let cluster_name = contract::cluster_name(&pm.metadata)
            .map(str::to_owned)
            .unwrap_or_else(|| pxc.name_any());
        match crate::ipam::resolve(&ctx.client, &pm, &cluster_name).await {
            Ok(crate::ipam::PoolState::Ready(found)) => pool_addresses = found,
            Ok(crate::ipam::PoolState::Waiting(message)) if phase.needs_bootstrap_data() => {
                condition::set(
                    &mut status.conditions,
                    ready(ConditionStatus::False, "WaitingForIPAddress", message, generation),
                );
                write_status(ctx, &api, &pm, &status).await?;
                return Ok(Action::requeue(IPAM_POLL));
            }
            Ok(crate::ipam::PoolState::Waiting(_)) => {}
            Err(Error::Bootstrap(message)) => {
                condition::set(
                    &mut status.conditions,
                    ready(ConditionStatus::False, "IPAddressInvalid", message, generation),
                );
                write_status(ctx, &api, &pm, &status).await?;
                return Ok(Action::requeue(provision::PERMANENT_RETRY));
            }
            Err(e) => {
                // e.g. a 403 on the claims: say so instead of showing an older wait reason.
                condition::set(
                    &mut status.conditions,
                    ready(
                        ConditionStatus::False,
                        "IPAddressClaimFailed",
                        e.to_string(),
                        generation,
                    ),
                );
                write_status(ctx, &api, &pm, &status).await?;
                return Err(e);
            }
        }
    }
    let input = MachineInput {
        uid: &uid,
        namespace: &namespace,
        name: &pm.name_any(),
        spec: &pm.spec,
        failure_domain: view.failure_domain.as_deref(),
        cluster_allowed_nodes: &allowed_nodes,
        cluster_vmid_range: pxc.spec.vmid_range.as_ref(),
        seed_storage: &ctx.seed_storage,
        pool_addresses: &pool_addresses,
    };
    // Once provisioned, day-2 problems (a failed reconfiguration) go to `VMUpToDate`; `Ready`
    // is True while the VM exists and runs (False, `PoweredOff`, while it is off).
    let was_provisioned = phase.is_provisioned();
    match provision::provision_step(&hv, &input, phase, bootstrap.as_ref(), &ctx.reservations).await {
        Ok(step) => {
            step.phase.write(&mut status);
            if let Some(p) = status.provisioning.as_mut() {
                p.message.clone_from(&step.waiting);
            }
            if let Some(loc) = step.phase.location() {
                status.failure_domain = Some(loc.node.clone());
            }
            if let Some(done) = &step.provisioned {
                if pm.spec.provider_id.as_deref() != Some(done.provider_id.as_str()) {
                    let patch = serde_json::json!({"spec": {"providerID": done.provider_id}});
                    let patched = api
                        .patch(&pm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(|e| Error::kube("setting spec.providerID", e))?;
                    ctx.metrics.count_write("spec");
                    // The spec change bumped the generation: describe the new one, or the next
                    // reconcile would write the status again just for observedGeneration.
                    generation = patched.metadata.generation;
                    status.observed_generation = generation;
                    for c in &mut status.conditions {
                        c.observed_generation = generation;
                    }
                }
                status.addresses.clone_from(&done.addresses);
                status.initialization = Initialization::provisioned(true);
            }
            if let Some(power) = step.power {
                status.power_state = Some(power);
            }
            if let Some(up) = &step.up_to_date {
                condition::set(
                    &mut status.conditions,
                    condition::new_condition(
                        VM_UP_TO_DATE,
                        ConditionStatus::from(up.status),
                        up.reason,
                        up.message.clone(),
                        generation,
                        now(),
                    ),
                );
            }
            let provisioned = step.phase.is_provisioned();
            // Provisioned is not Ready while the VM is powered off (crate::update::provisioned_ready).
            let (flag, reason, message) = match step.phase.location() {
                Some(loc) if provisioned => {
                    let (ok, reason, message) = crate::update::provisioned_ready(
                        loc.vmid,
                        crate::update::desired_power(&pm.spec),
                        status.power_state,
                    );
                    (ConditionStatus::from(ok), reason, message)
                }
                _ => (
                    ConditionStatus::False,
                    step.phase.reason(),
                    step.waiting.clone().unwrap_or_default(),
                ),
            };
            condition::set(&mut status.conditions, ready(flag, reason, message, generation));
            write_status(ctx, &api, &pm, &status).await?;
            if let Some((reason, note)) = step.event {
                info!(reason, %note, "transition");
                publish(&ctx.recorder, &pm, EventType::Normal, reason, note).await;
            }
            Ok(if provisioned && step.requeue >= provision::RESYNC {
                Action::requeue(step.requeue)
            } else {
                Action::requeue(step.requeue.max(Duration::from_millis(50)))
            })
        }
        Err(StepError::Permanent { reason, message }) => {
            let condition = if was_provisioned && reason != "VMNotFound" {
                condition::new_condition(
                    VM_UP_TO_DATE,
                    ConditionStatus::False,
                    reason,
                    message.clone(),
                    generation,
                    now(),
                )
            } else {
                ready(ConditionStatus::False, reason, message.clone(), generation)
            };
            let changed = condition::set(&mut status.conditions, condition);
            write_status(ctx, &api, &pm, &status).await?;
            if changed {
                publish(&ctx.recorder, &pm, EventType::Warning, reason, message).await;
            }
            Ok(Action::requeue(provision::PERMANENT_RETRY))
        }
        Err(e) => {
            let condition = if was_provisioned {
                condition::new_condition(
                    VM_UP_TO_DATE,
                    ConditionStatus::False,
                    e.reason(),
                    e.to_string(),
                    generation,
                    now(),
                )
            } else {
                ready(ConditionStatus::False, e.reason(), e.to_string(), generation)
            };
            condition::set(&mut status.conditions, condition);
            write_status(ctx, &api, &pm, &status).await?;
            Err(e.into())
        }
    }
}

/// A hypervisor handle for the ProxmoxCluster, and the nodes machines may use.
async fn hypervisor<C: Connector>(
    ctx: &MachineContext<C>,
    pxc: &ProxmoxCluster,
) -> Result<(C::Hv, Vec<String>)> {
    let connection = read_connection(&ctx.client, pxc).await?;
    let key = format!("{}/{}", pxc.namespace().unwrap_or_default(), pxc.name_any());
    Ok((
        ctx.connector.connect(&key, &connection)?,
        connection.allowed_nodes,
    ))
}

async fn delete<C: Connector>(
    ctx: &MachineContext<C>,
    api: &Api<ProxmoxMachine>,
    pm: &ProxmoxMachine,
    mut status: ProxmoxMachineStatus,
    pxc: Option<&ProxmoxCluster>,
) -> Result<Action> {
    let uid = pm.uid().unwrap_or_default();
    let generation = pm.metadata.generation;
    let Some(pxc) = pxc else {
        if pm.status.as_ref().and_then(|s| s.vmid).is_none() {
            patch_finalizers(ctx, api, pm, false).await?;
            return Ok(Action::await_change());
        }
        condition::set(
            &mut status.conditions,
            ready(
                ConditionStatus::False,
                "DeletionFailed",
                "the ProxmoxCluster is gone: cannot reach Proxmox to delete the VM",
                generation,
            ),
        );
        write_status(ctx, api, pm, &status).await?;
        return Ok(Action::requeue(provision::PERMANENT_RETRY));
    };
    let (hv, _) = hypervisor(ctx, pxc).await?;
    if pm.status.as_ref().and_then(|s| s.vmid).is_none()
        && let Some(provider_id) = pm.spec.provider_id.as_deref()
    {
        // Created anew (clusterctl move, restore) and deleted before its VM was adopted. A VM
        // already marked for this object is deleted; one still marked for an earlier object of
        // this name is left alone (that object may still exist elsewhere: a leaked VM can be
        // deleted by hand, a deleted one cannot come back).
        let name = pm.name_any();
        let owner = readopt::Owner {
            uid: &uid,
            namespace: &pm.namespace().unwrap_or_default(),
            name: &name,
        };
        let found = match readopt::find(&hv, owner, provider_id).await {
            Ok(found) => found,
            // An unparsable providerID names no VM: nothing to delete.
            Err(StepError::Permanent { .. }) => readopt::Found::Missing,
            Err(e) => return Err(e.into()),
        };
        match found {
            readopt::Found::Owned(loc) => {
                Phase::Provisioned(loc).write(&mut status);
                write_status(ctx, api, pm, &status).await?;
                return Ok(Action::requeue(Duration::from_millis(100)));
            }
            readopt::Found::Remark(loc, _) | readopt::Found::Foreign(loc, _) => {
                let note = format!(
                    "VM {} on {} has this machine's providerID but is marked for another object (an earlier object of this name, or its copy); left untouched: delete it by hand if it is no longer wanted",
                    loc.vmid, loc.node
                );
                publish(&ctx.recorder, pm, EventType::Normal, "VMLeftInPlace", note).await;
                patch_finalizers(ctx, api, pm, false).await?;
                return Ok(Action::await_change());
            }
            readopt::Found::Missing => {}
        }
    }
    match provision::delete_step(
        &hv,
        &uid,
        &ctx.seed_storage,
        pm.status.as_ref(),
        &ctx.reservations,
    )
    .await?
    {
        DeleteStep::Gone { note } => {
            publish(&ctx.recorder, pm, EventType::Normal, "Deleted", note).await;
            patch_finalizers(ctx, api, pm, false).await?;
            Ok(Action::await_change())
        }
        DeleteStep::InProgress {
            state,
            task,
            requeue,
            message,
        } => {
            let provisioning = status.provisioning.get_or_insert_with(Default::default);
            let task_id = task.map(|t| t.to_string());
            if provisioning.task_id != task_id {
                provisioning.task_started_at = None;
            }
            provisioning.state = state;
            provisioning.task_id = task_id;
            provisioning.message = Some(message.clone());
            condition::set(
                &mut status.conditions,
                ready(ConditionStatus::False, "Deleting", message, generation),
            );
            write_status(ctx, api, pm, &status).await?;
            Ok(Action::requeue(requeue))
        }
    }
}

/// Maps a Machine to the ProxmoxMachine it references.
fn machine_to_infra(machine: Machine) -> Option<ObjectRef<ProxmoxMachine>> {
    let r = &machine.spec.infrastructure_ref;
    (r.kind == "ProxmoxMachine" && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
        .then(|| ObjectRef::new(&r.name).within(&machine.namespace().unwrap_or_default()))
}

/// Runs the ProxmoxMachine controller until `shutdown`; restarted with CAPI watches when
/// Cluster API gets installed meanwhile ([`banlieue_provider_kit::capi`]).
pub async fn run<C: Connector>(
    ctx: Arc<MachineContext<C>>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    banlieue_provider_kit::capi::run_until_shutdown(
        ctx.client.clone(),
        "proxmoxmachine",
        ctx.capi_discovery_interval,
        shutdown,
        |capi, stop| run_once(ctx.clone(), namespace, concurrency, capi, stop),
    )
    .await;
}

/// One run of the ProxmoxMachine controller, with Machine and Cluster watches when `capi`.
async fn run_once<C: Connector>(
    ctx: Arc<MachineContext<C>>,
    namespace: Option<&str>,
    concurrency: u16,
    capi: bool,
    shutdown: banlieue_provider_kit::capi::Stop,
) {
    let client = ctx.client.clone();
    let (proxmox_machines, machines): (Api<ProxmoxMachine>, Api<Machine>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let clusters: Api<Cluster> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pxcs: Api<ProxmoxCluster> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let controller = Controller::new(proxmox_machines, watcher::Config::default());
    let store = controller.store();
    let pxc_store = store.clone();
    // A Cluster change (pause, infrastructure provisioned) concerns every ProxmoxMachine
    // labelled with its name.
    let cluster_to_machines = move |cluster: Cluster| {
        let (name, ns) = (cluster.name_any(), cluster.namespace());
        store
            .state()
            .into_iter()
            .filter(|pm| pm.namespace() == ns && contract::cluster_name(&pm.metadata) == Some(name.as_str()))
            .map(|pm| ObjectRef::from_obj(&*pm))
            .collect::<Vec<_>>()
    };
    // A standalone ProxmoxCluster change (provisioned, credentials) concerns every machine whose
    // `spec.providerRef` names its Provider.
    let standalone_cluster_to_machines = move |pxc: ProxmoxCluster| {
        let (name, ns) = (pxc.name_any(), pxc.namespace());
        pxc_store
            .state()
            .into_iter()
            .filter(|pm| {
                pm.namespace() == ns && owner::standalone_cluster_name(&**pm).as_deref() == Some(name.as_str())
            })
            .map(|pm| ObjectRef::from_obj(&*pm))
            .collect::<Vec<_>>()
    };
    // A user-data / bootstrap Secret created or fixed while a machine waits for it.
    let mut controller = controller
        .watches(pxcs, watcher::Config::default(), standalone_cluster_to_machines)
        .watches(
            banlieue_provider_runtime::secret_watch::secrets_api(ctx.client.clone(), namespace),
            watcher::Config::default(),
            ctx.user_data_secrets.mapper(),
        );
    if capi {
        controller = controller
            .watches(machines, watcher::Config::default(), machine_to_infra)
            .watches(clusters, watcher::Config::default(), cluster_to_machines);
    }
    controller
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
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
    fn user_data_is_needed_before_the_clone_and_for_the_seed_only() {
        let loc = crate::phase::VmLocation {
            node: "pve1".into(),
            vmid: 101,
        };
        assert!(user_data_needed(&Phase::SelectNode, false));
        assert!(!user_data_needed(&Phase::SelectNode, true), "re-adoption");
        assert!(user_data_needed(
            &Phase::AllocateVmid { node: "pve1".into() },
            false
        ));
        assert!(user_data_needed(&Phase::Clone(loc.clone()), false));
        assert!(user_data_needed(&Phase::Configure(loc.clone(), None), true));
        assert!(!user_data_needed(&Phase::WaitGuest(loc.clone()), false));
        assert!(!user_data_needed(&Phase::Provisioned(loc), false));
    }

    #[test]
    fn a_missing_user_data_secret_is_named_with_its_key() {
        let missing = Error::Missing {
            kind: "Secret",
            namespace: "team-a".into(),
            name: "web-user-data".into(),
        };
        let source = BootstrapSource::Secret {
            name: "web-user-data".into(),
            key: "userdata".into(),
        };
        let (reason, message, retry) = bootstrap_unusable("team-a", &source, true, &missing);
        assert_eq!(reason, "UserDataSecretNotFound");
        assert!(message.contains("team-a/web-user-data"), "{message}");
        assert!(message.contains("\"userdata\""), "{message}");
        assert_eq!(retry, WAIT_REQUEUE);
        let capi = BootstrapSource::Secret {
            name: "m1-bootstrap".into(),
            key: BOOTSTRAP_VALUE_KEY.into(),
        };
        assert_eq!(
            bootstrap_unusable("ns", &capi, false, &missing).0,
            "BootstrapDataSecretNotFound"
        );
        // A VirtualMachine's user data under the default key is still user data.
        let vm_default_key = BootstrapSource::Secret {
            name: "web-user-data".into(),
            key: BOOTSTRAP_VALUE_KEY.into(),
        };
        assert_eq!(
            bootstrap_unusable("ns", &vm_default_key, true, &missing).0,
            "UserDataSecretNotFound"
        );
        let invalid = Error::Bootstrap("unknown format".into());
        assert_eq!(
            bootstrap_unusable("ns", &capi, false, &invalid).0,
            "BootstrapDataInvalid"
        );
    }
}
