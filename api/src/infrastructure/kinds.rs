//! The contract shape every hypervisor's kinds share, as traits: what the provider kit
//! (`banlieue-provider-kit`) reads and writes on an InfraCluster, an InfraMachine and an
//! InfraMachineTemplate without knowing the hypervisor. Each hypervisor's kinds implement them
//! here, next to their definitions ([`impl_infra_kinds!`]), so a new hypervisor adds its kinds
//! and one macro call.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::common::{
    ApiEndpoint, Cpu, FailureDomain, Initialization, MachineAddress, MachineTemplateStatus, NetworkInterface,
    PowerState, ProviderReference,
};
use crate::condition::Condition;

/// What the kit needs of any namespaced kind: a typed, serialisable Kubernetes resource.
pub trait NamespacedKind:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> NamespacedKind for K where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// The fields of `status` every infra kind has: `initialization`, `conditions`,
/// `observedGeneration`.
pub trait ContractStatus: Clone + Debug + Default + PartialEq + Serialize + Send + Sync + 'static {
    /// `status.initialization`.
    fn initialization(&self) -> Option<&Initialization>;
    /// Sets `status.initialization.provisioned`.
    fn set_provisioned(&mut self, provisioned: bool);
    /// `status.conditions`.
    fn conditions(&self) -> &[Condition];
    /// `status.conditions`, to change.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
    /// Sets `status.observedGeneration`.
    fn set_observed_generation(&mut self, generation: Option<i64>);
}

/// `status` of an InfraCluster: also `failureDomains`.
pub trait InfraClusterStatus: ContractStatus {
    /// `status.failureDomains`, to change.
    fn failure_domains_mut(&mut self) -> &mut Vec<FailureDomain>;
    /// Records the hypervisor's version where the kind has a field for it (`status.version`).
    fn set_version(&mut self, _version: Option<String>) {}
}

/// An InfraCluster kind (`ProxmoxCluster`, `LibvirtCluster`, `VSphereCluster`).
pub trait InfraCluster: NamespacedKind {
    /// Its `status`.
    type Status: InfraClusterStatus;
    /// `status`, if any.
    fn status(&self) -> Option<&Self::Status>;
    /// `spec.providerRef`: the banlieue Provider a standalone cluster takes its endpoint from.
    fn provider_ref(&self) -> Option<&ProviderReference>;
    /// `spec.controlPlaneEndpoint`.
    fn control_plane_endpoint(&self) -> Option<&ApiEndpoint>;
}

/// `status` of an InfraMachine: also `addresses`.
pub trait InfraMachineStatus: ContractStatus {
    /// Sets `status.addresses`.
    fn set_addresses(&mut self, addresses: Vec<MachineAddress>);
}

/// An InfraMachine kind (`ProxmoxMachine`, `LibvirtMachine`, `VSphereMachine`).
pub trait InfraMachine: NamespacedKind {
    /// The hypervisor backend the kind belongs to (which fields it honours:
    /// [`crate::support::machine_fields`]).
    const BACKEND: crate::common::Backend;
    /// Its `status`.
    type Status: InfraMachineStatus;
    /// Its InfraCluster kind.
    type Cluster: InfraCluster;
    /// `status`, if any.
    fn status(&self) -> Option<&Self::Status>;
    /// Replaces `status` (in memory: what the next step of one reconcile reads).
    fn set_status(&mut self, status: Self::Status);
    /// `spec.providerRef` (a machine of a standalone VirtualMachine).
    fn provider_ref(&self) -> Option<&ProviderReference>;
    /// `spec.providerID`.
    fn provider_id(&self) -> Option<&str>;
    /// `spec.powerState`.
    fn power_state(&self) -> Option<PowerState>;
    /// `spec.networks`: the interfaces and how each gets its addresses.
    fn networks(&self) -> &[NetworkInterface];
}

/// An InfraMachineTemplate kind: its machines' size, and `status.capacity`.
pub trait InfraMachineTemplate: NamespacedKind {
    /// `spec.template.spec.cpu`.
    fn cpu(&self) -> &Cpu;
    /// `spec.template.spec.memoryMiB`.
    fn memory_mib(&self) -> u64;
    /// `status` (the published capacity), if any.
    fn capacity_status(&self) -> Option<&MachineTemplateStatus>;
}

/// Implements the traits of this module for one hypervisor's kinds, whose fields follow the
/// contract's names (as every kind of this crate does).
#[macro_export]
macro_rules! impl_infra_kinds {
    (
        backend: $backend:expr;
        cluster: $cluster:ty, $cluster_status:ty $(, version: $version:ident)?;
        machine: $machine:ty, $machine_status:ty;
        template: $template:ty $(;)?
    ) => {
        impl $crate::infrastructure::kinds::ContractStatus for $cluster_status {
            $crate::impl_infra_kinds!(@status);
        }
        impl $crate::infrastructure::kinds::InfraClusterStatus for $cluster_status {
            fn failure_domains_mut(&mut self) -> &mut Vec<$crate::common::FailureDomain> {
                &mut self.failure_domains
            }
            $(
                fn set_version(&mut self, version: Option<String>) {
                    self.$version = version;
                }
            )?
        }
        impl $crate::infrastructure::kinds::InfraCluster for $cluster {
            type Status = $cluster_status;
            fn status(&self) -> Option<&Self::Status> {
                self.status.as_ref()
            }
            fn provider_ref(&self) -> Option<&$crate::common::ProviderReference> {
                self.spec.provider_ref.as_ref()
            }
            fn control_plane_endpoint(&self) -> Option<&$crate::common::ApiEndpoint> {
                self.spec.control_plane_endpoint.as_ref()
            }
        }
        impl $crate::infrastructure::kinds::ContractStatus for $machine_status {
            $crate::impl_infra_kinds!(@status);
        }
        impl $crate::infrastructure::kinds::InfraMachineStatus for $machine_status {
            fn set_addresses(&mut self, addresses: Vec<$crate::common::MachineAddress>) {
                self.addresses = addresses;
            }
        }
        impl $crate::infrastructure::kinds::InfraMachine for $machine {
            const BACKEND: $crate::common::Backend = $backend;
            type Status = $machine_status;
            type Cluster = $cluster;
            fn status(&self) -> Option<&Self::Status> {
                self.status.as_ref()
            }
            fn set_status(&mut self, status: Self::Status) {
                self.status = Some(status);
            }
            fn provider_ref(&self) -> Option<&$crate::common::ProviderReference> {
                self.spec.provider_ref.as_ref()
            }
            fn provider_id(&self) -> Option<&str> {
                self.spec.provider_id.as_deref()
            }
            fn power_state(&self) -> Option<$crate::common::PowerState> {
                self.spec.power_state
            }
            fn networks(&self) -> &[$crate::common::NetworkInterface] {
                &self.spec.networks
            }
        }
        impl $crate::infrastructure::kinds::InfraMachineTemplate for $template {
            fn cpu(&self) -> &$crate::common::Cpu {
                &self.spec.template.spec.cpu
            }
            fn memory_mib(&self) -> u64 {
                self.spec.template.spec.memory_mib
            }
            fn capacity_status(&self) -> Option<&$crate::common::MachineTemplateStatus> {
                self.status.as_ref()
            }
        }
    };
    (@status) => {
        fn initialization(&self) -> Option<&$crate::common::Initialization> {
            self.initialization.as_ref()
        }
        fn set_provisioned(&mut self, provisioned: bool) {
            self.initialization = $crate::common::Initialization::provisioned(provisioned);
        }
        fn conditions(&self) -> &[$crate::condition::Condition] {
            &self.conditions
        }
        fn conditions_mut(&mut self) -> &mut Vec<$crate::condition::Condition> {
            &mut self.conditions
        }
        fn set_observed_generation(&mut self, generation: Option<i64>) {
            self.observed_generation = generation;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infrastructure::{LibvirtCluster, ProxmoxMachine, VSphereClusterStatus};

    #[test]
    fn the_traits_read_and_write_the_contract_fields() {
        let mut status = VSphereClusterStatus::default();
        status.set_provisioned(true);
        status.set_observed_generation(Some(3));
        status.set_version(Some("8.0".into()));
        status.failure_domains_mut().push(FailureDomain {
            name: "fd".into(),
            control_plane: Some(true),
            attributes: None,
        });
        assert!(Initialization::is_provisioned(status.initialization()));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.version.as_deref(), Some("8.0"));
        assert_eq!(status.failure_domains.len(), 1);

        let cluster: LibvirtCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtCluster",
            "metadata": {"name": "c"},
            "spec": {"providerRef": {"name": "lab"}, "controlPlaneEndpoint": {"host": "h", "port": 6443}}
        }))
        .unwrap();
        assert_eq!(
            InfraCluster::provider_ref(&cluster).map(|p| p.name.as_str()),
            Some("lab")
        );
        assert_eq!(cluster.control_plane_endpoint().map(|e| e.port), Some(6443));

        let machine: ProxmoxMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
            "metadata": {"name": "m"},
            "spec": {"providerID": "proxmox://x", "source": {"vmid": 9000}, "cpu": {"cores": 1}, "memoryMiB": 512, "powerState": "Off"}
        }))
        .unwrap();
        assert_eq!(machine.provider_id(), Some("proxmox://x"));
        assert_eq!(machine.power_state(), Some(PowerState::Off));
        assert!(InfraMachine::status(&machine).is_none());
    }
}
