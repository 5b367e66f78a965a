//! Proxmox VE High Availability for a provisioned machine (`spec.highAvailability`): its VM is
//! made an HA resource (`vm:<vmid>`) with the machine's settings, joins the HA rules the spec
//! names, and stops being one when the field goes (only a resource the provider added, told by
//! its comment). Moving with HA is followed by the provisioning steps like any migration; the
//! destroy's `purge` takes the VM out of HA and its rules.
//!
//! Every call here is synchronous (no task). A machine without the field whose VM is not an HA
//! resource costs no call: `status/current` already says whether it is one.

use banlieue_api::infrastructure::HighAvailability;
use banlieue_pve_client::{HaResource, HaResourceSettings, vm_sid};

use crate::hypervisor::{Hypervisor, PveError};
use crate::phase::VmLocation;

/// The comment marking an HA resource the provider added: `banlieue: <namespace>/<name>`.
pub fn comment(namespace: &str, name: &str) -> String {
    format!("{COMMENT_PREFIX} {namespace}/{name}")
}

const COMMENT_PREFIX: &str = "banlieue:";

/// Whether the provider added `resource` (its comment says so).
fn added_by_us(resource: &HaResource) -> bool {
    resource
        .comment
        .as_deref()
        .is_some_and(|c| c.starts_with(COMMENT_PREFIX))
}

/// What the VM's HA resource needs changed to match `wanted`: `None` when nothing. Unset limits
/// are PVE's default (1); the requested state is the power state's and left to the start and
/// stop calls (PVE turns them into HA requests for an HA resource).
pub fn settings_change(wanted: &HighAvailability, current: &HaResource) -> Option<HaResourceSettings> {
    let differs =
        |want: Option<u32>, have: Option<u64>| want.is_some_and(|w| u64::from(w) != have.unwrap_or(1));
    let change = HaResourceSettings {
        max_restart: wanted
            .max_restart
            .filter(|_| differs(wanted.max_restart, current.max_restart)),
        max_relocate: wanted
            .max_relocate
            .filter(|_| differs(wanted.max_relocate, current.max_relocate)),
        ..HaResourceSettings::default()
    };
    (change != HaResourceSettings::default()).then_some(change)
}

/// The settings of a new HA resource for the machine's VM, in the power state it is in.
pub fn new_resource(comment: &str, wanted: &HighAvailability, running: bool) -> HaResourceSettings {
    HaResourceSettings {
        state: Some(if running { "started" } else { "stopped" }.to_owned()),
        comment: Some(comment.to_owned()),
        max_restart: wanted.max_restart,
        max_relocate: wanted.max_relocate,
    }
}

/// What converging did: changes made (for an Event), or what a human must fix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// What was changed, for the `HighAvailability` Event.
    pub changed: Vec<String>,
    /// A rule the spec names that Proxmox does not have (`VMUpToDate` says so).
    pub missing_rule: Option<String>,
}

/// Makes the VM's HA membership match `wanted` (the spec's `highAvailability`); `comment`
/// marks a resource the provider adds ([`comment`]). `managed`: whether `status/current`
/// reported the VM an HA resource; `running`: whether it runs.
pub async fn converge<H: Hypervisor>(
    hv: &H,
    wanted: Option<&HighAvailability>,
    comment: &str,
    loc: &VmLocation,
    managed: bool,
    running: bool,
) -> Result<Outcome, PveError> {
    let mut outcome = Outcome::default();
    if wanted.is_none() && !managed {
        return Ok(outcome);
    }
    let current = if managed {
        hv.ha_resource(loc.vmid).await?
    } else {
        None
    };
    let Some(wanted) = wanted else {
        if let Some(resource) = current.filter(added_by_us) {
            hv.delete_ha_resource(loc.vmid).await?;
            outcome.changed.push(format!("removed {} from HA", resource.sid));
        }
        return Ok(outcome);
    };
    let sid = vm_sid(loc.vmid);
    match current {
        None => {
            hv.create_ha_resource(loc.vmid, &new_resource(comment, wanted, running))
                .await?;
            outcome.changed.push(format!("added {sid} to HA"));
        }
        Some(resource) => {
            if let Some(change) = settings_change(wanted, &resource) {
                hv.update_ha_resource(loc.vmid, &change).await?;
                outcome
                    .changed
                    .push(format!("set {sid}'s restart and relocate limits"));
            }
        }
    }
    for name in &wanted.rules {
        let Some(rule) = hv.ha_rule(name).await? else {
            outcome.missing_rule = Some(name.clone());
            continue;
        };
        let mut resources: Vec<String> = rule.resource_ids().into_iter().map(str::to_owned).collect();
        if resources.contains(&sid) {
            continue;
        }
        resources.push(sid.clone());
        hv.set_ha_rule_resources(&rule, &resources).await?;
        outcome.changed.push(format!("added {sid} to HA rule {name}"));
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(max_restart: Option<u64>, max_relocate: Option<u64>) -> HaResource {
        HaResource {
            sid: "vm:100".into(),
            max_restart,
            max_relocate,
            ..HaResource::default()
        }
    }

    #[test]
    fn unset_limits_and_pves_defaults_need_no_change() {
        let wanted = HighAvailability::default();
        assert_eq!(settings_change(&wanted, &resource(None, None)), None);
        let one = HighAvailability {
            max_restart: Some(1),
            max_relocate: Some(1),
            ..HighAvailability::default()
        };
        assert_eq!(settings_change(&one, &resource(None, None)), None);
    }

    #[test]
    fn a_limit_that_differs_is_the_only_one_set() {
        let wanted = HighAvailability {
            max_restart: Some(3),
            max_relocate: Some(1),
            ..HighAvailability::default()
        };
        let change = settings_change(&wanted, &resource(Some(1), None)).expect("a change");
        assert_eq!(change.max_restart, Some(3));
        assert_eq!(change.max_relocate, None);
        assert_eq!(change.state, None);
    }
}
