//! The arrival-only fill-up experiment: pods arrive one at a time, each is placed on the best
//! feasible node by the policy (ties to the smallest tie key) or dropped; nothing ever leaves.
//!
//! Speed comes from memoising the fragmentation measure. A node's fragmentation depends only on
//! its model, free CPU and the multiset of free GPU milli, so `F` is cached per packed state; the
//! node score of a fragmentation policy depends on that state and the pod shape, so scores are
//! cached per (state, shape). Identical nodes (most of an empty cluster) share entries, and a
//! placement invalidates nothing: the changed node simply has a new state key.
//!
//! The memoised policies (`tessera`, `fgd`) also keep, per shape, the nodes ordered by score
//! (`fill_index`): a pod reads its best node from its shape's index after only the nodes
//! changed since that index was last read are re-scored, so a placement costs about
//! `shapes x log(nodes)` instead of a scan of every node. The other policies scan.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use tessera_core::placement::frag::{
    FragBreakdown, GPU_MILLI, NodeView, ShapeMix, TaskShape, fgd_score, fragmentation,
    fragmentation_by_category,
};

use tessera_core::model::GpuShare;
use tessera_core::placement::{GpuFree, NodeCapacity, PodDemand, ScoreWeights, place_on_node};

use super::cluster::{Cluster, SimPod};
use super::fill_index::{Leaf, MaxTree, Score, ShapeTree};
use super::policy::{
    Policy, best_gpus, bestfit_raw, cluster_tag, clustering_score, dotprod_score, normalise,
    packing_score,
};
use rustc_hash::FxHashMap;

/// Maximum pods per node (the published node YAML's `pods: 1001`, never binding).
const MAX_PODS: u32 = 1001;

/// Cluster totals after one arrival.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventPoint {
    /// Cumulative GPU milli requested by all arrived pods (failed ones included).
    pub arrived_milli: u64,
    /// GPU milli allocated.
    pub used_milli: u64,
    /// Cluster fragmentation `sum_n F_n` in milli-GPU.
    pub frag_milli: f64,
}

/// Where one pod went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Node index in the cluster.
    pub node: usize,
    /// Bitmask of the GPU indices used on that node.
    pub gpus: u64,
}

/// The result of one fill run.
#[derive(Clone, Debug)]
pub struct FillOutcome {
    /// The node-scoring policy this run placed pods with, for labelling the report.
    pub policy: Policy,
    /// Pods placed.
    pub placed: usize,
    /// Pods that fit nowhere (dropped).
    pub failed: usize,
    /// Scheduling time only (the placement loop).
    pub wall: Duration,
    /// Cluster totals after every arrival.
    pub events: Vec<EventPoint>,
    /// Placement of every pod (`None` = failed).
    pub placements: Vec<Option<Placement>>,
    /// Allocated GPU milli at the end.
    pub used_gpu_milli: u64,
    /// GPUs with any allocation at the end.
    pub used_gpus: u64,
    /// Allocated CPU milli at the end.
    pub used_cpu_milli: u64,
    /// Allocated memory MiB at the end.
    pub used_memory_mib: u64,
    /// Idle GPU split by fragmentation category at the end, summed over nodes.
    pub frag: FragBreakdown,
}

/// Mutable state of one node.
#[derive(Clone, Debug)]
struct NodeState {
    cpu_free: u64,
    mem_free: u64,
    gpu_free: Vec<u32>,
    pods: u32,
    tags: u64,
    /// Packed state for the memo tables; `None` for nodes too large to pack.
    key: Option<u128>,
    frag: f64,
}

/// Packs (model, cpu, sorted GPU free list) into one integer, or `None` if it does not fit.
fn pack(model: u32, cpu: u64, gpus: &[u32]) -> Option<u128> {
    if gpus.len() > 8 || cpu >= 1 << 24 || model >= 64 {
        return None;
    }
    let mut sorted = [0u32; 8];
    sorted[..gpus.len()].copy_from_slice(gpus);
    sorted[..gpus.len()].sort_unstable_by(|a, b| b.cmp(a));
    let mut k: u128 = u128::from(model) | (gpus.len() as u128) << 6 | u128::from(cpu) << 10;
    for (i, &f) in sorted.iter().take(gpus.len()).enumerate() {
        k |= u128::from(f.min(2047)) << (34 + 11 * i);
    }
    Some(k)
}

/// Fragmentation memo keyed by packed node state.
struct FragMemo {
    mix: ShapeMix,
    table: FxHashMap<u128, f64>,
}

impl FragMemo {
    fn get(&mut self, model: u32, cpu: u64, gpus: &[u32]) -> f64 {
        let compute = |mix| {
            fragmentation(
                &NodeView {
                    cpu_free: cpu,
                    gpu_free: gpus,
                    model,
                },
                mix,
            )
        };
        match pack(model, cpu, gpus) {
            Some(k) => *self.table.entry(k).or_insert_with(|| compute(&self.mix)),
            None => compute(&self.mix),
        }
    }
}

/// Bit of a memo key (above the packed node state) saying the node already hosts a pod, which
/// the Tessera score depends on.
const IN_USE_BIT: u128 = 1 << 127;

/// The fill engine over one cluster.
pub struct FillEngine<'a> {
    cluster: &'a Cluster,
    policy: Policy,
    nodes: Vec<NodeState>,
    rank: Vec<u32>,
    memo: FragMemo,
    score_memo: FxHashMap<(u128, u32), Score>,
    shape_ids: FxHashMap<TaskShape, u32>,
    rng: ChaCha8Rng,
    /// Reused buffer for the BestFit normalisation pass.
    feasible: Vec<(usize, i64)>,
    /// Weights of the core's placement (policy `tessera`).
    core_weights: ScoreWeights,
    /// Node at each tie-rank position.
    by_rank: Vec<u32>,
    /// Per shape id, the ordered index of nodes by score (memoised policies only).
    trees: Vec<Option<ShapeTree>>,
    /// Nodes changed by placements, in order; each tree remembers how far it has read.
    changed: Vec<u32>,
    /// Free memory by tie-rank position, maximised over subtrees.
    mem: MaxTree,
}

impl<'a> FillEngine<'a> {
    /// A fresh, empty cluster. `seed` drives only the Random policy.
    pub fn new(cluster: &'a Cluster, mix: &'a ShapeMix, policy: Policy, seed: u64) -> Self {
        let mut order: Vec<usize> = (0..cluster.nodes.len()).collect();
        order.sort_by(|&a, &b| cluster.nodes[a].tie_key.cmp(&cluster.nodes[b].tie_key));
        let mut rank = vec![0u32; cluster.nodes.len()];
        for (r, &n) in order.iter().enumerate() {
            rank[n] = r as u32;
        }
        let mut memo = FragMemo {
            mix: mix.clone(),
            table: FxHashMap::default(),
        };
        let nodes = cluster
            .nodes
            .iter()
            .map(|n| {
                let gpu_free = vec![GPU_MILLI; n.gpus as usize];
                let frag = memo.get(n.model, n.cpu_milli, &gpu_free);
                NodeState {
                    cpu_free: n.cpu_milli,
                    mem_free: n.memory_mib,
                    key: pack(n.model, n.cpu_milli, &gpu_free),
                    gpu_free,
                    pods: 0,
                    tags: 0,
                    frag,
                }
            })
            .collect();
        let mut by_rank = vec![0u32; cluster.nodes.len()];
        for (n, &r) in rank.iter().enumerate() {
            by_rank[r as usize] = n as u32;
        }
        let mem_by_rank: Vec<u64> = by_rank
            .iter()
            .map(|&n| cluster.nodes[n as usize].memory_mib)
            .collect();
        FillEngine {
            cluster,
            policy,
            nodes,
            rank,
            by_rank,
            trees: Vec::new(),
            changed: Vec::new(),
            mem: MaxTree::new(&mem_by_rank),
            memo,
            score_memo: FxHashMap::default(),
            shape_ids: FxHashMap::default(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            feasible: Vec::new(),
            core_weights: ScoreWeights::default(),
        }
    }

    /// Runs the whole arrival sequence; `progress(done, total)` is called every 256 pods.
    pub fn run(mut self, pods: &[SimPod], progress: &mut dyn FnMut(usize, usize)) -> FillOutcome {
        let ids: Vec<u32> = pods.iter().map(|p| self.shape_id(&p.shape)).collect();
        let mut events = Vec::with_capacity(pods.len());
        let mut placements = Vec::with_capacity(pods.len());
        let (mut arrived, mut used, mut cpu, mut mem) = (0u64, 0u64, 0u64, 0u64);
        let mut frag_total: f64 = self.nodes.iter().map(|n| n.frag).sum();
        let start = Instant::now();
        for (i, (pod, &sid)) in pods.iter().zip(&ids).enumerate() {
            arrived += pod.shape.gpu_total();
            let placed = self.place(pod, sid);
            if let Some(p) = placed {
                used += pod.shape.gpu_total();
                cpu += pod.shape.cpu_milli;
                mem += pod.memory_mib;
                frag_total += self.apply(p, pod);
            }
            placements.push(placed);
            events.push(EventPoint {
                arrived_milli: arrived,
                used_milli: used,
                frag_milli: frag_total,
            });
            if i % 256 == 255 {
                progress(i + 1, pods.len());
            }
        }
        let wall = start.elapsed();
        progress(pods.len(), pods.len());
        let mut frag = FragBreakdown::default();
        for (n, s) in self.cluster.nodes.iter().zip(&self.nodes) {
            let view = NodeView {
                cpu_free: s.cpu_free,
                gpu_free: &s.gpu_free,
                model: n.model,
            };
            frag.add(&fragmentation_by_category(&view, &self.memo.mix));
        }
        let placed = placements.iter().filter(|p| p.is_some()).count();
        FillOutcome {
            policy: self.policy,
            placed,
            failed: pods.len() - placed,
            wall,
            events,
            placements,
            used_gpu_milli: used,
            used_gpus: self
                .nodes
                .iter()
                .map(|n| n.gpu_free.iter().filter(|&&f| f < GPU_MILLI).count() as u64)
                .sum(),
            used_cpu_milli: cpu,
            used_memory_mib: mem,
            frag,
        }
    }

    fn shape_id(&mut self, shape: &TaskShape) -> u32 {
        let next = self.shape_ids.len() as u32;
        *self.shape_ids.entry(*shape).or_insert(next)
    }

    fn feasible(&self, n: usize, pod: &SimPod) -> bool {
        let s = &self.nodes[n];
        let sh = &pod.shape;
        if s.cpu_free < sh.cpu_milli || s.mem_free < pod.memory_mib || s.pods >= MAX_PODS {
            return false;
        }
        if sh.is_cpu_only() {
            return true;
        }
        if s.gpu_free.is_empty() || !sh.models.contains(self.cluster.nodes[n].model) {
            return false;
        }
        s.gpu_free.iter().filter(|&&f| f >= sh.gpu_milli).count() >= sh.gpu_count as usize
    }

    /// Chooses the node and GPUs for one pod, or `None` if it fits nowhere.
    fn place(&mut self, pod: &SimPod, sid: u32) -> Option<Placement> {
        let node = match self.policy {
            Policy::Random => {
                let feasible: Vec<usize> = (0..self.nodes.len())
                    .filter(|&n| self.feasible(n, pod))
                    .collect();
                if feasible.is_empty() {
                    None
                } else {
                    Some(feasible[self.rng.random_range(0..feasible.len())])
                }
            }
            Policy::BestFit => self.pick_bestfit(pod),
            Policy::Tessera | Policy::Fgd => self.pick_indexed(pod, sid),
            _ => {
                let mut best: Option<([i64; 2], u32, usize)> = None;
                for n in 0..self.nodes.len() {
                    if !self.feasible(n, pod) {
                        continue;
                    }
                    let s = self.score(n, pod, sid);
                    let r = self.rank[n];
                    if best.is_none_or(|(bs, br, _)| s > bs || (s == bs && r < br)) {
                        best = Some((s, r, n));
                    }
                }
                best.map(|(_, _, n)| n)
            }
        }?;
        let gpus = self.choose_gpus(node, &pod.shape)?;
        Some(Placement { node, gpus })
    }

    /// The node a full scan would pick (highest score, then smallest rank, among feasible
    /// nodes), read from the shape's ordered index after re-scoring the nodes changed since
    /// the index was last read.
    fn pick_indexed(&mut self, pod: &SimPod, sid: u32) -> Option<usize> {
        let n = self.nodes.len();
        let sid_ix = sid as usize;
        if self.trees.len() <= sid_ix {
            self.trees.resize_with(sid_ix + 1, || None);
        }
        let mut tree = self.trees[sid_ix]
            .take()
            .unwrap_or_else(|| ShapeTree::new(n));
        let shape = pod.shape;
        match tree.cursor {
            // Re-scoring a changed node costs about what scoring it in a rebuild does, so a
            // long backlog is cheaper as one rebuild.
            Some(c) if self.changed.len() - c <= n / 2 => {
                for i in c..self.changed.len() {
                    let node = self.changed[i] as usize;
                    let leaf = self.leaf(node, &shape, sid);
                    tree.set(self.rank[node] as usize, leaf);
                }
            }
            _ => {
                let by_rank = std::mem::take(&mut self.by_rank);
                tree.rebuild(|p| self.leaf(by_rank[p] as usize, &shape, sid), n);
                self.by_rank = by_rank;
            }
        }
        tree.cursor = Some(self.changed.len());
        let best = tree
            .best(&self.mem, pod.memory_mib)
            .map(|p| self.by_rank[p] as usize);
        self.trees[sid_ix] = Some(tree);
        best
    }

    /// Node `n`'s standing for `shape`: whether everything but memory admits it, and its score.
    fn leaf(&mut self, n: usize, shape: &TaskShape, sid: u32) -> Leaf {
        // Memory is the pod's, checked by the query; zero here admits every node.
        let probe = SimPod {
            name: String::new(),
            memory_mib: 0,
            shape: *shape,
        };
        if !self.feasible(n, &probe) {
            return Leaf::NONE;
        }
        Leaf {
            feasible: true,
            score: self.score(n, &probe, sid),
        }
    }

    fn pick_bestfit(&mut self, pod: &SimPod) -> Option<usize> {
        let mut feasible = std::mem::take(&mut self.feasible);
        feasible.clear();
        for n in 0..self.nodes.len() {
            if self.feasible(n, pod) {
                let s = &self.nodes[n];
                feasible.push((n, bestfit_raw(s.cpu_free, &s.gpu_free, &pod.shape)));
            }
        }
        let lo = feasible.iter().map(|f| f.1).min().unwrap_or(0);
        let hi = feasible.iter().map(|f| f.1).max().unwrap_or(0);
        let best = feasible
            .iter()
            .map(|&(n, raw)| (normalise(raw, lo, hi), std::cmp::Reverse(self.rank[n]), n))
            .max()
            .map(|(_, _, n)| n);
        self.feasible = feasible;
        best
    }

    fn score(&mut self, n: usize, pod: &SimPod, sid: u32) -> Score {
        let s = &self.nodes[n];
        match self.policy {
            Policy::Packing => [packing_score(&s.gpu_free, &pod.shape), 0],
            Policy::Clustering => [clustering_score(&s.gpu_free, s.tags, &pod.shape), 0],
            Policy::DotProd => [dotprod_score(s.cpu_free, &s.gpu_free, &pod.shape), 0],
            Policy::Fgd => {
                if let Some(k) = s.key
                    && let Some(hit) = self.score_memo.get(&(k, sid))
                {
                    return *hit;
                }
                let key = s.key;
                let (score, _) = self.frag_choice(n, &pod.shape);
                if let Some(k) = key {
                    self.score_memo.insert((k, sid), score);
                }
                score
            }
            Policy::Tessera => {
                // The core's score depends on the packed state and on whether the node is in use.
                let key = s.key.map(|k| if s.pods > 0 { k | IN_USE_BIT } else { k });
                if let Some(k) = key
                    && let Some(hit) = self.score_memo.get(&(k, sid))
                {
                    return *hit;
                }
                let score = self
                    .core_choice(n, pod)
                    .map_or([i64::MIN, i64::MIN], |(sc, _)| sc);
                if let Some(k) = key {
                    self.score_memo.insert((k, sid), score);
                }
                score
            }
            // Scored by their own selection passes.
            Policy::BestFit | Policy::Random => [0, 0],
        }
    }

    /// The core's placement of `pod` on node `n`: its score and the GPU mask.
    fn core_choice(&self, n: usize, pod: &SimPod) -> Option<(Score, u64)> {
        let s = &self.nodes[n];
        let cap = NodeCapacity {
            cpu_free: s.cpu_free,
            mem_free: s.mem_free,
            model: self.cluster.nodes[n].model,
            gpus: s
                .gpu_free
                .iter()
                .map(|&f| GpuFree {
                    compute_free: f,
                    mem_free: 0,
                    mem_total: 0,
                    healthy: true,
                    fence: None,
                    mig: false,
                    island: None,
                    holders: u32::from(f < GPU_MILLI),
                })
                .collect(),
            schedulable: true,
            pods: s.pods,
            max_pods: u32::MAX,
        };
        let sh = &pod.shape;
        let demand = PodDemand {
            cpu_milli: sh.cpu_milli,
            memory_mib: pod.memory_mib,
            gpu_count: if sh.is_cpu_only() { 0 } else { sh.gpu_count },
            share: if sh.gpu_milli >= GPU_MILLI || sh.is_cpu_only() {
                GpuShare::Whole
            } else {
                GpuShare::Fraction(sh.gpu_milli)
            },
            models: sh.models,
            mig: false,
            tolerates_cordon: false,
            class: 0,
        };
        let choice = place_on_node(&cap, &demand, &self.memo.mix, &self.core_weights).ok()?;
        let mask = choice
            .gpus
            .iter()
            .fold(0u64, |m, (i, _, _)| m | (1u64 << i));
        Some((choice.score.0, mask))
    }

    /// Scores node `n` for FGD: `[FGD score, 0]` of the best GPU choice, and that choice (the
    /// first GPU with the highest integer score).
    fn frag_choice(&mut self, n: usize, shape: &TaskShape) -> (Score, u64) {
        let model = self.cluster.nodes[n].model;
        let s = &self.nodes[n];
        let before = s.frag;
        let cpu_after = s.cpu_free - shape.cpu_milli.min(s.cpu_free);
        let mut buf = [0u32; 64];
        let len = s.gpu_free.len().min(64);
        buf[..len].copy_from_slice(&s.gpu_free[..len]);
        let rate = |after: f64| -> Score { [fgd_score(before, after), 0] };
        if shape.is_cpu_only() {
            let after = self.memo.get(model, cpu_after, &buf[..len]);
            return (rate(after), 0);
        }
        if shape.gpu_count == 1 && shape.gpu_milli < GPU_MILLI {
            // Share pod: try each GPU that fits; equal free values give equal results.
            let mut best: Option<(Score, usize)> = None;
            let mut seen: [(u32, Score); 64] = [(u32::MAX, [0, 0]); 64];
            let mut nseen = 0;
            for g in 0..len {
                let f = buf[g];
                if f < shape.gpu_milli {
                    continue;
                }
                let score = match seen[..nseen].iter().find(|(v, _)| *v == f) {
                    Some((_, sc)) => *sc,
                    None => {
                        buf[g] = f - shape.gpu_milli;
                        let sc = rate(self.memo.get(model, cpu_after, &buf[..len]));
                        buf[g] = f;
                        seen[nseen] = (f, sc);
                        nseen += 1;
                        sc
                    }
                };
                if best.is_none_or(|(bs, _)| score > bs) {
                    best = Some((score, g));
                }
            }
            return best.map_or(([i64::MIN, 0], 0), |(s, g)| (s, 1u64 << g));
        }
        let Some(mask) = best_gpus(&buf[..len], shape.gpu_milli, shape.gpu_count) else {
            return ([i64::MIN, 0], 0);
        };
        for (g, f) in buf[..len].iter_mut().enumerate() {
            if mask >> g & 1 == 1 {
                *f -= shape.gpu_milli;
            }
        }
        (rate(self.memo.get(model, cpu_after, &buf[..len])), mask)
    }

    /// The GPUs the chosen node gives the pod, per the policy's GPU-selection rule.
    fn choose_gpus(&mut self, n: usize, shape: &TaskShape) -> Option<u64> {
        if shape.is_cpu_only() {
            return Some(0);
        }
        match self.policy {
            Policy::Fgd => {
                let (_, mask) = self.frag_choice(n, shape);
                (mask != 0).then_some(mask)
            }
            Policy::Tessera => {
                let pod = SimPod {
                    name: String::new(),
                    memory_mib: 0,
                    shape: *shape,
                };
                self.core_choice(n, &pod)
                    .map(|(_, m)| m)
                    .filter(|&m| m != 0)
            }
            Policy::Random if shape.gpu_count == 1 && shape.gpu_milli < GPU_MILLI => {
                let fitting: Vec<usize> = (0..self.nodes[n].gpu_free.len())
                    .filter(|&g| self.nodes[n].gpu_free[g] >= shape.gpu_milli)
                    .collect();
                if fitting.is_empty() {
                    None
                } else {
                    Some(1u64 << fitting[self.rng.random_range(0..fitting.len())])
                }
            }
            _ => best_gpus(&self.nodes[n].gpu_free, shape.gpu_milli, shape.gpu_count),
        }
    }

    /// Commits a placement and returns the change of the node's fragmentation.
    fn apply(&mut self, p: Placement, pod: &SimPod) -> f64 {
        let model = self.cluster.nodes[p.node].model;
        let s = &mut self.nodes[p.node];
        s.cpu_free -= pod.shape.cpu_milli;
        s.mem_free -= pod.memory_mib;
        s.pods += 1;
        s.tags |= cluster_tag(&pod.shape);
        for (g, f) in s.gpu_free.iter_mut().enumerate() {
            if p.gpus >> g & 1 == 1 {
                *f -= pod.shape.gpu_milli;
            }
        }
        s.key = pack(model, s.cpu_free, &s.gpu_free);
        let mem_free = s.mem_free;
        self.changed.push(p.node as u32);
        self.mem.set(self.rank[p.node] as usize, mem_free);
        let s = &mut self.nodes[p.node];
        let before = s.frag;
        s.frag = self.memo.get(model, s.cpu_free, &s.gpu_free);
        s.frag - before
    }
}

/// Convenience: runs one policy over a pod sequence.
pub fn run_fill(
    cluster: &Cluster,
    mix: &ShapeMix,
    pods: &[SimPod],
    policy: Policy,
    seed: u64,
    progress: &mut dyn FnMut(usize, usize),
) -> FillOutcome {
    FillEngine::new(cluster, mix, policy, seed).run(pods, progress)
}
