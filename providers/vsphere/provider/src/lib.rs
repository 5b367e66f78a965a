//! banlieue-vsphere: the Cluster API v1beta2 infrastructure provider for VMware vSphere,
//! over the thin SOAP client `banlieue-vsphere-client`.
//!
//! - [`connection`]: VSphereCluster / Provider → endpoint, credentials, TLS; client cache.
//! - [`phase`]: the provisioning state machine persisted in status.
//! - [`provision`]: one provisioning or deletion step against vCenter.
//! - [`guest_report`]: cloud-init's report, which the guest publishes in its guestinfo.
//! - [`image_import`], [`ova`]: a missing template imported from an OVA (`spec.source.image`).
//! - [`readopt`]: finding the VM of a machine re-created by `clusterctl move` or a restore.
//! - [`tags`]: vSphere tags from the machine's labels (`spec.tagsFromLabels`).
//! - [`update`]: CPU, memory, disks and NICs towards the spec (pure), during provisioning and as drift.
//! - [`machine_controller`]: the VSphereMachine controller; [`cluster_controller`]: the
//!   VSphereCluster's backend for the kit's InfraCluster reconciler.
//!
//! The contract (owner view, InfraCluster reconciler, templates' capacity, Secret watch) is
//! `banlieue-provider-kit`'s.

pub mod cluster_controller;
pub mod connection;
pub mod error;
pub mod guest_report;
pub mod image_import;
pub mod machine_controller;
pub mod ova;
pub mod phase;
pub mod provision;
pub mod rbac;
pub mod readopt;
pub mod tags;
pub mod update;

use banlieue_api::infrastructure::VSphereMachineTemplate;
use banlieue_provider_kit::serve::Provider;

use crate::cluster_controller::VSphereClusters;
use crate::machine_controller::VSphereMachines;

/// The provider's controllers (the kit's reconcilers with vSphere's backends), reporting Events
/// as `name`: what `banlieue-vsphere` serves, and what tests spawn in their own process.
pub fn provider(name: &'static str) -> Provider<VSphereMachines, VSphereClusters, VSphereMachineTemplate> {
    Provider::new(name, VSphereMachines::default(), VSphereClusters::default())
}
