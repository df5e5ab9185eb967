//! The bundled sample, replayed through the core: the inference burst gets in by reclaim as it
//! arrives, every wait has a reason per cycle, and parent queues report what their children
//! hold.

use tessera_core::cycle::CycleConfig;
use tessera_gpushape::bundled_dir;
use tessera_sim::replay::{ReplayOutcome, replay};
use tessera_sim::sample::default_workload_path;
use tessera_sim::workload::Workload;

fn sample() -> ReplayOutcome {
    let w = Workload::load(&default_workload_path(), &bundled_dir()).unwrap();
    replay(&w, &CycleConfig::default())
}

#[test]
fn the_samples_serve_pods_start_as_they_arrive_through_reclaim() {
    let out = sample();
    let serve: Vec<_> = out
        .jobs
        .iter()
        .filter(|j| j.queue == "product-serving")
        .collect();
    assert_eq!(serve.len(), 8);
    for j in &serve {
        assert_eq!(j.started, Some(j.arrival), "{j:?}");
        assert!(j.waits.is_empty(), "{j:?}");
    }
    // At least one of them was placed by evicting for it in the cycle it arrived in: the
    // binding and the eviction come out of the same cycle.
    let reclaims: Vec<_> = out
        .evicted
        .iter()
        .filter(|e| e.reason == "reclaim by queue product-serving")
        .collect();
    assert!(!reclaims.is_empty(), "{:?}", out.evicted);
    assert!(
        reclaims
            .iter()
            .all(|e| serve.iter().any(|j| j.arrival == e.time)),
        "{reclaims:?}"
    );
}

#[test]
fn every_job_that_waited_says_why_at_each_cycle() {
    let out = sample();
    for j in &out.jobs {
        let waited = j.started.is_none_or(|s| s > j.arrival);
        if waited {
            let first = j
                .waits
                .first()
                .unwrap_or_else(|| panic!("{} waited without a reason", j.job));
            assert_eq!(first.time, j.arrival, "{j:?}");
        }
        for w in &j.waits {
            assert!(!w.message.is_empty(), "{j:?}");
            assert!(
                j.started.is_none_or(|s| w.time <= s) || j.evictions > 0,
                "{j:?}"
            );
        }
        let cycles: Vec<usize> = j.waits.iter().map(|w| w.cycle).collect();
        assert!(cycles.windows(2).all(|c| c[0] < c[1]), "{j:?}");
    }
    let eval = out.jobs.iter().find(|j| j.job == "eval-gang").unwrap();
    // The nodes first, as kube-scheduler says them, then the gang.
    let first = &eval.waits[0].message;
    assert!(
        first.starts_with("0/7 nodes are available: ")
            && first.ends_with(". gang default/eval-gang: its 4 pods do not fit together"),
        "{:?}",
        eval.waits[0]
    );
}

#[test]
fn parent_queues_report_what_their_children_hold() {
    let out = sample();
    assert!(
        out.shares
            .iter()
            .any(|s| s.gpu_pct["research"] > 0.0 && s.gpu_pct["product"] > 0.0)
    );
    for s in &out.shares {
        for (parent, kids) in [
            ("research", ["research-llm", "research-vision"]),
            ("product", ["product-serving", "product-batch"]),
        ] {
            let sum: f64 = kids.iter().map(|k| s.gpu_pct[*k]).sum();
            assert!((s.gpu_pct[parent] - sum).abs() < 1e-9, "{s:?}");
        }
    }
}

fn mean_wait(out: &ReplayOutcome, prefix: &str) -> f64 {
    let waits: Vec<u64> = out
        .jobs
        .iter()
        .filter(|j| j.job.starts_with(prefix))
        .map(|j| j.started.expect("every job of the sample starts") - j.arrival)
        .collect();
    waits.iter().sum::<u64>() as f64 / waits.len() as f64
}

#[test]
fn with_usage_history_the_recent_heavy_user_yields_the_shared_gpus() {
    let w = Workload::load(&default_workload_path(), &bundled_dir()).unwrap();
    let plain = replay(&w, &CycleConfig::default());
    let cfg = CycleConfig {
        usage: tessera_core::usage::UsageDecay {
            half_life_seconds: 1800,
            window_seconds: 0,
        },
        ..CycleConfig::default()
    };
    let decayed = replay(&w, &cfg);
    // research-llm just held 16 H100s for two hours: its sweep waits longer, the product
    // team's nightly jobs less.
    assert!(
        mean_wait(&decayed, "llm-sweep") > mean_wait(&plain, "llm-sweep"),
        "{} vs {}",
        mean_wait(&decayed, "llm-sweep"),
        mean_wait(&plain, "llm-sweep")
    );
    assert!(
        mean_wait(&decayed, "nightly") < mean_wait(&plain, "nightly"),
        "{} vs {}",
        mean_wait(&decayed, "nightly"),
        mean_wait(&plain, "nightly")
    );
    // Before the two backlogs, quotas decide; the history changes nothing there.
    for (a, b) in plain.jobs.iter().zip(&decayed.jobs) {
        if a.arrival < 7200 {
            assert_eq!(
                (a.started, a.finished),
                (b.started, b.finished),
                "{}",
                a.job
            );
        }
    }
    // Deterministic: the same replay decides the same.
    let again = replay(&w, &cfg);
    let starts = |o: &ReplayOutcome| o.jobs.iter().map(|j| j.started).collect::<Vec<_>>();
    assert_eq!(starts(&again), starts(&decayed));
}
