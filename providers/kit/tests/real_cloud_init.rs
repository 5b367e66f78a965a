//! The seeds every provider writes for cloud-init, read by the real cloud-init (Debian bookworm's
//! package, see `tests/cloud-init/support.rs`): the NoCloud meta-data keeps names that YAML 1.1
//! would retype as strings, and the `network-config` the kit builds from `spec.networks` is
//! understood, renamed and rendered for netplan, ifupdown (eni) and systemd-networkd as asked:
//! DHCP, static and pool addresses, IPv4, IPv6 and dual stack, gateways, DNS, MTU.

#[path = "../../../tests/cloud-init/support.rs"]
mod cloud_init;

use anyhow::{Result, ensure};
use banlieue_api::common::{IpAddressing, IpAddressingMode, NetworkInterface};
use banlieue_capi::ipam::Allocation;
use banlieue_cloudinit::{MetaData, NoCloudSeed};
use banlieue_provider_kit::network::{PoolAddresses, network_config};

/// Valid Kubernetes names that a YAML 1.1 reader retypes when they are written plain.
const RETYPED_NAMES: [&str; 9] = ["on", "no", "y", "off", "null", "0123", "1e3", "2024-01-01", "1-2"];

fn seed_files(seed: &NoCloudSeed) -> Result<Vec<(String, Vec<u8>)>> {
    Ok(seed.files()?.into_iter().map(|f| (f.name, f.data)).collect())
}

#[test]
fn nocloud_meta_data_keeps_names_yaml_1_1_would_retype_as_strings() -> Result<()> {
    for name in RETYPED_NAMES {
        let seed = NoCloudSeed {
            user_data: b"#cloud-config\n".to_vec(),
            meta_data: MetaData {
                instance_id: name.to_owned(),
                local_hostname: name.to_owned(),
            },
            network_config: None,
        };
        let read = cloud_init::read_nocloud(&seed_files(&seed)?)?;
        ensure!(
            read.metadata["local-hostname"] == name && read.instance_id == name,
            "{name:?} read back as {} / {}",
            read.metadata["local-hostname"],
            read.instance_id
        );
        ensure!(read.network_config.is_null() && read.renames.is_empty());
    }
    Ok(())
}

fn addressing(mode: IpAddressingMode, address: Option<&str>, gateway: Option<&str>) -> IpAddressing {
    IpAddressing {
        mode,
        addresses: address.into_iter().map(str::to_owned).collect(),
        gateway: gateway.map(str::to_owned),
        pool_ref: None,
    }
}

/// Three interfaces: static dual stack with DNS and MTU (MAC `52:54:00:12:34:56`, all decimal
/// digits, the shape YAML 1.1 reads as a base-60 integer), pool addresses in both families,
/// DHCP for both families.
fn networks() -> (Vec<NetworkInterface>, PoolAddresses) {
    let mut first = NetworkInterface::dhcp("net0", "vmbr0");
    first.ipv4 = Some(addressing(
        IpAddressingMode::Static,
        Some("192.0.2.10/24"),
        Some("192.0.2.1"),
    ));
    first.ipv6 = Some(addressing(
        IpAddressingMode::Static,
        Some("2001:db8::10/64"),
        Some("2001:db8::1"),
    ));
    first.dns_servers = vec!["192.0.2.53".into(), "2001:db8::53".into()];
    first.mtu = Some(1450);
    let mut second = NetworkInterface::dhcp("net1", "vmbr1");
    second.ipv4 = Some(addressing(IpAddressingMode::Pool, None, None));
    second.ipv6 = Some(addressing(IpAddressingMode::Pool, None, None));
    let mut third = NetworkInterface::dhcp("net2", "vmbr2");
    third.ipv6 = Some(addressing(IpAddressingMode::DHCP, None, None));
    let mut allocated = PoolAddresses::new();
    allocated.insert(
        ("net1".into(), false),
        Allocation {
            address: "198.51.100.7".parse().unwrap(),
            prefix: 24,
            gateway: Some("198.51.100.1".parse().unwrap()),
        },
    );
    allocated.insert(
        ("net1".into(), true),
        Allocation {
            address: "2001:db8:1::7".parse().unwrap(),
            prefix: 64,
            gateway: None,
        },
    );
    (vec![first, second, third], allocated)
}

const MACS: [(&str, &str); 3] = [
    ("net0", "52:54:00:12:34:56"),
    ("net1", "52:54:00:12:34:57"),
    ("net2", "bc:24:11:aa:bb:cc"),
];

fn read_networks() -> Result<cloud_init::Read> {
    let (networks, allocated) = networks();
    let mac = |_, n: &NetworkInterface| {
        Ok(MACS
            .iter()
            .find(|(name, _)| *name == n.name)
            .map(|(_, mac)| (*mac).to_owned()))
    };
    let seed = NoCloudSeed {
        user_data: b"#cloud-config\n".to_vec(),
        meta_data: MetaData {
            instance_id: "i-1".into(),
            local_hostname: "worker-0".into(),
        },
        network_config: Some(network_config(&networks, mac, &allocated).map_err(anyhow::Error::msg)?),
    };
    cloud_init::read_nocloud(&seed_files(&seed)?)
}

#[test]
fn network_config_interfaces_are_renamed_to_their_spec_names_by_mac() -> Result<()> {
    let read = read_networks()?;
    let mut renames: Vec<(String, String)> =
        read.renames.iter().map(|r| (r.0.clone(), r.1.clone())).collect();
    renames.sort();
    let mut want: Vec<(String, String)> = MACS
        .iter()
        .map(|(name, mac)| ((*mac).to_owned(), (*name).to_owned()))
        .collect();
    want.sort();
    ensure!(renames == want, "cloud-init renames {renames:?}, not {want:?}");
    Ok(())
}

#[test]
fn network_config_renders_for_netplan_as_asked() -> Result<()> {
    let read = read_networks()?;
    let netplan = read.file("netplan", "50-cloud-init.yaml")?;
    for want in [
        "macaddress: '52:54:00:12:34:56'",
        "set-name: net0",
        "- 192.0.2.10/24",
        "- 2001:db8::10/64",
        "gateway6: 2001:db8::1",
        "to: 0.0.0.0/0",
        "via: 192.0.2.1",
        "- 192.0.2.53",
        "mtu: 1450",
        "- 198.51.100.7/24",
        "via: 198.51.100.1",
        "- 2001:db8:1::7/64",
        "dhcp4: true",
        "dhcp6: true",
    ] {
        ensure!(netplan.contains(want), "netplan lacks {want:?}:\n{netplan}");
    }
    Ok(())
}

#[test]
fn network_config_renders_for_ifupdown_as_asked() -> Result<()> {
    let read = read_networks()?;
    let eni = read.file("eni", "interfaces.d")?;
    for want in [
        "iface net0 inet static\n    address 192.0.2.10/24\n",
        "route add default gw 192.0.2.1",
        "iface net0 inet6 static\n    address 2001:db8::10/64\n    gateway 2001:db8::1\n",
        "dns-nameservers 192.0.2.53 2001:db8::53",
        "mtu 1450",
        "iface net1 inet static\n    address 198.51.100.7/24\n",
        "route add default gw 198.51.100.1",
        "iface net1 inet6 static\n    address 2001:db8:1::7/64\n",
        "iface net2 inet dhcp",
        "iface net2 inet6 dhcp",
    ] {
        ensure!(eni.contains(want), "eni lacks {want:?}:\n{eni}");
    }
    ensure!(
        !eni.contains("::/64"),
        "an IPv6 default route rendered as a /64:\n{eni}"
    );
    Ok(())
}

#[test]
fn network_config_renders_for_networkd_as_asked() -> Result<()> {
    let read = read_networks()?;
    let net0 = read.file("networkd", "net0.network")?;
    for want in [
        "MACAddress=52:54:00:12:34:56",
        "Name=net0",
        "Address=192.0.2.10/24",
        "Address=2001:db8::10/64",
        "Destination=0.0.0.0/0",
        "Gateway=192.0.2.1",
        "Gateway=2001:db8::1",
        "DNS=192.0.2.53 2001:db8::53",
        "MTUBytes=1450",
    ] {
        ensure!(net0.contains(want), "net0.network lacks {want:?}:\n{net0}");
    }
    ensure!(
        !net0.contains("::/64"),
        "an IPv6 default route rendered as a /64:\n{net0}"
    );
    let net1 = read.file("networkd", "net1.network")?;
    for want in [
        "Address=198.51.100.7/24",
        "Gateway=198.51.100.1",
        "Address=2001:db8:1::7/64",
    ] {
        ensure!(net1.contains(want), "net1.network lacks {want:?}:\n{net1}");
    }
    let net2 = read.file("networkd", "net2.network")?;
    ensure!(
        net2.contains("DHCP=yes"),
        "net2 asks DHCP for both families:\n{net2}"
    );
    Ok(())
}
