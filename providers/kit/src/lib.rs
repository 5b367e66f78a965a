//! banlieue-provider-kit: what every banlieue provider does the same way, whatever the hypervisor.
//!
//! A provider is a **backend** (its hypervisor client and the mapping of its kinds) plugged into
//! the kit, which owns the contract:
//!
//! | module | job |
//! |---|---|
//! | [`connection`] | an infra cluster's endpoint, credentials Secret and TLS trust, its own or its `Provider`'s, with one set of reasons for what cannot work |
//! | [`owner`] | an InfraMachine's controlling owner (CAPI `Machine` or banlieue `VirtualMachine`) resolved into what provisioning needs: bootstrap data source, failure domain, infra cluster, pause |
//! | [`cluster`] | the InfraCluster reconciler (owner, pause, finalizer, deletion after the machines, `controlPlaneEndpoint`, failure domains, `Ready`, Events), around a [`cluster::ClusterBackend`] |
//! | [`machine`] | the InfraMachine reconciler (fresh read, move, owner, pause, deletion step by step, finalizer, waits, user data, one provisioning step, `providerID`, conditions, Events, backoff), around a [`machine::MachineBackend`] |
//! | [`network`] | `spec.networks` for the guest: IPAM pool claims and their allocations, cloud-init `network-config` with DHCP, static and pool addresses |
//! | [`cloud_init`] | whether cloud-init has finished in a guest (its `result.json`), and the `Ready` of a provisioned machine until then |
//! | [`image`] | images imported from a URL: the verified download, and one background import per target shared by every machine waiting on it |
//! | [`placement`] | where a VM without a failure domain goes: the node or host with the most free memory |
//! | [`power`] | powering a guest off: a shutdown request first, a hard power-off once it is ignored for two minutes, the request's time persisted |
//! | [`readopt`] | re-adoption by identity: which VM a machine created anew (`clusterctl move`, a restore) may take over, and what its deletion may delete |
//! | [`template`] | the InfraMachineTemplate reconciler (`status.capacity`) |
//! | [`provider_references`] | a `Provider` owns its credentials Secret and CA bundle (owner references, recorded, released before its deletion), so that `clusterctl move` takes them along |
//! | [`serve`] | a provider binary's main loop: the three controllers of its backends behind the runtime's manager |
//! | [`status`] | conditions built with the time of now, `/status` written only when it changed, finalizers |
//! | [`events`] | Events for condition transitions (a normal state is never a Warning) |
//! | [`rbac`] | the contract's RBAC rules, declared per provider by [`contract_rbac!`] |
//! | [`secrets`] | the Secrets one reconcile reads, for the Secret watch |
//! | [`capi`] | whether Cluster API is served, and controllers restarted with CAPI watches once it is installed |
//! | [`error`] | the kit's error, and [`error::ReconcileError`], which a backend's errors implement |
//!
//! The kinds are read through the traits of [`banlieue_api::infrastructure::kinds`].

pub mod capi;
pub mod cloud_init;
pub mod cluster;
pub mod connection;
pub mod connection_memo;
mod drive;
pub mod error;
pub mod events;
pub mod image;
pub mod machine;
pub mod network;
pub mod owner;
pub mod placement;
pub mod power;
pub mod progress;
pub mod provider_references;
pub mod rbac;
pub mod readopt;
pub mod secrets;
pub mod serve;
pub mod status;
pub mod template;

/// `mutex`'s guard, also when a thread panicked while holding it (the kit's maps stay usable:
/// every writer leaves them consistent between statements).
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `items` one after the other, `separator` between them (for messages).
pub fn join<T: std::fmt::Display>(items: impl IntoIterator<Item = T>, separator: &str) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    items.join(separator)
}
