//! The vCenter role the provider needs: every privilege its calls ask for, each with the call
//! that asks (vSphere's API reference, "Required Privileges" of each method). Grant it on the
//! datacenter, or on the template, folder, resource pool, datastores and port groups the
//! provider uses. The scenario suite runs under exactly this role on a vcsim that makes
//! vCenter's checks (`tests/controlplane/vcsim/privileges.go`), so a privilege missing here
//! fails a test.
//!
//! Reading the inventory needs `System.View` and `System.Read`, which every role has. Not
//! covered: tagging (`spec.tagsFromLabels` goes through the vAPI REST endpoint, whose
//! privileges, `InventoryService.Tagging.*`, no test here checks) and a `tpm` (vSphere's
//! cryptographic privileges for a vTPM).

/// The role: `(privilege, the calls that need it)`.
pub const ROLE: &[(&str, &str)] = &[
    (
        "VirtualMachine.Provisioning.DeployTemplate",
        "CloneVM_Task from a template",
    ),
    (
        "VirtualMachine.Provisioning.Clone",
        "CloneVM_Task when spec.source.template names a virtual machine that is not a template",
    ),
    (
        "VirtualMachine.Inventory.CreateFromExisting",
        "CloneVM_Task: the new VM in its folder",
    ),
    (
        "Resource.AssignVMToPool",
        "CloneVM_Task and ImportVApp: the new VM in its resource pool",
    ),
    (
        "Datastore.AllocateSpace",
        "CloneVM_Task, ImportVApp and ReconfigVM_Task: disks on the datastore, new or grown",
    ),
    (
        "Network.Assign",
        "CloneVM_Task and ReconfigVM_Task: NICs on their port groups",
    ),
    ("VirtualMachine.Config.CPUCount", "ReconfigVM_Task: spec.cpu"),
    ("VirtualMachine.Config.Memory", "ReconfigVM_Task: spec.memoryMiB"),
    (
        "VirtualMachine.Config.AdvancedConfig",
        "ReconfigVM_Task: guestinfo (user data, metadata, network config) and the owner marks in extraConfig",
    ),
    ("VirtualMachine.Config.AddNewDisk", "ReconfigVM_Task: data disks"),
    (
        "VirtualMachine.Config.DiskExtend",
        "ReconfigVM_Task: the template's disks grown",
    ),
    (
        "VirtualMachine.Config.EditDevice",
        "ReconfigVM_Task: a NIC moved to another port group",
    ),
    (
        "VirtualMachine.Config.AddRemoveDevice",
        "ReconfigVM_Task: NICs, PCI devices and the vTPM added",
    ),
    (
        "VirtualMachine.Config.Resource",
        "ReconfigVM_Task: the memory reservation PCI passthrough needs",
    ),
    (
        "VirtualMachine.Config.Settings",
        "ReconfigVM_Task: firmware and Secure Boot",
    ),
    (
        "VirtualMachine.Config.Rename",
        "Rename_Task: an imported OVA's VM takes its template name once complete",
    ),
    ("VirtualMachine.Interact.PowerOn", "PowerOnVM_Task"),
    (
        "VirtualMachine.Interact.PowerOff",
        "PowerOffVM_Task, ShutdownGuest",
    ),
    (
        "VirtualMachine.Inventory.Delete",
        "Destroy_Task: the machine's VM, an import left half-done",
    ),
    (
        "VirtualMachine.Provisioning.MarkAsTemplate",
        "MarkAsTemplate: an imported OVA's VM becomes the template",
    ),
    ("VApp.Import", "ImportVApp: a template imported from an OVA"),
    (
        "VirtualMachine.Inventory.Create",
        "ImportVApp: the imported VM created in its folder (CreateVM_Task's privileges)",
    ),
];

/// The privileges of [`ROLE`], comma-separated (what `vcsim -role-privileges` takes).
pub fn role_privileges() -> String {
    ROLE.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(",")
}

/// [`ROLE`] as the Markdown table of `docs/security.md`.
pub fn role_table() -> String {
    let mut table = String::from("| privilege | asked by |\n|---|---|\n");
    for (privilege, calls) in ROLE {
        table.push_str(&format!("| `{privilege}` | {calls} |\n"));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECURITY_DOC: &str = include_str!("../../../../docs/security.md");
    const BEGIN: &str = "<!-- vcenter-role: generated from banlieue_vsphere::privileges::ROLE -->\n";
    const END: &str = "<!-- /vcenter-role -->";

    /// The documented role is the one the scenario suite runs under. To update the page after a
    /// change of [`ROLE`]: `BANLIEUE_UPDATE_DOCS=1 cargo test -p banlieue-vsphere --lib privileges`.
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
            "docs/security.md lists another vCenter role: BANLIEUE_UPDATE_DOCS=1 cargo test -p banlieue-vsphere --lib privileges"
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
}
