//! Re-adoption of a domain whose LibvirtMachine was created anew: `clusterctl move` re-creates
//! every object on the target cluster with a **new UID and no status**, and a restore from a
//! backup does the same. The domain still carries the owner marker of the old object (its
//! `<metadata>` names the UID, namespace and name it was defined for); the new object knows
//! the domain only by its `spec.providerID` (`libvirt://<host>/<domain uuid>`, which does move).
//!
//! Without this, the new object would start provisioning from scratch: its default domain uuid
//! is its (new) UID, so it would find no domain by uuid, rewrite the seed volume and stop on a
//! name conflict, and deleting it would leak the domain.
//!
//! The domain is re-marked for the new object only when all of this holds, so a machine can
//! never take over a domain that was not defined for it:
//! - the host named in `spec.providerID` is a failure domain of the LibvirtCluster;
//! - a domain with the uuid of `spec.providerID` exists there;
//! - its banlieue metadata names **this** LibvirtMachine (`namespace/name`, which `clusterctl
//!   move` keeps).
//!
//! Re-marking records the previous owner's UID on the domain (attribute
//! [`xml::ADOPTED_FROM`](crate::xml::ADOPTED_FROM) of the owner element). An object whose UID
//! the domain was taken over from never re-marks it back ([`taken_over`]): when the original
//! object still exists next to its copy (e.g. `clusterctl move --to-directory` then
//! `--from-directory` into a second management cluster while the first keeps running), the two
//! would otherwise take the domain from each other forever.
//!
//! A domain with the right uuid but marked for another object is refused; no domain with that
//! uuid means it was deleted behind the provider's back (never defined again: the Machine's
//! providerID is fixed, CAPI's health checks replace the machine).

use crate::desired::PROVIDER_ID_PREFIX;
use crate::hypervisor::{DomainInfo, ErrorKind, HvError, Hypervisor};
use crate::provision::StepError;
use crate::xml::Owner;

/// Condition reason of a refused or failed adoption.
pub const ADOPTION_FAILED: &str = "AdoptionFailed";
/// Condition reason when the domain of `spec.providerID` does not exist.
pub const VM_NOT_FOUND: &str = "VMNotFound";

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
    ProviderId::parse(provider_id).ok_or_else(|| StepError::Permanent {
        reason: ADOPTION_FAILED,
        message: format!("spec.providerID {provider_id:?} is not a {PROVIDER_ID_PREFIX}<host>/<uuid> ID"),
    })
}

/// What the search for the domain named by `spec.providerID` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// No domain has that uuid on that host.
    Missing,
    /// The domain already carries this object's owner marker.
    Owned(DomainInfo),
    /// The domain was defined for this object's previous incarnation: re-mark it.
    Remark(DomainInfo),
    /// The domain has that uuid but was not defined for this machine (why).
    Foreign(DomainInfo, String),
    /// The domain was taken over from this very object by a copy of it (why): never taken back.
    TakenOver(DomainInfo, String),
}

/// When the domain was re-marked for a copy of `me` (it records that it was adopted from `me`'s
/// UID) and no longer carries `me`'s UID: why `me` must not take it back.
pub fn taken_over(domain: &DomainInfo, me: &Owner) -> Option<String> {
    let current = domain.owner.as_ref().map(|o| o.uid.as_str());
    (domain.adopted_from.as_deref() == Some(me.uid.as_str()) && current != Some(me.uid.as_str())).then(|| {
        format!(
            "domain {} ({}) was taken over by a copy of this machine (object uid {}), created by clusterctl move or a restore while this object still exists; refusing to take it back",
            domain.name,
            domain.uuid,
            current.unwrap_or("unknown")
        )
    })
}

/// Whether the domain's banlieue metadata names `me`'s namespace and name (any UID).
pub fn created_for(domain: &DomainInfo, me: &Owner) -> bool {
    domain
        .owner
        .as_ref()
        .is_some_and(|o| o.namespace == me.namespace && o.name == me.name)
}

/// Classifies the domain with the providerID's uuid for the machine `me`.
pub fn classify(domain: DomainInfo, me: &Owner) -> Found {
    if domain.owner.as_ref().is_some_and(|o| o.uid == me.uid) {
        return Found::Owned(domain);
    }
    if let Some(why) = taken_over(&domain, me) {
        return Found::TakenOver(domain, why);
    }
    if created_for(&domain, me) {
        return Found::Remark(domain);
    }
    let marked = match &domain.owner {
        Some(o) => format!(
            "it was defined by banlieue-libvirt for LibvirtMachine {}/{}",
            o.namespace, o.name
        ),
        None => "it carries no banlieue-libvirt owner metadata".to_owned(),
    };
    let why = format!(
        "domain {} ({}) has this machine's providerID but {marked}, not for LibvirtMachine {}/{}; refusing to adopt it",
        domain.name, domain.uuid, me.namespace, me.name
    );
    Found::Foreign(domain, why)
}

/// A libvirt error while adopting: retried with backoff unless libvirt refuses the call itself.
fn hv_error(source: HvError) -> StepError {
    match source.kind {
        ErrorKind::Other | ErrorKind::Unsupported => StepError::Permanent {
            reason: ADOPTION_FAILED,
            message: source.to_string(),
        },
        ErrorKind::Transient | ErrorKind::NotFound | ErrorKind::Exists => StepError::Transient {
            reason: ADOPTION_FAILED,
            source,
        },
    }
}

/// Looks up the domain `uuid` on `hv` and classifies it for `me`.
pub async fn find<H: Hypervisor>(hv: &H, me: &Owner, uuid: &str) -> Result<Found, StepError> {
    Ok(match hv.domain_by_uuid(uuid).await.map_err(hv_error)? {
        None => Found::Missing,
        Some(d) => classify(d, me),
    })
}

/// Re-marks a domain found by [`find`] as [`Found::Remark`] for `me` (metadata only: the domain
/// is neither redefined nor restarted), recording the previous owner's UID as the one it was
/// adopted from, and returns it as now owned. A domain taken over from `me` ([`taken_over`]) is
/// refused with [`ADOPTION_FAILED`] and not written to.
pub async fn remark<H: Hypervisor>(hv: &H, domain: DomainInfo, me: &Owner) -> Result<DomainInfo, StepError> {
    if let Some(why) = taken_over(&domain, me) {
        return Err(StepError::Permanent {
            reason: ADOPTION_FAILED,
            message: why,
        });
    }
    let adopted_from = match &domain.owner {
        Some(o) if o.uid != me.uid => Some(o.uid.clone()),
        _ => domain.adopted_from.clone(),
    };
    hv.set_domain_owner(&domain.uuid, me, adopted_from.as_deref())
        .await
        .map_err(hv_error)?;
    Ok(DomainInfo {
        owner: Some(me.clone()),
        adopted_from,
        ..domain
    })
}

/// What deleting a machine with `spec.providerID` but no domain in its status (a copy made by
/// `clusterctl move` or a restore that was never adopted) does with the domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnDeletion {
    /// The domain carries this object's UID: delete it.
    Delete(DomainInfo),
    /// The domain was created for an earlier object of this name: left untouched (Event text).
    LeftInPlace(String),
    /// No domain of this machine's (missing, or another object's): nothing to do (Event text).
    Nothing(String),
}

/// Decides [`OnDeletion`] for the domain `uuid` on `host`; never writes to the domain.
pub async fn on_deletion<H: Hypervisor>(
    hv: &H,
    me: &Owner,
    host: &str,
    uuid: &str,
) -> Result<OnDeletion, StepError> {
    Ok(match find(hv, me, uuid).await? {
        Found::Owned(d) => OnDeletion::Delete(d),
        Found::Remark(d) => OnDeletion::LeftInPlace(format!(
            "domain {} ({}) on host {host} left untouched: it was created for an earlier object of this name (uid {}), not this one; delete it by hand if it is no longer wanted",
            d.name,
            d.uuid,
            d.owner.as_ref().map_or("unknown", |o| o.uid.as_str())
        )),
        Found::Missing => OnDeletion::Nothing(format!(
            "no domain has the uuid of spec.providerID ({uuid}) on host {host}: nothing deleted"
        )),
        Found::Foreign(d, _) | Found::TakenOver(d, _) => OnDeletion::Nothing(format!(
            "domain {} ({}) on host {host} named by spec.providerID is owned by another object ({}): left untouched, nothing deleted",
            d.name,
            d.uuid,
            d.owner.as_ref().map_or_else(
                || "no banlieue-libvirt owner metadata".to_owned(),
                |o| format!("LibvirtMachine {}/{} uid {}", o.namespace, o.name, o.uid)
            )
        )),
    })
}

/// For a provisioned machine whose domain does not carry its UID: whether the domain is this
/// machine's from before it was re-created (restored with its status): `spec.providerID` names
/// this host and domain, and the domain was defined for this `namespace/name`.
pub fn remark_provisioned(domain: &DomainInfo, me: &Owner, provider_id: Option<&str>, host: &str) -> bool {
    provider_id
        .and_then(ProviderId::parse)
        .is_some_and(|p| p.host == host && p.uuid == domain.uuid.to_ascii_lowercase())
        && created_for(domain, me)
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
        assert!(taken_over(&d, &original).is_some());
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
