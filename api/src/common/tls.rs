//! How a provider trusts a hypervisor API's TLS certificate.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Trust settings for a hypervisor API endpoint. Exactly one of `caBundleRef`,
/// `sha256Fingerprint` or `insecureSkipVerify: true` may be set; when none is set the system
/// trust roots are used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(has(self.caBundleRef) ? 1 : 0) + (has(self.sha256Fingerprint) ? 1 : 0) + ((has(self.insecureSkipVerify) && self.insecureSkipVerify) ? 1 : 0) <= 1",
        "message": "set at most one of tls.caBundleRef, tls.sha256Fingerprint or tls.insecureSkipVerify"
    }
]))]
pub struct TlsTrust {
    /// A PEM CA bundle in a Secret or ConfigMap; the endpoint's chain must verify against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_ref: Option<CaBundleReference>,
    /// SHA-256 fingerprint of the endpoint's leaf certificate, as 64 hex digits, optionally
    /// colon-separated (`AB:CD:…`). The certificate is pinned; no chain validation is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^([0-9A-Fa-f]{2}(:?)){31}[0-9A-Fa-f]{2}$"),
        length(max = 95)
    )]
    pub sha256_fingerprint: Option<String>,
    /// Skip certificate verification entirely. Only for labs: anyone on the path can read the
    /// credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// Server name to verify the certificate against, when it differs from the endpoint host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub server_name: Option<String>,
}

/// Kind of object holding a CA bundle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CaBundleKind {
    /// A Secret.
    #[default]
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

/// A PEM CA bundle stored under one key of a Secret or ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaBundleReference {
    /// `Secret` or `ConfigMap`.
    pub kind: CaBundleKind,
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the object; defaults to the referring object's namespace, required for a
    /// cluster-scoped `Provider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// Key holding the PEM bundle. Defaults to `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}
