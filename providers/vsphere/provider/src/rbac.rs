//! The Kubernetes API rights `banlieue-vsphere` needs, as data: the single source for the
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
        resources: &["vsphereclusters", "vspheremachines"],
        verbs: &["get", "list", "watch", "patch"],
        why: "reconcile the infrastructure objects (a VSphereCluster's deletion lists its machines); patch adds and removes the finalizer and sets spec.providerID",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &[
            "vsphereclusters/status",
            "vspheremachines/status",
            "vspheremachinetemplates/status",
        ],
        verbs: &["patch"],
        why: "write status (server-side apply / merge patch on /status)",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["vspheremachinetemplates"],
        verbs: &["get", "list", "watch"],
        why: "publish status.capacity of machine templates",
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
        why: "standalone mode: vCenter endpoint and credentials from a Provider, user data from a VirtualMachine owner",
    },
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["get"],
        why: "vCenter credentials, CA bundles in Secrets and bootstrap data (read by name only, never listed)",
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
        "vsphereclusters",
        "vsphereclustertemplates",
        "vspheremachines",
        "vspheremachinetemplates",
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

    #[test]
    fn only_vsphere_kinds_of_the_infrastructure_group() {
        for rule in CLUSTER_RULES.iter().chain(CAPI_AGGREGATED_RULES) {
            if rule.api_groups == ["infrastructure.banlieue.io"] {
                assert!(
                    rule.resources.iter().all(|r| r.starts_with("vsphere")),
                    "{rule:?}"
                );
            }
        }
        let rules = policy_rules(LEADER_ELECTION_RULES);
        assert_eq!(rules[0].verbs, ["get", "create", "update"]);
    }
}
