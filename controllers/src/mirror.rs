//! Pure status mirror: an infrastructure machine's contract fields → the VirtualMachine's
//! status.
//!
//! The machine is read through [`MachineView`], the part of the CAPI InfraMachine contract
//! (plus banlieue's `node`, `powerState` and `provisioning`) that every registered kind
//! shares, so one mirror serves every backend.

use banlieue_api::banlieue::{VirtualMachinePhase, VirtualMachineStatus};
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

/// Everything the mirror needs besides the current status.
#[derive(Clone, Debug, Default)]
pub struct MirrorInput<'a> {
    /// The VirtualMachine's `metadata.generation`.
    pub generation: Option<i64>,
    /// The VirtualMachine has a deletion timestamp.
    pub deleting: bool,
    /// The chosen Provider, if any.
    pub provider: Option<&'a str>,
    /// The infrastructure machine the VirtualMachine drives, once known.
    pub infrastructure_ref: Option<ContractReference>,
    /// The infrastructure machine, if it exists.
    pub machine: Option<&'a MachineView>,
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
            (Some(_), Some(c)) => set(condition::READY, parse_status(&c.status), &c.reason, &c.message),
            (Some(_), None) => set(
                condition::READY,
                ConditionStatus::False,
                &prov_reason,
                &prov_message,
            ),
        }
    }

    status.phase = Some(if input.deleting {
        VirtualMachinePhase::Deleting
    } else if provisioning.is_some_and(|p| p.state == ProvisioningState::Failed) {
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
    status.infrastructure_ref = input.infrastructure_ref.clone().or(status.infrastructure_ref);
    status.provider_id = machine.and_then(|m| m.spec.provider_id.clone());
    status.addresses = machine.map(|m| m.status.addresses.clone()).unwrap_or_default();
    status.power_state = machine.and_then(|m| m.status.power_state);
    status.node = machine.and_then(|m| m.status.node.clone());
    status.failure_domain = machine.and_then(|m| m.status.failure_domain.clone());
    status
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
