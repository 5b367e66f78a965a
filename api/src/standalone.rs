//! Standalone mode: how an infrastructure machine owned by a banlieue `VirtualMachine` (not a
//! CAPI `Machine`) finds its endpoint and credentials.
//!
//! For each (Provider `P`, namespace `N`) the banlieue controller server-side applies an infra
//! cluster object of the backend's cluster kind (`ProxmoxCluster`, `LibvirtCluster`,
//! `VSphereCluster`) in `N`, named [`infra_cluster_name`]`(P)`, with `spec.providerRef: {name:
//! P}` and a controlling ownerReference to the Provider. The provider's infra cluster
//! reconciler provisions it without any CAPI Cluster; the provider's machine reconciler resolves
//! the machine's controlling owner (a CAPI `Machine` or a banlieue `VirtualMachine`) into one
//! view and then runs a single provisioning path.

use sha2::{Digest, Sha256};

/// Kind of the banlieue object that owns VirtualMachine-driven infra machines.
pub const VIRTUAL_MACHINE_KIND: &str = "VirtualMachine";
/// Kind of the cluster-scoped banlieue object that owns standalone infra clusters.
pub const PROVIDER_KIND: &str = "Provider";
/// API group of [`VIRTUAL_MACHINE_KIND`] and [`PROVIDER_KIND`] owners.
pub const OWNER_GROUP: &str = crate::BANLIEUE_GROUP;
/// Kind of the CAPI object that owns CAPI-driven infra machines.
pub const CAPI_MACHINE_KIND: &str = "Machine";
/// Kind of the CAPI object that owns CAPI-driven infra clusters.
pub const CAPI_CLUSTER_KIND: &str = "Cluster";
/// API group of [`CAPI_MACHINE_KIND`] and [`CAPI_CLUSTER_KIND`] owners.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// Finalizer the banlieue controller keeps on a VirtualMachine until its infra machine is gone.
pub const VIRTUAL_MACHINE_FINALIZER: &str = "banlieue.io/virtual-machine";
/// Label naming the Provider on objects the banlieue controller creates for it.
pub const PROVIDER_LABEL: &str = "banlieue.io/provider";
/// Field manager (and `app.kubernetes.io/managed-by` value) of the banlieue controller.
pub const CONTROLLER_MANAGER: &str = "banlieue-controller";
/// Prefix of [`infra_cluster_name`].
pub const INFRA_CLUSTER_PREFIX: &str = "banlieue-";

/// Longest infra cluster name (a DNS label, so it also fits in a label value).
const MAX_NAME: usize = 63;
/// Hex digits of sha256(provider) appended when the name has to be shortened.
const HASH_HEX: usize = 10;

/// Name of the infra cluster object the banlieue controller creates for Provider `provider`
/// in each namespace that has VirtualMachines on it: `banlieue-<provider>`, or, when that
/// would be longer than 63 characters, a prefix of it shortened to fit, then `-` and the first
/// 10 hex digits of sha256(`provider`). The result is deterministic, at most 63 characters,
/// and distinct for distinct providers (up to sha256 prefix collisions of long names).
///
/// ```
/// use banlieue_api::standalone::infra_cluster_name;
/// assert_eq!(infra_cluster_name("pve-a"), "banlieue-pve-a");
/// assert!(infra_cluster_name(&"x".repeat(253)).len() <= 63);
/// ```
pub fn infra_cluster_name(provider: &str) -> String {
    let full = format!("{INFRA_CLUSTER_PREFIX}{provider}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let digest = Sha256::digest(provider.as_bytes());
    let hash = hex::encode(digest);
    let keep = MAX_NAME - 1 - HASH_HEX;
    // Provider names are DNS subdomains (ASCII), but stay on a char boundary regardless, and
    // never leave a `-` or `.` right before the separator (`a.-b` is not a valid name).
    let mut cut = keep.min(full.len());
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = full[..cut].trim_end_matches(['-', '.']);
    format!("{prefix}-{}", &hash[..HASH_HEX])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_prefixed() {
        assert_eq!(infra_cluster_name("pve-sim"), "banlieue-pve-sim");
        assert_eq!(infra_cluster_name("a"), "banlieue-a");
    }

    #[test]
    fn the_longest_unshortened_name_is_kept() {
        let provider = "p".repeat(MAX_NAME - INFRA_CLUSTER_PREFIX.len());
        assert_eq!(infra_cluster_name(&provider), format!("banlieue-{provider}"));
        assert_eq!(infra_cluster_name(&provider).len(), MAX_NAME);
    }

    #[test]
    fn long_names_are_shortened_with_a_hash() {
        let provider = format!("{}q", "p".repeat(MAX_NAME - INFRA_CLUSTER_PREFIX.len()));
        let name = infra_cluster_name(&provider);
        assert_eq!(name.len(), MAX_NAME);
        let hash = hex::encode(Sha256::digest(provider.as_bytes()));
        // 52 characters of `banlieue-<provider>`, `-`, 10 hex digits.
        assert_eq!(name, format!("banlieue-{}-{}", &provider[..43], &hash[..10]));
    }

    #[test]
    fn long_names_differing_only_at_the_end_stay_distinct() {
        let base = "zone-a.pve.example.com.".repeat(6);
        let a = infra_cluster_name(&format!("{base}1"));
        let b = infra_cluster_name(&format!("{base}2"));
        assert_ne!(a, b);
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME);
    }

    #[test]
    fn shortened_names_are_valid_dns_subdomains() {
        // Every cut position, including right after a `-` or `.` of the provider name.
        let subdomain =
            regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
                .expect("valid regex");
        for pad in 0..12 {
            let provider = format!("{}{}e", "x".repeat(pad), "a-b.c-d.".repeat(10));
            let name = infra_cluster_name(&provider);
            assert!(name.len() <= MAX_NAME, "{name}");
            assert!(subdomain.is_match(&name), "{name} is not a DNS subdomain");
            assert_eq!(name, infra_cluster_name(&provider), "deterministic");
        }
    }
}
