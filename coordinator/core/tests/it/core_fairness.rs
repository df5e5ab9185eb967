//! Fairness: three queues with quotas 50/30/20 GPUs and over-quota weights 1/1/2, all asking
//! for far more than the cluster has, converge to their fair shares within 2% after reclaim.

use tessera_core::cycle::{CycleConfig, Decisions, schedule};
use tessera_core::model::{Node, Pod, Queue, Snapshot};

/// Applies a cycle's decisions the way the cluster would: bindings bind, evicted pods are
/// recreated pending (same uid for simplicity).
fn apply(s: &mut Snapshot, d: &Decisions) {
    for b in &d.bindings {
        if let Some(p) = s.pods.iter_mut().find(|p| p.uid == b.pod) {
            *p = p.clone().bound(&b.node, b.assignment.clone());
        }
    }
    for e in &d.evictions {
        if let Some(p) = s.pods.iter_mut().find(|p| p.uid == e.pod) {
            p.placement = None;
        }
    }
    s.now += 10;
}

fn gpus_of(s: &Snapshot, queue: &str) -> f64 {
    s.pods
        .iter()
        .filter(|p| p.queue == queue && p.placement.is_some())
        .map(|p| f64::from(p.gpu.count))
        .sum()
}

#[test]
fn three_queues_converge_to_fair_share() {
    // 25 nodes × 8 GPUs = 200 GPUs. Deserved 50/30/20 leaves 100 to share by weight 1:1:2.
    // Fair: a = 50 + 25 = 75, b = 30 + 25 = 55, c = 20 + 50 = 70.
    let mut s = Snapshot::at(0)
        .queue(Queue::new("a").gpu(50.0, 1.0, -1.0))
        .queue(Queue::new("b").gpu(30.0, 1.0, -1.0))
        .queue(Queue::new("c").gpu(20.0, 2.0, -1.0));
    for n in 0..25 {
        s = s.node(Node::gpu_node(&format!("n{n:02}"), 8, "H100", 80_000));
    }
    // Queue a arrives first and takes the whole cluster.
    for i in 0..300 {
        s = s.pod(Pod::new(&format!("a{i:03}"), "a").gpus(1).created(i));
    }
    let cfg = CycleConfig::default();
    let d = schedule(&s, &cfg);
    apply(&mut s, &d);
    assert_eq!(gpus_of(&s, "a"), 200.0);
    // Then b and c arrive, over-demanding too (mixed 1- and 2-GPU pods).
    for i in 0..200 {
        s = s.pod(
            Pod::new(&format!("b{i:03}"), "b")
                .gpus(1 + (i % 2) as u32)
                .created(1000 + i),
        );
        s = s.pod(Pod::new(&format!("c{i:03}"), "c").gpus(1).created(1000 + i));
    }
    for _ in 0..6 {
        let d = schedule(&s, &cfg);
        apply(&mut s, &d);
    }
    let expect = [("a", 75.0), ("b", 55.0), ("c", 70.0)];
    let d = schedule(&s, &cfg);
    for (q, fair) in expect {
        let got = gpus_of(&s, q);
        assert!(
            (got - fair).abs() <= 0.02 * fair,
            "queue {q}: {got} GPUs, fair {fair}"
        );
        let st = d.fair_shares.iter().find(|x| x.queue == q).unwrap();
        assert!((st.fair_share[0] - fair * 1000.0).abs() < 1e-6, "{st:?}");
    }
    // Stable: a further cycle changes nothing.
    assert!(d.evictions.is_empty(), "{:?}", d.evictions);
}

#[test]
fn hierarchical_queues_with_fractions_converge() {
    // 16 nodes × 8 GPUs = 128 GPUs. org1 (quota 64) → t1 (quota 32), t2 (quota 0); org2
    // (quota 32, weight 2) → t3. Remaining 32 GPUs: org1 gets 1/3, org2 2/3.
    // Fair: org1 = 64 + 10.67 = 74.67 → t1 = 32 + 21.33 = 53.33, t2 = 21.33; t3 = 53.33.
    let mut s = Snapshot::at(0)
        .queue(Queue::new("org1").gpu(64.0, 1.0, -1.0))
        .queue(Queue::new("t1").parent("org1").gpu(32.0, 1.0, -1.0))
        .queue(Queue::new("t2").parent("org1").gpu(0.0, 1.0, -1.0))
        .queue(Queue::new("org2").gpu(32.0, 2.0, -1.0))
        .queue(Queue::new("t3").parent("org2").gpu(0.0, 1.0, -1.0));
    for n in 0..16 {
        s = s.node(Node::gpu_node(&format!("n{n:02}"), 8, "A100", 40_000));
    }
    for i in 0..300 {
        s = s.pod(
            Pod::new(&format!("t3-{i:03}"), "t3")
                .fraction(500)
                .created(i),
        );
    }
    let cfg = CycleConfig::default();
    let d = schedule(&s, &cfg);
    apply(&mut s, &d);
    for i in 0..200 {
        s = s.pod(
            Pod::new(&format!("t1-{i:03}"), "t1")
                .fraction(500)
                .created(1000 + i),
        );
        s = s.pod(
            Pod::new(&format!("t2-{i:03}"), "t2")
                .gpus(1)
                .created(1000 + i),
        );
    }
    for _ in 0..8 {
        let d = schedule(&s, &cfg);
        apply(&mut s, &d);
    }
    let used = |q: &str| -> f64 {
        s.pods
            .iter()
            .filter(|p| p.queue == q)
            .filter_map(|p| p.placement.as_ref())
            .flat_map(|pl| pl.assignment.slices())
            .map(|sl| f64::from(sl.compute_milli) / 1000.0)
            .sum()
    };
    let d = schedule(&s, &cfg);
    for (q, fair) in [("t1", 53.333), ("t2", 21.333), ("t3", 53.333)] {
        let got = used(q);
        assert!(
            (got - fair).abs() <= 0.02 * fair,
            "queue {q}: {got} GPUs, fair {fair}"
        );
        let st = d.fair_shares.iter().find(|x| x.queue == q).unwrap();
        assert!((st.fair_share[0] / 1000.0 - fair).abs() < 0.01, "{st:?}");
    }
}
