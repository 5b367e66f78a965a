//! The `VirtualMachine` kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ImageSource, ProviderAllocation};
use crate::common::{
    ContractReference, Cpu, Disk, LocalObjectReference, MachineAddress, NetworkInterface, PowerState,
    ProviderReference, ReadinessChecks, RestartPolicy, SecretKeyReference,
};

/// A hypervisor-neutral virtual machine. Pick where it runs with `providerRef` (one `Provider`)
/// or `placement.providerSelector` (any matching `Provider`), what it boots with `imageRef` (a
/// `VirtualMachineImage`) or `source` (a backend template), and how big it is with `classRef`
/// (a `VirtualMachineClass`) and/or explicit `cpu`, `memoryMiB` and `disks`, which override the
/// class.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachine",
    plural = "virtualmachines",
    namespaced,
    status = "VirtualMachineStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "vm",
    shortname = "bvm",
    category = "banlieue",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "A hypervisor-neutral virtual machine, placed on a banlieue Provider.",
    validation = Rule::new("self.metadata.name.size() <= 63").message(
        "metadata.name must be at most 63 characters (it is copied into the banlieue.io/virtual-machine label of the infrastructure machine): choose a shorter name"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the VM is ready (the Ready condition's status)"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why the VM is (not) ready (the Ready condition's reason)"
    ),
    printcolumn(
        name = "Power",
        type_ = "string",
        json_path = ".status.powerState",
        description = "Observed power state"
    ),
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".status.provider",
        description = "Provider running the VM"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.node",
        description = "Hypervisor node"
    ),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.addresses[?(@.type==\"InternalIP\")].address",
        description = "Internal IP addresses"
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".status.providerID",
        description = "Provider ID",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message",
        description = "The Ready condition's message: what is wrong and what to do",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.providerRef) != (has(self.placement) && has(self.placement.providerSelector))",
        "message": "set exactly one of spec.providerRef or spec.placement.providerSelector"
    },
    {
        "rule": "has(self.imageRef) != has(self.source)",
        "message": "set exactly one of spec.imageRef (a VirtualMachineImage) or spec.source (a backend template)"
    },
    {
        "rule": "has(self.classRef) || (has(self.cpu) && has(self.memoryMiB))",
        "message": "without spec.classRef, set both spec.cpu and spec.memoryMiB"
    },
    {
        "rule": "has(self.providerRef) == has(oldSelf.providerRef) && (!has(self.providerRef) || self.providerRef == oldSelf.providerRef)",
        "message": "spec.providerRef is immutable: create a new VirtualMachine to move to another Provider"
    },
    {
        "rule": "has(self.imageRef) == has(oldSelf.imageRef) && (!has(self.imageRef) || self.imageRef == oldSelf.imageRef) && has(self.source) == has(oldSelf.source) && (!has(self.source) || self.source == oldSelf.source)",
        "message": "the source image (spec.imageRef or spec.source) is immutable: create a new VirtualMachine to change it"
    }
]))]
pub struct VirtualMachineSpec {
    /// The `Provider` that runs this VM. Mutually exclusive with `placement.providerSelector`;
    /// immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// A `VirtualMachineClass` with default CPU, memory and disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_ref: Option<LocalObjectReference>,
    /// A `VirtualMachineImage` naming the image to boot, resolved per backend. Mutually exclusive
    /// with `source`; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<LocalObjectReference>,
    /// The backend template or base volume to boot, given explicitly. Mutually exclusive with
    /// `imageRef`; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ImageSource>,
    /// Virtual CPU topology; overrides the class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Memory in MiB (at least 128); overrides the class.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 128, max = 16777216))]
    pub memory_mib: Option<u64>,
    /// Disks, keyed by name; the first is the boot disk. Entries override the class's disks of
    /// the same name. A disk may grow but never shrink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<Disk>,
    /// Network interfaces, keyed by name. Defaults to one DHCP interface on the provider's
    /// default network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub networks: Vec<NetworkInterface>,
    /// Secret holding cloud-init user data (key `value` unless `key` says otherwise). Inline
    /// user data is deliberately not supported: it would be readable by anyone who can read the
    /// VirtualMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<SecretKeyReference>,
    /// Desired power state, `On` (default) or `Off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Whether a change that needs a restart (CPU, memory) may restart the running VM:
    /// `Manual` (default: no surprise reboots; the change waits for the next power-off, and the
    /// `VMUpToDate` condition and a Warning Event say `RestartRequired`) or `Automatic` (shut
    /// down, apply, start again, announced by a `PoweringOff` Event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// Guest readiness checks, copied to the infrastructure machine: `skipCloudInit` for a guest
    /// without cloud-init (else `Ready` waits for cloud-init's report where the provider reads
    /// it), `skipGuestAgent` for one without a guest agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_checks: Option<ReadinessChecks>,
    /// Placement: provider selection and hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// Where a VirtualMachine may run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Selects candidate `Provider`s by label; the controller picks one and records it in
    /// `status.provider`. Mutually exclusive with `spec.providerRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_selector: Option<LabelSelector>,
    /// Failure domain to place the VM in (a name from the Provider's failure domains, e.g. a
    /// Proxmox node or a vSphere zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,
    /// Hypervisor node to run on, when the backend has nodes (Proxmox node, libvirt host, ESXi
    /// host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub node: Option<String>,
}

/// Lifecycle phase of a VirtualMachine, a summary of its conditions for humans. `Failed` means
/// a human must act: the `Ready` condition says why (credentials, TLS trust, a missing template
/// or user-data Secret, invalid input, …); the phase leaves `Failed` once the cause is fixed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum VirtualMachinePhase {
    /// Accepted; waiting for a provider, an image or an IP address.
    #[default]
    Pending,
    /// The infrastructure machine is being created.
    Provisioning,
    /// Provisioned and powered on.
    Running,
    /// Provisioned and powered off.
    Stopped,
    /// Being deleted.
    Deleting,
    /// A human must act: the provisioning state is `Failed`, or `Ready` is `False` with a reason
    /// from `banlieue_api::condition::NEEDS_HUMAN_REASONS`. Left once the cause is fixed.
    Failed,
}

/// Observed state of a VirtualMachine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<VirtualMachinePhase>,
    /// Conditions, keyed by type: `Ready`, `Provisioned`, `InfrastructureReady` (mirrored from
    /// the infrastructure object) and `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Provider ID of the machine (e.g. `proxmox://<cluster>/<vmid>`), once provisioned.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,
    /// Addresses reported by the guest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub addresses: Vec<MachineAddress>,
    /// The infrastructure object (e.g. a `ProxmoxMachine`) this VirtualMachine drives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractReference>,
    /// Observed power state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Name of the `Provider` running the VM (chosen by `spec.providerRef` or the selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub provider: Option<String>,
    /// Hypervisor node the VM runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub node: Option<String>,
    /// Failure domain the VM was placed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,
    /// What the VM takes of its Provider's `spec.capacity`: one VM, its vCPUs (cores ×
    /// sockets), memory, and the sizes of the disks it declares (its own and its class's).
    /// Recorded with `provider`; the Provider's `status.allocated` is the sum over its VMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<ProviderAllocation>,
}
