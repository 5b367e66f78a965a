//! The InfraMachine reconciler, for every hypervisor (CAPI's InfraMachine contract, and the
//! machines of standalone banlieue VirtualMachines), around a [`MachineBackend`].
//!
//! Order of one reconcile (CAPD's, see `CAPI-CONTRACT.md`):
//!
//! 1. The object is read fresh with a GET, not from the watch cache: a step never runs on a
//!    status older than the one the previous step wrote (running an allocation twice on a stale
//!    status could create a VM twice).
//! 2. Deleted by `clusterctl move` (`clusterctl.cluster.x-k8s.io/delete-for-move`): released,
//!    the VM is left to the copy on the target cluster.
//! 3. The controlling owner ([`crate::owner`]); none, or not created yet: nothing.
//! 4. `Paused` (the Cluster's `spec.paused` or the annotation): recorded, nothing else done,
//!    deletion included.
//! 5. Deletion: one [`MachineBackend::delete`] step at a time until nothing of the machine is
//!    left on the hypervisor, then the finalizer is released.
//! 6. The finalizer; waits for the infra cluster (`WaitingForCluster`,
//!    `WaitingForClusterInfrastructure`) and the bootstrap data (`WaitingForBootstrapData`),
//!    then reads the user data when the next step needs it (inputs before side effects: no VM
//!    is created while its user data cannot be read).
//! 7. One [`MachineBackend::provision`] step, or several back to back while the backend says
//!    the next may follow at once ([`Step::next_now`]); `spec.providerID` as soon as a step
//!    knows it; the status (`Ready`, the backend's day-2 condition, addresses,
//!    `initialization.provisioned`) written once, after the last step, and only when it
//!    changed; Events.
//!
//! Transient failures back off per object (1 s … 5 min); problems a human must fix are
//! conditions with an actionable reason and a Warning Event when they appear.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::banlieue::VirtualMachine;
use banlieue_api::common::{MachineAddress, ProvisioningState};
use banlieue_api::condition;
use banlieue_api::infrastructure::kinds::{ContractStatus, InfraMachine, InfraMachineStatus};
use banlieue_api::support;
use banlieue_capi::bootstrap::{BOOTSTRAP_VALUE_KEY, BootstrapData, BootstrapFormat};
use banlieue_capi::contract;
use banlieue_capi::{Cluster, Machine};
use banlieue_provider_runtime::cache::{lean_controller, lean_watch};
use banlieue_provider_runtime::events::Publisher;
use banlieue_provider_runtime::metrics::Metrics;
use banlieue_provider_runtime::secret_watch::{SecretIndex, SecretKey, secrets_api};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Predicate, WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use crate::cluster::Problem;
use crate::connection_memo;
use crate::drive::api;
use crate::error::{Error, ReconcileError, Result};
use crate::events;
use crate::network::{self, IpamError, PoolAddresses, PoolState};
use crate::owner::{self, BootstrapSource, InfraCluster, Owner, OwnerView};
use crate::secrets::ReadSecrets;
use crate::status;

/// Condition reason while a Kubernetes read a step needs fails (retried with backoff).
pub const KUBERNETES_ERROR: &str = "KubernetesError";
/// Requeue while waiting on something another controller does (cluster infrastructure,
/// bootstrap data; Secrets are watched besides).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(15);
/// Requeue of a problem a human must fix (the watches bring the machine back at once when the
/// objects change).
pub const PERMANENT_RETRY: Duration = Duration::from_secs(300);
/// Requeue while an IPAM provider allocates the machine's addresses (claims are not watched).
pub const IPAM_POLL: Duration = Duration::from_secs(2);
/// Condition reason: the owner names no infra cluster, or it does not exist.
pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
/// Condition reason: the infra cluster is not provisioned yet.
pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructure";
/// Condition reason: the owner's bootstrap data Secret is not named yet.
pub const WAITING_FOR_BOOTSTRAP_DATA: &str = condition::WAITING_FOR_BOOTSTRAP_DATA;
/// Condition reason: a VirtualMachine's user-data Secret does not exist.
pub const USER_DATA_SECRET_NOT_FOUND: &str = condition::USER_DATA_SECRET_NOT_FOUND;
/// Condition reason: a CAPI Machine's bootstrap data Secret does not exist.
pub const BOOTSTRAP_DATA_SECRET_NOT_FOUND: &str = "BootstrapDataSecretNotFound";
/// Condition reason: the user-data Secret could not be read (the API refused).
pub const USER_DATA_SECRET_UNREADABLE: &str = "UserDataSecretUnreadable";
/// Condition reason: the user-data Secret has no such key, or its format is unknown.
pub const BOOTSTRAP_DATA_INVALID: &str = "BootstrapDataInvalid";
/// Condition reason: the persisted provisioning state cannot be read.
pub const INCONSISTENT_STATUS: &str = "InconsistentStatus";
/// Why a persisted status cannot be read back as a backend's phase (a hand-edited or corrupted
/// status): `Ready` False [`INCONSISTENT_STATUS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("status.provisioning is inconsistent: {0}")]
pub struct InconsistentStatus(pub String);

impl InconsistentStatus {
    /// `state` persisted without `what` it needs.
    pub fn without(state: ProvisioningState, what: &str) -> Self {
        Self(format!("state {state:?} without {what}"))
    }

    /// `state` is not one of the provisioning states the backend persists.
    pub fn not_provisioning(state: ProvisioningState) -> Self {
        Self(format!("state {state:?} is not a provisioning state"))
    }
}

impl From<InconsistentStatus> for Problem {
    fn from(e: InconsistentStatus) -> Self {
        Problem::new(INCONSISTENT_STATUS, e.to_string())
    }
}

/// Event reason of a released machine.
pub const DELETED: &str = "Deleted";
/// Condition reason: deletion in progress.
pub const DELETING: &str = "Deleting";
/// Condition reason: the VM cannot be deleted (its infra cluster is gone).
pub const DELETION_FAILED: &str = "DeletionFailed";
/// A provisioned machine whose backend asks to be looked at again after at least this long is
/// settled: reconciles that find it as the provider left it skip the hypervisor until then.
pub const SETTLED_MIN: Duration = Duration::from_secs(60);
/// At most this many provisioning steps run in one reconcile (see [`Step::next_now`]).
pub const MAX_STEPS_PER_RECONCILE: usize = 12;
/// Condition reason: a provisioning step failed and the VM does not exist (any more).
pub const VM_NOT_FOUND: &str = "VMNotFound";

/// What the next step of a machine needs, read from its persisted status by the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The next step reads the user data (it creates the VM or its seed).
    pub needs_user_data: bool,
    /// The machine was created anew with a `spec.providerID` (clusterctl move, a restore): its
    /// VM exists and is adopted, its bootstrap data is never needed again.
    pub readopting: bool,
    /// The VM is provisioned: a failure is a day-2 problem (the backend's
    /// [`MachineBackend::UP_TO_DATE_CONDITION`]), not a `Ready` one.
    pub provisioned: bool,
}

/// What a provisioning step reads.
pub struct Provision<'a, M: InfraMachine> {
    /// The machine, read fresh.
    pub machine: &'a M,
    /// Its owner's view.
    pub view: &'a OwnerView<M::Cluster>,
    /// The provisioned infra cluster.
    pub cluster: &'a M::Cluster,
    /// The user data, when the [`Plan`] asked for it.
    pub user_data: Option<&'a BootstrapData>,
    /// The addresses allocated from IPAM pools for `spec.networks`, for a step that needs the
    /// user data (else empty: the guest's seed is written by then).
    pub pool_addresses: &'a PoolAddresses,
    /// Records the Secrets the step reads (the Secret watch then follows them).
    pub secrets: &'a ReadSecrets<M>,
}

/// What a deletion step reads.
pub struct Deletion<'a, M: InfraMachine> {
    /// The machine, read fresh.
    pub machine: &'a M,
    /// The infra cluster, provisioned or not.
    pub cluster: &'a M::Cluster,
    /// Records the Secrets the step reads.
    pub secrets: &'a ReadSecrets<M>,
}

/// A condition the backend reports: status, reason, message (the kit stamps generation and
/// time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Whether it holds.
    pub ok: bool,
    /// The reason (a constant).
    pub reason: &'static str,
    /// What is going on, or what to do.
    pub message: String,
}

impl Report {
    /// Sets this report as the condition `type_` observed at `generation`.
    fn set_in(&self, conditions: &mut Vec<condition::Condition>, type_: &str, generation: Option<i64>) {
        status::set(
            conditions,
            type_,
            self.ok,
            self.reason,
            self.message.clone(),
            generation,
        );
    }

    /// A report.
    pub fn new(ok: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            ok,
            reason,
            message: message.into(),
        }
    }

    /// The day-2 report of a provisioned VM: up to date, or being updated (`why`).
    pub fn up_to_date(updating: Option<String>) -> Self {
        match updating {
            Some(why) => Self::new(false, condition::UPDATING, why),
            None => Self::new(true, UP_TO_DATE, ""),
        }
    }

    /// The day-2 report of a running VM whose changes (`why`, see
    /// [`crate::power::restart_required_message`]) wait for its user's restart: a Warning
    /// ([`crate::progress::Progress::into_step`]).
    pub fn restart_required(why: String) -> Self {
        Self::new(false, condition::RESTART_REQUIRED, why)
    }
}

/// [`condition::VM_UP_TO_DATE`] reason when the VM matches the spec.
pub const UP_TO_DATE: &str = "UpToDate";

/// The VM is provisioned: what the contract publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provisioned {
    /// `spec.providerID`.
    pub provider_id: String,
    /// `status.addresses` (`None`: keep the published ones).
    pub addresses: Option<Vec<MachineAddress>>,
}

/// The outcome of one successful step (the backend has written its own status fields:
/// provisioning state, location, power state).
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Set once the VM is provisioned.
    pub provisioned: Option<Provisioned>,
    /// `spec.providerID`, known before the VM is provisioned: published at once (CAPI copies
    /// it to the Machine only after `initialization.provisioned`), so later steps read it from
    /// the spec instead of asking the hypervisor again.
    pub provider_id: Option<String>,
    /// The `Ready` condition.
    pub ready: Report,
    /// The backend's day-2 condition, when it has something to say.
    pub up_to_date: Option<Report>,
    /// Normal Events: (reason, note).
    pub events: Vec<(&'static str, String)>,
    /// A problem reported beside the progress (a Warning Event when `Ready`'s reason changes;
    /// `Ready`'s `CloudInitFailed` is one without saying so).
    pub warning: bool,
    /// When to look again.
    pub requeue: Duration,
    /// The next step may run at once, in this reconcile, before this one's status is written:
    /// this step made no choice that a later side effect must find persisted (running it again
    /// after a crash finds what it did: a poll, an idempotent configuration, a started task
    /// whose VM is adopted by its identity). Chained steps share one status write and their
    /// Events ([`MAX_STEPS_PER_RECONCILE`] at most); a step that waits, fails, warns, reports
    /// day-2 state or finishes provisioning ends the chain.
    pub next_now: bool,
    /// The step met a failure that passes by itself (a hypervisor task that failed on a lock
    /// or a timeout) and set the phase to try again: looked at again after the object's
    /// backoff (2 s, 4 s, … 5 min, as a failed reconcile) instead of `requeue`, so a busy
    /// hypervisor is not hammered.
    pub backoff: bool,
}

/// A failed step.
#[derive(Debug)]
pub enum StepFailure<E> {
    /// A human must act (bad spec, missing template, refused credentials): the condition says
    /// so, a Warning Event when it appears; looked at again after `retry` (`None`: the
    /// context's `wait_requeue`, for what is likely fixed soon, such as a host coming back).
    Problem {
        /// What is wrong.
        problem: Problem,
        /// When to look again.
        retry: Option<Duration>,
    },
    /// A transient failure: the condition says so and the reconcile fails (backoff).
    Transient {
        /// The condition reason.
        reason: &'static str,
        /// The error.
        error: E,
    },
}

impl<E> StepFailure<E> {
    /// A [`StepFailure::Problem`] with `reason` and `message`, looked at again after `retry`.
    pub fn problem(reason: &'static str, message: impl Into<String>, retry: Option<Duration>) -> Self {
        Self::Problem {
            problem: Problem::new(reason, message),
            retry,
        }
    }
}

/// A provider's reconcile error: the kit's, or one step's over its hypervisor client's error
/// `S`; labelled for metrics by the kit's rule on every provider.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError<S: std::error::Error + Send + Sync + 'static> {
    /// The kit failed (a Kubernetes read while resolving the connection).
    #[error(transparent)]
    Kit(#[from] Error),
    /// A provisioning or deletion step failed.
    #[error(transparent)]
    Step(#[from] StepError<S>),
}

impl<S: std::error::Error + Send + Sync + 'static> ReconcileError for ProviderError<S> {
    fn metric_label(&self) -> &'static str {
        match self {
            Self::Kit(e) => e.metric_label(),
            Self::Step(e) => e.metric_label(),
        }
    }
}

/// Why one provisioning step of a backend failed; `S` is its hypervisor client's error.
#[derive(Debug, thiserror::Error)]
pub enum StepError<S: std::error::Error + 'static> {
    /// Will not pass without a change of the spec, the template or the hypervisor: reported in
    /// the condition, retried slowly.
    #[error("{reason}: {message}")]
    Permanent {
        /// Condition reason, e.g. `CloningFailed`.
        reason: &'static str,
        /// What to fix.
        message: String,
    },
    /// A hypervisor call failed in a way that may pass (network, lock): back off and retry.
    #[error("{reason}: {source}")]
    Transient {
        /// Condition reason.
        reason: &'static str,
        /// The client's error.
        #[source]
        source: S,
    },
    /// The step needs the bootstrap data, which was not read ([`Plan::needs_user_data`]).
    #[error("bootstrap data is needed for this step")]
    NeedBootstrapData,
}

impl<S: std::error::Error + 'static> StepError<S> {
    /// A [`StepError::Permanent`].
    pub fn permanent(reason: &'static str, message: impl Into<String>) -> Self {
        Self::Permanent {
            reason,
            message: message.into(),
        }
    }

    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Permanent { reason, .. } | Self::Transient { reason, .. } => reason,
            Self::NeedBootstrapData => WAITING_FOR_BOOTSTRAP_DATA,
        }
    }

    /// A short stable metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Permanent { .. } => "permanent",
            Self::Transient { .. } => "transient",
            Self::NeedBootstrapData => "need_bootstrap_data",
        }
    }

    /// As the kit's [`StepFailure`]: a permanent error is a problem looked at again after
    /// `retry`, a transient one backs off, missing bootstrap data waits for it.
    pub fn into_failure<E: From<Self>>(self, retry: Duration) -> StepFailure<E> {
        match self {
            Self::Permanent { reason, message } => StepFailure::problem(reason, message, Some(retry)),
            Self::NeedBootstrapData => StepFailure::problem(
                WAITING_FOR_BOOTSTRAP_DATA,
                "the bootstrap data was not read",
                Some(WAIT_REQUEUE),
            ),
            Self::Transient { reason, .. } => StepFailure::Transient {
                reason,
                error: self.into(),
            },
        }
    }
}

impl<E> StepFailure<E> {
    /// What resolving a step's hypervisor connection gave: the connection; a [`Problem`] a
    /// human must fix (no usable client), looked at again after `retry`; a failed Kubernetes
    /// read, transient ([`KUBERNETES_ERROR`]).
    pub fn connected<T>(
        found: std::result::Result<std::result::Result<T, Problem>, E>,
        retry: Option<Duration>,
    ) -> std::result::Result<T, Self> {
        match found {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(problem)) => Err(Self::Problem { problem, retry }),
            Err(error) => Err(Self::Transient {
                reason: KUBERNETES_ERROR,
                error,
            }),
        }
    }
}

/// The outcome of one deletion step.
#[derive(Clone, Debug, PartialEq)]
pub enum Deleted {
    /// Nothing of this machine is left on the hypervisor (or what is left is not its own):
    /// release the object with a Normal Event.
    Released {
        /// The Event's reason (`Deleted`, `VMLeftInPlace`).
        reason: &'static str,
        /// The Event's note.
        note: String,
    },
    /// Deletion goes on (`Ready` False `Deleting` with the message).
    InProgress {
        /// What is being done.
        message: String,
        /// When to look again.
        requeue: Duration,
    },
    /// Deletion cannot go on until a human acts (`Ready` False with the problem).
    Blocked(Problem),
    /// The backend learnt something of the VM (its location) and wrote it to status: look again
    /// at once.
    Again,
}

impl Deleted {
    /// Released with the Normal Event `Deleted` saying `note` (what was deleted, or that nothing
    /// had been created).
    pub fn released(note: impl Into<String>) -> Self {
        Self::Released {
            reason: DELETED,
            note: note.into(),
        }
    }
}

/// The hypervisor side of the InfraMachine reconciler: a few verbs, each one step.
pub trait MachineBackend: Send + Sync + 'static {
    /// The infra machine kind.
    type Machine: InfraMachine;
    /// The backend's errors (transient: the reconcile backs off).
    type Error: ReconcileError;
    /// Where provisioning stands, as the backend reads it from the machine's status: read once
    /// per reconcile by [`MachineBackend::plan`], handed to [`MachineBackend::provision`].
    type Phase: Send;
    /// The provider's finalizer: its machine kind's backend's ([`Backend::finalizer`]) unless it
    /// says otherwise.
    ///
    /// [`Backend::finalizer`]: banlieue_api::common::Backend::finalizer
    const FINALIZER: &'static str = <Self::Machine as InfraMachine>::BACKEND.finalizer();
    /// The provider's field manager for server-side apply.
    const FIELD_MANAGER: &'static str;
    /// The condition a provisioned VM's day-2 state and problems go to
    /// ([`condition::VM_UP_TO_DATE`]); `None`: `Ready` (a backend that cannot compare its VMs
    /// with the spec).
    const UP_TO_DATE_CONDITION: Option<&'static str> = Some(condition::VM_UP_TO_DATE);
    /// The bootstrap data formats the backend can deliver to a guest (cloud-init NoCloud seeds
    /// by default); other data is refused before anything is created.
    const BOOTSTRAP_FORMATS: &'static [BootstrapFormat] = &[BootstrapFormat::CloudConfig];

    /// Where provisioning stands (from the machine's persisted status) and what the next step
    /// needs; `Err`: the status cannot be read back (`INCONSISTENT_STATUS`).
    fn plan(&self, machine: &Self::Machine) -> std::result::Result<(Plan, Self::Phase), Problem>;

    /// Whether a VM may exist for the machine (something was created, or its providerID names
    /// one): a deleted machine whose infra cluster is gone is released only without one (else
    /// its deletion waits for a human, rather than leak a VM silently).
    fn may_have_vm(&self, machine: &Self::Machine) -> bool;

    /// One provisioning (or day-2) step from `phase`. The backend writes its own status fields
    /// to `status`.
    fn provision(
        &self,
        client: &kube::Client,
        request: Provision<'_, Self::Machine>,
        phase: Self::Phase,
        status: &mut <Self::Machine as InfraMachine>::Status,
    ) -> impl Future<Output = std::result::Result<Step, StepFailure<Self::Error>>> + Send;

    /// One deletion step.
    fn delete(
        &self,
        client: &kube::Client,
        request: Deletion<'_, Self::Machine>,
        status: &mut <Self::Machine as InfraMachine>::Status,
    ) -> impl Future<Output = std::result::Result<Deleted, Self::Error>> + Send;
}

/// Shared state of an InfraMachine controller.
pub struct MachineContext<B: MachineBackend> {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The hypervisor backend.
    pub backend: B,
    /// The provider's metrics registry.
    pub metrics: Metrics,
    /// Event recorder.
    pub recorder: Publisher,
    /// The Secrets each machine's last reconcile read, for the Secret watch.
    pub secrets: SecretIndex<B::Machine>,
    /// Requeue while waiting for the infra cluster or the bootstrap data ([`WAIT_REQUEUE`]).
    pub wait_requeue: Duration,
    /// How often discovery is asked whether Cluster API got installed ([`crate::capi`]).
    pub capi_discovery_interval: Duration,
    /// Only machines labelled `cluster.x-k8s.io/watch-filter=<this>` (CAPI's `--watch-filter`).
    pub watch_filter: Option<String>,
    backoffs: Mutex<Backoffs>,
    settled: Mutex<HashMap<String, Settled>>,
    /// The running controller's caches of owners and infra clusters ([`owner::OwnerCaches`]).
    owner_caches: Mutex<Option<owner::OwnerCaches<<B::Machine as InfraMachine>::Cluster>>>,
}

/// A provisioned machine whose last step found its VM as the spec wants and asked to be looked
/// at again only later, as the provider's own status write left it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Settled {
    /// The machine's [`read_state`] after that write.
    state: u64,
    /// When the backend asked to look again.
    until: Instant,
}

impl Settled {
    /// How long the hypervisor need not be asked about the machine, seen with `state` at `now`:
    /// while what a reconcile reads of it is as the provider left it and the backend's time has
    /// not come (a reconcile woken by the provider's own status write, by a VirtualMachine status
    /// write, by a Secret, by a write that changed only managed fields: nothing to ask the
    /// hypervisor).
    fn wait(&self, state: u64, now: Instant) -> Option<Duration> {
        (self.state == state && now < self.until).then(|| self.until - now)
    }
}

/// What a reconcile reads of a machine, hashed: its generation (the spec; deletion bumps it),
/// labels, annotations, finalizers, owners, deletion, and its status as stored (`status`: a
/// status someone wrote since, the provider's own `WaitingFor…` included, is a change). Not its
/// resourceVersion nor managed fields: CAPI's MachineSet applies each infra machine again once
/// provisioned, changing only who manages which field, and that alone is no reason to ask the
/// hypervisor.
fn read_state<K: Resource, S: serde::Serialize>(machine: &K, status: Option<&S>) -> u64 {
    use std::hash::{Hash, Hasher};
    let meta = machine.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (&owner.uid, &owner.kind, &owner.name, owner.controller).hash(&mut hasher);
    }
    serde_json::to_vec(&status).unwrap_or_default().hash(&mut hasher);
    hasher.finish()
}

impl<B: MachineBackend> MachineContext<B> {
    /// A context with the default timings, reporting Events as `reporter`.
    pub fn new(client: kube::Client, backend: B, reporter: &str) -> Self {
        Self {
            recorder: events::recorder(client.clone(), reporter),
            client,
            backend,
            metrics: Metrics::default(),
            secrets: SecretIndex::default(),
            wait_requeue: WAIT_REQUEUE,
            capi_discovery_interval: crate::capi::CAPI_DISCOVERY_INTERVAL,
            watch_filter: None,
            settled: Mutex::default(),
            backoffs: Mutex::default(),
            owner_caches: Mutex::default(),
        }
    }

    /// How long machine `uid`, seen with `state` ([`read_state`]), needs no look at its VM
    /// ([`Settled::wait`]).
    fn settled_wait(&self, uid: &str, state: u64) -> Option<Duration> {
        let settled = crate::lock(&self.settled);
        settled.get(uid)?.wait(state, Instant::now())
    }

    /// Records (or, `None`, forgets) that machine `uid` is settled.
    fn settle(&self, uid: &str, settled: Option<Settled>) {
        let mut map = crate::lock(&self.settled);
        match settled {
            Some(settled) => map.insert(uid.to_owned(), settled),
            None => map.remove(uid),
        };
    }

    fn backoffs(&self) -> std::sync::MutexGuard<'_, Backoffs> {
        crate::lock(&self.backoffs)
    }
}

/// Per-object backoff: 2 s, 4 s, … 256 s, then 5 min, counted over consecutive failures of the
/// retries that came when due. A reconcile that an event brings earlier (a Secret, the owner, a
/// status write) and fails too waits out what is left of the current delay instead of doubling
/// it: the delay grows with the time the failure lasts, so a short outage is over for the
/// machine within seconds of its end, however many events came meanwhile.
#[derive(Debug, Default)]
struct Backoffs {
    /// Failures counted, and when the current delay ends.
    failures: HashMap<String, (u32, Instant)>,
    /// Objects whose last successful reconcile asked for a backoff: their count survives it.
    held: std::collections::HashSet<String>,
}

impl Backoffs {
    /// Counts one more failure of `uid` at `now` (unless its current delay is not over); its
    /// delay.
    fn next(&mut self, uid: &str, now: Instant) -> Duration {
        let (n, due) = self.failures.entry(uid.to_owned()).or_insert((0, now));
        if *n > 0 && now < *due {
            return *due - now;
        }
        *n = n.saturating_add(1);
        let delay = Duration::from_secs(1u64 << (*n).min(9)).min(Duration::from_secs(300));
        *due = now + delay;
        delay
    }

    /// [`Self::next`], kept through the success that reports it.
    fn hold(&mut self, uid: &str, now: Instant) -> Duration {
        self.held.insert(uid.to_owned());
        self.next(uid, now)
    }

    /// A reconcile of `uid` succeeded: its count starts again, unless the step held it.
    fn succeeded(&mut self, uid: &str) {
        if !self.held.remove(uid) {
            self.failures.remove(uid);
        }
    }
}

/// The user data the owner view points at: a bootstrap Secret's `value` (and `format`:
/// cloud-config or Ignition), another key of a VirtualMachine's user-data Secret (cloud-config), or nothing
/// (an empty cloud-config). `Err`: the condition reason, message and requeue why it cannot be
/// read (pure).
pub fn user_data_from(
    secret: Option<&Secret>,
    source: &BootstrapSource,
    for_vm: bool,
    namespace: &str,
) -> std::result::Result<BootstrapData, (Problem, Duration)> {
    let cloud_config = |value| BootstrapData {
        format: BootstrapFormat::CloudConfig,
        value,
    };
    let BootstrapSource::Secret { name, key } = source else {
        return Ok(cloud_config(Vec::new()));
    };
    let Some(secret) = secret else {
        let reason = if for_vm {
            USER_DATA_SECRET_NOT_FOUND
        } else {
            BOOTSTRAP_DATA_SECRET_NOT_FOUND
        };
        let message =
            format!("Secret {namespace}/{name} (key {key:?}) not found; the VM is created once it exists");
        return Err((Problem::new(reason, message), WAIT_REQUEUE));
    };
    let invalid = |message: String| (Problem::new(BOOTSTRAP_DATA_INVALID, message), PERMANENT_RETRY);
    if key == BOOTSTRAP_VALUE_KEY {
        return BootstrapData::from_secret(secret).map_err(|e| invalid(e.to_string()));
    }
    // (A Secret read from the API server has no `stringData`: it is merged into `data` on write.)
    let value = secret.data.as_ref().and_then(|d| d.get(key));
    let value = value.ok_or_else(|| invalid(format!("Secret {namespace}/{name} has no key {key:?}")))?;
    Ok(cloud_config(value.0.clone()))
}

/// Reads the user data of `source` (its Secret recorded in `secrets` first: a missing one is
/// watched).
async fn read_user_data<M: InfraMachine>(
    client: &kube::Client,
    namespace: &str,
    view: &OwnerView<M::Cluster>,
    secrets: &ReadSecrets<M>,
) -> Result<std::result::Result<BootstrapData, (Problem, Duration)>> {
    let secret = match &view.bootstrap {
        BootstrapSource::Secret { name, .. } => {
            secrets.record([SecretKey::new(namespace, name.clone())]);
            Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(|e| Error::kube(format!("reading user-data Secret {namespace}/{name}"), e))?
        }
        BootstrapSource::Empty | BootstrapSource::Pending => None,
    };
    let for_vm = matches!(view.owner, Owner::VirtualMachine(_));
    Ok(user_data_from(
        secret.as_ref(),
        &view.bootstrap,
        for_vm,
        namespace,
    ))
}

/// One reconcile's writes and Events, made once at the end.
struct Writer<'a, B: MachineBackend> {
    ctx: &'a MachineContext<B>,
    api: Api<B::Machine>,
    machine: &'a B::Machine,
}

impl<B: MachineBackend> Writer<'_, B> {
    /// Writes `new` when it changed; the object as written when it wrote.
    async fn status(&self, new: &<B::Machine as InfraMachine>::Status) -> Result<Option<B::Machine>> {
        status::write_status(
            &self.api,
            self.machine,
            self.machine.status(),
            new,
            B::FIELD_MANAGER,
            &self.ctx.metrics,
        )
        .await
    }

    async fn finalizer(&self, present: bool) -> Result<()> {
        status::set_finalizer(&self.api, self.machine, B::FINALIZER, present, &self.ctx.metrics).await?;
        Ok(())
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        events::publish(
            &self.ctx.recorder,
            self.machine,
            vec![(type_, reason.to_owned(), note)],
        )
        .await;
    }

    /// The Normal Events of the steps run, in order.
    async fn transitions(&self, events: Vec<(&'static str, String)>) {
        for (reason, note) in events {
            info!(reason, %note, "transition");
            self.event(EventType::Normal, reason, note).await;
        }
    }

    /// `Ready` False with `reason`, written; then `requeue`.
    async fn wait(
        &self,
        mut new: <B::Machine as InfraMachine>::Status,
        reason: &str,
        message: String,
        requeue: Duration,
    ) -> Result<Action> {
        let generation = self.machine.meta().generation;
        status::set(
            new.conditions_mut(),
            condition::READY,
            false,
            reason,
            message,
            generation,
        );
        self.status(&new).await?;
        Ok(Action::requeue(requeue))
    }

    /// [`Writer::wait`] for `problem`, looked at again after [`PERMANENT_RETRY`] (no Event).
    async fn blocked(&self, new: <B::Machine as InfraMachine>::Status, problem: Problem) -> Result<Action> {
        self.wait(new, problem.reason, problem.message, PERMANENT_RETRY)
            .await
    }

    /// `Ready` False with `reason` and the error's words, written; then the error (backoff).
    async fn fail(
        &self,
        new: <B::Machine as InfraMachine>::Status,
        reason: &str,
        error: Error,
    ) -> Result<Action> {
        self.wait(new, reason, error.to_string(), Duration::ZERO).await?;
        Err(error)
    }

    /// [`Writer::wait`] for a problem a human must fix, looked at again after [`PERMANENT_RETRY`]:
    /// a Warning Event when it appears (the `Ready` reason changes).
    async fn problem(
        &self,
        new: <B::Machine as InfraMachine>::Status,
        reason: &'static str,
        message: String,
    ) -> Result<Action> {
        let appears = condition::find(new.conditions(), condition::READY)
            .is_none_or(|c| c.reason != reason || c.status != "False");
        let action = self.wait(new, reason, message.clone(), PERMANENT_RETRY).await?;
        if appears {
            self.event(EventType::Warning, reason, message).await;
        }
        Ok(action)
    }
}

/// Reconciles one infra machine.
#[instrument(skip_all, fields(kind = %B::Machine::kind(&()), namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<B: MachineBackend>(
    obj: Arc<B::Machine>,
    ctx: Arc<MachineContext<B>>,
) -> Result<Action> {
    let res = reconcile_inner::<B>(&obj, &ctx).await;
    match &res {
        Ok(_) => ctx.backoffs().succeeded(obj.uid().as_deref().unwrap_or_default()),
        Err(e) => warn!(error = %e, "reconcile failed"),
    }
    res
}

fn error_policy<B: MachineBackend>(
    obj: Arc<B::Machine>,
    _err: &Error,
    ctx: Arc<MachineContext<B>>,
) -> Action {
    let uid = obj.uid().unwrap_or_default();
    Action::requeue(ctx.backoffs().next(&uid, Instant::now()))
}

async fn reconcile_inner<B: MachineBackend>(obj: &B::Machine, ctx: &MachineContext<B>) -> Result<Action> {
    let kind = B::Machine::kind(&());
    let namespace = obj.namespace().unwrap_or_default();
    let api: Api<B::Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(machine) = api
        .get_opt(&obj.name_any())
        .await
        .map_err(|e| Error::kube(format!("reading {kind}"), e))?
    else {
        return Ok(Action::await_change());
    };
    // Whatever this reconcile returns, the Secret watch then follows exactly what it read.
    let secrets = ReadSecrets::new(&ctx.secrets, ObjectRef::from_obj(&machine));
    let write = Writer {
        ctx,
        api,
        machine: &machine,
    };
    let deleting = machine.meta().deletion_timestamp.is_some();
    if deleting && !status::has_finalizer(&machine, B::FINALIZER) {
        return Ok(Action::await_change());
    }
    if deleting && contract::is_deleted_for_move(machine.meta()) {
        // `clusterctl move` deletes the source objects once their copies exist on the target
        // cluster: the VM belongs to the copy now. Release the object, never touch the VM.
        write
            .event(
                EventType::Normal,
                "ReleasedForMove",
                "clusterctl move deleted this object; its VM is kept for the copy on the target cluster"
                    .to_owned(),
            )
            .await;
        secrets.forget();
        write.finalizer(false).await?;
        return Ok(Action::await_change());
    }
    // The controlling owner (a CAPI Machine or a banlieue VirtualMachine), resolved into one
    // view; everything after this is the same for both. No such owner: leave the object alone.
    let Some(owner) = owner::controlling_owner(machine.meta()) else {
        return Ok(Action::await_change());
    };
    let caches = crate::lock(&ctx.owner_caches).clone();
    let view = owner::resolve(&ctx.client, &machine, owner, caches.as_ref()).await?;
    if !view.owner_exists && !deleting {
        // CAPI has not created (or has deleted) the Machine; a deleted VirtualMachine's machine
        // is deleted by the garbage collector. Nothing to do until then (looked at again in
        // case no watched change announces the owner).
        return Ok(Action::requeue(ctx.wait_requeue));
    }
    let generation = machine.meta().generation;
    let uid = machine.uid().unwrap_or_default();
    let mut new = machine.status().cloned().unwrap_or_default();
    new.set_observed_generation(generation);
    let (paused, reason, message) = view.paused_condition.clone();
    let paused = paused == "True";
    status::set(
        new.conditions_mut(),
        condition::PAUSED,
        paused,
        reason,
        message,
        generation,
    );
    if view.paused.is_some() {
        // Paused: neither provision nor delete (clusterctl move deletes paused source objects).
        write.status(&new).await?;
        return Ok(Action::await_change());
    }
    if deleting {
        ctx.settle(&uid, None);
        return delete::<B>(ctx, &write, &view.infra_cluster, new, &secrets).await;
    }
    write.finalizer(true).await?;
    let cluster = match view.infra_cluster.usable() {
        Ok(cluster) => cluster,
        Err(why) => {
            let reason = match view.infra_cluster {
                InfraCluster::Missing(_) => WAITING_FOR_CLUSTER,
                _ => WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            };
            return write.wait(new, reason, why, ctx.wait_requeue).await;
        }
    };
    let (plan, phase) = match ctx.backend.plan(&machine) {
        Ok(planned) => planned,
        Err(problem) => return write.blocked(new, problem).await,
    };
    // A field the backend cannot honour: said before anything is created, never silently
    // ignored. On a provisioned VM it is said on the day-2 condition and the rest of the spec
    // is still acted on (power, CPU, memory), as is a field that acts only at creation and was
    // changed since (it is not applied to the existing VM).
    let backend = <B::Machine as InfraMachine>::BACKEND;
    let records_creation = machine
        .annotations()
        .contains_key(support::CREATED_WITH_ANNOTATION);
    // The spec as JSON, read once, and only when a check below reads it.
    let spec = (support::machine_refuses_any(backend) || records_creation)
        .then(|| serde_json::to_value(&machine).ok()?.get("spec").cloned())
        .flatten();
    let mut day2_note: Option<Report> = None;
    if let Some(message) = spec.as_ref().and_then(|spec| unsupported_fields::<B>(spec)) {
        if !(plan.provisioned && B::UP_TO_DATE_CONDITION.is_some()) {
            return write.problem(new, support::UNSUPPORTED_FIELD, message).await;
        }
        day2_note = Some(Report::new(false, support::UNSUPPORTED_FIELD, message));
    }
    // The steps act on the VM as created: a creation-only field changed since is put back to
    // its recorded value for them.
    let mut as_created: Option<B::Machine> = None;
    if plan.provisioned
        && day2_note.is_none()
        && B::UP_TO_DATE_CONDITION.is_some()
        && let Some(spec) = &spec
        && let Some((changes, restored)) = creation_changes::<B>(&machine, spec)
    {
        as_created = restored;
        let message = format!(
            "{} changed after the VM was created and acts only when it is created, so the VM keeps the old value: {}; set it back, or replace the machine (delete and create it again; a MachineDeployment rolls out a new one) to apply it",
            if changes.len() == 1 { "a field" } else { "fields" },
            changes.join("; ")
        );
        day2_note = Some(Report::new(false, support::RECREATE_REQUIRED, message));
    }
    // Provisioned, exactly as the provider's own last write left it (the status above only
    // restates what is persisted), and not due yet: nothing to ask the hypervisor.
    if plan.provisioned
        && machine.status() == Some(&new)
        && let Some(wait) = ctx.settled_wait(&uid, read_state(&machine, machine.status()))
    {
        return Ok(Action::requeue(wait));
    }
    if view.bootstrap == BootstrapSource::Pending && !plan.readopting {
        return write
            .wait(
                new,
                WAITING_FOR_BOOTSTRAP_DATA,
                "the owner's bootstrap data Secret is not set yet (the Machine's spec.bootstrap.dataSecretName)".to_owned(),
                ctx.wait_requeue,
            )
            .await;
    }
    // Inputs before side effects: until the VM is provisioned, the user data must be readable
    // before the hypervisor is asked anything (no VM while its Secret is missing); the Secret
    // watch brings the machine back within seconds once it appears.
    let user_data = if plan.needs_user_data && !plan.readopting {
        let read = match read_user_data(&ctx.client, &namespace, &view, &secrets).await {
            Ok(read) => read,
            // e.g. a 403: say so instead of showing an older reason, then back off.
            Err(error) => return write.fail(new, USER_DATA_SECRET_UNREADABLE, error).await,
        };
        match read {
            Ok(data) if !B::BOOTSTRAP_FORMATS.contains(&data.format) => {
                let message = format!(
                    "bootstrap data format {} is not supported: {kind}s are bootstrapped from {}",
                    data.format,
                    crate::join(B::BOOTSTRAP_FORMATS.iter().map(|f| f.as_str()), " or ")
                );
                return write
                    .wait(new, BOOTSTRAP_DATA_INVALID, message, PERMANENT_RETRY)
                    .await;
            }
            Ok(data) => Some(data),
            Err((problem, retry)) => {
                return write.wait(new, problem.reason, problem.message, retry).await;
            }
        }
    } else {
        None
    };
    let cluster_name = contract::cluster_name(machine.meta())
        .map(str::to_owned)
        .unwrap_or_else(|| cluster.name_any());
    // Addresses from IPAM pools, claimed once the user data is there, for the steps that need
    // the user data (up to the one writing the guest's seed), which wait for their allocation;
    // later steps never look at the claims again.
    let asks_pools = !network::pool_requests(machine.networks()).is_empty();
    let pools_resolved = asks_pools && plan.needs_user_data && !plan.provisioned && !plan.readopting;
    let pool_addresses = if !pools_resolved {
        PoolAddresses::new()
    } else {
        match network::resolve(&ctx.client, &machine, &cluster_name).await {
            Ok(PoolState::Ready(found)) => found,
            Ok(PoolState::Waiting(message)) => {
                return write
                    .wait(new, network::WAITING_FOR_IP_ADDRESS, message, IPAM_POLL)
                    .await;
            }
            Err(IpamError::Invalid(message)) => {
                return write.problem(new, network::IP_ADDRESS_INVALID, message).await;
            }
            Err(IpamError::Kube { context, source }) => {
                // e.g. a 403 on the claims: say so instead of showing an older wait reason.
                let error = Error::kube(context, source);
                return write.fail(new, network::IP_ADDRESS_CLAIM_FAILED, error).await;
            }
        }
    };
    // Steps run back to back while the backend says the next one may follow at once
    // (`Step::next_now`), each on the machine as the previous one left it in memory; the status
    // is written once, after the last, with the Events of all.
    let mut current = as_created.unwrap_or_else(|| machine.clone());
    let (mut plan, mut phase) = (plan, phase);
    let mut earlier_events: Vec<(&'static str, String)> = Vec::new();
    let mut steps = 0;
    let outcome = loop {
        let request = Provision {
            machine: &current,
            view: &view,
            cluster,
            user_data: user_data.as_ref(),
            pool_addresses: &pool_addresses,
            secrets: &secrets,
        };
        let outcome = ctx.backend.provision(&ctx.client, request, phase, &mut new).await;
        steps += 1;
        let step = match outcome {
            Ok(step) if chains(&step) && steps < MAX_STEPS_PER_RECONCILE => step,
            other => break other,
        };
        // The next step reads `spec.providerID` from the spec.
        publish_provider_id(&write, &mut current, &mut new, step.provider_id.as_deref()).await?;
        current.set_status(new.clone());
        // The inputs were read for the first step: a next one that needs an input not read
        // waits for the next reconcile.
        let next = ctx.backend.plan(&current).ok().filter(|(next, _)| {
            let wants_inputs = next.needs_user_data && !next.readopting && !next.provisioned;
            !wants_inputs || (user_data.is_some() && (pools_resolved || !asks_pools))
        });
        let Some((next_plan, next_phase)) = next else {
            break Ok(step);
        };
        earlier_events.extend(step.events);
        (plan, phase) = (next_plan, next_phase);
    };
    if steps > 1 {
        debug!(steps, "steps run in one reconcile");
    }
    // A chained step may have set `spec.providerID`, bumping the generation.
    let generation = current.meta().generation;
    let day2 = |reason: &str| B::UP_TO_DATE_CONDITION.filter(|_| plan.provisioned && reason != VM_NOT_FOUND);
    match outcome {
        Ok(mut step) => {
            // The day-2 note stands unless the step reports a day-2 problem of its own.
            if let Some(note) = day2_note
                && step.up_to_date.as_ref().is_none_or(|r| r.ok)
            {
                step.up_to_date = Some(note);
                step.warning = true;
            }
            apply_step::<B>(&write, &current, new, earlier_events, step).await
        }
        Err(failure) => {
            let (reason, message, outcome) = match failure {
                StepFailure::Problem { problem, retry } => {
                    let requeue = Action::requeue(retry.unwrap_or(ctx.wait_requeue));
                    (problem.reason, problem.message, Ok(requeue))
                }
                StepFailure::Transient { reason, error } => {
                    (reason, error.to_string(), Err(Error::backend(error)))
                }
            };
            let problem = outcome.is_ok();
            // A Warning when the problem or the outage appears (the condition's reason changes, or
            // a problem's condition was not False), not when only its message, the generation or
            // a retry does.
            let type_ = day2(reason).unwrap_or(condition::READY);
            let appears = condition::find(new.conditions(), type_)
                .is_none_or(|c| c.reason != reason || (problem && c.status != "False"));
            // A provisioned VM that is gone is not up to date either (never a stale True).
            let gone =
                B::UP_TO_DATE_CONDITION.filter(|_| problem && plan.provisioned && reason == VM_NOT_FOUND);
            let report = Report::new(false, reason, message.clone());
            for type_ in std::iter::once(type_).chain(gone) {
                report.set_in(new.conditions_mut(), type_, generation);
            }
            write.status(&new).await?;
            write.transitions(earlier_events).await;
            if appears {
                write.event(EventType::Warning, reason, message).await;
            }
            outcome
        }
    }
}

/// The condition message naming every field of the machine's `spec` (as JSON) its backend
/// refuses ([`support::machine_refusals`]), if any.
fn unsupported_fields<B: MachineBackend>(spec: &serde_json::Value) -> Option<String> {
    let backend = <B::Machine as InfraMachine>::BACKEND;
    let refusals = support::machine_refusals(backend, spec);
    (!refusals.is_empty())
        .then(|| support::refusal_message(&B::Machine::kind(&()), backend.as_str(), &refusals))
}

/// The changes of `machine`'s creation-only fields since the VM was created
/// ([`support::CREATED_WITH_ANNOTATION`]; `spec` is its spec as JSON), if it records them and
/// any changed, with the machine as created (those fields put back) for the steps.
fn creation_changes<B: MachineBackend>(
    machine: &B::Machine,
    spec: &serde_json::Value,
) -> Option<(Vec<String>, Option<B::Machine>)> {
    let recorded = machine.annotations().get(support::CREATED_WITH_ANNOTATION)?;
    let created: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_str(recorded).ok()?;
    let backend = <B::Machine as InfraMachine>::BACKEND;
    let changes = support::creation_changes(&created, &support::creation_values(backend, spec));
    if changes.is_empty() {
        return None;
    }
    let mut object = serde_json::to_value(machine).ok()?;
    if let Some(spec) = object.get_mut("spec") {
        support::restore_creation_values(backend, spec, &created);
    }
    Some((changes, serde_json::from_value(object).ok()))
}

/// The common answer for [`Step::next_now`] of a step that did not fail: it does not wait
/// (`requeue` zero), or it has just started a hypervisor task (`task_before` none, `task_after`
/// some), which is polled at once (an instant task is done; a running one is waited for).
pub fn follows_at_once(requeue: Duration, task_before: bool, task_after: bool) -> bool {
    requeue.is_zero() || (!task_before && task_after)
}

/// Whether the step after `step` may run in the same reconcile (see [`Step::next_now`]).
fn chains(step: &Step) -> bool {
    step.next_now && !step.backoff && !step.warning && step.provisioned.is_none() && step.up_to_date.is_none()
}

/// Sets `spec.providerID` when a step knows it and the spec does not say it yet. The spec
/// change bumps the generation, which `new` then describes (else the next reconcile would write
/// the status again just for `observedGeneration`); `machine` becomes the patched object.
async fn publish_provider_id<B: MachineBackend>(
    write: &Writer<'_, B>,
    machine: &mut B::Machine,
    new: &mut <B::Machine as InfraMachine>::Status,
    provider_id: Option<&str>,
) -> Result<()> {
    let Some(provider_id) = provider_id.filter(|id| machine.provider_id() != Some(*id)) else {
        return Ok(());
    };
    // The values of the fields that act only at creation, recorded beside the providerID (one
    // write): a later change of one is reported, not silently not applied.
    let spec = serde_json::to_value(&*machine)
        .ok()
        .and_then(|m| m.get("spec").cloned())
        .unwrap_or_default();
    let created = support::creation_values(<B::Machine as InfraMachine>::BACKEND, &spec);
    let patch = serde_json::json!({
        "metadata": {"annotations": {
            support::CREATED_WITH_ANNOTATION: serde_json::to_string(&created).unwrap_or_default(),
        }},
        "spec": {"providerID": provider_id},
    });
    let patched = write
        .api
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| Error::kube("setting spec.providerID", e))?;
    write.ctx.metrics.count_write("spec");
    let generation = patched.meta().generation;
    new.set_observed_generation(generation);
    for c in new.conditions_mut() {
        c.observed_generation = generation;
    }
    *machine = patched;
    Ok(())
}

/// Publishes a successful step: `spec.providerID` (and the generation it bumps), addresses,
/// `initialization.provisioned`, the conditions, the status, the Events.
async fn apply_step<B: MachineBackend>(
    write: &Writer<'_, B>,
    machine: &B::Machine,
    mut new: <B::Machine as InfraMachine>::Status,
    earlier_events: Vec<(&'static str, String)>,
    step: Step,
) -> Result<Action> {
    let provider_id =
        (step.provisioned.as_ref().map(|done| done.provider_id.as_str())).or(step.provider_id.as_deref());
    let mut machine = machine.clone();
    publish_provider_id(write, &mut machine, &mut new, provider_id).await?;
    let generation = machine.meta().generation;
    let uid = machine.uid().unwrap_or_default();
    if let Some(done) = &step.provisioned {
        if let Some(addresses) = &done.addresses {
            new.set_addresses(addresses.clone());
        }
        new.set_provisioned(true);
    }
    let mut day2_problem = None;
    if let (Some(report), Some(type_)) = (&step.up_to_date, B::UP_TO_DATE_CONDITION) {
        let appears = condition::find(new.conditions(), type_).is_none_or(|c| c.reason != report.reason);
        day2_problem = (!report.ok && appears).then_some(report);
        report.set_in(new.conditions_mut(), type_, generation);
    }
    let reason_changed =
        condition::find(new.conditions(), condition::READY).is_none_or(|c| c.reason != step.ready.reason);
    step.ready
        .set_in(new.conditions_mut(), condition::READY, generation);
    let written = write.status(&new).await?;
    // A provisioned VM as the spec wants it, looked at again only later: until then, a reconcile
    // that finds the machine as this write left it asks the hypervisor nothing.
    let healthy = new.initialization().and_then(|i| i.provisioned) == Some(true)
        && step.ready.ok
        && step.up_to_date.as_ref().is_none_or(|r| r.ok)
        && !step.warning
        && !step.backoff
        && step.requeue >= SETTLED_MIN;
    let settled = healthy.then(|| Settled {
        // The object as the write left it: its metadata as this reconcile's own writes left it
        // (a providerID patch bumps the generation), its status as stored.
        state: match &written {
            Some(written) => read_state(written, written.status()),
            None => read_state(&machine, Some(&new)),
        },
        until: Instant::now() + step.requeue,
    });
    write.ctx.settle(&uid, settled);
    let mut events = earlier_events;
    events.extend(step.events);
    write.transitions(events).await;
    // A Warning when the problem appears: on the day-2 condition when it carries it, else on
    // `Ready`. A guest's cloud-init that failed is one on every backend.
    let cloud_init_failed = step.ready.reason == crate::cloud_init::CLOUD_INIT_FAILED;
    // (A provisioned machine's `Ready` problem is its guest's cloud-init failing.)
    let ready_problem = reason_changed && !step.ready.ok && (step.up_to_date.is_none() || cloud_init_failed);
    if (step.warning || cloud_init_failed)
        && let Some(report) = day2_problem.or(ready_problem.then_some(&step.ready))
    {
        write
            .event(EventType::Warning, report.reason, report.message.clone())
            .await;
    }
    if step.backoff {
        return Ok(Action::requeue(write.ctx.backoffs().hold(&uid, Instant::now())));
    }
    Ok(Action::requeue(step.requeue.max(Duration::from_millis(50))))
}

async fn delete<B: MachineBackend>(
    ctx: &MachineContext<B>,
    write: &Writer<'_, B>,
    infra: &InfraCluster<<B::Machine as InfraMachine>::Cluster>,
    mut new: <B::Machine as InfraMachine>::Status,
    secrets: &ReadSecrets<B::Machine>,
) -> Result<Action> {
    let machine = write.machine;
    let Some(cluster) = infra.object() else {
        if !ctx.backend.may_have_vm(machine) {
            // Nothing was created on the hypervisor: release at once.
            secrets.forget();
            write.finalizer(false).await?;
            return Ok(Action::await_change());
        }
        let message = format!(
            "the {} is gone: cannot reach the hypervisor to delete the VM; restore it, or remove the finalizer {} by hand if the VM is gone",
            <<B::Machine as InfraMachine>::Cluster as Resource>::kind(&()),
            B::FINALIZER
        );
        return write.wait(new, DELETION_FAILED, message, PERMANENT_RETRY).await;
    };
    let request = Deletion {
        machine,
        cluster,
        secrets,
    };
    match ctx.backend.delete(&ctx.client, request, &mut new).await {
        Ok(Deleted::Released { reason, note }) => {
            write.event(EventType::Normal, reason, note).await;
            secrets.forget();
            write.finalizer(false).await?;
            Ok(Action::await_change())
        }
        Ok(Deleted::InProgress { message, requeue }) => write.wait(new, DELETING, message, requeue).await,
        Ok(Deleted::Blocked(problem)) => write.blocked(new, problem).await,
        Ok(Deleted::Again) => {
            write.status(&new).await?;
            Ok(Action::requeue(Duration::from_millis(100)))
        }
        Err(error) => write.fail(new, DELETING, Error::backend(error)).await,
    }
}

fn machine_to_infra<M: InfraMachine>(machine: Machine) -> Option<ObjectRef<M>> {
    let r = &machine.spec.infrastructure_ref;
    (r.kind == M::kind(&()) && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
        .then(|| ObjectRef::new(&r.name).within(&machine.namespace().unwrap_or_default()))
}

fn virtual_machine_to_infra<M: InfraMachine>(vm: VirtualMachine) -> Option<ObjectRef<M>> {
    let ns = vm.namespace().unwrap_or_default();
    vm.status
        .as_ref()
        .and_then(|s| s.infrastructure_ref.as_ref())
        .filter(|r| r.kind == M::kind(&()))
        .map(|r| ObjectRef::new(&r.name).within(&ns))
}

/// Runs the infra machine controller until `shutdown`, for one namespace or (`None`) all;
/// restarted with the CAPI watches when Cluster API gets installed meanwhile.
///
/// Besides its own kind it watches what a reconcile reads, so that a change there is acted on at
/// once rather than at the next requeue: the infra clusters (the machines of their namespace),
/// banlieue VirtualMachines (the machine their status names; not their status changes), both
/// also cached for the reconciles ([`owner::OwnerCaches`]), the Secrets each machine's last
/// reconcile read, and with CAPI the Machines (bootstrap data) and Clusters (pause,
/// infrastructure) of the labelled machines.
pub async fn run<B: MachineBackend>(
    ctx: Arc<MachineContext<B>>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    crate::capi::run_until_shutdown(
        ctx.client.clone(),
        "inframachine",
        ctx.capi_discovery_interval,
        shutdown,
        |capi, stop| run_once(ctx.clone(), namespace, concurrency, capi, stop),
    )
    .await;
}

async fn run_once<B: MachineBackend>(
    ctx: Arc<MachineContext<B>>,
    namespace: Option<&str>,
    concurrency: u16,
    capi: bool,
    shutdown: crate::capi::Stop,
) {
    let client = ctx.client.clone();
    let controller = lean_controller(
        api::<B::Machine>(&client, namespace),
        crate::drive::primary_watch(ctx.watch_filter.as_deref()),
    );
    let store = controller.store();
    let in_namespace = {
        let store = store.clone();
        move |cluster: <B::Machine as InfraMachine>::Cluster| {
            let ns = cluster.namespace();
            store
                .state()
                .into_iter()
                .filter(|m| m.namespace() == ns)
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        }
    };
    // The infra clusters and VirtualMachines are cached (what a reconcile reads of them) and
    // wake the machines they concern.
    let (clusters, clusters_events) = lean_watch(
        api::<<B::Machine as InfraMachine>::Cluster>(&client, namespace),
        watcher::Config::default(),
    );
    let clusters_changed = clusters_events.default_backoff().touched_objects();
    // Only what a reconcile reads of a VirtualMachine (its spec, labels, annotations and
    // deletion, which bumps the generation) wakes its machine: the controller's status writes,
    // a few per VM, would each wake it for nothing.
    let (virtual_machines, vms_events) = lean_watch(
        api::<VirtualMachine>(&client, namespace),
        watcher::Config::default(),
    );
    let vms_changed = vms_events.default_backoff().touched_objects().predicate_filter(
        crate::drive::spec_labels_annotations::<VirtualMachine>,
        Default::default(),
    );
    *crate::lock(&ctx.owner_caches) = Some(owner::OwnerCaches {
        virtual_machines,
        clusters,
    });
    let mut controller = controller
        .watches_stream(clusters_changed, in_namespace)
        .watches_stream(vms_changed, virtual_machine_to_infra::<B::Machine>)
        // A created or fixed credentials or user-data Secret concerns the machines that read it.
        .watches(
            secrets_api(client.clone(), namespace),
            watcher::Config::default(),
            ctx.secrets.mapper(),
        );
    if capi {
        let labelled = move |cluster: Cluster| {
            let (name, ns) = (cluster.name_any(), cluster.namespace());
            store
                .state()
                .into_iter()
                .filter(|m| m.namespace() == ns && contract::cluster_name(m.meta()) == Some(name.as_str()))
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        };
        // A machine reads its Machine's spec (bootstrap data Secret, failure domain) and its
        // Cluster's spec (`paused`) and whether its infrastructure is provisioned: CAPI's other
        // status writes of both (several per Machine) wake no reconcile.
        let cluster_read = crate::drive::spec_labels_annotations::<Cluster>
            .combine(|c: &Cluster| Some(u64::from(contract::is_infrastructure_provisioned(c))));
        controller = controller
            .watches_stream(
                crate::drive::changes_of::<Machine, _>(
                    &client,
                    namespace,
                    crate::drive::spec_labels_annotations::<Machine>,
                ),
                machine_to_infra::<B::Machine>,
            )
            .watches_stream(
                crate::drive::changes_of::<Cluster, _>(&client, namespace, cluster_read),
                labelled,
            );
    }
    let metrics = ctx.metrics.clone();
    // The steps of one reconcile and the reconciles of the machines sharing a Provider read its
    // connection once per moment (the infra cluster's controller, which reports a changed
    // Provider or Secret, reads it every time).
    let memo = connection_memo::Memo::default();
    let reconcile = move |obj, ctx| connection_memo::remembering(memo.clone(), reconcile::<B>(obj, ctx));
    crate::drive::drive(
        controller,
        concurrency,
        shutdown,
        metrics,
        reconcile,
        error_policy::<B>,
        ctx,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn an_unreadable_status_is_said_in_ready_with_its_reason() {
        let problem = Problem::from(InconsistentStatus::without(ProvisioningState::Cloning, "vmRef"));
        assert_eq!(problem.reason, INCONSISTENT_STATUS);
        assert_eq!(
            problem.message,
            "status.provisioning is inconsistent: state Cloning without vmRef"
        );
        let problem = Problem::from(InconsistentStatus::not_provisioning(ProvisioningState::Deleting));
        assert_eq!(
            problem.message,
            "status.provisioning is inconsistent: state Deleting is not a provisioning state"
        );
    }

    #[test]
    fn a_settled_machine_skips_the_hypervisor_only_as_left_and_until_due() {
        let now = std::time::Instant::now();
        let settled = Settled {
            state: 42,
            until: now + Duration::from_secs(600),
        };
        assert_eq!(settled.wait(42, now), Some(Duration::from_secs(600)));
        assert_eq!(settled.wait(43, now), None, "changed since the provider's write");
        assert_eq!(
            settled.wait(42, now + Duration::from_secs(600)),
            None,
            "due: the backend looks again"
        );
    }

    #[test]
    fn what_a_reconcile_reads_of_a_machine_changes_its_state_and_managed_fields_do_not() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
            ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
        };
        let machine = |f: &dyn Fn(&mut ObjectMeta)| {
            let mut meta = ObjectMeta {
                name: Some("m1".into()),
                generation: Some(1),
                resource_version: Some("10".into()),
                labels: Some([("a".to_owned(), "1".to_owned())].into()),
                ..ObjectMeta::default()
            };
            f(&mut meta);
            k8s_openapi::api::core::v1::ConfigMap {
                metadata: meta,
                ..Default::default()
            }
        };
        let status = Some(&"Provisioned");
        let base = read_state(&machine(&|_| {}), status);
        let managed_only = machine(&|m| {
            m.resource_version = Some("11".into());
            m.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some("capi-machineset".into()),
                operation: Some("Apply".into()),
                ..ManagedFieldsEntry::default()
            }]);
        });
        assert_eq!(
            read_state(&managed_only, status),
            base,
            "a new resourceVersion and field manager alone"
        );
        type Change<'a> = (&'a str, &'a dyn Fn(&mut ObjectMeta));
        let changes: [Change; 6] = [
            ("generation", &|m| m.generation = Some(2)),
            ("label", &|m| {
                m.labels = Some([("a".to_owned(), "2".to_owned())].into())
            }),
            ("annotation", &|m| {
                m.annotations = Some([("cluster.x-k8s.io/paused".to_owned(), String::new())].into())
            }),
            ("finalizer", &|m| m.finalizers = Some(vec!["x".into()])),
            ("deletion", &|m| {
                m.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()))
            }),
            ("owner", &|m| {
                m.owner_references = Some(vec![OwnerReference {
                    uid: "u".into(),
                    kind: "Machine".into(),
                    name: "m1".into(),
                    ..OwnerReference::default()
                }])
            }),
        ];
        for (what, change) in changes {
            assert_ne!(
                read_state(&machine(change), status),
                base,
                "a changed {what} is a change"
            );
        }
        assert_ne!(
            read_state(&machine(&|_| {}), Some(&"WaitingForCluster")),
            base,
            "a status written since is a change"
        );
    }

    #[test]
    fn a_step_that_asks_for_backoff_keeps_growing_it_until_a_plain_success() {
        let mut b = Backoffs::default();
        let secs = |d: Duration| d.as_secs();
        let mut now = std::time::Instant::now();
        assert_eq!(secs(b.next("a", now)), 2);
        b.succeeded("a");
        assert_eq!(secs(b.next("a", now)), 2, "a plain success starts again");
        now += Duration::from_secs(2);
        let held: Vec<u64> = (0..10)
            .map(|_| {
                let d = b.hold("a", now);
                b.succeeded("a");
                now += d;
                secs(d)
            })
            .collect();
        assert_eq!(held, [4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        b.succeeded("a");
        assert_eq!(secs(b.hold("a", now)), 2, "after a plain success, from the start");
        assert_eq!(secs(b.next("b", now)), 2, "per object");
    }

    #[test]
    fn failures_that_events_bring_early_wait_out_the_current_delay_without_doubling_it() {
        let mut b = Backoffs::default();
        let start = std::time::Instant::now();
        assert_eq!(b.next("a", start), Duration::from_secs(2));
        // Failures within the first delay (status writes, Secret events): no growth.
        for ms in [10, 50, 300, 900, 1500, 1990] {
            let early = start + Duration::from_millis(ms);
            assert_eq!(b.next("a", early), Duration::from_millis(2000 - ms));
        }
        // The retry that came when due fails: the delay doubles from then.
        let due = start + Duration::from_secs(2);
        assert_eq!(b.next("a", due), Duration::from_secs(4));
        assert_eq!(b.next("a", due + Duration::from_secs(1)), Duration::from_secs(3));
        assert_eq!(b.next("a", due + Duration::from_secs(4)), Duration::from_secs(8));
    }

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn source(key: &str) -> BootstrapSource {
        BootstrapSource::Secret {
            name: "web-user-data".into(),
            key: key.into(),
        }
    }

    #[test]
    fn a_missing_secret_and_a_missing_key_are_told_apart() {
        let (missing, retry) = user_data_from(None, &source("userdata"), true, "team-a").unwrap_err();
        assert_eq!(missing.reason, USER_DATA_SECRET_NOT_FOUND);
        assert!(
            missing.message.contains("team-a/web-user-data") && missing.message.contains("userdata"),
            "{}",
            missing.message
        );
        assert_eq!(retry, WAIT_REQUEUE);
        let (capi, _) = user_data_from(None, &source("value"), false, "ns").unwrap_err();
        assert_eq!(capi.reason, BOOTSTRAP_DATA_SECRET_NOT_FOUND);
        let (no_key, retry) =
            user_data_from(Some(&secret(&[("other", "x")])), &source("userdata"), true, "ns").unwrap_err();
        assert_eq!(no_key.reason, BOOTSTRAP_DATA_INVALID);
        assert_eq!(retry, PERMANENT_RETRY);
    }

    #[test]
    fn a_capi_secret_carries_its_format_and_a_virtual_machines_key_is_cloud_config() {
        let ignition = secret(&[("value", "{}"), ("format", "ignition")]);
        let data = user_data_from(Some(&ignition), &source("value"), false, "ns").unwrap();
        assert_eq!(data.format, BootstrapFormat::Ignition);
        let vm = user_data_from(
            Some(&secret(&[("userdata", "#cloud-config\n")])),
            &source("userdata"),
            true,
            "ns",
        )
        .unwrap();
        assert_eq!(vm.format, BootstrapFormat::CloudConfig);
        assert_eq!(vm.value, b"#cloud-config\n");
        let empty = user_data_from(None, &BootstrapSource::Empty, true, "ns").unwrap();
        assert!(empty.value.is_empty());
    }
}
