//! The `VirtualMachineClass` kind.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::Cpu;

/// A sizing preset: CPU, memory and disks a `VirtualMachine` gets through `spec.classRef`.
#[derive(CustomResource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachineClass",
    plural = "virtualmachineclasses",
    derive = "PartialEq",
    shortname = "vmclass",
    category = "banlieue",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "A sizing preset (CPU, memory, disks) for VirtualMachines.",
    printcolumn(name = "Cores", type_ = "integer", json_path = ".spec.cpu.cores"),
    printcolumn(name = "Sockets", type_ = "integer", json_path = ".spec.cpu.sockets"),
    printcolumn(name = "Memory (MiB)", type_ = "integer", json_path = ".spec.memoryMiB"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineClassSpec {
    /// Virtual CPU topology.
    pub cpu: Cpu,
    /// Memory in MiB (at least 128).
    #[serde(rename = "memoryMiB")]
    #[schemars(range(min = 128, max = 16777216))]
    pub memory_mib: u64,
    /// Disks, keyed by name; the first is the boot disk. A VirtualMachine's own disks override
    /// entries of the same name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<DiskPreset>,
}

/// A disk of a class. Unlike a machine's disk, a preset may shrink: classes only apply to
/// machines created after the change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskPreset {
    /// Name of the disk (`root`, `data`, or a Proxmox slot such as `scsi0`).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Size in GiB.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 65536))]
    pub size_gib: u64,
    /// Storage (Proxmox storage ID, libvirt pool, vSphere datastore); defaults to the
    /// Provider's default storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage: Option<String>,
}
