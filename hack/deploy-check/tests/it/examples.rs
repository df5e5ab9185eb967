//! Every example in `examples/` applied, as a user would `kubectl apply` it, to a real
//! cluster (the real Job, Deployment and ReplicaSet controllers make the pods) deployed from
//! the chart, with kubelet-lite nodes whose real agents are their device plugins, and placed
//! as the example says. Ten 8-GPU nodes in two racks: eight in r1 (the only rack that holds
//! the 64-GPU gang), two in r2.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Harness, NodeSpec, Options, is_running, node_of, repo, slices};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::Value;
use tessera_deploy_check::chart::split_documents;
use tessera_deploy_check::kinds;

const RACK: &str = "topology.tessera.dev/rack";

fn example(name: &str) -> Vec<Value> {
    let path = repo().join("examples").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    split_documents(&text)
        .iter()
        .map(|d| kinds::to_json(d).expect("example parses"))
        .collect()
}

async fn apply_example(h: &Harness, file: &str) {
    for doc in example(file) {
        h.apply(&doc).await;
    }
}

/// Waits until `count` pods selected by `selector` in `default` are bound and allocated by
/// their agent; returns them.
async fn wait_placed(h: &Harness, what: &str, selector: &str, count: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(h.admin.clone(), "default");
    h.wait_until(what, || async {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?;
        let placed: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && is_running(p))
            .collect();
        (placed.len() == count).then_some(placed)
    })
    .await
}

fn mem_compute(pod: &Pod) -> Vec<(u64, u64)> {
    slices(pod).into_iter().map(|(_, m, c)| (m, c)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_are_placed_as_described() {
    let mut nodes = Vec::new();
    for (rack, count) in [("r1", 8), ("r2", 2)] {
        for i in 0..count {
            nodes.push(
                NodeSpec::new(&format!("{rack}-n{i}"), 8)
                    .label(RACK, rack)
                    .label("topology.tessera.dev/block", "b1")
                    .label("topology.kubernetes.io/zone", "z1"),
            );
        }
    }
    let racks: BTreeMap<String, String> = nodes
        .iter()
        .map(|n| (n.name.clone(), n.labels[RACK].clone()))
        .collect();
    let mut options = Options::new(nodes);
    options.controllers = "gpu-user".into();
    let h = Harness::start(options).await;

    apply_example(&h, "queues.yaml").await;
    apply_example(&h, "topology.yaml").await;

    // 8 workers x 8 GPUs, all in one rack: only r1 has eight nodes.
    apply_example(&h, "training-gang.yaml").await;
    let gang = wait_placed(&h, "the training gang", "job-name=llama-pretrain", 8).await;
    let gang_nodes: BTreeSet<String> = gang.iter().filter_map(node_of).collect();
    assert_eq!(gang_nodes.len(), 8, "one worker per node: {gang_nodes:?}");
    let gang_racks: BTreeSet<&String> = gang_nodes.iter().map(|n| &racks[n]).collect();
    assert_eq!(gang_racks.len(), 1, "the gang spans racks: {gang_nodes:?}");
    for pod in &gang {
        let s = mem_compute(pod);
        assert_eq!(s.len(), 8, "{:?}: {s:?}", pod.metadata.name);
        assert!(s.iter().all(|(_, c)| *c == 1000), "whole GPUs: {s:?}");
    }

    // A quarter of one GPU: 25% compute and a quarter of its 80 GB.
    apply_example(&h, "notebook.yaml").await;
    let notebook = h
        .wait_until("the notebook to be placed", || async {
            h.pod("notebook-alice").await.filter(is_running)
        })
        .await;
    assert_eq!(mem_compute(&notebook), vec![(20480, 250)]);

    // Two replicas (made by the Deployment and ReplicaSet controllers) with 20 GiB each.
    apply_example(&h, "inference.yaml").await;
    let inference = wait_placed(&h, "the inference replicas", "app=llm-inference", 2).await;
    for pod in &inference {
        let s = mem_compute(pod);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].0, 20480, "{s:?}");
        assert_eq!(
            s[0].1, 250,
            "the compute share follows the memory share: {s:?}"
        );
    }

    // Elastic: runs from minMember (2) and grows to maxMember (6) on idle GPUs.
    apply_example(&h, "elastic-job.yaml").await;
    let elastic = wait_placed(&h, "the elastic job at maxMember", "job-name=sweep", 6).await;
    assert!(
        elastic
            .iter()
            .all(|p| mem_compute(p) == vec![(81920, 1000)])
    );

    // Queue status: both teams have a fair share and their allocation.
    let queues: Api<tessera_coordinator::crd::Queue> = Api::all(h.admin.clone());
    let (a, b) = h
        .wait_until("queue status with allocations", || async {
            let a = queues.get("team-a").await.ok()?.status?;
            let b = queues.get("team-b").await.ok()?.status?;
            // team-a: 64 gang GPUs + a quarter; team-b: 6 sweep GPUs + two quarters.
            let done = a.allocated.as_ref()?.gpu >= 64.25 - 0.01
                && b.allocated.as_ref()?.gpu >= 6.5 - 0.01;
            done.then_some((a, b))
        })
        .await;
    for (name, status) in [("team-a", &a), ("team-b", &b)] {
        let fair = status.fair_share.as_ref().map_or(0.0, |f| f.gpu);
        assert!(fair > 0.0, "{name} has no GPU fair share: {status:?}");
    }
    h.shutdown().await;
}
