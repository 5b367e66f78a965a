//! The VSphereCluster's backend for the kit's InfraCluster reconciler
//! ([`banlieue_provider_kit::cluster`], which owns the contract: owner, pause, finalizer,
//! deletion after the machines, endpoint, `Ready`, Events, watches).
//!
//! What is vSphere's: the vCenter (the VSphereCluster's `server` and credentials Secret, or its
//! Provider's), a login (`VSphereConnected`), `status.version` (vCenter's API version), the
//! datacenter checked, and the failure domains (compute clusters) checked and published; a
//! failure domain in another vCenter (its own `server` or `providerRef`) is checked there, and
//! left out, with a note on `VSphereConnected`, while that vCenter cannot be used.

use banlieue_api::common::FailureDomain;
use banlieue_api::infrastructure::{VSphereCluster, VSphereFailureDomain, VSphereMachine};
use banlieue_provider_kit::cluster::{self as kit, ClusterBackend, ClusterCheck, Problem};
use banlieue_provider_kit::secrets::ReadSecrets;
use banlieue_provider_kit::usable;

use crate::connection::{self, ClientCache};
use crate::error::Error;
use crate::error::reason_of;
use crate::machine_controller::{FIELD_MANAGER, FINALIZER};

/// Condition type: vCenter accepts the credentials.
pub const VSPHERE_CONNECTED: &str = "VSphereConnected";

/// The vSphere side of the VSphereCluster reconciler.
#[derive(Default)]
pub struct VSphereClusters {
    /// vSphere clients per endpoint.
    pub clients: ClientCache,
}

/// Shared state of the VSphereCluster controller.
pub type ClusterContext = kit::ClusterContext<VSphereClusters>;

/// The VSphereCluster controller's context, reporting Events as `reporter`.
pub fn context(client: kube::Client, reporter: &str) -> ClusterContext {
    kit::ClusterContext::new(client, VSphereClusters::default(), reporter)
}

fn failed(e: &banlieue_vsphere_client::Error) -> ClusterCheck {
    ClusterCheck::failed(Problem::new(reason_of(e), e.to_string()))
}

/// The inventory path of a failure domain's compute cluster: absolute as given, else under the
/// datacenter's `host` folder (pure).
pub fn compute_cluster_path(datacenter: Option<&str>, compute_cluster: &str) -> String {
    if compute_cluster.starts_with('/') {
        compute_cluster.to_owned()
    } else {
        format!("/{}/host/{compute_cluster}", datacenter.unwrap_or_default())
    }
}

impl VSphereClusters {
    /// A logged-in client for the vCenter of failure domain `fd` (`None`, or a domain without
    /// its own: the VSphereCluster's), with its endpoint, or why there is none.
    async fn logged_in(
        &self,
        client: &kube::Client,
        vsc: &VSphereCluster,
        fd: Option<&VSphereFailureDomain>,
        secrets: &ReadSecrets<VSphereCluster>,
    ) -> Result<Result<(banlieue_vsphere_client::Client, connection::Endpoint), Problem>, Error> {
        let endpoint = usable!(connection::resolve_for(client, vsc, fd, |keys| secrets.record(keys)).await?);
        let vc = usable!(self.clients.client(&endpoint));
        Ok(match vc.login_if_needed().await {
            Ok(()) => Ok((vc, endpoint)),
            Err(e) => Err(Problem::new(reason_of(&e), e.to_string())),
        })
    }
}

impl ClusterBackend for VSphereClusters {
    type Cluster = VSphereCluster;
    type Machine = VSphereMachine;
    type Error = Error;
    const FINALIZER: &'static str = FINALIZER;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;
    const CONNECTED_CONDITION: &'static str = VSPHERE_CONNECTED;

    async fn check(
        &self,
        client: &kube::Client,
        vsc: &VSphereCluster,
        secrets: &ReadSecrets<VSphereCluster>,
    ) -> Result<ClusterCheck, Error> {
        let (vcenter, endpoint) = match self.logged_in(client, vsc, None, secrets).await? {
            Ok(found) => found,
            Err(p) => return Ok(ClusterCheck::failed(p)),
        };
        let version = vcenter
            .service_content()
            .await
            .ok()
            .map(|c| c.api_version.clone());
        let insecure_tls = matches!(
            endpoint.tls,
            banlieue_vsphere_client::TlsVerification::InsecureSkipVerify
        );
        let not_usable = |problem: Problem| ClusterCheck {
            connected: Ok(String::new()),
            usable: Err(problem),
            failure_domains: None,
            version: version.clone(),
            insecure_tls,
        };
        if let Some(dc) = &vsc.spec.datacenter {
            match vcenter.find_by_inventory_path(&format!("/{dc}")).await {
                Err(e) => return Ok(failed(&e)),
                Ok(None) => {
                    return Ok(not_usable(Problem::new(
                        "DatacenterNotFound",
                        format!("datacenter {dc:?} not found in vCenter"),
                    )));
                }
                Ok(Some(_)) => {}
            }
        }
        let (mut domains, mut notes) = (Vec::new(), Vec::new());
        for fd in &vsc.spec.failure_domains {
            let datacenter = fd.datacenter.as_deref().or(vsc.spec.datacenter.as_deref());
            let path = compute_cluster_path(datacenter, &fd.compute_cluster);
            // A failure domain in another vCenter that cannot be used is left out (and said),
            // the others stay usable.
            let own = fd.has_own_server();
            let vc = if own {
                match self.logged_in(client, vsc, Some(fd), secrets).await? {
                    Ok((vc, _)) => vc,
                    Err(problem) => {
                        notes.push(format!(
                            "failure domain {} left out ({}): {}",
                            fd.name, problem.reason, problem.message
                        ));
                        continue;
                    }
                }
            } else {
                vcenter.clone()
            };
            match vc.find_by_inventory_path(&path).await {
                Err(e) if own => {
                    notes.push(format!(
                        "failure domain {} left out ({}): {e}",
                        fd.name,
                        reason_of(&e)
                    ));
                }
                Err(e) => return Ok(failed(&e)),
                Ok(None) => {
                    return Ok(not_usable(Problem::new(
                        "FailureDomainNotFound",
                        format!("failure domain {:?}: compute cluster {path:?} not found", fd.name),
                    )));
                }
                Ok(Some(compute)) => {
                    // A failed read keeps what was published (no status churn on a blip).
                    let published = vsc
                        .status
                        .as_ref()
                        .and_then(|s| s.failure_domains.iter().find(|d| d.name == fd.name))
                        .map_or((None, None), FailureDomain::capacity);
                    let (cpus, memory_mib) = capacity(&vc, &compute).await.unwrap_or(published);
                    let domain = FailureDomain {
                        name: fd.name.clone(),
                        control_plane: Some(fd.control_plane.unwrap_or(true)),
                        attributes: (!fd.attributes.is_empty()).then(|| fd.attributes.clone()),
                    };
                    domains.push(domain.with_capacity(cpus, memory_mib));
                }
            }
        }
        Ok(ClusterCheck {
            connected: Ok(notes.join("; ")),
            usable: Ok(()),
            failure_domains: Some(domains),
            version,
            insecure_tls,
        })
    }
}

/// A compute cluster's CPU cores and memory in MiB (`summary.numCpuCores`,
/// `summary.totalMemory`); `None` when vCenter could not be asked. Capacity is informative: a
/// failed read never fails the check.
async fn capacity(
    vcenter: &banlieue_vsphere_client::Client,
    compute: &banlieue_vsphere_client::MoRef,
) -> Option<(Option<u32>, Option<u64>)> {
    const CPUS: &str = "summary.numCpuCores";
    const MEMORY: &str = "summary.totalMemory";
    let props = vcenter.properties(compute, &[CPUS, MEMORY]).await.ok()??;
    let number = |path: &str| props.get(path).and_then(|e| e.text.trim().parse::<u64>().ok());
    Some((
        number(CPUS).and_then(|c| u32::try_from(c).ok()),
        number(MEMORY).map(|bytes| bytes >> 20),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_clusters_are_found_under_the_datacenter_unless_absolute() {
        assert_eq!(compute_cluster_path(Some("DC0"), "C0"), "/DC0/host/C0");
        assert_eq!(compute_cluster_path(Some("DC0"), "/DC1/host/C1"), "/DC1/host/C1");
    }
}
