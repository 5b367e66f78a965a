//! The ProxmoxCluster reconciler (CAPI InfraCluster contract).
//!
//! Reads the credentials Secret, checks connectivity (`GET /version`) and permissions (node and
//! guest listing), reports them in the `ProxmoxConnected` condition, publishes one failure
//! domain per allowed node (every online node when `spec.allowedNodes` is empty), handles
//! `spec.controlPlaneEndpoint` (a user value is never overwritten; when unset, the Cluster's is
//! mirrored once it exists) and sets `status.initialization.provisioned` and `Ready`.
//!
//! Only ProxmoxClusters owned by a CAPI Cluster, or by a banlieue `Provider` (standalone mode,
//! see [`banlieue_api::standalone`]), are reconciled (the finalizer is added once the owner
//! exists); objects with `cluster.x-k8s.io/managed-by` are skipped entirely. A standalone
//! cluster has no CAPI Cluster: it is paused only by its annotation, needs no
//! `controlPlaneEndpoint`, and takes endpoint, credentials, TLS and nodes from the Provider its
//! `spec.providerRef` names (see [`crate::credentials::connection_source`]). Every transition
//! of the `ProxmoxConnected`, `Ready` and `Paused` conditions is also a Kubernetes Event.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::banlieue::Provider;
use banlieue_api::common::{ApiEndpoint, FailureDomain, Initialization};
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxClusterStatus, ProxmoxMachine};
use banlieue_api::standalone;
use banlieue_capi::Cluster;
use banlieue_capi::contract;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{instrument, warn};

use crate::credentials::{Connector, connection_from, read_source, referenced_secrets};
use crate::error::{Error, Result};
use crate::hypervisor::{Hypervisor, NodeLoad};
use crate::machine_controller::{FIELD_MANAGER, FINALIZER};
use banlieue_provider_runtime::secret_watch::{SecretIndex, secrets_api};

/// Condition type: Proxmox VE answers with these credentials and they may list nodes and guests.
pub const PROXMOX_CONNECTED: &str = "ProxmoxConnected";
/// Resync period (refreshes connectivity and failure domains).
pub const RESYNC: Duration = Duration::from_secs(300);

/// Shared state of the ProxmoxCluster controller.
pub struct ClusterContext<C: Connector> {
    /// Kubernetes client.
    pub client: kube::Client,
    /// Builds hypervisor handles.
    pub connector: C,
    /// Counters for `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// Event recorder (an Event per condition transition).
    pub recorder: Recorder,
    /// How often discovery is asked whether Cluster API got installed, while it is not
    /// ([`crate::capi_discovery`]).
    pub capi_discovery_interval: std::time::Duration,
    /// The Secrets each ProxmoxCluster references (credentials, CA bundle), for the Secret watch.
    pub secrets: SecretIndex<ProxmoxCluster>,
}

impl<C: Connector> ClusterContext<C> {
    /// A context reporting Events as `reporter`.
    pub fn new(client: kube::Client, connector: C, reporter: &str) -> Self {
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
            metrics: crate::metrics::Metrics::default(),
            recorder,
            capi_discovery_interval: crate::capi_discovery::CAPI_DISCOVERY_INTERVAL,
            secrets: SecretIndex::default(),
        }
    }
}

/// Who owns a ProxmoxCluster, and so which mode it is reconciled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterOwner {
    /// A CAPI `Cluster` (the InfraCluster contract).
    Cluster(String),
    /// A banlieue `Provider` (standalone mode: the infra cluster the banlieue controller creates
    /// per Provider and namespace; no CAPI Cluster exists).
    Provider(String),
}

/// The owner that puts a ProxmoxCluster under this controller: a CAPI Cluster, else a banlieue
/// Provider; `None` = not reconciled (no finalizer, no status).
pub fn cluster_owner(meta: &ObjectMeta) -> Option<ClusterOwner> {
    if let Some(o) = contract::owner_cluster(meta) {
        return Some(ClusterOwner::Cluster(o.name.clone()));
    }
    contract::find_owner(meta, standalone::OWNER_GROUP, standalone::PROVIDER_KIND)
        .map(|o| ClusterOwner::Provider(o.name.clone()))
}

/// The Events to publish for condition changes between `old` and `new`: one per condition of
/// `types` whose status or reason changed (`Normal` when it became True, else `Warning`).
pub fn transition_events(
    old: &[condition::Condition],
    new: &[condition::Condition],
    types: &[&str],
) -> Vec<(EventType, String, String)> {
    types
        .iter()
        .filter_map(|t| {
            let after = condition::find(new, t)?;
            let before = condition::find(old, t);
            if before.is_some_and(|b| b.status == after.status && b.reason == after.reason) {
                return None;
            }
            let type_ = if after.status == "True" {
                EventType::Normal
            } else {
                EventType::Warning
            };
            let note = if after.message.is_empty() {
                format!("{t} is {}", after.status)
            } else {
                format!("{t} is {}: {}", after.status, after.message)
            };
            Some((type_, after.reason.clone(), note))
        })
        .collect()
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn cond(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> condition::Condition {
    condition::new_condition(type_, status, reason, message, generation, now())
}

/// The failure domains for `allowed` nodes (all online nodes when empty), sorted by name, and
/// the allowed nodes that are not online.
pub fn failure_domains(allowed: &[String], nodes: &[NodeLoad]) -> (Vec<FailureDomain>, Vec<String>) {
    let online = |name: &str| nodes.iter().any(|n| n.name == name && n.online);
    let mut names: Vec<String> = if allowed.is_empty() {
        nodes
            .iter()
            .filter(|n| n.online)
            .map(|n| n.name.clone())
            .collect()
    } else {
        allowed.iter().filter(|n| online(n)).cloned().collect()
    };
    names.sort();
    names.dedup();
    let missing = allowed.iter().filter(|n| !online(n)).cloned().collect();
    let domains = names
        .into_iter()
        .map(|name| FailureDomain {
            name,
            control_plane: Some(true),
            attributes: None,
        })
        .collect();
    (domains, missing)
}

/// The endpoint to set on the ProxmoxCluster: `None` when the user set one (never overwritten)
/// or when the Cluster has none yet.
pub fn endpoint_to_mirror(pxc: &ProxmoxCluster, cluster: &Cluster) -> Option<ApiEndpoint> {
    if pxc.spec.control_plane_endpoint.is_some() {
        return None;
    }
    let ep = cluster.spec.control_plane_endpoint.as_ref()?;
    let host = ep.host.clone().filter(|h| !h.is_empty())?;
    let port = ep.port.filter(|p| (1..=65535).contains(p))?;
    Some(ApiEndpoint { host, port })
}

/// Reconciles one ProxmoxCluster.
#[instrument(skip_all, fields(namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<C: Connector>(
    obj: Arc<ProxmoxCluster>,
    ctx: Arc<ClusterContext<C>>,
) -> Result<Action> {
    let started = std::time::Instant::now();
    let res = reconcile_inner(&obj, &ctx).await;
    ctx.metrics.record(
        "proxmoxcluster",
        started.elapsed(),
        res.as_ref().err().map(Error::metric_label),
    );
    if let Err(e) = &res {
        warn!(error = %e, "reconcile failed");
    }
    res
}

/// Error policy: retry after 30 s.
pub fn error_policy<C: Connector>(
    _obj: Arc<ProxmoxCluster>,
    _err: &Error,
    _ctx: Arc<ClusterContext<C>>,
) -> Action {
    Action::requeue(Duration::from_secs(30))
}

/// Applies `new` to `/status` when it changed, then publishes an Event per condition
/// transition.
async fn write_status<C: Connector>(
    ctx: &ClusterContext<C>,
    api: &Api<ProxmoxCluster>,
    pxc: &ProxmoxCluster,
    new: &ProxmoxClusterStatus,
) -> Result<()> {
    if pxc.status.as_ref() == Some(new) || (pxc.status.is_none() && *new == ProxmoxClusterStatus::default()) {
        return Ok(());
    }
    let old = pxc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let events = transition_events(
        old,
        &new.conditions,
        &[PROXMOX_CONNECTED, condition::READY, condition::PAUSED],
    );
    let patch = serde_json::json!({
        "apiVersion": ProxmoxCluster::api_version(&()),
        "kind": ProxmoxCluster::kind(&()),
        "status": new,
    });
    api.patch_status(
        &pxc.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| Error::kube("writing ProxmoxCluster status", e))?;
    ctx.metrics.count_write("status");
    for (type_, reason, note) in events {
        let event = Event {
            type_,
            reason,
            note: Some(note),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &pxc.object_ref(&())).await {
            warn!(error = %e, "cannot publish event");
        }
    }
    Ok(())
}

async fn set_finalizer(api: &Api<ProxmoxCluster>, pxc: &ProxmoxCluster, present: bool) -> Result<()> {
    let mut finalizers = pxc.finalizers().to_vec();
    if present {
        finalizers.push(FINALIZER.to_owned());
    } else {
        finalizers.retain(|f| f != FINALIZER);
    }
    let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": pxc.resource_version()}});
    api.patch(&pxc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube("updating ProxmoxCluster finalizers", e))?;
    Ok(())
}

async fn reconcile_inner<C: Connector>(obj: &ProxmoxCluster, ctx: &ClusterContext<C>) -> Result<Action> {
    let namespace = obj.namespace().unwrap_or_default();
    let api: Api<ProxmoxCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(pxc) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube("reading ProxmoxCluster", e))?
    else {
        return Ok(Action::await_change());
    };
    if contract::is_externally_managed(&pxc.metadata) {
        return Ok(Action::await_change());
    }
    let has_finalizer = pxc.finalizers().iter().any(|f| f == FINALIZER);
    let deleting = pxc.meta().deletion_timestamp.is_some();
    let Some(owner) = cluster_owner(&pxc.metadata) else {
        if deleting && has_finalizer {
            set_finalizer(&api, &pxc, false).await?;
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
    let standalone = matches!(owner, ClusterOwner::Provider(_));
    let generation = pxc.metadata.generation;
    let mut status = pxc.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let (flag, reason, message) =
        contract::paused_condition_fields(cluster.as_ref(), &pxc.metadata, "ProxmoxCluster");
    let flag = if flag == "True" {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    condition::set(
        &mut status.conditions,
        cond(condition::PAUSED, flag, reason, message, generation),
    );
    if contract::is_paused(cluster.as_ref(), &pxc.metadata) {
        write_status(ctx, &api, &pxc, &status).await?;
        return Ok(Action::await_change());
    }
    if deleting {
        // The ProxmoxCluster owns nothing on Proxmox, but its machines need its connection
        // settings to delete their VMs. CAPI deletes machines first; a standalone cluster can go
        // first (namespace deletion, garbage collection), so it waits for its machines.
        if standalone && has_finalizer {
            let pxc_name = pxc.name_any();
            let waiting: Vec<String> = Api::<ProxmoxMachine>::namespaced(ctx.client.clone(), &namespace)
                .list(&Default::default())
                .await
                .map_err(|e| Error::kube("listing ProxmoxMachines", e))?
                .items
                .iter()
                .filter(|pm| crate::owner::standalone_cluster_name(pm).as_deref() == Some(pxc_name.as_str()))
                .map(ResourceExt::name_any)
                .collect();
            if !waiting.is_empty() {
                condition::set(
                    &mut status.conditions,
                    cond(
                        condition::READY,
                        ConditionStatus::False,
                        "WaitingForMachines",
                        format!(
                            "deleting: waiting for {} ProxmoxMachine(s) to delete their VMs: {}",
                            waiting.len(),
                            waiting.join(", ")
                        ),
                        generation,
                    ),
                );
                write_status(ctx, &api, &pxc, &status).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        }
        if has_finalizer {
            set_finalizer(&api, &pxc, false).await?;
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        set_finalizer(&api, &pxc, true).await?;
    }
    if let Some(cluster) = &cluster
        && let Some(endpoint) = endpoint_to_mirror(&pxc, cluster)
    {
        let patch = serde_json::json!({"spec": {"controlPlaneEndpoint": endpoint}});
        api.patch(&pxc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("mirroring the Cluster's controlPlaneEndpoint", e))?;
    }
    // A standalone cluster hosts VirtualMachines, not a Kubernetes control plane.
    let has_endpoint = standalone
        || pxc.spec.control_plane_endpoint.is_some()
        || cluster
            .as_ref()
            .is_some_and(|c| endpoint_to_mirror(&pxc, c).is_some());

    let connection = match read_source(&ctx.client, &pxc).await {
        Ok((source, provider)) => {
            // Recorded before the Secret is read: a missing one is what the watch waits for.
            ctx.secrets
                .set(ObjectRef::from_obj(&pxc), referenced_secrets(&source));
            connection_from(&ctx.client, &pxc, source, provider.as_ref()).await
        }
        Err(e) => Err(e),
    };
    let connected = match connection {
        Err(Error::Credentials(message)) => Err(("CredentialsInvalid", message)),
        Err(Error::Provider { reason, message }) => Err((reason, message)),
        Err(e) => return Err(e),
        Ok(connection) => {
            let key = format!("{namespace}/{}", pxc.name_any());
            match ctx.connector.connect(&key, &connection) {
                Err(e) => Err(("CredentialsInvalid", e.to_string())),
                Ok(hv) => check(&hv, &connection.endpoint)
                    .await
                    .map(|nodes| (nodes, connection.allowed_nodes)),
            }
        }
    };
    let (ready_reason, ready_message, provisioned) = match connected {
        Ok((nodes, allowed_nodes)) => {
            let (domains, missing) = failure_domains(&allowed_nodes, &nodes);
            let message = if missing.is_empty() {
                String::new()
            } else {
                format!("allowed nodes not online: {}", missing.join(", "))
            };
            condition::set(
                &mut status.conditions,
                cond(
                    PROXMOX_CONNECTED,
                    ConditionStatus::True,
                    "Connected",
                    message,
                    generation,
                ),
            );
            let any = !domains.is_empty();
            status.failure_domains = domains;
            match (any, has_endpoint) {
                (false, _) => (
                    "NoOnlineNode",
                    "no allowed Proxmox node is online".to_owned(),
                    false,
                ),
                (true, false) => (
                    "WaitingForControlPlaneEndpoint",
                    "set spec.controlPlaneEndpoint on the ProxmoxCluster or the Cluster".to_owned(),
                    false,
                ),
                (true, true) => ("Provisioned", String::new(), true),
            }
        }
        Err((reason, message)) => {
            condition::set(
                &mut status.conditions,
                cond(
                    PROXMOX_CONNECTED,
                    ConditionStatus::False,
                    reason,
                    message.clone(),
                    generation,
                ),
            );
            (reason, message, false)
        }
    };
    // Once provisioned, CAPI never looks back: keep `provisioned` true through outages.
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
    write_status(ctx, &api, &pxc, &status).await?;
    Ok(Action::requeue(RESYNC))
}

/// Connectivity and permission check: version, nodes, guests. A failure is reported with
/// [`crate::error::connection_reason`]'s reason (`ProxmoxRequestFailed` for any other error,
/// e.g. a 5xx) and the endpoint and the error as message.
async fn check<H: Hypervisor>(
    hv: &H,
    endpoint: &str,
) -> std::result::Result<Vec<NodeLoad>, (&'static str, String)> {
    let classify = |e: crate::hypervisor::PveError| {
        let reason = crate::error::connection_reason(&e).unwrap_or("ProxmoxRequestFailed");
        (reason, format!("Proxmox VE at {endpoint}: {e}"))
    };
    hv.version().await.map_err(classify)?;
    let nodes = hv.nodes().await.map_err(classify)?;
    hv.guests().await.map_err(classify)?;
    Ok(nodes)
}

fn cluster_to_infra(cluster: Cluster) -> Option<ObjectRef<ProxmoxCluster>> {
    let r = cluster.spec.infrastructure_ref.as_ref()?;
    (r.kind == "ProxmoxCluster" && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
        .then(|| ObjectRef::new(&r.name).within(&cluster.namespace().unwrap_or_default()))
}

/// Runs the ProxmoxCluster controller until `shutdown`; restarted with the Cluster watch when
/// Cluster API gets installed meanwhile ([`crate::capi_discovery`]).
pub async fn run<C: Connector>(
    ctx: Arc<ClusterContext<C>>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    crate::capi_discovery::run_until_shutdown(
        ctx.client.clone(),
        "proxmoxcluster",
        ctx.capi_discovery_interval,
        shutdown,
        |capi, stop| run_once(ctx.clone(), namespace, concurrency, capi, stop),
    )
    .await;
}

/// One run of the ProxmoxCluster controller, with the Cluster watch when `capi`.
async fn run_once<C: Connector>(
    ctx: Arc<ClusterContext<C>>,
    namespace: Option<&str>,
    concurrency: u16,
    capi: bool,
    shutdown: crate::capi_discovery::Stop,
) {
    let client = ctx.client.clone();
    let (pxcs, clusters): (Api<ProxmoxCluster>, Api<Cluster>) = match namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client, ns)),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let providers: Api<Provider> = Api::all(ctx.client.clone());
    let controller = Controller::new(pxcs, watcher::Config::default());
    let store = controller.store();
    // A Provider change (endpoint, credentials, nodes) concerns every ProxmoxCluster naming it.
    let provider_to_infra = move |provider: Provider| {
        let name = provider.name_any();
        store
            .state()
            .into_iter()
            .filter(|c| c.spec.provider_ref.as_ref().is_some_and(|p| p.name == name))
            .map(|c| ObjectRef::from_obj(&*c))
            .collect::<Vec<_>>()
    };
    // A created or changed credentials / CA bundle Secret concerns the clusters referencing it.
    let mut controller = controller
        .watches(providers, watcher::Config::default(), provider_to_infra)
        .watches(
            secrets_api(ctx.client.clone(), namespace),
            watcher::Config::default(),
            ctx.secrets.mapper(),
        );
    if capi {
        controller = controller.watches(clusters, watcher::Config::default(), cluster_to_infra);
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
    use banlieue_capi::generated::cluster::{ClusterControlPlaneEndpoint, ClusterSpec};
    use rstest::rstest;

    fn nodes() -> Vec<NodeLoad> {
        ["pve2", "pve1", "pve3"]
            .iter()
            .map(|n| NodeLoad {
                name: n.to_string(),
                online: *n != "pve3",
                free_memory: 0,
            })
            .collect()
    }

    #[rstest]
    #[case::all_online_sorted(&[], &["pve1", "pve2"], &[])]
    #[case::allowed_only(&["pve2"], &["pve2"], &[])]
    #[case::offline_allowed_reported(&["pve3", "pve1"], &["pve1"], &["pve3"])]
    #[case::unknown_allowed_reported(&["pve9"], &[], &["pve9"])]
    fn failure_domains_come_from_online_allowed_nodes(
        #[case] allowed: &[&str],
        #[case] want: &[&str],
        #[case] missing: &[&str],
    ) {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        let (domains, got_missing) = failure_domains(&allowed, &nodes());
        let names: Vec<&str> = domains.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, want);
        assert!(domains.iter().all(|d| d.control_plane == Some(true)));
        assert_eq!(got_missing, missing);
    }

    fn cluster(host: Option<&str>, port: Option<i32>) -> Cluster {
        Cluster::new(
            "c1",
            ClusterSpec {
                control_plane_endpoint: Some(ClusterControlPlaneEndpoint {
                    host: host.map(str::to_owned),
                    port,
                }),
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_user_endpoint_is_never_overwritten_and_the_clusters_is_mirrored_only_when_complete() {
        let mut pxc = ProxmoxCluster::new("c1", Default::default());
        assert_eq!(
            endpoint_to_mirror(&pxc, &cluster(Some("10.0.0.1"), Some(6443))),
            Some(ApiEndpoint {
                host: "10.0.0.1".into(),
                port: 6443
            })
        );
        assert_eq!(endpoint_to_mirror(&pxc, &cluster(Some(""), Some(6443))), None);
        assert_eq!(endpoint_to_mirror(&pxc, &cluster(Some("h"), None)), None);
        assert_eq!(
            endpoint_to_mirror(&pxc, &Cluster::new("c1", Default::default())),
            None
        );
        pxc.spec.control_plane_endpoint = Some(ApiEndpoint {
            host: "user".into(),
            port: 443,
        });
        assert_eq!(
            endpoint_to_mirror(&pxc, &cluster(Some("10.0.0.1"), Some(6443))),
            None
        );
    }

    fn owned_by(api_version: &str, kind: &str) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: "o".into(),
                    uid: "u".into(),
                    controller: Some(true),
                    block_owner_deletion: None,
                },
            ]),
            ..Default::default()
        }
    }

    #[rstest]
    #[case::capi("cluster.x-k8s.io/v1beta2", "Cluster", Some(ClusterOwner::Cluster("o".into())))]
    #[case::provider("banlieue.io/v1alpha1", "Provider", Some(ClusterOwner::Provider("o".into())))]
    #[case::clusterctl_provider("clusterctl.cluster.x-k8s.io/v1alpha3", "Provider", None)]
    #[case::other("example.com/v1", "Cluster", None)]
    fn a_capi_cluster_or_a_banlieue_provider_puts_the_cluster_under_control(
        #[case] api_version: &str,
        #[case] kind: &str,
        #[case] want: Option<ClusterOwner>,
    ) {
        assert_eq!(cluster_owner(&owned_by(api_version, kind)), want);
        assert_eq!(cluster_owner(&ObjectMeta::default()), None);
    }

    fn c(type_: &str, status: ConditionStatus, reason: &str, message: &str) -> condition::Condition {
        cond(type_, status, reason, message, Some(1))
    }

    #[test]
    fn events_are_published_for_status_or_reason_transitions_only() {
        let old = vec![
            c(
                "Ready",
                ConditionStatus::False,
                "WaitingForControlPlaneEndpoint",
                "",
            ),
            c(PROXMOX_CONNECTED, ConditionStatus::True, "Connected", ""),
        ];
        // First observation of each condition: an Event each.
        let first = transition_events(&[], &old, &["Ready", PROXMOX_CONNECTED]);
        assert_eq!(first.len(), 2);
        // Same status and reason, new message: no Event.
        let same = vec![
            c(
                "Ready",
                ConditionStatus::False,
                "WaitingForControlPlaneEndpoint",
                "other text",
            ),
            c(PROXMOX_CONNECTED, ConditionStatus::True, "Connected", ""),
        ];
        assert!(transition_events(&old, &same, &["Ready", PROXMOX_CONNECTED]).is_empty());
        // Ready flips to True (Normal); connectivity lost with a reason (Warning).
        let new = vec![
            c("Ready", ConditionStatus::True, "Provisioned", ""),
            c(
                PROXMOX_CONNECTED,
                ConditionStatus::False,
                "AuthenticationFailed",
                "401 no ticket",
            ),
        ];
        let events = transition_events(&old, &new, &["Ready", PROXMOX_CONNECTED]);
        assert_eq!(
            events,
            vec![
                (
                    EventType::Normal,
                    "Provisioned".to_owned(),
                    "Ready is True".to_owned()
                ),
                (
                    EventType::Warning,
                    "AuthenticationFailed".to_owned(),
                    "ProxmoxConnected is False: 401 no ticket".to_owned()
                ),
            ]
        );
    }
}
