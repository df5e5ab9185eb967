//! Placement policies of the fill experiment: Tessera's own, and faithful re-implementations of
//! the published baselines (FGD artifact, §6 of the data README). The cheap closed-form node
//! scores live here; the fragmentation-based ones need the engine's memo tables (see `fill`).

use std::fmt;
use std::str::FromStr;

use tessera_core::placement::frag::{GPU_MILLI, TaskShape};

/// A node-scoring policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Tessera: the scheduling core's own per-node placement (`placement::place_on_node` with
    /// the production weights), scoring every feasible node: FGD's fragmentation score at half
    /// resolution, CPU-only pods onto GPU-full nodes, GPU pods onto nodes already in use, exact
    /// fragmentation to pick the GPU (see [`tessera_core::placement::frag::tessera_preference`]).
    /// `core` is accepted as another name for it.
    Tessera,
    /// Fragmentation Gradient Descent (`FGDScore`, GPU choice by score).
    Fgd,
    /// `BestFitScore`, min-max normalised.
    BestFit,
    /// `GpuPackingScore`.
    Packing,
    /// `GpuClusteringScore`.
    Clustering,
    /// `DotProductScore` (merge, max).
    DotProd,
    /// `RandomScore`.
    Random,
}

impl Policy {
    /// Every policy, ours first, then the baselines in the published table's reverse order.
    pub const ALL: [Policy; 7] = [
        Policy::Tessera,
        Policy::Fgd,
        Policy::BestFit,
        Policy::Packing,
        Policy::Clustering,
        Policy::DotProd,
        Policy::Random,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Tessera => "tessera",
            Policy::Fgd => "fgd",
            Policy::BestFit => "bestfit",
            Policy::Packing => "packing",
            Policy::Clustering => "clustering",
            Policy::DotProd => "dotprod",
            Policy::Random => "random",
        }
    }

    /// Whether the policy scores with the fragmentation measure (needs the typical-shape mix).
    pub fn uses_frag(self) -> bool {
        matches!(self, Policy::Tessera | Policy::Fgd)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown policy name.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown policy `{0}` (accepted: tessera (alias core), fgd, bestfit, packing, clustering, dotprod, random, all)"
)]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == lower)
            .or(match lower.as_str() {
                "core" => Some(Policy::Tessera),
                "gpupacking" => Some(Policy::Packing),
                "gpuclustering" => Some(Policy::Clustering),
                "dotproduct" => Some(Policy::DotProd),
                _ => None,
            })
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Parses `NAME`, a comma-separated list, or `all`.
pub fn parse_policies(s: &str) -> Result<Vec<Policy>, UnknownPolicy> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(Policy::ALL.to_vec());
    }
    s.split(',').map(str::parse).collect()
}

/// CPU scale of the published closed-form scores (a 128-core node).
const CPU_SCALE: f64 = 128_000.0;
/// GPU scale of the published closed-form scores (an 8-GPU node).
const GPU_SCALE: f64 = 8_000.0;

/// Total idle GPU milli of a free list.
pub fn idle(gpu_free: &[u32]) -> u64 {
    gpu_free.iter().map(|&f| u64::from(f)).sum()
}

/// The `best` GPU choice: GPUs with enough free milli, smallest free first, lowest index on
/// ties; `count` of them. Returns a bitmask of GPU indices, or `None` if they do not fit.
pub fn best_gpus(gpu_free: &[u32], milli: u32, count: u32) -> Option<u64> {
    let mut fitting: Vec<(u32, usize)> = gpu_free
        .iter()
        .enumerate()
        .filter(|(_, f)| **f >= milli)
        .map(|(i, f)| (*f, i))
        .collect();
    if fitting.len() < count as usize {
        return None;
    }
    fitting.sort_unstable();
    Some(
        fitting
            .iter()
            .take(count as usize)
            .fold(0u64, |m, (_, i)| m | (1u64 << i)),
    )
}

/// `BestFitScore` before normalisation.
pub fn bestfit_raw(cpu_free: u64, gpu_free: &[u32], shape: &TaskShape) -> i64 {
    let cpu_left = cpu_free as f64 - shape.cpu_milli as f64;
    let gpu_left = idle(gpu_free) as f64 - shape.gpu_total() as f64;
    (100.0 * (1.0 - (0.5 * cpu_left / CPU_SCALE + 0.5 * gpu_left / GPU_SCALE))) as i64
}

/// `GpuPackingScore`.
pub fn packing_score(gpu_free: &[u32], shape: &TaskShape) -> i64 {
    if shape.is_cpu_only() {
        return 0;
    }
    let g = gpu_free.len() as i64;
    if gpu_free.iter().all(|&f| f == GPU_MILLI) {
        return (33 - g).max(g);
    }
    let Some(mask) = best_gpus(gpu_free, shape.gpu_milli, shape.gpu_count) else {
        return 0;
    };
    let used = || {
        gpu_free
            .iter()
            .enumerate()
            .filter(move |(i, _)| mask >> i & 1 == 1)
    };
    let whole_free = used().filter(|(_, f)| **f == GPU_MILLI).count() as i64;
    if whole_free > 0 {
        (50 - whole_free).max(33)
    } else {
        let sum: i64 = used()
            .map(|(_, f)| i64::from(*f) * 100 / i64::from(GPU_MILLI))
            .sum();
        (100 - sum / 10).max(50)
    }
}

/// Tag bit of a pod for `GpuClusteringScore`: share-GPU pods bit 0, `k`-GPU pods bit `k`.
pub fn cluster_tag(shape: &TaskShape) -> u64 {
    if shape.is_cpu_only() {
        0
    } else if shape.gpu_count == 1 && shape.gpu_milli < GPU_MILLI {
        1
    } else {
        1u64 << shape.gpu_count.min(63)
    }
}

/// `GpuClusteringScore`; `tags` is the set of tag bits of GPU pods already on the node.
pub fn clustering_score(gpu_free: &[u32], tags: u64, shape: &TaskShape) -> i64 {
    if shape.is_cpu_only() {
        return 0;
    }
    let base = 25 * (GPU_SCALE as i64 - idle(gpu_free) as i64) / GPU_SCALE as i64;
    let tag = cluster_tag(shape);
    let bonus = if tags == 0 {
        25
    } else if tags == tag {
        75
    } else if tags & tag != 0 {
        50
    } else {
        0
    };
    base + bonus
}

/// `DotProductScore` with `merge` dimension extension and `max` normalisation.
pub fn dotprod_score(cpu_free: u64, gpu_free: &[u32], shape: &TaskShape) -> i64 {
    if cpu_free < shape.cpu_milli {
        return 0;
    }
    let cpu = (cpu_free as f64 / CPU_SCALE) * (shape.cpu_milli as f64 / CPU_SCALE);
    let gpu = (idle(gpu_free) as f64 / GPU_SCALE) * (shape.gpu_total() as f64 / GPU_SCALE);
    (100.0 * (1.0 - (cpu + gpu) / 2.0)) as i64
}

/// Min-max normalisation of raw scores to integers 0..=100 (all 0 when they are all equal).
pub fn normalise(raw: i64, lo: i64, hi: i64) -> i64 {
    if hi == lo {
        0
    } else {
        (raw - lo) * 100 / (hi - lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::placement::frag::ModelSet;

    fn shape(cpu: u64, milli: u32, count: u32) -> TaskShape {
        TaskShape {
            cpu_milli: cpu,
            gpu_milli: milli,
            gpu_count: count,
            models: ModelSet::ANY,
        }
    }

    #[test]
    fn parses_names() {
        assert_eq!("FGD".parse::<Policy>().unwrap(), Policy::Fgd);
        assert_eq!(parse_policies("all").unwrap().len(), 7);
        assert_eq!("core".parse::<Policy>().unwrap(), Policy::Tessera);
        assert_eq!(
            parse_policies("fgd,bestfit").unwrap(),
            vec![Policy::Fgd, Policy::BestFit]
        );
        let e = "best".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("accepted: tessera"), "{e}");
    }

    #[test]
    fn best_gpu_choice() {
        assert_eq!(best_gpus(&[1000, 300, 600, 300], 250, 1), Some(0b0010));
        assert_eq!(best_gpus(&[1000, 0, 1000, 1000], 1000, 2), Some(0b0101));
        assert_eq!(best_gpus(&[1000, 0], 1000, 2), None);
    }

    #[test]
    fn closed_form_scores() {
        // BestFit: cpu left 64000-0 -> 0.25, gpu left 8000-1000 = 7000 -> 0.4375 -> 31.25 -> 31.
        assert_eq!(bestfit_raw(64_000, &[1000; 8], &shape(0, 1000, 1)), 31);
        assert_eq!(normalise(31, 10, 60), 42);
        assert_eq!(normalise(5, 5, 5), 0);
        // Packing: all free, 8 GPUs -> max(25, 8).
        assert_eq!(packing_score(&[1000; 8], &shape(1, 500, 1)), 25);
        // One used GPU with 400 free fits a 300 share -> 100 - 40/10 = 96.
        assert_eq!(packing_score(&[1000, 400], &shape(1, 300, 1)), 96);
        // Only a whole free GPU fits -> max(50 - 1, 33) = 49.
        assert_eq!(packing_score(&[1000, 200], &shape(1, 300, 1)), 49);
        assert_eq!(packing_score(&[1000, 200], &shape(1, 0, 0)), 0);
        // Clustering: idle 1000 of 8000 -> base 21; only share pods hosted -> +75.
        assert_eq!(clustering_score(&[1000], 1, &shape(1, 500, 1)), 96);
        assert_eq!(clustering_score(&[1000], 0, &shape(1, 500, 1)), 21 + 25);
        assert_eq!(clustering_score(&[1000], 0b11, &shape(1, 500, 1)), 21 + 50);
        assert_eq!(clustering_score(&[1000], 0b10, &shape(1, 500, 1)), 21);
        // DotProd: (0.5*0.0625 + 1*0.125)/2 = 0.078125 -> 92.1875 -> 92.
        assert_eq!(dotprod_score(64_000, &[1000; 8], &shape(8000, 1000, 1)), 92);
        assert_eq!(dotprod_score(1000, &[1000; 8], &shape(8000, 1000, 1)), 0);
    }
}
