//! Pure status mirror: an infrastructure machine's contract fields → the VirtualMachine's
//! status.
//!
//! The machine is read through [`MachineView`], the part of the CAPI InfraMachine contract
//! (plus banlieue's `node`, `powerState` and `provisioning`) that every registered kind
//! shares, so one mirror serves every backend. The infra cluster the machine uses is read
//! through [`ClusterView`]: when the machine only says it waits for that cluster, the
//! VirtualMachine shows the cluster's own reason (authentication, TLS, reachability) instead.
//! A `Ready` reason that needs a human ([`condition::needs_human`]) makes the phase `Failed`.

use banlieue_api::banlieue::{ProviderAllocation, VirtualMachinePhase, VirtualMachineStatus};
use banlieue_api::common::{
    ContractReference, Initialization, MachineAddress, PowerState, ProvisioningState, ProvisioningStatus,
};
use banlieue_api::condition::{self, Condition, ConditionStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;

use crate::build::Invalid;

/// Reason of `InfrastructureReady`/`Ready` while the infrastructure machine does not exist.
pub const WAITING_FOR_INFRASTRUCTURE: &str = "WaitingForInfrastructure";
/// Reason of `InfrastructureReady` while the machine has not reported `Ready` at all.
pub const READY_NOT_REPORTED: &str = "ReadyNotReported";
/// Reason of `Provisioned` once the machine is provisioned.
pub const PROVISIONED: &str = "Provisioned";
/// Reason of `Ready` while the VirtualMachine is being deleted.
pub const DELETING: &str = "Deleting";

/// The `spec` part of an infrastructure machine the mirror reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct MachineSpecView {
    /// `spec.providerID`, set by the provider.
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
}

/// The `status` part of an infrastructure machine the mirror reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatusView {
    /// `status.initialization` (`provisioned`).
    #[serde(default)]
    pub initialization: Option<Initialization>,
    /// `status.addresses`.
    #[serde(default)]
    pub addresses: Vec<MachineAddress>,
    /// `status.failureDomain`.
    #[serde(default)]
    pub failure_domain: Option<String>,
    /// `status.conditions`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// `status.node`.
    #[serde(default)]
    pub node: Option<String>,
    /// `status.powerState`.
    #[serde(default)]
    pub power_state: Option<PowerState>,
    /// `status.provisioning`.
    #[serde(default)]
    pub provisioning: Option<ProvisioningStatus>,
}

/// What the mirror reads of an infrastructure machine.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct MachineView {
    /// The machine has a deletion timestamp (the provider is deleting the hypervisor VM).
    #[serde(skip)]
    pub deleting: bool,
    /// The spec part.
    #[serde(default)]
    pub spec: MachineSpecView,
    /// The status part.
    #[serde(default)]
    pub status: MachineStatusView,
}

impl MachineView {
    /// Reads the view out of a machine object. A status that does not have the contract's
    /// shape is read as empty (the machine then looks unprovisioned) rather than failing.
    pub fn from_object(obj: &serde_json::Value) -> Self {
        let spec = obj
            .get("spec")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default();
        let status = obj
            .get("status")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default();
        let deleting = obj
            .get("metadata")
            .and_then(|m| m.get("deletionTimestamp"))
            .is_some_and(|t| !t.is_null());
        Self {
            deleting,
            spec,
            status,
        }
    }

    fn provisioned(&self) -> bool {
        Initialization::is_provisioned(self.status.initialization.as_ref())
    }
}

/// What the mirror reads of the infra cluster (e.g. the generated `ProxmoxCluster`) the
/// machine uses: its `Ready` condition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// `status.conditions[type=Ready]`, if reported.
    pub ready: Option<Condition>,
}

impl ClusterView {
    /// Reads the view out of an infra cluster object; a status without the contract's shape
    /// reads as "Ready not reported".
    pub fn from_object(obj: &serde_json::Value) -> Self {
        let conditions: Vec<Condition> = obj
            .get("status")
            .and_then(|s| s.get("conditions"))
            .and_then(|c| serde_json::from_value(c.clone()).ok())
            .unwrap_or_default();
        Self {
            ready: condition::find(&conditions, condition::READY).cloned(),
        }
    }
}

/// Everything the mirror needs besides the current status.
#[derive(Clone, Debug, Default)]
pub struct MirrorInput<'a> {
    /// The VirtualMachine's `metadata.generation`.
    pub generation: Option<i64>,
    /// The VirtualMachine has a deletion timestamp.
    pub deleting: bool,
    /// The chosen Provider, if any.
    pub provider: Option<&'a str>,
    /// What the VirtualMachine takes of that Provider's capacity (`status.allocated`), when
    /// the controller could size it; the recorded value stays otherwise.
    pub allocated: Option<&'a ProviderAllocation>,
    /// The infrastructure machine the VirtualMachine drives, once known.
    pub infrastructure_ref: Option<ContractReference>,
    /// The infrastructure machine, if it exists.
    pub machine: Option<&'a MachineView>,
    /// The infra cluster the machine uses, if the controller knows it.
    pub cluster: Option<&'a ClusterView>,
    /// The Secret named by the VirtualMachine's `spec.userDataSecretRef`, if any.
    pub user_data_secret: Option<&'a str>,
    /// Why the VirtualMachine cannot be realised as written, if so.
    pub invalid: Option<&'a Invalid>,
}

/// The VirtualMachine status for `input`, starting from `current` so that conditions keep their
/// `lastTransitionTime` unless their status flips and conditions owned by others (e.g.
/// `Paused`) survive. Calling it again on its own output with the same input returns an equal
/// status, which is how the reconciler knows there is nothing to write.
pub fn mirror(
    current: Option<&VirtualMachineStatus>,
    input: &MirrorInput<'_>,
    now: &Time,
) -> VirtualMachineStatus {
    let mut status = current.cloned().unwrap_or_default();
    let generation = input.generation;
    let machine = input.machine;
    let provider = input
        .provider
        .map(str::to_owned)
        .or_else(|| status.provider.clone());
    let vm_up_to_date = machine.and_then(|m| condition::find(&m.status.conditions, condition::VM_UP_TO_DATE));
    if vm_up_to_date.is_none() {
        status.conditions.retain(|c| c.type_ != condition::UP_TO_DATE);
    }
    let mut set = |type_: &str, s: ConditionStatus, reason: &str, message: &str| {
        condition::set(
            &mut status.conditions,
            condition::new_condition(type_, s, reason, message, generation, now.clone()),
        );
    };

    // InfrastructureReady: the machine's Ready, verbatim.
    let infra_ready = machine.and_then(|m| condition::find(&m.status.conditions, condition::READY));
    match (machine, infra_ready) {
        (None, _) => set(
            condition::INFRASTRUCTURE_READY,
            ConditionStatus::False,
            WAITING_FOR_INFRASTRUCTURE,
            "the infrastructure machine does not exist yet",
        ),
        (Some(_), None) => set(
            condition::INFRASTRUCTURE_READY,
            ConditionStatus::Unknown,
            READY_NOT_REPORTED,
            "the provider has not reported the machine's Ready condition yet",
        ),
        (Some(_), Some(c)) => set(
            condition::INFRASTRUCTURE_READY,
            parse_status(&c.status),
            &c.reason,
            &c.message,
        ),
    }

    // UpToDate: the machine's VMUpToDate, verbatim (what a provisioned VM's day-2 work does or
    // why it failed), absent while the machine reports none.
    if let Some(c) = vm_up_to_date {
        set(
            condition::UP_TO_DATE,
            parse_status(&c.status),
            &c.reason,
            &c.message,
        );
    }

    // Provisioned: initialization.provisioned, or the provisioning state machine's step.
    let provisioning = machine.and_then(|m| m.status.provisioning.as_ref());
    let (prov_status, prov_reason, prov_message) = match machine {
        None => (
            ConditionStatus::False,
            WAITING_FOR_INFRASTRUCTURE.to_owned(),
            String::new(),
        ),
        Some(m) if m.provisioned() => (ConditionStatus::True, PROVISIONED.to_owned(), String::new()),
        Some(_) => (
            ConditionStatus::False,
            provisioning
                .map_or(ProvisioningState::Pending, |p| p.state)
                .as_str()
                .to_owned(),
            provisioning.and_then(|p| p.message.clone()).unwrap_or_default(),
        ),
    };
    set(condition::PROVISIONED, prov_status, &prov_reason, &prov_message);

    // Ready: a summary with the provider's reason and message.
    if let Some(invalid) = input.invalid {
        set(
            condition::READY,
            ConditionStatus::False,
            invalid.reason(),
            &invalid.to_string(),
        );
    } else if input.deleting {
        set(
            condition::READY,
            ConditionStatus::False,
            DELETING,
            &deletion_message(machine, infra_ready),
        );
    } else {
        match (machine, infra_ready) {
            (None, _) => set(
                condition::READY,
                ConditionStatus::False,
                WAITING_FOR_INFRASTRUCTURE,
                "waiting for the infrastructure machine",
            ),
            (Some(_), Some(c)) => match cluster_cause(input) {
                Some(cause) => set(
                    condition::READY,
                    ConditionStatus::False,
                    &cause.reason,
                    &cluster_message(provider.as_deref(), cause),
                ),
                None => match user_data_missing(input, c) {
                    Some(message) => set(
                        condition::READY,
                        ConditionStatus::False,
                        condition::USER_DATA_SECRET_NOT_FOUND,
                        &message,
                    ),
                    None => set(condition::READY, parse_status(&c.status), &c.reason, &c.message),
                },
            },
            (Some(_), None) => set(
                condition::READY,
                ConditionStatus::False,
                &prov_reason,
                &prov_message,
            ),
        }
    }

    let needs_human = condition::find(&status.conditions, condition::READY)
        .is_some_and(|c| c.status == "False" && condition::needs_human(&c.reason));
    status.phase = Some(if input.deleting {
        VirtualMachinePhase::Deleting
    } else if needs_human || provisioning.is_some_and(|p| p.state == ProvisioningState::Failed) {
        VirtualMachinePhase::Failed
    } else if machine.is_some_and(MachineView::provisioned) {
        match machine.and_then(|m| m.status.power_state) {
            Some(PowerState::Off) => VirtualMachinePhase::Stopped,
            _ => VirtualMachinePhase::Running,
        }
    } else if machine.is_some() {
        VirtualMachinePhase::Provisioning
    } else {
        VirtualMachinePhase::Pending
    });
    status.observed_generation = generation;
    status.provider = input.provider.map(str::to_owned).or(status.provider);
    status.allocated = input.allocated.cloned().or(status.allocated);
    status.infrastructure_ref = input.infrastructure_ref.clone().or(status.infrastructure_ref);
    status.provider_id = machine.and_then(|m| m.spec.provider_id.clone());
    status.addresses = machine.map(|m| m.status.addresses.clone()).unwrap_or_default();
    status.power_state = machine.and_then(|m| m.status.power_state);
    status.node = machine.and_then(|m| m.status.node.clone());
    status.failure_domain = machine.and_then(|m| m.status.failure_domain.clone());
    status
}

/// The infra cluster's `Ready` when it is the real cause of the machine's: the machine reports
/// only that it waits for its cluster ([`condition::waits_for_cluster`]) and the cluster reports
/// a `Ready` that is not `True`.
fn cluster_cause<'a>(input: &MirrorInput<'a>) -> Option<&'a Condition> {
    let machine_ready = condition::find(&input.machine?.status.conditions, condition::READY)?;
    let cluster_ready = input.cluster?.ready.as_ref()?;
    (machine_ready.status != "True"
        && condition::waits_for_cluster(&machine_ready.reason)
        && cluster_ready.status != "True")
        .then_some(cluster_ready)
}

/// The `Ready` message when the machine waits for bootstrap data although the VirtualMachine
/// names a user-data Secret: a VirtualMachine has no bootstrap provider, so the provider waits
/// for that Secret, which does not exist (or cannot be read) — only a human can create it.
fn user_data_missing(input: &MirrorInput<'_>, machine_ready: &Condition) -> Option<String> {
    let secret = input.user_data_secret?;
    (machine_ready.status != "True" && machine_ready.reason == condition::WAITING_FOR_BOOTSTRAP_DATA).then(
        || {
            let detail = if machine_ready.message.is_empty() {
                String::new()
            } else {
                format!(" ({})", machine_ready.message)
            };
            format!(
                "user-data Secret {secret} (spec.userDataSecretRef) not found{detail}: create it in the VirtualMachine's namespace"
            )
        },
    )
}

/// "Provider P: <the cluster's message>" (its reason when it has no message).
fn cluster_message(provider: Option<&str>, cause: &Condition) -> String {
    let detail = if cause.message.is_empty() {
        &cause.reason
    } else {
        &cause.message
    };
    match provider {
        Some(p) => format!("Provider {p}: {detail}"),
        None => detail.clone(),
    }
}

/// The Warning Event to publish after a mirror from `before` to `after`: the new `Ready`
/// reason and message when `Ready` newly became False (or changed reason while False) for a
/// cause someone must look at — a reason that needs a human, or the infra cluster's problem
/// ([`cluster_cause`]). Progress reasons (`Cloning`, `PoweringOn`, …) and deletion make none;
/// the same reason twice makes none, so a reconcile that changes nothing publishes nothing.
pub fn warning(
    before: Option<&VirtualMachineStatus>,
    after: &VirtualMachineStatus,
    input: &MirrorInput<'_>,
) -> Option<(String, String)> {
    if input.deleting {
        return None;
    }
    let now = condition::find(&after.conditions, condition::READY).filter(|c| c.status == "False")?;
    let previous = before.and_then(|s| condition::find(&s.conditions, condition::READY));
    if previous.is_some_and(|p| p.status == now.status && p.reason == now.reason) {
        return None;
    }
    (condition::needs_human(&now.reason) || cluster_cause(input).is_some())
        .then(|| (now.reason.clone(), now.message.clone()))
}

/// Whether the change from `before` to `after` is only provisioning progress, news a user reads
/// just as well a moment later: the VirtualMachine had no status yet or was `Pending` or
/// `Provisioning`, is `Provisioning` now, its `Ready` is False for a reason nobody must act on,
/// no infra cluster problem shows through, and the input is valid and not being deleted. The
/// reconciler holds such a status briefly for the next news ([`crate::controller::PROGRESS_HOLD`]).
pub fn only_progress(
    before: Option<&VirtualMachineStatus>,
    after: &VirtualMachineStatus,
    input: &MirrorInput<'_>,
) -> bool {
    if input.invalid.is_some() || input.deleting || cluster_cause(input).is_some() {
        return false;
    }
    let was_provisioning = before.is_none_or(|b| {
        matches!(
            b.phase,
            None | Some(VirtualMachinePhase::Pending | VirtualMachinePhase::Provisioning)
        )
    });
    let ready = condition::find(&after.conditions, condition::READY);
    was_provisioning
        && after.phase == Some(VirtualMachinePhase::Provisioning)
        && ready.is_some_and(|c| c.status != "True" && !condition::needs_human(&c.reason))
}

/// The Normal Event to publish after a mirror from `before` to `after`: one per lifecycle step
/// a user follows — a new phase (`Provisioning`, `Running`, `Stopped`, `Deleting`), and while
/// provisioning each new step the provider reports (`Ready`'s reason: `Scheduled`, `Cloning`,
/// `PoweringOn`, `WaitingForGuest`, …). None for `Pending` and `Failed` (that is the Warning's),
/// none for a reason that needs a human, none when nothing changed.
pub fn lifecycle(
    before: Option<&VirtualMachineStatus>,
    after: &VirtualMachineStatus,
) -> Option<(String, String)> {
    let phase = after.phase?;
    if matches!(phase, VirtualMachinePhase::Pending | VirtualMachinePhase::Failed) {
        return None;
    }
    let ready = condition::find(&after.conditions, condition::READY);
    if ready.is_some_and(|c| c.status == "False" && condition::needs_human(&c.reason)) {
        return None;
    }
    let step = |s: Option<&VirtualMachineStatus>| {
        let phase = s.and_then(|s| s.phase);
        let reason = match phase {
            Some(VirtualMachinePhase::Provisioning) => s
                .and_then(|s| condition::find(&s.conditions, condition::READY))
                .map(|c| c.reason.clone()),
            _ => None,
        };
        (phase, reason)
    };
    let now = step(Some(after));
    if step(before) == now {
        return None;
    }
    let (reason, note) = match (phase, now.1) {
        (VirtualMachinePhase::Provisioning, Some(reason)) => {
            let message = ready.map(|c| c.message.as_str()).unwrap_or_default();
            let note = if message.is_empty() {
                format!("provisioning: {reason}")
            } else {
                format!("provisioning: {reason}: {message}")
            };
            (reason, note)
        }
        (phase, _) => {
            let name = format!("{phase:?}");
            let note = match phase {
                VirtualMachinePhase::Running => "the VM is provisioned and powered on".to_owned(),
                VirtualMachinePhase::Stopped => "the VM is provisioned and powered off".to_owned(),
                VirtualMachinePhase::Deleting => "deleting the VM".to_owned(),
                _ => format!("phase {name}"),
            };
            (name, note)
        }
    };
    Some((reason, note))
}

/// The `Ready` message while the VirtualMachine is being deleted: the provider's own message
/// once it reports the deletion (its `Ready` is not `True` on a machine being deleted).
fn deletion_message(machine: Option<&MachineView>, infra_ready: Option<&Condition>) -> String {
    match (machine, infra_ready) {
        (None, _) => "the infrastructure machine is gone".to_owned(),
        (Some(m), Some(c)) if m.deleting && c.status != "True" && !c.message.is_empty() => {
            if c.reason == DELETING {
                c.message.clone()
            } else {
                format!("{}: {}", c.reason, c.message)
            }
        }
        (Some(m), _) if m.deleting => {
            "waiting for the provider to delete the infrastructure machine".to_owned()
        }
        (Some(_), _) => "deleting the infrastructure machine".to_owned(),
    }
}

fn parse_status(s: &str) -> ConditionStatus {
    match s {
        "True" => ConditionStatus::True,
        "False" => ConditionStatus::False,
        _ => ConditionStatus::Unknown,
    }
}

#[cfg(test)]
#[path = "mirror_tests.rs"]
mod tests;
