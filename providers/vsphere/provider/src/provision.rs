//! One provisioning or deletion step against vCenter. A step starts at most one task and
//! returns the next [`Phase`]; tasks are polled on the next reconcile, never awaited here.
//!
//! Crash safety: every clone carries the machine's UID in extraConfig [`OWNER_KEY`] (and its
//! `namespace/name` in [`OWNER_NAME_KEY`], see [`crate::readopt`]). Before
//! cloning (and whenever the clone task is lost) the inventory is searched for a VM with that
//! UID and such a VM is adopted instead of cloning again. Deletion only ever touches the VM in
//! `status.vmRef` or one carrying our UID.

use std::time::Duration;

use banlieue_api::common::{CloneMode, MachineAddress, MachineAddressType, PowerState, ReadinessChecks};
use banlieue_api::infrastructure::{VSphereCluster, VSphereFailureDomain, VSphereMachineSpec};
use banlieue_api::support;
use banlieue_provider_kit::network::{self, PoolAddresses, WAITING_FOR_IP_ADDRESS};
use banlieue_provider_kit::power;
use banlieue_vsphere_client::device::nic_type_for_model;
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{Client, CloneSpec, MoRef, PoolHosts, VmInfo, VmPowerState};
use base64::Engine as _;
use k8s_openapi::jiff::Timestamp;

use crate::image_import;
use crate::phase::Phase;
use crate::readopt::{self, Found};
use crate::update::{self, DesiredNic, UpdateAction};
use banlieue_provider_kit::machine::Report;
use banlieue_provider_kit::progress::{FailedTask, Progress};

pub use crate::readopt::{OWNER_KEY, OWNER_NAME_KEY};
/// How often a running task is polled.
pub const TASK_POLL: Duration = Duration::from_secs(2);
/// How often the guest is asked for its IP.
pub const GUEST_POLL: Duration = Duration::from_secs(5);
/// Resync of a provisioned machine.
pub const RESYNC: Duration = Duration::from_secs(600);
pub use banlieue_provider_kit::machine::PERMANENT_RETRY;

/// Everything about the machine provisioning reads.
#[derive(Clone, Copy, Debug)]
pub struct MachineInput<'a> {
    /// The VSphereMachine the VM is marked for (its UID); its name is also the VM name and the
    /// guest hostname.
    pub owner: readopt::Owner<'a>,
    /// The spec.
    pub spec: &'a VSphereMachineSpec,
    /// The infra cluster.
    pub cluster: &'a VSphereCluster,
    /// Requested failure domain.
    pub failure_domain: Option<&'a str>,
    /// Addresses allocated from IPAM pools for `mode: Pool` interfaces (the kit's).
    pub pool_addresses: &'a PoolAddresses,
}

/// The inventory paths a machine resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Datacenter name.
    pub datacenter: String,
    /// Template path.
    pub template: String,
    /// VM folder path.
    pub folder: String,
    /// Resource pool path.
    pub pool: String,
    /// Datastore path.
    pub datastore: Option<String>,
    /// The failure domain used.
    pub failure_domain: Option<String>,
}

/// `path` as given when absolute, else under the datacenter's `kind` folder (`host`, `vm`, …).
pub(crate) fn under(dc: &str, kind: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{dc}/{kind}/{path}")
    }
}

/// The datacenter: the failure domain's own (it may be in another vCenter), else the machine's,
/// else the cluster's.
fn datacenter(input: &MachineInput<'_>, fd: Option<&VSphereFailureDomain>) -> Result<String, StepError> {
    fd.and_then(|f| f.datacenter.clone())
        .or_else(|| input.spec.datacenter.clone())
        .or_else(|| input.cluster.spec.datacenter.clone())
        .ok_or_else(|| {
            permanent(
                "DatacenterNotSet",
                "set spec.datacenter on the VSphereMachine or the VSphereCluster",
            )
        })
}

/// The machine's failure domain in the VSphereCluster's `spec.failureDomains`, if it has one.
fn failure_domain<'a>(input: &MachineInput<'a>) -> Result<Option<&'a VSphereFailureDomain>, StepError> {
    let Some(name) = input.failure_domain else {
        return Ok(None);
    };
    let found = input.cluster.spec.failure_domains.iter().find(|f| f.name == name);
    found.map(Some).ok_or_else(|| {
        permanent(
            "FailureDomainNotFound",
            format!("failure domain {name:?} is not in the VSphereCluster's spec.failureDomains"),
        )
    })
}

/// Resolves datacenter, template, folder, pool and datastore paths (pure).
pub fn placement(input: &MachineInput<'_>) -> Result<Placement, StepError> {
    let spec = input.spec;
    let fd = failure_domain(input)?;
    let dc = datacenter(input, fd)?;
    let pool = match (fd, &spec.resource_pool) {
        (Some(fd), _) => {
            let cluster = under(&dc, "host", &fd.compute_cluster);
            match &fd.resource_pool {
                Some(p) if p.starts_with('/') => p.clone(),
                Some(p) => format!("{cluster}/Resources/{p}"),
                None => format!("{cluster}/Resources"),
            }
        }
        (None, Some(p)) => under(&dc, "host", p),
        (None, None) => {
            return Err(permanent(
                "ResourcePoolNotSet",
                "set spec.resourcePool (e.g. cluster1/Resources) or place the machine in a failure domain",
            ));
        }
    };
    let datastore = fd
        .and_then(|f| f.datastore.clone())
        .or_else(|| spec.datastore.clone())
        .map(|d| under(&dc, "datastore", &d));
    Ok(Placement {
        template: under(&dc, "vm", &spec.source.template),
        folder: under(&dc, "vm", spec.folder.as_deref().unwrap_or(""))
            .trim_end_matches('/')
            .to_owned(),
        pool,
        datastore,
        failure_domain: fd.map(|f| f.name.clone()),
        datacenter: dc,
    })
}

/// `guestinfo.metadata`, read by cloud-init's VMware datasource (YAML 1.1: written by
/// [`banlieue_cloudinit::yaml11`] so a name such as `on` stays a string).
#[derive(serde::Serialize)]
struct GuestMetadata<'a> {
    #[serde(rename = "instance-id")]
    instance_id: &'a str,
    #[serde(rename = "local-hostname")]
    local_hostname: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<String>,
    #[serde(rename = "network.encoding", skip_serializing_if = "Option::is_none")]
    network_encoding: Option<&'static str>,
}

/// `guestinfo.metadata` (base64): instance id and hostname, and when `spec.networks` asks for
/// more than DHCP on the first interface (static or pool addresses, IPv6, MTU, DNS) a `network`
/// (cloud-init's VMware datasource) whose interfaces are matched by the MAC `mac` gives the
/// interface at that index of `spec.networks` (and renamed to its name), else by name. `Err`: an
/// address from an IPAM pool is not allocated yet.
pub fn guest_metadata(
    input: &MachineInput<'_>,
    mac: impl Fn(usize) -> Option<String>,
) -> Result<String, String> {
    let networks = &input.spec.networks;
    let network = if network::needs_network_config(networks) {
        let config = network::network_config(networks, |i, _| Ok(mac(i)), input.pool_addresses)?
            .to_yaml()
            .map_err(|e| e.to_string())?;
        Some(base64(config.as_bytes()))
    } else {
        None
    };
    let meta = banlieue_cloudinit::yaml11::to_string(&GuestMetadata {
        instance_id: input.owner.uid,
        local_hostname: input.owner.name,
        network_encoding: network.as_ref().map(|_| "base64"),
        network,
    })
    .map_err(|e| format!("cannot render guestinfo.metadata: {e}"))?;
    Ok(base64(meta.as_bytes()))
}

fn base64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The guestinfo extraConfig of a clone: user data and meta-data ([`guest_metadata`], its
/// interfaces matched by the MACs the spec sets: the VM's own are known once it exists, and
/// Configure rewrites the meta-data with them), base64, the vendor data that reports cloud-init's
/// end ([`crate::guest_report`]), plus our UID.
pub fn guestinfo(
    input: &MachineInput<'_>,
    user_data: Option<&[u8]>,
) -> Result<Vec<(String, String)>, String> {
    let networks = &input.spec.networks;
    let meta = guest_metadata(input, |i| networks.get(i).and_then(|n| n.mac_address.clone()))?;
    let mut out = vec![
        (GUESTINFO_METADATA.to_owned(), meta),
        ("guestinfo.metadata.encoding".to_owned(), "base64".to_owned()),
    ];
    if let Some(ud) = user_data {
        out.push(("guestinfo.userdata".to_owned(), base64(ud)));
        out.push(("guestinfo.userdata.encoding".to_owned(), "base64".to_owned()));
    }
    out.extend(crate::guest_report::clone_extra_config());
    out.extend(readopt::marker(input.owner));
    Ok(out)
}

/// The extraConfig key of the meta-data.
pub const GUESTINFO_METADATA: &str = "guestinfo.metadata";

/// Before the first power-on: the meta-data's `network` matched by the MACs the VM's NICs really
/// have (vCenter assigns them at clone time), so the guest configures and renames the right
/// interfaces whatever names its kernel gives them. `None` when the meta-data already says
/// that (or carries no `network`, or cannot be written: a machine re-adopted after a move keeps
/// what it has).
async fn metadata_rewrite(
    c: &Client,
    input: &MachineInput<'_>,
    vm: &MoRef,
    info: &VmInfo,
    nics: &[DesiredNic],
) -> Result<Option<Step>, StepError> {
    if !network::needs_network_config(&input.spec.networks) {
        return Ok(None);
    }
    let macs = update::paired_macs(nics, &info.hardware);
    let networks = &input.spec.networks;
    let mac = |i: usize| {
        networks
            .get(i)
            .and_then(|n| n.mac_address.clone())
            .or_else(|| macs.get(i).cloned().flatten())
    };
    let Ok(meta) = guest_metadata(input, mac) else {
        return Ok(None);
    };
    if info.extra_config.get(GUESTINFO_METADATA) == Some(&meta) {
        return Ok(None);
    }
    let spec = ConfigSpec {
        extra_config: vec![
            (GUESTINFO_METADATA.to_owned(), meta),
            ("guestinfo.metadata.encoding".to_owned(), "base64".to_owned()),
        ],
        ..ConfigSpec::default()
    };
    let task = c.reconfigure(vm, &spec).await.or_fail("ConfiguringFailed")?;
    Ok(Some(Step::wait(
        Phase::Configure(vm.clone(), Some(task)),
        TASK_POLL,
        "writing the guest's network configuration for the VM's MACs".to_owned(),
    )))
}

/// Addresses from the guest (pure): hostname plus every reported IP.
pub fn addresses(name: &str, info: &VmInfo) -> Vec<MachineAddress> {
    let mut out = vec![MachineAddress::new(MachineAddressType::Hostname, name)];
    let mut ips: Vec<&String> = info.ip_address.iter().collect();
    ips.extend(
        info.guest_ips
            .iter()
            .filter(|ip| Some(*ip) != info.ip_address.as_ref()),
    );
    for ip in ips {
        out.push(MachineAddress::new(MachineAddressType::InternalIP, ip.clone()));
    }
    out
}

/// What a step decided (the kit's [`Progress`] over the vSphere [`Phase`]).
pub type Step = Progress<Phase, Seen>;

/// What a step saw of the VM, for the status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    /// The VM's facts, once it exists.
    pub vm: Option<VmInfo>,
    /// The failure domain the VM was placed in.
    pub failure_domain: Option<String>,
}

/// Whether the step after `step` (which left `from`) may run at once, before its phase is
/// persisted ([`banlieue_provider_kit::machine::Step::next_now`]): when it neither waits nor
/// failed, or when it has just started a task (polled at once). Every step is safe to run
/// again after a crash: a VM carrying the machine's UID is adopted rather than cloned again (see
/// the module docs).
pub fn next_now(step: &Step, from: &Phase) -> bool {
    step.follows_at_once(from.task().is_some(), step.phase.task().is_some())
}

pub use crate::error::{OrFail, StepError, client_error};

fn permanent(reason: &'static str, message: impl Into<String>) -> StepError {
    StepError::permanent(reason, message)
}

/// The host of a clone into `pool`: none in a DRS cluster (vCenter places the VM), else the
/// connected host out of maintenance with the most memory left
/// ([`banlieue_provider_kit::placement`]), so machines without a failure domain spread over the
/// hosts instead of landing on the template's.
async fn choose_host(c: &Client, pool: &MoRef, pool_path: &str) -> Result<Option<MoRef>, StepError> {
    let hosts = match c.pool_hosts(pool).await.or_fail("CloningFailed")? {
        PoolHosts::Drs => return Ok(None),
        PoolHosts::Hosts(hosts) => hosts,
    };
    let usable: Vec<_> = hosts.into_iter().filter(|h| h.usable).collect();
    let chosen = banlieue_provider_kit::placement::roomiest(
        usable.iter().map(|h| (h.name.as_str(), Some(h.free_mib()))),
    );
    match chosen.and_then(|name| usable.iter().find(|h| h.name == name)) {
        Some(room) => Ok(Some(room.host.clone())),
        None => Err(permanent(
            "NoUsableHost",
            format!("no host of resource pool {pool_path:?} is connected and out of maintenance mode"),
        )),
    }
}

async fn find(c: &Client, path: &str, reason: &'static str, what: &str) -> Result<MoRef, StepError> {
    found(
        c.find_by_inventory_path(path).await.or_fail(reason)?,
        reason,
        what,
        path,
    )
}

/// `value`, else `what` at `path` is not found in vCenter.
fn found<T>(value: Option<T>, reason: &'static str, what: &str, path: &str) -> Result<T, StepError> {
    value.ok_or_else(|| permanent(reason, format!("{what} {path:?} not found in vCenter")))
}

async fn adoptable(c: &Client, uid: &str) -> Result<Option<MoRef>, StepError> {
    let vms = c
        .find_vms_by_extra_config(OWNER_KEY, uid)
        .await
        .or_fail("CloningFailed")?;
    Ok(vms.into_iter().next())
}

/// Retry after the VM's tags could not be set.
pub const TAGGING_RETRY: Duration = Duration::from_secs(60);

/// The template of `spec.source.image` is missing: its import is started or looked at
/// ([`image_import`]); the machine waits in [`Phase::Clone`].
async fn import_template(
    c: &Client,
    p: &Placement,
    image: &banlieue_api::common::ImageDownload,
) -> Result<Step, StepError> {
    let datastore = p.datastore.as_deref().ok_or_else(|| {
        permanent(
            image_import::IMPORT_NEEDS_DATASTORE,
            format!(
                "template {:?} is missing and spec.source.image would import it, which needs a datastore: \
                 set spec.datastore (or the failure domain's datastore)",
                p.template
            ),
        )
    })?;
    let folder_path = p.template.rsplit_once('/').map_or("", |(parent, _)| parent);
    let target = image_import::Target {
        template_path: p.template.clone(),
        folder: find(c, folder_path, "FolderNotFound", "template folder").await?,
        pool: find(c, &p.pool, "ResourcePoolNotFound", "resource pool").await?,
        datastore: find(c, datastore, "DatastoreNotFound", "datastore").await?,
        host: None,
    };
    let target = image_import::Target {
        host: choose_host(c, &target.pool, &p.pool).await?,
        ..target
    };
    let how_far = image_import::ensure(c, image, target)?;
    Ok(Step::to(Phase::Clone).importing(how_far))
}

/// One provisioning step. `user_data` is `None` until the controller read it; a step that needs
/// it returns [`StepError::NeedBootstrapData`]. `Some(None)` means "no user data".
pub async fn provision_step(
    c: &Client,
    input: &MachineInput<'_>,
    phase: Phase,
    user_data: Option<Option<&[u8]>>,
    desired_power: PowerState,
) -> Result<Step, StepError> {
    match phase {
        Phase::Clone if let Some(provider_id) = input.spec.provider_id.as_deref() => {
            readopt_step(c, input, provider_id).await
        }
        Phase::Clone => {
            if let Some(vm) = adoptable(c, input.owner.uid).await? {
                return Ok(Step::to(Phase::Configure(vm.clone(), None)).event(
                    "Adopted",
                    format!("adopted VM {} carrying this machine's UID", vm.value),
                ));
            }
            let Some(user_data) = user_data else {
                return Err(StepError::NeedBootstrapData);
            };
            let p = placement(input)?;
            let template = match &input.spec.source.image {
                None => find(c, &p.template, "TemplateNotFound", "template").await?,
                Some(image) => match c
                    .find_by_inventory_path(&p.template)
                    .await
                    .or_fail("TemplateNotFound")?
                {
                    Some(template) => {
                        image_import::check_template(c, &template, &p.template, image).await?;
                        template
                    }
                    None => return import_template(c, &p, image).await,
                },
            };
            let folder = find(c, &p.folder, "FolderNotFound", "folder").await?;
            let pool = find(c, &p.pool, "ResourcePoolNotFound", "resource pool").await?;
            let host = choose_host(c, &pool, &p.pool).await?;
            let datastore = match &p.datastore {
                Some(d) => Some(find(c, d, "DatastoreNotFound", "datastore").await?),
                None => None,
            };
            let linked_snapshot = match input.spec.clone_mode.unwrap_or_default() {
                CloneMode::Full => None,
                CloneMode::Linked => Some(
                    c.properties(&template, &["snapshot.currentSnapshot"])
                        .await
                        .or_fail("CloningFailed")?
                        .and_then(|p| p.get("snapshot.currentSnapshot").and_then(MoRef::from_xml))
                        .ok_or_else(|| {
                            permanent(
                                "CloningFailed",
                                format!("a Linked clone needs a snapshot on template {:?}", p.template),
                            )
                        })?,
                ),
            };
            let spec = CloneSpec {
                folder,
                name: input.owner.name.to_owned(),
                pool,
                datastore,
                host,
                linked_snapshot,
                config: ConfigSpec {
                    extra_config: guestinfo(input, user_data)
                        .map_err(|e| permanent(WAITING_FOR_IP_ADDRESS, e))?,
                    ..ConfigSpec::default()
                },
                power_on: false,
            };
            let task = c.clone_vm(&template, &spec).await.or_fail("CloningFailed")?;
            let mut step = Step::wait(
                Phase::WaitClone(task.clone()),
                TASK_POLL,
                format!("clone task {} running", task.value),
            )
            .event(
                "CloneStarted",
                format!("cloning {} into {}", p.template, p.folder),
            );
            step.found.failure_domain = p.failure_domain;
            Ok(step)
        }
        Phase::WaitClone(task) => match c.task_info(&task).await {
            Err(e) => Err(client_error("CloningFailed", e)),
            Ok(None) => Ok(Step::to(Phase::Clone)),
            Ok(Some(info)) => match info.outcome() {
                Ok(None) => Ok(Step::wait(
                    Phase::WaitClone(task.clone()),
                    TASK_POLL,
                    format!("clone task {} {:?}", task.value, info.state),
                )),
                Ok(Some(Some(vm))) => Ok(Step::to(Phase::Configure(vm.clone(), None))
                    .event("Cloned", format!("cloned VM {}", vm.value))),
                Ok(Some(None)) => Ok(Step::to(Phase::Clone)),
                Err(e) if e.fault() == Some("DuplicateName") => match adoptable(c, input.owner.uid).await? {
                    Some(vm) => Ok(Step::to(Phase::Configure(vm, None))),
                    None => Err(permanent(
                        "CloningFailed",
                        format!(
                            "a VM named {:?} that is not this machine's already exists in the folder",
                            input.owner.name
                        ),
                    )),
                },
                Err(e) => Err(permanent("CloningFailed", e.to_string())),
            },
        },
        Phase::Configure(vm, task) => {
            if let Some(step) =
                poll(c, task, "ConfiguringFailed", |t| Phase::Configure(vm.clone(), t)).await?
            {
                return Ok(step);
            }
            let info = vm_info(c, &vm, "ConfiguringFailed").await?;
            let Some(info) = info else {
                return Ok(Step::to(Phase::Clone).event(
                    "VMVanished",
                    format!("VM {} disappeared; cloning again", vm.value),
                ));
            };
            if let Some(why) = update::disk_storage_refusal(input.spec, &info.hardware) {
                return Err(permanent(support::UNSUPPORTED_FIELD, why));
            }
            // Firmware, Secure Boot, a TPM and PCI devices: while the new VM is off, before
            // anything else.
            let firmware = update::firmware_changes(input.spec, &info)
                .map_err(|why| permanent("ConfiguringFailed", why))?;
            let (task, why) = if firmware.is_empty() {
                let nics = desired_nics(c, input).await?;
                match update::next_action(input.spec, &info, &nics, None) {
                    // (`RestartRequired` needs a provisioned VM the user wants on: not while
                    // configuring.)
                    UpdateAction::InSync | UpdateAction::PowerOn | UpdateAction::RestartRequired { .. } => {
                        let rewrite = metadata_rewrite(c, input, &vm, &info, &nics).await?;
                        return Ok(rewrite.unwrap_or_else(|| Step::to(Phase::PowerOn(vm, None))));
                    }
                    UpdateAction::Reconfigure { spec, what } => {
                        (c.reconfigure(&vm, &spec).await, format!("reconfiguring: {what}"))
                    }
                    UpdateAction::PowerOff { why } => (c.power_off(&vm).await, format!("powering off {why}")),
                }
            } else {
                let why = "setting the firmware (Secure Boot, TPM, PCI devices)".to_owned();
                (c.reconfigure(&vm, &firmware).await, why)
            };
            let task = task.or_fail("ConfiguringFailed")?;
            Ok(Step::wait(Phase::Configure(vm, Some(task)), TASK_POLL, why))
        }
        Phase::PowerOn(vm, task) => {
            if let Some(step) = poll(c, task, "PowerOnFailed", |t| Phase::PowerOn(vm.clone(), t)).await? {
                return Ok(step);
            }
            let info = vm_info(c, &vm, "PowerOnFailed")
                .await?
                .ok_or_else(|| permanent("VMVanished", "the VM disappeared"))?;
            if desired_power == PowerState::Off || info.power_state == Some(VmPowerState::PoweredOn) {
                return Ok(Step::to(Phase::WaitGuest(vm)));
            }
            let task = c.power_on(&vm).await.or_fail("PowerOnFailed")?;
            Ok(
                Step::wait(Phase::PowerOn(vm, Some(task)), TASK_POLL, "powering on")
                    .event("PoweringOn", "powering the VM on"),
            )
        }
        Phase::WaitGuest(vm) => {
            let info = vm_info(c, &vm, "WaitingForGuest")
                .await?
                .ok_or_else(|| permanent("VMVanished", "the VM disappeared"))?;
            let skip = ReadinessChecks::skip_guest_agent(input.spec.readiness_checks.as_ref());
            let has_ip = info.ip_address.is_some() || !info.guest_ips.is_empty();
            if has_ip || skip || desired_power == PowerState::Off {
                return Ok(settled(vm, info).event("Provisioned", "VM is running"));
            }
            Ok(Step::wait(
                Phase::WaitGuest(vm),
                GUEST_POLL,
                "VMware Tools has reported no IP address yet",
            ))
        }
        Phase::ShuttingDown(vm, since) => {
            let info = existing_vm(c, &vm).await?;
            if info.power_state != Some(VmPowerState::PoweredOn) {
                // Off: the change that needed it proceeds from the provisioned phase.
                return Ok(seeing(Step::to(Phase::Provisioned(vm, None)), info));
            }
            if power::shutdown_overdue(Some(since), Timestamp::now()) {
                let task = c.power_off(&vm).await.or_fail("PowerOffFailed")?;
                let why = format!(
                    "the guest ignored the shutdown request for {}s: VM {} powered off",
                    power::SHUTDOWN_TIMEOUT.as_secs(),
                    vm.value
                );
                let step = Step::wait(Phase::Provisioned(vm, Some(task)), TASK_POLL, why.clone());
                return Ok(seeing(step.event(power::POWERED_OFF_FORCIBLY, why), info));
            }
            let why = if desired_power == PowerState::Off {
                "spec.powerState is Off"
            } else {
                "to apply a change that needs the VM off"
            };
            let asked = Timestamp::now().duration_since(since).as_secs().max(0);
            let message = format!(
                "waiting for the guest to shut down ({why}): asked {asked}s ago, powered off hard after {}s",
                power::SHUTDOWN_TIMEOUT.as_secs()
            );
            let step = Step::wait(Phase::ShuttingDown(vm, since), GUEST_POLL, message);
            Ok(seeing(step, info))
        }
        Phase::Provisioned(vm, task) => {
            if let Some(step) = poll(c, task, "UpdateFailed", |t| Phase::Provisioned(vm.clone(), t)).await? {
                return Ok(seeing(step, existing_vm(c, &vm).await?));
            }
            let info = existing_vm(c, &vm).await?;
            let owner = input.owner;
            if readopt::remark_provisioned(&info, owner, input.spec.provider_id.as_deref())
                || readopt::missing_name_marker(&info, owner)
            {
                // Created anew with its status (e.g. restored), or cloned before the marker
                // carried namespace/name: (re-)mark the VM, nothing else.
                // Refused, without writing, if a copy of this object took the VM over.
                let task = readopt::remark(c, &info, owner).await?;
                let why = format!(
                    "marking VM {} as this machine's ({})",
                    vm.value,
                    owner.name_marker()
                );
                let step = Step::wait(Phase::Provisioned(vm, Some(task)), TASK_POLL, why.clone());
                return Ok(seeing(step.event("Adopting", why), info));
            }
            let nics = desired_nics(c, input).await?;
            let (task, waiting, event) =
                match update::next_action(input.spec, &info, &nics, Some(desired_power)) {
                    UpdateAction::InSync => return Ok(settled(vm, info)),
                    UpdateAction::RestartRequired { why } => {
                        let mut step = settled(vm, info);
                        step.up_to_date = Some(Report::restart_required(why));
                        return Ok(step);
                    }
                    UpdateAction::Reconfigure { spec, what } => (
                        c.reconfigure(&vm, &spec).await.or_fail("UpdateFailed")?,
                        format!("applying {what}"),
                        ("Reconfiguring", what),
                    ),
                    UpdateAction::PowerOff { why } => match c.shutdown_guest(&vm).await {
                        // The guest is asked first; powered off hard once it ignored that too long.
                        Ok(()) => {
                            let step = Step::wait(
                                Phase::ShuttingDown(vm, Timestamp::now()),
                                GUEST_POLL,
                                format!("waiting for the guest to shut down ({why})"),
                            );
                            let asked = step.event("PoweringOff", format!("guest shutdown requested {why}"));
                            return Ok(seeing(asked, info));
                        }
                        // Without VMware Tools (or in a state the guest cannot be asked in) the
                        // guest cannot be asked: power it off.
                        Err(e) if matches!(e.fault(), Some("ToolsUnavailable" | "InvalidState")) => (
                            c.power_off(&vm).await.or_fail("PowerOffFailed")?,
                            format!("powering off {why}"),
                            (
                                "PoweringOff",
                                format!(
                                    "powering the VM off {why} (VMware Tools not running: no guest shutdown)"
                                ),
                            ),
                        ),
                        Err(e) => return Err(client_error("PowerOffFailed", e)),
                    },
                    UpdateAction::PowerOn => (
                        c.power_on(&vm).await.or_fail("PowerOnFailed")?,
                        "powering on (spec.powerState On)".to_owned(),
                        ("PoweringOn", "powering the VM on".to_owned()),
                    ),
                };
            let step = Step::wait(Phase::Provisioned(vm, Some(task)), TASK_POLL, waiting);
            Ok(seeing(step.event(event.0, event.1), info))
        }
    }
}

/// A machine with a providerID but no VM in its status was created anew (`clusterctl move`, a
/// restore; see [`readopt`]): its VM is found by the providerID, re-marked for this object and
/// adopted like a VM found after a crash (never cloned again, no new bootstrap data).
async fn readopt_step(c: &Client, input: &MachineInput<'_>, provider_id: &str) -> Result<Step, StepError> {
    let owner = input.owner;
    match readopt::find(c, owner, provider_id).await? {
        Found::Missing => Err(permanent(
            readopt::VM_NOT_FOUND,
            format!(
                "spec.providerID is {provider_id} but no VM in vCenter has that BIOS uuid (deleted outside banlieue?): delete this machine to replace it"
            ),
        )),
        Found::Foreign(_, why) | Found::TakenOver(_, why) => Err(permanent(readopt::ADOPTION_FAILED, why)),
        Found::Remark(readopt::Candidate { vm: info, .. }) => {
            let task = readopt::remark(c, &info, owner).await?;
            let why = format!(
                "marking VM {} as this machine's: the object was created anew (clusterctl move or a restore)",
                info.vm.value
            );
            // The adoption goes on once the task is done (the next look finds the VM ours).
            Ok(
                Step::wait(Phase::Configure(info.vm, Some(task)), TASK_POLL, why.clone())
                    .event("Adopting", why),
            )
        }
        Found::Owned(readopt::Candidate { vm: info, .. }) => {
            Ok(Step::to(Phase::Configure(info.vm.clone(), None)).event(
                "Adopted",
                format!("adopted VM {} by its providerID {provider_id}", info.vm.value),
            ))
        }
    }
}

/// The NICs `spec.networks` asks for, each port group resolved in vCenter (empty without
/// `spec.networks`).
async fn desired_nics(c: &Client, input: &MachineInput<'_>) -> Result<Vec<DesiredNic>, StepError> {
    if input.spec.networks.is_empty() {
        return Ok(Vec::new());
    }
    // Under the datacenter the VM is placed in (its failure domain's, when that names one).
    let dc = datacenter(input, failure_domain(input)?)?;
    let mut out = Vec::with_capacity(input.spec.networks.len());
    for n in &input.spec.networks {
        let path = under(&dc, "network", &n.network);
        let net = find(c, &path, "NetworkNotFound", "network").await?;
        let backing = c.network_backing(&net).await.or_fail("NetworkNotFound")?;
        let backing = found(backing, "NetworkNotFound", "network", &path)?;
        let kind = match n.model.as_deref() {
            None => "VirtualVmxnet3",
            Some(m) => nic_type_for_model(m).ok_or_else(|| {
                permanent(
                    "NetworkModelNotSupported",
                    format!(
                        "interface {:?}: model {m:?} is not a vSphere adapter (use vmxnet3, e1000 or e1000e)",
                        n.name
                    ),
                )
            })?,
        };
        out.push(DesiredNic {
            backing,
            mac: n.mac_address.clone(),
            kind,
        });
    }
    Ok(out)
}

/// The VM's facts; its absence is `VMNotFound` (a provisioned machine never clones again; `Ready`
/// turns False, as on every provider).
async fn existing_vm(c: &Client, vm: &MoRef) -> Result<VmInfo, StepError> {
    vm_info(c, vm, "VMUnreachable").await?.ok_or_else(|| {
        permanent(
            readopt::VM_NOT_FOUND,
            format!(
                "VM {} no longer exists in vCenter (deleted outside banlieue?): delete this machine to replace it",
                vm.value
            ),
        )
    })
}

/// `step`, having seen the VM `info` (for the status).
fn seeing(mut step: Step, info: VmInfo) -> Step {
    step.found.vm = Some(info);
    step
}

/// Provisioned, no task running: looked at again after [`RESYNC`].
fn settled(vm: MoRef, info: VmInfo) -> Step {
    Step {
        requeue: RESYNC,
        ..seeing(Step::to(Phase::Provisioned(vm, None)), info)
    }
}

async fn vm_info(c: &Client, vm: &MoRef, reason: &'static str) -> Result<Option<VmInfo>, StepError> {
    c.vm_info(vm).await.or_fail(reason)
}

/// The task a phase recorded, looked at: `None` once there is none, it succeeded or vCenter
/// forgot it (the phase goes on); else the step that waits on it (`at(Some(task))`) or, after its
/// failure, the one that tries again later without it (`at(None)`, the failure said with `reason`).
async fn poll(
    c: &Client,
    task: Option<MoRef>,
    reason: &'static str,
    at: impl Fn(Option<MoRef>) -> Phase,
) -> Result<Option<Step>, StepError> {
    let Some(task) = task else {
        return Ok(None);
    };
    let Some(info) = c.task_info(&task).await.or_fail(reason)? else {
        return Ok(None);
    };
    Ok(match info.outcome() {
        Ok(None) => {
            let why = format!("task {} running", task.value);
            Some(Step::wait(at(Some(task)), TASK_POLL, why))
        }
        Ok(Some(_)) => None,
        Err(e) => {
            let message = e.to_string();
            let mut step = Step::wait(at(None), PERMANENT_RETRY, message.clone());
            step.failed = Some(FailedTask {
                reason,
                message,
                busy: false,
            });
            Some(step)
        }
    })
}

/// What deletion did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteStep {
    /// A task runs (power off or destroy); persist it and look again.
    Wait(MoRef, &'static str),
    /// The VM is gone: remove the finalizer.
    Gone,
}

/// One deletion step: wait for a recorded task, then power off, then destroy.
pub async fn delete_step(
    c: &Client,
    uid: &str,
    vm: Option<MoRef>,
    task: Option<MoRef>,
) -> Result<DeleteStep, StepError> {
    if let Some(task) = &task
        && let Some(info) = c.task_info(task).await.or_fail("DeletionFailed")?
        && !info.done()
    {
        return Ok(DeleteStep::Wait(task.clone(), "waiting for the running task"));
    }
    let vm = match vm {
        Some(vm) => Some(vm),
        None => adoptable(c, uid).await?,
    };
    let Some(vm) = vm else {
        return Ok(DeleteStep::Gone);
    };
    let Some(info) = c.vm_info(&vm).await.or_fail("DeletionFailed")? else {
        // status.vmRef is gone; a VM carrying our UID may still exist (e.g. a lost clone).
        return match adoptable(c, uid).await? {
            Some(other) if other != vm => Box::pin(delete_step(c, uid, Some(other), None)).await,
            _ => Ok(DeleteStep::Gone),
        };
    };
    if info.extra_config.get(OWNER_KEY).map(String::as_str) != Some(uid) {
        // Not ours (vmRef reused or edited): never delete someone else's VM.
        return Ok(DeleteStep::Gone);
    }
    if info.power_state == Some(VmPowerState::PoweredOn) {
        let t = c.power_off(&vm).await.or_fail("DeletionFailed")?;
        return Ok(DeleteStep::Wait(t, "powering off"));
    }
    let t = c.destroy(&vm).await.or_fail("DeletionFailed")?;
    Ok(DeleteStep::Wait(t, "destroying"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::Cpu;

    static NO_POOL: PoolAddresses = PoolAddresses::new();
    use banlieue_api::infrastructure::{VSphereClusterSpec, VSphereFailureDomain, VSphereTemplateSource};

    fn spec() -> VSphereMachineSpec {
        VSphereMachineSpec {
            provider_id: None,
            provider_ref: None,
            power_state: None,
            source: VSphereTemplateSource {
                template: "ubuntu".into(),
                image: None,
            },
            tags_from_labels: Vec::new(),
            datacenter: None,
            datastore: Some("ds1".into()),
            folder: Some("k8s".into()),
            resource_pool: Some("c1/Resources".into()),
            clone_mode: None,
            cpu: Cpu {
                cores: 2,
                sockets: Some(2),
            },
            memory_mib: 4096,
            disks: vec![],
            networks: vec![],
            readiness_checks: None,
            restart_policy: None,
            firmware: None,
            secure_boot: None,
            tpm: None,
            pci_devices: vec![],
        }
    }

    fn cluster() -> VSphereCluster {
        VSphereCluster::new(
            "c",
            VSphereClusterSpec {
                datacenter: Some("dc1".into()),
                failure_domains: vec![VSphereFailureDomain {
                    name: "az1".into(),
                    compute_cluster: "c2".into(),
                    datastore: Some("fast".into()),
                    ..VSphereFailureDomain::default()
                }],
                ..VSphereClusterSpec::default()
            },
        )
    }

    #[test]
    fn paths_are_found_under_the_datacenter_unless_absolute() {
        assert_eq!(under("DC0", "host", "C0"), "/DC0/host/C0");
        assert_eq!(under("DC0", "host", "/DC1/host/C1"), "/DC1/host/C1");
    }

    #[test]
    fn placement_resolves_relative_paths_and_failure_domains() {
        let (s, c) = (spec(), cluster());
        let input = MachineInput {
            owner: readopt::Owner {
                uid: "u",
                namespace: "ns",
                name: "m",
            },
            spec: &s,
            cluster: &c,
            failure_domain: None,
            pool_addresses: &NO_POOL,
        };
        let p = placement(&input).unwrap();
        assert_eq!(p.template, "/dc1/vm/ubuntu");
        assert_eq!(p.folder, "/dc1/vm/k8s");
        assert_eq!(p.pool, "/dc1/host/c1/Resources");
        assert_eq!(p.datastore.as_deref(), Some("/dc1/datastore/ds1"));
        let input = MachineInput {
            failure_domain: Some("az1"),
            ..input
        };
        let p = placement(&input).unwrap();
        assert_eq!(p.pool, "/dc1/host/c2/Resources");
        assert_eq!(p.datastore.as_deref(), Some("/dc1/datastore/fast"));
        assert_eq!(p.failure_domain.as_deref(), Some("az1"));
        let input = MachineInput {
            failure_domain: Some("nope"),
            ..input
        };
        assert_eq!(placement(&input).unwrap_err().reason(), "FailureDomainNotFound");
        let nowhere = VSphereCluster::new("c", VSphereClusterSpec::default());
        let input = MachineInput {
            cluster: &nowhere,
            failure_domain: None,
            ..input
        };
        let err = placement(&input).unwrap_err();
        assert_eq!(err.reason(), "DatacenterNotSet");
        assert!(err.to_string().contains("set spec.datacenter"), "{err}");
    }

    #[test]
    fn config_changes_only_what_differs() {
        let s = spec();
        let mut info = VmInfo {
            vm: MoRef::new("VirtualMachine", "vm-1"),
            name: "m".into(),
            bios_uuid: None,
            instance_uuid: None,
            template: false,
            power_state: None,
            num_cpu: Some(4),
            cores_per_socket: Some(2),
            memory_mb: Some(4096),
            extra_config: Default::default(),
            ip_address: Some("10.0.0.1".into()),
            guest_ips: vec!["10.0.0.1".into(), "10.0.0.2".into()],
            host: None,
            hardware: Default::default(),
            firmware: None,
            secure_boot: false,
        };
        assert!(update::cold_changes(&s, &info).is_empty());
        info.memory_mb = Some(1024);
        let c = update::cold_changes(&s, &info);
        assert_eq!((c.num_cpus, c.memory_mb), (None, Some(4096)));
        let addrs = addresses("m", &info);
        assert_eq!(addrs.len(), 3, "{addrs:?}");
    }

    #[test]
    fn guestinfo_carries_base64_data_and_the_owner() {
        let (s, c) = (spec(), cluster());
        let input = MachineInput {
            owner: readopt::Owner {
                uid: "u-1",
                namespace: "ns",
                name: "m",
            },
            spec: &s,
            cluster: &c,
            failure_domain: None,
            pool_addresses: &NO_POOL,
        };
        let gi = guestinfo(&input, Some(b"#cloud-config\n")).unwrap();
        let get = |k: &str| gi.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("guestinfo.userdata"), Some("I2Nsb3VkLWNvbmZpZwo="));
        assert_eq!(get(OWNER_KEY), Some("u-1"));
        assert_eq!(get(OWNER_NAME_KEY), Some("ns/m"));
        assert!(
            guestinfo(&input, None)
                .unwrap()
                .iter()
                .all(|(k, _)| k != "guestinfo.userdata")
        );
    }
}
