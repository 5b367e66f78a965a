//! VMware vSphere: `VSphereCluster`, `VSphereMachine` and their templates.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    ApiEndpoint, CloneMode, Cpu, Disk, FailureDomain, Firmware, ImageDownload, Initialization,
    MachineAddress, MachineTemplateStatus, NetworkInterface, ObjectMetaTemplate, PowerState,
    ProviderReference, ProvisioningStatus, ReadinessChecks, RestartPolicy, SecretReference, TlsTrust,
};

/// The vSphere template a machine is cloned from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereTemplateSource {
    /// Name or inventory path of the template VM, e.g. `ubuntu-2404-kube-v1.34` or
    /// `/dc1/vm/templates/ubuntu-2404-kube-v1.34`.
    #[schemars(length(min = 1, max = 2048))]
    pub template: String,
    /// An OVA the provider imports as `template` when no VM has that path: downloaded and
    /// verified by the provider, imported once (`ImportVApp` into the machine's resource pool
    /// and datastore, which must be set), renamed to its final name only once complete and
    /// marked as a template. An existing `template` is used as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageDownload>,
}

/// A vSphere failure domain: a compute cluster (and optionally a resource pool and datastore)
/// in the cluster's datacenter, or in another vCenter (`server` or `providerRef`) and
/// datacenter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(has(self.server) && has(self.providerRef))",
        "message": "set at most one of server (with credentialsRef) or providerRef on a failure domain"
    },
    {
        "rule": "!has(self.server) || has(self.credentialsRef)",
        "message": "a failure domain's server needs its credentialsRef: a Secret with keys username and password"
    },
    {
        "rule": "has(self.server) || !(has(self.credentialsRef) || has(self.tls))",
        "message": "a failure domain's credentialsRef and tls are for its own server: set server too, or remove them"
    }
]))]
pub struct VSphereFailureDomain {
    /// Name of the failure domain, copied into Machines' `spec.failureDomain`.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Compute cluster of the failure domain.
    #[schemars(length(min = 1, max = 2048))]
    pub compute_cluster: String,
    /// Resource pool inside the compute cluster; defaults to the cluster's root pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub resource_pool: Option<String>,
    /// Datastore for machines in this failure domain; overrides the machine's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub datastore: Option<String>,
    /// Whether control plane machines may be placed here. Defaults to true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes published in the Cluster's failure domain.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    /// Another vCenter for this failure domain (a hostname or an `https://` URL), so one
    /// workload cluster spans several vCenters. Unset: the VSphereCluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub server: Option<String>,
    /// A banlieue `Provider` (backend `vsphere`) giving this failure domain's vCenter,
    /// credentials and TLS trust. Mutually exclusive with `server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// Secret with keys `username` and `password` for `server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
    /// How to trust `server`'s certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsTrust>,
    /// Datacenter of this failure domain's compute cluster, resource pool, datastore, template
    /// and folder; overrides the machine's and the VSphereCluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub datacenter: Option<String>,
}

impl VSphereFailureDomain {
    /// Whether its vCenter is its own (`server` or `providerRef`), not the VSphereCluster's.
    pub fn has_own_server(&self) -> bool {
        self.server.is_some() || self.provider_ref.is_some()
    }
}

/// A vCenter (and datacenter) hosting a Cluster API workload cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "VSphereCluster",
    plural = "vsphereclusters",
    namespaced,
    status = "VSphereClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "vscluster",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Cluster API infrastructure cluster on VMware vSphere.",
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
    printcolumn(name = "Server", type_ = "string", json_path = ".spec.server"),
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
        "rule": "has(self.providerRef) != has(self.server)",
        "message": "set either spec.providerRef (a banlieue Provider) or spec.server with spec.credentialsRef"
    },
    {
        "rule": "!has(self.server) || has(self.credentialsRef)",
        "message": "spec.server needs spec.credentialsRef: a Secret with keys username and password"
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
pub struct VSphereClusterSpec {
    /// Endpoint of the workload cluster's API server; copied to the Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// A banlieue `Provider` (backend `vsphere`) giving server, credentials and TLS trust.
    /// Mutually exclusive with `server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// vCenter server: a hostname or an `https://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub server: Option<String>,
    /// Secret with keys `username` and `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
    /// How to trust vCenter's certificate: a CA bundle, or its SHA-256 thumbprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsTrust>,
    /// Datacenter machines are created in, unless they say otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub datacenter: Option<String>,
    /// Failure domains (compute clusters), published in `status.failureDomains`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub failure_domains: Vec<VSphereFailureDomain>,
}

/// Observed state of a VSphereCluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereClusterStatus {
    /// `provisioned: true` once the cluster infrastructure is ready; omitted before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Failure domains, copied to the Cluster.
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
    /// vCenter version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A vSphere VM backing a Cluster API Machine (or a banlieue VirtualMachine).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "VSphereMachine",
    plural = "vspheremachines",
    namespaced,
    status = "VSphereMachineStatus",
    derive = "PartialEq",
    shortname = "vsmachine",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Cluster API infrastructure machine on VMware vSphere.",
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
    }
]))]
pub struct VSphereMachineSpec {
    /// `vsphere://<bios uuid>` once the VM exists; must equal the workload Node's
    /// `spec.providerID`. Set by the provider; immutable once set.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,
    /// A banlieue `Provider` to take server and credentials from, for machines without a CAPI
    /// Cluster. Unset: use the Cluster's VSphereCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// The template to clone. Immutable.
    pub source: VSphereTemplateSource,
    /// Datacenter; defaults to the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub datacenter: Option<String>,
    /// Datastore for the VM's files and disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub datastore: Option<String>,
    /// VM folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub folder: Option<String>,
    /// Resource pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub resource_pool: Option<String>,
    /// `Full` (default) or `Linked` clone (needs a snapshot on the template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_mode: Option<CloneMode>,
    /// Virtual CPU topology.
    pub cpu: Cpu,
    /// Memory in MiB (at least 128).
    #[serde(rename = "memoryMiB")]
    #[schemars(range(min = 128, max = 16777216))]
    pub memory_mib: u64,
    /// Disks, keyed by name; the first is the boot disk, grown from the template's. A disk may
    /// grow but never shrink. `storage` is a datastore.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<Disk>,
    /// Network interfaces, keyed by name; `network` is a port group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub networks: Vec<NetworkInterface>,
    /// Guest readiness checks; skip them for guests without VMware Tools or cloud-init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_checks: Option<ReadinessChecks>,
    /// Label keys of this VSphereMachine whose labels become vSphere tags of its VM (Cluster API
    /// copies a Machine's labels onto it when it creates it): each key is a tag category of its
    /// own (one tag per VM, created when missing), the label's value the tag (the key's part
    /// after its prefix for a label without a value). A changed value moves the VM to the other
    /// tag, a removed label detaches it; tags of other categories stay.
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
    /// Firmware: `BIOS` or `UEFI` (vSphere's `efi`). Unset: the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// UEFI Secure Boot (`bootOptions.efiSecureBootEnabled`). Needs `firmware: UEFI` or a UEFI
    /// template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// A virtual TPM 2.0 (`VirtualTPM`), added while the new VM is off, before its first
    /// power-on. Needs UEFI firmware (`firmware: UEFI` or a UEFI template) and a key provider in
    /// vCenter (the TPM's state is encrypted); a vCenter without one fails the reconfigure, and
    /// the machine's `Ready` says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<bool>,
    /// PCI devices (GPUs, NICs) passed through, added while the new VM is off, before its first
    /// power-on: by vendor and device ID with Dynamic DirectPath I/O (vCenter picks a free
    /// matching device on the host, optionally one with the hardware label `customLabel`), or an
    /// NVIDIA vGPU profile. Either locks the VM's memory reservation to its size, as vSphere
    /// requires.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub pci_devices: Vec<VSpherePciDevice>,
}

/// A PCI device for a VSphereMachine: a Dynamic DirectPath I/O device (`vendorId` and
/// `deviceId`, optionally `customLabel`), or a vGPU (`vgpuProfile`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.vgpuProfile) != (has(self.vendorId) && has(self.deviceId))",
        "message": "a PCI device is either vendorId and deviceId (Dynamic DirectPath I/O) or a vgpuProfile"
    },
    {
        "rule": "!has(self.customLabel) || has(self.deviceId)",
        "message": "customLabel selects among the devices of vendorId and deviceId"
    }
]))]
pub struct VSpherePciDevice {
    /// PCI vendor ID, as vSphere shows it (decimal: NVIDIA is 4318).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    pub vendor_id: Option<i32>,
    /// PCI device ID (decimal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    pub device_id: Option<i32>,
    /// The hardware label a host gave the device (Dynamic DirectPath I/O's `customLabel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub custom_label: Option<String>,
    /// An NVIDIA vGPU profile (`grid_a100-4c`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"))]
    pub vgpu_profile: Option<String>,
}

/// Observed state of a VSphereMachine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereMachineStatus {
    /// `provisioned: true` once the VM runs and `spec.providerID` is set; omitted before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Addresses of the VM, copied to the Machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub addresses: Vec<MachineAddress>,
    /// Failure domain the VM was placed in, copied to the Machine.
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
    /// The vCenter holding the VM when it is a failure domain's own (`failureDomains[].server`
    /// or its Provider's): a machine whose failure domain names another vCenter later is
    /// blocked (`VCenterChanged`) instead of looking for its VM where it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Managed object reference of the VM (`vm-123`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_ref: Option<String>,
    /// ESXi host the VM runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Observed power state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Persisted provisioning progress, including the vSphere task in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<ProvisioningStatus>,
}

/// `spec.template` of a VSphereClusterTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereClusterTemplateResource {
    /// Labels and annotations for the VSphereClusters created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// Spec of the VSphereClusters created from the template.
    pub spec: VSphereClusterSpec,
}

/// A template of VSphereClusters, for ClusterClasses.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "VSphereClusterTemplate",
    plural = "vsphereclustertemplates",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    shortname = "vsct",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Template of vSphere infrastructure clusters, for ClusterClasses.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VSphereClusterTemplateSpec {
    /// The VSphereCluster to create.
    pub template: VSphereClusterTemplateResource,
}

/// `spec.template` of a VSphereMachineTemplate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.spec.providerID)",
        "message": "spec.template.spec.providerID must not be set in a template: each machine gets its own"
    }
]))]
pub struct VSphereMachineTemplateResource {
    /// Labels and annotations for the VSphereMachines created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// Spec of the VSphereMachines created from the template.
    pub spec: VSphereMachineSpec,
}

/// A template of VSphereMachines.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "VSphereMachineTemplate",
    plural = "vspheremachinetemplates",
    namespaced,
    status = "MachineTemplateStatus",
    derive = "PartialEq",
    shortname = "vsmt",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Template of vSphere infrastructure machines.",
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
pub struct VSphereMachineTemplateSpec {
    /// The VSphereMachine to create.
    pub template: VSphereMachineTemplateResource,
}
