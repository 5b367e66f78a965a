//! Pure functions from a LibvirtMachine to what should exist on the host: names of the domain
//! and its volumes, the domain configuration, the NoCloud seed, addresses and the providerID.

use banlieue_api::common::{Firmware, MachineAddress, MachineAddressType, NetworkInterface, SeedDriveBus};
use banlieue_api::infrastructure::LibvirtMachineSpec;
use banlieue_cloudinit::{MetaData, NoCloudSeed};
use banlieue_provider_kit::network::{self, PoolAddresses};

use crate::hypervisor::GuestAddress;
use crate::xml::{
    DiskConfig, DomainConfig, DomainType, FirmwareConfig, KernelBoot, NicConfig, NicSource, Owner,
};

/// Prefix of `spec.providerID`: `libvirt://<host>/<domain uuid>`.
pub const PROVIDER_ID_PREFIX: &str = "libvirt://";
/// Bytes per GiB.
pub const GIB: u64 = 1 << 30;
/// The libvirt network used when a machine lists no network interface.
pub const DEFAULT_NETWORK: &str = "default";

/// Host-wide settings of the provider (binary flags), not part of any object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `kvm` on real hosts, `qemu` (TCG) where hardware virtualization is unavailable.
    pub domain_type: DomainType,
    /// Directory on the libvirt host for serial console logs (`<dir>/<domain>.serial`); unset:
    /// no log file.
    pub serial_log_dir: Option<String>,
    /// Direct kernel boot for every domain (tests with a kernel + initramfs guest).
    pub kernel_boot: Option<KernelBoot>,
}

/// Domain name for a machine: `<namespace>_<name>` (both are DNS names, so `_` cannot be part
/// of either: the mapping is injective).
pub fn domain_name(namespace: &str, name: &str) -> String {
    format!("{namespace}_{name}")
}

/// Storage pool of the machine's volumes: `spec.storagePool`, else the source's pool.
pub fn machine_pool(spec: &LibvirtMachineSpec) -> &str {
    spec.storage_pool.as_deref().unwrap_or(&spec.source.pool)
}

/// One volume the machine needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumePlan {
    /// Pool.
    pub pool: String,
    /// Volume name.
    pub name: String,
    /// Size in bytes (the boot disk: at least the base volume's size).
    pub capacity_gib: Option<u64>,
    /// Boot disk: an overlay on the source volume.
    pub boot: bool,
}

/// The disk volumes of a machine, boot disk first. With no `spec.disks`, one boot disk of the
/// base volume's size.
pub fn disk_volumes(spec: &LibvirtMachineSpec, domain: &str) -> Vec<VolumePlan> {
    let pool = machine_pool(spec);
    if spec.disks.is_empty() {
        return vec![VolumePlan {
            pool: pool.to_owned(),
            name: format!("{domain}-root.qcow2"),
            capacity_gib: None,
            boot: true,
        }];
    }
    spec.disks
        .iter()
        .enumerate()
        .map(|(i, d)| VolumePlan {
            pool: d.storage.clone().unwrap_or_else(|| pool.to_owned()),
            name: format!("{domain}-{}.qcow2", d.name),
            capacity_gib: Some(d.size_gib),
            boot: i == 0,
        })
        .collect()
}

/// The seed volume: `(pool, name)`.
pub fn seed_volume(spec: &LibvirtMachineSpec, domain: &str) -> (String, String) {
    (machine_pool(spec).to_owned(), format!("{domain}-seed.iso"))
}

/// A MAC address derived from the machine UID and the interface index (`52:54:00` is QEMU's
/// prefix), stable across reconciles so that an adopted domain keeps its leases.
pub fn mac_address(uid: &str, index: usize) -> String {
    // FNV-1a, 64 bit.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes().chain(index.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "52:54:00:{:02x}:{:02x}:{:02x}",
        (h >> 16) as u8,
        (h >> 8) as u8,
        h as u8
    )
}

/// The MAC of interface `i`: the spec's (lower case), else [`mac_address`].
fn nic_mac(uid: &str, i: usize, net: &NetworkInterface) -> String {
    net.mac_address
        .as_ref()
        .map_or_else(|| mac_address(uid, i), |m| m.to_ascii_lowercase())
}

/// The seed cdrom's device name and bus for `seedDriveBus` (SATA when unset).
pub fn seed_drive(bus: Option<SeedDriveBus>) -> (&'static str, &'static str) {
    match bus {
        None | Some(SeedDriveBus::Sata) => ("sda", "sata"),
        Some(SeedDriveBus::Scsi) => ("sda", "scsi"),
        Some(SeedDriveBus::Ide) => ("hdc", "ide"),
    }
}

/// The domain configuration for a machine.
pub fn domain_config(
    spec: &LibvirtMachineSpec,
    owner: &Owner,
    uuid: &str,
    settings: &Settings,
) -> DomainConfig {
    let name = domain_name(&owner.namespace, &owner.name);
    let mut disks: Vec<DiskConfig> = disk_volumes(spec, &name)
        .into_iter()
        .enumerate()
        .map(|(i, v)| DiskConfig {
            pool: v.pool,
            volume: v.name,
            target: format!("vd{}", (b'a' + (i as u8 % 26)) as char),
            cdrom: false,
            bus: "virtio",
            format: "qcow2".into(),
        })
        .collect();
    let (seed_pool, seed_name) = seed_volume(spec, &name);
    let (target, bus) = seed_drive(spec.seed_drive_bus);
    disks.push(DiskConfig {
        pool: seed_pool,
        volume: seed_name,
        target: target.into(),
        cdrom: true,
        bus,
        format: "raw".into(),
    });
    // No network asked for: one DHCP interface on libvirt's default network.
    let default = [NetworkInterface::dhcp("", DEFAULT_NETWORK)];
    let networks = if spec.networks.is_empty() {
        &default[..]
    } else {
        &spec.networks[..]
    };
    let nics = networks
        .iter()
        .enumerate()
        .map(|(i, n)| NicConfig {
            source: match n.network.strip_prefix("bridge:") {
                Some(bridge) => NicSource::Bridge(bridge.to_owned()),
                None => NicSource::Network(n.network.clone()),
            },
            mac: nic_mac(&owner.uid, i, n),
            model: n.model.clone().unwrap_or_else(|| "virtio".into()),
            mtu: n.mtu,
            vlan: n.vlan,
        })
        .collect();
    DomainConfig {
        serial_log: settings
            .serial_log_dir
            .as_ref()
            .map(|dir| format!("{}/{name}.serial", dir.trim_end_matches('/'))),
        name,
        uuid: uuid.to_owned(),
        domain_type: settings.domain_type,
        sockets: spec.cpu.sockets.unwrap_or(1),
        cores: spec.cpu.cores,
        memory_mib: spec.memory_mib,
        disks,
        nics,
        firmware: match (spec.firmware, spec.secure_boot) {
            (Some(Firmware::UEFI), Some(true)) => FirmwareConfig::UefiSecureBoot,
            (Some(Firmware::UEFI), _) => FirmwareConfig::Uefi,
            _ => FirmwareConfig::Bios,
        },
        cpu_model: spec.cpu_type.clone(),
        cpu_flags: spec.cpu_flags.clone(),
        tpm: spec.tpm == Some(true),
        pci_devices: spec
            .pci_devices
            .iter()
            .map(|d| d.address.to_ascii_lowercase())
            .collect(),
        kernel_boot: settings.kernel_boot.clone(),
        owner: owner.clone(),
        adopted_from: None,
    }
}

/// Keeps the MAC addresses a domain already has (`current`, in interface order) for the
/// interfaces whose MAC the spec does not set: generated MACs derive from the owner's UID, and a
/// machine re-created with a new UID (`clusterctl move`, a restore) must not change them.
pub fn keep_macs(config: &mut DomainConfig, spec: &LibvirtMachineSpec, current: &[String]) {
    for (i, nic) in config.nics.iter_mut().enumerate() {
        let explicit = spec.networks.get(i).is_some_and(|n| n.mac_address.is_some());
        if let Some(mac) = current.get(i).filter(|_| !explicit) {
            nic.mac = mac.to_ascii_lowercase();
        }
    }
}

/// The NoCloud seed: user data byte for byte, instance-id = machine UID, hostname = machine
/// name, and a `network-config` matching each interface by its MAC when `spec.networks` asks
/// for more than DHCP on the first interface (static or pool addresses, IPv6, MTU, DNS).
/// `Err`: an address from an IPAM pool is not allocated yet.
pub fn seed(
    owner: &Owner,
    spec: &LibvirtMachineSpec,
    user_data: &[u8],
    pool: &PoolAddresses,
) -> Result<NoCloudSeed, String> {
    let network_config = if network::needs_network_config(&spec.networks) {
        let mac = |i, net: &NetworkInterface| Ok(Some(nic_mac(&owner.uid, i, net)));
        Some(network::network_config(&spec.networks, mac, pool)?)
    } else {
        None
    };
    Ok(NoCloudSeed {
        user_data: user_data.to_vec(),
        meta_data: MetaData {
            instance_id: owner.uid.clone(),
            local_hostname: owner.name.clone(),
        },
        network_config,
    })
}

/// `libvirt://<host>/<uuid>`.
pub fn provider_id(host: &str, uuid: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{host}/{}", uuid.to_ascii_lowercase())
}

/// Machine addresses from the DHCP leases of the domain's interfaces: IPv4 first (in interface
/// order), then IPv6, then the hostname. Empty when the guest has no lease yet.
pub fn addresses(leases: &[GuestAddress], macs: &[String], hostname: &str) -> Vec<MachineAddress> {
    let rank = |a: &GuestAddress| macs.iter().position(|m| *m == a.mac).unwrap_or(usize::MAX);
    let mut ips: Vec<&GuestAddress> = leases.iter().filter(|a| !a.ip.is_empty()).collect();
    ips.sort_by_key(|a| (a.ip.contains(':'), rank(a)));
    ips.dedup_by(|a, b| a.ip == b.ip);
    if ips.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<MachineAddress> = ips
        .into_iter()
        .map(|a| MachineAddress::new(MachineAddressType::InternalIP, a.ip.clone()))
        .collect();
    out.push(MachineAddress::new(MachineAddressType::Hostname, hostname));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::{Disk, NetworkInterface};
    use pretty_assertions::assert_eq;

    fn spec() -> LibvirtMachineSpec {
        serde_json::from_value(serde_json::json!({
            "source": {"volume": "base.qcow2", "pool": "images"},
            "cpu": {"cores": 2},
            "memoryMiB": 1024
        }))
        .unwrap()
    }

    fn owner() -> Owner {
        Owner {
            uid: "0b5a8f1e-8a57-4d6c-9a38-9b4e3c1f6a10".into(),
            namespace: "ns".into(),
            name: "m1".into(),
        }
    }

    #[test]
    fn without_disks_one_boot_overlay_of_the_base_size_in_the_source_pool() {
        assert_eq!(
            disk_volumes(&spec(), "ns_m1"),
            vec![VolumePlan {
                pool: "images".into(),
                name: "ns_m1-root.qcow2".into(),
                capacity_gib: None,
                boot: true
            }]
        );
    }

    #[test]
    fn disks_keep_order_and_take_their_pool() {
        let mut s = spec();
        s.storage_pool = Some("fast".into());
        s.disks = vec![
            Disk {
                name: "root".into(),
                size_gib: 20,
                storage: None,
            },
            Disk {
                name: "data".into(),
                size_gib: 5,
                storage: Some("bulk".into()),
            },
        ];
        let v = disk_volumes(&s, "ns_m1");
        assert_eq!(
            v.iter()
                .map(|v| (v.pool.as_str(), v.name.as_str(), v.capacity_gib, v.boot))
                .collect::<Vec<_>>(),
            vec![
                ("fast", "ns_m1-root.qcow2", Some(20), true),
                ("bulk", "ns_m1-data.qcow2", Some(5), false)
            ]
        );
        assert_eq!(seed_volume(&s, "ns_m1"), ("fast".into(), "ns_m1-seed.iso".into()));
    }

    /// The CPU model with its required and disabled features, and a TPM 2.0, in the domain XML.
    #[test]
    fn cpu_model_flags_and_tpm_reach_the_domain_xml() {
        let settings = Settings {
            domain_type: DomainType::Kvm,
            serial_log_dir: None,
            kernel_boot: None,
        };
        let mut s = spec();
        s.cpu_type = Some("EPYC-Rome".into());
        s.cpu_flags = vec!["+aes".into(), "-pcid".into()];
        s.tpm = Some(true);
        let xml = crate::xml::domain_xml(&domain_config(&s, &owner(), "uuid-1", &settings));
        for part in [
            "<cpu mode='custom' match='exact'>",
            "<model fallback='forbid'>EPYC-Rome</model>",
            "<feature policy='require' name='aes'/>",
            "<feature policy='disable' name='pcid'/>",
            "<tpm model='tpm-crb'>",
            "<backend type='emulator' version='2.0'/>",
        ] {
            assert!(xml.contains(part), "{part} missing from\n{xml}");
        }
        s.cpu_type = Some("host".into());
        s.cpu_flags.clear();
        s.tpm = None;
        let xml = crate::xml::domain_xml(&domain_config(&s, &owner(), "uuid-1", &settings));
        assert!(xml.contains("<cpu mode='host-passthrough'>"), "{xml}");
        assert!(!xml.contains("<tpm"), "{xml}");
    }

    /// The seed cdrom sits on the bus the spec names: SATA by default, SCSI on a virtio-scsi
    /// controller, IDE as `hdc`.
    #[test]
    fn the_seed_cdrom_is_on_the_bus_the_spec_names() {
        let settings = Settings {
            domain_type: DomainType::Qemu,
            serial_log_dir: None,
            kernel_boot: None,
        };
        for (bus, target, xml_bus, controller) in [
            (None, "sda", "sata", false),
            (Some(SeedDriveBus::Scsi), "sda", "scsi", true),
            (Some(SeedDriveBus::Ide), "hdc", "ide", false),
        ] {
            let mut s = spec();
            s.seed_drive_bus = bus;
            let c = domain_config(&s, &owner(), "uuid-1", &settings);
            let seed = c.disks.iter().find(|d| d.cdrom).expect("the seed cdrom");
            assert_eq!((seed.target.as_str(), seed.bus), (target, xml_bus), "{bus:?}");
            let xml = crate::xml::domain_xml(&c);
            assert!(
                xml.contains(&format!("<target dev='{target}' bus='{xml_bus}'/>")),
                "{xml}"
            );
            assert_eq!(xml.contains("model='virtio-scsi'"), controller, "{xml}");
        }
    }

    #[test]
    fn domain_config_maps_the_spec() {
        let mut s = spec();
        s.cpu.sockets = Some(2);
        s.networks = vec![
            NetworkInterface::dhcp("eth0", "lab"),
            NetworkInterface {
                mac_address: Some("52:54:00:AB:CD:EF".into()),
                ..NetworkInterface::dhcp("eth1", "bridge:br0")
            },
        ];
        s.firmware = Some(Firmware::UEFI);
        let settings = Settings {
            domain_type: DomainType::Qemu,
            serial_log_dir: Some("/var/log/x/".into()),
            kernel_boot: None,
        };
        let c = domain_config(&s, &owner(), "uuid-1", &settings);
        assert_eq!(c.name, "ns_m1");
        assert_eq!((c.sockets, c.cores, c.memory_mib), (2, 2, 1024));
        assert_eq!(c.domain_type, DomainType::Qemu);
        assert_eq!(c.firmware, FirmwareConfig::Uefi);
        s.secure_boot = Some(true);
        let secure = domain_config(&s, &owner(), "uuid-1", &settings);
        assert_eq!(secure.firmware, FirmwareConfig::UefiSecureBoot);
        assert_eq!(c.serial_log.as_deref(), Some("/var/log/x/ns_m1.serial"));
        assert_eq!(c.disks.len(), 2);
        assert_eq!((c.disks[0].target.as_str(), c.disks[0].cdrom), ("vda", false));
        assert_eq!((c.disks[1].target.as_str(), c.disks[1].cdrom), ("sda", true));
        assert_eq!(c.nics[0].source, NicSource::Network("lab".into()));
        assert_eq!(c.nics[0].mac, mac_address(&owner().uid, 0));
        assert_eq!(c.nics[1].source, NicSource::Bridge("br0".into()));
        assert_eq!(c.nics[1].mac, "52:54:00:ab:cd:ef");
    }

    #[test]
    fn no_networks_means_one_nic_on_the_default_network() {
        let c = domain_config(&spec(), &owner(), "u", &Settings::default());
        assert_eq!(c.nics.len(), 1);
        assert_eq!(c.nics[0].source, NicSource::Network(DEFAULT_NETWORK.into()));
        assert_eq!(c.domain_type, DomainType::Kvm);
    }

    #[test]
    fn existing_macs_are_kept_unless_the_spec_sets_one() {
        let mut s = spec();
        s.networks = vec![
            NetworkInterface::dhcp("eth0", "lab"),
            NetworkInterface {
                mac_address: Some("52:54:00:AB:CD:EF".into()),
                ..NetworkInterface::dhcp("eth1", "lab")
            },
            NetworkInterface::dhcp("eth2", "lab"),
        ];
        let mut c = domain_config(&s, &owner(), "u", &Settings::default());
        let current = ["52:54:00:00:00:01".to_owned(), "52:54:00:00:00:02".to_owned()];
        keep_macs(&mut c, &s, &current);
        let macs: Vec<&str> = c.nics.iter().map(|n| n.mac.as_str()).collect();
        let generated = mac_address(&owner().uid, 2);
        assert_eq!(
            macs,
            ["52:54:00:00:00:01", "52:54:00:ab:cd:ef", generated.as_str()],
            "kept, explicit, generated for a new interface"
        );
    }

    #[test]
    fn macs_are_stable_distinct_and_valid() {
        let a = mac_address("uid-a", 0);
        assert_eq!(a, mac_address("uid-a", 0));
        assert_ne!(a, mac_address("uid-a", 1));
        assert_ne!(a, mac_address("uid-b", 0));
        assert!(a.starts_with("52:54:00:") && a.len() == 17);
    }

    #[test]
    fn addresses_ipv4_first_in_interface_order_then_hostname() {
        let macs = vec!["52:54:00:00:00:01".to_owned(), "52:54:00:00:00:02".to_owned()];
        let leases = vec![
            GuestAddress {
                mac: macs[1].clone(),
                ip: "10.0.1.5".into(),
            },
            GuestAddress {
                mac: macs[0].clone(),
                ip: "fd00::5".into(),
            },
            GuestAddress {
                mac: macs[0].clone(),
                ip: "10.0.0.5".into(),
            },
        ];
        let got: Vec<(MachineAddressType, String)> = addresses(&leases, &macs, "m1")
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            got,
            vec![
                (MachineAddressType::InternalIP, "10.0.0.5".into()),
                (MachineAddressType::InternalIP, "10.0.1.5".into()),
                (MachineAddressType::InternalIP, "fd00::5".into()),
                (MachineAddressType::Hostname, "m1".into()),
            ]
        );
        assert!(addresses(&[], &macs, "m1").is_empty());
    }

    #[test]
    fn provider_id_and_seed() {
        assert_eq!(provider_id("h1", "ABC-1"), "libvirt://h1/abc-1");
        let s = seed(&owner(), &spec(), b"#!/bin/sh\necho hi\n", &PoolAddresses::new()).unwrap();
        assert_eq!(s.meta_data.instance_id, owner().uid);
        assert_eq!(s.meta_data.local_hostname, "m1");
        // DHCP on the first interface is the guest's default: no network-config.
        assert_eq!(s.network_config, None);
        let files = banlieue_cloudinit::SeedFiles::from_iso(&s.to_iso().unwrap()).unwrap();
        assert_eq!(files.user_data.as_deref(), Some(&b"#!/bin/sh\necho hi\n"[..]));
        assert_eq!(files.network_config, None);
    }

    #[test]
    fn static_and_pool_addresses_reach_the_seed_matched_by_the_domains_macs() {
        let mut s = spec();
        s.networks = serde_json::from_value(serde_json::json!([
            {"name": "eth0", "network": "default",
             "ipv4": {"mode": "Static", "addresses": ["192.0.2.10/24"], "gateway": "192.0.2.1"}},
            {"name": "eth1", "network": "bridge:br1", "macAddress": "52:54:00:AA:BB:CC",
             "ipv4": {"mode": "Pool", "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}}}
        ]))
        .unwrap();
        let err = seed(&owner(), &s, b"x", &PoolAddresses::new()).unwrap_err();
        assert!(err.contains("eth1: no address from the IPAM pool yet"), "{err}");
        let mut pool = PoolAddresses::new();
        pool.insert(
            ("eth1".into(), false),
            banlieue_capi::ipam::Allocation {
                address: "198.51.100.7".parse().unwrap(),
                prefix: 24,
                gateway: None,
            },
        );
        let files = banlieue_cloudinit::SeedFiles::from_iso(
            &seed(&owner(), &s, b"x", &pool).unwrap().to_iso().unwrap(),
        )
        .unwrap();
        let config = files.parsed_network_config().unwrap().unwrap();
        let domain = domain_config(&s, &owner(), "u", &Settings::default());
        let eth0 = &config.ethernets["eth0"];
        assert_eq!(eth0.match_mac.as_ref().unwrap().macaddress, domain.nics[0].mac);
        assert_eq!(eth0.addresses, vec!["192.0.2.10/24".to_owned()]);
        let eth1 = &config.ethernets["eth1"];
        assert_eq!(eth1.match_mac.as_ref().unwrap().macaddress, "52:54:00:aa:bb:cc");
        assert_eq!(eth1.addresses, vec!["198.51.100.7/24".to_owned()]);
    }
}
