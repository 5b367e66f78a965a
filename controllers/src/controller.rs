//! The VirtualMachine reconciler.
//!
//! Per reconcile: fetch (Providers from a watch cache; class, image, namespace and the
//! infrastructure machine by GET) → choose and build (pure, [`crate::build`]) → server-side
//! apply the machine with field manager [`FIELD_MANAGER`] only when it lacks something the
//! controller owns → mirror its status ([`crate::mirror`]) and server-side apply the
//! VirtualMachine's `/status` only when it changed.
//!
//! Deletion: the finalizer ([`crate::finalizer`]) keeps the VirtualMachine, `Deleting` with the
//! provider's progress, until its machine is gone; the machine also carries an ownerReference
//! with `controller: true` and `blockOwnerDeletion: true`, so the garbage collector deletes it
//! should the VirtualMachine be removed without the controller.
//!
//! Reconciles are debounced ([`RECONCILE_DEBOUNCE`]): a burst of writes to one VirtualMachine or
//! its machine is mirrored once. A status that only brings provisioning progress waits up to
//! [`PROGRESS_HOLD`] for the next news, so a VM that is Ready within it is written once.
//!
//! The machine is applied with the provider's finalizer ([`Backend::finalizer`]) already on it:
//! the provider has no finalizer write of its own to make. A machine being deleted is never
//! applied (it is created again once gone).
//!
//! Triggers: VirtualMachine changes (spec, labels, annotations, finalizers, deletion; not its
//! status, which only this controller writes), changes of any registered infrastructure machine kind
//! (metadata watch, mapped to the controlling VirtualMachine, so a provider status write shows
//! within one watch round-trip), and any change of a Provider, VirtualMachineClass or
//! VirtualMachineImage (re-reconciles every VirtualMachine; these objects change rarely).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_api::banlieue::{
    Provider, ProviderAllocation, VirtualMachine, VirtualMachineClass, VirtualMachineImage,
    VirtualMachineStatus,
};
#[cfg(doc)]
use banlieue_api::common::Backend;
use banlieue_api::common::ContractReference;
use banlieue_provider_runtime::cache::lean_controller_on;
use banlieue_provider_runtime::events::Publisher;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, Preconditions,
};
use kube::runtime::controller::{self as runtime_controller, Action};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, instrument, warn};

use crate::build::{self, FIELD_MANAGER, Invalid};
use crate::finalizer;
use crate::infra_cluster::{self, Ensured, InfraClusters};
use crate::mirror::{self, MachineView, MirrorInput};
use crate::provider_controller;
use crate::provider_use;
use crate::registry::{self, BackendEntry};
use crate::served;
use crate::{Error, Result};

/// Upper bound of one reconcile (all its API calls together).
pub const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);
/// Requeue after a successful reconcile: a safety resync; changes arrive by watch.
pub const RESYNC: Duration = Duration::from_secs(600);
/// Requeue of an invalid VirtualMachine: not hot; a change of the VirtualMachine or of any
/// Provider, class or image triggers a reconcile at once anyway.
pub const INVALID_RETRY: Duration = Duration::from_secs(300);
/// A reconcile waits until its VirtualMachine and machine have been quiet this long (trailing
/// debounce): a provider's burst of writes (its finalizer, a provisioning step's status, the
/// providerID a moment later) is mirrored in one status write instead of one each, for at most
/// this much delay.
pub const RECONCILE_DEBOUNCE: Duration = Duration::from_millis(300);
/// A status whose only news is provisioning progress ([`mirror::only_progress`]: the first
/// `Provisioning`, a provider's next step) waits this long for the next news before it is
/// written: a VM that is Ready within it gets one status write, not one per step. Anything
/// else (Ready, a problem, a placement to record, deletion) is written at once.
pub const PROGRESS_HOLD: Duration = Duration::from_secs(2);
/// Reconciles run at once at most: each holds its VirtualMachine's machine as JSON while it
/// waits on the API server, so a burst (1,000 VMs created together) is worked through in
/// order instead of all at once, with bounded memory.
pub const RECONCILE_CONCURRENCY: u16 = 32;
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Counters of what the controller did, shared with the caller of [`run_with_metrics`]
/// (tests, the benchmark, and later the Prometheus endpoint).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Reconciles run (successful or not).
    pub reconciles: AtomicU64,
    /// Reconciles that failed with a transient error.
    pub errors: AtomicU64,
    /// Server-side applies of an infrastructure machine.
    pub machine_applies: AtomicU64,
    /// Server-side applies of a VirtualMachine's `/status`.
    pub status_writes: AtomicU64,
    /// Server-side applies of an infra cluster object (one per Provider and namespace).
    pub cluster_applies: AtomicU64,
    /// Finalizer patches of a VirtualMachine (add, remove).
    pub finalizer_writes: AtomicU64,
    /// Deletions of an infrastructure machine.
    pub machine_deletes: AtomicU64,
    /// The controller is running (its Provider cache is filled): `/readyz` answers 200.
    pub ready: AtomicBool,
}

/// A point-in-time copy of [`Metrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// See [`Metrics::reconciles`].
    pub reconciles: u64,
    /// See [`Metrics::errors`].
    pub errors: u64,
    /// See [`Metrics::machine_applies`].
    pub machine_applies: u64,
    /// See [`Metrics::status_writes`].
    pub status_writes: u64,
    /// See [`Metrics::cluster_applies`].
    pub cluster_applies: u64,
    /// See [`Metrics::finalizer_writes`].
    pub finalizer_writes: u64,
    /// See [`Metrics::machine_deletes`].
    pub machine_deletes: u64,
}

impl MetricsSnapshot {
    /// Every API write counted.
    pub fn writes(&self) -> u64 {
        self.machine_applies
            + self.status_writes
            + self.cluster_applies
            + self.finalizer_writes
            + self.machine_deletes
    }
}

impl Metrics {
    /// The current counter values.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            reconciles: self.reconciles.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            machine_applies: self.machine_applies.load(Ordering::Relaxed),
            status_writes: self.status_writes.load(Ordering::Relaxed),
            cluster_applies: self.cluster_applies.load(Ordering::Relaxed),
            finalizer_writes: self.finalizer_writes.load(Ordering::Relaxed),
            machine_deletes: self.machine_deletes.load(Ordering::Relaxed),
        }
    }
}

/// Shared state of the controller.
pub struct Context {
    client: Client,
    metrics: Arc<Metrics>,
    providers: Store<Provider>,
    clusters: InfraClusters,
    failures: Mutex<HashMap<String, u32>>,
    recorder: Publisher,
    /// Per VirtualMachine uid, our status writes not yet seen through the watch: see
    /// [`Written`].
    written: Mutex<HashMap<String, Written>>,
    /// The infrastructure machine kinds installed when this run started ([`served`]).
    served: Vec<&'static str>,
    /// Held while a VirtualMachine is placed on a Provider with a VM capacity, from the fresh
    /// count until its status records the placement: two VMs never take the last slot together.
    placement: Arc<tokio::sync::Mutex<()>>,
    /// The Provider reconciler runs (cluster-wide controller): only then may a Provider get the
    /// in-use finalizer, which that reconciler removes.
    manage_providers: bool,
    /// Per VirtualMachine uid, since when a progress-only status waits to be written
    /// ([`PROGRESS_HOLD`]).
    held: Mutex<HashMap<String, std::time::Instant>>,
}

/// The controller's own status writes of one VirtualMachine that its watch cache has not caught
/// up with. A reconcile that sees one of the `stale` resourceVersions (the object as it was
/// before one of these writes) uses `status` (the last written) as the current status instead
/// of writing the same status again. The entry is dropped when a reconcile sees `latest` (our
/// last write came back) or any other resourceVersion (someone else changed the object).
#[derive(Debug)]
struct Written {
    stale: Vec<String>,
    latest: String,
    status: VirtualMachineStatus,
}

impl Context {
    /// Whether `vm` is a version that a status write of ours has superseded (the watch cache
    /// lags behind our writes).
    fn cache_is_behind_our_writes(&self, vm: &VirtualMachine) -> bool {
        let (uid, rv) = (
            vm.uid().unwrap_or_default(),
            vm.resource_version().unwrap_or_default(),
        );
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&uid)
            .is_some_and(|w| w.stale.contains(&rv))
    }

    fn backoff(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        let exp = BACKOFF_MIN.saturating_mul(1u32 << (*n - 1).min(16));
        exp.min(BACKOFF_MAX)
    }

    fn reset_backoff(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn key(vm: &VirtualMachine) -> String {
    format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any())
}

/// Reconciles one VirtualMachine (bounded by [`RECONCILE_TIMEOUT`]).
#[instrument(skip_all, fields(namespace = vm.namespace().unwrap_or_default(), name = vm.name_any()))]
pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
    let action = tokio::time::timeout(RECONCILE_TIMEOUT, reconcile_inner(&vm, &ctx))
        .await
        .map_err(|_| Error::Timeout(RECONCILE_TIMEOUT))??;
    ctx.reset_backoff(&key(&vm));
    Ok(action)
}

/// Transient faults: exponential backoff per VirtualMachine (1 s doubling to 5 min). Invalid
/// input never reaches here: it is reported as a condition by [`reconcile`].
pub fn error_policy(vm: Arc<VirtualMachine>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.errors.fetch_add(1, Ordering::Relaxed);
    let delay = ctx.backoff(&key(&vm));
    warn!(
        namespace = vm.namespace().unwrap_or_default(),
        name = vm.name_any(),
        error = %error,
        source = ?std::error::Error::source(error).map(ToString::to_string),
        kind = error.metric_label(),
        retry_in_s = delay.as_secs_f64(),
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// What the fetch and build steps decided.
struct Plan {
    provider: Option<String>,
    entry: Option<&'static BackendEntry>,
    /// The infra cluster object of the chosen Provider in this namespace.
    cluster: Option<Value>,
    desired: Option<Value>,
    /// What the VirtualMachine takes of the Provider's capacity, when the machine is built.
    allocated: Option<ProviderAllocation>,
    invalid: Option<Invalid>,
    /// The placement lock, when this reconcile places the VirtualMachine on a Provider with a
    /// VM capacity; released when the reconcile ends (after the status write).
    _placement: Option<tokio::sync::OwnedMutexGuard<()>>,
}

async fn plan(vm: &VirtualMachine, ctx: &Context) -> Result<Plan> {
    let client = &ctx.client;
    let ns = vm.namespace().unwrap_or_default();
    let class = match &vm.spec.class_ref {
        Some(r) => match Api::<VirtualMachineClass>::all(client.clone())
            .get_opt(&r.name)
            .await
            .map_err(|e| Error::kube(format!("reading VirtualMachineClass {}", r.name), e))?
        {
            Some(c) => Some(c),
            None => return Ok(Plan::invalid(vm, Invalid::ClassNotFound(r.name.clone()))),
        },
        None => None,
    };
    let image = match &vm.spec.image_ref {
        Some(r) => match Api::<VirtualMachineImage>::all(client.clone())
            .get_opt(&r.name)
            .await
            .map_err(|e| Error::kube(format!("reading VirtualMachineImage {}", r.name), e))?
        {
            Some(i) => Some(i),
            None => return Ok(Plan::invalid(vm, Invalid::ImageNotFound(r.name.clone()))),
        },
        None => None,
    };
    let providers: Vec<Provider> = ctx.providers.state().iter().map(|p| (**p).clone()).collect();
    let namespace_labels = if providers.iter().any(|p| p.spec.namespace_selector.is_some()) {
        Api::<Namespace>::all(client.clone())
            .get_opt(&ns)
            .await
            .map_err(|e| Error::kube(format!("reading Namespace {ns}"), e))?
            .map(|n| n.labels().clone())
            .unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    let unplaced = provider_use::placed_on(vm).is_none();
    let (placed, placement) = if unplaced && providers.iter().any(provider_use::has_capacity) {
        let guard = ctx.placement.clone().lock_owned().await;
        let all = Api::<VirtualMachine>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("listing VirtualMachines to count Provider capacity", e))?;
        let uid = vm.uid();
        (
            provider_use::placed_totals(&all.items, uid.as_deref()),
            Some(guard),
        )
    } else {
        (BTreeMap::new(), None)
    };
    // Without a size the machine cannot be built (desired_machine says why); the VM then
    // asks nothing of a capacity.
    let allocated = build::allocation(vm, class.as_ref()).ok();
    let wanted = allocated.clone().unwrap_or_default();
    let chosen = build::choose_provider(vm, &providers, &namespace_labels, &placed, &wanted, |p| {
        build::image_source(vm, p, image.as_ref()).is_some()
            && build::unsupported_fields(vm, p.spec.backend, &p.name_any(), class.as_ref(), image.as_ref())
                .is_ok()
    });
    let provider = match chosen {
        Ok(p) => p,
        Err(invalid) => return Ok(Plan::invalid(vm, invalid)),
    };
    if unplaced && ctx.manage_providers {
        // Before the first infrastructure object: the Provider cannot go while this VM uses it.
        provider_controller::ensure_in_use_finalizer(client, provider).await?;
    }
    let entry = build::entry_for(provider.spec.backend).ok();
    let built = build::desired_machine(vm, provider, class.as_ref(), image.as_ref())
        .and_then(|machine| Ok((machine, build::desired_cluster(provider, &ns)?)));
    Ok(match built {
        Ok((desired, cluster)) => Plan {
            provider: Some(provider.name_any()),
            entry,
            cluster: Some(cluster),
            desired: Some(desired),
            allocated,
            invalid: None,
            _placement: placement,
        },
        Err(invalid) => Plan {
            provider: Some(provider.name_any()),
            entry,
            cluster: None,
            desired: None,
            allocated: None,
            invalid: Some(invalid),
            _placement: placement,
        },
    })
}

impl Plan {
    /// An invalid plan; keeps driving the machine recorded in status (if any) for the mirror.
    fn invalid(vm: &VirtualMachine, invalid: Invalid) -> Self {
        let recorded = vm.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref());
        Self {
            provider: None,
            entry: recorded.and_then(|r| registry::by_kind(&r.kind)),
            cluster: None,
            desired: None,
            allocated: None,
            invalid: Some(invalid),
            _placement: None,
        }
    }
}

async fn reconcile_inner(vm: &VirtualMachine, ctx: &Context) -> Result<Action> {
    if vm.meta().deletion_timestamp.is_some() {
        return cleanup(vm, ctx).await;
    }
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    // resourceVersions of this VirtualMachine that our writes in this reconcile supersede.
    let mut superseded = vec![vm.resource_version().unwrap_or_default()];
    if let Some(rv) = add_finalizer(ctx, vm).await? {
        superseded.push(rv);
    }
    let mut plan = plan(vm, ctx).await?;
    if let Some(entry) = plan.entry
        && !ctx.served.contains(&entry.kind)
    {
        plan.invalid = Some(Invalid::KindNotInstalled {
            kind: entry.kind,
            backend: entry.image_key,
            provider: plan.provider.clone().unwrap_or_default(),
        });
        plan.desired = None;
        plan.cluster = None;
    }

    // The infra cluster object of the Provider in this namespace, before the machine (the
    // provider waits for it to be provisioned).
    if let (Some(entry), Some(cluster)) = (plan.entry, &plan.cluster) {
        match ctx.clusters.ensure(&ctx.client, entry, cluster).await? {
            Ensured::Unchanged => {}
            Ensured::Applied => {
                ctx.metrics.cluster_applies.fetch_add(1, Ordering::Relaxed);
            }
            Ensured::Conflict(invalid) => {
                plan.invalid = Some(invalid);
                plan.desired = None;
            }
        }
    }

    // What the infra cluster reports (its Ready carries the cause when the provider cannot
    // connect); read from the watch cache.
    let cluster_view = plan
        .entry
        .zip(plan.cluster.as_ref())
        .and_then(|(entry, cluster)| {
            ctx.clusters
                .view(entry, &ns, cluster["metadata"]["name"].as_str()?)
        });

    // The machine: read, then apply only when it lacks what the controller owns.
    let mut machine: Option<DynamicObject> = None;
    if let Some(entry) = plan.entry.filter(|e| ctx.served.contains(&e.kind)) {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &entry.api_resource());
        machine = api
            .get_opt(&name)
            .await
            .map_err(|e| Error::kube(format!("reading {} {ns}/{name}", entry.kind), e))?;
        if machine.as_ref().is_some_and(|m| !controlled(m, &uid)) {
            plan.invalid = Some(Invalid::MachineConflict {
                kind: entry.kind,
                name: name.clone(),
            });
            plan.desired = None;
            machine = None;
        }
        if let Some(desired) = plan.desired.as_mut() {
            let existing = machine.as_ref().and_then(|m| serde_json::to_value(m).ok());
            if let Some(existing) = &existing {
                build::keep_created_defaults(desired, existing, entry);
            }
            // A machine being deleted is left to go (the provider is deleting its VM); the
            // next reconcile after it is gone creates it again.
            let deleting = machine
                .as_ref()
                .is_some_and(|m| m.metadata.deletion_timestamp.is_some());
            if !deleting
                && !existing
                    .as_ref()
                    .is_some_and(|e| build::machine_holds(e, desired))
            {
                let applied = api
                    .patch(
                        &name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(desired),
                    )
                    .await
                    .map_err(|e| Error::kube(format!("applying {} {ns}/{name}", entry.kind), e))?;
                ctx.metrics.machine_applies.fetch_add(1, Ordering::Relaxed);
                info!(
                    kind = entry.kind,
                    created = existing.is_none(),
                    "applied infrastructure machine"
                );
                machine = Some(applied);
            }
        }
    }

    let infrastructure_ref = plan
        .entry
        .filter(|_| machine.is_some())
        .map(|e| ContractReference {
            api_group: e.group().to_owned(),
            kind: e.kind.to_owned(),
            name: name.clone(),
        });
    let view = machine
        .as_ref()
        .and_then(|m| serde_json::to_value(m).ok())
        .map(|v| MachineView::from_object(&v));
    let input = MirrorInput {
        generation: vm.meta().generation,
        deleting: false,
        provider: plan.provider.as_deref(),
        allocated: plan.allocated.as_ref().filter(|_| plan.invalid.is_none()),
        infrastructure_ref,
        machine: view.as_ref(),
        cluster: cluster_view.as_ref(),
        user_data_secret: vm.spec.user_data_secret_ref.as_ref().map(|r| r.name.as_str()),
        invalid: plan.invalid.as_ref(),
    };
    let placing = plan._placement.is_some();
    let held = update_status(ctx, vm, &input, superseded, placing).await?;
    Ok(if let Some(remaining) = held {
        Action::requeue(remaining)
    } else if plan.invalid.is_some() {
        Action::requeue(INVALID_RETRY)
    } else {
        Action::requeue(RESYNC)
    })
}

/// Whether the machine is controlled by the VirtualMachine with `uid`.
fn controlled(machine: &DynamicObject, uid: &str) -> bool {
    build::controlled_by(
        serde_json::to_value(&machine.metadata)
            .ok()
            .and_then(|v| v.get("ownerReferences").cloned())
            .as_ref(),
        uid,
    )
}

/// Adds the finalizer when missing; returns the new resourceVersion when it wrote.
async fn add_finalizer(ctx: &Context, vm: &VirtualMachine) -> Result<Option<String>> {
    let Some(patch) = finalizer::add_patch(vm.finalizers()) else {
        return Ok(None);
    };
    if ctx.cache_is_behind_our_writes(vm) {
        // The cache holds a version our own writes superseded: the reconcile that wrote them
        // added the finalizer first (a finalizer removed since would be a newer version).
        return Ok(None);
    }
    match patch_finalizers(ctx, vm, patch, "adding").await {
        Ok(rv) => Ok(Some(rv)),
        // The guard failed: the list changed since the cache saw it (typically this reconcile
        // runs on a cache entry older than our own finalizer patch). Look at the live object.
        Err(Error::Kube {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 422 => {
            let ns = vm.namespace().unwrap_or_default();
            let name = vm.name_any();
            let live = Api::<VirtualMachine>::namespaced(ctx.client.clone(), &ns)
                .get(&name)
                .await
                .map_err(|e| Error::kube(format!("reading VirtualMachine {ns}/{name}"), e))?;
            match finalizer::add_patch(live.finalizers()) {
                None => Ok(None),
                Some(patch) => patch_finalizers(ctx, &live, patch, "adding").await.map(Some),
            }
        }
        Err(e) => Err(e),
    }
}

async fn patch_finalizers(ctx: &Context, vm: &VirtualMachine, patch: Value, what: &str) -> Result<String> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let updated = finalizer::send(
        &Api::<VirtualMachine>::namespaced(ctx.client.clone(), &ns),
        &name,
        patch,
        format!("{what} the finalizer of VirtualMachine {ns}/{name}"),
    )
    .await?;
    ctx.metrics.finalizer_writes.fetch_add(1, Ordering::Relaxed);
    Ok(updated.resource_version().unwrap_or_default())
}

/// Deletion: delete the infrastructure machine the VirtualMachine controls (whatever its kind:
/// the Provider may be gone), show the provider's progress while it deletes the hypervisor VM,
/// and remove the finalizer once the machine is gone.
async fn cleanup(vm: &VirtualMachine, ctx: &Context) -> Result<Action> {
    if !finalizer::has(vm.finalizers()) {
        return Ok(Action::await_change());
    }
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    let mut remaining: Option<(&'static BackendEntry, DynamicObject)> = None;
    for entry in registry::REGISTRY {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &entry.api_resource());
        let found = match api.get_opt(&name).await {
            // A kind that is not installed holds no machine.
            Err(e) if served::is_kind_not_served(&e) => None,
            found => found.map_err(|e| Error::kube(format!("reading {} {ns}/{name}", entry.kind), e))?,
        };
        let Some(machine) = found else {
            continue;
        };
        if !controlled(&machine, &uid) {
            continue;
        }
        if machine.metadata.deletion_timestamp.is_some() {
            remaining = Some((entry, machine));
            break;
        }
        let params = DeleteParams {
            preconditions: machine.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let deleted = api
            .delete(&name, &params)
            .await
            .map_err(|e| Error::kube(format!("deleting {} {ns}/{name}", entry.kind), e))?;
        ctx.metrics.machine_deletes.fetch_add(1, Ordering::Relaxed);
        info!(kind = entry.kind, "deleting infrastructure machine");
        if let Some(still_there) = deleted.left() {
            remaining = Some((entry, still_there));
        }
        break;
    }
    let Some((entry, machine)) = remaining else {
        if let Some(patch) = finalizer::remove_patch(vm.finalizers()) {
            patch_finalizers(ctx, vm, patch, "removing").await?;
            info!("infrastructure machine gone; finalizer removed");
        }
        // Nothing more will be written for this VirtualMachine.
        ctx.written.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
        return Ok(Action::await_change());
    };
    let view = serde_json::to_value(&machine)
        .ok()
        .map(|v| MachineView::from_object(&v));
    let input = MirrorInput {
        generation: vm.meta().generation,
        deleting: true,
        provider: None,
        allocated: None,
        infrastructure_ref: Some(ContractReference {
            api_group: entry.group().to_owned(),
            kind: entry.kind.to_owned(),
            name,
        }),
        machine: view.as_ref(),
        cluster: None,
        user_data_secret: None,
        invalid: None,
    };
    update_status(
        ctx,
        vm,
        &input,
        vec![vm.resource_version().unwrap_or_default()],
        false,
    )
    .await?;
    // The machine's own events (status writes, its disappearance) trigger the next reconcile.
    Ok(Action::requeue(RESYNC))
}

/// Mirrors `input` into the VirtualMachine's status and writes it when it changed; publishes a
/// Warning Event for newly detected invalid input. `superseded` are resourceVersions of the
/// VirtualMachine this reconcile saw or replaced; `placing`: this reconcile places the VM on a
/// Provider with a VM capacity (the status records it at once). A change that is only progress
/// waits up to [`PROGRESS_HOLD`] for the next one: then the time left is returned (reconcile
/// again after it) and nothing is written.
async fn update_status(
    ctx: &Context,
    vm: &VirtualMachine,
    input: &MirrorInput<'_>,
    superseded: Vec<String>,
    placing: bool,
) -> Result<Option<Duration>> {
    let uid = vm.uid().unwrap_or_default();
    let rv = vm.resource_version().unwrap_or_default();
    let current = {
        let mut written = ctx.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get(&uid) {
            Some(w) if w.stale.contains(&rv) => Some(w.status.clone()),
            Some(_) => {
                written.remove(&uid);
                vm.status.clone()
            }
            None => vm.status.clone(),
        }
    };
    let status = mirror::mirror(current.as_ref(), input, &now());
    let warning = mirror::warning(current.as_ref(), &status, input);
    if current.as_ref() == Some(&status) {
        ctx.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
        return Ok(None);
    }
    if !placing && warning.is_none() && mirror::only_progress(current.as_ref(), &status, input) {
        let mut held = ctx.held.lock().unwrap_or_else(|e| e.into_inner());
        let waited = held
            .entry(uid.clone())
            .or_insert_with(std::time::Instant::now)
            .elapsed();
        if waited < PROGRESS_HOLD {
            drop(held);
            // This reconcile's own writes (the finalizer) still supersede the cached object.
            let mut superseded = superseded;
            if superseded.len() > 1
                && let Some(latest) = superseded.pop()
            {
                record_written(ctx, uid, superseded, latest, current.unwrap_or_default());
            }
            return Ok(Some(PROGRESS_HOLD - waited));
        }
    }
    ctx.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
    if let Some((reason, note)) = warning {
        publish_event(ctx, vm, EventType::Warning, reason, note).await;
    } else if let Some((reason, note)) = mirror::lifecycle(current.as_ref(), &status) {
        publish_event(ctx, vm, EventType::Normal, reason, note).await;
    }
    let latest = write_status(ctx, vm, &status).await?;
    record_written(ctx, uid, superseded, latest, status);
    Ok(None)
}

/// Records that our writes made `latest` the VirtualMachine's newest version, with `status`,
/// superseding the versions `superseded` (see [`Written`]).
fn record_written(
    ctx: &Context,
    uid: String,
    superseded: Vec<String>,
    latest: String,
    status: VirtualMachineStatus,
) {
    let mut written = ctx.written.lock().unwrap_or_else(|e| e.into_inner());
    let entry = written.entry(uid).or_insert_with(|| Written {
        stale: Vec::new(),
        latest: String::new(),
        status: status.clone(),
    });
    entry.stale.extend(superseded);
    if !entry.latest.is_empty() {
        let previous = std::mem::take(&mut entry.latest);
        entry.stale.push(previous);
    }
    entry.latest = latest;
    entry.status = status;
}

/// Publishes an Event on the VirtualMachine: a Warning for a new not-ready cause (once per new
/// reason, not per retry: see [`mirror::warning`]), a Normal one per lifecycle step
/// ([`mirror::lifecycle`]). Failing to publish is logged, never fatal.
async fn publish_event(ctx: &Context, vm: &VirtualMachine, type_: EventType, reason: String, note: String) {
    let event = Event {
        type_,
        reason,
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &vm.object_ref(&())).await {
        warn!(error = %e, "cannot publish event");
    }
}

/// Server-side applies `status` on the VirtualMachine's `/status`; returns the new
/// resourceVersion.
async fn write_status(ctx: &Context, vm: &VirtualMachine, status: &VirtualMachineStatus) -> Result<String> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let body = json!({
        "apiVersion": VirtualMachine::api_version(&()),
        "kind": VirtualMachine::kind(&()),
        "status": status,
    });
    let updated = Api::<VirtualMachine>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| Error::kube(format!("writing VirtualMachine {ns}/{name} status"), e))?;
    ctx.metrics.status_writes.fetch_add(1, Ordering::Relaxed);
    Ok(updated.resource_version().unwrap_or_default())
}

/// Runs the controller over `namespace` (every namespace when `None`) until `shutdown`
/// completes. Returns once the controller has drained.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    run_with_metrics(client, namespace, shutdown, Arc::new(Metrics::default())).await;
}

/// [`run`], counting into `metrics`. Watches the infrastructure kinds that are installed, and
/// restarts itself when that set changes ([`served`]).
pub async fn run_with_metrics(
    client: Client,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    metrics: Arc<Metrics>,
) {
    run_with_discovery_interval(client, namespace, shutdown, metrics, served::DISCOVERY_INTERVAL).await;
}

/// [`run_with_metrics`], asking discovery for installed providers every `interval`.
pub async fn run_with_discovery_interval(
    client: Client,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    metrics: Arc<Metrics>,
    interval: Duration,
) {
    let shutdown = shutdown.shared();
    // Providers are reconciled beside (not restarted with) the VirtualMachine controller; with
    // --namespace the controller sees only part of the VirtualMachines and leaves Providers alone.
    let providers = namespace
        .is_none()
        .then(|| tokio::spawn(provider_controller::run(client.clone(), shutdown.clone())));
    let _stop_providers = AbortOnDrop(providers);
    loop {
        let entries = served::served_entries(&client)
            .await
            .unwrap_or_else(|| registry::REGISTRY.iter().collect());
        let kinds = served::kinds(&entries);
        let missing: Vec<&str> = registry::REGISTRY
            .iter()
            .map(|e| e.kind)
            .filter(|k| !kinds.contains(k))
            .collect();
        if !missing.is_empty() {
            info!(
                installed = ?kinds,
                not_installed = ?missing,
                "some providers' kinds are not installed: their VirtualMachines wait for them"
            );
        }
        let (changed_tx, changed_rx) = tokio::sync::oneshot::channel::<()>();
        let discovery = tokio::spawn({
            let client = client.clone();
            async move {
                served::wait_for_change(client, kinds, interval).await;
                let _ = changed_tx.send(());
            }
        });
        let changed = changed_rx.map(|_| ());
        let stop = futures::future::select(shutdown.clone(), changed).map(|_| ());
        run_once(
            client.clone(),
            namespace.as_deref(),
            stop,
            metrics.clone(),
            &entries,
        )
        .await;
        discovery.abort();
        if shutdown.peek().is_some() {
            return;
        }
        info!("the installed infrastructure kinds changed: restarting the controller with their watches");
    }
}

/// One run of the controller with watches on `entries`' kinds, until `stop`.
async fn run_once(
    client: Client,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    metrics: Arc<Metrics>,
    entries: &[&'static BackendEntry],
) {
    let vms: Api<VirtualMachine> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };

    // Provider cache (lookup) + trigger: any Provider, class or image change reconciles all.
    let (providers, writer) = reflector::store();
    let (tx, rx) = futures::channel::mpsc::channel::<()>(1);
    let provider_events = reflector::reflector(
        writer,
        watcher(Api::<Provider>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .map(|_| ());
    let class_events = watcher(
        Api::<PartialObjectMeta<VirtualMachineClass>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .touched_objects()
    .map(|_| ());
    let image_events = watcher(
        Api::<PartialObjectMeta<VirtualMachineImage>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .touched_objects()
    .map(|_| ());
    // Infra cluster objects the controller manages: a cache per cluster kind. Their deletion
    // (by hand, or by the garbage collector after a Provider was recreated; rare) reconciles
    // every VirtualMachine, so those of that Provider apply it again; so does a change of their
    // Ready condition (rare too), so those VirtualMachines show the cluster's cause.
    let mut cluster_stores = Vec::new();
    let mut cluster_changes = Vec::new();
    for entry in entries {
        let ar = entry.cluster_api_resource();
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let writer = reflector::store::Writer::new(ar.clone());
        let store = writer.as_reader();
        cluster_stores.push((entry.cluster_kind, store));
        let mut ready_changes = infra_cluster::ReadyChanges::default();
        let changed = reflector::reflector(
            writer,
            watcher(
                api,
                watcher::Config::default().labels(&infra_cluster::managed_selector()),
            ),
        )
        .default_backoff()
        .filter_map(move |event| {
            let trigger = match event {
                Ok(event) => ready_changes.observe(&event).then_some(()),
                Err(e) => {
                    warn!(error = %e, "watching infra cluster objects");
                    None
                }
            };
            futures::future::ready(trigger)
        });
        cluster_changes.push(changed.boxed());
    }

    let trigger_task = tokio::spawn(async move {
        let mut events = futures::stream::select_all(
            [
                provider_events.boxed(),
                class_events.boxed(),
                image_events.boxed(),
            ]
            .into_iter()
            .chain(cluster_changes),
        );
        let mut tx = tx;
        while events.next().await.is_some() {
            // A full channel already holds a pending "reconcile all": dropping is fine.
            if tx.try_send(()).is_err() && tx.is_closed() {
                break;
            }
        }
    });
    if tokio::time::timeout(Duration::from_secs(60), providers.wait_until_ready())
        .await
        .is_err()
    {
        warn!("the Provider cache is not ready after 60 s; starting anyway (Providers may look missing)");
    }

    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics,
        providers,
        clusters: InfraClusters::new(cluster_stores),
        failures: Mutex::new(HashMap::new()),
        written: Mutex::new(HashMap::new()),
        served: served::kinds(entries),
        placement: Arc::new(tokio::sync::Mutex::new(())),
        manage_providers: namespace.is_none(),
        held: Mutex::default(),
        recorder: Publisher::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.to_owned(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
    });
    ctx.metrics.ready.store(true, Ordering::Relaxed);
    // A VirtualMachine's own status (the controller's writes) is no input: only its spec,
    // labels, annotations, finalizers and deletion (which bumps the generation) trigger.
    let inputs = predicates::generation
        .combine(predicates::labels)
        .combine(predicates::annotations)
        .combine(predicates::finalizers);
    let mut controller = lean_controller_on(vms, watcher::Config::default(), inputs).with_config(
        runtime_controller::Config::default()
            .debounce(RECONCILE_DEBOUNCE)
            .concurrency(RECONCILE_CONCURRENCY),
    );
    for entry in entries {
        let ar = entry.api_resource();
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        controller = controller.owns_with(api, ar, watcher::Config::default());
    }
    controller
        .reconcile_all_on(rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                warn!(error = %error, "controller event");
            }
        })
        .await;
    trigger_task.abort();
}

/// Aborts the task when dropped (when the controller returns).
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}
