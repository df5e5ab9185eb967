//! Usage history in fair share: a recent heavy user yields the over-quota part to a light one,
//! gets it back once it stops using (the decay converges to the plain fair share), never
//! loses its deserved quota to the history, and the history survives a restart (records
//! read back without what the queue held go on as if nothing happened). Deterministic.

use proptest::prelude::*;
use tessera_core::cycle::{CycleConfig, Decisions, QueueShareStatus, schedule};
use tessera_core::model::{
    Assignment, ContainerAssignment, GpuSlice, Node, Pod, Queue, QueueUsage, Snapshot,
};
use tessera_core::usage::UsageDecay;

const HOUR: UsageDecay = UsageDecay {
    half_life_seconds: 3600,
    window_seconds: 0,
};

fn with(usage: UsageDecay) -> CycleConfig {
    CycleConfig {
        usage,
        ..CycleConfig::default()
    }
}

/// `nodes` × 8 GPUs; leaf queues `(name, quota, weight)`, each with more 1-GPU pods pending
/// than the cluster holds.
fn cluster(nodes: u32, queues: &[(&str, f64, f64)]) -> Snapshot {
    let mut s = Snapshot::at(1_000_000);
    for n in 0..nodes {
        s = s.node(Node::gpu_node(&format!("n{n}"), 8, "H100", 80_000));
    }
    for &(name, quota, weight) in queues {
        s = s.queue(Queue::new(name).gpu(quota, weight, -1.0));
        for i in 0..nodes * 8 + 4 {
            s = s.pod(
                Pod::new(&format!("{name}-{i}"), name)
                    .gpus(1)
                    .created(u64::from(i)),
            );
        }
    }
    s
}

fn record(queue: &str, at: u64, gpu_milli_seconds: f64, holding: Option<f64>) -> QueueUsage {
    QueueUsage {
        queue: queue.into(),
        at,
        used: [gpu_milli_seconds, 0.0, 0.0],
        holding: holding.map(|h| [h, 0.0, 0.0]),
    }
}

fn share<'d>(d: &'d Decisions, q: &str) -> &'d QueueShareStatus {
    d.fair_shares.iter().find(|s| s.queue == q).unwrap()
}

fn fair(d: &Decisions, q: &str) -> f64 {
    share(d, q).fair_share[0]
}

fn deserved(d: &Decisions, q: &str) -> f64 {
    share(d, q).deserved[0]
}

fn placed(d: &Decisions, q: &str) -> usize {
    d.bindings
        .iter()
        .filter(|b| b.pod.starts_with(&format!("{q}-")))
        .count()
}

#[test]
fn a_recent_heavy_user_yields_the_over_quota_part_and_gets_it_back_once_idle() {
    let mut s = cluster(4, &[("a", 0.0, 1.0), ("b", 0.0, 1.0)]);
    let plain = schedule(&s, &CycleConfig::default());
    assert_eq!(fair(&plain, "a"), fair(&plain, "b"));
    assert!(plain.usage.is_empty(), "off by default: no usage out");
    // `a` held the whole cluster (32 GPUs) for a long time; `b` nothing.
    let tau = HOUR.mean_life();
    s.usage = vec![record("a", s.now, 32_000.0 * tau, Some(32_000.0))];
    let d = schedule(&s, &with(HOUR));
    assert!(
        fair(&d, "a") < 0.5 * fair(&d, "b"),
        "a {} b {}",
        fair(&d, "a"),
        fair(&d, "b")
    );
    assert!((fair(&d, "a") + fair(&d, "b") - 32_000.0).abs() < 1e-6);
    assert!(placed(&d, "b") > placed(&d, "a"), "{:?}", d.bindings.len());
    // Both queues' records come back, advanced to the snapshot's time.
    assert_eq!(d.usage.len(), 2);
    assert!(d.usage.iter().all(|u| u.at == s.now));
    // `a` stops using: a half-life later its share is back up, and after many it is the
    // plain share again.
    let mut last = fair(&d, "a");
    let mut usage = d.usage.clone();
    for step in 1..=30 {
        for u in &mut usage {
            u.holding = Some([0.0; 3]);
        }
        s.usage = usage;
        s.now += 3600;
        let d = schedule(&s, &with(HOUR));
        let now = fair(&d, "a");
        assert!(now >= last - 1e-9, "step {step}: {now} < {last}");
        last = now;
        usage = d.usage;
    }
    assert!(
        (last - fair(&plain, "a")).abs() < 1e-3 * 32_000.0,
        "{last} vs {}",
        fair(&plain, "a")
    );
}

#[test]
fn restarts_keep_history() {
    // The same allocation held throughout: a record read back from a Queue's status (no
    // holding, as the status keeps none) goes on exactly as the one kept in memory.
    let mut s = cluster(2, &[("a", 4.0, 1.0), ("b", 0.0, 2.0)]);
    s.pods.truncate(0);
    for i in 0..6 {
        s = s.pod(Pod::new(&format!("a-{i}"), "a").gpus(1).on_node("n0"));
    }
    s.usage = vec![record("a", s.now - 600, 1e6, None)];
    let mut kept = s.clone();
    let mut restarted = s.clone();
    for step in 0..6 {
        let dk = schedule(&kept, &with(HOUR));
        let dr = schedule(&restarted, &with(HOUR));
        for (a, b) in dk.usage.iter().zip(&dr.usage) {
            for k in 0..3 {
                assert!(
                    (a.used[k] - b.used[k]).abs() <= 1e-9 * a.used[k].max(1.0),
                    "step {step}: {a:?} vs {b:?}"
                );
            }
        }
        kept.usage = dk.usage;
        // A new leader: the records as the status gives them back.
        restarted.usage = dr
            .usage
            .into_iter()
            .map(|u| QueueUsage { holding: None, ..u })
            .collect();
        kept.now += 900;
        restarted.now += 900;
    }
    let a = kept.usage.iter().find(|u| u.queue == "a").unwrap();
    assert!(a.used[0] > 1e6, "usage accrued while a held 10 GPUs: {a:?}");
}

#[test]
fn the_history_counts_what_bound_pods_hold_before_their_nodes_gpus_are_reported() {
    // Right after a failover a node's agent may not have reported its GPUs yet: the node has
    // none in the snapshot, but its pods' assignments still say what the queue holds.
    let mut s = Snapshot::at(10_000)
        .node(Node::cpu_node("n0", 64_000, 262_144))
        .queue(Queue::new("a"));
    for i in 0..4 {
        let assignment = Assignment {
            containers: vec![ContainerAssignment {
                container: "main".into(),
                gpus: vec![GpuSlice {
                    uuid: format!("GPU-{i}"),
                    memory_mib: 81_920,
                    compute_milli: 1000,
                }],
            }],
        };
        s = s.pod(
            Pod::new(&format!("a-{i}"), "a")
                .gpus(1)
                .bound("n0", assignment),
        );
    }
    s.usage = vec![record("a", s.now - 100, 0.0, None)];
    let d = schedule(&s, &with(HOUR));
    let a = d.usage.iter().find(|u| u.queue == "a").unwrap();
    assert!(
        (a.used[0] - HOUR.advance(Some(&s.usage[0]), [4000.0, 0.0, 0.0], s.now)[0]).abs() < 1e-6,
        "{a:?}"
    );
    assert_eq!(a.holding.map(|h| h[0]), Some(4000.0));
}

#[test]
fn a_window_forgets_at_its_boundary() {
    let mut s = cluster(2, &[("a", 0.0, 1.0), ("b", 0.0, 1.0)]);
    let windowed = UsageDecay {
        half_life_seconds: 3600,
        window_seconds: 86_400,
    };
    let day_start = 86_400 * 12;
    s.now = day_start + 100;
    s.usage = vec![record(
        "a",
        day_start - 10,
        16_000.0 * HOUR.mean_life(),
        None,
    )];
    let d = schedule(&s, &with(windowed));
    assert_eq!(fair(&d, "a"), fair(&d, "b"), "yesterday's usage is gone");
    let d = schedule(&s, &with(HOUR));
    assert!(fair(&d, "a") < fair(&d, "b"), "without a window it counts");
}

/// [`cluster`] with leaf queues `q0, q1, …` of the given `(quota, weight)`, and their names.
fn leaves(nodes: u32, qs: &[(u32, u32)]) -> (Vec<String>, Snapshot) {
    let names: Vec<String> = (0..qs.len()).map(|i| format!("q{i}")).collect();
    let spec: Vec<(&str, f64, f64)> = names
        .iter()
        .zip(qs)
        .map(|(n, &(q, w))| (n.as_str(), f64::from(q), f64::from(w)))
        .collect();
    let s = cluster(nodes, &spec);
    (names, s)
}

fn queues() -> impl Strategy<Value = Vec<(u32, u32)>> {
    prop::collection::vec((0..12u32, 0..4u32), 2..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn decay_converges_to_the_plain_fair_share(
        qs in queues(),
        used in prop::collection::vec(0.0..20.0f64, 5),
        half_life in 60..86_400u64,
    ) {
        let (names, mut s) = leaves(3, &qs);
        let decay = UsageDecay { half_life_seconds: half_life, window_seconds: 0 };
        let plain = schedule(&s, &CycleConfig::default());
        s.usage = names
            .iter()
            .zip(&used)
            .map(|(n, &u)| record(n, s.now, u * 24_000.0 * decay.mean_life(), Some(0.0)))
            .collect();
        for _ in 0..60 {
            let d = schedule(&s, &with(decay));
            s.usage = d.usage.into_iter().map(|u| QueueUsage { holding: Some([0.0; 3]), ..u }).collect();
            s.now += half_life;
        }
        let d = schedule(&s, &with(decay));
        for n in &names {
            prop_assert!((fair(&d, n) - fair(&plain, n)).abs() < 1e-6 * 24_000.0, "{n}: {} vs {}", fair(&d, n), fair(&plain, n));
        }
    }

    #[test]
    fn the_history_never_takes_a_deserved_quota(
        qs in queues(),
        used in prop::collection::vec(0.0..50.0f64, 5),
        held in prop::collection::vec(0..10u32, 5),
    ) {
        // Each queue holds some GPUs already (preemptible pods) and wants many more.
        let (names, mut s) = leaves(4, &qs);
        let mut node = 0;
        let mut free = 8;
        for (n, &h) in names.iter().zip(&held) {
            for i in 0..h {
                if free == 0 {
                    node += 1;
                    free = 8;
                }
                if node == 4 {
                    break;
                }
                let p = s.pods.iter_mut().find(|p| p.uid == format!("{n}-{i}")).unwrap();
                *p = p.clone().controlled_by("ReplicaSet r").on_node(&format!("n{node}"));
                free -= 1;
            }
        }
        s.usage = names
            .iter()
            .zip(&used)
            .map(|(n, &u)| record(n, s.now, u * 32_000.0 * HOUR.mean_life(), None))
            .collect();
        let plain = schedule(&s, &CycleConfig::default());
        let d = schedule(&s, &with(HOUR));
        for n in &names {
            prop_assert_eq!(deserved(&d, n), deserved(&plain, n), "{}", n);
            prop_assert!(fair(&d, n) + 1e-9 >= deserved(&d, n));
            let before = s.pods.iter().filter(|p| &p.queue == n && p.placement.is_some()).count() as f64 * 1000.0;
            let after = share(&d, n).allocated[0];
            // Reclaim takes nothing a queue holds within its deserved quota.
            prop_assert!(after + 1e-9 >= before.min(deserved(&d, n)), "{n}: {before} -> {after}, deserved {}", deserved(&d, n));
        }
    }

    #[test]
    fn usage_history_is_deterministic_for_a_seed(
        qs in queues(),
        used in prop::collection::vec(0.0..5.0f64, 5),
        seed in any::<u64>(),
    ) {
        let (names, mut s) = leaves(2, &qs);
        s.usage = names
            .iter()
            .zip(&used)
            .map(|(n, &u)| record(n, s.now - 100, u * 16_000.0 * HOUR.mean_life(), Some(u * 1000.0)))
            .collect();
        let cfg = CycleConfig { seed, shuffle_ties: true, ..with(HOUR) };
        let a = schedule(&s, &cfg);
        prop_assert_eq!(&a, &schedule(&s, &cfg));
        prop_assert_eq!(a.usage.len(), names.len());
    }
}
