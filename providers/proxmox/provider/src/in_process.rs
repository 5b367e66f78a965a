//! Both controllers as tasks of this process, for one namespace, connecting through real
//! Proxmox clients: what the scenario, standalone and real-host tests run (the binary serves
//! them with leader election, probes and metrics instead, see `main.rs`).

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::credentials::ClientConnector;
use crate::{cluster_controller, machine_controller};

/// Spawns the ProxmoxMachine (4 concurrent reconciles) and ProxmoxCluster (2) controllers,
/// watching `namespace`, uploading seeds to `seed_storage`, reporting Events as `reporter`.
pub fn spawn_controllers(
    kube: kube::Client,
    seed_storage: &str,
    reporter: &str,
    namespace: &str,
) -> [JoinHandle<()>; 2] {
    let machines = Arc::new(machine_controller::context(
        kube.clone(),
        ClientConnector::default(),
        seed_storage,
        reporter,
    ));
    let clusters = Arc::new(cluster_controller::context(
        kube,
        ClientConnector::default(),
        reporter,
    ));
    let (a, b) = (namespace.to_owned(), namespace.to_owned());
    [
        tokio::spawn(async move {
            machine_controller::run(machines, Some(&a), 4, std::future::pending()).await;
        }),
        tokio::spawn(async move {
            cluster_controller::run(clusters, Some(&b), 2, std::future::pending()).await;
        }),
    ]
}
