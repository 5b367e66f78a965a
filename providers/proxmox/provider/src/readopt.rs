//! Re-adoption of a VM whose ProxmoxMachine was created anew: `clusterctl move` re-creates every
//! object on the target cluster with a **new UID and no status**, and a restore from a backup
//! does the same. The VM still carries the owner marker of the old object (its UID in the
//! description and the `banlieue-uid-…` tag); the new object knows the VM only by its
//! `spec.providerID` (`proxmox://<smbios uuid>`, which does move).
//!
//! The VM is re-marked for the new object only when all of this holds, so a machine can never
//! take over a VM that was not created for it:
//! - its SMBIOS uuid is the one in `spec.providerID`;
//! - its description names **this** ProxmoxMachine (`namespace/name`, which `clusterctl move`
//!   keeps) and carries a banlieue owner marker.
//!
//! A VM with the right uuid but marked for another object is refused; no VM with that uuid means
//! the VM was deleted behind the provider's back (never re-cloned: the Machine's providerID is
//! fixed, CAPI's health checks replace it).

use std::collections::BTreeSet;

use banlieue_pve_client::{ConfigUpdate, VmConfig};

use crate::desired::{self, OWNER_DESCRIPTION_MARKER, OWNER_TAG_PREFIX};
use crate::hypervisor::Hypervisor;
use crate::phase::VmLocation;
use crate::provision::{MachineInput, StepError};

/// The object a VM is (to be) marked for.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    /// The ProxmoxMachine's UID.
    pub uid: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
}

impl<'a> From<&MachineInput<'a>> for Owner<'a> {
    fn from(input: &MachineInput<'a>) -> Self {
        Self {
            uid: input.uid,
            namespace: input.namespace,
            name: input.name,
        }
    }
}

/// Description line recording the UID a VM was re-marked from (the previous object).
pub const ADOPTED_FROM_MARKER: &str = "banlieue.io/adopted-from: ";

/// Prefix of the providerID this provider sets.
pub const PROVIDER_ID_PREFIX: &str = "proxmox://";

/// What the search for the VM named by `spec.providerID` found.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// No VM has that SMBIOS uuid.
    Missing,
    /// The VM already carries this object's owner marker.
    Owned(VmLocation),
    /// The VM was created for this object's previous incarnation: apply `update` to re-mark it.
    Remark(VmLocation, ConfigUpdate),
    /// The VM has that uuid but was not created for this machine (why).
    Foreign(VmLocation, String),
}

/// The SMBIOS uuid in a `proxmox://<uuid>` providerID (lower case).
pub fn uuid_of(provider_id: &str) -> Option<String> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|u| !u.is_empty() && !u.contains('/'))
        .map(str::to_ascii_lowercase)
}

/// The first line of [`desired::owner_description`]: names the object the VM was created for.
fn created_for_line(namespace: &str, name: &str) -> String {
    format!("Created by banlieue-proxmox for ProxmoxMachine {namespace}/{name}.")
}

/// Whether the VM's description says it was created by banlieue for `namespace/name` (any UID).
pub fn created_for(config: &VmConfig, namespace: &str, name: &str) -> bool {
    let Some(description) = config.get("description") else {
        return false;
    };
    let line = created_for_line(namespace, name);
    description.lines().any(|l| l.trim() == line)
        && description
            .lines()
            .any(|l| l.trim().starts_with(OWNER_DESCRIPTION_MARKER))
}

/// The config change that moves the VM's owner marker to `uid`: the description's marker lines
/// are replaced (other lines the user added stay), the old `banlieue-uid-…` tags are replaced by
/// the new one. Guarded by the config digest, so a concurrent change makes it fail and retry.
pub fn remark(config: &VmConfig, uid: &str, namespace: &str, name: &str) -> ConfigUpdate {
    let created = created_for_line(namespace, name);
    let description_now = config.get("description").unwrap_or_default();
    let previous = owner_uid(config);
    let kept: Vec<&str> = description_now
        .lines()
        .filter(|l| {
            let l = l.trim();
            l != created && !l.starts_with(OWNER_DESCRIPTION_MARKER) && !l.starts_with(ADOPTED_FROM_MARKER)
        })
        .collect();
    let mut description = desired::owner_description(uid, namespace, name);
    if let Some(previous) = previous {
        description.push_str(ADOPTED_FROM_MARKER);
        description.push_str(&previous);
        description.push('\n');
    }
    for line in kept {
        description.push_str(line);
        description.push('\n');
    }
    let mut tags: BTreeSet<String> = config
        .tags()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.starts_with(OWNER_TAG_PREFIX))
        .collect();
    tags.insert(desired::owner_tag(uid));
    let mut update = ConfigUpdate::default()
        .set("description", description)
        .set("tags", tags.into_iter().collect::<Vec<_>>().join(";"));
    update.digest = config.digest().map(str::to_owned);
    update
}

/// The owner UID in the VM's description marker, if any.
pub fn owner_uid(config: &VmConfig) -> Option<String> {
    description_value(config, OWNER_DESCRIPTION_MARKER)
}

fn description_value(config: &VmConfig, marker: &str) -> Option<String> {
    config
        .get("description")?
        .lines()
        .find_map(|l| l.trim().strip_prefix(marker))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Classifies a VM whose SMBIOS uuid is the one of `spec.providerID` for this machine.
pub fn classify(loc: VmLocation, config: &VmConfig, input: Owner<'_>) -> Found {
    if desired::is_owned_by(config, input.uid) {
        return Found::Owned(loc);
    }
    if description_value(config, ADOPTED_FROM_MARKER).as_deref() == Some(input.uid) {
        // A copy of this object (clusterctl move or a restore while this one still exists)
        // took the VM over: taking it back would start a tug of war between the two.
        let why = format!(
            "VM {} on {} was taken over by a copy of this machine (object uid {}), created by clusterctl move or a restore while this object still exists; refusing to take it back",
            loc.vmid,
            loc.node,
            owner_uid(config).unwrap_or_default()
        );
        return Found::Foreign(loc, why);
    }
    if created_for(config, input.namespace, input.name) {
        let update = remark(config, input.uid, input.namespace, input.name);
        return Found::Remark(loc, update);
    }
    let why = format!(
        "VM {} on {} has this machine's providerID but was not created by banlieue-proxmox for ProxmoxMachine {}/{}; refusing to adopt it",
        loc.vmid, loc.node, input.namespace, input.name
    );
    Found::Foreign(loc, why)
}

/// Finds the VM of `provider_id`. Candidates are the non-template VMs named like the machine
/// (the clone's name), then the other VMs carrying a banlieue owner tag; each candidate's config
/// is read until one has the uuid.
pub async fn find<H: Hypervisor>(hv: &H, input: Owner<'_>, provider_id: &str) -> Result<Found, StepError> {
    let reason = "AdoptionFailed";
    let uuid = uuid_of(provider_id).ok_or_else(|| StepError::Permanent {
        reason,
        message: format!("spec.providerID {provider_id:?} is not a {PROVIDER_ID_PREFIX}<uuid> ID"),
    })?;
    let guests = hv.guests().await.map_err(|e| StepError::from_pve(reason, e))?;
    let named = |g: &&crate::hypervisor::Guest| g.name.as_deref() == Some(input.name);
    let tagged = |g: &&crate::hypervisor::Guest| g.tags.iter().any(|t| t.starts_with(OWNER_TAG_PREFIX));
    let live = guests.iter().filter(|g| !g.template);
    let candidates = live
        .clone()
        .filter(named)
        .chain(live.filter(|g| !named(g) && tagged(g)));
    for guest in candidates {
        let Some(config) = hv
            .vm_config(&guest.node, guest.vmid)
            .await
            .map_err(|e| StepError::from_pve(reason, e))?
        else {
            continue;
        };
        if config.smbios_uuid().map(str::to_ascii_lowercase).as_deref() != Some(uuid.as_str()) {
            continue;
        }
        let loc = VmLocation {
            node: guest.node.clone(),
            vmid: guest.vmid,
        };
        return Ok(classify(loc, &config, input));
    }
    Ok(Found::Missing)
}

/// For a provisioned machine whose VM does not carry its owner marker: [`classify`] when the VM
/// has the machine's providerID (re-created object with its status, e.g. restored), else `None`.
pub fn classify_provisioned(loc: VmLocation, config: &VmConfig, input: &MachineInput<'_>) -> Option<Found> {
    let wanted = input.spec.provider_id.as_deref()?;
    let actual = desired::provider_id(config)?;
    (uuid_of(wanted) == uuid_of(&actual)).then(|| classify(loc, config, input.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> VmConfig {
        VmConfig(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn provider_ids_are_parsed_strictly() {
        assert_eq!(
            uuid_of("proxmox://5C1D5B3E-0000-4000-8000-000000000001").as_deref(),
            Some("5c1d5b3e-0000-4000-8000-000000000001")
        );
        assert_eq!(uuid_of("vsphere://x"), None);
        assert_eq!(uuid_of("proxmox://"), None);
        assert_eq!(uuid_of("proxmox://a/b"), None);
    }

    #[test]
    fn remarking_moves_the_marker_and_keeps_the_rest() {
        let old = desired::owner_description("old-uid", "ns", "m1");
        let description = format!("{old}notes from the operator\n");
        let before = config(&[
            ("description", &description),
            ("tags", "k8s;banlieue-uid-old-uid"),
            ("digest", "abc"),
        ]);
        assert!(created_for(&before, "ns", "m1"));
        assert!(!created_for(&before, "ns", "m2"));
        assert!(!created_for(&before, "other", "m1"));
        let update = remark(&before, "new-uid", "ns", "m1");
        assert_eq!(update.digest.as_deref(), Some("abc"));
        assert_eq!(update.set["tags"], "banlieue-uid-new-uid;k8s");
        let after = config(&[
            ("description", &update.set["description"]),
            ("tags", &update.set["tags"]),
        ]);
        assert!(desired::is_owned_by(&after, "new-uid"));
        assert!(!desired::is_owned_by(&after, "old-uid"));
        assert!(update.set["description"].ends_with("notes from the operator\n"));
        assert_eq!(
            update.set["description"]
                .matches(OWNER_DESCRIPTION_MARKER)
                .count(),
            1
        );
    }

    #[test]
    fn the_original_does_not_take_back_a_vm_its_copy_adopted() {
        let original = desired::owner_description("old-uid", "ns", "m1");
        let vm = config(&[("description", &original), ("tags", "banlieue-uid-old-uid")]);
        let loc = VmLocation {
            node: "pve1".into(),
            vmid: 100,
        };
        let copy = Owner {
            uid: "new-uid",
            namespace: "ns",
            name: "m1",
        };
        let Found::Remark(_, update) = classify(loc.clone(), &vm, copy) else {
            panic!("the copy adopts");
        };
        assert!(update.set["description"].contains("banlieue.io/adopted-from: old-uid"));
        let adopted = config(&[
            ("description", &update.set["description"]),
            ("tags", &update.set["tags"]),
        ]);
        let back = Owner {
            uid: "old-uid",
            ..copy
        };
        match classify(loc.clone(), &adopted, back) {
            Found::Foreign(_, why) => assert!(why.contains("taken over by a copy"), "{why}"),
            other => panic!("the original must not re-mark it: {other:?}"),
        }
        // A third incarnation (e.g. moved again) still adopts from the copy.
        let third = Owner {
            uid: "third-uid",
            ..copy
        };
        let Found::Remark(_, again) = classify(loc, &adopted, third) else {
            panic!("a later copy adopts");
        };
        assert_eq!(again.set["description"].matches(ADOPTED_FROM_MARKER).count(), 1);
        assert!(again.set["description"].contains("banlieue.io/adopted-from: new-uid"));
    }

    #[test]
    fn a_description_without_the_marker_is_not_ours() {
        let forged = config(&[(
            "description",
            "Created by banlieue-proxmox for ProxmoxMachine ns/m1.\n",
        )]);
        assert!(!created_for(&forged, "ns", "m1"));
    }
}
