//! banlieue-libvirt: the Cluster API v1beta2 infrastructure provider for libvirt.
//!
//! - [`xml`]: pure domain and volume XML generation, ownership metadata.
//! - [`hypervisor`]: the small trait the reconcilers use to reach one libvirt host.
//! - [`connection`] (feature `libvirt`): the real implementation over the `virt` crate.
//! - [`desired`], [`phase`], [`provision`]: names and configuration, the persisted state
//!   machine, and provisioning / deletion against hosts.
//! - [`image_import`]: the base volume, an existing one or an image imported from a URL.
//! - [`readopt`]: finding the domain of a machine re-created by `clusterctl move` or a restore.
//! - [`hosts`]: the LibvirtCluster's hosts.
//! - [`credentials`]: Secret-held SSH keys / TLS certificates as private files and URI
//!   parameters.
//! - [`update`]: reconfiguring a provisioned domain (CPU, memory, power state).
//! - [`machine_controller`]: the LibvirtMachine controller; [`cluster_controller`]: the
//!   LibvirtCluster's backend for the kit's InfraCluster reconciler.
//!
//! The contract (owner view, InfraCluster reconciler, templates' capacity, Secret watch) is
//! `banlieue-provider-kit`'s.

pub mod cluster_controller;
#[cfg(feature = "libvirt")]
pub mod connection;
pub mod credentials;
pub mod desired;
pub mod error;
#[cfg(feature = "libvirt")]
mod guest_agent;
pub mod hosts;
pub mod hypervisor;
pub mod image_import;
pub mod machine_controller;
pub mod phase;
pub mod provision;
pub mod rbac;
pub mod readopt;
pub mod update;
pub mod xml;

/// The provider binary's name: Events' reporter, default Lease name.
pub const NAME: &str = "banlieue-libvirt";

/// The provider binary's controllers (the kit's InfraMachine, InfraCluster and template
/// reconcilers with libvirt's backends) over real libvirt connections: what `banlieue-libvirt`
/// serves, and what a test serves in its own process (libvirt's `test:///default` driver keeps
/// its state in the process that opened it).
#[cfg(feature = "libvirt")]
pub fn provider(
    connector: connection::VirtConnector,
    settings: desired::Settings,
) -> banlieue_provider_kit::serve::Provider<
    machine_controller::LibvirtMachines<connection::VirtConnector>,
    cluster_controller::LibvirtClusters<connection::VirtConnector>,
    banlieue_api::infrastructure::LibvirtMachineTemplate,
> {
    let machines = machine_controller::LibvirtMachines {
        connector: connector.clone(),
        settings,
        imports: Default::default(),
    };
    let clusters = cluster_controller::LibvirtClusters { connector };
    banlieue_provider_kit::serve::Provider::new(NAME, machines, clusters)
}
