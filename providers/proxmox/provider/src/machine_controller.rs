//! The ProxmoxMachine's backend for the kit's InfraMachine reconciler
//! ([`banlieue_provider_kit::machine`], which owns the contract: fresh read, clusterctl move,
//! owner, pause, finalizer, waits, user data, `providerID`, conditions, Events, backoff).
//!
//! What is Proxmox's: the connection (the ProxmoxCluster's, [`crate::credentials`]), one step of the provisioning state machine
//! ([`crate::provision`], persisted in status by [`crate::phase`]) with its in-process VMID
//! reservations, and deletion step by step (re-adopting a machine created anew first,
//! [`crate::readopt`]).

use std::time::SystemTime;

use banlieue_api::common::ProvisioningState;
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxMachine, ProxmoxMachineStatus};
use banlieue_provider_kit::cloud_init;
use banlieue_provider_kit::cluster::Problem;
use banlieue_provider_kit::machine::{Deleted, Deletion, MachineBackend, Plan, Provision, Step, StepFailure};
use banlieue_provider_kit::progress::Guest;
use banlieue_provider_kit::usable;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::credentials::Connector;
use crate::endpoints::{self, Connected};
use crate::error::Error;
use crate::hypervisor::Hypervisor;
use crate::phase::Phase;
use crate::provision::{self, DeleteStep, MachineInput, StepError, VmidReservations};
use crate::readopt;
use banlieue_provider_kit::connection::CREDENTIALS_INVALID;
use banlieue_provider_kit::secrets::ReadSecrets;

/// Field manager of every write of this provider.
pub const FIELD_MANAGER: &str = "banlieue-proxmox";

/// The Proxmox side of the ProxmoxMachine reconciler.
pub struct ProxmoxMachines<C: Connector> {
    /// Builds hypervisor handles from ProxmoxCluster settings.
    pub connector: C,
    /// In-process VMID reservations.
    pub reservations: VmidReservations,
    /// Storage (content `iso`) for seed ISOs.
    pub seed_storage: String,
}

/// Whether the user data must be readable before this reconcile calls Proxmox (inputs before
/// side effects): while provisioning has not cloned anything yet (node, VMID, clone) and when
/// the seed is built (Configure). Not for a machine created anew with a providerID that
/// re-adopts its VM (clusterctl move, a restore), nor once the clone runs (its later phases
/// never read it).
pub fn user_data_needed(phase: &Phase, has_provider_id: bool) -> bool {
    match phase {
        Phase::SelectNode => !has_provider_id,
        Phase::AllocateVmid { .. } | Phase::Clone(_) | Phase::Configure(..) => true,
        _ => false,
    }
}

/// The endpoint a provisioning step of `pm` uses ([`crate::endpoints`]), or why there is none:
/// the cluster's own; on a spread cluster the one kept in `status.failureDomain` once the node
/// is chosen, else the owner's failure domain, else the one holding the VM of a providerID,
/// else the roomiest.
async fn provisioning_endpoint<C: Connector>(
    client: &kube::Client,
    connector: &C,
    (pm, phase, owner_failure_domain): (&ProxmoxMachine, &Phase, Option<&str>),
    pxc: &ProxmoxCluster,
    secrets: &ReadSecrets<ProxmoxMachine>,
) -> Result<Result<Connected<C::Hv>, Problem>, Error> {
    // The connection's Secrets are watched for the machine too: fixing them wakes it at once.
    let record = |keys| secrets.record(keys);
    if !endpoints::spread(pxc) {
        return endpoints::connect(client, connector, pxc, None, record).await;
    }
    let kept = kept_endpoint(pm).filter(|_| !matches!(phase, Phase::SelectNode));
    if let Some(name) = kept.or(owner_failure_domain.filter(|f| !f.is_empty())) {
        let site = usable!(endpoints::named(pxc, name));
        return endpoints::connect(client, connector, pxc, Some(site), record).await;
    }
    let (reachable, problems) = every_endpoint(client, connector, pxc, secrets).await?;
    if reachable.is_empty() {
        return Ok(Err(unreachable(problems)));
    }
    if let Some(provider_id) = pm.spec.provider_id.as_deref() {
        // Re-adoption: the endpoint holding the VM; when every endpoint answered that none
        // does, the first one says it is missing. An endpoint that could not answer may hold
        // it: nothing is decided until it does.
        if !problems.is_empty() {
            return Ok(Err(unreachable(problems)));
        }
        let index = usable!(holding(&reachable, pm, provider_id).await).unwrap_or(0);
        return Ok(Ok(reachable.into_iter().nth(index).expect("index of reachable")));
    }
    let mut rooms = Vec::with_capacity(reachable.len());
    for endpoint in &reachable {
        rooms.push(match endpoint.hv.nodes().await {
            Ok(nodes) => endpoints::roomiest_free_memory(&endpoint.connection.allowed_nodes, &nodes),
            Err(e) => {
                tracing::debug!(endpoint = ?endpoint.site, error = %e, "nodes not listed; endpoint skipped");
                None
            }
        });
    }
    let names = reachable.iter().map(|e| e.site.as_deref().unwrap_or_default());
    let Some(chosen) = endpoints::roomiest_site(names.zip(rooms)).map(str::to_owned) else {
        return Ok(Err(Problem::new(
            endpoints::NO_ONLINE_NODE,
            "no endpoint of spec.endpoints has an allowed node online",
        )));
    };
    Ok(Ok(reachable
        .into_iter()
        .find(|e| e.site.as_deref() == Some(chosen.as_str()))
        .expect("chosen among the reachable")))
}

/// The endpoint of a spread cluster that `status.failureDomain` keeps.
fn kept_endpoint(pm: &ProxmoxMachine) -> Option<&str> {
    pm.status.as_ref().and_then(|s| s.failure_domain.as_deref())
}

/// Every endpoint of a spread cluster: those connected, and what the others lack.
async fn every_endpoint<C: Connector>(
    client: &kube::Client,
    connector: &C,
    pxc: &ProxmoxCluster,
    secrets: &ReadSecrets<ProxmoxMachine>,
) -> Result<(Vec<Connected<C::Hv>>, Vec<String>), Error> {
    let (mut reachable, mut problems) = (Vec::new(), Vec::new());
    for site in &pxc.spec.endpoints {
        match endpoints::connect(client, connector, pxc, Some(site), |keys| secrets.record(keys)).await? {
            Ok(connected) => reachable.push(connected),
            Err(problem) => problems.push(format!("{}: {}", site.name, problem.message)),
        }
    }
    Ok((reachable, problems))
}

/// Why no endpoint of a spread cluster could be used.
fn unreachable(problems: Vec<String>) -> Problem {
    Problem::new(
        CREDENTIALS_INVALID,
        format!(
            "no endpoint of spec.endpoints can be used: {}",
            problems.join("; ")
        ),
    )
}

/// Which of `reachable` holds the VM of `provider_id`: `Ok(None)` when every one answered that
/// none does (or the providerID names no VM), an error when one could not answer.
async fn holding<H: Hypervisor>(
    reachable: &[Connected<H>],
    pm: &ProxmoxMachine,
    provider_id: &str,
) -> Result<Option<usize>, Problem> {
    if readopt::uuid_of(provider_id).is_none() {
        return Ok(None);
    }
    let owner = readopt::Owner::of(pm);
    let mut failed = Vec::new();
    for (index, endpoint) in reachable.iter().enumerate() {
        match readopt::find(&endpoint.hv, owner, provider_id).await {
            Ok(readopt::Found::Missing) => {}
            Ok(_) => return Ok(Some(index)),
            Err(e) => failed.push(format!("{}: {e}", endpoint.site.as_deref().unwrap_or_default())),
        }
    }
    if failed.is_empty() {
        Ok(None)
    } else {
        Err(Problem::new(
            readopt::ADOPTION_FAILED,
            format!(
                "looking for the VM of spec.providerID {provider_id} on every endpoint: {}",
                failed.join("; ")
            ),
        ))
    }
}

/// The endpoint a deletion step of `pm` uses, with its failure-domain name on a spread
/// cluster: `None` when no VM can exist (a spread cluster's machine deleted before its endpoint
/// was kept, without a providerID to look for).
async fn deletion_endpoint<C: Connector>(
    client: &kube::Client,
    connector: &C,
    pm: &ProxmoxMachine,
    pxc: &ProxmoxCluster,
    secrets: &ReadSecrets<ProxmoxMachine>,
) -> Result<Result<Option<Connected<C::Hv>>, Problem>, Error> {
    let record = |keys| secrets.record(keys);
    if !endpoints::spread(pxc) {
        return Ok(endpoints::connect(client, connector, pxc, None, record)
            .await?
            .map(Some));
    }
    if let Some(name) = kept_endpoint(pm) {
        let site = match endpoints::named(pxc, name) {
            Ok(site) => site,
            Err(problem) => {
                let message = format!(
                    "{}: the machine's VM lives there; put the endpoint back to delete it (or delete the VM by hand and remove the finalizer)",
                    problem.message
                );
                return Ok(Err(Problem::new(problem.reason, message)));
            }
        };
        return Ok(endpoints::connect(client, connector, pxc, Some(site), record)
            .await?
            .map(Some));
    }
    let Some(provider_id) = pm.spec.provider_id.as_deref() else {
        return Ok(Ok(None));
    };
    // Created anew with a providerID and deleted before adoption: every endpoint must answer,
    // or the VM could be where nobody looked.
    let (reachable, problems) = every_endpoint(client, connector, pxc, secrets).await?;
    if !problems.is_empty() {
        return Ok(Err(unreachable(problems)));
    }
    let index = usable!(holding(&reachable, pm, provider_id).await);
    Ok(Ok(index.and_then(|i| reachable.into_iter().nth(i))))
}

impl<C: Connector> MachineBackend for ProxmoxMachines<C> {
    type Machine = ProxmoxMachine;
    type Error = Error;
    type Phase = Phase;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;

    fn plan(&self, pm: &ProxmoxMachine) -> Result<(Plan, Phase), Problem> {
        let phase = Phase::read(pm.status.as_ref())?;
        let has_provider_id = pm.spec.provider_id.is_some();
        let plan = Plan {
            needs_user_data: user_data_needed(&phase, has_provider_id),
            readopting: matches!(phase, Phase::SelectNode) && has_provider_id,
            provisioned: phase.is_provisioned(),
        };
        Ok((plan, phase))
    }

    fn may_have_vm(&self, pm: &ProxmoxMachine) -> bool {
        pm.status.as_ref().and_then(|s| s.vmid).is_some()
    }

    async fn provision(
        &self,
        client: &kube::Client,
        request: Provision<'_, ProxmoxMachine>,
        phase: Phase,
        status: &mut ProxmoxMachineStatus,
    ) -> Result<Step, StepFailure<Error>> {
        let (pm, pxc) = (request.machine, request.cluster);
        let owner_failure_domain = request.view.failure_domain.as_deref();
        let endpoint = provisioning_endpoint(
            client,
            &self.connector,
            (pm, &phase, owner_failure_domain),
            pxc,
            request.secrets,
        )
        .await;
        let Connected { hv, connection, site } =
            StepFailure::connected(endpoint, Some(provision::PERMANENT_RETRY))?;
        // Read once: the step's input, and kept in the status while the wait goes on.
        let waiting_since = guest_wait_started(Some(status));
        let cloud_init_wait = cloud_init::Wait::recorded(&status.conditions);
        // A template made from an image is searched for by the image's tag; the labels of
        // spec.tagsFromLabels are tags like the spec's.
        let mut spec = crate::image_import::effective_spec(&pm.spec);
        let label_tags = crate::desired::label_tags(pm.labels(), &pm.spec.tags_from_labels);
        if !label_tags.is_empty() {
            spec.to_mut().tags.extend(label_tags);
        }
        let input = MachineInput {
            owner: readopt::Owner::of(pm),
            spec: &spec,
            // On a spread cluster, the failure domain chose the endpoint, not the node.
            failure_domain: owner_failure_domain.filter(|_| site.is_none()),
            cluster_allowed_nodes: &connection.allowed_nodes,
            cluster_vmid_range: pxc.spec.vmid_range.as_ref(),
            seed_storage: &self.seed_storage,
            pool_addresses: request.pool_addresses,
            waiting_since,
            cloud_init_pending: cloud_init_wait.is_pending() && phase.is_provisioned(),
        };
        let from = phase.clone();
        let step = provision::provision_step(&hv, &input, phase, request.user_data, &self.reservations)
            .await
            .map_err(|e| e.into_failure(provision::PERMANENT_RETRY))?;
        let next_now = provision::next_now(&step, &from);
        step.phase.write(status);
        if let Some(p) = status.provisioning.as_mut() {
            p.message.clone_from(&step.waiting);
            // The wait for the guest keeps the time it began (the agent is asked often at first).
            if matches!(step.phase, Phase::WaitGuest(_)) {
                let since = waiting_since.unwrap_or_else(SystemTime::now);
                p.task_started_at = Some(Time(
                    Timestamp::try_from(since).unwrap_or_else(|_| Timestamp::now()),
                ));
            }
        }
        match (&site, step.phase.location()) {
            // The endpoint is kept from the moment the node is chosen: later steps find it there.
            (Some(site), _) if !matches!(step.phase, Phase::SelectNode) => {
                status.failure_domain = Some(site.clone());
            }
            (None, Some(loc)) => status.failure_domain = Some(loc.node.clone()),
            _ => {}
        }
        if let Some(power) = step.power {
            status.power_state = Some(power);
        }
        // Once provisioned, day-2 problems (a failed reconfiguration) go to `VMUpToDate`;
        // `Ready` is True while the VM exists and runs (False, `PoweredOff`, while it is off).
        let vm = (step.phase.location())
            .filter(|_| step.phase.is_provisioned())
            .map(|loc| format!("VM {}", loc.vmid));
        let guest = vm.as_deref().map(|name| Guest {
            name,
            observed: status.power_state,
            desired: pm.spec.power_state,
            skip_cloud_init: cloud_init::skipped(pm.spec.readiness_checks.as_ref()),
        });
        let reason = step.phase.reason();
        Ok(step.into_step(guest, reason, &cloud_init_wait, next_now))
    }

    async fn delete(
        &self,
        client: &kube::Client,
        request: Deletion<'_, ProxmoxMachine>,
        status: &mut ProxmoxMachineStatus,
    ) -> Result<Deleted, Error> {
        let (pm, pxc) = (request.machine, request.cluster);
        let uid = pm.uid().unwrap_or_default();
        let Connected { hv, site, .. } =
            match deletion_endpoint(client, &self.connector, pm, pxc, request.secrets).await? {
                Ok(Some(found)) => found,
                Ok(None) => {
                    self.reservations.release(&uid);
                    return Ok(Deleted::released("no VM was created"));
                }
                Err(problem) => return Ok(Deleted::Blocked(problem)),
            };
        if pm.status.as_ref().and_then(|s| s.vmid).is_none()
            && let Some(provider_id) = pm.spec.provider_id.as_deref()
        {
            // Created anew (clusterctl move, restore) and deleted before its VM was adopted. A VM
            // already marked for this object is deleted; one still marked for an earlier object
            // of this name is left alone (that object may still exist elsewhere: a leaked VM can
            // be deleted by hand, a deleted one cannot come back).
            let owner = readopt::Owner::of(pm);
            let found = match readopt::find(&hv, owner, provider_id).await {
                Ok(found) => found,
                // An unparsable providerID names no VM: nothing to delete.
                Err(StepError::Permanent { .. }) if readopt::uuid_of(provider_id).is_none() => {
                    readopt::Found::Missing
                }
                // A human must act (a token refused the listing): the VM may be there, so the
                // finalizer stays, as for the deletion itself below.
                Err(StepError::Permanent { reason, message }) => {
                    return Ok(Deleted::Blocked(Problem::new(reason, message)));
                }
                Err(e) => return Err(e.into()),
            };
            // Nothing found by the providerID: the deletion below goes by the status (no VMID:
            // nothing to delete).
            if !matches!(found, readopt::Found::Missing) {
                match readopt::on_deletion(found, String::new, readopt::WORDS) {
                    readopt::OnDeletion::Delete(c) => {
                        Phase::Provisioned(c.vm.loc).write(status);
                        // On a spread cluster, the endpoint it was found on is kept too.
                        if site.is_some() {
                            status.failure_domain = site;
                        }
                        return Ok(Deleted::Again);
                    }
                    readopt::OnDeletion::Release(released) => return Ok(released),
                }
            }
        }
        let step = match provision::delete_step(
            &hv,
            &uid,
            &self.seed_storage,
            pm.status.as_ref(),
            &self.reservations,
        )
        .await
        {
            // A human must act (a privilege the token lacks): said with its own reason, retried
            // slowly; the finalizer stays.
            Err(StepError::Permanent { reason, message }) => {
                return Ok(Deleted::Blocked(Problem::new(reason, message)));
            }
            other => other?,
        };
        match step {
            DeleteStep::Gone { note } => Ok(Deleted::released(note)),
            DeleteStep::InProgress { state, task, message } => {
                let provisioning = status.provisioning.get_or_insert_with(Default::default);
                let task_id = task.map(|t| t.to_string());
                if provisioning.task_id != task_id {
                    provisioning.task_started_at = None;
                }
                provisioning.state = state;
                provisioning.task_id = task_id;
                provisioning.message = Some(message.clone());
                Ok(Deleted::InProgress {
                    message,
                    requeue: provision::TASK_POLL,
                })
            }
        }
    }
}

/// When the machine began waiting for its guest, if it does (`WaitingForGuest` with
/// `taskStartedAt`).
fn guest_wait_started(status: Option<&ProxmoxMachineStatus>) -> Option<SystemTime> {
    let provisioning = status?.provisioning.as_ref()?;
    if provisioning.state != ProvisioningState::WaitingForGuest {
        return None;
    }
    provisioning
        .task_started_at
        .as_ref()
        .map(|t| SystemTime::from(t.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::Connection;
    use crate::fake::{FakePve, api_error};

    fn connected(site: &str, hv: FakePve) -> Connected<FakePve> {
        Connected {
            hv,
            connection: Connection {
                endpoint: format!("https://{site}.invalid:8006"),
                auth: banlieue_pve_client::Auth::Token {
                    token_id: "t@pve!t".into(),
                    secret: "s".to_owned().into(),
                },
                tls: banlieue_pve_client::TlsVerification::WebPki,
                server_name: None,
                version: String::new(),
                allowed_nodes: vec![],
            },
            site: Some(site.to_owned()),
        }
    }

    #[tokio::test]
    async fn an_endpoint_that_cannot_answer_is_never_taken_for_one_without_the_vm() {
        let spec = banlieue_api::infrastructure::ProxmoxMachineSpec::new(
            banlieue_api::infrastructure::ProxmoxTemplateSource {
                vmid: Some(9000),
                ..Default::default()
            },
            banlieue_api::common::Cpu::cores(2),
            2048,
        );
        let pm = ProxmoxMachine::new("m1", spec);
        let id = "proxmox://5e1d2c3b-0000-4000-8000-00000000a001";
        let (down, empty) = (FakePve::default(), FakePve::default());
        down.fail_next("guests", api_error(503, "service unavailable"));
        let reachable = [connected("site-a", down), connected("site-b", empty.clone())];
        let problem = holding(&reachable, &pm, id).await.unwrap_err();
        assert_eq!(problem.reason, readopt::ADOPTION_FAILED);
        assert!(problem.message.contains("site-a"), "{}", problem.message);
        // Every endpoint answered: none holds it.
        assert_eq!(holding(&reachable, &pm, id).await, Ok(None));
        // A providerID that names no VM is looked for nowhere.
        assert_eq!(holding(&reachable, &pm, "proxmox://not-a-uuid").await, Ok(None));
    }

    #[test]
    fn user_data_is_needed_before_the_clone_and_for_the_seed_only() {
        let loc = crate::phase::VmLocation {
            node: "pve1".into(),
            vmid: 101,
        };
        assert!(user_data_needed(&Phase::SelectNode, false));
        assert!(!user_data_needed(&Phase::SelectNode, true), "re-adoption");
        assert!(user_data_needed(
            &Phase::AllocateVmid { node: "pve1".into() },
            false
        ));
        assert!(user_data_needed(&Phase::Clone(loc.clone()), false));
        assert!(user_data_needed(&Phase::Configure(loc.clone(), None), true));
        assert!(!user_data_needed(&Phase::WaitGuest(loc.clone()), false));
        assert!(!user_data_needed(&Phase::Provisioned(loc), false));
    }
}
