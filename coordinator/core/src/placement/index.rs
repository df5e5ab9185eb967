//! Capacity index: nodes bucketed by free whole GPUs and by the largest free share of a single
//! GPU, so a pod only visits nodes that can fit it, tightest buckets first.
//!
//! Updating a node after a placement or eviction moves it between buckets in `O(log n)`; a
//! query walks buckets from the tightest that can fit upwards, nodes inside a bucket in
//! tie-break rank order. This keeps a cycle near-linear in pending pods.

use std::collections::BTreeSet;

use super::gpu_fit::{GPU_MILLI, NodeCapacity, PodDemand};

/// Width of a share bucket in milli-GPU.
const BUCKET: u32 = 10;
const FRAC_BUCKETS: usize = (GPU_MILLI / BUCKET) as usize + 1;

/// Bucketed view of node free capacity.
#[derive(Clone, Debug)]
pub struct CapacityIndex {
    rank: Vec<u32>,
    key: Vec<(usize, usize)>,
    whole: Vec<BTreeSet<(u32, u32)>>,
    frac: Vec<BTreeSet<(u32, u32)>>,
    node_free: Vec<u64>,
    total_free: u64,
}

fn free_milli(n: &NodeCapacity) -> u64 {
    if !n.schedulable {
        return 0;
    }
    n.gpus
        .iter()
        .filter(|g| g.healthy)
        .map(|g| u64::from(g.compute_free))
        .sum()
}

fn key_of(n: &NodeCapacity) -> (usize, usize) {
    if !n.schedulable {
        return (0, 0);
    }
    let whole = n.gpus.iter().filter(|g| g.healthy && g.is_idle()).count();
    // Raw compute share (not memory-adjusted): it bounds every kind of request from above.
    let max_free = n
        .gpus
        .iter()
        .filter(|g| g.healthy)
        .map(|g| g.compute_free)
        .max()
        .unwrap_or(0);
    (whole, (max_free / BUCKET) as usize)
}

impl CapacityIndex {
    /// Indexes `nodes`; `rank[i]` is node `i`'s tie-break position (lower first).
    pub fn new(nodes: &[NodeCapacity], rank: Vec<u32>) -> CapacityIndex {
        let max_gpus = nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0);
        let mut idx = CapacityIndex {
            rank,
            key: Vec::with_capacity(nodes.len()),
            whole: vec![BTreeSet::new(); max_gpus + 1],
            frac: vec![BTreeSet::new(); FRAC_BUCKETS],
            node_free: Vec::with_capacity(nodes.len()),
            total_free: 0,
        };
        for (i, n) in nodes.iter().enumerate() {
            let k = key_of(n);
            idx.key.push(k);
            idx.whole[k.0].insert((idx.rank[i], i as u32));
            idx.frac[k.1].insert((idx.rank[i], i as u32));
            let f = free_milli(n);
            idx.node_free.push(f);
            idx.total_free += f;
        }
        idx
    }

    /// Re-buckets node `i` after its capacity changed.
    pub fn update(&mut self, i: u32, n: &NodeCapacity) {
        let f = free_milli(n);
        self.total_free = self.total_free - self.node_free[i as usize] + f;
        self.node_free[i as usize] = f;
        let k = key_of(n);
        let old = self.key[i as usize];
        if k == old {
            return;
        }
        let r = self.rank[i as usize];
        self.whole[old.0].remove(&(r, i));
        self.frac[old.1].remove(&(r, i));
        if k.0 >= self.whole.len() {
            self.whole.resize(k.0 + 1, BTreeSet::new());
        }
        self.whole[k.0].insert((r, i));
        self.frac[k.1].insert((r, i));
        self.key[i as usize] = k;
    }

    /// Completely free healthy GPUs in the cluster.
    pub fn idle_gpus(&self) -> u64 {
        self.whole
            .iter()
            .enumerate()
            .map(|(k, b)| k as u64 * b.len() as u64)
            .sum()
    }

    /// Free compute share of healthy GPUs on schedulable nodes, in milli-GPU.
    pub fn free_gpu_milli(&self) -> u64 {
        self.total_free
    }

    /// Tie-break rank of node `i`.
    pub fn rank(&self, i: u32) -> u32 {
        self.rank[i as usize]
    }

    /// Visits nodes that may fit `d` (a superset test on GPUs only; the caller checks fully),
    /// tightest first, until `visit` returns false. `min_share` is the smallest compute share
    /// (milli) any GPU must have free for the pod (for memory requests: on the largest GPU).
    pub fn candidates(&self, d: &PodDemand, min_share: u32, mut visit: impl FnMut(u32) -> bool) {
        if d.gpu_count > 0 && d.whole() && !d.mig {
            for bucket in self.whole.iter().skip(d.gpu_count as usize) {
                for &(_, i) in bucket {
                    if !visit(i) {
                        return;
                    }
                }
            }
            return;
        }
        let from = if d.gpu_count == 0 {
            0
        } else {
            (min_share / BUCKET) as usize
        };
        for bucket in self.frac.iter().skip(from) {
            for &(_, i) in bucket {
                if !visit(i) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GpuShare;
    use crate::placement::frag::ModelSet;
    use crate::placement::gpu_fit::GpuFree;

    fn node(free: &[u32]) -> NodeCapacity {
        NodeCapacity {
            cpu_free: 1000,
            mem_free: 1000,
            model: 0,
            gpus: free
                .iter()
                .map(|&f| GpuFree {
                    compute_free: f,
                    holders: u32::from(f < 1000),
                    ..GpuFree::idle(1000, None)
                })
                .collect(),
            schedulable: true,
            pods: 0,
            max_pods: u32::MAX,
        }
    }

    fn demand(count: u32, share: GpuShare) -> PodDemand {
        PodDemand {
            cpu_milli: 0,
            memory_mib: 0,
            gpu_count: count,
            share,
            models: ModelSet::ANY,
            mig: false,
            tolerates_cordon: false,
            class: 0,
        }
    }

    fn visit(idx: &CapacityIndex, d: &PodDemand, min: u32) -> Vec<u32> {
        let mut out = Vec::new();
        idx.candidates(d, min, |n| {
            out.push(n);
            true
        });
        out
    }

    #[test]
    fn visits_only_nodes_that_can_fit_tightest_first() {
        let nodes = vec![
            node(&[1000, 1000]),
            node(&[1000, 200]),
            node(&[300, 0]),
            node(&[0, 0]),
        ];
        let mut idx = CapacityIndex::new(&nodes, vec![0, 1, 2, 3]);
        assert_eq!(visit(&idx, &demand(2, GpuShare::Whole), 1000), vec![0]);
        assert_eq!(visit(&idx, &demand(1, GpuShare::Whole), 1000), vec![1, 0]);
        assert_eq!(
            visit(&idx, &demand(1, GpuShare::Fraction(250)), 250),
            vec![2, 0, 1]
        );
        assert_eq!(idx.idle_gpus(), 3);
        assert_eq!(idx.free_gpu_milli(), 3500);
        // Node 0 fills up: it leaves the whole-GPU buckets.
        let full = node(&[0, 0]);
        idx.update(0, &full);
        assert_eq!(visit(&idx, &demand(1, GpuShare::Whole), 1000), vec![1]);
        assert_eq!(idx.free_gpu_milli(), 1500);
    }
}
