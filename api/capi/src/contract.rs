//! Hand-written helpers for the CAPI v1beta2 provider contract (see `shared/CAPI-CONTRACT.md`):
//! well-known label/annotation keys, pause detection, owner lookup, contract-label parsing and
//! `{apiGroup, kind, name}` references.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference};
use kube::core::{GroupVersionKind, Version};

use crate::error::{Error, Result};
use crate::generated::cluster::Cluster;
use crate::generated::machine::Machine;

/// API group of CAPI's core kinds (Cluster, Machine, MachineSet, …).
pub const CLUSTER_API_GROUP: &str = "cluster.x-k8s.io";
/// API version of CAPI's core kinds that this crate's types represent.
pub const CLUSTER_API_VERSION: &str = "cluster.x-k8s.io/v1beta2";
/// The contract this crate implements.
pub const CONTRACT: &str = "v1beta2";
/// The API group CAPI grants itself access to by default; other groups need
/// [`AGGREGATE_TO_MANAGER_LABEL`] on a ClusterRole.
pub const INFRASTRUCTURE_API_GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// CRD label naming the provider's API versions that implement contract v1beta2; the value is
/// `_`-separated (e.g. `v1alpha1_v1alpha2`), CAPI uses the highest ([`highest_contract_version`]).
pub const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";
/// Label CAPI sets on every object belonging to a Cluster; the value is the Cluster's name.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Label present (any value, usually `""`) on control-plane Machines and their infra objects.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// Label CAPI sets on Machines (and their infra objects) created for a MachineDeployment.
pub const MACHINE_DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Label CAPI sets on Machines (and their infra objects) created by a MachineSet.
pub const MACHINE_SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";
/// Label on control-plane Machines naming their control plane object (e.g. the KubeadmControlPlane).
pub const MACHINE_CONTROL_PLANE_NAME_LABEL: &str = "cluster.x-k8s.io/control-plane-name";
/// Annotation that pauses reconciliation of one object (any value counts).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Annotation CAPI sets on an object cloned from a template: the template's name.
pub const CLONED_FROM_NAME_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-name";
/// Annotation CAPI sets on an object cloned from a template: the template's `Kind.group`.
pub const CLONED_FROM_GROUP_KIND_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-groupkind";
/// Annotation marking an InfraCluster as managed by something else: providers skip it entirely.
pub const MANAGED_BY_ANNOTATION: &str = "cluster.x-k8s.io/managed-by";
/// Node label CAPI sets when the InfraMachine reports `status.interruptible: true`.
pub const INTERRUPTIBLE_LABEL: &str = "cluster.x-k8s.io/interruptible";
/// Label selecting which objects a controller started with `--watch-filter` reconciles.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
/// ClusterRole label that aggregates the role into CAPI's manager role.
pub const AGGREGATE_TO_MANAGER_LABEL: &str = "cluster.x-k8s.io/aggregate-to-manager";
/// Label clusterctl stamps on every installed object: `infrastructure-<name>`.
pub const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
/// Label (value `""`) clusterctl stamps on everything it installs; `clusterctl move` follows
/// CRDs carrying it.
pub const CLUSTERCTL_LABEL: &str = "clusterctl.cluster.x-k8s.io";
/// Label making `clusterctl move` move an object (or every object of a labelled CRD).
pub const CLUSTERCTL_MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";
/// Like [`CLUSTERCTL_MOVE_LABEL`], and also moves the object's owned hierarchy.
pub const CLUSTERCTL_MOVE_HIERARCHY_LABEL: &str = "clusterctl.cluster.x-k8s.io/move-hierarchy";
/// Annotation that makes `clusterctl move` wait while it is present on any object.
pub const BLOCK_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// Annotation `clusterctl move` sets on source objects right before deleting them.
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// Annotation on server-side-apply dry-run requests the topology controller sends.
pub const TOPOLOGY_DRY_RUN_ANNOTATION: &str = "topology.cluster.x-k8s.io/dry-run";

/// Condition type every contract object reports; mirrored by CAPI (e.g. as the Machine's
/// `InfrastructureReady`).
pub const READY_CONDITION: &str = "Ready";
/// Condition type reporting whether the object is paused.
pub const PAUSED_CONDITION: &str = "Paused";
/// Reason of a `Paused=True` condition.
pub const PAUSED_REASON: &str = "Paused";
/// Reason of a `Paused=False` condition.
pub const NOT_PAUSED_REASON: &str = "NotPaused";
/// Cluster condition type that turns True once the control plane is initialized.
pub const CONTROL_PLANE_INITIALIZED_CONDITION: &str = "ControlPlaneInitialized";
/// Machine condition type mirroring the InfraMachine's `Ready`.
pub const INFRASTRUCTURE_READY_CONDITION: &str = "InfrastructureReady";

/// The API group part of an `apiVersion` (`"cluster.x-k8s.io/v1beta2"` → `"cluster.x-k8s.io"`,
/// the core group `"v1"` → `""`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

fn has_annotation(meta: &ObjectMeta, key: &str) -> bool {
    meta.annotations.as_ref().is_some_and(|a| a.contains_key(key))
}

fn has_label(meta: &ObjectMeta, key: &str) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(key))
}

/// True if the object carries the [`PAUSED_ANNOTATION`] (any value, even `""`).
pub fn has_paused_annotation(meta: &ObjectMeta) -> bool {
    has_annotation(meta, PAUSED_ANNOTATION)
}

/// Why an object is paused; both may hold at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseCause {
    /// The owning Cluster has `spec.paused: true`.
    pub cluster_paused: bool,
    /// The object itself carries the [`PAUSED_ANNOTATION`].
    pub annotation: bool,
}

impl PauseCause {
    /// A message for the `Paused` condition naming every cause, e.g.
    /// `"Cluster spec.paused is set to true, ProxmoxMachine has the cluster.x-k8s.io/paused annotation"`.
    pub fn message(&self, kind: &str) -> String {
        let mut parts = Vec::with_capacity(2);
        if self.cluster_paused {
            parts.push("Cluster spec.paused is set to true".to_owned());
        }
        if self.annotation {
            parts.push(format!("{kind} has the {PAUSED_ANNOTATION} annotation"));
        }
        parts.join(", ")
    }
}

/// Why the object is paused, or `None` if it is not. `cluster` is the object's Cluster when known;
/// before it is known only the annotation counts.
pub fn pause_cause(cluster: Option<&Cluster>, meta: &ObjectMeta) -> Option<PauseCause> {
    let cause = PauseCause {
        cluster_paused: cluster.and_then(|c| c.spec.paused).unwrap_or(false),
        annotation: has_paused_annotation(meta),
    };
    (cause.cluster_paused || cause.annotation).then_some(cause)
}

/// The contract's pause rule: paused if the Cluster's `spec.paused` is true or the object has the
/// [`PAUSED_ANNOTATION`]. A paused provider must not reconcile, and must not delete real
/// infrastructure either (clusterctl move deletes paused source objects).
pub fn is_paused(cluster: Option<&Cluster>, meta: &ObjectMeta) -> bool {
    pause_cause(cluster, meta).is_some()
}

/// The `status`, `reason` and `message` of the `Paused` condition for an object of `kind`.
/// The caller fills `observedGeneration` and keeps `lastTransitionTime` unless `status` flips.
pub fn paused_condition_fields(
    cluster: Option<&Cluster>,
    meta: &ObjectMeta,
    kind: &str,
) -> (&'static str, &'static str, String) {
    match pause_cause(cluster, meta) {
        Some(cause) => ("True", PAUSED_REASON, cause.message(kind)),
        None => ("False", NOT_PAUSED_REASON, String::new()),
    }
}

/// The value of the [`CLUSTER_NAME_LABEL`], if present and not empty.
pub fn cluster_name(meta: &ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(CLUSTER_NAME_LABEL))
        .map(String::as_str)
        .filter(|name| !name.is_empty())
}

/// True if the object carries the [`CONTROL_PLANE_LABEL`] (any value).
pub fn is_control_plane(meta: &ObjectMeta) -> bool {
    has_label(meta, CONTROL_PLANE_LABEL)
}

/// True if the object carries the [`MANAGED_BY_ANNOTATION`]: the provider must leave it alone.
pub fn is_externally_managed(meta: &ObjectMeta) -> bool {
    has_annotation(meta, MANAGED_BY_ANNOTATION)
}

/// True if the object carries the [`BLOCK_MOVE_ANNOTATION`].
pub fn blocks_move(meta: &ObjectMeta) -> bool {
    has_annotation(meta, BLOCK_MOVE_ANNOTATION)
}

/// True if `clusterctl move` is deleting this (source) object: keep the real infrastructure.
pub fn is_deleted_for_move(meta: &ObjectMeta) -> bool {
    has_annotation(meta, DELETE_FOR_MOVE_ANNOTATION)
}

/// The first owner reference of the given `kind` in API `group` (any version), as CAPI's
/// `util.GetOwnerMachine`/`GetOwnerCluster` look it up.
pub fn find_owner<'a>(meta: &'a ObjectMeta, group: &str, kind: &str) -> Option<&'a OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|o| o.kind == kind && group_of(&o.api_version) == group)
}

/// The owning Machine's reference (the InfraMachine's way to its Machine). `None` means CAPI has
/// not linked the object yet: wait, it is not an error.
pub fn owner_machine(meta: &ObjectMeta) -> Option<&OwnerReference> {
    find_owner(meta, CLUSTER_API_GROUP, "Machine")
}

/// The owning Cluster's reference (the InfraCluster's way to its Cluster).
pub fn owner_cluster(meta: &ObjectMeta) -> Option<&OwnerReference> {
    find_owner(meta, CLUSTER_API_GROUP, "Cluster")
}

/// The condition of `type_` in a condition list.
pub fn find_condition<'a>(conditions: Option<&'a [Condition]>, type_: &str) -> Option<&'a Condition> {
    conditions?.iter().find(|c| c.type_ == type_)
}

/// True if the condition of `type_` exists and has status `True`.
pub fn is_condition_true(conditions: Option<&[Condition]>, type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// True once the Cluster's infrastructure is provisioned
/// (`status.initialization.infrastructureProvisioned`).
pub fn is_infrastructure_provisioned(cluster: &Cluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.infrastructure_provisioned)
        .unwrap_or(false)
}

/// True once the Cluster's control plane is initialized: `status.initialization.controlPlaneInitialized`
/// or the `ControlPlaneInitialized` condition.
pub fn is_control_plane_initialized(cluster: &Cluster) -> bool {
    let Some(status) = cluster.status.as_ref() else {
        return false;
    };
    status
        .initialization
        .as_ref()
        .and_then(|i| i.control_plane_initialized)
        .unwrap_or(false)
        || is_condition_true(status.conditions.as_deref(), CONTROL_PLANE_INITIALIZED_CONDITION)
}

/// The name of the Machine's bootstrap data Secret, once the bootstrap provider has set it.
pub fn bootstrap_data_secret_name(machine: &Machine) -> Option<&str> {
    machine
        .spec
        .bootstrap
        .data_secret_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

/// True for a control-plane Machine (it carries the [`CONTROL_PLANE_LABEL`]).
pub fn is_control_plane_machine(machine: &Machine) -> bool {
    is_control_plane(&machine.metadata)
}

/// The version CAPI uses from a [`CONTRACT_LABEL`] value: the highest by Kubernetes version
/// priority (GA > beta > alpha, then by number), e.g. `"v1alpha1_v1beta1_v1alpha2"` → `"v1beta1"`.
pub fn highest_contract_version(label_value: &str) -> Result<&str> {
    label_value
        .split('_')
        .filter(|v| !v.is_empty())
        .max_by_key(|v| Version::parse(v).priority())
        .ok_or_else(|| Error::EmptyContractLabel {
            value: label_value.to_owned(),
        })
}

/// The API version CAPI will use for a CRD with these labels, or `None` if the CRD does not carry
/// the [`CONTRACT_LABEL`] (CAPI then refuses to use it).
pub fn contract_version_from_crd_labels(labels: &BTreeMap<String, String>) -> Result<Option<&str>> {
    labels
        .get(CONTRACT_LABEL)
        .map(|v| highest_contract_version(v))
        .transpose()
}

/// A CAPI v1beta2 reference: `{apiGroup, kind, name}`, namespace = the referrer's, version from the
/// referenced CRD's [`CONTRACT_LABEL`]. Every generated `…Ref` struct of that shape converts to
/// and from it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContractRef {
    /// API group of the referenced object, e.g. `infrastructure.banlieue.io`.
    pub api_group: String,
    /// Kind of the referenced object, e.g. `ProxmoxMachine`.
    pub kind: String,
    /// Name of the referenced object, in the referrer's namespace.
    pub name: String,
}

impl ContractRef {
    /// A reference to `name` of `kind` in `api_group`.
    pub fn new(api_group: impl Into<String>, kind: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            api_group: api_group.into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    /// Errors if any of the three fields is empty (CAPI's CRDs require all three).
    pub fn validate(&self) -> Result<()> {
        let field = if self.api_group.is_empty() {
            "apiGroup"
        } else if self.kind.is_empty() {
            "kind"
        } else if self.name.is_empty() {
            "name"
        } else {
            return Ok(());
        };
        Err(Error::IncompleteReference {
            kind: self.kind.clone(),
            name: self.name.clone(),
            field,
        })
    }

    /// `apiVersion` of the referenced object at `version` (`"<apiGroup>/<version>"`).
    pub fn api_version(&self, version: &str) -> String {
        format!("{}/{}", self.api_group, version)
    }

    /// Group, version and kind of the referenced object at `version`.
    pub fn gvk(&self, version: &str) -> GroupVersionKind {
        GroupVersionKind::gvk(&self.api_group, version, &self.kind)
    }

    /// True if this reference names an object with this `apiVersion` (any version of the group),
    /// `kind` and `name`.
    pub fn refers_to(&self, api_version: &str, kind: &str, name: &str) -> bool {
        group_of(api_version) == self.api_group && self.kind == kind && self.name == name
    }

    /// `Kind.group`, the format of the [`CLONED_FROM_GROUP_KIND_ANNOTATION`].
    pub fn group_kind(&self) -> String {
        format!("{}.{}", self.kind, self.api_group)
    }
}

impl std::fmt::Display for ContractRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}/{}", self.kind, self.api_group, self.name)
    }
}

macro_rules! contract_ref_conversions {
    ($($ty:path),+ $(,)?) => {$(
        impl From<&$ty> for ContractRef {
            fn from(r: &$ty) -> Self {
                ContractRef::new(r.api_group.clone(), r.kind.clone(), r.name.clone())
            }
        }
        impl From<ContractRef> for $ty {
            fn from(r: ContractRef) -> Self {
                Self { api_group: r.api_group, kind: r.kind, name: r.name }
            }
        }
    )+};
}

contract_ref_conversions!(
    crate::generated::cluster::ClusterControlPlaneRef,
    crate::generated::cluster::ClusterInfrastructureRef,
    crate::generated::machine::MachineBootstrapConfigRef,
    crate::generated::machine::MachineInfrastructureRef,
    crate::generated::machine_set::MachineSetTemplateSpecBootstrapConfigRef,
    crate::generated::machine_set::MachineSetTemplateSpecInfrastructureRef,
    crate::generated::machine_deployment::MachineDeploymentTemplateSpecBootstrapConfigRef,
    crate::generated::machine_deployment::MachineDeploymentTemplateSpecInfrastructureRef,
    crate::generated::machine_pool::MachinePoolTemplateSpecBootstrapConfigRef,
    crate::generated::machine_pool::MachinePoolTemplateSpecInfrastructureRef,
    crate::generated::kubeadm_control_plane::KubeadmControlPlaneMachineTemplateSpecInfrastructureRef,
    crate::generated::ip_address_claim::IpAddressClaimPoolRef,
    crate::generated::ip_address::IpAddressPoolRef,
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::cluster::{ClusterSpec, ClusterStatus, ClusterStatusInitialization};
    use crate::generated::machine::{MachineInfrastructureRef, MachineSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        ObjectMeta {
            labels: map(labels),
            annotations: map(annotations),
            ..ObjectMeta::default()
        }
    }

    fn cluster(paused: Option<bool>) -> Cluster {
        Cluster::new(
            "c1",
            ClusterSpec {
                paused,
                ..ClusterSpec::default()
            },
        )
    }

    fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ..OwnerReference::default()
        }
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time("2026-08-21T10:00:00Z".parse().unwrap()),
        }
    }

    #[test]
    fn group_of_splits_api_versions() {
        assert_eq!(group_of("cluster.x-k8s.io/v1beta2"), "cluster.x-k8s.io");
        assert_eq!(group_of("v1"), "");
        assert_eq!(
            group_of("infrastructure.banlieue.io/v1alpha1"),
            "infrastructure.banlieue.io"
        );
    }

    #[test]
    fn contract_label_keys_match_the_contract() {
        // The contract label key is the CAPI group plus the contract version.
        assert_eq!(CONTRACT_LABEL, format!("{CLUSTER_API_GROUP}/{CONTRACT}"));
        assert_eq!(CLUSTER_API_VERSION, format!("{CLUSTER_API_GROUP}/{CONTRACT}"));
        for key in [
            CLUSTER_NAME_LABEL,
            CONTROL_PLANE_LABEL,
            MACHINE_DEPLOYMENT_NAME_LABEL,
            MACHINE_SET_NAME_LABEL,
            MACHINE_CONTROL_PLANE_NAME_LABEL,
            PAUSED_ANNOTATION,
            CLONED_FROM_NAME_ANNOTATION,
            CLONED_FROM_GROUP_KIND_ANNOTATION,
            MANAGED_BY_ANNOTATION,
        ] {
            assert_eq!(
                key.split_once('/').map(|(g, _)| g),
                Some(CLUSTER_API_GROUP),
                "{key}"
            );
        }
        for key in [
            BLOCK_MOVE_ANNOTATION,
            DELETE_FOR_MOVE_ANNOTATION,
            CLUSTERCTL_MOVE_LABEL,
        ] {
            assert!(key.starts_with(&format!("{CLUSTERCTL_LABEL}/")), "{key}");
        }
    }

    #[test]
    fn paused_by_cluster_annotation_both_or_neither() {
        let plain = meta(&[], &[]);
        let annotated = meta(&[], &[(PAUSED_ANNOTATION, "")]);
        assert!(!is_paused(None, &plain));
        assert!(!is_paused(Some(&cluster(None)), &plain));
        assert!(!is_paused(Some(&cluster(Some(false))), &plain));
        assert!(is_paused(Some(&cluster(Some(true))), &plain));
        assert!(is_paused(None, &annotated), "annotation with empty value counts");
        assert!(is_paused(Some(&cluster(Some(false))), &annotated));
        assert_eq!(
            pause_cause(Some(&cluster(Some(true))), &annotated),
            Some(PauseCause {
                cluster_paused: true,
                annotation: true
            })
        );
        // Other annotations don't pause.
        assert!(!is_paused(
            None,
            &meta(&[], &[("cluster.x-k8s.io/pausedx", "true")])
        ));
    }

    #[test]
    fn paused_condition_fields_name_each_cause() {
        let annotated = meta(&[], &[(PAUSED_ANNOTATION, "true")]);
        let (status, reason, message) =
            paused_condition_fields(Some(&cluster(Some(true))), &annotated, "ProxmoxMachine");
        assert_eq!((status, reason), ("True", PAUSED_REASON));
        assert_eq!(
            message,
            "Cluster spec.paused is set to true, ProxmoxMachine has the cluster.x-k8s.io/paused annotation"
        );
        let (_, _, message) = paused_condition_fields(Some(&cluster(Some(true))), &meta(&[], &[]), "X");
        assert_eq!(message, "Cluster spec.paused is set to true");
        let (status, reason, message) = paused_condition_fields(None, &meta(&[], &[]), "X");
        assert_eq!(
            (status, reason, message.as_str()),
            ("False", NOT_PAUSED_REASON, "")
        );
    }

    #[test]
    fn labels_and_annotations_are_detected_by_key() {
        let m = meta(
            &[(CLUSTER_NAME_LABEL, "prod"), (CONTROL_PLANE_LABEL, "")],
            &[
                (MANAGED_BY_ANNOTATION, "someone"),
                (BLOCK_MOVE_ANNOTATION, ""),
                (DELETE_FOR_MOVE_ANNOTATION, ""),
            ],
        );
        assert_eq!(cluster_name(&m), Some("prod"));
        assert!(is_control_plane(&m));
        assert!(is_externally_managed(&m));
        assert!(blocks_move(&m));
        assert!(is_deleted_for_move(&m));

        let empty = meta(&[(CLUSTER_NAME_LABEL, "")], &[]);
        assert_eq!(
            cluster_name(&empty),
            None,
            "an empty cluster-name label names no cluster"
        );
        assert!(!is_control_plane(&empty));
        assert!(!is_externally_managed(&empty));
        assert!(!blocks_move(&empty));
        assert!(!is_deleted_for_move(&empty));
    }

    #[test]
    fn owners_are_found_by_group_and_kind_in_any_version() {
        let mut m = meta(&[], &[]);
        assert!(owner_machine(&m).is_none());
        m.owner_references = Some(vec![
            owner("apps/v1", "Machine", "not-capi"),
            owner("cluster.x-k8s.io/v1beta2", "MachineSet", "ms"),
            owner("cluster.x-k8s.io/v1beta1", "Machine", "m1"),
            owner("cluster.x-k8s.io/v1beta2", "Cluster", "c1"),
        ]);
        assert_eq!(owner_machine(&m).map(|o| o.name.as_str()), Some("m1"));
        assert_eq!(owner_cluster(&m).map(|o| o.name.as_str()), Some("c1"));
        assert_eq!(
            find_owner(&m, "apps", "Machine").map(|o| o.name.as_str()),
            Some("not-capi")
        );
        assert!(find_owner(&m, CLUSTER_API_GROUP, "KubeadmControlPlane").is_none());
    }

    #[test]
    fn cluster_initialization_is_read_from_status() {
        let mut c = cluster(None);
        assert!(!is_infrastructure_provisioned(&c));
        assert!(!is_control_plane_initialized(&c));
        c.status = Some(ClusterStatus {
            initialization: Some(ClusterStatusInitialization {
                infrastructure_provisioned: Some(true),
                control_plane_initialized: None,
            }),
            conditions: Some(vec![condition(CONTROL_PLANE_INITIALIZED_CONDITION, "False")]),
            ..ClusterStatus::default()
        });
        assert!(is_infrastructure_provisioned(&c));
        assert!(!is_control_plane_initialized(&c));
        c.status.as_mut().unwrap().conditions =
            Some(vec![condition(CONTROL_PLANE_INITIALIZED_CONDITION, "True")]);
        assert!(is_control_plane_initialized(&c), "the condition alone suffices");
        c.status.as_mut().unwrap().conditions = None;
        c.status
            .as_mut()
            .unwrap()
            .initialization
            .as_mut()
            .unwrap()
            .control_plane_initialized = Some(true);
        assert!(
            is_control_plane_initialized(&c),
            "the initialization field alone suffices"
        );
    }

    #[test]
    fn conditions_are_found_by_type() {
        let list = vec![
            condition(READY_CONDITION, "True"),
            condition(PAUSED_CONDITION, "False"),
        ];
        assert_eq!(
            find_condition(Some(&list), PAUSED_CONDITION).map(|c| c.status.as_str()),
            Some("False")
        );
        assert!(is_condition_true(Some(&list), READY_CONDITION));
        assert!(!is_condition_true(Some(&list), PAUSED_CONDITION));
        assert!(!is_condition_true(Some(&list), INFRASTRUCTURE_READY_CONDITION));
        assert!(!is_condition_true(None, READY_CONDITION));
    }

    #[test]
    fn machine_helpers_read_bootstrap_secret_and_control_plane_label() {
        let mut m = Machine::new(
            "m1",
            MachineSpec {
                cluster_name: "c1".into(),
                infrastructure_ref: ContractRef::new("infrastructure.banlieue.io", "ProxmoxMachine", "m1")
                    .into(),
                ..MachineSpec::default()
            },
        );
        assert_eq!(bootstrap_data_secret_name(&m), None);
        m.spec.bootstrap.data_secret_name = Some(String::new());
        assert_eq!(bootstrap_data_secret_name(&m), None, "empty name is not set");
        m.spec.bootstrap.data_secret_name = Some("m1-bootstrap".into());
        assert_eq!(bootstrap_data_secret_name(&m), Some("m1-bootstrap"));
        assert!(!is_control_plane_machine(&m));
        m.metadata.labels = Some([(CONTROL_PLANE_LABEL.to_owned(), String::new())].into());
        assert!(is_control_plane_machine(&m));
    }

    #[test]
    fn highest_contract_version_uses_kubernetes_priority() {
        let cases = [
            ("v1alpha1", "v1alpha1"),
            ("v1alpha1_v1alpha2", "v1alpha2"),
            ("v1alpha2_v1alpha1", "v1alpha2"),
            ("v1alpha3_v1beta1", "v1beta1"),
            ("v1beta1_v1_v2alpha1", "v1"),
            ("v1alpha10_v1alpha9", "v1alpha10"),
            ("_v1alpha1_", "v1alpha1"),
        ];
        for (value, want) in cases {
            assert_eq!(highest_contract_version(value).unwrap(), want, "{value}");
        }
        for bad in ["", "_", "__"] {
            let err = highest_contract_version(bad).unwrap_err();
            assert!(matches!(err, Error::EmptyContractLabel { .. }), "{bad:?}: {err}");
            assert_eq!(err.metric_label(), "empty_contract_label");
        }
    }

    #[test]
    fn contract_version_is_read_from_crd_labels() {
        let mut labels = BTreeMap::new();
        assert_eq!(contract_version_from_crd_labels(&labels).unwrap(), None);
        labels.insert("cluster.x-k8s.io/v1beta1".to_owned(), "v1alpha9".to_owned());
        assert_eq!(
            contract_version_from_crd_labels(&labels).unwrap(),
            None,
            "other contracts don't count"
        );
        labels.insert(CONTRACT_LABEL.to_owned(), "v1alpha1_v1alpha2".to_owned());
        assert_eq!(
            contract_version_from_crd_labels(&labels).unwrap(),
            Some("v1alpha2")
        );
        labels.insert(CONTRACT_LABEL.to_owned(), String::new());
        assert!(contract_version_from_crd_labels(&labels).is_err());
    }

    #[test]
    fn contract_ref_builds_versions_and_matches_objects() {
        let r = ContractRef::new("infrastructure.banlieue.io", "ProxmoxMachine", "m1");
        r.validate().unwrap();
        assert_eq!(r.api_version("v1alpha1"), "infrastructure.banlieue.io/v1alpha1");
        let gvk = r.gvk("v1alpha1");
        assert_eq!(
            (gvk.group.as_str(), gvk.version.as_str(), gvk.kind.as_str()),
            ("infrastructure.banlieue.io", "v1alpha1", "ProxmoxMachine")
        );
        assert!(r.refers_to("infrastructure.banlieue.io/v1alpha2", "ProxmoxMachine", "m1"));
        assert!(!r.refers_to("infrastructure.cluster.x-k8s.io/v1alpha1", "ProxmoxMachine", "m1"));
        assert!(!r.refers_to("infrastructure.banlieue.io/v1alpha1", "ProxmoxCluster", "m1"));
        assert!(!r.refers_to("infrastructure.banlieue.io/v1alpha1", "ProxmoxMachine", "m2"));
        assert_eq!(r.group_kind(), "ProxmoxMachine.infrastructure.banlieue.io");
        assert_eq!(r.to_string(), "ProxmoxMachine.infrastructure.banlieue.io/m1");
    }

    #[test]
    fn contract_ref_validation_names_the_empty_field() {
        for (r, field) in [
            (ContractRef::new("", "K", "n"), "apiGroup"),
            (ContractRef::new("g", "", "n"), "kind"),
            (ContractRef::new("g", "K", ""), "name"),
        ] {
            match r.validate() {
                Err(Error::IncompleteReference { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{r:?}: expected IncompleteReference, got {other:?}"),
            }
        }
    }

    #[test]
    fn contract_ref_converts_to_and_from_generated_refs() {
        let r = ContractRef::new("infrastructure.banlieue.io", "ProxmoxMachine", "m1");
        let generated: MachineInfrastructureRef = r.clone().into();
        assert_eq!(generated.api_group, "infrastructure.banlieue.io");
        assert_eq!(generated.kind, "ProxmoxMachine");
        assert_eq!(generated.name, "m1");
        assert_eq!(ContractRef::from(&generated), r);
        assert_eq!(
            serde_json::to_value(&generated).unwrap(),
            serde_json::json!({"apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxMachine", "name": "m1"})
        );
    }
}
