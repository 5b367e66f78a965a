//! The LibvirtMachine's backend for the kit's InfraMachine reconciler
//! ([`banlieue_provider_kit::machine`], which owns the contract: fresh read, clusterctl move,
//! owner, pause, finalizer, waits, user data, `providerID`, conditions, Events, backoff).
//!
//! What is libvirt's: the LibvirtCluster's hosts ([`crate::hosts`], their credentials Secrets
//! recorded for the Secret watch), one step of the provisioning state machine
//! ([`crate::provision`], persisted in status by [`crate::phase`]) and deletion (after checking
//! that a domain named by the providerID of a machine created anew is its own,
//! [`crate::readopt`]).

use banlieue_api::common::ProvisioningState;
use banlieue_api::infrastructure::{LibvirtMachine, LibvirtMachineStatus};
use banlieue_provider_kit::cloud_init;
use banlieue_provider_kit::cluster::Problem;
use banlieue_provider_kit::image::Imports;
use banlieue_provider_kit::machine::{
    self as kit, Deleted, Deletion, MachineBackend, Plan, Provision, Step, StepFailure,
};
use banlieue_provider_kit::power;
use banlieue_provider_kit::progress::Guest;
use kube::ResourceExt;

use crate::desired::Settings;
use crate::error::Error;
use crate::hosts::{self, Connector};
use crate::phase::Phase;
use crate::provision::{self, MachineInput};
use crate::readopt;
use crate::xml::Owner;

/// Field manager of every write of this provider.
pub const FIELD_MANAGER: &str = "banlieue-libvirt";

/// The libvirt side of the LibvirtMachine reconciler.
pub struct LibvirtMachines<C: Connector> {
    /// Opens libvirt connections.
    pub connector: C,
    /// Provider-wide settings (domain type, serial logs, kernel boot).
    pub settings: Settings,
    /// The image imports running in this process (`spec.source.image`).
    pub imports: Imports,
}

/// The domain uuid of a machine: the one recorded in status, else its UID.
fn domain_uuid(lm: &LibvirtMachine) -> String {
    lm.status
        .as_ref()
        .and_then(|s| s.domain_uuid.clone())
        .unwrap_or_else(|| lm.uid().unwrap_or_default())
}

fn me(lm: &LibvirtMachine) -> Owner {
    Owner {
        uid: lm.uid().unwrap_or_default(),
        namespace: lm.namespace().unwrap_or_default(),
        name: lm.name_any(),
    }
}

/// The providerID of a machine created anew (clusterctl move, a restore) that has not been
/// placed yet: the domain it names is adopted, or deleted only if it is this object's.
fn adopting(lm: &LibvirtMachine) -> Option<readopt::ProviderId> {
    match lm.status.as_ref().and_then(|s| s.node.as_ref()) {
        Some(_) => None,
        None => lm
            .spec
            .provider_id
            .as_deref()
            .and_then(readopt::ProviderId::parse),
    }
}

impl<C: Connector> MachineBackend for LibvirtMachines<C> {
    type Machine = LibvirtMachine;
    type Error = Error;
    type Phase = Phase;
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;

    fn plan(&self, lm: &LibvirtMachine) -> Result<(Plan, Phase), Problem> {
        let phase = Phase::read(lm.status.as_ref())?;
        let plan = Plan {
            needs_user_data: phase.needs_bootstrap_data(),
            readopting: provision::readopts(&phase, &lm.spec),
            provisioned: matches!(phase, Phase::Provisioned { .. }),
        };
        Ok((plan, phase))
    }

    fn may_have_vm(&self, lm: &LibvirtMachine) -> bool {
        lm.status.as_ref().and_then(|s| s.node.as_ref()).is_some() || adopting(lm).is_some()
    }

    async fn provision(
        &self,
        client: &kube::Client,
        request: Provision<'_, LibvirtMachine>,
        phase: Phase,
        status: &mut LibvirtMachineStatus,
    ) -> Result<Step, StepFailure<Error>> {
        let lm = request.machine;
        let resolved = hosts::resolve(client, request.cluster, request.secrets).await;
        let host_specs = StepFailure::connected(resolved, None)?;
        let hosts = hosts::connect_all(&self.connector, &host_specs);
        let (owner, uuid) = (me(lm), domain_uuid(lm));
        let cloud_init_wait = cloud_init::Wait::recorded(&status.conditions);
        let input = MachineInput {
            owner: &owner,
            spec: &lm.spec,
            uuid: &uuid,
            failure_domain: request.view.failure_domain.as_deref(),
            settings: &self.settings,
            power: lm.spec.power_state.unwrap_or_default(),
            shutdown_requested_at: power::shutdown_requested_at(
                lm.status.as_ref().and_then(|s| s.provisioning.as_ref()),
            ),
            pool_addresses: request.pool_addresses,
            ask_cloud_init: cloud_init_wait.is_pending() || !matches!(phase, Phase::Provisioned { .. }),
            imports: &self.imports,
        };
        let user_data = request.user_data.map(|d| d.value.as_slice());
        let mut step = provision::provision(&hosts, &input, phase, user_data)
            .await
            .map_err(|e| e.into_failure(provision::PERMANENT_RETRY))?;
        if let Some(p) = &step.phase {
            p.write(status);
            status.failure_domain = p.host().map(str::to_owned);
        }
        if let Some(p) = status.provisioning.as_mut() {
            p.message.clone_from(&step.waiting);
            // A pending ACPI shutdown is remembered (forced power-off after a timeout).
            power::record_shutdown(p, step.found);
        }
        if step.power.is_some() {
            status.power_state = step.power;
        }
        // Once provisioned, what is being brought to the spec (a resize, a power change) is
        // VMUpToDate's, as on every provider.
        let provisioned = step.provisioned.is_some();
        if provisioned {
            step.up_to_date_unless_said();
        }
        let domain = format!(
            "domain {}",
            crate::desired::domain_name(&owner.namespace, &owner.name)
        );
        let guest = provisioned.then(|| Guest {
            name: &domain,
            observed: step.power,
            desired: lm.spec.power_state,
            skip_cloud_init: cloud_init::skipped(lm.spec.readiness_checks.as_ref()),
        });
        let reason = step.phase.as_ref().map_or("Unknown", Phase::reason);
        Ok(step.into_step(guest, reason, &cloud_init_wait, false))
    }

    async fn delete(
        &self,
        client: &kube::Client,
        request: Deletion<'_, LibvirtMachine>,
        status: &mut LibvirtMachineStatus,
    ) -> Result<Deleted, Error> {
        let lm = request.machine;
        let owner = me(lm);
        // Created anew (clusterctl move, a restore) and deleted before its domain was adopted:
        // the providerID names the domain. It is deleted only if it already carries this
        // object's UID; one created for an earlier object of this name is left in place (never
        // re-marked here). A providerID that does not parse names no domain: nothing to delete.
        let adopting = adopting(lm);
        let Some(host) = lm
            .status
            .as_ref()
            .and_then(|s| s.node.clone())
            .or_else(|| adopting.as_ref().map(|p| p.host.clone()))
        else {
            return Ok(Deleted::released("no domain was created"));
        };
        let spec = match hosts::resolve(client, request.cluster, request.secrets).await? {
            Ok(specs) => specs.into_iter().find(|h| h.name == host),
            Err(e) => return Ok(Deleted::Blocked(Problem::new(kit::DELETION_FAILED, e.message))),
        };
        let Some(spec) = spec else {
            if adopting.is_some() {
                // Never adopted, and its providerID names a host the cluster does not have.
                return Ok(Deleted::released(format!(
                    "spec.providerID names host {host:?}, which is not a failure domain of the LibvirtCluster: nothing deleted"
                )));
            }
            return Ok(Deleted::Blocked(Problem::new(
                kit::DELETION_FAILED,
                format!("host {host:?} is no longer a failure domain of the LibvirtCluster"),
            )));
        };
        let hv = self.connector.connect(&spec.uri);
        let mut uuid = domain_uuid(lm);
        if let Some(id) = &adopting {
            match readopt::on_deletion(&*hv, &owner, &host, &id.uuid).await? {
                readopt::OnDeletion::Delete(d) => uuid = d.vm.uuid,
                // Nothing of this object's on the host: release it, touch nothing.
                readopt::OnDeletion::Release(released) => return Ok(released),
            }
        }
        match provision::delete(&*hv, &owner, &lm.spec, &uuid).await {
            Ok(note) => Ok(Deleted::released(note)),
            Err(e) => {
                let p = status.provisioning.get_or_insert_with(Default::default);
                p.state = ProvisioningState::Deleting;
                p.message = Some(e.to_string());
                Err(e.into())
            }
        }
    }
}
