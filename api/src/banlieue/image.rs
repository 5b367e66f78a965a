//! The `VirtualMachineImage` kind and the per-backend image source.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Firmware, SeedDriveBus};
use crate::infrastructure::{LibvirtVolumeSource, ProxmoxTemplateSource, VSphereTemplateSource};

/// The template or base volume to clone, per backend. A `VirtualMachine` with an explicit
/// `source` may set several backends so that a `placement.providerSelector` can pick any of
/// them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.proxmox) || has(self.libvirt) || has(self.vsphere)",
        "message": "set the source for at least one backend: proxmox, libvirt or vsphere"
    }
]))]
pub struct ImageSource {
    /// Proxmox VE template to clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxmox: Option<ProxmoxTemplateSource>,
    /// libvirt base volume to clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtVolumeSource>,
    /// vSphere template to clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsphere: Option<VSphereTemplateSource>,
}

/// A neutral image name (e.g. `ubuntu-24.04`) mapped to the template or base volume that holds
/// it on each backend, so that one `VirtualMachine` spec can be placed on any Provider.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachineImage",
    plural = "virtualmachineimages",
    derive = "PartialEq",
    derive = "Default",
    shortname = "vmimage",
    category = "banlieue",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "A neutral image name mapped to each backend's template or base volume.",
    printcolumn(
        name = "OS",
        type_ = "string",
        json_path = ".spec.osType",
        description = "Guest operating system family"
    ),
    printcolumn(name = "Display name", type_ = "string", json_path = ".spec.displayName"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineImageSpec {
    /// Human-readable name, e.g. `Ubuntu 24.04 LTS (cloud image)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub display_name: Option<String>,
    /// Guest operating system family: `Linux`, `Windows` or `Other`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_type: Option<OsType>,
    /// Bus of the CD-ROM drive the bootstrap seed is attached on for this image's guests
    /// (`IDE`, `SATA`, `SCSI`): ARM64 images have no IDE controller. Unset: the provider's
    /// default (Proxmox `IDE`, libvirt `SATA`). Copied to the machine's `spec.seedDriveBus`;
    /// vSphere passes cloud-init data through guestinfo and has no seed drive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_drive_bus: Option<SeedDriveBus>,
    /// Firmware the image boots with: `BIOS` or `UEFI`. Copied to the machine's
    /// `spec.firmware` (Proxmox: `bios: ovmf` with an EFI disk; libvirt: OVMF; vSphere: `efi`).
    /// Unset: the template's (Proxmox, vSphere) or BIOS (libvirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Where the image lives on each backend. The controller uses the first entry whose backend
    /// matches the chosen Provider and whose `provider` (if set) names it.
    #[schemars(length(min = 1, max = 32))]
    pub sources: Vec<VirtualMachineImageSource>,
}

/// Guest operating system family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OsType {
    /// Linux (cloud-init).
    Linux,
    /// Windows (cloudbase-init).
    Windows,
    /// Anything else.
    Other,
}

/// Where an image lives on one backend, optionally for one Provider only (template IDs differ
/// between Proxmox clusters).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(has(self.proxmox) ? 1 : 0) + (has(self.libvirt) ? 1 : 0) + (has(self.vsphere) ? 1 : 0) == 1",
        "message": "each entry of spec.sources sets exactly one of proxmox, libvirt or vsphere"
    }
]))]
pub struct VirtualMachineImageSource {
    /// Restrict this entry to the named `Provider`; unset means every Provider of the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub provider: Option<String>,
    /// Proxmox VE template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxmox: Option<ProxmoxTemplateSource>,
    /// libvirt base volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtVolumeSource>,
    /// vSphere template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsphere: Option<VSphereTemplateSource>,
}
