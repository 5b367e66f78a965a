//! Re-adoption by identity: which VM a machine created anew may take over.
//!
//! `clusterctl move` re-creates every object on the target cluster with a **new UID and no
//! status**, and a restore from a backup does the same. The VM still carries the owner marks of
//! the old object (its UID and `namespace/name`); the new object knows the VM only by its
//! `spec.providerID`, which does move. A backend finds the VM the providerID names, reads its
//! [`Marks`], and this module decides:
//!
//! - marked with this object's UID: it is ours ([`Found::Owned`]);
//! - marked for **this** `namespace/name` under another UID: re-mark it for this object
//!   ([`Found::Remark`]), recording the previous UID as the one it was adopted from
//!   ([`Marks::previous_owner`]);
//! - taken over from this very object by a copy of it: never taken back ([`Found::TakenOver`]).
//!   When the original object still exists next to its copy (`clusterctl move --to-directory`,
//!   then `--from-directory` into a second management cluster while the first keeps running),
//!   the two would otherwise take the VM from each other forever;
//! - anything else (another object's, no marks, a template): refused ([`Found::Foreign`]).
//!
//! No VM with the providerID's identity means it was deleted behind the provider's back: it is
//! never created again (the Machine's providerID is fixed; CAPI's health checks replace it).
//! Deleting a machine that was never adopted deletes only a VM already marked with its UID
//! ([`on_deletion`]).

pub use crate::machine::DELETED;
use crate::machine::Deleted;

/// Condition reason of a refused or failed adoption.
pub const ADOPTION_FAILED: &str = "AdoptionFailed";
/// Event reason when a deleted machine leaves a VM created for an earlier object in place.
pub const VM_LEFT_IN_PLACE: &str = "VMLeftInPlace";
pub use crate::machine::VM_NOT_FOUND;

/// The object a VM is (to be) marked for.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    /// The infra machine's UID.
    pub uid: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
}

impl<'a> Owner<'a> {
    /// The owner `object` (an infra machine) is: its UID, namespace and name.
    pub fn of(object: &'a impl kube::Resource) -> Self {
        let meta = object.meta();
        Self {
            uid: meta.uid.as_deref().unwrap_or_default(),
            namespace: meta.namespace.as_deref().unwrap_or_default(),
            name: meta.name.as_deref().unwrap_or_default(),
        }
    }

    /// `namespace/name`, the mark that `clusterctl move` keeps.
    pub fn name_marker(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// How a provider names itself and its machine kind in messages.
#[derive(Clone, Copy, Debug)]
pub struct Words {
    /// `banlieue-vsphere`.
    pub provider: &'static str,
    /// `VSphereMachine`.
    pub kind: &'static str,
}

/// What a VM's owner marks say (each backend stores them its own way).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// UID of the object the VM is marked for.
    pub uid: Option<String>,
    /// `namespace/name` of the object the VM was created for.
    pub name: Option<String>,
    /// UID of the object the VM was taken over from, when it was re-marked.
    pub adopted_from: Option<String>,
    /// A template is never adopted.
    pub template: bool,
}

impl Marks {
    fn uid(&self) -> Option<&str> {
        self.uid.as_deref().filter(|u| !u.is_empty())
    }

    /// Whether the VM carries `owner`'s UID.
    pub fn owned_by(&self, owner: Owner<'_>) -> bool {
        !self.template && self.uid() == Some(owner.uid)
    }

    /// Whether the VM was created for `owner`'s `namespace/name` (under any UID).
    pub fn created_for(&self, owner: Owner<'_>) -> bool {
        !self.template && self.uid().is_some() && self.name.as_deref() == Some(owner.name_marker().as_str())
    }

    /// Whether a copy of `owner` took the VM over from it.
    pub fn taken_over_from(&self, owner: Owner<'_>) -> bool {
        self.adopted_from.as_deref() == Some(owner.uid) && self.uid() != Some(owner.uid)
    }

    /// The UID to record as adopted-from when re-marking the VM for `owner`: the current owner's
    /// when it is another object, else what is recorded already.
    pub fn previous_owner(&self, owner: Owner<'_>) -> Option<String> {
        match self.uid() {
            Some(uid) if uid != owner.uid => Some(uid.to_owned()),
            _ => self.adopted_from.clone(),
        }
    }
}

/// A VM a backend found by a machine's providerID, with what the decision needs of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<V> {
    /// The backend's handle of the VM.
    pub vm: V,
    /// Its owner marks.
    pub marks: Marks,
    /// How messages name it: `VM web-1 (vm-42)`.
    pub label: String,
}

/// What the search for the VM named by `spec.providerID` found.
#[derive(Clone, Debug, PartialEq)]
pub enum Found<V> {
    /// No VM has that identity.
    Missing,
    /// The VM already carries this object's UID.
    Owned(Candidate<V>),
    /// The VM was created for this object's previous incarnation: re-mark it.
    Remark(Candidate<V>),
    /// The VM has that identity but was not created for this machine (why).
    Foreign(Candidate<V>, String),
    /// The VM was taken over from this very object by a copy of it (why): never taken back.
    TakenOver(Candidate<V>, String),
}

/// Why `owner` must not take back the VM with `marks` (named `label` in messages) that a copy
/// of it took over, if that is the case.
pub fn taken_over(marks: &Marks, label: &str, owner: Owner<'_>) -> Option<String> {
    marks.taken_over_from(owner).then(|| {
        format!(
            "{label} was taken over by a copy of this machine (object uid {}), created by clusterctl move or a restore while this object still exists; refusing to take it back",
            marks.uid().unwrap_or("unknown")
        )
    })
}

/// Classifies the VM with the providerID's identity for `owner`.
pub fn classify<V>(vm: Candidate<V>, owner: Owner<'_>, words: Words) -> Found<V> {
    let marks = &vm.marks;
    if marks.owned_by(owner) {
        return Found::Owned(vm);
    }
    if let Some(why) = taken_over(&vm.marks, &vm.label, owner) {
        return Found::TakenOver(vm, why);
    }
    if marks.created_for(owner) {
        return Found::Remark(vm);
    }
    let Words { provider, kind } = words;
    let marked = match (marks.template, marks.uid(), &marks.name) {
        (true, ..) => "is a template".to_owned(),
        (false, None, _) => format!("carries no {provider} owner marker"),
        (false, Some(_), Some(other)) => format!("was created by {provider} for {kind} {other}"),
        (false, Some(_), None) => format!(
            "was created by {provider} without the name marker (before this version; its old object records it on its next resync)"
        ),
    };
    let why = format!(
        "{} has this machine's providerID but {marked}, not for {kind} {}; refusing to adopt it",
        vm.label,
        owner.name_marker()
    );
    Found::Foreign(vm, why)
}

/// Whether a provisioned machine's VM that does not carry its UID is this machine's from before
/// it was re-created with its status (a restore): the VM has the identity of `spec.providerID`
/// (`same_identity`) and was created for this `namespace/name`.
pub fn remark_provisioned(marks: &Marks, owner: Owner<'_>, same_identity: bool) -> bool {
    !marks.owned_by(owner) && same_identity && marks.created_for(owner)
}

/// What deleting a machine with `spec.providerID` but no VM in its status (a copy made by
/// `clusterctl move` or a restore that was never adopted) does with the VM.
#[derive(Clone, Debug, PartialEq)]
pub enum OnDeletion<V> {
    /// The VM carries this object's UID: delete it.
    Delete(Candidate<V>),
    /// Release the machine without touching any VM (the Event to report).
    Release(Deleted),
}

/// Decides [`OnDeletion`] from what the search found (`missing`: the Event's note when nothing
/// has the identity). Never re-marks: a VM created for an earlier object of this name is left in
/// place (that object may still exist elsewhere; a leaked VM can be deleted by hand, a deleted
/// one cannot come back).
pub fn on_deletion<V>(found: Found<V>, missing: impl FnOnce() -> String, words: Words) -> OnDeletion<V> {
    let release = |reason, note| OnDeletion::Release(Deleted::Released { reason, note });
    match found {
        Found::Owned(vm) => OnDeletion::Delete(vm),
        Found::Remark(vm) => release(
            VM_LEFT_IN_PLACE,
            format!(
                "{} left untouched: it was created for an earlier object of this name (uid {}), not this one; delete it by hand if it is no longer wanted",
                vm.label,
                vm.marks.uid().unwrap_or("unknown")
            ),
        ),
        Found::Missing => release(DELETED, missing()),
        Found::Foreign(vm, _) | Found::TakenOver(vm, _) => {
            let marks = &vm.marks;
            let whose = match (marks.uid(), &marks.name) {
                _ if marks.template => "a template".to_owned(),
                (Some(uid), Some(name)) => format!("{} {name} uid {uid}", words.kind),
                (Some(uid), None) => format!("object uid {uid}"),
                (None, _) => format!("no {} owner marker", words.provider),
            };
            release(
                DELETED,
                format!(
                    "{} named by spec.providerID is owned by another object ({whose}): left untouched, nothing deleted",
                    vm.label
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Vm = Candidate<()>;

    #[test]
    fn the_owner_of_an_object_is_its_uid_namespace_and_name() {
        let mut object = k8s_openapi::api::core::v1::ConfigMap::default();
        assert_eq!(
            Owner::of(&object).name_marker(),
            "/",
            "no metadata: empty, no panic"
        );
        object.metadata.uid = Some("u1".into());
        object.metadata.namespace = Some("ns".into());
        object.metadata.name = Some("m1".into());
        let owner = Owner::of(&object);
        assert_eq!((owner.uid, owner.namespace, owner.name), ("u1", "ns", "m1"));
    }

    const WORDS: Words = Words {
        provider: "banlieue-test",
        kind: "TestMachine",
    };
    const ME: Owner<'static> = Owner {
        uid: "new",
        namespace: "ns",
        name: "m",
    };

    fn vm(uid: Option<&str>, name: Option<&str>, adopted_from: Option<&str>) -> Vm {
        Candidate {
            vm: (),
            marks: Marks {
                uid: uid.map(Into::into),
                name: name.map(Into::into),
                adopted_from: adopted_from.map(Into::into),
                template: false,
            },
            label: "VM web (42)".to_owned(),
        }
    }

    #[test]
    fn a_vm_marked_with_this_uid_is_owned() {
        assert!(matches!(
            classify(vm(Some("new"), None, None), ME, WORDS),
            Found::Owned(_)
        ));
    }

    #[test]
    fn a_vm_created_for_this_name_under_another_uid_is_remarked_recording_that_uid() {
        let v = vm(Some("old"), Some("ns/m"), None);
        assert_eq!(v.marks.previous_owner(ME).as_deref(), Some("old"));
        assert!(matches!(classify(v, ME, WORDS), Found::Remark(_)));
    }

    #[test]
    fn a_vm_taken_over_from_this_object_is_never_taken_back() {
        let found = classify(vm(Some("copy"), Some("ns/m"), Some("new")), ME, WORDS);
        let Found::TakenOver(_, why) = found else {
            panic!("{found:?}")
        };
        assert!(
            why.contains("taken over by a copy of this machine (object uid copy)"),
            "{why}"
        );
        assert!(why.contains("refusing to take it back"), "{why}");
    }

    #[test]
    fn another_objects_vm_an_unmarked_vm_and_a_template_are_refused_saying_why() {
        for (v, says) in [
            (
                vm(Some("x"), Some("ns/other"), None),
                "was created by banlieue-test for TestMachine ns/other",
            ),
            (vm(None, None, None), "carries no banlieue-test owner marker"),
            (
                {
                    let mut v = vm(Some("new"), Some("ns/m"), None);
                    v.marks.template = true;
                    v
                },
                "is a template",
            ),
        ] {
            let found = classify(v, ME, WORDS);
            let Found::Foreign(_, why) = found else {
                panic!("{found:?}")
            };
            assert!(
                why.contains(says) && why.contains("refusing to adopt it"),
                "{why}"
            );
            assert!(why.contains("not for TestMachine ns/m"), "{why}");
        }
    }

    #[test]
    fn deletion_deletes_only_a_vm_carrying_this_uid() {
        let missing = || "nothing has it: nothing deleted".to_owned();
        let owned = classify(vm(Some("new"), None, None), ME, WORDS);
        assert!(matches!(
            on_deletion(owned, missing, WORDS),
            OnDeletion::Delete(_)
        ));
        let earlier = classify(vm(Some("old"), Some("ns/m"), None), ME, WORDS);
        assert!(matches!(
            on_deletion(earlier, missing, WORDS),
            OnDeletion::Release(Deleted::Released { reason: VM_LEFT_IN_PLACE, note }) if note.contains("left untouched") && note.contains("uid old")
        ));
        let foreign = classify(vm(Some("x"), Some("ns/other"), None), ME, WORDS);
        assert!(matches!(
            on_deletion(foreign, missing, WORDS),
            OnDeletion::Release(Deleted::Released { reason: DELETED, note }) if note.contains("TestMachine ns/other uid x") && note.contains("nothing deleted")
        ));
        assert!(matches!(
            on_deletion(Found::<()>::Missing, missing, WORDS),
            OnDeletion::Release(Deleted::Released { reason: DELETED, note }) if note == missing()
        ));
    }

    #[test]
    fn a_restored_machine_remarks_only_its_own_vm() {
        let earlier = vm(Some("old"), Some("ns/m"), None);
        assert!(remark_provisioned(&earlier.marks, ME, true));
        assert!(!remark_provisioned(&earlier.marks, ME, false));
        assert!(!remark_provisioned(
            &vm(Some("new"), Some("ns/m"), None).marks,
            ME,
            true
        ));
        assert!(!remark_provisioned(
            &vm(Some("old"), Some("ns/x"), None).marks,
            ME,
            true
        ));
    }
}
