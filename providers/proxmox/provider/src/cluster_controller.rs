//! The ProxmoxCluster's backend for the kit's InfraCluster reconciler
//! ([`banlieue_provider_kit::cluster`], which owns the contract: owner, pause, finalizer,
//! deletion after the machines, endpoint, `Ready`, Events, watches).
//!
//! What is Proxmox's: the connection (the ProxmoxCluster's endpoint and credentials Secret, or
//! its Provider's, see [`crate::credentials::read_connection`]), checked with `GET /version`
//! and the node and guest listings (`ProxmoxConnected`, with the reason of
//! [`crate::error::connection_reason`]), and one failure domain per allowed online node (every
//! online node when `spec.allowedNodes` is empty).

use banlieue_api::common::FailureDomain;
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxMachine};
use banlieue_provider_kit::cluster::{self as kit, ClusterBackend, ClusterCheck, Problem};
use banlieue_provider_kit::secrets::ReadSecrets;
use kube::ResourceExt;

use crate::credentials::{Connector, read_connection};
use crate::error::Error;
use crate::hypervisor::{Hypervisor, NodeLoad};
use crate::machine_controller::{FIELD_MANAGER, FINALIZER};

pub use banlieue_provider_kit::cluster::run;

/// Condition type: Proxmox VE answers with these credentials and they may list nodes and guests.
pub const PROXMOX_CONNECTED: &str = "ProxmoxConnected";

/// The Proxmox side of the ProxmoxCluster reconciler.
pub struct ProxmoxClusters<C: Connector> {
    /// Builds hypervisor handles.
    pub connector: C,
}

/// Shared state of the ProxmoxCluster controller.
pub type ClusterContext<C> = kit::ClusterContext<ProxmoxClusters<C>>;

/// The ProxmoxCluster controller's context, reporting Events as `reporter`.
pub fn context<C: Connector>(client: kube::Client, connector: C, reporter: &str) -> ClusterContext<C> {
    kit::ClusterContext::new(client, ProxmoxClusters { connector }, reporter)
}

/// The failure domains for `allowed` nodes (all online nodes when empty), sorted by name, and
/// the allowed nodes that are not online.
pub fn failure_domains(allowed: &[String], nodes: &[NodeLoad]) -> (Vec<FailureDomain>, Vec<String>) {
    let online = |name: &str| nodes.iter().any(|n| n.name == name && n.online);
    let mut names: Vec<String> = if allowed.is_empty() {
        nodes
            .iter()
            .filter(|n| n.online)
            .map(|n| n.name.clone())
            .collect()
    } else {
        allowed.iter().filter(|n| online(n)).cloned().collect()
    };
    names.sort();
    names.dedup();
    let missing = allowed.iter().filter(|n| !online(n)).cloned().collect();
    let domains = names
        .into_iter()
        .map(|name| {
            let node = nodes.iter().find(|n| n.name == name);
            FailureDomain {
                name,
                control_plane: Some(true),
                attributes: None,
            }
            .with_capacity(node.and_then(|n| n.cpus), node.and_then(|n| n.memory_mib))
        })
        .collect();
    (domains, missing)
}

/// The check's outcome from the nodes Proxmox listed (pure): connected, with a note naming the
/// allowed nodes that are not online; usable when one allowed node is online.
pub fn check_from_nodes(allowed: &[String], nodes: &[NodeLoad]) -> ClusterCheck {
    let (domains, missing) = failure_domains(allowed, nodes);
    let note = if missing.is_empty() {
        String::new()
    } else {
        format!("allowed nodes not online: {}", missing.join(", "))
    };
    ClusterCheck {
        connected: Ok(note),
        usable: if domains.is_empty() {
            Err(Problem::new("NoOnlineNode", "no allowed Proxmox node is online"))
        } else {
            Ok(())
        },
        failure_domains: Some(domains),
        version: None,
        insecure_tls: false,
    }
}

impl<C: Connector> ClusterBackend for ProxmoxClusters<C> {
    type Cluster = ProxmoxCluster;
    type Machine = ProxmoxMachine;
    type Error = Error;
    const FINALIZER: &'static str = FINALIZER;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;
    const CONNECTED_CONDITION: &'static str = PROXMOX_CONNECTED;

    async fn check(
        &self,
        client: &kube::Client,
        pxc: &ProxmoxCluster,
        secrets: &ReadSecrets<ProxmoxCluster>,
    ) -> Result<ClusterCheck, Error> {
        let connection = match read_connection(client, pxc, |keys| secrets.record(keys)).await? {
            Err(problem) => return Ok(ClusterCheck::failed(problem)),
            Ok(connection) => connection,
        };
        let key = format!("{}/{}", pxc.namespace().unwrap_or_default(), pxc.name_any());
        let hv = match self.connector.connect(&key, &connection) {
            Err(e) => {
                return Ok(ClusterCheck::failed(Problem::new(
                    banlieue_provider_kit::connection::CREDENTIALS_INVALID,
                    e.to_string(),
                )));
            }
            Ok(hv) => hv,
        };
        Ok(match check(&hv, &connection.endpoint).await {
            Ok((version, nodes)) => ClusterCheck {
                version: Some(version),
                insecure_tls: matches!(
                    connection.tls,
                    banlieue_pve_client::TlsVerification::InsecureSkipVerify
                ),
                ..check_from_nodes(&connection.allowed_nodes, &nodes)
            },
            Err(problem) => ClusterCheck::failed(problem),
        })
    }
}

/// Connectivity and permission check: version, nodes, guests; the version and the nodes. A failure is reported with
/// [`crate::error::connection_reason`]'s reason (`ProxmoxRequestFailed` for any other error,
/// e.g. a 5xx) and the endpoint and the error as message.
async fn check<H: Hypervisor>(hv: &H, endpoint: &str) -> Result<(String, Vec<NodeLoad>), Problem> {
    let classify = |e: crate::hypervisor::PveError| {
        let reason = crate::error::connection_reason(&e).unwrap_or("ProxmoxRequestFailed");
        Problem::new(
            reason,
            format!("Proxmox VE at {endpoint}: {}", crate::error::describe(&e)),
        )
    };
    let version = hv.version().await.map_err(classify)?;
    let nodes = hv.nodes().await.map_err(classify)?;
    hv.guests().await.map_err(classify)?;
    Ok((version, nodes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn nodes() -> Vec<NodeLoad> {
        ["pve2", "pve1", "pve3"]
            .iter()
            .map(|n| NodeLoad {
                name: n.to_string(),
                online: *n != "pve3",
                free_memory: 0,
                cpus: Some(4),
                memory_mib: None,
            })
            .collect()
    }

    #[rstest]
    #[case::all_online_sorted(&[], &["pve1", "pve2"], &[])]
    #[case::allowed_only(&["pve2"], &["pve2"], &[])]
    #[case::offline_allowed_reported(&["pve3", "pve1"], &["pve1"], &["pve3"])]
    #[case::unknown_allowed_reported(&["pve9"], &[], &["pve9"])]
    fn failure_domains_come_from_online_allowed_nodes(
        #[case] allowed: &[&str],
        #[case] want: &[&str],
        #[case] missing: &[&str],
    ) {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        let (domains, got_missing) = failure_domains(&allowed, &nodes());
        let names: Vec<&str> = domains.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, want);
        assert!(domains.iter().all(|d| d.control_plane == Some(true)));
        assert!(
            domains.iter().all(|d| d.capacity() == (Some(4), None)),
            "with the CPUs Proxmox lists"
        );
        assert_eq!(got_missing, missing);
    }

    #[test]
    fn connected_with_no_allowed_node_online_is_not_usable() {
        let check = check_from_nodes(&["pve3".to_owned()], &nodes());
        assert_eq!(check.connected, Ok("allowed nodes not online: pve3".to_owned()));
        assert_eq!(check.usable.unwrap_err().reason, "NoOnlineNode");
        assert!(check_from_nodes(&[], &nodes()).usable.is_ok());
    }
}
