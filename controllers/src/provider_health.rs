//! A Provider's health, read from the infrastructure clusters the controller applied for it (one
//! `banlieue-<provider>` per namespace whose VirtualMachines use it): the provider of that
//! backend checks the connection there, so the Provider says what they found rather than
//! connecting a second time.
//!
//! | infra clusters | `Ready` | reason |
//! |---|---|---|
//! | none yet | `Unknown` | `NotUsedYet`: the connection is checked when the first VirtualMachine uses it |
//! | one is `Ready=True` | `True` | `Connected` (the version the hypervisor reported, when its kind publishes one) |
//! | none is ready | `False` | the first one's reason (`AuthenticationFailed`, `ProviderUnreachable`, …), its namespace and message |

use banlieue_api::banlieue::ProviderNode;
use banlieue_api::common::FailureDomain;
use banlieue_api::condition::ConditionStatus;
use kube::ResourceExt;
use kube::api::DynamicObject;

/// `Ready` reason while no infrastructure cluster of the Provider exists.
pub const NOT_USED_YET: &str = "NotUsedYet";
/// `Ready` reason when an infrastructure cluster of the Provider is ready.
pub const CONNECTED: &str = "Connected";

/// What the Provider's status says of its hypervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// `Ready`'s status.
    pub status: ConditionStatus,
    /// `Ready`'s reason.
    pub reason: String,
    /// `Ready`'s message.
    pub message: String,
    /// `status.version`: the hypervisor's, when an infra cluster reported it.
    pub version: Option<String>,
    /// `status.nodes`: the failure domains the infra clusters report (each once, by name), with
    /// the capacity among their attributes.
    pub nodes: Vec<ProviderNode>,
}

/// The nodes of the infra clusters' `status.failureDomains` (each once, by name).
pub fn nodes(clusters: &[&DynamicObject]) -> Vec<ProviderNode> {
    let mut nodes: Vec<ProviderNode> = Vec::new();
    for cluster in clusters {
        let Some(domains) = cluster.data.pointer("/status/failureDomains") else {
            continue;
        };
        let domains: Vec<FailureDomain> = serde_json::from_value(domains.clone()).unwrap_or_default();
        for domain in domains {
            if nodes.iter().any(|n| n.name == domain.name) {
                continue;
            }
            let (cpus, memory_mib) = domain.capacity();
            nodes.push(ProviderNode {
                name: domain.name,
                cpus,
                memory_mib,
            });
        }
    }
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    // The CRD caps the list (a longer one would make every status write fail).
    nodes.truncate(MAX_NODES);
    nodes
}

/// The most nodes `status.nodes` holds (its `maxItems`).
pub const MAX_NODES: usize = 256;

fn ready_of(cluster: &DynamicObject) -> Option<(String, String, String)> {
    let conditions = cluster.data.pointer("/status/conditions")?.as_array()?;
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    let text = |k: &str| ready[k].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// The health from the Provider's infrastructure clusters (pure).
pub fn health(clusters: &[DynamicObject]) -> Health {
    let mut sorted: Vec<&DynamicObject> = clusters.iter().collect();
    sorted.sort_by_key(|c| c.namespace());
    let version = sorted
        .iter()
        .find_map(|c| c.data.pointer("/status/version").and_then(|v| v.as_str()))
        .map(str::to_owned);
    let nodes = nodes(&sorted);
    if sorted.is_empty() {
        return Health {
            status: ConditionStatus::Unknown,
            reason: NOT_USED_YET.to_owned(),
            message:
                "no VirtualMachine uses this Provider yet: its connection is checked when the first one does"
                    .to_owned(),
            version,
            nodes,
        };
    }
    if sorted.iter().any(|c| ready_of(c).is_some_and(|r| r.0 == "True")) {
        return Health {
            status: ConditionStatus::True,
            reason: CONNECTED.to_owned(),
            message: String::new(),
            version,
            nodes,
        };
    }
    let (namespace, (reason, message)) = sorted
        .iter()
        .find_map(|c| {
            ready_of(c)
                .filter(|r| r.0 == "False" && !r.1.is_empty())
                .map(|r| (c.namespace().unwrap_or_default(), (r.1, r.2)))
        })
        .unwrap_or_else(|| {
            (
                sorted[0].namespace().unwrap_or_default(),
                (
                    "Checking".to_owned(),
                    "the provider has not reported on the connection yet".to_owned(),
                ),
            )
        });
    Health {
        status: ConditionStatus::False,
        message: if message.is_empty() {
            format!("in namespace {namespace}")
        } else {
            format!("in namespace {namespace}: {message}")
        },
        reason,
        version,
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn cluster(ns: &str, ready: Option<(&str, &str, &str)>, version: Option<&str>) -> DynamicObject {
        let mut status = json!({});
        if let Some((s, r, m)) = ready {
            status["conditions"] = json!([{"type": "Ready", "status": s, "reason": r, "message": m}]);
        }
        if let Some(v) = version {
            status["version"] = json!(v);
        }
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
            "metadata": {"name": "banlieue-p", "namespace": ns},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn no_infra_cluster_yet_is_unknown() {
        let h = health(&[]);
        assert_eq!(
            (h.status, h.reason.as_str()),
            (ConditionStatus::Unknown, NOT_USED_YET)
        );
    }

    #[test]
    fn one_ready_infra_cluster_makes_the_provider_ready_with_its_version() {
        let h = health(&[
            cluster("a", Some(("False", "AuthenticationFailed", "401")), None),
            cluster("b", Some(("True", "Provisioned", "")), Some("8.3.2")),
        ]);
        assert_eq!(
            h,
            Health {
                status: ConditionStatus::True,
                reason: CONNECTED.into(),
                message: String::new(),
                version: Some("8.3.2".into()),
                nodes: Vec::new(),
            }
        );
    }

    #[test]
    fn the_nodes_are_the_infra_clusters_failure_domains_with_their_capacity() {
        let mut a = cluster("a", Some(("True", "Provisioned", "")), None);
        a.data["status"]["failureDomains"] = json!([
            {"name": "pve2", "attributes": {"banlieue.io/cpus": "8", "banlieue.io/memoryMiB": "16384"}},
            {"name": "pve1"},
        ]);
        let mut b = cluster("b", Some(("True", "Provisioned", "")), None);
        b.data["status"]["failureDomains"] =
            json!([{"name": "pve1", "attributes": {"banlieue.io/cpus": "4"}}]);
        let h = health(&[b, a]);
        assert_eq!(
            h.nodes,
            vec![
                ProviderNode {
                    name: "pve1".into(),
                    cpus: None,
                    memory_mib: None
                },
                ProviderNode {
                    name: "pve2".into(),
                    cpus: Some(8),
                    memory_mib: Some(16384)
                },
            ],
            "each node once, from the first cluster by namespace"
        );
    }

    #[test]
    fn otherwise_the_first_failure_says_why_and_where() {
        let h = health(&[
            cluster("z", Some(("False", "ProviderUnreachable", "refused")), None),
            cluster(
                "a",
                Some(("False", "AuthenticationFailed", "401 no ticket")),
                None,
            ),
        ]);
        assert_eq!(h.status, ConditionStatus::False);
        assert_eq!(h.reason, "AuthenticationFailed");
        assert_eq!(h.message, "in namespace a: 401 no ticket");
        let fresh = health(&[cluster("a", None, None)]);
        assert_eq!(fresh.reason, "Checking");
    }
}
