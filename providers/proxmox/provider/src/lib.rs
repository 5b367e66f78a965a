//! banlieue-proxmox: the Cluster API v1beta2 infrastructure provider for Proxmox VE.
//!
//! - [`hypervisor`]: the small trait the reconcilers use to reach Proxmox VE, implemented by
//!   [`banlieue_pve_client::Client`].
//! - [`phase`]: the provisioning state machine, persisted in `ProxmoxMachine.status`.
//! - [`placement`], [`desired`]: pure functions — node choice, desired VM config, seed content.
//! - [`provision`]: one provisioning or deletion step against a [`hypervisor::Hypervisor`].
//! - [`image_import`]: templates made from an image (`spec.source.image`) by Proxmox VE itself.
//! - [`endpoints`]: the Proxmox VE endpoint a machine uses (one, or one of several failure domains).
//! - [`readopt`]: finding the VM of a machine re-created by `clusterctl move` or a restore.
//! - [`task_failure`]: what a failed Proxmox task means (retry, another VMID, or a human).
//! - `fake` (feature `testing`, and unit tests): an in-memory hypervisor double for tests.
//! - [`machine_controller`]: the ProxmoxMachine controller; [`cluster_controller`]: the
//!   ProxmoxCluster's backend for the kit's InfraCluster reconciler; [`provider`]: both with
//!   real Proxmox VE clients, served by the binary or spawned by tests.
//!
//! The contract (owner view, InfraCluster reconciler, templates' capacity, Secret watch, CAPI
//! installed late) is `banlieue-provider-kit`'s.

pub mod cluster_controller;
pub mod credentials;
pub mod desired;
pub mod endpoints;
pub mod error;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod ha;
pub mod hardware;
pub mod hypervisor;
pub mod image_import;
pub mod machine_controller;
pub mod phase;
pub mod placement;
pub mod provision;
pub mod rbac;
pub mod readopt;
pub mod task_failure;
pub mod template_facts;
pub mod update;

#[cfg(test)]
mod provision_tests;

use banlieue_api::infrastructure::ProxmoxMachineTemplate;
use banlieue_provider_kit::serve::Provider;

use crate::cluster_controller::ProxmoxClusters;
use crate::credentials::ClientConnector;
use crate::machine_controller::ProxmoxMachines;

/// The provider's controllers (the kit's reconcilers with Proxmox's backends) over real Proxmox
/// VE clients, uploading seed ISOs to `seed_storage`, reporting Events as `name`: what
/// `banlieue-proxmox` serves, and what tests spawn in their own process.
pub fn provider(
    name: &'static str,
    seed_storage: impl Into<String>,
) -> Provider<ProxmoxMachines<ClientConnector>, ProxmoxClusters<ClientConnector>, ProxmoxMachineTemplate> {
    let machines = ProxmoxMachines {
        connector: ClientConnector::default(),
        reservations: provision::VmidReservations::default(),
        seed_storage: seed_storage.into(),
    };
    let clusters = ProxmoxClusters {
        connector: ClientConnector::default(),
    };
    Provider::new(name, machines, clusters)
}
