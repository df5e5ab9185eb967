//! Scenario tests for each action, written as small tables: cluster, queues, pods → expected
//! decisions.

use tessera_core::cycle::{CycleConfig, Decisions, EvictionReason, Reason, schedule};
use tessera_core::model::{InputError, Node, Pod, PodGroup, Queue, Snapshot};

fn cluster(nodes: &[(&str, u32)]) -> Snapshot {
    let mut s = Snapshot::at(1000).queue(Queue::new("default"));
    for &(n, g) in nodes {
        s = s.node(Node::gpu_node(n, g, "H100", 80_000));
    }
    s
}

fn bound(d: &Decisions) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = d
        .bindings
        .iter()
        .map(|b| (b.pod.clone(), b.node.clone()))
        .collect();
    v.sort();
    v
}

fn bound_pods(d: &Decisions) -> Vec<&str> {
    let mut v: Vec<&str> = d.bindings.iter().map(|b| b.pod.as_str()).collect();
    v.sort();
    v
}

fn evicted(d: &Decisions) -> Vec<(&str, EvictionReason)> {
    let mut v: Vec<(&str, EvictionReason)> = d
        .evictions
        .iter()
        .map(|e| (e.pod.as_str(), e.reason.clone()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

fn pending_msg<'a>(d: &'a Decisions, uid: &str) -> &'a str {
    d.pending
        .iter()
        .find(|p| p.pod == uid)
        .map(|p| p.message.as_str())
        .unwrap_or("<not pending>")
}

fn run(s: &Snapshot) -> Decisions {
    schedule(s, &CycleConfig::default())
}

#[test]
fn allocate_packs_fractions_on_one_gpu() {
    // | node | GPUs |      pods: four 0.25 fractions → all on the same GPU of n1
    let s = cluster(&[("n1", 2)])
        .pod(Pod::new("a", "default").fraction(250))
        .pod(Pod::new("b", "default").fraction(250))
        .pod(Pod::new("c", "default").fraction(250))
        .pod(Pod::new("d", "default").fraction(250));
    let d = run(&s);
    assert_eq!(d.bindings.len(), 4);
    let gpus: Vec<&str> = d
        .bindings
        .iter()
        .map(|b| b.assignment.containers[0].gpus[0].uuid.as_str())
        .collect();
    assert!(gpus.iter().all(|g| *g == gpus[0]), "{gpus:?}");
    let slice = &d.bindings[0].assignment.containers[0].gpus[0];
    assert_eq!((slice.compute_milli, slice.memory_mib), (250, 20_000));
}

#[test]
fn gang_is_all_or_nothing() {
    // | nodes: n1, n2, n3 with 4 GPUs; one GPU of n3 busy | gang g1: 3 pods × 4 GPUs (needs
    // 12, 11 free) → nothing, after a tentative partial placement is rolled back
    // | gang g2: 2 pods × 4 GPUs → both bound
    let mut s = cluster(&[("n1", 4), ("n2", 4), ("n3", 4)])
        .pod(
            Pod::new("busy", "default")
                .gpus(1)
                .priority(200)
                .on_node("n3"),
        )
        .group(PodGroup::new("g1", "default", 3))
        .group(PodGroup::new("g2", "default", 2));
    for i in 0..3 {
        s = s.pod(
            Pod::new(&format!("g1-{i}"), "default")
                .gpus(4)
                .group("g1")
                .created(1),
        );
    }
    for i in 0..2 {
        s = s.pod(
            Pod::new(&format!("g2-{i}"), "default")
                .gpus(4)
                .group("g2")
                .created(2),
        );
    }
    let d = run(&s);
    assert_eq!(bound_pods(&d), vec!["g2-0", "g2-1"]);
    assert_eq!(
        pending_msg(&d, "g1-0"),
        "0/3 nodes are available: 3 node(s) had fewer than 4 free GPUs. gang default/g1: its 3 pods do not fit together"
    );
}

#[test]
fn elastic_members_fill_idle_capacity_one_by_one() {
    // | n1 4 GPUs | group min 2 max 4, five 1-GPU pods → four bound, fifth beyond max
    let mut s = cluster(&[("n1", 4)]).group(PodGroup::new("e", "default", 2).max(4));
    for i in 0..5 {
        s = s.pod(
            Pod::new(&format!("e-{i}"), "default")
                .gpus(1)
                .group("e")
                .created(i),
        );
    }
    let d = run(&s);
    assert_eq!(d.bindings.len(), 4);
    assert!(pending_msg(&d, "e-4").contains("maxMember=4"));
}

fn two_queue_cluster() -> Snapshot {
    // | n1 4 GPUs | queue a quota 2, queue b quota 2 | a runs 4 pods, b wants 2
    let mut s = Snapshot::at(1000)
        .node(Node::gpu_node("n1", 4, "H100", 80_000))
        .queue(Queue::new("a").gpu(2.0, 1.0, -1.0))
        .queue(Queue::new("b").gpu(2.0, 1.0, -1.0));
    for i in 0..4 {
        s = s.pod(
            Pod::new(&format!("a{i}"), "a")
                .gpus(1)
                .created(i)
                .on_node("n1"),
        );
    }
    s
}

#[test]
fn reclaim_restores_fair_share() {
    let s = two_queue_cluster()
        .pod(Pod::new("b0", "b").gpus(1).created(10))
        .pod(Pod::new("b1", "b").gpus(1).created(11))
        .pod(Pod::new("b2", "b").gpus(1).created(12));
    let d = run(&s);
    // a falls to its fair share 2 (youngest first), b gets 2; b2 would push b over its share.
    let by_b = EvictionReason::Reclaim {
        by_queue: "b".into(),
    };
    assert_eq!(evicted(&d), vec![("a2", by_b.clone()), ("a3", by_b)]);
    assert_eq!(bound_pods(&d), vec!["b0", "b1"]);
    assert!(d.bindings.iter().all(|b| b.after_evictions));
}

#[test]
fn reclaim_never_evicts_non_preemptible_nor_below_deserved() {
    let mut s = two_queue_cluster().pod(Pod::new("b0", "b").gpus(1));
    for p in &mut s.pods {
        if p.queue == "a" {
            p.preemptible = false;
        }
    }
    assert!(run(&s).evictions.is_empty());
    // Deserved: a's quota is 4 of 4 → b cannot take anything even though b has quota 0.
    let mut s = two_queue_cluster().pod(Pod::new("b0", "b").gpus(1));
    s.queues[0] = Queue::new("a").gpu(4.0, 1.0, -1.0);
    s.queues[1] = Queue::new("b").gpu(0.0, 1.0, -1.0);
    assert!(run(&s).evictions.is_empty());
}

#[test]
fn reclaim_takes_elastic_pods_first() {
    // | n1 6 GPUs | a (quota 3): gang ga min 2 running 4 pods (priority 50) + solo (priority 0)
    // | b (quota 3) wants 2 → fair a = 4, b = 2: one GPU is free, one must come back from a.
    // Priority order alone would pick solo; elastic members go first.
    let mut s = Snapshot::at(1000)
        .node(Node::gpu_node("n1", 6, "H100", 80_000))
        .queue(Queue::new("a").gpu(3.0, 1.0, -1.0))
        .queue(Queue::new("b").gpu(3.0, 1.0, -1.0))
        .group(PodGroup::new("ga", "a", 2).max(4));
    for i in 0..4 {
        s = s.pod(
            Pod::new(&format!("ga{i}"), "a")
                .gpus(1)
                .priority(50)
                .group("ga")
                .created(i)
                .on_node("n1"),
        );
    }
    s = s.pod(
        Pod::new("solo", "a")
            .gpus(1)
            .priority(0)
            .created(9)
            .on_node("n1"),
    );
    s = s
        .pod(Pod::new("b0", "b").gpus(1))
        .pod(Pod::new("b1", "b").gpus(1));
    let d = run(&s);
    let by_b = EvictionReason::Reclaim {
        by_queue: "b".into(),
    };
    assert_eq!(evicted(&d), vec![("ga3", by_b)]);
    assert_eq!(bound_pods(&d), vec!["b0", "b1"]);
}

#[test]
fn preempt_inside_a_queue_by_priority() {
    // | n1 2 GPUs | default queue runs two priority-10 pods; a priority-50 pod arrives.
    let s = cluster(&[("n1", 2)])
        .pod(
            Pod::new("low0", "default")
                .gpus(1)
                .priority(10)
                .created(1)
                .on_node("n1"),
        )
        .pod(
            Pod::new("low1", "default")
                .gpus(1)
                .priority(10)
                .created(2)
                .on_node("n1"),
        )
        .pod(Pod::new("high", "default").gpus(1).priority(50).created(3))
        .pod(Pod::new("same", "default").gpus(1).priority(10).created(4));
    let d = run(&s);
    assert_eq!(
        evicted(&d),
        vec![(
            "low1",
            EvictionReason::Preempt {
                by_pod: "high".into()
            }
        )]
    );
    assert_eq!(bound(&d), vec![("high".into(), "n1".into())]);
    assert!(
        pending_msg(&d, "same").starts_with("0/1 nodes"),
        "{}",
        pending_msg(&d, "same")
    );
}

#[test]
fn consolidate_moves_fractions_to_free_a_node() {
    // | n1 2 GPUs: 0.5 on GPU0 | n2 2 GPUs: 0.5 on GPU1 | a 2-GPU pod needs a whole node.
    let fraction = |uid: &str, node: &str| {
        Pod::new(uid, "default")
            .controlled_by(&format!("ReplicaSet {uid}"))
            .fraction(500)
            .on_node(node)
    };
    let s = cluster(&[("n1", 2), ("n2", 2)])
        .pod(fraction("f1", "n1"))
        .pod(fraction("f2", "n2"))
        .pod(Pod::new("big", "default").gpus(2).priority(50));
    let d = run(&s);
    assert_eq!(d.evictions.len(), 1, "{:?}", d.evictions);
    let EvictionReason::Consolidate { moved_to } = &d.evictions[0].reason else {
        panic!("{:?}", d.evictions)
    };
    assert_eq!(d.bindings.len(), 1);
    assert_ne!(&d.bindings[0].node, moved_to);
}

#[test]
fn bare_pods_are_never_consolidated() {
    // The same cluster, but one fraction has no controller: nothing would recreate it, so it is
    // not moved, and the other one alone cannot free a node.
    let s = cluster(&[("n1", 2), ("n2", 2)])
        .pod(Pod::new("bare", "default").fraction(500).on_node("n1"))
        .pod(
            Pod::new("owned", "default")
                .controlled_by("ReplicaSet web")
                .fraction(500)
                .on_node("n2"),
        )
        .pod(Pod::new("big", "default").gpus(2).priority(50));
    let d = run(&s);
    let bare_evicted = d.evictions.iter().any(|e| e.pod == "bare");
    assert!(!bare_evicted, "{:?}", d.evictions);
    // The controlled one is moved to free n2 for the big pod.
    let EvictionReason::Consolidate { moved_to } = &d.evictions[0].reason else {
        panic!("{:?}", d.evictions)
    };
    assert_eq!(
        (d.evictions.len(), d.evictions[0].pod.as_str()),
        (1, "owned")
    );
    assert_eq!(
        (moved_to.as_str(), d.bindings[0].node.as_str()),
        ("n1", "n2")
    );
}

#[test]
fn consolidate_only_when_every_moved_pod_fits_elsewhere() {
    // Both nodes hold 0.6: moving one would not fit next to the other (1.2 > 1).
    let s = cluster(&[("n1", 1), ("n2", 1)])
        .pod(
            Pod::new("f1", "default")
                .fraction(600)
                .preemptible(true)
                .on_node("n1"),
        )
        .pod(
            Pod::new("f2", "default")
                .fraction(600)
                .preemptible(true)
                .on_node("n2"),
        )
        .pod(Pod::new("big", "default").gpus(1).priority(0));
    let d = run(&s);
    assert!(
        d.evictions
            .iter()
            .all(|e| !matches!(e.reason, EvictionReason::Consolidate { .. }))
    );
}

#[test]
fn stale_gang_is_evicted_after_grace() {
    // | n1 2 GPUs, both used by an unrelated non-preemptible pod and gang member |
    let mut g = PodGroup::new("g", "default", 3);
    g.below_min_member_since = Some(600);
    let base = cluster(&[("n1", 2)])
        .group(g)
        .pod(Pod::new("m0", "default").gpus(1).group("g").on_node("n1"))
        .pod(Pod::new("x", "default").gpus(1).priority(200).on_node("n1"))
        .pod(Pod::new("m1", "default").gpus(1).group("g"))
        .pod(Pod::new("m2", "default").gpus(1).group("g"));
    // now=1000, since 600: 400 s > 300 s grace.
    let d = run(&base);
    assert_eq!(
        evicted(&d),
        vec![("m0", EvictionReason::GangBelowMinMember)]
    );
    assert!(d.gangs_below_min.is_empty());
    // Within grace nothing happens, and the group is reported below minMember.
    let mut early = base.clone();
    early.now = 700;
    let d = run(&early);
    assert!(d.evictions.is_empty());
    assert_eq!(d.gangs_below_min, vec!["default/g".to_string()]);
}

#[test]
fn topology_required_keeps_a_gang_in_one_rack() {
    // | rack r1: n1, n2 (4 GPUs, n2 half used) | rack r2: n3, n4 (4 GPUs free) |
    let s = Snapshot::at(0)
        .queue(Queue::new("default"))
        .levels(&["rack"])
        .node(Node::gpu_node("n1", 4, "H100", 80_000).label("rack", "r1"))
        .node(Node::gpu_node("n2", 4, "H100", 80_000).label("rack", "r1"))
        .node(Node::gpu_node("n3", 4, "H100", 80_000).label("rack", "r2"))
        .node(Node::gpu_node("n4", 4, "H100", 80_000).label("rack", "r2"))
        .pod(
            Pod::new("busy", "default")
                .gpus(2)
                .priority(200)
                .on_node("n2"),
        )
        .group(PodGroup::new("g", "default", 2).required("rack"))
        .pod(Pod::new("g0", "default").gpus(4).group("g"))
        .pod(Pod::new("g1", "default").gpus(4).group("g"));
    let d = run(&s);
    let nodes: Vec<String> = bound(&d).into_iter().map(|b| b.1).collect();
    assert_eq!(nodes, vec!["n3".to_string(), "n4".to_string()]);
}

#[test]
fn nvlink_sets_for_multi_gpu_and_pairs_kept_for_singles() {
    // | n1: 8 GPUs in NVLink pairs, GPU 0 used |
    let s = Snapshot::at(0)
        .queue(Queue::new("default"))
        .node(Node::gpu_node("n1", 8, "H100", 80_000).nvlink_islands(2))
        .pod(
            Pod::new("used", "default")
                .gpus(1)
                .priority(200)
                .on_node("n1"),
        )
        .pod(Pod::new("one", "default").gpus(1).created(1))
        .pod(Pod::new("two", "default").gpus(2).created(2));
    let d = run(&s);
    let uuids = |pod: &str| -> Vec<String> {
        d.bindings
            .iter()
            .find(|b| b.pod == pod)
            .unwrap()
            .assignment
            .containers[0]
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect()
    };
    // The single takes GPU 1 (its pair is already broken), the pair gets one island.
    assert_eq!(uuids("one"), vec!["GPU-n1-1"]);
    assert_eq!(uuids("two"), vec!["GPU-n1-2", "GPU-n1-3"]);
}

#[test]
fn queue_limit_is_a_hard_cap() {
    let s = Snapshot::at(0)
        .node(Node::gpu_node("n1", 8, "H100", 80_000))
        .queue(Queue::new("team-a").gpu(0.0, 1.0, 2.0))
        .pod(Pod::new("p0", "team-a").gpus(1).created(0))
        .pod(Pod::new("p1", "team-a").gpus(1).created(1))
        .pod(Pod::new("p2", "team-a").gpus(1).created(2));
    let d = run(&s);
    assert_eq!(d.bindings.len(), 2);
    assert!(
        pending_msg(&d, "p2").contains("queue team-a over limit gpu=2"),
        "{}",
        pending_msg(&d, "p2")
    );
}

#[test]
fn bad_input_stays_pending_with_a_reason_naming_the_field() {
    let mut both = Pod::new("both", "default").fraction(500);
    both.input_errors.push(InputError {
        field: "tessera.dev/gpu-memory".into(),
        message: "set either tessera.dev/gpu-fraction or tessera.dev/gpu-memory, not both".into(),
    });
    let s = cluster(&[("n1", 2)])
        .pod(Pod::new("frac", "default").fraction(1500))
        .pod(Pod::new("mem", "default").gpu_memory(1, 200_000))
        .pod(Pod::new("q", "nope").gpus(1))
        .pod(both)
        .group(PodGroup::new("huge", "default", 3))
        .pod(Pod::new("h0", "default").gpus(2).group("huge"))
        .pod(Pod::new("h1", "default").gpus(2).group("huge"))
        .pod(Pod::new("h2", "default").gpus(2).group("huge"))
        .pod(Pod::new("ok", "default").gpus(1));
    let d = run(&s);
    assert_eq!(bound_pods(&d), vec!["ok"]);
    assert!(pending_msg(&d, "frac").contains("tessera.dev/gpu-fraction"));
    assert!(pending_msg(&d, "frac").contains("1.5"));
    assert!(pending_msg(&d, "mem").contains("larger than any GPU"));
    assert!(pending_msg(&d, "q").contains("queue nope does not exist"));
    assert!(pending_msg(&d, "both").contains("not both"));
    assert!(
        pending_msg(&d, "h0").contains("needs 6 GPUs"),
        "{}",
        pending_msg(&d, "h0")
    );
    let r = &d.pending.iter().find(|p| p.pod == "frac").unwrap().reasons;
    assert!(
        matches!(&r[0].0, Reason::InvalidInput { field, .. } if field == "tessera.dev/gpu-fraction")
    );
}

#[test]
fn explanation_counts_nodes_per_failed_constraint() {
    // Two nodes with one GPU nearly full on memory, one CPU-starved node.
    let s = Snapshot::at(0)
        .queue(Queue::new("default"))
        .node(Node::gpu_node("n1", 1, "A100", 40_000))
        .node(Node::gpu_node("n2", 1, "A100", 40_000))
        .node(Node::gpu_node("n3", 1, "A100", 40_000).with_cpu(1000, 4096))
        .pod(
            Pod::new("hog1", "default")
                .gpu_memory(1, 35_000)
                .priority(200)
                .on_node("n1"),
        )
        .pod(
            Pod::new("hog2", "default")
                .gpu_memory(1, 35_000)
                .priority(200)
                .on_node("n2"),
        )
        .pod(
            Pod::new("want", "default")
                .gpu_memory(1, 10_000)
                .cpu(2000, 1024),
        );
    let d = run(&s);
    let m = pending_msg(&d, "want");
    assert!(
        m.starts_with(
            "0/3 nodes are available: 2 node(s) had no GPU with enough free compute share, 1 Insufficient cpu."
        ),
        "{m}"
    );
}

#[test]
fn other_schedulers_pods_consume_capacity() {
    let mut foreign = Pod::new("foreign", "nowhere").gpus(2).on_node("n1");
    foreign.owned_by_other_scheduler = true;
    let s = cluster(&[("n1", 2)])
        .pod(foreign)
        .pod(Pod::new("mine", "default").gpus(1));
    let d = run(&s);
    assert!(d.bindings.is_empty());
    assert!(d.evictions.is_empty());
}

#[test]
fn reclaim_between_siblings_of_a_full_parent() {
    // | n1 4 GPUs | org (quota 4) → x (quota 2), y (quota 2) | x runs 4 pods, y wants 2.
    let mut s = Snapshot::at(0)
        .node(Node::gpu_node("n1", 4, "H100", 80_000))
        .queue(Queue::new("org").gpu(4.0, 1.0, -1.0))
        .queue(Queue::new("x").parent("org").gpu(2.0, 1.0, -1.0))
        .queue(Queue::new("y").parent("org").gpu(2.0, 1.0, -1.0));
    for i in 0..4 {
        s = s.pod(
            Pod::new(&format!("x{i}"), "x")
                .gpus(1)
                .created(i)
                .on_node("n1"),
        );
    }
    s = s
        .pod(Pod::new("y0", "y").gpus(1))
        .pod(Pod::new("y1", "y").gpus(1));
    let d = run(&s);
    assert_eq!(d.evictions.len(), 2, "{:?}", d.pending);
    assert_eq!(bound_pods(&d), vec!["y0", "y1"]);
}

#[test]
fn reclaim_across_subtrees_respects_parent_fair_share() {
    // | n1 4 GPUs | a (quota 2) → a1 | b (quota 2) → b1, b2 | a1 runs 4; b1 and b2 want 2 each:
    // b's subtree may take 2 back in total, not 4.
    let mut s = Snapshot::at(0)
        .node(Node::gpu_node("n1", 4, "H100", 80_000))
        .queue(Queue::new("a").gpu(2.0, 1.0, -1.0))
        .queue(Queue::new("a1").parent("a"))
        .queue(Queue::new("b").gpu(2.0, 1.0, -1.0))
        .queue(Queue::new("b1").parent("b"))
        .queue(Queue::new("b2").parent("b"));
    for i in 0..4 {
        s = s.pod(
            Pod::new(&format!("a{i}"), "a1")
                .gpus(1)
                .created(i)
                .on_node("n1"),
        );
    }
    for q in ["b1", "b2"] {
        s = s
            .pod(Pod::new(&format!("{q}-0"), q).gpus(1))
            .pod(Pod::new(&format!("{q}-1"), q).gpus(1));
    }
    let d = run(&s);
    assert_eq!(d.evictions.len(), 2, "{:?}", d.evictions);
    assert_eq!(d.bindings.len(), 2);
}

#[test]
fn topology_preferred_packs_a_gang_into_one_rack_when_it_can() {
    // | r1: n1 (4 GPUs) | r2: n2, n3 (4 GPUs) | gang 2 × 3 GPUs preferring one rack → r2.
    let s = Snapshot::at(0)
        .queue(Queue::new("default"))
        .levels(&["rack"])
        .node(Node::gpu_node("n1", 4, "H100", 80_000).label("rack", "r1"))
        .node(Node::gpu_node("n2", 4, "H100", 80_000).label("rack", "r2"))
        .node(Node::gpu_node("n3", 4, "H100", 80_000).label("rack", "r2"))
        .group(PodGroup::new("g", "default", 2).preferred("rack"))
        .pod(Pod::new("g0", "default").gpus(3).group("g"))
        .pod(Pod::new("g1", "default").gpus(3).group("g"));
    let nodes: Vec<String> = bound(&run(&s)).into_iter().map(|b| b.1).collect();
    assert_eq!(nodes, vec!["n2".to_string(), "n3".to_string()]);
    // When no single rack fits, the gang still runs across racks.
    let mut s2 = s.clone();
    s2.nodes.truncate(2);
    assert_eq!(run(&s2).bindings.len(), 2);
}

#[test]
fn seeded_tie_break_is_deterministic() {
    let mut s = Snapshot::at(0).queue(Queue::new("default"));
    for n in 0..20 {
        s = s.node(Node::gpu_node(&format!("n{n:02}"), 4, "T4", 16_000));
    }
    for i in 0..30 {
        s = s.pod(
            Pod::new(&format!("p{i}"), "default")
                .fraction(100 + 30 * (i % 7))
                .created(u64::from(i)),
        );
    }
    let cfg = CycleConfig {
        shuffle_ties: true,
        seed: 42,
        ..CycleConfig::default()
    };
    let a = schedule(&s, &cfg);
    assert_eq!(a, schedule(&s, &cfg));
    assert_eq!(a.bindings.len(), 30);
    let json = serde_json::to_string(&a.bindings[0].assignment).unwrap();
    assert!(json.contains("\"compute_milli\""), "{json}");
}

#[test]
fn reclaim_evicts_a_gang_whole_or_not_at_all() {
    // | n1 2 GPUs | a (quota 0) runs gang ga (min 2) on both GPUs | b (quota 2) wants 2.
    let base = Snapshot::at(0)
        .node(Node::gpu_node("n1", 2, "H100", 80_000))
        .queue(Queue::new("a").gpu(0.0, 1.0, -1.0))
        .queue(Queue::new("b").gpu(2.0, 1.0, -1.0))
        .group(PodGroup::new("ga", "a", 2))
        .pod(Pod::new("ga0", "a").gpus(1).group("ga").on_node("n1"))
        .pod(Pod::new("ga1", "a").gpus(1).group("ga").on_node("n1"));
    let s = base
        .clone()
        .pod(Pod::new("b0", "b").gpus(1))
        .pod(Pod::new("b1", "b").gpus(1));
    let d = run(&s);
    let by_b = EvictionReason::Reclaim {
        by_queue: "b".into(),
    };
    assert_eq!(evicted(&d), vec![("ga0", by_b.clone()), ("ga1", by_b)]);
    assert_eq!(bound_pods(&d), vec!["b0", "b1"]);
    // With quota 1 each, a's fair share is 1: evicting the gang would take a to 0, and evicting
    // one member would break the gang, so nothing happens.
    let mut s = base.pod(Pod::new("b0", "b").gpus(1));
    s.queues[0] = Queue::new("a").gpu(1.0, 1.0, -1.0);
    s.queues[1] = Queue::new("b").gpu(1.0, 1.0, -1.0);
    assert!(run(&s).evictions.is_empty());
}

#[test]
fn mig_pods_only_on_mig_gpus_and_back() {
    use tessera_core::model::{Isolation, MigInstance};
    let mut node = Node::gpu_node("n1", 2, "A100", 40_000);
    node.gpus[0].mig = Some(vec![MigInstance {
        profile: "3g.20gb".into(),
        memory_mib: 20_000,
        compute_milli: 500,
    }]);
    let mut mig = Pod::new("mig", "default").fraction(500);
    mig.isolation = Isolation::Mig;
    let s = Snapshot::at(0)
        .queue(Queue::new("default"))
        .node(node)
        .pod(mig)
        .pod(Pod::new("plain", "default").fraction(500).created(1));
    let d = run(&s);
    let gpu_of = |pod: &str| {
        d.bindings
            .iter()
            .find(|b| b.pod == pod)
            .unwrap()
            .assignment
            .containers[0]
            .gpus[0]
            .uuid
            .clone()
    };
    assert_eq!(gpu_of("mig"), "GPU-n1-0");
    assert_eq!(gpu_of("plain"), "GPU-n1-1");
}

#[test]
fn cpu_only_pods_keep_cpu_free_where_gpus_need_it() {
    // | gpu: 4 GPUs, 16 cores | cpu: no GPU, 16 cores | the mix has 1-GPU pods needing 12 cores:
    // a 8-core CPU-only pod on the GPU node would strand its GPUs, so it goes to the CPU node.
    let mut s = Snapshot::at(0)
        .queue(Queue::new("default"))
        .node(Node::gpu_node("gpu", 4, "T4", 16_000).with_cpu(16_000, 65_536))
        .node(Node::cpu_node("zcpu", 16_000, 65_536))
        .pod(Pod::new("cpu-pod", "default").cpu(8_000, 1024));
    // Pods that shape the mix but cannot be placed (other queue without quota, limit 0).
    s = s.queue(Queue::new("shapes").gpu(0.0, 1.0, 0.0));
    for i in 0..10 {
        s = s.pod(
            Pod::new(&format!("shape{i}"), "shapes")
                .gpus(1)
                .cpu(12_000, 1024),
        );
    }
    let d = run(&s);
    assert_eq!(bound(&d), vec![("cpu-pod".to_string(), "zcpu".to_string())]);
}

#[test]
fn empty_and_degenerate_snapshots_do_not_panic() {
    assert_eq!(run(&Snapshot::default()), Decisions::default());
    // No nodes, no queues, a pod bound to a node that no longer exists, a zero-size group.
    let mut g = PodGroup::new("g", "default", 0);
    g.topology_required = Some("nowhere".into());
    let s = Snapshot::at(5)
        .group(g)
        .pod(Pod::new("ghost", "default").gpus(1).on_node("gone"))
        .pod(Pod::new("p", "default").gpus(1).group("g"))
        .pod(Pod::new("c", "default").cpu(1, 1));
    let d = run(&s);
    assert!(d.bindings.is_empty());
    assert_eq!(d.pending.len(), 2);
    assert_eq!(pending_msg(&d, "p"), "no nodes available to schedule pods.");
    assert!(pending_msg(&d, "c").contains("queue default does not exist"));
}

/// The bundled sample's shape at the moment its inference burst arrives: research-llm holds
/// every GPU with a 2-node pretraining gang and an elastic fine-tuning group (priority 0, pods
/// with CPU and memory requests), product-serving waits below its fair share.
fn sample_burst(finetune_pods: u32, serve_pods: u32) -> Snapshot {
    let mut s = Snapshot::at(1000)
        .node(Node::gpu_node("h1", 8, "H100", 80_000).with_cpu(128_000, 2 << 20))
        .node(Node::gpu_node("h2", 8, "H100", 80_000).with_cpu(128_000, 2 << 20))
        .node(Node::gpu_node("l1", 4, "L40S", 48_000).with_cpu(64_000, 512 << 10))
        .node(Node::gpu_node("l2", 4, "L40S", 48_000).with_cpu(64_000, 512 << 10))
        .queue(Queue::new("research").gpu(16.0, 1.0, -1.0))
        .queue(
            Queue::new("research-llm")
                .parent("research")
                .gpu(12.0, 2.0, -1.0),
        )
        .queue(
            Queue::new("research-vision")
                .parent("research")
                .gpu(4.0, 1.0, -1.0),
        )
        .queue(Queue::new("product").gpu(20.0, 1.0, -1.0))
        .queue(
            Queue::new("product-serving")
                .parent("product")
                .gpu(12.0, 1.0, -1.0),
        )
        .queue(
            Queue::new("product-batch")
                .parent("product")
                .gpu(8.0, 1.0, 16.0),
        )
        .group(PodGroup::new("pretrain", "research-llm", 2))
        .group(PodGroup::new("finetune", "research-llm", 2).max(4));
    for (i, n) in ["h1", "h2"].iter().enumerate() {
        s = s.pod(
            Pod::new(&format!("pretrain-{i}"), "research-llm")
                .gpus(8)
                .cpu(64_000, 512 << 10)
                .group("pretrain")
                .created(i as u64)
                .on_node(n),
        );
    }
    for i in 0..finetune_pods {
        s = s.pod(
            Pod::new(&format!("finetune-{i}"), "research-llm")
                .gpus(2)
                .cpu(16_000, 128 << 10)
                .group("finetune")
                .created(300 + u64::from(i))
                .on_node(if i < 2 { "l1" } else { "l2" }),
        );
    }
    for i in 0..serve_pods {
        s = s.pod(
            Pod::new(&format!("serve-{i}"), "product-serving")
                .gpu_memory(1, 20_480)
                .cpu(4_000, 16 << 10)
                .priority(200)
                .created(900 + u64::from(i)),
        );
    }
    s
}

#[test]
fn reclaim_lets_a_queue_below_its_deserved_quota_in_at_once() {
    // research-llm holds 24 of 24 GPUs against a deserved 12; eight serving pods (20 GiB each)
    // are counted as 0.427 of the 48 GB L40S they fit on, so product-serving asks for 3.4 GPUs,
    // within its deserved quota of 12: rule (a) may take research-llm down to its deserved
    // quota. Elastic fine-tuning pods go first; the node needing the fewest victims is emptied
    // and holds all eight pods. CPU and memory requests do not block it: the victims' CPU is
    // returned, the reclaimer's CPU is uncontended.
    let d = run(&sample_burst(4, 8));
    let by = EvictionReason::Reclaim {
        by_queue: "product-serving".into(),
    };
    assert_eq!(
        evicted(&d),
        vec![("finetune-0", by.clone()), ("finetune-1", by)]
    );
    let served = bound(&d);
    assert_eq!(served.len(), 8, "{:?}", d.pending);
    assert!(
        served
            .iter()
            .all(|(p, n)| p.starts_with("serve-") && n == "l1")
    );
    let st = d
        .fair_shares
        .iter()
        .find(|q| q.queue == "product-serving")
        .unwrap();
    assert_eq!(st.requested[0], 8.0 * 427.0, "{st:?}");
    assert_eq!(st.allocated[0], 8.0 * 427.0, "{st:?}");
}

#[test]
fn reclaim_takes_a_whole_gang_for_a_queue_below_its_deserved_quota() {
    // Only the two core fine-tuning pods remain: freeing GPUs means evicting the whole gang (4
    // GPUs), which takes research-llm from 20 GPUs below its fair share (~16.6) but not below
    // its deserved 12. product-serving is inside its deserved quota, so rule (a) applies: the
    // gang leaves whole and the serving pods start in this cycle, instead of waiting for batch
    // jobs to end.
    let mut s = sample_burst(2, 8);
    s.nodes.retain(|n| n.name != "l2");
    let d = run(&s);
    let by = EvictionReason::Reclaim {
        by_queue: "product-serving".into(),
    };
    assert_eq!(
        evicted(&d),
        vec![("finetune-0", by.clone()), ("finetune-1", by)]
    );
    assert_eq!(bound(&d).len(), 8, "{:?}", d.pending);
    let llm = d
        .fair_shares
        .iter()
        .find(|q| q.queue == "research-llm")
        .unwrap();
    assert!(llm.allocated[0] >= llm.deserved[0], "{llm:?}");
    assert!(llm.allocated[0] < llm.fair_share[0], "{llm:?}");
}

/// | n1 8 GPUs | a (quota `qa`), b (quota `qb`) | b runs two gangs of 2 pods × 2 GPUs (gb1 older
/// than gb2); a's pods are added by the caller.
pub(crate) fn b_runs_two_gangs(qa: f64, qb: f64) -> Snapshot {
    let mut s = Snapshot::at(1000)
        .node(Node::gpu_node("n1", 8, "H100", 80_000))
        .queue(Queue::new("a").gpu(qa, 1.0, -1.0))
        .queue(Queue::new("b").gpu(qb, 1.0, -1.0));
    for (g, t) in [("gb1", 1), ("gb2", 3)] {
        s = s.group(PodGroup::new(g, "b", 2));
        for i in 0..2 {
            s = s.pod(
                Pod::new(&format!("{g}-{i}"), "b")
                    .gpus(2)
                    .group(g)
                    .created(t + i)
                    .on_node("n1"),
            );
        }
    }
    s
}

#[test]
fn reclaim_rule_a_a_small_request_below_deserved_gets_a_gang_reclaimed() {
    // a and b deserve 4 each; b holds all 8 GPUs. a asking for 1 GPU has a fair share of 1 and
    // b one of 7, so b's fair share would forbid evicting a 4-GPU gang; but a is inside its
    // deserved quota and b stays at its own (8 - 4 = 4): the youngest gang leaves whole.
    let by_a = EvictionReason::Reclaim {
        by_queue: "a".into(),
    };
    let s = b_runs_two_gangs(4.0, 4.0).pod(Pod::new("a0", "a").gpus(1).created(10));
    let d = run(&s);
    assert_eq!(
        evicted(&d),
        vec![("gb2-0", by_a.clone()), ("gb2-1", by_a.clone())]
    );
    assert_eq!(bound_pods(&d), vec!["a0"]);
    // Asking for 4 (its whole deserved quota) gets the same at once.
    let s = b_runs_two_gangs(4.0, 4.0).pod(Pod::new("a0", "a").gpus(4).created(10));
    let d = run(&s);
    assert_eq!(evicted(&d), vec![("gb2-0", by_a.clone()), ("gb2-1", by_a)]);
    assert_eq!(bound_pods(&d), vec!["a0"]);
}

#[test]
fn reclaim_rule_a_never_takes_a_victim_below_its_deserved_quota() {
    // b deserves 6: evicting either gang leaves it 4 < 6, so a waits although it is inside its
    // own deserved quota, and says why.
    let s = b_runs_two_gangs(2.0, 6.0).pod(Pod::new("a0", "a").gpus(1).created(10));
    let d = run(&s);
    assert!(d.evictions.is_empty(), "{:?}", d.evictions);
    assert!(d.bindings.is_empty());
    assert!(
        pending_msg(&d, "a0").starts_with(
            "0/1 nodes are available: 1 node(s) had no free GPU. queue a is below its fair share, but no preemptible pod of a queue above its own can be evicted for it without taking that queue below its deserved quota"
        ),
        "{}",
        pending_msg(&d, "a0")
    );
}

/// | n1 8 GPUs | a (quota `qa`) runs 2 pods of 1 GPU and wants 1 more | b (quota 2) runs a
/// 2-GPU pod and a gang of 2 × 2 GPUs.
fn a_at_two_b_at_six(qa: f64) -> Snapshot {
    let mut s = Snapshot::at(1000)
        .node(Node::gpu_node("n1", 8, "H100", 80_000))
        .queue(Queue::new("a").gpu(qa, 1.0, -1.0))
        .queue(Queue::new("b").gpu(2.0, 1.0, -1.0))
        .group(PodGroup::new("gb", "b", 2))
        .pod(Pod::new("bx", "b").gpus(2).created(5).on_node("n1"));
    for i in 0..2 {
        s = s
            .pod(
                Pod::new(&format!("a{i}"), "a")
                    .gpus(1)
                    .created(i)
                    .on_node("n1"),
            )
            .pod(
                Pod::new(&format!("gb-{i}"), "b")
                    .gpus(2)
                    .group("gb")
                    .created(2 + i)
                    .on_node("n1"),
            );
    }
    s.pod(Pod::new("a2", "a").gpus(1).created(10))
}

#[test]
fn reclaim_rule_b_keeps_the_victims_fair_share_once_past_deserved() {
    // a (quota 2) already holds its deserved 2 and asks for a third GPU: it is above its
    // deserved quota but below its fair share (3), so only rule (b) applies and b must keep
    // its fair share of 5. Evicting bx leaves b 4, the gang leaves it 2: a waits.
    let d = run(&a_at_two_b_at_six(2.0));
    assert!(d.evictions.is_empty(), "{:?}", d.evictions);
    let shares: Vec<(String, f64, f64)> = d
        .fair_shares
        .iter()
        .map(|q| (q.queue.clone(), q.deserved[0], q.fair_share[0]))
        .collect();
    assert_eq!(
        shares,
        vec![
            ("a".to_string(), 2000.0, 3000.0),
            ("b".to_string(), 2000.0, 5000.0)
        ]
    );
    assert!(
        pending_msg(&d, "a2")
            .contains("or below its fair share where a would pass its own deserved quota")
    );
    // With quota 3 the third GPU is inside a's deserved quota: rule (a), b may go down to its
    // deserved 2, and the single pod bx (fewest victims) leaves.
    let d = run(&a_at_two_b_at_six(3.0));
    let by_a = EvictionReason::Reclaim {
        by_queue: "a".into(),
    };
    assert_eq!(evicted(&d), vec![("bx", by_a)]);
    assert_eq!(bound_pods(&d), vec!["a2"]);
}

#[test]
fn reclaim_rule_b_takes_back_up_to_fair_share() {
    // a (quota 2) holds 2 and wants 2 more; b (quota 2) holds 6 single GPUs. Fair shares are
    // 4 and 4: a, past its deserved quota, reclaims two of b's youngest pods, and b keeps its
    // fair share.
    let mut s = Snapshot::at(1000)
        .node(Node::gpu_node("n1", 8, "H100", 80_000))
        .queue(Queue::new("a").gpu(2.0, 1.0, -1.0))
        .queue(Queue::new("b").gpu(2.0, 1.0, -1.0));
    for i in 0..2 {
        s = s.pod(
            Pod::new(&format!("a{i}"), "a")
                .gpus(1)
                .created(i)
                .on_node("n1"),
        );
    }
    for i in 0..6 {
        s = s.pod(
            Pod::new(&format!("b{i}"), "b")
                .gpus(1)
                .created(10 + i)
                .on_node("n1"),
        );
    }
    s = s
        .pod(Pod::new("a2", "a").gpus(1).created(20))
        .pod(Pod::new("a3", "a").gpus(1).created(21));
    let d = run(&s);
    let by_a = EvictionReason::Reclaim {
        by_queue: "a".into(),
    };
    assert_eq!(evicted(&d), vec![("b4", by_a.clone()), ("b5", by_a)]);
    assert_eq!(bound_pods(&d), vec!["a2", "a3"]);
}

#[test]
fn gpu_memory_requests_count_as_the_share_of_the_gpu_they_land_on() {
    // | h1: 1 H100 80 GB | a1: 2 A100 40 GB | four 20 GiB pods land two per A100, taking half
    // of each: the queue asks for 2 GPUs, not the 1.02 that 20 GiB of the H100 would be, and
    // its demand (the basis of its fair share) equals what it ends up holding.
    let s = Snapshot::at(0)
        .queue(Queue::new("m").gpu(4.0, 1.0, -1.0))
        .node(Node::gpu_node("h1", 1, "H100", 80_000))
        .node(Node::gpu_node("a1", 2, "A100", 40_960))
        .pod(Pod::new("m0", "m").gpu_memory(1, 20_480))
        .pod(Pod::new("m1", "m").gpu_memory(1, 20_480))
        .pod(Pod::new("m2", "m").gpu_memory(1, 20_480))
        .pod(Pod::new("m3", "m").gpu_memory(1, 20_480));
    let d = run(&s);
    assert!(bound(&d).iter().all(|(_, n)| n == "a1"), "{:?}", bound(&d));
    assert_eq!(d.bindings.len(), 4);
    let m = &d.fair_shares[0];
    assert_eq!((m.requested[0], m.allocated[0]), (2000.0, 2000.0), "{m:?}");
    // A pod that accepts only the H100 is counted on the H100 (20 GiB of 80 GB, 0.256).
    let s = s.pod(Pod::new("m4", "m").gpu_memory(1, 20_480).models(&["H100"]));
    let d = run(&s);
    assert_eq!(d.fair_shares[0].requested[0], 2256.0, "{:?}", d.fair_shares);
}

fn budget(name: &str, allowed: u32, pods: &[&str]) -> tessera_core::model::DisruptionBudget {
    tessera_core::model::DisruptionBudget {
        name: name.into(),
        disruptions_allowed: allowed,
        pods: pods.iter().map(|p| p.to_string()).collect(),
    }
}

#[test]
fn reclaim_takes_no_victim_a_disruption_budget_protects() {
    // Without a budget, b reclaims a2 and a3 (see reclaim_restores_fair_share).
    let s = || {
        two_queue_cluster()
            .pod(Pod::new("b0", "b").gpus(1).created(10))
            .pod(Pod::new("b1", "b").gpus(1).created(11))
    };
    let by_b = EvictionReason::Reclaim {
        by_queue: "b".into(),
    };
    // No disruption allowed: nothing is evicted, and the waiting pods name the budget.
    let mut none = s();
    none.disruption_budgets = vec![budget("ns/a-pdb", 0, &["a0", "a1", "a2", "a3"])];
    let d = run(&none);
    assert!(d.evictions.is_empty(), "{:?}", d.evictions);
    assert!(d.bindings.is_empty());
    assert!(
        pending_msg(&d, "b0").contains("protected by PodDisruptionBudget ns/a-pdb"),
        "{}",
        pending_msg(&d, "b0")
    );
    // One allowed: exactly one victim, one reclaimer placed.
    let mut one = s();
    one.disruption_budgets = vec![budget("ns/a-pdb", 1, &["a0", "a1", "a2", "a3"])];
    let d = run(&one);
    assert_eq!(evicted(&d), vec![("a3", by_b.clone())]);
    assert_eq!(bound_pods(&d), vec!["b0"]);
    // The budget covers only some pods: the others are taken instead.
    let mut part = s();
    part.disruption_budgets = vec![budget("ns/a-pdb", 0, &["a3"])];
    let d = run(&part);
    assert_eq!(
        evicted(&d),
        vec![("a1", by_b.clone()), ("a2", by_b.clone())]
    );
    // A pod covered by two budgets cannot be evicted at all (the API server refuses it).
    let mut two = s();
    two.disruption_budgets = vec![
        budget("ns/x", 5, &["a0", "a1", "a2", "a3"]),
        budget("ns/y", 5, &["a0", "a1", "a2", "a3"]),
    ];
    let d = run(&two);
    assert!(d.evictions.is_empty(), "{:?}", d.evictions);
}
