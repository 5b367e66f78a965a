//! The VSphereMachine's backend for the kit's InfraMachine reconciler
//! ([`banlieue_provider_kit::machine`], which owns the contract: fresh read, clusterctl move,
//! owner, pause, finalizer, waits, user data, `providerID`, conditions, Events, backoff).
//!
//! What is vSphere's: the vCenter (the VSphereCluster's, [`crate::connection`]), one step of the
//! provisioning state machine ([`crate::provision`], persisted in status by [`crate::phase`]),
//! and deletion (power off, destroy; a machine created anew deletes the VM its providerID names
//! only if it carries this object's UID, [`crate::readopt`]).

use banlieue_api::common::{PowerState, ProvisioningState};

use banlieue_api::infrastructure::{
    VSphereCluster, VSphereFailureDomain, VSphereMachine, VSphereMachineStatus,
};
use banlieue_provider_kit::cloud_init;
use banlieue_provider_kit::cluster::Problem;
use banlieue_provider_kit::machine::{
    Deleted, Deletion, MachineBackend, Plan, Provision, Provisioned, Report, Step, StepFailure,
};
use banlieue_provider_kit::progress::Guest;
use banlieue_provider_kit::secrets::ReadSecrets;
use banlieue_provider_kit::usable;
use kube::ResourceExt;

use crate::connection::{self, ClientCache};
use crate::error::Error;
use crate::guest_report;
use crate::phase::{Phase, task_ref, vm_ref};
use crate::provision::{self, DeleteStep, MachineInput};
use crate::readopt;

/// Field manager of every write of this provider.
pub const FIELD_MANAGER: &str = "banlieue-vsphere";

/// The vSphere side of the VSphereMachine reconciler.
#[derive(Default)]
pub struct VSphereMachines {
    /// vSphere clients per endpoint.
    pub clients: ClientCache,
}

impl VSphereMachines {
    /// A client for the vCenter of failure domain `domain` (the VSphereCluster's unless the
    /// domain names its own), with that vCenter's server when it is the domain's own, or why
    /// there is none. `recorded`: the server the machine's status says holds its VM; another
    /// one is refused (`VCenterChanged`).
    async fn client(
        &self,
        kube: &kube::Client,
        cluster: &VSphereCluster,
        (domain, recorded): (Option<&str>, Option<&str>),
        secrets: &ReadSecrets<VSphereMachine>,
    ) -> Result<Result<(banlieue_vsphere_client::Client, Option<String>), Problem>, Error> {
        let entry = usable!(domain_entry(cluster, domain));
        // The connection's Secrets are watched for the machine too: fixing them wakes it at once.
        let endpoint =
            usable!(connection::resolve_for(kube, cluster, entry, |keys| secrets.record(keys)).await?);
        let own = entry
            .is_some_and(VSphereFailureDomain::has_own_server)
            .then(|| endpoint.server.clone());
        if let Some(recorded) = recorded
            && own.as_deref() != Some(recorded)
        {
            return Ok(Err(Problem::new(
                VCENTER_CHANGED,
                format!(
                    "this machine's VM is in vCenter {recorded}, but its failure domain {:?} now names {}: put the failure domain's server back (or delete the VM by hand and remove the finalizer)",
                    domain.unwrap_or_default(),
                    endpoint.server
                ),
            )));
        }
        Ok(self.clients.client(&endpoint).map(|client| (client, own)))
    }
}

impl MachineBackend for VSphereMachines {
    type Machine = VSphereMachine;
    type Error = Error;
    type Phase = Phase;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;

    fn plan(&self, vm: &VSphereMachine) -> Result<(Plan, Phase), Problem> {
        let phase = Phase::read(vm.status.as_ref())?;
        let cloning = matches!(phase, Phase::Clone);
        let has_provider_id = vm.spec.provider_id.is_some();
        // Configure rewrites the meta-data's network for the VM's MACs: pool addresses again.
        let configuring = matches!(phase, Phase::Configure(..));
        let plan = Plan {
            needs_user_data: (cloning || configuring) && !has_provider_id,
            readopting: cloning && has_provider_id,
            provisioned: phase.is_provisioned(),
        };
        Ok((plan, phase))
    }

    fn may_have_vm(&self, vm: &VSphereMachine) -> bool {
        vm.status
            .as_ref()
            .is_some_and(|s| s.vm_ref.is_some() || s.provisioning.is_some())
            || vm.spec.provider_id.is_some()
    }

    async fn provision(
        &self,
        kube: &kube::Client,
        request: Provision<'_, VSphereMachine>,
        phase: Phase,
        status: &mut VSphereMachineStatus,
    ) -> Result<Step, StepFailure<Error>> {
        let (vm, cluster) = (request.machine, request.cluster);
        // The failure domain kept in the status, else the owner's: its vCenter.
        let domain = status
            .failure_domain
            .as_deref()
            .or(request.view.failure_domain.as_deref());
        let recorded = status.server.clone();
        let found = (self.client(kube, cluster, (domain, recorded.as_deref()), request.secrets)).await;
        let (client, own_server) = StepFailure::connected(found, Some(provision::PERMANENT_RETRY))?;
        let name = vm.name_any();
        let input = MachineInput {
            owner: readopt::Owner::of(vm),
            spec: &vm.spec,
            cluster,
            failure_domain: domain,
            pool_addresses: request.pool_addresses,
        };
        let desired_power = vm.spec.power_state.unwrap_or(PowerState::On);
        // `None`: not read (the step says so if it needs it); `Some(None)`: no user data.
        let user_data = request
            .user_data
            .map(|d| (!d.value.is_empty()).then_some(d.value.as_slice()));
        let from = phase.clone();
        // Ready waits on the guest's cloud-init: asked when the machine is provisioned, and again
        // while the recorded wait goes on (its report is in the VM's extraConfig, read anyway).
        let cloud_init_wait = cloud_init::Wait::recorded(&status.conditions);
        let ask_cloud_init = cloud_init_wait.is_pending() || !from.is_provisioned();
        let mut step = provision::provision_step(&client, &input, phase, user_data, desired_power)
            .await
            .map_err(|e| e.into_failure(provision::PERMANENT_RETRY))?;
        let next_now = provision::next_now(&step, &from);
        step.phase.write(status);
        // Kept from the first step on: the clone may have happened in it.
        status.server = own_server;
        if let Some(fd) = &step.found.failure_domain {
            status.failure_domain = Some(fd.clone());
        } else if status.failure_domain.is_none() {
            status.failure_domain = request.view.failure_domain.clone();
        }
        let provisioned = step.phase.is_provisioned();
        if let Some(info) = &step.found.vm {
            status.addresses = provision::addresses(&name, info);
            status.power_state = info.power_state.map(|p| match p {
                banlieue_vsphere_client::VmPowerState::PoweredOn => PowerState::On,
                _ => PowerState::Off,
            });
            if let Some(host) = &info.host
                && status.node.as_deref() != Some(host.value.as_str())
            {
                status.node = Some(host.value.clone());
            }
            step.provisioned = info.bios_uuid.as_ref().map(|uuid| Provisioned {
                provider_id: format!("vsphere://{uuid}"),
                addresses: None,
            });
            // What the guest's cloud-init says, unless a change is in flight.
            if provisioned && ask_cloud_init && step.waiting.is_none() && step.failed.is_none() {
                step.cloud_init = Some(guest_report::cloud_init(&info.extra_config));
            }
        }
        // Once provisioned, drift being corrected is VMUpToDate's, as on every provider.
        if provisioned {
            step.up_to_date_unless_said();
        }
        // A settled provisioned VM gets the tags of its labels (spec.tagsFromLabels).
        if let Phase::Provisioned(vm_ref, None) = &step.phase
            && step.failed.is_none()
            && !vm.spec.tags_from_labels.is_empty()
        {
            let wanted = crate::tags::wanted(vm.labels(), &vm.spec.tags_from_labels);
            match crate::tags::sync(&client, vm_ref, &wanted).await {
                Ok(changes) if !changes.is_empty() => {
                    step.events.push((crate::tags::TAGS_CHANGED, changes.join(", ")));
                }
                Ok(_) => {}
                Err(e) => {
                    step.warning = true;
                    step.requeue = step.requeue.min(provision::TAGGING_RETRY);
                    step.up_to_date = Some(Report::new(
                        false,
                        crate::tags::TAGGING_FAILED,
                        format!("the tags of spec.tagsFromLabels: {e}"),
                    ));
                }
            }
        }
        let vm_name = format!("VM {name}");
        let guest = provisioned.then(|| Guest {
            name: &vm_name,
            observed: status.power_state,
            desired: vm.spec.power_state,
            // A VM cloned before the reporter existed says nothing: not waited for.
            skip_cloud_init: cloud_init::skipped(vm.spec.readiness_checks.as_ref())
                || (step.found.vm.as_ref()).is_some_and(|info| !guest_report::reports(&info.extra_config)),
        });
        let reason = step.phase.reason();
        Ok(step.into_step(guest, reason, &cloud_init_wait, next_now))
    }

    async fn delete(
        &self,
        kube: &kube::Client,
        request: Deletion<'_, VSphereMachine>,
        status: &mut VSphereMachineStatus,
    ) -> Result<Deleted, Error> {
        let vm = request.machine;
        let candidates = deletion_domains(request.cluster, status);
        let mut deleted = None;
        let recorded = status.server.clone();
        for domain in &candidates {
            let (client, own_server) = match self
                .client(
                    kube,
                    request.cluster,
                    (domain.as_deref(), recorded.as_deref()),
                    request.secrets,
                )
                .await?
            {
                Ok(found) => found,
                Err(problem) => return Ok(Deleted::Blocked(problem)),
            };
            // Released by one vCenter: nothing of this machine there; the next one is looked at.
            match self.delete_on(&client, vm, status).await? {
                released @ Deleted::Released { .. } => deleted = Some(released),
                other => {
                    // Where the VM was found is kept: the next steps look there.
                    if status.failure_domain.is_none() {
                        status.failure_domain.clone_from(domain);
                    }
                    status.server = own_server;
                    return Ok(other);
                }
            }
        }
        Ok(deleted.unwrap_or(Deleted::released("no VM was created")))
    }
}

/// Reason: the vCenter a machine's failure domain names is not the one holding its VM.
pub const VCENTER_CHANGED: &str = "VCenterChanged";

/// The failure domain `name` of the cluster (`None`: its own vCenter). A name missing from
/// `spec.failureDomains` is the cluster's vCenter, unless some failure domain has its own: the
/// machine's VM may then be in the missing domain's vCenter, and looking for it elsewhere could
/// take it for gone.
fn domain_entry<'a>(
    cluster: &'a VSphereCluster,
    name: Option<&str>,
) -> Result<Option<&'a VSphereFailureDomain>, Problem> {
    let Some(name) = name else { return Ok(None) };
    let domains = &cluster.spec.failure_domains;
    match domains.iter().find(|f| f.name == name) {
        Some(domain) => Ok(Some(domain)),
        None if domains.iter().any(VSphereFailureDomain::has_own_server) => Err(Problem::new(
            "FailureDomainNotFound",
            format!(
                "failure domain {name:?} is not in the VSphereCluster's spec.failureDomains, whose failure domains span several vCenters: put it back (its vCenter holds this machine's VM)"
            ),
        )),
        None => Ok(None),
    }
}

/// The failure domains (`None`: the VSphereCluster's own vCenter) whose vCenters may hold the
/// VM of a machine being deleted: the one it was placed in; for a machine created anew
/// without status (clusterctl move, a restore), every vCenter of the cluster.
fn deletion_domains(cluster: &VSphereCluster, status: &VSphereMachineStatus) -> Vec<Option<String>> {
    let placed = status.vm_ref.is_some() || status.provisioning.is_some() || status.failure_domain.is_some();
    if placed {
        return vec![status.failure_domain.clone()];
    }
    let own = cluster
        .spec
        .failure_domains
        .iter()
        .filter(|f| f.has_own_server())
        .map(|f| Some(f.name.clone()));
    std::iter::once(None).chain(own).collect()
}

impl VSphereMachines {
    /// One deletion step of `vm` on the vCenter of `client`.
    async fn delete_on(
        &self,
        client: &banlieue_vsphere_client::Client,
        vm: &VSphereMachine,
        status: &mut VSphereMachineStatus,
    ) -> Result<Deleted, Error> {
        let uid = vm.uid().unwrap_or_default();
        let mut found = status.vm_ref.as_deref().map(vm_ref);
        // A task in flight (a pending guest shutdown is not one: the VM is powered off anyway).
        let task = status
            .provisioning
            .as_ref()
            .and_then(|p| p.task_id.as_deref())
            .filter(|t| *t != banlieue_provider_kit::power::SHUTDOWN_TASK)
            .map(task_ref);
        let owner = readopt::Owner::of(vm);
        let step = match (&found, task, vm.spec.provider_id.as_deref()) {
            // Created anew (clusterctl move, a restore) and deleted before its VM was adopted:
            // the VM is deleted only if it already carries this object's UID; one created for
            // an earlier object of this name is left in place (never re-marked here).
            (None, None, Some(provider_id)) => {
                match readopt::on_deletion(client, owner, provider_id).await? {
                    readopt::OnDeletion::Delete(candidate) => {
                        found = Some(candidate.vm.vm);
                        provision::delete_step(client, &uid, found.clone(), None).await?
                    }
                    readopt::OnDeletion::Release(released) => {
                        // Still nothing carrying this object's UID may be left behind.
                        match provision::delete_step(client, &uid, None, None).await? {
                            DeleteStep::Gone => return Ok(released),
                            other => other,
                        }
                    }
                }
            }
            (_, task, _) => provision::delete_step(client, &uid, found.clone(), task).await?,
        };
        match step {
            DeleteStep::Gone => Ok(Deleted::released("VM deleted in vCenter")),
            DeleteStep::Wait(task, what) => {
                status.vm_ref = status.vm_ref.take().or(found.map(|v| v.value));
                let prov = status.provisioning.get_or_insert_with(Default::default);
                prov.state = ProvisioningState::Deleting;
                if prov.task_id.as_deref() != Some(task.value.as_str()) {
                    prov.task_started_at = None;
                }
                prov.task_id = Some(task.value.clone());
                Ok(Deleted::InProgress {
                    message: what.to_owned(),
                    requeue: provision::TASK_POLL,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::infrastructure::VSphereClusterSpec;

    fn cluster(remote: bool) -> VSphereCluster {
        let domain = |name: &str, server: Option<&str>| VSphereFailureDomain {
            name: name.into(),
            compute_cluster: "c".into(),
            server: server.map(str::to_owned),
            ..Default::default()
        };
        VSphereCluster::new(
            "c",
            VSphereClusterSpec {
                failure_domains: vec![
                    domain("az1", None),
                    domain("az2", remote.then_some("vc2.example.com")),
                ],
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_missing_failure_domain_is_refused_only_when_domains_span_vcenters() {
        assert_eq!(domain_entry(&cluster(true), None), Ok(None));
        assert_eq!(
            domain_entry(&cluster(true), Some("az2")).map(|d| d.map(|d| d.name.as_str())),
            Ok(Some("az2"))
        );
        assert_eq!(
            domain_entry(&cluster(false), Some("gone")),
            Ok(None),
            "one vCenter: the cluster's"
        );
        let problem = domain_entry(&cluster(true), Some("gone")).unwrap_err();
        assert_eq!(problem.reason, "FailureDomainNotFound");
        assert!(problem.message.contains("put it back"), "{}", problem.message);
    }

    #[test]
    fn a_machine_without_status_is_looked_for_in_every_vcenter() {
        let fresh = VSphereMachineStatus::default();
        assert_eq!(
            deletion_domains(&cluster(true), &fresh),
            [None, Some("az2".to_owned())]
        );
        assert_eq!(deletion_domains(&cluster(false), &fresh), [None]);
        let placed = VSphereMachineStatus {
            failure_domain: Some("az2".into()),
            ..Default::default()
        };
        assert_eq!(
            deletion_domains(&cluster(true), &placed),
            [Some("az2".to_owned())]
        );
    }
}
