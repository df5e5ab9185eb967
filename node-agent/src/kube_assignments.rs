//! The pod-watch assignment source (`--assignments kube`): watches the pods bound to this
//! node (field selector `spec.nodeName=<node>`) and reads `tessera.dev/assignment` from
//! them. Read-only: it needs `list`/`watch` on pods, which the chart's default (the
//! coordinator's stream, [`crate::coordinator_pods`]) does not grant.
//!
//! The watch keeps an in-memory copy of the node's GPU pods; the device plugin reads it
//! synchronously on every call, so Allocate never waits on the API server.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use tessera_contract::keys::{
    ASSIGNMENT as ASSIGNMENT_ANNOTATION, ISOLATION as ISOLATION_ANNOTATION,
};
use tessera_contract::pod::{allocation_order, container_gpus, has_started, is_finished};

use crate::assignments::{AssignmentSource, ListedPod, PendingPod, SourceKind};
use crate::ledger::PodRef;
use crate::pod_table::{BoundPod, PodTable, RawPod};
use tessera_contract::PodUid;

/// Assignments from the pods bound to this node.
pub struct KubeAssignments {
    table: Arc<RwLock<PodTable>>,
    synced: watch::Receiver<bool>,
    departures: Mutex<Option<mpsc::UnboundedReceiver<PodUid>>>,
    task: JoinHandle<()>,
}

impl Drop for KubeAssignments {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the agent needs from one pod; `Ok(None)` for pods that request no GPUs or
/// are finished; `Err` names a bad annotation or limit.
fn read_pod(pod: &Pod) -> Result<Option<BoundPod>, String> {
    let meta = &pod.metadata;
    if is_finished(pod) {
        return Ok(None);
    }
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let mut containers = Vec::new();
    // Init containers first, in order: the kubelet allocates them before the app containers
    // (and hands their devices on to the app containers), so a request is matched to the
    // first container, in that order, that has no allocation yet.
    for c in allocation_order(spec) {
        let slots =
            container_gpus(c.container).map_err(|e| format!("{}: {e}", c.gpu_field(e.which)))?;
        if slots > 0 {
            containers.push((c.container.name.clone(), slots));
        }
    }
    let annotations = meta.annotations.as_ref();
    BoundPod::read(RawPod {
        pod: pod_ref(pod),
        uid: meta.uid.as_deref().unwrap_or_default(),
        created_unix_ms: meta
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_millisecond().max(0) as u64),
        containers,
        assignment: annotations
            .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
            .map(String::as_str),
        isolation: annotations
            .and_then(|a| a.get(ISOLATION_ANNOTATION))
            .map(String::as_str),
        terminating: meta.deletion_timestamp.is_some(),
        started: has_started(pod),
    })
}

impl KubeAssignments {
    /// Starts watching the pods bound to `node_name`.
    pub fn start(client: kube::Client, node_name: &str) -> Self {
        let api: Api<Pod> = Api::all(client);
        let table = Arc::new(RwLock::new(PodTable::default()));
        let (synced_tx, synced) = watch::channel(false);
        let (departed_tx, departed_rx) = mpsc::unbounded_channel();
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let task = {
            let table = Arc::clone(&table);
            tokio::spawn(async move {
                let mut fresh: Option<Vec<BoundPod>> = None;
                let mut stream = watcher(api, config).default_backoff().boxed();
                // A cause is logged once; its repeats (the watcher retries with backoff) are
                // logged at debug level until the watch works again.
                let mut last_error: Option<String> = None;
                while let Some(event) = stream.next().await {
                    let event = match event {
                        Ok(e) => e,
                        Err(error) => {
                            let text = error.to_string();
                            if last_error.as_deref() == Some(text.as_str()) {
                                tracing::debug!(error = %text, "pod watch failed again; retrying");
                            } else {
                                tracing::warn!(error = %text, "pod watch failed; retrying with backoff (repeats of this cause are logged at debug level)");
                                last_error = Some(text);
                            }
                            continue;
                        }
                    };
                    last_error = None;
                    match event {
                        watcher::Event::Init => fresh = Some(Vec::new()),
                        watcher::Event::InitApply(pod) => {
                            if let (Some(list), Some(entry)) = (fresh.as_mut(), keyed(&pod)) {
                                list.push(entry);
                            }
                        }
                        watcher::Event::InitDone => {
                            if let Some(list) = fresh.take() {
                                table.write().replace(list);
                            }
                            let _ = synced_tx.send(true);
                        }
                        watcher::Event::Apply(pod) => {
                            let entry = keyed(&pod);
                            // A pod without a readable UID was never kept: nothing to drop.
                            let Some(uid) = pod_uid(&pod) else { continue };
                            if is_finished(&pod) {
                                let _ = departed_tx.send(uid.clone());
                            }
                            let mut t = table.write();
                            match entry {
                                Some(entry) => t.insert(entry),
                                None => t.remove(&uid),
                            }
                        }
                        watcher::Event::Delete(pod) => {
                            if let Some(uid) = pod_uid(&pod) {
                                let _ = departed_tx.send(uid.clone());
                                table.write().remove(&uid);
                            }
                        }
                    }
                }
            })
        };
        Self {
            table,
            synced,
            departures: Mutex::new(Some(departed_rx)),
            task,
        }
    }

    /// Waits until the first full list arrived; false on timeout.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut rx = self.synced.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef::new(
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The pod's UID; `None` for an object without a valid one (the table never kept it).
fn pod_uid(pod: &Pod) -> Option<PodUid> {
    PodUid::new(pod.metadata.uid.clone()?).ok()
}

fn keyed(pod: &Pod) -> Option<BoundPod> {
    match read_pod(pod) {
        Ok(Some(entry)) => Some(entry),
        Ok(None) => None,
        Err(reason) => {
            // Such a pod gets nothing: no share can be derived and whole GPUs would
            // contradict the coordinator.
            tracing::warn!(pod = %pod_ref(pod), %reason, "ignoring pod with an unreadable GPU request");
            None
        }
    }
}

impl AssignmentSource for KubeAssignments {
    fn kind(&self) -> SourceKind {
        SourceKind::Kube
    }

    fn synced(&self) -> watch::Receiver<bool> {
        self.synced.clone()
    }

    fn pending(&self) -> Vec<PendingPod> {
        self.table.read().pending()
    }

    fn listed(&self, pod: &PodRef) -> Option<ListedPod> {
        self.table.read().listed(pod)
    }

    fn departures(&self) -> Option<mpsc::UnboundedReceiver<PodUid>> {
        self.departures.lock().take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use tessera_contract::Isolation;

    /// The shared test pod (`main` asking for GPUs) bound to node `n` with `annotations`,
    /// its GPU limit written as `limit`, beside a sidecar asking for none, as the API server
    /// would return it (UID and creation time set).
    fn pod(annotations: serde_json::Value, limit: &str) -> Pod {
        let mut builder = tessera_testcluster::pods::pod("p")
            .namespace("ml")
            .gpus(1)
            .spec_field("nodeName", serde_json::json!("n"));
        for (key, value) in annotations.as_object().into_iter().flatten() {
            builder = builder.annotation(key, value.as_str().unwrap_or_default());
        }
        let mut pod = builder.build();
        pod.metadata.uid = Some("6a1f0c2e-8b3d-4c5e-9f70-1a2b3c4d5e6f".into());
        pod.metadata.creation_timestamp =
            Some(serde_json::from_value(serde_json::json!("2026-01-01T00:00:01Z")).unwrap());
        let spec = pod.spec.as_mut().unwrap();
        spec.containers[0]
            .resources
            .get_or_insert_default()
            .limits
            .get_or_insert_default()
            .insert("nvidia.com/gpu".into(), Quantity(limit.into()));
        spec.containers.push(Container {
            name: "sidecar".into(),
            ..Container::default()
        });
        pod
    }

    #[test]
    fn reads_assignment_and_slot_count() {
        let text = r#"{"containers":[{"container":"main","gpus":[{"uuid":"GPU-a","memory_mib":100,"compute_milli":500}]}]}"#;
        let entry = read_pod(&pod(serde_json::json!({ASSIGNMENT_ANNOTATION: text}), "1"))
            .unwrap()
            .unwrap();
        assert_eq!(entry.pending.containers.len(), 1);
        assert_eq!(entry.pending.containers[0].slots, 1);
        assert_eq!(
            entry.pending.containers[0].gpus.as_ref().unwrap()[0].uuid,
            "GPU-a"
        );
        assert_eq!(entry.pending.created_unix_ms, 1_767_225_601_000);
        assert_eq!(entry.uid().as_str(), "6a1f0c2e-8b3d-4c5e-9f70-1a2b3c4d5e6f");
        assert!(!entry.started && !entry.terminating);
    }

    #[test]
    fn pods_without_assignment_or_gpus() {
        let entry = read_pod(&pod(serde_json::json!({}), "2")).unwrap().unwrap();
        assert_eq!(entry.pending.containers[0].gpus, None);
        assert!(
            read_pod(&pod(serde_json::json!({}), "0"))
                .unwrap()
                .is_none()
        );
        let err = read_pod(&pod(
            serde_json::json!({ASSIGNMENT_ANNOTATION: "nope"}),
            "1",
        ))
        .unwrap_err();
        assert!(err.starts_with(ASSIGNMENT_ANNOTATION), "{err}");
        let err = read_pod(&pod(serde_json::json!({}), "half")).unwrap_err();
        assert!(err.contains("not a whole number"), "{err}");
    }

    #[test]
    fn reads_the_isolation_mode() {
        let entry = read_pod(&pod(serde_json::json!({ISOLATION_ANNOTATION: "mps"}), "1"))
            .unwrap()
            .unwrap();
        assert_eq!(entry.pending.isolation, Isolation::Mps);
        let entry = read_pod(&pod(serde_json::json!({}), "1")).unwrap().unwrap();
        assert_eq!(entry.pending.isolation, Isolation::Watchdog);
        let err =
            read_pod(&pod(serde_json::json!({ISOLATION_ANNOTATION: "hard"}), "1")).unwrap_err();
        assert!(err.starts_with(ISOLATION_ANNOTATION), "{err}");
    }
}
