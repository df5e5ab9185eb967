//! Queue tree, water-filling fair share and DRF ordering.
//!
//! Per resource and level by level: each child first gets its deserved quota (capped by what it
//! asks for and its limit; scaled down proportionally when the parent cannot cover all quotas),
//! then what is left is water-filled by over-quota weight among the children that still want
//! more. Higher-priority siblings are served first in both rounds. A child's fair share is then
//! split among its own children the same way.
//!
//! The same water-fill runs for each GPU model a queue's settings name (see
//! [`QueueTree::models`]), over that model's GPUs, with the queues' per-model settings. Usage
//! history enters as a factor on each queue's over-quota weight (see [`crate::usage`]); the
//! deserved round never sees it.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::model::{Queue, QueueResource, Resource};

/// Below this an amount is treated as zero (accounting is in milli-units, so this is far below
/// any real request).
const EPS: f64 = 1e-9;

/// One queue of the tree.
#[derive(Clone, Debug)]
pub struct QueueNode {
    /// Name.
    pub name: String,
    /// Parent index.
    pub parent: Option<usize>,
    /// Children indices, sorted by name.
    pub children: Vec<usize>,
    /// Sibling priority.
    pub priority: i32,
    /// Settings per resource in accounting units (GPU in milli-GPU). The GPU quota counts at
    /// least the sum of the queue's per-model quotas, which are deserved too.
    pub settings: [QueueResource; 3],
    /// Settings per GPU model of [`QueueTree::models`], in milli-GPU of that model: the
    /// queue's own for a model it names, else quota 0, its GPU weight and no limit.
    pub model_settings: Vec<QueueResource>,
}

impl QueueNode {
    /// Whether the queue takes pods (has no children).
    pub fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }

    /// The hard cap of resource `r`, if any.
    pub fn limit(&self, r: Resource) -> Option<f64> {
        let l = self.settings[r.index()].limit;
        (l >= 0.0).then_some(l)
    }

    /// The hard cap (milli-GPU) of GPU model `m` (an index of [`QueueTree::models`]), if any.
    pub fn model_limit(&self, m: usize) -> Option<f64> {
        let l = self.model_settings.get(m)?.limit;
        (l >= 0.0).then_some(l)
    }
}

/// The queue hierarchy, indexed; queue `i` is `snapshot.queues[i]`.
#[derive(Clone, Debug, Default)]
pub struct QueueTree {
    /// Queues in snapshot order.
    pub nodes: Vec<QueueNode>,
    /// Top-level queues, sorted by name.
    pub roots: Vec<usize>,
    /// Hashed: looked up once per pod of every cycle, never iterated.
    by_name: FxHashMap<String, usize>,
    /// Problems found while building (duplicate names, unknown parents, cycles); such queues
    /// are treated as top-level.
    pub problems: Vec<String>,
    /// The GPU model keys some queue's settings name, sorted: the models that get a fair
    /// share of their own. Empty (the usual case) when no queue sets per-model quotas.
    pub models: Vec<String>,
}

impl QueueTree {
    /// Builds the tree. Never fails: malformed parents become top-level queues and are listed
    /// in [`QueueTree::problems`].
    pub fn build(queues: &[Queue]) -> QueueTree {
        let mut by_name = FxHashMap::default();
        let mut problems = Vec::new();
        for (i, q) in queues.iter().enumerate() {
            if by_name.insert(q.name.clone(), i).is_some() {
                problems.push(format!(
                    "queue {}: duplicate name, the last definition wins",
                    q.name
                ));
            }
        }
        let mut models: Vec<String> = queues
            .iter()
            .flat_map(|q| q.gpu_models.iter().map(|m| m.model.clone()))
            .collect();
        models.sort();
        models.dedup();
        let mut nodes: Vec<QueueNode> = queues
            .iter()
            .map(|q| {
                let mut settings = Resource::ALL.map(|r| q.settings(r));
                let model_settings = model_settings(q, &models, settings[0].over_quota_weight);
                let named: f64 = model_settings.iter().map(|m| m.quota).sum();
                settings[0].quota = settings[0].quota.max(named);
                QueueNode {
                    name: q.name.clone(),
                    parent: None,
                    children: Vec::new(),
                    priority: q.priority,
                    settings,
                    model_settings,
                }
            })
            .collect();
        for (i, q) in queues.iter().enumerate() {
            if let Some(p) = &q.parent {
                match by_name.get(p) {
                    Some(&pi) if pi != i => nodes[i].parent = Some(pi),
                    _ => problems.push(format!(
                        "queue {}: parent {p} does not exist; treated as a top-level queue",
                        q.name
                    )),
                }
            }
        }
        // Break cycles: walk up at most n steps; a walk that does not end is a cycle.
        for i in 0..nodes.len() {
            let mut cur = nodes[i].parent;
            let mut steps = 0;
            while let Some(c) = cur {
                steps += 1;
                if steps > nodes.len() {
                    problems.push(format!(
                        "queue {}: parent chain forms a cycle; treated as a top-level queue",
                        nodes[i].name
                    ));
                    nodes[i].parent = None;
                    break;
                }
                cur = nodes[c].parent;
            }
        }
        let mut roots = Vec::new();
        for i in 0..nodes.len() {
            if by_name.get(&nodes[i].name) != Some(&i) {
                continue; // shadowed duplicate
            }
            match nodes[i].parent {
                Some(p) => nodes[p].children.push(i),
                None => roots.push(i),
            }
        }
        let name_of = |i: &usize| queues[*i].name.clone();
        roots.sort_by_key(name_of);
        for n in &mut nodes {
            n.children.sort_by_key(name_of);
        }
        QueueTree {
            nodes,
            roots,
            by_name,
            problems,
            models,
        }
    }

    /// Index of GPU model key `key` in [`QueueTree::models`].
    pub fn model(&self, key: &str) -> Option<usize> {
        self.models.binary_search_by(|m| m.as_str().cmp(key)).ok()
    }

    /// Index of the queue called `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The queue and its ancestors, innermost first.
    pub fn path(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(i), move |&c| self.nodes[c].parent)
    }

    /// Number of queues.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no queues.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// A queue's settings for each model of `models`, in milli-GPU: its own where it names the
/// model (negative or non-finite amounts read as none), else quota 0, `gpu_weight`, no limit.
fn model_settings(q: &Queue, models: &[String], gpu_weight: f64) -> Vec<QueueResource> {
    models
        .iter()
        .map(
            |key| match q.gpu_models.iter().rev().find(|m| &m.model == key) {
                None => QueueResource {
                    quota: 0.0,
                    over_quota_weight: gpu_weight,
                    limit: -1.0,
                },
                Some(m) => {
                    let ok = |v: f64| v.is_finite() && v >= 0.0;
                    QueueResource {
                        quota: if ok(m.quota) { m.quota * 1000.0 } else { 0.0 },
                        over_quota_weight: m
                            .over_quota_weight
                            .filter(|w| ok(*w))
                            .unwrap_or(gpu_weight),
                        limit: if ok(m.limit) { m.limit * 1000.0 } else { -1.0 },
                    }
                }
            },
        )
        .collect()
}

/// Deserved and fair amounts of one queue, per resource in accounting units.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Share {
    /// Granted deserved quota (quota capped by demand and limit).
    pub deserved: [f64; 3],
    /// Fair share: deserved plus the water-filled over-quota part.
    pub fair: [f64; 3],
    /// Demand the computation used (allocated + pending, capped by limit).
    pub demand: [f64; 3],
}

/// Deserved and fair amounts of one queue in one dimension (a resource, or a GPU model's
/// milli-GPU).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DimShare {
    /// Granted deserved quota.
    pub deserved: f64,
    /// Fair share.
    pub fair: f64,
    /// Demand, capped by the limits.
    pub demand: f64,
}

/// Computes every queue's fair share of `capacity`, given each leaf's demand (allocated plus
/// pending requests; entries of non-leaf queues are ignored and recomputed from children).
pub fn fair_shares(tree: &QueueTree, capacity: [f64; 3], leaf_demand: &[[f64; 3]]) -> Vec<Share> {
    fair_shares_weighted(tree, capacity, leaf_demand, None)
}

/// [`fair_shares`] with each queue's over-quota weight of resource `k` multiplied by
/// `factors[q][k]` (usage history; `None` = 1 everywhere). Deserved quotas do not depend on
/// the factors.
pub fn fair_shares_weighted(
    tree: &QueueTree,
    capacity: [f64; 3],
    leaf_demand: &[[f64; 3]],
    factors: Option<&[[f64; 3]]>,
) -> Vec<Share> {
    let n = tree.nodes.len();
    let mut shares = vec![Share::default(); n];
    // Demand bottom-up, capped by each queue's limit.
    let mut visited = vec![false; n];
    for &r in &tree.roots {
        subtree_demand(tree, r, leaf_demand, &mut shares, &mut visited);
    }
    let mut dims = vec![DimShare::default(); n];
    for r in Resource::ALL {
        let k = r.index();
        for (d, s) in dims.iter_mut().zip(&shares) {
            *d = DimShare {
                demand: s.demand[k],
                ..DimShare::default()
            };
        }
        let settings = |c: usize| {
            let s = tree.nodes[c].settings[k];
            match factors {
                Some(f) => QueueResource {
                    over_quota_weight: s.over_quota_weight * f[c][k],
                    ..s
                },
                None => s,
            }
        };
        distribute(tree, &tree.roots, capacity[k], &settings, &mut dims);
        for (s, d) in shares.iter_mut().zip(&dims) {
            s.deserved[k] = d.deserved;
            s.fair[k] = d.fair;
        }
    }
    shares
}

/// Every queue's fair share of each GPU model of [`QueueTree::models`]: `capacity[m]` is the
/// model's healthy milli-GPU, `leaf_demand[q][m]` a leaf's demand of it (allocated plus the
/// pending requests that may land on it); `gpu_factors[q]`, when given, scales the
/// over-quota weights as the GPU factor does in [`fair_shares_weighted`]. Indexed
/// `[model][queue]`.
pub fn model_fair_shares(
    tree: &QueueTree,
    capacity: &[f64],
    leaf_demand: &[Vec<f64>],
    gpu_factors: Option<&[[f64; 3]]>,
) -> Vec<Vec<DimShare>> {
    let n = tree.nodes.len();
    (0..tree.models.len())
        .map(|m| {
            let mut dims = vec![DimShare::default(); n];
            let mut visited = vec![false; n];
            for &r in &tree.roots {
                model_demand(tree, r, m, leaf_demand, &mut dims, &mut visited);
            }
            let settings = |c: usize| {
                let s = tree.nodes[c].model_settings[m];
                QueueResource {
                    over_quota_weight: s.over_quota_weight
                        * gpu_factors.map_or(1.0, |f| f[c][Resource::Gpu.index()]),
                    ..s
                }
            };
            distribute(
                tree,
                &tree.roots,
                capacity.get(m).copied().unwrap_or(0.0),
                &settings,
                &mut dims,
            );
            dims
        })
        .collect()
}

fn model_demand(
    tree: &QueueTree,
    i: usize,
    m: usize,
    leaf_demand: &[Vec<f64>],
    dims: &mut [DimShare],
    visited: &mut [bool],
) -> f64 {
    if visited[i] {
        return dims[i].demand;
    }
    visited[i] = true;
    let node = &tree.nodes[i];
    let mut d = if node.is_leaf() {
        leaf_demand
            .get(i)
            .and_then(|v| v.get(m))
            .copied()
            .unwrap_or(0.0)
    } else {
        0.0
    };
    for &c in &node.children {
        d += model_demand(tree, c, m, leaf_demand, dims, visited);
    }
    if let Some(l) = node.model_limit(m) {
        d = d.min(l);
    }
    dims[i].demand = d;
    d
}

fn subtree_demand(
    tree: &QueueTree,
    i: usize,
    leaf_demand: &[[f64; 3]],
    shares: &mut [Share],
    visited: &mut [bool],
) -> [f64; 3] {
    if visited[i] {
        return shares[i].demand;
    }
    visited[i] = true;
    let node = &tree.nodes[i];
    let mut d = if node.is_leaf() {
        leaf_demand.get(i).copied().unwrap_or([0.0; 3])
    } else {
        [0.0; 3]
    };
    for &c in &node.children {
        let cd = subtree_demand(tree, c, leaf_demand, shares, visited);
        for k in 0..3 {
            d[k] += cd[k];
        }
    }
    for r in Resource::ALL {
        if let Some(l) = node.limit(r) {
            d[r.index()] = d[r.index()].min(l);
        }
    }
    shares[i].demand = d;
    d
}

/// Splits `amount` of one dimension among `children` (settings of child `c`: `settings(c)`,
/// demand: `dims[c].demand`), then recurses.
fn distribute(
    tree: &QueueTree,
    children: &[usize],
    amount: f64,
    settings: &dyn Fn(usize) -> QueueResource,
    dims: &mut [DimShare],
) {
    if children.is_empty() {
        return;
    }
    let mut given: BTreeMap<usize, f64> = children.iter().map(|&c| (c, 0.0)).collect();
    let cap = |c: usize, dims: &[DimShare]| dims[c].demand;
    // Priority tiers, highest first; inside a tier children keep name order.
    let mut tiers: Vec<i32> = children.iter().map(|&c| tree.nodes[c].priority).collect();
    tiers.sort_unstable_by(|a, b| b.cmp(a));
    tiers.dedup();
    let mut left = amount.max(0.0);
    // Round 1: deserved quota.
    for &t in &tiers {
        let tier: Vec<usize> = children
            .iter()
            .copied()
            .filter(|&c| tree.nodes[c].priority == t)
            .collect();
        let want: Vec<f64> = tier
            .iter()
            .map(|&c| settings(c).quota.max(0.0).min(cap(c, dims)))
            .collect();
        let total: f64 = want.iter().sum();
        let scale = if total > left && total > 0.0 {
            left / total
        } else {
            1.0
        };
        for (c, w) in tier.iter().zip(&want) {
            let g = w * scale;
            *given.entry(*c).or_default() += g;
            dims[*c].deserved = g;
        }
        left = (left - total * scale).max(0.0);
    }
    // Round 2: water-fill the rest by over-quota weight.
    for &t in &tiers {
        if left <= EPS {
            break;
        }
        let mut open: Vec<usize> = children
            .iter()
            .copied()
            .filter(|&c| {
                tree.nodes[c].priority == t
                    && settings(c).over_quota_weight > 0.0
                    && given[&c] + EPS < cap(c, dims)
            })
            .collect();
        while left > EPS && !open.is_empty() {
            let wsum: f64 = open.iter().map(|&c| settings(c).over_quota_weight).sum();
            // Anyone whose proportional slice would overshoot their cap is filled and leaves.
            let mut saturated = Vec::new();
            for &c in &open {
                let slice = left * settings(c).over_quota_weight / wsum;
                if given[&c] + slice >= cap(c, dims) - EPS {
                    saturated.push(c);
                }
            }
            if saturated.is_empty() {
                for &c in &open {
                    let slice = left * settings(c).over_quota_weight / wsum;
                    *given.entry(c).or_default() += slice;
                }
                left = 0.0;
            } else {
                for c in &saturated {
                    let g = given.entry(*c).or_default();
                    let inc = (cap(*c, dims) - *g).max(0.0);
                    *g += inc;
                    left = (left - inc).max(0.0);
                }
                open.retain(|c| !saturated.contains(c));
            }
        }
    }
    for (&c, &g) in &given {
        dims[c].fair = g;
        let kids = tree.nodes[c].children.clone();
        distribute(tree, &kids, g, settings, dims);
    }
}

/// Dominant share of an allocation relative to a fair share: `max_r alloc_r / fair_r`.
/// A resource in use with a zero fair share counts as infinitely over.
pub fn dominant_share(alloc: [f64; 3], fair: [f64; 3]) -> f64 {
    let mut s: f64 = 0.0;
    for k in 0..3 {
        if alloc[k] <= EPS {
            continue;
        }
        if fair[k] <= EPS {
            return f64::INFINITY;
        }
        s = s.max(alloc[k] / fair[k]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, quota: f64, w: f64, limit: f64) -> Queue {
        Queue::new(name).gpu(quota, w, limit)
    }

    #[test]
    fn deserved_then_weighted_remainder() {
        let tree = QueueTree::build(&[q("a", 10.0, 1.0, -1.0), q("b", 10.0, 3.0, -1.0)]);
        let cap = [100_000.0, 0.0, 0.0];
        let s = fair_shares(&tree, cap, &[[1e9, 0.0, 0.0], [1e9, 0.0, 0.0]]);
        assert!((s[0].fair[0] - 30_000.0).abs() < 1e-6);
        assert!((s[1].fair[0] - 70_000.0).abs() < 1e-6);
    }

    #[test]
    fn satisfied_queue_returns_the_rest() {
        let tree = QueueTree::build(&[q("a", 10.0, 1.0, -1.0), q("b", 10.0, 1.0, 20.0)]);
        let s = fair_shares(
            &tree,
            [100_000.0, 0.0, 0.0],
            &[[5_000.0, 0.0, 0.0], [1e9, 0.0, 0.0]],
        );
        assert!((s[0].fair[0] - 5_000.0).abs() < 1e-6);
        assert!((s[1].fair[0] - 20_000.0).abs() < 1e-6, "limit caps b");
    }

    #[test]
    fn hierarchy_recurses() {
        let tree = QueueTree::build(&[
            q("org", 60.0, 1.0, -1.0),
            q("x", 0.0, 1.0, -1.0).parent("org"),
            q("y", 0.0, 1.0, -1.0).parent("org"),
            q("other", 40.0, 1.0, -1.0),
        ]);
        let d = [[0.0; 3], [1e9, 0.0, 0.0], [1e9, 0.0, 0.0], [1e9, 0.0, 0.0]];
        let s = fair_shares(&tree, [100_000.0, 0.0, 0.0], &d);
        assert!((s[0].fair[0] - 60_000.0).abs() < 1e-6);
        assert!((s[1].fair[0] - 30_000.0).abs() < 1e-6);
        assert!((s[3].fair[0] - 40_000.0).abs() < 1e-6);
    }

    #[test]
    fn weight_factors_move_only_the_over_quota_part() {
        let tree = QueueTree::build(&[q("a", 10.0, 1.0, -1.0), q("b", 10.0, 1.0, -1.0)]);
        let d = [[1e9, 0.0, 0.0], [1e9, 0.0, 0.0]];
        let f = [[0.25, 1.0, 1.0], [1.0, 1.0, 1.0]];
        let s = fair_shares_weighted(&tree, [100_000.0, 0.0, 0.0], &d, Some(&f));
        assert_eq!(s[0].deserved[0], 10_000.0);
        assert!(
            (s[0].fair[0] - (10_000.0 + 80_000.0 * 0.2)).abs() < 1e-6,
            "{s:?}"
        );
        assert!(
            (s[1].fair[0] - (10_000.0 + 80_000.0 * 0.8)).abs() < 1e-6,
            "{s:?}"
        );
    }

    #[test]
    fn models_get_their_own_water_fill_and_count_in_the_total_quota() {
        let tree = QueueTree::build(&[
            Queue::new("a").gpu_model("H100", 3.0, Some(1.0), -1.0),
            Queue::new("b")
                .gpu(1.0, 2.0, -1.0)
                .gpu_model("H100", 0.0, None, 5.0),
        ]);
        assert_eq!(tree.models, ["H100"]);
        assert_eq!(
            tree.nodes[0].settings[0].quota, 3000.0,
            "raised to the model's quota"
        );
        let m = model_fair_shares(&tree, &[10_000.0], &[vec![1e9], vec![1e9]], None);
        assert_eq!(m[0][0].deserved, 3000.0);
        // The 7 left go 1:2 by weight, b capped at its limit of 5.
        assert!((m[0][1].fair - 4_666.666_666_666_667).abs() < 1e-6, "{m:?}");
        assert!((m[0][0].fair - 5_333.333_333_333_333).abs() < 1e-6, "{m:?}");
    }

    #[test]
    fn unknown_parent_and_cycle_are_top_level() {
        let tree = QueueTree::build(&[
            q("a", 0.0, 1.0, -1.0).parent("b"),
            q("b", 0.0, 1.0, -1.0).parent("a"),
            q("c", 0.0, 1.0, -1.0).parent("nope"),
        ]);
        assert!(!tree.problems.is_empty());
        assert!(tree.roots.contains(&2));
        assert!(!tree.roots.is_empty());
    }
}
