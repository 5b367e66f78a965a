//! Keeping a VM's virtual hardware in line with its spec — right after the clone and, as drift,
//! for the whole life of the machine — without ever cloning again. Pure: [`next_action`] decides
//! one action from the spec, the VM as read and the resolved networks; [`crate::provision`]
//! performs it, records the task and looks again on the next reconcile.
//!
//! - **Disks** (`spec.disks[i]` ↔ the VM's i-th disk by controller and unit): grown with a
//!   `deviceChange` edit of `capacityInKB`, online on a running VM. Never shrunk: a size below
//!   the VM's keeps the VM's. Disks beyond the VM's are created (thin, on the boot disk's
//!   controller, `storage` = datastore, else the VM's folder).
//! - **NICs** (`spec.networks`, port groups by name or path): matched to the VM's adapters by
//!   MAC, then by network, then in key order; an unmatched adapter is moved (edit of its backing),
//!   missing ones added (`vmxnet3` unless `model` says otherwise), extra ones removed. Applied
//!   online. No `spec.networks`: the template's adapters are kept as they are.
//! - **CPU and memory** are cold: with `spec.restartPolicy: Automatic` a running VM is powered
//!   off, reconfigured, and powered on again when the desired power state is `On`; with `Manual`
//!   (the default) a provisioned VM is left running and `VMUpToDate` says `RestartRequired` until
//!   its user powers it off.

use banlieue_api::common::{Firmware, PowerState, RestartPolicy};
use banlieue_api::infrastructure::VSphereMachineSpec;
use banlieue_vsphere_client::{
    ConfigSpec, DeviceChange, Hardware, NetworkBacking, PciPassthrough, VirtualNic, VmInfo, VmPowerState,
};

/// A NIC the spec asks for, with its network resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredNic {
    /// The network backing.
    pub backing: NetworkBacking,
    /// A fixed MAC, if the spec sets one.
    pub mac: Option<String>,
    /// Adapter type for a new NIC (`VirtualVmxnet3`, …).
    pub kind: &'static str,
}

/// The next action towards the spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateAction {
    /// `ReconfigVM_Task` with this spec; `what` describes it.
    Reconfigure {
        /// The changes.
        spec: ConfigSpec,
        /// Human description.
        what: String,
    },
    /// Power the VM off (`why`: a cold change, or `spec.powerState: Off`).
    PowerOff {
        /// Human description.
        why: String,
    },
    /// Power the VM on.
    PowerOn,
    /// The running VM needs a restart that `spec.restartPolicy` (`Manual`) leaves to its user:
    /// `why` says which changes wait.
    RestartRequired {
        /// The waiting changes, and how to apply them.
        why: String,
    },
    /// Nothing to do.
    InSync,
}

/// The firmware, Secure Boot, virtual TPM and PCI devices a new VM still lacks (set while it is
/// configured, powered off, before its first start; never changed afterwards: they belong to the
/// installed guest). Empty when it has them. `Err`: Secure Boot or a TPM asked for a VM that
/// would boot BIOS.
pub fn firmware_changes(spec: &VSphereMachineSpec, info: &VmInfo) -> Result<ConfigSpec, String> {
    let mut change = ConfigSpec::default();
    let want = spec.firmware.map(|f| match f {
        Firmware::BIOS => "bios",
        Firmware::UEFI => "efi",
    });
    if let Some(want) = want
        && info.firmware.as_deref() != Some(want)
    {
        change.firmware = Some(want.to_owned());
    }
    // The firmware the VM boots with once configured.
    let efi = want.or(info.firmware.as_deref()) == Some("efi");
    if let Some(on) = spec.secure_boot
        && info.secure_boot != on
    {
        if on && !efi {
            return Err(
                "secureBoot needs UEFI firmware: set firmware: UEFI (the template boots BIOS)".to_owned(),
            );
        }
        change.secure_boot = Some(on);
    }
    if spec.tpm == Some(true) && !info.hardware.tpm {
        if !efi {
            return Err("tpm needs UEFI firmware: set firmware: UEFI (the template boots BIOS)".to_owned());
        }
        change.device_change.push(DeviceChange::AddTpm { key: TPM_KEY });
    }
    let missing = missing_pci_devices(spec, &info.hardware);
    if !missing.is_empty() {
        // vSphere powers on a VM with passthrough devices only with all its memory reserved.
        change.memory_reservation_locked_to_max = Some(true);
    }
    for (i, device) in (0..).zip(missing) {
        change.device_change.push(DeviceChange::AddPci {
            key: PCI_KEY - i,
            device,
        });
    }
    Ok(change)
}

/// The temporary key of a virtual TPM being added.
const TPM_KEY: i32 = -11_000;
/// The temporary key of the first PCI device being added (the next ones count down).
const PCI_KEY: i32 = -13_000;

/// The spec's PCI devices the VM does not have yet (each device it has counts once).
fn missing_pci_devices(spec: &VSphereMachineSpec, hardware: &Hardware) -> Vec<PciPassthrough> {
    let mut present = hardware.pci_devices.clone();
    let mut missing = Vec::new();
    for wanted in &spec.pci_devices {
        let device = match (&wanted.vgpu_profile, wanted.vendor_id, wanted.device_id) {
            (Some(profile), _, _) => PciPassthrough::Vgpu {
                profile: profile.clone(),
            },
            (None, Some(vendor_id), Some(device_id)) => PciPassthrough::Dynamic {
                vendor_id,
                device_id,
                custom_label: wanted.custom_label.clone(),
            },
            // The schema refuses anything else.
            _ => continue,
        };
        match present.iter().position(|p| *p == device) {
            Some(found) => {
                present.remove(found);
            }
            None => missing.push(device),
        }
    }
    missing
}

/// CPU and memory changes (cold); empty when the VM matches.
pub fn cold_changes(spec: &VSphereMachineSpec, info: &VmInfo) -> ConfigSpec {
    let total = spec.cpu.vcpus();
    let mut c = ConfigSpec::default();
    if info.num_cpu != Some(total) || info.cores_per_socket.is_some_and(|c| c != spec.cpu.cores) {
        c.num_cpus = Some(total);
        c.cores_per_socket = Some(spec.cpu.cores);
    }
    if info.memory_mb != Some(spec.memory_mib) {
        c.memory_mb = Some(spec.memory_mib);
    }
    c
}

fn describe_cold(c: &ConfigSpec, info: &VmInfo) -> String {
    let show = |v: Option<u64>| v.map_or_else(|| "unset".to_owned(), |v| v.to_string());
    let mut parts = Vec::new();
    if let Some(n) = c.num_cpus {
        parts.push(format!("CPUs {}→{n}", show(info.num_cpu.map(u64::from))));
    }
    if let Some(m) = c.memory_mb {
        parts.push(format!("memory {}→{m} MiB", show(info.memory_mb)));
    }
    parts.join(", ")
}

fn same_mac(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Which of the VM's NICs (index into `have`) stands for each desired NIC: by MAC, then by
/// network, then whatever is left; `None`: a NIC to add.
pub fn pair_nics(nics: &[DesiredNic], have: &[VirtualNic]) -> Vec<Option<usize>> {
    let mut pair: Vec<Option<usize>> = vec![None; nics.len()];
    let mut used = vec![false; have.len()];
    let mut take = |pair: &mut Vec<Option<usize>>, matches: &dyn Fn(&DesiredNic, usize) -> bool| {
        for (i, want) in nics.iter().enumerate() {
            if pair[i].is_some() {
                continue;
            }
            if let Some(j) = (0..have.len()).find(|&j| !used[j] && matches(want, j)) {
                used[j] = true;
                pair[i] = Some(j);
            }
        }
    };
    take(&mut pair, &|want, j| {
        want.mac
            .as_deref()
            .zip(have[j].mac.as_deref())
            .is_some_and(|(a, b)| same_mac(a, b))
    });
    take(&mut pair, &|want, j| {
        want.mac.is_none() && want.backing.same_network(&have[j].backing)
    });
    take(&mut pair, &|_, _| true);
    pair
}

/// The MAC of the VM's NIC standing for each desired NIC ([`pair_nics`]), where it has one.
pub fn paired_macs(nics: &[DesiredNic], hw: &Hardware) -> Vec<Option<String>> {
    pair_nics(nics, &hw.nics)
        .into_iter()
        .map(|j| j.and_then(|j| hw.nics[j].mac.clone()))
        .collect()
}

/// Disk growth and NIC changes (hot); empty when the VM matches.
pub fn device_changes(spec: &VSphereMachineSpec, hw: &Hardware, nics: &[DesiredNic]) -> Vec<DeviceChange> {
    let mut out = Vec::new();
    for (want, disk) in spec.disks.iter().zip(&hw.disks) {
        let kb = want.size_gib.saturating_mul(1024 * 1024);
        if kb > disk.capacity_kb {
            out.push(DeviceChange::GrowDisk {
                disk: disk.clone(),
                capacity_kb: kb,
            });
        }
    }
    // Disks beyond the VM's are created, thin, on the boot disk's controller.
    if let Some(controller) = hw.disks.first().map(|d| d.controller_key) {
        let mut taken = Vec::new();
        for (i, want) in spec.disks.iter().enumerate().skip(hw.disks.len()) {
            let Some(unit) = hw.free_unit(controller, &taken) else {
                break;
            };
            taken.push(unit);
            out.push(DeviceChange::AddDisk {
                key: -100 - i32::try_from(i).unwrap_or(0),
                controller_key: controller,
                unit_number: unit,
                capacity_kb: want.size_gib.saturating_mul(1024 * 1024),
                datastore: want.storage.clone(),
            });
        }
    }
    if nics.is_empty() {
        return out;
    }
    let pair = pair_nics(nics, &hw.nics);
    let used: Vec<bool> = (0..hw.nics.len()).map(|j| pair.contains(&Some(j))).collect();
    let mut new_key = -1;
    for (want, paired) in nics.iter().zip(&pair) {
        match paired {
            Some(j) => {
                let nic = &hw.nics[*j];
                let mac_differs = want
                    .mac
                    .as_deref()
                    .is_some_and(|m| !nic.mac.as_deref().is_some_and(|n| same_mac(m, n)));
                if mac_differs || !want.backing.same_network(&nic.backing) {
                    out.push(DeviceChange::EditNic {
                        nic: nic.clone(),
                        backing: want.backing.clone(),
                        mac: want.mac.clone().filter(|_| mac_differs),
                    });
                }
            }
            None => {
                out.push(DeviceChange::AddNic {
                    key: new_key,
                    kind: want.kind.to_owned(),
                    backing: want.backing.clone(),
                    mac: want.mac.clone(),
                });
                new_key -= 1;
            }
        }
    }
    for (j, nic) in hw.nics.iter().enumerate() {
        if !used[j] {
            out.push(DeviceChange::RemoveNic { nic: nic.clone() });
        }
    }
    out
}

/// The first of the VM's disks (the template's, matched by position) that the spec wants on
/// another datastore than the one it is on: a cloned disk is never moved, so that is refused
/// (`UnsupportedField`) rather than ignored. `None` when every disk's `storage` is unset or
/// its datastore. Disks beyond the VM's are created on their `storage`.
pub fn disk_storage_refusal(spec: &VSphereMachineSpec, hw: &Hardware) -> Option<String> {
    spec.disks
        .iter()
        .zip(&hw.disks)
        .enumerate()
        .find_map(|(i, (want, disk))| {
            let wanted = want.storage.as_deref()?;
            let actual = datastore_of(&disk.file_name)?;
            (wanted != actual).then(|| {
                format!(
                    "spec.disks[{i}].storage = {wanted:?}: the VM's disk {i} ({:?}) is on datastore {actual:?}, and the vsphere provider does not move a cloned disk: remove storage or set it to {actual:?} (spec.datastore places the clone)",
                    want.name
                )
            })
        })
}

/// The datastore name of a disk file `[datastore] folder/disk.vmdk`.
fn datastore_of(file: &str) -> Option<&str> {
    let (datastore, _) = file.strip_prefix('[')?.split_once(']')?;
    Some(datastore.trim())
}

/// The next action for a VM read as `info`. `power` is the desired power state once
/// provisioned; `None` while provisioning (the power-on step follows).
pub fn next_action(
    spec: &VSphereMachineSpec,
    info: &VmInfo,
    nics: &[DesiredNic],
    power: Option<PowerState>,
) -> UpdateAction {
    let cold = cold_changes(spec, info);
    let hot = device_changes(spec, &info.hardware, nics);
    let on = info.power_state == Some(VmPowerState::PoweredOn);
    // A running VM gets its hot changes only: the cold ones need it off.
    let applied = if on { ConfigSpec::default() } else { cold.clone() };
    if !hot.is_empty() || !applied.is_empty() {
        let what = [describe_cold(&applied, info)]
            .into_iter()
            .chain(hot.iter().map(DeviceChange::describe))
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        return UpdateAction::Reconfigure {
            spec: ConfigSpec {
                device_change: hot,
                ..applied
            },
            what,
        };
    }
    if !on {
        return if power == Some(PowerState::On) {
            UpdateAction::PowerOn
        } else {
            UpdateAction::InSync
        };
    }
    // A provisioned VM the user wants on is restarted only as its restart policy allows.
    let user_restart =
        power == Some(PowerState::On) && spec.restart_policy.unwrap_or_default() == RestartPolicy::Manual;
    if !cold.is_empty() && user_restart {
        return UpdateAction::RestartRequired {
            why: banlieue_provider_kit::power::restart_required_message(&describe_cold(&cold, info)),
        };
    }
    if !cold.is_empty() {
        return UpdateAction::PowerOff {
            why: format!(
                "to apply {} (CPU and memory changes need the VM off)",
                describe_cold(&cold, info)
            ),
        };
    }
    if power == Some(PowerState::Off) {
        return UpdateAction::PowerOff {
            why: "spec.powerState is Off".to_owned(),
        };
    }
    UpdateAction::InSync
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::{Cpu, Disk, NetworkInterface};
    use banlieue_api::infrastructure::VSphereTemplateSource;
    use banlieue_vsphere_client::{MoRef, VirtualDisk, VirtualNic};

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
            datastore: None,
            folder: None,
            resource_pool: None,
            clone_mode: None,
            cpu: Cpu {
                cores: 2,
                sockets: None,
            },
            memory_mib: 2048,
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

    fn net(name: &str, id: &str) -> NetworkBacking {
        NetworkBacking::Standard {
            name: name.into(),
            network: Some(MoRef::new("Network", id)),
        }
    }

    fn nic(key: i32, backing: NetworkBacking, mac: &str) -> VirtualNic {
        VirtualNic {
            key,
            kind: "VirtualE1000".into(),
            backing,
            mac: Some(mac.into()),
            address_type: Some("generated".into()),
            controller_key: Some(100),
            unit_number: Some(7),
        }
    }

    /// A running VM matching `spec()` with one 10 GiB disk and one NIC on `VM Network`.
    fn vm() -> VmInfo {
        VmInfo {
            vm: MoRef::new("VirtualMachine", "vm-1"),
            name: "m".into(),
            bios_uuid: None,
            instance_uuid: None,
            template: false,
            power_state: Some(VmPowerState::PoweredOn),
            num_cpu: Some(2),
            cores_per_socket: Some(2),
            memory_mb: Some(2048),
            extra_config: Default::default(),
            ip_address: None,
            guest_ips: vec![],
            host: None,
            hardware: Hardware {
                disks: vec![VirtualDisk {
                    key: 204,
                    controller_key: 202,
                    unit_number: Some(0),
                    capacity_kb: 10 * 1024 * 1024,
                    backing_type: "VirtualDiskFlatVer2BackingInfo".into(),
                    file_name: "[ds] m/m.vmdk".into(),
                    datastore: None,
                    disk_mode: Some("persistent".into()),
                    thin: Some(true),
                }],
                nics: vec![nic(4000, net("VM Network", "network-6"), "00:0c:29:00:00:01")],
                used_units: vec![(202, 0), (100, 7)],
                tpm: false,
                pci_devices: vec![],
            },
            firmware: None,
            secure_boot: false,
        }
    }

    fn want(backing: NetworkBacking) -> DesiredNic {
        DesiredNic {
            backing,
            mac: None,
            kind: "VirtualVmxnet3",
        }
    }

    #[test]
    fn a_template_disk_wanted_on_another_datastore_is_refused_not_ignored() {
        let mut s = spec();
        s.disks = vec![Disk {
            name: "root".into(),
            size_gib: 10,
            storage: Some("ds".into()),
        }];
        assert_eq!(disk_storage_refusal(&s, &vm().hardware), None, "on its datastore");
        s.disks[0].storage = Some("fast".into());
        let why = disk_storage_refusal(&s, &vm().hardware).expect("refused");
        assert!(
            why.contains("spec.disks[0].storage")
                && why.contains("\"ds\"")
                && why.contains("vsphere provider"),
            "{why}"
        );
        // A disk beyond the VM's is created on its storage: nothing to refuse.
        s.disks[0].storage = None;
        s.disks.push(Disk {
            name: "data".into(),
            size_gib: 5,
            storage: Some("fast".into()),
        });
        assert_eq!(disk_storage_refusal(&s, &vm().hardware), None);
    }

    #[test]
    fn firmware_secure_boot_and_a_tpm_are_added_once_and_need_uefi() {
        let mut s = spec();
        s.firmware = Some(Firmware::UEFI);
        s.secure_boot = Some(true);
        s.tpm = Some(true);
        let change = firmware_changes(&s, &vm()).unwrap();
        assert_eq!(change.firmware.as_deref(), Some("efi"));
        assert_eq!(change.secure_boot, Some(true));
        assert_eq!(change.device_change, vec![DeviceChange::AddTpm { key: TPM_KEY }]);
        // Once the VM has them, nothing.
        let mut done = vm();
        done.firmware = Some("efi".into());
        done.secure_boot = true;
        done.hardware.tpm = true;
        assert!(firmware_changes(&s, &done).unwrap().is_empty());
        // A TPM on a VM that boots BIOS is refused with what to set.
        s.firmware = None;
        s.secure_boot = None;
        let why = firmware_changes(&s, &vm()).unwrap_err();
        assert!(why.contains("firmware: UEFI"), "{why}");
    }

    #[test]
    fn missing_pci_devices_are_added_once_with_memory_locked() {
        use banlieue_api::infrastructure::VSpherePciDevice;
        let mut s = spec();
        let gpu = VSpherePciDevice {
            vendor_id: Some(4318),
            device_id: Some(7864),
            custom_label: Some("gpu-a".into()),
            vgpu_profile: None,
        };
        s.pci_devices = vec![
            gpu.clone(),
            gpu,
            VSpherePciDevice {
                vgpu_profile: Some("grid_a100-4c".into()),
                ..VSpherePciDevice::default()
            },
        ];
        let change = firmware_changes(&s, &vm()).unwrap();
        assert_eq!(change.memory_reservation_locked_to_max, Some(true));
        assert_eq!(change.device_change.len(), 3);
        let keys: Vec<i32> = change
            .device_change
            .iter()
            .map(|d| match d {
                DeviceChange::AddPci { key, .. } => *key,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(keys, [PCI_KEY, PCI_KEY - 1, PCI_KEY - 2]);
        // One of the two GPUs is there already: one more is added, with the vGPU.
        let mut one = vm();
        one.hardware.pci_devices = vec![PciPassthrough::Dynamic {
            vendor_id: 4318,
            device_id: 7864,
            custom_label: Some("gpu-a".into()),
        }];
        assert_eq!(firmware_changes(&s, &one).unwrap().device_change.len(), 2);
        // All there: nothing, the memory left as it is.
        one.hardware.pci_devices.push(one.hardware.pci_devices[0].clone());
        one.hardware.pci_devices.push(PciPassthrough::Vgpu {
            profile: "grid_a100-4c".into(),
        });
        assert!(firmware_changes(&s, &one).unwrap().is_empty());
    }

    #[test]
    fn a_matching_vm_is_in_sync() {
        let nics = [want(net("VM Network", "network-6"))];
        assert_eq!(
            next_action(&spec(), &vm(), &nics, Some(PowerState::On)),
            UpdateAction::InSync
        );
        assert_eq!(next_action(&spec(), &vm(), &[], None), UpdateAction::InSync);
    }

    /// No surprise reboots: under `Manual` (the default) a running VM the user wants on is not
    /// powered off for CPU and memory; a user's power-off (or a VM being provisioned) applies it.
    #[test]
    fn under_the_manual_policy_cpu_and_memory_wait_for_the_user() {
        let mut s = spec();
        s.cpu.cores = 4;
        s.memory_mib = 4096;
        let action = next_action(&s, &vm(), &[], Some(PowerState::On));
        let UpdateAction::RestartRequired { why } = &action else {
            panic!("expected RestartRequired, got {action:?}");
        };
        assert!(
            why.contains("CPUs 2→4") && why.contains("spec.restartPolicy: Automatic"),
            "{why}"
        );
        assert!(matches!(
            next_action(&s, &vm(), &[], Some(PowerState::Off)),
            UpdateAction::PowerOff { .. }
        ));
        assert!(
            matches!(next_action(&s, &vm(), &[], None), UpdateAction::PowerOff { .. }),
            "while provisioning, nothing the user runs yet"
        );
    }

    #[test]
    fn cpu_and_memory_on_a_running_vm_power_it_off_first_then_apply_then_power_on() {
        let mut s = spec();
        s.cpu.cores = 4;
        s.memory_mib = 4096;
        s.restart_policy = Some(RestartPolicy::Automatic);
        let UpdateAction::PowerOff { why } = next_action(&s, &vm(), &[], Some(PowerState::On)) else {
            panic!("expected PowerOff");
        };
        assert_eq!(
            why,
            "to apply CPUs 2→4, memory 2048→4096 MiB (CPU and memory changes need the VM off)"
        );
        let mut off = vm();
        off.power_state = Some(VmPowerState::PoweredOff);
        let UpdateAction::Reconfigure { spec: c, .. } = next_action(&s, &off, &[], Some(PowerState::On))
        else {
            panic!("expected Reconfigure");
        };
        assert_eq!(
            (c.num_cpus, c.cores_per_socket, c.memory_mb),
            (Some(4), Some(4), Some(4096))
        );
        assert_eq!(
            next_action(&spec(), &off, &[], Some(PowerState::On)),
            UpdateAction::PowerOn
        );
        assert_eq!(
            next_action(&spec(), &off, &[], Some(PowerState::Off)),
            UpdateAction::InSync
        );
        assert_eq!(next_action(&spec(), &off, &[], None), UpdateAction::InSync);
    }

    #[test]
    fn disks_grow_online_and_never_shrink() {
        let mut s = spec();
        s.disks = vec![Disk {
            name: "root".into(),
            size_gib: 20,
            storage: None,
        }];
        let UpdateAction::Reconfigure { spec: c, what } = next_action(&s, &vm(), &[], Some(PowerState::On))
        else {
            panic!("expected Reconfigure");
        };
        assert_eq!(what, "grow disk 204 from 10 to 20 GiB");
        assert!(c.num_cpus.is_none() && c.memory_mb.is_none());
        assert!(matches!(
            c.device_change.as_slice(),
            [DeviceChange::GrowDisk { capacity_kb, .. }] if *capacity_kb == 20 * 1024 * 1024
        ));
        s.disks[0].size_gib = 5;
        let mut hw = vm().hardware;
        hw.used_units = vec![(202, 0), (202, 1)];
        let mut two = s.clone();
        two.disks.push(Disk {
            name: "data".into(),
            size_gib: 4,
            storage: Some("fast".into()),
        });
        // A second disk is created on the boot disk's controller, in a free unit.
        assert_eq!(
            device_changes(&two, &hw, &[]),
            [DeviceChange::AddDisk {
                key: -101,
                controller_key: 202,
                unit_number: 2,
                capacity_kb: 4 * 1024 * 1024,
                datastore: Some("fast".into()),
            }]
        );
        assert_eq!(
            next_action(&s, &vm(), &[], Some(PowerState::On)),
            UpdateAction::InSync
        );
    }

    #[test]
    fn nics_are_moved_added_and_removed_to_match_the_networks() {
        let a = net("VM Network", "network-6");
        let b = net("Storage", "network-7");
        let hw = vm().hardware;
        // Second network: one NIC added, the existing one kept.
        let changes = device_changes(&spec(), &hw, &[want(a.clone()), want(b.clone())]);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(
            matches!(&changes[0], DeviceChange::AddNic { backing, kind, key: -1, mac: None }
            if *backing == b && kind == "VirtualVmxnet3")
        );
        // Only the other network: the existing NIC is moved, not replaced.
        let changes = device_changes(&spec(), &hw, &[want(b.clone())]);
        assert!(
            matches!(&changes[..], [DeviceChange::EditNic { nic, backing, mac: None }]
            if nic.key == 4000 && *backing == b)
        );
        // Order does not matter: an adapter already on a wanted network stays where it is.
        let mut two = hw.clone();
        two.nics.insert(0, nic(205, b.clone(), "00:0c:29:00:00:02"));
        assert!(device_changes(&spec(), &two, &[want(a.clone()), want(b.clone())]).is_empty());
        // One network left: the other adapter is removed.
        let changes = device_changes(&spec(), &two, &[want(a)]);
        assert!(matches!(&changes[..], [DeviceChange::RemoveNic { nic }] if nic.key == 205));
        // A fixed MAC that differs is set on the paired adapter.
        let fixed = DesiredNic {
            mac: Some("00:50:56:00:00:09".into()),
            ..want(net("VM Network", "network-6"))
        };
        let changes = device_changes(&spec(), &hw, &[fixed]);
        assert!(
            matches!(&changes[..], [DeviceChange::EditNic { mac: Some(m), .. }] if m == "00:50:56:00:00:09")
        );
    }

    #[test]
    fn a_stopped_vm_gets_cold_and_hot_changes_in_one_reconfigure() {
        let mut s = spec();
        s.memory_mib = 1024;
        s.networks = vec![NetworkInterface::dhcp("eth0", "Storage")];
        let mut off = vm();
        off.power_state = Some(VmPowerState::PoweredOff);
        let UpdateAction::Reconfigure { spec: c, what } =
            next_action(&s, &off, &[want(net("Storage", "network-7"))], None)
        else {
            panic!("expected Reconfigure");
        };
        assert_eq!(c.memory_mb, Some(1024));
        assert_eq!(c.device_change.len(), 1);
        assert_eq!(
            what,
            "memory 2048→1024 MiB, move NIC 4000 from VM Network to Storage"
        );
    }
}
