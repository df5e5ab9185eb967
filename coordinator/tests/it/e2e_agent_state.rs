//! End to end on real Kubernetes (hack/k8s) for the agent's own state: an agent restarted
//! with its state directory wiped or its checkpoint corrupt, a pod deleted and created again
//! under its name, and a pod whose `tessera.dev/isolation` is edited after it was allocated.
//! Each time every pod keeps exactly its share and its enforcement, and the node keeps
//! admitting pods.

use crate::e2e;

use std::time::Duration;

use e2e::{E2e, Setup, StateDamage, assert_record_matches, pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use tessera_agent::assignments::AssignmentSource;
use tessera_agent::enforce::watchdog::WatchdogConfig;
use tessera_agent::ledger::{Origin, PodRef};
use tessera_contract::keys::ISOLATION;
use tessera_contract::{Isolation, PodUid};

fn uid(pod: &Pod) -> PodUid {
    PodUid::new(pod.metadata.uid.clone().unwrap_or_default())
        .expect("the API server gives every pod a UID")
}

/// What the agent of `node` holds for `pod`, by its UID: (GPU, milli, MiB, origin) per grant.
fn held(e2e: &E2e, node: &str, pod: &Pod) -> Vec<(String, u32, u64, Origin)> {
    let ledger = e2e.agent(node).node().ledger.lock();
    let mut out: Vec<_> = ledger
        .allocations()
        .iter()
        .filter(|a| a.pod_uid.as_ref() == Some(&uid(pod)))
        .flat_map(|a| {
            a.grants
                .iter()
                .map(|g| (g.uuid.clone(), g.compute_milli, g.memory_mib, a.origin))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// What `pod` was assigned, in the shape of [`held`].
fn assigned(pod: &Pod) -> Vec<(String, u32, u64, Origin)> {
    let mut out: Vec<_> = e2e::assignment_of(pod)
        .slices()
        .map(|g| {
            (
                g.uuid.clone(),
                g.compute_milli,
                g.memory_mib,
                Origin::Assigned,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Two fractional pods share the node's one GPU; the agent goes away, its state is damaged
/// as `damage` says, and it comes back: both are held at their shares again (not whole),
/// and a third pod assigned to the same GPU runs.
async fn agent_restarted_with(damage: StateDamage) {
    let mut e2e = E2e::start(Setup::one_gpu()).await;
    let first = vec!["quarter".to_string(), "half".into()];
    e2e.create(pod("quarter").fraction("0.25")).await;
    e2e.create(pod("half").fraction("0.5")).await;
    let running = e2e.wait_running(&first).await;
    for p in &running {
        assert_eq!(held(&e2e, "node-a", p), assigned(p));
    }

    e2e.stop_agent("node-a").await;
    e2e.damage_agent_state("node-a", damage);
    e2e.start_agent("node-a").await;
    e2e.wait_until(
        &format!("the agent ({damage:?} state) to hold every running pod at its share"),
        || async {
            running
                .iter()
                .all(|p| held(&e2e, "node-a", p) == assigned(p))
                .then_some(())
        },
    )
    .await;

    // It keeps serving: a new fractional pod placed on the same GPU runs at its share.
    e2e.create(pod("after").fraction("0.25")).await;
    let after = e2e.wait_running(&["after".to_string()]).await;
    e2e.assert_got_assignment(&after[0]);
    let gpu = |p: &Pod| assigned(p)[0].0.clone();
    assert_eq!(
        gpu(&after[0]),
        gpu(&running[0]),
        "the new pod shares the GPU"
    );
    for p in running.iter().chain(&after) {
        assert_eq!(
            held(&e2e, "node-a", p),
            assigned(p),
            "{damage:?}: pod {:?}",
            p.metadata.name
        );
    }
    e2e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_with_an_empty_state_directory_keeps_every_fraction() {
    agent_restarted_with(StateDamage::Wiped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_with_a_corrupt_checkpoint_keeps_every_fraction() {
    agent_restarted_with(StateDamage::Corrupt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_and_created_again_under_its_name_runs_with_its_own_allocation() {
    let e2e = E2e::start(Setup::one_gpu()).await;
    let name = "same".to_string();
    e2e.create(pod(&name).fraction("0.5")).await;
    let first = e2e
        .wait_running(std::slice::from_ref(&name))
        .await
        .remove(0);
    // Deleted at once (as a controller replacing it, or a missed list during a reconnect
    // would make it look) and created again with the same spec.
    e2e.pods()
        .delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    e2e.wait_until("the first pod to be gone", || async {
        match e2e.pods().get_opt(&name).await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
    e2e.create(pod(&name).fraction("0.5")).await;
    let second = e2e
        .wait_running(std::slice::from_ref(&name))
        .await
        .remove(0);
    assert_ne!(uid(&first), uid(&second), "a new pod, with a new UID");

    // Its own container got exactly its own assignment ...
    let record = e2e
        .containers()
        .into_iter()
        .map(|(_, r)| r)
        .find(|r| r.uid == uid(&second).as_str() && r.container == e2e::CONTAINER)
        .expect("the second pod's container started");
    let wanted = e2e::assignment_of(&second);
    assert_record_matches(&record, &wanted.containers[0].gpus);
    // ... and the agent holds it by its UID, nothing of the first pod's.
    e2e.wait_until("the agent to release the first pod", || async {
        held(&e2e, "node-a", &first).is_empty().then_some(())
    })
    .await;
    assert_eq!(held(&e2e, "node-a", &second), assigned(&second));
    e2e.shutdown().await;
}

/// A process the test starts and the watchdog may kill; killed and reaped at the end.
struct Sleeper(std::process::Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolation_edited_after_allocation_keeps_the_watchdog_on_the_pod() {
    let mut e2e = E2e::start(Setup::one_gpu()).await;
    e2e.set_agent_watchdog(
        "node-a",
        Some(WatchdogConfig {
            interval: Duration::from_millis(100),
            memory_grace: Duration::from_millis(300),
            ..WatchdogConfig::default()
        }),
    );
    e2e.restart_agent("node-a").await;
    let name = "tenant".to_string();
    e2e.create(
        pod(&name)
            .fraction("0.25")
            .annotation(ISOLATION, "watchdog"),
    )
    .await;
    let running = e2e
        .wait_running(std::slice::from_ref(&name))
        .await
        .remove(0);
    let slice = e2e::assignment_of(&running).containers[0].gpus[0].clone();

    // An admin client (the pod's owner, with rights to edit its pods) turns enforcement
    // off; the coordinator streams the new value to the agent.
    e2e.pods()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ISOLATION: "none"}}})),
        )
        .await
        .unwrap();
    let pods = e2e.agent_pods("node-a");
    e2e.wait_until("the agent's pod list to carry isolation none", || async {
        pods.listed(&PodRef::new(e2e::NS, &name))
            .is_some_and(|l| l.isolation == Isolation::None)
            .then_some(())
    })
    .await;

    // The pod's process goes over its memory limit: the watchdog still kills it.
    let child = Sleeper(
        std::process::Command::new("sleep")
            .arg("120")
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let cgroup = e2e.agent_proc_root("node-a").join(pid.to_string());
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(
        cgroup.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n",
            uid(&running).as_str().replace('-', "_"),
            "c".repeat(64)
        ),
    )
    .unwrap();
    e2e.slot("node-a")
        .sim
        .set_process(&slice.uuid, pid, slice.memory_mib + 1024, 5)
        .unwrap();
    let mut child = child;
    e2e.wait_until("the watchdog to kill the process over its limit", || {
        let exited = child.0.try_wait().ok().flatten().is_some();
        async move { exited.then_some(()) }
    })
    .await;
    let recorded: Vec<Isolation> = e2e
        .agent("node-a")
        .node()
        .ledger
        .lock()
        .allocations()
        .iter()
        .filter(|a| a.pod_uid.as_ref() == Some(&uid(&running)))
        .map(|a| a.isolation)
        .collect();
    assert_eq!(recorded, [Isolation::Watchdog]);
    e2e.shutdown().await;
}
