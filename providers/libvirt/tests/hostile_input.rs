//! Hostile and broken input for what the provider reads back from libvirt (a domain's owner
//! marks, sizing, MACs) and from users (providerIDs): never a panic; owner marks with any
//! characters read back as written.

#[path = "../../../tests/hostile/support.rs"]
mod hostile;

use banlieue_libvirt::readopt::ProviderId;
use banlieue_libvirt::xml::{
    Owner, adopted_from_xml, escape, macs_from_xml, owner_element, owner_from_xml, sizing_from_xml, unescape,
};
use hostile::Hostile;

const DOMAIN: &str = "<domain type='kvm'><name>m1</name><uuid>3f2c1d4e-0000-4000-8000-00000000a001</uuid>\
<metadata><lv:owner xmlns:lv=\"https://banlieue.io/libvirt/v1alpha1\" uid='u&amp;1' namespace='ns' name='n' adopted-from='old'/></metadata>\
<memory unit='KiB'>2097152</memory><vcpu placement='static'>2</vcpu><cpu><topology sockets='1' cores='2' threads='1'/></cpu>\
<devices><interface type='network'><mac address='52:54:00:12:34:56'/><source network='default'/></interface></devices></domain>";

#[test]
fn domain_xml_never_panics_the_readers() {
    let mut h = Hostile::new(21);
    for _ in 0..Hostile::cases() {
        let xml = h.input(&[DOMAIN]);
        let _ = owner_from_xml(&xml);
        let _ = adopted_from_xml(&xml);
        let _ = sizing_from_xml(&xml);
        let _ = macs_from_xml(&xml);
    }
}

#[test]
fn owner_marks_with_any_characters_read_back_as_written() {
    let mut h = Hostile::new(22);
    for _ in 0..Hostile::cases() {
        let owner = Owner {
            uid: h.string(),
            namespace: h.string(),
            name: h.string(),
        };
        let adopted_from = h.string();
        let xml = format!(
            "<domain><metadata>{}</metadata></domain>",
            owner_element(&owner, Some(&adopted_from))
        );
        let short = |s: &str| s.chars().take(200).collect::<String>();
        assert!(
            owner_from_xml(&xml) == Some(owner.clone()),
            "owner of {:?}",
            short(&xml)
        );
        assert!(
            adopted_from_xml(&xml) == Some(adopted_from.clone()).filter(|a| !a.is_empty()),
            "adopted-from of {:?}",
            short(&xml)
        );
        let text = h.string();
        assert!(unescape(&escape(&text)) == text, "{:?}", short(&text));
    }
}

#[test]
fn provider_ids_never_panic_and_name_one_host_and_uuid() {
    let mut h = Hostile::new(23);
    for _ in 0..Hostile::cases() {
        let id = h.input(&[
            "libvirt://host-a/3f2c1d4e-0000-4000-8000-00000000a001",
            "libvirt://h/u",
        ]);
        if let Some(parsed) = ProviderId::parse(&id) {
            assert!(
                !parsed.host.is_empty() && !parsed.uuid.is_empty() && !parsed.uuid.contains('/'),
                "{id:?}"
            );
        }
    }
}
