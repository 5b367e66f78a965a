//! The `Provider` kind: one hypervisor endpoint.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{SecretReference, TlsTrust};

pub use crate::common::Backend;

/// The label that opts a Provider into `clusterctl move` (clusterctl's own
/// `clusterctl.cluster.x-k8s.io/move-hierarchy`): every move then copies it, with the Secret and
/// CA bundle it names, which its backend's provider makes it own (an owner reference).
pub const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move-hierarchy";

/// Finalizer the provider of a Provider's backend keeps on it while the Provider owns the
/// objects it names (credentials Secret, CA bundle): the Provider's deletion first takes its
/// owner references off them, so the garbage collector never deletes a Secret that others
/// may still use.
pub const REFERENCES_FINALIZER: &str = "banlieue.io/owns-references";

/// Annotation on a Provider: the objects it owns for `clusterctl move`, as
/// `Kind namespace/name` separated by commas (written by the provider, so that a changed
/// reference releases the object named before).
pub const OWNED_REFERENCES_ANNOTATION: &str = "banlieue.io/owned-references";

/// One hypervisor endpoint (a Proxmox VE cluster, a libvirt host, a vCenter) with its
/// credentials, TLS trust, defaults and declared capacity. Providers are cluster-scoped so
/// that VirtualMachines of every namespace can use them, like StorageClasses; their
/// `metadata.labels` are what `VirtualMachine.spec.placement.providerSelector` matches.
/// Any number of Providers of one backend may coexist (several Proxmox clusters, per-zone
/// credentials).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "Provider",
    plural = "providers",
    status = "ProviderStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "vmprovider",
    category = "banlieue",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    // `clusterctl move` discovers only CRDs labelled `clusterctl.cluster.x-k8s.io`; a Provider
    // labelled [`MOVE_LABEL`] is then moved with everything it owns (copied to the target, kept
    // on the source, as CAPV's cluster identities), its Secret included.
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "A hypervisor endpoint (Proxmox VE, libvirt or vSphere) VirtualMachines can run on.",
    validation = Rule::new("self.metadata.name.size() <= 63").message(
        "metadata.name must be at most 63 characters (it is copied into the banlieue.io/provider label of the objects made for VirtualMachines): choose a shorter name"
    ),
    printcolumn(name = "Backend", type_ = "string", json_path = ".spec.backend"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.endpoint"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.capacity.nodes"),
    printcolumn(
        name = "CPUs",
        type_ = "integer",
        json_path = ".status.capacity.cpus",
        priority = 1
    ),
    printcolumn(
        name = "MemoryMiB",
        type_ = "integer",
        json_path = ".status.capacity.memoryMiB",
        priority = 1
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.version",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.backend"
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.backend == oldSelf.backend",
        "message": "spec.backend is immutable: create a new Provider for another backend"
    },
    {
        "rule": "self.backend == 'libvirt' || self.endpoint.startsWith('https://')",
        "message": "a proxmox or vsphere endpoint must be an https:// URL, e.g. https://pve.example.com:8006"
    },
    {
        "rule": "self.backend != 'libvirt' || self.endpoint.matches('^(qemu|qemu\\\\+ssh|qemu\\\\+tls|qemu\\\\+tcp|test)://')",
        "message": "a libvirt endpoint must be a libvirt URI, e.g. qemu+ssh://root@host.example.com/system"
    },
    {
        "rule": "self.backend == 'libvirt' || has(self.credentialsRef)",
        "message": "proxmox and vsphere Providers need spec.credentialsRef"
    },
    {
        "rule": "!has(self.credentialsRef) || has(self.credentialsRef.__namespace__)",
        "message": "a Provider is cluster-scoped: set spec.credentialsRef.namespace"
    },
    {
        "rule": "!has(self.tls) || !has(self.tls.caBundleRef) || has(self.tls.caBundleRef.__namespace__)",
        "message": "a Provider is cluster-scoped: set spec.tls.caBundleRef.namespace"
    },
    {
        "rule": "self.backend != 'libvirt' || !has(self.tls)",
        "message": crate::support::PROVIDER_TLS_RULE
    },
    {
        "rule": "self.backend == 'proxmox' || !has(self.nodes)",
        "message": crate::support::PROVIDER_NODES_RULE
    },
    {
        "rule": "self.backend != 'libvirt' || !has(self.defaults) || !has(self.defaults.resourcePool)",
        "message": crate::support::PROVIDER_RESOURCE_POOL_RULE
    },
    {
        "rule": "self.backend == 'vsphere' || !has(self.defaults) || (!has(self.defaults.datacenter) && !has(self.defaults.folder))",
        "message": crate::support::PROVIDER_VSPHERE_DEFAULTS_RULE
    }
]))]
pub struct ProviderSpec {
    /// The hypervisor API: `proxmox`, `libvirt` or `vsphere`. Immutable.
    pub backend: Backend,
    /// Where the API is: `https://pve.example.com:8006` (Proxmox VE),
    /// `qemu+ssh://root@host.example.com/system` (libvirt), `https://vcenter.example.com`
    /// (vSphere).
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: String,
    /// Secret with the credentials (namespace required). Proxmox: keys `tokenID` and `secret`
    /// (an API token); vSphere: `username` and `password`; libvirt: optional `ssh-privatekey`
    /// and `known_hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
    /// How to trust the endpoint's TLS certificate; the system roots when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsTrust>,
    /// Defaults for VirtualMachines placed on this Provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<ProviderDefaults>,
    /// Proxmox nodes VMs may be placed on; each is a failure domain. Empty means any node.
    /// Only for backend `proxmox` (a libvirt Provider is one host; vSphere places through
    /// failure domains).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub nodes: Vec<String>,
    /// Capacity the operator allows banlieue's standalone VirtualMachines to use on this
    /// endpoint; the controller places no VM beyond any of the limits set (a VM that does not
    /// fit waits, `Ready=False ProviderFull`, and is placed once there is room). Unset means
    /// unlimited. VMs of Cluster API clusters are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<ProviderCapacity>,
    /// Namespaces whose VirtualMachines and infrastructure clusters (`spec.providerRef`) may
    /// use this Provider, selected by the namespaces' labels. Unset means every namespace; an
    /// empty selector (`{}`) also matches every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// Defaults applied to VirtualMachines that do not say otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderDefaults {
    /// Default storage for disks: Proxmox storage ID, libvirt pool or vSphere datastore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage: Option<String>,
    /// Default network: Proxmox bridge, libvirt network or vSphere port group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub network: Option<String>,
    /// Proxmox resource pool or vSphere resource pool path new VMs are put in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub resource_pool: Option<String>,
    /// vSphere datacenter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub datacenter: Option<String>,
    /// vSphere VM folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub folder: Option<String>,
}

/// Declared capacity of a Provider.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCapacity {
    /// Total virtual CPUs (cores × sockets of each VM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub vcpus: Option<u32>,
    /// Total memory in MiB.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 128))]
    pub memory_mib: Option<u64>,
    /// Total disk space in GiB: the sizes of the disks the VMs declare (`spec.disks` and their
    /// class's). While it is set, a VM that declares no disk is not placed here
    /// (`StorageNotDeclared`).
    #[serde(default, rename = "storageGiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub storage_gib: Option<u64>,
    /// Maximum number of VirtualMachines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub virtual_machines: Option<u32>,
}

/// What banlieue currently uses of a Provider.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAllocation {
    /// Virtual CPUs of the VirtualMachines placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Memory in MiB of the VirtualMachines placed here.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Disk space in GiB of the VirtualMachines placed here.
    #[serde(default, rename = "storageGiB", skip_serializing_if = "Option::is_none")]
    pub storage_gib: Option<u64>,
    /// Number of VirtualMachines placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machines: Option<u32>,
}

/// A node of the hypervisor (a failure domain of the Provider's infrastructure clusters), with
/// the capacity the hypervisor reports for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderNode {
    /// Node (failure domain) name.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Its CPUs, when the hypervisor tells them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Its memory in MiB, when the hypervisor tells it.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
}

/// The totals of a Provider's nodes (what its printer columns show).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderNodeTotals {
    /// Number of nodes.
    pub nodes: u32,
    /// CPUs of the nodes that report them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    /// Memory in MiB of the nodes that report it.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
}

impl ProviderNodeTotals {
    /// The totals of `nodes` (`None`: no node).
    pub fn of(nodes: &[ProviderNode]) -> Option<Self> {
        let sum = |part: fn(&ProviderNode) -> Option<u64>| {
            nodes
                .iter()
                .filter_map(part)
                .fold(None, |acc: Option<u64>, n| Some(acc.unwrap_or(0) + n))
        };
        (!nodes.is_empty()).then(|| Self {
            nodes: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
            cpus: sum(|n| n.cpus.map(u64::from)),
            memory_mib: sum(|n| n.memory_mib),
        })
    }
}

/// Observed state of a Provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// Conditions, keyed by type; `Ready` is true when the endpoint answers with the given
    /// credentials.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Version reported by the hypervisor API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Resources used by banlieue's VirtualMachines: the sum of their `status.allocated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<ProviderAllocation>,
    /// The hypervisor's reachable nodes, as its infrastructure clusters report them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub nodes: Vec<ProviderNode>,
    /// The totals of `nodes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<ProviderNodeTotals>,
}

impl Provider {
    /// Whether objects of a namespace with these labels may use this Provider: no
    /// `namespaceSelector`, or one selecting the labels. `Err` carries why the selector cannot
    /// be read.
    pub fn admits_namespace(
        &self,
        namespace_labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<bool, String> {
        use kube::core::{Selector, SelectorExt};
        match &self.spec.namespace_selector {
            None => Ok(true),
            Some(selector) => Selector::try_from(selector.clone())
                .map(|s| s.matches(namespace_labels))
                .map_err(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cpus: Option<u32>, memory_mib: Option<u64>) -> ProviderNode {
        ProviderNode {
            name: "n".into(),
            cpus,
            memory_mib,
        }
    }

    #[test]
    fn totals_count_every_node_and_sum_what_they_report() {
        assert_eq!(ProviderNodeTotals::of(&[]), None);
        assert_eq!(
            ProviderNodeTotals::of(&[node(Some(8), None), node(Some(4), Some(1024)), node(None, None)]),
            Some(ProviderNodeTotals {
                nodes: 3,
                cpus: Some(12),
                memory_mib: Some(1024),
            })
        );
        assert_eq!(
            ProviderNodeTotals::of(&[node(None, None)]).and_then(|t| t.cpus),
            None
        );
    }
}
