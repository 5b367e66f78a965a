//! The neutral machine shape shared by `VirtualMachine` and every infrastructure machine.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::IpPoolReference;

/// Smallest memory size a machine may ask for, in MiB.
pub const MIN_MEMORY_MIB: u64 = 128;

/// A Kubernetes label key (an optional DNS-subdomain prefix and `/`, then a name): what
/// `tagsFromLabels` lists on Proxmox and vSphere machines.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// Virtual CPU topology.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    /// Cores per socket.
    #[schemars(range(min = 1, max = 512))]
    pub cores: u32,
    /// Number of sockets. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub sockets: Option<u32>,
}

impl Cpu {
    /// A single-socket topology with `cores` cores.
    pub fn cores(cores: u32) -> Self {
        Self { cores, sockets: None }
    }

    /// Total virtual CPUs (`cores × sockets`).
    pub fn vcpus(&self) -> u32 {
        self.cores.saturating_mul(self.sockets.unwrap_or(1))
    }
}

/// A virtual disk. Disks are keyed by `name`; the first disk is the boot disk, grown from the
/// source image's disk. A disk may grow but never shrink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.sizeGiB >= oldSelf.sizeGiB",
        "message": "a disk may grow but never shrink: set sizeGiB back to at least its previous value"
    }
]))]
pub struct Disk {
    /// Name of the disk, unique within the machine. For Proxmox it may be the device slot
    /// (`scsi0`, `virtio1`); otherwise any DNS label (`root`, `data`). On Proxmox, a slot the
    /// template does not have is created as a new disk of `sizeGiB` on `storage`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Size in GiB (1 GiB = 1024 MiB).
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 65536))]
    pub size_gib: u64,
    /// Where the disk lives: Proxmox storage ID, libvirt storage pool or vSphere datastore.
    /// Defaults to the provider's default storage. On Proxmox, the first disk's storage is the
    /// full clone's target when `spec.storage` is unset; an existing disk is never moved (a
    /// different storage is refused with a condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage: Option<String>,
}

/// How a network interface gets its addresses for one IP family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum IpAddressingMode {
    /// The guest asks a DHCP server.
    #[default]
    DHCP,
    /// The addresses listed in `addresses` are configured through cloud-init.
    Static,
    /// An address is claimed from a Cluster API IPAM pool (`poolRef`) and configured through
    /// cloud-init.
    Pool,
}

/// Address configuration of a network interface for one IP family.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.mode != 'Static' || (has(self.addresses) && size(self.addresses) > 0)",
        "message": "mode Static needs at least one entry in addresses, in CIDR notation (e.g. 192.0.2.10/24)"
    },
    {
        "rule": "self.mode == 'Static' || !has(self.addresses)",
        "message": "addresses may only be set with mode Static"
    },
    {
        "rule": "(self.mode == 'Pool') == has(self.poolRef)",
        "message": "poolRef must be set when, and only when, mode is Pool"
    },
    {
        "rule": "self.mode == 'Static' || !has(self.gateway)",
        "message": "gateway may only be set with mode Static (DHCP and IPAM pools provide their own)"
    }
]))]
pub struct IpAddressing {
    /// `DHCP`, `Static` or `Pool`.
    pub mode: IpAddressingMode,
    /// Addresses in CIDR notation (`192.0.2.10/24`, `2001:db8::10/64`); only with `Static`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 3, max = 64)))]
    pub addresses: Vec<String>,
    /// Default gateway; only with `Static`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 45))]
    pub gateway: Option<String>,
    /// The IPAM pool to claim an address from; only with `Pool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<IpPoolReference>,
}

/// A virtual network interface. Interfaces are keyed by `name`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// Name of the interface, unique within the machine. Proxmox: `net0`…; libvirt and vSphere:
    /// free. When a network configuration is written for the guest (static or pool addresses,
    /// IPv6, MTU, DNS, several interfaces), it matches the interface by its MAC and renames it to
    /// this name (cloud-init `set-name`).
    #[schemars(length(min = 1, max = 15), regex(pattern = r"^[a-z][a-z0-9]*$"))]
    pub name: String,
    /// What the interface attaches to: Proxmox bridge (`vmbr0`), libvirt network (`default`)
    /// or vSphere port group (`VM Network`).
    #[schemars(length(min = 1, max = 253))]
    pub network: String,
    /// 802.1Q VLAN tag (1–4094).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4094))]
    pub vlan: Option<u16>,
    /// MTU of the interface (576–65520). Defaults to the network's MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 65520))]
    pub mtu: Option<u32>,
    /// Fixed MAC address (`52:54:00:12:34:56`); generated when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$"), length(max = 17))]
    pub mac_address: Option<String>,
    /// Device model (`virtio`, `e1000`, `vmxnet3`…). Defaults to the backend's paravirtual
    /// model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub model: Option<String>,
    /// IPv4 configuration. Defaults to DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<IpAddressing>,
    /// IPv6 configuration. Unset means no IPv6 configuration is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<IpAddressing>,
    /// DNS servers written through cloud-init (at most 3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3), inner(length(min = 2, max = 45)))]
    pub dns_servers: Vec<String>,
}

impl NetworkInterface {
    /// A DHCP interface on `network`.
    pub fn dhcp(name: impl Into<String>, network: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            network: network.into(),
            vlan: None,
            mtu: None,
            mac_address: None,
            model: None,
            ipv4: None,
            ipv6: None,
            dns_servers: Vec::new(),
        }
    }
}

/// Desired or observed power state of a machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PowerState {
    /// Running.
    #[default]
    On,
    /// Stopped.
    Off,
}

/// Whether a provider may restart a running VM to apply a change that needs it (CPU and memory;
/// on Proxmox also what PVE keeps pending until the next boot, such as a NIC model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RestartPolicy {
    /// Never restart on its own: the change waits, `VMUpToDate` is False with reason
    /// `RestartRequired` (a Warning Event announces it) until the VM is powered off (then it is
    /// applied, and the VM started again if asked) or the policy becomes `Automatic`.
    #[default]
    Manual,
    /// Shut the VM down (ACPI, then a hard stop after the shutdown timeout), apply the change and
    /// start it again, announced by a `PoweringOff` Event and `VMUpToDate` False meanwhile.
    Automatic,
}

/// Step of a machine's provisioning state machine, persisted in `status.provisioning` so that
/// long hypervisor tasks survive controller restarts and `clusterctl move`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ProvisioningState {
    /// Nothing done yet (waiting for the cluster, bootstrap data, an IP address…).
    #[default]
    Pending,
    /// Cloning the source template or volume.
    Cloning,
    /// Applying CPU, memory, disks, networks and cloud-init.
    Configuring,
    /// Starting the machine.
    PoweringOn,
    /// Waiting for the guest agent / cloud-init to report the guest ready.
    WaitingForGuest,
    /// Provisioned and running (or stopped on purpose).
    Ready,
    /// Stopping the machine.
    PoweringOff,
    /// Deleting the machine on the hypervisor.
    Deleting,
    /// A terminal failure; the reason is in the `Ready` condition.
    Failed,
}

/// Persisted progress of provisioning.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningStatus {
    /// Current step.
    pub state: ProvisioningState,
    /// Identifier of the hypervisor task in flight (Proxmox UPID, vSphere task MoRef), polled on
    /// requeue. Unset when no task runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub task_id: Option<String>,
    /// When the task in flight started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_started_at: Option<Time>,
    /// Human-readable detail about the current step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 10240))]
    pub message: Option<String>,
}

/// How a machine is cloned from its source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CloneMode {
    /// An independent copy of every disk (default; slower, no dependency on the source).
    #[default]
    Full,
    /// Copy-on-write disks backed by the source (fast; the source must stay, and on Proxmox the
    /// disks stay on the template's storage).
    Linked,
}

/// Firmware a VM boots with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Firmware {
    /// SeaBIOS (default).
    #[default]
    BIOS,
    /// OVMF (UEFI).
    UEFI,
}

/// The bus of the CD-ROM drive the bootstrap seed (a NoCloud ISO) is attached on. Each
/// provider has its default (Proxmox `IDE`, libvirt `SATA`); guests without an IDE controller
/// (ARM64 `virt` machines, q35 without legacy devices) need `SATA` or `SCSI`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SeedDriveBus {
    /// IDE.
    #[serde(rename = "IDE")]
    Ide,
    /// SATA (AHCI).
    #[serde(rename = "SATA")]
    Sata,
    /// SCSI (a virtio-scsi controller).
    #[serde(rename = "SCSI")]
    Scsi,
}

/// Guest readiness checks done before a machine is reported provisioned. Skip them for guests
/// without a guest agent or cloud-init (appliances, some BSDs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessChecks {
    /// Do not wait for the guest agent to answer (and do not read addresses from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_guest_agent: Option<bool>,
    /// Do not wait for cloud-init to report completion. Otherwise a machine is provisioned once
    /// its guest reports an address and Ready only once cloud-init in the guest has finished
    /// (`WaitingForCloudInit` until then, `CloudInitFailed` with its errors; how each provider
    /// learns it: docs/field-support.md); set it for a guest without cloud-init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_cloud_init: Option<bool>,
}

impl ReadinessChecks {
    /// Whether `checks` (a spec's `readinessChecks`) skip the guest agent: the VM is ready
    /// without it, with the spec's static addresses.
    pub fn skip_guest_agent(checks: Option<&Self>) -> bool {
        checks.and_then(|c| c.skip_guest_agent).unwrap_or(false)
    }
}

impl ProvisioningState {
    /// The wire form, also usable as a condition reason (`Cloning`, `WaitingForGuest`…).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Cloning => "Cloning",
            Self::Configuring => "Configuring",
            Self::PoweringOn => "PoweringOn",
            Self::WaitingForGuest => "WaitingForGuest",
            Self::Ready => "Ready",
            Self::PoweringOff => "PoweringOff",
            Self::Deleting => "Deleting",
            Self::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for ProvisioningState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PowerState {
    /// The wire form: `On` or `Off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "On",
            Self::Off => "Off",
        }
    }
}

impl std::fmt::Display for PowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_forms_match_serde() {
        use ProvisioningState::*;
        for state in [
            Pending,
            Cloning,
            Configuring,
            PoweringOn,
            WaitingForGuest,
            Ready,
            PoweringOff,
            Deleting,
            Failed,
        ] {
            assert_eq!(serde_json::to_value(state).expect("serializes"), state.as_str());
            assert_eq!(state.to_string(), state.as_str());
        }
        for power in [PowerState::On, PowerState::Off] {
            assert_eq!(
                serde_json::to_value(power).expect("serializes"),
                power.to_string()
            );
        }
    }

    #[test]
    fn vcpus_multiply_cores_and_sockets() {
        assert_eq!(Cpu::cores(4).vcpus(), 4);
        assert_eq!(
            Cpu {
                cores: 4,
                sockets: Some(2)
            }
            .vcpus(),
            8
        );
        assert_eq!(
            Cpu {
                cores: u32::MAX,
                sockets: Some(2)
            }
            .vcpus(),
            u32::MAX
        );
    }
}
