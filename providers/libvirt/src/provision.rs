//! Provisioning and deletion against [`Hypervisor`]s.
//!
//! libvirt calls return when the work is done (no long-running tasks), so one reconcile runs
//! consecutive phases until one has to wait (for a DHCP lease) or fails; each phase is
//! idempotent and looks before it creates. The caller persists the returned phase.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::common::{PowerState, ReadinessChecks};
use banlieue_api::infrastructure::LibvirtMachineSpec;
use banlieue_provider_kit::cloud_init::{self, CloudInit};
use banlieue_provider_kit::image::Imports;
use banlieue_provider_kit::machine::{Provisioned, Report};
use banlieue_provider_kit::network::{PoolAddresses, WAITING_FOR_IP_ADDRESS};
use banlieue_provider_kit::power;
use banlieue_provider_kit::progress::Progress;
use k8s_openapi::jiff::Timestamp;

use crate::desired::{self, GIB, Settings};
use crate::hypervisor::{HvError, Hypervisor, RunState};
use crate::image_import::{self, Base};
use crate::phase::Phase;
use crate::readopt::{self, Found};
use crate::update::{self, UpdateAction};
use crate::xml::{self, Owner};

/// Requeue while waiting for the guest's lease.
pub const GUEST_POLL: Duration = Duration::from_secs(5);
/// Resync of a provisioned machine (detects a vanished domain).
pub const RESYNC: Duration = Duration::from_secs(300);
pub use banlieue_provider_kit::machine::PERMANENT_RETRY;

pub use crate::error::StepError;
use crate::error::step_error;

/// The hosts' names, for a message.
fn known<H>(hosts: &[Host<H>]) -> String {
    banlieue_provider_kit::join(hosts.iter().map(|h| &h.name), ", ")
}

/// A hypervisor error of `phase` as its step's error (the phase's failure reason).
fn failing(phase: &Phase) -> impl Fn(HvError) -> StepError + Copy {
    let reason = phase.failure_reason();
    move |e| step_error(reason, e)
}

/// A host a machine may be placed on: its failure-domain name and a handle.
pub struct Host<H> {
    /// Failure domain name.
    pub name: String,
    /// The libvirt URI it is reached at: which host it is (two clusters may name theirs alike).
    pub uri: String,
    /// The libvirt connection.
    pub hv: Arc<H>,
}

/// What a provisioning step needs to know about the machine.
pub struct MachineInput<'a> {
    /// The LibvirtMachine (uid, namespace, name).
    pub owner: &'a Owner,
    /// Its spec.
    pub spec: &'a LibvirtMachineSpec,
    /// Domain uuid to define (`status.domainUUID`, else the machine's UID).
    pub uuid: &'a str,
    /// Failure domain asked for by the owner (Machine or VirtualMachine).
    pub failure_domain: Option<&'a str>,
    /// Provider-wide settings.
    pub settings: &'a Settings,
    /// Desired power state once provisioned (`spec.powerState`, `On` when unset).
    pub power: PowerState,
    /// When the pending ACPI shutdown was first requested (from `status.provisioning`), if any.
    pub shutdown_requested_at: Option<Timestamp>,
    /// Addresses allocated from IPAM pools for `mode: Pool` interfaces (the kit's).
    pub pool_addresses: &'a PoolAddresses,
    /// Whether the guest's cloud-init is asked how it went: while the machine is being
    /// provisioned, and while its `Ready` waits on it ([`cloud_init::pending`]).
    pub ask_cloud_init: bool,
    /// The image imports of this provider process (`spec.source.image`).
    pub imports: &'a Imports,
}

/// Result of provisioning (the kit's [`Progress`] over the phase reached, if any, with the time
/// a pending ACPI shutdown was first requested, to persist).
pub type Step = Progress<Option<Phase>, Option<Timestamp>>;

/// Where a machine without a failure domain goes: spread over the hosts by free memory
/// ([`banlieue_provider_kit::placement::roomiest`]) instead of filling the first one.
async fn roomiest_host<H: Hypervisor>(hosts: &[Host<H>]) -> Result<String, StepError> {
    let mut free = Vec::with_capacity(hosts.len());
    for h in hosts {
        free.push((h.name.clone(), h.hv.host_info().await.ok().map(|i| i.free_memory)));
    }
    banlieue_provider_kit::placement::roomiest(free.iter().map(|(name, free)| (name.as_str(), *free)))
        .map(str::to_owned)
        .ok_or_else(|| StepError::permanent("NoHost", "the LibvirtCluster has no host"))
}

fn host<'h, H>(hosts: &'h [Host<H>], name: &str) -> Result<&'h Host<H>, StepError> {
    hosts.iter().find(|h| h.name == name).ok_or_else(|| {
        StepError::permanent(
            "HostNotFound",
            format!(
                "host {name:?} is not a failure domain of the LibvirtCluster (known: {})",
                known(hosts)
            ),
        )
    })
}

/// Runs provisioning phases from `phase` until one waits or fails. `user_data` must be given
/// when `phase.needs_bootstrap_data()`.
pub async fn provision<H: Hypervisor>(
    hosts: &[Host<H>],
    input: &MachineInput<'_>,
    mut phase: Phase,
    user_data: Option<&[u8]>,
) -> Result<Step, StepError> {
    let mut step = Step::to(None);
    let domain = desired::domain_name(&input.owner.namespace, &input.owner.name);
    loop {
        let next = match &phase {
            Phase::SelectHost if let Some(provider_id) = input.spec.provider_id.as_deref() => {
                readopt_step(hosts, input, provider_id, &mut step).await?
            }
            Phase::SelectHost => {
                let chosen = match input.failure_domain {
                    Some(fd) => host(hosts, fd)?.name.clone(),
                    None => roomiest_host(hosts).await?,
                };
                Phase::Volumes { host: chosen }
            }
            Phase::Volumes { host: name } => {
                let Host { hv, uri, .. } = host(hosts, name)?;
                let base = match image_import::base_volume(
                    hv,
                    (name, uri),
                    &input.spec.source,
                    input.imports,
                    failing(&phase),
                )
                .await?
                {
                    Base::Ready(base) => base,
                    Base::Importing(how_far) => {
                        step.phase = Some(phase);
                        return Ok(step.importing(how_far));
                    }
                };
                create_volumes(&**hv, input, &base, &domain, &phase, user_data).await?;
                step.events.push((
                    "VolumesCreated",
                    format!("disk and seed volumes of {domain} on {name}"),
                ));
                Phase::Define { host: name.clone() }
            }
            Phase::Define { host: name } => {
                let hv = &host(hosts, name)?.hv;
                let uuid = define(&**hv, input, &domain, &phase).await?;
                step.events
                    .push(("DomainDefined", format!("domain {domain} ({uuid}) on {name}")));
                Phase::PowerOn {
                    host: name.clone(),
                    uuid,
                }
            }
            Phase::PowerOn { host: name, uuid } => {
                let hv = &host(hosts, name)?.hv;
                hv.start_domain(uuid).await.map_err(failing(&phase))?;
                step.events
                    .push(("PoweredOn", format!("domain {domain} started")));
                Phase::WaitGuest {
                    host: name.clone(),
                    uuid: uuid.clone(),
                }
            }
            Phase::WaitGuest { host: name, uuid } | Phase::Provisioned { host: name, uuid } => {
                let hv = &host(hosts, name)?.hv;
                let Some(d) = hv.domain_by_uuid(uuid).await.map_err(failing(&phase))? else {
                    return Err(StepError::permanent(
                        readopt::VM_NOT_FOUND,
                        format!("domain {uuid} vanished from host {name}; delete the machine to replace it"),
                    ));
                };
                let skip_address = ReadinessChecks::skip_guest_agent(input.spec.readiness_checks.as_ref());
                let leases = if d.state == RunState::Running && !skip_address {
                    hv.domain_addresses(uuid).await.map_err(failing(&phase))?
                } else {
                    Vec::new()
                };
                let addresses = desired::addresses(&leases, &d.macs, &input.owner.name);
                let was_provisioned = matches!(phase, Phase::Provisioned { .. });
                if addresses.is_empty() && !skip_address && !was_provisioned {
                    step.waiting = Some(if d.state == RunState::Running {
                        "waiting for the guest's DHCP lease".into()
                    } else {
                        format!("domain is {:?}", d.state)
                    });
                    step.requeue = GUEST_POLL;
                    step.phase = Some(phase);
                    return Ok(step);
                }
                if !was_provisioned {
                    step.events
                        .push(("Provisioned", format!("domain {domain} is up")));
                }
                step.requeue = RESYNC;
                let mut power_state = match d.state {
                    RunState::ShutOff | RunState::Crashed => PowerState::Off,
                    RunState::Running | RunState::ShuttingDown => PowerState::On,
                };
                let mut d = d;
                if d.owner.as_ref().is_none_or(|o| o.uid != input.owner.uid)
                    && readopt::remark_provisioned(&d, input.owner, input.spec.provider_id.as_deref(), name)
                {
                    // The object was created anew with its status (e.g. restored): re-mark it
                    // (refused, without writing, if a copy of this object took it over).
                    d = readopt::remark(&**hv, d, input.owner).await?;
                    step.events.push((
                        "Adopting",
                        format!(
                            "domain {domain} ({uuid}) on {name} marked as this machine's: the object was created anew"
                        ),
                    ));
                }
                if d.owner.as_ref().is_none_or(|o| o.uid != input.owner.uid) {
                    return Err(StepError::permanent(
                        "DomainConflict",
                        format!(
                            "domain {} with uuid {uuid} on host {name} does not belong to this machine; it is left alone",
                            d.name
                        ),
                    ));
                }
                let want = update::desired_sizing(input.spec);
                let now = Timestamp::now();
                match update::next_action(
                    &want,
                    d.sizing.as_ref(),
                    d.state,
                    input.power,
                    input.spec.restart_policy.unwrap_or_default(),
                    power::shutdown_overdue(input.shutdown_requested_at, now),
                ) {
                    UpdateAction::PowerCut { why } => {
                        hv.destroy_domain(uuid).await.map_err(failing(&phase))?;
                        step.events.push((
                            power::POWERED_OFF_FORCIBLY,
                            format!("domain {domain} powered off: {why}"),
                        ));
                        // Next poll: the domain is off, the change proceeds.
                        step.waiting = Some(format!("powered off: {why}"));
                        step.requeue = Duration::from_millis(50);
                        power_state = PowerState::Off;
                    }
                    UpdateAction::Shutdown { why } => {
                        step.found = Some(input.shutdown_requested_at.unwrap_or(now));
                        hv.shutdown_domain(uuid).await.map_err(failing(&phase))?;
                        if input.shutdown_requested_at.is_none() {
                            step.events.push((
                                "PoweringOff",
                                format!("ACPI shutdown of {domain} requested: {why}"),
                            ));
                        }
                        step.waiting = Some(format!("waiting for the guest to power off: {why}"));
                        step.requeue = GUEST_POLL;
                    }
                    UpdateAction::WaitShutdown { why } => {
                        step.found = Some(input.shutdown_requested_at.unwrap_or(now));
                        step.waiting = Some(format!("waiting for the guest to power off: {why}"));
                        step.requeue = GUEST_POLL;
                    }
                    UpdateAction::Redefine { why, start } => {
                        let mut config =
                            desired::domain_config(input.spec, input.owner, uuid, input.settings);
                        // Generated MACs derive from the owner's UID, which changes when the
                        // object is created anew: the domain keeps the ones it has.
                        desired::keep_macs(&mut config, input.spec, &d.macs);
                        // And the record of the object it was taken over from.
                        config.adopted_from = d.adopted_from.clone();
                        hv.define_domain(&xml::domain_xml(&config))
                            .await
                            .map_err(failing(&phase))?;
                        step.events
                            .push(("Reconfigured", format!("domain {domain} redefined: {why}")));
                        if start {
                            hv.start_domain(uuid).await.map_err(failing(&phase))?;
                            step.events
                                .push(("PoweredOn", format!("domain {domain} started")));
                            power_state = PowerState::On;
                        }
                    }
                    UpdateAction::Start => {
                        hv.start_domain(uuid).await.map_err(failing(&phase))?;
                        step.events
                            .push(("PoweredOn", format!("domain {domain} started")));
                        power_state = PowerState::On;
                    }
                    UpdateAction::RestartRequired { why } => {
                        step.up_to_date = Some(Report::restart_required(why));
                    }
                    UpdateAction::InSync => {}
                }
                // `Ready` waits for cloud-init in a guest left running as it was.
                if input.ask_cloud_init
                    && d.state == RunState::Running
                    && power_state == PowerState::On
                    && step.waiting.is_none()
                    && !cloud_init::skipped(input.spec.readiness_checks.as_ref())
                {
                    let report = hv.cloud_init_result(uuid).await.map_err(failing(&phase))?;
                    step.cloud_init = Some(CloudInit::from_result(report.as_deref()));
                }
                step.provisioned = Some(Provisioned {
                    provider_id: desired::provider_id(name, uuid),
                    addresses: (!addresses.is_empty()).then_some(addresses),
                });
                step.power = Some(power_state);
                step.phase = Some(Phase::Provisioned {
                    host: name.clone(),
                    uuid: uuid.clone(),
                });
                return Ok(step);
            }
        };
        phase = next;
    }
}

/// Whether provisioning from `phase` re-adopts the domain named by `spec.providerID` (the object
/// was created anew: `clusterctl move`, a restore) instead of creating one.
pub fn readopts(phase: &Phase, spec: &LibvirtMachineSpec) -> bool {
    matches!(phase, Phase::SelectHost) && spec.provider_id.is_some()
}

/// A machine with a providerID but no domain in its status was created anew (see [`readopt`]):
/// its domain is found by the providerID, re-marked for this object and adopted; nothing is
/// created, no bootstrap data is written, the domain is not restarted. Returns the next phase.
async fn readopt_step<H: Hypervisor>(
    hosts: &[Host<H>],
    input: &MachineInput<'_>,
    provider_id: &str,
    step: &mut Step,
) -> Result<Phase, StepError> {
    let id = readopt::parse(provider_id)?;
    let Some(h) = hosts.iter().find(|h| h.name == id.host) else {
        return Err(StepError::permanent(
            readopt::ADOPTION_FAILED,
            format!(
                "spec.providerID {provider_id} names host {:?}, which is not a failure domain of the LibvirtCluster (known: {})",
                id.host,
                known(hosts)
            ),
        ));
    };
    let d = match readopt::find(&*h.hv, input.owner, &id.uuid).await? {
        Found::Missing => {
            return Err(StepError::permanent(
                readopt::VM_NOT_FOUND,
                format!(
                    "spec.providerID is {provider_id} but host {} has no domain with uuid {} (deleted outside banlieue?): delete this machine to replace it",
                    id.host, id.uuid
                ),
            ));
        }
        Found::Foreign(_, why) | Found::TakenOver(_, why) => {
            return Err(StepError::permanent(readopt::ADOPTION_FAILED, why));
        }
        Found::Owned(d) => d.vm,
        Found::Remark(d) => {
            let d = readopt::remark(&*h.hv, d.vm, input.owner).await?;
            step.events.push((
                "Adopting",
                format!(
                    "domain {} ({}) on {} marked as this machine's: the object was created anew (clusterctl move or a restore)",
                    d.name, d.uuid, id.host
                ),
            ));
            d
        }
    };
    step.events.push((
        "Adopted",
        format!(
            "adopted domain {} ({}) on {} by its providerID",
            d.name, d.uuid, id.host
        ),
    ));
    // A running domain waits for its lease like a new one; any other goes straight to the
    // provisioned checks, which bring it to spec.powerState.
    Ok(if d.state == RunState::Running {
        Phase::WaitGuest {
            host: id.host,
            uuid: d.uuid,
        }
    } else {
        Phase::Provisioned {
            host: id.host,
            uuid: d.uuid,
        }
    })
}

async fn create_volumes<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    base: &crate::hypervisor::VolumeInfo,
    domain: &str,
    phase: &Phase,
    user_data: Option<&[u8]>,
) -> Result<(), StepError> {
    for v in desired::disk_volumes(input.spec, domain) {
        if hv
            .volume(&v.pool, &v.name)
            .await
            .map_err(failing(phase))?
            .is_some()
        {
            continue;
        }
        let xml = if v.boot {
            let wanted = v.capacity_gib.map_or(0, |g| g.saturating_mul(GIB));
            if wanted != 0 && wanted < base.capacity {
                return Err(StepError::permanent(
                    "DiskTooSmall",
                    format!(
                        "boot disk of {} GiB is smaller than the base volume ({} bytes): the disk may grow but never shrink",
                        wanted / GIB,
                        base.capacity
                    ),
                ));
            }
            xml::overlay_volume_xml(&v.name, wanted.max(base.capacity), &base.path, &base.format)
        } else {
            xml::plain_volume_xml(&v.name, v.capacity_gib.unwrap_or(1).saturating_mul(GIB), "qcow2")
        };
        hv.create_volume(&v.pool, &xml).await.map_err(failing(phase))?;
    }
    let iso = desired::seed(
        input.owner,
        input.spec,
        user_data.unwrap_or_default(),
        input.pool_addresses,
    )
    .map_err(|e| StepError::permanent(WAITING_FOR_IP_ADDRESS, e))?
    .to_iso()
    .map_err(|e| StepError::permanent("BootstrapDataInvalid", e.to_string()))?;
    let (pool, name) = desired::seed_volume(input.spec, domain);
    let size = iso.len() as u64;
    let existing = hv.volume(&pool, &name).await.map_err(failing(phase))?;
    if existing.as_ref().is_none_or(|v| v.capacity != size) {
        if existing.is_some() {
            // The bootstrap data changed size since a crash: recreate.
            hv.delete_volume(&pool, &name).await.map_err(failing(phase))?;
        }
        hv.create_volume(&pool, &xml::plain_volume_xml(&name, size, "raw"))
            .await
            .map_err(failing(phase))?;
    }
    // Always (re)write the content: a crash may have left the volume empty.
    hv.upload_volume(&pool, &name, iso).await.map_err(failing(phase))
}

/// Defines the domain or adopts ours; returns its uuid.
async fn define<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    domain: &str,
    phase: &Phase,
) -> Result<String, StepError> {
    let ours = |owner: &Option<Owner>| owner.as_ref().is_some_and(|o| o.uid == input.owner.uid);
    if let Some(d) = hv.domain_by_uuid(input.uuid).await.map_err(failing(phase))? {
        if ours(&d.owner) {
            return Ok(d.uuid);
        }
        return Err(StepError::permanent(
            "DomainConflict",
            format!(
                "domain {} with uuid {} exists and does not belong to this machine; it is left alone",
                d.name, d.uuid
            ),
        ));
    }
    if let Some(d) = hv.domain_by_name(domain).await.map_err(failing(phase))? {
        if ours(&d.owner) {
            return Ok(d.uuid);
        }
        return Err(StepError::permanent(
            "DomainNameConflict",
            format!("a domain named {domain} exists and does not belong to this machine; it is left alone"),
        ));
    }
    let config = desired::domain_config(input.spec, input.owner, input.uuid, input.settings);
    let d = hv
        .define_domain(&xml::domain_xml(&config))
        .await
        .map_err(failing(phase))?;
    Ok(d.uuid)
}

/// Deletes the machine's domain (only if it is ours) and its volumes. Returns a note for the
/// `Deleted` event. Idempotent: what is already gone is skipped.
pub async fn delete<H: Hypervisor>(
    hv: &H,
    owner: &Owner,
    spec: &LibvirtMachineSpec,
    uuid: &str,
) -> Result<String, StepError> {
    let err = |e: HvError| StepError::Transient {
        reason: "DeletionFailed",
        source: e,
    };
    let domain = desired::domain_name(&owner.namespace, &owner.name);
    let mut found = hv.domain_by_uuid(uuid).await.map_err(err)?;
    if found.is_none() {
        found = hv.domain_by_name(&domain).await.map_err(err)?;
    }
    let mut note = format!("domain {domain} was already gone");
    if let Some(d) = found {
        if d.owner.as_ref().is_some_and(|o| o.uid == owner.uid) {
            if d.state != RunState::ShutOff {
                hv.destroy_domain(&d.uuid).await.map_err(err)?;
            }
            hv.undefine_domain(&d.uuid).await.map_err(err)?;
            note = format!("domain {domain} ({}) destroyed and undefined", d.uuid);
        } else {
            note = format!("domain {} is not ours and was left alone", d.name);
        }
    }
    let mut volumes: Vec<(String, String)> = desired::disk_volumes(spec, &domain)
        .into_iter()
        .map(|v| (v.pool, v.name))
        .collect();
    volumes.push(desired::seed_volume(spec, &domain));
    for (pool, name) in &volumes {
        match hv.delete_volume(pool, name).await {
            Ok(()) => {}
            // A pool that vanished has no volumes to delete.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(format!("{note}; {} volumes deleted", volumes.len()))
}
