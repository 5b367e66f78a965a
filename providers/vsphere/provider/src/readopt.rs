//! Re-adoption of a VM whose VSphereMachine was created anew: `clusterctl move` re-creates every
//! object on the target cluster with a **new UID and no status**, and a restore from a backup
//! does the same. The VM still carries the owner marker of the old object (extraConfig
//! [`OWNER_KEY`] = its UID, [`OWNER_NAME_KEY`] = `namespace/name`); the new object knows the VM
//! only by its `spec.providerID` (`vsphere://<bios uuid>`, which does move). Without this, the
//! new object would find no VM carrying its UID and clone a second one.
//!
//! The VM is re-marked for the new object (both keys rewritten, nothing else: no reboot, no new
//! bootstrap data) only when all of this holds, so a machine can never take over a VM that was
//! not created for it:
//! - its BIOS uuid is the one in `spec.providerID` and it is not a template;
//! - it carries a banlieue owner UID and its [`OWNER_NAME_KEY`] names **this** VSphereMachine
//!   (`namespace/name`, which `clusterctl move` keeps).
//!
//! Re-marking records the previous owner's UID in extraConfig [`ADOPTED_FROM_KEY`]. An object
//! whose UID the VM was taken over from never re-marks it back ([`taken_over`]): when the
//! original object still exists next to its copy (e.g. `clusterctl move --to-directory` then
//! `--from-directory` into a second management cluster while the first keeps running), the two
//! would otherwise take the VM from each other forever.
//!
//! VMs cloned before [`OWNER_NAME_KEY`] existed get it on their next resync (see
//! [`missing_name_marker`]); until then they are refused like any VM marked for someone else.
//! No VM with that uuid means it was deleted behind the provider's back (never cloned again: the
//! Machine's providerID is fixed, CAPI's health checks replace the machine).

use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{Client, MoRef, VmInfo};

use crate::provision::{MachineInput, OWNER_KEY, OWNER_NAME_KEY, StepError};

/// Condition reason of a refused or failed adoption.
pub const ADOPTION_FAILED: &str = "AdoptionFailed";
/// Condition reason when the VM of `spec.providerID` does not exist.
pub const VM_NOT_FOUND: &str = "VMNotFound";
/// extraConfig key holding the UID of the object a VM was taken over from when it was re-marked
/// for a copy (`clusterctl move`, a restore).
pub const ADOPTED_FROM_KEY: &str = "guestinfo.banlieue.adopted-from";
/// Prefix of the providerID this provider sets.
pub const PROVIDER_ID_PREFIX: &str = "vsphere://";

/// The object a VM is (to be) marked for.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    /// The VSphereMachine's UID.
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

impl Owner<'_> {
    /// The value of [`OWNER_NAME_KEY`]: `namespace/name`.
    pub fn name_marker(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The extraConfig entries that mark a VM as this object's.
    pub fn marker(&self) -> Vec<(String, String)> {
        vec![
            (OWNER_KEY.to_owned(), self.uid.to_owned()),
            (OWNER_NAME_KEY.to_owned(), self.name_marker()),
        ]
    }

    /// The reconfiguration that (re-)marks a VM as this object's.
    pub fn remark_spec(&self) -> ConfigSpec {
        ConfigSpec {
            extra_config: self.marker(),
            ..ConfigSpec::default()
        }
    }
}

/// The BIOS uuid in a `vsphere://<uuid>` providerID.
pub fn bios_uuid_of(provider_id: &str) -> Option<&str> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|u| !u.is_empty() && !u.contains('/'))
}

/// What the search for the VM named by `spec.providerID` found.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// No VM has that BIOS uuid.
    Missing,
    /// The VM already carries this object's UID.
    Owned(VmInfo),
    /// The VM was created for this object's previous incarnation: re-mark it.
    Remark(VmInfo),
    /// The VM has that uuid but was not created for this machine (why).
    Foreign(VmInfo, String),
    /// The VM was taken over from this very object by a copy of it (why): never taken back.
    TakenOver(VmInfo, String),
}

/// When the VM was re-marked for a copy of `owner` (it records that it was adopted from
/// `owner`'s UID) and no longer carries `owner`'s UID: why `owner` must not take it back.
pub fn taken_over(info: &VmInfo, owner: Owner<'_>) -> Option<String> {
    let current = info.extra_config.get(OWNER_KEY).map(String::as_str);
    (info.extra_config.get(ADOPTED_FROM_KEY).map(String::as_str) == Some(owner.uid) && current != Some(owner.uid))
        .then(|| {
            format!(
                "VM {} ({}) was taken over by a copy of this machine (object uid {}), created by clusterctl move or a restore while this object still exists; refusing to take it back",
                info.name,
                info.vm.value,
                current.unwrap_or("unknown")
            )
        })
}

/// Whether the VM carries a banlieue owner UID and was created for `namespace/name`.
pub fn created_for(info: &VmInfo, owner: Owner<'_>) -> bool {
    info.extra_config.get(OWNER_KEY).is_some_and(|u| !u.is_empty())
        && info.extra_config.get(OWNER_NAME_KEY).map(String::as_str) == Some(owner.name_marker().as_str())
}

/// Classifies the VM with the providerID's BIOS uuid for `owner`.
pub fn classify(info: VmInfo, owner: Owner<'_>) -> Found {
    let ours = info.extra_config.get(OWNER_KEY).map(String::as_str) == Some(owner.uid);
    if !info.template && ours {
        return Found::Owned(info);
    }
    if let Some(why) = taken_over(&info, owner) {
        return Found::TakenOver(info, why);
    }
    if !info.template && created_for(&info, owner) {
        return Found::Remark(info);
    }
    let marked = if info.template {
        "is a template".to_owned()
    } else {
        match (
            info.extra_config.get(OWNER_KEY),
            info.extra_config.get(OWNER_NAME_KEY),
        ) {
            (None, _) => "carries no banlieue-vsphere owner marker".to_owned(),
            (Some(_), Some(other)) => format!("was created by banlieue-vsphere for VSphereMachine {other}"),
            (Some(_), None) => format!(
                "was created by banlieue-vsphere without extraConfig {OWNER_NAME_KEY} (before this version; its old object records it on its next resync)"
            ),
        }
    };
    let why = format!(
        "VM {} ({}) has this machine's providerID but {marked}, not for VSphereMachine {}; refusing to adopt it",
        info.name,
        info.vm.value,
        owner.name_marker()
    );
    Found::Foreign(info, why)
}

/// Finds the VM of `provider_id` (`SearchIndex.FindByUuid`, BIOS uuid) and classifies it.
pub async fn find(c: &Client, owner: Owner<'_>, provider_id: &str) -> Result<Found, StepError> {
    let uuid = bios_uuid_of(provider_id).ok_or_else(|| StepError::Permanent {
        reason: ADOPTION_FAILED,
        message: format!("spec.providerID {provider_id:?} is not a {PROVIDER_ID_PREFIX}<bios uuid> ID"),
    })?;
    let client = |e| StepError::from_client(ADOPTION_FAILED, e);
    let Some(vm) = c.find_vm_by_bios_uuid(None, uuid).await.map_err(client)? else {
        return Ok(Found::Missing);
    };
    Ok(match c.vm_info(&vm).await.map_err(client)? {
        None => Found::Missing,
        Some(info) => classify(info, owner),
    })
}

/// The reconfiguration that re-marks `info` for `owner`: both owner keys, and
/// [`ADOPTED_FROM_KEY`] = the previous owner's UID when it was another object's.
pub fn remark_spec_for(info: &VmInfo, owner: Owner<'_>) -> ConfigSpec {
    let mut spec = owner.remark_spec();
    if let Some(previous) = info
        .extra_config
        .get(OWNER_KEY)
        .filter(|u| !u.is_empty() && u.as_str() != owner.uid)
    {
        spec.extra_config
            .push((ADOPTED_FROM_KEY.to_owned(), previous.clone()));
    }
    spec
}

/// Starts the reconfiguration that re-marks the VM `info` for `owner` ([`remark_spec_for`]);
/// returns its task. A VM taken over from `owner` ([`taken_over`]) is refused with
/// [`ADOPTION_FAILED`] and not written to.
pub async fn remark(c: &Client, info: &VmInfo, owner: Owner<'_>) -> Result<MoRef, StepError> {
    if let Some(why) = taken_over(info, owner) {
        return Err(StepError::Permanent {
            reason: ADOPTION_FAILED,
            message: why,
        });
    }
    c.reconfigure(&info.vm, &remark_spec_for(info, owner))
        .await
        .map_err(|e| StepError::from_client(ADOPTION_FAILED, e))
}

/// What deleting a machine with `spec.providerID` but no VM in its status (a copy made by
/// `clusterctl move` or a restore that was never adopted) does with the VM.
#[derive(Clone, Debug, PartialEq)]
pub enum OnDeletion {
    /// The VM carries this object's UID: delete it.
    Delete(MoRef),
    /// The VM was created for an earlier object of this name: left untouched (Event text).
    LeftInPlace(String),
    /// No VM of this machine's (none, another object's, or an unparsable providerID): nothing to
    /// do (Event text).
    Nothing(String),
}

/// Decides [`OnDeletion`] for the VM of `provider_id`; never writes to the VM.
pub async fn on_deletion(c: &Client, owner: Owner<'_>, provider_id: &str) -> Result<OnDeletion, StepError> {
    if bios_uuid_of(provider_id).is_none() {
        return Ok(OnDeletion::Nothing(format!(
            "spec.providerID {provider_id:?} is not a {PROVIDER_ID_PREFIX}<bios uuid> ID and no VM is in the status: nothing deleted"
        )));
    }
    Ok(match find(c, owner, provider_id).await? {
        Found::Owned(info) => OnDeletion::Delete(info.vm),
        Found::Remark(info) => OnDeletion::LeftInPlace(format!(
            "VM {} ({}) left untouched: it was created for an earlier object of this name (uid {}), not this one; delete it by hand if it is no longer wanted",
            info.name,
            info.vm.value,
            info.extra_config.get(OWNER_KEY).map_or("unknown", String::as_str)
        )),
        Found::Missing => OnDeletion::Nothing(format!(
            "no VM in vCenter has the BIOS uuid of spec.providerID {provider_id}: nothing deleted"
        )),
        Found::Foreign(info, _) | Found::TakenOver(info, _) => OnDeletion::Nothing(format!(
            "VM {} ({}) named by spec.providerID is owned by another object ({}): left untouched, nothing deleted",
            info.name,
            info.vm.value,
            match (
                info.extra_config.get(OWNER_NAME_KEY),
                info.extra_config.get(OWNER_KEY)
            ) {
                (Some(name), Some(uid)) => format!("VSphereMachine {name} uid {uid}"),
                (None, Some(uid)) => format!("object uid {uid}"),
                _ if info.template => "a template".to_owned(),
                _ => "no banlieue-vsphere owner marker".to_owned(),
            }
        )),
    })
}

/// For a provisioned machine whose VM does not carry its UID: whether the VM is this machine's
/// from before it was re-created (restored with its status): `spec.providerID` is the VM's
/// BIOS uuid and it was created for this `namespace/name`.
pub fn remark_provisioned(info: &VmInfo, owner: Owner<'_>, provider_id: Option<&str>) -> bool {
    info.extra_config.get(OWNER_KEY).map(String::as_str) != Some(owner.uid)
        && provider_id
            .and_then(bios_uuid_of)
            .zip(info.bios_uuid.as_deref())
            .is_some_and(|(want, have)| want.eq_ignore_ascii_case(have))
        && created_for(info, owner)
}

/// For a provisioned VM carrying this machine's UID but not (or not the right) `namespace/name`
/// (cloned before [`OWNER_NAME_KEY`] existed): the marker is completed so that the VM can be
/// re-adopted after a `clusterctl move`.
pub fn missing_name_marker(info: &VmInfo, owner: Owner<'_>) -> bool {
    info.extra_config.get(OWNER_KEY).map(String::as_str) == Some(owner.uid)
        && info.extra_config.get(OWNER_NAME_KEY).map(String::as_str) != Some(owner.name_marker().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Owner<'static> = Owner {
        uid: "new-uid",
        namespace: "ns",
        name: "m1",
    };

    fn info(marks: &[(&str, &str)]) -> VmInfo {
        VmInfo {
            vm: MoRef::new("VirtualMachine", "vm-1"),
            name: "m1".into(),
            bios_uuid: Some("4218A0F3-0000-4000-8000-000000000001".into()),
            instance_uuid: None,
            template: false,
            power_state: None,
            num_cpu: None,
            cores_per_socket: None,
            memory_mb: None,
            extra_config: marks
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ip_address: None,
            guest_ips: vec![],
            host: None,
            hardware: Default::default(),
        }
    }

    #[test]
    fn provider_ids_are_parsed_strictly() {
        assert_eq!(bios_uuid_of("vsphere://4218a0f3-1"), Some("4218a0f3-1"));
        assert_eq!(bios_uuid_of("vsphere://"), None);
        assert_eq!(bios_uuid_of("vsphere://a/b"), None);
        assert_eq!(bios_uuid_of("libvirt://h/u"), None);
    }

    #[test]
    fn only_a_vm_created_for_the_same_namespace_and_name_is_remarked() {
        assert!(matches!(
            classify(info(&[(OWNER_KEY, "new-uid")]), ME),
            Found::Owned(_)
        ));
        assert!(matches!(
            classify(info(&[(OWNER_KEY, "old-uid"), (OWNER_NAME_KEY, "ns/m1")]), ME),
            Found::Remark(_)
        ));
        for (marks, says) in [
            (
                vec![(OWNER_KEY, "old-uid"), (OWNER_NAME_KEY, "ns/m2")],
                "for VSphereMachine ns/m2",
            ),
            (
                vec![(OWNER_KEY, "old-uid"), (OWNER_NAME_KEY, "other/m1")],
                "other/m1",
            ),
            (vec![(OWNER_KEY, "old-uid")], "without extraConfig"),
            (
                vec![(OWNER_NAME_KEY, "ns/m1")],
                "no banlieue-vsphere owner marker",
            ),
            (
                vec![(OWNER_KEY, ""), (OWNER_NAME_KEY, "ns/m1")],
                "for VSphereMachine ns/m1",
            ),
            (vec![], "no banlieue-vsphere owner marker"),
        ] {
            let Found::Foreign(_, why) = classify(info(&marks), ME) else {
                panic!("{marks:?} must be refused");
            };
            assert!(
                why.contains(says) && why.contains("refusing to adopt"),
                "{marks:?}: {why}"
            );
        }
        let mut template = info(&[(OWNER_KEY, "new-uid"), (OWNER_NAME_KEY, "ns/m1")]);
        template.template = true;
        assert!(matches!(classify(template, ME), Found::Foreign(..)));
    }

    #[test]
    fn remarking_writes_both_keys() {
        assert_eq!(
            ME.remark_spec().extra_config,
            vec![
                (OWNER_KEY.to_owned(), "new-uid".to_owned()),
                (OWNER_NAME_KEY.to_owned(), "ns/m1".to_owned())
            ]
        );
    }

    #[test]
    fn a_restored_provisioned_machine_remarks_only_its_own_vm() {
        let vm = info(&[(OWNER_KEY, "old-uid"), (OWNER_NAME_KEY, "ns/m1")]);
        let id = "vsphere://4218a0f3-0000-4000-8000-000000000001";
        assert!(remark_provisioned(&vm, ME, Some(id)));
        assert!(!remark_provisioned(&vm, ME, None));
        assert!(!remark_provisioned(&vm, ME, Some("vsphere://other")));
        let other = info(&[(OWNER_KEY, "old-uid"), (OWNER_NAME_KEY, "ns/m2")]);
        assert!(!remark_provisioned(&other, ME, Some(id)));
        let owned = info(&[(OWNER_KEY, "new-uid"), (OWNER_NAME_KEY, "ns/m1")]);
        assert!(!remark_provisioned(&owned, ME, Some(id)), "already ours");
    }

    #[test]
    fn a_vm_taken_over_from_this_object_is_never_taken_back() {
        const ORIGINAL: Owner<'static> = Owner {
            uid: "old-uid",
            namespace: "ns",
            name: "m1",
        };
        let vm = info(&[
            (OWNER_KEY, "new-uid"),
            (OWNER_NAME_KEY, "ns/m1"),
            (ADOPTED_FROM_KEY, "old-uid"),
        ]);
        let Found::TakenOver(_, why) = classify(vm.clone(), ORIGINAL) else {
            panic!("the original must not re-mark its copy's VM");
        };
        assert!(
            why.contains("taken over by a copy of this machine (object uid new-uid)"),
            "{why}"
        );
        assert!(why.contains("refusing to take it back"), "{why}");
        assert!(matches!(classify(vm.clone(), ME), Found::Owned(_)));
        // Re-marking records where the VM came from.
        let old = info(&[(OWNER_KEY, "old-uid"), (OWNER_NAME_KEY, "ns/m1")]);
        assert!(
            remark_spec_for(&old, ME)
                .extra_config
                .contains(&(ADOPTED_FROM_KEY.to_owned(), "old-uid".to_owned()))
        );
        assert!(
            !remark_spec_for(&info(&[(OWNER_KEY, "new-uid")]), ME)
                .extra_config
                .iter()
                .any(|(k, _)| k == ADOPTED_FROM_KEY),
            "completing the name marker records nothing"
        );
    }

    #[test]
    fn old_vms_get_the_name_marker_completed() {
        assert!(missing_name_marker(&info(&[(OWNER_KEY, "new-uid")]), ME));
        assert!(!missing_name_marker(
            &info(&[(OWNER_KEY, "new-uid"), (OWNER_NAME_KEY, "ns/m1")]),
            ME
        ));
        assert!(
            !missing_name_marker(&info(&[(OWNER_KEY, "old-uid")]), ME),
            "never on a VM that is not ours"
        );
    }
}
