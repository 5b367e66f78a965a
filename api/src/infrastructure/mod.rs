//! `infrastructure.banlieue.io/v1alpha1`: Cluster API v1beta2 infrastructure kinds, per
//! hypervisor. Each backend has an InfraCluster, an InfraMachine and a template of each, shaped
//! exactly as CAPI's contract reads them (see `CAPI-CONTRACT.md`): `spec.providerID`,
//! `spec.controlPlaneEndpoint`, `status.initialization.provisioned`, `status.addresses`,
//! `status.failureDomain(s)`, `status.conditions`, `spec.template.{metadata,spec}`.
//!
//! Machines share the neutral shape of [`crate::common`] (`cpu`, `memoryMiB`, `disks`,
//! `networks`) so the banlieue controller can map a `VirtualMachine` onto any of them. A
//! machine with `spec.providerRef` takes its endpoint from that banlieue `Provider`
//! (standalone VirtualMachines, no CAPI Cluster); otherwise from its CAPI Cluster's
//! InfraCluster.

mod libvirt;
mod proxmox;
mod vsphere;

pub use libvirt::*;
pub use proxmox::*;
pub use vsphere::*;

pub mod kinds;

crate::impl_infra_kinds! {
    backend: crate::common::Backend::Proxmox;
    cluster: ProxmoxCluster, ProxmoxClusterStatus, version: version;
    machine: ProxmoxMachine, ProxmoxMachineStatus;
    template: ProxmoxMachineTemplate;
}

crate::impl_infra_kinds! {
    backend: crate::common::Backend::Libvirt;
    cluster: LibvirtCluster, LibvirtClusterStatus, version: version;
    machine: LibvirtMachine, LibvirtMachineStatus;
    template: LibvirtMachineTemplate;
}

crate::impl_infra_kinds! {
    backend: crate::common::Backend::Vsphere;
    cluster: VSphereCluster, VSphereClusterStatus, version: version;
    machine: VSphereMachine, VSphereMachineStatus;
    template: VSphereMachineTemplate;
}
