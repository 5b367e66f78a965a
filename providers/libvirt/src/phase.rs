//! The LibvirtMachine provisioning state machine, persisted in `status` (`provisioning.state`,
//! `node` = the host / failure domain, `domainUUID`) so a restarted controller resumes where
//! the last one stopped. The `Ready` condition's reason is derived from the phase.
//!
//! ```text
//! SelectHost → Volumes(host) → Define(host) → PowerOn(host, uuid) → WaitGuest(host, uuid)
//!            → Provisioned(host, uuid)
//! ```
//!
//! Every step is idempotent (it looks before it creates), so a crash between a libvirt side
//! effect and the status write only repeats a look-up.

use banlieue_api::common::ProvisioningState;
use banlieue_api::infrastructure::LibvirtMachineStatus;
use banlieue_provider_kit::progress;

/// One state of provisioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Choose the host (the owner's failure domain, else the reachable host with the most free
    /// memory).
    SelectHost,
    /// Create the disk volumes (overlay on the base volume) and the seed volume.
    Volumes {
        /// Chosen host.
        host: String,
    },
    /// Define the domain (or adopt ours).
    Define {
        /// Chosen host.
        host: String,
    },
    /// Start the domain.
    PowerOn {
        /// Host.
        host: String,
        /// Domain uuid.
        uuid: String,
    },
    /// Wait for a DHCP lease.
    WaitGuest {
        /// Host.
        host: String,
        /// Domain uuid.
        uuid: String,
    },
    /// Done.
    Provisioned {
        /// Host.
        host: String,
        /// Domain uuid.
        uuid: String,
    },
}

pub use banlieue_provider_kit::machine::InconsistentStatus;

impl Phase {
    /// Rebuilds the phase from a persisted status.
    pub fn read(status: Option<&LibvirtMachineStatus>) -> Result<Self, InconsistentStatus> {
        let Some(status) = status else {
            return Ok(Self::SelectHost);
        };
        let state = status
            .provisioning
            .as_ref()
            .map_or(ProvisioningState::Pending, |p| p.state);
        let host = status.node.clone();
        let uuid = status.domain_uuid.clone();
        let need = |what: &str| InconsistentStatus::without(state, what);
        let both = || -> Result<(String, String), InconsistentStatus> {
            Ok((
                host.clone().ok_or_else(|| need("node"))?,
                uuid.clone().ok_or_else(|| need("domainUUID"))?,
            ))
        };
        Ok(match state {
            ProvisioningState::Pending => match host {
                None => Self::SelectHost,
                Some(host) => Self::Volumes { host },
            },
            ProvisioningState::Cloning => Self::Volumes {
                host: host.ok_or_else(|| need("node"))?,
            },
            ProvisioningState::Configuring => Self::Define {
                host: host.ok_or_else(|| need("node"))?,
            },
            ProvisioningState::PoweringOn => {
                let (host, uuid) = both()?;
                Self::PowerOn { host, uuid }
            }
            ProvisioningState::WaitingForGuest => {
                let (host, uuid) = both()?;
                Self::WaitGuest { host, uuid }
            }
            ProvisioningState::Ready => {
                let (host, uuid) = both()?;
                Self::Provisioned { host, uuid }
            }
            other => {
                return Err(InconsistentStatus::not_provisioning(other));
            }
        })
    }

    /// Persists the phase into `status` (node, domainUUID, provisioning state); the message is
    /// cleared, other fields are left alone.
    pub fn write(&self, status: &mut LibvirtMachineStatus) {
        let state = match self {
            Self::SelectHost => ProvisioningState::Pending,
            Self::Volumes { .. } => ProvisioningState::Cloning,
            Self::Define { .. } => ProvisioningState::Configuring,
            Self::PowerOn { .. } => ProvisioningState::PoweringOn,
            Self::WaitGuest { .. } => ProvisioningState::WaitingForGuest,
            Self::Provisioned { .. } => ProvisioningState::Ready,
        };
        status.node = self.host().map(str::to_owned);
        if let Some(uuid) = self.uuid() {
            status.domain_uuid = Some(uuid.to_owned());
        }
        status.provisioning = Some(progress::provisioning(None, state, None));
    }

    /// The chosen host, once known.
    pub fn host(&self) -> Option<&str> {
        match self {
            Self::SelectHost => None,
            Self::Volumes { host } | Self::Define { host } => Some(host),
            Self::PowerOn { host, .. } | Self::WaitGuest { host, .. } | Self::Provisioned { host, .. } => {
                Some(host)
            }
        }
    }

    /// The domain uuid, once defined.
    pub fn uuid(&self) -> Option<&str> {
        match self {
            Self::PowerOn { uuid, .. } | Self::WaitGuest { uuid, .. } | Self::Provisioned { uuid, .. } => {
                Some(uuid)
            }
            _ => None,
        }
    }

    /// Whether provisioning from this phase needs the bootstrap data (to build the seed).
    pub fn needs_bootstrap_data(&self) -> bool {
        matches!(self, Self::SelectHost | Self::Volumes { .. })
    }

    /// `Ready` condition reason while in this phase.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SelectHost => "SelectingHost",
            Self::Volumes { .. } => "CreatingVolumes",
            Self::Define { .. } => "DefiningDomain",
            Self::PowerOn { .. } => "PoweringOn",
            Self::WaitGuest { .. } => "WaitingForGuest",
            Self::Provisioned { .. } => "Provisioned",
        }
    }

    /// Reason when this phase fails.
    pub fn failure_reason(&self) -> &'static str {
        match self {
            Self::SelectHost => "HostSelectionFailed",
            Self::Volumes { .. } => "VolumeCreationFailed",
            Self::Define { .. } => "DomainDefinitionFailed",
            Self::PowerOn { .. } => "PowerOnFailed",
            Self::WaitGuest { .. } => "GuestNotReady",
            Self::Provisioned { .. } => "ProvisionedDomainFailed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::ProvisioningStatus;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    fn h() -> String {
        "host-a".into()
    }
    fn u() -> String {
        "0b5a8f1e-8a57-4d6c-9a38-9b4e3c1f6a10".into()
    }

    #[rstest]
    #[case::select(Phase::SelectHost)]
    #[case::volumes(Phase::Volumes { host: h() })]
    #[case::define(Phase::Define { host: h() })]
    #[case::power_on(Phase::PowerOn { host: h(), uuid: u() })]
    #[case::wait(Phase::WaitGuest { host: h(), uuid: u() })]
    #[case::done(Phase::Provisioned { host: h(), uuid: u() })]
    fn every_phase_round_trips_through_status_and_json(#[case] phase: Phase) {
        let mut status = LibvirtMachineStatus::default();
        phase.write(&mut status);
        assert_eq!(Phase::read(Some(&status)).unwrap(), phase);
        let back: LibvirtMachineStatus =
            serde_json::from_value(serde_json::to_value(&status).unwrap()).unwrap();
        assert_eq!(Phase::read(Some(&back)).unwrap(), phase);
    }

    #[test]
    fn fresh_objects_select_a_host() {
        assert_eq!(Phase::read(None).unwrap(), Phase::SelectHost);
        assert_eq!(
            Phase::read(Some(&LibvirtMachineStatus::default())).unwrap(),
            Phase::SelectHost
        );
    }

    #[rstest]
    #[case::ready_without_uuid(ProvisioningState::Ready, Some("h"), None)]
    #[case::define_without_host(ProvisioningState::Configuring, None, None)]
    #[case::deleting(ProvisioningState::Deleting, Some("h"), Some("u"))]
    fn inconsistent_status_is_an_error(
        #[case] state: ProvisioningState,
        #[case] node: Option<&str>,
        #[case] uuid: Option<&str>,
    ) {
        let status = LibvirtMachineStatus {
            node: node.map(str::to_owned),
            domain_uuid: uuid.map(str::to_owned),
            provisioning: Some(ProvisioningStatus {
                state,
                ..ProvisioningStatus::default()
            }),
            ..LibvirtMachineStatus::default()
        };
        assert!(Phase::read(Some(&status)).is_err());
    }

    #[test]
    fn reasons_differ_from_failure_reasons() {
        for p in [
            Phase::SelectHost,
            Phase::Volumes { host: h() },
            Phase::Define { host: h() },
            Phase::PowerOn { host: h(), uuid: u() },
            Phase::WaitGuest { host: h(), uuid: u() },
            Phase::Provisioned { host: h(), uuid: u() },
        ] {
            assert_ne!(p.reason(), p.failure_reason());
            assert!(p.reason().chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }
}
