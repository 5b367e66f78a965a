//! The LibvirtCluster's backend for the kit's InfraCluster reconciler
//! ([`banlieue_provider_kit::cluster`], which owns the contract: owner, pause, finalizer,
//! deletion after the machines, endpoint, `Ready`, Events, watches).
//!
//! What is libvirt's: the hosts ([`crate::hosts`]: the LibvirtCluster's `uri` or `hosts`, or its
//! Provider's), each asked for its host info (`LibvirtConnected`: every host answers), and one
//! failure domain per reachable host. One reachable host is enough for the cluster to be usable.

use banlieue_api::common::FailureDomain;
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine};
use banlieue_provider_kit::cluster::{ClusterBackend, ClusterCheck, Problem};
use banlieue_provider_kit::secrets::ReadSecrets;

use crate::error::Error;
use crate::hosts::{self, Connector};
use crate::hypervisor::Hypervisor;
use crate::machine_controller::FIELD_MANAGER;

/// Condition type: every host answers.
pub const LIBVIRT_CONNECTED: &str = "LibvirtConnected";

/// The libvirt side of the LibvirtCluster reconciler.
pub struct LibvirtClusters<C: Connector> {
    /// Opens libvirt connections.
    pub connector: C,
}

/// The check's outcome from the hosts that answered (`up`: their failure domains) and those that
/// did not (`down`: "name: why"). Pure.
pub fn check_from_hosts(mut up: Vec<FailureDomain>, down: Vec<String>) -> ClusterCheck {
    up.sort_by(|a, b| a.name.cmp(&b.name));
    let unreachable = Problem::new("Unreachable", down.join("; "));
    let connected = if down.is_empty() {
        Ok(String::new())
    } else {
        Err(unreachable.clone())
    };
    ClusterCheck::with_domains(connected, up, unreachable)
}

impl<C: Connector> ClusterBackend for LibvirtClusters<C> {
    type Cluster = LibvirtCluster;
    type Machine = LibvirtMachine;
    type Error = Error;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;
    const CONNECTED_CONDITION: &'static str = LIBVIRT_CONNECTED;

    async fn check(
        &self,
        client: &kube::Client,
        cluster: &LibvirtCluster,
        secrets: &ReadSecrets<LibvirtCluster>,
    ) -> Result<Result<ClusterCheck, Problem>, Error> {
        let specs = banlieue_provider_kit::usable!(hosts::resolve(client, cluster, secrets).await?);
        let (mut up, mut down, mut version) = (Vec::new(), Vec::new(), None);
        for h in &specs {
            match self.connector.connect(&h.uri).host_info().await {
                Ok(info) => {
                    version.get_or_insert(info.version);
                    let domain = FailureDomain {
                        name: h.name.clone(),
                        control_plane: Some(h.control_plane),
                        attributes: None,
                    };
                    up.push(domain.with_capacity(info.cpus, info.memory_mib));
                }
                Err(e) => down.push(format!("{}: {}", h.name, e.message)),
            }
        }
        Ok(Ok(ClusterCheck {
            version,
            ..check_from_hosts(up, down)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, control_plane: bool) -> FailureDomain {
        FailureDomain {
            name: name.into(),
            control_plane: Some(control_plane),
            attributes: None,
        }
    }

    #[test]
    fn one_reachable_host_is_usable_and_every_host_must_answer_to_be_connected() {
        let partial = check_from_hosts(vec![host("b", false), host("a", true)], vec!["c: refused".into()]);
        assert_eq!(partial.usable, Ok(()));
        assert_eq!(partial.connected, Err(Problem::new("Unreachable", "c: refused")));
        let names: Vec<_> = partial
            .failure_domains
            .unwrap()
            .iter()
            .map(|d| (d.name.clone(), d.control_plane))
            .collect();
        assert_eq!(names, vec![("a".into(), Some(true)), ("b".into(), Some(false))]);
        let none = check_from_hosts(vec![], vec!["a: down".into()]);
        assert_eq!(none.usable, Err(Problem::new("Unreachable", "a: down")));
        let all = check_from_hosts(vec![host("a", true)], vec![]);
        assert_eq!(all.connected, Ok(String::new()));
    }
}
