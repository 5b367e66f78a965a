//! Hostile and broken input for what the client decodes from vCenter (SOAP responses, object
//! references, devices): never a panic, a DOCTYPE never expanded, and escaped text reads back
//! as written.

#[path = "../../../../tests/hostile/support.rs"]
mod hostile;

use banlieue_vsphere_client::MoRef;
use banlieue_vsphere_client::device::hardware_of;
use banlieue_vsphere_client::xml::{self, Element};
use hostile::Hostile;

const RESPONSE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<soapenv:Body><RetrievePropertiesExResponse xmlns="urn:vim25"><returnval><objects>
<obj type="VirtualMachine">vm-42</obj>
<propSet><name>config.hardware.device</name><val xsi:type="ArrayOfVirtualDevice">
<VirtualDevice xsi:type="VirtualDisk"><key>2000</key><controllerKey>1000</controllerKey><unitNumber>0</unitNumber>
<capacityInKB>16777216</capacityInKB><backing xsi:type="VirtualDiskFlatVer2BackingInfo"><fileName>[ds] vm/vm.vmdk</fileName></backing></VirtualDevice>
<VirtualDevice xsi:type="VirtualVmxnet3"><key>4000</key><macAddress>00:50:56:12:34:56</macAddress><addressType>assigned</addressType>
<backing xsi:type="VirtualEthernetCardNetworkBackingInfo"><deviceName>VM Network</deviceName><network type="Network">network-7</network></backing></VirtualDevice>
</val></propSet>
<propSet><name>name</name><val xsi:type="xsd:string">a &amp; b &#x41;&#66; <![CDATA[<raw>]]></val></propSet>
</objects></returnval></RetrievePropertiesExResponse></soapenv:Body></soapenv:Envelope>"#;

const FAULT: &str = r#"<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body>
<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>The object 'vim.VirtualMachine:vm-9' has already been deleted</faultstring>
<detail><ManagedObjectNotFoundFault xmlns="urn:vim25" xsi:type="ManagedObjectNotFound"><obj type="VirtualMachine">vm-9</obj></ManagedObjectNotFoundFault></detail>
</soapenv:Fault></soapenv:Body></soapenv:Envelope>"#;

fn walk(el: &Element) {
    let _ = MoRef::from_xml(el);
    if el.local_name() == "val" {
        let _ = hardware_of(el);
    }
    for child in &el.children {
        walk(child);
    }
}

#[test]
fn soap_responses_never_panic_the_parser_or_the_decoders() {
    let mut h = Hostile::new(11);
    assert!(
        xml::parse(RESPONSE).is_ok() && xml::parse(FAULT).is_ok(),
        "the samples are valid"
    );
    for _ in 0..Hostile::cases() {
        if let Ok(doc) = xml::parse(&h.input(&[RESPONSE, FAULT])) {
            walk(&doc);
        }
    }
}

#[test]
fn a_doctype_is_refused_not_expanded() {
    let laughs = r#"<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]><x>&b;</x>"#;
    assert!(xml::parse(laughs).is_err());
}

#[test]
fn escaped_text_reads_back_as_written() {
    let mut h = Hostile::new(12);
    for _ in 0..Hostile::cases() {
        let text = h.string().replace('\r', "");
        let doc = format!("<x a=\"{}\">{}</x>", xml::escape(&text), xml::escape(&text));
        match xml::parse(&doc) {
            // XML has no way to carry most control characters: refusing them is the answer.
            Err(_) => assert!(
                text.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t')),
                "{text:?}"
            ),
            Ok(el) => {
                assert_eq!(el.text, text, "text of {doc:?}");
                assert_eq!(el.attr("a"), Some(text.as_str()), "attribute of {doc:?}");
            }
        }
    }
}

/// Texts of an element and its descendants, in order.
fn texts(el: &Element, out: &mut Vec<String>) {
    out.push(el.text.clone());
    for child in &el.children {
        texts(child, out);
    }
}

#[test]
fn an_element_written_back_reads_back_the_same() {
    // What a call returned and is passed on as it is (an OVF import spec): any text, escaped.
    let mut h = Hostile::new(12);
    for _ in 0..Hostile::cases() {
        let Ok(doc) = xml::parse(&h.input(&[RESPONSE, FAULT])) else {
            continue;
        };
        let written = doc.to_xml("spec");
        let back = xml::parse(&format!(
            "<r xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\">{written}</r>"
        ))
        .unwrap_or_else(|e| panic!("{written:?} does not parse: {e}"));
        let (mut want, mut got) = (Vec::new(), Vec::new());
        texts(&doc, &mut want);
        texts(&back.children[0], &mut got);
        assert_eq!(got, want, "{written:?}");
    }
}
