//! The chart's RBAC on a real kube-apiserver: the coordinator and a real agent, each acting as
//! the chart's ServiceAccount with exactly the rules `helm template` renders, go through the
//! main paths (bind, fractions, gang with reclaim by eviction, events, pod and CRD status,
//! the leader Lease, TokenReview of the agent's pod-bound token), the coordinator without
//! any right to modify a pod (the assignment travels in the Binding) and the agent without
//! any rule on pods (its node's pods come over its stream); the coordinator labels nodes with
//! their GPUs and, under the chart's node-labels admission policy, may change nothing else on
//! a Node. Then the same with one
//! verb taken away from each component: the API server answers 403 and the component's
//! work visibly does not happen.

use crate::common;

use std::collections::BTreeSet;

use common::{
    COORDINATOR_SA, Harness, LEASE, NAMESPACE, NodeSpec, Options, gpu_pod, is_bound, is_running,
    remove_verb, slices,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use tessera_coordinator::crd::{GpuNode, PodGroup, Queue};

async fn create(h: &Harness, pod: Pod) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    Api::<Pod>::namespaced(h.admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
}

/// Waits until every pod in `names` is bound and marked allocated by its agent.
async fn wait_allocated(h: &Harness, what: &str, names: &[&str]) -> Vec<Pod> {
    h.wait_until(what, || async {
        let all = h.pods("default").await;
        let done: Vec<Pod> = names
            .iter()
            .filter_map(|n| {
                all.iter()
                    .find(|p| p.metadata.name.as_deref() == Some(n))
                    .filter(|p| is_bound(p) && is_running(p))
                    .cloned()
            })
            .collect();
        (done.len() == names.len()).then_some(done)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_rbac_lets_coordinator_and_agent_do_their_work() {
    let h = Harness::start(Options::new(vec![NodeSpec::new("gpu-0", 4)])).await;
    for (name, quota) in [("team-a", 0), ("team-b", 4)] {
        h.apply(&json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": name},
            "spec": {"gpu": {"quota": quota, "overQuotaWeight": 1, "limit": -1}},
        }))
        .await;
    }
    h.apply(&json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "Topology",
        "metadata": {"name": "default"},
        "spec": {"levels": [{"name": "hostname", "nodeLabel": "kubernetes.io/hostname"}]},
    }))
    .await;

    // Fractions: two halves of one GPU, bound, allocated by the agent (it patches the pod).
    for name in ["half-0", "half-1"] {
        create(
            &h,
            gpu_pod(
                name,
                "team-b",
                1,
                "tessera-notebook",
                json!({"tessera.dev/gpu-fraction": "0.5"}),
            ),
        )
        .await;
    }
    let halves = wait_allocated(&h, "the two halves to be allocated", &["half-0", "half-1"]).await;
    let gpus: BTreeSet<String> = halves
        .iter()
        .flat_map(|p| slices(p).into_iter().map(|s| s.0))
        .collect();
    assert_eq!(gpus.len(), 1, "the two halves share one GPU: {gpus:?}");

    // Borrowers: team-a (quota 0) takes the three free GPUs, preemptible.
    let borrowers = ["borrow-0", "borrow-1", "borrow-2"];
    for name in borrowers {
        create(
            &h,
            gpu_pod(name, "team-a", 1, "tessera-training", json!({})),
        )
        .await;
    }
    wait_allocated(&h, "the borrowers to be allocated", &borrowers).await;

    // Bad input: PodScheduled=False (pods/status) and an event (events).
    create(
        &h,
        gpu_pod(
            "bad-fraction",
            "team-a",
            1,
            "tessera-notebook",
            json!({"tessera.dev/gpu-fraction": "1.5"}),
        ),
    )
    .await;

    // A gang of team-b that only fits by reclaiming two of team-a's GPUs (pods/eviction).
    h.apply(&json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "gang", "namespace": "default"},
        "spec": {"minMember": 2, "queue": "team-b"},
    }))
    .await;
    for name in ["gang-0", "gang-1"] {
        create(
            &h,
            gpu_pod(
                name,
                "team-b",
                1,
                "tessera-inference",
                json!({"tessera.dev/pod-group": "gang"}),
            ),
        )
        .await;
    }
    wait_allocated(&h, "the gang to run after reclaim", &["gang-0", "gang-1"]).await;
    let remaining = h.pods("default").await;
    let borrowers_left = remaining
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("borrow-"))
                && p.metadata.deletion_timestamp.is_none()
        })
        .count();
    assert!(
        borrowers_left <= 1,
        "two borrowers were evicted: {borrowers_left} left"
    );

    h.wait_until(
        "bad-fraction to be marked Unschedulable with an event",
        || async {
            let pod = h.pod("bad-fraction").await?;
            let unschedulable = pod
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False");
            let evented = !h.events_of("bad-fraction").await.is_empty();
            (unschedulable && evented).then_some(())
        },
    )
    .await;
    h.wait_until("a Scheduled event for a bound pod", || async {
        h.events_of("gang-0")
            .await
            .iter()
            .any(|(reason, _)| reason == "Scheduled")
            .then_some(())
    })
    .await;
    h.wait_until("queue and PodGroup status", || async {
        let queues: Api<Queue> = Api::all(h.admin.clone());
        let groups: Api<PodGroup> = Api::namespaced(h.admin.clone(), "default");
        let q = queues.get("team-b").await.ok()?.status?;
        let g = groups.get("gang").await.ok()?.status?;
        (q.allocated.as_ref()?.gpu >= 2.0 && g.phase.is_some()).then_some(())
    })
    .await;

    // The node's GpuNode view (what `kubectl tessera gpus` reads): created, owned by its Node,
    // and its status written with the shares the agent reports.
    h.wait_until("gpu-0's GpuNode view with the shares held", || async {
        let view = Api::<GpuNode>::all(h.admin.clone())
            .get("gpu-0")
            .await
            .ok()?;
        let owner = view.metadata.owner_references.as_ref()?.first()?.clone();
        let status = view.status?;
        (owner.kind == "Node"
            && owner.name == "gpu-0"
            && status.gpu_count == 4
            && status
                .gpus
                .iter()
                .any(|g| g.shares.iter().any(|s| s.pod == "gang-0")))
        .then_some(())
    })
    .await;

    // The leader Lease, created and renewed by the coordinator (Role, by resourceName).
    let leases: Api<Lease> = Api::namespaced(h.admin.clone(), NAMESPACE);
    let first = leases.get(LEASE).await.expect("the leader Lease exists");
    let spec = first.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some("tessera-coordinator-0")
    );
    h.wait_until("the Lease to be renewed", || async {
        let now = leases.get(LEASE).await.ok()?;
        (now.metadata.resource_version != first.metadata.resource_version).then_some(())
    })
    .await;

    // The agent connected through TokenReview (else no pod would have been placed), and
    // nothing either component asked for was refused.
    let agent_log = h.node("gpu-0").agent.log();
    assert!(
        !agent_log.to_lowercase().contains("forbidden"),
        "the agent was refused something:\n{agent_log}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_on_pods_binding_the_coordinator_cannot_bind() {
    let mut options = Options::new(vec![NodeSpec::new("gpu-0", 2)]);
    options.edit = |docs| {
        remove_verb(
            docs,
            "ClusterRole",
            COORDINATOR_SA,
            "pods/binding",
            "create",
        )
    };
    let h = Harness::start(options).await;
    create(
        &h,
        gpu_pod("p", "default", 1, "tessera-notebook", json!({})),
    )
    .await;
    // The coordinator decided and its one write, the Binding carrying the assignment, came
    // back 403; it says so in a FailedBinding event.
    let message = h
        .wait_until("a FailedBinding event for p", || async {
            h.events_of("p")
                .await
                .into_iter()
                .find(|(reason, _)| reason == "FailedBinding")
                .map(|(_, m)| m)
        })
        .await;
    assert!(
        message.contains("forbidden") && message.contains("pods/binding"),
        "{message}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let pod = h.pod("p").await.expect("p exists");
    assert!(!is_bound(&pod), "p was bound without the right to bind");
    assert!(
        pod.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("tessera.dev/assignment")),
        "a refused Binding left an assignment on p"
    );
    h.shutdown().await;
}

/// The coordinator places pods with one write, the Binding: its role may read and delete pods
/// but never modify them (the main test above runs everything under exactly this role).
#[test]
fn the_coordinator_may_not_patch_or_update_pods() {
    let docs = common::default_render();
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == COORDINATOR_SA)
        .expect("the coordinator's ClusterRole");
    let mut verbs: Vec<String> = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        let resources: Vec<String> =
            serde_json::from_value(rule["resources"].clone()).expect("resources");
        if resources.iter().any(|r| r == "pods" || r == "*") {
            verbs.extend(
                serde_json::from_value::<Vec<String>>(rule["verbs"].clone()).expect("verbs"),
            );
        }
    }
    verbs.sort();
    assert_eq!(verbs, ["delete", "get", "list", "watch"], "{role:#}");
}

/// The verbs `role` grants on pods.
fn pod_verbs(docs: &[serde_json::Value], role: &str) -> Vec<String> {
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == role)
        .unwrap_or_else(|| panic!("the ClusterRole {role}"));
    let mut verbs: Vec<String> = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        let resources: Vec<String> =
            serde_json::from_value(rule["resources"].clone()).expect("resources");
        if resources.iter().any(|r| r.starts_with("pods") || r == "*") {
            verbs.extend(
                serde_json::from_value::<Vec<String>>(rule["verbs"].clone()).expect("verbs"),
            );
        }
    }
    verbs.sort();
    verbs
}

/// The agent learns its node's pods from the coordinator's stream and reports allocations on
/// it: by default its role grants nothing on pods (the main test above runs a real agent under
/// exactly that role). Only `agent.assignments=kube` grants a read-only pod watch.
#[test]
fn the_agent_may_not_read_or_write_pods_unless_it_watches_them() {
    assert_eq!(
        pod_verbs(&common::default_render(), common::AGENT_SA),
        Vec::<String>::new()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let values = dir.path().join("kube.yaml");
    std::fs::write(&values, "agent:\n  assignments: kube\n").expect("values file");
    assert_eq!(
        pod_verbs(&common::render_with(&[values]), common::AGENT_SA),
        ["list", "watch"]
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "agent:\n  assignments: api\n").expect("values file");
    let err = tessera_deploy_check::chart::template(
        &common::chart_dir(),
        &tessera_deploy_check::chart::Release::default(),
        &[bad],
        true,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("agent.assignments") && err.contains("expected coordinator or kube"),
        "{err}"
    );
}

/// The agent's one write to the API, a pod's Event from the watchdog, as `events.rs` builds it:
/// accepted under the chart's role, refused (403) once `create` on events is taken away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_writes_pod_events_with_its_role_and_not_without_create_on_events() {
    use k8s_openapi::api::core::v1::Event;
    use tessera_agent::events::{EventReason, KubeEvents, PodEvent};
    use tessera_agent::ledger::PodRef;

    for without_create in [false, true] {
        let mut options = Options::new(vec![NodeSpec::new("gpu-0", 1)]);
        if without_create {
            options.edit =
                |docs| remove_verb(docs, "ClusterRole", common::AGENT_SA, "events", "create");
        }
        let h = Harness::start(options).await;
        let kubeconfig = tokio::task::block_in_place(|| {
            h.cluster
                .service_account_kubeconfig(NAMESPACE, common::AGENT_SA)
        });
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("the agent's kubeconfig"),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("the agent's client config");
        let client = kube::Client::try_from(config).expect("the agent's client");
        let event = PodEvent {
            pod: PodRef::new("default", "p"),
            pod_uid: String::new(),
            reason: EventReason::GpuMemoryOverLimit,
            message: "over its GPU memory limit".into(),
        };
        let object = KubeEvents::new(client.clone(), "gpu-0")
            .object(&event, k8s_openapi::jiff::Timestamp::now());
        let created = Api::<Event>::namespaced(client, "default")
            .create(&PostParams::default(), &object)
            .await;
        match (without_create, created) {
            (false, Ok(_)) => {}
            (true, Err(kube::Error::Api(status))) if status.code == 403 => {}
            (without_create, other) => {
                panic!("without create on events: {without_create}; the agent's Event: {other:?}")
            }
        }
        h.shutdown().await;
    }
}

/// A Node change the coordinator's ServiceAccount asks for, and whether the API server lets it.
async fn node_change(client: &kube::Client, patch: serde_json::Value) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    Api::<Node>::all(client.clone())
        .patch("gpu-0", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// The coordinator labels each node with its agent's inventory in GPUs (the only write it
/// makes to Nodes, by server-side apply under `patch` on nodes) and may change nothing else
/// on a Node: the chart's node-labels admission policy refuses it another label, an
/// annotation, a taint or a cordon (403), which RBAC alone would allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_labels_nodes_with_their_gpus_and_may_change_nothing_else() {
    use k8s_openapi::api::core::v1::Node;
    let h = Harness::start(Options::new(vec![NodeSpec::new("gpu-0", 4)])).await;
    let nodes: Api<Node> = Api::all(h.admin.clone());
    let labels = h
        .wait_until("gpu-0's GPU labels from its agent", || async {
            let labels = nodes.get("gpu-0").await.ok()?.metadata.labels?;
            labels
                .contains_key("tessera.dev/gpu-count")
                .then_some(labels)
        })
        .await;
    for (key, value) in [
        ("nvidia.com/gpu.count", "4"),
        ("nvidia.com/gpu.product", "A100-80GB"),
        ("nvidia.com/gpu.memory", "81920"),
        ("tessera.dev/gpu-count", "4"),
        ("tessera.dev/gpu-shares-per-gpu", "10"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "{key}: {labels:?}"
        );
    }

    let coordinator = h.cluster.service_account(NAMESPACE, COORDINATOR_SA).await;
    // Its own labels: allowed.
    node_change(
        &coordinator,
        json!({"metadata": {"labels": {"tessera.dev/gpu-count": "4"}}}),
    )
    .await
    .expect("the coordinator writes the GPU labels");
    // Anything else: refused by the admission policy, naming what it may change.
    for (what, patch) in [
        (
            "another label",
            json!({"metadata": {"labels": {"example.com/pool": "gpu"}}}),
        ),
        (
            "another label removed",
            json!({"metadata": {"labels": {"kubernetes.io/hostname": null}}}),
        ),
        (
            "an annotation",
            json!({"metadata": {"annotations": {"example.com/note": "x"}}}),
        ),
        (
            "a taint",
            json!({"spec": {"taints": [{"key": "example.com/t", "effect": "NoSchedule"}]}}),
        ),
        ("a cordon", json!({"spec": {"unschedulable": true}})),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    ] {
        match node_change(&coordinator, patch).await {
            Err(kube::Error::Api(status))
                if status.code == 403
                    && status.message.contains("may change only the GPU labels") => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    // The node is as it was.
    let after = nodes.get("gpu-0").await.expect("gpu-0");
    let spec = after.spec.clone().unwrap_or_default();
    assert!(
        spec.taints.is_none() && spec.unschedulable.is_none(),
        "{spec:?}"
    );
    h.shutdown().await;
}

/// Without `patch` on nodes the coordinator's label write is the API server's 403 (the rule
/// is the labeller's and nothing else's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_patch_on_nodes_the_coordinator_cannot_label_them() {
    let mut options = Options::new(vec![NodeSpec::new("gpu-0", 1)]);
    options.edit = |docs| remove_verb(docs, "ClusterRole", COORDINATOR_SA, "nodes", "patch");
    let h = Harness::start(options).await;
    let coordinator = h.cluster.service_account(NAMESPACE, COORDINATOR_SA).await;
    match node_change(
        &coordinator,
        json!({"metadata": {"labels": {"tessera.dev/gpu-count": "1"}}}),
    )
    .await
    {
        Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("patch") => {
        }
        other => panic!("a label without patch on nodes: {other:?}"),
    }
    h.shutdown().await;
}

/// `tessera-viewer`, for people running `kubectl tessera`: reads only, of Tessera's objects and
/// Nodes, and nothing of pods, Secrets or ConfigMaps (a user's own pods come from their
/// namespace's roles). The end-to-end use of it is `coordinator/tests/it/e2e_kubectl.rs`.
#[test]
fn the_viewer_role_only_reads_tesseras_objects_and_nodes() {
    let docs = common::default_render();
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "tessera-viewer")
        .expect("the ClusterRole tessera-viewer");
    let mut granted: BTreeSet<(String, String, String)> = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        let list = |key: &str| -> Vec<String> {
            serde_json::from_value(rule[key].clone()).unwrap_or_default()
        };
        for group in list("apiGroups") {
            for resource in list("resources") {
                for verb in list("verbs") {
                    granted.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    let mut want = BTreeSet::new();
    for (group, resource) in [
        ("tessera.dev", "gpunodes"),
        ("tessera.dev", "queues"),
        ("tessera.dev", "podgroups"),
        ("tessera.dev", "topologies"),
        ("", "nodes"),
    ] {
        for verb in ["get", "list", "watch"] {
            want.insert((group.to_owned(), resource.to_owned(), verb.to_owned()));
        }
    }
    assert_eq!(granted, want, "{role:#}");
    // Nothing binds it: an admin chooses who views.
    assert!(
        !docs
            .iter()
            .any(|d| d["roleRef"]["name"] == "tessera-viewer"),
        "the chart binds tessera-viewer"
    );
}
