//! `banlieue.io/v1alpha1`: the hypervisor-neutral kinds.
//!
//! - [`VirtualMachine`] (namespaced): a VM a user creates without Cluster API; the banlieue
//!   controller turns it into the infrastructure machine of the chosen [`Provider`].
//! - [`Provider`] (cluster-scoped): one hypervisor endpoint with credentials, TLS trust,
//!   defaults, placement labels and declared capacity. Several Providers of one backend coexist.
//! - [`VirtualMachineClass`] (cluster-scoped): sizing presets.
//! - [`VirtualMachineImage`] (cluster-scoped): a neutral image name mapped to each backend's
//!   template or base volume.

mod class;
mod image;
mod provider;
mod virtual_machine;

pub use class::{DiskPreset, VirtualMachineClass, VirtualMachineClassSpec};
pub use image::{
    ImageSource, OsType, VirtualMachineImage, VirtualMachineImageSource, VirtualMachineImageSpec,
};
pub use provider::{
    Backend, MOVE_LABEL, OWNED_REFERENCES_ANNOTATION, Provider, ProviderAllocation, ProviderCapacity,
    ProviderDefaults, ProviderNode, ProviderNodeTotals, ProviderSpec, ProviderStatus, REFERENCES_FINALIZER,
};
pub use virtual_machine::{
    Placement, VirtualMachine, VirtualMachinePhase, VirtualMachineSpec, VirtualMachineStatus,
};
