//! The Kubernetes API rights every provider's contract needs, as data: [`contract_rbac!`]
//! declares a provider's `CLUSTER_RULES` (its ClusterRole) and `CAPI_AGGREGATED_RULES`
//! (aggregated into Cluster API's manager role) from its kind prefix, plus the rules only its
//! backend needs; `banlieue-clusterctl` generates the manifests from them, and the generated
//! unit test runs the least-privilege lint ([`banlieue_provider_runtime::rbac::lint`]).
//!
//! Every rule says why it exists. Add a verb only together with the code that calls it.

pub use banlieue_provider_runtime::rbac::{
    LEADER_ELECTION_RULES, Rule, SECRET_WATCH_VERBS, lint, policy_rules,
};

/// Declares `CLUSTER_RULES` and `CAPI_AGGREGATED_RULES` for the kinds `<prefix>clusters`,
/// `<prefix>machines` and their templates, with `extra` rules of the backend, and the lint test.
#[macro_export]
macro_rules! contract_rbac {
    ($prefix:literal, extra: [$($extra:expr),* $(,)?] $(,)?) => {
        #[allow(unused_imports)]
        pub use $crate::rbac::{LEADER_ELECTION_RULES, Rule, policy_rules};

        /// Cluster-wide rules of the provider's ClusterRole: the kit's contract, then the
        /// backend's own.
        pub const CLUSTER_RULES: &[Rule] = &[
            Rule {
                api_groups: &["infrastructure.banlieue.io"],
                resources: &[concat!($prefix, "clusters"), concat!($prefix, "machines")],
                verbs: &["get", "list", "watch", "patch"],
                why: "reconcile the infrastructure objects (a cluster's deletion lists its machines); patch adds and removes the finalizer, sets spec.providerID and mirrors the Cluster's controlPlaneEndpoint",
            },
            Rule {
                api_groups: &["infrastructure.banlieue.io"],
                resources: &[
                    concat!($prefix, "clusters/status"),
                    concat!($prefix, "machines/status"),
                    concat!($prefix, "machinetemplates/status"),
                ],
                verbs: &["patch"],
                why: "write status (server-side apply on /status)",
            },
            Rule {
                api_groups: &["infrastructure.banlieue.io"],
                resources: &[concat!($prefix, "machinetemplates")],
                verbs: &["get", "list", "watch"],
                why: "publish status.capacity of machine templates",
            },
            Rule {
                api_groups: &["cluster.x-k8s.io"],
                resources: &["clusters", "machines"],
                verbs: &["get", "list", "watch"],
                why: "owners: pause, infrastructure readiness, bootstrap data name and failure domain (watched once Cluster API is served)",
            },
            Rule {
                api_groups: &["banlieue.io"],
                resources: &["providers", "virtualmachines"],
                verbs: &["get", "list", "watch"],
                why: "standalone mode: the hypervisor's endpoint and credentials from a Provider, user data from a VirtualMachine owner (watched)",
            },
            Rule {
                api_groups: &["banlieue.io"],
                resources: &["providers"],
                verbs: &["patch"],
                why: "a Provider of the provider's backend records the objects it owns for clusterctl move (annotation banlieue.io/owned-references) and holds the finalizer banlieue.io/owns-references that takes its owner references off them before it is deleted",
            },
            Rule {
                api_groups: &[""],
                resources: &["secrets"],
                verbs: $crate::rbac::SECRET_WATCH_VERBS,
                why: "hypervisor credentials, CA bundles and bootstrap / user data: contents are read only by get, in the reconcile that needs them; list and watch feed a metadata-only watch (banlieue_provider_runtime::secret_watch, decoded as PartialObjectMeta, nothing of the data kept) so that a Secret created or fixed after the fact is acted on within seconds instead of at the next requeue",
            },
            Rule {
                api_groups: &[""],
                resources: &["secrets"],
                verbs: &["patch"],
                why: "the label clusterctl.cluster.x-k8s.io/move on the credentials and CA bundle an infra cluster reads from its own namespace, and a Provider's owner reference on those it names (its CRD is labelled clusterctl.cluster.x-k8s.io/move-hierarchy), so that clusterctl move takes them along (metadata only)",
            },
            Rule {
                api_groups: &["events.k8s.io"],
                resources: &["events"],
                verbs: &["create"],
                why: "Kubernetes Events on each condition and provisioning transition",
            },
            Rule {
                api_groups: &[""],
                resources: &["namespaces"],
                verbs: &["get"],
                why: "tenancy: a Provider's spec.namespaceSelector is matched against the labels of the namespace of the infra cluster that names it (read by name)",
            },
            Rule {
                api_groups: &["infrastructure.banlieue.io"],
                resources: &[concat!($prefix, "machines/finalizers")],
                verbs: &["update"],
                why: "IPAddressClaims are owned by their machine with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission plugin allows only to who may update the owner's finalizers",
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
            $($extra),*
        ];

        /// Rules aggregated into Cluster API's manager ClusterRole (label
        /// `cluster.x-k8s.io/aggregate-to-manager: "true"`): CAPI's controllers read and patch
        /// infrastructure objects (owner references, labels, paused annotation) and create
        /// them from templates (MachineSets, ClusterClass topologies).
        pub const CAPI_AGGREGATED_RULES: &[Rule] = &[Rule {
            api_groups: &["infrastructure.banlieue.io"],
            resources: &[
                concat!($prefix, "clusters"),
                concat!($prefix, "clustertemplates"),
                concat!($prefix, "machines"),
                concat!($prefix, "machinetemplates"),
            ],
            verbs: &["get", "list", "watch", "create", "update", "patch", "delete"],
            why: "Cluster API's core and topology controllers manage the provider's objects",
        }];

        #[cfg(test)]
        mod contract_rbac_lint {
            /// Every rule explained, no wildcard, Secrets only read by name and watched, and
            /// only this provider's kinds of the infrastructure group.
            #[test]
            fn rules_are_least_privilege_and_only_name_the_providers_kinds() {
                $crate::rbac::lint(
                    &[super::CLUSTER_RULES, super::LEADER_ELECTION_RULES, super::CAPI_AGGREGATED_RULES],
                    Some($prefix),
                )
                .unwrap_or_else(|violations| panic!("{violations}"));
            }
        }
    };
}

/// `configmaps` `get` and `patch`: CA bundles referenced by `spec.tls.caBundleRef` (for
/// backends whose connection takes a CA bundle from a ConfigMap), labelled for
/// `clusterctl move` when in the infra cluster's own namespace.
pub const CA_BUNDLE_CONFIGMAPS: Rule = Rule {
    api_groups: &[""],
    resources: &["configmaps"],
    verbs: &["get", "patch"],
    why: "CA bundles referenced by spec.tls.caBundleRef; the label clusterctl.cluster.x-k8s.io/move on those in the infra cluster's own namespace, and a Provider's owner reference on the one it names (metadata only)",
};

#[cfg(test)]
mod tests {
    mod example {
        crate::contract_rbac!("example", extra: [super::super::CA_BUNDLE_CONFIGMAPS]);
    }

    #[test]
    fn the_contract_rules_name_the_providers_kinds() {
        let resources: Vec<&str> = example::CLUSTER_RULES
            .iter()
            .flat_map(|r| r.resources.iter().copied())
            .collect();
        for kind in [
            "exampleclusters",
            "examplemachines/status",
            "examplemachinetemplates",
            "configmaps",
        ] {
            assert!(resources.contains(&kind), "{kind} missing from {resources:?}");
        }
        assert_eq!(example::CAPI_AGGREGATED_RULES[0].resources.len(), 4);
    }
}
