//! Firmware, TPM, CPU model and PCI passthrough of a new VM (`spec.firmware`, `secureBoot`,
//! `tpm`, `cpuType`, `cpuFlags`, `pciDevices`): written while the clone is configured, before
//! its first start, and never changed afterwards (a VM's firmware and TPM belong to its
//! installed guest). The EFI variables disk and the TPM state are new volumes on
//! `spec.storage`, else on the boot disk's storage.

use banlieue_api::common::Firmware;
use banlieue_api::infrastructure::ProxmoxMachineSpec;
use banlieue_pve_client::{ConfigUpdate, DiskSpec, VmConfig};

/// The drive keys tried, in order, for the boot disk's storage when the spec names none.
const BOOT_DISK_KEYS: [&str; 4] = ["scsi0", "virtio0", "sata0", "ide0"];

/// The storage new firmware volumes go on: `spec.storage`, else the boot disk's.
fn volume_storage(spec: &ProxmoxMachineSpec, actual: &VmConfig) -> Result<String, String> {
    if let Some(storage) = &spec.storage {
        return Ok(storage.clone());
    }
    spec.disks
        .first()
        .map(|d| d.name.as_str())
        .into_iter()
        .chain(BOOT_DISK_KEYS)
        .filter_map(|key| disk_at(actual, key))
        .find_map(|d| d.storage().map(str::to_owned))
        .ok_or_else(|| "no storage for the EFI disk or TPM state: set spec.storage".to_owned())
}

/// The `cpu` option the spec asks for (`x86-64-v2-AES,flags=+aes;-pcid`), if any.
pub fn cpu_option(spec: &ProxmoxMachineSpec) -> Result<Option<String>, String> {
    let Some(model) = &spec.cpu_type else {
        if spec.cpu_flags.is_empty() {
            return Ok(None);
        }
        return Err("cpuFlags needs cpuType: flags change a CPU model".to_owned());
    };
    Ok(Some(if spec.cpu_flags.is_empty() {
        model.clone()
    } else {
        format!("{model},flags={}", spec.cpu_flags.join(";"))
    }))
}

/// The model and flags of a `cpu` option, for comparison (`cputype=` is the default key).
fn cpu_parts(value: &str) -> (String, String) {
    let mut model = String::new();
    let mut flags = String::new();
    for part in value.split(',') {
        match part.split_once('=') {
            Some(("cputype", v)) => model = v.to_owned(),
            Some(("flags", v)) => flags = v.to_owned(),
            Some(_) => {}
            None => model = part.to_owned(),
        }
    }
    (model, flags)
}

/// The `hostpciN` value of a mapped device.
fn hostpci_value(device: &banlieue_api::infrastructure::PciDevice) -> String {
    let mut value = format!("mapping={}", device.mapping);
    if device.pcie == Some(true) {
        value.push_str(",pcie=1");
    }
    if device.primary_gpu == Some(true) {
        value.push_str(",x-vga=1");
    }
    value
}

/// What the new VM's config still lacks of the spec's firmware, TPM, CPU model and PCI
/// devices (empty when nothing).
pub fn hardware_update(spec: &ProxmoxMachineSpec, actual: &VmConfig) -> Result<ConfigUpdate, String> {
    let uefi = spec.firmware == Some(Firmware::UEFI);
    let secure_boot = spec.secure_boot == Some(true);
    if secure_boot && !uefi {
        return Err("secureBoot needs firmware: UEFI".to_owned());
    }
    let mut update = ConfigUpdate::default();
    match spec.firmware {
        Some(Firmware::UEFI) => {
            if actual.get("bios") != Some("ovmf") {
                update = update.set("bios", "ovmf");
            }
            if actual.get("efidisk0").is_none() {
                let storage = volume_storage(spec, actual)?;
                update = update.set(
                    "efidisk0",
                    format!(
                        "{storage}:1,efitype=4m,pre-enrolled-keys={}",
                        u8::from(secure_boot)
                    ),
                );
            }
        }
        Some(Firmware::BIOS) if actual.get("bios") == Some("ovmf") => {
            update = update.set("bios", "seabios");
        }
        _ => {}
    }
    if spec.tpm == Some(true) && actual.get("tpmstate0").is_none() {
        let storage = volume_storage(spec, actual)?;
        update = update.set("tpmstate0", format!("{storage}:1,version=v2.0"));
    }
    if let Some(cpu) = cpu_option(spec)?
        && actual.get("cpu").map(cpu_parts) != Some(cpu_parts(&cpu))
    {
        update = update.set("cpu", cpu);
    }
    for (index, device) in spec.pci_devices.iter().enumerate() {
        let key = format!("hostpci{index}");
        let value = hostpci_value(device);
        if actual.get(&key) != Some(value.as_str()) {
            update = update.set(key, value);
        }
    }
    let pcie = spec.pci_devices.iter().any(|d| d.pcie == Some(true));
    if pcie && !actual.get("machine").is_some_and(|m| m.contains("q35")) {
        update = update.set("machine", "q35");
    }
    Ok(update)
}

/// The disk (not a CD-ROM) in `slot` of the VM, if there is one.
pub fn disk_at(actual: &VmConfig, slot: &str) -> Option<DiskSpec> {
    let disk: DiskSpec = actual.get(slot)?.parse().ok()?;
    (!disk.is_cdrom()).then_some(disk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::infrastructure::PciDevice;

    fn config(pairs: &[(&str, &str)]) -> VmConfig {
        VmConfig(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    fn spec() -> ProxmoxMachineSpec {
        serde_json::from_value(serde_json::json!({
            "source": {"vmid": 9000}, "cpu": {"cores": 2}, "memoryMiB": 2048,
        }))
        .expect("a spec")
    }

    #[test]
    fn uefi_with_secure_boot_and_a_tpm_on_the_boot_disks_storage() {
        let spec = ProxmoxMachineSpec {
            firmware: Some(Firmware::UEFI),
            secure_boot: Some(true),
            tpm: Some(true),
            ..spec()
        };
        let actual = config(&[("scsi0", "ceph:vm-101-disk-0,size=8G")]);
        let update = hardware_update(&spec, &actual).unwrap();
        assert_eq!(update.set.get("bios").map(String::as_str), Some("ovmf"));
        assert_eq!(
            update.set.get("efidisk0").map(String::as_str),
            Some("ceph:1,efitype=4m,pre-enrolled-keys=1")
        );
        assert_eq!(
            update.set.get("tpmstate0").map(String::as_str),
            Some("ceph:1,version=v2.0")
        );
        // Once written, nothing more.
        let done = config(&[
            ("scsi0", "ceph:vm-101-disk-0,size=8G"),
            ("bios", "ovmf"),
            (
                "efidisk0",
                "ceph:vm-101-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M",
            ),
            ("tpmstate0", "ceph:vm-101-disk-2,size=4M,version=v2.0"),
        ]);
        assert_eq!(hardware_update(&spec, &done).unwrap(), ConfigUpdate::default());
    }

    #[test]
    fn cpu_model_and_flags_and_mapped_pci_devices() {
        let spec = ProxmoxMachineSpec {
            cpu_type: Some("x86-64-v2-AES".into()),
            cpu_flags: vec!["+aes".into(), "-pcid".into()],
            pci_devices: vec![PciDevice {
                mapping: "gpu".into(),
                pcie: Some(true),
                primary_gpu: Some(true),
            }],
            ..spec()
        };
        let update = hardware_update(&spec, &config(&[("cpu", "kvm64")])).unwrap();
        assert_eq!(
            update.set.get("cpu").map(String::as_str),
            Some("x86-64-v2-AES,flags=+aes;-pcid")
        );
        assert_eq!(
            update.set.get("hostpci0").map(String::as_str),
            Some("mapping=gpu,pcie=1,x-vga=1")
        );
        assert_eq!(update.set.get("machine").map(String::as_str), Some("q35"));
        let done = config(&[
            ("cpu", "cputype=x86-64-v2-AES,flags=+aes;-pcid"),
            ("hostpci0", "mapping=gpu,pcie=1,x-vga=1"),
            ("machine", "pc-q35-9.2"),
        ]);
        assert_eq!(hardware_update(&spec, &done).unwrap(), ConfigUpdate::default());
    }

    #[test]
    fn contradictions_are_refused_with_what_to_change() {
        let secure_bios = ProxmoxMachineSpec {
            secure_boot: Some(true),
            ..spec()
        };
        let err = hardware_update(&secure_bios, &config(&[])).unwrap_err();
        assert!(err.contains("firmware: UEFI"), "{err}");
        let flags_only = ProxmoxMachineSpec {
            cpu_flags: vec!["+aes".into()],
            ..spec()
        };
        let err = hardware_update(&flags_only, &config(&[])).unwrap_err();
        assert!(err.contains("cpuType"), "{err}");
        let no_storage = ProxmoxMachineSpec {
            tpm: Some(true),
            ..spec()
        };
        let err = hardware_update(&no_storage, &config(&[])).unwrap_err();
        assert!(err.contains("spec.storage"), "{err}");
    }
}
