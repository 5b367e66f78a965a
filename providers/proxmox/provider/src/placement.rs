//! Node choice for a new VM (pure).
//!
//! Order of precedence: the ProxmoxMachine's `spec.targetNode`; else the Machine's
//! `spec.failureDomain` (a node name: the ProxmoxCluster publishes one failure domain per
//! allowed node); else the online allowed node with the most free memory (ties: by name, so the
//! choice is deterministic), among the nodes the template can be cloned to: only its own when a
//! disk of it is on storage the nodes do not share (Proxmox VE refuses the clone elsewhere). A
//! node's free memory is what it reports free less the configured memory of its guests that do
//! not run yet ([`reserve_for_stopped_guests`]).

use crate::hypervisor::{Guest, NodeLoad};

/// Why no node could be chosen. Every variant is permanent until the spec, the Machine or the
/// Proxmox cluster changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The requested node is not in the allowed set.
    #[error("{what} {node:?} is not an allowed node (allowed: {allowed})")]
    NotAllowed {
        /// `spec.targetNode` or `failure domain`.
        what: &'static str,
        /// The requested node.
        node: String,
        /// The allowed nodes, comma-separated.
        allowed: String,
    },
    /// The requested node does not exist or is offline.
    #[error("{what} {node:?} is not an online Proxmox node")]
    NotOnline {
        /// `spec.targetNode` or `failure domain`.
        what: &'static str,
        /// The requested node.
        node: String,
    },
    /// No allowed node is online.
    #[error("no allowed Proxmox node is online (allowed: {allowed})")]
    NoneOnline {
        /// The allowed nodes, comma-separated, or `any`.
        allowed: String,
    },
    /// The template can be cloned on its own node only, which cannot be used.
    #[error(
        "the template has disks on storage local to node {node:?} (Proxmox VE clones it to that node only), \
         which is not an online allowed node (allowed: {allowed}): move the template's disks to shared \
         storage, keep a template on each node, or allow {node:?}"
    )]
    TemplateNodeUnavailable {
        /// The template's node.
        node: String,
        /// The allowed nodes, comma-separated, or `any`.
        allowed: String,
    },
}

/// What placement depends on.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlacementInput<'a> {
    /// ProxmoxMachine `spec.targetNode`.
    pub target_node: Option<&'a str>,
    /// Machine `spec.failureDomain`.
    pub failure_domain: Option<&'a str>,
    /// ProxmoxMachine `spec.allowedNodes` (narrows the cluster's; empty = no narrowing).
    pub machine_allowed: &'a [String],
    /// ProxmoxCluster `spec.allowedNodes` (empty = every node).
    pub cluster_allowed: &'a [String],
    /// The template's node when it has a disk on storage the nodes do not share: the only node
    /// a VM without a requested node may go to.
    pub template_node: Option<&'a str>,
}

impl PlacementInput<'_> {
    fn allows(&self, node: &str) -> bool {
        let in_list = |list: &[String]| list.is_empty() || list.iter().any(|n| n == node);
        in_list(self.cluster_allowed) && in_list(self.machine_allowed)
    }

    fn allowed_text(&self) -> String {
        let lists: Vec<&[String]> = [self.cluster_allowed, self.machine_allowed]
            .into_iter()
            .filter(|l| !l.is_empty())
            .collect();
        match lists.as_slice() {
            [] => "any".to_owned(),
            [one] => one.join(","),
            [a, b] => {
                let both: Vec<&str> = a.iter().filter(|n| b.contains(n)).map(String::as_str).collect();
                both.join(",")
            }
            _ => unreachable!("at most two lists"),
        }
    }
}

/// Chooses the node for a new VM.
pub fn choose_node(input: &PlacementInput<'_>, nodes: &[NodeLoad]) -> Result<String, PlacementError> {
    let requested = input.target_node.map(|n| ("spec.targetNode", n)).or(input
        .failure_domain
        .filter(|f| !f.is_empty())
        .map(|f| ("failure domain", f)));
    if let Some((what, node)) = requested {
        if !input.allows(node) {
            return Err(PlacementError::NotAllowed {
                what,
                node: node.to_owned(),
                allowed: input.allowed_text(),
            });
        }
        return match nodes.iter().find(|n| n.name == node) {
            Some(n) if n.online => Ok(n.name.clone()),
            _ => Err(PlacementError::NotOnline {
                what,
                node: node.to_owned(),
            }),
        };
    }
    let candidates = nodes
        .iter()
        .filter(|n| n.online && input.allows(&n.name))
        .filter(|n| input.template_node.is_none_or(|t| t == n.name))
        .map(|n| (n.name.as_str(), Some(n.free_memory)));
    banlieue_provider_kit::placement::roomiest(candidates)
        .map(str::to_owned)
        .ok_or_else(|| match input.template_node {
            Some(node) => PlacementError::TemplateNodeUnavailable {
                node: node.to_owned(),
                allowed: input.allowed_text(),
            },
            None => PlacementError::NoneOnline {
                allowed: input.allowed_text(),
            },
        })
}

/// `nodes` with the configured memory of their guests that do not run (templates aside) taken
/// off their free memory: such a guest (being cloned, or stopped) uses its memory once it starts,
/// which its node does not count as used yet. So machines created together spread over the nodes
/// instead of all choosing the one that looked freest before any of them started.
pub fn reserve_for_stopped_guests(mut nodes: Vec<NodeLoad>, guests: &[Guest]) -> Vec<NodeLoad> {
    for node in &mut nodes {
        let reserved: u64 = guests
            .iter()
            .filter(|g| g.node == node.name && !g.template && !g.running)
            .map(|g| g.memory)
            .sum();
        node.free_memory = node.free_memory.saturating_sub(reserved);
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn node(name: &str, online: bool, free_gib: u64) -> NodeLoad {
        NodeLoad {
            name: name.into(),
            online,
            free_memory: free_gib << 30,
            cpus: None,
            memory_mib: None,
        }
    }

    fn nodes() -> Vec<NodeLoad> {
        vec![
            node("pve1", true, 8),
            node("pve2", true, 32),
            node("pve3", false, 64),
            node("pve4", true, 32),
        ]
    }

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[rstest]
    #[case::least_loaded_online_tie_by_name(None, None, &[], &[], "pve2")]
    #[case::offline_node_with_most_memory_is_skipped(None, None, &["pve3", "pve1"], &[], "pve1")]
    #[case::cluster_allowed_narrows(None, None, &["pve1", "pve4"], &[], "pve4")]
    #[case::machine_allowed_narrows_further(None, None, &["pve1", "pve2", "pve4"], &["pve1"], "pve1")]
    #[case::failure_domain_wins_over_load(None, Some("pve1"), &[], &[], "pve1")]
    #[case::empty_failure_domain_is_unset(None, Some(""), &[], &[], "pve2")]
    #[case::target_node_wins_over_failure_domain(Some("pve4"), Some("pve1"), &[], &[], "pve4")]
    fn chooses(
        #[case] target: Option<&str>,
        #[case] fd: Option<&str>,
        #[case] cluster: &[&str],
        #[case] machine: &[&str],
        #[case] want: &str,
    ) {
        let (cluster, machine) = (list(cluster), list(machine));
        let input = PlacementInput {
            target_node: target,
            failure_domain: fd,
            machine_allowed: &machine,
            cluster_allowed: &cluster,
            template_node: None,
        };
        assert_eq!(choose_node(&input, &nodes()).unwrap(), want);
    }

    #[test]
    fn failure_domain_outside_the_allowed_nodes_is_refused() {
        let cluster = list(&["pve1", "pve2"]);
        let input = PlacementInput {
            failure_domain: Some("pve4"),
            cluster_allowed: &cluster,
            ..PlacementInput::default()
        };
        let err = choose_node(&input, &nodes()).unwrap_err();
        assert_eq!(
            err,
            PlacementError::NotAllowed {
                what: "failure domain",
                node: "pve4".into(),
                allowed: "pve1,pve2".into()
            }
        );
        assert!(err.to_string().contains("pve1,pve2"), "{err}");
    }

    #[rstest]
    #[case::offline("pve3")]
    #[case::unknown("pve9")]
    fn requested_node_must_be_online(#[case] wanted: &str) {
        let input = PlacementInput {
            failure_domain: Some(wanted),
            ..PlacementInput::default()
        };
        assert!(matches!(
            choose_node(&input, &nodes()),
            Err(PlacementError::NotOnline { node, .. }) if node == wanted
        ));
    }

    #[test]
    fn no_online_allowed_node_is_an_error_naming_the_intersection() {
        let (cluster, machine) = (list(&["pve3", "pve1"]), list(&["pve3"]));
        let input = PlacementInput {
            cluster_allowed: &cluster,
            machine_allowed: &machine,
            ..PlacementInput::default()
        };
        assert_eq!(
            choose_node(&input, &nodes()).unwrap_err(),
            PlacementError::NoneOnline {
                allowed: "pve3".into()
            }
        );
        assert!(matches!(
            choose_node(&PlacementInput::default(), &[]),
            Err(PlacementError::NoneOnline { allowed }) if allowed == "any"
        ));
    }
}

#[cfg(test)]
mod storage_and_reservation_tests {
    use super::*;

    fn node(name: &str, online: bool) -> NodeLoad {
        NodeLoad {
            name: name.into(),
            online,
            free_memory: 56 << 30,
            cpus: None,
            memory_mib: None,
        }
    }

    fn guest(node: &str, memory_gib: u64, running: bool, template: bool) -> Guest {
        Guest {
            node: node.into(),
            vmid: 100,
            name: None,
            template,
            tags: vec![],
            memory: memory_gib << 30,
            running,
            reported: true,
        }
    }

    #[test]
    fn guests_that_do_not_run_yet_take_their_memory_off_their_node() {
        let guests = [
            guest("pve1", 4, false, false), // being cloned
            guest("pve1", 8, true, false),  // running: already in the node's used memory
            guest("pve2", 2, false, true),  // a template never starts
            guest("pve3", 64, false, false),
        ];
        let nodes = vec![node("pve1", true), node("pve2", true), node("pve3", true)];
        let free: Vec<u64> = reserve_for_stopped_guests(nodes, &guests)
            .iter()
            .map(|n| n.free_memory >> 30)
            .collect();
        assert_eq!(free, [52, 56, 0]);
        let nodes = reserve_for_stopped_guests(vec![node("pve1", true), node("pve2", true)], &guests[..1]);
        assert_eq!(
            choose_node(&PlacementInput::default(), &nodes).unwrap(),
            "pve2",
            "the clone in flight on pve1 counts"
        );
    }

    #[test]
    fn a_template_on_local_storage_keeps_machines_on_its_node_or_says_why_not() {
        let nodes = vec![node("pve1", true), node("pve2", true), node("pve3", false)];
        let pinned = |t| PlacementInput {
            template_node: Some(t),
            ..PlacementInput::default()
        };
        assert_eq!(choose_node(&pinned("pve2"), &nodes).unwrap(), "pve2");
        let err = choose_node(&pinned("pve3"), &nodes).unwrap_err();
        assert_eq!(
            err,
            PlacementError::TemplateNodeUnavailable {
                node: "pve3".into(),
                allowed: "any".into()
            }
        );
        assert!(err.to_string().contains("shared storage"), "{err}");
        // A node asked for explicitly is the user's choice (the clone reports a refusal).
        let asked = PlacementInput {
            failure_domain: Some("pve1"),
            template_node: Some("pve2"),
            ..PlacementInput::default()
        };
        assert_eq!(choose_node(&asked, &nodes).unwrap(), "pve1");
    }
}
