//! The LibvirtCluster reconciler (CAPI InfraCluster contract, and standalone infra clusters of
//! banlieue Providers).
//!
//! Reconciled when its controlling owner is a CAPI `Cluster` or a banlieue `Provider`
//! (standalone; the banlieue controller creates those). Resolves the hosts ([`crate::hosts`]),
//! checks each one answers (`LibvirtConnected`), publishes one failure domain per reachable host,
//! mirrors the Cluster's `controlPlaneEndpoint` when the user set none (CAPI only), and sets
//! `status.initialization.provisioned` and `Ready`. Objects with `cluster.x-k8s.io/managed-by`
//! are skipped. The credentials Secrets of its hosts are watched: one created or fixed after the
//! fact is acted on within seconds ([`crate::secrets`]).

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::{ApiEndpoint, FailureDomain, Initialization};
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtClusterStatus};
use banlieue_api::standalone;
use banlieue_capi::Cluster;
use banlieue_capi::contract;
use banlieue_provider_runtime::secret_watch::{SecretIndex, secrets_api};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{instrument, warn};

use crate::error::{Error, Result};
use crate::hosts::{self, Connector};
use crate::hypervisor::Hypervisor;
use crate::machine_controller::{FIELD_MANAGER, FINALIZER};
use crate::secrets::ReadSecrets;

/// Condition type: every host answers.
pub const LIBVIRT_CONNECTED: &str = "LibvirtConnected";
/// Resync period.
pub const RESYNC: Duration = Duration::from_secs(300);
/// Requeue while a host is unreachable or its credentials are unusable (a created or fixed
/// credentials Secret is acted on at once: it is watched).
pub const RETRY: Duration = Duration::from_secs(10);

/// Shared state of the LibvirtCluster controller.
pub struct ClusterContext<C: Connector> {
    /// Kubernetes client.
    pub client: kube::Client,
    /// Opens libvirt connections.
    pub connector: C,
    /// The credentials Secrets each LibvirtCluster's last reconcile read, for the Secret watch.
    pub secrets: SecretIndex<LibvirtCluster>,
    /// Requeue while a host is unreachable or its credentials are unusable ([`RETRY`]).
    pub retry: Duration,
}

impl<C: Connector> ClusterContext<C> {
    /// A context with the default [`RETRY`].
    pub fn new(client: kube::Client, connector: C) -> Self {
        Self {
            client,
            connector,
            secrets: SecretIndex::default(),
            retry: RETRY,
        }
    }
}

fn cond(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    g: Option<i64>,
) -> condition::Condition {
    condition::new_condition(
        type_,
        status,
        reason,
        message,
        g,
        Time(k8s_openapi::jiff::Timestamp::now()),
    )
}

/// The controlling owner of an infra cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterOwner {
    /// A CAPI Cluster.
    Cluster(String),
    /// A banlieue Provider (standalone).
    Provider(String),
}

/// The owner this controller acts for, if any.
pub fn cluster_owner(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<ClusterOwner> {
    if let Some(o) = contract::owner_cluster(meta) {
        return Some(ClusterOwner::Cluster(o.name.clone()));
    }
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && contract::group_of(&o.api_version) == standalone::OWNER_GROUP
                && o.kind == standalone::PROVIDER_KIND
        })
        .map(|o| ClusterOwner::Provider(o.name.clone()))
}

/// The endpoint to mirror from the Cluster: `None` when the user set one or the Cluster has
/// none (complete) yet.
pub fn endpoint_to_mirror(lvc: &LibvirtCluster, cluster: &Cluster) -> Option<ApiEndpoint> {
    if lvc.spec.control_plane_endpoint.is_some() {
        return None;
    }
    let ep = cluster.spec.control_plane_endpoint.as_ref()?;
    let host = ep.host.clone().filter(|h| !h.is_empty())?;
    let port = ep.port.filter(|p| (1..=65535).contains(p))?;
    Some(ApiEndpoint { host, port })
}

/// Reconciles one LibvirtCluster.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<C: Connector>(
    obj: Arc<LibvirtCluster>,
    ctx: Arc<ClusterContext<C>>,
) -> Result<Action> {
    let res = reconcile_inner(&obj, &ctx).await;
    if let Err(e) = &res {
        warn!(error = %e, "reconcile failed");
    }
    res
}

/// Error policy: retry after 30 s.
pub fn error_policy<C: Connector>(_: Arc<LibvirtCluster>, _: &Error, _: Arc<ClusterContext<C>>) -> Action {
    Action::requeue(Duration::from_secs(30))
}

async fn write_status(
    api: &Api<LibvirtCluster>,
    lvc: &LibvirtCluster,
    new: &LibvirtClusterStatus,
) -> Result<()> {
    if lvc.status.clone().unwrap_or_default() == *new {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": LibvirtCluster::api_version(&()),
        "kind": LibvirtCluster::kind(&()),
        "status": new,
    });
    api.patch_status(
        &lvc.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing LibvirtCluster status", e))?;
    Ok(())
}

async fn set_finalizer(api: &Api<LibvirtCluster>, lvc: &LibvirtCluster, present: bool) -> Result<()> {
    let mut finalizers = lvc.finalizers().to_vec();
    if present {
        finalizers.push(FINALIZER.to_owned());
    } else {
        finalizers.retain(|f| f != FINALIZER);
    }
    let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": lvc.resource_version()}});
    api.patch(&lvc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube("updating LibvirtCluster finalizers", e))?;
    Ok(())
}

async fn reconcile_inner<C: Connector>(obj: &LibvirtCluster, ctx: &ClusterContext<C>) -> Result<Action> {
    // Whatever this reconcile returns, the watch then follows exactly the Secrets it read.
    let read = ReadSecrets::new(&ctx.secrets, ObjectRef::from_obj(obj));
    let namespace = obj.namespace().unwrap_or_default();
    let api: Api<LibvirtCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(lvc) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube("reading LibvirtCluster", e))?
    else {
        return Ok(Action::await_change());
    };
    if contract::is_externally_managed(&lvc.metadata) {
        return Ok(Action::await_change());
    }
    let has_finalizer = lvc.finalizers().iter().any(|f| f == FINALIZER);
    let deleting = lvc.meta().deletion_timestamp.is_some();
    let Some(owner) = cluster_owner(&lvc.metadata) else {
        if deleting && has_finalizer {
            set_finalizer(&api, &lvc, false).await?;
        }
        return Ok(Action::await_change());
    };
    let cluster = match &owner {
        ClusterOwner::Cluster(name) => Api::<Cluster>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(name)
            .await
            .map_err(|e| Error::kube("reading the owner Cluster", e))?,
        ClusterOwner::Provider(_) => None,
    };
    let generation = lvc.metadata.generation;
    let mut status = lvc.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let (flag, reason, message) =
        contract::paused_condition_fields(cluster.as_ref(), &lvc.metadata, "LibvirtCluster");
    condition::set(
        &mut status.conditions,
        cond(
            condition::PAUSED,
            if flag == "True" {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason,
            message,
            generation,
        ),
    );
    if contract::is_paused(cluster.as_ref(), &lvc.metadata) {
        write_status(&api, &lvc, &status).await?;
        return Ok(Action::await_change());
    }
    if deleting {
        // The cluster owns nothing on libvirt: machines are deleted first.
        if has_finalizer {
            set_finalizer(&api, &lvc, false).await?;
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        set_finalizer(&api, &lvc, true).await?;
    }
    if let Some(c) = &cluster
        && let Some(endpoint) = endpoint_to_mirror(&lvc, c)
    {
        let patch = serde_json::json!({"spec": {"controlPlaneEndpoint": endpoint}});
        api.patch(&lvc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("mirroring the Cluster's controlPlaneEndpoint", e))?;
    }
    // Standalone clusters have no workload API server.
    let needs_endpoint = matches!(owner, ClusterOwner::Cluster(_));
    let has_endpoint = lvc.spec.control_plane_endpoint.is_some()
        || cluster
            .as_ref()
            .is_some_and(|c| endpoint_to_mirror(&lvc, c).is_some());

    let (ready_reason, ready_message, provisioned) = match hosts::resolve(&ctx.client, &lvc, &read).await? {
        Err(e) => {
            condition::set(
                &mut status.conditions,
                cond(
                    LIBVIRT_CONNECTED,
                    ConditionStatus::False,
                    e.reason,
                    e.message.clone(),
                    generation,
                ),
            );
            (e.reason, e.message, false)
        }
        Ok(specs) => {
            let mut up = Vec::new();
            let mut down = Vec::new();
            for h in &specs {
                match ctx.connector.connect(&h.uri).host_info().await {
                    Ok(_) => up.push((h.name.clone(), h.control_plane)),
                    Err(e) => down.push(format!("{}: {}", h.name, e.message)),
                }
            }
            up.sort();
            status.failure_domains = up
                .iter()
                .map(|(name, control_plane)| FailureDomain {
                    name: name.clone(),
                    control_plane: Some(*control_plane),
                    attributes: None,
                })
                .collect();
            let connected = down.is_empty();
            condition::set(
                &mut status.conditions,
                cond(
                    LIBVIRT_CONNECTED,
                    ConditionStatus::from(connected),
                    if connected { "Connected" } else { "Unreachable" },
                    down.join("; "),
                    generation,
                ),
            );
            match (up.is_empty(), needs_endpoint && !has_endpoint) {
                (true, _) => ("Unreachable", down.join("; "), false),
                (false, true) => (
                    "WaitingForControlPlaneEndpoint",
                    "set spec.controlPlaneEndpoint on the LibvirtCluster or the Cluster".to_owned(),
                    false,
                ),
                (false, false) => ("Provisioned", String::new(), true),
            }
        }
    };
    // Once provisioned, CAPI never looks back: keep it through outages.
    if provisioned || Initialization::is_provisioned(status.initialization.as_ref()) {
        status.initialization = Initialization::provisioned(true);
    }
    condition::set(
        &mut status.conditions,
        cond(
            condition::READY,
            ConditionStatus::from(provisioned),
            ready_reason,
            ready_message,
            generation,
        ),
    );
    write_status(&api, &lvc, &status).await?;
    let connected = condition::is_true(&status.conditions, LIBVIRT_CONNECTED);
    Ok(Action::requeue(if connected { RESYNC } else { ctx.retry }))
}

fn cluster_to_infra(cluster: Cluster) -> Option<ObjectRef<LibvirtCluster>> {
    let r = cluster.spec.infrastructure_ref.as_ref()?;
    (r.kind == "LibvirtCluster" && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
        .then(|| ObjectRef::new(&r.name).within(&cluster.namespace().unwrap_or_default()))
}

/// Runs the LibvirtCluster controller until `shutdown`.
pub async fn run<C: Connector>(
    ctx: Arc<ClusterContext<C>>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    run_with_metrics(ctx, namespace, concurrency, shutdown, Default::default()).await;
}

/// The `controller` label of this controller's metrics.
pub const METRICS_NAME: &str = "libvirtcluster";

/// [`run`], recording every reconcile into `metrics`.
pub async fn run_with_metrics<C: Connector>(
    ctx: Arc<ClusterContext<C>>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    metrics: banlieue_provider_runtime::metrics::Metrics,
) {
    let client = ctx.client.clone();
    let (lvcs, clusters): (Api<LibvirtCluster>, Api<Cluster>) = match namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client, ns)),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let secrets = secrets_api(ctx.client.clone(), namespace);
    Controller::new(lvcs, watcher::Config::default())
        .watches(clusters, watcher::Config::default(), cluster_to_infra)
        // A created or fixed credentials Secret concerns the clusters whose hosts use it.
        .watches(secrets, watcher::Config::default(), ctx.secrets.mapper())
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            move |obj, ctx| {
                let metrics = metrics.clone();
                async move {
                    metrics
                        .observe(METRICS_NAME, Error::metric_label, reconcile(obj, ctx))
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn meta(api_version: &str, kind: &str, controller: bool) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "o".into(),
                uid: "u".into(),
                controller: Some(controller),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn owners_are_a_capi_cluster_or_a_controlling_provider() {
        assert_eq!(
            cluster_owner(&meta("cluster.x-k8s.io/v1beta2", "Cluster", true)),
            Some(ClusterOwner::Cluster("o".into()))
        );
        assert_eq!(
            cluster_owner(&meta("banlieue.io/v1alpha1", "Provider", true)),
            Some(ClusterOwner::Provider("o".into()))
        );
        assert_eq!(
            cluster_owner(&meta("banlieue.io/v1alpha1", "Provider", false)),
            None
        );
        assert_eq!(cluster_owner(&meta("example.com/v1", "Provider", true)), None);
        assert_eq!(cluster_owner(&ObjectMeta::default()), None);
    }
}
