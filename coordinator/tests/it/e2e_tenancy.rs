//! Queue tenancy end to end on real Kubernetes (hack/k8s): a Queue that admits only
//! namespaces labelled for it. A pod from another namespace naming it stays Pending with a
//! condition and an Event that name the queue and the namespace, while one from an admitted
//! namespace runs on the same GPU; labelling the outsider's namespace admits it, with nothing
//! restarted (the rule is judged from the coordinator's cache of namespaces every cycle).

use crate::e2e;

use e2e::{E2e, Setup, pod, unschedulable_message};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_coordinator::crd::{NamespaceSelector, Queue, QueueSpec};
use tessera_testcluster::pods::events_of;
use tessera_testcluster::{apply, wait_service_account};

/// The queue's label on the namespaces it admits.
const TEAM_LABEL: &str = "example.com/team";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_from_a_namespace_its_queue_does_not_admit_waits_and_says_why() {
    let e2e = E2e::start(Setup::one_gpu()).await;
    let client = e2e.client.clone();
    for (name, labels) in [
        ("ml", json!({TEAM_LABEL: "ml"})),
        ("outside", json!({TEAM_LABEL: "web"})),
    ] {
        apply(
            &client,
            &json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": labels}}),
        )
        .await;
        wait_service_account(&client, name, "default").await;
    }
    let queue = Queue::new(
        "ml-gpus",
        QueueSpec {
            namespace_selector: Some(NamespaceSelector {
                match_labels: [(TEAM_LABEL.to_string(), "ml".to_string())].into(),
                ..NamespaceSelector::default()
            }),
            ..QueueSpec::default()
        },
    );
    Api::<Queue>::all(client.clone())
        .create(&PostParams::default(), &queue)
        .await
        .expect("the queue");

    // A quarter of the one GPU each: either would fit.
    let in_namespace = |ns: &str| -> Api<Pod> { Api::namespaced(client.clone(), ns) };
    for (ns, name) in [("outside", "outsider"), ("ml", "insider")] {
        let p = pod(name)
            .namespace(ns)
            .fraction("0.25")
            .queue("ml-gpus")
            .build();
        in_namespace(ns)
            .create(&PostParams::default(), &p)
            .await
            .unwrap_or_else(|e| panic!("creating {ns}/{name}: {e}"));
    }

    let message = e2e
        .wait_until("outside/outsider to be marked Unschedulable", || async {
            let p = in_namespace("outside").get("outsider").await.ok()?;
            unschedulable_message(&p)
        })
        .await;
    assert!(
        message.contains("tessera.dev/queue")
            && message.contains("queue \"ml-gpus\" does not admit pods of namespace \"outside\""),
        "{message}"
    );
    let event = e2e
        .wait_until("an Event about outside/outsider", || async {
            events_of(&client, "outside", "outsider")
                .await
                .into_iter()
                .find(|(_, m)| m.contains("\"ml-gpus\"") && m.contains("\"outside\""))
        })
        .await;
    assert_eq!(event.0, "FailedScheduling", "{event:?}");

    e2e.wait_until("ml/insider to run", || async {
        let p = in_namespace("ml").get("insider").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let outsider = in_namespace("outside")
        .get("outsider")
        .await
        .expect("outsider");
    assert_eq!(
        outsider.spec.and_then(|s| s.node_name),
        None,
        "the outsider was never bound"
    );

    // The namespace joins the team: admitted, it runs beside the insider.
    Api::<Namespace>::all(client.clone())
        .patch(
            "outside",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {TEAM_LABEL: "ml"}}})),
        )
        .await
        .expect("relabelling the namespace");
    e2e.wait_until("outside/outsider to run once admitted", || async {
        let p = in_namespace("outside").get("outsider").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    e2e.shutdown().await;
}
