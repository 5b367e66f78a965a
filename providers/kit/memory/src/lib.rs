//! An in-memory hypervisor behind the provider kit: the smallest complete backend, and the
//! worked example of `docs/write-a-provider.md`.
//!
//! - [`Hypervisor`]: the "hypervisor", a few hosts and VMs in a `Mutex`, with the knobs a test
//!   needs (an outage, slowness).
//! - [`MemoryClusters`]: the [`ClusterBackend`]: connect, list hosts as failure domains.
//! - [`MemoryMachines`]: the [`MachineBackend`]: place, create, start, delete, one step at a time,
//!   each idempotent (a VM's id is its machine's UID, so a retried or re-run step never creates
//!   a second one).
//!
//! A new hypervisor has kinds of its own; this double borrows libvirt's (`LibvirtCluster` with
//! `uri: test:///memory`, `LibvirtMachine` with `source.volume` as the image), so no CRD exists for
//! it. Run it only in a namespace no libvirt provider watches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use banlieue_api::common::{
    FailureDomain, MachineAddress, MachineAddressType, PowerState, ProvisioningState,
};
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine, LibvirtMachineStatus};
use banlieue_provider_kit::cloud_init::Wait;
use banlieue_provider_kit::cluster::{ClusterBackend, ClusterCheck, Problem};
use banlieue_provider_kit::error::ReconcileError;
use banlieue_provider_kit::machine::{
    self as kit, Deleted, Deletion, MachineBackend, Plan, Provision, Provisioned, Report, Step, StepFailure,
};
use banlieue_provider_kit::network;
use banlieue_provider_kit::progress::{Guest, Progress};
use banlieue_provider_kit::secrets::ReadSecrets;
use kube::ResourceExt;

/// Finalizer of the machines and clusters this backend serves.
pub const FINALIZER: &str = "infrastructure.banlieue.io/memory";
/// Field manager of its writes.
pub const FIELD_MANAGER: &str = "banlieue-memory";
/// What every `spec.providerID` starts with: `memory://<host>/<id>`.
pub const PROVIDER_ID_PREFIX: &str = "memory://";
/// The endpoint (`LibvirtCluster.spec.uri`) the hypervisor answers on.
pub const ENDPOINT: &str = "test:///memory";
/// Condition type of the cluster's connection.
pub const MEMORY_CONNECTED: &str = "MemoryConnected";
/// Condition reason: the image (`spec.source.volume`) does not exist.
pub const IMAGE_NOT_FOUND: &str = "ImageNotFound";
/// Condition reason: the endpoint does not answer.
pub const UNREACHABLE: &str = "Unreachable";
/// CPUs every in-memory host reports.
pub const HOST_CPUS: u32 = 4;
/// Memory in MiB every in-memory host reports.
pub const HOST_MEMORY_MIB: u64 = 8192;

/// A VM of the in-memory hypervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vm {
    /// Its id: the UID of the machine it was created for.
    pub id: String,
    /// The host it runs on.
    pub host: String,
    /// The machine it belongs to (`namespace/name`, and UID), written on creation.
    pub owner: String,
    /// The UID of that machine.
    pub owner_uid: String,
    /// The user data the guest sees.
    pub user_data: Vec<u8>,
    /// The cloud-init `network-config` the guest sees (YAML), when `spec.networks` asks for
    /// more than DHCP.
    pub network_config: Option<String>,
    /// Whether it runs.
    pub running: bool,
}

#[derive(Debug, Default)]
struct State {
    hosts: Vec<String>,
    images: Vec<String>,
    vms: BTreeMap<String, Vm>,
    down: bool,
    delay: Duration,
}

/// The in-memory hypervisor, shared by its backends and the test that plays with it.
#[derive(Clone, Debug, Default)]
pub struct Hypervisor(Arc<Mutex<State>>);

/// A call to the hypervisor that failed: it is down.
#[derive(Debug, thiserror::Error)]
#[error("in-memory hypervisor at {ENDPOINT} does not answer (test outage)")]
pub struct Outage;

impl ReconcileError for Outage {
    fn metric_label(&self) -> &'static str {
        "unreachable"
    }
}

impl Hypervisor {
    /// A hypervisor with these hosts and images, no VM.
    pub fn new(hosts: &[&str], images: &[&str]) -> Self {
        let state = State {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            images: images.iter().map(|i| (*i).to_owned()).collect(),
            ..State::default()
        };
        Self(Arc::new(Mutex::new(state)))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every VM.
    pub fn vms(&self) -> Vec<Vm> {
        self.lock().vms.values().cloned().collect()
    }

    /// Cuts (`true`) or restores every connection; the VMs survive.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Makes every call take `delay` (so a test can kill a controller between two steps).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// One call: waits the delay, then runs `f` on the state unless the hypervisor is down.
    async fn call<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T, Outage> {
        let delay = self.lock().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.lock();
        if state.down {
            return Err(Outage);
        }
        Ok(f(&mut state))
    }
}

/// The cluster side: the endpoint must be [`ENDPOINT`]; every host is a failure domain.
#[derive(Clone, Debug)]
pub struct MemoryClusters(pub Hypervisor);

impl ClusterBackend for MemoryClusters {
    type Cluster = LibvirtCluster;
    type Machine = LibvirtMachine;
    type Error = Outage;
    const FINALIZER: &'static str = FINALIZER;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;
    const CONNECTED_CONDITION: &'static str = MEMORY_CONNECTED;

    async fn check(
        &self,
        _client: &kube::Client,
        cluster: &LibvirtCluster,
        _secrets: &ReadSecrets<LibvirtCluster>,
    ) -> Result<Result<ClusterCheck, Problem>, Outage> {
        let uri = cluster.spec.uri.as_deref().unwrap_or_default();
        if uri != ENDPOINT {
            return Ok(Err(Problem::new(
                UNREACHABLE,
                format!("no in-memory hypervisor at {uri:?} (it answers at {ENDPOINT})"),
            )));
        }
        let hosts = match self.0.call(|s| s.hosts.clone()).await {
            Err(e) => return Ok(Err(Problem::new(UNREACHABLE, e.to_string()))),
            Ok(hosts) => hosts,
        };
        let domains = hosts
            .into_iter()
            .map(|name| {
                let domain = FailureDomain {
                    name,
                    control_plane: Some(true),
                    attributes: None,
                };
                domain.with_capacity(Some(HOST_CPUS), Some(HOST_MEMORY_MIB))
            })
            .collect();
        // Usable while the hypervisor has a host to place machines on.
        let none = Problem::new("NoHost", "the in-memory hypervisor has no host");
        Ok(Ok(ClusterCheck {
            version: Some("memory-1".to_owned()),
            ..ClusterCheck::with_domains(Ok(String::new()), domains, none)
        }))
    }
}

/// Where a machine is, from its persisted status: `node` = host, `domainUUID` = VM id,
/// `provisioning.state` = `Ready` once started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Choose the host.
    Place,
    /// Create the VM on `host`.
    Create {
        /// The chosen host.
        host: String,
    },
    /// Start VM `id`.
    Start {
        /// Its host.
        host: String,
        /// Its id.
        id: String,
    },
    /// Done.
    Provisioned {
        /// Its host.
        host: String,
        /// Its id.
        id: String,
    },
}

impl Phase {
    fn read(status: Option<&LibvirtMachineStatus>) -> Self {
        let host = status.and_then(|s| s.node.clone());
        let id = status.and_then(|s| s.domain_uuid.clone());
        let ready = status
            .and_then(|s| s.provisioning.as_ref())
            .is_some_and(|p| p.state == ProvisioningState::Ready);
        match (host, id) {
            (None, _) => Self::Place,
            (Some(host), None) => Self::Create { host },
            (Some(host), Some(id)) if ready => Self::Provisioned { host, id },
            (Some(host), Some(id)) => Self::Start { host, id },
        }
    }

    fn write(&self, status: &mut LibvirtMachineStatus) {
        let (host, id, state) = match self {
            Self::Place => (None, None, ProvisioningState::Pending),
            Self::Create { host } => (Some(host), None, ProvisioningState::Cloning),
            Self::Start { host, id } => (Some(host), Some(id), ProvisioningState::PoweringOn),
            Self::Provisioned { host, id } => (Some(host), Some(id), ProvisioningState::Ready),
        };
        status.node = host.cloned();
        status.failure_domain = host.cloned();
        status.domain_uuid = id.cloned();
        status.provisioning.get_or_insert_with(Default::default).state = state;
    }
}

/// The machine side.
#[derive(Clone, Debug)]
pub struct MemoryMachines(pub Hypervisor);

fn problem(reason: &'static str, message: String) -> StepFailure<Outage> {
    StepFailure::problem(reason, message, Some(kit::PERMANENT_RETRY))
}

fn outage(error: Outage) -> StepFailure<Outage> {
    StepFailure::Transient {
        reason: UNREACHABLE,
        error,
    }
}

impl MachineBackend for MemoryMachines {
    type Machine = LibvirtMachine;
    type Error = Outage;
    type Phase = Phase;
    const FINALIZER: &'static str = FINALIZER;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;

    fn plan(&self, machine: &LibvirtMachine) -> Result<(Plan, Phase), Problem> {
        let phase = Phase::read(machine.status.as_ref());
        let readopting = phase == Phase::Place && machine.spec.provider_id.is_some();
        let plan = Plan {
            needs_user_data: matches!(phase, Phase::Place | Phase::Create { .. }) && !readopting,
            readopting,
            provisioned: matches!(phase, Phase::Provisioned { .. }),
        };
        Ok((plan, phase))
    }

    fn may_have_vm(&self, machine: &LibvirtMachine) -> bool {
        machine.status.as_ref().is_some_and(|s| s.node.is_some()) || machine.spec.provider_id.is_some()
    }

    async fn provision(
        &self,
        _client: &kube::Client,
        request: Provision<'_, LibvirtMachine>,
        phase: Phase,
        status: &mut LibvirtMachineStatus,
    ) -> Result<Step, StepFailure<Outage>> {
        let machine = request.machine;
        let uid = machine.uid().unwrap_or_default();
        let owner = format!(
            "{}/{}",
            machine.namespace().unwrap_or_default(),
            machine.name_any()
        );
        let next = match &phase {
            // A machine created anew with a providerID (clusterctl move): adopt its VM.
            Phase::Place if machine.spec.provider_id.is_some() => {
                let provider_id = machine.spec.provider_id.clone().unwrap_or_default();
                let id = provider_id.rsplit('/').next().unwrap_or_default().to_owned();
                let adopted = self
                    .0
                    .call(|s| {
                        let vm = s.vms.get_mut(&id)?;
                        vm.owner_uid.clone_from(&uid);
                        vm.owner.clone_from(&owner);
                        Some(vm.host.clone())
                    })
                    .await
                    .map_err(outage)?;
                let Some(host) = adopted else {
                    return Err(problem(
                        kit::VM_NOT_FOUND,
                        format!("no VM {id} for spec.providerID {provider_id}"),
                    ));
                };
                Phase::Provisioned { host, id }
            }
            Phase::Place => {
                let image = machine.spec.source.volume.clone().unwrap_or_default();
                let wanted = request.view.failure_domain.clone();
                let placed = self
                    .0
                    .call(|s| {
                        if !s.images.contains(&image) {
                            return Err((IMAGE_NOT_FOUND, format!("image {image:?} not found")));
                        }
                        match wanted {
                            Some(fd) if s.hosts.contains(&fd) => Ok(fd),
                            Some(fd) => Err(("FailureDomainNotFound", format!("no host {fd:?}"))),
                            // Spread: the host with the fewest VMs.
                            None => s
                                .hosts
                                .iter()
                                .min_by_key(|h| s.vms.values().filter(|v| &v.host == *h).count())
                                .cloned()
                                .ok_or(("NoHost", "no host".to_owned())),
                        }
                    })
                    .await
                    .map_err(outage)?;
                match placed {
                    Ok(host) => Phase::Create { host },
                    Err((reason, message)) => return Err(problem(reason, message)),
                }
            }
            Phase::Create { host } => {
                let user_data = request.user_data.map(|d| d.value.clone()).unwrap_or_default();
                // Addresses as the spec asks (pool addresses resolved by the kit), interfaces
                // matched by name.
                let networks = &request.machine.spec.networks;
                let network_config = if network::needs_network_config(networks) {
                    let config = network::network_config(networks, |_, _| Ok(None), request.pool_addresses)
                        .map_err(|message| problem(network::WAITING_FOR_IP_ADDRESS, message))?;
                    Some(
                        config
                            .to_yaml()
                            .map_err(|e| problem("NetworkConfigInvalid", e.to_string()))?,
                    )
                } else {
                    None
                };
                let vm = Vm {
                    id: uid.clone(),
                    host: host.clone(),
                    owner: owner.clone(),
                    owner_uid: uid.clone(),
                    user_data,
                    network_config,
                    running: false,
                };
                // Idempotent: the id is the machine's UID.
                self.0
                    .call(|s| {
                        s.vms.entry(vm.id.clone()).or_insert(vm);
                    })
                    .await
                    .map_err(outage)?;
                Phase::Start {
                    host: host.clone(),
                    id: uid.clone(),
                }
            }
            Phase::Start { host, id } | Phase::Provisioned { host, id } => {
                let running = self
                    .0
                    .call(|s| {
                        let vm = s.vms.get_mut(id)?;
                        vm.running = true;
                        Some(())
                    })
                    .await
                    .map_err(outage)?;
                if running.is_none() {
                    return Err(problem(kit::VM_NOT_FOUND, format!("VM {id} is gone")));
                }
                Phase::Provisioned {
                    host: host.clone(),
                    id: id.clone(),
                }
            }
        };
        next.write(status);
        status.power_state = matches!(next, Phase::Provisioned { .. }).then_some(PowerState::On);
        // What the step did, in the kit's terms: the kit decides `Ready` and `VMUpToDate` from it.
        let (reason, progress) = match (&phase, &next) {
            (Phase::Provisioned { .. }, Phase::Provisioned { .. }) => ("Provisioned", Progress::<()>::to(())),
            (_, Phase::Provisioned { id, .. }) => (
                "Provisioned",
                Progress::to(()).event("Provisioned", format!("VM {id} runs")),
            ),
            (_, Phase::Create { host }) => (
                "Creating",
                Progress::wait((), Duration::ZERO, format!("creating the VM on {host}"))
                    .event("Scheduled", format!("placed on host {host}")),
            ),
            (_, _) => (
                "PoweringOn",
                Progress::wait((), Duration::ZERO, "starting the VM"),
            ),
        };
        let Phase::Provisioned { host, id } = &next else {
            // Every step is idempotent (the VM's id is the machine's UID): the next follows at once.
            return Ok(progress.into_step(None, reason, &Wait::default(), true));
        };
        let vm = format!("VM {id}");
        let guest = Guest {
            name: &vm,
            observed: status.power_state,
            desired: machine.spec.power_state,
            skip_cloud_init: true,
        };
        let progress = Progress {
            requeue: Duration::from_secs(300),
            provisioned: Some(Provisioned {
                provider_id: format!("{PROVIDER_ID_PREFIX}{host}/{id}"),
                addresses: Some(vec![MachineAddress::new(
                    MachineAddressType::InternalIP,
                    "192.0.2.10",
                )]),
            }),
            // The in-memory VM never drifts from its spec.
            up_to_date: Some(Report::up_to_date(None)),
            ..progress
        };
        Ok(progress.into_step(Some(guest), reason, &Wait::default(), true))
    }

    async fn delete(
        &self,
        _client: &kube::Client,
        request: Deletion<'_, LibvirtMachine>,
        _status: &mut LibvirtMachineStatus,
    ) -> Result<Deleted, Outage> {
        let uid = request.machine.uid().unwrap_or_default();
        // Only a VM that carries this machine's UID is deleted (a VM adopted by a copy elsewhere
        // is not).
        let removed = self
            .0
            .call(|s| {
                let ids: Vec<String> = s
                    .vms
                    .values()
                    .filter(|v| v.owner_uid == uid)
                    .map(|v| v.id.clone())
                    .collect();
                ids.iter().filter_map(|id| s.vms.remove(id)).count()
            })
            .await?;
        Ok(Deleted::released(if removed == 0 {
            "no VM was created"
        } else {
            "VM deleted"
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phase_round_trips_through_status() {
        for phase in [
            Phase::Place,
            Phase::Create { host: "a".into() },
            Phase::Start {
                host: "a".into(),
                id: "u".into(),
            },
            Phase::Provisioned {
                host: "a".into(),
                id: "u".into(),
            },
        ] {
            let mut status = LibvirtMachineStatus::default();
            phase.write(&mut status);
            assert_eq!(Phase::read(Some(&status)), phase);
        }
    }

    #[tokio::test]
    async fn an_outage_fails_every_call_and_keeps_the_vms() {
        let hv = Hypervisor::new(&["a"], &["img"]);
        hv.call(|s| {
            s.vms.insert(
                "u".into(),
                Vm {
                    id: "u".into(),
                    host: "a".into(),
                    owner: "ns/m".into(),
                    owner_uid: "u".into(),
                    user_data: vec![],
                    network_config: None,
                    running: true,
                },
            )
        })
        .await
        .unwrap();
        hv.set_down(true);
        assert!(hv.call(|s| s.vms.len()).await.is_err());
        hv.set_down(false);
        assert_eq!(hv.vms().len(), 1);
    }
}
