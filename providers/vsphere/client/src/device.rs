//! Virtual hardware: the disks and network adapters read from `config.hardware.device`, the
//! network backings a port group resolves to, and the `deviceChange` entries of a
//! `VirtualMachineConfigSpec` (grow a disk, add / edit / remove a NIC). XML is written in the
//! schema's sequence order.

use std::fmt::Write as _;

use crate::objects::MoRef;
use crate::xml::{self, Element};

/// A `VirtualDisk` of a VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualDisk {
    /// Device key (stable across edits).
    pub key: i32,
    /// Key of its controller.
    pub controller_key: i32,
    /// Unit on the controller.
    pub unit_number: Option<i32>,
    /// Capacity in KiB.
    pub capacity_kb: u64,
    /// The backing's `xsi:type`, e.g. `VirtualDiskFlatVer2BackingInfo`.
    pub backing_type: String,
    /// `[datastore] path/disk.vmdk`.
    pub file_name: String,
    /// The backing's datastore.
    pub datastore: Option<MoRef>,
    /// `persistent`, `independent_persistent`, …
    pub disk_mode: Option<String>,
    /// Thin provisioned.
    pub thin: Option<bool>,
}

/// What a network adapter is connected to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetworkBacking {
    /// A standard port group (`Network`): its name and reference.
    Standard {
        /// Port group name.
        name: String,
        /// The `Network` object.
        network: Option<MoRef>,
    },
    /// A distributed port group.
    Distributed {
        /// UUID of the distributed switch.
        switch_uuid: String,
        /// Key of the port group (`dvportgroup-12`).
        portgroup_key: String,
    },
    /// Another backing (opaque network, …), by `xsi:type`.
    Other(String),
}

impl NetworkBacking {
    /// Whether both are the same network.
    pub fn same_network(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Standard { name: a, network: na }, Self::Standard { name: b, network: nb }) => {
                match (na, nb) {
                    (Some(x), Some(y)) => x == y,
                    _ => a == b,
                }
            }
            (Self::Distributed { portgroup_key: a, .. }, Self::Distributed { portgroup_key: b, .. }) => {
                a == b
            }
            _ => false,
        }
    }

    /// A short human description (`VM Network`, `dvportgroup-12`).
    pub fn describe(&self) -> String {
        match self {
            Self::Standard { name, .. } => name.clone(),
            Self::Distributed { portgroup_key, .. } => portgroup_key.clone(),
            Self::Other(t) => t.clone(),
        }
    }

    fn to_xml(&self) -> String {
        match self {
            Self::Standard { name, network } => format!(
                "<backing xsi:type=\"VirtualEthernetCardNetworkBackingInfo\"><deviceName>{}</deviceName>{}</backing>",
                xml::escape(name),
                network.as_ref().map(|n| n.to_xml("network")).unwrap_or_default()
            ),
            Self::Distributed {
                switch_uuid,
                portgroup_key,
            } => format!(
                "<backing xsi:type=\"VirtualEthernetCardDistributedVirtualPortBackingInfo\"><port>\
<switchUuid>{}</switchUuid><portgroupKey>{}</portgroupKey></port></backing>",
                xml::escape(switch_uuid),
                xml::escape(portgroup_key)
            ),
            Self::Other(_) => String::new(),
        }
    }
}

/// A network adapter (`VirtualEthernetCard` subtype) of a VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualNic {
    /// Device key.
    pub key: i32,
    /// `xsi:type`: `VirtualVmxnet3`, `VirtualE1000`, …
    pub kind: String,
    /// What it is connected to.
    pub backing: NetworkBacking,
    /// MAC address.
    pub mac: Option<String>,
    /// `generated`, `manual` or `assigned`.
    pub address_type: Option<String>,
    /// Key of its controller.
    pub controller_key: Option<i32>,
    /// Unit on the controller.
    pub unit_number: Option<i32>,
}

/// The adapter types vim25 derives from `VirtualEthernetCard`.
pub const NIC_TYPES: &[&str] = &[
    "VirtualE1000",
    "VirtualE1000e",
    "VirtualPCNet32",
    "VirtualVmxnet",
    "VirtualVmxnet2",
    "VirtualVmxnet3",
    "VirtualVmxnet3Vrdma",
    "VirtualSriovEthernetCard",
];

/// The adapter type for a user's model name (`vmxnet3` → `VirtualVmxnet3`); `None` if unknown.
pub fn nic_type_for_model(model: &str) -> Option<&'static str> {
    let m = model.to_ascii_lowercase();
    NIC_TYPES
        .iter()
        .find(|t| t.trim_start_matches("Virtual").eq_ignore_ascii_case(&m))
        .copied()
}

/// Disks and NICs of `config.hardware.device` (disks ordered by controller and unit, NICs by
/// key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hardware {
    /// Virtual disks.
    pub disks: Vec<VirtualDisk>,
    /// Network adapters.
    pub nics: Vec<VirtualNic>,
    /// `(controllerKey, unitNumber)` of every device attached to a controller unit.
    pub used_units: Vec<(i32, i32)>,
    /// Whether the VM has a virtual TPM (`VirtualTPM`).
    pub tpm: bool,
    /// PCI passthrough devices (`VirtualPCIPassthrough`), in key order.
    pub pci_devices: Vec<PciPassthrough>,
}

/// What a `VirtualPCIPassthrough` device passes through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PciPassthrough {
    /// Dynamic DirectPath I/O: any free device of this vendor and device ID on the host
    /// (`VirtualPCIPassthroughDynamicBackingInfo`), optionally one with this hardware label.
    Dynamic {
        /// PCI vendor ID.
        vendor_id: i32,
        /// PCI device ID.
        device_id: i32,
        /// The host's hardware label of the device.
        custom_label: Option<String>,
    },
    /// An NVIDIA vGPU of this profile (`VirtualPCIPassthroughVmiopBackingInfo`).
    Vgpu {
        /// The profile (`grid_a100-4c`…).
        profile: String,
    },
    /// Another backing (a fixed host device), by its backing type.
    Other(String),
}

impl PciPassthrough {
    fn from_backing(backing: Option<&Element>) -> Self {
        let Some(b) = backing else {
            return Self::Other("none".to_owned());
        };
        match b.xsi_type() {
            Some("VirtualPCIPassthroughDynamicBackingInfo") => Self::Dynamic {
                vendor_id: b
                    .child("allowedDevice")
                    .and_then(|a| small(a, "vendorId"))
                    .unwrap_or(0),
                device_id: b
                    .child("allowedDevice")
                    .and_then(|a| small(a, "deviceId"))
                    .unwrap_or(0),
                custom_label: b
                    .child_text("customLabel")
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty()),
            },
            Some("VirtualPCIPassthroughVmiopBackingInfo") => Self::Vgpu {
                profile: b.child_text("vgpu").unwrap_or("").trim().to_owned(),
            },
            other => Self::Other(other.unwrap_or("unknown").to_owned()),
        }
    }

    fn backing_xml(&self) -> String {
        match self {
            Self::Dynamic {
                vendor_id,
                device_id,
                custom_label,
            } => {
                let label = custom_label
                    .as_deref()
                    .map(|l| format!("<customLabel>{}</customLabel>", xml::escape(l)))
                    .unwrap_or_default();
                format!(
                    "<backing xsi:type=\"VirtualPCIPassthroughDynamicBackingInfo\"><deviceName></deviceName>\
<allowedDevice><vendorId>{vendor_id}</vendorId><deviceId>{device_id}</deviceId></allowedDevice>{label}</backing>"
                )
            }
            Self::Vgpu { profile } => format!(
                "<backing xsi:type=\"VirtualPCIPassthroughVmiopBackingInfo\"><vgpu>{}</vgpu></backing>",
                xml::escape(profile)
            ),
            Self::Other(kind) => format!("<backing xsi:type=\"{}\"></backing>", xml::escape(kind)),
        }
    }

    /// A short human description.
    pub fn describe(&self) -> String {
        match self {
            Self::Dynamic {
                vendor_id,
                device_id,
                custom_label: Some(label),
            } => format!("PCI device {vendor_id:04x}:{device_id:04x} labelled {label}"),
            Self::Dynamic {
                vendor_id, device_id, ..
            } => format!("PCI device {vendor_id:04x}:{device_id:04x}"),
            Self::Vgpu { profile } => format!("vGPU {profile}"),
            Self::Other(kind) => format!("PCI device ({kind})"),
        }
    }
}

impl Hardware {
    /// The first free unit (0–15, never 7, the SCSI controller's own) on `controller`, not
    /// in `taken` either.
    pub fn free_unit(&self, controller: i32, taken: &[i32]) -> Option<i32> {
        (0..16).find(|u| *u != 7 && !taken.contains(u) && !self.used_units.contains(&(controller, *u)))
    }
}

fn int(el: &Element, name: &str) -> Option<i64> {
    el.child_text(name).and_then(|t| t.trim().parse().ok())
}

fn small(el: &Element, name: &str) -> Option<i32> {
    int(el, name).and_then(|n| i32::try_from(n).ok())
}

/// Reads the `<val>` of `config.hardware.device`.
pub fn hardware_of(val: &Element) -> Hardware {
    let mut hw = Hardware::default();
    for d in &val.children {
        let Some(kind) = d.xsi_type() else { continue };
        let Some(key) = small(d, "key") else { continue };
        if let (Some(c), Some(u)) = (small(d, "controllerKey"), small(d, "unitNumber")) {
            hw.used_units.push((c, u));
        }
        if kind == "VirtualTPM" {
            hw.tpm = true;
        } else if kind == "VirtualPCIPassthrough" {
            hw.pci_devices
                .push(PciPassthrough::from_backing(d.child("backing")));
        } else if kind == "VirtualDisk" {
            let backing = d.child("backing");
            let capacity_kb = int(d, "capacityInKB")
                .and_then(|k| u64::try_from(k).ok())
                .or_else(|| {
                    int(d, "capacityInBytes")
                        .and_then(|b| u64::try_from(b).ok())
                        .map(|b| b / 1024)
                })
                .unwrap_or(0);
            hw.disks.push(VirtualDisk {
                key,
                controller_key: small(d, "controllerKey").unwrap_or(0),
                unit_number: small(d, "unitNumber"),
                capacity_kb,
                backing_type: backing
                    .and_then(Element::xsi_type)
                    .unwrap_or("VirtualDiskFlatVer2BackingInfo")
                    .to_owned(),
                file_name: backing
                    .and_then(|b| b.child_text("fileName"))
                    .unwrap_or("")
                    .trim()
                    .to_owned(),
                datastore: backing
                    .and_then(|b| b.child("datastore"))
                    .and_then(MoRef::from_xml),
                disk_mode: backing
                    .and_then(|b| b.child_text("diskMode"))
                    .map(|m| m.trim().to_owned()),
                thin: backing
                    .and_then(|b| b.child_text("thinProvisioned"))
                    .map(|t| t.trim() == "true"),
            });
        } else if NIC_TYPES.contains(&kind) {
            let backing = match d.child("backing") {
                Some(b) if b.xsi_type() == Some("VirtualEthernetCardNetworkBackingInfo") => {
                    NetworkBacking::Standard {
                        name: b.child_text("deviceName").unwrap_or("").trim().to_owned(),
                        network: b.child("network").and_then(MoRef::from_xml),
                    }
                }
                Some(b) if b.xsi_type() == Some("VirtualEthernetCardDistributedVirtualPortBackingInfo") => {
                    NetworkBacking::Distributed {
                        switch_uuid: b
                            .path(&["port", "switchUuid"])
                            .map(|e| e.text.trim().to_owned())
                            .unwrap_or_default(),
                        portgroup_key: b
                            .path(&["port", "portgroupKey"])
                            .map(|e| e.text.trim().to_owned())
                            .unwrap_or_default(),
                    }
                }
                Some(b) => NetworkBacking::Other(b.xsi_type().unwrap_or("unknown").to_owned()),
                None => NetworkBacking::Other("none".to_owned()),
            };
            hw.nics.push(VirtualNic {
                key,
                kind: kind.to_owned(),
                backing,
                mac: d
                    .child_text("macAddress")
                    .map(|m| m.trim().to_owned())
                    .filter(|m| !m.is_empty()),
                address_type: d.child_text("addressType").map(|m| m.trim().to_owned()),
                controller_key: small(d, "controllerKey"),
                unit_number: small(d, "unitNumber"),
            });
        }
    }
    hw.disks
        .sort_by_key(|d| (d.controller_key, d.unit_number.unwrap_or(i32::MAX), d.key));
    hw.nics.sort_by_key(|n| n.key);
    hw
}

/// One `deviceChange` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChange {
    /// Grow `disk` to `capacity_kb` (online on a running VM).
    GrowDisk {
        /// The disk as read.
        disk: VirtualDisk,
        /// New capacity in KiB.
        capacity_kb: u64,
    },
    /// Create a new thin disk.
    AddDisk {
        /// Temporary (negative) key, unique within one spec.
        key: i32,
        /// Controller to attach it to.
        controller_key: i32,
        /// Free unit on that controller.
        unit_number: i32,
        /// Capacity in KiB.
        capacity_kb: u64,
        /// Datastore name; `None`: the VM's folder.
        datastore: Option<String>,
    },
    /// Add a NIC.
    AddNic {
        /// Temporary (negative) key, unique within one spec.
        key: i32,
        /// `VirtualVmxnet3`, …
        kind: String,
        /// Network.
        backing: NetworkBacking,
        /// Fixed MAC (`addressType=manual`); generated when `None`.
        mac: Option<String>,
    },
    /// Connect an existing NIC to another network and/or give it a fixed MAC.
    EditNic {
        /// The NIC as read.
        nic: VirtualNic,
        /// Network.
        backing: NetworkBacking,
        /// MAC: `Some` sets it (manual), `None` keeps the NIC's.
        mac: Option<String>,
    },
    /// Remove a NIC.
    RemoveNic {
        /// The NIC as read.
        nic: VirtualNic,
    },
    /// Add a virtual TPM (the VM off, with EFI firmware).
    AddTpm {
        /// Temporary (negative) key, unique within one spec.
        key: i32,
    },
    /// Add a PCI passthrough device (the VM off, its memory reservation locked).
    AddPci {
        /// Temporary (negative) key, unique within one spec.
        key: i32,
        /// What it passes through.
        device: PciPassthrough,
    },
}

fn connectable() -> &'static str {
    "<connectable><startConnected>true</startConnected><allowGuestControl>true</allowGuestControl>\
<connected>true</connected></connectable>"
}

fn mac_xml(s: &mut String, address_type: &str, mac: Option<&str>) {
    let _ = write!(s, "<addressType>{}</addressType>", xml::escape(address_type));
    if let Some(m) = mac {
        let _ = write!(s, "<macAddress>{}</macAddress>", xml::escape(m));
    }
}

fn unit_xml(s: &mut String, controller_key: Option<i32>, unit_number: Option<i32>) {
    if let Some(c) = controller_key {
        let _ = write!(s, "<controllerKey>{c}</controllerKey>");
    }
    if let Some(u) = unit_number {
        let _ = write!(s, "<unitNumber>{u}</unitNumber>");
    }
}

impl DeviceChange {
    /// `<deviceChange>…</deviceChange>` (a `VirtualDeviceConfigSpec`).
    pub fn to_xml(&self) -> String {
        let mut s = String::from("<deviceChange>");
        match self {
            Self::GrowDisk { disk, capacity_kb } => {
                let _ = write!(
                    s,
                    "<operation>edit</operation><device xsi:type=\"VirtualDisk\"><key>{}</key>\
<backing xsi:type=\"{}\"><fileName>{}</fileName>",
                    disk.key,
                    xml::escape(&disk.backing_type),
                    xml::escape(&disk.file_name)
                );
                if let Some(ds) = &disk.datastore {
                    s.push_str(&ds.to_xml("datastore"));
                }
                let _ = write!(
                    s,
                    "<diskMode>{}</diskMode>",
                    xml::escape(disk.disk_mode.as_deref().unwrap_or("persistent"))
                );
                if let Some(thin) = disk.thin {
                    let _ = write!(s, "<thinProvisioned>{thin}</thinProvisioned>");
                }
                s.push_str("</backing>");
                unit_xml(&mut s, Some(disk.controller_key), disk.unit_number);
                let _ = write!(
                    s,
                    "<capacityInKB>{capacity_kb}</capacityInKB><capacityInBytes>{}</capacityInBytes></device>",
                    capacity_kb.saturating_mul(1024)
                );
            }
            Self::AddDisk {
                key,
                controller_key,
                unit_number,
                capacity_kb,
                datastore,
            } => {
                let file = datastore.as_deref().map(|d| format!("[{d}]")).unwrap_or_default();
                let _ = write!(
                    s,
                    "<operation>add</operation><fileOperation>create</fileOperation>\
<device xsi:type=\"VirtualDisk\"><key>{key}</key><backing xsi:type=\"VirtualDiskFlatVer2BackingInfo\">\
<fileName>{}</fileName><diskMode>persistent</diskMode><thinProvisioned>true</thinProvisioned></backing>\
<controllerKey>{controller_key}</controllerKey><unitNumber>{unit_number}</unitNumber>\
<capacityInKB>{capacity_kb}</capacityInKB></device>",
                    xml::escape(&file)
                );
            }
            Self::AddNic {
                key,
                kind,
                backing,
                mac,
            } => {
                let _ = write!(
                    s,
                    "<operation>add</operation><device xsi:type=\"{}\"><key>{key}</key>{}{}",
                    xml::escape(kind),
                    backing.to_xml(),
                    connectable()
                );
                match mac {
                    Some(m) => mac_xml(&mut s, "manual", Some(m)),
                    None => mac_xml(&mut s, "generated", None),
                }
                s.push_str("</device>");
            }
            Self::EditNic { nic, backing, mac } => {
                let _ = write!(
                    s,
                    "<operation>edit</operation><device xsi:type=\"{}\"><key>{}</key>{}{}",
                    xml::escape(&nic.kind),
                    nic.key,
                    backing.to_xml(),
                    connectable()
                );
                unit_xml(&mut s, nic.controller_key, nic.unit_number);
                match (mac, &nic.mac) {
                    (Some(m), _) => mac_xml(&mut s, "manual", Some(m)),
                    (None, Some(current)) => mac_xml(
                        &mut s,
                        nic.address_type.as_deref().unwrap_or("generated"),
                        Some(current),
                    ),
                    (None, None) => mac_xml(&mut s, "generated", None),
                }
                s.push_str("</device>");
            }
            Self::RemoveNic { nic } => {
                let _ = write!(
                    s,
                    "<operation>remove</operation><device xsi:type=\"{}\"><key>{}</key>",
                    xml::escape(&nic.kind),
                    nic.key
                );
                unit_xml(&mut s, nic.controller_key, nic.unit_number);
                s.push_str("</device>");
            }
            Self::AddTpm { key } => {
                let _ = write!(
                    s,
                    "<operation>add</operation><device xsi:type=\"VirtualTPM\"><key>{key}</key></device>"
                );
            }
            Self::AddPci { key, device } => {
                let _ = write!(
                    s,
                    "<operation>add</operation><device xsi:type=\"VirtualPCIPassthrough\"><key>{key}</key>{}</device>",
                    device.backing_xml()
                );
            }
        }
        s.push_str("</deviceChange>");
        s
    }

    /// A short human description for conditions and events.
    pub fn describe(&self) -> String {
        match self {
            Self::GrowDisk { disk, capacity_kb } => format!(
                "grow disk {} from {} to {} GiB",
                disk.key,
                disk.capacity_kb / (1024 * 1024),
                capacity_kb / (1024 * 1024)
            ),
            Self::AddDisk { capacity_kb, .. } => {
                format!("add a {} GiB disk", capacity_kb / (1024 * 1024))
            }
            Self::AddNic { backing, .. } => format!("add a NIC on {}", backing.describe()),
            Self::EditNic { nic, backing, .. } => format!(
                "move NIC {} from {} to {}",
                nic.key,
                nic.backing.describe(),
                backing.describe()
            ),
            Self::RemoveNic { nic } => format!("remove NIC {} on {}", nic.key, nic.backing.describe()),
            Self::AddTpm { .. } => "add a virtual TPM".to_owned(),
            Self::AddPci { device, .. } => format!("add {}", device.describe()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVICES: &str = r#"<val xmlns:x="http://www.w3.org/2001/XMLSchema-instance" x:type="ArrayOfVirtualDevice">
<VirtualDevice x:type="VirtualPCIController"><key>100</key><busNumber>0</busNumber></VirtualDevice>
<VirtualDevice x:type="ParaVirtualSCSIController"><key>202</key><busNumber>0</busNumber></VirtualDevice>
<VirtualDevice x:type="VirtualE1000"><key>4000</key><backing x:type="VirtualEthernetCardDistributedVirtualPortBackingInfo"><port><switchUuid>a86e</switchUuid><portgroupKey>dvportgroup-12</portgroupKey></port></backing><controllerKey>100</controllerKey><unitNumber>7</unitNumber><addressType>generated</addressType><macAddress>00:0c:29:35:32:37</macAddress></VirtualDevice>
<VirtualDevice x:type="VirtualDisk"><key>205</key><backing x:type="VirtualDiskFlatVer2BackingInfo"><fileName>[LocalDS_0] vm/disk2.vmdk</fileName><diskMode>persistent</diskMode></backing><controllerKey>202</controllerKey><unitNumber>1</unitNumber><capacityInKB>1048576</capacityInKB></VirtualDevice>
<VirtualDevice x:type="VirtualDisk"><key>204</key><backing x:type="VirtualDiskFlatVer2BackingInfo"><fileName>[LocalDS_0] vm/disk1.vmdk</fileName><datastore type="Datastore">datastore-59</datastore><diskMode>persistent</diskMode><thinProvisioned>true</thinProvisioned></backing><controllerKey>202</controllerKey><unitNumber>0</unitNumber><capacityInKB>10485760</capacityInKB><capacityInBytes>10737418240</capacityInBytes></VirtualDevice>
<VirtualDevice x:type="VirtualVmxnet3"><key>205</key><backing x:type="VirtualEthernetCardNetworkBackingInfo"><deviceName>VM Network</deviceName><network type="Network">network-6</network></backing><controllerKey>100</controllerKey><unitNumber>1</unitNumber><addressType>manual</addressType><macAddress>00:50:56:00:00:01</macAddress></VirtualDevice>
</val>"#;

    #[test]
    fn pci_passthrough_devices_are_read_and_added_as_written() {
        let with_pci = DEVICES.replace(
            "</val>",
            "<VirtualDevice x:type=\"VirtualPCIPassthrough\"><key>13000</key><backing x:type=\"VirtualPCIPassthroughDynamicBackingInfo\"><deviceName></deviceName><allowedDevice><vendorId>4318</vendorId><deviceId>7864</deviceId></allowedDevice><customLabel>gpu-a</customLabel></backing></VirtualDevice>\n\
<VirtualDevice x:type=\"VirtualPCIPassthrough\"><key>13001</key><backing x:type=\"VirtualPCIPassthroughVmiopBackingInfo\"><vgpu>grid_a100-4c</vgpu></backing></VirtualDevice>\n</val>",
        );
        let hw = hardware_of(&xml::parse(&with_pci).unwrap());
        let dynamic = PciPassthrough::Dynamic {
            vendor_id: 4318,
            device_id: 7864,
            custom_label: Some("gpu-a".into()),
        };
        let vgpu = PciPassthrough::Vgpu {
            profile: "grid_a100-4c".into(),
        };
        assert_eq!(hw.pci_devices, vec![dynamic.clone(), vgpu.clone()]);
        let added = DeviceChange::AddPci {
            key: -13,
            device: dynamic,
        }
        .to_xml();
        assert!(
            added.contains("<device xsi:type=\"VirtualPCIPassthrough\"><key>-13</key><backing xsi:type=\"VirtualPCIPassthroughDynamicBackingInfo\"><deviceName></deviceName><allowedDevice><vendorId>4318</vendorId><deviceId>7864</deviceId></allowedDevice><customLabel>gpu-a</customLabel></backing></device>"),
            "{added}"
        );
        let added = DeviceChange::AddPci {
            key: -14,
            device: vgpu,
        }
        .to_xml();
        assert!(added.contains("<vgpu>grid_a100-4c</vgpu>"), "{added}");
    }

    #[test]
    fn a_virtual_tpm_is_seen_and_added_by_key() {
        let with_tpm = DEVICES.replace(
            "</val>",
            "<VirtualDevice x:type=\"VirtualTPM\"><key>11000</key></VirtualDevice>\n</val>",
        );
        assert!(hardware_of(&xml::parse(&with_tpm).unwrap()).tpm);
        assert_eq!(
            DeviceChange::AddTpm { key: -11 }.to_xml(),
            "<deviceChange><operation>add</operation><device xsi:type=\"VirtualTPM\"><key>-11</key></device></deviceChange>"
        );
    }

    #[test]
    fn reads_disks_in_unit_order_and_nics_by_key() {
        let hw = hardware_of(&xml::parse(DEVICES).unwrap());
        assert_eq!(hw.disks.len(), 2);
        assert!(!hw.tpm);
        let boot = &hw.disks[0];
        assert_eq!(
            (boot.key, boot.unit_number, boot.capacity_kb),
            (204, Some(0), 10_485_760)
        );
        assert_eq!(boot.datastore, Some(MoRef::new("Datastore", "datastore-59")));
        assert_eq!(
            (boot.thin, boot.file_name.as_str()),
            (Some(true), "[LocalDS_0] vm/disk1.vmdk")
        );
        assert_eq!(hw.nics.len(), 2);
        assert_eq!(hw.nics[0].kind, "VirtualVmxnet3");
        assert_eq!(
            hw.nics[0].backing,
            NetworkBacking::Standard {
                name: "VM Network".into(),
                network: Some(MoRef::new("Network", "network-6"))
            }
        );
        assert_eq!(
            hw.nics[1].backing,
            NetworkBacking::Distributed {
                switch_uuid: "a86e".into(),
                portgroup_key: "dvportgroup-12".into()
            }
        );
        assert_eq!(hw.nics[1].mac.as_deref(), Some("00:0c:29:35:32:37"));
    }

    fn order(x: &str) -> Vec<String> {
        let root = xml::parse(x).unwrap();
        root.child("device")
            .unwrap()
            .children
            .iter()
            .map(|e| e.local_name().to_owned())
            .collect()
    }

    #[test]
    fn device_changes_follow_the_schema_order() {
        let hw = hardware_of(&xml::parse(DEVICES).unwrap());
        let grow = DeviceChange::GrowDisk {
            disk: hw.disks[0].clone(),
            capacity_kb: 20 * 1024 * 1024,
        }
        .to_xml();
        assert_eq!(
            order(&grow),
            [
                "key",
                "backing",
                "controllerKey",
                "unitNumber",
                "capacityInKB",
                "capacityInBytes"
            ]
        );
        assert!(
            grow.contains("<capacityInBytes>21474836480</capacityInBytes>"),
            "{grow}"
        );
        let add = DeviceChange::AddNic {
            key: -1,
            kind: "VirtualVmxnet3".into(),
            backing: hw.nics[0].backing.clone(),
            mac: Some("00:50:56:00:00:02".into()),
        }
        .to_xml();
        assert_eq!(
            order(&add),
            ["key", "backing", "connectable", "addressType", "macAddress"]
        );
        let edit = DeviceChange::EditNic {
            nic: hw.nics[1].clone(),
            backing: hw.nics[0].backing.clone(),
            mac: None,
        }
        .to_xml();
        assert_eq!(
            order(&edit),
            [
                "key",
                "backing",
                "connectable",
                "controllerKey",
                "unitNumber",
                "addressType",
                "macAddress"
            ]
        );
        assert!(
            edit.contains("<macAddress>00:0c:29:35:32:37</macAddress>"),
            "{edit}"
        );
        let add_disk = DeviceChange::AddDisk {
            key: -100,
            controller_key: 202,
            unit_number: hw.free_unit(202, &[]).unwrap(),
            capacity_kb: 1024 * 1024,
            datastore: Some("LocalDS_0".into()),
        }
        .to_xml();
        assert_eq!(
            order(&add_disk),
            ["key", "backing", "controllerKey", "unitNumber", "capacityInKB"]
        );
        assert!(add_disk.contains("<operation>add</operation><fileOperation>create</fileOperation>"));
        assert!(
            add_disk.contains("<fileName>[LocalDS_0]</fileName>"),
            "{add_disk}"
        );
        assert!(
            add_disk.contains("<unitNumber>2</unitNumber>"),
            "units 0 and 1 are taken: {add_disk}"
        );
        assert_eq!(
            hw.free_unit(202, &[2, 3, 4, 5, 6]),
            Some(8),
            "7 is the controller's own unit"
        );
        assert!(
            edit.contains("<deviceName>VM Network</deviceName><network type=\"Network\">network-6</network>")
        );
    }

    #[test]
    fn networks_compare_by_object_and_models_map_to_types() {
        let a = NetworkBacking::Standard {
            name: "VM Network".into(),
            network: Some(MoRef::new("Network", "network-6")),
        };
        let b = NetworkBacking::Distributed {
            switch_uuid: "u".into(),
            portgroup_key: "dvportgroup-12".into(),
        };
        assert!(a.same_network(&a.clone()));
        assert!(!a.same_network(&b));
        assert!(b.same_network(&NetworkBacking::Distributed {
            switch_uuid: "other".into(),
            portgroup_key: "dvportgroup-12".into()
        }));
        assert_eq!(nic_type_for_model("vmxnet3"), Some("VirtualVmxnet3"));
        assert_eq!(nic_type_for_model("E1000e"), Some("VirtualE1000e"));
        assert_eq!(nic_type_for_model("virtio"), None);
    }
}
