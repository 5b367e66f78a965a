//! Events for condition transitions. One Event per condition whose status or reason changed; a
//! Warning only when a condition turns to its bad state, so a normal state never shows as a
//! Warning (an object that is simply not paused says nothing at all).

use banlieue_api::condition::{self, Condition};
use banlieue_provider_runtime::events::Publisher;
use kube::runtime::events::{Event, EventType, Reporter};
use tracing::warn;

/// Reasons that are a Warning even in a condition's good state: usable, but a human should know
/// (a connection whose TLS certificate is not verified).
const WARNING_REASONS: [&str; 1] = [condition::CONNECTED_WITHOUT_TLS_VERIFICATION];

/// A condition whose transitions are published, and which status is its good one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watched<'a> {
    /// The condition type.
    pub type_: &'a str,
    /// The status that is normal (`True` for `Ready`; `False` for `Paused`).
    pub good: bool,
}

impl<'a> Watched<'a> {
    /// A condition that is good when `True` (`Ready`, `…Connected`).
    pub const fn positive(type_: &'a str) -> Self {
        Self { type_, good: true }
    }

    /// A condition that is normal when `False` (`Paused`): pausing and resuming are Normal
    /// Events, and the first `False` is not an Event.
    pub const fn negative(type_: &'a str) -> Self {
        Self { type_, good: false }
    }
}

/// The Events for the changes from `old` to `new` of the `watched` conditions:
/// `(type, reason, note)`.
pub fn transition_events(
    old: &[Condition],
    new: &[Condition],
    watched: &[Watched<'_>],
) -> Vec<(EventType, String, String)> {
    watched
        .iter()
        .filter_map(|w| {
            let after = condition::find(new, w.type_)?;
            let before = condition::find(old, w.type_);
            if before.is_some_and(|b| b.status == after.status && b.reason == after.reason) {
                return None;
            }
            let is_true = after.status == "True";
            if !w.good && !is_true && before.is_none() {
                return None;
            }
            let type_ = if (w.good && !is_true) || WARNING_REASONS.contains(&after.reason.as_str()) {
                EventType::Warning
            } else {
                EventType::Normal
            };
            let note = if after.message.is_empty() {
                format!("{} is {}", w.type_, after.status)
            } else {
                format!("{} is {}: {}", w.type_, after.status, after.message)
            };
            Some((type_, after.reason.clone(), note))
        })
        .collect()
}

/// The Event publisher of one controller, reporting as `controller` (and the Pod, `$POD_NAME`).
pub fn recorder(client: kube::Client, controller: &str) -> Publisher {
    Publisher::new(
        client,
        Reporter {
            controller: controller.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        },
    )
}

/// Publishes `events` about the object; a failure is logged (an Event is never worth a retry).
pub async fn publish<K: kube::Resource<DynamicType = ()>>(
    recorder: &Publisher,
    object: &K,
    events: Vec<(EventType, String, String)>,
) {
    for (type_, reason, note) in events {
        let event = Event {
            type_,
            reason,
            note: Some(note),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &object.object_ref(&())).await {
            warn!(error = %e, "cannot publish an Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::condition::ConditionStatus;
    use pretty_assertions::assert_eq;

    fn c(type_: &str, status: ConditionStatus, reason: &str, message: &str) -> Condition {
        crate::status::condition(type_, status, reason, message, Some(1))
    }

    const WATCHED: &[Watched<'static>] = &[
        Watched::positive("Ready"),
        Watched::positive("ProxmoxConnected"),
        Watched::negative("Paused"),
    ];

    #[test]
    fn events_follow_status_or_reason_transitions_only() {
        let old = vec![
            c(
                "Ready",
                ConditionStatus::False,
                "WaitingForControlPlaneEndpoint",
                "",
            ),
            c("ProxmoxConnected", ConditionStatus::True, "Connected", ""),
        ];
        assert_eq!(transition_events(&[], &old, WATCHED).len(), 2);
        let same = vec![
            c(
                "Ready",
                ConditionStatus::False,
                "WaitingForControlPlaneEndpoint",
                "other text",
            ),
            c("ProxmoxConnected", ConditionStatus::True, "Connected", ""),
        ];
        assert!(transition_events(&old, &same, WATCHED).is_empty());
        let new = vec![
            c("Ready", ConditionStatus::True, "Provisioned", ""),
            c(
                "ProxmoxConnected",
                ConditionStatus::False,
                "AuthenticationFailed",
                "401 no ticket",
            ),
        ];
        assert_eq!(
            transition_events(&old, &new, WATCHED),
            vec![
                (
                    EventType::Normal,
                    "Provisioned".to_owned(),
                    "Ready is True".to_owned()
                ),
                (
                    EventType::Warning,
                    "AuthenticationFailed".to_owned(),
                    "ProxmoxConnected is False: 401 no ticket".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn not_being_paused_is_no_event_and_pausing_is_never_a_warning() {
        let not_paused = vec![c("Paused", ConditionStatus::False, "NotPaused", "")];
        assert!(transition_events(&[], &not_paused, WATCHED).is_empty());
        let paused = vec![c("Paused", ConditionStatus::True, "Paused", "annotation")];
        let pausing = transition_events(&not_paused, &paused, WATCHED);
        assert_eq!(pausing.len(), 1);
        assert_eq!(pausing[0].0, EventType::Normal);
        let resuming = transition_events(&paused, &not_paused, WATCHED);
        assert_eq!(resuming.len(), 1);
        assert_eq!(resuming[0].0, EventType::Normal);
        assert_eq!(resuming[0].1, "NotPaused");
    }

    #[test]
    fn a_connection_without_tls_verification_is_a_warning_once() {
        let verified = vec![c("ProxmoxConnected", ConditionStatus::True, "Connected", "")];
        let unverified = vec![c(
            "ProxmoxConnected",
            ConditionStatus::True,
            condition::CONNECTED_WITHOUT_TLS_VERIFICATION,
            "not verified",
        )];
        let events = transition_events(&verified, &unverified, WATCHED);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].0, EventType::Warning);
        assert!(transition_events(&unverified, &unverified, WATCHED).is_empty());
        let back = transition_events(&unverified, &verified, WATCHED);
        assert_eq!(back[0].0, EventType::Normal);
    }
}
