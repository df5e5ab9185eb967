//! End to end on real Kubernetes (hack/k8s): the constraints kube-scheduler's default filters
//! enforce hold for the pods Tessera places, written the way users write them (the API server
//! validates and defaults them, kubelet-lite nodes admit the bound pods, real agents allocate
//! their GPUs): required node affinity, scheduling gates, inter-pod anti-affinity, taints and
//! tolerations, and hard topology spread. Pods that cannot be placed say why, counting nodes.

use crate::e2e;

use std::collections::BTreeMap;

use e2e::{E2e, PodBuilder, Setup, names, node_of, pod, pod_scheduled_false};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const HOSTNAME: &str = "kubernetes.io/hostname";

/// Required node affinity: `kubernetes.io/hostname In nodes`.
fn on_hosts(p: PodBuilder, nodes: &[&str]) -> PodBuilder {
    p.spec_field(
        "affinity",
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME, "operator": "In", "values": nodes}]}]}}}),
    )
}

/// Labelled `app=<app>`, with required anti-affinity to other `app=<app>` pods per node.
fn one_per_node(p: PodBuilder, app: &str) -> PodBuilder {
    p.label("app", app).spec_field(
        "affinity",
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}]}}),
    )
}

/// Pods per node among `pods`.
fn per_node(pods: &[Pod]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in pods {
        *out.entry(node_of(p).unwrap_or_default()).or_default() += 1;
    }
    out
}

/// Waits many scheduling cycles and checks `name` is still unbound.
async fn assert_stays_unbound(e2e: &E2e, name: &str) {
    // The coordinator runs a cycle at least every 100 ms in the harness.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        node_of(&e2e.pod(name).await),
        None,
        "{name} was bound\n{}",
        e2e.describe().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_node_affinity_picks_the_named_node() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    let pinned = names("pinned", 3);
    for name in &pinned {
        e2e.create(on_hosts(pod(name).gpus(1), &["node-b"])).await;
    }
    let pods = e2e.wait_running(&pinned).await;
    for p in &pods {
        assert_eq!(
            node_of(p).as_deref(),
            Some("node-b"),
            "{:?}",
            p.metadata.name
        );
        e2e.assert_got_assignment(p);
    }
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_no_node_satisfies_stays_pending_with_counted_reasons() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    e2e.create(on_hosts(pod("nowhere").gpus(1), &["node-z"]))
        .await;
    let message = e2e.wait_unschedulable("nowhere").await;
    assert!(
        message.contains("0/2") && message.contains("2 ") && message.contains("affinity"),
        "the message counts both nodes as failing node affinity: {message:?}"
    );
    assert_stays_unbound(&e2e, "nowhere").await;
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduling_gates_hold_a_pod_until_removed() {
    let e2e = E2e::start(Setup::one_node()).await;
    let gate = "example.com/quota-check";
    e2e.create(
        pod("gated")
            .gpus(1)
            .spec_field("schedulingGates", json!([{"name": gate}])),
    )
    .await;
    // The API server writes a SchedulingGated condition at creation; the coordinator's own
    // names the gate.
    e2e.wait_until("the coordinator's SchedulingGated condition", || async {
        let message = pod_scheduled_false(&e2e.pod("gated").await, "SchedulingGated")?;
        message.contains(gate).then_some(())
    })
    .await;
    assert_stays_unbound(&e2e, "gated").await;
    let still = pod_scheduled_false(&e2e.pod("gated").await, "SchedulingGated");
    assert!(
        still.is_some(),
        "the gated pod's reason changed: {:?}",
        e2e.pod("gated").await.status
    );
    assert!(
        !e2e.events_of("gated")
            .await
            .iter()
            .any(|(reason, _)| reason == "FailedScheduling"),
        "a gated pod is not tried, so it has no FailedScheduling event"
    );

    // Removing the gate releases it.
    // A merge patch's null removes the field (gates may only be removed).
    let patch = json!({"spec": {"schedulingGates": null}});
    e2e.pods()
        .patch("gated", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("removing the scheduling gate");
    let pods = e2e.wait_running(&["gated".to_string()]).await;
    e2e.assert_got_assignment(&pods[0]);
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_anti_affinity_puts_one_pod_per_node() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    let first = names("solo", 2);
    for name in &first {
        e2e.create(one_per_node(pod(name).gpus(1), "solo")).await;
    }
    let pods = e2e.wait_running(&first).await;
    assert_eq!(
        per_node(&pods),
        BTreeMap::from([("node-a".to_string(), 1), ("node-b".to_string(), 1)]),
        "anti-affinity on the hostname puts them on different nodes"
    );
    // Both nodes hold one: a third has nowhere to go.
    e2e.create(one_per_node(pod("solo-2").gpus(1), "solo"))
        .await;
    let message = e2e.wait_unschedulable("solo-2").await;
    assert!(
        message.contains("0/2") && message.contains("anti-affinity"),
        "{message:?}"
    );
    assert_stays_unbound(&e2e, "solo-2").await;
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taints_keep_pods_without_a_toleration_away() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    let nodes: Api<Node> = Api::all(e2e.client.clone());
    let taint = json!({"spec": {"taints": [
        {"key": "example.com/dedicated", "value": "x", "effect": "NoSchedule"}]}});
    nodes
        .patch("node-a", &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("tainting node-a");
    // The coordinator must see the taint before the pods arrive.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    let plain = names("plain", 3);
    for name in &plain {
        e2e.create(pod(name).gpus(1)).await;
    }
    let pods = e2e.wait_running(&plain).await;
    for p in &pods {
        assert_eq!(
            node_of(p).as_deref(),
            Some("node-b"),
            "{:?} does not tolerate node-a's taint",
            p.metadata.name
        );
    }
    // Tolerating it, a pod may use node-a (pinned there, so it must).
    let toleration: Value = json!([{"key": "example.com/dedicated", "operator": "Equal",
                                    "value": "x", "effect": "NoSchedule"}]);
    e2e.create(
        on_hosts(pod("tolerant").gpus(1), &["node-a"]).spec_field("tolerations", toleration),
    )
    .await;
    let pods = e2e.wait_running(&["tolerant".to_string()]).await;
    assert_eq!(node_of(&pods[0]).as_deref(), Some("node-a"));
    e2e.assert_got_assignment(&pods[0]);

    // Pinned to node-a without the toleration: pending, the taint named.
    e2e.create(on_hosts(pod("intolerant").gpus(1), &["node-a"]))
        .await;
    let message = e2e.wait_unschedulable("intolerant").await;
    assert!(message.contains("example.com/dedicated"), "{message:?}");
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_topology_spread_balances_replicas_over_nodes() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    let replicas = names("web", 4);
    let spread = json!([{"maxSkew": 1, "topologyKey": HOSTNAME,
                         "whenUnsatisfiable": "DoNotSchedule",
                         "labelSelector": {"matchLabels": {"app": "web"}}}]);
    e2e.create_all(replicas.iter().map(|name| {
        pod(name)
            .gpus(1)
            .label("app", "web")
            .spec_field("topologySpreadConstraints", spread.clone())
    }))
    .await;
    let pods = e2e.wait_running(&replicas).await;
    assert_eq!(
        per_node(&pods),
        BTreeMap::from([("node-a".to_string(), 2), ("node-b".to_string(), 2)]),
        "maxSkew 1 over two nodes: two each"
    );
    e2e.assert_bound_at_most_once();
    e2e.shutdown().await;
}
