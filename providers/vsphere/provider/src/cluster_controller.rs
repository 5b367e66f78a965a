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
use banlieue_provider_kit::cluster::{ClusterBackend, ClusterCheck, Problem};
use banlieue_provider_kit::secrets::ReadSecrets;
use banlieue_provider_kit::usable;

use crate::connection::{self, ClientCache};
use crate::error::{Error, reason_of};
use crate::machine_controller::FIELD_MANAGER;
use crate::provision::under;

/// Condition type: vCenter accepts the credentials.
pub const VSPHERE_CONNECTED: &str = "VSphereConnected";

/// The vSphere side of the VSphereCluster reconciler.
#[derive(Default)]
pub struct VSphereClusters {
    /// vSphere clients per endpoint.
    pub clients: ClientCache,
}

fn problem(e: &banlieue_vsphere_client::Error) -> Problem {
    Problem::new(reason_of(e), e.to_string())
}

/// The connection note of failure domain `name` left out for `p`.
fn left_out(name: &str, p: Problem) -> String {
    format!("failure domain {name} left out ({}): {}", p.reason, p.message)
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
            Err(e) => Err(problem(&e)),
        })
    }
}

impl ClusterBackend for VSphereClusters {
    type Cluster = VSphereCluster;
    type Machine = VSphereMachine;
    type Error = Error;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;
    const CONNECTED_CONDITION: &'static str = VSPHERE_CONNECTED;

    async fn check(
        &self,
        client: &kube::Client,
        vsc: &VSphereCluster,
        secrets: &ReadSecrets<VSphereCluster>,
    ) -> Result<Result<ClusterCheck, Problem>, Error> {
        let (vcenter, endpoint) = usable!(self.logged_in(client, vsc, None, secrets).await?);
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
                Err(e) => return Ok(Err(problem(&e))),
                Ok(None) => {
                    return Ok(Ok(not_usable(Problem::new(
                        "DatacenterNotFound",
                        format!("datacenter {dc:?} not found in vCenter"),
                    ))));
                }
                Ok(Some(_)) => {}
            }
        }
        let (mut domains, mut notes) = (Vec::new(), Vec::new());
        for fd in &vsc.spec.failure_domains {
            let datacenter = fd.datacenter.as_deref().or(vsc.spec.datacenter.as_deref());
            let path = under(datacenter.unwrap_or_default(), "host", &fd.compute_cluster);
            // A failure domain in another vCenter that cannot be used is left out (and said),
            // the others stay usable.
            let own = fd.has_own_server();
            let vc = if own {
                match self.logged_in(client, vsc, Some(fd), secrets).await? {
                    Ok((vc, _)) => vc,
                    Err(problem) => {
                        notes.push(left_out(&fd.name, problem));
                        continue;
                    }
                }
            } else {
                vcenter.clone()
            };
            match vc.find_by_inventory_path(&path).await {
                Err(e) if own => notes.push(left_out(&fd.name, problem(&e))),
                Err(e) => return Ok(Err(problem(&e))),
                Ok(None) => {
                    return Ok(Ok(not_usable(Problem::new(
                        "FailureDomainNotFound",
                        format!("failure domain {:?}: compute cluster {path:?} not found", fd.name),
                    ))));
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
        Ok(Ok(ClusterCheck {
            connected: Ok(notes.join("; ")),
            usable: Ok(()),
            failure_domains: Some(domains),
            version,
            insecure_tls,
        }))
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
