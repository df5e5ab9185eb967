//! Every example in `examples/` applied to a development cluster with the coordinator
//! running, and placed as the example says. The dev cluster runs no controllers, so the
//! test expands Deployments and Jobs into their pods the way the ReplicaSet and Job
//! controllers would. Twelve 8-GPU hollow nodes in two racks; their inventory goes straight
//! into the coordinator's agent registry (the agents themselves are covered by rbac.rs and
//! the node-agent's own tests).

mod common;

use std::collections::BTreeSet;

use common::{Cluster, NodeSpec, repo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
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

/// Pods a controller would make from `template`, owned by `owner`.
fn expand(
    template: &Value,
    owner: &Value,
    owner_kind: &str,
    names: &[String],
    indexed: bool,
) -> Vec<Pod> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut pod = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": template["metadata"].clone(),
                "spec": template["spec"].clone(),
            });
            let meta = pod["metadata"]
                .as_object_mut()
                .expect("template metadata is a map");
            meta.insert("name".into(), json!(name));
            meta.insert("namespace".into(), json!("default"));
            meta.insert(
                "ownerReferences".into(),
                json!([{
                    "apiVersion": owner["apiVersion"], "kind": owner_kind,
                    "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                    "controller": true,
                }]),
            );
            if owner_kind == "Job" {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                labels["job-name"] = owner["metadata"]["name"].clone();
                if indexed {
                    let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
                    annotations["batch.kubernetes.io/job-completion-index"] = json!(i.to_string());
                }
            }
            serde_json::from_value(pod).expect("expanded pod")
        })
        .collect()
}

/// Applies an example file; Deployments and Jobs also get their pods. Returns the pod names.
async fn apply_example(cluster: &Cluster, file: &str) -> Vec<String> {
    let pods_api: Api<Pod> = Api::namespaced(cluster.admin.clone(), "default");
    let mut names = Vec::new();
    for doc in example(file) {
        let created = serde_json::to_value(cluster.apply(&doc).await).expect("object json");
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let pods = match doc["kind"].as_str() {
            Some("Pod") => {
                names.push(name);
                continue;
            }
            Some("Deployment") => {
                let n = doc["spec"]["replicas"].as_u64().unwrap_or(1);
                let rs = json!({
                    "apiVersion": "apps/v1",
                    "metadata": {"name": format!("{name}-5c8f9d"), "uid": format!("rs-uid-{name}")},
                });
                let pod_names: Vec<String> = (0..n).map(|i| format!("{name}-5c8f9d-{i}")).collect();
                expand(
                    &doc["spec"]["template"],
                    &rs,
                    "ReplicaSet",
                    &pod_names,
                    false,
                )
            }
            Some("Job") => {
                let n = doc["spec"]["parallelism"].as_u64().unwrap_or(1);
                let indexed = doc["spec"]["completionMode"] == "Indexed";
                let pod_names: Vec<String> = (0..n).map(|i| format!("{name}-{i}")).collect();
                expand(
                    &doc["spec"]["template"],
                    &created,
                    "Job",
                    &pod_names,
                    indexed,
                )
            }
            _ => continue,
        };
        for pod in pods {
            names.push(pod.metadata.name.clone().unwrap_or_default());
            pods_api
                .create(&PostParams::default(), &pod)
                .await
                .unwrap_or_else(|e| panic!("creating a pod of {name}: {e}"));
        }
    }
    names
}

/// Waits until every pod in `names` is bound; returns them.
async fn wait_bound(cluster: &Cluster, what: &str, names: &[String]) -> Vec<Pod> {
    cluster
        .wait_until(what, || async {
            let all = cluster.pods("default").await;
            let bound: Vec<Pod> = all
                .into_iter()
                .filter(|p| names.contains(p.metadata.name.as_ref().unwrap_or(&String::new())))
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .collect();
            (bound.len() == names.len()).then_some(bound)
        })
        .await
}

/// `(memory MiB, compute milli)` of each GPU in the pod's assignment.
fn slices(pod: &Pod) -> Vec<(u64, u64)> {
    let text = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("tessera.dev/assignment"))
        .unwrap_or_else(|| panic!("{:?} has no assignment", pod.metadata.name));
    let a: Value = serde_json::from_str(text).expect("assignment JSON");
    a["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .flat_map(|c| c["gpus"].as_array().cloned().unwrap_or_default())
        .map(|g| {
            (
                g["memory_mib"].as_u64().unwrap_or(0),
                g["compute_milli"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_are_placed_as_described() {
    let mut nodes = Vec::new();
    for (rack, count) in [("r1", 8), ("r2", 4)] {
        for i in 0..count {
            nodes.push(
                NodeSpec::new(&format!("{rack}-n{i}"), 8, false)
                    .label(RACK, rack)
                    .label("topology.tessera.dev/block", "b1")
                    .label("topology.kubernetes.io/zone", "z1"),
            );
        }
    }
    let cluster = Cluster::start(&nodes).await;
    let racks: std::collections::BTreeMap<String, String> = nodes
        .iter()
        .map(|n| (n.name.clone(), n.labels[RACK].clone()))
        .collect();

    apply_example(&cluster, "queues.yaml").await;
    apply_example(&cluster, "topology.yaml").await;

    // 8 workers x 8 GPUs, all in one rack: only r1 has eight nodes.
    let gang = apply_example(&cluster, "training-gang.yaml").await;
    assert_eq!(gang.len(), 8);
    let gang_pods = wait_bound(&cluster, "the training gang to be bound", &gang).await;
    let gang_nodes: BTreeSet<String> = gang_pods.iter().map(node_of).collect();
    assert_eq!(gang_nodes.len(), 8, "one worker per node: {gang_nodes:?}");
    let gang_racks: BTreeSet<&String> = gang_nodes.iter().map(|n| &racks[n]).collect();
    assert_eq!(gang_racks.len(), 1, "the gang spans racks: {gang_nodes:?}");
    for pod in &gang_pods {
        let s = slices(pod);
        assert_eq!(s.len(), 8, "{:?}: {s:?}", pod.metadata.name);
        assert!(s.iter().all(|(_, c)| *c == 1000), "whole GPUs: {s:?}");
    }

    // A quarter of one GPU: 25% compute and a quarter of its 80 GB.
    let notebook = apply_example(&cluster, "notebook.yaml").await;
    let pods = wait_bound(&cluster, "the notebook to be bound", &notebook).await;
    assert_eq!(slices(&pods[0]), vec![(20480, 250)]);

    // Two replicas with 20 GiB of one GPU each.
    let inference = apply_example(&cluster, "inference.yaml").await;
    assert_eq!(inference.len(), 2);
    let pods = wait_bound(&cluster, "the inference replicas to be bound", &inference).await;
    for pod in &pods {
        let s = slices(pod);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].0, 20480, "{s:?}");
        assert_eq!(
            s[0].1, 250,
            "the compute share follows the memory share: {s:?}"
        );
    }

    // Elastic: runs from minMember (2) and grows to maxMember (6) on idle GPUs.
    let elastic = apply_example(&cluster, "elastic-job.yaml").await;
    assert_eq!(elastic.len(), 6);
    let pods = wait_bound(&cluster, "the elastic job to grow to maxMember", &elastic).await;
    assert!(pods.iter().all(|p| slices(p) == vec![(81920, 1000)]));

    // Queue status: both teams have a fair share and their allocation.
    let queues: Api<tessera_coordinator::crd::Queue> = Api::all(cluster.admin.clone());
    let (a, b) = cluster
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
    cluster.shutdown().await;
}
