//! The Proxmox VE endpoint a machine uses. A ProxmoxCluster has one (`spec.endpoint` or its
//! Provider's, whose nodes are the failure domains) or is spread over several
//! (`spec.endpoints`, each one failure domain). A machine of a spread cluster goes to its
//! owner's failure domain, else to the endpoint whose roomiest allowed node has the most free
//! memory; once its node is chosen, the endpoint is kept in `status.failureDomain`, which is
//! where every later step (and deletion) finds its VM.

use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxClusterEndpoint};
use banlieue_provider_kit::cluster::Problem;
use banlieue_provider_kit::connection::CREDENTIALS_INVALID;
use banlieue_provider_kit::usable;
use banlieue_provider_runtime::secret_watch::SecretKey;
use kube::ResourceExt;

use crate::credentials::{Connection, Connector, read_endpoint_connection};
use crate::error::Error;
use crate::hypervisor::NodeLoad;

/// Reason: a failure domain that is not one of the ProxmoxCluster's `spec.endpoints`.
pub const FAILURE_DOMAIN_NOT_FOUND: &str = "FailureDomainNotFound";
/// Reason: no endpoint of a spread ProxmoxCluster has an allowed node online.
pub const NO_ONLINE_NODE: &str = "NoOnlineNode";

/// A connected endpoint.
pub struct Connected<H> {
    /// The hypervisor handle.
    pub hv: H,
    /// Its settings (the allowed nodes among them).
    pub connection: Connection,
    /// Its failure-domain name: `None` for the single endpoint of a ProxmoxCluster that is not
    /// spread.
    pub site: Option<String>,
}

/// Whether the cluster is spread over `spec.endpoints`.
pub fn spread(pxc: &ProxmoxCluster) -> bool {
    !pxc.spec.endpoints.is_empty()
}

/// The endpoint of `spec.endpoints` named `name`, or why there is none.
pub fn named<'a>(pxc: &'a ProxmoxCluster, name: &str) -> Result<&'a ProxmoxClusterEndpoint, Problem> {
    pxc.spec.endpoints.iter().find(|e| e.name == name).ok_or_else(|| {
        Problem::new(
            FAILURE_DOMAIN_NOT_FOUND,
            format!(
                "failure domain {name:?} is not one of ProxmoxCluster {}'s spec.endpoints (known: {})",
                pxc.name_any(),
                banlieue_provider_kit::join(pxc.spec.endpoints.iter().map(|e| &e.name), ", ")
            ),
        )
    })
}

/// A handle on `site` of the cluster (`None`: the cluster's own endpoint), or why there is
/// none. `record` gets the Secrets read.
pub async fn connect<C: Connector>(
    client: &kube::Client,
    connector: &C,
    pxc: &ProxmoxCluster,
    site: Option<&ProxmoxClusterEndpoint>,
    record: impl FnOnce(Vec<SecretKey>),
) -> Result<Result<Connected<C::Hv>, Problem>, Error> {
    let connection = usable!(read_endpoint_connection(client, pxc, site, record).await?);
    let mut key = format!("{}/{}", pxc.namespace().unwrap_or_default(), pxc.name_any());
    if let Some(site) = site {
        key = format!("{key}/{}", site.name);
    }
    Ok(match connector.connect(&key, &connection) {
        Ok(hv) => Ok(Connected {
            hv,
            connection,
            site: site.map(|s| s.name.clone()),
        }),
        Err(message) => Err(Problem::new(CREDENTIALS_INVALID, message)),
    })
}

/// The most free memory of an allowed online node (`allowed` empty: any node), if one is.
pub fn roomiest_free_memory(allowed: &[String], nodes: &[NodeLoad]) -> Option<u64> {
    nodes
        .iter()
        .filter(|n| n.online && (allowed.is_empty() || allowed.contains(&n.name)))
        .map(|n| n.free_memory)
        .max()
}

/// The endpoint a machine without a failure domain goes to: the one whose roomiest allowed
/// online node has the most free memory (ties: the first name), by the kit's rule for every
/// hypervisor. `None` when no endpoint has an allowed node online.
pub fn roomiest_site<'a>(sites: impl IntoIterator<Item = (&'a str, Option<u64>)>) -> Option<&'a str> {
    // Only endpoints with room: the kit's rule takes the first name when none is known.
    banlieue_provider_kit::placement::roomiest(sites.into_iter().filter(|(_, free)| free.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::infrastructure::ProxmoxClusterSpec;

    fn node(name: &str, online: bool, free_memory: u64) -> NodeLoad {
        NodeLoad {
            name: name.into(),
            online,
            free_memory,
            cpus: None,
            memory_mib: None,
        }
    }

    #[test]
    fn an_endpoints_room_is_its_roomiest_allowed_online_node() {
        let nodes = [node("a", true, 5), node("b", false, 50), node("c", true, 9)];
        assert_eq!(roomiest_free_memory(&[], &nodes), Some(9));
        assert_eq!(
            roomiest_free_memory(&["a".into(), "b".into()], &nodes),
            Some(5),
            "b is offline"
        );
        assert_eq!(roomiest_free_memory(&["b".into()], &nodes), None);
    }

    #[test]
    fn a_machine_without_failure_domain_goes_to_the_roomiest_endpoint() {
        assert_eq!(
            roomiest_site([("a", Some(5)), ("b", Some(9)), ("c", None)]),
            Some("b")
        );
        assert_eq!(
            roomiest_site([("b", Some(9)), ("a", Some(9))]),
            Some("a"),
            "ties: first name"
        );
        assert_eq!(roomiest_site([("a", None)]), None);
    }

    #[test]
    fn an_unknown_failure_domain_names_the_known_endpoints() {
        let pxc = ProxmoxCluster::new(
            "spread",
            ProxmoxClusterSpec {
                endpoints: ["site-a", "site-b"]
                    .map(|name| ProxmoxClusterEndpoint {
                        name: name.into(),
                        ..Default::default()
                    })
                    .to_vec(),
                ..Default::default()
            },
        );
        assert!(spread(&pxc));
        assert_eq!(named(&pxc, "site-b").map(|e| e.name.as_str()), Ok("site-b"));
        let problem = named(&pxc, "pve1").unwrap_err();
        assert_eq!(problem.reason, FAILURE_DOMAIN_NOT_FOUND);
        assert!(
            problem.message.contains("known: site-a, site-b"),
            "{}",
            problem.message
        );
    }
}
