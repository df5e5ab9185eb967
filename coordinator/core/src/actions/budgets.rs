//! PodDisruptionBudgets in the victim search: a victim set is allowed only if the Eviction
//! API would take every eviction in it, counting the evictions already decided this cycle.
//!
//! The count of evicted pods per budget lives in the [`super::State`] (kept in step by its
//! `evict` and rolled back with it); this module holds the read-only part: which budgets cover
//! which pod, and how many disruptions each allows.

use std::collections::BTreeMap;

use crate::model::Snapshot;

/// Budgets by index, and the budgets of every pod.
#[derive(Debug, Default)]
pub struct Budgets {
    /// `namespace/name` per budget.
    pub names: Vec<String>,
    /// `disruptionsAllowed` per budget.
    pub allowed: Vec<u32>,
    /// Budget indices per pod index; empty when the snapshot has no budget.
    of_pod: Vec<Vec<u32>>,
}

impl Budgets {
    /// The snapshot's budgets; pod UIDs not in the snapshot are ignored.
    pub fn build(snap: &Snapshot) -> Budgets {
        if snap.disruption_budgets.is_empty() {
            return Budgets::default();
        }
        let index: BTreeMap<&str, usize> = snap
            .pods
            .iter()
            .enumerate()
            .map(|(i, p)| (p.uid.as_str(), i))
            .collect();
        let mut of_pod = vec![Vec::new(); snap.pods.len()];
        for (b, budget) in snap.disruption_budgets.iter().enumerate() {
            for uid in &budget.pods {
                if let Some(&p) = index.get(uid.as_str()) {
                    of_pod[p].push(b as u32);
                }
            }
        }
        Budgets {
            names: snap
                .disruption_budgets
                .iter()
                .map(|b| b.name.clone())
                .collect(),
            allowed: snap
                .disruption_budgets
                .iter()
                .map(|b| b.disruptions_allowed)
                .collect(),
            of_pod,
        }
    }

    /// Number of budgets.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The budgets covering pod `p`.
    pub fn of(&self, p: u32) -> &[u32] {
        self.of_pod.get(p as usize).map_or(&[], Vec::as_slice)
    }

    /// The budgets that refuse evicting all of `set` after `evicted` (evictions per budget
    /// already decided): exhausted ones, and those of a pod covered by several (the API server
    /// refuses such a pod's eviction whatever the counts). Empty when the set may go.
    pub fn refusing(&self, evicted: &[u32], set: &[u32]) -> Vec<u32> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut wanted: BTreeMap<u32, u32> = BTreeMap::new();
        let mut refused: Vec<u32> = Vec::new();
        for &v in set {
            let covering = self.of(v);
            if covering.len() > 1 {
                refused.extend_from_slice(covering);
            }
            for &b in covering {
                *wanted.entry(b).or_default() += 1;
            }
        }
        for (b, n) in wanted {
            let used = evicted.get(b as usize).copied().unwrap_or(0);
            if used + n > self.allowed[b as usize] {
                refused.push(b);
            }
        }
        refused.sort_unstable();
        refused.dedup();
        refused
    }
}
