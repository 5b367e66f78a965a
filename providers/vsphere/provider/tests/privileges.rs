//! The documented vCenter role (`support/privileges.rs`): `docs/security.md` lists exactly it, each
//! privilege once.

#[path = "support/privileges.rs"]
mod privileges;

use privileges::{ROLE, role_table};

const SECURITY_DOC: &str = include_str!("../../../../docs/security.md");
const BEGIN: &str =
    "<!-- vcenter-role: generated from providers/vsphere/provider/tests/support/privileges.rs -->\n";
const END: &str = "<!-- /vcenter-role -->";

/// The documented role is the one the scenario suite runs under. To update the page after a
/// change of [`ROLE`]: `BANLIEUE_UPDATE_DOCS=1 cargo test -p banlieue-vsphere --test privileges`.
#[test]
fn the_security_page_lists_exactly_the_role() {
    let start = SECURITY_DOC
        .find(BEGIN)
        .expect("the role's markers in docs/security.md")
        + BEGIN.len();
    let end = SECURITY_DOC[start..].find(END).expect("the end marker") + start;
    let want = role_table();
    if std::env::var_os("BANLIEUE_UPDATE_DOCS").is_some() {
        let page = format!("{}{want}{}", &SECURITY_DOC[..start], &SECURITY_DOC[end..]);
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../../docs/security.md"),
            page,
        )
        .unwrap();
        return;
    }
    assert_eq!(
        &SECURITY_DOC[start..end],
        want,
        "docs/security.md lists another vCenter role: BANLIEUE_UPDATE_DOCS=1 cargo test -p banlieue-vsphere --test privileges"
    );
}

#[test]
fn each_privilege_is_listed_once() {
    let mut seen = std::collections::BTreeSet::new();
    for (privilege, calls) in ROLE {
        assert!(seen.insert(privilege), "{privilege} twice");
        assert!(
            !calls.is_empty() && privilege.contains('.'),
            "{privilege}: {calls}"
        );
    }
}
