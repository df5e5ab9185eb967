//! The plugin's Allocate flow over a simulated node: which pod a request goes to, and that
//! each request decides and records under one acquisition of the ledger lock.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tessera_contract::{Assignment, ContainerAssignment, GpuSlice};
use tessera_device_plugin::{DeviceProvider, ProviderError, api};

use super::matcher::Reservation;
use super::*;
use crate::assignments::NoAssignments;
use crate::gpu::sim::SimBackend;
use crate::ledger::{Origin, PodRef};
use crate::node::{NodeOptions, slot_id};
use crate::testing::StaticAssignments;

/// Four L40S GPUs (no NVLink), 10 slots each, and a source the test fills.
fn plugin() -> (GpuPlugin, Arc<StaticAssignments>, Vec<String>) {
    let source = Arc::new(StaticAssignments::new());
    let (plugin, uuids) = plugin_over(source.clone());
    (plugin, source, uuids)
}

fn plugin_over(source: Arc<dyn AssignmentSource>) -> (GpuPlugin, Vec<String>) {
    let shape = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/gpus/l40s-4x-pcie.yaml");
    let sim = Arc::new(SimBackend::from_file(shape).expect("the shape parses"));
    let uuids = (0..4)
        .map(|i| sim.uuid_of(i).expect("4 GPUs").to_owned())
        .collect();
    let node = Arc::new(
        Node::new(sim, Ledger::in_memory(), NodeOptions::default()).expect("the node starts"),
    );
    (GpuPlugin::new(node, source), uuids)
}

fn share(uuid: &str, milli: u32) -> Assignment {
    Assignment {
        containers: vec![ContainerAssignment {
            container: "main".into(),
            gpus: vec![GpuSlice {
                uuid: uuid.into(),
                memory_mib: 1024,
                compute_milli: milli,
            }],
        }],
    }
}

/// Binds pod `ml/name`, created at `created`, with one container assigned `milli` of GPU `uuid`.
fn bind_share(source: &StaticAssignments, name: &str, created: u64, uuid: &str, milli: u32) {
    source.bind(
        PodRef::new("ml", name),
        created,
        &[("main", 1)],
        Some(share(uuid, milli)),
    );
}

fn request(containers: Vec<Vec<String>>) -> api::AllocateRequest {
    api::AllocateRequest {
        container_requests: containers
            .into_iter()
            .map(|devices_ids| api::ContainerAllocateRequest { devices_ids })
            .collect(),
    }
}

/// The pod (name) and compute of the ledger's allocation holding `slot`.
fn holder(p: &GpuPlugin, slot: &str) -> Option<(String, u32)> {
    let ledger = p.node.ledger.lock();
    let a = ledger
        .allocations()
        .iter()
        .find(|a| a.slots.iter().any(|s| s == slot))?;
    Some((
        a.pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
        a.grants[0].compute_milli,
    ))
}

#[tokio::test]
async fn a_request_goes_to_the_oldest_pending_pod_assigned_exactly_its_gpus() {
    let (p, source, g) = plugin();
    bind_share(&source, "young", 2, &g[0], 250);
    bind_share(&source, "old", 1, &g[0], 500);
    bind_share(&source, "other", 0, &g[1], 500);
    // Two requests alike in one Allocate: the oldest pod, then the next on that GPU.
    let (a, b) = (slot_id(&g[0], 3), slot_id(&g[0], 4));
    p.allocate(request(vec![vec![a.clone()], vec![b.clone()]]))
        .await
        .expect("both fit");
    assert_eq!(holder(&p, &a), Some(("old".to_owned(), 500)));
    assert_eq!(holder(&p, &b), Some(("young".to_owned(), 250)));
    // A request on GPU 1 is the pod assigned GPU 1, though older pods were pending.
    let c = slot_id(&g[1], 0);
    p.allocate(request(vec![vec![c.clone()]]))
        .await
        .expect("fits");
    assert_eq!(holder(&p, &c), Some(("other".to_owned(), 500)));
}

#[tokio::test]
async fn a_reserved_slot_set_goes_to_the_pod_it_was_reserved_for() {
    let (p, source, g) = plugin();
    bind_share(&source, "a", 1, &g[2], 500);
    bind_share(&source, "b", 2, &g[2], 250);
    p.reservations.lock().push(Reservation {
        slots: BTreeSet::from([slot_id(&g[2], 7)]),
        uid: source.uid(&PodRef::new("ml", "b")).expect("bound"),
        container: "main".into(),
        at: Instant::now(),
    });
    let (reserved, other) = (slot_id(&g[2], 7), slot_id(&g[2], 8));
    p.allocate(request(vec![vec![reserved.clone()]]))
        .await
        .unwrap();
    assert_eq!(holder(&p, &reserved).unwrap().0, "b");
    assert!(p.reservations.lock().is_empty(), "used up");
    p.allocate(request(vec![vec![other.clone()]]))
        .await
        .unwrap();
    assert_eq!(holder(&p, &other).unwrap().0, "a");
}

#[tokio::test]
async fn a_request_on_gpus_no_pending_pod_is_assigned_is_refused_naming_the_pending_ones() {
    let (p, source, g) = plugin();
    bind_share(&source, "a", 1, &g[0], 500);
    let err = p
        .allocate(request(vec![vec![slot_id(&g[3], 0)]]))
        .await
        .expect_err("refused");
    let ProviderError::FailedPrecondition(text) = err else {
        panic!("{err:?}")
    };
    assert!(text.contains(&g[3]) && text.contains("ml/a/main"), "{text}");
    assert!(p.node.ledger.lock().allocations().is_empty());
}

#[tokio::test]
async fn a_pod_without_an_assignment_gets_whole_free_gpus_and_never_a_shared_one() {
    let (p, source, g) = plugin();
    source.bind(PodRef::new("ml", "plain"), 1, &[("main", 1)], None);
    source.bind(PodRef::new("ml", "plain-2"), 2, &[("main", 1)], None);
    bind_share(&source, "shared", 0, &g[2], 500);
    let slot = slot_id(&g[1], 0);
    p.allocate(request(vec![vec![slot.clone()]])).await.unwrap();
    assert_eq!(holder(&p, &slot), Some(("plain".to_owned(), 1000)));
    assert_eq!(p.node.ledger.lock().allocations()[0].origin, Origin::Whole);
    // GPU 2 is the shared pod's once it is allocated: never whole for another pod.
    p.allocate(request(vec![vec![slot_id(&g[2], 0)]]))
        .await
        .unwrap();
    let err = p
        .allocate(request(vec![vec![slot_id(&g[2], 1)]]))
        .await
        .expect_err("in use");
    assert!(err.to_string().contains("already in use"), "{err}");
}

/// Every Allocate and GetPreferredAllocation, allocated, whole or refused, takes the ledger
/// lock exactly once: the decision and its record are one critical section.
#[tokio::test]
async fn each_request_decides_and_records_under_one_ledger_acquisition() {
    let (p, source, g) = plugin();
    bind_share(&source, "a", 1, &g[0], 500);
    source.bind(PodRef::new("ml", "plain"), 2, &[("main", 2)], None);
    // Pending throughout, so that a request on another GPU is refused at once (with nobody
    // pending of its size, the plugin would wait for the source to catch up).
    bind_share(&source, "c", 3, &g[3], 100);
    let ledger = &p.node.ledger;
    let mut before = ledger.acquisitions();
    let mut took = |what: &str| {
        let now = ledger.acquisitions();
        assert_eq!(now - before, 1, "{what}");
        before = now;
    };
    let preferred = p
        .preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: (0..4).map(|i| slot_id(&g[i], 0)).collect(),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap();
    took("preferred");
    let slots = preferred.container_responses[0].device_i_ds.clone();
    assert_eq!(slots, [slot_id(&g[0], 0)]);
    p.allocate(request(vec![slots])).await.unwrap();
    took("an assigned allocate");
    p.allocate(request(vec![vec![slot_id(&g[2], 0), slot_id(&g[3], 0)]]))
        .await
        .unwrap();
    took("a whole allocate");
    p.allocate(request(vec![vec![slot_id(&g[1], 0)]]))
        .await
        .expect_err("nobody is pending for GPU 1");
    took("a refused allocate");

    let (none, g) = plugin_over(Arc::new(NoAssignments));
    let before = none.node.ledger.acquisitions();
    none.allocate(request(vec![vec![slot_id(&g[0], 0)]]))
        .await
        .unwrap();
    assert_eq!(none.node.ledger.acquisitions() - before, 1, "no cluster");
}

/// Two Allocates racing for one GPU whose pending shares do not both fit: as the capacity
/// check and the record are one critical section, exactly one of them gets it, and the
/// oldest pod is allocated once. (Checked and recorded under separate acquisitions, both
/// could match the oldest pod and pass the check against the same ledger.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_allocates_never_both_pass_one_capacity_check() {
    for round in 0..50 {
        let (p, source, g) = plugin();
        let p = Arc::new(p);
        bind_share(&source, "a", 1, &g[0], 600);
        bind_share(&source, "b", 2, &g[0], 600);
        let go = Arc::new(tokio::sync::Barrier::new(2));
        let race = |k: u32| {
            let (p, go, slot) = (Arc::clone(&p), Arc::clone(&go), slot_id(&g[0], k));
            tokio::spawn(async move {
                go.wait().await;
                p.allocate(request(vec![vec![slot]])).await.is_ok()
            })
        };
        let (one, two) = (race(1), race(2));
        let won = [one.await.unwrap(), two.await.unwrap()];
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: {won:?}"
        );
        let ledger = p.node.ledger.lock();
        assert_eq!(ledger.allocations().len(), 1, "round {round}");
        assert_eq!(
            ledger.allocations()[0].pod,
            Some(PodRef::new("ml", "a")),
            "round {round}"
        );
    }
}
