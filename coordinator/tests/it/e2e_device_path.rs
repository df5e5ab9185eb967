//! The kubelet's device path for Tessera's own pods, through the kubelet's real device
//! manager (kubelet-lite) and real agents: an init container asking for a GPU is allocated
//! first and its GPU handed on to the app container; several GPU containers in one pod each
//! get their own GPUs; the coordinator counts the pod's GPUs as the kubelet does, so the node
//! is full exactly when the kubelet says so.

use crate::e2e;

use std::collections::BTreeSet;

use e2e::{E2e, Setup, pod};
use serde_json::json;

fn gpu_container(name: &str, gpus: u32) -> serde_json::Value {
    json!({"name": name, "image": "cuda",
           "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                         "limits": {"nvidia.com/gpu": gpus.to_string()}}})
}

/// The GPUs (`NVIDIA_VISIBLE_DEVICES`) container `container` of pod `name` was started with.
fn visible(e2e: &E2e, name: &str, container: &str) -> BTreeSet<String> {
    let records: Vec<_> = e2e
        .containers()
        .into_iter()
        .filter(|(_, r)| r.pod == name && r.container == container)
        .collect();
    assert_eq!(
        records.len(),
        1,
        "{name}/{container} started once: {records:#?}"
    );
    records[0]
        .1
        .env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_and_several_gpu_containers_get_what_the_kubelet_hands_them() {
    let e2e = E2e::start(Setup::one_node()).await;
    // An init container whose GPU the app container reuses: one GPU in all.
    e2e.create(
        pod("warm-start")
            .spec_field("initContainers", json!([gpu_container("warm", 1)]))
            .spec_field("containers", json!([gpu_container("main", 1)])),
    )
    .await;
    // Two app containers with their own GPUs: three in all.
    e2e.create(pod("two-apps").spec_field(
        "containers",
        json!([gpu_container("a", 1), gpu_container("b", 2)]),
    ))
    .await;
    // An init container larger than the app: four GPUs, the app reuses one of them.
    e2e.create(
        pod("big-init")
            .spec_field("initContainers", json!([gpu_container("fetch", 4)]))
            .spec_field("containers", json!([gpu_container("main", 1)])),
    )
    .await;
    let names = [
        "warm-start".to_owned(),
        "two-apps".into(),
        "big-init".into(),
    ];
    e2e.wait_running(&names).await;

    let warm = visible(&e2e, "warm-start", "warm");
    assert_eq!(warm.len(), 1);
    assert_eq!(
        visible(&e2e, "warm-start", "main"),
        warm,
        "main reuses warm's GPU"
    );
    let a = visible(&e2e, "two-apps", "a");
    let b = visible(&e2e, "two-apps", "b");
    assert_eq!((a.len(), b.len()), (1, 2));
    assert!(a.is_disjoint(&b), "{a:?} {b:?}");
    let fetch = visible(&e2e, "big-init", "fetch");
    let main = visible(&e2e, "big-init", "main");
    assert_eq!(fetch.len(), 4);
    assert!(
        main.len() == 1 && main.is_subset(&fetch),
        "{main:?} {fetch:?}"
    );
    // Eight GPUs held by 1 + 3 + 4: no pod shares a GPU with another.
    let all: Vec<&BTreeSet<String>> = vec![&warm, &a, &b, &fetch];
    let held: BTreeSet<&String> = all.iter().flat_map(|s| s.iter()).collect();
    assert_eq!(held.len(), 8, "{held:?}");

    // The node is full as the coordinator counts it too: one more GPU pod waits.
    e2e.create(pod("one-more").gpus(1)).await;
    let message = e2e.wait_unschedulable("one-more").await;
    assert!(message.contains("1 node(s) had no free GPU"), "{message}");
    e2e.shutdown().await;
}
