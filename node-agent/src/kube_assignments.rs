//! The Kubernetes assignment source: watches the pods bound to this node (field
//! selector `spec.nodeName=<node>`), reads `tessera.dev/assignment`, and writes
//! `tessera.dev/allocated` once the kubelet allocated a pod's GPUs.
//!
//! The watch keeps an in-memory copy of the node's GPU pods; the device plugin reads it
//! synchronously on every call, so Allocate never waits on the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::assignments::{
    ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, Assignment, AssignmentSource, PendingContainer,
    PendingPod,
};
use crate::enforce::isolation::{ISOLATION_ANNOTATION, Isolation};
use crate::ledger::PodRef;
use crate::node::GPU_RESOURCE;

/// A GPU pod as the watch last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    pending: PendingPod,
    /// `metadata.uid`: how the pod's processes are recognised by their cgroups.
    uid: Option<String>,
    assignment: Option<Assignment>,
    /// `tessera.dev/isolation`; `None` when absent (the default, watchdog).
    isolation: Option<Isolation>,
    allocated: bool,
}

#[derive(Debug, Default)]
struct State {
    pods: BTreeMap<PodRef, Entry>,
    /// Containers allocated by this agent (the annotation write may still be in flight).
    allocated: BTreeSet<(PodRef, String)>,
}

/// Assignments from the pods bound to this node.
pub struct KubeAssignments {
    client: kube::Client,
    state: Arc<RwLock<State>>,
    synced: watch::Receiver<bool>,
    departures: Mutex<Option<mpsc::UnboundedReceiver<PodRef>>>,
    task: JoinHandle<()>,
}

/// Whether the pod's containers are gone for good: it is finished. A pod that is only
/// terminating (deletionTimestamp) may still run during its grace period.
fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

impl Drop for KubeAssignments {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the agent needs from one pod; `Ok(None)` for pods that request no GPUs or
/// are finished; `Err` names a bad annotation.
fn read_pod(pod: &Pod) -> Result<Option<Entry>, String> {
    let meta = &pod.metadata;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) || meta.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let mut containers = Vec::new();
    // Init containers first, in order: the kubelet allocates them before the app containers
    // (and hands their devices on to the app containers), so a request is matched to the
    // first container, in that order, that has no allocation yet.
    let init = spec.init_containers.iter().flatten();
    for c in init.chain(spec.containers.iter()) {
        let limit = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(GPU_RESOURCE));
        let Some(limit) = limit else { continue };
        let slots: u32 = limit.0.trim().parse().map_err(|_| {
            format!(
                "container {:?}: {GPU_RESOURCE} limit {:?} is not a whole number",
                c.name, limit.0
            )
        })?;
        if slots > 0 {
            containers.push((c.name.clone(), slots));
        }
    }
    if containers.is_empty() {
        return Ok(None);
    }
    let annotations = meta.annotations.as_ref();
    let assignment = annotations
        .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
        .map(|text| Assignment::from_json(text))
        .transpose()?;
    let isolation = annotations
        .and_then(|a| a.get(ISOLATION_ANNOTATION))
        .map(|text| Isolation::parse(text))
        .transpose()?;
    let pending = PendingPod {
        pod: PodRef::new(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        ),
        created_unix_ms: meta
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_millisecond().max(0) as u64),
        containers: containers
            .into_iter()
            .map(|(name, slots)| PendingContainer {
                gpus: assignment.as_ref().map(|a| {
                    a.containers
                        .iter()
                        .find(|c| c.container == name)
                        .map(|c| c.gpus.clone())
                        .unwrap_or_default()
                }),
                name,
                slots,
            })
            .collect(),
    };
    Ok(Some(Entry {
        pending,
        uid: meta.uid.clone(),
        assignment,
        isolation,
        allocated: annotations.is_some_and(|a| a.contains_key(ALLOCATED_ANNOTATION)),
    }))
}

impl KubeAssignments {
    /// Starts watching the pods bound to `node_name`.
    pub fn start(client: kube::Client, node_name: &str) -> Self {
        let state = Arc::new(RwLock::new(State::default()));
        let (synced_tx, synced) = watch::channel(false);
        let (departed_tx, departed_rx) = mpsc::unbounded_channel();
        let api: Api<Pod> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let task = {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let mut fresh: Option<BTreeMap<PodRef, Entry>> = None;
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
                        watcher::Event::Init => fresh = Some(BTreeMap::new()),
                        watcher::Event::InitApply(pod) => {
                            if let (Some(map), Some((key, entry))) = (fresh.as_mut(), keyed(&pod)) {
                                map.insert(key, entry);
                            }
                        }
                        watcher::Event::InitDone => {
                            if let Some(map) = fresh.take() {
                                state.write().pods = map;
                            }
                            let _ = synced_tx.send(true);
                        }
                        watcher::Event::Apply(pod) => {
                            if is_finished(&pod) {
                                let _ = departed_tx.send(pod_ref(&pod));
                            }
                            let mut s = state.write();
                            match keyed(&pod) {
                                Some((key, entry)) => {
                                    s.pods.insert(key, entry);
                                }
                                None => {
                                    s.pods.remove(&pod_ref(&pod));
                                }
                            }
                        }
                        watcher::Event::Delete(pod) => {
                            let key = pod_ref(&pod);
                            let _ = departed_tx.send(key.clone());
                            let mut s = state.write();
                            s.pods.remove(&key);
                            s.allocated.retain(|(p, _)| *p != key);
                        }
                    }
                }
            })
        };
        Self {
            client,
            state,
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

fn keyed(pod: &Pod) -> Option<(PodRef, Entry)> {
    match read_pod(pod) {
        Ok(Some(entry)) => Some((entry.pending.pod.clone(), entry)),
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
    fn kind(&self) -> &'static str {
        "kube"
    }

    fn pending(&self) -> Vec<PendingPod> {
        let s = self.state.read();
        let mut pods: Vec<PendingPod> = s
            .pods
            .values()
            .filter(|e| !e.allocated)
            .filter_map(|e| {
                let containers: Vec<PendingContainer> = e
                    .pending
                    .containers
                    .iter()
                    .filter(|c| {
                        !s.allocated
                            .contains(&(e.pending.pod.clone(), c.name.clone()))
                    })
                    .cloned()
                    .collect();
                (!containers.is_empty()).then(|| PendingPod {
                    containers,
                    ..e.pending.clone()
                })
            })
            .collect();
        pods.sort_by(|a, b| (a.created_unix_ms, &a.pod).cmp(&(b.created_unix_ms, &b.pod)));
        pods
    }

    fn mark_allocated(&self, pod: &PodRef, container: &str) {
        let all_done = {
            let mut s = self.state.write();
            s.allocated.insert((pod.clone(), container.to_owned()));
            s.pods.get(pod).is_none_or(|e| {
                e.pending
                    .containers
                    .iter()
                    .all(|c| s.allocated.contains(&(pod.clone(), c.name.clone())))
            })
        };
        if !all_done {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let name = pod.name.clone();
        let patch = serde_json::json!({
            "metadata": {"annotations": {ALLOCATED_ANNOTATION: crate::ledger::now_unix_ms().to_string()}}
        });
        tokio::spawn(async move {
            if let Err(error) = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(pod = %name, %error, "could not mark the pod allocated");
            }
        });
    }

    fn assignment_of(&self, pod: &PodRef) -> Option<Assignment> {
        self.state
            .read()
            .pods
            .get(pod)
            .and_then(|e| e.assignment.clone())
    }

    fn pod_uid(&self, pod: &PodRef) -> Option<String> {
        self.state.read().pods.get(pod).and_then(|e| e.uid.clone())
    }

    fn departures(&self) -> Option<mpsc::UnboundedReceiver<PodRef>> {
        self.departures.lock().take()
    }

    fn isolation(&self, pod: &PodRef) -> Option<Isolation> {
        self.state.read().pods.get(pod).and_then(|e| e.isolation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: serde_json::Value, limit: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "annotations": annotations,
                         "uid": "6a1f0c2e-8b3d-4c5e-9f70-1a2b3c4d5e6f",
                         "creationTimestamp": "2026-01-01T00:00:01Z"},
            "spec": {"nodeName": "n", "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": limit}}},
                {"name": "sidecar"}
            ]},
        }))
        .unwrap()
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
        assert_eq!(
            entry.uid.as_deref(),
            Some("6a1f0c2e-8b3d-4c5e-9f70-1a2b3c4d5e6f")
        );
        assert!(!entry.allocated);
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
        assert_eq!(entry.isolation, Some(Isolation::Mps));
        let entry = read_pod(&pod(serde_json::json!({}), "1")).unwrap().unwrap();
        assert_eq!(entry.isolation, None);
        let err =
            read_pod(&pod(serde_json::json!({ISOLATION_ANNOTATION: "hard"}), "1")).unwrap_err();
        assert!(err.starts_with(ISOLATION_ANNOTATION), "{err}");
    }
}
