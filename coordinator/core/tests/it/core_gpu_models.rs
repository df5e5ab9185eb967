//! Quota per GPU model: a queue's limit of a model caps what it holds of that model while it
//! still gets other models; each named model gets a fair share of its own; a queue within its
//! deserved quota of a model reclaims that model from a queue above its share of it, never
//! below that queue's deserved quota of it.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_core::cycle::{CycleConfig, Decisions, Reason, schedule};
use tessera_core::model::{Node, Pod, Queue, Snapshot};

/// 2 nodes of 8 H100s and 2 of 4 L40Ss (24 GPUs).
fn mixed() -> Snapshot {
    Snapshot::at(100)
        .node(Node::gpu_node("h0", 8, "H100", 80_000))
        .node(Node::gpu_node("h1", 8, "H100", 80_000))
        .node(Node::gpu_node("l0", 4, "L40S", 46_000))
        .node(Node::gpu_node("l1", 4, "L40S", 46_000))
}

/// Applies a cycle's decisions (see `core_props::apply`) and lets time pass.
fn apply(s: &mut Snapshot, d: &Decisions) {
    crate::core_props::apply(s, d);
    s.now += 10;
}

/// Adds `n` one-GPU pods `<prefix>NN` of queue `prefix` created from `created` on, asking
/// for H100s when `h100`; `hog`'s are a ReplicaSet's (bound first, they are the victims).
fn one_gpu_pods(mut s: Snapshot, prefix: &str, n: u64, h100: bool, created: u64) -> Snapshot {
    for i in 0..n {
        let mut p = Pod::new(&format!("{prefix}{i:02}"), prefix)
            .gpus(1)
            .created(created + i);
        if h100 {
            p = p.models(&["H100"]);
        }
        if prefix == "hog" {
            p = p.controlled_by("ReplicaSet hog");
        }
        s = s.pod(p);
    }
    s
}

/// Milli-GPU each queue holds per node GPU model (queue → model → milli).
fn held(s: &Snapshot) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for p in &s.pods {
        let Some(pl) = &p.placement else { continue };
        let node = s.nodes.iter().find(|n| n.name == pl.node).unwrap();
        for slice in pl.assignment.slices() {
            let gpu = node.gpus.iter().find(|g| g.uuid == slice.uuid).unwrap();
            *out.entry(p.queue.clone())
                .or_default()
                .entry(gpu.model.clone())
                .or_default() += u64::from(slice.compute_milli);
        }
    }
    out
}

fn of(s: &Snapshot, queue: &str, model: &str) -> u64 {
    held(s)
        .get(queue)
        .and_then(|m| m.get(model))
        .copied()
        .unwrap_or(0)
}

#[test]
fn a_queue_with_an_h100_limit_never_gets_more_h100s_and_still_gets_other_models() {
    let mut s = mixed().queue(Queue::new("a").gpu_model("H100", 0.0, None, 3.0));
    for i in 0..14 {
        s = s.pod(Pod::new(&format!("p{i:02}"), "a").gpus(1).created(i));
    }
    let d = schedule(&s, &CycleConfig::default());
    apply(&mut s, &d);
    assert_eq!(of(&s, "a", "H100"), 3000);
    assert_eq!(of(&s, "a", "L40S"), 8000, "the other model is not limited");
    // The three left wait, saying which limit holds them.
    assert_eq!(d.pending.len(), 3);
    for p in &d.pending {
        assert!(
            p.reasons.iter().any(|(r, _)| matches!(
                r,
                Reason::QueueOverModelLimit { queue, model, limit }
                    if queue == "a" && model == "H100" && limit == "3"
            )),
            "{p:?}"
        );
        assert!(
            p.message
                .contains("queue a over limit gpu=3 of GPU model H100"),
            "{}",
            p.message
        );
    }
    let st = d.fair_shares.iter().find(|q| q.queue == "a").unwrap();
    assert_eq!(st.models.len(), 1);
    assert_eq!(st.models[0].model, "H100");
    assert_eq!(st.models[0].allocated, 3000.0);
    // A second cycle changes nothing, and (its pods now victims a reclaim could take) the
    // limit is still what the waiting pods are told.
    let d = schedule(&s, &CycleConfig::default());
    assert!(d.bindings.is_empty() && d.evictions.is_empty(), "{d:?}");
    for p in &d.pending {
        assert!(
            p.message
                .contains("queue a over limit gpu=3 of GPU model H100"),
            "{}",
            p.message
        );
    }
}

#[test]
fn a_parents_model_limit_binds_its_children_together() {
    let mut s = mixed()
        .queue(Queue::new("org").gpu_model("H100", 0.0, None, 4.0))
        .queue(Queue::new("x").parent("org"))
        .queue(Queue::new("y").parent("org"));
    for i in 0..6 {
        s = s
            .pod(Pod::new(&format!("x{i}"), "x").gpus(1).models(&["H100"]))
            .pod(Pod::new(&format!("y{i}"), "y").gpus(1).models(&["H100"]));
    }
    let d = schedule(&s, &CycleConfig::default());
    apply(&mut s, &d);
    assert_eq!(of(&s, "x", "H100") + of(&s, "y", "H100"), 4000);
}

#[test]
fn each_named_model_gets_a_fair_share_of_its_own() {
    // H100: a deserves 4, b 0; the other 12 go by weight 1:3.
    let mut s = mixed()
        .queue(Queue::new("a").gpu_model("H100", 4.0, Some(1.0), -1.0))
        .queue(Queue::new("b").gpu_model("H100", 0.0, Some(3.0), -1.0));
    for i in 0..30 {
        s = s
            .pod(Pod::new(&format!("a{i:02}"), "a").gpus(1).models(&["H100"]))
            .pod(Pod::new(&format!("b{i:02}"), "b").gpus(1).models(&["H100"]));
    }
    let d = schedule(&s, &CycleConfig::default());
    let model = |q: &str| d.fair_shares.iter().find(|x| x.queue == q).unwrap().models[0].clone();
    assert_eq!(model("a").deserved, 4000.0);
    assert!(
        (model("a").fair_share - 7000.0).abs() < 1e-6,
        "{:?}",
        model("a")
    );
    assert!(
        (model("b").fair_share - 9000.0).abs() < 1e-6,
        "{:?}",
        model("b")
    );
    // The totals count the per-model quota as deserved.
    let a = d.fair_shares.iter().find(|x| x.queue == "a").unwrap();
    assert_eq!(a.deserved[0], 4000.0);
    apply(&mut s, &d);
    assert_eq!(of(&s, "a", "H100") + of(&s, "b", "H100"), 16_000);
    assert!(of(&s, "a", "H100") >= 4000);
}

#[test]
fn a_queue_within_its_h100_quota_reclaims_h100s_but_never_below_the_victims_h100_quota() {
    // `hog` deserves 4 H100s and holds all 16; `team` deserves 8 H100s and holds none.
    let mut s = mixed()
        .queue(Queue::new("hog").gpu_model("H100", 4.0, None, -1.0))
        .queue(Queue::new("team").gpu_model("H100", 8.0, None, -1.0));
    s = one_gpu_pods(s, "hog", 16, true, 0);
    let d = schedule(&s, &CycleConfig::default());
    apply(&mut s, &d);
    assert_eq!(of(&s, "hog", "H100"), 16_000);
    s = one_gpu_pods(s, "team", 16, true, 100);
    for _ in 0..4 {
        let d = schedule(&s, &CycleConfig::default());
        apply(&mut s, &d);
        assert!(of(&s, "hog", "H100") >= 4000, "{:?}", held(&s));
    }
    assert!(of(&s, "team", "H100") >= 8000, "{:?}", held(&s));
    assert!(of(&s, "hog", "H100") >= 4000, "{:?}", held(&s));
}

#[test]
fn outside_its_model_quota_a_queue_reclaims_that_model_only_up_to_its_fair_share_of_it() {
    // `hog` deserves 8 H100s (so 8 in total) and holds every GPU; `team` deserves 12 GPUs of
    // any model but asks for H100s, of which it deserves none. By the totals alone, `team`
    // would take 12 H100s (inside its total quota, `hog` going down to its own 8); by the
    // H100 shares (hog 8 + 4, team 0 + 4 of the 16) it takes 4, and `hog` keeps its fair
    // share of the model, above its deserved 8.
    let mut s = mixed()
        .queue(Queue::new("hog").gpu_model("H100", 8.0, None, -1.0))
        .queue(Queue::new("team").gpu(12.0, 1.0, -1.0));
    s = one_gpu_pods(s, "hog", 24, false, 0);
    let d = schedule(&s, &CycleConfig::default());
    apply(&mut s, &d);
    assert_eq!(of(&s, "hog", "H100") + of(&s, "hog", "L40S"), 24_000);
    s = one_gpu_pods(s, "team", 12, true, 100);
    for _ in 0..4 {
        let d = schedule(&s, &CycleConfig::default());
        apply(&mut s, &d);
        assert!(of(&s, "hog", "H100") >= 8000, "{:?}", held(&s));
    }
    assert_eq!(of(&s, "team", "H100"), 4000, "{:?}", held(&s));
    assert_eq!(of(&s, "hog", "H100"), 12_000, "{:?}", held(&s));
}

#[test]
fn without_per_model_settings_nothing_changes() {
    let mut s = mixed().queue(Queue::new("a").gpu(2.0, 1.0, -1.0));
    for i in 0..30 {
        s = s.pod(Pod::new(&format!("p{i:02}"), "a").gpus(1));
    }
    let d = schedule(&s, &CycleConfig::default());
    assert!(d.fair_shares.iter().all(|q| q.models.is_empty()));
    assert_eq!(d.bindings.len(), 24);
}

/// A random workload's queues: per leaf, `(H100 limit, L40S limit, H100 quota)` (negative
/// limits: none), under one parent with an H100 limit of its own.
fn limits() -> impl Strategy<Value = (Vec<(i32, i32, u32)>, i32)> {
    (
        prop::collection::vec((-1..6i32, -1..4i32, 0..4u32), 1..4),
        -1..10i32,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn per_model_allocation_never_exceeds_a_per_model_limit(
        (leaves, parent_limit) in limits(),
        pods in prop::collection::vec((0..3usize, 1..3u32, 0..3u8, any::<bool>()), 1..40),
        held_first in prop::collection::vec(0..3usize, 0..6),
    ) {
        let lim = |l: i32| if l < 0 { -1.0 } else { f64::from(l) };
        let mut s = mixed().queue(Queue::new("org").gpu_model("H100", 0.0, None, lim(parent_limit)));
        for (i, &(h, l, q)) in leaves.iter().enumerate() {
            s = s.queue(
                Queue::new(&format!("q{i}"))
                    .parent("org")
                    .gpu_model("H100", f64::from(q), None, lim(h))
                    .gpu_model("L40S", 0.0, Some(2.0), lim(l)),
            );
        }
        // Some pods of an unlimited queue first, so that reclaim has victims.
        s = s.queue(Queue::new("free"));
        for (i, &n) in held_first.iter().enumerate() {
            s = s.pod(Pod::new(&format!("f{i}"), "free").gpus(1 + n as u32).controlled_by("ReplicaSet f"));
        }
        let d = schedule(&s, &CycleConfig::default());
        apply(&mut s, &d);
        for (i, &(q, count, kind, whole)) in pods.iter().enumerate() {
            let q = q % leaves.len();
            let mut p = Pod::new(&format!("p{i:02}"), &format!("q{q}")).created(200 + i as u64);
            p = if whole { p.gpus(count) } else { p.fraction(500) };
            p = match kind {
                0 => p,
                1 => p.models(&["H100"]),
                _ => p.models(&["L40S"]),
            };
            s = s.pod(p.controlled_by("ReplicaSet p"));
        }
        for _ in 0..3 {
            let d = schedule(&s, &CycleConfig::default());
            apply(&mut s, &d);
            let h = held(&s);
            let mut org_h100 = 0;
            for (i, &(hl, ll, _)) in leaves.iter().enumerate() {
                let mine = h.get(&format!("q{i}")).cloned().unwrap_or_default();
                let h100 = mine.get("H100").copied().unwrap_or(0);
                let l40s = mine.get("L40S").copied().unwrap_or(0);
                org_h100 += h100;
                if hl >= 0 {
                    prop_assert!(h100 <= hl as u64 * 1000, "q{i}: {h100} H100 milli over {hl}");
                }
                if ll >= 0 {
                    prop_assert!(l40s <= ll as u64 * 1000, "q{i}: {l40s} L40S milli over {ll}");
                }
            }
            if parent_limit >= 0 {
                prop_assert!(org_h100 <= parent_limit as u64 * 1000, "org: {org_h100} over {parent_limit}");
            }
        }
    }
}
