//! PodDisruptionBudgets on the real cluster: the real disruption controller counts
//! `disruptionsAllowed`, the coordinator watches the budgets and chooses no reclaim victim
//! whose eviction the API server would refuse, says so on the waiting pod, and takes exactly
//! as many victims as the budget allows once it allows some.

use crate::e2e;

use e2e::{E2e, NS, Setup, names, pod, unschedulable_message};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// `disruptionsAllowed` as the disruption controller last wrote it for this generation.
async fn allowed(budgets: &Api<PodDisruptionBudget>) -> Option<i32> {
    let b = budgets.get("a-pdb").await.ok()?;
    let status = b.status?;
    (status.observed_generation? >= b.metadata.generation?).then_some(status.disruptions_allowed?)
}

/// How many of `names` are gone or terminating (an evicted pod is deleted; kubelet-lite
/// removes it at once).
async fn victims(e2e: &E2e, names: &[String]) -> usize {
    let mut n = 0;
    for name in names {
        match e2e.pods().get(name).await {
            Ok(p) if p.metadata.deletion_timestamp.is_none() => {}
            _ => n += 1,
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_takes_no_victim_its_budget_protects_and_no_more_than_it_allows() {
    let e2e = E2e::start(Setup::two_gpus()).await;
    // Queue a deserves nothing but holds both GPUs; queue b deserves two.
    e2e.create_queue("a", 0.0).await;
    e2e.create_queue("b", 2.0).await;
    let held = names("a", 2);
    for name in &held {
        e2e.create(pod(name).gpus(1).queue("a").label("app", "a"))
            .await;
    }
    e2e.wait_running(&held).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(e2e.client.clone(), NS);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "a-pdb"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "a"}}},
    }))
    .unwrap();
    budgets.create(&PostParams::default(), &pdb).await.unwrap();
    e2e.wait_until("the disruption controller to count the budget", || async {
        (allowed(&budgets).await == Some(0)).then_some(())
    })
    .await;

    // b is inside its deserved quota and would reclaim both GPUs; the budget allows nothing.
    let wanted = names("b", 2);
    for name in &wanted {
        e2e.create(pod(name).gpus(1).queue("b")).await;
    }
    let message = e2e
        .wait_until("b's pods to name the budget", || async {
            let m = unschedulable_message(&e2e.pod(&wanted[0]).await)?;
            m.contains("PodDisruptionBudget").then_some(m)
        })
        .await;
    assert!(
        message.contains("protected by PodDisruptionBudget default/a-pdb"),
        "{message}"
    );
    for name in &held {
        let p = e2e.pod(name).await;
        assert!(
            p.metadata.deletion_timestamp.is_none(),
            "{name} was evicted against its budget"
        );
    }

    // One disruption allowed: one victim, one of b's pods placed, the other still waits.
    budgets
        .patch(
            "a-pdb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
        )
        .await
        .unwrap();
    let placed = e2e
        .wait_until("one of b's pods to be placed", || async {
            let mut running = Vec::new();
            for name in &wanted {
                let p = e2e.pods().get(name).await.ok()?;
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                    running.push(name.clone());
                }
            }
            (!running.is_empty()).then_some(running)
        })
        .await;
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_eq!(victims(&e2e, &held).await, 1, "exactly one victim");
    // The budget is spent again: nothing more is taken.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(victims(&e2e, &held).await, 1, "the budget's last pod stays");
    e2e.shutdown().await;
}
