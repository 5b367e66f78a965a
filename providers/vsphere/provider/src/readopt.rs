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

/// Starts the reconfiguration that re-marks `vm` for `owner`; returns its task.
pub async fn remark(c: &Client, vm: &MoRef, owner: Owner<'_>) -> Result<MoRef, StepError> {
    c.reconfigure(vm, &owner.remark_spec())
        .await
        .map_err(|e| StepError::from_client(ADOPTION_FAILED, e))
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
