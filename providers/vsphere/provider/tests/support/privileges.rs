//! The vCenter role the provider needs (test support: the tests run the provider under it and
//! `docs/security.md` lists it; `#[path]`-included by the test binaries that need it): every privilege its calls ask for, each with the call
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

#![allow(dead_code)]

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
