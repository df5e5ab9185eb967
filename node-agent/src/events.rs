//! Kubernetes Events about pods, behind a small trait: the watchdog says what happened
//! ([`PodEvent`]) and an [`EventSink`] delivers it — to the API server
//! ([`KubeEvents`]), to the log only ([`LogEvents`], for `--no-kube`), or into memory
//! ([`RecordedEvents`], tests).
//!
//! Emitting never blocks the caller: the watchdog runs on its own thread and must not
//! wait on the API server, so [`KubeEvents`] hands each write to the tokio runtime.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;

use crate::ledger::PodRef;

/// The component name on every Event the agent writes.
pub const REPORTING_COMPONENT: &str = "tessera-agent";

/// Why an Event is emitted (its `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// A pod went over its GPU memory limit.
    GpuMemoryOverLimit,
    /// A pod's processes were killed for staying over its GPU memory limit.
    GpuMemoryKilled,
    /// A pod started being throttled to its compute share.
    GpuComputeThrottled,
}

impl EventReason {
    /// The `reason` field.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::GpuMemoryOverLimit => "GpuMemoryOverLimit",
            EventReason::GpuMemoryKilled => "GpuMemoryKilled",
            EventReason::GpuComputeThrottled => "GpuComputeThrottled",
        }
    }

    /// `Warning` or `Normal`.
    pub fn event_type(self) -> &'static str {
        match self {
            EventReason::GpuMemoryOverLimit | EventReason::GpuMemoryKilled => "Warning",
            EventReason::GpuComputeThrottled => "Normal",
        }
    }

    /// The `action` field: what the agent did or will do.
    pub fn action(self) -> &'static str {
        match self {
            EventReason::GpuMemoryOverLimit => "Warn",
            EventReason::GpuMemoryKilled => "Kill",
            EventReason::GpuComputeThrottled => "Throttle",
        }
    }
}

/// One Event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// Namespace and name of the pod the Event is about.
    pub pod: PodRef,
    /// Its UID (the Event's `involvedObject.uid`).
    pub pod_uid: String,
    /// The Event's `reason`, which also sets its type (Warning or Normal).
    pub reason: EventReason,
    /// Human-readable, with the numbers.
    pub message: String,
}

/// Somewhere Events go.
pub trait EventSink: Send + Sync + 'static {
    /// Emits `event` without blocking.
    fn emit(&self, event: PodEvent);
}

/// Writes Events to the log only (no cluster).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogEvents;

impl EventSink for LogEvents {
    fn emit(&self, event: PodEvent) {
        tracing::warn!(pod = %event.pod, reason = event.reason.as_str(), "{}", event.message);
    }
}

/// Keeps Events in memory (tests).
#[derive(Debug, Default)]
pub struct RecordedEvents {
    events: Mutex<Vec<PodEvent>>,
}

impl RecordedEvents {
    /// Everything emitted so far, in order.
    pub fn events(&self) -> Vec<PodEvent> {
        self.events.lock().clone()
    }
}

impl EventSink for RecordedEvents {
    fn emit(&self, event: PodEvent) {
        LogEvents.emit(event.clone());
        self.events.lock().push(event);
    }
}

/// Creates core/v1 Events on the pods, with this node as the source host.
pub struct KubeEvents {
    client: kube::Client,
    node_name: String,
    /// Carries the writes; `None` when created outside a runtime (Events are then
    /// only logged).
    runtime: Option<tokio::runtime::Handle>,
}

impl KubeEvents {
    /// Events written through `client`, by the tokio runtime this is created in.
    pub fn new(client: kube::Client, node_name: impl Into<String>) -> Self {
        let runtime = tokio::runtime::Handle::try_current().ok();
        if runtime.is_none() {
            tracing::warn!("pod Events created outside a tokio runtime are only logged");
        }
        Self {
            client,
            node_name: node_name.into(),
            runtime,
        }
    }

    /// The Event object for `event`, at `now`.
    pub fn object(&self, event: &PodEvent, now: k8s_openapi::jiff::Timestamp) -> Event {
        let stamp = now.as_nanosecond();
        Event {
            metadata: ObjectMeta {
                // Unique per pod and instant, like the kubelet's `<pod>.<hex>` names.
                name: Some(format!("{}.{:x}", event.pod.name, stamp)),
                namespace: Some(event.pod.namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(event.pod.name.clone()),
                namespace: Some(event.pod.namespace.clone()),
                uid: (!event.pod_uid.is_empty()).then(|| event.pod_uid.clone()),
                ..ObjectReference::default()
            },
            reason: Some(event.reason.as_str().into()),
            message: Some(event.message.clone()),
            type_: Some(event.reason.event_type().into()),
            action: Some(event.reason.action().into()),
            source: Some(EventSource {
                component: Some(REPORTING_COMPONENT.into()),
                host: Some(self.node_name.clone()),
            }),
            reporting_component: Some(REPORTING_COMPONENT.into()),
            reporting_instance: Some(self.node_name.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            ..Event::default()
        }
    }
}

impl EventSink for KubeEvents {
    fn emit(&self, event: PodEvent) {
        let object = self.object(&event, k8s_openapi::jiff::Timestamp::now());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &event.pod.namespace);
        LogEvents.emit(event);
        let Some(runtime) = &self.runtime else {
            return;
        };
        runtime.spawn(async move {
            if let Err(error) = api.create(&PostParams::default(), &object).await {
                tracing::warn!(%error, "cannot write a pod Event");
            }
        });
    }
}
