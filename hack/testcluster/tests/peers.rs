//! The peers themselves, exercised the way the product's tests rely on them: the real
//! kube-scheduler binds a default-scheduler pod and leaves a `schedulerName: tessera` pod alone,
//! the real job controller completes a Job whose pod a kubelet-lite node ran, and the real
//! garbage collector removes the Job's pods with it.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy};
use serde_json::json;
use tessera_testcluster::{Cluster, ClusterOptions, LiteNode, NodeOptions, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_scheduler_job_controller_and_kubelet_lite_run_a_job_to_completion() {
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions {
            scheduler: true,
            controllers: Some("gpu-user".into()),
            ..ClusterOptions::default()
        })
    });
    let mut options = NodeOptions::new("n1");
    options.capacity = BTreeMap::from([("nvidia.com/gpu".to_owned(), "8".to_owned())]);
    let node = tokio::task::block_in_place(|| LiteNode::start(&cluster, options));
    let client = cluster.admin().await;
    let describe = || async { format!("kubelet-lite log:\n{}\n{}", node.log(), cluster.logs()) };
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait_for(
        "the default ServiceAccount",
        || async { sas.get_opt("default").await.ok().flatten() },
        describe,
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ours: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ours"},
        "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &ours).await.unwrap();

    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {"kubelet-lite.tessera.dev/run-for": "1s"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    wait_for(
        "the Job to complete",
        || async {
            let job = jobs.get("once").await.ok()?;
            (job.status?.succeeded? == 1).then_some(())
        },
        describe,
    )
    .await;
    let run = pods
        .list(&ListParams::default().labels("job-name=once"))
        .await
        .unwrap();
    assert_eq!(run.items.len(), 1);
    let spec = run.items[0].spec.as_ref().unwrap();
    assert_eq!(
        spec.node_name.as_deref(),
        Some("n1"),
        "kube-scheduler bound it"
    );
    assert!(
        node.containers()
            .iter()
            .any(|c| c.pod == run.items[0].metadata.name.clone().unwrap()),
        "kubelet-lite recorded the Job's container"
    );

    let ours = pods.get("ours").await.unwrap();
    assert_eq!(
        ours.spec.unwrap().node_name,
        None,
        "kube-scheduler bound a pod that names another scheduler"
    );

    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    jobs.delete("once", &dp).await.unwrap();
    wait_for(
        "the garbage collector to remove the Job's pod",
        || async {
            let left = pods
                .list(&ListParams::default().labels("job-name=once"))
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        },
        describe,
    )
    .await;
}
