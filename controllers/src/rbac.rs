//! The Kubernetes API rights the banlieue controller needs, as data: the single source for the
//! generated RBAC manifests (`banlieue-clusterctl`) and for tests that run the controller under
//! exactly these rules.
//!
//! Every rule says why it exists. Add a verb here only together with the code that calls it.

pub use banlieue_provider_runtime::rbac::{LEADER_ELECTION_RULES, Rule, policy_rules};

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
        api_groups: &["banlieue.io"],
        resources: &["providers"],
        verbs: &["patch"],
        why: "add and remove the banlieue.io/provider-in-use finalizer of a Provider that VirtualMachines use",
    },
    Rule {
        api_groups: &["banlieue.io"],
        resources: &["providers/status"],
        verbs: &["patch"],
        why: "report the VirtualMachines placed on a Provider and a deletion that waits for them",
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
        verbs: &["create"],
        why: "Warning Events on a VirtualMachine whose Ready turns False for a cause someone must act on",
    },
];

#[cfg(test)]
mod tests {
    use banlieue_provider_runtime::rbac::lint;

    use super::*;

    /// Every rule explained and no wildcard; the controller touches all providers' kinds of the
    /// infrastructure group (no own-kind check) and never a Secret.
    #[test]
    fn every_rule_is_explained_and_never_a_wildcard_or_a_secret() {
        lint(&[CLUSTER_RULES, LEADER_ELECTION_RULES], None)
            .unwrap_or_else(|violations| panic!("{violations}"));
        for rule in CLUSTER_RULES.iter().chain(LEADER_ELECTION_RULES) {
            assert!(
                !rule.resources.contains(&"secrets"),
                "the controller never reads Secrets: {rule:?}"
            );
        }
    }
}
