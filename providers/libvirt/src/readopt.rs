//! Re-adoption of a domain whose LibvirtMachine was created anew (`clusterctl move`, a restore):
//! the decision is the kit's ([`banlieue_provider_kit::readopt`]); this module reads and writes
//! the marks. A domain is marked in its `<metadata>`: the owner element names the UID,
//! namespace and name it was defined for, and its attribute
//! [`xml::ADOPTED_FROM`](crate::xml::ADOPTED_FROM) the UID it was re-marked from. The new
//! object knows the domain by its `spec.providerID` (`libvirt://<host>/<domain uuid>`, which
//! does move); the host must be a failure domain of the LibvirtCluster.
//!
//! Without this, the new object would start provisioning from scratch: its default domain uuid
//! is its (new) UID, so it would find no domain by uuid, rewrite the seed volume and stop on a
//! name conflict, and deleting it would leak the domain.

use banlieue_provider_kit::readopt::{self as kit, Marks};

use crate::desired::PROVIDER_ID_PREFIX;
use crate::error::{StepError, step_error};
use crate::hypervisor::{DomainInfo, HvError, Hypervisor};
use crate::xml::Owner;

pub use banlieue_provider_kit::readopt::{ADOPTION_FAILED, Candidate, Found, OnDeletion, VM_NOT_FOUND};

/// How messages name this provider and its kind.
pub const WORDS: kit::Words = kit::Words {
    provider: "banlieue-libvirt",
    kind: "LibvirtMachine",
};

/// What a `libvirt://<host>/<uuid>` providerID names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderId {
    /// The host (failure domain name of the LibvirtCluster).
    pub host: String,
    /// The domain uuid, lower case.
    pub uuid: String,
}

impl ProviderId {
    /// Parses `libvirt://<host>/<uuid>`; anything else is `None`.
    pub fn parse(provider_id: &str) -> Option<Self> {
        let (host, uuid) = provider_id.strip_prefix(PROVIDER_ID_PREFIX)?.split_once('/')?;
        (!host.is_empty() && !uuid.is_empty() && !uuid.contains('/')).then(|| Self {
            host: host.to_owned(),
            uuid: uuid.to_ascii_lowercase(),
        })
    }
}

/// Parses a providerID or fails with [`ADOPTION_FAILED`].
pub fn parse(provider_id: &str) -> Result<ProviderId, StepError> {
    ProviderId::parse(provider_id).ok_or_else(|| {
        StepError::permanent(
            ADOPTION_FAILED,
            format!("spec.providerID {provider_id:?} is not a {PROVIDER_ID_PREFIX}<host>/<uuid> ID"),
        )
    })
}

/// `me` as the kit's decision sees it.
pub fn owner(me: &Owner) -> kit::Owner<'_> {
    kit::Owner {
        uid: &me.uid,
        namespace: &me.namespace,
        name: &me.name,
    }
}

/// The owner marks of a domain.
pub fn marks(domain: &DomainInfo) -> Marks {
    Marks {
        uid: domain.owner.as_ref().map(|o| o.uid.clone()),
        name: domain.owner.as_ref().map(|o| owner(o).name_marker()),
        adopted_from: domain.adopted_from.clone(),
        template: false,
    }
}

/// The domain as the kit's decision sees it.
pub fn candidate(domain: DomainInfo) -> Candidate<DomainInfo> {
    Candidate {
        marks: marks(&domain),
        label: format!("domain {} ({})", domain.name, domain.uuid),
        vm: domain,
    }
}

/// Classifies the domain with the providerID's uuid for the machine `me`.
pub fn classify(domain: DomainInfo, me: &Owner) -> Found<DomainInfo> {
    kit::classify(candidate(domain), owner(me), WORDS)
}

/// A libvirt error while adopting.
fn hv_error(source: HvError) -> StepError {
    step_error(ADOPTION_FAILED, source)
}

/// Looks up the domain `uuid` on `hv` and classifies it for `me`.
pub async fn find<H: Hypervisor>(hv: &H, me: &Owner, uuid: &str) -> Result<Found<DomainInfo>, StepError> {
    Ok(match hv.domain_by_uuid(uuid).await.map_err(hv_error)? {
        None => Found::Missing,
        Some(d) => classify(d, me),
    })
}

/// Re-marks a domain found by [`find`] as [`Found::Remark`] for `me` (metadata only: the domain
/// is neither redefined nor restarted), recording the previous owner's UID as the one it was
/// adopted from, and returns it as now owned. A domain taken over from `me` is refused with
/// [`ADOPTION_FAILED`] and not written to.
pub async fn remark<H: Hypervisor>(hv: &H, domain: DomainInfo, me: &Owner) -> Result<DomainInfo, StepError> {
    let domain = candidate(domain);
    if let Some(why) = kit::taken_over(&domain.marks, &domain.label, owner(me)) {
        return Err(StepError::permanent(ADOPTION_FAILED, why));
    }
    let adopted_from = domain.marks.previous_owner(owner(me));
    hv.set_domain_owner(&domain.vm.uuid, me, adopted_from.as_deref())
        .await
        .map_err(hv_error)?;
    Ok(DomainInfo {
        owner: Some(me.clone()),
        adopted_from,
        ..domain.vm
    })
}

/// Decides what deleting a machine with `spec.providerID` but no domain in its status does with
/// the domain `uuid` on `host` ([`kit::on_deletion`]); never writes to the domain.
pub async fn on_deletion<H: Hypervisor>(
    hv: &H,
    me: &Owner,
    host: &str,
    uuid: &str,
) -> Result<OnDeletion<DomainInfo>, StepError> {
    let missing =
        || format!("no domain has the uuid of spec.providerID ({uuid}) on host {host}: nothing deleted");
    Ok(kit::on_deletion(find(hv, me, uuid).await?, missing, WORDS))
}

/// For a provisioned machine whose domain does not carry its UID: whether the domain is this
/// machine's from before it was re-created (restored with its status): `spec.providerID` names
/// this host and domain, and the domain was defined for this `namespace/name`.
pub fn remark_provisioned(domain: &DomainInfo, me: &Owner, provider_id: Option<&str>, host: &str) -> bool {
    let same = provider_id
        .and_then(ProviderId::parse)
        .is_some_and(|p| p.host == host && p.uuid == domain.uuid.to_ascii_lowercase());
    kit::remark_provisioned(&marks(domain), owner(me), same)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hypervisor::RunState;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    fn owner(uid: &str, namespace: &str, name: &str) -> Owner {
        Owner {
            uid: uid.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn domain(owner: Option<Owner>) -> DomainInfo {
        DomainInfo {
            name: "ns_m1".into(),
            uuid: "0b5a8f1e-8a57-4d6c-9a38-9b4e3c1f6a10".into(),
            state: RunState::Running,
            owner,
            adopted_from: None,
            macs: Vec::new(),
            sizing: None,
        }
    }

    #[test]
    fn a_domain_taken_over_from_this_object_is_never_taken_back() {
        let original = owner("old", "ns", "m1");
        let mut d = domain(Some(owner("new", "ns", "m1")));
        d.adopted_from = Some("old".into());
        let Found::TakenOver(_, why) = classify(d.clone(), &original) else {
            panic!("the original must not re-mark the copy's domain");
        };
        assert!(
            why.contains("taken over by a copy of this machine (object uid new)"),
            "{why}"
        );
        assert!(why.contains("refusing to take it back"), "{why}");
        let c = candidate(d.clone());
        assert!(kit::taken_over(&c.marks, &c.label, super::owner(&original)).is_some());
        assert!(remark_provisioned(
            &d,
            &original,
            Some(&crate::desired::provider_id("h1", &d.uuid)),
            "h1"
        ));
        // The copy owns it; a third object of the same name may still adopt it.
        assert!(matches!(
            classify(d.clone(), &owner("new", "ns", "m1")),
            Found::Owned(_)
        ));
        assert!(matches!(
            classify(d, &owner("third", "ns", "m1")),
            Found::Remark(_)
        ));
    }

    #[rstest]
    #[case::ok("libvirt://h1/ABC-1", Some(("h1", "abc-1")))]
    #[case::other_provider("proxmox://abc", None)]
    #[case::no_uuid("libvirt://h1/", None)]
    #[case::no_host("libvirt:///abc", None)]
    #[case::no_slash("libvirt://abc", None)]
    #[case::extra_segment("libvirt://h1/a/b", None)]
    fn provider_ids_are_parsed_strictly(#[case] id: &str, #[case] want: Option<(&str, &str)>) {
        assert_eq!(
            ProviderId::parse(id),
            want.map(|(host, uuid)| ProviderId {
                host: host.into(),
                uuid: uuid.into()
            })
        );
    }

    #[test]
    fn a_provider_id_written_by_the_provider_parses_back() {
        let id = crate::desired::provider_id("kvm-a", "0B5A8F1E-8A57-4D6C-9A38-9B4E3C1F6A10");
        assert_eq!(
            ProviderId::parse(&id),
            Some(ProviderId {
                host: "kvm-a".into(),
                uuid: "0b5a8f1e-8a57-4d6c-9a38-9b4e3c1f6a10".into()
            })
        );
    }

    #[test]
    fn only_a_domain_defined_for_the_same_namespace_and_name_is_remarked() {
        let me = owner("new", "ns", "m1");
        assert!(matches!(
            classify(domain(Some(owner("new", "ns", "m1"))), &me),
            Found::Owned(_)
        ));
        assert!(matches!(
            classify(domain(Some(owner("old", "ns", "m1"))), &me),
            Found::Remark(_)
        ));
        for other in [
            Some(owner("old", "ns", "m2")),
            Some(owner("old", "other", "m1")),
            None,
        ] {
            let Found::Foreign(_, why) = classify(domain(other.clone()), &me) else {
                panic!("{other:?} must be refused");
            };
            assert!(why.contains("refusing to adopt"), "{why}");
            assert!(why.contains("LibvirtMachine ns/m1"), "{why}");
        }
    }

    #[test]
    fn a_restored_provisioned_machine_remarks_only_its_own_domain() {
        let me = owner("new", "ns", "m1");
        let d = domain(Some(owner("old", "ns", "m1")));
        let id = crate::desired::provider_id("h1", &d.uuid);
        assert!(remark_provisioned(&d, &me, Some(&id), "h1"));
        assert!(!remark_provisioned(&d, &me, Some(&id), "h2"), "other host");
        assert!(!remark_provisioned(&d, &me, None, "h1"), "no providerID");
        assert!(
            !remark_provisioned(
                &d,
                &me,
                Some(&crate::desired::provider_id(
                    "h1",
                    "ffffffff-0000-4000-8000-000000000000"
                )),
                "h1"
            ),
            "other uuid"
        );
        let foreign = domain(Some(owner("old", "ns", "m2")));
        assert!(!remark_provisioned(&foreign, &me, Some(&id), "h1"));
    }
}
