//! One step of the provisioning and deletion state machines against a [`Hypervisor`].
//!
//! [`provision_step`] performs at most one side effect on Proxmox VE (start a clone, apply a
//! config change, start an upload, start the VM, …) and returns the next [`Phase`] to persist
//! and when to look again. Tasks are never awaited here: their UPID goes into the phase and is
//! polled on the next reconcile.
//!
//! Crash safety: the VMID is persisted (phase [`Phase::Clone`]) *before* the clone starts, and
//! the clone carries the owner's UID in its description (tags cannot be written while PVE
//! holds the clone lock). A controller that restarts between "clone started" and "UPID
//! persisted" finds the VM at the persisted VMID, waits for the clone lock to go, sees its own
//! UID and adopts the VM instead of cloning again. A VM at that VMID without our UID belongs to
//! someone else: a new VMID is chosen and that VM is never touched, and never deleted.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use banlieue_api::common::{
    CloneMode, Initialization, MachineAddress, PowerState, ProvisioningState, ReadinessChecks,
};
use banlieue_api::infrastructure::{ProxmoxMachineSpec, ProxmoxMachineStatus, VmidRange};
use banlieue_capi::bootstrap::BootstrapData;
use banlieue_provider_kit::cloud_init::{self, CloudInit};
use banlieue_provider_kit::{join, lock};
use banlieue_pve_client::{CloneRequest, ErrorClass, PendingConfig, SizeChange, TaskOutcome, Upid};

use crate::desired::{self, ConfigureAction};
use crate::ha;
use crate::hypervisor::{Guest, Hypervisor, Inventory, RunState};
use crate::image_import;
use crate::phase::{Phase, VmLocation};
use crate::placement::{PlacementInput, choose_node, reserve_for_stopped_guests};
use crate::readopt::{self, Found};
use crate::task_failure::{self, TaskFailure};
use crate::template_facts;
use crate::update::{self, UpdateAction};
use banlieue_provider_kit::machine::{Provisioned, Report};
use banlieue_provider_kit::progress::{FailedTask, Progress};

/// How often a running task is polled at most (see [`task_poll`]).
pub const TASK_POLL: Duration = Duration::from_secs(2);
/// How often the guest agent is asked for addresses at most (see [`guest_poll`]).
pub const GUEST_POLL: Duration = Duration::from_secs(5);
/// The shortest wait between two polls of a task or of the guest agent.
pub const FIRST_POLL: Duration = Duration::from_millis(500);

/// The wait before the next poll of something pending for `waited`: a quarter of that, from
/// [`FIRST_POLL`] up to `max`, so what ends within seconds (most tasks, a booting guest's agent)
/// is seen within half a second to a second, and what takes long is not polled more often than
/// before.
pub fn poll_after(waited: Duration, max: Duration) -> Duration {
    (waited / 4).clamp(FIRST_POLL, max)
}

/// When to poll the running task `upid` again: by how long it has run, from the start time
/// PVE wrote into the UPID (whole seconds; a clock behind PVE's counts as just started).
pub fn task_poll(upid: &Upid) -> Duration {
    let started = UNIX_EPOCH + Duration::from_secs(upid.starttime);
    poll_after(
        SystemTime::now().duration_since(started).unwrap_or_default(),
        TASK_POLL,
    )
}

/// When to ask the guest agent again: by how long the machine has waited for its guest
/// ([`MachineInput::waiting_since`]), an eighth of it (a VM is Ready within about a second of
/// its agent answering while guests boot in seconds to a minute; a guest that never answers is
/// asked every [`GUEST_POLL`] after 40 s, as before).
fn guest_poll(input: &MachineInput<'_>) -> Duration {
    let waited = input
        .waiting_since
        .and_then(|since| SystemTime::now().duration_since(since).ok())
        .unwrap_or_default();
    poll_after(waited / 2, GUEST_POLL)
}
pub use banlieue_provider_kit::machine::PERMANENT_RETRY;
/// Resync of a provisioned machine (no Proxmox call is made then).
pub const RESYNC: Duration = Duration::from_secs(600);

/// Everything about the machine that provisioning reads (besides the hypervisor).
#[derive(Clone, Copy, Debug)]
pub struct MachineInput<'a> {
    /// The ProxmoxMachine the VM is marked for (its UID); its name is also the VM name and the
    /// guest hostname.
    pub owner: readopt::Owner<'a>,
    /// The ProxmoxMachine spec.
    pub spec: &'a ProxmoxMachineSpec,
    /// The Machine's `spec.failureDomain`.
    pub failure_domain: Option<&'a str>,
    /// The ProxmoxCluster's allowed nodes.
    pub cluster_allowed_nodes: &'a [String],
    /// The ProxmoxCluster's VMID range.
    pub cluster_vmid_range: Option<&'a VmidRange>,
    /// Storage (content `iso`) the seed ISO is uploaded to.
    pub seed_storage: &'a str,
    /// Addresses allocated from IPAM pools for `mode: Pool` interfaces (the kit's).
    pub pool_addresses: &'a banlieue_provider_kit::network::PoolAddresses,
    /// Since when the machine waits for its guest (`status.provisioning.taskStartedAt` while
    /// `WaitingForGuest`): how often the agent is asked.
    pub waiting_since: Option<SystemTime>,
    /// The machine is provisioned and its `Ready` still waits on the guest's cloud-init
    /// ([`cloud_init::pending`]): a provisioned step asks the guest again.
    pub cloud_init_pending: bool,
}

/// What a provisioning step decided (the kit's [`Progress`] over the Proxmox [`Phase`]).
pub type Step = Progress<Phase>;

/// Whether the step after `step` (which left `from`) may run at once, before its phase is
/// persisted ([`banlieue_provider_kit::machine::Step::next_now`]): when it neither waits nor
/// failed, or when it has just started a task (polled at once: an instant task is done; a
/// running one is polled again after [`TASK_POLL`]). Never into [`Phase::Clone`]: the VMID is
/// persisted before the clone starts (see the module docs).
pub fn next_now(step: &Step, from: &Phase) -> bool {
    !matches!(step.phase, Phase::Clone(_))
        && step.follows_at_once(from.task().is_some(), step.phase.task().is_some())
}

/// The facts CAPI needs once the VM is up: `proxmox://<smbios uuid>`, hostname and internal IPs.
fn provisioned(provider_id: String, addresses: Vec<MachineAddress>) -> Option<Provisioned> {
    Some(Provisioned {
        provider_id,
        addresses: Some(addresses),
    })
}

pub use crate::error::{StepError, pve_error};

fn permanent(reason: &'static str, message: impl Into<String>) -> StepError {
    StepError::permanent(reason, message)
}

/// The highest VMID Proxmox accepts.
const MAX_VMID: u32 = 999_999_999;

/// VMIDs probed with PVE after the one it proposed before allocation gives up (each probe that
/// fails is a VMID used by something PVE knows and this process did not reserve).
pub(crate) const VMID_PROBES: usize = 64;

/// VMIDs chosen but not yet cloned, per machine UID, so that two machines reconciled at the
/// same time in this process do not pick the same `nextid`. (Across processes PVE's
/// `VM N already exists` on clone resolves the race.)
#[derive(Debug, Default)]
pub struct VmidReservations(Mutex<HashMap<String, u32>>);

impl VmidReservations {
    /// Reserves `vmid` for `uid`; false if another machine holds it.
    pub fn reserve(&self, uid: &str, vmid: u32) -> bool {
        let mut map = lock(&self.0);
        if map.iter().any(|(u, v)| *v == vmid && u != uid) {
            return false;
        }
        map.insert(uid.to_owned(), vmid);
        true
    }

    /// Atomically moves the reservation of `uid` to the lowest VMID `>= from` that no other
    /// machine holds, and returns it. Choosing and reserving under one lock is what keeps
    /// hundreds of machines allocating at once from racing each other up the VMID space.
    /// VMIDs in `used` (what a listing showed) are skipped too.
    pub fn reserve_next(&self, uid: &str, from: u32, used: &HashSet<u32>) -> Option<u32> {
        let mut map = lock(&self.0);
        map.remove(uid);
        let held: HashSet<u32> = map.values().copied().collect();
        let vmid = (from..=MAX_VMID).find(|id| !held.contains(id) && !used.contains(id))?;
        map.insert(uid.to_owned(), vmid);
        Some(vmid)
    }

    /// Releases the reservation of `uid`.
    pub fn release(&self, uid: &str) {
        lock(&self.0).remove(uid);
    }
}

/// The template to clone: `(node, vmid)`.
///
/// A template kept on every node (the same name or tags, one copy per node, on node-local
/// storage) is not ambiguous for a machine placed on one of those nodes: `on` picks that node's
/// copy.
pub fn find_template(
    spec: &ProxmoxMachineSpec,
    guests: &[Guest],
    on: Option<&str>,
) -> Result<(String, u32), StepError> {
    let source = &spec.source;
    let on_node = |g: &&Guest| source.node.as_ref().is_none_or(|n| *n == g.node);
    let candidates: Vec<&Guest> = match source.vmid {
        Some(vmid) => guests.iter().filter(|g| g.vmid == vmid).filter(on_node).collect(),
        None => guests
            .iter()
            .filter(|g| g.template)
            .filter(on_node)
            .filter(|g| source.name.as_ref().is_none_or(|n| g.name.as_ref() == Some(n)))
            .filter(|g| has_tags(g, &source.tags))
            .collect(),
    };
    let wanted = || {
        let mut parts = Vec::new();
        if let Some(v) = source.vmid {
            parts.push(format!("vmid {v}"));
        }
        if let Some(n) = &source.name {
            parts.push(format!("name {n:?}"));
        }
        if !source.tags.is_empty() {
            parts.push(format!("tags {}", source.tags.join(",")));
        }
        if let Some(n) = &source.node {
            parts.push(format!("on node {n}"));
        }
        parts.join(", ")
    };
    match candidates.as_slice() {
        [] => Err(permanent(
            "TemplateNotFound",
            format!(
                "no Proxmox template with {} among the guests the API token can see (Proxmox VE \
                 leaves out of its listings what the token lacks VM.Audit on)",
                wanted()
            ),
        )),
        [one] if !one.template => Err(permanent(
            "TemplateNotFound",
            format!("VM {} is not a template", one.vmid),
        )),
        [one] => Ok((one.node.clone(), one.vmid)),
        many if let (Some(node), true) = (on, once_per_node(many)) => {
            match many.iter().find(|g| g.node == node) {
                Some(copy) => Ok((copy.node.clone(), copy.vmid)),
                None => Err(permanent(
                    "TemplateNotFound",
                    format!(
                        "the template with {} is kept once per node (on {}), but not on node {node}, \
                         where this machine is placed",
                        wanted(),
                        join(many.iter().map(|g| &g.node), ", ")
                    ),
                )),
            }
        }
        many => Err(permanent(
            "TemplateAmbiguous",
            format!(
                "{} templates match {} (VMIDs {}): make the selector unique",
                many.len(),
                wanted(),
                join(many.iter().map(|g| g.vmid), ", ")
            ),
        )),
    }
}

/// Whether `guest` carries every one of `tags` (compared in lower case, as Proxmox keeps them).
fn has_tags(guest: &Guest, tags: &[String]) -> bool {
    tags.iter().all(|t| guest.tags.contains(&t.to_ascii_lowercase()))
}

/// How soon a clone looks again for a template Proxmox may list without its details yet.
const LISTING_LAG_POLL: Duration = Duration::from_secs(3);

/// The guests listed without their statistics ([`Guest::reported`]) that could be the template
/// `spec.source` names: its VMID, or, for a name or tags, any on the allowed node whose tags
/// (listed at once, from the config) match.
fn unreported_candidates(spec: &ProxmoxMachineSpec, guests: &[Guest]) -> Vec<u32> {
    let source = &spec.source;
    guests
        .iter()
        .filter(|g| !g.reported)
        .filter(|g| source.node.as_ref().is_none_or(|n| *n == g.node))
        .filter(|g| match source.vmid {
            Some(vmid) => g.vmid == vmid,
            None => has_tags(g, &source.tags),
        })
        .map(|g| g.vmid)
        .collect()
}

/// Whether the candidates are one template kept once per node: every one a template, no two
/// on one node.
fn once_per_node(candidates: &[&Guest]) -> bool {
    let nodes: std::collections::BTreeSet<&str> = candidates.iter().map(|g| g.node.as_str()).collect();
    nodes.len() == candidates.len() && candidates.iter().all(|g| g.template)
}

/// The nodes holding a copy of a template kept once per node (see [`find_template`]); empty
/// when one template (or none) matches.
fn template_copies(spec: &ProxmoxMachineSpec, guests: &[Guest]) -> Vec<String> {
    match find_template(spec, guests, None) {
        Err(StepError::Permanent {
            reason: "TemplateAmbiguous",
            ..
        }) => guests
            .iter()
            .filter(|g| {
                g.template && find_template(spec, guests, Some(&g.node)).is_ok_and(|(_, v)| v == g.vmid)
            })
            .map(|g| g.node.clone())
            .collect(),
        _ => Vec::new(),
    }
}

/// The template's node when one of its disks (not a CD-ROM) is on storage local to that node:
/// Proxmox VE clones it to that node only. `None` when any node will do, or when no single
/// template matches yet (the clone step says why).
async fn template_pinned_to<H: Hypervisor>(
    hv: &H,
    spec: &ProxmoxMachineSpec,
    inventory: &Inventory,
) -> Result<Option<String>, banlieue_pve_client::Error> {
    let Ok((node, vmid)) = find_template(spec, &inventory.guests, None) else {
        return Ok(None);
    };
    let Some(local) = inventory.local_storages.get(&node).filter(|l| !l.is_empty()) else {
        return Ok(None);
    };
    let Some(storages) = template_facts::disk_storages(hv, &node, vmid).await? else {
        return Ok(None);
    };
    let pinned = storages.iter().any(|storage| local.contains(storage));
    Ok(pinned.then_some(node))
}

/// What polling a task found.
enum Polled {
    Running,
    Done,
    /// It failed, with PVE's exit status.
    Failed(String),
}

/// Polls a task. An unknown UPID (PVE forgot it, e.g. after a node restart) counts as
/// finished: the caller re-inspects the VM anyway.
async fn poll_task<H: Hypervisor>(hv: &H, reason: &'static str, upid: &Upid) -> Result<Polled, StepError> {
    match hv.task(upid).await {
        Ok(TaskOutcome::Running) => Ok(Polled::Running),
        Ok(TaskOutcome::Failed(text)) => Ok(Polled::Failed(text)),
        Ok(_) => Ok(Polled::Done),
        Err(e) if e.class() == ErrorClass::NotFound || e.status() == Some(400) => Ok(Polled::Done),
        Err(e) => Err(pve_error(reason, e)),
    }
}

/// The step after task `upid` failed with `exitstatus`: `again` (the phase without the task)
/// tries the step again, after a backoff when Proxmox was busy, else after
/// [`PERMANENT_RETRY`] with PVE's words in the condition (see [`crate::task_failure`]).
fn task_failed(again: Phase, reason: &'static str, upid: &Upid, exitstatus: &str) -> Step {
    let what = format!("task {} failed: {}", upid.task_type, exitstatus.trim());
    let failed = match task_failure::classify(exitstatus) {
        TaskFailure::Busy => FailedTask {
            reason: task_failure::PROXMOX_BUSY,
            message: format!("{what} (Proxmox was busy: trying again)"),
            busy: true,
        },
        TaskFailure::VmidTaken | TaskFailure::Refused => FailedTask {
            reason,
            message: format!(
                "{what} (tried again every {} min; fix what Proxmox reports, or the spec)",
                PERMANENT_RETRY.as_secs() / 60
            ),
            busy: false,
        },
    };
    let requeue = if failed.busy { TASK_POLL } else { PERMANENT_RETRY };
    Step {
        failed: Some(failed),
        ..Step::wait(again, requeue, what)
    }
}

/// The VMIDs new VMs of this machine get: the machine's `vmidRange`, else its cluster's.
fn vmid_range<'a>(input: &MachineInput<'a>) -> Option<&'a banlieue_api::infrastructure::VmidRange> {
    input.spec.vmid_range.as_ref().or(input.cluster_vmid_range)
}

async fn allocate_vmid<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    reservations: &VmidReservations,
) -> Result<u32, StepError> {
    let reason = "VMIDAllocationFailed";
    let pve = |e| pve_error(reason, e);
    if let Some(range) = vmid_range(input) {
        let used: std::collections::HashSet<u32> =
            hv.guests().await.map_err(pve)?.iter().map(|g| g.vmid).collect();
        // The listing holds QEMU guests only: PVE itself is asked whether the VMID is free, so a
        // container holding it is not cloned over (REAL-PVE.md R8).
        for id in range.start..=range.end {
            if used.contains(&id) || !reservations.reserve(input.owner.uid, id) {
                continue;
            }
            if hv.vmid_is_free(id).await.map_err(pve)? {
                return Ok(id);
            }
            reservations.release(input.owner.uid);
        }
        return Err(permanent(
            "VMIDRangeExhausted",
            format!("no free VMID in {}-{}", range.start, range.end),
        ));
    }
    // PVE proposes the lowest free VMID, the same for every machine allocating at once: each
    // machine reserves the next VMID no other machine in this process holds *before* asking PVE
    // whether it is free, so concurrent allocations never probe the same VMID twice. When the
    // proposal is held by another machine, VMIDs just cloned (no longer reserved) may follow it
    // in a long run: the guest listing skips them instead of one probe each.
    let proposed = hv.next_vmid().await.map_err(pve)?;
    let mut used = HashSet::new();
    if reservations.reserve_next(input.owner.uid, proposed, &used) != Some(proposed) {
        used = hv.guests().await.map_err(pve)?.iter().map(|g| g.vmid).collect();
    }
    let mut from = proposed;
    for _ in 0..VMID_PROBES {
        let Some(candidate) = reservations.reserve_next(input.owner.uid, from, &used) else {
            break;
        };
        // PVE has just said its proposal is free: only another VMID is asked about.
        if candidate == proposed || hv.vmid_is_free(candidate).await.map_err(pve)? {
            return Ok(candidate);
        }
        from = candidate.saturating_add(1);
    }
    reservations.release(input.owner.uid);
    Err(permanent(reason, "no free VMID found near the one PVE proposed"))
}

/// Performs the next provisioning step from `phase`.
pub async fn provision_step<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    phase: Phase,
    bootstrap: Option<&BootstrapData>,
    reservations: &VmidReservations,
) -> Result<Step, StepError> {
    let reason = phase.failure_reason();
    let pve = |e| pve_error(reason, e);
    match phase {
        Phase::SelectNode if let Some(provider_id) = input.spec.provider_id.as_deref() => {
            readopt_step(hv, input, provider_id).await
        }
        Phase::SelectNode => {
            let requested =
                input.spec.target_node.is_some() || input.failure_domain.is_some_and(|f| !f.is_empty());
            // A template made from an image is made on the node the machine goes to.
            let from_image = input.spec.source.image.is_some();
            let (nodes, template_node) = if requested || from_image {
                (hv.nodes().await.map_err(pve)?, None)
            } else {
                // Nodes, guests and storages in one listing.
                let inventory = hv.inventory().await.map_err(pve)?;
                let pinned = template_pinned_to(hv, input.spec, &inventory)
                    .await
                    .map_err(pve)?;
                // A template kept once per node: only nodes with a copy can clone it locally.
                let copies = template_copies(input.spec, &inventory.guests);
                let nodes: Vec<_> = reserve_for_stopped_guests(inventory.nodes, &inventory.guests)
                    .into_iter()
                    .filter(|n| copies.is_empty() || copies.contains(&n.name))
                    .collect();
                (nodes, pinned)
            };
            let placement = PlacementInput {
                target_node: input.spec.target_node.as_deref(),
                failure_domain: input.failure_domain,
                machine_allowed: &input.spec.allowed_nodes,
                cluster_allowed: input.cluster_allowed_nodes,
                template_node: template_node.as_deref(),
            };
            let node = choose_node(&placement, &nodes).map_err(|e| permanent(reason, e.to_string()))?;
            Ok(Step::to(Phase::AllocateVmid { node }))
        }
        Phase::AllocateVmid { node } => {
            let vmid = allocate_vmid(hv, input, reservations).await?;
            Ok(Step::to(Phase::Clone(VmLocation { node, vmid })))
        }
        Phase::Clone(loc) => clone(hv, input, loc, reservations).await,
        Phase::WaitClone(loc, upid) => match poll_task(hv, reason, &upid).await? {
            Polled::Done => {
                reservations.release(input.owner.uid);
                // Ownership and config are checked by the next step (Configure re-reads the VM).
                let message = format!("VM {} cloned on node {}", loc.vmid, loc.node);
                Ok(Step::to(Phase::Configure(loc, None)).event("Cloned", message))
            }
            Polled::Running => Ok(Step::wait(
                Phase::WaitClone(loc, upid.clone()),
                task_poll(&upid),
                format!("clone task {upid} running"),
            )),
            // PVE removes what a failed clone made: the VMID is free again, unless a guest the
            // synchronous check could not see holds it.
            Polled::Failed(text) if task_failure::classify(&text) == TaskFailure::VmidTaken => {
                reservations.release(input.owner.uid);
                Ok(Step::to(Phase::AllocateVmid { node: loc.node }).event(
                    "VMIDTaken",
                    format!(
                        "the clone to VMID {} failed because a guest holds that VMID ({}); choosing another",
                        loc.vmid,
                        text.trim()
                    ),
                ))
            }
            Polled::Failed(text) => Ok(task_failed(Phase::Clone(loc), reason, &upid, &text)),
        },
        Phase::Configure(loc, Some(upid)) => match poll_task(hv, reason, &upid).await? {
            // The seed was just uploaded, the last configuration step (the step that started it
            // found the rest in place): attached at once, and the VM started without reading
            // its configuration again. A VM meant to stay off is looked at once more, to publish
            // it provisioned.
            Polled::Done if upid.task_type == UPLOAD_TASK => {
                let seed_volid = desired::seed_volid(input.seed_storage, input.owner.uid);
                hv.set_config(
                    &loc.node,
                    loc.vmid,
                    &desired::attach_seed(desired::seed_slot(input.spec), &seed_volid),
                )
                .await
                .map_err(pve)?;
                if update::desired_power(input.spec) == PowerState::Off {
                    return Ok(Step::to(Phase::Configure(loc, None)));
                }
                Ok(Step::to(Phase::PowerOn(loc, None)).event("Configured", "VM configured"))
            }
            Polled::Done => Ok(Step::to(Phase::Configure(loc, None))),
            Polled::Running => Ok(Step::wait(
                Phase::Configure(loc, Some(upid.clone())),
                task_poll(&upid),
                format!("task {} running", upid.task_type),
            )),
            Polled::Failed(text) => Ok(task_failed(Phase::Configure(loc, None), reason, &upid, &text)),
        },
        Phase::Configure(loc, None) => configure(hv, input, loc, bootstrap).await,
        Phase::PowerOn(loc, Some(upid)) => match poll_task(hv, reason, &upid).await? {
            Polled::Done => Ok(Step::to(Phase::WaitGuest(loc)).event("PoweredOn", "VM started")),
            Polled::Running => Ok(Step::wait(
                Phase::PowerOn(loc, Some(upid.clone())),
                task_poll(&upid),
                "start task running",
            )),
            Polled::Failed(text) if already_running(Some(&text)) => {
                Ok(Step::to(Phase::WaitGuest(loc)).event("PoweredOn", "VM started"))
            }
            // A failed start may still have started the VM: the next step looks.
            Polled::Failed(text) => Ok(task_failed(Phase::PowerOn(loc, None), reason, &upid, &text)),
        },
        // Started without asking first: a VM that already runs (a start before a restart of
        // the provider) makes PVE say so, which counts as started.
        Phase::PowerOn(loc, None) => match hv.start_vm(&loc.node, loc.vmid).await {
            Ok(upid) => Ok(Step::wait(
                Phase::PowerOn(loc, Some(upid)),
                TASK_POLL,
                "start task running",
            )),
            Err(e) if already_running(e.message()) => Ok(Step::to(Phase::WaitGuest(loc))),
            Err(e) if e.class() == ErrorClass::NotFound => Ok(vanished(loc)),
            Err(e) => Err(pve(e)),
        },
        Phase::WaitGuest(loc) => wait_guest(hv, input, loc).await,
        Phase::Provisioned(loc) => {
            let step = update_step(hv, input, loc, None).await?;
            cloud_init_step(hv, input, step).await
        }
        Phase::Update(loc, state, task) => update_step(hv, input, loc, Some((state, task))).await,
    }
}

/// A machine with a providerID but no VM in its status was created anew (`clusterctl move`, a
/// restore; see [`readopt`]): its VM is found by the providerID, re-marked for this object, and
/// adopted as provisioned. It is never cloned again.
async fn readopt_step<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    provider_id: &str,
) -> Result<Step, StepError> {
    let reason = readopt::ADOPTION_FAILED;
    let pve = |e| pve_error(reason, e);
    match readopt::find(hv, input.owner, provider_id).await? {
        Found::Missing => Err(permanent(
            readopt::VM_NOT_FOUND,
            format!(
                "spec.providerID is {provider_id} but no VM on Proxmox has that SMBIOS uuid (deleted outside banlieue?): delete this machine to replace it"
            ),
        )),
        Found::Foreign(_, why) | Found::TakenOver(_, why) => Err(permanent(reason, why)),
        Found::Remark(c) => {
            let loc = c.vm.loc;
            let update = readopt::remark(&c.vm.config, input.owner);
            let requeue = apply_remark(hv, &loc, &update, reason).await?;
            let why = format!(
                "marking VM {} on {} as this machine's: the object was created anew (clusterctl move or a restore)",
                loc.vmid, loc.node
            );
            Ok(Step::wait(Phase::SelectNode, requeue, why.clone()).event("Adopting", why))
        }
        Found::Owned(c) => {
            let loc = c.vm.loc;
            let message = format!(
                "adopted VM {} on node {} by its providerID {provider_id}",
                loc.vmid, loc.node
            );
            let config = match hv.vm_running(&loc.node, loc.vmid).await.map_err(pve)? {
                Some(true) => return Ok(Step::to(Phase::WaitGuest(loc)).event("Adopted", message)),
                Some(false) => hv.vm_config(&loc.node, loc.vmid).await.map_err(pve)?,
                None => None,
            };
            match config {
                None => {
                    let why = format!("VM {} disappeared while being adopted", loc.vmid);
                    Ok(Step::wait(Phase::SelectNode, TASK_POLL, why))
                }
                Some(config) => {
                    let step = provisioned_powered_off(hv, input, loc, &config).await?;
                    // The update step starts it at once if the spec wants it on. Its one Event
                    // says the adoption (not provisioning, which happened elsewhere).
                    Ok(Step {
                        requeue: Duration::ZERO,
                        events: Vec::new(),
                        ..step
                    }
                    .event("Adopted", message))
                }
            }
        }
    }
}

/// Writes the re-marking of a VM found by its providerID ([`readopt`]); returns when to look
/// again (after the config task, if PVE started one).
async fn apply_remark<H: Hypervisor>(
    hv: &H,
    loc: &VmLocation,
    update: &banlieue_pve_client::ConfigUpdate,
    reason: &'static str,
) -> Result<Duration, StepError> {
    let upid = hv
        .update_config(&loc.node, loc.vmid, update)
        .await
        .map_err(|e| pve_error(reason, e))?;
    Ok(if upid.is_some() { TASK_POLL } else { Duration::ZERO })
}

/// The VM at `loc` does not carry this machine's owner marker: it is never modified.
fn not_ours(reason: &'static str, loc: &VmLocation) -> StepError {
    let vm = readopt::label(loc);
    permanent(
        reason,
        format!("{vm} does not carry this machine's owner marker; refusing to modify it"),
    )
}

/// Brings a provisioned VM to its spec, one action at a time (see [`crate::update`]):
/// `in_flight` is the update state and task persisted by the previous step, if any.
async fn update_step<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: VmLocation,
    in_flight: Option<(ProvisioningState, Option<Upid>)>,
) -> Result<Step, StepError> {
    let reason = "UpdateFailed";
    let pve = |e| pve_error(reason, e);
    let progress_reason = |state: ProvisioningState| match state {
        ProvisioningState::PoweringOff => "PoweringOff",
        ProvisioningState::PoweringOn => "PoweringOn",
        _ => "Reconfiguring",
    };
    let again = |to: VmLocation| match &in_flight {
        Some((state, _)) => Phase::Update(to, *state, None),
        None => Phase::Provisioned(to),
    };
    if let Some((state, Some(upid))) = &in_flight {
        match poll_task(hv, reason, upid).await? {
            Polled::Done => {}
            Polled::Running => {
                let message = format!("task {} running", upid.task_type);
                return Ok(Step {
                    up_to_date: Some(Report::new(false, progress_reason(*state), message.clone())),
                    ..Step::wait(
                        Phase::Update(loc.clone(), *state, Some(upid.clone())),
                        task_poll(upid),
                        message,
                    )
                });
            }
            Polled::Failed(text) => return Ok(task_failed(again(loc.clone()), reason, upid, &text)),
        }
    }
    let gone = || {
        permanent(
            readopt::VM_NOT_FOUND,
            format!(
                "VM {} no longer exists on node {}: delete this machine to replace it",
                loc.vmid, loc.node
            ),
        )
    };
    let Some(run) = hv.vm_run_state(&loc.node, loc.vmid).await.map_err(pve)? else {
        return follow_moved(hv, input, &loc, reason, again)
            .await?
            .ok_or_else(gone);
    };
    let running = run.running;
    let Some(PendingConfig { config, pending }) = hv.vm_pending(&loc.node, loc.vmid).await.map_err(pve)?
    else {
        return follow_moved(hv, input, &loc, reason, again)
            .await?
            .ok_or_else(gone);
    };
    let power = Some(update::observed_power(running));
    let current = again(loc.clone());
    if let Some(lock) = config.lock() {
        return Ok(Step {
            power,
            up_to_date: Some(Report::new(false, "VMLocked", format!("VM is locked ({lock})"))),
            ..Step::wait(current, TASK_POLL, format!("VM is locked ({lock})"))
        });
    }
    if !desired::is_owned_by(&config, input.owner.uid) {
        if let Some(why) = readopt::taken_over(&readopt::marks(&config), &readopt::label(&loc), input.owner) {
            return Err(permanent(readopt::ADOPTION_FAILED, why));
        }
        if readopt::remark_provisioned(&config, input.owner, input.spec.provider_id.as_deref()) {
            // The object was created anew with its status (e.g. restored): re-mark the VM.
            let update = readopt::remark(&config, input.owner);
            let requeue = apply_remark(hv, &loc, &update, reason).await?;
            let why = format!(
                "marking VM {} on {} as this machine's: the object was created anew",
                loc.vmid, loc.node
            );
            return Ok(Step {
                power,
                up_to_date: Some(Report::new(false, "Adopting", why.clone())),
                ..Step::wait(current, requeue, why.clone())
            }
            .event("Adopting", why));
        }
        return Err(not_ours(reason, &loc));
    }
    let action = update::next_update_action(input.spec, input.owner.uid, &config, running, &pending)
        .map_err(|e| permanent(reason, e.0))?;
    let start = |state: ProvisioningState, upid: Option<Upid>, why: String| Step {
        power,
        up_to_date: Some(Report::new(false, progress_reason(state), why.clone())),
        ..Step::wait(Phase::Update(loc.clone(), state, upid), TASK_POLL, why)
    };
    let settled = |report: Report| Step {
        requeue: RESYNC,
        power,
        up_to_date: Some(report),
        ..Step::to(Phase::Provisioned(loc.clone()))
    };
    let seed_volid = desired::seed_volid(input.seed_storage, input.owner.uid);
    match action {
        // A machine provisioned powered off still carries its seed: once the guest has booted
        // (it reports an address), the seed is removed and the addresses refreshed.
        UpdateAction::InSync if running && desired::seed_attached(&config, &seed_volid) => {
            let in_sync = settled(Report::up_to_date(None));
            let Some(ips) = first_boot_addresses(hv, input, &loc).await? else {
                return Ok(Step {
                    requeue: GUEST_POLL,
                    ..in_sync
                });
            };
            let provider_id = desired::provider_id(&config).ok_or_else(|| {
                permanent(reason, "the VM has no smbios1 uuid to derive the providerID from")
            })?;
            remove_seed(hv, input, &loc, reason).await?;
            let first_boot = Step {
                provisioned: provisioned(provider_id, desired::machine_addresses(input.owner.name, &ips)),
                ..in_sync
            }
            .event(
                "FirstBoot",
                format!(
                    "VM {} booted for the first time; bootstrap seed removed",
                    loc.vmid
                ),
            );
            high_availability(hv, input, &loc, run, first_boot).await
        }
        UpdateAction::InSync => {
            let mut in_sync = settled(Report::up_to_date(None));
            if in_flight.is_some() {
                in_sync = in_sync.event("Updated", "VM matches the spec");
            }
            high_availability(hv, input, &loc, run, in_sync).await
        }
        UpdateAction::RestartRequired { why } => Ok(settled(Report::restart_required(why))),
        UpdateAction::Resize { disk, size } => {
            let upid = hv
                .resize_disk(&loc.node, loc.vmid, &disk, SizeChange::To(size))
                .await
                .map_err(pve)?;
            let why = format!("growing disk {disk} to {size}");
            Ok(start(ProvisioningState::Configuring, upid, why.clone()).event("Resizing", why))
        }
        UpdateAction::Apply(update) => {
            let why = format!("applying {}", join(update.set.keys().chain(&update.delete), ", "));
            let upid = hv
                .update_config(&loc.node, loc.vmid, &update)
                .await
                .map_err(pve)?;
            Ok(start(ProvisioningState::Configuring, upid, why.clone()).event("Reconfiguring", why))
        }
        UpdateAction::Shutdown { why } => {
            let upid = hv
                .shutdown_vm(&loc.node, loc.vmid, update::SHUTDOWN_TIMEOUT_SECS)
                .await
                .map_err(pve)?;
            let why = format!("shutting VM {} down {why}", loc.vmid);
            Ok(start(ProvisioningState::PoweringOff, Some(upid), why.clone()).event("PoweringOff", why))
        }
        UpdateAction::Start => {
            let upid = hv.start_vm(&loc.node, loc.vmid).await.map_err(pve)?;
            let why = format!("starting VM {}", loc.vmid);
            Ok(start(ProvisioningState::PoweringOn, Some(upid), why.clone()).event("PoweringOn", why))
        }
    }
}

/// A VM otherwise in sync gets its HA membership converged ([`ha::converge`]): what changed
/// is told in an Event; a rule the spec names that Proxmox lacks makes `VMUpToDate` False
/// (`HARuleNotFound`), looked at again after [`PERMANENT_RETRY`].
async fn high_availability<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: &VmLocation,
    run: RunState,
    mut step: Step,
) -> Result<Step, StepError> {
    let comment = ha::comment(input.owner.namespace, input.owner.name);
    let wanted = input.spec.high_availability.as_ref();
    let outcome = ha::converge(hv, wanted, &comment, loc, run.ha_managed, run.running)
        .await
        .map_err(|e| pve_error(HA_FAILED, e))?;
    if !outcome.changed.is_empty() {
        let message = outcome.changed.join("; ");
        match step.events.last_mut() {
            Some((_, earlier)) => *earlier = format!("{earlier}; {message}"),
            None => step.events.push(("HighAvailability", message)),
        }
    }
    if let Some(rule) = outcome.missing_rule {
        step.requeue = PERMANENT_RETRY;
        step.up_to_date = Some(Report::new(
            false,
            "HARuleNotFound",
            format!(
                "HA rule {rule:?} does not exist in Proxmox VE: create it (Datacenter → HA → \
                 Rules) or remove it from spec.highAvailability.rules"
            ),
        ));
    }
    Ok(step)
}

/// The reason of a failed HA call (a token without `Sys.Console` on `/` among them).
const HA_FAILED: &str = "HighAvailabilityFailed";

/// The VM is not on `loc.node` any more. A migration (by a user, node maintenance or HA) keeps
/// its VMID, config and SMBIOS uuid: when the cluster lists that VMID on another node and the
/// VM there carries this machine's owner marker (and, once published, its providerID), the
/// machine follows it (`again` at the new location, an Event `VMMoved`). `None`: it is gone.
async fn follow_moved<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: &VmLocation,
    reason: &'static str,
    again: impl FnOnce(VmLocation) -> Phase,
) -> Result<Option<Step>, StepError> {
    let pve = |e| pve_error(reason, e);
    let guests = hv.guests().await.map_err(pve)?;
    let Some(guest) = guests.iter().find(|g| g.vmid == loc.vmid && g.node != loc.node) else {
        return Ok(None);
    };
    let Some(config) = hv.vm_config(&guest.node, loc.vmid).await.map_err(pve)? else {
        return Ok(None);
    };
    let same_identity = input
        .spec
        .provider_id
        .as_deref()
        .is_none_or(|id| desired::provider_id(&config).as_deref() == Some(id));
    if !desired::is_owned_by(&config, input.owner.uid) || !same_identity {
        return Ok(None);
    }
    let to = VmLocation {
        node: guest.node.clone(),
        vmid: loc.vmid,
    };
    let message = format!(
        "VM {} moved from node {} to {} (a migration, node maintenance or HA); following it",
        loc.vmid, loc.node, to.node
    );
    Ok(Some(Step::to(again(to)).event("VMMoved", message)))
}

/// The VM disappeared before provisioning finished: start over from the clone (the VMID is kept;
/// adoption rules still apply).
fn vanished(loc: VmLocation) -> Step {
    Step::to(Phase::Clone(loc.clone())).event(
        "VMVanished",
        format!(
            "VM {} disappeared from node {} before it was provisioned",
            loc.vmid, loc.node
        ),
    )
}

async fn clone<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: VmLocation,
    reservations: &VmidReservations,
) -> Result<Step, StepError> {
    let reason = "CloningFailed";
    let pve = |e| pve_error(reason, e);
    let waiting = |why: &str| Step::wait(Phase::Clone(loc.clone()), TASK_POLL, why);
    let guests = hv.guests().await.map_err(pve)?;
    if let Some(existing) = guests.iter().find(|g| g.vmid == loc.vmid) {
        let found = VmLocation {
            node: existing.node.clone(),
            vmid: loc.vmid,
        };
        let Some(config) = hv.vm_config(&found.node, found.vmid).await.map_err(pve)? else {
            return Ok(waiting("VM listed but its config is not readable yet"));
        };
        if config.lock() == Some("clone") {
            return Ok(waiting(&format!(
                "VMID {vmid} on {node} is being cloned; waiting to see whose clone it is (a clone \
                 whose worker died leaves `lock: clone` behind for good: if no clone task to \
                 VMID {vmid} runs on {node}, remove it there with `qm unlock {vmid} && qm destroy {vmid}`)",
                vmid = found.vmid,
                node = found.node,
            )));
        }
        reservations.release(input.owner.uid);
        if desired::is_owned_by(&config, input.owner.uid) {
            return Ok(Step::to(Phase::Configure(found.clone(), None)).event(
                "Adopted",
                format!(
                    "adopted VM {} on node {} created earlier for this machine",
                    found.vmid, found.node
                ),
            ));
        }
        return Ok(Step::to(Phase::AllocateVmid { node: loc.node }).event(
            "VMIDTaken",
            format!(
                "VMID {} is used by a VM this machine did not create; choosing another",
                loc.vmid
            ),
        ));
    }
    if let Some(how_far) = image_import::ensure(hv, &guests, &loc.node, input.spec, vmid_range(input))? {
        return Ok(Step::to(Phase::Clone(loc)).importing(how_far));
    }
    let (template_node, template_vmid) = match find_template(input.spec, &guests, Some(&loc.node)) {
        Err(err) if err.reason() == "TemplateNotFound" => {
            let lagging = unreported_candidates(input.spec, &guests);
            if lagging.is_empty() {
                return Err(err);
            }
            let vmids = join(&lagging, ", ");
            return Ok(Step::wait(
                Phase::Clone(loc),
                LISTING_LAG_POLL,
                format!(
                    "no template matches yet, but Proxmox lists guests {vmids} without their name and \
                     template flag (pvestatd reports them about 10 s after a VM is made a template, a \
                     node boots or pvestatd restarts; an offline node's guests stay so): looking again"
                ),
            ));
        }
        found => found?,
    };
    let linked = input.spec.clone_mode == Some(CloneMode::Linked);
    let request = CloneRequest {
        newid: loc.vmid,
        name: Some(input.owner.name.to_owned()),
        target: (template_node != loc.node).then(|| loc.node.clone()),
        full: Some(!linked),
        // A full clone puts every disk on one storage: spec.storage, else the first disk's own.
        storage: desired::full_clone_storage(input.spec).filter(|_| !linked),
        format: None,
        pool: input.spec.pool.clone(),
        description: Some(desired::owner_description(
            input.owner.uid,
            input.owner.namespace,
            input.owner.name,
        )),
        snapname: None,
    };
    match hv.clone_vm(&template_node, template_vmid, &request).await {
        Ok(upid) => Ok(Step::wait(
            Phase::WaitClone(loc, upid.clone()),
            TASK_POLL,
            format!("clone task {upid} running"),
        )
        .event(
            "CloneStarted",
            format!(
                "cloning template {template_vmid} on {template_node} to VMID {}",
                request.newid
            ),
        )),
        // The listing did not show the VMID, PVE says it is taken: a guest created since, or
        // one the listing leaves out because the token lacks VM.Audit on it (it may be this
        // machine's own, cloned before a restart). Looked at directly before moving on: a 403
        // names the privilege instead of cloning a second VM beside a hidden first one.
        Err(e) if e.class() == ErrorClass::AlreadyExists => {
            for node in [template_node.clone(), loc.node.clone()] {
                match hv.vm_config(&node, loc.vmid).await {
                    Err(e) if e.class() == ErrorClass::Auth => return Err(pve(e)),
                    Ok(Some(config)) if desired::is_owned_by(&config, input.owner.uid) => {
                        return Ok(waiting(
                            "this machine's VM exists but is not listed yet; looking again",
                        ));
                    }
                    _ => {}
                }
            }
            reservations.release(input.owner.uid);
            Ok(Step::to(Phase::AllocateVmid { node: loc.node }))
        }
        Err(e) => Err(refused_clone(pve(e))),
    }
}

/// A clone request Proxmox refuses for good (the template's storage cannot reach the chosen
/// node, an unknown storage or pool, …) is `CloneRefused`, which needs a human; a failure that
/// may pass stays `CloningFailed` and is retried.
fn refused_clone(err: StepError) -> StepError {
    match err {
        StepError::Permanent {
            reason: "CloningFailed",
            message,
        } => permanent(CLONE_REFUSED, message),
        other => other,
    }
}

/// Whether PVE refused a start because the VM runs already (`VM 101 already running`, in the
/// task on PVE 8/9).
fn already_running(message: Option<&str>) -> bool {
    message.is_some_and(|m| m.contains("already running"))
}

/// The task type of an upload to a storage (`imgcopy`).
const UPLOAD_TASK: &str = "imgcopy";

/// The `Ready` reason of a VM whose guest agent is not enabled in its config.
pub const GUEST_AGENT_NOT_CONFIGURED: &str = "GuestAgentNotConfigured";

fn guest_agent_not_configured(vmid: u32) -> StepError {
    permanent(
        GUEST_AGENT_NOT_CONFIGURED,
        format!(
            "VM {vmid} has no QEMU guest agent enabled in its config, so its addresses cannot be \
             read: enable it on the template (qm set <template vmid> --agent 1, with \
             qemu-guest-agent inside the image) and delete this machine to clone it again, or set \
             spec.readinessChecks.skipGuestAgent with static addresses"
        ),
    )
}

/// Whether the spec waits for static addresses rather than the guest agent's.
fn skips_guest_agent(spec: &ProxmoxMachineSpec) -> bool {
    ReadinessChecks::skip_guest_agent(spec.readiness_checks.as_ref())
}

/// The `Ready` reason of a clone request Proxmox refused for good (see [`refused_clone`]).
pub const CLONE_REFUSED: &str = "CloneRefused";

async fn configure<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: VmLocation,
    bootstrap: Option<&BootstrapData>,
) -> Result<Step, StepError> {
    let reason = "ConfigurationFailed";
    let pve = |e| pve_error(reason, e);
    let Some(config) = hv.vm_config(&loc.node, loc.vmid).await.map_err(pve)? else {
        return Ok(vanished(loc));
    };
    if let Some(lock) = config.lock() {
        return Ok(Step::wait(
            Phase::Configure(loc, None),
            TASK_POLL,
            format!("VM is locked ({lock})"),
        ));
    }
    if !desired::is_owned_by(&config, input.owner.uid) {
        return Err(not_ours(reason, &loc));
    }
    // Told before the VM boots: without the agent option PVE says "not configured", but with
    // `agent: 0` only that the agent does not run, and the machine would wait for it forever.
    if !skips_guest_agent(input.spec) && !config.agent_enabled() {
        return Err(guest_agent_not_configured(loc.vmid));
    }
    let seed_volid = desired::seed_volid(input.seed_storage, input.owner.uid);
    let spec_error = |e: desired::SpecError| permanent(reason, e.0);
    // The providerID is known from here on: published now, so the steps after this one need
    // not read the configuration again for it.
    let provider_id = input
        .spec
        .provider_id
        .is_none()
        .then(|| desired::provider_id(&config))
        .flatten();
    let running = |upid: Option<Upid>, what: &str| Step {
        provider_id: provider_id.clone(),
        ..match upid {
            Some(upid) => Step::wait(
                Phase::Configure(loc.clone(), Some(upid)),
                TASK_POLL,
                what.to_owned(),
            ),
            None => Step::to(Phase::Configure(loc.clone(), None)),
        }
    };
    let mut config = config;
    let mut applied_at_once = false;
    let action = loop {
        match desired::next_configure_action(input.spec, input.owner.uid, &config, &seed_volid)
            .map_err(spec_error)?
        {
            // Options PVE stores as written are set synchronously and the next action is taken
            // from the config as it now is, without reading it again (once: should PVE have
            // stored them otherwise, the next step reads the config).
            ConfigureAction::Apply(update) if !applied_at_once && !desired::changes_devices(&update) => {
                hv.set_config(&loc.node, loc.vmid, &update).await.map_err(pve)?;
                config = config.with_update(&update);
                applied_at_once = true;
            }
            action => break action,
        }
    };
    match action {
        ConfigureAction::Apply(update) if applied_at_once => {
            tracing::debug!(
                ?update,
                "config still differs after a synchronous update; reading it again"
            );
            Ok(running(None, "config updated"))
        }
        ConfigureAction::Apply(update) => {
            let upid = hv
                .update_config(&loc.node, loc.vmid, &update)
                .await
                .map_err(pve)?;
            Ok(running(upid, "config update running"))
        }
        ConfigureAction::Resize { disk, size } => {
            let upid = hv
                .resize_disk(&loc.node, loc.vmid, &disk, SizeChange::To(size))
                .await
                .map_err(pve)?;
            Ok(running(upid, "disk resize running"))
        }
        // Uploaded even if an earlier try did (PVE overwrites the file): cheaper than asking
        // the storage first, and the seed is rebuilt from the current bootstrap data.
        ConfigureAction::Seed => {
            let bootstrap = bootstrap.ok_or(StepError::NeedBootstrapData)?;
            let instance_id = config
                .smbios_uuid()
                .ok_or_else(|| permanent(reason, "the cloned VM has no smbios1 uuid"))?;
            let seed = desired::seed(
                bootstrap,
                input.owner.name,
                instance_id,
                input.spec,
                &config,
                input.pool_addresses,
            )
            .map_err(spec_error)?;
            let iso = seed
                .to_iso()
                .map_err(|e| permanent(reason, format!("cannot build the seed ISO: {e}")))?;
            let upid = hv
                .upload_iso(
                    &loc.node,
                    input.seed_storage,
                    &desired::seed_file_name(input.owner.uid),
                    iso,
                )
                .await
                .map_err(|e| pve_error("BootstrapDeliveryFailed", e))?;
            Ok(running(Some(upid), "uploading the bootstrap seed"))
        }
        ConfigureAction::Done if update::desired_power(input.spec) == PowerState::Off => {
            provisioned_powered_off(hv, input, loc, &config).await
        }
        ConfigureAction::Done => Ok(Step {
            provider_id,
            ..Step::to(Phase::PowerOn(loc, None)).event("Configured", "VM configured")
        }),
    }
}

/// A machine whose spec wants the VM `Off` when configuration is done is provisioned without
/// booting it: the start and the wait for the guest are skipped. The providerID comes from the
/// config (smbios1 uuid); the addresses are the hostname plus what is known without a guest
/// (static `addresses` and IPAM pool allocations). The seed ISO stays attached, so cloud-init
/// runs with the bootstrap data on the VM's first boot; [`update_step`] ejects and deletes it
/// once the running guest reports an address (deletion deletes it in any case).
async fn provisioned_powered_off<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: VmLocation,
    config: &banlieue_pve_client::VmConfig,
) -> Result<Step, StepError> {
    let reason = "ConfigurationFailed";
    let provider_id = desired::provider_id(config)
        .ok_or_else(|| permanent(reason, "the VM has no smbios1 uuid to derive the providerID from"))?;
    let Some(running) = hv
        .vm_running(&loc.node, loc.vmid)
        .await
        .map_err(|e| pve_error(reason, e))?
    else {
        return Ok(vanished(loc));
    };
    let ips: Vec<std::net::IpAddr> = desired::static_addresses(input.spec)
        .into_iter()
        .chain(input.pool_addresses.values().map(|a| a.address))
        .collect();
    let message = format!(
        "VM {} provisioned without booting it (spec.powerState is Off); it runs its bootstrap data on its first start",
        loc.vmid
    );
    Ok(Step {
        // Someone started it meanwhile: the update step shuts it down at once.
        requeue: if running { Duration::ZERO } else { RESYNC },
        provisioned: provisioned(provider_id, desired::machine_addresses(input.owner.name, &ips)),
        power: Some(update::observed_power(running)),
        up_to_date: (!running).then(|| Report::up_to_date(None)),
        ..Step::to(Phase::Provisioned(loc))
    }
    .event("Provisioned", message))
}

async fn wait_guest<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: VmLocation,
) -> Result<Step, StepError> {
    let reason = "GuestNotReady";
    let pve = |e| pve_error(reason, e);
    let skip_agent = skips_guest_agent(input.spec);
    let waiting = |why: &str| Step::wait(Phase::WaitGuest(loc.clone()), guest_poll(input), why);
    let ips = if skip_agent {
        desired::static_addresses(input.spec)
    } else {
        match hv.guest_addresses(&loc.node, loc.vmid).await {
            Ok(Some(ips)) => ips,
            Ok(None) => return Ok(waiting("waiting for the QEMU guest agent")),
            Err(e) if e.class() == ErrorClass::NotFound => {
                let moved = follow_moved(hv, input, &loc, reason, Phase::WaitGuest).await?;
                return Ok(moved.unwrap_or_else(|| vanished(loc.clone())));
            }
            Err(e)
                if e.message()
                    .is_some_and(|m| m.contains("No QEMU guest agent configured")) =>
            {
                return Err(guest_agent_not_configured(loc.vmid));
            }
            Err(e) => return Err(pve(e)),
        }
    };
    let addresses = desired::machine_addresses(input.owner.name, &ips);
    if !skip_agent && addresses.len() < 2 {
        return Ok(waiting("waiting for the guest to report an IP address"));
    }
    // Published by the configuration step; read from the VM for a machine configured before
    // that was so.
    let provider_id = match &input.spec.provider_id {
        Some(id) => id.clone(),
        None => {
            let Some(config) = hv.vm_config(&loc.node, loc.vmid).await.map_err(pve)? else {
                return Ok(vanished(loc));
            };
            desired::provider_id(&config).ok_or_else(|| {
                permanent(reason, "the VM has no smbios1 uuid to derive the providerID from")
            })?
        }
    };
    // The seed has served its purpose (cloud-init read it at its first stage).
    let left_behind = remove_seed(hv, input, &loc, reason).await?;
    let message = match left_behind {
        Some(why) => format!("VM running and reachable; {why}"),
        None => "VM running and reachable".to_owned(),
    };
    let cloud_init = guest_cloud_init(hv, input, &loc, reason).await?;
    Ok(Step {
        requeue: RESYNC,
        provisioned: provisioned(provider_id, addresses),
        power: Some(PowerState::On),
        up_to_date: Some(Report::up_to_date(None)),
        cloud_init,
        ..Step::to(Phase::Provisioned(loc))
    }
    .event("Provisioned", message))
}

/// What the guest's cloud-init says now; `None` when the spec does not wait for it.
async fn guest_cloud_init<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: &VmLocation,
    reason: &'static str,
) -> Result<Option<CloudInit>, StepError> {
    if cloud_init::skipped(input.spec.readiness_checks.as_ref()) {
        return Ok(None);
    }
    let report = hv
        .cloud_init_result(&loc.node, loc.vmid)
        .await
        .map_err(|e| pve_error(reason, e))?;
    Ok(Some(CloudInit::from_result(report.as_deref())))
}

/// A provisioned machine whose `Ready` waits on the guest's cloud-init asks it again, when the
/// step left the VM running as it is (no change in flight, no failure).
async fn cloud_init_step<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    mut step: Step,
) -> Result<Step, StepError> {
    if let Phase::Provisioned(loc) = &step.phase
        && input.cloud_init_pending
        && step.failed.is_none()
        && step.power == Some(PowerState::On)
    {
        step.cloud_init = guest_cloud_init(hv, input, loc, "GuestNotReady").await?;
    }
    Ok(step)
}

/// Ejects and deletes the seed ISO (it holds the bootstrap data, secrets included). A failure
/// fails the step, which is tried again: deletion of a provisioned machine counts on the seed
/// being gone. A token not allowed to delete volumes (Datastore.Allocate) leaves it behind:
/// `Some` says so, for the Event.
async fn remove_seed<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: &VmLocation,
    reason: &'static str,
) -> Result<Option<String>, StepError> {
    let seed_volid = desired::seed_volid(input.seed_storage, input.owner.uid);
    hv.set_config(
        &loc.node,
        loc.vmid,
        &desired::eject_seed(desired::seed_slot(input.spec)),
    )
    .await
    .map_err(|e| pve_error(reason, e))?;
    delete_seed(hv, &loc.node, &seed_volid, reason).await
}

/// Deletes the seed ISO `volid` on `node` (gone already is fine). Deleting a volume needs
/// Datastore.Allocate, more than uploading it: a token without it leaves the seed behind rather
/// than keep a finalizer, and `Some` says so.
async fn delete_seed<H: Hypervisor>(
    hv: &H,
    node: &str,
    volid: &str,
    reason: &'static str,
) -> Result<Option<String>, StepError> {
    match hv.delete_volume(node, volid).await {
        Ok(_) => Ok(None),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) if e.class() == ErrorClass::Auth => {
            let why = crate::error::describe(&e);
            tracing::warn!(%volid, %node, "seed ISO left behind: {why}");
            Ok(Some(format!(
                "the seed ISO {volid} on {node} was left behind: {why}"
            )))
        }
        Err(e) => Err(pve_error(reason, e)),
    }
}

/// The addresses of a running guest that booted for the first time after it was provisioned
/// powered off: the guest agent's (`None` until it reports one), or the static ones when the
/// spec skips the agent.
async fn first_boot_addresses<H: Hypervisor>(
    hv: &H,
    input: &MachineInput<'_>,
    loc: &VmLocation,
) -> Result<Option<Vec<std::net::IpAddr>>, StepError> {
    let skip_agent = skips_guest_agent(input.spec);
    if skip_agent {
        return Ok(Some(desired::static_addresses(input.spec)));
    }
    let ips = hv
        .guest_addresses(&loc.node, loc.vmid)
        .await
        .map_err(|e| pve_error("GuestNotReady", e))?;
    Ok(ips.filter(|ips| desired::machine_addresses(input.owner.name, ips).len() >= 2))
}

/// What a deletion step decided.
#[derive(Clone, Debug, PartialEq)]
pub enum DeleteStep {
    /// Nothing of this machine is left on Proxmox: remove the finalizer.
    Gone {
        /// Why it counts as gone (for the Event).
        note: String,
    },
    /// Deletion continues: persist `state`/`task` and look again after `requeue`.
    InProgress {
        /// `PoweringOff` or `Deleting`.
        state: ProvisioningState,
        /// The task in flight (looked at again after [`TASK_POLL`]).
        task: Option<Upid>,
        /// What happens.
        message: String,
    },
}

/// Deletion goes on: `state`, with `task` in flight.
fn deleting(state: ProvisioningState, task: Option<Upid>, message: String) -> DeleteStep {
    DeleteStep::InProgress { state, task, message }
}

/// Performs the next deletion step for a machine whose status is `status`.
///
/// Stops the VM (awaiting the task), deletes it with purge (awaiting the task), then deletes
/// the seed ISO. A VM that is already gone counts as deleted; a VM without this owner's marker
/// is never touched.
pub async fn delete_step<H: Hypervisor>(
    hv: &H,
    uid: &str,
    seed_storage: &str,
    status: Option<&ProxmoxMachineStatus>,
    reservations: &VmidReservations,
) -> Result<DeleteStep, StepError> {
    use ProvisioningState::{Deleting, PoweringOff};
    let reason = "DeletionFailed";
    let pve = |e| pve_error(reason, e);
    let node = status.and_then(|s| s.node.clone());
    // A provisioned machine's seed was deleted when its guest first came up (or is still
    // attached to a VM provisioned powered off, and deleted below when the VM shows it).
    let provisioned = Initialization::is_provisioned(status.and_then(|s| s.initialization.as_ref()));
    let cleanup_seed = async |note: String| -> Result<DeleteStep, StepError> {
        let left_behind = match node.as_ref().filter(|_| !provisioned) {
            Some(node) => delete_seed(hv, node, &desired::seed_volid(seed_storage, uid), reason).await?,
            None => None,
        };
        reservations.release(uid);
        let note = match left_behind {
            Some(why) => format!("{note}; {why}"),
            None => note,
        };
        Ok(DeleteStep::Gone { note })
    };
    let provisioning = status.and_then(|s| s.provisioning.as_ref());
    let vmid = status.and_then(|s| s.vmid);
    if let Some(p) = provisioning.filter(|p| matches!(p.state, PoweringOff | Deleting))
        && let Some(raw) = &p.task_id
        && let Ok(upid) = raw.parse::<Upid>()
    {
        match hv.task(&upid).await {
            Ok(TaskOutcome::Running) => {
                return Ok(deleting(p.state, Some(upid), format!("task {raw} running")));
            }
            Ok(TaskOutcome::Failed(text)) => {
                tracing::warn!(task = %raw, exitstatus = %text, "deletion task failed; retrying");
            }
            // The destroy task ended well: the VM is gone, nothing to look up again.
            Ok(_) if p.state == Deleting && vmid.is_some() => {
                return cleanup_seed(format!("VM {} deleted", vmid.unwrap_or_default())).await;
            }
            // The stop task ended well on the task's node: destroyed at once (the VM was found
            // and checked to be this machine's before it was stopped). Should it run again or
            // be gone, the VM is looked at below.
            Ok(_) if let Some(vmid) = vmid => match hv.delete_vm(&upid.node, vmid).await {
                Ok(task) => return Ok(deleting(Deleting, Some(task), format!("deleting VM {vmid}"))),
                Err(e) if e.is_not_found() => {
                    return cleanup_seed(format!("VM {vmid} is gone")).await;
                }
                Err(e) => tracing::debug!(error = %e, vmid, "destroy after the stop refused; looking again"),
            },
            Ok(_) => {}
            Err(e) if e.is_not_found() || e.status() == Some(400) => {}
            Err(e) => return Err(pve(e)),
        }
    }
    let Some(vmid) = vmid else {
        return cleanup_seed("no VM was created".to_owned()).await;
    };
    // Looked for on its node first (a 403 there names the privilege: Proxmox leaves out of
    // its listings what the token lacks VM.Audit on, so a VM the token cannot see must not
    // count as gone, or the finalizer would go and the VM leak); only when it is not there, in
    // the cluster's listing (it may have migrated).
    let on_its_node = match &node {
        Some(n) => hv
            .vm_config(n, vmid)
            .await
            .map_err(pve)?
            .map(|config| (n.clone(), config)),
        None => None,
    };
    let (vm_node, config) = match on_its_node {
        Some(found) => found,
        None => {
            let guests = hv.guests().await.map_err(pve)?;
            let Some(guest) = guests.iter().find(|g| g.vmid == vmid) else {
                return cleanup_seed(format!("VM {vmid} is gone")).await;
            };
            let Some(config) = hv.vm_config(&guest.node, vmid).await.map_err(pve)? else {
                return cleanup_seed(format!("VM {vmid} is gone")).await;
            };
            (guest.node.clone(), config)
        }
    };

    if config.lock() == Some("clone") {
        let message = format!("VMID {vmid} is being cloned; waiting before deleting it");
        return Ok(deleting(Deleting, None, message));
    }
    if !desired::is_owned_by(&config, uid) {
        let note = format!("VM {vmid} on {vm_node} was not created for this machine; left untouched");
        return cleanup_seed(note).await;
    }
    let seed_volid = desired::seed_volid(seed_storage, uid);
    if provisioned && desired::seed_attached(&config, &seed_volid) {
        delete_seed(hv, &vm_node, &seed_volid, reason).await?;
    }
    // Stopped without asking whether it runs: PVE's stop of a stopped VM is a task that ends
    // well, and the destroy follows the stop task either way.
    match hv.stop_vm(&vm_node, vmid).await {
        Ok(upid) => Ok(deleting(PoweringOff, Some(upid), format!("stopping VM {vmid}"))),
        Err(e) if e.is_not_found() => cleanup_seed(format!("VM {vmid} is gone")).await,
        Err(e) => Err(pve(e)),
    }
}
