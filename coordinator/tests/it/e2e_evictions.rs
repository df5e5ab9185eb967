//! No pod that nothing recreates is evicted to "move" it, and every eviction says what happens
//! to the pod next: on the real API server with real agents behind kubelet-lite nodes.
//!
//! The scenario: two half-GPU pods left alone on two one-GPU nodes (their neighbours deleted),
//! and a whole-GPU pod of the same queue and priority waiting. Consolidation could move one
//! half to the other node; it may only when the pod's controller recreates it.

use crate::e2e;

use std::collections::BTreeSet;

use e2e::{E2e, NS, Setup, one_a100, pod};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_testcluster::pods::slices;

/// Two nodes of one GPU each (`node-a`, `node-b`): a move goes to the other node.
fn two_single_gpu_nodes() -> Setup {
    Setup {
        nodes: vec![("node-a".into(), one_a100()), ("node-b".into(), one_a100())],
        ..Setup::one_gpu()
    }
}

/// The GPU a running pod holds.
fn gpu_of(p: &Pod) -> String {
    slices(p)
        .first()
        .map(|(uuid, _, _)| uuid.clone())
        .expect("the pod holds a GPU share")
}

async fn delete_now(e2e: &E2e, name: &str) {
    e2e.pods()
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    e2e.wait_until(&format!("{name} gone"), || async {
        e2e.pods()
            .get_opt(name)
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
}

/// A half-GPU pod `name` that fills the GPU its neighbour half uses, so the next half goes to
/// the other GPU; returns once it runs.
async fn half(e2e: &E2e, name: &str) -> Pod {
    e2e.create(pod(name).fraction("0.5")).await;
    e2e.wait_running(&[name.to_owned()]).await.remove(0)
}

/// The Deployment `keep` of `replicas` half-GPU pods for Tessera.
fn keep(replicas: i32) -> Deployment {
    let template = pod("unused").fraction("0.5").label("app", "keep").build();
    serde_json::from_value(json!({
        "metadata": {"name": "keep"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "keep"}},
            "template": {
                "metadata": {"labels": template.metadata.labels, "annotations": template.metadata.annotations},
                "spec": template.spec,
            },
        },
    }))
    .unwrap()
}

async fn keep_pods(e2e: &E2e) -> Vec<Pod> {
    e2e.pods()
        .list(&ListParams::default().labels("app=keep"))
        .await
        .unwrap()
        .items
}

fn running(pods: &[Pod]) -> Vec<Pod> {
    pods.iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_pods_are_not_consolidated_away() {
    let e2e = E2e::start(two_single_gpu_nodes()).await;
    // Node A: temp-0 + bare-0; node B: temp-1 + bare-1; then the temps go.
    half(&e2e, "temp-0").await;
    let a = half(&e2e, "bare-0").await;
    half(&e2e, "temp-1").await;
    let b = half(&e2e, "bare-1").await;
    assert_ne!(
        gpu_of(&a),
        gpu_of(&b),
        "the halves share a GPU: no scenario"
    );
    delete_now(&e2e, "temp-0").await;
    delete_now(&e2e, "temp-1").await;

    e2e.create(pod("whole").gpus(1)).await;
    let message = e2e.wait_unschedulable("whole").await;
    // A few cycles pass; consolidation would have evicted by now.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    for before in [&a, &b] {
        let name = before.metadata.name.as_deref().unwrap();
        let now = e2e.pod(name).await;
        assert_eq!(now.metadata.uid, before.metadata.uid, "{name} was replaced");
        assert!(now.metadata.deletion_timestamp.is_none(), "{name} evicted");
        let events = e2e.events_of(name).await;
        assert!(
            !events.iter().any(|(reason, _)| reason == "Evicted"),
            "{name}: {events:?}"
        );
    }
    assert!(
        e2e.pod("whole").await.spec.unwrap().node_name.is_none(),
        "whole was placed: {message}"
    );
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployments_pods_are_moved_and_come_back() {
    let e2e = E2e::start(two_single_gpu_nodes()).await;
    let deployments: Api<Deployment> = Api::namespaced(e2e.client.clone(), NS);
    half(&e2e, "temp-0").await;
    deployments
        .create(&PostParams::default(), &keep(1))
        .await
        .unwrap();
    e2e.wait_until("the first keep pod to run", || async {
        (running(&keep_pods(&e2e).await).len() == 1).then_some(())
    })
    .await;
    half(&e2e, "temp-1").await;
    deployments
        .patch(
            "keep",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let before = e2e
        .wait_until("both keep pods to run", || async {
            let r = running(&keep_pods(&e2e).await);
            (r.len() == 2).then_some(r)
        })
        .await;
    let gpus: BTreeSet<String> = before.iter().map(gpu_of).collect();
    assert_eq!(gpus.len(), 2, "the halves share a GPU: no scenario");
    delete_now(&e2e, "temp-0").await;
    delete_now(&e2e, "temp-1").await;

    e2e.create(pod("whole").gpus(1)).await;
    e2e.wait_running(&["whole".to_owned()]).await;
    // One keep pod was evicted, and its event says the ReplicaSet recreates it.
    let uids: BTreeSet<String> = before
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let mut said = Vec::new();
    for p in &before {
        for (reason, message) in e2e.events_of(p.metadata.name.as_deref().unwrap()).await {
            if reason == "Evicted" {
                said.push(message);
            }
        }
    }
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("consolidation")
            && said[0].contains("ReplicaSet keep-")
            && said[0].contains("recreates it"),
        "{}",
        said[0]
    );
    // And it came back: two keep pods run again, one of them new.
    let after = e2e
        .wait_until("the keep pods to run again", || async {
            let r = running(&keep_pods(&e2e).await);
            (r.len() == 2).then_some(r)
        })
        .await;
    let new: Vec<&Pod> = after
        .iter()
        .filter(|p| !uids.contains(p.metadata.uid.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(new.len(), 1, "{after:?}");
    e2e.shutdown().await;
}
