//! The backend registry: which infrastructure machine kind realises a VirtualMachine on each
//! backend, and how the neutral words map onto that kind's fields.
//!
//! The table is data. The reconciler and [`crate::build`] only read it, so adding a backend
//! means adding one [`BackendEntry`] to [`REGISTRY`] (plus its CRD in `banlieue-api`), not
//! changing any reconcile logic.
//!
//! | backend | machine kind | infra cluster kind | image key | default storage → | node → | power → |
//! |---|---|---|---|---|---|---|
//! | proxmox | ProxmoxMachine | ProxmoxCluster | `proxmox` | `storage` | `targetNode` | `powerState` |
//! | libvirt | LibvirtMachine | LibvirtCluster | `libvirt` | `storagePool` | – | `powerState` |
//! | vsphere | VSphereMachine | VSphereCluster | `vsphere` | `datastore` | – | `powerState` |
//!
//! Every infrastructure machine shares the neutral shape (`providerRef`, `source`, `cpu`,
//! `memoryMiB`, `disks`, `networks`), so those fields are copied under the same names. The
//! infra cluster kind is the object the controller applies once per (Provider, namespace) so
//! that the provider gets endpoint and credentials the way it does for a CAPI Cluster.

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
    /// Kind of the backend's infra cluster (e.g. `ProxmoxCluster`): one per (Provider,
    /// namespace), with `spec.providerRef`, owned by the Provider.
    pub cluster_kind: &'static str,
    /// Plural of [`Self::cluster_kind`] (e.g. `proxmoxclusters`).
    pub cluster_plural: &'static str,
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
    /// Machine spec field that receives `VirtualMachine.spec.powerState` (`On` | `Off`, the same
    /// enum on both sides), when the backend can power machines on and off.
    pub power_state_field: Option<&'static str>,
    /// Machine spec field that receives `VirtualMachineImage.spec.seedDriveBus` (the same enum),
    /// when the backend attaches a seed drive.
    pub seed_drive_bus_field: Option<&'static str>,
    /// Machine spec field that receives `VirtualMachineImage.spec.firmware` (the same enum),
    /// when the backend sets a clone's firmware.
    pub firmware_field: Option<&'static str>,
}

/// The registry: one entry per backend.
pub const REGISTRY: &[BackendEntry] = &[
    BackendEntry {
        backend: Backend::Proxmox,
        kind: "ProxmoxMachine",
        plural: "proxmoxmachines",
        cluster_kind: "ProxmoxCluster",
        cluster_plural: "proxmoxclusters",
        image_key: "proxmox",
        defaults: &[("storage", "storage"), ("resourcePool", "pool")],
        node_field: Some("targetNode"),
        default_interface: "net0",
        power_state_field: Some("powerState"),
        seed_drive_bus_field: Some("seedDriveBus"),
        firmware_field: Some("firmware"),
    },
    BackendEntry {
        backend: Backend::Libvirt,
        kind: "LibvirtMachine",
        plural: "libvirtmachines",
        cluster_kind: "LibvirtCluster",
        cluster_plural: "libvirtclusters",
        image_key: "libvirt",
        defaults: &[("storage", "storagePool")],
        node_field: None,
        default_interface: "net0",
        power_state_field: Some("powerState"),
        seed_drive_bus_field: Some("seedDriveBus"),
        firmware_field: Some("firmware"),
    },
    BackendEntry {
        backend: Backend::Vsphere,
        kind: "VSphereMachine",
        plural: "vspheremachines",
        cluster_kind: "VSphereCluster",
        cluster_plural: "vsphereclusters",
        image_key: "vsphere",
        defaults: &[
            ("storage", "datastore"),
            ("resourcePool", "resourcePool"),
            ("datacenter", "datacenter"),
            ("folder", "folder"),
        ],
        node_field: None,
        default_interface: "net0",
        power_state_field: Some("powerState"),
        seed_drive_bus_field: None,
        firmware_field: Some("firmware"),
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

    /// The dynamic API resource of the machine kind, for `Api<DynamicObject>`.
    pub fn api_resource(&self) -> ApiResource {
        resource(self.kind, self.plural)
    }

    /// The dynamic API resource of the infra cluster kind.
    pub fn cluster_api_resource(&self) -> ApiResource {
        resource(self.cluster_kind, self.cluster_plural)
    }
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(banlieue_api::INFRASTRUCTURE_GROUP, banlieue_api::VERSION, kind);
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use rstest::rstest;

    use super::*;

    type Crd = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    fn spec_properties(crd: &Crd) -> serde_json::Value {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("schema serializes");
        schema["openAPIV3Schema"]["properties"]["spec"]["properties"].clone()
    }

    fn assert_names(crd: &Crd, kind: &str, plural: &str, ar: &ApiResource, entry: &BackendEntry) {
        assert_eq!(kind, crd.spec.names.kind);
        assert_eq!(plural, crd.spec.names.plural);
        assert_eq!(entry.group(), crd.spec.group);
        assert!(
            crd.spec
                .versions
                .iter()
                .any(|v| entry.api_version().ends_with(&v.name))
        );
        assert_eq!(ar.api_version, entry.api_version());
        assert_eq!((ar.plural.as_str(), ar.kind.as_str()), (plural, kind));
    }

    #[rstest]
    #[case::proxmox(
        Backend::Proxmox,
        banlieue_api::infrastructure::ProxmoxMachine::crd(),
        banlieue_api::infrastructure::ProxmoxCluster::crd()
    )]
    #[case::libvirt(
        Backend::Libvirt,
        banlieue_api::infrastructure::LibvirtMachine::crd(),
        banlieue_api::infrastructure::LibvirtCluster::crd()
    )]
    #[case::vsphere(
        Backend::Vsphere,
        banlieue_api::infrastructure::VSphereMachine::crd(),
        banlieue_api::infrastructure::VSphereCluster::crd()
    )]
    fn entry_matches_the_crds(#[case] backend: Backend, #[case] machine: Crd, #[case] cluster: Crd) {
        let entry = lookup(backend).expect("registered");
        assert_names(&machine, entry.kind, entry.plural, &entry.api_resource(), entry);
        assert_names(
            &cluster,
            entry.cluster_kind,
            entry.cluster_plural,
            &entry.cluster_api_resource(),
            entry,
        );
        assert_eq!(by_kind(entry.kind), Some(entry));
    }

    /// Every field the table writes exists in the kinds' CRD schemas, so a renamed API field
    /// fails here rather than being pruned silently by the apiserver.
    #[rstest]
    #[case::proxmox(
        Backend::Proxmox,
        banlieue_api::infrastructure::ProxmoxMachine::crd(),
        banlieue_api::infrastructure::ProxmoxCluster::crd()
    )]
    #[case::libvirt(
        Backend::Libvirt,
        banlieue_api::infrastructure::LibvirtMachine::crd(),
        banlieue_api::infrastructure::LibvirtCluster::crd()
    )]
    #[case::vsphere(
        Backend::Vsphere,
        banlieue_api::infrastructure::VSphereMachine::crd(),
        banlieue_api::infrastructure::VSphereCluster::crd()
    )]
    fn mapped_fields_exist_in_the_schema(
        #[case] backend: Backend,
        #[case] machine: Crd,
        #[case] cluster: Crd,
    ) {
        let entry = lookup(backend).expect("registered");
        let spec_props = spec_properties(&machine);
        let mut fields: Vec<&str> = entry.defaults.iter().map(|(_, to)| *to).collect();
        fields.extend(entry.node_field);
        fields.extend(entry.power_state_field);
        fields.extend(entry.seed_drive_bus_field);
        fields.extend(entry.firmware_field);
        fields.extend([
            "providerRef",
            "source",
            "cpu",
            "memoryMiB",
            "disks",
            "networks",
            "restartPolicy",
            "readinessChecks",
        ]);
        for field in fields {
            assert!(
                spec_props.get(field).is_some(),
                "{} has no spec.{field}",
                entry.kind
            );
        }
        // The power state is the same enum on the VirtualMachine and on the machine.
        if let Some(field) = entry.power_state_field {
            let vm =
                serde_json::to_value(&banlieue_api::banlieue::VirtualMachine::crd().spec.versions[0].schema)
                    .expect("schema serializes");
            let vm_enum = &vm["openAPIV3Schema"]["properties"]["spec"]["properties"]["powerState"]["enum"];
            assert!(vm_enum.is_array(), "VirtualMachine spec.powerState is an enum");
            assert_eq!(&spec_props[field]["enum"], vm_enum, "{} spec.{field}", entry.kind);
        }
        // So is the restart policy.
        let vm = serde_json::to_value(&banlieue_api::banlieue::VirtualMachine::crd().spec.versions[0].schema)
            .expect("schema serializes");
        let vm_enum = &vm["openAPIV3Schema"]["properties"]["spec"]["properties"]["restartPolicy"]["enum"];
        assert_eq!(vm_enum, &serde_json::json!(["Manual", "Automatic"]));
        assert_eq!(
            &spec_props["restartPolicy"]["enum"], vm_enum,
            "{} spec.restartPolicy",
            entry.kind
        );
        assert!(
            spec_properties(&cluster)["providerRef"]["properties"]
                .get("name")
                .is_some(),
            "{} has no spec.providerRef.name",
            entry.cluster_kind
        );
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
                assert_ne!(a.cluster_kind, b.cluster_kind);
            }
        }
    }
}
