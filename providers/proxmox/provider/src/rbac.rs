//! The Kubernetes API rights `banlieue-proxmox` needs, as data: the single source for the
//! generated RBAC manifests (`banlieue-clusterctl`) and for the least-privilege test that runs
//! the binary under exactly these rules.
//!
//! Every rule says why it exists. Add a verb here only together with the code that calls it.

pub use banlieue_provider_runtime::rbac::{LEADER_ELECTION_RULES, Rule, policy_rules};

/// Cluster-wide rules of the provider's ClusterRole.
pub const CLUSTER_RULES: &[Rule] = &[
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["proxmoxclusters", "proxmoxmachines"],
        verbs: &["get", "list", "watch", "patch"],
        why: "reconcile the infrastructure objects; patch adds and removes the finalizer and sets spec.providerID",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &[
            "proxmoxclusters/status",
            "proxmoxmachines/status",
            "proxmoxmachinetemplates/status",
        ],
        verbs: &["patch"],
        why: "write status (server-side apply / merge patch on /status)",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["proxmoxmachinetemplates"],
        verbs: &["get", "list", "watch"],
        why: "publish status.capacity of machine templates",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["proxmoxmachines/finalizers"],
        verbs: &["update"],
        why: "IPAddressClaims are owned by their ProxmoxMachine with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission plugin allows only to who may update the owner's finalizers",
    },
    Rule {
        api_groups: &["ipam.cluster.x-k8s.io"],
        resources: &["ipaddressclaims"],
        verbs: &["get", "create"],
        why: "CAPI IPAM: claim an address per `mode: Pool` interface and family, read the claim's addressRef (by name; the owner reference lets the garbage collector delete them)",
    },
    Rule {
        api_groups: &["ipam.cluster.x-k8s.io"],
        resources: &["ipaddresses"],
        verbs: &["get"],
        why: "CAPI IPAM: read the IPAddress a claim points at (by name, polled while waiting)",
    },
    Rule {
        api_groups: &["cluster.x-k8s.io"],
        resources: &["clusters", "machines"],
        verbs: &["get", "list", "watch"],
        why: "owners: pause, infrastructure readiness, bootstrap data name and failure domain",
    },
    Rule {
        api_groups: &["banlieue.io"],
        resources: &["providers", "virtualmachines"],
        verbs: &["get", "list", "watch"],
        why: "standalone mode: endpoint and credentials from a Provider, user data from a VirtualMachine owner",
    },
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["get", "list", "watch"],
        why: "Proxmox credentials, CA bundles and bootstrap / user data: contents are read only by get, in the reconcile that needs them; list and watch feed a metadata-only watch (decoded as PartialObjectMeta, nothing of the data kept) so that a Secret created or fixed after the fact is acted on within seconds instead of at the next resync",
    },
    Rule {
        api_groups: &[""],
        resources: &["configmaps"],
        verbs: &["get"],
        why: "CA bundles referenced by spec.tls.caBundleRef",
    },
    Rule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
        why: "Kubernetes Events on each provisioning transition",
    },
];

/// Rules aggregated into Cluster API's manager ClusterRole (label
/// `cluster.x-k8s.io/aggregate-to-manager: "true"`): CAPI's controllers read and patch
/// infrastructure objects (owner references, labels, paused annotation) and create them from
/// templates (MachineSets, ClusterClass topologies).
pub const CAPI_AGGREGATED_RULES: &[Rule] = &[Rule {
    api_groups: &["infrastructure.banlieue.io"],
    resources: &[
        "proxmoxclusters",
        "proxmoxclustertemplates",
        "proxmoxmachines",
        "proxmoxmachinetemplates",
    ],
    verbs: &["get", "list", "watch", "create", "update", "patch", "delete"],
    why: "Cluster API's core and topology controllers manage the provider's objects",
}];

#[cfg(test)]
mod tests {
    use banlieue_provider_runtime::rbac::lint;

    use super::*;

    /// Every rule explained, no wildcard, Secrets only read by name and watched, and only proxmox kinds of
    /// the infrastructure group.
    #[test]
    fn rules_are_least_privilege_and_only_name_proxmox_kinds() {
        lint(
            &[CLUSTER_RULES, LEADER_ELECTION_RULES, CAPI_AGGREGATED_RULES],
            Some("proxmox"),
        )
        .unwrap_or_else(|violations| panic!("{violations}"));
    }

    /// The verbs `crate::ipam` uses (get and create claims, get addresses) are granted.
    #[test]
    fn ipam_claims_and_addresses_are_granted() {
        let granted = |resource: &str, verb: &str| {
            CLUSTER_RULES.iter().any(|r| {
                r.api_groups == ["ipam.cluster.x-k8s.io"]
                    && r.resources.contains(&resource)
                    && r.verbs.contains(&verb)
            })
        };
        for verb in ["get", "create"] {
            assert!(granted("ipaddressclaims", verb), "{verb} ipaddressclaims");
        }
        assert!(granted("ipaddresses", "get"));
    }
}
