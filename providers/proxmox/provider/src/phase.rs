//! The ProxmoxMachine provisioning state machine.
//!
//! [`Phase`] is the explicit state; it is persisted in `status` (`provisioning.state`,
//! `provisioning.taskId`, `node`, `vmid`) through [`Phase::write`] and rebuilt from it by
//! [`Phase::read`], so that a restarted controller (or one after `clusterctl move`) resumes where
//! the last one stopped. The `Ready` condition's reason is *derived* from the phase
//! ([`Phase::reason`]); reasons are never read back as state.
//!
//! ```text
//! SelectNode → AllocateVmid → Clone → WaitClone → Configure(config, resize, seed) → PowerOn
//!            → WaitGuest → Provisioned
//! ```
//!
//! The configure sub-steps (apply config, grow disks, upload and attach the seed ISO) are not
//! persisted separately: each reconcile compares the VM's real config with the desired one
//! ([`crate::desired`]) and does the next missing thing, which is idempotent and crash-safe.

use banlieue_api::common::{Initialization, ProvisioningState};
use banlieue_api::infrastructure::ProxmoxMachineStatus;
use banlieue_provider_kit::progress;
use banlieue_pve_client::Upid;

/// Where the VM lives once chosen: node and VMID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmLocation {
    /// Proxmox node.
    pub node: String,
    /// VMID.
    pub vmid: u32,
}

/// One state of provisioning. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Choose the node (failure domain from the Machine, else the least-loaded allowed node).
    SelectNode,
    /// Choose a free VMID on the chosen node's cluster.
    AllocateVmid {
        /// The chosen node.
        node: String,
    },
    /// Adopt the VM at the chosen VMID if it is ours, else start the clone.
    Clone(VmLocation),
    /// The clone task runs.
    WaitClone(VmLocation, Upid),
    /// Bring config, disks and the bootstrap seed to the desired state; `Some` while a task of
    /// that step runs.
    Configure(VmLocation, Option<Upid>),
    /// Start the VM; `Some` while the start task runs.
    PowerOn(VmLocation, Option<Upid>),
    /// Wait for the guest to report addresses.
    WaitGuest(VmLocation),
    /// Done: providerID, addresses and `initialization.provisioned` are set.
    Provisioned(VmLocation),
    /// Provisioned, and bringing the VM to a changed spec (power state, CPU, memory, disks;
    /// see [`crate::update`]): `state` is what the task in flight does (`Configuring`,
    /// `PoweringOff` or `PoweringOn`). Persisted with `initialization.provisioned: true`, which
    /// tells it from the provisioning states of the same name.
    Update(VmLocation, ProvisioningState, Option<Upid>),
}

pub use banlieue_provider_kit::machine::InconsistentStatus;

impl Phase {
    /// Rebuilds the phase from a persisted status (`None` = a fresh object).
    pub fn read(status: Option<&ProxmoxMachineStatus>) -> Result<Self, InconsistentStatus> {
        let Some(status) = status else {
            return Ok(Self::SelectNode);
        };
        let provisioning = status.provisioning.as_ref();
        let state = provisioning.map_or(ProvisioningState::Pending, |p| p.state);
        let task = provisioning
            .and_then(|p| p.task_id.as_deref())
            .map(|raw| {
                raw.parse::<Upid>()
                    .map_err(|e| InconsistentStatus(format!("taskId: {e}")))
            })
            .transpose()?;
        let location = status
            .node
            .clone()
            .zip(status.vmid)
            .map(|(node, vmid)| VmLocation { node, vmid });
        let need = |what: &str| InconsistentStatus::without(state, what);
        let located = || location.clone().ok_or_else(|| need("node and vmid"));
        let provisioned = Initialization::is_provisioned(status.initialization.as_ref());
        if provisioned
            && matches!(
                state,
                ProvisioningState::Configuring
                    | ProvisioningState::PoweringOn
                    | ProvisioningState::PoweringOff
            )
        {
            return Ok(Self::Update(located()?, state, task));
        }
        Ok(match state {
            ProvisioningState::Pending => match (&status.node, location) {
                (None, _) => Self::SelectNode,
                (Some(node), None) => Self::AllocateVmid { node: node.clone() },
                (Some(_), Some(loc)) => Self::Clone(loc),
            },
            ProvisioningState::Cloning => {
                let loc = located()?;
                match task {
                    Some(task) => Self::WaitClone(loc, task),
                    // The clone's UPID was lost: look again and adopt.
                    None => Self::Clone(loc),
                }
            }
            ProvisioningState::Configuring => Self::Configure(located()?, task),
            ProvisioningState::PoweringOn => Self::PowerOn(located()?, task),
            ProvisioningState::WaitingForGuest => Self::WaitGuest(located()?),
            ProvisioningState::Ready => Self::Provisioned(located()?),
            other => {
                return Err(InconsistentStatus::not_provisioning(other));
            }
        })
    }

    /// Persists the phase into `status` (node, vmid, provisioning state and task); other fields
    /// are left alone.
    pub fn write(&self, status: &mut ProxmoxMachineStatus) {
        let (state, location, task, node) = match self {
            Self::SelectNode => (ProvisioningState::Pending, None, None, None),
            Self::AllocateVmid { node } => (ProvisioningState::Pending, None, None, Some(node.as_str())),
            Self::Clone(l) => (ProvisioningState::Pending, Some(l), None, None),
            Self::WaitClone(l, t) => (ProvisioningState::Cloning, Some(l), Some(t), None),
            Self::Configure(l, t) => (ProvisioningState::Configuring, Some(l), t.as_ref(), None),
            Self::PowerOn(l, t) => (ProvisioningState::PoweringOn, Some(l), t.as_ref(), None),
            Self::WaitGuest(l) => (ProvisioningState::WaitingForGuest, Some(l), None, None),
            Self::Provisioned(l) => (ProvisioningState::Ready, Some(l), None, None),
            Self::Update(l, state, t) => (*state, Some(l), t.as_ref(), None),
        };
        status.node = location.map(|l| l.node.clone()).or(node.map(str::to_owned));
        status.vmid = location.map(|l| l.vmid);
        let task_id = task.map(|t| t.to_string());
        status.provisioning = Some(progress::provisioning(status.provisioning.take(), state, task_id));
    }

    /// The VM's location, once known.
    pub fn location(&self) -> Option<&VmLocation> {
        match self {
            Self::SelectNode | Self::AllocateVmid { .. } => None,
            Self::Clone(l)
            | Self::WaitClone(l, _)
            | Self::Configure(l, _)
            | Self::PowerOn(l, _)
            | Self::WaitGuest(l)
            | Self::Provisioned(l)
            | Self::Update(l, ..) => Some(l),
        }
    }

    /// The task the phase waits on, if any.
    pub fn task(&self) -> Option<&Upid> {
        match self {
            Self::WaitClone(_, task) => Some(task),
            Self::Configure(_, task) | Self::PowerOn(_, task) | Self::Update(_, _, task) => task.as_ref(),
            Self::SelectNode
            | Self::AllocateVmid { .. }
            | Self::Clone(_)
            | Self::WaitGuest(_)
            | Self::Provisioned(_) => None,
        }
    }

    /// Whether the VM is provisioned (CAPI has what it needs; day-2 work may continue).
    pub fn is_provisioned(&self) -> bool {
        matches!(self, Self::Provisioned(_) | Self::Update(..))
    }

    /// The `Ready` condition reason while in this phase (CamelCase, stable).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SelectNode => "SelectingNode",
            Self::AllocateVmid { .. } => "AllocatingVMID",
            Self::Clone(_) | Self::WaitClone(..) => "Cloning",
            Self::Configure(..) => "Configuring",
            Self::PowerOn(..) => "PoweringOn",
            Self::WaitGuest(_) => "WaitingForGuest",
            Self::Provisioned(_) | Self::Update(..) => "Provisioned",
        }
    }

    /// The reason used when this phase fails (e.g. `CloningFailed`).
    pub fn failure_reason(&self) -> &'static str {
        match self {
            Self::SelectNode => "NodeSelectionFailed",
            Self::AllocateVmid { .. } => "VMIDAllocationFailed",
            Self::Clone(_) | Self::WaitClone(..) => "CloningFailed",
            Self::Configure(..) => "ConfigurationFailed",
            Self::PowerOn(..) => "PowerOnFailed",
            Self::WaitGuest(_) => "GuestNotReady",
            Self::Provisioned(_) => "ProvisionedVMFailed",
            Self::Update(..) => "UpdateFailed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::ProvisioningStatus;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    const UPID: &str = "UPID:pve1:00000001:00000002:00000003:qmclone:9000:root@pam:";

    fn loc() -> VmLocation {
        VmLocation {
            node: "pve2".into(),
            vmid: 104,
        }
    }

    fn upid() -> Upid {
        UPID.parse().unwrap()
    }

    #[rstest]
    #[case::select(Phase::SelectNode)]
    #[case::allocate(Phase::AllocateVmid { node: "pve3".into() })]
    #[case::clone(Phase::Clone(loc()))]
    #[case::wait_clone(Phase::WaitClone(loc(), upid()))]
    #[case::configure(Phase::Configure(loc(), None))]
    #[case::configure_task(Phase::Configure(loc(), Some(upid())))]
    #[case::power_on(Phase::PowerOn(loc(), Some(upid())))]
    #[case::power_on_idle(Phase::PowerOn(loc(), None))]
    #[case::wait_guest(Phase::WaitGuest(loc()))]
    #[case::provisioned(Phase::Provisioned(loc()))]
    fn every_phase_round_trips_through_status(#[case] phase: Phase) {
        let mut status = ProxmoxMachineStatus::default();
        phase.write(&mut status);
        assert_eq!(Phase::read(Some(&status)).unwrap(), phase);
        // and through JSON, as the apiserver stores it
        let json = serde_json::to_value(&status).unwrap();
        let back: ProxmoxMachineStatus = serde_json::from_value(json).unwrap();
        assert_eq!(Phase::read(Some(&back)).unwrap(), phase);
    }

    #[rstest]
    #[case::configuring(ProvisioningState::Configuring, Some(upid()))]
    #[case::powering_off(ProvisioningState::PoweringOff, Some(upid()))]
    #[case::powering_on(ProvisioningState::PoweringOn, None)]
    fn update_phases_round_trip_on_a_provisioned_machine(
        #[case] state: ProvisioningState,
        #[case] task: Option<Upid>,
    ) {
        let phase = Phase::Update(loc(), state, task);
        let mut status = ProxmoxMachineStatus {
            initialization: banlieue_api::common::Initialization::provisioned(true),
            ..ProxmoxMachineStatus::default()
        };
        phase.write(&mut status);
        assert_eq!(Phase::read(Some(&status)).unwrap(), phase);
        assert!(phase.is_provisioned());
        // The same state without `provisioned` is a provisioning step, not an update.
        status.initialization = None;
        assert!(!matches!(Phase::read(Some(&status)), Ok(Phase::Update(..))));
    }

    #[test]
    fn a_fresh_object_starts_by_selecting_a_node() {
        assert_eq!(Phase::read(None).unwrap(), Phase::SelectNode);
        assert_eq!(
            Phase::read(Some(&ProxmoxMachineStatus::default())).unwrap(),
            Phase::SelectNode
        );
    }

    #[test]
    fn cloning_without_a_task_goes_back_to_adoption() {
        let mut status = ProxmoxMachineStatus::default();
        Phase::WaitClone(loc(), upid()).write(&mut status);
        status.provisioning.as_mut().unwrap().task_id = None;
        assert_eq!(Phase::read(Some(&status)).unwrap(), Phase::Clone(loc()));
    }

    #[rstest]
    #[case::bad_upid(ProvisioningState::Cloning, Some("not-a-upid"), true)]
    #[case::configuring_without_vm(ProvisioningState::Configuring, None, false)]
    #[case::deleting_is_not_provisioning(ProvisioningState::Deleting, None, true)]
    fn inconsistent_status_is_an_error(
        #[case] state: ProvisioningState,
        #[case] task: Option<&str>,
        #[case] with_vm: bool,
    ) {
        let status = ProxmoxMachineStatus {
            node: with_vm.then(|| "pve1".to_owned()),
            vmid: with_vm.then_some(100),
            provisioning: Some(ProvisioningStatus {
                state,
                task_id: task.map(str::to_owned),
                ..ProvisioningStatus::default()
            }),
            ..ProxmoxMachineStatus::default()
        };
        assert!(Phase::read(Some(&status)).is_err());
    }

    #[test]
    fn writing_clears_the_task_and_keeps_other_fields() {
        let mut status = ProxmoxMachineStatus {
            failure_domain: Some("pve2".into()),
            ..ProxmoxMachineStatus::default()
        };
        Phase::WaitClone(loc(), upid()).write(&mut status);
        assert_eq!(
            status.provisioning.as_ref().unwrap().task_id.as_deref(),
            Some(UPID)
        );
        Phase::Configure(loc(), None).write(&mut status);
        assert_eq!(status.provisioning.as_ref().unwrap().task_id, None);
        assert_eq!(status.failure_domain.as_deref(), Some("pve2"));
        assert_eq!((status.node.as_deref(), status.vmid), (Some("pve2"), Some(104)));
    }

    #[test]
    fn reasons_are_valid_condition_reasons_and_distinct_from_failures() {
        let re = regex_lite(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$");
        for phase in [
            Phase::SelectNode,
            Phase::AllocateVmid { node: "n".into() },
            Phase::Clone(loc()),
            Phase::Configure(loc(), None),
            Phase::PowerOn(loc(), None),
            Phase::WaitGuest(loc()),
            Phase::Provisioned(loc()),
        ] {
            assert!(re(phase.reason()), "{}", phase.reason());
            assert!(re(phase.failure_reason()), "{}", phase.failure_reason());
            assert_ne!(phase.reason(), phase.failure_reason());
        }
    }

    /// A tiny matcher for the condition-reason pattern (avoids a regex dependency).
    fn regex_lite(_: &str) -> impl Fn(&str) -> bool {
        |s: &str| {
            let mut chars = s.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
                && !s.ends_with([',', ':'])
        }
    }
}
