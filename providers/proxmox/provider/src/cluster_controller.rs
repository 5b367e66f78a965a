//! The ProxmoxCluster's backend for the kit's InfraCluster reconciler
//! ([`banlieue_provider_kit::cluster`], which owns the contract: owner, pause, finalizer,
//! deletion after the machines, endpoint, `Ready`, Events, watches).
//!
//! What is Proxmox's: the connection (the ProxmoxCluster's endpoint and credentials Secret, or
//! its Provider's, see [`crate::credentials::read_endpoint_connection`]), checked with `GET /version`
//! and the node and guest listings (`ProxmoxConnected`, with the reason of
//! [`crate::error::connection_reason`]), and one failure domain per allowed online node (every
//! online node when `spec.allowedNodes` is empty). A cluster spread over `spec.endpoints` is
//! checked endpoint by endpoint, each one failure domain ([`check_from_endpoints`]).

use banlieue_api::common::FailureDomain;
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxClusterEndpoint, ProxmoxMachine};
use banlieue_provider_kit::cluster::{ClusterBackend, ClusterCheck, Problem};
use banlieue_provider_kit::secrets::ReadSecrets;
use banlieue_provider_kit::usable;

use crate::credentials::Connector;
use crate::endpoints::Connected;
use crate::error::Error;
use crate::hypervisor::{Hypervisor, NodeLoad};
use crate::machine_controller::FIELD_MANAGER;

/// Condition type: Proxmox VE answers with these credentials and they may list nodes and guests.
pub const PROXMOX_CONNECTED: &str = "ProxmoxConnected";

/// The Proxmox side of the ProxmoxCluster reconciler.
pub struct ProxmoxClusters<C: Connector> {
    /// Builds hypervisor handles.
    pub connector: C,
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
    let none = Problem::new("NoOnlineNode", "no allowed Proxmox node is online");
    ClusterCheck::with_domains(Ok(note), domains, none)
}

/// What one endpoint of a spread cluster answered: its version, allowed nodes and nodes.
pub type EndpointAnswer = Result<(String, Vec<String>, Vec<NodeLoad>), Problem>;

/// The check of a cluster spread over `spec.endpoints` (pure), from what each endpoint
/// answered: one failure domain per endpoint with an allowed node online (its capacity the sum
/// of those nodes'); connected while one endpoint answers, with a note naming those that do not
/// and those without an allowed node online.
pub fn check_from_endpoints(answers: &[(&ProxmoxClusterEndpoint, EndpointAnswer)]) -> ClusterCheck {
    let (mut domains, mut notes, mut versions) = (Vec::new(), Vec::new(), Vec::new());
    let mut failures = Vec::new();
    for (site, answer) in answers {
        let (version, allowed, nodes) = match answer {
            Ok(answered) => answered,
            Err(problem) => {
                failures.push(problem.clone());
                notes.push(format!(
                    "endpoint {} unusable ({}): {}",
                    site.name, problem.reason, problem.message
                ));
                continue;
            }
        };
        versions.push(format!("{}: {version}", site.name));
        let (node_domains, missing) = failure_domains(allowed, nodes);
        if !missing.is_empty() {
            notes.push(format!(
                "endpoint {}: allowed nodes not online: {}",
                site.name,
                missing.join(", ")
            ));
        }
        if node_domains.is_empty() {
            notes.push(format!("endpoint {}: no allowed node online", site.name));
            continue;
        }
        let cpus: Option<u64> = node_domains.iter().map(|d| d.capacity().0.map(u64::from)).sum();
        let memory: Option<u64> = node_domains.iter().map(|d| d.capacity().1).sum();
        domains.push(
            FailureDomain {
                name: site.name.clone(),
                control_plane: Some(site.control_plane.unwrap_or(true)),
                attributes: None,
            }
            .with_capacity(cpus.and_then(|c| u32::try_from(c).ok()), memory),
        );
    }
    if failures.len() == answers.len()
        && let Some(first) = failures.first()
    {
        let message = notes.join("; ");
        return ClusterCheck::failed(Problem::new(first.reason, message));
    }
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    let none = "no endpoint of spec.endpoints has an allowed node online";
    let none = Problem::new(crate::endpoints::NO_ONLINE_NODE, none);
    ClusterCheck {
        version: (!versions.is_empty()).then(|| versions.join(", ")),
        ..ClusterCheck::with_domains(Ok(notes.join("; ")), domains, none)
    }
}

impl<C: Connector> ProxmoxClusters<C> {
    /// The check of a cluster spread over `spec.endpoints`: each endpoint asked in turn.
    async fn check_spread(
        &self,
        client: &kube::Client,
        pxc: &ProxmoxCluster,
        secrets: &ReadSecrets<ProxmoxCluster>,
    ) -> Result<ClusterCheck, Error> {
        let mut answers = Vec::with_capacity(pxc.spec.endpoints.len());
        let mut insecure_tls = false;
        for site in &pxc.spec.endpoints {
            let record = |keys| secrets.record(keys);
            let answer =
                match crate::endpoints::connect(client, &self.connector, pxc, Some(site), record).await? {
                    Err(problem) => Err(problem),
                    Ok(connected) => {
                        insecure_tls |= connected.connection.skips_tls_verification();
                        check(&connected.hv, &connected.connection.endpoint)
                            .await
                            .map(|(version, nodes)| (version, connected.connection.allowed_nodes, nodes))
                    }
                };
            answers.push((site, answer));
        }
        Ok(ClusterCheck {
            insecure_tls,
            ..check_from_endpoints(&answers)
        })
    }
}

impl<C: Connector> ClusterBackend for ProxmoxClusters<C> {
    type Cluster = ProxmoxCluster;
    type Machine = ProxmoxMachine;
    type Error = Error;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;
    const CONNECTED_CONDITION: &'static str = PROXMOX_CONNECTED;

    async fn check(
        &self,
        client: &kube::Client,
        pxc: &ProxmoxCluster,
        secrets: &ReadSecrets<ProxmoxCluster>,
    ) -> Result<Result<ClusterCheck, Problem>, Error> {
        if crate::endpoints::spread(pxc) {
            return self.check_spread(client, pxc, secrets).await.map(Ok);
        }
        let record = |keys| secrets.record(keys);
        let Connected { hv, connection, .. } =
            usable!(crate::endpoints::connect(client, &self.connector, pxc, None, record).await?);
        let (version, nodes) = usable!(check(&hv, &connection.endpoint).await);
        Ok(Ok(ClusterCheck {
            version: Some(version),
            insecure_tls: connection.skips_tls_verification(),
            ..check_from_nodes(&connection.allowed_nodes, &nodes)
        }))
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

    fn site(name: &str, control_plane: Option<bool>) -> ProxmoxClusterEndpoint {
        ProxmoxClusterEndpoint {
            name: name.into(),
            control_plane,
            ..Default::default()
        }
    }

    #[test]
    fn each_endpoint_with_an_allowed_node_online_is_one_failure_domain() {
        let (b, a, c, d) = (
            site("site-b", Some(false)),
            site("site-a", None),
            site("site-c", None),
            site("site-d", None),
        );
        let answers = [
            (&b, Ok(("8.2.4".to_owned(), vec![], nodes()))),
            (
                &a,
                Ok((
                    "8.1.3".to_owned(),
                    vec!["pve1".to_owned(), "pve3".to_owned()],
                    nodes(),
                )),
            ),
            (&c, Ok(("8.2.4".to_owned(), vec!["pve3".to_owned()], nodes()))),
            (&d, Err(Problem::new("ProxmoxUnreachable", "connection refused"))),
        ];
        let check = check_from_endpoints(&answers);
        let domains = check.failure_domains.expect("published");
        let names: Vec<(&str, Option<bool>)> = domains
            .iter()
            .map(|d| (d.name.as_str(), d.control_plane))
            .collect();
        assert_eq!(
            names,
            [("site-a", Some(true)), ("site-b", Some(false))],
            "site-c has no allowed node online"
        );
        assert_eq!(
            domains[1].capacity(),
            (Some(8), None),
            "site-b: two online nodes of 4 CPUs"
        );
        assert_eq!(domains[0].capacity(), (Some(4), None), "site-a: pve1 only");
        let note = check.connected.expect("connected while one endpoint answers");
        for part in [
            "endpoint site-d unusable (ProxmoxUnreachable)",
            "endpoint site-c: no allowed node online",
            "endpoint site-a: allowed nodes not online: pve3",
        ] {
            assert!(note.contains(part), "{part:?} in {note:?}");
        }
        assert!(check.usable.is_ok());
        assert_eq!(
            check.version.as_deref(),
            Some("site-b: 8.2.4, site-a: 8.1.3, site-c: 8.2.4")
        );
    }

    #[test]
    fn a_spread_cluster_with_no_endpoint_answering_is_not_connected() {
        let (a, b) = (site("site-a", None), site("site-b", None));
        let answers = [
            (&a, Err(Problem::new("ProxmoxUnreachable", "refused"))),
            (&b, Err(Problem::new("CredentialsInvalid", "401"))),
        ];
        let check = check_from_endpoints(&answers);
        let problem = check.connected.unwrap_err();
        assert_eq!(problem.reason, "ProxmoxUnreachable");
        assert!(
            problem.message.contains("site-b") && problem.message.contains("401"),
            "{}",
            problem.message
        );
        assert_eq!(check.failure_domains, None, "the published ones are kept");
        let offline = [(&a, Ok(("8.2.4".to_owned(), vec!["pve3".to_owned()], nodes())))];
        assert_eq!(
            check_from_endpoints(&offline).usable.unwrap_err().reason,
            "NoOnlineNode"
        );
    }

    #[test]
    fn connected_with_no_allowed_node_online_is_not_usable() {
        let check = check_from_nodes(&["pve3".to_owned()], &nodes());
        assert_eq!(check.connected, Ok("allowed nodes not online: pve3".to_owned()));
        assert_eq!(check.usable.unwrap_err().reason, "NoOnlineNode");
        assert!(check_from_nodes(&[], &nodes()).usable.is_ok());
    }
}
