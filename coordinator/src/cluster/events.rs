//! Kubernetes Events for what the scheduler decided or refused.
//!
//! Written as core/v1 Events (what `kubectl describe` shows) rather than through kube-runtime's
//! `Recorder`, because the recorder folds events that differ only in their message into one
//! series and keeps the first message: a changed reason must show up with its own text.
//!
//! A writer made [`EventWriter::queued`] (the scheduler's) never makes its caller wait: an
//! event goes into a bounded queue that one task writes out in order, so a Binding is never
//! held up behind the Event that reports it, as client-go's broadcaster also writes events off
//! the scheduling path. An event that finds the queue full is dropped and counted in the log:
//! events are advice, and a burst of them must not grow memory or stall binding.
//!
//! Identical events (same object, type, reason and message) aggregate the way client-go's
//! recorder does: the first is created, each repeat raises the existing Event's `count` and
//! `lastTimestamp`, so a pod pending for an hour has one `FailedScheduling` Event rather than
//! one per scheduling cycle. The writer remembers the Events it wrote in a small bounded map
//! shared by its clones; an Event gone from the server (expired by its TTL) is created again.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::mpsc;

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

/// The longest Event name the API server accepts (a DNS subdomain).
const MAX_NAME: usize = 253;
/// How many distinct events the writer remembers for aggregation.
const MAX_REMEMBERED: usize = 4096;
/// Events a queued writer holds before it drops new ones: a few seconds of binding at full
/// speed, far more than a healthy API server leaves unwritten.
const QUEUE_CAPACITY: usize = 8192;

/// What makes two events the same: the object (its UID, or namespace/kind/name without
/// one), the type, the reason and the message.
type EventKey = (String, &'static str, String, String);

/// An Event the writer created, to be counted up on a repeat.
#[derive(Clone, Debug)]
struct Written {
    name: String,
    count: i32,
    first: jiff::Timestamp,
    last: jiff::Timestamp,
}

/// One event waiting in a queued writer's queue.
struct Queued {
    object: ObjectReference,
    kind: EventKind,
    reason: String,
    message: String,
}

/// Writes Events naming this scheduler as their source.
#[derive(Clone)]
pub struct EventWriter {
    client: kube::Client,
    component: String,
    instance: String,
    written: Arc<Mutex<HashMap<EventKey, Written>>>,
    /// Set on a [`EventWriter::queued`] writer: where `publish` puts events.
    queue: Option<Queue>,
}

/// The sending side of a queued writer, and how many events it had to drop.
#[derive(Clone)]
struct Queue {
    tx: mpsc::Sender<Queued>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
}

impl EventWriter {
    /// Events reported by `component` (the scheduler name) from replica `instance`.
    pub fn new(client: kube::Client, component: &str, instance: &str) -> Self {
        Self {
            client,
            component: component.to_owned(),
            instance: instance.to_owned(),
            written: Arc::default(),
            queue: None,
        }
    }

    /// This writer behind a queue: `publish` returns at once and one task (spawned here, on
    /// the current Tokio runtime) writes the events in order. The task ends when the last
    /// clone of the returned writer is dropped, after writing what was queued.
    pub fn queued(self) -> Self {
        let (tx, mut rx) = mpsc::channel::<Queued>(QUEUE_CAPACITY);
        let direct = Self {
            queue: None,
            ..self.clone()
        };
        tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                direct.write(&e.object, e.kind, &e.reason, &e.message).await;
            }
        });
        Self {
            queue: Some(Queue {
                tx,
                dropped: Arc::default(),
            }),
            ..self
        }
    }

    /// Publishes one event about `object`: written before this returns, or for a
    /// [`EventWriter::queued`] writer, queued to be written in order. Failures are logged,
    /// never returned: an event is advice, and a scheduling decision must not depend on it.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        kind: EventKind,
        reason: &str,
        message: &str,
    ) {
        let Some(queue) = &self.queue else {
            return self.write(object, kind, reason, message).await;
        };
        let event = Queued {
            object: object.clone(),
            kind,
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = queue.tx.try_send(event) {
            let dropped = queue
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // One line per thousand, so a long outage does not flood the log either.
            if dropped % 1000 == 0 {
                tracing::warn!(
                    dropped = dropped + 1,
                    reason,
                    "the event queue is full (the API server is not keeping up); events are dropped"
                );
            }
        }
    }

    /// Writes one event now: a new Event, or a count raised on the one written before.
    async fn write(&self, object: &ObjectReference, kind: EventKind, reason: &str, message: &str) {
        let namespace = object
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let now = jiff::Timestamp::now();
        let type_ = match kind {
            EventKind::Normal => "Normal",
            EventKind::Warning => "Warning",
        };
        // The API server caps messages at 1 kB.
        let message = truncate(message, 1024);
        let object_key = match object.uid.as_deref().filter(|u| !u.is_empty()) {
            Some(uid) => uid.to_owned(),
            None => format!(
                "{namespace}/{}/{}",
                object.kind.as_deref().unwrap_or_default(),
                object.name.as_deref().unwrap_or_default()
            ),
        };
        let key: EventKey = (object_key, type_, reason.to_owned(), message.clone());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);

        let previous = self.written.lock().get(&key).cloned();
        if let Some(prev) = &previous {
            let count = prev.count.saturating_add(1);
            let patch = json!({"count": count, "lastTimestamp": Time(now)});
            match api
                .patch(&prev.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.remember(
                        key,
                        Written {
                            count,
                            last: now,
                            ..prev.clone()
                        },
                    );
                    return;
                }
                // Expired (or deleted): written again below, under a new name.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    tracing::warn!(%error, reason, object = ?object.name, "could not update an event");
                    return;
                }
            }
        }
        // Counted on from the Event that expired, as client-go does.
        let (count, first) = previous.map_or((1, now), |p| (p.count.saturating_add(1), p.first));
        let name = event_name(
            object.name.as_deref().unwrap_or(&self.component),
            now.as_nanosecond(),
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.to_owned()),
            message: Some(message),
            type_: Some(type_.to_owned()),
            count: Some(count),
            first_timestamp: Some(Time(first)),
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
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => self.remember(
                key,
                Written {
                    name,
                    count,
                    first,
                    last: now,
                },
            ),
            Err(error) => {
                tracing::warn!(%error, reason, object = ?object.name, "could not write an event");
            }
        }
    }

    /// Remembers a written Event; when the map is full, forgets the one updated longest ago.
    fn remember(&self, key: EventKey, written: Written) {
        let mut map = self.written.lock();
        if map.len() >= MAX_REMEMBERED && !map.contains_key(&key) {
            let oldest = map
                .iter()
                .min_by_key(|(_, w)| w.last)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                map.remove(&oldest);
            }
        }
        map.insert(key, written);
    }
}

/// A valid Event name for an event about `object_name` at `nanos`: `<object>.<hex nanos>`, as
/// client-go names them, with the object part made a DNS subdomain and cut so the whole name
/// stays within 253 characters whatever the object's name.
fn event_name(object_name: &str, nanos: i128) -> String {
    let suffix = format!("{:x}", nanos.max(0));
    let budget = MAX_NAME - 1 - suffix.len();
    let lowered: String = object_name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    // Every dot-separated label must start and end with an alphanumeric character.
    let mut prefix = lowered
        .split('.')
        .map(|l| l.trim_matches('-'))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(".");
    if prefix.len() > budget {
        prefix.truncate(budget);
        let keep = prefix.trim_end_matches(['-', '.']).len();
        prefix.truncate(keep);
    }
    if prefix.is_empty() {
        prefix = "event".to_owned();
    }
    format!("{prefix}.{suffix}")
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

    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    }

    #[test]
    fn event_names_are_dns_subdomains_of_bounded_length() {
        let nanos = 1_764_870_000_123_456_789;
        assert_eq!(event_name("p", nanos), format!("p.{nanos:x}"));
        for name in [
            "a".repeat(253),
            format!("{}-{}", "a".repeat(235), "b".repeat(17)),
            format!("{}.{}", "a".repeat(235), "b".repeat(17)),
            "Gang_Of.Four-".to_owned(),
            "--.--".to_owned(),
            String::new(),
        ] {
            let event = event_name(&name, nanos);
            assert!(is_dns_subdomain(&event), "{event:?} from {name:?}");
            assert!(event.ends_with(&format!(".{nanos:x}")), "{event}");
        }
        assert_eq!(event_name("--.--", nanos), format!("event.{nanos:x}"));
    }
}
