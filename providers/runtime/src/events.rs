//! Publishing Kubernetes Events (`events.k8s.io/v1`) without keeping them.
//!
//! kube's `Recorder` keeps every Event it published for six minutes, to turn a repeat into a
//! series (a patch of the first Event's count). banlieue's managers publish an Event per
//! transition (a condition's status or reason, a lifecycle step), never the same one in a
//! loop, so that memory would buy nothing: at 1,000 machines it is thousands of Events held
//! (and scanned at each publish) in each manager. [`Publisher`] takes the same [`Event`] and
//! [`ObjectReference`] and creates the Event as the `Recorder` names and fills it, and keeps
//! nothing; a repeat is a second Event.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

/// Creates Events as one reporter (a controller, and the Pod it runs in).
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    reporter: Reporter,
}

impl Publisher {
    /// A publisher reporting as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// Creates `event` about the object `regarding`, in its namespace (`default` without one).
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let event = kube_event(&self.reporter, event, regarding, Timestamp::now());
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        Api::<KubeEvent>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
    }
}

/// The Event object for `event` about `regarding` at `now`: named `<object>.<nanoseconds, hex>`
/// and filled as kube's `Recorder` does, without a series.
fn kube_event(reporter: &Reporter, event: &Event, regarding: &ObjectReference, now: Timestamp) -> KubeEvent {
    KubeEvent {
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or(&reporter.controller),
                now.as_nanosecond()
            )),
            ..ObjectMeta::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        ..KubeEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_named_after_its_object_and_filled_as_the_recorder_fills_it() {
        let reporter = Reporter {
            controller: "banlieue-proxmox".to_owned(),
            instance: None,
        };
        let regarding = ObjectReference {
            kind: Some("ProxmoxMachine".to_owned()),
            namespace: Some("team-a".to_owned()),
            name: Some("web-1".to_owned()),
            uid: Some("0b5e".to_owned()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "CloneFailed".to_owned(),
            note: Some("Ready is False: clone failed".to_owned()),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        let now: Timestamp = "2026-12-05T19:00:00Z".parse().unwrap();

        let made = kube_event(&reporter, &event, &regarding, now);

        assert_eq!(made.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            made.metadata.name,
            Some(format!("web-1.{:x}", now.as_nanosecond()))
        );
        assert_eq!(made.type_.as_deref(), Some("Warning"));
        assert_eq!(made.reason.as_deref(), Some("CloneFailed"));
        assert_eq!(made.action.as_deref(), Some("Reconcile"));
        assert_eq!(made.note, event.note);
        assert_eq!(made.regarding, Some(regarding));
        assert_eq!(made.event_time, Some(MicroTime(now)));
        assert_eq!(made.reporting_controller.as_deref(), Some("banlieue-proxmox"));
        assert_eq!(
            made.reporting_instance.as_deref(),
            Some("banlieue-proxmox"),
            "without a Pod name, the controller is the instance"
        );
        assert_eq!(made.series, None);
    }
}
