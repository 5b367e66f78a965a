//! The backend registry: which infrastructure machine kind realises a VirtualMachine on each
//! backend, and how the neutral words map onto that kind's fields.
//!
//! The table is data. The reconciler and [`crate::build`] only read it, so adding a backend
//! means adding one [`BackendEntry`] to [`REGISTRY`] (plus its CRD in `banlieue-api`), not
//! changing any reconcile logic.
//!
//! | backend | kind | plural | image key | default storage → | node → |
//! |---|---|---|---|---|---|
//! | proxmox | ProxmoxMachine | proxmoxmachines | `proxmox` | `storage` | `targetNode` |
//! | libvirt | LibvirtMachine | libvirtmachines | `libvirt` | `storagePool` | – |
//! | vsphere | VSphereMachine | vspheremachines | `vsphere` | `datastore` | – |
//!
//! Every infrastructure machine shares the neutral shape (`providerRef`, `source`, `cpu`,
//! `memoryMiB`, `disks`, `networks`), so those fields are copied under the same names.

use banlieue_api::banlieue::Backend;
use kube::core::{ApiResource, GroupVersionKind};

/// How one backend's infrastructure machine is addressed and filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendEntry {
    /// The Provider backend this entry serves.
    pub backend: Backend,
    /// Kind of the infrastructure machine (e.g. `ProxmoxMachine`).
    pub kind: &'static str,
    /// Plural resource name (e.g. `proxmoxmachines`).
    pub plural: &'static str,
    /// Key of this backend's template in `ImageSource` / `VirtualMachineImage.spec.sources[]`;
    /// the value is copied verbatim to the machine's `spec.source`.
    pub image_key: &'static str,
    /// Provider defaults copied to the machine spec when the VirtualMachine does not decide:
    /// `(field of Provider.spec.defaults, field of the machine spec)`.
    pub defaults: &'static [(&'static str, &'static str)],
    /// Machine spec field that pins the hypervisor node (`VirtualMachine.spec.placement.node`),
    /// when the backend has one.
    pub node_field: Option<&'static str>,
    /// Name of the interface created on the Provider's default network when the VirtualMachine
    /// lists no networks.
    pub default_interface: &'static str,
}

/// The registry: one entry per backend.
pub const REGISTRY: &[BackendEntry] = &[
    BackendEntry {
        backend: Backend::Proxmox,
        kind: "ProxmoxMachine",
        plural: "proxmoxmachines",
        image_key: "proxmox",
        defaults: &[("storage", "storage"), ("resourcePool", "pool")],
        node_field: Some("targetNode"),
        default_interface: "net0",
    },
    BackendEntry {
        backend: Backend::Libvirt,
        kind: "LibvirtMachine",
        plural: "libvirtmachines",
        image_key: "libvirt",
        defaults: &[("storage", "storagePool")],
        node_field: None,
        default_interface: "net0",
    },
    BackendEntry {
        backend: Backend::Vsphere,
        kind: "VSphereMachine",
        plural: "vspheremachines",
        image_key: "vsphere",
        defaults: &[
            ("storage", "datastore"),
            ("resourcePool", "resourcePool"),
            ("datacenter", "datacenter"),
            ("folder", "folder"),
        ],
        node_field: None,
        default_interface: "net0",
    },
];

/// The registry entry of `backend`, if the backend is registered.
pub fn lookup(backend: Backend) -> Option<&'static BackendEntry> {
    REGISTRY.iter().find(|e| e.backend == backend)
}

/// The registry entry of an infrastructure machine kind, if registered.
pub fn by_kind(kind: &str) -> Option<&'static BackendEntry> {
    REGISTRY.iter().find(|e| e.kind == kind)
}

impl BackendEntry {
    /// API group of every infrastructure machine (`infrastructure.banlieue.io`).
    pub fn group(&self) -> &'static str {
        banlieue_api::INFRASTRUCTURE_GROUP
    }

    /// `apiVersion` of the machine (`infrastructure.banlieue.io/v1alpha1`).
    pub fn api_version(&self) -> String {
        format!("{}/{}", banlieue_api::INFRASTRUCTURE_GROUP, banlieue_api::VERSION)
    }

    /// The dynamic API resource, for `Api<DynamicObject>`.
    pub fn api_resource(&self) -> ApiResource {
        let gvk = GroupVersionKind::gvk(
            banlieue_api::INFRASTRUCTURE_GROUP,
            banlieue_api::VERSION,
            self.kind,
        );
        ApiResource::from_gvk_with_plural(&gvk, self.plural)
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case::proxmox(Backend::Proxmox, banlieue_api::infrastructure::ProxmoxMachine::crd())]
    #[case::libvirt(Backend::Libvirt, banlieue_api::infrastructure::LibvirtMachine::crd())]
    #[case::vsphere(Backend::Vsphere, banlieue_api::infrastructure::VSphereMachine::crd())]
    fn entry_matches_the_crd(
        #[case] backend: Backend,
        #[case] crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) {
        let entry = lookup(backend).expect("registered");
        assert_eq!(entry.kind, crd.spec.names.kind);
        assert_eq!(entry.plural, crd.spec.names.plural);
        assert_eq!(entry.group(), crd.spec.group);
        assert!(
            crd.spec
                .versions
                .iter()
                .any(|v| entry.api_version().ends_with(&v.name))
        );
        assert_eq!(by_kind(entry.kind), Some(entry));
        let ar = entry.api_resource();
        assert_eq!(ar.api_version, entry.api_version());
        assert_eq!(ar.plural, entry.plural);
        assert_eq!(ar.kind, entry.kind);
    }

    /// Every field the table writes exists in the kind's CRD schema, so a renamed API field
    /// fails here rather than being pruned silently by the apiserver.
    #[rstest]
    #[case::proxmox(Backend::Proxmox, banlieue_api::infrastructure::ProxmoxMachine::crd())]
    #[case::libvirt(Backend::Libvirt, banlieue_api::infrastructure::LibvirtMachine::crd())]
    #[case::vsphere(Backend::Vsphere, banlieue_api::infrastructure::VSphereMachine::crd())]
    fn mapped_fields_exist_in_the_schema(
        #[case] backend: Backend,
        #[case] crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) {
        let entry = lookup(backend).expect("registered");
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("schema serializes");
        let spec_props = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let mut fields: Vec<&str> = entry.defaults.iter().map(|(_, to)| *to).collect();
        fields.extend(entry.node_field);
        fields.extend(["providerRef", "source", "cpu", "memoryMiB", "disks", "networks"]);
        for field in fields {
            assert!(
                spec_props.get(field).is_some(),
                "{} has no spec.{field}",
                entry.kind
            );
        }
        let defaults = serde_json::to_value(schemars::schema_for!(banlieue_api::banlieue::ProviderDefaults))
            .expect("schema serializes");
        for (from, _) in entry.defaults {
            assert!(
                defaults["properties"].get(from).is_some(),
                "Provider defaults have no {from}"
            );
        }
    }

    #[test]
    fn backends_are_unique() {
        for (i, a) in REGISTRY.iter().enumerate() {
            for b in &REGISTRY[i + 1..] {
                assert_ne!(a.backend, b.backend);
                assert_ne!(a.kind, b.kind);
            }
        }
    }
}
