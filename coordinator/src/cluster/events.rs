//! Kubernetes Events for what the scheduler decided or refused.
//!
//! Written as core/v1 Events (what `kubectl describe` shows) rather than through kube-runtime's
//! `Recorder`, because the recorder folds events that differ only in their message into one
//! series and keeps the first message: a changed reason must show up with its own text.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};

/// Event reason when a pod is bound.
pub const SCHEDULED: &str = "Scheduled";
/// Event reason when a pod stays pending (and why).
pub const FAILED_SCHEDULING: &str = "FailedScheduling";
/// Event reason when a pod is evicted (the message names the cause).
pub const EVICTED: &str = "Evicted";
/// Event reason when a bind or eviction call failed.
pub const BIND_FAILED: &str = "FailedBinding";
/// Event reason when a CRD object is malformed.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// Severity of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Expected.
    Normal,
    /// Needs attention.
    Warning,
}

/// Writes Events naming this scheduler as their source.
#[derive(Clone)]
pub struct EventWriter {
    client: kube::Client,
    component: String,
    instance: String,
}

impl EventWriter {
    /// Events reported by `component` (the scheduler name) from replica `instance`.
    pub fn new(client: kube::Client, component: &str, instance: &str) -> Self {
        Self {
            client,
            component: component.to_owned(),
            instance: instance.to_owned(),
        }
    }

    /// Publishes one event about `object`. Failures are logged, never returned: an event is
    /// advice, and a scheduling decision must not depend on it.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        kind: EventKind,
        reason: &str,
        message: &str,
    ) {
        let namespace = object
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let now = jiff::Timestamp::now();
        let name = format!(
            "{}.{:x}",
            object.name.as_deref().unwrap_or(&self.component),
            now.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.to_owned()),
            // The API server caps messages at 1 kB.
            message: Some(truncate(message, 1024)),
            type_: Some(
                match kind {
                    EventKind::Normal => "Normal",
                    EventKind::Warning => "Warning",
                }
                .to_owned(),
            ),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.instance.clone()),
            action: Some(reason.to_owned()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(error) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(%error, reason, object = ?object.name, "could not write an event");
        }
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// A reference to a pod for events.
pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid: Some(uid.to_owned()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_at_char_boundary() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("aé", 2), "a");
    }
}
