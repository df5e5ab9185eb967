//! Property tests of the scheduling invariants over random clusters and workloads.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tessera_core::cycle::{CycleConfig, Decisions, EvictionReason, schedule};
use tessera_core::fairshare::{QueueTree, fair_shares};
use tessera_core::model::{GpuRequest, GpuShare, Node, Pod, PodGroup, Queue, Snapshot};

#[derive(Clone, Debug)]
struct PodSpec {
    queue: usize,
    share: u8,
    amount: u32,
    count: u32,
    cpu: u64,
    prio: i32,
    preemptible: bool,
    group: Option<usize>,
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (
        prop::sample::select(vec![0usize, 0, 1, 1, 2, 2, 3]),
        prop::sample::select(vec![0u8, 1, 1, 2, 2, 2, 3, 3, 4, 5]),
        1..1000u32,
        1..3u32,
        0..6u64,
        prop_oneof![Just(0), Just(50), Just(150)],
        any::<bool>(),
        prop::option::weighted(0.3, 0..3usize),
    )
        .prop_map(
            |(queue, share, amount, count, cpu, prio, preemptible, group)| PodSpec {
                queue,
                share,
                amount,
                count,
                cpu: cpu * 1000,
                prio,
                preemptible,
                group,
            },
        )
}

fn build(nodes: &[(u32, bool)], limits: &[i32], specs: &[PodSpec], mins: &[u32]) -> Snapshot {
    let mut s = Snapshot::at(1000).queue(Queue::new("root").gpu(0.0, 1.0, -1.0));
    for (q, &l) in limits.iter().enumerate() {
        let limit = if l < 0 { -1.0 } else { f64::from(l) };
        s = s.queue(Queue::new(&format!("q{q}")).parent("root").gpu(
            q as f64,
            1.0 + q as f64,
            limit,
        ));
    }
    s = s.levels(&["rack"]);
    for (i, &(g, big)) in nodes.iter().enumerate() {
        let mem = if big { 80_000 } else { 16_000 };
        s = s.node(
            Node::gpu_node(&format!("n{i}"), g, "G", mem)
                .with_cpu(16_000, 65_536)
                .nvlink_islands(2)
                .label("rack", &format!("r{}", i / 2)),
        );
    }
    for (g, &m) in mins.iter().enumerate() {
        let mut group = PodGroup::new(&format!("g{g}"), "q0", m);
        match g {
            0 => group = group.required("rack"),
            1 => group = group.preferred("rack").max(m + 1),
            _ => group.below_min_member_since = Some(0),
        }
        s = s.group(group);
    }
    for (i, p) in specs.iter().enumerate() {
        let gpu = match p.share {
            0 => GpuRequest {
                count: 0,
                per_gpu: GpuShare::Whole,
            },
            1 => GpuRequest {
                count: p.count,
                per_gpu: GpuShare::Whole,
            },
            2 => GpuRequest {
                count: 1,
                per_gpu: GpuShare::Fraction(p.amount),
            },
            3 => GpuRequest {
                count: 1,
                per_gpu: GpuShare::MemoryMib(u64::from(p.amount) * 16),
            },
            // Malformed inputs: fraction up to 2.0 (or 0), memory up to 200 GB, 9 GPUs.
            4 => GpuRequest {
                count: 1,
                per_gpu: GpuShare::Fraction(p.amount * 2 % 2000),
            },
            _ => GpuRequest {
                count: if p.amount % 7 == 0 { 9 } else { 1 },
                per_gpu: GpuShare::MemoryMib(u64::from(p.amount) * 200),
            },
        };
        let mut pod = Pod::new(
            &format!("p{i:02}"),
            &format!("q{}", if p.group.is_some() { 0 } else { p.queue }),
        )
        .cpu(p.cpu, 1024)
        .priority(p.prio)
        .preemptible(p.preemptible)
        .created(i as u64);
        // Half the pods have a controller (consolidation may move them), half are bare.
        if i % 2 == 0 {
            pod = pod.controlled_by(&format!("ReplicaSet r{i}"));
        }
        pod.gpu = gpu;
        if let Some(g) = p.group {
            pod = pod.group(&format!("g{g}"));
        }
        s = s.pod(pod);
    }
    s
}

/// Applies a cycle's decisions as the cluster would: bindings bind, evicted pods are pending
/// again.
pub(crate) fn apply(s: &mut Snapshot, d: &Decisions) {
    for b in &d.bindings {
        let p = s.pods.iter_mut().find(|p| p.uid == b.pod).unwrap();
        *p = p.clone().bound(&b.node, b.assignment.clone());
    }
    for e in &d.evictions {
        s.pods
            .iter_mut()
            .find(|p| p.uid == e.pod)
            .unwrap()
            .placement = None;
    }
}

/// Checks capacity on the state after applying `d` to `s`.
fn check_capacity(s: &Snapshot) -> Result<(), TestCaseError> {
    let mut cpu: BTreeMap<&str, u64> = BTreeMap::new();
    let mut gpu: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    for p in &s.pods {
        let Some(pl) = &p.placement else { continue };
        *cpu.entry(pl.node.as_str()).or_default() += p.cpu_milli;
        let n: u32 = pl.assignment.slices().count() as u32;
        prop_assert_eq!(n, p.gpu.count, "pod {} got {} GPUs", p.uid, n);
        for sl in pl.assignment.slices() {
            let e = gpu.entry(sl.uuid.as_str()).or_default();
            e.0 += sl.compute_milli;
            e.1 += sl.memory_mib;
        }
    }
    for n in &s.nodes {
        prop_assert!(cpu.get(n.name.as_str()).copied().unwrap_or(0) <= n.cpu_milli);
        for g in &n.gpus {
            let (c, m) = gpu.get(g.uuid.as_str()).copied().unwrap_or((0, 0));
            prop_assert!(c <= 1000, "GPU {} compute {}", g.uuid, c);
            prop_assert!(m <= g.memory_mib, "GPU {} memory {}", g.uuid, m);
        }
    }
    Ok(())
}

fn check_cycle(before: &Snapshot, d: &Decisions) -> Result<Snapshot, TestCaseError> {
    let cfg = CycleConfig::default();
    // Deterministic.
    prop_assert_eq!(&schedule(before, &cfg), d);
    // Non-preemptible pods are never evicted by reclaim/preempt/consolidate.
    for e in &d.evictions {
        let p = before.pods.iter().find(|p| p.uid == e.pod).unwrap();
        prop_assert!(p.placement.is_some());
        if !matches!(e.reason, EvictionReason::GangBelowMinMember) {
            prop_assert!(p.preemptible, "non-preemptible {} evicted", p.uid);
        }
        // A move needs something to recreate the pod: a bare pod is never consolidated.
        if matches!(e.reason, EvictionReason::Consolidate { .. }) {
            prop_assert!(p.controller.is_some(), "bare pod {} consolidated", p.uid);
        }
    }
    let mut after = before.clone();
    apply(&mut after, d);
    // Every pod left pending is explained.
    let explained: BTreeMap<&str, &str> = d
        .pending
        .iter()
        .map(|p| (p.pod.as_str(), p.message.as_str()))
        .collect();
    for p in before.pods.iter().filter(|p| p.placement.is_none()) {
        if !d.bindings.iter().any(|b| b.pod == p.uid) {
            let m = explained.get(p.uid.as_str()).copied().unwrap_or("");
            prop_assert!(!m.is_empty(), "pod {} pending without explanation", p.uid);
        }
    }
    check_capacity(&after)?;
    check_reclaim_floor(before, d)?;
    check_fair_shares_fill_capacity(before, d)?;
    // No partial gang: a group that received bindings has at least minMember pods bound.
    let bound_now: BTreeSet<&str> = d.bindings.iter().map(|b| b.pod.as_str()).collect();
    for g in &after.groups {
        let members: Vec<&Pod> = after
            .pods
            .iter()
            .filter(|p| p.group.as_deref() == Some(g.name.as_str()))
            .collect();
        let got_new = members.iter().any(|p| bound_now.contains(p.uid.as_str()));
        let bound = members.iter().filter(|p| p.placement.is_some()).count() as u32;
        if got_new {
            prop_assert!(
                bound >= g.min_member,
                "group {} partially bound: {} < {}",
                g.name,
                bound,
                g.min_member
            );
        }
    }
    // A required topology level holds: all bound pods of the group share one rack.
    for g in after
        .groups
        .iter()
        .filter(|g| g.topology_required.is_some())
    {
        let racks: BTreeSet<&str> = after
            .pods
            .iter()
            .filter(|p| p.group.as_deref() == Some(g.name.as_str()))
            .filter_map(|p| p.placement.as_ref())
            .map(|pl| {
                let n = after.nodes.iter().find(|n| n.name == pl.node).unwrap();
                n.labels["rack"].as_str()
            })
            .collect();
        prop_assert!(racks.len() <= 1, "group {} spans racks {:?}", g.name, racks);
    }
    // Limits never exceeded.
    for q in &after.queues {
        if q.gpu.limit < 0.0 {
            continue;
        }
        let used: u64 = after
            .pods
            .iter()
            .filter(|p| p.queue == q.name)
            .filter_map(|p| p.placement.as_ref())
            .flat_map(|pl| pl.assignment.slices())
            .map(|s| u64::from(s.compute_milli))
            .sum();
        prop_assert!(
            used as f64 <= q.gpu.limit * 1000.0 + 1e-6,
            "queue {} at {} over limit {}",
            q.name,
            used,
            q.gpu.limit
        );
    }
    Ok(after)
}

/// Queue `q` and its ancestors, innermost first.
fn queue_path<'a>(s: &'a Snapshot, q: &'a str) -> Vec<&'a str> {
    let mut out = vec![q];
    while let Some(p) = s
        .queues
        .iter()
        .find(|x| x.name == *out.last().unwrap())
        .and_then(|x| x.parent.as_deref())
    {
        if out.contains(&p) {
            break;
        }
        out.push(p);
    }
    out
}

fn gpu_held(p: &Pod) -> f64 {
    p.placement.as_ref().map_or(0.0, |pl| {
        pl.assignment
            .slices()
            .map(|s| f64::from(s.compute_milli))
            .sum()
    })
}

/// No reclaim takes a queue that loses (on the victim's path, not on the reclaimer's) below
/// its deserved quota. Pods the queue itself preempted are added back: preemption inside a
/// queue is the queue's own business.
fn check_reclaim_floor(before: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let mut lost: BTreeMap<&str, f64> = BTreeMap::new();
    let mut preempted: BTreeMap<&str, f64> = BTreeMap::new();
    for e in &d.evictions {
        let p = before.pods.iter().find(|p| p.uid == e.pod).unwrap();
        match &e.reason {
            EvictionReason::Reclaim { by_queue } => {
                let theirs = queue_path(before, by_queue);
                for a in queue_path(before, &p.queue) {
                    if !theirs.contains(&a) {
                        *lost.entry(a).or_default() += gpu_held(p);
                    }
                }
            }
            EvictionReason::Preempt { .. } => {
                for a in queue_path(before, &p.queue) {
                    *preempted.entry(a).or_default() += gpu_held(p);
                }
            }
            _ => {}
        }
    }
    for (q, l) in lost {
        if l <= 0.0 {
            continue;
        }
        let st = d.fair_shares.iter().find(|x| x.queue == q).unwrap();
        let kept = st.allocated[0] + preempted.get(q).copied().unwrap_or(0.0);
        prop_assert!(
            kept + 1e-6 >= st.deserved[0],
            "reclaim took queue {} to {} GPU milli, below its deserved {}",
            q,
            kept,
            st.deserved[0]
        );
    }
    Ok(())
}

/// Under contention the whole cluster is shared out: the top queue's fair share is the
/// capacity (or all it asks for, when that is less), and its children's fair shares add up to
/// it.
fn check_fair_shares_fill_capacity(before: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let cap: f64 = before
        .nodes
        .iter()
        .map(|n| n.gpus.len() as f64 * 1000.0)
        .sum();
    let Some(root) = d.fair_shares.iter().find(|x| x.queue == "root") else {
        return Ok(()); // not a generated tree
    };
    prop_assert!(
        (root.fair_share[0] - cap.min(root.requested[0])).abs() < 1e-3,
        "root fair {} vs capacity {} and demand {}",
        root.fair_share[0],
        cap,
        root.requested[0]
    );
    let children: f64 = d
        .fair_shares
        .iter()
        .filter(|x| {
            before
                .queues
                .iter()
                .any(|q| q.name == x.queue && q.parent.as_deref() == Some("root"))
        })
        .map(|x| x.fair_share[0])
        .sum();
    prop_assert!(
        (children - root.fair_share[0]).abs() < 1e-3,
        "children's fair shares {} vs root's {}",
        children,
        root.fair_share[0]
    );
    Ok(())
}

/// Reclaims of one cycle as (victim's leaf queue, reclaiming queue).
fn reclaim_pairs(s: &Snapshot, d: &Decisions) -> BTreeSet<(String, String)> {
    d.evictions
        .iter()
        .filter_map(|e| match &e.reason {
            EvictionReason::Reclaim { by_queue } => {
                let p = s.pods.iter().find(|p| p.uid == e.pod)?;
                Some((p.queue.clone(), by_queue.clone()))
            }
            _ => None,
        })
        .collect()
}

/// A starving queue and its victims: `(GPUs per node, units of the victim queue b on it)`,
/// unit size in GPUs, whether units are 2-pod gangs, a's quota, b's quota, a's request.
#[derive(Clone, Debug)]
struct Starving {
    nodes: Vec<(u32, u32)>,
    unit: u32,
    gangs: bool,
    quota_a: u32,
    quota_b: u32,
    ask: u32,
}

fn starving() -> impl Strategy<Value = Starving> {
    (
        prop::collection::vec((prop_oneof![Just(4u32), Just(8)], 0..9u32), 1..4),
        prop_oneof![Just(1u32), Just(2), Just(4)],
        any::<bool>(),
        0..100u32,
        0..100u32,
        0..100u32,
    )
        .prop_map(|(nodes, unit, gangs, qa, qb, ask)| {
            let nodes: Vec<(u32, u32)> = nodes
                .into_iter()
                .map(|(g, u)| (g, u.min(g / unit)))
                .collect();
            let cap: u32 = nodes.iter().map(|n| n.0).sum();
            let biggest = nodes.iter().map(|n| n.0).max().unwrap_or(1);
            let quota_a = 1 + qa % (cap / 2).max(1);
            let quota_b = qb % (cap - quota_a + 1);
            let ask = 1 + ask % quota_a.min(biggest);
            Starving {
                nodes,
                unit,
                gangs: gangs && unit >= 2,
                quota_a,
                quota_b,
                ask,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_queue_below_its_deserved_quota_with_feasible_victims_is_placed_in_one_cycle(
        w in starving(),
    ) {
        let mut s = Snapshot::at(1000)
            .queue(Queue::new("a").gpu(f64::from(w.quota_a), 1.0, -1.0))
            .queue(Queue::new("b").gpu(f64::from(w.quota_b), 1.0, -1.0));
        let mut held = 0;
        for (n, &(g, units)) in w.nodes.iter().enumerate() {
            let node = format!("n{n}");
            s = s.node(Node::gpu_node(&node, g, "H100", 80_000));
            for u in 0..units {
                let name = format!("b-{n}-{u}");
                if w.gangs {
                    s = s.group(PodGroup::new(&name, "b", 2));
                    for i in 0..2 {
                        s = s.pod(Pod::new(&format!("{name}-{i}"), "b").gpus(w.unit / 2).group(&name).created(u64::from(u)).on_node(&node));
                    }
                } else {
                    s = s.pod(Pod::new(&name, "b").gpus(w.unit).created(u64::from(u)).on_node(&node));
                }
                held += w.unit;
            }
        }
        s = s.pod(Pod::new("a0", "a").gpus(w.ask).created(100));
        // b asks for nothing more, so it deserves min(quota, what it holds); a asks within
        // its quota, so it is inside its deserved quota.
        let deserved_b = w.quota_b.min(held);
        let feasible = w.nodes.iter().any(|&(g, units)| {
            let free = g - units * w.unit;
            let need = w.ask.saturating_sub(free).div_ceil(w.unit);
            w.ask <= g && need <= units && held - need * w.unit >= deserved_b
        });
        let d = schedule(&s, &CycleConfig::default());
        // (The bound pods carry no assignment, which `check_cycle`'s capacity check needs.)
        check_reclaim_floor(&s, &d)?;
        let placed = d.bindings.iter().any(|b| b.pod == "a0");
        // Consolidation may place it where the victims alone could not.
        prop_assert!(placed || !feasible, "{:?} {:?} {:?}", w, d.evictions, d.pending);
    }

    #[test]
    fn a_reclaim_never_triggers_a_counter_reclaim(
        nodes in prop::collection::vec((prop_oneof![Just(0u32), Just(1), Just(2), Just(4), Just(8)], any::<bool>()), 1..5),
        limits in prop::collection::vec(prop_oneof![Just(-1i32), 0..6i32], 3),
        first in prop::collection::vec(pod_spec(), 0..20),
        second in prop::collection::vec(pod_spec(), 0..20),
        mins in prop::collection::vec(1..4u32, 3),
    ) {
        // Work arrives in two waves; then the cluster is left to settle with nothing new.
        // (Only the reclaim invariants are checked here; `invariants_hold_over_two_cycles`
        // checks the rest.)
        let mut s = build(&nodes, &limits, &first, &mins);
        let d = schedule(&s, &CycleConfig::default());
        apply(&mut s, &d);
        let extra = build(&nodes, &limits, &second, &mins);
        for mut p in extra.pods {
            p.uid = format!("x{}", p.uid);
            p.name = p.uid.clone();
            s.pods.push(p);
        }
        let mut earlier: BTreeSet<(String, String)> = BTreeSet::new();
        for _ in 0..3 {
            let d = schedule(&s, &CycleConfig::default());
            let pairs = reclaim_pairs(&s, &d);
            for (victim, by) in &pairs {
                prop_assert!(
                    !earlier.contains(&(by.clone(), victim.clone())),
                    "{} reclaimed from {} right after {} reclaimed from {}: {:?}",
                    by, victim, victim, by, d.fair_shares
                );
            }
            earlier = pairs;
            check_reclaim_floor(&s, &d)?;
            apply(&mut s, &d);
        }
    }

    #[test]
    fn invariants_hold_over_two_cycles(
        nodes in prop::collection::vec((prop_oneof![Just(0u32), Just(1), Just(2), Just(4), Just(8)], any::<bool>()), 1..5),
        limits in prop::collection::vec(prop_oneof![Just(-1i32), 0..6i32], 3),
        first in prop::collection::vec(pod_spec(), 0..20),
        second in prop::collection::vec(pod_spec(), 0..20),
        mins in prop::collection::vec(1..4u32, 3),
    ) {
        let s1 = build(&nodes, &limits, &first, &mins);
        let d1 = schedule(&s1, &CycleConfig::default());
        let mut s2 = check_cycle(&s1, &d1)?;
        // More work arrives, with different priorities: reclaim and preemption get exercised.
        let extra = build(&nodes, &limits, &second, &mins);
        for mut p in extra.pods {
            p.uid = format!("x{}", p.uid);
            p.name = p.uid.clone();
            s2.pods.push(p);
        }
        let d2 = schedule(&s2, &CycleConfig::default());
        check_cycle(&s2, &d2)?;
    }

    #[test]
    fn victims_respect_disruption_budgets(
        nodes in prop::collection::vec((prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], any::<bool>()), 1..5),
        limits in prop::collection::vec(prop_oneof![Just(-1i32), 0..6i32], 3),
        first in prop::collection::vec(pod_spec(), 1..20),
        second in prop::collection::vec(pod_spec(), 1..20),
        mins in prop::collection::vec(1..4u32, 3),
        allowed in prop::collection::vec(0..3u32, 4),
        overlap in any::<bool>(),
    ) {
        let s1 = build(&nodes, &limits, &first, &mins);
        let d1 = schedule(&s1, &CycleConfig::default());
        let mut s2 = check_cycle(&s1, &d1)?;
        // Every running pod may be a victim but for the budgets.
        for p in &mut s2.pods {
            p.preemptible = true;
            p.priority = 0;
        }
        // One budget per queue over its bound pods, and maybe one across every bound pod
        // (which then makes each of them unevictable).
        let bound: Vec<(String, String)> = s2
            .pods
            .iter()
            .filter(|p| p.placement.is_some())
            .map(|p| (p.uid.clone(), p.queue.clone()))
            .collect();
        for (q, &n) in allowed.iter().enumerate() {
            let queue = format!("q{q}");
            s2.disruption_budgets.push(tessera_core::model::DisruptionBudget {
                name: format!("ns/{queue}"),
                disruptions_allowed: n,
                pods: bound.iter().filter(|(_, bq)| *bq == queue).map(|(u, _)| u.clone()).collect(),
            });
        }
        if overlap {
            s2.disruption_budgets.push(tessera_core::model::DisruptionBudget {
                name: "ns/all".into(),
                disruptions_allowed: 100,
                pods: bound.iter().map(|(u, _)| u.clone()).collect(),
            });
        }
        let extra = build(&nodes, &limits, &second, &mins);
        for mut p in extra.pods {
            p.uid = format!("x{}", p.uid);
            p.name = p.uid.clone();
            p.priority += 100;
            s2.pods.push(p);
        }
        let d2 = schedule(&s2, &CycleConfig::default());
        check_cycle(&s2, &d2)?;
        // The victim search (reclaim, preemption, consolidation) never exceeds a budget; a
        // stale gang's eviction is not a victim choice.
        let chosen: Vec<&str> = d2
            .evictions
            .iter()
            .filter(|e| !matches!(e.reason, EvictionReason::GangBelowMinMember))
            .map(|e| e.pod.as_str())
            .collect();
        for b in &s2.disruption_budgets {
            let taken = chosen.iter().filter(|p| b.pods.iter().any(|u| u == *p)).count() as u32;
            prop_assert!(taken <= b.disruptions_allowed, "{} took {} of {}", b.name, taken, b.disruptions_allowed);
        }
        for p in &chosen {
            let covering = s2.disruption_budgets.iter().filter(|b| b.pods.iter().any(|u| u == p)).count();
            prop_assert!(covering <= 1, "{p} is covered by {covering} budgets and was evicted");
        }
    }

    #[test]
    fn fair_shares_sum_to_capacity_under_contention(
        quotas in prop::collection::vec((0..50u32, 1..5u32, 0..2usize), 2..7),
        cap in 1..200u32,
    ) {
        let mut qs = vec![Queue::new("p0").gpu(0.0, 1.0, -1.0), Queue::new("p1").gpu(0.0, 2.0, -1.0)];
        for (i, &(q, w, parent)) in quotas.iter().enumerate() {
            qs.push(Queue::new(&format!("l{i}")).parent(&format!("p{parent}")).gpu(f64::from(q), f64::from(w), -1.0));
        }
        let tree = QueueTree::build(&qs);
        let capacity = [f64::from(cap) * 1000.0, 0.0, 0.0];
        let demand: Vec<[f64; 3]> = qs.iter().map(|_| [1e12, 0.0, 0.0]).collect();
        let shares = fair_shares(&tree, capacity, &demand);
        let leaf_sum: f64 = (0..qs.len()).filter(|&i| tree.nodes[i].is_leaf() && tree.nodes[i].parent.is_some()).map(|i| shares[i].fair[0]).sum();
        let empty_parents = (0..2).filter(|&i| tree.nodes[i].is_leaf()).map(|i| shares[i].fair[0]).sum::<f64>();
        prop_assert!((leaf_sum + empty_parents - capacity[0]).abs() < 1e-6 * capacity[0].max(1.0), "sum {} vs {}", leaf_sum + empty_parents, capacity[0]);
        for sh in &shares {
            prop_assert!(sh.fair[0] + 1e-9 >= sh.deserved[0]);
        }
    }
}
