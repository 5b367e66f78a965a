//! Proxmox VE: `ProxmoxCluster`, `ProxmoxMachine` and their templates.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    ApiEndpoint, CloneMode, Cpu, Disk, FailureDomain, Firmware, ImageDownload, Initialization,
    MachineAddress, MachineTemplateStatus, NetworkInterface, ObjectMetaTemplate, PowerState,
    ProviderReference, ProvisioningStatus, ReadinessChecks, RestartPolicy, SecretReference, SeedDriveBus,
    TlsTrust,
};

/// The Proxmox VE template a machine is cloned from: by `vmid`, or by `name` and/or `tags`
/// (the template must then be unique), or made by the provider from an `image`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.image) ? !(has(self.vmid) || has(self.name) || has(self.tags)) : has(self.vmid) != (has(self.name) || has(self.tags))",
        "message": "select the source template either by vmid, or by name and/or tags, or by image (only one of them)"
    },
    {
        "rule": "!has(self.imageStorage) || has(self.image)",
        "message": "imageStorage is where an image is downloaded to: set image too"
    }
]))]
pub struct ProxmoxTemplateSource {
    /// VMID of the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 999_999_999))]
    pub vmid: Option<u32>,
    /// Name of the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub name: Option<String>,
    /// Tags the template must all carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(min = 1, max = 64), regex(pattern = r"^[a-z0-9_][a-z0-9_+.-]*$"))
    )]
    pub tags: Vec<String>,
    /// Node holding the template, when it is not on shared storage; defaults to any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub node: Option<String>,
    /// An image the provider makes the template from, once per node: the storage downloads it
    /// (`download-url`, checksum verified by Proxmox VE), a VM is created with its disk imported
    /// (`import-from`) and made a template tagged `banlieue-<algorithm>-<checksum's first 48
    /// digits>`, which every machine naming the same image on that node clones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageDownload>,
    /// Storage the image is downloaded to: file-based, with content `import` enabled (default
    /// `local`). The template's disk goes to `spec.storage`, else the first disk's storage,
    /// else `local-lvm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub image_storage: Option<String>,
}

/// An inclusive range of VMIDs new machines get their VMID from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.start <= self.end", "message": "vmidRange.start must not be greater than vmidRange.end"}
]))]
pub struct VmidRange {
    /// First VMID of the range.
    #[schemars(range(min = 100, max = 999_999_999))]
    pub start: u32,
    /// Last VMID of the range.
    #[schemars(range(min = 100, max = 999_999_999))]
    pub end: u32,
}

/// A PCI device passed through to the VM by a Proxmox VE resource mapping (Datacenter →
/// Resource Mappings): the mapping names the device on each node, so the VM can move between
/// nodes that have it, and its `Mapping.Use` permission is what the token needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PciDevice {
    /// The PCI resource mapping's id.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z][A-Za-z0-9_.-]*$"))]
    pub mapping: String,
    /// Attach it as a PCI Express device (`pcie=1`; the VM's machine type becomes `q35`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<bool>,
    /// It is the VM's primary GPU (`x-vga=1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_gpu: Option<bool>,
}

/// Proxmox VE High Availability for a machine's VM: the HA manager restarts it, or starts it on
/// another node, when its node fails. The provider adds the VM as an HA resource (`vm:<vmid>`)
/// once it is provisioned, keeps following it when HA moves it, and removes it from HA with the
/// VM. Needs Proxmox VE 9 (HA rules) and `Sys.Console` on `/` for the token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HighAvailability {
    /// HA rules (`/cluster/ha/rules`, node-affinity or resource-affinity) the VM's resource
    /// joins; they must exist. A rule listed here later is joined then; a rule removed from
    /// the list keeps the VM (remove it in Proxmox). When the VM is deleted, Proxmox removes it
    /// from its rules, and deletes a rule it was the only resource of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z][A-Za-z0-9_.-]*$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub rules: Vec<String>,
    /// How often the HA manager restarts the VM on its node after a failed start (Proxmox's
    /// `max_restart`); default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10))]
    pub max_restart: Option<u32>,
    /// How often the HA manager tries another node after the restarts failed (Proxmox's
    /// `max_relocate`); default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10))]
    pub max_relocate: Option<u32>,
}

/// One Proxmox VE cluster (or standalone host) of a ProxmoxCluster spread over several: a
/// failure domain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.providerRef) != has(self.endpoint)",
        "message": "set either providerRef (a banlieue Provider) or endpoint with credentialsRef"
    },
    {
        "rule": "!has(self.endpoint) || has(self.credentialsRef)",
        "message": "endpoint needs credentialsRef: a Secret with keys tokenID and secret"
    },
    {
        "rule": "!has(self.providerRef) || (!has(self.credentialsRef) && !has(self.tls))",
        "message": "with providerRef, the Provider's credentials and TLS trust are used: remove credentialsRef and tls"
    }
]))]
pub struct ProxmoxClusterEndpoint {
    /// Failure-domain name (a DNS label): what `Machine.spec.failureDomain` names and what a
    /// machine's `status.failureDomain` says.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// A banlieue `Provider` (backend `proxmox`) giving endpoint, credentials and TLS trust.
    /// Mutually exclusive with `endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// URL of this Proxmox VE API, e.g. `https://pve-a.example.com:8006`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 9, max = 2048), regex(pattern = r"^https://"))]
    pub endpoint: Option<String>,
    /// Secret with this endpoint's API token: keys `tokenID` (`user@realm!name`) and `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
    /// How to trust this endpoint's TLS certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsTrust>,
    /// Nodes of this endpoint machines may run on. Empty means every online node (or the
    /// Provider's `nodes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub allowed_nodes: Vec<String>,
    /// Whether control plane machines may be placed here (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
}

/// A Proxmox VE cluster hosting a Cluster API workload cluster: where its API is, the
/// credentials, and the nodes machines may be placed on (its failure domains).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "ProxmoxCluster",
    plural = "proxmoxclusters",
    namespaced,
    status = "ProxmoxClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "pxcluster",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Cluster API infrastructure cluster on Proxmox VE.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster API Cluster"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "[has(self.providerRef), has(self.endpoint), has(self.endpoints)].exists_one(x, x)",
        "message": "set exactly one of spec.providerRef (a banlieue Provider), spec.endpoint with spec.credentialsRef (one Proxmox VE cluster) or spec.endpoints (several, each a failure domain)"
    },
    {
        "rule": "!has(oldSelf.endpoints) || has(self.endpoints)",
        "message": "spec.endpoints cannot be removed: machines keep their VMs on those endpoints (their status.failureDomain names them)"
    },
    {
        "rule": "!has(self.endpoints) || !(has(self.credentialsRef) || has(self.tls) || has(self.allowedNodes))",
        "message": "with spec.endpoints, credentialsRef, tls and allowedNodes are set on each endpoint: remove spec.credentialsRef, spec.tls and spec.allowedNodes"
    },
    {
        "rule": "!has(self.endpoint) || has(self.credentialsRef)",
        "message": "spec.endpoint needs spec.credentialsRef: a Secret with keys tokenID and secret"
    },
    {
        "rule": "!has(oldSelf.controlPlaneEndpoint) || (has(self.controlPlaneEndpoint) && self.controlPlaneEndpoint == oldSelf.controlPlaneEndpoint)",
        "message": "spec.controlPlaneEndpoint is immutable once set"
    },
    {
        "rule": "!has(self.providerRef) || (!has(self.credentialsRef) && !has(self.tls))",
        "message": crate::support::CLUSTER_PROVIDER_REF_RULE
    }
]))]
pub struct ProxmoxClusterSpec {
    /// Endpoint of the workload cluster's API server; copied to the Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// A banlieue `Provider` (backend `proxmox`) giving endpoint, credentials and TLS trust.
    /// Mutually exclusive with `endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// URL of the Proxmox VE API, e.g. `https://pve.example.com:8006`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 9, max = 2048), regex(pattern = r"^https://"))]
    pub endpoint: Option<String>,
    /// Secret with the API token: keys `tokenID` (`user@realm!name`) and `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
    /// How to trust the API's TLS certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsTrust>,
    /// Nodes machines may run on; each becomes a failure domain. Empty means every online node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub allowed_nodes: Vec<String>,
    /// Several Proxmox VE clusters (or standalone hosts), keyed by name: each is one failure
    /// domain, and a machine goes to the node with the most free memory of its failure
    /// domain's endpoint. Mutually exclusive with `endpoint` and `providerRef`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub endpoints: Vec<ProxmoxClusterEndpoint>,
    /// VMIDs new machines get; defaults to the next free VMID of the Proxmox cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmid_range: Option<VmidRange>,
}

/// Observed state of a ProxmoxCluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxClusterStatus {
    /// `provisioned: true` once the cluster infrastructure is ready; omitted before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Failure domains (one per allowed node), copied to the Cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub failure_domains: Vec<FailureDomain>,
    /// Conditions, keyed by type; `Ready` is mirrored as the Cluster's `InfrastructureReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The Proxmox VE version (`GET /version`), from the last connection check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A Proxmox VE virtual machine backing a Cluster API Machine (or a banlieue VirtualMachine).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "ProxmoxMachine",
    plural = "proxmoxmachines",
    namespaced,
    status = "ProxmoxMachineStatus",
    derive = "PartialEq",
    shortname = "pxmachine",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Cluster API infrastructure machine on Proxmox VE.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster API Cluster"
    ),
    printcolumn(name = "State", type_ = "string", json_path = ".status.provisioning.state"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.node"),
    printcolumn(name = "VMID", type_ = "integer", json_path = ".status.vmid"),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.addresses[?(@.type==\"InternalIP\")].address"
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".spec.providerID",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(oldSelf.providerID) || (has(self.providerID) && self.providerID == oldSelf.providerID)",
        "message": "spec.providerID is immutable once set"
    },
    {
        "rule": "self.source == oldSelf.source",
        "message": "spec.source is immutable: create a new machine to change the template"
    },
    {
        "rule": "!has(self.cloneMode) || self.cloneMode != 'Linked' || !has(self.storage)",
        "message": "a linked clone stays on the template's storage: remove spec.storage or use cloneMode Full"
    },
    {
        "rule": "!has(self.targetNode) || !has(self.allowedNodes) || self.targetNode in self.allowedNodes",
        "message": "spec.targetNode must be one of spec.allowedNodes"
    }
]))]
pub struct ProxmoxMachineSpec {
    /// `proxmox://<vm uuid>` once the VM exists; must equal the workload Node's
    /// `spec.providerID`. Set by the provider; immutable once set.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,
    /// A banlieue `Provider` to take the endpoint and credentials from, for machines without a
    /// CAPI Cluster (standalone VirtualMachines). Unset: use the Cluster's ProxmoxCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// The template to clone. Immutable.
    pub source: ProxmoxTemplateSource,
    /// Node to create the VM on. Defaults to the Machine's failure domain, else the allowed node
    /// with the most free memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub target_node: Option<String>,
    /// Nodes this machine may run on; narrows the cluster's allowed nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub allowed_nodes: Vec<String>,
    /// Storage ID for the cloned disks (full clones only); defaults to the template's storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage: Option<String>,
    /// `Full` (default) or `Linked` clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_mode: Option<CloneMode>,
    /// Proxmox resource pool to add the VM to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pool: Option<String>,
    /// Virtual CPU topology.
    pub cpu: Cpu,
    /// Memory in MiB (at least 128).
    #[serde(rename = "memoryMiB")]
    #[schemars(range(min = 128, max = 16777216))]
    pub memory_mib: u64,
    /// Disks, keyed by name (`scsi0`, `virtio1`…); the first is the boot disk, resized from the
    /// template's. A disk may grow but never shrink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<Disk>,
    /// Network interfaces (`net0`, `net1`…), keyed by name; `network` is the bridge. Defaults to
    /// the template's interfaces with DHCP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub networks: Vec<NetworkInterface>,
    /// Proxmox tags added to the VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(length(min = 1, max = 64), regex(pattern = r"^[a-z0-9_][a-z0-9_+.-]*$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub tags: Vec<String>,
    /// Label keys of this ProxmoxMachine whose labels become VM tags (Cluster API copies a
    /// Machine's labels onto it when it creates it): `<name>.<value>` with `<name>` the key's
    /// part after its prefix and the value lower-cased, characters a tag cannot hold as `_`
    /// (`cluster.x-k8s.io/cluster-name: prod` → `cluster-name.prod`); a label without a value is
    /// `<name>` (`node-role.kubernetes.io/control-plane` → `control-plane`). A changed value
    /// replaces its tag; a missing label adds none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(
            length(min = 1, max = 317),
            regex(pattern = crate::common::LABEL_KEY_PATTERN)
        ),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub tags_from_labels: Vec<String>,
    /// VMIDs this machine may get; overrides the cluster's range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmid_range: Option<VmidRange>,
    /// Guest readiness checks; skip them for guests without qemu-guest-agent or cloud-init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_checks: Option<ReadinessChecks>,
    /// Desired power state: `On` (default when unset) or `Off`. Set by the banlieue controller
    /// from a VirtualMachine's `spec.powerState`; unset for machines of CAPI Machines. The
    /// provider powers a provisioned machine on or off to match and reports `status.powerState`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Whether the provider may restart the running VM to apply a change that needs it (CPU,
    /// memory): `Manual` (default when unset: the change waits for the next power-off and
    /// `VMUpToDate` says `RestartRequired`) or `Automatic`. Set by the banlieue controller from a
    /// VirtualMachine's `spec.restartPolicy`; a CAPI machine is replaced by CAPI, not changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// Put the VM under Proxmox VE High Availability. Unset: an HA resource the provider added
    /// is removed (one added in Proxmox by hand is left alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HighAvailability>,
    /// Bus of the CD-ROM drive the bootstrap seed is attached on until the first boot: `IDE`
    /// (default when unset, slot `ide2`), `SATA` (`sata5`) or `SCSI` (`scsi30`). ARM64 guests
    /// have no IDE controller: use `SCSI`. The slot must not be one of `disks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_drive_bus: Option<SeedDriveBus>,
    /// Firmware: `BIOS` (SeaBIOS) or `UEFI` (OVMF, with an EFI variables disk created on
    /// `storage`, else the boot disk's storage). Unset: the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// UEFI Secure Boot: the EFI disk is created with Microsoft's keys enrolled
    /// (`pre-enrolled-keys=1`). Needs `firmware: UEFI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// A TPM 2.0, its state (`tpmstate0`) on `storage`, else the boot disk's storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<bool>,
    /// CPU model the VM sees (Proxmox's `cpu` option): `host`, `x86-64-v2-AES`, `x86-64-v3`…
    /// Unset: the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"))]
    pub cpu_type: Option<String>,
    /// CPU flags to add (`+aes`) or remove (`-pcid`) from the model; needs `cpuType`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(length(min = 2, max = 64), regex(pattern = r"^[+-][a-z0-9_-]+$"))
    )]
    pub cpu_flags: Vec<String>,
    /// PCI devices (GPUs, NICs) passed through by resource mapping, as `hostpci0`, `hostpci1`…
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub pci_devices: Vec<PciDevice>,
}

impl ProxmoxMachineSpec {
    /// A machine cloned from `source` with `cpu` and `memory_mib`, everything else unset (the
    /// provider's and the template's defaults); set more with struct update syntax.
    pub fn new(source: ProxmoxTemplateSource, cpu: Cpu, memory_mib: u64) -> Self {
        Self {
            provider_id: None,
            provider_ref: None,
            source,
            target_node: None,
            allowed_nodes: Vec::new(),
            storage: None,
            clone_mode: None,
            pool: None,
            cpu,
            memory_mib,
            disks: Vec::new(),
            networks: Vec::new(),
            tags: Vec::new(),
            tags_from_labels: Vec::new(),
            vmid_range: None,
            readiness_checks: None,
            power_state: None,
            restart_policy: None,
            high_availability: None,
            seed_drive_bus: None,
            firmware: None,
            secure_boot: None,
            tpm: None,
            cpu_type: None,
            cpu_flags: Vec::new(),
            pci_devices: Vec::new(),
        }
    }
}

/// Observed state of a ProxmoxMachine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxMachineStatus {
    /// `provisioned: true` once the VM runs and `spec.providerID` is set; omitted before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Addresses of the VM, copied to the Machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub addresses: Vec<MachineAddress>,
    /// Failure domain (node) the VM was placed in, copied to the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,
    /// Conditions, keyed by type; `Ready` is mirrored as the Machine's `InfrastructureReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// VMID of the VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmid: Option<u32>,
    /// Node the VM runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Observed power state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Persisted provisioning progress, including the Proxmox task (UPID) in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<ProvisioningStatus>,
}

/// `spec.template` of a ProxmoxClusterTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxClusterTemplateResource {
    /// Labels and annotations for the ProxmoxClusters created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// Spec of the ProxmoxClusters created from the template.
    pub spec: ProxmoxClusterSpec,
}

/// A template of ProxmoxClusters, for ClusterClasses.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "ProxmoxClusterTemplate",
    plural = "proxmoxclustertemplates",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    shortname = "pxct",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Template of Proxmox VE infrastructure clusters, for ClusterClasses.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxClusterTemplateSpec {
    /// The ProxmoxCluster to create.
    pub template: ProxmoxClusterTemplateResource,
}

/// `spec.template` of a ProxmoxMachineTemplate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.spec.providerID)",
        "message": "spec.template.spec.providerID must not be set in a template: each machine gets its own"
    }
]))]
pub struct ProxmoxMachineTemplateResource {
    /// Labels and annotations for the ProxmoxMachines created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// Spec of the ProxmoxMachines created from the template.
    pub spec: ProxmoxMachineSpec,
}

/// A template of ProxmoxMachines, for MachineDeployments, MachineSets and control planes.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "ProxmoxMachineTemplate",
    plural = "proxmoxmachinetemplates",
    namespaced,
    status = "MachineTemplateStatus",
    derive = "PartialEq",
    shortname = "pxmt",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Template of Proxmox VE infrastructure machines.",
    printcolumn(
        name = "Cores",
        type_ = "integer",
        json_path = ".spec.template.spec.cpu.cores"
    ),
    printcolumn(
        name = "Memory (MiB)",
        type_ = "integer",
        json_path = ".spec.template.spec.memoryMiB"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
// `spec.template.spec` is immutable, but not to CAPI's topology controller's dry-run requests
// (ClusterClass): a CEL rule cannot tell those apart, an admission policy can
// (`crate::policies::immutable_templates`).
pub struct ProxmoxMachineTemplateSpec {
    /// The ProxmoxMachine to create.
    pub template: ProxmoxMachineTemplateResource,
}
