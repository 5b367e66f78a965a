//! Re-adoption of a VM whose VSphereMachine was created anew (`clusterctl move`, a restore):
//! the decision is the kit's ([`banlieue_provider_kit::readopt`]); this module reads and writes
//! the marks. A VM is marked in its extraConfig: [`OWNER_KEY`] = the object's UID,
//! [`OWNER_NAME_KEY`] = `namespace/name`, [`ADOPTED_FROM_KEY`] = the UID it was re-marked from.
//! The new object knows the VM by its `spec.providerID` (`vsphere://<bios uuid>`, which does
//! move). Re-marking rewrites those keys and nothing else: no reboot, no new bootstrap data.
//!
//! VMs cloned before [`OWNER_NAME_KEY`] existed get it on their next resync (see
//! [`missing_name_marker`]); until then they are refused like any VM marked for someone else.

use banlieue_provider_kit::readopt::{self as kit, Marks};
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{Client, MoRef, VmInfo};

use crate::error::{OrFail, StepError, client_error};

pub use banlieue_provider_kit::readopt::{
    ADOPTION_FAILED, Candidate, Found, OnDeletion, Owner, VM_NOT_FOUND,
};

/// extraConfig key holding the owning VSphereMachine's UID.
pub const OWNER_KEY: &str = "guestinfo.banlieue.owner-uid";
/// extraConfig key holding the owning VSphereMachine's `namespace/name`: what a machine created
/// anew by `clusterctl move` (new UID) re-adopts its VM by.
pub const OWNER_NAME_KEY: &str = "guestinfo.banlieue.owner-name";
/// extraConfig key holding the UID of the object a VM was taken over from when it was re-marked
/// for a copy (`clusterctl move`, a restore).
pub const ADOPTED_FROM_KEY: &str = "guestinfo.banlieue.adopted-from";
/// Prefix of the providerID this provider sets.
pub const PROVIDER_ID_PREFIX: &str = "vsphere://";
/// How messages name this provider and its kind.
pub const WORDS: kit::Words = kit::Words {
    provider: "banlieue-vsphere",
    kind: "VSphereMachine",
};

/// The extraConfig entries that mark a VM as `owner`'s.
pub fn marker(owner: Owner<'_>) -> Vec<(String, String)> {
    vec![
        (OWNER_KEY.to_owned(), owner.uid.to_owned()),
        (OWNER_NAME_KEY.to_owned(), owner.name_marker()),
    ]
}

/// The owner marks of a VM.
pub fn marks(info: &VmInfo) -> Marks {
    let key = |k: &str| info.extra_config.get(k).cloned();
    Marks {
        uid: key(OWNER_KEY),
        name: key(OWNER_NAME_KEY),
        adopted_from: key(ADOPTED_FROM_KEY),
        template: info.template,
    }
}

/// The VM as the kit's decision sees it.
pub fn candidate(info: VmInfo) -> Candidate<VmInfo> {
    Candidate {
        marks: marks(&info),
        label: label(&info),
        vm: info,
    }
}

/// How messages name a VM.
fn label(info: &VmInfo) -> String {
    format!("VM {} ({})", info.name, info.vm.value)
}

/// The BIOS uuid in a `vsphere://<uuid>` providerID.
pub fn bios_uuid_of(provider_id: &str) -> Option<&str> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|u| !u.is_empty() && !u.contains('/'))
}

/// Finds the VM of `provider_id` (`SearchIndex.FindByUuid`, BIOS uuid) and classifies it.
pub async fn find(c: &Client, owner: Owner<'_>, provider_id: &str) -> Result<Found<VmInfo>, StepError> {
    let uuid = bios_uuid_of(provider_id).ok_or_else(|| {
        StepError::permanent(
            ADOPTION_FAILED,
            format!("spec.providerID {provider_id:?} is not a {PROVIDER_ID_PREFIX}<bios uuid> ID"),
        )
    })?;
    let client = |e| client_error(ADOPTION_FAILED, e);
    let Some(vm) = c.find_vm_by_bios_uuid(None, uuid).await.map_err(client)? else {
        return Ok(Found::Missing);
    };
    Ok(match c.vm_info(&vm).await.map_err(client)? {
        None => Found::Missing,
        Some(info) => kit::classify(candidate(info), owner, WORDS),
    })
}

/// The reconfiguration that re-marks `info` for `owner`: both owner keys, and
/// [`ADOPTED_FROM_KEY`] = the previous owner's UID when it was another object's.
pub fn remark_spec_for(info: &VmInfo, owner: Owner<'_>) -> ConfigSpec {
    let mut extra_config = marker(owner);
    if let Some(previous) = marks(info).previous_owner(owner) {
        extra_config.push((ADOPTED_FROM_KEY.to_owned(), previous));
    }
    ConfigSpec {
        extra_config,
        ..ConfigSpec::default()
    }
}

/// Starts the reconfiguration that re-marks the VM `info` for `owner` ([`remark_spec_for`]);
/// returns its task. A VM taken over from `owner` is refused with [`ADOPTION_FAILED`] and not
/// written to.
pub async fn remark(c: &Client, info: &VmInfo, owner: Owner<'_>) -> Result<MoRef, StepError> {
    if let Some(why) = kit::taken_over(&marks(info), &label(info), owner) {
        return Err(StepError::permanent(ADOPTION_FAILED, why));
    }
    c.reconfigure(&info.vm, &remark_spec_for(info, owner))
        .await
        .or_fail(ADOPTION_FAILED)
}

/// Decides what deleting a machine with `spec.providerID` but no VM in its status does
/// ([`kit::on_deletion`]); never writes to the VM.
pub async fn on_deletion(
    c: &Client,
    owner: Owner<'_>,
    provider_id: &str,
) -> Result<OnDeletion<VmInfo>, StepError> {
    let found = if bios_uuid_of(provider_id).is_none() {
        Found::Missing
    } else {
        find(c, owner, provider_id).await?
    };
    let missing =
        || format!("no VM in vCenter has the BIOS uuid of spec.providerID {provider_id:?}: nothing deleted");
    Ok(kit::on_deletion(found, missing, WORDS))
}

/// For a provisioned machine whose VM does not carry its UID: whether the VM is this machine's
/// from before it was re-created (restored with its status) ([`kit::remark_provisioned`]).
pub fn remark_provisioned(info: &VmInfo, owner: Owner<'_>, provider_id: Option<&str>) -> bool {
    let same = provider_id
        .and_then(bios_uuid_of)
        .zip(info.bios_uuid.as_deref())
        .is_some_and(|(want, have)| want.eq_ignore_ascii_case(have));
    kit::remark_provisioned(&marks(info), owner, same)
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
            firmware: None,
            secure_boot: false,
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
            kit::classify(candidate(info(&[(OWNER_KEY, "new-uid")])), ME, WORDS),
            Found::Owned(_)
        ));
        assert!(matches!(
            kit::classify(
                candidate(info(&[(OWNER_KEY, "old-uid"), (OWNER_NAME_KEY, "ns/m1")])),
                ME,
                WORDS
            ),
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
            (vec![(OWNER_KEY, "old-uid")], "without the name marker"),
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
            let Found::Foreign(_, why) = kit::classify(candidate(info(&marks)), ME, WORDS) else {
                panic!("{marks:?} must be refused");
            };
            assert!(
                why.contains(says) && why.contains("refusing to adopt"),
                "{marks:?}: {why}"
            );
        }
        let mut template = info(&[(OWNER_KEY, "new-uid"), (OWNER_NAME_KEY, "ns/m1")]);
        template.template = true;
        assert!(matches!(
            kit::classify(candidate(template), ME, WORDS),
            Found::Foreign(..)
        ));
    }

    #[test]
    fn remarking_writes_both_keys() {
        assert_eq!(
            marker(ME),
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
        let Found::TakenOver(_, why) = kit::classify(candidate(vm.clone()), ORIGINAL, WORDS) else {
            panic!("the original must not re-mark its copy's VM");
        };
        assert!(
            why.contains("taken over by a copy of this machine (object uid new-uid)"),
            "{why}"
        );
        assert!(why.contains("refusing to take it back"), "{why}");
        assert!(matches!(
            kit::classify(candidate(vm.clone()), ME, WORDS),
            Found::Owned(_)
        ));
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
