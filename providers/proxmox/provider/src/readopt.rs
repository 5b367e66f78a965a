//! Re-adoption of a VM whose ProxmoxMachine was created anew (`clusterctl move`, a restore):
//! the decision is the kit's ([`banlieue_provider_kit::readopt`]); this module reads and writes
//! the marks. A VM is marked in its description (the line naming the ProxmoxMachine, the
//! [`OWNER_DESCRIPTION_MARKER`] line with its UID, an [`ADOPTED_FROM_MARKER`] line after a
//! re-mark) and its `banlieue-uid-…` tag. The new object knows the VM by its `spec.providerID`
//! (`proxmox://<smbios uuid>`, which does move).

use std::collections::BTreeSet;

use banlieue_provider_kit::readopt::{self as kit, Marks};
use banlieue_pve_client::{ConfigUpdate, VmConfig};

use crate::desired::{self, OWNER_DESCRIPTION_MARKER, OWNER_TAG_PREFIX};
use crate::error::{StepError, pve_error};
use crate::hypervisor::Hypervisor;
use crate::phase::VmLocation;

pub use banlieue_provider_kit::readopt::{
    ADOPTION_FAILED, Candidate, Found, OnDeletion, Owner, VM_NOT_FOUND, on_deletion, taken_over,
};

/// Description line recording the UID a VM was re-marked from (the previous object).
pub const ADOPTED_FROM_MARKER: &str = "banlieue.io/adopted-from: ";
/// Prefix of the providerID this provider sets.
pub const PROVIDER_ID_PREFIX: &str = "proxmox://";
/// How messages name this provider and its kind.
pub const WORDS: kit::Words = kit::Words {
    provider: "banlieue-proxmox",
    kind: "ProxmoxMachine",
};

/// A VM found by its SMBIOS uuid: where it is and its config.
#[derive(Clone, Debug, PartialEq)]
pub struct Vm {
    /// Node and VMID.
    pub loc: VmLocation,
    /// Its config (marks, digest).
    pub config: VmConfig,
}

/// The SMBIOS uuid in a `proxmox://<uuid>` providerID (lower case).
pub fn uuid_of(provider_id: &str) -> Option<String> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|u| !u.is_empty() && !u.contains('/'))
        .map(str::to_ascii_lowercase)
}

/// The first line of [`desired::owner_description`]: names the object the VM was created for.
const CREATED_FOR: &str = "Created by banlieue-proxmox for ProxmoxMachine ";

/// The owner marks of a VM: the description's lines (the UID also from the owner tag).
pub fn marks(config: &VmConfig) -> Marks {
    let tag_uid = || {
        config
            .tags()
            .unwrap_or_default()
            .iter()
            .find_map(|t| t.strip_prefix(OWNER_TAG_PREFIX).map(str::to_owned))
    };
    // The name counts only beside the description's owner marker (both are written at clone
    // time): a tag alone proves ownership, never that the VM was made for this name.
    let described = owner_uid(config);
    Marks {
        name: described
            .as_ref()
            .and_then(|_| description_value(config, CREATED_FOR))
            .map(|n| n.trim_end_matches('.').to_owned()),
        uid: described.or_else(tag_uid),
        adopted_from: description_value(config, ADOPTED_FROM_MARKER),
        template: config.is_template(),
    }
}

/// The VM as the kit's decision sees it.
pub fn candidate(loc: VmLocation, config: VmConfig) -> Candidate<Vm> {
    Candidate {
        marks: marks(&config),
        label: label(&loc),
        vm: Vm { loc, config },
    }
}

/// How messages name a VM.
pub fn label(loc: &VmLocation) -> String {
    format!("VM {} on {}", loc.vmid, loc.node)
}

/// The config change that moves the VM's owner marker to `owner`: the description's marker lines
/// are replaced (other lines the user added stay), the old `banlieue-uid-…` tags are replaced by
/// the new one. Guarded by the config digest, so a concurrent change makes it fail and retry.
pub fn remark(config: &VmConfig, owner: Owner<'_>) -> ConfigUpdate {
    let description_now = config.get("description").unwrap_or_default();
    let kept: Vec<&str> = description_now
        .lines()
        .filter(|l| {
            let l = l.trim();
            !l.starts_with(CREATED_FOR)
                && !l.starts_with(OWNER_DESCRIPTION_MARKER)
                && !l.starts_with(ADOPTED_FROM_MARKER)
        })
        .collect();
    let mut description = desired::owner_description(owner.uid, owner.namespace, owner.name);
    if let Some(previous) = marks(config).previous_owner(owner) {
        description.push_str(&format!("{ADOPTED_FROM_MARKER}{previous}\n"));
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
    tags.insert(desired::owner_tag(owner.uid));
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

/// Finds the VM of `provider_id`. Candidates are the non-template VMs named like the machine
/// (the clone's name), then the other VMs carrying a banlieue owner tag; each candidate's config
/// is read until one has the uuid.
pub async fn find<H: Hypervisor>(
    hv: &H,
    owner: Owner<'_>,
    provider_id: &str,
) -> Result<Found<Vm>, StepError> {
    let uuid = uuid_of(provider_id).ok_or_else(|| {
        StepError::permanent(
            ADOPTION_FAILED,
            format!("spec.providerID {provider_id:?} is not a {PROVIDER_ID_PREFIX}<uuid> ID"),
        )
    })?;
    let pve = |e| pve_error(ADOPTION_FAILED, e);
    let guests = hv.guests().await.map_err(pve)?;
    let named = |g: &&crate::hypervisor::Guest| g.name.as_deref() == Some(owner.name);
    let tagged = |g: &&crate::hypervisor::Guest| g.tags.iter().any(|t| t.starts_with(OWNER_TAG_PREFIX));
    let live = guests.iter().filter(|g| !g.template);
    let candidates = live
        .clone()
        .filter(named)
        .chain(live.filter(|g| !named(g) && tagged(g)));
    for guest in candidates {
        let Some(config) = hv.vm_config(&guest.node, guest.vmid).await.map_err(pve)? else {
            continue;
        };
        if config.smbios_uuid().map(str::to_ascii_lowercase).as_deref() != Some(uuid.as_str()) {
            continue;
        }
        let loc = VmLocation {
            node: guest.node.clone(),
            vmid: guest.vmid,
        };
        return Ok(kit::classify(candidate(loc, config), owner, WORDS));
    }
    Ok(Found::Missing)
}

/// For a provisioned machine whose VM does not carry its owner marker: whether the VM is this
/// machine's from before it was re-created with its status (a restore): it has the machine's
/// providerID and was created for this `namespace/name` ([`kit::remark_provisioned`]).
pub fn remark_provisioned(config: &VmConfig, owner: Owner<'_>, provider_id: Option<&str>) -> bool {
    let same = provider_id
        .zip(desired::provider_id(config))
        .is_some_and(|(wanted, actual)| uuid_of(wanted).is_some() && uuid_of(wanted) == uuid_of(&actual));
    kit::remark_provisioned(&marks(config), owner, same)
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
        let me = |namespace, name| Owner {
            uid: "new-uid",
            namespace,
            name,
        };
        assert!(marks(&before).created_for(me("ns", "m1")));
        assert!(!marks(&before).created_for(me("ns", "m2")));
        assert!(!marks(&before).created_for(me("other", "m1")));
        let update = remark(&before, me("ns", "m1"));
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
        let Found::Remark(_) = kit::classify(candidate(loc.clone(), vm.clone()), copy, WORDS) else {
            panic!("the copy adopts");
        };
        let update = remark(&vm, copy);
        assert!(update.set["description"].contains("banlieue.io/adopted-from: old-uid"));
        let adopted = config(&[
            ("description", &update.set["description"]),
            ("tags", &update.set["tags"]),
        ]);
        let back = Owner {
            uid: "old-uid",
            ..copy
        };
        match kit::classify(candidate(loc.clone(), adopted.clone()), back, WORDS) {
            Found::TakenOver(_, why) => assert!(why.contains("taken over by a copy"), "{why}"),
            other => panic!("the original must not re-mark it: {other:?}"),
        }
        // A third incarnation (e.g. moved again) still adopts from the copy.
        let third = Owner {
            uid: "third-uid",
            ..copy
        };
        let Found::Remark(_) = kit::classify(candidate(loc, adopted.clone()), third, WORDS) else {
            panic!("a later copy adopts");
        };
        let again = remark(&adopted, third);
        assert_eq!(again.set["description"].matches(ADOPTED_FROM_MARKER).count(), 1);
        assert!(again.set["description"].contains("banlieue.io/adopted-from: new-uid"));
    }

    #[test]
    fn a_tag_without_the_description_marker_is_never_remarked() {
        let vm = config(&[
            (
                "description",
                "Created by banlieue-proxmox for ProxmoxMachine ns/m1.\n",
            ),
            ("tags", "banlieue-uid-old-uid"),
        ]);
        let me = Owner {
            uid: "new-uid",
            namespace: "ns",
            name: "m1",
        };
        let loc = VmLocation {
            node: "pve1".into(),
            vmid: 100,
        };
        assert!(matches!(
            kit::classify(candidate(loc, vm), me, WORDS),
            Found::Foreign(..)
        ));
    }

    #[test]
    fn a_description_without_the_marker_is_not_ours() {
        let forged = config(&[(
            "description",
            "Created by banlieue-proxmox for ProxmoxMachine ns/m1.\n",
        )]);
        let me = Owner {
            uid: "x",
            namespace: "ns",
            name: "m1",
        };
        assert!(!marks(&forged).created_for(me));
    }
}
