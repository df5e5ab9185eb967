//! A cache of [`place_on_node`] results keyed by the node's exact free-capacity state and the
//! pod's demand, for one cycle (one shape mix, one set of weights).
//!
//! A placement changes one node, and many nodes are in identical states (every node of a kind
//! in an empty cluster, every full node later), so most of the nodes a pod scores were
//! already scored, in the same state, for an earlier pod of the same demand. States are
//! interned (each distinct [`NodeCapacity`] gets a class id); each node remembers its class
//! for the version of its state it was computed at, so a node changed since is re-interned
//! before its next lookup.
//!
//! Invariant: a hit returns exactly what `place_on_node` would return now, because the result
//! is a function of (capacity, demand, mix, weights) alone and the first two are the key, the
//! last two fixed for the cache's lifetime.

use rustc_hash::FxHashMap;

use super::frag::ShapeMix;
use super::gpu_fit::{GpuChoice, Misfit, NodeCapacity, PodDemand, ScoreWeights, place_on_node};

/// Entries kept before the cache starts afresh (bounds memory on long victim searches).
const MAX_ENTRIES: usize = 1 << 18;

/// No class computed for this node yet.
const UNKNOWN: u32 = u32::MAX;

/// `place_on_node` results by (node state class, demand).
#[derive(Debug, Default)]
pub struct ChoiceCache {
    classes: FxHashMap<NodeCapacity, u32>,
    /// Per node: (state version the class was computed at, class).
    node_class: Vec<(u32, u32)>,
    /// Keyed by `class << 32 | demand id`.
    choices: FxHashMap<u64, Result<GpuChoice, Misfit>>,
}

impl ChoiceCache {
    /// A cache for `nodes` nodes.
    pub fn new(nodes: usize) -> ChoiceCache {
        ChoiceCache {
            node_class: vec![(UNKNOWN, UNKNOWN); nodes],
            ..ChoiceCache::default()
        }
    }

    fn class_of(&mut self, n: u32, version: u32, node: &NodeCapacity) -> u32 {
        let slot = self.node_class[n as usize];
        if slot.0 == version && slot.1 != UNKNOWN {
            return slot.1;
        }
        if self.classes.len() >= MAX_ENTRIES {
            self.classes.clear();
            self.choices.clear();
            self.node_class.fill((UNKNOWN, UNKNOWN));
        }
        let next = self.classes.len() as u32;
        let class = match self.classes.get(node) {
            Some(&c) => c,
            None => {
                self.classes.insert(node.clone(), next);
                next
            }
        };
        self.node_class[n as usize] = (version, class);
        class
    }

    /// `place_on_node(node, d, mix, w)` for node `n`, whose state has changed `version`
    /// times (the caller's count; a different number means a different state). `demand` is
    /// the caller's dense id of `d` (equal ids for equal demands, so the key hashes one
    /// integer); `mix` and `w` must be the same on every call.
    #[allow(clippy::too_many_arguments)]
    pub fn place(
        &mut self,
        n: u32,
        version: u32,
        node: &NodeCapacity,
        d: &PodDemand,
        demand: u32,
        mix: &ShapeMix,
        w: &ScoreWeights,
    ) -> &Result<GpuChoice, Misfit> {
        let class = self.class_of(n, version, node);
        if self.choices.len() >= MAX_ENTRIES {
            self.choices.clear();
        }
        self.choices
            .entry(u64::from(class) << 32 | u64::from(demand))
            .or_insert_with(|| place_on_node(node, d, mix, w))
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
            cpu_free: 64_000,
            mem_free: 1 << 20,
            model: 0,
            gpus: free
                .iter()
                .map(|&f| GpuFree {
                    compute_free: f,
                    mem_free: 16_000 * u64::from(f) / 1000,
                    holders: u32::from(f < 1000),
                    ..GpuFree::idle(16_000, None)
                })
                .collect(),
            schedulable: true,
            pods: 1,
            max_pods: u32::MAX,
        }
    }

    #[test]
    fn hits_equal_fresh_results_and_versions_invalidate() {
        let mix = ShapeMix::default();
        let w = ScoreWeights::default();
        let d = PodDemand {
            cpu_milli: 1000,
            memory_mib: 1,
            gpu_count: 1,
            share: GpuShare::Fraction(300),
            models: ModelSet::ANY,
            mig: false,
            tolerates_cordon: false,
            class: 0,
        };
        let mut c = ChoiceCache::new(3);
        let a = node(&[1000, 500]);
        let b = node(&[200, 100]);
        assert_eq!(
            c.place(0, 0, &a, &d, 0, &mix, &w),
            &place_on_node(&a, &d, &mix, &w)
        );
        // Node 1 in the same state shares node 0's entry.
        assert_eq!(
            c.place(1, 0, &a, &d, 0, &mix, &w),
            &place_on_node(&a, &d, &mix, &w)
        );
        assert_eq!(c.classes.len(), 1);
        // Node 0 changed (new version): looked up under its new state.
        assert_eq!(
            c.place(0, 1, &b, &d, 0, &mix, &w),
            &place_on_node(&b, &d, &mix, &w)
        );
        assert!(c.place(0, 1, &b, &d, 0, &mix, &w).is_err());
    }
}
