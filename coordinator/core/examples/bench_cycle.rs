//! Scheduling cycles on the synthetic benchmark cluster (5,000 nodes, 40,000 GPUs, 50,000
//! pending pods, gangs up to 256, 100 queues in two levels). Prints, for the first cycle (empty
//! cluster) and for a second one (the first's bindings applied, so reclaim, preemption and
//! consolidation run against 10k+ bound pods), the time, placements per second and evictions,
//! a digest of the decisions (equal digests: the same decisions), and finally the peak memory
//! (VmHWM).
//!
//! Run: `cargo run --release -p tessera-core --example bench_cycle`. Override the size
//! with `TESSERA_BENCH_NODES` and `TESSERA_BENCH_PODS`. `TESSERA_BENCH_CONSTRAINED=1` gives the
//! pods kube-scheduler constraints (see [`constrain`]) to show their cost; `=no-spread` leaves
//! out the topology spread constraints.

use std::collections::BTreeMap;
use std::time::Instant;

use tessera_core::cycle::{CycleConfig, Decisions, schedule};
use tessera_core::model::synthetic::{SyntheticSpec, synthetic};
use tessera_core::model::{
    InclusionPolicy, LabelSelector, NodeSelector, NodeSelectorTerm, PodAffinityTerm, Requirement,
    SelectorOp, Snapshot, SpreadConstraint, Taint, TaintEffect, Toleration, TolerationOp,
};

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// FNV-1a of every decision, to compare runs of different builds.
fn digest(lines: impl Iterator<Item = String>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for l in lines {
        for b in l.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn report(label: &str, snap: &Snapshot, d: &Decisions, secs: f64) {
    let gpus: usize = snap.nodes.iter().map(|n| n.gpus.len()).sum();
    let gpu_milli: u64 = d
        .bindings
        .iter()
        .flat_map(|b| b.assignment.slices())
        .map(|s| u64::from(s.compute_milli))
        .sum();
    let decisions = digest(
        d.bindings
            .iter()
            .map(|b| format!("{b:?}"))
            .chain(d.evictions.iter().map(|e| format!("{e:?}")))
            .chain(d.pending.iter().map(|p| format!("{p:?}"))),
    );
    println!(
        "{label}: {secs:.3} s, {} pods placed ({:.0} placements/s), {} evictions, {} pending explained, \
         newly bound GPU {:.1}% of the cluster, decisions {decisions:016x}",
        d.bindings.len(),
        d.bindings.len() as f64 / secs,
        d.evictions.len(),
        d.pending.len(),
        gpu_milli as f64 / (gpus as f64 * 10.0)
    );
    let mut first_reason: BTreeMap<String, usize> = BTreeMap::new();
    for p in &d.pending {
        let head = p.message.split([';', ':']).next().unwrap_or("").to_string();
        *first_reason.entry(head).or_default() += 1;
    }
    let mut top: Vec<(String, usize)> = first_reason.into_iter().collect();
    top.sort_by_key(|t| std::cmp::Reverse(t.1));
    for (r, n) in top.iter().take(3) {
        println!("  pending {n:>6}: {r}");
    }
    if let Some(p) = d.pending.first() {
        println!("  e.g. {}: {}", p.pod, p.message);
    }
}

fn req(key: &str, op: SelectorOp, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: op,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

/// Constraints on a realistic share of the benchmark: every pod labelled `app` (one of 50) and
/// tolerating the `dedicated=ml` taint that one node in ten carries; one pod in five with
/// required node affinity (`zone NotIn [z0]`); one in twenty, outside gangs, with required
/// anti-affinity to its own app per node; one in twenty spread over zones (`maxSkew` 2, hard).
fn constrain(snap: &mut Snapshot, spread: bool) {
    for (i, n) in snap.nodes.iter_mut().enumerate() {
        if i % 10 == 0 {
            n.constraints.taints.push(Taint {
                key: "dedicated".into(),
                value: "ml".into(),
                effect: TaintEffect::NoSchedule,
            });
        }
    }
    for (i, p) in snap.pods.iter_mut().enumerate() {
        let app = format!("app-{}", i % 50);
        let c = &mut p.constraints;
        c.labels.insert("app".into(), app.clone());
        c.tolerations.push(Toleration {
            key: "dedicated".into(),
            operator: TolerationOp::Equal,
            value: "ml".into(),
            effect: Some(TaintEffect::NoSchedule),
        });
        let own_app = Some(LabelSelector {
            requirements: vec![req("app", SelectorOp::In, &[&app])],
        });
        if i % 5 == 0 {
            c.node_affinity = Some(NodeSelector {
                terms: vec![NodeSelectorTerm {
                    match_expressions: vec![req("zone", SelectorOp::NotIn, &["z0"])],
                    match_fields: vec![],
                }],
            });
        }
        if i % 20 == 1 && p.group.is_none() {
            c.pod_anti_affinity.push(PodAffinityTerm {
                selector: own_app.clone(),
                namespaces: Default::default(),
                topology_key: "kubernetes.io/hostname".into(),
            });
        }
        if spread && i % 20 == 2 {
            c.spread.push(SpreadConstraint {
                max_skew: 2,
                topology_key: "zone".into(),
                hard: true,
                selector: own_app,
                min_domains: None,
                node_affinity_policy: InclusionPolicy::Honor,
                node_taints_policy: InclusionPolicy::Ignore,
            });
        }
    }
    for n in &mut snap.nodes {
        let name = n.name.clone();
        n.labels.insert("kubernetes.io/hostname".into(), name);
    }
}

fn main() {
    let spec = SyntheticSpec {
        nodes: env_or("TESSERA_BENCH_NODES", 5000),
        pending_pods: env_or("TESSERA_BENCH_PODS", 50_000),
        ..SyntheticSpec::default()
    };
    let t = Instant::now();
    let mut snap = synthetic(&spec);
    let mode = std::env::var("TESSERA_BENCH_CONSTRAINED").unwrap_or_default();
    let constrained = mode == "1" || mode == "no-spread";
    if constrained {
        constrain(&mut snap, mode == "1");
    }
    println!(
        "cluster: {} nodes, {} GPUs, {} pending pods, {} groups, {} queues{} (built in {:.2?})",
        snap.nodes.len(),
        snap.nodes.iter().map(|n| n.gpus.len()).sum::<usize>(),
        snap.pods.len(),
        snap.groups.len(),
        snap.queues.len(),
        if constrained { ", constrained" } else { "" },
        t.elapsed()
    );
    let cfg = CycleConfig::default();
    let t = Instant::now();
    let d = schedule(&snap, &cfg);
    report(
        "cycle 1 (empty cluster)",
        &snap,
        &d,
        t.elapsed().as_secs_f64(),
    );
    // Apply the bindings; the rest stays pending and competes in cycle 2.
    let by_uid: BTreeMap<String, usize> = snap
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.uid.clone(), i))
        .collect();
    for b in &d.bindings {
        let p = &mut snap.pods[by_uid[&b.pod]];
        *p = p.clone().bound(&b.node, b.assignment.clone());
    }
    snap.now += 60;
    let t = Instant::now();
    let d2 = schedule(&snap, &cfg);
    report(
        "cycle 2 (bound cluster, victims)",
        &snap,
        &d2,
        t.elapsed().as_secs_f64(),
    );
    match vm_hwm_kib() {
        Some(k) => println!("peak RSS (VmHWM): {:.1} MiB", k as f64 / 1024.0),
        None => println!("peak RSS: unavailable (/proc/self/status)"),
    }
}
