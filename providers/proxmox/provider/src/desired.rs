//! Desired Proxmox VE state of a machine, derived from its spec (pure): the VM config to apply,
//! the disks to grow, the ownership markers, and the NoCloud seed carrying the bootstrap data.

use std::collections::BTreeSet;
use std::net::IpAddr;

use banlieue_api::common::{
    IpAddressingMode, MachineAddress, MachineAddressType, NetworkInterface, SeedDriveBus,
};
use banlieue_api::infrastructure::ProxmoxMachineSpec;
use banlieue_capi::bootstrap::{BootstrapData, BootstrapFormat};
use banlieue_cloudinit::{MetaData, NetworkConfig, NoCloudSeed};
use banlieue_pve_client::config::{is_disk_key, normalize_tags};
use banlieue_pve_client::{ConfigUpdate, DiskSpec, NetDevice, Size, VmConfig};

use banlieue_provider_kit::network::PoolAddresses;

use crate::hardware::disk_at;

/// Prefix of the tag put on every VM this provider creates; the owner's UID follows.
pub const OWNER_TAG_PREFIX: &str = "banlieue-uid-";
/// A label key's name part as a tag: after the prefix (`cluster.x-k8s.io/cluster-name` →
/// `cluster-name`), lower-cased, characters a tag cannot hold as `_`.
fn label_tag_name(key: &str) -> String {
    tag_text(key.rsplit('/').next().unwrap_or(key))
}

/// `text` lower-cased with every character outside `[a-z0-9_+.-]` as `_`.
fn tag_text(text: &str) -> String {
    text.chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The tags of `spec.tagsFromLabels`: `<name>.<value>` for each listed key the machine's
/// `labels` carry (`<name>` alone for an empty value), in the keys' order.
pub fn label_tags(labels: &std::collections::BTreeMap<String, String>, keys: &[String]) -> Vec<String> {
    keys.iter()
        .filter_map(|key| {
            let value = labels.get(key)?;
            let name = label_tag_name(key);
            Some(if value.is_empty() {
                name
            } else {
                format!("{name}.{}", tag_text(value))
            })
        })
        .collect()
}

/// Marker line prefix in the VM description (set at clone time, before tags can be written).
pub const OWNER_DESCRIPTION_MARKER: &str = "banlieue.io/owner-uid: ";
/// Drive slot the seed ISO is attached to by default (`seedDriveBus` unset).
pub const SEED_SLOT: &str = "ide2";

/// The drive slot the machine's seed ISO is attached to (its `seedDriveBus`): `ide2` (the
/// default, PVE's own cloud-init slot on x86), `sata5` or `scsi30` (the last slot of each bus).
pub fn seed_slot(spec: &ProxmoxMachineSpec) -> &'static str {
    match spec.seed_drive_bus {
        None | Some(SeedDriveBus::Ide) => SEED_SLOT,
        Some(SeedDriveBus::Sata) => "sata5",
        Some(SeedDriveBus::Scsi) => "scsi30",
    }
}

/// The spec asks for something Proxmox cannot do or the VM contradicts; permanent until the spec
/// (or the template) changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

fn spec_err(msg: impl Into<String>) -> SpecError {
    SpecError(msg.into())
}

/// The tag marking a VM as created for the object with this UID.
pub fn owner_tag(uid: &str) -> String {
    format!("{OWNER_TAG_PREFIX}{}", uid.to_ascii_lowercase())
}

/// The description given to the clone: names the object and carries the owner marker, so a
/// clone can be recognised (and adopted) before its tags can be set.
pub fn owner_description(uid: &str, namespace: &str, name: &str) -> String {
    format!(
        "Created by banlieue-proxmox for ProxmoxMachine {namespace}/{name}.\n{OWNER_DESCRIPTION_MARKER}{uid}\n"
    )
}

/// Whether the VM config carries this owner's marker (description line or tag).
pub fn is_owned_by(config: &VmConfig, uid: &str) -> bool {
    let by_description = config.get("description").is_some_and(|d| {
        d.lines()
            .any(|l| l.trim() == format!("{OWNER_DESCRIPTION_MARKER}{uid}"))
    });
    let by_tag = config
        .tags()
        .is_ok_and(|tags| tags.iter().any(|t| *t == owner_tag(uid)));
    by_description || by_tag
}

/// File name of the seed ISO of the object with this UID.
pub fn seed_file_name(uid: &str) -> String {
    format!("banlieue-seed-{}.iso", uid.to_ascii_lowercase())
}

/// Volume id of the seed ISO on `storage`.
pub fn seed_volid(storage: &str, uid: &str) -> String {
    format!("{storage}:iso/{}", seed_file_name(uid))
}

/// `proxmox://<smbios uuid>`, the providerID format (lower-case uuid, as the kubelet's
/// `/sys/class/dmi/id/product_uuid` shows it on Proxmox guests).
pub fn provider_id(config: &VmConfig) -> Option<String> {
    config
        .smbios_uuid()
        .filter(|u| !u.is_empty())
        .map(|u| format!("proxmox://{}", u.to_ascii_lowercase()))
}

/// The storage a full clone puts every disk on: `spec.storage`, else the first disk's own.
pub fn full_clone_storage(spec: &ProxmoxMachineSpec) -> Option<String> {
    spec.storage
        .clone()
        .or_else(|| spec.disks.first()?.storage.clone())
}

/// The next thing to do to bring a cloned VM to its desired configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigureAction {
    /// Apply these config changes.
    Apply(ConfigUpdate),
    /// Grow `disk` to `size`.
    Resize {
        /// Drive slot, e.g. `scsi0`.
        disk: String,
        /// New absolute size.
        size: Size,
    },
    /// The seed ISO is not attached yet: upload it if needed, then attach it.
    Seed,
    /// Nothing left to do.
    Done,
}

/// The config changes, disk growth and seed attachment still missing, in that order.
pub fn next_configure_action(
    spec: &ProxmoxMachineSpec,
    uid: &str,
    actual: &VmConfig,
    seed_volid: &str,
) -> Result<ConfigureAction, SpecError> {
    check_seed_slot(spec, actual)?;
    let update = config_update(spec, uid, actual)?;
    if update != ConfigUpdate::default() {
        return Ok(ConfigureAction::Apply(update));
    }
    // Firmware, TPM, CPU model, PCI devices: at creation only (not in the update path).
    let hardware = crate::hardware::hardware_update(spec, actual).map_err(SpecError)?;
    if hardware != ConfigUpdate::default() {
        return Ok(ConfigureAction::Apply(hardware));
    }
    if let Some((disk, size)) = disk_to_grow(spec, actual)? {
        return Ok(ConfigureAction::Resize { disk, size });
    }
    if !seed_attached(actual, seed_volid) {
        return Ok(ConfigureAction::Seed);
    }
    Ok(ConfigureAction::Done)
}

/// The seed's slot ([`seed_slot`]) must be free for a CD-ROM: not a disk of the spec, not a disk
/// of the template.
fn check_seed_slot(spec: &ProxmoxMachineSpec, actual: &VmConfig) -> Result<(), SpecError> {
    let slot = seed_slot(spec);
    if spec.disks.iter().any(|d| d.name == slot) {
        return Err(spec_err(format!(
            "disk {slot} is the slot of the seed drive (seedDriveBus): name the disk differently or choose another bus"
        )));
    }
    if disk_at(actual, slot).is_some() {
        return Err(spec_err(format!(
            "the template has a disk in {slot}, the slot of the seed drive (seedDriveBus): choose another bus"
        )));
    }
    Ok(())
}

/// Whether `update` adds, changes or removes a device (a disk or a NIC): PVE does not store
/// those as written (a new NIC gets a MAC, a new disk a volume, a removed disk becomes
/// `unused`), so the config must be read again after such an update.
pub fn changes_devices(update: &ConfigUpdate) -> bool {
    let is_net = |key: &str| {
        key.strip_prefix("net")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    update
        .set
        .keys()
        .chain(&update.delete)
        .any(|key| is_disk_key(key) || is_net(key))
}

/// Whether the seed volume is attached (on any drive: the slot depends on `seedDriveBus`).
pub fn seed_attached(actual: &VmConfig, seed_volid: &str) -> bool {
    actual.0.iter().any(|(key, value)| {
        is_disk_key(key) && value.parse::<DiskSpec>().is_ok_and(|d| d.volume == seed_volid)
    })
}

/// The update attaching the seed ISO as a cdrom in `slot` ([`seed_slot`]).
pub fn attach_seed(slot: &str, seed_volid: &str) -> ConfigUpdate {
    ConfigUpdate::default().set(slot, format!("{seed_volid},media=cdrom"))
}

/// The update ejecting the seed ISO from `slot` ([`seed_slot`]; live-applicable on a running
/// VM).
pub fn eject_seed(slot: &str) -> ConfigUpdate {
    ConfigUpdate::default().set(slot, "none,media=cdrom")
}

fn num(actual: &VmConfig, key: &str, default: u64) -> u64 {
    actual.get(key).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn net_index(name: &str) -> Result<u8, SpecError> {
    name.strip_prefix("net")
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|n| *n <= 31 && name.len() > 3)
        .ok_or_else(|| {
            spec_err(format!(
                "network {name:?}: Proxmox interfaces are named net0…net31"
            ))
        })
}

/// The config changes the spec asks for relative to `actual` (empty when in sync).
pub fn config_update(
    spec: &ProxmoxMachineSpec,
    uid: &str,
    actual: &VmConfig,
) -> Result<ConfigUpdate, SpecError> {
    let mut update = ConfigUpdate::default();
    let cores = u64::from(spec.cpu.cores);
    if num(actual, "cores", 1) != cores {
        update = update.set("cores", cores.to_string());
    }
    let sockets = u64::from(spec.cpu.sockets.unwrap_or(1));
    if num(actual, "sockets", 1) != sockets {
        update = update.set("sockets", sockets.to_string());
    }
    if actual.memory_mib() != Some(spec.memory_mib) {
        update = update.set("memory", spec.memory_mib.to_string());
    }
    for net in &spec.networks {
        let index = net_index(&net.name)?;
        let current = actual
            .net(index)
            .map_err(|e| spec_err(format!("{}: cannot read the VM's device: {e}", net.name)))?;
        let mtu = net
            .mtu
            .map(|m| u16::try_from(m).map_err(|_| spec_err(format!("{}: mtu {m} too large", net.name))))
            .transpose()?;
        let mut want = current.clone().unwrap_or_else(|| NetDevice::virtio(&net.network));
        if let Some(model) = &net.model {
            want.model.clone_from(model);
        }
        if let Some(mac) = &net.mac_address {
            want.mac = Some(mac.to_ascii_uppercase());
        }
        want.bridge = Some(net.network.clone());
        want.tag = net.vlan;
        want.mtu = mtu;
        if current.as_ref() != Some(&want) {
            update = update.set(net.name.clone(), want.to_string());
        }
    }
    let current_tags = actual
        .tags()
        .map_err(|e| spec_err(format!("cannot read the VM's tags: {e}")))?;
    let mut wanted: BTreeSet<String> = spec.tags.iter().map(|t| t.to_ascii_lowercase()).collect();
    wanted.insert(owner_tag(uid));
    // Tags of other origins stay; a label's tag whose value changed (or went) is replaced.
    let label_prefixes: Vec<String> = spec
        .tags_from_labels
        .iter()
        .map(|key| format!("{}.", label_tag_name(key)))
        .collect();
    let mut tags: BTreeSet<String> = current_tags
        .iter()
        .filter(|t| wanted.contains(*t) || !label_prefixes.iter().any(|p| t.starts_with(p.as_str())))
        .cloned()
        .collect();
    tags.extend(wanted);
    let tags: Vec<String> = tags.into_iter().collect();
    if tags != current_tags {
        let joined = tags.join(";");
        normalize_tags(&joined).map_err(|e| spec_err(format!("tags: {e}")))?;
        update = update.set("tags", joined);
    }
    for (slot, value) in new_disks(spec, actual)? {
        update = update.set(slot, value);
    }
    // PVE's own cloud-init drive would compete with our NoCloud seed (both are `cidata`).
    for (key, value) in &actual.0 {
        if is_disk_key(key)
            && key != seed_slot(spec)
            && value
                .parse::<DiskSpec>()
                .is_ok_and(|d| is_pve_cloudinit_volume(d.volume_name()))
        {
            update = update.delete(key.clone());
        }
    }
    Ok(update)
}

/// Whether a volume (the part after `storage:`) is a PVE cloud-init drive, named as PVE names
/// them on every storage: `vm-101-cloudinit` on block storage, `101/vm-101-cloudinit.qcow2` on
/// directory, NFS or CIFS storage, plain `cloudinit` in older releases.
pub fn is_pve_cloudinit_volume(volume: &str) -> bool {
    let file = volume.rsplit('/').next().unwrap_or(volume);
    let stem = ["raw", "qcow", "qed", "qcow2", "vmdk", "cloop"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext).and_then(|f| f.strip_suffix('.')))
        .unwrap_or(file);
    let unprefixed = stem
        .strip_prefix("vm-")
        .and_then(|rest| rest.split_once('-'))
        .filter(|(vmid, _)| !vmid.is_empty() && vmid.bytes().all(|b| b.is_ascii_digit()))
        .map_or(stem, |(_, name)| name);
    unprefixed == "cloudinit"
}

/// The data disks of `spec.disks` the VM does not have yet, as PVE creates them: `slot` →
/// `<storage>:<size in GiB>` (a new volume of that size). The storage is the disk's own, else
/// `spec.storage`, else the boot disk's.
fn new_disks(spec: &ProxmoxMachineSpec, actual: &VmConfig) -> Result<Vec<(String, String)>, SpecError> {
    let boot_storage = || disk_at(actual, &boot_disk(actual)?)?.storage().map(str::to_owned);
    let mut out = Vec::new();
    for disk in spec.disks.iter().filter(|d| is_disk_key(&d.name)) {
        if actual.get(&disk.name).is_some() {
            continue;
        }
        let storage = disk
            .storage
            .clone()
            .or_else(|| spec.storage.clone())
            .or_else(boot_storage)
            .ok_or_else(|| {
                spec_err(format!(
                    "disk {}: no storage to create it on; set disks[].storage or spec.storage",
                    disk.name
                ))
            })?;
        out.push((disk.name.clone(), format!("{storage}:{}", disk.size_gib)));
    }
    Ok(out)
}

/// The boot disk slot of a VM: the `bootdisk`/first `boot: order=` entry, else the first of
/// `scsi0`, `virtio0`, `sata0`, `ide0` that is a disk (not a cdrom).
pub fn boot_disk(actual: &VmConfig) -> Option<String> {
    let is_disk = |key: &str| disk_at(actual, key).is_some();
    let from_boot = actual.get("boot").and_then(|b| {
        b.strip_prefix("order=")?
            .split(';')
            .find(|k| is_disk_key(k) && is_disk(k))
            .map(str::to_owned)
    });
    from_boot
        .or_else(|| actual.get("bootdisk").filter(|k| is_disk(k)).map(str::to_owned))
        .or_else(|| {
            ["scsi0", "virtio0", "sata0", "ide0"]
                .into_iter()
                .find(|k| is_disk(k))
                .map(str::to_owned)
        })
}

/// The first disk that is smaller than the spec asks, with its new size.
pub fn disk_to_grow(
    spec: &ProxmoxMachineSpec,
    actual: &VmConfig,
) -> Result<Option<(String, Size)>, SpecError> {
    for (i, disk) in spec.disks.iter().enumerate() {
        let key = if is_disk_key(&disk.name) {
            disk.name.clone()
        } else if i == 0 {
            boot_disk(actual).ok_or_else(|| spec_err("the template has no boot disk to resize"))?
        } else {
            return Err(spec_err(format!(
                "disk {:?}: additional disks must be named by their slot (scsi1, virtio1, …)",
                disk.name
            )));
        };
        // A disk the VM does not have yet is created at its size by the config update.
        let Some(current) = actual.get(&key) else {
            continue;
        };
        let current = current
            .parse::<DiskSpec>()
            .map_err(|e| spec_err(format!("disk {key}: {e}")))?;
        if let Some(want) = disk.storage.as_deref()
            && current.storage().is_some_and(|have| have != want)
        {
            return Err(spec_err(format!(
                "disk {key}: disks[].storage is {want}, but the VM's disk is on {}: the Proxmox \
                 provider does not move existing disks (a full clone puts every disk on \
                 spec.storage, or on the first disk's storage)",
                current.storage().unwrap_or_default()
            )));
        }
        let want = disk
            .size_gib
            .checked_mul(1 << 30)
            .map(Size)
            .ok_or_else(|| spec_err(format!("disk {key}: size too large")))?;
        match current.size {
            Some(have) if have > want => {
                return Err(spec_err(format!(
                    "disk {key} is {have} in the template, larger than the requested {}GiB (disks cannot shrink)",
                    disk.size_gib
                )));
            }
            Some(have) if have == want => {}
            _ => return Ok(Some((key, want))),
        }
    }
    Ok(None)
}

/// The `network-config` v2 for the VM (the kit's, [`banlieue_provider_kit::network`]): one
/// ethernet per interface, matched by the MAC the VM really has. Without `spec.networks`, every
/// NIC of the clone uses DHCP. `pool` holds the addresses allocated from IPAM pools.
pub fn network_config(
    spec: &ProxmoxMachineSpec,
    actual: &VmConfig,
    pool: &PoolAddresses,
) -> Result<NetworkConfig, SpecError> {
    let nets = actual
        .nets()
        .map_err(|e| spec_err(format!("cannot read the VM's network devices: {e}")))?;
    let mac_of = |index: u8, name: &str| {
        nets.get(&index)
            .and_then(|d| d.mac.clone())
            .ok_or_else(|| format!("{name} has no MAC address on the VM"))
    };
    let clone_nics: Vec<NetworkInterface>;
    let networks = if spec.networks.is_empty() {
        clone_nics = nets
            .keys()
            .map(|index| NetworkInterface::dhcp(format!("net{index}"), ""))
            .collect();
        &clone_nics
    } else {
        &spec.networks
    };
    banlieue_provider_kit::network::network_config(
        networks,
        |_, net| {
            let index = net_index(&net.name).map_err(|e| e.0)?;
            mac_of(index, &net.name).map(Some)
        },
        pool,
    )
    .map_err(SpecError)
}

/// The NoCloud seed: `user-data` is the bootstrap Secret's `value` byte for byte, `meta-data`
/// has the VM's SMBIOS uuid as instance-id and the machine name as hostname.
pub fn seed(
    bootstrap: &BootstrapData,
    hostname: &str,
    instance_id: &str,
    spec: &ProxmoxMachineSpec,
    actual: &VmConfig,
    pool: &PoolAddresses,
) -> Result<NoCloudSeed, SpecError> {
    if bootstrap.format != BootstrapFormat::CloudConfig {
        return Err(spec_err(format!(
            "bootstrap data format {} is not supported: the Proxmox provider delivers cloud-init NoCloud seeds",
            bootstrap.format
        )));
    }
    Ok(NoCloudSeed {
        user_data: bootstrap.value.clone(),
        meta_data: MetaData {
            instance_id: instance_id.to_owned(),
            local_hostname: hostname.to_owned(),
        },
        network_config: Some(network_config(spec, actual, pool)?),
    })
}

/// Machine addresses from guest-agent IPs: loopback, link-local and unspecified addresses are
/// dropped; the hostname comes first. Sorted and de-duplicated so status does not flap.
pub fn machine_addresses(hostname: &str, ips: &[IpAddr]) -> Vec<MachineAddress> {
    let usable = |ip: &&IpAddr| match ip {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80,
    };
    let ips: BTreeSet<&IpAddr> = ips.iter().filter(usable).collect();
    std::iter::once(MachineAddress::new(MachineAddressType::Hostname, hostname))
        .chain(
            ips.into_iter()
                .map(|ip| MachineAddress::new(MachineAddressType::InternalIP, ip.to_string())),
        )
        .collect()
}

/// Addresses from the spec's static configuration (for guests without an agent).
pub fn static_addresses(spec: &ProxmoxMachineSpec) -> Vec<IpAddr> {
    spec.networks
        .iter()
        .flat_map(|n| [n.ipv4.as_ref(), n.ipv6.as_ref()])
        .flatten()
        .filter(|a| a.mode == IpAddressingMode::Static)
        .flat_map(|a| a.addresses.iter())
        .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::{Cpu, Disk, IpAddressing};
    use banlieue_api::infrastructure::ProxmoxTemplateSource;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    const UID: &str = "5b1e0f3c-aaaa-bbbb-cccc-0123456789ab";

    fn spec() -> ProxmoxMachineSpec {
        ProxmoxMachineSpec::new(
            ProxmoxTemplateSource {
                vmid: Some(9000),
                ..ProxmoxTemplateSource::default()
            },
            Cpu::cores(2),
            4096,
        )
    }

    /// A freshly cloned VM, as PVE returns it (memory as a string, MAC first in net0).
    fn clone_config() -> VmConfig {
        VmConfig(
            [
                ("name", "m1"),
                ("cores", "1"),
                ("memory", "2048"),
                ("scsi0", "local-lvm:vm-101-disk-0,size=8G"),
                ("ide2", "local-lvm:vm-101-cloudinit,media=cdrom"),
                ("net0", "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0"),
                ("smbios1", "uuid=0E6B7D4C-1111-2222-3333-444455556666"),
                ("tags", "template;ubuntu"),
                ("boot", "order=scsi0;ide2;net0"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        )
    }

    fn apply(config: &mut VmConfig, update: &ConfigUpdate) {
        for (k, v) in &update.set {
            let v = if k == "tags" {
                normalize_tags(v).unwrap().join(";")
            } else {
                v.clone()
            };
            config.0.insert(k.clone(), v);
        }
        for k in &update.delete {
            config.0.remove(k);
        }
    }

    #[test]
    fn labels_become_tags_named_after_the_key() {
        let labels: std::collections::BTreeMap<String, String> = [
            ("cluster.x-k8s.io/cluster-name", "Prod-EU"),
            ("node-role.kubernetes.io/control-plane", ""),
            ("team", "a b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let keys: Vec<String> = [
            "cluster.x-k8s.io/cluster-name",
            "node-role.kubernetes.io/control-plane",
            "team",
            "absent",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(
            label_tags(&labels, &keys),
            ["cluster-name.prod-eu", "control-plane", "team.a_b"]
        );
        assert!(
            normalize_tags(&label_tags(&labels, &keys).join(";")).is_ok(),
            "valid Proxmox tags"
        );
    }

    #[test]
    fn a_label_tag_whose_value_changed_is_replaced_and_other_tags_stay() {
        let mut s = spec();
        s.tags_from_labels = vec!["cluster.x-k8s.io/cluster-name".into()];
        s.tags = vec!["cluster-name.new".into()];
        let mut vm = clone_config();
        vm.0.insert(
            "tags".into(),
            format!("cluster-name.old;manual;{}", owner_tag(UID)),
        );
        let update = config_update(&s, UID, &vm).unwrap();
        assert_eq!(
            update.set.get("tags").map(String::as_str),
            Some(format!("{};cluster-name.new;manual", owner_tag(UID)).as_str())
        );
    }

    #[test]
    fn a_fresh_clone_gets_cpu_memory_tags_and_loses_the_pve_cloudinit_drive() {
        let update = config_update(&spec(), UID, &clone_config()).unwrap();
        assert_eq!(update.set.get("cores").map(String::as_str), Some("2"));
        assert_eq!(update.set.get("memory").map(String::as_str), Some("4096"));
        assert!(!update.set.contains_key("sockets"), "1 socket is the default");
        assert_eq!(
            update.set.get("tags").map(String::as_str),
            Some(format!("{};template;ubuntu", owner_tag(UID)).as_str())
        );
        assert!(
            update.delete.is_empty(),
            "a cloud-init drive in the seed slot is replaced by the seed later: {:?}",
            update.delete
        );
    }

    #[rstest]
    #[case::block_storage("local-lvm:vm-101-cloudinit,media=cdrom")]
    #[case::directory_storage("local:101/vm-101-cloudinit.qcow2,media=cdrom")]
    #[case::raw_on_nfs("nfs:101/vm-101-cloudinit.raw,media=cdrom")]
    #[case::old_release("local:cloudinit,media=cdrom")]
    fn the_pve_cloudinit_drive_outside_the_seed_slot_is_removed(#[case] drive: &str) {
        let mut config = clone_config();
        config.0.remove("ide2");
        config.0.insert("ide0".into(), drive.into());
        let update = config_update(&spec(), UID, &config).unwrap();
        assert_eq!(update.delete, vec!["ide0".to_owned()]);
    }

    #[rstest]
    #[case::data_disk("101/vm-101-disk-0.qcow2")]
    #[case::named_like_it("vm-101-cloudinit-backup")]
    #[case::another_vmid_prefix("vm-x-cloudinit")]
    #[case::iso("iso/cloudinit-seed.iso")]
    fn other_volumes_are_not_taken_for_a_pve_cloudinit_drive(#[case] volume: &str) {
        assert!(!is_pve_cloudinit_volume(volume), "{volume}");
    }

    #[test]
    fn applying_the_update_converges() {
        let mut s = spec();
        s.networks = vec![NetworkInterface {
            vlan: Some(20),
            mtu: Some(1450),
            ..NetworkInterface::dhcp("net0", "vmbr1")
        }];
        s.tags = vec!["k8s".into()];
        let mut config = clone_config();
        let update = config_update(&s, UID, &config).unwrap();
        assert_eq!(
            update.set.get("net0").map(String::as_str),
            Some("virtio=BC:24:11:AA:BB:CC,bridge=vmbr1,mtu=1450,tag=20"),
            "the MAC PVE assigned is kept"
        );
        apply(&mut config, &update);
        assert_eq!(config_update(&s, UID, &config).unwrap(), ConfigUpdate::default());
    }

    #[rstest]
    #[case("eth0")]
    #[case("net")]
    #[case("net32")]
    fn network_names_must_be_pve_slots(#[case] name: &str) {
        let mut s = spec();
        s.networks = vec![NetworkInterface::dhcp(name, "vmbr0")];
        let err = config_update(&s, UID, &clone_config()).unwrap_err();
        assert!(err.0.contains("net0…net31"), "{err}");
    }

    #[rstest]
    #[case::boot_disk_by_any_name("root", 32, Some(("scsi0", 32)))]
    #[case::by_slot("scsi0", 20, Some(("scsi0", 20)))]
    #[case::same_size("scsi0", 8, None)]
    fn disks_grow_to_the_requested_size(
        #[case] name: &str,
        #[case] gib: u64,
        #[case] want: Option<(&str, u64)>,
    ) {
        let mut s = spec();
        s.disks = vec![Disk {
            name: name.into(),
            size_gib: gib,
            storage: None,
        }];
        let got = disk_to_grow(&s, &clone_config()).unwrap();
        assert_eq!(got, want.map(|(k, g)| (k.to_owned(), Size::gib(g))));
    }

    #[rstest]
    #[case::shrink("scsi0", 4, None, "cannot shrink")]
    #[case::other_storage("scsi0", 8, Some("ceph"), "does not move existing disks")]
    fn impossible_disks_are_spec_errors(
        #[case] name: &str,
        #[case] gib: u64,
        #[case] storage: Option<&str>,
        #[case] text: &str,
    ) {
        let mut s = spec();
        s.disks = vec![Disk {
            name: name.into(),
            size_gib: gib,
            storage: storage.map(str::to_owned),
        }];
        let err = disk_to_grow(&s, &clone_config()).unwrap_err();
        assert!(err.0.contains(text), "{err}");
    }

    /// Data disks the template lacks are created with their size, on their own storage, else
    /// `spec.storage`, else the boot disk's; they are never "grown" before they exist.
    #[test]
    fn data_disks_the_template_lacks_are_created_on_their_storage() {
        let mut s = spec();
        let disk = |name: &str, gib, storage: Option<&str>| Disk {
            name: name.into(),
            size_gib: gib,
            storage: storage.map(str::to_owned),
        };
        s.disks = vec![
            disk("scsi0", 8, None),
            disk("scsi1", 32, Some("ceph")),
            disk("virtio2", 10, None),
        ];
        let update = config_update(&s, UID, &clone_config()).unwrap();
        let boot_storage = clone_config()
            .get("scsi0")
            .unwrap()
            .split(':')
            .next()
            .unwrap()
            .to_owned();
        assert_eq!(update.set.get("scsi1").map(String::as_str), Some("ceph:32"));
        assert_eq!(
            update.set.get("virtio2").cloned(),
            Some(format!("{boot_storage}:10"))
        );
        assert_eq!(disk_to_grow(&s, &clone_config()).unwrap(), None);
        s.storage = Some("nfs".into());
        let update = config_update(&s, UID, &clone_config()).unwrap();
        assert_eq!(update.set.get("virtio2").map(String::as_str), Some("nfs:10"));
    }

    #[test]
    fn configure_actions_come_in_order_config_resize_seed_done() {
        let mut s = spec();
        s.disks = vec![Disk {
            name: "scsi0".into(),
            size_gib: 16,
            storage: None,
        }];
        let seed = seed_volid("local", UID);
        let mut config = clone_config();
        let ConfigureAction::Apply(update) = next_configure_action(&s, UID, &config, &seed).unwrap() else {
            panic!("config first");
        };
        apply(&mut config, &update);
        assert_eq!(
            next_configure_action(&s, UID, &config, &seed).unwrap(),
            ConfigureAction::Resize {
                disk: "scsi0".into(),
                size: Size::gib(16)
            }
        );
        config
            .0
            .insert("scsi0".into(), "local-lvm:vm-101-disk-0,size=16G".into());
        assert_eq!(
            next_configure_action(&s, UID, &config, &seed).unwrap(),
            ConfigureAction::Seed
        );
        apply(&mut config, &attach_seed(SEED_SLOT, &seed));
        assert!(seed_attached(&config, &seed));
        assert_eq!(
            next_configure_action(&s, UID, &config, &seed).unwrap(),
            ConfigureAction::Done
        );
    }

    #[test]
    fn ownership_is_recognised_by_description_or_tag_only_for_that_uid() {
        let mut config = clone_config();
        assert!(!is_owned_by(&config, UID));
        config
            .0
            .insert("description".into(), owner_description(UID, "ns", "m1"));
        assert!(is_owned_by(&config, UID));
        assert!(!is_owned_by(&config, "other-uid"));
        let mut tagged = clone_config();
        tagged.0.insert("tags".into(), format!("a;{}", owner_tag(UID)));
        assert!(is_owned_by(&tagged, UID));
        assert!(!is_owned_by(&tagged, "5b1e0f3c"));
    }

    #[test]
    fn provider_id_is_the_lowercase_smbios_uuid() {
        assert_eq!(
            provider_id(&clone_config()).as_deref(),
            Some("proxmox://0e6b7d4c-1111-2222-3333-444455556666")
        );
        assert_eq!(provider_id(&VmConfig::default()), None);
    }

    #[test]
    fn seed_carries_user_data_byte_for_byte_and_matches_nics_by_mac() {
        let bootstrap = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            value: b"#cloud-config\nruncmd: [\"echo \xc3\xa9\"]\n".to_vec(),
        };
        let mut s = spec();
        s.networks = vec![NetworkInterface {
            ipv4: Some(IpAddressing {
                mode: IpAddressingMode::Static,
                addresses: vec!["10.0.0.5/24".into()],
                gateway: Some("10.0.0.1".into()),
                pool_ref: None,
            }),
            dns_servers: vec!["10.0.0.53".into()],
            ..NetworkInterface::dhcp("net0", "vmbr0")
        }];
        let seed = seed(
            &bootstrap,
            "m1",
            "uuid-1",
            &s,
            &clone_config(),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(seed.user_data, bootstrap.value);
        assert_eq!(seed.meta_data.instance_id, "uuid-1");
        assert_eq!(seed.meta_data.local_hostname, "m1");
        let net = seed.network_config.unwrap();
        let eth = &net.ethernets["net0"];
        assert_eq!(eth.match_mac.as_ref().unwrap().macaddress, "bc:24:11:aa:bb:cc");
        assert_eq!(eth.addresses, vec!["10.0.0.5/24".to_owned()]);
        assert_eq!(eth.routes[0].via, "10.0.0.1");
        assert_eq!(eth.dhcp4, None);
        assert_eq!(
            eth.nameservers.as_ref().unwrap().addresses,
            vec!["10.0.0.53".to_owned()]
        );
    }

    #[test]
    fn without_networks_every_nic_uses_dhcp() {
        let bootstrap = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            value: b"x".to_vec(),
        };
        let seed = seed(
            &bootstrap,
            "m1",
            "i",
            &spec(),
            &clone_config(),
            &Default::default(),
        )
        .unwrap();
        let net = seed.network_config.unwrap();
        assert_eq!(net.ethernets.len(), 1);
        assert_eq!(net.ethernets["net0"].dhcp4, Some(true));
    }

    #[test]
    fn ignition_and_ipam_pools_are_refused_with_a_clear_message() {
        let ignition = BootstrapData {
            format: BootstrapFormat::Ignition,
            value: b"{}".to_vec(),
        };
        let err = seed(
            &ignition,
            "m1",
            "i",
            &spec(),
            &clone_config(),
            &Default::default(),
        )
        .unwrap_err();
        assert!(err.0.contains("ignition"), "{err}");
        let mut s = spec();
        s.networks = vec![NetworkInterface {
            ipv4: Some(IpAddressing {
                mode: IpAddressingMode::Pool,
                ..IpAddressing::default()
            }),
            ..NetworkInterface::dhcp("net0", "vmbr0")
        }];
        let cloud = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            value: b"x".to_vec(),
        };
        let err = seed(&cloud, "m1", "i", &s, &clone_config(), &Default::default()).unwrap_err();
        assert!(err.0.contains("IPAM"), "{err}");
    }

    #[test]
    fn a_pool_address_is_written_as_a_static_address_with_its_gateway() {
        let mut s = spec();
        s.networks = vec![NetworkInterface {
            ipv4: Some(IpAddressing {
                mode: IpAddressingMode::Pool,
                ..IpAddressing::default()
            }),
            ..NetworkInterface::dhcp("net0", "vmbr0")
        }];
        let mut pool = PoolAddresses::new();
        pool.insert(
            ("net0".to_owned(), false),
            banlieue_capi::ipam::Allocation {
                address: "10.10.0.5".parse().unwrap(),
                prefix: 24,
                gateway: Some("10.10.0.1".parse().unwrap()),
            },
        );
        let yaml = network_config(&s, &clone_config(), &pool)
            .unwrap()
            .to_yaml()
            .unwrap();
        assert!(yaml.contains("10.10.0.5/24"), "{yaml}");
        assert!(yaml.contains("via: \"10.10.0.1\""), "{yaml}");
        assert!(!yaml.contains("dhcp4: true"), "{yaml}");
    }

    #[test]
    fn addresses_drop_loopback_and_link_local_and_are_sorted() {
        let ips: Vec<IpAddr> = [
            "127.0.0.1",
            "10.0.0.9",
            "fe80::1",
            "::1",
            "10.0.0.5",
            "2001:db8::5",
            "10.0.0.5",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let got = machine_addresses("m1", &ips);
        let shown: Vec<(MachineAddressType, &str)> =
            got.iter().map(|a| (a.type_, a.address.as_str())).collect();
        assert_eq!(
            shown,
            vec![
                (MachineAddressType::Hostname, "m1"),
                (MachineAddressType::InternalIP, "10.0.0.5"),
                (MachineAddressType::InternalIP, "10.0.0.9"),
                (MachineAddressType::InternalIP, "2001:db8::5"),
            ]
        );
    }

    /// The seed's slot is refused when a disk of the spec or of the template holds it.
    #[test]
    fn a_seed_slot_taken_by_a_disk_is_refused() {
        let spec = ProxmoxMachineSpec {
            seed_drive_bus: Some(SeedDriveBus::Sata),
            ..spec()
        };
        assert_eq!(seed_slot(&spec), "sata5");
        let template = VmConfig(
            [("sata5", "local-lvm:vm-101-disk-1,size=4G")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        );
        let err = next_configure_action(&spec, "uid", &template, "local:iso/seed.iso").unwrap_err();
        assert!(err.0.contains("the template has a disk in sata5"), "{err}");
        let in_spec = ProxmoxMachineSpec {
            disks: vec![banlieue_api::common::Disk {
                name: "sata5".into(),
                size_gib: 4,
                storage: None,
            }],
            ..spec.clone()
        };
        let err =
            next_configure_action(&in_spec, "uid", &VmConfig::default(), "local:iso/seed.iso").unwrap_err();
        assert!(
            err.0.contains("disk sata5 is the slot of the seed drive"),
            "{err}"
        );
    }
}
