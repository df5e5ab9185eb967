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
        "gang default/g1: its 3 pods do not fit together; 0/3 nodes: 3 too few free whole GPUs"
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
    let s = cluster(&[("n1", 2), ("n2", 2)])
        .pod(Pod::new("f1", "default").fraction(500).on_node("n1"))
        .pod(Pod::new("f2", "default").fraction(500).on_node("n2"))
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
            "0/3 nodes: 2 insufficient free GPU share on any single GPU, 1 insufficient CPU"
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
    assert!(
        pending_msg(&d, "p").contains("nvidia.com/gpu"),
        "{}",
        pending_msg(&d, "p")
    );
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
fn reclaim_frees_gpus_held_over_fair_share_despite_cpu_requests() {
    // research-llm holds 24 of 24 GPUs; eight serving pods (20 GiB each, counted as 0.256 of
    // the cluster's largest GPU) give product-serving a fair share of ~2.05 GPUs and
    // research-llm ~21.95. Evicting one elastic
    // fine-tuning pod (2 GPUs) keeps research-llm above its fair share; a second would not.
    // Reclaim used to refuse: the victim's CPU and memory counted as a loss below research-llm's
    // fair share of CPU (equal to its demand, CPU being uncontended), and the serving side was
    // charged the victim's whole 2 GPUs instead of its own request.
    let d = run(&sample_burst(4, 8));
    let by = EvictionReason::Reclaim {
        by_queue: "product-serving".into(),
    };
    let ev = evicted(&d);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].0.starts_with("finetune-"), "{ev:?}");
    assert_eq!(ev[0].1, by);
    // The freed two L40S GPUs (48 GiB) hold two 20 GiB serving pods each.
    let victim_node = if ev[0].0 < "finetune-2" { "l1" } else { "l2" };
    let served = bound(&d);
    assert_eq!(served.len(), 4, "{:?}", d.pending);
    assert!(
        served
            .iter()
            .all(|(p, n)| p.starts_with("serve-") && n == victim_node)
    );
}

#[test]
fn reclaim_keeps_a_gang_at_min_member_whole_when_that_breaks_fair_share() {
    // Only the two core fine-tuning pods remain: freeing GPUs means evicting the whole gang
    // (4 GPUs), which would take research-llm (20 GPUs) below its fair share (~17.95): serving
    // waits, and no pod is evicted.
    let mut s = sample_burst(2, 8);
    s.nodes.retain(|n| n.name != "l2");
    let d = run(&s);
    assert!(d.evictions.is_empty(), "{:?}", d.evictions);
    assert!(d.bindings.is_empty(), "{:?}", bound(&d));
    let msg = pending_msg(&d, "serve-0");
    assert!(
        msg.starts_with("queue product-serving is below its fair share, but no preemptible pod"),
        "{msg}"
    );
}
