//! Powering a running guest off (for a change that needs the VM off, or `spec.powerState:
//! Off`), by the same rule on every hypervisor: the guest is asked to shut down (ACPI, VMware
//! Tools) and is powered off hard only once it ignored the request for [`SHUTDOWN_TIMEOUT`].
//! The time of the first request is persisted in `status.provisioning` (`taskID`
//! [`SHUTDOWN_TASK`], `taskStartedAt`), so a restarted controller keeps counting instead of
//! asking again from zero.

use std::time::Duration;

use banlieue_api::common::ProvisioningStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// How long a guest may ignore a shutdown request before it is powered off hard.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(120);
/// `status.provisioning.taskID` while a guest shutdown is pending.
pub const SHUTDOWN_TASK: &str = "guest-shutdown";
/// The libvirt provider's id for it before the kit owned the rule, still read (a shutdown
/// pending across an upgrade keeps its time) and cleared.
const LEGACY_SHUTDOWN_TASKS: [&str; 1] = ["acpi-shutdown"];

fn is_shutdown_task(id: Option<&str>) -> bool {
    id.is_some_and(|id| id == SHUTDOWN_TASK || LEGACY_SHUTDOWN_TASKS.contains(&id))
}
/// The `VMUpToDate` message of a running VM whose `changes` (CPU, memory, …) wait for a restart
/// that `spec.restartPolicy: Manual` (the default) leaves to its user: what waits, and the two
/// ways to apply it. The same words on every hypervisor.
pub fn restart_required_message(changes: &str) -> String {
    format!(
        "{changes} wait for a restart, which spec.restartPolicy Manual leaves to you: power the VM \
         off (spec.powerState: Off, then On) or set spec.restartPolicy: Automatic"
    )
}

/// Event reason of a hard power-off after the guest ignored the shutdown request.
pub const POWERED_OFF_FORCIBLY: &str = "PoweredOffForcibly";

/// When the pending guest shutdown was first requested, if one is pending.
pub fn shutdown_requested_at(provisioning: Option<&ProvisioningStatus>) -> Option<Timestamp> {
    provisioning
        .filter(|p| is_shutdown_task(p.task_id.as_deref()))
        .and_then(|p| p.task_started_at.as_ref())
        .map(|t| t.0)
}

/// Records the pending shutdown first requested at `requested_at` in `provisioning`; `None`
/// clears a recorded one (any other task is left alone).
pub fn record_shutdown(provisioning: &mut ProvisioningStatus, requested_at: Option<Timestamp>) {
    match requested_at {
        Some(at) => {
            provisioning.task_id = Some(SHUTDOWN_TASK.to_owned());
            provisioning.task_started_at = Some(Time(at));
        }
        None if is_shutdown_task(provisioning.task_id.as_deref()) => {
            provisioning.task_id = None;
            provisioning.task_started_at = None;
        }
        None => {}
    }
}

/// Whether a guest asked to shut down at `requested_at` has ignored it for
/// [`SHUTDOWN_TIMEOUT`] by `now` (never when no shutdown was requested).
pub fn shutdown_overdue(requested_at: Option<Timestamp>, now: Timestamp) -> bool {
    requested_at
        .and_then(|at| Duration::try_from(now.duration_since(at)).ok())
        .is_some_and(|waited| waited >= SHUTDOWN_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shutdown_is_recorded_survives_a_restart_and_is_overdue_after_the_timeout() {
        let mut p = ProvisioningStatus::default();
        assert_eq!(shutdown_requested_at(Some(&p)), None);
        let at: Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
        record_shutdown(&mut p, Some(at));
        // What a restarted controller reads back.
        let read = shutdown_requested_at(Some(&p));
        assert_eq!(read, Some(at));
        let later = |secs: i64| at + k8s_openapi::jiff::SignedDuration::from_secs(secs);
        assert!(!shutdown_overdue(read, later(119)));
        assert!(shutdown_overdue(read, later(120)));
        assert!(!shutdown_overdue(None, later(1000)));
        // A clock behind the request is not overdue.
        assert!(!shutdown_overdue(read, later(-5)));
        record_shutdown(&mut p, None);
        assert_eq!((p.task_id, p.task_started_at), (None, None));
    }

    #[test]
    fn a_shutdown_recorded_under_the_old_libvirt_id_is_read_and_cleared() {
        let at: Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
        let mut p = ProvisioningStatus {
            task_id: Some("acpi-shutdown".into()),
            task_started_at: Some(Time(at)),
            ..ProvisioningStatus::default()
        };
        assert_eq!(shutdown_requested_at(Some(&p)), Some(at));
        record_shutdown(&mut p, None);
        assert_eq!((p.task_id, p.task_started_at), (None, None));
    }

    #[test]
    fn clearing_leaves_another_task_alone() {
        let mut p = ProvisioningStatus {
            task_id: Some("task-7".into()),
            ..ProvisioningStatus::default()
        };
        record_shutdown(&mut p, None);
        assert_eq!(p.task_id.as_deref(), Some("task-7"));
    }
}
