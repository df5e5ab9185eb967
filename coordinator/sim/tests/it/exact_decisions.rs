//! Exact decisions: the fill engine and the scheduling cycle decide exactly what a recorded
//! golden run decided, pod for pod. Speed work on the core must keep this test green; a change
//! that is meant to change decisions re-records the golden file and says why in its commit.
//!
//! Covered:
//! - fill, every policy, on the five openb trace variants (generated order, seed 42);
//! - fill, `tessera` and `fgd`, on the published arrival orders `events/default_s4{2..6}`;
//! - fill, `tessera`, `fgd` and `bestfit`, on the openb nodes repeated three times (many
//!   identical nodes, so ties between equal nodes decide a lot);
//! - two scheduling cycles (the second on the first's bindings, so reclaim, preemption and
//!   consolidation run) on synthetic clusters with gangs, fractions, GPU-memory requests and
//!   queues in two levels, several seeds and shapes, with and without kube-scheduler
//!   constraints.
//!
//! Each run is reduced to a count and FNV-1a digests of its decisions in blocks of
//! [`BLOCK`] decisions, so a failure names the first block that differs. The fill parts skip
//! without the openb data (`../shared/data/openb`). Re-record with `TESSERA_BLESS=1` (files
//! `tests/it/golden/exact_decisions_*.txt`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tessera_core::cycle::{CycleConfig, Decisions, schedule};
use tessera_core::model::synthetic::{SyntheticSpec, synthetic};
use tessera_core::model::{
    InclusionPolicy, LabelSelector, NodeSelector, NodeSelectorTerm, PodAffinityTerm, Requirement,
    SelectorOp, Snapshot, SpreadConstraint, Taint, TaintEffect, Toleration, TolerationOp,
};
use tessera_sim::cluster::Cluster;
use tessera_sim::experiment::{FillSpec, default_data_dir, prepare};
use tessera_sim::fill::run_fill;
use tessera_sim::openb::{OpenbNode, read_nodes, read_pods};
use tessera_sim::policy::Policy;
use tessera_sim::trace::{TYPICAL_COVERAGE, generate, typical_mix};

/// Decisions per digest block.
const BLOCK: usize = 1000;

/// The golden file of one section (one per test, so recording runs in parallel safely).
fn golden_path(section: &str) -> PathBuf {
    manifest().join(format!("tests/it/golden/exact_decisions_{section}.txt"))
}

/// FNV-1a over a stream of decision lines, one digest per [`BLOCK`] lines.
struct Digest {
    count: usize,
    cur: u64,
    blocks: Vec<u64>,
}

impl Digest {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

    fn new() -> Digest {
        Digest {
            count: 0,
            cur: Self::OFFSET,
            blocks: Vec::new(),
        }
    }

    fn line(&mut self, s: &str) {
        for b in s.bytes().chain(std::iter::once(b'\n')) {
            self.cur ^= u64::from(b);
            self.cur = self.cur.wrapping_mul(0x0100_0000_01b3);
        }
        self.count += 1;
        if self.count.is_multiple_of(BLOCK) {
            self.blocks.push(self.cur);
            self.cur = Self::OFFSET;
        }
    }

    fn finish(mut self) -> String {
        if !self.count.is_multiple_of(BLOCK) || self.count == 0 {
            self.blocks.push(self.cur);
        }
        let mut out = format!("{}", self.count);
        for b in &self.blocks {
            let _ = write!(out, " {b:016x}");
        }
        out
    }
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn load_golden(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Compares `got` with the golden file, or records it there under `TESSERA_BLESS=1`.
fn check(section: &str, got: BTreeMap<String, String>) {
    let path = golden_path(section);
    let golden = load_golden(&path);
    if std::env::var("TESSERA_BLESS").is_ok_and(|v| v == "1") {
        let mut text = String::from(
            "# Golden decisions of tests/exact_decisions.rs: name: count, then FNV-1a digests per 1000 decisions.\n",
        );
        for (k, v) in &got {
            let _ = writeln!(text, "{k}: {v}");
        }
        std::fs::create_dir_all(path.parent().expect("golden path has a parent"))
            .expect("create the golden directory");
        std::fs::write(&path, text).expect("write the golden file");
        return;
    }
    let mut failures = Vec::new();
    for (k, v) in &got {
        match golden.get(k) {
            None => failures.push(format!(
                "{k}: not in the golden file (record with TESSERA_BLESS=1)"
            )),
            Some(g) if g != v => {
                let (gw, vw): (Vec<&str>, Vec<&str>) =
                    (g.split(' ').collect(), v.split(' ').collect());
                let block = gw
                    .iter()
                    .zip(&vw)
                    .skip(1)
                    .position(|(a, b)| a != b)
                    .map_or_else(|| "count".to_string(), |i| format!("block {i}"));
                failures.push(format!(
                    "{k}: decisions differ first in {block} (golden count {}, now {})",
                    gw[0], vw[0]
                ));
            }
            Some(_) => {}
        }
    }
    for k in golden.keys() {
        if !got.contains_key(k) {
            failures.push(format!("{k}: recorded but not run"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn fill_digest(
    cluster: &Cluster,
    mix: &tessera_core::placement::frag::ShapeMix,
    pods: &[tessera_sim::cluster::SimPod],
    policy: Policy,
) -> String {
    let out = run_fill(cluster, mix, pods, policy, 42, &mut |_, _| {});
    let mut d = Digest::new();
    for p in &out.placements {
        match p {
            Some(p) => d.line(&format!("{} {:x}", p.node, p.gpus)),
            None => d.line("-"),
        }
    }
    d.finish()
}

fn data_dir() -> Option<PathBuf> {
    let d = default_data_dir(manifest());
    if d.is_none() {
        eprintln!("openb data not found at ../shared/data/openb: skipping the fill part");
    }
    d
}

#[test]
fn fill_decisions_on_openb_traces_are_unchanged() {
    let Some(dir) = data_dir() else { return };
    let mut got = BTreeMap::new();
    for trace in ["default", "gpushare40", "multigpu20", "gpuspec10", "cpu050"] {
        let spec = FillSpec {
            nodes: dir.join("openb_node_list_gpu_node.csv"),
            pods: dir.join(format!("openb_pod_list_{trace}.csv")),
            events: None,
            prefixes: None,
            inflate: 1.3,
            seed: 42,
        };
        let p = prepare(&spec).expect("openb trace");
        for policy in Policy::ALL {
            got.insert(
                format!("fill/{trace}/s42/{}", policy.name()),
                fill_digest(&p.cluster, &p.mix, &p.arrivals, policy),
            );
        }
    }
    for seed in 42..=46 {
        let events = dir.join(format!("events/default_s{seed}_order.csv.gz"));
        if !events.exists() {
            continue;
        }
        let spec = FillSpec {
            nodes: dir.join("openb_node_list_gpu_node.csv"),
            pods: dir.join("openb_pod_list_default.csv"),
            events: Some(events),
            prefixes: None,
            inflate: 1.3,
            seed,
        };
        let p = prepare(&spec).expect("openb events");
        for policy in [Policy::Tessera, Policy::Fgd] {
            got.insert(
                format!("fill/default/events-s{seed}/{}", policy.name()),
                fill_digest(&p.cluster, &p.mix, &p.arrivals, policy),
            );
        }
    }
    check("fill", got);
}

/// The openb nodes three times over (copies `<node>-r<k>`) with the default trace's pods in
/// a generated order tuned to 130% of that cluster: the shape of `examples/bench_fill.rs`.
#[test]
fn fill_decisions_on_repeated_openb_nodes_are_unchanged() {
    let Some(dir) = data_dir() else { return };
    let base = read_nodes(&dir.join("openb_node_list_gpu_node.csv")).expect("openb nodes");
    let original = read_pods(&dir.join("openb_pod_list_default.csv")).expect("openb pods");
    let nodes: Vec<OpenbNode> = (0..base.len() * 3)
        .map(|i| {
            let mut n = base[i % base.len()].clone();
            n.name = format!("{}-r{}", n.name, i / base.len());
            n
        })
        .collect();
    let mut cluster = Cluster::from_openb(&nodes, None);
    let arrivals = generate(&original, cluster.gpu_milli(), nodes.len(), 1.3, 7);
    cluster.apply_permutation(&arrivals.node_perm);
    for p in &original {
        for m in p
            .gpu_spec
            .split('|')
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            if cluster.models.get(m).is_none() {
                cluster.models.intern(m);
            }
        }
    }
    let mix = typical_mix(&cluster, &original, TYPICAL_COVERAGE);
    let pods: Vec<_> = arrivals.pods.iter().map(|p| cluster.pod(p)).collect();
    let mut got = BTreeMap::new();
    for policy in [Policy::Tessera, Policy::Fgd, Policy::BestFit] {
        got.insert(
            format!("fill-x3/default/s7/{}", policy.name()),
            fill_digest(&cluster, &mix, &pods, policy),
        );
    }
    check("fill-x3", got);
}

fn cycle_digest(d: &Decisions) -> String {
    let mut g = Digest::new();
    for b in &d.bindings {
        g.line(&serde_json::to_string(b).expect("binding serialises"));
    }
    for e in &d.evictions {
        g.line(&serde_json::to_string(e).expect("eviction serialises"));
    }
    for p in &d.pending {
        g.line(&serde_json::to_string(p).expect("explanation serialises"));
    }
    for q in &d.fair_shares {
        g.line(&serde_json::to_string(q).expect("share serialises"));
    }
    g.line(&d.gangs_below_min.join(","));
    g.finish()
}

fn req(key: &str, op: SelectorOp, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: op,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

/// The constraints of `examples/bench_cycle.rs` (`TESSERA_BENCH_CONSTRAINED=1`): taints,
/// tolerations, node affinity, anti-affinity and hard topology spread on a share of the pods.
fn constrain(snap: &mut Snapshot) {
    for (i, n) in snap.nodes.iter_mut().enumerate() {
        if i % 10 == 0 {
            n.constraints.taints.push(Taint {
                key: "dedicated".into(),
                value: "ml".into(),
                effect: TaintEffect::NoSchedule,
            });
        }
        let name = n.name.clone();
        n.labels.insert("kubernetes.io/hostname".into(), name);
    }
    for (i, p) in snap.pods.iter_mut().enumerate() {
        let app = format!("app-{}", i % 50);
        let c = &mut p.constraints;
        c.labels.insert("app".into(), app.clone());
        if i % 3 != 0 {
            c.tolerations.push(Toleration {
                key: "dedicated".into(),
                operator: TolerationOp::Equal,
                value: "ml".into(),
                effect: Some(TaintEffect::NoSchedule),
            });
        }
        let own_app = Some(LabelSelector {
            requirements: vec![req("app", SelectorOp::In, &[&app])],
        });
        if i % 5 == 0 {
            c.node_affinity = Some(NodeSelector {
                terms: vec![NodeSelectorTerm {
                    match_expressions: vec![req("rack", SelectorOp::NotIn, &["r0000"])],
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
        if i % 20 == 2 {
            c.spread.push(SpreadConstraint {
                max_skew: 2,
                topology_key: "rack".into(),
                hard: true,
                selector: own_app,
                min_domains: None,
                node_affinity_policy: InclusionPolicy::Honor,
                node_taints_policy: InclusionPolicy::Ignore,
            });
        }
    }
}

/// Two cycles: the snapshot as given, then again with the first cycle's bindings applied.
fn two_cycles(mut snap: Snapshot) -> (String, String) {
    let cfg = CycleConfig::default();
    let d1 = schedule(&snap, &cfg);
    let by_uid: BTreeMap<String, usize> = snap
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.uid.clone(), i))
        .collect();
    for b in &d1.bindings {
        let p = &mut snap.pods[by_uid[&b.pod]];
        *p = p.clone().bound(&b.node, b.assignment.clone());
    }
    snap.now += 60;
    let d2 = schedule(&snap, &cfg);
    (cycle_digest(&d1), cycle_digest(&d2))
}

#[test]
fn cycle_decisions_on_synthetic_clusters_are_unchanged() {
    let mut got = BTreeMap::new();
    let shapes = [
        ("n400-p4000", 400, 8, 4000, 64),
        ("n250-p3000-g4", 250, 4, 3000, 32),
    ];
    for (name, nodes, gpus, pods, gang) in shapes {
        for seed in 1..=3 {
            let spec = SyntheticSpec {
                nodes,
                gpus_per_node: gpus,
                nodes_per_rack: 16,
                pending_pods: pods,
                max_gang: gang,
                seed,
                ..SyntheticSpec::default()
            };
            let (a, b) = two_cycles(synthetic(&spec));
            got.insert(format!("cycle/{name}/s{seed}/1"), a);
            got.insert(format!("cycle/{name}/s{seed}/2"), b);
            if seed == 1 {
                let mut snap = synthetic(&spec);
                constrain(&mut snap);
                let (a, b) = two_cycles(snap);
                got.insert(format!("cycle/{name}-constrained/s{seed}/1"), a);
                got.insert(format!("cycle/{name}-constrained/s{seed}/2"), b);
            }
        }
    }
    check("cycle", got);
}
