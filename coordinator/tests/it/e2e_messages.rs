//! What `kubectl describe pod` shows of a pending pod, end to end on real Kubernetes
//! (hack/k8s): the `PodScheduled=False` condition's message and the `FailedScheduling` Event
//! say the node-level reasons first, in kube-scheduler's words with node counts, then the
//! queue and fair-share reasons; GPU reasons name the pod's GPU count ("fewer than 8 free
//! GPUs") and call no healthy GPU unhealthy.

use crate::e2e;

use e2e::{E2e, Setup, a100_pairs, one_a100, pod, two_a100};
use serde_json::json;

/// Three nodes for an 8-GPU pod: 8 GPUs (one will be taken), 2 and 1.
fn smaller_nodes() -> Setup {
    Setup {
        nodes: vec![
            ("node-a".into(), a100_pairs()),
            ("node-b".into(), two_a100()),
            ("node-c".into(), one_a100()),
        ],
        ..Setup::one_node()
    }
}

/// Waits for the FailedScheduling Event about `name` that says `message`, as `kubectl
/// describe` lists it under Events.
async fn wait_event(e2e: &E2e, name: &str, message: &str) {
    e2e.wait_until(
        &format!("a FailedScheduling event about {name}: {message}"),
        || async {
            e2e.events_of(name)
                .await
                .into_iter()
                .any(|(reason, m)| reason == "FailedScheduling" && m == message)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_hear_the_nodes_first_in_kube_schedulers_words() {
    let e2e = E2e::start(smaller_nodes()).await;
    // Queue a (quota 4) holds one GPU of node-a; queue b (no quota) holds node-c's one GPU,
    // which a could reclaim: fair share has something to say too.
    e2e.create_queue("a", 4.0).await;
    e2e.create_queue("b", 0.0).await;
    for (name, queue, node) in [("holder-a", "a", "node-a"), ("holder-b", "b", "node-c")] {
        e2e.create(
            pod(name)
                .gpus(1)
                .queue(queue)
                .spec_field("nodeSelector", json!({"kubernetes.io/hostname": node})),
        )
        .await;
    }
    e2e.wait_running(&["holder-a".to_owned(), "holder-b".to_owned()])
        .await;

    // (a) A required node affinity no node satisfies: said first, before any fair share.
    e2e.create(
        pod("nowhere")
            .gpus(1)
            .queue("a")
            .spec_field("nodeSelector", json!({"example.com/pool": "absent"})),
    )
    .await;
    let affinity = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.";
    let condition = e2e.wait_unschedulable("nowhere").await;
    assert!(condition.starts_with(affinity), "{condition}");
    wait_event(&e2e, "nowhere", &condition).await;

    // (b) Eight GPUs on nodes that have fewer, or fewer free: counted in GPUs, nothing about
    // health (every GPU is healthy).
    e2e.create(pod("big").gpus(8).queue("a")).await;
    let condition = e2e.wait_unschedulable("big").await;
    assert!(
        condition.starts_with(
            "0/3 nodes are available: 2 node(s) had fewer than 8 GPUs, 1 node(s) had fewer than 8 free GPUs."
        ),
        "{condition}"
    );
    assert!(!condition.contains("healthy"), "{condition}");
    wait_event(&e2e, "big", &condition).await;
    e2e.shutdown().await;
}
