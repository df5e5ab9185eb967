//! The recent mix of task shapes, taken from the snapshot's pods once per cycle, and GPU model
//! ids.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::frag::{ModelSet, ShapeMix, TaskShape, sort_ranked};
use super::gpu_fit::{GPU_MILLI, demand_on_gpu};
use crate::model::{GpuShare, Pod, Snapshot};

/// Dense ids of the GPU model names present in the cluster (sorted by name).
#[derive(Clone, Debug, Default)]
pub struct ModelIds {
    /// Hashed: looked up per pod and node, never iterated.
    ids: FxHashMap<String, u32>,
}

impl ModelIds {
    /// Collects the models of every GPU in the snapshot.
    pub fn of(snapshot: &Snapshot) -> ModelIds {
        // Deduplicated while collecting: a cluster has a handful of models over many GPUs,
        // and a node's GPUs are mostly of one model, so a repeat of the last name is skipped
        // before the set is searched.
        let mut names: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        let mut last: Option<&str> = None;
        for g in snapshot.nodes.iter().flat_map(|n| &n.gpus) {
            if last != Some(g.model.as_str()) {
                names.insert(g.model.as_str());
                last = Some(g.model.as_str());
            }
        }
        ModelIds {
            ids: names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), i as u32))
                .collect(),
        }
    }

    /// Id of a model name.
    pub fn id(&self, model: &str) -> Option<u32> {
        self.ids.get(model).copied()
    }

    /// The set of acceptable models of a pod (unknown names accept nothing; empty = any).
    pub fn set_of(&self, models: &[String]) -> ModelSet {
        if models.is_empty() {
            return ModelSet::ANY;
        }
        let mut bits = 0u64;
        for m in models {
            if let Some(id) = self.id(m).filter(|&id| id < 64) {
                bits |= 1 << id;
            }
        }
        ModelSet(bits)
    }
}

/// The task shape of a pod for the fragmentation measure. Memory requests are converted to a
/// share of a GPU of `typical_gpu_mib`.
pub fn task_shape(pod: &Pod, models: &ModelIds, typical_gpu_mib: u64) -> TaskShape {
    let gpu_milli = if pod.gpu.count == 0 {
        0
    } else {
        match pod.gpu.per_gpu {
            GpuShare::Whole => GPU_MILLI,
            s => demand_on_gpu(s, typical_gpu_mib.max(1)).0,
        }
    };
    TaskShape {
        cpu_milli: pod.cpu_milli,
        gpu_milli,
        gpu_count: if gpu_milli == 0 { 0 } else { pod.gpu.count },
        models: models.set_of(&pod.gpu_models),
    }
}

/// The typical-shape mix of the snapshot's pods (pending and bound), keeping the most popular
/// shapes up to `coverage` of all pods and at most `max_shapes` of them.
pub fn shape_mix_of(
    snapshot: &Snapshot,
    models: &ModelIds,
    typical_gpu_mib: u64,
    coverage: f64,
    max_shapes: usize,
) -> ShapeMix {
    let mut counts: BTreeMap<(u64, u32, u32, u64), u64> = BTreeMap::new();
    for p in &snapshot.pods {
        if !p.input_errors.is_empty() {
            continue;
        }
        let s = task_shape(p, models, typical_gpu_mib);
        *counts
            .entry((s.cpu_milli, s.gpu_milli, s.gpu_count, s.models.0))
            .or_insert(0) += 1;
    }
    let mut groups: Vec<(TaskShape, u64)> = counts
        .into_iter()
        .map(|((cpu_milli, gpu_milli, gpu_count, m), n)| {
            (
                TaskShape {
                    cpu_milli,
                    gpu_milli,
                    gpu_count,
                    models: ModelSet(m),
                },
                n,
            )
        })
        .collect();
    sort_ranked(&mut groups, |a, b| a.models.cmp(&b.models));
    let total: u64 = groups.iter().map(|g| g.1).sum();
    // Truncate to max_shapes but keep the coverage computed against all pods by scaling it.
    if groups.len() > max_shapes {
        let kept: u64 = groups[..max_shapes].iter().map(|g| g.1).sum();
        groups.truncate(max_shapes);
        let share = if total > 0 {
            kept as f64 / total as f64
        } else {
            1.0
        };
        let cov = if share > 0.0 {
            (coverage / share).min(1.0)
        } else {
            1.0
        };
        return ShapeMix::from_ranked(groups, cov);
    }
    ShapeMix::from_ranked(groups, coverage)
}
