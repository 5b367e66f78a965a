//! What a failed Proxmox VE task means for the step that started it.
//!
//! A real Proxmox VE answers most requests with a task, and most failures happen inside the
//! task, not in the HTTP answer (`REAL-PVE.md` R1): a clone that cannot get the storage or
//! config lock within its timeout, a start refused because a backup holds the VM's lock, a
//! VMID already used by a guest on another node. PVE reports them only as the task's
//! `exitstatus` text, which is classified here, as other Proxmox clients do:
//!
//! - [`TaskFailure::Busy`]: Proxmox was busy (a lock, a timeout, a worker that could not
//!   start): the same step is tried again after a backoff, without a human.
//! - [`TaskFailure::VmidTaken`]: the VMID is used by a guest the synchronous check did not see
//!   (another node's VM or container): the clone is redone with another VMID.
//! - [`TaskFailure::Refused`]: anything else (full or missing storage, a bad parameter): the
//!   condition says what Proxmox said, and the step is tried again slowly, so a fix made on
//!   Proxmox is picked up without touching the machine.
//!
//! Whatever the class, the failed task's UPID is dropped from the phase: the next step
//! re-inspects the VM instead of polling the same failed task forever.

/// The class of a failed task (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskFailure {
    /// A lock, a timeout, a busy storage: retried with backoff.
    Busy,
    /// The new VMID is taken (only a clone meets it): cloned again with another VMID.
    VmidTaken,
    /// Needs a change on Proxmox or in the spec: reported, retried slowly.
    Refused,
}

/// Texts of a task that failed because Proxmox was busy (lower case). PVE's lock helpers say
/// `can't lock file '…' - got timeout`, `cfs-lock '…' error: got lock request timeout` and
/// `VM 101 is locked (backup)`; a worker that could not be forked says `got no worker upid`;
/// a task interrupted by a node or daemon restart says `interrupted by signal`.
const BUSY: &[&str] = &[
    "can't lock file",
    "got timeout",
    "lock request timeout",
    "is locked",
    "cfs-lock",
    "got no worker upid",
    "interrupted by signal",
    "resource busy",
    "timeout waiting",
];

/// Texts of a clone whose new VMID turned out to be taken: pmxcfs refuses to create a second
/// config of that VMID (`close (rename) atomic file '…' failed: File exists`), or the
/// synchronous check's own wording when the guest appeared meanwhile.
const VMID_TAKEN: &[&str] = &["file exists", "config file already exists", "already exists"];

/// Classifies a task's `exitstatus`.
pub fn classify(exitstatus: &str) -> TaskFailure {
    let lower = exitstatus.to_ascii_lowercase();
    if BUSY.iter().any(|t| lower.contains(t)) {
        TaskFailure::Busy
    } else if VMID_TAKEN.iter().any(|t| lower.contains(t)) {
        TaskFailure::VmidTaken
    } else {
        TaskFailure::Refused
    }
}

/// Condition reason while a step is retried because Proxmox was busy.
pub const PROXMOX_BUSY: &str = "ProxmoxBusy";

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    // Exit statuses as real Proxmox VE writes them (from qemu-server, pve-cluster and pve-storage,
    // and the trackers quoted in REAL-PVE.md R1).
    #[rstest]
    #[case("clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout")]
    #[case("clone failed: cfs-lock 'storage-ceph' error: got lock request timeout")]
    #[case("VM 101 is locked (backup)")]
    #[case("can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout")]
    #[case("got no worker upid - start worker failed")]
    #[case("interrupted by signal")]
    #[case("VM 101 qmp command 'query-version' failed - got timeout")]
    fn busy_proxmox_is_retried(#[case] exitstatus: &str) {
        assert_eq!(classify(exitstatus), TaskFailure::Busy);
    }

    #[rstest]
    #[case(
        "clone failed: close (rename) atomic file '/etc/pve/nodes/pve2/qemu-server/105.conf' failed: File exists"
    )]
    #[case("unable to create VM 105: config file already exists")]
    fn a_taken_vmid_is_redone_elsewhere(#[case] exitstatus: &str) {
        assert_eq!(classify(exitstatus), TaskFailure::VmidTaken);
    }

    #[rstest]
    #[case(
        "clone failed: lvcreate 'pve/vm-105-disk-0' error:   Volume group \"pve\" has insufficient free space"
    )]
    #[case("storage 'fast' does not exist")]
    #[case("unable to parse value of 'net0' - format error")]
    fn anything_else_needs_a_change(#[case] exitstatus: &str) {
        assert_eq!(classify(exitstatus), TaskFailure::Refused);
    }
}
