//! The VSphereMachine provisioning state machine, persisted in `status` (`provisioning.state`,
//! `provisioning.taskId`, `vmRef`) so that a restarted controller resumes where the last one
//! stopped. The `Ready` condition's reason is derived from the phase, never read back.
//!
//! ```text
//! Clone → WaitClone(task) → Configure(vm, task?) → PowerOn(vm, task?) → WaitGuest(vm) → Provisioned(vm, task?)
//!                                                                                  ⇅
//!                                                                   ShuttingDown(vm, since)
//! ```

use banlieue_api::common::{ProvisioningState, ProvisioningStatus};
use banlieue_api::infrastructure::VSphereMachineStatus;
use banlieue_provider_kit::{power, progress};
use banlieue_vsphere_client::MoRef;
use k8s_openapi::jiff::Timestamp;

/// One provisioning state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Adopt a VM carrying our owner UID, else start the clone.
    Clone,
    /// The clone task runs.
    WaitClone(MoRef),
    /// Bring CPU, memory, disks and NICs to the spec ([`crate::update`]); `Some` while a
    /// reconfigure (or power-off) task runs.
    Configure(MoRef, Option<MoRef>),
    /// Power on; `Some` while the task runs.
    PowerOn(MoRef, Option<MoRef>),
    /// Wait for VMware Tools to report an IP.
    WaitGuest(MoRef),
    /// Done; drift is corrected here (`Some` while a reconfigure or power task runs).
    Provisioned(MoRef, Option<MoRef>),
    /// Provisioned, the guest asked to shut down (VMware Tools) at that time: waiting for it
    /// to power off, powered off hard once it ignored the request too long (the kit's
    /// [`banlieue_provider_kit::power`]).
    ShuttingDown(MoRef, Timestamp),
}

pub use banlieue_provider_kit::machine::InconsistentStatus;

/// A VM reference from `status.vmRef`.
pub fn vm_ref(value: &str) -> MoRef {
    MoRef::new("VirtualMachine", value)
}

/// A task reference from `status.provisioning.taskId`.
pub fn task_ref(value: &str) -> MoRef {
    MoRef::new("Task", value)
}

impl Phase {
    /// Rebuilds the phase from a persisted status.
    pub fn read(status: Option<&VSphereMachineStatus>) -> Result<Self, InconsistentStatus> {
        let Some(status) = status else {
            return Ok(Self::Clone);
        };
        let prov = status.provisioning.as_ref();
        let state = prov.map_or(ProvisioningState::Pending, |p| p.state);
        let task = prov.and_then(|p| p.task_id.as_deref()).map(task_ref);
        let vm = status.vm_ref.as_deref().map(vm_ref);
        let need_vm = || {
            vm.clone()
                .ok_or_else(|| InconsistentStatus::without(state, "vmRef"))
        };
        Ok(match state {
            ProvisioningState::Pending => Self::Clone,
            ProvisioningState::Cloning => match task {
                Some(t) => Self::WaitClone(t),
                None => Self::Clone,
            },
            ProvisioningState::Configuring => Self::Configure(need_vm()?, task),
            ProvisioningState::PoweringOn => Self::PowerOn(need_vm()?, task),
            ProvisioningState::WaitingForGuest => Self::WaitGuest(need_vm()?),
            ProvisioningState::Ready => Self::Provisioned(need_vm()?, task),
            ProvisioningState::PoweringOff => Self::ShuttingDown(
                need_vm()?,
                power::shutdown_requested_at(prov)
                    .ok_or_else(|| InconsistentStatus::without(state, "the shutdown's time"))?,
            ),
            other => {
                return Err(InconsistentStatus::not_provisioning(other));
            }
        })
    }

    /// Persists the phase into `status` (vmRef, state, task); other fields are left alone.
    pub fn write(&self, status: &mut VSphereMachineStatus) {
        let (state, vm, task) = match self {
            Self::Clone => (ProvisioningState::Pending, None, None),
            Self::WaitClone(t) => (ProvisioningState::Cloning, None, Some(t)),
            Self::Configure(v, t) => (ProvisioningState::Configuring, Some(v), t.as_ref()),
            Self::PowerOn(v, t) => (ProvisioningState::PoweringOn, Some(v), t.as_ref()),
            Self::WaitGuest(v) => (ProvisioningState::WaitingForGuest, Some(v), None),
            Self::Provisioned(v, t) => (ProvisioningState::Ready, Some(v), t.as_ref()),
            Self::ShuttingDown(v, since) => {
                status.vm_ref = Some(v.value.clone());
                let mut provisioning = ProvisioningStatus {
                    state: ProvisioningState::PoweringOff,
                    ..ProvisioningStatus::default()
                };
                power::record_shutdown(&mut provisioning, Some(*since));
                status.provisioning = Some(provisioning);
                return;
            }
        };
        status.vm_ref = vm.map(|v| v.value.clone());
        let task_id = task.map(|t| t.value.clone());
        status.provisioning = Some(progress::provisioning(status.provisioning.take(), state, task_id));
    }

    /// Whether the VM is provisioned (shutting down for a day-2 change included).
    pub fn is_provisioned(&self) -> bool {
        matches!(self, Self::Provisioned(..) | Self::ShuttingDown(..))
    }

    /// The task the phase waits on, if any.
    pub fn task(&self) -> Option<&MoRef> {
        match self {
            Self::WaitClone(task) => Some(task),
            Self::Configure(_, task) | Self::PowerOn(_, task) | Self::Provisioned(_, task) => task.as_ref(),
            Self::Clone | Self::WaitGuest(_) | Self::ShuttingDown(..) => None,
        }
    }

    /// The `Ready` condition reason while in this phase.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Clone => "Pending",
            Self::WaitClone(_) => "Cloning",
            Self::Configure(..) => "Configuring",
            Self::PowerOn(..) => "PoweringOn",
            Self::WaitGuest(_) => "WaitingForGuest",
            Self::Provisioned(..) | Self::ShuttingDown(..) => "Provisioned",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_round_trips_through_status() {
        let vm = vm_ref("vm-42");
        let t = task_ref("task-7");
        for phase in [
            Phase::Clone,
            Phase::WaitClone(t.clone()),
            Phase::Configure(vm.clone(), None),
            Phase::Configure(vm.clone(), Some(t.clone())),
            Phase::PowerOn(vm.clone(), Some(t.clone())),
            Phase::WaitGuest(vm.clone()),
            Phase::Provisioned(vm.clone(), None),
            Phase::Provisioned(vm.clone(), Some(t.clone())),
            Phase::ShuttingDown(vm.clone(), "2026-12-04T10:00:00Z".parse().unwrap()),
        ] {
            let mut status = VSphereMachineStatus::default();
            phase.write(&mut status);
            assert_eq!(Phase::read(Some(&status)).unwrap(), phase);
        }
    }

    #[test]
    fn a_lost_clone_task_falls_back_to_adoption_and_bad_status_is_reported() {
        let mut status = VSphereMachineStatus::default();
        Phase::WaitClone(task_ref("task-1")).write(&mut status);
        status.provisioning.as_mut().unwrap().task_id = None;
        assert_eq!(Phase::read(Some(&status)).unwrap(), Phase::Clone);
        let mut status = VSphereMachineStatus::default();
        Phase::WaitGuest(vm_ref("vm-1")).write(&mut status);
        status.vm_ref = None;
        assert!(Phase::read(Some(&status)).is_err());
        // A pending shutdown without its time cannot be resumed (the timeout would restart).
        let mut status = VSphereMachineStatus::default();
        Phase::ShuttingDown(vm_ref("vm-1"), "2026-12-04T10:00:00Z".parse().unwrap()).write(&mut status);
        status.provisioning.as_mut().unwrap().task_started_at = None;
        assert!(Phase::read(Some(&status)).is_err());
    }
}
