//! The Kubernetes API rights `banlieue-libvirt` needs, as data: the single source for the
//! generated RBAC manifests (`banlieue-clusterctl`) and for the least-privilege test that runs
//! the binary under exactly these rules.
//!
//! Every rule says why it exists. Add a verb here only together with the code that calls it.

use banlieue_provider_runtime::rbac::SECRET_WATCH_VERBS;
pub use banlieue_provider_runtime::rbac::{LEADER_ELECTION_RULES, Rule, policy_rules};

/// Cluster-wide rules of the provider's ClusterRole.
pub const CLUSTER_RULES: &[Rule] = &[
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["libvirtclusters", "libvirtmachines"],
        verbs: &["get", "list", "watch", "patch"],
        why: "reconcile the infrastructure objects; patch adds and removes the finalizer and sets spec.providerID",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &[
            "libvirtclusters/status",
            "libvirtmachines/status",
            "libvirtmachinetemplates/status",
        ],
        verbs: &["patch"],
        why: "write status (server-side apply / merge patch on /status)",
    },
    Rule {
        api_groups: &["infrastructure.banlieue.io"],
        resources: &["libvirtmachinetemplates"],
        verbs: &["get", "list", "watch"],
        why: "publish status.capacity of machine templates",
    },
    Rule {
        api_groups: &["cluster.x-k8s.io"],
        resources: &["clusters", "machines"],
        verbs: &["get", "list", "watch"],
        why: "owners: pause, infrastructure readiness, bootstrap data name and failure domain (watched)",
    },
    Rule {
        api_groups: &["banlieue.io"],
        resources: &["providers", "virtualmachines"],
        verbs: &["get", "list", "watch"],
        why: "standalone mode: hosts from a Provider, user data and power state from a VirtualMachine owner (watched)",
    },
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: SECRET_WATCH_VERBS,
        why: "host credentials (qemu+ssh / qemu+tls) and bootstrap / user data: contents are read only by get, in the reconcile that needs them; list and watch feed a metadata-only watch (banlieue_provider_runtime::secret_watch, decoded as PartialObjectMeta, nothing of the data kept) so that a Secret created or fixed after the fact is acted on within seconds instead of at the next requeue",
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
        "libvirtclusters",
        "libvirtclustertemplates",
        "libvirtmachines",
        "libvirtmachinetemplates",
    ],
    verbs: &["get", "list", "watch", "create", "update", "patch", "delete"],
    why: "Cluster API's core and topology controllers manage the provider's objects",
}];

#[cfg(test)]
mod tests {
    use banlieue_provider_runtime::rbac::lint;

    use super::*;

    /// Every rule explained, no wildcard, Secrets only read by name and watched, and only
    /// libvirt kinds of the infrastructure group.
    #[test]
    fn rules_are_least_privilege_and_only_name_libvirt_kinds() {
        lint(
            &[CLUSTER_RULES, LEADER_ELECTION_RULES, CAPI_AGGREGATED_RULES],
            Some("libvirt"),
        )
        .unwrap_or_else(|violations| panic!("{violations}"));
    }
}
