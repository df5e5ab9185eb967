//! Per-GPU fit of one pod on one node, and the fragmentation-aware choice of its GPUs.
//!
//! Ranking of a placement ([`NodeScore`], higher is better; equal scores go to the node earliest
//! in the cycle's fixed node order, which packs like first-fit):
//! - the growth of the node's FGD fragmentation (expected idle GPU that a task drawn from the
//!   recent mix of shapes could not use), measured on *effective* free share: a GPU whose
//!   memory is mostly taken cannot host a share of its compute either, so each GPU counts
//!   `min(free compute, free memory fraction)`;
//! - NVLink penalties, in the same milli-GPU unit as fragmentation growth: spreading a
//!   multi-GPU pod over several NVLink islands, and splitting a completely free NVLink island
//!   with a single-GPU pod;
//! - the growth is turned into FGD's integer score and ranked at half its resolution, with
//!   nodes already in use first inside a class; CPU-only pods go first to the nodes with the
//!   least idle GPU ([`tessera_preference`]).
//!
//! Inside the chosen node the GPUs are picked by the exact (unrounded) fragmentation change.
//! The offline simulator's `tessera` fill policy calls [`place_on_node`] itself, so the figures
//! of `hack/bench-openb quality` measure this function.

use super::frag::{
    ModelSet, NodeView, ShapeMix, TaskShape, fgd_score, fragmentation, tessera_preference,
};
use super::nvlink::{breaks_free_island, pick_set};
use crate::model::{Assignment, ContainerAssignment, Fence, GpuShare, GpuSlice, Node};

/// Whole GPU in milli-GPU.
pub const GPU_MILLI: u32 = 1000;

/// Whole GPU in milli-GPU, as `u64`.
pub const GPU_MILLI_U64: u64 = 1000;

/// Free capacity of one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuFree {
    /// Free compute share in milli-GPU.
    pub compute_free: u32,
    /// Free memory in MiB.
    pub mem_free: u64,
    /// Device memory in MiB.
    pub mem_total: u64,
    /// Only these GPUs take new pods: healthy and not fenced.
    pub healthy: bool,
    /// Why a healthy GPU takes nothing new for now (then `healthy` is false): kept apart from
    /// unhealthy GPUs so that a pending pod is told the real cause.
    pub fence: Option<Fence>,
    /// In MIG mode: only `isolation: mig` pods.
    pub mig: bool,
    /// NVLink island.
    pub island: Option<u32>,
    /// Number of pods holding a slice of it.
    pub holders: u32,
}

impl GpuFree {
    /// A free, healthy GPU with `mem_total` MiB.
    pub fn idle(mem_total: u64, island: Option<u32>) -> GpuFree {
        GpuFree {
            compute_free: GPU_MILLI,
            mem_free: mem_total,
            mem_total,
            healthy: true,
            fence: None,
            mig: false,
            island,
            holders: 0,
        }
    }

    /// Nobody holds any part of it.
    pub fn is_idle(&self) -> bool {
        self.holders == 0 && self.compute_free >= GPU_MILLI && self.mem_free >= self.mem_total
    }

    /// Free share as the fragmentation measure sees it (memory-aware when asked).
    pub fn effective_free(&self, memory_aware: bool) -> u32 {
        if !self.healthy {
            return 0;
        }
        if !memory_aware || self.mem_total == 0 {
            return self.compute_free;
        }
        let by_mem = (self.mem_free.saturating_mul(u64::from(GPU_MILLI)) / self.mem_total) as u32;
        self.compute_free.min(by_mem)
    }
}

/// Free capacity of one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeCapacity {
    /// Free CPU (milli-cores).
    pub cpu_free: u64,
    /// Free memory (MiB).
    pub mem_free: u64,
    /// GPU model id (see `ModelIds`); nodes without GPUs carry 0.
    pub model: u32,
    /// GPUs in index order.
    pub gpus: Vec<GpuFree>,
    /// Cordoned nodes take nothing new.
    pub schedulable: bool,
    /// Pods on the node (GPU pods prefer nodes already in use, so empty nodes stay whole).
    pub pods: u32,
    /// Allocatable pod count (`u32::MAX` = unlimited).
    pub max_pods: u32,
}

impl NodeCapacity {
    /// The free capacity of an empty `node` whose GPU model has id `model` (see `ModelIds`).
    pub fn from_node(node: &Node, model: u32) -> NodeCapacity {
        NodeCapacity {
            cpu_free: node.cpu_milli,
            mem_free: node.memory_mib,
            model,
            gpus: node
                .gpus
                .iter()
                .map(|g| GpuFree {
                    healthy: g.healthy && g.fence.is_none(),
                    fence: g.fence.filter(|_| g.healthy),
                    mig: g.mig.is_some(),
                    ..GpuFree::idle(g.memory_mib, g.nvlink_island)
                })
                .collect(),
            schedulable: node.schedulable,
            pods: 0,
            max_pods: node.constraints.max_pods.unwrap_or(u32::MAX),
        }
    }
}

/// A pod's request in the form placement needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodDemand {
    /// CPU (milli-cores).
    pub cpu_milli: u64,
    /// Memory (MiB).
    pub memory_mib: u64,
    /// GPUs wanted (0 = CPU-only).
    pub gpu_count: u32,
    /// Share of each GPU.
    pub share: GpuShare,
    /// Acceptable GPU models.
    pub models: ModelSet,
    /// Needs a MIG-mode GPU.
    pub mig: bool,
    /// May land on a cordoned node (tolerates `node.kubernetes.io/unschedulable`).
    pub tolerates_cordon: bool,
    /// Static constraint class (see `Ctx`): pods of one class pass the same nodes' static
    /// filters, so failure caches keyed by demand stay exact. 0 = no static constraint.
    pub class: u32,
}

impl PodDemand {
    /// Whether every requested GPU must be whole and exclusive.
    pub fn whole(&self) -> bool {
        matches!(self.share, GpuShare::Whole | GpuShare::Fraction(GPU_MILLI))
    }
}

/// Compute (milli) and memory (MiB) a share takes on a GPU with `mem_total` MiB.
pub fn demand_on_gpu(share: GpuShare, mem_total: u64) -> (u32, u64) {
    match share {
        GpuShare::Whole => (GPU_MILLI, mem_total),
        GpuShare::Fraction(m) => {
            let m = m.min(GPU_MILLI);
            (m, mem_total * u64::from(m) / u64::from(GPU_MILLI))
        }
        GpuShare::MemoryMib(mib) => {
            if mem_total == 0 {
                return (GPU_MILLI, mib);
            }
            let c = (mib.saturating_mul(u64::from(GPU_MILLI))).div_ceil(mem_total);
            (c.clamp(1, u64::from(GPU_MILLI)) as u32, mib)
        }
    }
}

/// The GPUs chosen for a pod on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuChoice {
    /// `(gpu index, compute milli, memory MiB)` per chosen GPU, ascending index.
    pub gpus: Vec<(u32, u32, u64)>,
    /// How good the placement is (higher is better; equal scores go to the node order).
    pub score: NodeScore,
}

/// Rank of a placement on a node, compared lexicographically: higher is better. See
/// [`tessera_preference`] for the two components.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeScore(pub [i64; 2]);

impl NodeScore {
    /// Below every real placement score.
    pub const MIN: NodeScore = NodeScore([i64::MIN, i64::MIN]);
}

impl GpuChoice {
    /// The `tessera.dev/assignment` for this choice on `node`, all GPUs to `container`.
    pub fn assignment(&self, node: &Node, container: &str) -> Assignment {
        let gpus = self
            .gpus
            .iter()
            .filter_map(|&(g, c, m)| {
                node.gpus.get(g as usize).map(|gpu| GpuSlice {
                    uuid: gpu.uuid.clone(),
                    memory_mib: m,
                    compute_milli: c,
                })
            })
            .collect();
        Assignment {
            containers: vec![ContainerAssignment {
                container: container.to_string(),
                gpus,
            }],
        }
    }
}

/// Why a pod does not fit on a node (first failed check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Misfit {
    /// Node cordoned.
    Unschedulable,
    /// Node labels do not match the pod's node selector.
    NodeSelector,
    /// The node runs its allocatable number of pods.
    TooManyPods,
    /// The node has no GPU.
    NoGpus,
    /// The node's GPU model is not acceptable.
    ModelMismatch,
    /// Not enough free CPU.
    Cpu,
    /// Not enough free memory.
    Memory,
    /// The node has fewer GPUs (of the right MIG mode) than the pod asks for, healthy or not.
    TooFewGpus,
    /// Not enough healthy GPUs (of the right MIG mode) at all.
    HealthyGpus,
    /// Enough GPUs only if fenced ones counted: the node's account of them is not settled.
    Fenced(Fence),
    /// Fewer than the wanted number of completely free GPUs.
    WholeGpus,
    /// No (or too few) GPUs with enough free compute share.
    GpuShare,
    /// GPUs with enough share lack free memory.
    GpuMemory,
}

/// Tuning of the placement score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreWeights {
    /// Milli-GPU of fragment-equivalent cost per extra NVLink island a multi-GPU pod spans.
    pub nvlink_span: f64,
    /// Milli-GPU of fragment-equivalent cost of splitting a completely free NVLink island with
    /// a single-GPU pod.
    pub island_break: f64,
    /// Count a GPU's free share as `min(compute, memory fraction)`.
    pub memory_aware: bool,
    /// Use the fragmentation measure at all (off = only the NVLink terms, packing and node order).
    pub use_fragmentation: bool,
}

impl Default for ScoreWeights {
    fn default() -> Self {
        ScoreWeights {
            nvlink_span: 200.0,
            island_break: 20.0,
            memory_aware: true,
            use_fragmentation: true,
        }
    }
}

/// `(integer FGD score, exact fragmentation decrease)` of one GPU choice inside a node.
type GpuRank = [i64; 2];

/// `(gpu index, compute milli, memory MiB)` of one chosen GPU.
type Slice = (u32, u32, u64);

/// Resolution of the exact fragmentation change that picks GPUs inside a node (1e-6 milli-GPU),
/// so float noise does not break real ties.
const DELTA_SCALE: f64 = 1e6;

/// Checks whether the pod fits on the node at all, without choosing GPUs.
pub fn check_fit(node: &NodeCapacity, d: &PodDemand) -> Result<(), Misfit> {
    if !node.schedulable && !d.tolerates_cordon {
        return Err(Misfit::Unschedulable);
    }
    if node.pods >= node.max_pods {
        return Err(Misfit::TooManyPods);
    }
    if d.gpu_count > 0 {
        if node.gpus.is_empty() {
            return Err(Misfit::NoGpus);
        }
        if !d.models.contains(node.model) {
            return Err(Misfit::ModelMismatch);
        }
    }
    if node.cpu_free < d.cpu_milli {
        return Err(Misfit::Cpu);
    }
    if node.mem_free < d.memory_mib {
        return Err(Misfit::Memory);
    }
    if d.gpu_count == 0 {
        return Ok(());
    }
    let need = d.gpu_count as usize;
    let usable = node
        .gpus
        .iter()
        .filter(|g| g.healthy && g.mig == d.mig)
        .count();
    if usable < need {
        return Err(short_of_gpus(node, d, need, |_| true));
    }
    if d.whole() {
        let idle = node
            .gpus
            .iter()
            .filter(|g| g.healthy && g.mig == d.mig && g.is_idle())
            .count();
        return if idle >= need {
            Ok(())
        } else {
            Err(match short_of_gpus(node, d, need, GpuFree::is_idle) {
                Misfit::Fenced(f) => Misfit::Fenced(f),
                _ => Misfit::WholeGpus,
            })
        };
    }
    let (mut share_ok, mut both_ok) = (0, 0);
    for g in node.gpus.iter().filter(|g| g.healthy && g.mig == d.mig) {
        let (c, m) = demand_on_gpu(d.share, g.mem_total);
        if g.compute_free >= c {
            share_ok += 1;
            if g.mem_free >= m {
                both_ok += 1;
            }
        }
    }
    if both_ok >= need {
        Ok(())
    } else if let Misfit::Fenced(f) = short_of_gpus(node, d, need, |g| {
        let (c, m) = demand_on_gpu(d.share, g.mem_total);
        g.compute_free >= c && g.mem_free >= m
    }) {
        Err(Misfit::Fenced(f))
    } else if share_ok < need {
        Err(Misfit::GpuShare)
    } else {
        Err(Misfit::GpuMemory)
    }
}

/// Why a node has fewer than `need` usable GPUs (of the pod's MIG mode) on which `room` holds:
/// too few GPUs at all, or enough once fenced GPUs count (then the first fence's kind), or
/// else too few healthy ones.
fn short_of_gpus(
    node: &NodeCapacity,
    d: &PodDemand,
    need: usize,
    room: impl Fn(&GpuFree) -> bool,
) -> Misfit {
    let mode = node.gpus.iter().filter(|g| g.mig == d.mig);
    if mode.clone().count() < need {
        return Misfit::TooFewGpus;
    }
    let open = mode
        .clone()
        .filter(|g| (g.healthy || g.fence.is_some()) && room(g))
        .count();
    match mode.filter_map(|g| g.fence).next() {
        Some(f) if open >= need => Misfit::Fenced(f),
        _ => Misfit::HealthyGpus,
    }
}

/// Chooses the GPUs for a pod on a node and scores the placement; `mix` is the recent mix of
/// task shapes (an empty mix turns the fragmentation term off).
pub fn place_on_node(
    node: &NodeCapacity,
    d: &PodDemand,
    mix: &ShapeMix,
    w: &ScoreWeights,
) -> Result<GpuChoice, Misfit> {
    check_fit(node, d)?;
    let mut free: Vec<u32> = node
        .gpus
        .iter()
        .map(|g| g.effective_free(w.memory_aware))
        .collect();
    let idle_before: u64 = free.iter().map(|&f| u64::from(f)).sum();
    let use_frag = w.use_fragmentation && !mix.is_empty();
    let frag_of = |cpu_free: u64, free: &[u32]| {
        if use_frag {
            fragmentation(
                &NodeView {
                    cpu_free,
                    gpu_free: free,
                    model: node.model,
                },
                mix,
            )
        } else {
            0.0
        }
    };
    let before = frag_of(node.cpu_free, &free);
    let cpu_after = node.cpu_free - d.cpu_milli; // check_fit proved cpu_free >= cpu_milli
    // The pod as the preference sees it: only CPU-only versus GPU matters there.
    let shape = TaskShape {
        cpu_milli: d.cpu_milli,
        gpu_milli: if d.gpu_count == 0 { 0 } else { 1 },
        gpu_count: d.gpu_count,
        models: d.models,
    };
    // FGD's integer score of the change, NVLink penalties counted as extra fragment.
    let score_of = |after: f64, penalty: f64| fgd_score(before, after + penalty);
    let node_score =
        |fgd: i64| NodeScore(tessera_preference(&shape, fgd, idle_before, node.pods > 0));
    if d.gpu_count == 0 {
        let fgd = score_of(frag_of(cpu_after, &free), 0.0);
        return Ok(GpuChoice {
            gpus: Vec::new(),
            score: node_score(fgd),
        });
    }
    let usable = |g: &GpuFree| g.healthy && g.mig == d.mig;
    let count = d.gpu_count as usize;
    if d.whole() {
        let cands: Vec<u32> = (0..node.gpus.len() as u32)
            .filter(|&i| usable(&node.gpus[i as usize]) && node.gpus[i as usize].is_idle())
            .collect();
        let (set, spanned) = pick_set(&node.gpus, &cands, count).ok_or(Misfit::WholeGpus)?;
        for &i in &set {
            free[i as usize] = 0;
        }
        let mut penalty = w.nvlink_span * f64::from(spanned.saturating_sub(1));
        if count == 1 && breaks_free_island(&node.gpus, set[0]) {
            penalty += w.island_break;
        }
        let fgd = score_of(frag_of(cpu_after, &free), penalty);
        let gpus = set
            .iter()
            .map(|&i| {
                let g = &node.gpus[i as usize];
                (i, GPU_MILLI, g.mem_total)
            })
            .collect();
        return Ok(GpuChoice {
            gpus,
            score: node_score(fgd),
        });
    }
    // Fractions: candidate GPUs with enough compute and memory.
    let mut cands: Vec<(u32, u32, u64)> = Vec::new();
    for (i, g) in node.gpus.iter().enumerate() {
        if !usable(g) {
            continue;
        }
        let (c, m) = demand_on_gpu(d.share, g.mem_total);
        if g.compute_free >= c && g.mem_free >= m {
            cands.push((i as u32, c, m));
        }
    }
    if cands.len() < count {
        return Err(Misfit::GpuShare);
    }
    if count == 1 {
        // The GPU with the best (integer score, exact fragmentation change) wins; among equals
        // the one left with the least free share (best fit keeps whole GPUs whole), then the
        // lowest index. Identical GPU states give identical results: evaluate each once.
        let mut best: Option<(GpuRank, u32, Slice)> = None;
        let mut seen: Vec<(u32, u64, u64, bool)> = Vec::new();
        for &(i, c, m) in &cands {
            let g = &node.gpus[i as usize];
            let breaks = breaks_free_island(&node.gpus, i);
            let key = (g.compute_free, g.mem_free, g.mem_total, breaks);
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let old = free[i as usize];
            let after_gpu = GpuFree {
                compute_free: g.compute_free - c,
                mem_free: g.mem_free - m,
                holders: g.holders + 1,
                ..*g
            };
            free[i as usize] = after_gpu.effective_free(w.memory_aware);
            let penalty = if breaks { w.island_break } else { 0.0 };
            let after = frag_of(cpu_after, &free) + penalty;
            free[i as usize] = old;
            let rank = [
                score_of(after, 0.0),
                ((before - after) * DELTA_SCALE).round() as i64,
            ];
            let left = g.compute_free - c;
            if best.is_none_or(|(b, bl, _)| rank > b || (rank == b && left < bl)) {
                best = Some((rank, left, (i, c, m)));
            }
        }
        let (rank, _, pick) = best.ok_or(Misfit::GpuShare)?;
        return Ok(GpuChoice {
            gpus: vec![pick],
            score: node_score(rank[0]),
        });
    }
    // Multi-GPU fractions: tightest GPUs first inside the tightest NVLink group.
    cands.sort_by_key(|&(i, _, _)| (node.gpus[i as usize].compute_free, i));
    let order: Vec<u32> = cands.iter().map(|c| c.0).collect();
    let (set, spanned) = pick_set(&node.gpus, &order, count).ok_or(Misfit::GpuShare)?;
    let mut gpus = Vec::with_capacity(count);
    for &i in &set {
        // `set` is a subset of `cands`.
        let &(_, c, m) = cands.iter().find(|x| x.0 == i).unwrap_or(&(i, 0, 0));
        let g = &node.gpus[i as usize];
        let after_gpu = GpuFree {
            compute_free: g.compute_free - c,
            mem_free: g.mem_free - m,
            ..*g
        };
        free[i as usize] = after_gpu.effective_free(w.memory_aware);
        gpus.push((i, c, m));
    }
    gpus.sort_unstable();
    let penalty = w.nvlink_span * f64::from(spanned.saturating_sub(1));
    let fgd = score_of(frag_of(cpu_after, &free), penalty);
    Ok(GpuChoice {
        gpus,
        score: node_score(fgd),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::frag::TaskShape;

    fn node(free: &[u32]) -> NodeCapacity {
        NodeCapacity {
            cpu_free: 64_000,
            mem_free: 1 << 20,
            model: 0,
            gpus: free
                .iter()
                .map(|&f| GpuFree {
                    compute_free: f,
                    mem_free: 16_000 * u64::from(f) / 1000,
                    mem_total: 16_000,
                    holders: u32::from(f < 1000),
                    ..GpuFree::idle(16_000, None)
                })
                .collect(),
            schedulable: true,
            pods: 1,
            max_pods: u32::MAX,
        }
    }

    fn frac(m: u32) -> PodDemand {
        PodDemand {
            cpu_milli: 1000,
            memory_mib: 1024,
            gpu_count: 1,
            share: GpuShare::Fraction(m),
            models: ModelSet::ANY,
            mig: false,
            tolerates_cordon: false,
            class: 0,
        }
    }

    #[test]
    fn fraction_goes_where_the_leftover_stays_usable() {
        // Mix: half the tasks want 500 milli. Placing 500 on the 1000-free GPU leaves 500
        // (usable); placing it on the 700-free GPU leaves 200 (a fragment).
        let mix = ShapeMix::from_weights([(
            TaskShape {
                cpu_milli: 1000,
                gpu_milli: 500,
                gpu_count: 1,
                models: ModelSet::ANY,
            },
            1.0,
        )]);
        let n = node(&[700, 1000]);
        let c = place_on_node(&n, &frac(500), &mix, &ScoreWeights::default()).unwrap();
        assert_eq!(c.gpus[0].0, 1);
        // Exact fit on a 500-free GPU leaves no fragment at all and beats both.
        let n = node(&[700, 1000, 500]);
        let c = place_on_node(&n, &frac(500), &mix, &ScoreWeights::default()).unwrap();
        assert_eq!(c.gpus[0].0, 2);
    }

    #[test]
    fn a_misfit_names_too_few_gpus_and_fenced_ones_apart_from_unhealthy_ones() {
        let whole = |count| PodDemand {
            share: GpuShare::Whole,
            gpu_count: count,
            ..frac(1)
        };
        let mut n = node(&[1000, 1000, 500]);
        assert_eq!(check_fit(&n, &whole(4)), Err(Misfit::TooFewGpus));
        n.gpus[0].healthy = false;
        assert_eq!(check_fit(&n, &whole(3)), Err(Misfit::HealthyGpus));
        // Fenced: healthy, but its account is not settled: said so, whole or fraction.
        n.gpus[0].fence = Some(Fence::Unreported);
        assert_eq!(
            check_fit(&n, &whole(2)),
            Err(Misfit::Fenced(Fence::Unreported))
        );
        n.gpus[1].healthy = false;
        n.gpus[1].fence = Some(Fence::Refused);
        assert_eq!(
            check_fit(&n, &frac(600)),
            Err(Misfit::Fenced(Fence::Unreported))
        );
        // What fits on an open GPU still fits.
        assert_eq!(check_fit(&n, &frac(500)), Ok(()));
        // Too little room even on the fenced ones: the usual reason.
        assert_eq!(
            check_fit(&n, &whole(1)),
            Err(Misfit::Fenced(Fence::Unreported))
        );
        n.gpus[0].compute_free = 100;
        n.gpus[1].compute_free = 100;
        assert_eq!(check_fit(&n, &frac(600)), Err(Misfit::GpuShare));
    }

    #[test]
    fn memory_request_checks_memory() {
        let n = node(&[1000]);
        let d = PodDemand {
            share: GpuShare::MemoryMib(20_000),
            ..frac(1)
        };
        assert_eq!(check_fit(&n, &d), Err(Misfit::GpuMemory));
        let d = PodDemand {
            share: GpuShare::MemoryMib(8_000),
            ..frac(1)
        };
        let c = place_on_node(&n, &d, &ShapeMix::default(), &ScoreWeights::default()).unwrap();
        assert_eq!(c.gpus, vec![(0, 500, 8_000)]);
    }

    #[test]
    fn misfit_reasons() {
        let n = node(&[300, 300]);
        assert_eq!(check_fit(&n, &frac(500)), Err(Misfit::GpuShare));
        let mut n2 = node(&[1000]);
        n2.gpus[0].mem_free = 100;
        assert_eq!(check_fit(&n2, &frac(500)), Err(Misfit::GpuMemory));
        let d = PodDemand {
            share: GpuShare::Whole,
            gpu_count: 2,
            ..frac(1)
        };
        assert_eq!(check_fit(&node(&[1000, 999]), &d), Err(Misfit::WholeGpus));
        assert_eq!(check_fit(&node(&[1000]), &d), Err(Misfit::TooFewGpus));
        let d = PodDemand {
            cpu_milli: 100_000,
            ..frac(1)
        };
        assert_eq!(check_fit(&node(&[1000]), &d), Err(Misfit::Cpu));
    }
}
