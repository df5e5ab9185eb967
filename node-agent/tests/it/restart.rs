//! Restarts: the agent's own (checkpoint + pod-resources) and the kubelet's.

use crate::common;

use std::sync::Arc;

use common::{Harness, WAIT, gpu_of, refs, share};
use tessera_agent::coordinator_pods::CoordinatorPods;
use tessera_agent::ledger::{CHECKPOINT_FILE, Origin, PodRef};
use tessera_agent::reconcile::reconcile_once;
use tessera_agent::testing::StaticAssignments;
use tessera_contract::PodUid;
use tessera_device_plugin::testing::pod_with_devices;
use tessera_proto::tessera::v1 as pb;
use tessera_testcluster::until;
use tonic::Code;

/// Binds pods a (half of GPU 0) and b (a quarter of GPU 0) and lets the kubelet
/// allocate both; returns their slots.
async fn allocate_two(h: &Harness, source: &StaticAssignments) -> (String, String) {
    let plugin = h.gpu_plugin().await;
    let g0 = h.uuid(0);
    source.bind(
        PodRef::new("ml", "a"),
        1,
        &[("main", 1)],
        Some(share(&g0, 20480, 500)),
    );
    source.bind(
        PodRef::new("ml", "b"),
        2,
        &[("main", 1)],
        Some(share(&g0, 10240, 250)),
    );
    let all = h.available(&plugin).await;
    let a = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap()
        .remove(0);
    plugin.allocate_one(&[&a]).await.unwrap();
    let b = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap()
        .remove(0);
    plugin.allocate_one(&[&b]).await.unwrap();
    (a, b)
}

fn source_with_assignments(h: &Harness) -> Arc<StaticAssignments> {
    let g0 = h.uuid(0);
    let s = Arc::new(StaticAssignments::new());
    s.bind(
        PodRef::new("ml", "a"),
        1,
        &[("main", 1)],
        Some(share(&g0, 20480, 500)),
    );
    s.bind(
        PodRef::new("ml", "b"),
        2,
        &[("main", 1)],
        Some(share(&g0, 10240, 250)),
    );
    s.set_started(&PodRef::new("ml", "a"));
    s.set_started(&PodRef::new("ml", "b"));
    s
}

#[tokio::test]
async fn agent_restart_recovers_the_ledger_from_its_checkpoint() {
    let source = Arc::new(StaticAssignments::new());
    let mut h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    let (a, b) = allocate_two(&h, &source).await;
    let before = h.agent().node().ledger.lock().allocations().to_vec();
    assert_eq!(before.len(), 2);
    h.pod_resources.set_pods(vec![
        pod_with_devices("ml", "a", "main", "nvidia.com/gpu", &[&a]),
        pod_with_devices("ml", "b", "main", "nvidia.com/gpu", &[&b]),
    ]);
    h.stop_agent().await;
    h.start_agent(source_with_assignments(&h)).await;
    assert_eq!(
        h.agent().node().ledger.lock().allocations(),
        before.as_slice()
    );

    // Pod b ends: the next reconcile releases its share, and only its share.
    h.pod_resources.set_pods(vec![pod_with_devices(
        "ml",
        "a",
        "main",
        "nvidia.com/gpu",
        &[&a],
    )]);
    let report = reconcile_once(
        h.agent().node(),
        &StaticAssignments::new(),
        &h.dir.path().join("pr/kubelet.sock"),
        0,
    )
    .await
    .unwrap();
    assert_eq!(report.released, vec![before[1].id]);
    let usage = h.agent().node().ledger.lock().usage(&h.uuid(0));
    assert_eq!((usage.memory_mib, usage.compute_milli), (20480, 500));
}

#[tokio::test]
async fn lost_checkpoint_is_rebuilt_from_pod_resources_without_double_booking() {
    let source = Arc::new(StaticAssignments::new());
    let mut h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    let (a, b) = allocate_two(&h, &source).await;
    let old = h.gpu_plugin().await;
    h.stop_agent().await;
    std::fs::remove_file(h.dir.path().join("state").join(CHECKPOINT_FILE)).unwrap();
    // The kubelet also reports a pod of another scheduler holding a slot of GPU 4.
    let g4_slot = format!("{}-0", h.uuid(4));
    h.pod_resources.set_pods(vec![
        pod_with_devices("ml", "a", "main", "nvidia.com/gpu", &[&a]),
        pod_with_devices("ml", "b", "main", "nvidia.com/gpu", &[&b]),
        pod_with_devices("other", "x", "main", "nvidia.com/gpu", &[&g4_slot]),
    ]);
    let source = source_with_assignments(&h);
    // Pod x is another scheduler's (listed without an assignment); a pod the source does not
    // list (finished or deleted, the kubelet not done with it yet) holds a slot of GPU 5.
    source.bind(PodRef::new("other", "x"), 0, &[("main", 1)], None);
    source.set_started(&PodRef::new("other", "x"));
    let g5_slot = format!("{}-0", h.uuid(5));
    h.pod_resources.set_pods(vec![
        pod_with_devices("ml", "a", "main", "nvidia.com/gpu", &[&a]),
        pod_with_devices("ml", "b", "main", "nvidia.com/gpu", &[&b]),
        pod_with_devices("other", "x", "main", "nvidia.com/gpu", &[&g4_slot]),
        pod_with_devices("gone", "y", "main", "nvidia.com/gpu", &[&g5_slot]),
    ]);
    h.start_agent(source.clone()).await;
    {
        let ledger = h.agent().node().ledger.lock();
        let allocations = ledger.allocations();
        assert_eq!(
            allocations.len(),
            3,
            "a, b at their shares and x whole; the unlisted pod is not adopted: {allocations:#?}"
        );
        assert_eq!(ledger.usage(&h.uuid(5)).holders, 0);
        let a_alloc = allocations
            .iter()
            .find(|x| x.pod == Some(PodRef::new("ml", "a")))
            .unwrap();
        assert_eq!(a_alloc.origin, Origin::Assigned);
        assert_eq!(a_alloc.grants[0].memory_mib, 20480);
        let x = allocations
            .iter()
            .find(|x| x.pod == Some(PodRef::new("other", "x")))
            .unwrap();
        assert_eq!(x.origin, Origin::Recovered);
        assert!(ledger.usage(&h.uuid(4)).whole);
        assert_eq!(ledger.usage(&h.uuid(0)).compute_milli, 750);
    }
    // A new assignment that would overcommit GPU 0 is refused, not double-booked.
    let plugin = h.new_gpu_plugin(&old).await;
    source.bind(
        PodRef::new("ml", "c"),
        3,
        &[("main", 1)],
        Some(share(&h.uuid(0), 24000, 300)),
    );
    let err = plugin
        .allocate_one(&[&format!("{}-7", h.uuid(0))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("overcommit"), "{}", err.message());
    // And nothing can be added to the GPU the other scheduler's pod holds whole.
    source.bind(
        PodRef::new("ml", "d"),
        4,
        &[("main", 1)],
        Some(share(&h.uuid(4), 1000, 100)),
    );
    let err = plugin
        .allocate_one(&[&format!("{}-5", h.uuid(4))])
        .await
        .unwrap_err();
    assert!(err.message().contains("held whole"), "{}", err.message());
    assert_eq!(gpu_of(&g4_slot), h.uuid(4));
}

#[tokio::test]
async fn kubelet_restart_gets_a_fresh_registration() {
    let source = Arc::new(StaticAssignments::new());
    let mut h = Harness::start("l40s-4x-pcie.yaml", source).await;
    h.gpu_plugin().await;
    h.kubelet.restart().await.unwrap();
    let plugin = h
        .kubelet
        .wait_for_plugin("nvidia.com/gpu", WAIT)
        .await
        .unwrap();
    let devices = plugin
        .devices()
        .wait_until(|d| d.len() == 40, WAIT)
        .await
        .unwrap();
    assert_eq!(devices.len(), 40);
}

/// Binds a (half of GPU 0, older) and b (a quarter of GPU 0) with one-slot requests and lets
/// the kubelet allocate a only; then the kubelet restarts.
async fn a_allocated_then_kubelet_restarts(h: &mut Harness, source: &StaticAssignments) -> String {
    let g0 = h.uuid(0);
    source.bind(
        PodRef::new("ml", "a"),
        1,
        &[("main", 1)],
        Some(share(&g0, 20480, 500)),
    );
    source.bind(
        PodRef::new("ml", "b"),
        2,
        &[("main", 1)],
        Some(share(&g0, 10240, 250)),
    );
    let plugin = h.gpu_plugin().await;
    let all = h.available(&plugin).await;
    let a = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap();
    let env = plugin.allocate_one(&refs(&a)).await.unwrap().envs;
    assert_eq!(env["TESSERA_GPU_MEMORY_LIMIT_MIB"], "20480");
    h.kubelet.restart().await.unwrap();
    a.into_iter().next().unwrap()
}

/// What the restarted kubelet's next one-slot request gets, as its memory limit.
async fn next_one_slot_limit(h: &Harness) -> String {
    let plugin = h
        .kubelet
        .wait_for_plugin("nvidia.com/gpu", WAIT)
        .await
        .unwrap();
    let all = h.available(&plugin).await;
    let slot = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap();
    let env = plugin.allocate_one(&refs(&slot)).await.unwrap().envs;
    env["TESSERA_GPU_MEMORY_LIMIT_MIB"].clone()
}

#[tokio::test]
async fn a_restarted_kubelet_that_lost_an_allocation_gets_it_for_the_same_pod_again() {
    // The kubelet answered for a but died before checkpointing it: after the restart it
    // lists a without devices and asks for a's container again. That request is a's, not
    // b's, although both are pending requests of one slot on GPU 0.
    let source = Arc::new(StaticAssignments::new());
    let mut h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    a_allocated_then_kubelet_restarts(&mut h, &source).await;
    h.pod_resources.set_pods(vec![pod_with_devices(
        "ml",
        "a",
        "main",
        "nvidia.com/gpu",
        &[],
    )]);
    assert_eq!(next_one_slot_limit(&h).await, "20480", "a's share again");
    h.pod_resources.set_pods(vec![
        pod_with_devices("ml", "a", "main", "nvidia.com/gpu", &[]),
        pod_with_devices("ml", "b", "main", "nvidia.com/gpu", &[]),
    ]);
    assert_eq!(next_one_slot_limit(&h).await, "10240", "then b's");
    let ledger = h.agent().node().ledger.lock();
    let held: Vec<_> = ledger.allocations().iter().map(|a| a.pod.clone()).collect();
    assert_eq!(
        held,
        [Some(PodRef::new("ml", "a")), Some(PodRef::new("ml", "b"))],
        "a's first allocation was released, not kept beside the new one"
    );
}

#[tokio::test]
async fn a_restarted_kubelet_that_kept_an_allocation_is_not_asked_about_it() {
    // The control: the kubelet had checkpointed a (pod-resources lists its slot), so its next
    // one-slot request is b's.
    let source = Arc::new(StaticAssignments::new());
    let mut h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    let a_slot = a_allocated_then_kubelet_restarts(&mut h, &source).await;
    h.pod_resources.set_pods(vec![pod_with_devices(
        "ml",
        "a",
        "main",
        "nvidia.com/gpu",
        &[&a_slot],
    )]);
    assert_eq!(next_one_slot_limit(&h).await, "10240");
    assert_eq!(h.agent().node().ledger.lock().allocations().len(), 2);
}

/// Pod `name` (UID `uid`, container `main`, one slot) as the coordinator streams it, with
/// `milli` of GPU `gpu` and `mib` of its memory.
fn streamed(name: &str, uid: &str, created: i64, gpu: &str, mib: u64, milli: u32) -> pb::BoundPod {
    pb::BoundPod {
        uid: uid.into(),
        namespace: "ml".into(),
        name: name.into(),
        created_unix_ms: created,
        containers: vec![pb::BoundContainer {
            name: "main".into(),
            gpus: 1,
        }],
        assignment: share(gpu, mib, milli).to_json(),
        ..pb::BoundPod::default()
    }
}

fn started(mut pod: pb::BoundPod) -> pb::BoundPod {
    pod.started = true;
    pod
}

#[tokio::test]
async fn a_lost_checkpoint_is_adopted_at_the_assigned_shares_once_the_coordinators_list_is_in() {
    let source = Arc::new(StaticAssignments::new());
    let mut h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    let (a, b) = allocate_two(&h, &source).await;
    h.pod_resources.set_pods(vec![
        pod_with_devices("ml", "a", "main", "nvidia.com/gpu", &[&a]),
        pod_with_devices("ml", "b", "main", "nvidia.com/gpu", &[&b]),
    ]);
    let checkpoint = h.dir.path().join("state").join(CHECKPOINT_FILE);
    h.agent().node().ledger.lock().flush();
    for damage in ["lost", "corrupt"] {
        // The agent dies and its checkpoint is lost or damaged; the kubelet still runs a and b.
        let pods = Arc::new(CoordinatorPods::new());
        h.restart_agent_with(pods.clone(), |config, _| {
            match damage {
                "lost" => std::fs::remove_file(&checkpoint).unwrap(),
                _ => std::fs::write(&checkpoint, "{\"next_id\": 7, \"allocations\": [{\"id\"")
                    .unwrap(),
            }
            config.node_pods = Some(pods.clone());
        })
        .await;
        // Nothing is adopted before the coordinator's list: a and b would be taken whole.
        assert!(
            h.agent().node().ledger.lock().allocations().is_empty(),
            "{damage}: adopted before the coordinator's list arrived"
        );
        // The list: a and b run with their shares of GPU 0; c is bound there for a quarter.
        let g0 = h.uuid(0);
        pods.receive(
            h.agent().node(),
            &pb::NodePods {
                pods: vec![
                    started(streamed("a", "uid-ml-a", 1, &g0, 20480, 500)),
                    started(streamed("b", "uid-ml-b", 2, &g0, 10240, 250)),
                    streamed("c", &format!("uid-c-{damage}"), 3, &g0, 10240, 250),
                ],
            },
        );
        until(&format!("{damage}: a and b adopted"), || {
            h.agent().node().ledger.lock().allocations().len() == 2
        })
        .await;
        {
            let ledger = h.agent().node().ledger.lock();
            for (name, milli, mib) in [("a", 500, 20480), ("b", 250, 10240)] {
                let held = ledger
                    .allocations()
                    .iter()
                    .find(|x| x.pod_uid == Some(PodUid::new(format!("uid-ml-{name}")).unwrap()))
                    .unwrap_or_else(|| panic!("{damage}: {name} not adopted"));
                assert_eq!(held.origin, Origin::Assigned, "{damage}: {name}");
                assert_eq!(
                    (held.grants[0].compute_milli, held.grants[0].memory_mib),
                    (milli, mib),
                    "{damage}: {name} is held at its share"
                );
            }
        }
        // And c, assigned to the same GPU, is admitted at its share.
        assert_eq!(next_one_slot_limit(&h).await, "10240", "{damage}");
        if damage == "corrupt" {
            let aside = std::fs::read_dir(h.dir.path().join("state"))
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("ledger.json.corrupt-")
                })
                .count();
            assert_eq!(aside, 1, "the corrupt checkpoint was moved aside");
        }
        // c ends before the next round.
        let c = PodUid::new(format!("uid-c-{damage}")).unwrap();
        h.agent().node().release_departed(&c);
        h.agent().node().ledger.lock().flush();
    }
}

#[tokio::test]
async fn a_pod_created_again_under_its_name_gets_its_own_allocation() {
    let pods = Arc::new(CoordinatorPods::new());
    let mut h = Harness::start("a100-8x-mig.yaml", Arc::new(StaticAssignments::new())).await;
    h.restart_agent_with(pods.clone(), |config, _| {
        config.node_pods = Some(pods.clone())
    })
    .await;
    let g0 = h.uuid(0);
    let node = || h.agent().node();
    let first = streamed("a", "uid-first", 1, &g0, 20480, 500);
    pods.receive(node(), &pb::NodePods { pods: vec![first] });
    assert_eq!(next_one_slot_limit(&h).await, "20480");
    assert!(
        node()
            .ledger
            .lock()
            .has_container(&PodUid::new("uid-first").unwrap(), "main")
    );
    // Deleted and created again under its name (a StatefulSet, or two lists the agent saw
    // back to back): the next list has the new UID only.
    let second = streamed("a", "uid-second", 5, &g0, 20480, 500);
    pods.receive(node(), &pb::NodePods { pods: vec![second] });
    assert!(
        node().ledger.lock().allocations().is_empty(),
        "the first pod departed by its UID"
    );
    assert_eq!(next_one_slot_limit(&h).await, "20480");
    let ledger = node().ledger.lock();
    let uids: Vec<Option<PodUid>> = ledger
        .allocations()
        .iter()
        .map(|a| a.pod_uid.clone())
        .collect();
    assert_eq!(uids, [Some(PodUid::new("uid-second").unwrap())]);
}
