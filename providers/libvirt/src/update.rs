//! After provisioning: keeping a domain in line with its LibvirtMachine — CPU topology, memory
//! and `spec.powerState` — without ever re-cloning it. Pure: [`next_action`] decides the next
//! single step from the spec and what libvirt reports; [`crate::provision`] performs it.
//!
//! Semantics (the same as the Proxmox provider's cold changes):
//! - **CPU (sockets, cores) and memory** are applied to a shut-off domain: with
//!   `spec.restartPolicy: Automatic` a running domain is shut down by ACPI (`virDomainShutdown`),
//!   then redefined from the regenerated XML (same name, uuid, volumes and MACs: the disks are
//!   untouched), then started again when `spec.powerState` is `On`. With `Manual` (the default)
//!   a running domain is left running: `VMUpToDate` says `RestartRequired` until its user
//!   powers it off.
//! - **Power**: `Off` shuts the domain down by ACPI; `On` starts a shut-off or crashed domain.
//! - A guest that ignores ACPI for [`SHUTDOWN_TIMEOUT`] after the first request is powered off
//!   hard (`virDomainDestroy`, a `PoweredOffForcibly` event), like Proxmox's `forceStop`. The
//!   time of the first request is persisted in `status.provisioning` by the kit's
//!   [`banlieue_provider_kit::power`] so a restarted controller keeps counting.

use banlieue_api::common::{PowerState, RestartPolicy};
use banlieue_api::infrastructure::LibvirtMachineSpec;

use crate::hypervisor::RunState;
use crate::xml::Sizing;

/// How long a guest may ignore the ACPI shutdown before it is powered off hard (the kit's, the
/// same on every hypervisor).
pub use banlieue_provider_kit::power::SHUTDOWN_TIMEOUT;

/// The next step to bring a provisioned domain to its spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateAction {
    /// Ask the guest to shut down (ACPI); `why` says what for.
    Shutdown {
        /// Human-readable cause.
        why: String,
    },
    /// The guest is shutting down: wait.
    WaitShutdown {
        /// Human-readable cause.
        why: String,
    },
    /// The guest ignored the ACPI shutdown for [`SHUTDOWN_TIMEOUT`]: power it off hard.
    PowerCut {
        /// Human-readable cause.
        why: String,
    },
    /// Redefine the (shut-off) domain from the spec, then start it if `start`.
    Redefine {
        /// What changes.
        why: String,
        /// Start it afterwards (`spec.powerState` On).
        start: bool,
    },
    /// Start the domain.
    Start,
    /// The running domain needs a restart that `spec.restartPolicy` (`Manual`) leaves to its
    /// user: `why` says which changes wait.
    RestartRequired {
        /// The waiting changes, and how to apply them.
        why: String,
    },
    /// The domain matches the spec.
    InSync,
}

/// The sizing a spec asks for, normalised like the generated XML (at least one socket/core).
pub fn desired_sizing(spec: &LibvirtMachineSpec) -> Sizing {
    Sizing {
        sockets: spec.cpu.sockets.unwrap_or(1).max(1),
        cores: spec.cpu.cores.max(1),
        memory_mib: spec.memory_mib,
    }
}

/// What differs, for messages and events (`cores 2→4, memory 512→1024 MiB`); empty when in
/// sync.
pub fn changes(want: &Sizing, have: &Sizing) -> Vec<String> {
    let mut out = Vec::new();
    if want.sockets != have.sockets {
        out.push(format!("sockets {}→{}", have.sockets, want.sockets));
    }
    if want.cores != have.cores {
        out.push(format!("cores {}→{}", have.cores, want.cores));
    }
    if want.memory_mib != have.memory_mib {
        out.push(format!("memory {}→{} MiB", have.memory_mib, want.memory_mib));
    }
    out
}

/// Decides the next step for a provisioned domain. `have` is `None` when libvirt's XML could
/// not be read (then only the power state is reconciled). `overdue`: the pending ACPI shutdown
/// was ignored for [`SHUTDOWN_TIMEOUT`] ([`banlieue_provider_kit::power::shutdown_overdue`]). A
/// running domain is shut down for a CPU or memory change only under `restart: Automatic`.
pub fn next_action(
    want: &Sizing,
    have: Option<&Sizing>,
    state: RunState,
    power: PowerState,
    restart: RestartPolicy,
    overdue: bool,
) -> UpdateAction {
    match decide(want, have, state, power, restart) {
        UpdateAction::Shutdown { why } | UpdateAction::WaitShutdown { why } if overdue => {
            UpdateAction::PowerCut {
                why: format!(
                    "the guest ignored the ACPI shutdown for {}s ({why})",
                    SHUTDOWN_TIMEOUT.as_secs()
                ),
            }
        }
        other => other,
    }
}

fn decide(
    want: &Sizing,
    have: Option<&Sizing>,
    state: RunState,
    power: PowerState,
    restart: RestartPolicy,
) -> UpdateAction {
    let diff = have.map(|h| changes(want, h)).unwrap_or_default();
    let off = matches!(state, RunState::ShutOff | RunState::Crashed);
    if !diff.is_empty()
        && state == RunState::Running
        && power == PowerState::On
        && restart == RestartPolicy::Manual
    {
        return UpdateAction::RestartRequired {
            why: banlieue_provider_kit::power::restart_required_message(&diff.join(", ")),
        };
    }
    if !diff.is_empty() {
        let why = format!(
            "to apply {} (CPU and memory changes need the domain off)",
            diff.join(", ")
        );
        return match state {
            RunState::Running => UpdateAction::Shutdown { why },
            RunState::ShuttingDown => UpdateAction::WaitShutdown { why },
            RunState::ShutOff | RunState::Crashed => UpdateAction::Redefine {
                why: diff.join(", "),
                start: power == PowerState::On,
            },
        };
    }
    match (power, state) {
        (PowerState::Off, RunState::Running) => UpdateAction::Shutdown {
            why: "spec.powerState is Off".into(),
        },
        (_, RunState::ShuttingDown) => UpdateAction::WaitShutdown {
            why: "the guest is shutting down".into(),
        },
        (PowerState::On, _) if off => UpdateAction::Start,
        _ => UpdateAction::InSync,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    const SMALL: Sizing = Sizing {
        sockets: 1,
        cores: 2,
        memory_mib: 512,
    };
    const BIG: Sizing = Sizing {
        sockets: 1,
        cores: 4,
        memory_mib: 1024,
    };

    fn kind(a: &UpdateAction) -> &'static str {
        match a {
            UpdateAction::Shutdown { .. } => "shutdown",
            UpdateAction::WaitShutdown { .. } => "wait",
            UpdateAction::PowerCut { .. } => "power-cut",
            UpdateAction::Redefine { start: true, .. } => "redefine+start",
            UpdateAction::Redefine { start: false, .. } => "redefine",
            UpdateAction::Start => "start",
            UpdateAction::RestartRequired { .. } => "restart-required",
            UpdateAction::InSync => "in-sync",
        }
    }

    #[rstest]
    // Cold change: off first, then redefine, then start (On) or stay off (Off).
    #[case(BIG, RunState::Running, PowerState::On, "shutdown")]
    #[case(BIG, RunState::ShuttingDown, PowerState::On, "wait")]
    #[case(BIG, RunState::ShutOff, PowerState::On, "redefine+start")]
    #[case(BIG, RunState::Crashed, PowerState::On, "redefine+start")]
    #[case(BIG, RunState::ShutOff, PowerState::Off, "redefine")]
    #[case(BIG, RunState::Running, PowerState::Off, "shutdown")]
    // Power only.
    #[case(SMALL, RunState::Running, PowerState::On, "in-sync")]
    #[case(SMALL, RunState::Running, PowerState::Off, "shutdown")]
    #[case(SMALL, RunState::ShuttingDown, PowerState::Off, "wait")]
    #[case(SMALL, RunState::ShutOff, PowerState::Off, "in-sync")]
    #[case(SMALL, RunState::ShutOff, PowerState::On, "start")]
    #[case(SMALL, RunState::Crashed, PowerState::On, "start")]
    fn next_action_table(
        #[case] want: Sizing,
        #[case] state: RunState,
        #[case] power: PowerState,
        #[case] expected: &str,
    ) {
        assert_eq!(
            kind(&next_action(
                &want,
                Some(&SMALL),
                state,
                power,
                RestartPolicy::Automatic,
                false
            )),
            expected
        );
    }

    /// No surprise reboots: under `Manual` a running domain is not shut down for a CPU or memory
    /// change; the user's power-off (or a domain already off) applies it.
    #[rstest]
    #[case(RunState::Running, PowerState::On, "restart-required")]
    #[case(RunState::Running, PowerState::Off, "shutdown")]
    #[case(RunState::ShuttingDown, PowerState::Off, "wait")]
    #[case(RunState::ShutOff, PowerState::Off, "redefine")]
    #[case(RunState::ShutOff, PowerState::On, "redefine+start")]
    fn under_the_manual_policy_a_running_domain_waits_for_its_user(
        #[case] state: RunState,
        #[case] power: PowerState,
        #[case] expected: &str,
    ) {
        let got = next_action(&BIG, Some(&SMALL), state, power, RestartPolicy::Manual, false);
        assert_eq!(kind(&got), expected, "{got:?}");
        if let UpdateAction::RestartRequired { why } = got {
            assert!(
                why.contains("cores 2→4") && why.contains("spec.restartPolicy: Automatic"),
                "{why}"
            );
        }
    }

    #[test]
    fn unreadable_sizing_reconciles_power_only() {
        assert_eq!(
            next_action(
                &BIG,
                None,
                RunState::Running,
                PowerState::On,
                RestartPolicy::Manual,
                false
            ),
            UpdateAction::InSync
        );
        assert_eq!(
            next_action(
                &BIG,
                None,
                RunState::ShutOff,
                PowerState::On,
                RestartPolicy::Manual,
                false
            ),
            UpdateAction::Start
        );
    }

    #[test]
    fn messages_say_what_changes() {
        assert_eq!(changes(&BIG, &SMALL), vec!["cores 2→4", "memory 512→1024 MiB"]);
        match next_action(
            &BIG,
            Some(&SMALL),
            RunState::Running,
            PowerState::On,
            RestartPolicy::Automatic,
            false,
        ) {
            UpdateAction::Shutdown { why } => assert!(why.contains("cores 2→4"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[rstest]
    #[case(false, RunState::Running, "shutdown")]
    #[case(false, RunState::ShuttingDown, "wait")]
    #[case(true, RunState::Running, "power-cut")]
    #[case(true, RunState::ShuttingDown, "power-cut")]
    #[case(true, RunState::ShutOff, "in-sync")]
    fn a_guest_ignoring_acpi_is_powered_off_after_the_timeout(
        #[case] overdue: bool,
        #[case] state: RunState,
        #[case] expected: &str,
    ) {
        let got = next_action(
            &SMALL,
            Some(&SMALL),
            state,
            PowerState::Off,
            RestartPolicy::Manual,
            overdue,
        );
        assert_eq!(kind(&got), expected, "{got:?}");
    }

    #[test]
    fn desired_sizing_defaults_to_one_socket() {
        let spec: LibvirtMachineSpec = serde_json::from_value(serde_json::json!({
            "source": {"volume": "b", "pool": "p"}, "cpu": {"cores": 3}, "memoryMiB": 256
        }))
        .unwrap();
        assert_eq!(
            desired_sizing(&spec),
            Sizing {
                sockets: 1,
                cores: 3,
                memory_mib: 256
            }
        );
    }
}
