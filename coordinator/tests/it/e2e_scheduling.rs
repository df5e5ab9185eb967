//! End to end on real Kubernetes (hack/k8s): a real coordinator schedules for kubelet-lite nodes whose
//! device plugin is a real agent, and each container gets exactly what the coordinator
//! decided. Gangs, GPU fractions, reclaim between queues and bad input.

use crate::e2e;

use e2e::{E2e, Setup, assignment_of, names, node_of, pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tessera_coordinator::crd::Queue;

/// Whole GPUs of one 80 GB A100 as the coordinator assigns them.
const GPU_MIB: u64 = 81920;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_of_four_two_gpu_pods_is_bound_whole_on_nvlink_pairs() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    e2e.create_pod_group("train", 4, None, None).await;
    let gang = names("train", 4);

    // Three of four members: below minMember nothing may be bound, and each says why.
    for name in &gang[..3] {
        e2e.create(pod(name).gpus(2).group("train")).await;
    }
    for name in &gang[..3] {
        let message = e2e.wait_unschedulable(name).await;
        assert!(!message.is_empty(), "{name}: empty Unschedulable message");
    }
    for name in &gang[..3] {
        assert_eq!(
            node_of(&e2e.pod(name).await),
            None,
            "{name} was bound without its gang"
        );
    }

    // The fourth member completes the gang: all four run.
    e2e.create(pod(&gang[3]).gpus(2).group("train")).await;
    let pods = e2e.wait_running(&gang).await;
    for p in &pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let node = node_of(p).expect("bound");
        let assignment = e2e.assert_got_assignment(p);
        let gpus: Vec<_> = assignment.slices().collect();
        assert_eq!(gpus.len(), 2, "{name}: {assignment:?}");
        for g in &gpus {
            assert_eq!(
                (g.memory_mib, g.compute_milli),
                (GPU_MIB, 1000),
                "{name}: whole GPUs: {g:?}"
            );
        }
        // NVLink bridges join GPUs 2k and 2k+1 only.
        let sim = &e2e.slot(&node).sim;
        let mut index: Vec<u32> = gpus.iter().map(|g| sim.devices_index(&g.uuid)).collect();
        index.sort();
        assert!(
            index[0].is_multiple_of(2) && index[1] == index[0] + 1,
            "{name} got GPUs {index:?} on {node}, not an NVLink pair"
        );
    }
    e2e.assert_no_admission_waited_out();
    // Eight whole GPUs, none given twice.
    let mut all: Vec<(String, String)> = pods
        .iter()
        .flat_map(|p| {
            let node = node_of(p).unwrap_or_default();
            assignment_of(p)
                .slices()
                .map(|g| (node.clone(), g.uuid.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 8, "the gang's GPUs overlap: {all:?}");

    // A gang of five more two-GPU pods needs 10 GPUs of the 8 left: none of it is bound.
    e2e.create_pod_group("big", 5, None, None).await;
    let big = names("big", 5);
    for name in &big {
        e2e.create(pod(name).gpus(2).group("big")).await;
    }
    for name in &big {
        e2e.wait_unschedulable(name).await;
    }
    // The smaller job behind it still runs, and the first gang is untouched.
    e2e.create(pod("single").gpus(2)).await;
    let single = e2e.wait_running(&["single".to_string()]).await;
    e2e.assert_got_assignment(&single[0]);
    for name in &big {
        assert_eq!(
            node_of(&e2e.pod(name).await),
            None,
            "{name} was bound without its gang"
        );
    }
    let again = e2e.wait_running(&gang).await;
    for (before, after) in pods.iter().zip(&again) {
        assert_eq!(before.metadata.uid, after.metadata.uid);
        assert_eq!(assignment_of(before), assignment_of(after));
    }
    e2e.assert_bound_at_most_once();
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_members_are_bound_with_their_assignments_in_one_write() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    e2e.create_pod_group("train", 4, None, None).await;
    let gang = names("train", 4);
    for name in &gang {
        e2e.create(pod(name).gpus(2).group("train")).await;
    }
    e2e.wait_running(&gang).await;
    e2e.assert_bound_with_assignment_in_one_write(&gang);
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fractions_share_one_gpu_and_an_oversized_fraction_waits_with_a_reason() {
    let e2e = E2e::start(Setup::one_gpu()).await;
    let sharing = vec!["half".to_string(), "quarter-1".into(), "quarter-2".into()];
    e2e.create(pod("half").fraction("0.5")).await;
    e2e.create(pod("quarter-1").fraction("0.25")).await;
    e2e.create(pod("quarter-2").fraction("0.25")).await;
    let pods = e2e.wait_running(&sharing).await;

    let mut compute = 0;
    let mut memory = 0;
    let mut uuids = Vec::new();
    for (p, share) in pods.iter().zip([500, 250, 250]) {
        let assignment = e2e.assert_got_assignment(p);
        let gpus: Vec<_> = assignment.slices().collect();
        assert_eq!(gpus.len(), 1, "{assignment:?}");
        assert_eq!(
            gpus[0].compute_milli, share,
            "{:?}: {assignment:?}",
            p.metadata.name
        );
        compute += gpus[0].compute_milli;
        memory += gpus[0].memory_mib;
        uuids.push(gpus[0].uuid.clone());
    }
    uuids.dedup();
    assert_eq!(uuids.len(), 1, "the three pods must share the one GPU");
    assert_eq!(compute, 1000);
    assert!(
        memory <= GPU_MIB,
        "{memory} MiB assigned on a {GPU_MIB} MiB GPU"
    );

    // The GPU is full: a 0.6 pod waits, and says so.
    e2e.create(pod("big").fraction("0.6")).await;
    let message = e2e.wait_unschedulable("big").await;
    assert!(
        message.contains("0/1 nodes") && message.contains("GPU"),
        "unclear Unschedulable message: {message:?}"
    );
    let events = e2e
        .wait_until("a FailedScheduling event for big", || async {
            let events = e2e.events_of("big").await;
            events
                .iter()
                .any(|(reason, _)| reason == "FailedScheduling")
                .then_some(events)
        })
        .await;
    assert!(
        events.iter().any(|(_, m)| m.contains("GPU")),
        "events do not say why: {events:?}"
    );
    assert_eq!(node_of(&e2e.pod("big").await), None);
    // The sharing pods still run with what they were given.
    let again = e2e.wait_running(&sharing).await;
    for (before, after) in pods.iter().zip(&again) {
        assert_eq!(assignment_of(before), assignment_of(after));
    }
    e2e.assert_bound_at_most_once();
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fraction_stays_pending_naming_the_field_and_nothing_else_is_affected() {
    let e2e = E2e::start(Setup::one_gpu()).await;
    e2e.create(pod("bad").fraction("1.5")).await;
    e2e.create(pod("good").fraction("0.5")).await;

    let message = e2e.wait_unschedulable("bad").await;
    assert!(
        message.contains("tessera.dev/gpu-fraction"),
        "the condition must name the field: {message:?}"
    );
    assert!(
        message.contains("1.5"),
        "the condition should quote the value: {message:?}"
    );
    let events = e2e
        .wait_until("an event for bad naming the field", || async {
            let events = e2e.events_of("bad").await;
            events
                .iter()
                .any(|(_, m)| m.contains("tessera.dev/gpu-fraction"))
                .then_some(events)
        })
        .await;
    assert!(!events.is_empty());

    let good = e2e.wait_running(&["good".to_string()]).await;
    e2e.assert_got_assignment(&good[0]);
    let bad = e2e.pod("bad").await;
    assert_eq!(node_of(&bad), None, "a pod with bad input was bound");
    assert!(
        bad.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(e2e::ASSIGNMENT)),
        "a pod with bad input got an assignment"
    );
    // Bad input is not a capacity problem: a later pod that fits still runs.
    e2e.create(pod("later").fraction("0.25")).await;
    let later = e2e.wait_running(&["later".to_string()]).await;
    e2e.assert_got_assignment(&later[0]);
    e2e.shutdown().await;
}

/// The coordinator writes its `PodScheduled` condition as a strategic-merge patch keyed by
/// condition type, so the real API server keeps every condition another writer set (a
/// readiness-gate controller, the kubelet) instead of replacing the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unschedulable_condition_keeps_the_conditions_other_writers_set() {
    let e2e = E2e::start(Setup::one_gpu()).await;
    e2e.create(pod("bad").fraction("1.5")).await;
    let first = e2e.wait_unschedulable("bad").await;
    assert!(first.contains("1.5"), "{first:?}");

    let pods = e2e.pods();
    let other = serde_json::json!({"status": {"conditions": [{
        "type": "example.com/Reviewed", "status": "True", "reason": "Test",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    pods.patch_status(
        "bad",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(&other),
    )
    .await
    .expect("another writer sets its condition");
    // A new bad value makes the coordinator write a new message.
    let annotation =
        serde_json::json!({"metadata": {"annotations": {"tessera.dev/gpu-fraction": "2.5"}}});
    pods.patch(
        "bad",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&annotation),
    )
    .await
    .expect("annotation updated");
    let pod = e2e
        .wait_until("the coordinator to rewrite its condition", || async {
            let pod = pods.get("bad").await.ok()?;
            let message = e2e::unschedulable_message(&pod)?;
            message.contains("2.5").then_some(pod)
        })
        .await;
    let types: Vec<String> = pod
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert!(
        types.iter().any(|t| t == "example.com/Reviewed"),
        "the coordinator's status patch dropped another writer's condition: {types:?}"
    );
    assert_eq!(
        types.iter().filter(|t| *t == "PodScheduled").count(),
        1,
        "{types:?}"
    );
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_takes_elastic_pods_from_the_queue_over_its_share() {
    let e2e = E2e::start(Setup::two_nodes()).await;
    e2e.create_queue("team-a", 8.0).await;
    e2e.create_queue("team-b", 8.0).await;

    // Team A fills all 16 GPUs: a gang of 4 plus 12 elastic pods.
    e2e.create_pod_group("a-job", 4, Some(16), Some("team-a"))
        .await;
    let a = names("a", 16);
    for name in &a {
        e2e.create(pod(name).gpus(1).group("a-job").queue("team-a"))
            .await;
    }
    e2e.wait_running(&a).await;

    // Team B asks for its deserved 8.
    let b = names("b", 8);
    for name in &b {
        e2e.create(pod(name).gpus(1).queue("team-b")).await;
    }
    let b_pods = e2e.wait_running(&b).await;
    for p in &b_pods {
        e2e.assert_got_assignment(p);
    }

    // A keeps exactly its share; the rest were evicted with a reason.
    let pods: Api<Pod> = e2e.pods();
    let remaining = e2e
        .wait_until("team A to shrink to its fair share of 8", || async {
            let mut left = Vec::new();
            for name in &a {
                if pods.get_opt(name).await.ok()?.is_some() {
                    left.push(name.clone());
                }
            }
            (left.len() == 8).then_some(left)
        })
        .await;
    e2e.wait_running(&remaining).await;
    let evicted: Vec<&String> = a.iter().filter(|n| !remaining.contains(n)).collect();
    for name in &evicted {
        let events = e2e
            .wait_until(&format!("an eviction event for {name}"), || async {
                let events = e2e.events_of(name).await;
                events
                    .iter()
                    .any(|(reason, _)| reason == "Evicted")
                    .then_some(events)
            })
            .await;
        assert!(
            events
                .iter()
                .any(|(r, m)| r == "Evicted" && m.to_lowercase().contains("reclaim")),
            "{name}: the eviction event must name the reason: {events:?}"
        );
    }

    // Queue status converges on the fair share.
    let queues: Api<Queue> = Api::all(e2e.client.clone());
    for queue in ["team-a", "team-b"] {
        e2e.wait_until(
            &format!("{queue}'s status to show 8 GPUs allocated of a fair share of 8"),
            || async {
                let status = queues.get(queue).await.ok()?.status?;
                let allocated = status.allocated?.gpu;
                let fair = status.fair_share?.gpu;
                ((allocated - 8.0).abs() < 1e-6 && (fair - 8.0).abs() < 1e-6).then_some(())
            },
        )
        .await;
    }
    e2e.assert_bound_at_most_once();
    e2e.shutdown().await;
}
