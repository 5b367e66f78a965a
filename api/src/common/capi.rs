//! Fragments of the Cluster API v1beta2 provider contract, shaped exactly as CAPI reads them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API server endpoint of a workload cluster (`spec.controlPlaneEndpoint`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// Hostname or IP address of the control plane endpoint.
    #[schemars(length(min = 1, max = 512))]
    pub host: String,
    /// TCP port of the control plane endpoint.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Initialization status CAPI reads (`status.initialization`). Leave the whole struct out of
/// the status while `provisioned` is unset: see [`Initialization::provisioned`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Initialization {
    /// True once the infrastructure is fully provisioned. CAPI copies it to the owner's
    /// `status.initialization.infrastructureProvisioned`; once true it never goes back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

impl Initialization {
    /// `Some(Initialization { provisioned: Some(true) })` when provisioned, else `None`, so the
    /// field is omitted (never `null`, never `{}`) until there is something to say.
    pub fn provisioned(provisioned: bool) -> Option<Self> {
        provisioned.then_some(Self {
            provisioned: Some(true),
        })
    }

    /// Whether `status.initialization.provisioned` is true.
    pub fn is_provisioned(this: Option<&Self>) -> bool {
        this.and_then(|i| i.provisioned).unwrap_or(false)
    }
}

/// The kind of a machine address, as in CAPI's `MachineAddress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum MachineAddressType {
    /// The machine's hostname.
    Hostname,
    /// An address reachable from outside the machine's network.
    ExternalIP,
    /// An address reachable inside the machine's network.
    InternalIP,
    /// A DNS name resolving from outside.
    ExternalDNS,
    /// A DNS name resolving inside the cluster network.
    InternalDNS,
}

/// One address of a machine (CAPI `MachineAddress` shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// Kind of address.
    #[serde(rename = "type")]
    pub type_: MachineAddressType,
    /// The address.
    #[schemars(length(min = 1, max = 256))]
    pub address: String,
}

impl MachineAddress {
    /// An address of the given type.
    pub fn new(type_: MachineAddressType, address: impl Into<String>) -> Self {
        Self {
            type_,
            address: address.into(),
        }
    }
}

/// A failure domain of an infrastructure cluster (`status.failureDomains[]`). CAPI copies the
/// list to the Cluster sorted by name and spreads control plane machines over the domains with
/// `controlPlane: true`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain (for Proxmox a node name, for vSphere a zone, for libvirt a
    /// host); CAPI writes it into a Machine's `spec.failureDomain`.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Whether control plane machines may be placed in this failure domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes of the failure domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

impl FailureDomain {
    /// Attribute a banlieue provider sets to the failure domain's CPUs, when the hypervisor
    /// tells them.
    pub const CPUS_ATTRIBUTE: &str = "banlieue.io/cpus";
    /// Attribute a banlieue provider sets to the failure domain's memory in MiB.
    pub const MEMORY_MIB_ATTRIBUTE: &str = "banlieue.io/memoryMiB";

    /// This failure domain with its capacity among its attributes (nothing added for what is
    /// unknown).
    pub fn with_capacity(mut self, cpus: Option<u32>, memory_mib: Option<u64>) -> Self {
        let mut set = |key: &str, value: Option<String>| {
            if let Some(value) = value {
                self.attributes
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key.to_owned(), value);
            }
        };
        set(Self::CPUS_ATTRIBUTE, cpus.map(|c| c.to_string()));
        set(Self::MEMORY_MIB_ATTRIBUTE, memory_mib.map(|m| m.to_string()));
        self
    }

    /// The capacity among its attributes: CPUs and memory in MiB.
    pub fn capacity(&self) -> (Option<u32>, Option<u64>) {
        let get = |key: &str| self.attributes.as_ref().and_then(|a| a.get(key));
        (
            get(Self::CPUS_ATTRIBUTE).and_then(|v| v.parse().ok()),
            get(Self::MEMORY_MIB_ATTRIBUTE).and_then(|v| v.parse().ok()),
        )
    }
}

/// Labels and annotations for objects created from a template (`spec.template.metadata`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMetaTemplate {
    /// Labels copied onto the objects created from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations copied onto the objects created from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ObjectMetaTemplate {
    /// True when there are neither labels nor annotations (the field is then omitted).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// Node information for cluster-autoscaler scale-from-zero (`status.nodeInfo` on a machine
/// template).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// CPU architecture of the nodes, e.g. `amd64` or `arm64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub architecture: Option<String>,
    /// Operating system of the nodes, e.g. `linux` or `windows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub operating_system: Option<String>,
}

/// Optional status of an infrastructure machine template, read by cluster-autoscaler to scale
/// a MachineDeployment from zero.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateStatus {
    /// Resources of one machine (`cpu`, `memory`, `ephemeral-storage`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// Node information of the machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
}
