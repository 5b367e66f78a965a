//! The InfraCluster reconciler, for every hypervisor (CAPI's InfraCluster contract, and the
//! standalone infra clusters the banlieue controller creates per Provider).
//!
//! An infra cluster is reconciled when its owner is a CAPI `Cluster` or (standalone) a banlieue
//! `Provider`; one with `cluster.x-k8s.io/managed-by` is left alone entirely. In order:
//!
//! 1. `Paused` (the Cluster's `spec.paused` or the annotation): recorded, nothing else done.
//! 2. Deletion: the finalizer is held while an InfraMachine still takes its connection from
//!    the cluster (`Ready` False `WaitingForMachines`), then released.
//! 3. The finalizer; the Cluster's `controlPlaneEndpoint` mirrored when the user set none.
//! 4. The [`ClusterBackend`] checks the hypervisor: the `<Hypervisor>Connected` condition, the
//!    failure domains and the hypervisor's version.
//! 5. `Ready` and `status.initialization.provisioned` (which stays true through later outages:
//!    CAPI never looks back), `/status` written once and only when it changed, an Event per
//!    condition transition.
//!
//! The watches: the infra clusters, CAPI Clusters (once CAPI is served, see [`crate::capi`]),
//! banlieue Providers (a standalone cluster takes its connection from one), and the Secrets
//! each cluster's last reconcile read.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::banlieue::Provider;
use banlieue_api::common::{ApiEndpoint, FailureDomain, Initialization};
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_api::infrastructure::kinds::{ContractStatus, InfraCluster, InfraClusterStatus, InfraMachine};
use banlieue_api::standalone;
use banlieue_capi::Cluster;
use banlieue_capi::contract;
use banlieue_provider_runtime::events::Publisher;
use banlieue_provider_runtime::metrics::Metrics;
use banlieue_provider_runtime::secret_watch::{SecretIndex, secrets_api};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{instrument, warn};

use crate::drive::api;
use crate::error::{Error, ReconcileError, Result};
use crate::events::{self, Watched};
use crate::secrets::ReadSecrets;
use crate::status;

/// Condition reason: deletion waits for the cluster's machines.
pub const WAITING_FOR_MACHINES: &str = "WaitingForMachines";
/// Condition reason: a CAPI cluster needs `spec.controlPlaneEndpoint`.
pub const WAITING_FOR_CONTROL_PLANE_ENDPOINT: &str = "WaitingForControlPlaneEndpoint";
/// Condition reason: the cluster is provisioned.
pub const PROVISIONED: &str = "Provisioned";
/// Condition reason: the hypervisor answers.
pub const CONNECTED: &str = "Connected";
/// Re-check of a ready cluster (reachability, credentials, failure domains).
pub const RESYNC: Duration = Duration::from_secs(300);
/// Re-check of a cluster that is not ready (a created or fixed Secret or Provider is acted on
/// at once: they are watched).
pub const RETRY: Duration = Duration::from_secs(15);
/// Re-check of a deleting cluster waiting for its machines.
pub const MACHINE_WAIT: Duration = Duration::from_secs(5);

/// Why something does not work, for a condition: a reason (a constant, CamelCase) and a message
/// a human can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The condition reason.
    pub reason: &'static str,
    /// What is wrong, and what to do.
    pub message: String,
}

impl Problem {
    /// A problem with `reason` and `message`.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// The value of a `Result<T, Problem>`, else returns `Ok(Err(problem))` from the enclosing
/// function: the `?` of a step whose problem is an answer (said in a condition), not an error.
#[macro_export]
macro_rules! usable {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(problem) => return Ok(Err(problem)),
        }
    };
}

/// What the backend found when it checked the hypervisor of an infra cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterCheck {
    /// The connection condition: `Ok(note)` (the note may say what is degraded) or why not.
    pub connected: Result<String, Problem>,
    /// Whether machines can be placed (`Err`: `Ready` False with that reason).
    pub usable: Result<(), Problem>,
    /// The failure domains (`None`: keep the published ones, e.g. while unreachable).
    pub failure_domains: Option<Vec<FailureDomain>>,
    /// The hypervisor's version, where known.
    pub version: Option<String>,
    /// The connection does not verify the server's TLS certificate (`tls.insecureSkipVerify`).
    pub insecure_tls: bool,
}

impl ClusterCheck {
    /// The hypervisor could not be used at all (unreachable, credentials refused).
    pub fn failed(problem: Problem) -> Self {
        Self {
            connected: Err(problem.clone()),
            usable: Err(problem),
            failure_domains: None,
            version: None,
            insecure_tls: false,
        }
    }

    /// Connected as `connected` says, with these failure domains: usable while there is one,
    /// else not, for the reason `none` gives (no version known, the certificate verified).
    pub fn with_domains(
        connected: Result<String, Problem>,
        domains: Vec<FailureDomain>,
        none: Problem,
    ) -> Self {
        Self {
            connected,
            usable: if domains.is_empty() { Err(none) } else { Ok(()) },
            failure_domains: Some(domains),
            version: None,
            insecure_tls: false,
        }
    }
}

/// The message of a connection condition that is True without verifying the server's
/// certificate, before the backend's `note`.
pub const INSECURE_TLS_MESSAGE: &str = "the server's TLS certificate is not verified (tls.insecureSkipVerify): a host on the \
     path can impersonate it and read the credentials; pin it with tls.sha256Fingerprint or trust its CA with \
     tls.caBundleRef";

/// The hypervisor side of the InfraCluster reconciler.
pub trait ClusterBackend: Send + Sync + 'static {
    /// The infra cluster kind.
    type Cluster: InfraCluster;
    /// The infra machine kind (deletion waits for the cluster's machines).
    type Machine: InfraMachine<Cluster = Self::Cluster>;
    /// The backend's hard errors (Kubernetes reads); everything the user can fix is a
    /// [`Problem`] in the [`ClusterCheck`].
    type Error: ReconcileError;
    /// The provider's finalizer: its machine kind's backend's ([`Backend::finalizer`]) unless it
    /// says otherwise.
    ///
    /// [`Backend::finalizer`]: banlieue_api::common::Backend::finalizer
    const FINALIZER: &'static str = <Self::Machine as InfraMachine>::BACKEND.finalizer();
    /// The provider's field manager for server-side apply.
    const FIELD_MANAGER: &'static str;
    /// The connection condition type (`ProxmoxConnected`, `LibvirtConnected`, …).
    const CONNECTED_CONDITION: &'static str;

    /// Checks the hypervisor `cluster` points at (`Err(problem)`: it cannot be used at all,
    /// [`ClusterCheck::failed`]). Secrets it reads are recorded in `secrets` first (the Secret
    /// watch then follows them).
    fn check(
        &self,
        client: &kube::Client,
        cluster: &Self::Cluster,
        secrets: &ReadSecrets<Self::Cluster>,
    ) -> impl Future<Output = Result<Result<ClusterCheck, Problem>, Self::Error>> + Send;
}

/// Shared state of an InfraCluster controller.
pub struct ClusterContext<B: ClusterBackend> {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The hypervisor backend.
    pub backend: B,
    /// The provider's metrics registry.
    pub metrics: Metrics,
    /// Event recorder (an Event per condition transition).
    pub recorder: Publisher,
    /// The Secrets each cluster's last reconcile read, for the Secret watch.
    pub secrets: SecretIndex<B::Cluster>,
    /// Requeue of a cluster that is not ready ([`RETRY`]).
    pub retry: Duration,
    /// How often discovery is asked whether Cluster API got installed ([`crate::capi`]).
    pub capi_discovery_interval: Duration,
    /// Only clusters labelled `cluster.x-k8s.io/watch-filter=<this>` (CAPI's `--watch-filter`).
    pub watch_filter: Option<String>,
}

impl<B: ClusterBackend> ClusterContext<B> {
    /// A context with the default timings, reporting Events as `reporter`.
    pub fn new(client: kube::Client, backend: B, reporter: &str) -> Self {
        Self {
            recorder: events::recorder(client.clone(), reporter),
            client,
            backend,
            metrics: Metrics::default(),
            secrets: SecretIndex::default(),
            retry: RETRY,
            capi_discovery_interval: crate::capi::CAPI_DISCOVERY_INTERVAL,
            watch_filter: None,
        }
    }
}

/// Who owns an infra cluster, and so which mode it is reconciled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterOwner {
    /// A CAPI `Cluster` (the InfraCluster contract).
    Cluster(String),
    /// A banlieue `Provider` (standalone: no CAPI Cluster exists).
    Provider(String),
}

/// The owner that puts an infra cluster under its controller: a CAPI Cluster, else a banlieue
/// Provider; `None` = not reconciled (no finalizer, no status).
pub fn cluster_owner(meta: &ObjectMeta) -> Option<ClusterOwner> {
    if let Some(o) = contract::owner_cluster(meta) {
        return Some(ClusterOwner::Cluster(o.name.clone()));
    }
    contract::find_owner(meta, standalone::OWNER_GROUP, standalone::PROVIDER_KIND)
        .map(|o| ClusterOwner::Provider(o.name.clone()))
}

/// The endpoint to set on the infra cluster: `None` when the user set one (never overwritten)
/// or when the Cluster has no complete one yet.
pub fn endpoint_to_mirror(own: Option<&ApiEndpoint>, cluster: &Cluster) -> Option<ApiEndpoint> {
    if own.is_some() {
        return None;
    }
    let ep = cluster.spec.control_plane_endpoint.as_ref()?;
    let host = ep.host.clone().filter(|h| !h.is_empty())?;
    let port = ep.port.filter(|p| (1..=65535).contains(p))?;
    Some(ApiEndpoint { host, port })
}

/// Whether `machine` takes its connection from `infra`: a standalone machine through its
/// Provider (`banlieue-<provider>`), a CAPI machine through the cluster-name label of the CAPI
/// Cluster owning `infra`.
pub fn belongs_to<M: InfraMachine>(machine: &M, infra: &M::Cluster) -> bool {
    if let Some(p) = machine.provider_ref() {
        return standalone::infra_cluster_name(&p.name) == infra.name_any();
    }
    match (
        contract::owner_cluster(infra.meta()),
        contract::cluster_name(machine.meta()),
    ) {
        (Some(owner), Some(label)) => owner.name == label,
        _ => false,
    }
}

/// The `Ready` message while deletion waits for machines: how many and which (ten at most).
pub fn waiting_message(kind: &str, remaining: &[String]) -> String {
    let shown: Vec<&str> = remaining.iter().take(10).map(String::as_str).collect();
    let more = remaining.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "deleting: waiting for {} {kind}(s) to delete their VMs: {}{tail}",
        remaining.len(),
        shown.join(", ")
    )
}

/// The `Ready` condition's status, reason and message from the check (pure). A standalone
/// cluster hosts VirtualMachines, not a Kubernetes control plane: it needs no endpoint.
pub fn readiness(check: &ClusterCheck, has_endpoint: bool) -> (bool, &'static str, String) {
    match (&check.usable, has_endpoint) {
        (Err(p), _) => (false, p.reason, p.message.clone()),
        (Ok(()), false) => (
            false,
            WAITING_FOR_CONTROL_PLANE_ENDPOINT,
            "set spec.controlPlaneEndpoint on the infrastructure cluster or the Cluster".to_owned(),
        ),
        (Ok(()), true) => (true, PROVISIONED, String::new()),
    }
}

/// Reconciles one infra cluster.
#[instrument(skip_all, fields(kind = %B::Cluster::kind(&()), namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<B: ClusterBackend>(
    obj: Arc<B::Cluster>,
    ctx: Arc<ClusterContext<B>>,
) -> Result<Action> {
    let res = reconcile_inner::<B>(&obj, &ctx).await;
    if let Err(e) = &res {
        warn!(error = %e, "reconcile failed");
    }
    res
}

fn error_policy<B: ClusterBackend>(
    _obj: Arc<B::Cluster>,
    _err: &Error,
    ctx: Arc<ClusterContext<B>>,
) -> Action {
    Action::requeue(ctx.retry)
}

/// Writes `new` when it changed, then publishes the condition transitions as Events.
async fn write_status<B: ClusterBackend>(
    ctx: &ClusterContext<B>,
    api: &Api<B::Cluster>,
    infra: &B::Cluster,
    new: &<B::Cluster as InfraCluster>::Status,
) -> Result<()> {
    let old = infra.status();
    let written = status::write_status(api, infra, old, new, B::FIELD_MANAGER, &ctx.metrics).await?;
    if written.is_some() {
        let before = old.map(ContractStatus::conditions).unwrap_or_default();
        let watched = [
            Watched::positive(B::CONNECTED_CONDITION),
            Watched::positive(condition::READY),
            Watched::negative(condition::PAUSED),
        ];
        let events = events::transition_events(before, new.conditions(), &watched);
        events::publish(&ctx.recorder, infra, events).await;
    }
    Ok(())
}

async fn machines_of<B: ClusterBackend>(client: &kube::Client, infra: &B::Cluster) -> Result<Vec<String>> {
    let machines: Api<B::Machine> = Api::namespaced(client.clone(), &infra.namespace().unwrap_or_default());
    let mut names: Vec<String> = machines
        .list(&Default::default())
        .await
        .map_err(|e| Error::kube(format!("listing {}s", B::Machine::kind(&())), e))?
        .items
        .iter()
        // A machine without the finalizer has nothing on the hypervisor to delete.
        .filter(|m| belongs_to(*m, infra) && status::has_finalizer(*m, B::FINALIZER))
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    Ok(names)
}

async fn reconcile_inner<B: ClusterBackend>(obj: &B::Cluster, ctx: &ClusterContext<B>) -> Result<Action> {
    let kind = B::Cluster::kind(&());
    let namespace = obj.namespace().unwrap_or_default();
    let api: Api<B::Cluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(infra) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube(format!("reading {kind}"), e))?
    else {
        return Ok(Action::await_change());
    };
    if contract::is_externally_managed(infra.meta()) {
        return Ok(Action::await_change());
    }
    // Whatever this reconcile returns, the Secret watch then follows exactly what it read.
    let read = ReadSecrets::new(&ctx.secrets, ObjectRef::from_obj(&infra));
    let has_finalizer = status::has_finalizer(&infra, B::FINALIZER);
    let deleting = infra.meta().deletion_timestamp.is_some();
    let Some(owner) = cluster_owner(infra.meta()) else {
        if deleting {
            status::set_finalizer(&api, &infra, B::FINALIZER, false, &ctx.metrics).await?;
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
    let generation = infra.meta().generation;
    let mut new = infra.status().cloned().unwrap_or_default();
    new.set_observed_generation(generation);
    let (paused, reason, message) = contract::paused_condition_fields(cluster.as_ref(), infra.meta(), &kind);
    let paused = paused == "True";
    status::set(
        new.conditions_mut(),
        condition::PAUSED,
        paused,
        reason,
        message,
        generation,
    );
    if paused {
        write_status(ctx, &api, &infra, &new).await?;
        return Ok(Action::await_change());
    }
    if deleting {
        // The cluster owns nothing on the hypervisor, but its machines need its connection to
        // delete their VMs. CAPI deletes machines first; a standalone cluster can go first
        // (namespace deletion, garbage collection), so deletion waits for them.
        if has_finalizer {
            let remaining = machines_of::<B>(&ctx.client, &infra).await?;
            if !remaining.is_empty() {
                status::set(
                    new.conditions_mut(),
                    condition::READY,
                    ConditionStatus::False,
                    WAITING_FOR_MACHINES,
                    waiting_message(&B::Machine::kind(&()), &remaining),
                    generation,
                );
                write_status(ctx, &api, &infra, &new).await?;
                return Ok(Action::requeue(MACHINE_WAIT));
            }
            read.forget();
            status::set_finalizer(&api, &infra, B::FINALIZER, false, &ctx.metrics).await?;
        }
        return Ok(Action::await_change());
    }
    status::set_finalizer(&api, &infra, B::FINALIZER, true, &ctx.metrics).await?;
    let mirrored = cluster
        .as_ref()
        .and_then(|c| endpoint_to_mirror(infra.control_plane_endpoint(), c));
    if let Some(endpoint) = &mirrored {
        let patch = serde_json::json!({"spec": {"controlPlaneEndpoint": endpoint}});
        api.patch(&infra.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("mirroring the Cluster's controlPlaneEndpoint", e))?;
        ctx.metrics.count_write("spec");
    }
    let has_endpoint = standalone || infra.control_plane_endpoint().is_some() || mirrored.is_some();

    let check = ctx
        .backend
        .check(&ctx.client, &infra, &read)
        .await
        .map_err(Error::backend)?
        .unwrap_or_else(ClusterCheck::failed);
    let (connected, reason, message) = match &check.connected {
        Ok(note) if check.insecure_tls => {
            let message = if note.is_empty() {
                INSECURE_TLS_MESSAGE.to_owned()
            } else {
                format!("{INSECURE_TLS_MESSAGE}; {note}")
            };
            (true, condition::CONNECTED_WITHOUT_TLS_VERIFICATION, message)
        }
        Ok(note) => (true, CONNECTED, note.clone()),
        Err(p) => (false, p.reason, p.message.clone()),
    };
    status::set(
        new.conditions_mut(),
        B::CONNECTED_CONDITION,
        connected,
        reason,
        message,
        generation,
    );
    if let Some(domains) = &check.failure_domains {
        *new.failure_domains_mut() = domains.clone();
    }
    if check.version.is_some() {
        new.set_version(check.version.clone());
    }
    let (ready, reason, message) = readiness(&check, has_endpoint);
    // Once provisioned, CAPI never looks back: keep it through outages.
    if ready || Initialization::is_provisioned(new.initialization()) {
        new.set_provisioned(true);
    }
    let conditions = new.conditions_mut();
    status::set(conditions, condition::READY, ready, reason, message, generation);
    write_status(ctx, &api, &infra, &new).await?;
    Ok(Action::requeue(if ready && check.connected.is_ok() {
        RESYNC
    } else {
        ctx.retry
    }))
}

fn cluster_to_infra<C: InfraCluster>(cluster: Cluster) -> Option<ObjectRef<C>> {
    let r = cluster.spec.infrastructure_ref.as_ref()?;
    (r.kind == C::kind(&()) && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
        .then(|| ObjectRef::new(&r.name).within(&cluster.namespace().unwrap_or_default()))
}

/// Runs the infra cluster controller until `shutdown`, for one namespace or (`None`) all;
/// restarted with the Cluster watch when Cluster API gets installed meanwhile.
pub async fn run<B: ClusterBackend>(
    ctx: Arc<ClusterContext<B>>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    crate::capi::run_until_shutdown(
        ctx.client.clone(),
        "infracluster",
        ctx.capi_discovery_interval,
        shutdown,
        |capi, stop| run_once(ctx.clone(), namespace, concurrency, capi, stop),
    )
    .await;
}

async fn run_once<B: ClusterBackend>(
    ctx: Arc<ClusterContext<B>>,
    namespace: Option<&str>,
    concurrency: u16,
    capi: bool,
    shutdown: crate::capi::Stop,
) {
    let controller = Controller::new(
        api::<B::Cluster>(&ctx.client, namespace),
        crate::drive::primary_watch(ctx.watch_filter.as_deref()),
    );
    let store = controller.store();
    // A Provider change (endpoint, credentials, nodes) concerns every cluster naming it.
    let provider_to_infra = move |provider: Provider| {
        let name = provider.name_any();
        store
            .state()
            .into_iter()
            .filter(|c| c.provider_ref().is_some_and(|p| p.name == name))
            .map(|c| ObjectRef::from_obj(&*c))
            .collect::<Vec<_>>()
    };
    let mut controller = controller
        .watches(
            Api::<Provider>::all(ctx.client.clone()),
            watcher::Config::default(),
            provider_to_infra,
        )
        // A created or fixed credentials / CA bundle Secret concerns the clusters reading it.
        .watches(
            secrets_api(ctx.client.clone(), namespace),
            watcher::Config::default(),
            ctx.secrets.mapper(),
        );
    if capi {
        // An infra cluster reads its Cluster's spec (`paused`), not the status CAPI writes.
        controller = controller.watches_stream(
            crate::drive::changes_of::<Cluster, _>(
                &ctx.client,
                namespace,
                crate::drive::spec_labels_annotations::<Cluster>,
            ),
            cluster_to_infra::<B::Cluster>,
        );
    }
    let metrics = ctx.metrics.clone();
    crate::drive::drive(
        controller,
        concurrency,
        shutdown,
        metrics,
        reconcile::<B>,
        error_policy::<B>,
        ctx,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::infrastructure::{VSphereCluster, VSphereMachine};
    use banlieue_capi::generated::cluster::{ClusterControlPlaneEndpoint, ClusterSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use rstest::rstest;

    fn owned_by(api_version: &str, kind: &str) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "o".into(),
                uid: "u".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
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
        let want = ApiEndpoint {
            host: "10.0.0.1".into(),
            port: 6443,
        };
        assert_eq!(
            endpoint_to_mirror(None, &cluster(Some("10.0.0.1"), Some(6443))),
            Some(want.clone())
        );
        assert_eq!(endpoint_to_mirror(None, &cluster(Some(""), Some(6443))), None);
        assert_eq!(endpoint_to_mirror(None, &cluster(Some("h"), None)), None);
        assert_eq!(
            endpoint_to_mirror(None, &Cluster::new("c1", Default::default())),
            None
        );
        let user = ApiEndpoint {
            host: "user".into(),
            port: 443,
        };
        assert_eq!(
            endpoint_to_mirror(Some(&user), &cluster(Some("10.0.0.1"), Some(6443))),
            None
        );
    }

    #[test]
    fn machines_belong_by_provider_or_by_cluster_name() {
        let mut infra = VSphereCluster::new("banlieue-lab", Default::default());
        let mut machine = VSphereMachine::new(
            "m",
            serde_json::from_value(
                serde_json::json!({"source": {"template": "t"}, "cpu": {"cores": 1}, "memoryMiB": 512}),
            )
            .unwrap(),
        );
        assert!(!belongs_to(&machine, &infra));
        machine.spec.provider_ref = Some(banlieue_api::common::ProviderReference { name: "lab".into() });
        assert!(belongs_to(&machine, &infra));
        machine.spec.provider_ref = None;
        infra.metadata = owned_by("cluster.x-k8s.io/v1beta2", "Cluster");
        machine.metadata.labels = Some([(contract::CLUSTER_NAME_LABEL.to_owned(), "o".to_owned())].into());
        assert!(belongs_to(&machine, &infra));
        machine.metadata.labels =
            Some([(contract::CLUSTER_NAME_LABEL.to_owned(), "other".to_owned())].into());
        assert!(!belongs_to(&machine, &infra));
    }

    #[test]
    fn the_waiting_message_names_ten_machines_at_most() {
        let names: Vec<String> = (0..12).map(|i| format!("m{i:02}")).collect();
        let message = waiting_message("LibvirtMachine", &names);
        assert!(
            message.starts_with("deleting: waiting for 12 LibvirtMachine(s)"),
            "{message}"
        );
        assert!(message.contains("m09") && !message.contains("m10"), "{message}");
        assert!(message.ends_with(" and 2 more"), "{message}");
    }

    #[test]
    fn readiness_needs_a_usable_hypervisor_and_for_capi_an_endpoint() {
        let ok = ClusterCheck {
            connected: Ok(String::new()),
            usable: Ok(()),
            failure_domains: Some(vec![]),
            version: None,
            insecure_tls: false,
        };
        assert_eq!(readiness(&ok, true), (true, PROVISIONED, String::new()));
        assert_eq!(readiness(&ok, false).1, WAITING_FOR_CONTROL_PLANE_ENDPOINT);
        let down = ClusterCheck::failed(Problem::new("AuthenticationFailed", "401"));
        assert_eq!(
            readiness(&down, true),
            (false, "AuthenticationFailed", "401".to_owned())
        );
    }
}
