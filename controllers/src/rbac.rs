//! The Kubernetes API rights the banlieue controller needs, as data: the single source for the
//! generated RBAC manifests (`banlieue-clusterctl`) and for tests that run the controller under
//! exactly these rules.
//!
//! Every rule says why it exists. Add a verb here only together with the code that calls it.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One RBAC rule and the reason the controller needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API groups (`""` is the core group).
    pub api_groups: &'static [&'static str],
    /// Resources, with `/status` for the status subresource.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What the controller does with it.
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

/// Cluster-wide rules of the controller's ClusterRole.
pub const CLUSTER_RULES: &[Rule] = &[
    Rule {
        api_groups: &["banlieue.io"],
        resources: &["virtualmachines"],
        verbs: &["get", "list", "watch", "patch"],
        why: "reconcile VirtualMachines; patch adds and removes the banlieue.io/virtual-machine finalizer",
    },
    Rule {
        api_groups: &["banlieue.io"],
        resources: &["virtualmachines/status"],
        verbs: &["patch"],
        why: "mirror the infrastructure machine's status",
    },
    Rule {
        api_groups: &["banlieue.io"],
        resources: &["providers", "virtualmachineclasses", "virtualmachineimages"],
        verbs: &["get", "list", "watch"],
        why: "choose a Provider, resolve class and image",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["proxmoxmachines", "libvirtmachines", "vspheremachines"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        why: "server-side apply the infrastructure machine of each VirtualMachine, delete it with the VirtualMachine",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["proxmoxclusters", "libvirtclusters", "vsphereclusters"],
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "server-side apply one infrastructure cluster per (Provider, namespace)",
    },
    Rule {
        api_groups: &[""],
        resources: &["namespaces"],
        verbs: &["get"],
        why: "match a Provider's spec.namespaceSelector",
    },
    Rule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
        why: "Warning Events on invalid input",
    },
];

/// Rules of the leader-election Role, in the namespace of the Lease.
pub const LEADER_ELECTION_RULES: &[Rule] = &[Rule {
    api_groups: &["coordination.k8s.io"],
    resources: &["leases"],
    verbs: &["get", "create", "update"],
    why: "--leader-elect: acquire, renew and release the Lease",
}];

/// The rules as Kubernetes `PolicyRule`s.
pub fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules.iter().map(Rule::policy_rule).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_is_explained_and_never_a_wildcard_or_a_secret() {
        for rule in CLUSTER_RULES.iter().chain(LEADER_ELECTION_RULES) {
            assert!(!rule.why.is_empty(), "{rule:?}");
            assert!(
                !rule.verbs.contains(&"*") && !rule.resources.contains(&"*"),
                "{rule:?}"
            );
            assert!(
                !rule.resources.contains(&"secrets"),
                "the controller never reads Secrets"
            );
        }
        assert_eq!(policy_rules(CLUSTER_RULES).len(), CLUSTER_RULES.len());
    }
}
