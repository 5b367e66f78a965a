//! The Kubernetes API rights `banlieue-proxmox` needs, as data: the single source for the
//! generated RBAC manifests (`banlieue-clusterctl`) and for the least-privilege test that runs
//! the binary under exactly these rules.
//!
//! Every rule says why it exists. Add a verb here only together with the code that calls it.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One RBAC rule and the reason the provider needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API groups (`""` is the core group).
    pub api_groups: &'static [&'static str],
    /// Resources, with `/status` for the status subresource.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What the provider does with it.
    pub why: &'static str,
}

impl Rule {
    /// The rule as a Kubernetes `PolicyRule`.
    pub fn policy_rule(&self) -> PolicyRule {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(self.api_groups)),
            resources: Some(strings(self.resources)),
            verbs: strings(self.verbs),
            ..Default::default()
        }
    }
}

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
        verbs: &["get"],
        why: "Proxmox credentials and bootstrap data (read only, never listed)",
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

/// Rules of the leader-election Role, in the namespace of the Lease.
pub const LEADER_ELECTION_RULES: &[Rule] = &[Rule {
    api_groups: &["coordination.k8s.io"],
    resources: &["leases"],
    verbs: &["get", "create", "update"],
    why: "--leader-elect: acquire, renew and release the Lease",
}];

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

/// The rules as Kubernetes `PolicyRule`s.
pub fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules.iter().map(Rule::policy_rule).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_is_explained_and_never_a_wildcard_or_secret_listing() {
        for rule in CLUSTER_RULES
            .iter()
            .chain(LEADER_ELECTION_RULES)
            .chain(CAPI_AGGREGATED_RULES)
        {
            assert!(!rule.why.is_empty(), "{rule:?}");
            assert!(
                !rule.verbs.contains(&"*") && !rule.resources.contains(&"*"),
                "{rule:?}"
            );
            assert!(!rule.verbs.is_empty() && !rule.resources.is_empty(), "{rule:?}");
            if rule.resources.contains(&"secrets") {
                assert_eq!(rule.verbs, ["get"], "secrets are read by name only");
            }
        }
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

    #[test]
    fn converts_to_policy_rules() {
        let rules = policy_rules(LEADER_ELECTION_RULES);
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["coordination.k8s.io".to_owned()][..])
        );
        assert_eq!(rules[0].verbs, ["get", "create", "update"]);
    }
}
