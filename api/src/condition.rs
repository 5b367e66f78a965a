//! `metav1.Condition` helpers: conditions are a list keyed by `type`, and a condition's
//! `lastTransitionTime` moves only when its `status` flips.

use std::fmt;

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The object is ready for use (for infrastructure kinds CAPI mirrors it as the owner's
/// `InfrastructureReady`).
pub const READY: &str = "Ready";
/// The machine exists on the hypervisor and is configured.
pub const PROVISIONED: &str = "Provisioned";
/// Reason of a `…Connected` condition that is True over TLS whose certificate is not verified
/// (`tls.insecureSkipVerify`): usable, and announced by a Warning Event when it starts.
pub const CONNECTED_WITHOUT_TLS_VERIFICATION: &str = "ConnectedWithoutTLSVerification";
/// On a `VirtualMachine`: mirrors the `Ready` condition of the infrastructure object it drives.
pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
/// The object is paused (Cluster `spec.paused` or the `cluster.x-k8s.io/paused` annotation).
pub const PAUSED: &str = "Paused";
/// On an infrastructure machine of every provider: its provisioned VM matches the spec (power
/// state, CPU, memory, disks); False with what is being done (`Updating`, `PoweringOff`, …) or
/// the day-2 problem. `Ready` stays about the VM existing and running.
pub const VM_UP_TO_DATE: &str = "VMUpToDate";
/// On a `VirtualMachine`: mirrors its infrastructure machine's [`VM_UP_TO_DATE`].
pub const UP_TO_DATE: &str = "UpToDate";
/// [`VM_UP_TO_DATE`] reason while a provisioned VM is brought to a changed spec.
pub const UPDATING: &str = "Updating";
/// [`VM_UP_TO_DATE`] reason while a change that needs a restart (CPU, memory) waits for the user
/// to power the running VM off, as `spec.restartPolicy: Manual` (the default) asks; announced by
/// a Warning Event when it appears.
pub const RESTART_REQUIRED: &str = "RestartRequired";

/// `Ready` reason of a provisioned machine whose VM is powered off: provisioned (CAPI's
/// `status.initialization.provisioned` stays true) but not ready.
pub const POWERED_OFF: &str = "PoweredOff";

/// The `Ready` message of a provisioned machine whose VM (`vm`, e.g. "VM 123" or "domain x") is
/// observed powered off, by what `spec.powerState` wants (`None` = On, the default): the same
/// words for every provider.
pub fn powered_off_message(vm: &str, desired: Option<crate::common::PowerState>) -> String {
    match desired.unwrap_or_default() {
        crate::common::PowerState::Off => {
            format!("{vm} is powered off because spec.powerState is Off; set it to On to start the VM")
        }
        crate::common::PowerState::On => {
            format!(
                "{vm} is powered off; the provider starts it because spec.powerState is On (see condition VMUpToDate)"
            )
        }
    }
}

/// `Ready` reasons of an infrastructure machine that only say "my infra cluster is not usable
/// yet" (CAPI's `WaitingForClusterInfrastructure`; `WaitingForCluster` when it does not exist):
/// the real cause is on the infra cluster's own `Ready` condition.
pub const WAITING_FOR_CLUSTER_REASONS: &[&str] = &["WaitingForClusterInfrastructure", "WaitingForCluster"];

/// Whether a machine's `Ready` reason only defers to its infra cluster
/// ([`WAITING_FOR_CLUSTER_REASONS`]).
pub fn waits_for_cluster(reason: &str) -> bool {
    WAITING_FOR_CLUSTER_REASONS.contains(&reason)
}

/// `Ready` reason of a machine whose bootstrap data (user data) cannot be read yet. For a CAPI
/// Machine the bootstrap provider has not produced it; for a machine owned by a
/// `VirtualMachine` the user-data Secret it names does not exist, which the banlieue controller
/// shows as [`USER_DATA_SECRET_NOT_FOUND`].
pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
/// `Ready` reason of a `VirtualMachine` whose `spec.userDataSecretRef` names a Secret that does
/// not exist (in [`NEEDS_HUMAN_REASONS`]).
pub const USER_DATA_SECRET_NOT_FOUND: &str = "UserDataSecretNotFound";

/// `Ready` reasons that mean **a human must act**: nothing changes by waiting or retrying, an
/// operator or the user has to fix credentials, trust, configuration or the spec. A
/// `VirtualMachine` whose `Ready` carries one of them has phase `Failed` (and leaves it as soon
/// as the cause is fixed and the reason changes). Providers and the banlieue controller write
/// these words; a provider that needs a new one adds it here.
///
/// Deliberately absent: reasons that also describe transient faults (`Unreachable`,
/// `VCenterUnreachable`, `CloningFailed` — Proxmox writes the latter for a 5xx during a clone
/// as well; a clone Proxmox refuses for good is `CloneRefused`), and waiting reasons (`WaitingForBootstrapData`, `ProviderFull`: the VM is placed
/// by itself when a slot frees up).
pub const NEEDS_HUMAN_REASONS: &[&str] = &[
    // Credentials and permissions (the Provider's Secret, the API token's rights).
    "AuthenticationFailed",
    "PermissionDenied",
    "CredentialsInvalid",
    "CredentialsNotFound",
    "ProxmoxCredentialsInvalid",
    "ProxmoxAuthenticationFailed",
    // TLS trust (spec.tls: CA bundle or fingerprint).
    "TLSVerificationFailed",
    "CABundleNotFound",
    // The infra cluster (or its Provider) names no endpoint.
    "NoEndpoint",
    // The Provider and its placement.
    "ProviderNotFound",
    "ProviderBackendMismatch",
    "ProviderKindNotInstalled",
    "UnsupportedBackend",
    "NamespaceNotAllowed",
    "NoProviderMatches",
    "InvalidProviderSelector",
    "ProviderDeleting",
    // Images and templates.
    "TemplateNotFound",
    // Proxmox refused the clone request itself (e.g. a template on node-local storage cloned
    // to another node); a clone that may pass on retry is `CloningFailed`.
    "CloneRefused",
    // The template's guest agent is off: addresses can never be read (Proxmox).
    "GuestAgentNotConfigured",
    "BaseVolumeNotFound",
    "ImageNotFound",
    "NoImageSourceForBackend",
    // Hypervisor objects named by the spec or the Provider's defaults.
    "NetworkNotFound",
    "DatastoreNotFound",
    "DatacenterNotFound",
    "FolderNotFound",
    "ResourcePoolNotFound",
    "FailureDomainNotFound",
    "HostNotFound",
    // User data.
    "BootstrapDataInvalid",
    // cloud-init in the guest finished with errors (a failed bootstrap).
    "CloudInitFailed",
    USER_DATA_SECRET_NOT_FOUND,
    "UserDataSecretUnreadable",
    // The spec itself.
    "ClassNotFound",
    "NoSize",
    // A Provider that limits storage, and a VM that declares no disk size to count.
    "StorageNotDeclared",
    "IPAddressInvalid",
    // A field the backend cannot honour (`crate::support`).
    "UnsupportedField",
    "InfrastructureMachineConflict",
    "InfrastructureClusterConflict",
];

/// Whether a `Ready` reason is one of [`NEEDS_HUMAN_REASONS`].
pub fn needs_human(reason: &str) -> bool {
    NEEDS_HUMAN_REASONS.contains(&reason)
}

/// Status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// The controller cannot tell.
    Unknown,
}

impl ConditionStatus {
    /// The wire form: `True`, `False` or `Unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Builds a condition whose `lastTransitionTime` is `now`.
///
/// `reason` must be a CamelCase word (the apiserver validates
/// `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`).
pub fn new_condition(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

/// The condition of the given type, if any.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of the given type exists and is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Sets `new` in `conditions`, keyed by its type, and returns whether anything changed.
///
/// When a condition of that type exists with the same `status`, its `lastTransitionTime` is
/// kept and only `reason`, `message` and `observedGeneration` are updated; when the status
/// flips (or the condition is new) `new.last_transition_time` is used.
pub fn set(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) if existing.status == new.status => {
            let changed = existing.reason != new.reason
                || existing.message != new.message
                || existing.observed_generation != new.observed_generation;
            if changed {
                existing.reason = new.reason;
                existing.message = new.message;
                existing.observed_generation = new.observed_generation;
            }
            changed
        }
        Some(existing) => {
            *existing = new;
            true
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// Removes the condition of the given type; returns whether one was removed.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    #[test]
    fn powered_off_message_says_what_to_do() {
        use crate::common::PowerState;
        assert!(super::powered_off_message("VM 7", Some(PowerState::Off)).contains("set it to On"));
        assert!(super::powered_off_message("VM 7", None).contains("the provider starts it"));
    }

    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("valid timestamp"))
    }

    fn ready(status: ConditionStatus, reason: &str, generation: i64, now: i64) -> Condition {
        new_condition(
            READY,
            status,
            reason,
            format!("{reason} message"),
            Some(generation),
            at(now),
        )
    }

    #[test]
    fn adding_a_new_condition_uses_its_time() {
        let mut conditions = Vec::new();
        assert!(set(
            &mut conditions,
            ready(ConditionStatus::False, "Cloning", 1, 10)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].status, "False");
    }

    #[test]
    fn same_status_keeps_transition_time_but_updates_reason_and_generation() {
        let mut conditions = vec![ready(ConditionStatus::False, "Cloning", 1, 10)];
        assert!(set(
            &mut conditions,
            ready(ConditionStatus::False, "PoweringOn", 2, 20)
        ));
        let c = find(&conditions, READY).expect("Ready present");
        assert_eq!(c.last_transition_time, at(10));
        assert_eq!(c.reason, "PoweringOn");
        assert_eq!(c.message, "PoweringOn message");
        assert_eq!(c.observed_generation, Some(2));
    }

    #[test]
    fn identical_condition_reports_no_change() {
        let mut conditions = vec![ready(ConditionStatus::True, "Running", 3, 10)];
        assert!(!set(
            &mut conditions,
            ready(ConditionStatus::True, "Running", 3, 99)
        ));
        assert_eq!(conditions[0].last_transition_time, at(10));
    }

    #[test]
    fn flipping_status_moves_transition_time() {
        let mut conditions = vec![ready(ConditionStatus::False, "Cloning", 1, 10)];
        assert!(set(
            &mut conditions,
            ready(ConditionStatus::True, "Running", 1, 30)
        ));
        assert_eq!(conditions[0].last_transition_time, at(30));
        assert!(is_true(&conditions, READY));
    }

    #[test]
    fn conditions_are_keyed_by_type() {
        let mut conditions = vec![ready(ConditionStatus::True, "Running", 1, 10)];
        let paused = new_condition(PAUSED, ConditionStatus::False, "NotPaused", "", Some(1), at(11));
        assert!(set(&mut conditions, paused));
        assert_eq!(conditions.len(), 2);
        assert!(!is_true(&conditions, PAUSED));
        assert!(remove(&mut conditions, PAUSED));
        assert!(!remove(&mut conditions, PAUSED));
        assert_eq!(conditions.len(), 1);
    }

    #[test]
    fn reason_sets_are_valid_distinct_condition_reasons() {
        let valid = |r: &str| {
            r.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && r.chars().all(|c| c.is_ascii_alphanumeric() || "_,:".contains(c))
        };
        let all: Vec<&str> = NEEDS_HUMAN_REASONS
            .iter()
            .chain(WAITING_FOR_CLUSTER_REASONS)
            .copied()
            .collect();
        for (i, r) in all.iter().enumerate() {
            assert!(valid(r), "{r} is not a condition reason");
            assert!(!all[i + 1..].contains(r), "{r} listed twice");
        }
        assert!(needs_human("AuthenticationFailed") && !needs_human("Cloning"));
        assert!(waits_for_cluster("WaitingForClusterInfrastructure") && !waits_for_cluster("Cloning"));
    }

    #[test]
    fn status_from_bool() {
        assert_eq!(ConditionStatus::from(true).as_str(), "True");
        assert_eq!(ConditionStatus::from(false).to_string(), "False");
    }
}
