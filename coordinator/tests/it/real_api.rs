//! What the real kube-apiserver (hack/k8s) does to the coordinator's writes, checked with the
//! coordinator's own binder where it has the call, and with the raw call where a fix in the
//! binding path builds on the server's behaviour: a Binding's annotations land on the pod
//! atomically, a gated pod cannot be bound, and an eviction carries its UID precondition.
//! Also what the server says when a disruption budget refuses an eviction, and that the
//! coordinator's Events are accepted and aggregate.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tessera_coordinator::cluster::binder::{Binder, EvictOutcome, EvictTarget, EvictionRefusal};
use tessera_coordinator::cluster::events::{self, EventKind, EventWriter};
use tessera_testcluster::{Cluster, ClusterOptions, DEADLINE, LiteNode, NodeOptions};

struct Env {
    cluster: Cluster,
    node: LiteNode,
    client: kube::Client,
}

async fn env() -> Env {
    env_with("serviceaccount-controller").await
}

/// A cluster whose kube-controller-manager runs `controllers`.
async fn env_with(controllers: &str) -> Env {
    let cluster = Cluster::start(ClusterOptions {
        controllers: Some(controllers.into()),
        ..ClusterOptions::default()
    });
    let mut options = NodeOptions::new("n1");
    options.capacity = BTreeMap::from([("nvidia.com/gpu".to_owned(), "8".to_owned())]);
    let node = LiteNode::start(&cluster, options);
    let client = cluster.admin().await;
    tessera_testcluster::wait_service_account(&client, "default", "default").await;
    Env {
        cluster,
        node,
        client,
    }
}

async fn wait<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    tessera_testcluster::wait_for(what, probe, || async { String::new() }).await
}

impl Env {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, name: &str, extra_spec: serde_json::Value) -> Pod {
        let mut spec = json!({"schedulerName": "tessera",
            "containers": [{"name": "main", "image": "cuda"}]});
        if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
            s.extend(extra.clone());
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    async fn bind(
        &self,
        name: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), kube::Error> {
        let binding: Binding = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        }))
        .unwrap();
        let _: serde_json::Value = self
            .pods()
            .create_subresource("binding", name, &PostParams::default(), &binding)
            .await?;
        Ok(())
    }

    /// Waits until the pod runs on its node.
    async fn wait_running(&self, name: &str) {
        let pods = self.pods();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let p = pods.get(name).await.expect("read the pod");
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {name} to run; its status: {:?}\nnode log:\n{}",
                p.status,
                self.node.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn binder(&self) -> Binder {
        Binder::new(
            self.client.clone(),
            EventWriter::new(self.client.clone(), "tessera", "test"),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_carries_its_annotations_onto_the_pod() {
    let env = env().await;
    env.create("p", json!({})).await;
    let assignment = r#"{"containers":[{"container":"main","gpus":[]}]}"#;
    env.bind(
        "p",
        BTreeMap::from([("tessera.dev/assignment".to_owned(), assignment.to_owned())]),
    )
    .await
    .expect("bind");
    let pod = env.pods().get("p").await.unwrap();
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(
        pod.metadata
            .annotations
            .unwrap_or_default()
            .get("tessera.dev/assignment")
            .map(String::as_str),
        Some(assignment),
        "the server copies a Binding's annotations onto the pod in the same write"
    );
    // A second bind is refused: a pod is bound once.
    let again = env
        .bind("p", BTreeMap::new())
        .await
        .expect_err("second bind");
    assert!(
        matches!(&again, kube::Error::Api(s) if s.code == 409),
        "{again}"
    );
    drop(env.cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_scheduling_gates_cannot_be_bound() {
    let env = env().await;
    env.create(
        "gated",
        json!({"schedulingGates": [{"name": "example.com/quota"}]}),
    )
    .await;
    let refused = env
        .bind("gated", BTreeMap::new())
        .await
        .expect_err("gated bind");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 409 && s.message.contains("schedulingGates")),
        "the server refuses with a conflict naming the gates: {refused}"
    );
    assert!(
        env.pods()
            .get("gated")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binders_eviction_keeps_its_uid_precondition() {
    let env = env().await;
    env.create("victim", json!({})).await;
    env.bind("victim", BTreeMap::new()).await.expect("bind");
    let pods = env.pods();
    env.wait_running("victim").await;
    let uid = pods.get("victim").await.unwrap().metadata.uid.unwrap();
    let binder = env.binder();

    // An eviction meant for an earlier pod of the same name must not touch this one.
    let stale = EvictTarget {
        namespace: "default".into(),
        name: "victim".into(),
        uid: "00000000-0000-0000-0000-000000000000".into(),
    };
    let outcome = binder
        .evict(&stale, "test")
        .await
        .expect("eviction answered");
    assert_eq!(
        outcome,
        EvictOutcome::Gone,
        "a UID mismatch is the server's 409"
    );
    let still = pods.get("victim").await.unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "the server evicted a pod whose UID the eviction did not name"
    );

    // With its own UID it is evicted, and its kubelet ends it.
    let outcome = binder
        .evict(&EvictTarget { uid, ..stale }, "test")
        .await
        .expect("eviction answered");
    assert_eq!(outcome, EvictOutcome::Evicted);
    wait("the evicted pod to be gone", || async {
        pods.get_opt("victim").await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_a_disruption_budget_refuses_is_a_budget_refusal() {
    let env = env_with("serviceaccount-controller,disruption").await;
    env.create("guarded", json!({})).await;
    let pods = env.pods();
    pods.patch(
        "guarded",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "guarded"}}})),
    )
    .await
    .expect("label the pod");
    env.bind("guarded", BTreeMap::new()).await.expect("bind");
    // A Pending pod is never guarded by a budget: the server evicts it regardless.
    env.wait_running("guarded").await;
    let uid = pods.get("guarded").await.unwrap().metadata.uid.unwrap();

    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-one", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("create the budget");
    // The eviction handler reads the budget's status, which the disruption controller
    // computes; it must have observed the budget's generation.
    wait(
        "the disruption controller to compute the budget",
        || async {
            let pdb = pdbs.get("keep-one").await.ok()?;
            let status = pdb.status?;
            (status.observed_generation? >= pdb.metadata.generation?
                && status.disruptions_allowed.unwrap_or(-1) == 0
                && status.desired_healthy.unwrap_or(-1) == 1)
                .then_some(())
        },
    )
    .await;

    // kube 5 clients retry every 429 by default (up to 15 times, backing off exponentially:
    // minutes), a budget refusal included; this binder's client answers at once.
    let kubeconfig = Kubeconfig::read_from(env.cluster.admin_kubeconfig()).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
    config.default_retry = false;
    let once = kube::Client::try_from(config).unwrap();
    let binder = Binder::new(once.clone(), EventWriter::new(once, "tessera", "test"));
    let target = EvictTarget {
        namespace: "default".into(),
        name: "guarded".into(),
        uid,
    };
    let refused = binder
        .evict(&target, "test")
        .await
        .expect_err("the budget refuses the eviction");
    assert_eq!(
        EvictionRefusal::of(&refused),
        Some(EvictionRefusal::DisruptionBudget),
        "the server's 429 names the DisruptionBudget cause: {refused:?}"
    );
    assert!(
        pods.get("guarded")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "a refused eviction leaves the pod"
    );

    // A gang rollback goes past the budget: the refusal is classified as one and the
    // member deleted, not retried as throttling.
    let outcome = binder
        .evict_or_delete(&target, "test")
        .await
        .expect("deleted past the budget");
    assert_eq!(outcome, EvictOutcome::Evicted);
    wait("the deleted pod to go", || async {
        let p = pods.get_opt("guarded").await.ok()?;
        p.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_for_a_long_named_pod_are_accepted_and_aggregate() {
    let env = env().await;
    let name = format!("{}-{}", "long".repeat(61), "named");
    assert_eq!(name.len(), 250);
    let pod = env.create(&name, json!({})).await;
    let uid = pod.metadata.uid.unwrap();
    let writer = EventWriter::new(env.client.clone(), "tessera", "test");
    let object = events::pod_ref("default", &name, &uid);
    for _ in 0..3 {
        writer
            .publish(
                &object,
                EventKind::Warning,
                events::FAILED_SCHEDULING,
                "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
            )
            .await;
    }
    let api: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let about_pod = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    let list = api.list(&about_pod).await.expect("list events").items;
    assert_eq!(
        list.len(),
        1,
        "three identical events are one Event: {list:#?}"
    );
    let event = &list[0];
    let event_name = event.metadata.name.as_deref().unwrap();
    assert!(event_name.len() <= 253, "{event_name}");
    assert_eq!(event.count, Some(3), "{event:#?}");
    assert_eq!(event.involved_object.name.as_deref(), Some(name.as_str()));
    assert!(event.last_timestamp >= event.first_timestamp, "{event:#?}");

    // Another message is another Event.
    writer
        .publish(
            &object,
            EventKind::Warning,
            events::FAILED_SCHEDULING,
            "0/1 nodes are available: 1 node(s) had untolerated taint.",
        )
        .await;
    let list = api.list(&about_pod).await.expect("list events").items;
    assert_eq!(list.len(), 2, "{list:#?}");
    assert!(
        list.iter()
            .any(|e| e.metadata.name.as_deref() == Some(event_name) && e.count == Some(3))
    );

    // An Event gone from the server (expired) is written again, counting on.
    api.delete(event_name, &Default::default())
        .await
        .expect("delete the event");
    writer
        .publish(
            &object,
            EventKind::Warning,
            events::FAILED_SCHEDULING,
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
        )
        .await;
    let list = api.list(&about_pod).await.expect("list events").items;
    assert_eq!(list.len(), 2, "{list:#?}");
    assert!(
        list.iter().any(|e| e.count == Some(4)
            && e.message.as_deref()
                == Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")),
        "{list:#?}"
    );
}
