//! Kueue in front of Tessera on real Kubernetes: Kueue's own controller (`kueue-peer`,
//! hack/kueue) admits a batch Job against its ClusterQueue's quota, its Job webhook having
//! created the Job suspended; once Kueue admits it and lifts the suspension, the job
//! controller creates the pods, which name `schedulerName: tessera`, and Tessera places them
//! (one gang, exact GPU assignments). A Job over the quota stays suspended in Kueue and never
//! reaches Tessera.

use crate::e2e;

use e2e::{E2e, NS, Setup};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;
use tessera_testcluster::{Kueue, apply};

/// Kueue's label naming a Job's LocalQueue.
const QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";

/// A Job of `pods` pods of `gpus` whole GPUs each, placed by Tessera, queued in Kueue's
/// LocalQueue `team`.
fn job(name: &str, pods: i32, gpus: u32) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_NAME: "team"}},
        "spec": {
            "parallelism": pods, "completions": pods,
            "template": {"spec": {
                "schedulerName": "tessera",
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "cuda", "resources": {
                    "requests": {"cpu": "100m", "memory": "128Mi"},
                    "limits": {"nvidia.com/gpu": gpus.to_string()}}}],
            }},
        },
    }))
    .expect("a valid Job")
}

/// Kueue's Workload objects in the test namespace.
fn workloads(e2e: &E2e) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: "Workload".into(),
        plural: "workloads".into(),
    };
    Api::namespaced_with(e2e.client.clone(), NS, &resource)
}

/// The status of condition `type_` of the Workload Kueue made for Job `job`.
async fn workload_condition(e2e: &E2e, job: &str, type_: &str) -> Option<(String, String)> {
    let list = workloads(e2e).list(&ListParams::default()).await.ok()?;
    let w = list.items.into_iter().find(|w| {
        w.metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o.kind == "Job" && o.name == job))
    })?;
    let c = w.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    Some((
        c["status"].as_str()?.to_owned(),
        c["message"].as_str().unwrap_or("").to_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admits_a_job_and_tessera_places_its_pods() {
    let e2e = E2e::start(Setup::one_node().with_job_controller()).await;
    let kueue = tokio::task::block_in_place(|| Kueue::start(e2e.cluster()));
    // One flavor, a ClusterQueue of four GPUs for every namespace, and the team's LocalQueue.
    for object in [
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": "gpus"}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
               "metadata": {"name": "cluster"},
               "spec": {"namespaceSelector": {}, "resourceGroups": [{
                   "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                   "flavors": [{"name": "gpus", "resources": [
                       {"name": "cpu", "nominalQuota": "16"},
                       {"name": "memory", "nominalQuota": "64Gi"},
                       {"name": "nvidia.com/gpu", "nominalQuota": "4"}]}]}]}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "team", "namespace": NS},
               "spec": {"clusterQueue": "cluster"}}),
    ] {
        apply(&e2e.client, &object).await;
    }

    // Kueue's webhook creates the Job suspended: nothing runs before Kueue admits it.
    let jobs: Api<Job> = Api::namespaced(e2e.client.clone(), NS);
    let created = jobs
        .create(&PostParams::default(), &job("train", 2, 2))
        .await
        .expect("creating the Job");
    assert_eq!(
        created.spec.as_ref().and_then(|s| s.suspend),
        Some(true),
        "Kueue's webhook did not suspend the Job:\n{}",
        kueue.logs()
    );

    // Admitted, unsuspended, and its two pods placed by Tessera.
    let admitted = e2e
        .wait_until("Kueue to admit Job train", || async {
            workload_condition(&e2e, "train", "Admitted")
                .await
                .filter(|(s, _)| s == "True")
        })
        .await;
    assert_eq!(admitted.0, "True");
    let pods: Api<Pod> = Api::namespaced(e2e.client.clone(), NS);
    let names = e2e
        .wait_until("Job train's two pods", || async {
            let list = pods
                .list(&ListParams::default().labels("job-name=train"))
                .await
                .ok()?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            (names.len() == 2).then_some(names)
        })
        .await;
    let running = e2e.wait_running(&names).await;
    for pod in &running {
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
            Some("tessera")
        );
        let assignment = e2e.assert_got_assignment(pod);
        assert_eq!(assignment.slices().count(), 2, "{assignment:?}");
    }

    // The quota is used up: Kueue keeps the next Job suspended, and Tessera never sees a pod.
    jobs.create(&PostParams::default(), &job("more", 1, 2))
        .await
        .expect("creating the second Job");
    let (status, message) = e2e
        .wait_until("Kueue to hold Job more", || async {
            workload_condition(&e2e, "more", "QuotaReserved")
                .await
                .filter(|(s, _)| s == "False")
        })
        .await;
    assert_eq!(status, "False");
    assert!(message.contains("nvidia.com/gpu"), "{message}");
    let more = jobs.get("more").await.expect("Job more");
    assert_eq!(more.spec.and_then(|s| s.suspend), Some(true));
    let none = pods
        .list(&ListParams::default().labels("job-name=more"))
        .await
        .expect("listing pods");
    assert!(none.items.is_empty(), "{:?}", none.items);
    drop(kueue);
    e2e.shutdown().await;
}
