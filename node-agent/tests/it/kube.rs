//! The Kubernetes assignment source against a real kube-apiserver (hack/k8s): assignments
//! are read from pods bound to this node, Allocate answers exactly them, and the agent writes
//! nothing to the pods.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Harness, WAIT, gpu_of, refs, share};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use tessera_agent::assignments::AssignmentSource;
use tessera_agent::kube_assignments::KubeAssignments;
use tessera_contract::PodUid;
use tessera_contract::keys::ASSIGNMENT as ASSIGNMENT_ANNOTATION;
use tessera_testcluster::{Cluster, ClusterOptions, pods};

/// A pod of `gpus` GPUs bound to `node` at creation, with `assignment` when given.
fn gpu_pod(name: &str, node: &str, gpus: u32, assignment: Option<String>) -> Pod {
    let pod = pods::pod(name)
        .gpus(gpus)
        .spec_field("nodeName", serde_json::json!(node));
    match assignment {
        Some(a) => pod.annotation(ASSIGNMENT_ANNOTATION, &a),
        None => pod,
    }
    .build()
}

/// The ledger holds `name`'s main container, and the pod itself was left as it was: the
/// agent writes no pod.
async fn assert_allocated(h: &Harness, api: &Api<Pod>, name: &str) {
    let pod = api.get(name).await.unwrap();
    let uid = PodUid::new(pod.metadata.uid.clone().unwrap()).unwrap();
    assert!(h.agent().node().ledger.lock().has_container(&uid, "main"));
    let annotations = pod.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key("tessera.dev/allocated"),
        "the agent wrote on {name}: {annotations:?}"
    );
}

#[tokio::test]
async fn pods_bound_to_this_node_get_exactly_their_assignment_and_are_not_written() {
    // Pods need the namespace's ServiceAccount, which the real controller creates.
    let server = Cluster::start(ClusterOptions {
        controllers: Some("serviceaccount-controller".into()),
        ..ClusterOptions::default()
    });
    let client = server.admin().await;
    tessera_testcluster::wait_service_account(&client, "default", "default").await;
    let source = Arc::new(KubeAssignments::start(client.clone(), "node-a"));
    let h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    let plugin = h.gpu_plugin().await;
    let api: Api<Pod> = Api::namespaced(client, "default");
    let g0 = h.uuid(0);
    let pp = PostParams::default();
    api.create(
        &pp,
        &gpu_pod("a", "node-a", 1, Some(share(&g0, 20480, 500).to_json())),
    )
    .await
    .unwrap();
    // The server stamps creation to the second: keep the creation order visible.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.create(
        &pp,
        &gpu_pod("b", "node-a", 1, Some(share(&g0, 8192, 200).to_json())),
    )
    .await
    .unwrap();
    // Another node's pod and a pod of another scheduler.
    api.create(
        &pp,
        &gpu_pod(
            "elsewhere",
            "node-b",
            1,
            Some(share(&g0, 40960, 1000).to_json()),
        ),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.create(&pp, &gpu_pod("plain", "node-a", 2, None))
        .await
        .unwrap();
    assert!(source.wait_synced(WAIT).await);
    let deadline = tokio::time::Instant::now() + WAIT;
    while source.pending().len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watch did not deliver the pods"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let names: Vec<String> = source.pending().into_iter().map(|p| p.pod.name).collect();
    assert_eq!(names, ["a", "b", "plain"]);

    let all = h.available(&plugin).await;
    let slot = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap();
    let env = plugin.allocate_one(&refs(&slot)).await.unwrap().envs;
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], g0);
    assert_eq!(env["TESSERA_GPU_MEMORY_LIMIT_MIB"], "20480");
    assert_allocated(&h, &api, "a").await;

    let slot = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap();
    let env = plugin.allocate_one(&refs(&slot)).await.unwrap().envs;
    assert_eq!(env["TESSERA_GPU_MEMORY_LIMIT_MIB"], "8192");
    assert_eq!(env["TESSERA_GPU_COMPUTE_PERCENT"], "20");
    assert_allocated(&h, &api, "b").await;

    // The other scheduler's pod gets two whole free GPUs, an NVLink pair.
    let pair = plugin
        .preferred_allocation(&refs(&all), &[], 2)
        .await
        .unwrap();
    assert!(pair.iter().all(|s| gpu_of(s) != g0));
    let env = plugin.allocate_one(&refs(&pair)).await.unwrap().envs;
    assert_eq!(env["TESSERA_GPU_COMPUTE_PERCENT"], "100,100");
    assert_allocated(&h, &api, "plain").await;
    // Pending means "not started": they stay listed, the ledger says they are allocated.
    assert_eq!(source.pending().len(), 3);
}
