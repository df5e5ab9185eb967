//! Queues end to end on real Kubernetes (hack/k8s): a quota per GPU model on mixed nodes whose
//! agents report NVML's model names, and usage history that a new leader goes on from.

use std::path::Path;
use std::time::Duration;

use crate::e2e;

use e2e::{E2e, Setup, names, node_of, pod};
use kube::api::{Api, PostParams};
use tessera_coordinator::crd::{GpuModelQuota, GpuQuota, Queue, QueueSpec};
use tessera_core::usage::UsageDecay;

/// A bundled `hack/gpus` shape with its model named as NVML names it on a real machine.
fn shape(file: &str, model: &str, nvml_name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../hack/gpus")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("bundled shape exists");
    let from = format!("model: {model},");
    assert!(text.contains(&from), "{file} names {model}");
    text.replace(&from, &format!("model: \"{nvml_name}\","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_with_an_h100_limit_never_gets_more_h100s_and_still_gets_other_models() {
    let h100 = shape(
        "h100-8x-nvswitch.yaml",
        "H100-80GB",
        "NVIDIA H100 80GB HBM3",
    );
    let l40s = shape("l40s-4x-pcie.yaml", "L40S", "NVIDIA L40S");
    let e2e = E2e::start(Setup {
        nodes: vec![("h100".into(), h100), ("l40s".into(), l40s)],
        ..Setup::one_node()
    })
    .await;
    // The key is the agent's model name in the form nvidia.com/gpu.product spells it.
    let queues: Api<Queue> = Api::all(e2e.client.clone());
    let team = Queue::new(
        "team",
        QueueSpec {
            gpu: Some(GpuQuota {
                models: vec![GpuModelQuota {
                    model: "NVIDIA-H100-80GB-HBM3".into(),
                    limit: 2.0,
                    ..GpuModelQuota::default()
                }],
                ..GpuQuota::default()
            }),
            ..QueueSpec::default()
        },
    );
    queues.create(&PostParams::default(), &team).await.unwrap();

    // Six one-GPU pods: two H100s (the limit) and all four L40Ss.
    let first = names("p", 6);
    for name in &first {
        e2e.create(pod(name).gpus(1).queue("team")).await;
    }
    let running = e2e.wait_running(&first).await;
    let on = |node: &str| {
        running
            .iter()
            .filter(|p| node_of(p).as_deref() == Some(node))
            .count()
    };
    assert_eq!((on("h100"), on("l40s")), (2, 4), "{running:?}");

    // A seventh waits although six H100s are idle, saying which limit holds it.
    e2e.create(pod("p-extra").gpus(1).queue("team")).await;
    let message = e2e.wait_unschedulable("p-extra").await;
    assert!(
        message.contains("queue team over limit gpu=2 of GPU model NVIDIA-H100-80GB-HBM3"),
        "{message}"
    );
    assert!(node_of(&e2e.pod("p-extra").await).is_none());

    // The queue's status shows what it holds of the model.
    e2e.wait_until("team's status to show 2 H100s held", || async {
        let status = queues.get("team").await.ok()?.status?;
        let h100 = status
            .gpu_models
            .iter()
            .find(|m| m.model == "NVIDIA-H100-80GB-HBM3")?;
        ((h100.allocated - 2.0).abs() < 1e-9).then_some(())
    })
    .await;
    e2e.assert_bound_at_most_once();
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_goes_on_from_the_usage_history_in_queue_status() {
    let decay = UsageDecay {
        half_life_seconds: 3600,
        window_seconds: 0,
    };
    let e2e = E2e::start(
        Setup {
            usage_history: Some((decay, Duration::from_secs(1))),
            ..Setup::one_node()
        }
        .coordinators(2),
    )
    .await;
    e2e.create_queue("team", 0.0).await;
    let team = names("t", 4);
    for name in &team {
        e2e.create(pod(name).gpus(1).queue("team")).await;
    }
    e2e.wait_running(&team).await;

    // The leader writes the history into the Queue's status as it grows.
    let queues: Api<Queue> = Api::all(e2e.client.clone());
    let usage = || async {
        let u = queues.get("team").await.ok()?.status?.usage?;
        let at: jiff::Timestamp = u.updated_at.parse().ok()?;
        Some((u.gpu_seconds, at))
    };
    let (before, _) = e2e
        .wait_until("team's usage to pass 20 GPU-seconds", || async {
            usage().await.filter(|(gpu, _)| *gpu >= 20.0)
        })
        .await;

    // The leader dies; the other replica takes over and goes on from the status: what it
    // writes is more, never the few GPU-seconds a fresh start would have counted.
    let leader = e2e.wait_leader().await;
    let killed_at = jiff::Timestamp::now();
    e2e.kill_coordinator(leader);
    let next = e2e.wait_leader().await;
    assert_ne!(next, leader);
    let (after, at) = e2e
        .wait_until("the new leader to write team's usage", || async {
            usage()
                .await
                .filter(|(_, at)| at.as_second() > killed_at.as_second())
        })
        .await;
    assert!(
        after >= before,
        "the new leader restarted the history: {after} GPU-s at {at}, {before} before"
    );
    e2e.shutdown().await;
}
