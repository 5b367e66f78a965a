//! References to other objects.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reference to a Secret, possibly in another namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the Secret. Defaults to the namespace of the referring object; required when
    /// the referring object is cluster-scoped (a `Provider`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// A reference to one key of a Secret in the referring object's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyReference {
    /// Name of the Secret, in the same namespace as the referring object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret's `data`. Defaults to `value` (the key Cluster API bootstrap
    /// Secrets use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

impl SecretKeyReference {
    /// The key to read, `value` when unset.
    pub fn key_or_default(&self) -> &str {
        self.key.as_deref().unwrap_or("value")
    }
}

/// A reference by name to an object of a kind implied by the field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A reference to a cluster-scoped banlieue `Provider` (`banlieue.io/v1alpha1`), which holds
/// the hypervisor endpoint, its credentials and defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderReference {
    /// Name of the `Provider`.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A Cluster API contract reference: `{apiGroup, kind, name}` in the referring object's
/// namespace; the version is read from the CRD's contract label.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractReference {
    /// API group of the referenced object, e.g. `infrastructure.banlieue.io`.
    #[schemars(length(min = 1, max = 253))]
    pub api_group: String,
    /// Kind of the referenced object, e.g. `ProxmoxMachine`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A reference to a Cluster API IPAM pool (e.g. `InClusterIPPool` of group
/// `ipam.cluster.x-k8s.io`) from which an `IPAddressClaim` is made.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpPoolReference {
    /// API group of the pool, e.g. `ipam.cluster.x-k8s.io`.
    #[schemars(length(min = 1, max = 253))]
    pub api_group: String,
    /// Kind of the pool, e.g. `InClusterIPPool` or `GlobalInClusterIPPool`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Name of the pool.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}
