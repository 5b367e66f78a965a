//! After provisioning: keeping the VM in line with the spec — power state (`spec.powerState`)
//! and live reconfiguration of CPU, memory, disks (grow), network interfaces and tags — without
//! re-cloning. Pure: [`next_update_action`] decides the next single action from the spec and
//! the VM's real config and power state; [`crate::provision`] performs it.
//!
//! How changes reach a provisioned VM (Proxmox VE semantics):
//! - **Disk growth** is applied online (`PUT …/resize` works on a running VM).
//! - **Network interfaces and tags** are applied online (hot-pluggable by default).
//! - **CPU (cores, sockets) and memory** are applied cold: on a running VM PVE would only record
//!   them as *pending* (effective after the next boot). With `spec.restartPolicy: Automatic` the
//!   provider shuts the VM down (ACPI shutdown, hard stop after [`SHUTDOWN_TIMEOUT_SECS`]),
//!   applies them and starts it again if `spec.powerState` is `On`; the `VMUpToDate` condition
//!   says so while it happens (`PoweringOff` with the reason in its message). With `Manual` (the
//!   default) it never restarts a running VM: `VMUpToDate` is False with `RestartRequired` (and a
//!   Warning Event) until the user powers the VM off, or changes the policy.
//! - **Anything else PVE keeps pending** on a running VM (a NIC change when the VM's `hotplug`
//!   lacks `network`, the removal of an IDE/SATA drive): the config is read from `GET …/pending`
//!   (the values with pending changes applied, as `GET …/config` shows them, and which keys are
//!   pending), so a written change is not written again; a pending change of a key the provider
//!   manages is applied by the same shutdown and start, as the restart policy allows.
//! - **Power**: `Off` shuts the VM down the same way; `On` starts it.

use banlieue_api::common::{PowerState, RestartPolicy};
use banlieue_api::infrastructure::ProxmoxMachineSpec;
use banlieue_pve_client::{ConfigUpdate, Size, VmConfig};

use crate::desired::{self, SpecError};

/// Seconds PVE waits for a guest to shut down before it stops it hard (`forceStop`): the kit's
/// [`banlieue_provider_kit::power::SHUTDOWN_TIMEOUT`], the same on every hypervisor (PVE counts
/// it in its own shutdown task).
#[allow(clippy::cast_possible_truncation)]
pub const SHUTDOWN_TIMEOUT_SECS: u32 = banlieue_provider_kit::power::SHUTDOWN_TIMEOUT.as_secs() as u32;

/// Config keys PVE cannot apply to a running VM without hotplug support (cold changes).
pub const COLD_KEYS: &[&str] = &["cores", "sockets", "memory"];

/// The next action to bring a provisioned VM to its spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateAction {
    /// Grow `disk` to `size` (online or offline).
    Resize {
        /// Drive slot.
        disk: String,
        /// New absolute size.
        size: Size,
    },
    /// Apply these config changes (live-applicable ones on a running VM; all on a stopped one).
    Apply(ConfigUpdate),
    /// Shut the VM down (`why` says what for: power off, or a cold change).
    Shutdown {
        /// Human-readable cause.
        why: String,
    },
    /// Start the VM.
    Start,
    /// The running VM needs a restart that `spec.restartPolicy` (`Manual`) leaves to its user:
    /// `why` says which changes wait.
    RestartRequired {
        /// The waiting changes, and how to apply them.
        why: String,
    },
    /// The VM matches the spec.
    InSync,
}

/// What a running VM does with a change that needs a restart, per `spec.restartPolicy`: restart
/// (`Automatic`) or wait for its user (`Manual`, the default).
fn restart_or_wait(spec: &ProxmoxMachineSpec, changes: String) -> UpdateAction {
    match spec.restart_policy.unwrap_or_default() {
        RestartPolicy::Automatic => UpdateAction::Shutdown {
            why: format!("to apply {changes}"),
        },
        RestartPolicy::Manual => UpdateAction::RestartRequired {
            why: banlieue_provider_kit::power::restart_required_message(&changes),
        },
    }
}

/// The desired power state (`On` when unset).
pub fn desired_power(spec: &ProxmoxMachineSpec) -> PowerState {
    spec.power_state.unwrap_or_default()
}

/// The observed power state from PVE's `running` flag.
pub fn observed_power(running: bool) -> PowerState {
    if running { PowerState::On } else { PowerState::Off }
}

/// Whether a config key is one the provider writes (hardware the spec describes, its tags), so
/// that its pending change is the provider's to apply by a restart.
fn managed(key: &str) -> bool {
    let slot = |prefix: &str| {
        key.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    matches!(key, "cores" | "sockets" | "memory" | "tags")
        || ["net", "ide", "sata", "scsi", "virtio"].into_iter().any(slot)
}

/// Decides the next action for a provisioned VM with config `actual` (pending changes applied,
/// as `GET …/config` shows it), running or not; `pending` are the keys Proxmox keeps pending
/// until the VM restarts (a NIC change without network hotplug, a drive removal, …).
pub fn next_update_action(
    spec: &ProxmoxMachineSpec,
    uid: &str,
    actual: &VmConfig,
    running: bool,
    pending: &[String],
) -> Result<UpdateAction, SpecError> {
    let update = desired::config_update(spec, uid, actual)?;
    let grow = desired::disk_to_grow(spec, actual)?;
    let cold: Vec<String> = COLD_KEYS
        .iter()
        .filter_map(|k| {
            update
                .set
                .get(*k)
                .map(|v| format!("{k} {}→{v}", actual.get(k).unwrap_or("default")))
        })
        .collect();
    if running {
        if let Some((disk, size)) = grow {
            return Ok(UpdateAction::Resize { disk, size });
        }
        let policy = spec.restart_policy.unwrap_or_default();
        if !cold.is_empty() && policy == RestartPolicy::Automatic {
            return Ok(restart_or_wait(
                spec,
                format!("{} (CPU and memory changes need the VM off)", cold.join(", ")),
            ));
        }
        // What can change while the VM runs does; cold keys wait for the restart (Manual).
        let mut live = update;
        live.set.retain(|k, _| !COLD_KEYS.contains(&k.as_str()));
        if live != ConfigUpdate::default() {
            return Ok(UpdateAction::Apply(live));
        }
        if desired_power(spec) == PowerState::Off {
            return Ok(UpdateAction::Shutdown {
                why: "spec.powerState is Off".to_owned(),
            });
        }
        // Written, but not in effect: Proxmox applies them when the VM starts again.
        let waiting: Vec<String> = pending
            .iter()
            .filter(|k| managed(k))
            .map(|k| format!("{k} (kept pending by Proxmox)"))
            .collect();
        let restart: Vec<String> = cold.into_iter().chain(waiting).collect();
        if !restart.is_empty() {
            return Ok(restart_or_wait(spec, restart.join(", ")));
        }
        return Ok(UpdateAction::InSync);
    }
    if update != ConfigUpdate::default() {
        return Ok(UpdateAction::Apply(update));
    }
    if let Some((disk, size)) = grow {
        return Ok(UpdateAction::Resize { disk, size });
    }
    if desired_power(spec) == PowerState::On {
        return Ok(UpdateAction::Start);
    }
    Ok(UpdateAction::InSync)
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::{Cpu, Disk};
    use banlieue_api::infrastructure::ProxmoxTemplateSource;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    const UID: &str = "5e0c6a7b-0000-4000-8000-000000000001";

    fn spec() -> ProxmoxMachineSpec {
        ProxmoxMachineSpec {
            disks: vec![Disk {
                name: "scsi0".into(),
                size_gib: 16,
                storage: None,
            }],
            restart_policy: Some(RestartPolicy::Automatic),
            ..ProxmoxMachineSpec::new(
                ProxmoxTemplateSource {
                    vmid: Some(9000),
                    ..Default::default()
                },
                Cpu::cores(2),
                2048,
            )
        }
    }

    /// The config of a VM provisioned from `spec()`.
    fn in_sync() -> VmConfig {
        VmConfig(
            [
                ("cores", "2"),
                ("sockets", "1"),
                ("memory", "2048"),
                ("scsi0", "local-lvm:vm-105-disk-0,size=16G"),
                ("net0", "virtio=BC:24:11:00:01:05,bridge=vmbr0"),
                ("tags", &format!("banlieue-uid-{UID}")),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        )
    }

    #[rstest]
    #[case::running_on(None, true)]
    #[case::explicit_on(Some(PowerState::On), true)]
    #[case::stopped_off(Some(PowerState::Off), false)]
    fn a_vm_matching_its_spec_is_left_alone(#[case] power: Option<PowerState>, #[case] running: bool) {
        let spec = ProxmoxMachineSpec {
            power_state: power,
            ..spec()
        };
        assert_eq!(
            next_update_action(&spec, UID, &in_sync(), running, &[]).unwrap(),
            UpdateAction::InSync
        );
    }

    #[test]
    fn power_off_shuts_down_and_power_on_starts() {
        let off = ProxmoxMachineSpec {
            power_state: Some(PowerState::Off),
            ..spec()
        };
        assert_eq!(
            next_update_action(&off, UID, &in_sync(), true, &[]).unwrap(),
            UpdateAction::Shutdown {
                why: "spec.powerState is Off".into()
            }
        );
        assert_eq!(
            next_update_action(&spec(), UID, &in_sync(), false, &[]).unwrap(),
            UpdateAction::Start
        );
    }

    #[test]
    fn memory_and_cpu_changes_on_a_running_vm_shut_it_down_first_then_apply_then_start() {
        let bigger = ProxmoxMachineSpec {
            cpu: Cpu::cores(4),
            memory_mib: 4096,
            ..spec()
        };
        let action = next_update_action(&bigger, UID, &in_sync(), true, &[]).unwrap();
        let UpdateAction::Shutdown { why } = action else {
            panic!("expected a shutdown, got {action:?}");
        };
        assert!(
            why.contains("cores 2→4") && why.contains("memory 2048→4096"),
            "{why}"
        );
        // Stopped: the change is applied…
        let UpdateAction::Apply(update) = next_update_action(&bigger, UID, &in_sync(), false, &[]).unwrap()
        else {
            panic!("expected an apply");
        };
        assert_eq!(update.set.get("memory").map(String::as_str), Some("4096"));
        assert_eq!(update.set.get("cores").map(String::as_str), Some("4"));
        // …and once it is, the VM is started again (powerState On).
        let mut applied = in_sync();
        applied.0.insert("cores".into(), "4".into());
        applied.0.insert("memory".into(), "4096".into());
        assert_eq!(
            next_update_action(&bigger, UID, &applied, false, &[]).unwrap(),
            UpdateAction::Start
        );
        assert_eq!(
            next_update_action(&bigger, UID, &applied, true, &[]).unwrap(),
            UpdateAction::InSync
        );
    }

    /// No surprise reboots: under `Manual` (the default) a running VM is never shut down for a
    /// CPU or memory change; live changes still go through, the VMUpToDate message says what
    /// waits and how to apply it, and a power cycle by the user applies it.
    #[test]
    fn under_the_manual_policy_a_running_vm_waits_for_its_user_to_restart_it() {
        let bigger = ProxmoxMachineSpec {
            cpu: Cpu::cores(4),
            memory_mib: 4096,
            tags: vec!["web".into()],
            restart_policy: None,
            ..spec()
        };
        let UpdateAction::Apply(live) = next_update_action(&bigger, UID, &in_sync(), true, &[]).unwrap()
        else {
            panic!("the live change first");
        };
        assert!(live.set.contains_key("tags"), "{live:?}");
        assert!(
            !live.set.contains_key("cores") && !live.set.contains_key("memory"),
            "cold keys are not written to a running VM: {live:?}"
        );
        let mut tagged = in_sync();
        tagged.0.insert("tags".into(), live.set["tags"].clone());
        let action = next_update_action(&bigger, UID, &tagged, true, &[]).unwrap();
        let UpdateAction::RestartRequired { why } = action else {
            panic!("expected RestartRequired, got {action:?}");
        };
        assert!(
            why.contains("cores 2→4") && why.contains("memory 2048→4096"),
            "{why}"
        );
        assert!(
            why.contains("spec.restartPolicy: Automatic") && why.contains("spec.powerState"),
            "{why}"
        );
        let pending = ["net0".to_owned()];
        let action = next_update_action(&spec_with(None), UID, &in_sync(), true, &pending).unwrap();
        assert!(
            matches!(&action, UpdateAction::RestartRequired { why } if why.contains("net0")),
            "{action:?}"
        );
        // The user powers it off: it is shut down as asked, then the change is applied.
        let off = ProxmoxMachineSpec {
            power_state: Some(PowerState::Off),
            ..bigger.clone()
        };
        assert!(matches!(
            next_update_action(&off, UID, &tagged, true, &[]).unwrap(),
            UpdateAction::Shutdown { why } if why == "spec.powerState is Off"
        ));
        assert!(matches!(
            next_update_action(&off, UID, &tagged, false, &[]).unwrap(),
            UpdateAction::Apply(u) if u.set.contains_key("memory")
        ));
    }

    fn spec_with(policy: Option<RestartPolicy>) -> ProxmoxMachineSpec {
        ProxmoxMachineSpec {
            restart_policy: policy,
            ..spec()
        }
    }

    #[test]
    fn a_memory_change_of_a_vm_that_stays_off_does_not_start_it() {
        let spec = ProxmoxMachineSpec {
            memory_mib: 1024,
            power_state: Some(PowerState::Off),
            ..spec()
        };
        assert!(matches!(
            next_update_action(&spec, UID, &in_sync(), false, &[]).unwrap(),
            UpdateAction::Apply(_)
        ));
        let mut applied = in_sync();
        applied.0.insert("memory".into(), "1024".into());
        assert_eq!(
            next_update_action(&spec, UID, &applied, false, &[]).unwrap(),
            UpdateAction::InSync
        );
    }

    #[test]
    fn a_disk_grows_online_without_a_shutdown() {
        let spec = ProxmoxMachineSpec {
            disks: vec![Disk {
                name: "scsi0".into(),
                size_gib: 32,
                storage: None,
            }],
            ..spec()
        };
        assert_eq!(
            next_update_action(&spec, UID, &in_sync(), true, &[]).unwrap(),
            UpdateAction::Resize {
                disk: "scsi0".into(),
                size: Size(32 << 30)
            }
        );
    }

    #[test]
    fn tags_are_applied_live() {
        let spec = ProxmoxMachineSpec {
            tags: vec!["web".into()],
            ..spec()
        };
        let action = next_update_action(&spec, UID, &in_sync(), true, &[]).unwrap();
        let UpdateAction::Apply(update) = action else {
            panic!("expected a live apply, got {action:?}");
        };
        assert!(update.set.get("tags").is_some_and(|t| t.contains("web")));
        assert!(!update.set.contains_key("memory"));
    }

    #[test]
    fn a_disk_shrink_is_a_spec_error_not_an_action() {
        let spec = ProxmoxMachineSpec {
            disks: vec![Disk {
                name: "scsi0".into(),
                size_gib: 8,
                storage: None,
            }],
            ..spec()
        };
        assert!(next_update_action(&spec, UID, &in_sync(), true, &[]).is_err());
    }

    /// A change Proxmox keeps pending on a running VM (a NIC model without network hotplug)
    /// is in the config but not in effect: the VM is restarted to apply it, and only for keys
    /// the provider writes (a user's own pending change of another key is left alone).
    #[test]
    fn a_pending_change_the_provider_wrote_restarts_the_vm() {
        let pending = ["net0".to_owned(), "hookscript".to_owned()];
        let UpdateAction::Shutdown { why } =
            next_update_action(&spec(), UID, &in_sync(), true, &pending).unwrap()
        else {
            panic!("a restart")
        };
        assert!(why.contains("net0") && !why.contains("hookscript"), "{why}");
        assert!(why.contains("kept pending by Proxmox"), "{why}");
        assert_eq!(
            next_update_action(&spec(), UID, &in_sync(), true, &["hookscript".to_owned()]).unwrap(),
            UpdateAction::InSync
        );
        assert_eq!(
            next_update_action(&spec(), UID, &in_sync(), false, &pending).unwrap(),
            UpdateAction::Start,
            "a stopped VM applies them when it starts"
        );
    }
}
