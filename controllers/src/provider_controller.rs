//! The Provider reconciler: a Provider that VirtualMachines use keeps the finalizer
//! [`IN_USE_FINALIZER`] until the last of them is gone, its deletion says what it waits for,
//! `status.allocated.virtualMachines` counts the VirtualMachines placed on it, and `Ready` and
//! `status.version` say what the provider found when it connected
//! ([`crate::provider_health`]).
//!
//! It watches Providers and VirtualMachines (two caches) and, after any change, looks at every
//! Provider once the changes have settled for [`SETTLE`] (so a burst of VM placements costs
//! one status write per Provider, not one per VM). A pass writes only what differs: a no-op
//! pass makes no API call. Failed writes are retried after [`RETRY`].
//!
//! The finalizer is also added by the VirtualMachine reconciler before it creates the first
//! infrastructure machine on a Provider ([`ensure_in_use_finalizer`]), so a Provider deleted at
//! that moment cannot vanish before this reconciler notices the new VM.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::banlieue::{Backend, Provider, ProviderAllocation, ProviderNodeTotals, VirtualMachine};
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_provider_runtime::events::Publisher;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::build::{FIELD_MANAGER, PROVIDER_LABEL};
use crate::finalizer;
use crate::provider_health;
pub use crate::provider_use::IN_USE_FINALIZER;
use crate::provider_use::{self, DELETION_BLOCKED};
use crate::registry;
use crate::{Error, Result};

/// How long changes must settle before a pass over the Providers.
pub const SETTLE: Duration = Duration::from_millis(500);
/// Delay before a pass that failed is tried again.
pub const RETRY: Duration = Duration::from_secs(5);
/// A pass happens at least this often, changes or not (a safety resync).
pub const RESYNC: Duration = Duration::from_secs(600);
/// Upper bound of one pass (all its API calls together).
pub const PASS_TIMEOUT: Duration = Duration::from_secs(60);

struct Context {
    client: Client,
    providers: Store<Provider>,
    vms: Store<VirtualMachine>,
    recorder: Publisher,
}

/// Runs the Provider reconciler until `shutdown`.
pub async fn run(client: Client, shutdown: impl Future<Output = ()> + Send + 'static) {
    let (providers, provider_writer) = reflector::store::<Provider>();
    let (vms, vm_writer) = reflector::store::<VirtualMachine>();
    let changed = Arc::new(tokio::sync::Notify::new());
    let provider_events = reflector::reflector(
        provider_writer,
        watcher(Api::<Provider>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .map(|_| ())
    .boxed();
    let vm_events = reflector::reflector(
        vm_writer,
        watcher(
            Api::<VirtualMachine>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map(|_| ())
    .boxed();
    // The caches fill only while their streams are polled: this task drives both.
    let driver = tokio::spawn({
        let changed = changed.clone();
        async move {
            let mut events = futures::stream::select(provider_events, vm_events);
            while events.next().await.is_some() {
                changed.notify_one();
            }
        }
    });
    let ready = async {
        providers.wait_until_ready().await?;
        vms.wait_until_ready().await
    };
    if tokio::time::timeout(Duration::from_secs(60), ready)
        .await
        .is_err()
    {
        // Without complete caches a pass could miss users and release a Provider too early.
        warn!(
            "the Provider and VirtualMachine caches are not ready after 60 s; the Provider reconciler waits"
        );
        let _ = futures::future::join(providers.wait_until_ready(), vms.wait_until_ready()).await;
    }
    let ctx = Context {
        recorder: Publisher::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.to_owned(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        client,
        providers,
        vms,
    };
    let passes = async {
        loop {
            let failed = match tokio::time::timeout(PASS_TIMEOUT, pass(&ctx)).await {
                Ok(failures) => failures > 0,
                Err(_) => {
                    warn!(
                        timeout_s = PASS_TIMEOUT.as_secs(),
                        "a Provider pass took too long"
                    );
                    true
                }
            };
            let wait = if failed { RETRY } else { RESYNC };
            // Wait for a change (or the retry/resync delay), then let the burst settle.
            let _ = tokio::time::timeout(wait, changed.notified()).await;
            tokio::time::sleep(SETTLE).await;
        }
    };
    tokio::select! {
        () = shutdown => {}
        () = passes => {}
    }
    driver.abort();
}

/// One look at every Provider; returns how many could not be brought in line. The infra
/// clusters applied for Providers are listed once per backend per pass, not once per Provider.
async fn pass(ctx: &Context) -> usize {
    let mut failures = 0;
    let mut listed = InfraClusters::default();
    for provider in ctx.providers.state() {
        if let Err(error) = reconcile(&provider, ctx, &mut listed).await {
            failures += 1;
            warn!(
                provider = provider.name_any(),
                error = %error,
                source = ?std::error::Error::source(&error).map(ToString::to_string),
                "reconciling Provider failed; retrying"
            );
        }
    }
    failures
}

#[instrument(skip_all, fields(provider = provider.name_any()))]
async fn reconcile(provider: &Provider, ctx: &Context, listed: &mut InfraClusters) -> Result<()> {
    let name = provider.name_any();
    let vms = ctx.vms.state();
    let users = provider_use::users(&name, vms.iter().map(AsRef::as_ref));
    let allocated = provider_use::placed_totals(vms.iter().map(AsRef::as_ref), None)
        .remove(&name)
        .unwrap_or_else(provider_use::empty);
    let deleting = provider_use::deleting(provider);
    if deleting && users.is_empty() {
        if let Some(patch) = finalizer::remove_named_patch(IN_USE_FINALIZER, provider.finalizers()) {
            patch_finalizers(ctx, provider, patch, "removing").await?;
            info!("no VirtualMachine uses the Provider any more: released for deletion");
        }
        return Ok(());
    }
    if !deleting && !users.is_empty() {
        ensure_in_use_finalizer(&ctx.client, provider).await?;
    }
    let blocked = deleting.then(|| provider_use::deletion_blocked_message(&users));
    let health = provider_health::health(&listed.of(ctx, provider).await?);
    write_status(ctx, provider, allocated, blocked, health).await
}

/// The infrastructure clusters the controller applied for Providers (labelled
/// [`PROVIDER_LABEL`]), listed once per backend and kept for one pass.
#[derive(Default)]
struct InfraClusters(HashMap<Backend, Vec<DynamicObject>>);

impl InfraClusters {
    /// Those applied for `provider` (one per namespace).
    async fn of(&mut self, ctx: &Context, provider: &Provider) -> Result<Vec<DynamicObject>> {
        let backend = provider.spec.backend;
        let Some(entry) = registry::lookup(backend) else {
            return Ok(Vec::new());
        };
        if let Entry::Vacant(slot) = self.0.entry(backend) {
            let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &entry.cluster_api_resource());
            let list = api
                .list(&ListParams::default().labels(PROVIDER_LABEL))
                .await
                .map_err(|e| Error::kube(format!("listing the {}s of Providers", entry.cluster_kind), e))?;
            slot.insert(list.items);
        }
        let name = provider.name_any();
        let cluster_name = banlieue_api::standalone::infra_cluster_name(&name);
        Ok(self.0[&backend]
            .iter()
            .filter(|c| c.name_any() == cluster_name && c.labels().get(PROVIDER_LABEL) == Some(&name))
            .cloned()
            .collect())
    }
}

/// Writes `status.allocated`, `status.version` and `Ready`: while a deletion waits for
/// VirtualMachines, `Ready=False` saying so (plus a Warning Event when that message changes),
/// otherwise the hypervisor's health; nothing when the status already says it.
async fn write_status(
    ctx: &Context,
    provider: &Provider,
    allocation: ProviderAllocation,
    blocked: Option<String>,
    health: provider_health::Health,
) -> Result<()> {
    let status = provider.status.clone().unwrap_or_default();
    let (ready_status, reason, message) = match &blocked {
        Some(message) => (
            ConditionStatus::False,
            DELETION_BLOCKED.to_owned(),
            message.clone(),
        ),
        None => (health.status, health.reason.clone(), health.message.clone()),
    };
    let current_ready = condition::find(&status.conditions, condition::READY);
    let ready_matches = current_ready.is_some_and(|c| {
        c.status == ready_status.as_str()
            && c.reason == reason
            && c.message == message
            && c.observed_generation == provider.metadata.generation
    });
    if status.allocated.as_ref() == Some(&allocation)
        && ready_matches
        && status.version == health.version
        && status.nodes == health.nodes
        && status.capacity == ProviderNodeTotals::of(&health.nodes)
    {
        return Ok(());
    }
    // Merged into the current list, so lastTransitionTime moves only when the status flips.
    let mut conditions = status.conditions.clone();
    condition::set(
        &mut conditions,
        condition::new_condition(
            condition::READY,
            ready_status,
            &reason,
            message.clone(),
            provider.metadata.generation,
            Time(Timestamp::now()),
        ),
    );
    let mut body = json!({
        "apiVersion": Provider::api_version(&()),
        "kind": Provider::kind(&()),
        "status": {
            "allocated": allocation,
            "conditions": [condition::find(&conditions, condition::READY)],
            "observedGeneration": provider.metadata.generation,
        },
    });
    if let Some(version) = &health.version {
        body["status"]["version"] = json!(version);
    }
    if let Some(capacity) = ProviderNodeTotals::of(&health.nodes) {
        body["status"]["nodes"] = json!(health.nodes);
        body["status"]["capacity"] = json!(capacity);
    }
    let name = provider.name_any();
    Api::<Provider>::all(ctx.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| Error::kube(format!("writing the status of Provider {name}"), e))?;
    let message_changed = current_ready.is_none_or(|c| c.reason != reason || c.message != message);
    if let (Some(message), true) = (blocked, message_changed) {
        let event = Event {
            type_: EventType::Warning,
            reason: DELETION_BLOCKED.to_owned(),
            note: Some(message),
            action: "Delete".to_owned(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &provider.object_ref(&())).await {
            warn!(error = %e, "cannot publish event");
        }
    }
    Ok(())
}

/// Adds [`IN_USE_FINALIZER`] to `provider` when it lacks it (re-reading the live object when the
/// cached list was stale).
pub async fn ensure_in_use_finalizer(client: &Client, provider: &Provider) -> Result<()> {
    let Some(patch) = finalizer::add_named_patch(IN_USE_FINALIZER, provider.finalizers()) else {
        return Ok(());
    };
    let api = Api::<Provider>::all(client.clone());
    let name = provider.name_any();
    match apply_json_patch(&api, &name, patch, "adding").await {
        Err(Error::Kube {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 422 => {
            let live = api
                .get(&name)
                .await
                .map_err(|e| Error::kube(format!("reading Provider {name}"), e))?;
            match finalizer::add_named_patch(IN_USE_FINALIZER, live.finalizers()) {
                None => Ok(()),
                Some(patch) => apply_json_patch(&api, &name, patch, "adding").await,
            }
        }
        other => other,
    }
}

async fn patch_finalizers(
    ctx: &Context,
    provider: &Provider,
    patch: serde_json::Value,
    what: &str,
) -> Result<()> {
    apply_json_patch(
        &Api::<Provider>::all(ctx.client.clone()),
        &provider.name_any(),
        patch,
        what,
    )
    .await
}

async fn apply_json_patch(
    api: &Api<Provider>,
    name: &str,
    patch: serde_json::Value,
    what: &str,
) -> Result<()> {
    let context = format!("{what} the finalizer {IN_USE_FINALIZER} of Provider {name}");
    finalizer::send(api, name, patch, context).await.map(drop)
}
