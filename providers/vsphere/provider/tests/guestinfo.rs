//! What a clone's `guestinfo.*` tells the guest, read by the real cloud-init's VMware datasource
//! (Debian bookworm's package, see `tests/cloud-init/support.rs`): the instance id, a hostname
//! that YAML 1.1 would retype, the user data, and the `network` of the meta-data rendered as
//! asked.

#[path = "../../../../tests/cloud-init/support.rs"]
mod cloud_init;

use anyhow::{Result, ensure};
use banlieue_api::infrastructure::{VSphereCluster, VSphereClusterSpec, VSphereMachineSpec};
use banlieue_vsphere::provision::{MachineInput, guestinfo};
use serde_json::json;

const UID: &str = "7d0c5e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";

fn spec(networks: serde_json::Value) -> Result<VSphereMachineSpec> {
    Ok(serde_json::from_value(json!({
        "source": {"template": "ubuntu-2404"},
        "resourcePool": "cluster1/Resources",
        "cpu": {"cores": 2},
        "memoryMiB": 2048,
        "networks": networks,
    }))?)
}

fn read(name: &str, spec: &VSphereMachineSpec) -> Result<cloud_init::Read> {
    let cluster = VSphereCluster::new("c", VSphereClusterSpec::default());
    let pool = banlieue_provider_kit::network::PoolAddresses::new();
    let input = MachineInput {
        owner: banlieue_vsphere::readopt::Owner {
            uid: UID,
            namespace: "ns",
            name,
        },
        spec,
        cluster: &cluster,
        failure_domain: None,
        pool_addresses: &pool,
    };
    let extra = guestinfo(&input, Some(b"#cloud-config\nruncmd: [true]\n")).map_err(anyhow::Error::msg)?;
    cloud_init::read_vmware(&extra)
}

#[test]
fn the_vmware_datasource_reads_the_hostname_as_written_and_the_user_data() -> Result<()> {
    let spec = spec(json!([{"name": "ens192", "network": "VM Network"}]))?;
    for name in ["on", "no", "0123", "2024-01-01", "worker-0"] {
        let read = read(name, &spec)?;
        ensure!(
            read.metadata["local-hostname"] == name && read.instance_id == UID,
            "{name:?} read back as {} / {}",
            read.metadata["local-hostname"],
            read.instance_id
        );
        ensure!(read.userdata.as_deref() == Some("#cloud-config\nruncmd: [true]\n"));
    }
    Ok(())
}

#[test]
fn the_vmware_datasource_renders_the_network_by_name_or_by_mac() -> Result<()> {
    let spec = spec(json!([
        {"name": "ens192", "network": "VM Network",
         "ipv4": {"mode": "Static", "addresses": ["192.0.2.10/24"], "gateway": "192.0.2.1"},
         "ipv6": {"mode": "Static", "addresses": ["2001:db8::10/64"], "gateway": "2001:db8::1"},
         "dnsServers": ["192.0.2.53"]},
        {"name": "data0", "network": "storage", "macAddress": "00:50:56:12:34:56", "mtu": 9000},
    ]))?;
    let read = read("worker-1", &spec)?;
    let renames: Vec<(&str, &str)> = read
        .renames
        .iter()
        .map(|r| (r.0.as_str(), r.1.as_str()))
        .collect();
    ensure!(renames == [("00:50:56:12:34:56", "data0")], "{renames:?}");
    let netplan = read.file("netplan", "50-cloud-init.yaml")?;
    for want in [
        "ens192:",
        "- 192.0.2.10/24",
        "via: 192.0.2.1",
        "gateway6: 2001:db8::1",
        "- 192.0.2.53",
        "set-name: data0",
        "mtu: 9000",
    ] {
        ensure!(netplan.contains(want), "netplan lacks {want:?}:\n{netplan}");
    }
    let eni = read.file("eni", "interfaces.d")?;
    ensure!(
        eni.contains("iface ens192 inet6 static\n    address 2001:db8::10/64\n    gateway 2001:db8::1\n"),
        "{eni}"
    );
    Ok(())
}
