//! Nodes say their GPUs in GPUs, end to end on real Kubernetes (hack/k8s): a node's
//! `nvidia.com/gpu` capacity is share slots (80 on an 8-GPU node), and the coordinator labels
//! it with what its agent reports — the count, model and memory under NVIDIA GPU feature
//! discovery's names, and Tessera's own count and slots per GPU — following a change of the
//! agent's inventory (the agent restarted on another machine shape).

use std::collections::BTreeMap;

use crate::e2e;

use e2e::{E2e, Setup, two_a100};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

/// Waits until node `name` carries every label of `want`, and returns its labels.
async fn wait_labels(e2e: &E2e, name: &str, want: &[(&str, &str)]) -> BTreeMap<String, String> {
    let nodes: Api<Node> = Api::all(e2e.client.clone());
    e2e.wait_until(&format!("node {name} labelled {want:?}"), || async {
        let labels = nodes.get(name).await.ok()?.metadata.labels?;
        want.iter()
            .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            .then_some(labels)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_labelled_with_their_gpus_and_follow_the_agents_inventory() {
    let mut e2e = E2e::start(Setup::one_node()).await;
    // Eight 80 GB A100s, 10 slots each: capacity 80, labels 8.
    let node: Node = Api::all(e2e.client.clone())
        .get("node-a")
        .await
        .expect("node-a");
    let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
    assert_eq!(
        capacity.get("nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("80")
    );
    wait_labels(
        &e2e,
        "node-a",
        &[
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.product", "A100-80GB"),
            ("nvidia.com/gpu.memory", "81920"),
            ("tessera.dev/gpu-count", "8"),
            ("tessera.dev/gpu-shares-per-gpu", "10"),
        ],
    )
    .await;

    // The agent comes back on a two-GPU machine: the labels follow its new inventory.
    e2e.restart_agent_as("node-a", &two_a100()).await;
    let labels = wait_labels(
        &e2e,
        "node-a",
        &[
            ("nvidia.com/gpu.count", "2"),
            ("tessera.dev/gpu-count", "2"),
        ],
    )
    .await;
    assert_eq!(
        labels.get("nvidia.com/gpu.memory").map(String::as_str),
        Some("81920")
    );
    // Nothing else was written: the kubelet's own labels are as they were.
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some("node-a")
    );
    e2e.shutdown().await;
}
