//! What the real kube-apiserver (hack/k8s) does to the coordinator's writes, checked with the
//! coordinator's own binder where it has the call, and with the raw call where a fix in the
//! binding path builds on the server's behaviour: a Binding's annotations land on the pod
//! atomically, a gated pod cannot be bound, and an eviction carries its UID precondition.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tessera_coordinator::cluster::binder::{Binder, EvictOutcome, EvictTarget};
use tessera_coordinator::cluster::events::EventWriter;
use tessera_testcluster::{Cluster, ClusterOptions, DEADLINE, LiteNode, NodeOptions};

struct Env {
    cluster: Cluster,
    node: LiteNode,
    client: kube::Client,
}

async fn env() -> Env {
    let cluster = Cluster::start(ClusterOptions {
        controllers: Some("serviceaccount-controller".into()),
        ..ClusterOptions::default()
    });
    let mut options = NodeOptions::new("n1");
    options.capacity = BTreeMap::from([("nvidia.com/gpu".to_owned(), "8".to_owned())]);
    let node = LiteNode::start(&cluster, options);
    let client = cluster.admin().await;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), "default");
    wait("the default ServiceAccount", || async {
        sas.get("default").await.ok().map(|_| ())
    })
    .await;
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
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let p = pods.get("victim").await.expect("read the victim");
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the victim to run; its status: {:?}\nnode log:\n{}",
            p.status,
            env.node.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
