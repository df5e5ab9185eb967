//! End to end on real Kubernetes (hack/k8s) when something dies: the leading coordinator, a
//! node's agent, a node's kubelet. Each time the pods in flight end up running exactly once
//! with exactly their assignment, and what already ran keeps its GPUs.

use crate::e2e;

use std::collections::BTreeMap;

use e2e::{E2e, Setup, assignment_of, names, node_of, pod};
use k8s_openapi::api::core::v1::Pod;

/// Checks the node's agent ledger after everything settled: every running pod of `pods` on
/// `node` holds exactly its assigned GPUs there, and no GPU is shared beyond its capacity.
fn assert_ledger_holds(e2e: &E2e, node: &str, pods: &[Pod]) {
    let ledger = e2e.agent(node).node().ledger.lock();
    let mut compute: BTreeMap<String, u32> = BTreeMap::new();
    for a in ledger.allocations() {
        for g in &a.grants {
            *compute.entry(g.uuid.clone()).or_default() += g.compute_milli;
        }
    }
    for (uuid, milli) in &compute {
        assert!(
            *milli <= 1000,
            "GPU {uuid} is shared beyond its compute: {milli} milli"
        );
    }
    for p in pods.iter().filter(|p| node_of(p).as_deref() == Some(node)) {
        let name = p.metadata.name.as_deref().unwrap_or("");
        let held: Vec<String> = ledger
            .allocations()
            .iter()
            .filter(|a| a.pod.as_ref().is_some_and(|r| r.name == name))
            .flat_map(|a| a.grants.iter().map(|g| g.uuid.clone()))
            .collect();
        let mut held = held;
        held.sort();
        let mut assigned: Vec<String> = assignment_of(p).slices().map(|g| g.uuid.clone()).collect();
        assigned.sort();
        assert_eq!(
            held, assigned,
            "the agent of {node} lost or changed pod {name}'s GPUs"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_mid_run_binds_every_pod_once_and_keeps_the_gang_whole() {
    let e2e = E2e::start(Setup::two_nodes().coordinators(2)).await;
    let first = e2e.wait_leader().await;

    e2e.create_pod_group("train", 4, None, None).await;
    let gang = names("train", 4);
    for name in &gang {
        e2e.create(pod(name).gpus(2).group("train")).await;
    }
    let gang_before = e2e.wait_running(&gang).await;

    // A second wave; the leader dies as soon as it has written its first decision for it.
    let wave = names("wave", 8);
    for name in &wave {
        e2e.create(pod(name).fraction("0.5")).await;
    }
    e2e.wait_seen("the leader's first decision for the second wave", |s| {
        s.name.starts_with("wave-") && s.assignment.is_some()
    })
    .await;
    e2e.kill_coordinator(first);

    let second = e2e.wait_leader().await;
    assert_ne!(first, second, "the killed replica cannot lead");
    let wave_pods = e2e.wait_running(&wave).await;

    // The gang stays whole where it was.
    let gang_after = e2e.wait_running(&gang).await;
    for (before, after) in gang_before.iter().zip(&gang_after) {
        assert_eq!(
            before.metadata.uid, after.metadata.uid,
            "a gang member was replaced"
        );
        assert_eq!(node_of(before), node_of(after));
        assert_eq!(assignment_of(before), assignment_of(after));
    }
    // Every pod was bound once, its container started once, with its final assignment.
    e2e.assert_bound_at_most_once();
    for p in gang_after.iter().chain(&wave_pods) {
        e2e.assert_got_assignment(p);
    }
    for name in gang.iter().chain(&wave) {
        let scheduled = e2e
            .events_of(name)
            .await
            .into_iter()
            .filter(|(reason, _)| reason == "Scheduled")
            .count();
        assert!(scheduled <= 1, "{name} has {scheduled} Scheduled events");
    }
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_in_the_middle_of_allocations_loses_nothing() {
    let mut e2e = E2e::start(Setup::one_node()).await;
    let first = vec![
        "whole-1".to_string(),
        "half-1".into(),
        "half-2".into(),
        "quarter-1".into(),
    ];
    e2e.create(pod("whole-1").gpus(2)).await;
    e2e.create(pod("half-1").fraction("0.5")).await;
    e2e.create(pod("half-2").fraction("0.5")).await;
    e2e.create(pod("quarter-1").fraction("0.25")).await;
    let first_pods = e2e.wait_running(&first).await;

    // The agent goes away with allocations held and more pods arriving. (A pod whose
    // Binding lands while the plugin socket is gone is refused by the kubelet itself, so the
    // coordinator must not bind there until the agent is back.)
    e2e.stop_agent("node-a").await;
    let second = vec![
        "whole-2".to_string(),
        "quarter-2".into(),
        "quarter-3".into(),
        "half-3".into(),
    ];
    e2e.create(pod("whole-2").gpus(2)).await;
    e2e.create(pod("quarter-2").fraction("0.25")).await;
    e2e.create(pod("quarter-3").fraction("0.25")).await;
    e2e.create(pod("half-3").fraction("0.5")).await;
    let message = e2e.wait_unschedulable("whole-2").await;
    assert!(!message.is_empty());
    for name in &second {
        assert_eq!(
            node_of(&e2e.pod(name).await),
            None,
            "{name} was bound to a node without its agent"
        );
    }
    e2e.start_agent("node-a").await;

    let second_pods = e2e.wait_running(&second).await;
    let all: Vec<Pod> = first_pods.iter().chain(&second_pods).cloned().collect();
    for p in &all {
        e2e.assert_got_assignment(p);
    }
    // The first wave is untouched, and the restarted agent knows every allocation.
    let first_again = e2e.wait_running(&first).await;
    for (before, after) in first_pods.iter().zip(&first_again) {
        assert_eq!(assignment_of(before), assignment_of(after));
    }
    assert_ledger_holds(&e2e, "node-a", &all);
    e2e.assert_bound_at_most_once();

    // A restart between an allocation and the next one: the new agent answers at once.
    e2e.restart_agent("node-a").await;
    e2e.create(pod("after").fraction("0.25")).await;
    let after = e2e.wait_running(&["after".to_string()]).await;
    e2e.assert_got_assignment(&after[0]);
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_in_the_middle_of_allocations_loses_nothing() {
    let mut e2e = E2e::start(Setup::one_node()).await;
    let first = vec!["whole-1".to_string(), "half-1".into(), "quarter-1".into()];
    e2e.create(pod("whole-1").gpus(2)).await;
    e2e.create(pod("half-1").fraction("0.5")).await;
    e2e.create(pod("quarter-1").fraction("0.25")).await;
    let first_pods = e2e.wait_running(&first).await;

    let second = vec!["whole-2".to_string(), "half-2".into(), "quarter-2".into()];
    e2e.create(pod("whole-2").gpus(2)).await;
    e2e.create(pod("half-2").fraction("0.5")).await;
    e2e.create(pod("quarter-2").fraction("0.25")).await;
    e2e.wait_seen("the first binding of the second wave", |s| {
        second.contains(&s.name) && s.node.is_some()
    })
    .await;
    e2e.restart_kubelet("node-a").await;

    // The real kubelet admits the pods bound to it as soon as it is back, and its device
    // manager refuses every device-plugin resource until the plugin has registered again
    // ("no healthy devices present"): pods it admits in that gap fail, as on a real node,
    // and their controllers would create them again. What must hold: nothing that ran
    // loses its GPUs, no pod runs on a GPU it was not assigned, a refused pod's share is
    // given back, and its replacement runs.
    let settled = e2e
        .wait_until("the second wave to run or be refused by the restarted kubelet", || async {
            let mut out = Vec::new();
            for name in &second {
                let pod = e2e.pods().get(name).await.ok()?;
                let status = pod.status.clone().unwrap_or_default();
                match status.phase.as_deref() {
                    Some("Running") => out.push((pod, true)),
                    Some("Failed") => {
                        let message = status.message.unwrap_or_default();
                        // A pod the restarted kubelet admitted while the agent's plugin was
                        // registering again can be refused before the agent settles what the
                        // kubelet lost; it is recreated like the gap's other failures.
                        assert!(
                            message.contains("no healthy devices present")
                                || message.contains("(pending assignments: none)"),
                            "pod {name} failed for another reason than the restart gap: {message}"
                        );
                        out.push((pod, false));
                    }
                    _ => return None,
                }
            }
            Some(out)
        })
        .await;
    // Replacements come once the node has its GPUs again, as a controller's retries would
    // eventually find it; created in the gap, they would fail like the gap's pods.
    e2e.wait_kubelet_has_the_agents_devices("node-a").await;
    let mut running: Vec<Pod> = first_pods.clone();
    let mut replacements = Vec::new();
    for (pod_seen, ran) in settled {
        let name = pod_seen.metadata.name.clone().unwrap_or_default();
        if ran {
            running.push(pod_seen);
            continue;
        }
        let again = format!("{name}-again");
        let builder = match name.as_str() {
            "whole-2" => pod(&again).gpus(2),
            "half-2" => pod(&again).fraction("0.5"),
            _ => pod(&again).fraction("0.25"),
        };
        e2e.create(builder).await;
        replacements.push(again);
    }
    running.extend(e2e.wait_running(&replacements).await);
    for p in &running {
        e2e.assert_got_assignment(p);
    }
    assert_ledger_holds(&e2e, "node-a", &running);
    e2e.assert_bound_at_most_once();
    e2e.create(pod("after").fraction("0.25")).await;
    let after = e2e.wait_running(&["after".to_string()]).await;
    e2e.assert_got_assignment(&after[0]);
    e2e.shutdown().await;
}
