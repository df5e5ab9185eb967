//! The Workload API on real Kubernetes (hack/k8s serves `scheduling.k8s.io/v1beta1` with the
//! GenericWorkload gate on): pods that name a PodGroup in `spec.schedulingGroup` are one gang
//! for Tessera, placed whole or not at all, with the PodGroup's `PodGroupInitiallyScheduled`
//! condition written as kube-scheduler writes it; a pod that is also in a Tessera PodGroup is
//! refused, naming both groups.

use crate::e2e;

use e2e::{E2e, NS, Setup, names, node_of, pod};
use k8s_openapi::api::scheduling::v1beta1::{PodGroup as WorkloadPodGroup, Workload};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, PostParams};
use serde_json::json;

/// The condition kube-scheduler writes on a PodGroup after trying it.
const INITIALLY_SCHEDULED: &str = "PodGroupInitiallyScheduled";

/// Creates a Workload `name` with one pod group template, and the PodGroup `name` a workload
/// controller would create from it: a gang of `min_count`, or a `basic` group for `None`.
async fn create_workload_group(e2e: &E2e, name: &str, min_count: Option<i32>) {
    let policy = match min_count {
        Some(n) => json!({"gang": {"minCount": n}}),
        None => json!({"basic": {}}),
    };
    let workload: Workload = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": policy}]},
    }))
    .expect("a valid Workload");
    Api::<Workload>::namespaced(e2e.client.clone(), NS)
        .create(&PostParams::default(), &workload)
        .await
        .unwrap_or_else(|e| panic!("creating Workload {name}: {e}"));
    let group: WorkloadPodGroup = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "workloadRef": {"workloadName": name, "templateName": "workers"},
            "schedulingPolicy": policy,
        },
    }))
    .expect("a valid PodGroup");
    Api::<WorkloadPodGroup>::namespaced(e2e.client.clone(), NS)
        .create(&PostParams::default(), &group)
        .await
        .unwrap_or_else(|e| panic!("creating PodGroup {name}: {e}"));
}

/// The PodGroup's `PodGroupInitiallyScheduled` condition, if written.
async fn initially_scheduled(e2e: &E2e, name: &str) -> Option<Condition> {
    let group = Api::<WorkloadPodGroup>::namespaced(e2e.client.clone(), NS)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading PodGroup {name}: {e}"));
    group
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == INITIALLY_SCHEDULED)
}

/// Waits until PodGroup `name`'s condition has `status`, and returns it.
async fn wait_condition(e2e: &E2e, name: &str, status: &str) -> Condition {
    e2e.wait_until(
        &format!("PodGroup {name} to say {INITIALLY_SCHEDULED}={status}"),
        || async {
            initially_scheduled(e2e, name)
                .await
                .filter(|c| c.status == status)
        },
    )
    .await
}

/// A pod of `gpus` whole GPUs in the Workload API's PodGroup `group`.
fn member(name: &str, group: &str, gpus: u32) -> tessera_testcluster::pods::PodBuilder {
    pod(name)
        .gpus(gpus)
        .spec_field("schedulingGroup", json!({"podGroupName": group}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_in_a_workload_api_pod_group_is_placed_whole_or_not_at_all() {
    let e2e = E2e::start(Setup::one_node()).await;
    create_workload_group(&e2e, "train", Some(3)).await;
    let gang = names("train", 3);

    // Two of three: kube-scheduler would not try the group yet, and neither may Tessera bind
    // any of it; the group has no condition until it is tried.
    for name in &gang[..2] {
        e2e.create(member(name, "train", 2)).await;
    }
    for name in &gang[..2] {
        let message = e2e.wait_unschedulable(name).await;
        assert!(
            message.contains("scheduling.k8s.io/train"),
            "{name}: the message names its group: {message}"
        );
    }
    for name in &gang[..2] {
        assert_eq!(node_of(&e2e.pod(name).await), None, "{name} bound alone");
    }
    assert_eq!(initially_scheduled(&e2e, "train").await, None);

    // The third member completes it: all three run, and the group says so.
    e2e.create(member(&gang[2], "train", 2)).await;
    e2e.wait_running(&gang).await;
    let scheduled = wait_condition(&e2e, "train", "True").await;
    assert_eq!(scheduled.reason, "Scheduled");
    let generation = Api::<WorkloadPodGroup>::namespaced(e2e.client.clone(), NS)
        .get("train")
        .await
        .expect("the PodGroup")
        .metadata
        .generation;
    assert_eq!(scheduled.observed_generation, generation);

    // A gang of two two-GPU pods needs four of the two GPUs left: none of it is bound, and
    // its PodGroup says why.
    create_workload_group(&e2e, "big", Some(2)).await;
    let big = names("big", 2);
    for name in &big {
        e2e.create(member(name, "big", 2)).await;
    }
    let refused = wait_condition(&e2e, "big", "False").await;
    assert_eq!(refused.reason, "Unschedulable");
    assert!(!refused.message.is_empty(), "{refused:?}");
    for name in &big {
        e2e.wait_unschedulable(name).await;
        assert_eq!(node_of(&e2e.pod(name).await), None, "{name} bound alone");
    }

    // A basic group's pod is placed on its own, in the room the big gang could not use.
    create_workload_group(&e2e, "solo", None).await;
    e2e.create(member("solo-0", "solo", 2)).await;
    e2e.wait_running(&["solo-0".to_string()]).await;
    assert_eq!(
        wait_condition(&e2e, "solo", "True").await.reason,
        "Scheduled"
    );
    for name in &big {
        assert_eq!(node_of(&e2e.pod(name).await), None, "{name} bound alone");
    }
    e2e.assert_bound_at_most_once();
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_in_a_workload_group_and_a_tessera_pod_group_is_refused_naming_both() {
    let e2e = E2e::start(Setup::one_node()).await;
    create_workload_group(&e2e, "wl", Some(1)).await;
    e2e.create_pod_group("tg", 1, None, None).await;

    e2e.create(member("both", "wl", 1).group("tg")).await;
    let message = e2e.wait_unschedulable("both").await;
    for named in [
        "scheduling.k8s.io PodGroup default/wl",
        "spec.schedulingGroup.podGroupName",
        "Tessera PodGroup default/tg",
        "tessera.dev/pod-group",
    ] {
        assert!(message.contains(named), "{named:?} not in: {message}");
    }
    // The Workload API's PodGroup says the same.
    let refused = wait_condition(&e2e, "wl", "False").await;
    assert!(refused.message.contains("default/tg"), "{refused:?}");

    // Each group alone still works, and the refused pod stays unbound.
    e2e.create(member("only-wl", "wl", 1)).await;
    e2e.create(pod("only-tg").gpus(1).group("tg")).await;
    e2e.wait_running(&["only-wl".to_string(), "only-tg".to_string()])
        .await;
    assert_eq!(
        node_of(&e2e.pod("both").await),
        None,
        "the refused pod was bound"
    );
    e2e.shutdown().await;
}
