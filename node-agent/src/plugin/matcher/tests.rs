//! The matcher under adversarial interleavings: a model of the kubelet and the coordinator
//! drives [`allocate`] and [`preferred`] through random sequences of binds (as the coordinator
//! binds: never a second pod with a request size in common while the first is not allocated,
//! nor while a deleted pod of that size may still be admitted), preferred answers, Allocates
//! (on the preferred slots, on the pod's own GPUs, on any GPUs, reusing an init container's
//! devices), pods starting, deleted and created again under their name with a new UID,
//! kubelet restarts that lose an allocation, reservations expiring, and requests from pods the
//! agent does not know. After every step the invariants hold: a plan is its owner's own share
//! on exactly the request's GPUs, for the pod that asked; no GPU is over capacity; a
//! reservation serves at most the one container it was made for; a container is allocated
//! once; a pod created again under an old name is allocated as itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use proptest::prelude::*;
use tessera_contract::{GpuSlice, Isolation, PodUid};

use super::*;
use crate::assignments::{PendingContainer, PendingPod, SourceKind};
use crate::gpu::sim::SimBackend;
use crate::ledger::{Ledger, PodRef};
use crate::node::{Node, NodeOptions, slot_id};
use crate::plugin::GpuPlugin;
use crate::testing::StaticAssignments;

const GPUS: usize = 4;

/// Who asks: a known pod's container, or (`None`) a pod the agent does not know.
type Asker<'p> = Option<(&'p PendingPod, &'p PendingContainer)>;

/// What one step of the run does.
#[derive(Debug, Clone)]
enum Op {
    /// The coordinator binds a pod named `name` (one created again under an old name has a
    /// new UID); skipped when its hold forbids it.
    Bind {
        name: u8,
        init: Option<u8>,
        main: u8,
        assigned: bool,
        gpus: [u8; 2],
        milli: u16,
        mib: u64,
    },
    /// The kubelet asks for the next container of pending pod `pod` (allocation order), on
    /// slots chosen `how`.
    Allocate { pod: u8, how: How },
    /// Every container of pending pod `pod` not allocated yet, in one Allocate, each on a
    /// free slot of each of its own GPUs.
    AllocateAll { pod: u8 },
    /// A pod the agent does not know asks: a pod deleted in the API that the kubelet still
    /// admits (`ghost`: its size is one the coordinator holds), or any request at all.
    Stranger { ghost: u8, size: u8, gpus: [u8; 2] },
    /// Pending pod `pod` starts: no longer pending.
    Start { pod: u8 },
    /// Pending pod `pod` is deleted; its shares are released now (`release`) or later.
    Delete { pod: u8, release: bool },
    /// The kubelets saw every deletion: no deleted pod is admitted any more.
    Forget,
    /// The kubelet restarted and lost one allocation of a pending pod (settled: released).
    KubeletLoses { pick: u8 },
    /// Time passes beyond the reservations' lifetime.
    Expire,
}

#[derive(Debug, Clone)]
enum How {
    /// The slots GetPreferredAllocation answered.
    Preferred,
    /// A free slot on each of the container's own assigned GPUs.
    OwnGpus,
    /// Free slots on these GPUs.
    Gpus([u8; 2]),
    /// The devices the pod's init container holds (the kubelet hands them on).
    ReuseInit,
}

fn op() -> impl Strategy<Value = Op> {
    let gpus = || [0..GPUS as u8, 0..GPUS as u8];
    prop_oneof![
        4 => (0..3u8, prop::option::of(1..=2u8), 1..=2u8, prop::bool::weighted(0.8), gpus(), 1..=1000u16, 0..=30_000u64)
            .prop_map(|(name, init, main, assigned, gpus, milli, mib)| Op::Bind { name, init, main, assigned, gpus, milli, mib }),
        6 => (any::<u8>(), prop_oneof![
                Just(How::Preferred), Just(How::OwnGpus), gpus().prop_map(How::Gpus), Just(How::ReuseInit)
            ]).prop_map(|(pod, how)| Op::Allocate { pod, how }),
        2 => any::<u8>().prop_map(|pod| Op::AllocateAll { pod }),
        1 => (any::<u8>(), 1..=2u8, gpus()).prop_map(|(ghost, size, gpus)| Op::Stranger { ghost, size, gpus }),
        1 => any::<u8>().prop_map(|pod| Op::Start { pod }),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(pod, release)| Op::Delete { pod, release }),
        1 => Just(Op::Forget),
        1 => any::<u8>().prop_map(|pick| Op::KubeletLoses { pick }),
        1 => Just(Op::Expire),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Pending,
    Started,
    /// Deleted in the API; the kubelet may still admit it.
    Ghost,
    Gone,
}

#[derive(Debug, Clone)]
struct ModelPod {
    pod: PendingPod,
    status: Status,
}

/// The node, the coordinator's binds and the kubelet, around the matcher.
struct Model<'a> {
    view: NodeView<'a>,
    pods: Vec<ModelPod>,
    ledger: Ledger,
    reservations: Vec<Reservation>,
    now: Instant,
    next: u64,
    /// A kubelet restart lost an allocation after the coordinator's hold had been lifted
    /// for it: two pending containers may now look alike.
    lookalikes_possible: bool,
}

impl Model<'_> {
    fn pending(&self) -> Vec<PendingPod> {
        let mut pods: Vec<PendingPod> = self
            .pods
            .iter()
            .filter(|p| p.status == Status::Pending)
            .map(|p| p.pod.clone())
            .collect();
        pods.sort_by_key(|p| p.created_unix_ms);
        pods
    }

    fn held(&self, uid: &PodUid, container: &str) -> bool {
        self.ledger
            .allocations()
            .iter()
            .any(|a| a.pod_uid.as_ref() == Some(uid) && a.container.as_deref() == Some(container))
    }

    fn fully_allocated(&self, p: &PendingPod) -> bool {
        p.containers.iter().all(|c| self.held(&p.uid, &c.name))
    }

    /// Request sizes the coordinator holds: those of pending pods not yet allocated, and of
    /// deleted pods the kubelet may still admit.
    fn held_sizes(&self) -> BTreeSet<u32> {
        self.pods
            .iter()
            .filter(|p| match p.status {
                Status::Pending => !self.fully_allocated(&p.pod),
                Status::Ghost => true,
                Status::Started | Status::Gone => false,
            })
            .flat_map(|p| p.pod.containers.iter().map(|c| c.slots))
            .collect()
    }

    fn uuid(&self, i: u8) -> String {
        self.view.gpus[usize::from(i) % GPUS].uuid.clone()
    }

    /// `size` distinct GPUs starting from `gpus`.
    fn gpu_set(&self, gpus: [u8; 2], size: u8) -> Vec<String> {
        let first = usize::from(gpus[0]) % GPUS;
        let mut second = usize::from(gpus[1]) % GPUS;
        if second == first {
            second = (first + 1) % GPUS;
        }
        [first, second][..usize::from(size.min(2))]
            .iter()
            .map(|&i| self.uuid(i as u8))
            .collect()
    }

    fn free_slots(&self) -> Vec<String> {
        let held: BTreeSet<&String> = self
            .ledger
            .allocations()
            .iter()
            .flat_map(|a| a.slots.iter())
            .collect();
        self.view
            .gpus
            .iter()
            .flat_map(|g| (0..self.view.shares_per_gpu).map(|k| slot_id(&g.uuid, k)))
            .filter(|s| !held.contains(s))
            .collect()
    }

    fn free_slot_on(&self, uuid: &str) -> Option<String> {
        self.free_slots()
            .into_iter()
            .find(|s| parse_slot(s).is_some_and(|(u, _)| u == uuid))
    }

    fn snapshot<'s>(&'s self, pending: &'s [PendingPod]) -> Snapshot<'s> {
        Snapshot {
            node: &self.view,
            pending,
            reservations: &self.reservations,
            allocations: self.ledger.allocations(),
            now: self.now,
        }
    }

    fn bind(&mut self, name: u8, containers: Vec<PendingContainer>) {
        let pod = PodRef::new("ml", format!("p{name}"));
        for p in &mut self.pods {
            // Created again under its name: the old pod is gone (its shares may linger
            // until its departure is seen).
            if p.pod.pod == pod && matches!(p.status, Status::Pending | Status::Ghost) {
                p.status = Status::Gone;
            }
        }
        let sizes: BTreeSet<u32> = containers.iter().map(|c| c.slots).collect();
        if !sizes.is_disjoint(&self.held_sizes()) {
            return;
        }
        self.next += 1;
        self.pods.push(ModelPod {
            pod: PendingPod {
                uid: PodUid::new(format!("uid-{}", self.next)).unwrap(),
                pod,
                created_unix_ms: self.next,
                isolation: Isolation::Watchdog,
                containers,
            },
            status: Status::Pending,
        });
    }

    fn pick_pending(&self, k: u8) -> Option<usize> {
        let idx: Vec<usize> = (0..self.pods.len())
            .filter(|&i| self.pods[i].status == Status::Pending)
            .collect();
        (!idx.is_empty()).then(|| idx[usize::from(k) % idx.len()])
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Bind {
                name,
                init,
                main,
                assigned,
                gpus,
                milli,
                mib,
            } => {
                let container = |name: &str, size: u8| PendingContainer {
                    name: name.to_owned(),
                    slots: u32::from(size),
                    gpus: assigned.then(|| {
                        self.gpu_set(*gpus, size)
                            .into_iter()
                            .map(|uuid| GpuSlice {
                                uuid,
                                memory_mib: *mib,
                                compute_milli: u32::from(*milli),
                            })
                            .collect()
                    }),
                };
                let mut containers: Vec<PendingContainer> =
                    init.iter().map(|&s| container("fetch", s)).collect();
                containers.push(container("main", *main));
                self.bind(*name, containers);
            }
            Op::Allocate { pod, how } => {
                let Some(i) = self.pick_pending(*pod) else {
                    return Ok(());
                };
                let p = self.pods[i].pod.clone();
                let Some(c) = p
                    .containers
                    .iter()
                    .find(|c| !self.held(&p.uid, &c.name))
                    .cloned()
                else {
                    return Ok(());
                };
                let size = c.slots as usize;
                let slots = match how {
                    How::Preferred => {
                        let pending = self.pending();
                        let available = self.free_slots();
                        let answers = preferred(
                            &self.snapshot(&pending),
                            &[PreferredRequest {
                                size,
                                available: &available,
                                must_include: &[],
                            }],
                        );
                        self.check_reservations_made(&answers)?;
                        reserve(&mut self.reservations, &answers);
                        Some(answers[0].slots.clone())
                    }
                    How::OwnGpus => c
                        .gpus
                        .iter()
                        .flatten()
                        .map(|g| self.free_slot_on(&g.uuid))
                        .collect(),
                    How::Gpus(gpus) => self
                        .gpu_set(*gpus, c.slots as u8)
                        .iter()
                        .map(|u| self.free_slot_on(u))
                        .collect(),
                    How::ReuseInit => {
                        let init: Vec<String> = self
                            .ledger
                            .allocations()
                            .iter()
                            .filter(|a| {
                                a.pod_uid.as_ref() == Some(&p.uid)
                                    && a.container.as_deref() == Some("fetch")
                            })
                            .flat_map(|a| a.slots.clone())
                            .collect();
                        (c.name == "main" && init.len() >= size).then(|| init[..size].to_vec())
                    }
                };
                let Some(slots) = slots.filter(|s| s.len() == size) else {
                    return Ok(());
                };
                self.allocate(&[(Some((&p, &c)), slots)], false)?;
            }
            Op::AllocateAll { pod } => {
                let Some(i) = self.pick_pending(*pod) else {
                    return Ok(());
                };
                let p = self.pods[i].pod.clone();
                let mut free = self.free_slots();
                let mut requests = Vec::new();
                for c in p.containers.iter().filter(|c| !self.held(&p.uid, &c.name)) {
                    let mut slots = Vec::new();
                    for g in c.gpus.iter().flatten() {
                        let on_gpu = |s: &String| parse_slot(s).is_some_and(|(u, _)| u == g.uuid);
                        if let Some(k) = free.iter().position(on_gpu) {
                            slots.push(free.remove(k));
                        }
                    }
                    if slots.len() != c.slots as usize {
                        return Ok(());
                    }
                    requests.push((Some((&p, c)), slots));
                }
                if !requests.is_empty() {
                    self.allocate(&requests, false)?;
                }
            }
            Op::Stranger { ghost, size, gpus } => {
                // The kubelet admits a pod the agent does not know: a deleted one (the
                // coordinator holds its size) or anything at all.
                let ghosts: Vec<&ModelPod> = self
                    .pods
                    .iter()
                    .filter(|p| p.status == Status::Ghost)
                    .collect();
                let (size, held) = match ghosts.get(usize::from(*ghost) % ghosts.len().max(1)) {
                    Some(g) => (g.pod.containers[0].slots as u8, true),
                    None => (*size, false),
                };
                let slots: Option<Vec<String>> = self
                    .gpu_set(*gpus, size)
                    .iter()
                    .map(|u| self.free_slot_on(u))
                    .collect();
                if let Some(slots) = slots {
                    self.allocate(&[(None, slots)], held)?;
                }
            }
            Op::Start { pod } => {
                if let Some(i) = self.pick_pending(*pod) {
                    self.pods[i].status = Status::Started;
                }
            }
            Op::Delete { pod, release } => {
                if let Some(i) = self.pick_pending(*pod) {
                    let uid = self.pods[i].pod.uid.clone();
                    let admitted = self.fully_allocated(&self.pods[i].pod);
                    self.pods[i].status = if admitted {
                        Status::Gone
                    } else {
                        Status::Ghost
                    };
                    if *release {
                        self.ledger.release_pod(&uid).unwrap();
                    }
                }
            }
            Op::Forget => {
                for p in &mut self.pods {
                    if p.status == Status::Ghost {
                        p.status = Status::Gone;
                    }
                }
            }
            Op::KubeletLoses { pick } => {
                let pending: BTreeSet<PodUid> = self.pending().into_iter().map(|p| p.uid).collect();
                let lost: Vec<Vec<String>> = self
                    .ledger
                    .allocations()
                    .iter()
                    .filter(|a| a.pod_uid.as_ref().is_some_and(|u| pending.contains(u)))
                    .map(|a| a.slots.clone())
                    .collect();
                if let Some(slots) = lost.get(usize::from(*pick) % lost.len().max(1)) {
                    // Its pod is pending again while the coordinator's hold is lifted.
                    self.lookalikes_possible = true;
                    self.ledger.remove_holding(slots).unwrap();
                }
            }
            Op::Expire => {
                self.now += RESERVATION_TTL;
                let now = self.now;
                self.reservations.retain(|r| r.live_at(now));
            }
        }
        self.check_ledger()
    }

    /// Allocates each request's slots in one Allocate, each for its asker (`None`: a pod the
    /// agent does not know; `ghost`: one whose size the coordinator holds), and checks the
    /// decision.
    fn allocate(
        &mut self,
        requests: &[(Asker<'_>, Vec<String>)],
        ghost: bool,
    ) -> Result<(), TestCaseError> {
        let pending = self.pending();
        let snap = self.snapshot(&pending);
        let slot_lists: Vec<Vec<String>> = requests.iter().map(|(_, s)| s.clone()).collect();
        let decision = allocate(&snap, &slot_lists);
        if let [(Some((_, c)), slots)] = requests {
            // A known pod asking alone on exactly its GPUs, with room: allocated, whatever
            // pod held its name before.
            let fits = !self.lookalikes_possible
                && c.gpus.as_ref().is_some_and(|gpus| {
                    gpus.iter()
                        .map(|g| g.uuid.as_str())
                        .collect::<BTreeSet<_>>()
                        == gpus_of(slots)
                        && gpus.iter().all(|g| {
                            let u = usage_of(snap.allocations, &g.uuid, slots);
                            !u.whole
                                && u.memory_mib + g.memory_mib <= self.view.memory_total(&g.uuid)
                                && u.compute_milli + g.compute_milli <= 1000
                        })
                });
            if fits {
                prop_assert!(decision.is_ok(), "{c:?} on {slots:?} refused: {decision:?}");
            }
        }
        let Ok(plans) = decision else {
            return Ok(());
        };
        prop_assert_eq!(plans.len(), requests.len());
        for (k, (plan, (asker, slots))) in plans.iter().zip(requests).enumerate() {
            self.check_plan(&snap, &plans[..k], plan, *asker, slots, ghost)?;
        }
        super::super::record(&mut self.ledger, &plans).unwrap();
        release(&mut self.reservations, &plans);
        for r in &self.reservations {
            prop_assert!(
                !plans.iter().any(|p| p.is_for(&r.uid, &r.container)
                    || p.slots.iter().any(|s| r.slots.contains(s))),
                "reservation {r:?} outlived its use"
            );
        }
        Ok(())
    }

    /// `plan`, for `slots` asked by `asker` after `earlier` plans of the same Allocate, is
    /// its owner's own share on exactly those GPUs, for the pod that asked.
    fn check_plan(
        &self,
        snap: &Snapshot<'_>,
        earlier: &[Plan],
        plan: &Plan,
        asker: Asker<'_>,
        slots: &[String],
        ghost: bool,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(&plan.slots, slots);
        let request_gpus = gpus_of(slots);
        let holdings = snap.allocations;
        match (&plan.owner, plan.origin) {
            (Some(owner), Origin::Assigned) => {
                let granted: BTreeSet<&str> = plan.grants.iter().map(|g| g.uuid.as_str()).collect();
                prop_assert_eq!(&granted, &request_gpus);
                let pod = snap.pending.iter().find(|p| p.uid == owner.uid);
                prop_assert!(pod.is_some(), "owner {} is not pending", owner.uid);
                let own: Vec<&GpuSlice> = pod
                    .and_then(|p| p.containers.iter().find(|c| c.name == owner.container))
                    .iter()
                    .flat_map(|c| c.gpus.iter().flatten())
                    .collect();
                for g in &plan.grants {
                    let mine = own.iter().any(|s| {
                        s.uuid == g.uuid
                            && s.memory_mib == g.memory_mib
                            && s.compute_milli == g.compute_milli
                    }) || holdings
                        .iter()
                        .any(|a| a.pod_uid.as_ref() == Some(&owner.uid) && a.grants.contains(g));
                    prop_assert!(mine, "{g:?} is not {}'s", owner.uid);
                }
                let twice = holdings.iter().any(|a| {
                    a.pod_uid.as_ref() == Some(&owner.uid)
                        && a.container.as_deref() == Some(owner.container.as_str())
                        && !a.slots.iter().any(|s| slots.contains(s))
                }) || earlier
                    .iter()
                    .any(|p| p.is_for(&owner.uid, &owner.container));
                prop_assert!(!twice, "{}/{} allocated twice", owner.uid, owner.container);
                let reserved_for = snap.live_reservations().find(|r| {
                    r.slots.iter().collect::<BTreeSet<_>>() == slots.iter().collect()
                        && candidates(snap, slots.len(), true)
                            .iter()
                            .any(|c| c.is(&r.uid, &r.container))
                        && !earlier.iter().any(|p| p.is_for(&r.uid, &r.container))
                });
                if let Some(r) = reserved_for {
                    prop_assert!(
                        owner.is(&r.uid, &r.container),
                        "reserved for {}/{}, given to {}/{}",
                        r.uid,
                        r.container,
                        owner.uid,
                        owner.container
                    );
                }
                match asker {
                    Some((p, c)) if !self.lookalikes_possible => prop_assert!(
                        owner.is(&p.uid, &c.name),
                        "{}/{} asked, {}/{} got it",
                        p.uid,
                        c.name,
                        owner.uid,
                        owner.container
                    ),
                    Some(_) => {}
                    None => prop_assert!(
                        !ghost || self.lookalikes_possible,
                        "a deleted pod the kubelet still admits got {}'s share",
                        owner.uid
                    ),
                }
            }
            (owner, Origin::Whole) => {
                prop_assert!(
                    owner.as_ref().is_none_or(|o| o.gpus.is_empty()),
                    "whole GPUs for an assigned pod"
                );
                // Without a cluster anyone gets whole GPUs; with one, only a pending pod
                // without an assignment.
                prop_assert!(
                    owner.is_some() || self.view.source == SourceKind::None,
                    "whole GPUs for nobody's request"
                );
                for g in &plan.grants {
                    prop_assert_eq!(usage_of(holdings, &g.uuid, slots).holders, 0);
                }
            }
            other => prop_assert!(false, "unexpected plan {other:?}"),
        }
        Ok(())
    }

    fn check_reservations_made(&self, answers: &[Preference]) -> Result<(), TestCaseError> {
        for r in answers.iter().filter_map(|a| a.reservation.as_ref()) {
            for other in self
                .reservations
                .iter()
                .filter(|o| o.live_at(self.now) && !o.is_for(&r.uid, &r.container))
            {
                prop_assert!(
                    r.slots.is_disjoint(&other.slots),
                    "{r:?} shares a slot with {other:?}"
                );
            }
        }
        Ok(())
    }

    /// No GPU over capacity, a whole holder alone, a container allocated once, and a
    /// reservation per container.
    fn check_ledger(&self) -> Result<(), TestCaseError> {
        let allocations = self.ledger.allocations();
        for g in &self.view.gpus {
            let u = usage_of(allocations, &g.uuid, &[]);
            prop_assert!(
                u.memory_mib <= g.memory_total_mib,
                "{} memory {u:?}",
                g.uuid
            );
            prop_assert!(u.compute_milli <= 1000, "{} compute {u:?}", g.uuid);
            prop_assert!(
                !u.whole || u.holders == 1,
                "{} shared while held whole: {u:?}",
                g.uuid
            );
        }
        let mut seen: BTreeMap<(&PodUid, &str), u64> = BTreeMap::new();
        for a in allocations {
            if let (Some(uid), Some(c)) = (&a.pod_uid, &a.container) {
                prop_assert!(
                    seen.insert((uid, c.as_str()), a.id).is_none(),
                    "{uid}/{c} allocated twice"
                );
            }
        }
        let mut per_container = BTreeSet::new();
        for r in &self.reservations {
            prop_assert!(
                per_container.insert((&r.uid, &r.container)),
                "two reservations for {}/{}",
                r.uid,
                r.container
            );
        }
        Ok(())
    }
}

/// The GPUs the slots are on.
fn gpus_of(slots: &[String]) -> BTreeSet<&str> {
    slots
        .iter()
        .filter_map(|s| parse_slot(s).map(|(u, _)| u))
        .collect()
}

/// The simulated four-GPU node's view (10 slots per GPU), as the plugin builds it.
fn node() -> Arc<Node> {
    let shape = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/gpus/l40s-4x-pcie.yaml");
    let sim = Arc::new(SimBackend::from_file(shape).expect("the shape parses"));
    Arc::new(Node::new(sim, Ledger::in_memory(), NodeOptions::default()).expect("the node starts"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_interleaving_gives_a_pod_another_pods_share_or_overcommits(ops in prop::collection::vec(op(), 1..60)) {
        let node = node();
        let plugin = GpuPlugin::new(Arc::clone(&node), Arc::new(StaticAssignments::new()));
        let mut model = Model {
            view: plugin.view(),
            pods: Vec::new(),
            ledger: Ledger::in_memory(),
            reservations: Vec::new(),
            now: Instant::now(),
            next: 0,
            lookalikes_possible: false,
        };
        for op in &ops {
            model.step(op)?;
        }
    }
}
