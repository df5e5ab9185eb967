//! What each node's agent is told about its pods (`NodePods`, protocol revision 2): every
//! pod bound there that asks for `nvidia.com/gpu` and has not finished, with its
//! assignment, so the agent needs no pod access in the API.
//!
//! Published from the pod cache only once it is complete: a pod absent from a snapshot
//! is gone, and the agent releases its shares. Any scheduler's pods are included; the
//! agent gives whole free GPUs to those without an assignment.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use tessera_proto::tessera::v1 as pb;
use tokio::sync::watch;

use super::cache::{Cache, Store};
use crate::agents::AgentRegistry;
use crate::agents::stopped;
use tessera_contract::keys;
use tessera_contract::keys::ASSIGNMENT as ASSIGNMENT_ANNOTATION;
use tessera_contract::pod::{allocation_order, container_gpus, has_started, is_finished};

/// `pod` as its agent will see it once bound to `node` with `assignment` (JSON), for the
/// announcement made right before the Binding is sent.
pub fn as_bound(pod: &Pod, node: &str, assignment: &str) -> Option<(String, pb::BoundPod)> {
    let (_, mut bound) = describe(pod, node)?;
    bound.assignment = assignment.to_owned();
    Some((node.to_owned(), bound))
}

/// The pod as its node's agent needs it; `None` when it is not bound, has finished, or
/// asks for no GPU.
fn bound_pod(pod: &Pod) -> Option<(String, pb::BoundPod)> {
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.as_deref().filter(|n| !n.is_empty())?;
    describe(pod, node)
}

fn describe(pod: &Pod, node: &str) -> Option<(String, pb::BoundPod)> {
    let spec = pod.spec.as_ref()?;
    if is_finished(pod) {
        return None;
    }
    let containers: Vec<pb::BoundContainer> = allocation_order(spec)
        .map(|c| c.container)
        .filter_map(|c| {
            let gpus = container_gpus(c).ok().filter(|&n| n > 0)?;
            Some(pb::BoundContainer {
                name: c.name.clone(),
                gpus,
            })
        })
        .collect();
    if containers.is_empty() {
        return None;
    }
    let meta = &pod.metadata;
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
            .unwrap_or_default()
    };
    Some((
        node.to_owned(),
        pb::BoundPod {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            created_unix_ms: meta
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_millisecond()),
            containers,
            assignment: annotation(ASSIGNMENT_ANNOTATION),
            isolation: annotation(keys::ISOLATION),
            terminating: meta.deletion_timestamp.is_some(),
            started: has_started(pod),
        },
    ))
}

/// Every node's GPU pods, by node name (pods in uid order within a node).
pub fn by_node(store: &Store) -> BTreeMap<String, pb::NodePods> {
    let mut out: BTreeMap<String, pb::NodePods> = BTreeMap::new();
    for pod in store.pods.values() {
        if let Some((node, bound)) = bound_pod(pod) {
            out.entry(node).or_default().pods.push(bound);
        }
    }
    out
}

/// Publishes [`by_node`] into `registry` whenever the cache changes, from the moment it
/// is complete, until `shutdown`.
pub async fn publish(cache: Cache, registry: AgentRegistry, mut shutdown: watch::Receiver<bool>) {
    let mut ready = cache.ready();
    tokio::select! {
        _ = ready.wait_for(|r| *r) => {}
        _ = stopped(&mut shutdown) => return,
    }
    let mut changes = cache.changes();
    loop {
        changes.borrow_and_update();
        registry.publish_node_pods(cache.read(by_node));
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = stopped(&mut shutdown) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pod(value: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn bound_unfinished_gpu_pods_are_told_to_their_node() {
        let gpu = |name: &str, node: &str, phase: &str| {
            pod(serde_json::json!({
                "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
                             "annotations": {ASSIGNMENT_ANNOTATION: "{}", keys::ISOLATION: "mps"},
                             "creationTimestamp": "2026-01-01T00:00:01Z"},
                "spec": {"nodeName": node,
                         "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                         "containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": "2"}}},
                                        {"name": "log"}]},
                "status": {"phase": phase}
            }))
        };
        let mut store = Store::default();
        for (uid, p) in [
            ("1", gpu("a", "n1", "Pending")),
            ("2", gpu("b", "n1", "Succeeded")),
            ("3", gpu("c", "", "Pending")),
            ("4", gpu("d", "n2", "Running")),
            (
                "5",
                pod(serde_json::json!({"metadata": {"name": "cpu"},
                    "spec": {"nodeName": "n1", "containers": [{"name": "main"}]}})),
            ),
        ] {
            store.pods.insert(uid.into(), p);
        }
        let out = by_node(&store);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        let a = &out["n1"].pods[0];
        assert_eq!(out["n1"].pods.len(), 1);
        assert_eq!((a.name.as_str(), a.uid.as_str()), ("a", "u-a"));
        let containers: Vec<(&str, u32)> = a
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.gpus))
            .collect();
        assert_eq!(containers, [("warm", 1), ("main", 2)]);
        assert_eq!((a.assignment.as_str(), a.isolation.as_str()), ("{}", "mps"));
        assert_eq!(a.created_unix_ms, 1_767_225_601_000);
        assert!(!a.started && !a.terminating);
        assert!(out["n2"].pods[0].started);
    }

    #[test]
    fn publishing_sends_only_changes_and_empties_nodes_whose_pods_left() {
        let registry = AgentRegistry::new();
        let mut rx = registry.node_pods("n1");
        assert!(
            rx.borrow().is_none(),
            "nothing before the cache is complete"
        );
        let one = pb::NodePods {
            pods: vec![pb::BoundPod {
                name: "a".into(),
                ..Default::default()
            }],
        };
        registry.publish_node_pods(BTreeMap::from([("n1".to_owned(), one.clone())]));
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().as_deref(), Some(&one));
        registry.publish_node_pods(BTreeMap::from([("n1".to_owned(), one)]));
        assert!(
            !rx.has_changed().unwrap(),
            "the same snapshot is not sent again"
        );
        registry.publish_node_pods(BTreeMap::new());
        assert_eq!(
            rx.borrow_and_update().as_deref(),
            Some(&pb::NodePods::default())
        );
    }
}
