//! Topology spread constraints, as kube-scheduler's PodTopologySpread plugin judges them:
//! matching pods counted per domain over the eligible nodes once per pod, then the skew a
//! node would create.

use std::collections::BTreeMap;

use crate::cycle::NodeReason;
use crate::model::{InclusionPolicy, Node, Pod, Snapshot, SpreadConstraint};

use super::Occupancy;
use super::labels::{required_node_affinity_ok, selector_matches};
use super::taints::first_untolerated;

/// Counts for one constraint.
struct Domains<'a> {
    constraint: &'a SpreadConstraint,
    counts: BTreeMap<&'a str, i64>,
    /// The least loaded domain's count (0 below `minDomains`).
    min: i64,
    self_match: bool,
}

/// The spread state of one pod: hard constraints (a filter) and soft ones (a score).
pub struct Spread<'a> {
    hard: Vec<Domains<'a>>,
    soft: Vec<Domains<'a>>,
}

/// Whether `node` counts for constraint `c` of `pod` (its inclusion policies).
fn included(c: &SpreadConstraint, pod: &Pod, node: &Node) -> bool {
    (c.node_affinity_policy == InclusionPolicy::Ignore || required_node_affinity_ok(pod, node))
        && (c.node_taints_policy == InclusionPolicy::Ignore
            || first_untolerated(&node.constraints.taints, &pod.constraints.tolerations).is_none())
}

fn domains<'a>(
    snap: &'a Snapshot,
    p: u32,
    occ: &impl Occupancy,
    constraints: Vec<&'a SpreadConstraint>,
) -> Vec<Domains<'a>> {
    let pod = &snap.pods[p as usize];
    let mut out: Vec<Domains> = constraints
        .iter()
        .map(|c| Domains {
            constraint: c,
            counts: BTreeMap::new(),
            min: 0,
            self_match: selector_matches(c.selector.as_ref(), &pod.constraints.labels),
        })
        .collect();
    if out.is_empty() {
        return out;
    }
    for (n, node) in snap.nodes.iter().enumerate() {
        // Only nodes carrying every constraint's key take part.
        if !constraints
            .iter()
            .all(|c| node.labels.contains_key(&c.topology_key))
        {
            continue;
        }
        for d in &mut out {
            let c = d.constraint;
            if !included(c, pod, node) {
                continue;
            }
            let Some(value) = node.labels.get(&c.topology_key) else {
                continue;
            };
            let matching = occ
                .pods_on(n as u32)
                .iter()
                .filter(|&&q| q != p)
                .map(|&q| &snap.pods[q as usize])
                .filter(|e| {
                    !e.terminating
                        && e.namespace == pod.namespace
                        && selector_matches(c.selector.as_ref(), &e.constraints.labels)
                })
                .count() as i64;
            *d.counts.entry(value.as_str()).or_insert(0) += matching;
        }
    }
    for d in &mut out {
        let few = d
            .constraint
            .min_domains
            .is_some_and(|m| (d.counts.len() as u64) < u64::from(m));
        // With no eligible domain kube-scheduler's minimum stays at its initial maximum, so
        // every node passes.
        d.min = if few {
            0
        } else {
            d.counts
                .values()
                .copied()
                .min()
                .unwrap_or(i64::from(i32::MAX))
        };
    }
    out
}

impl<'a> Spread<'a> {
    /// The spread state of pod `p` over the pods placed now.
    pub fn build(snap: &'a Snapshot, p: u32, occ: &impl Occupancy) -> Self {
        let all = &snap.pods[p as usize].constraints.spread;
        Spread {
            hard: domains(snap, p, occ, all.iter().filter(|c| c.hard).collect()),
            soft: domains(snap, p, occ, all.iter().filter(|c| !c.hard).collect()),
        }
    }

    /// The first hard constraint `node` breaks.
    pub fn misfit(&self, node: &Node) -> Option<NodeReason> {
        for d in &self.hard {
            let c = d.constraint;
            let Some(value) = node.labels.get(&c.topology_key) else {
                return Some(NodeReason::TopologySpreadMissingLabel);
            };
            let here = d.counts.get(value.as_str()).copied().unwrap_or(0);
            if here + i64::from(d.self_match) - d.min > i64::from(c.max_skew) {
                return Some(NodeReason::TopologySpread);
            }
        }
        None
    }

    /// Soft constraints' score (higher is better): minus 100 per matching pod already in the
    /// node's domain, relative to the least loaded domain; a node without the key scores as
    /// the most loaded domain.
    pub fn score(&self, node: &Node) -> i64 {
        let mut s = 0;
        for d in &self.soft {
            let worst = d.counts.values().copied().max().unwrap_or(0);
            let here = node
                .labels
                .get(&d.constraint.topology_key)
                .map_or(worst + 1, |v| {
                    d.counts.get(v.as_str()).copied().unwrap_or(0)
                });
            let skew = (here - d.min.min(here)) / i64::from(d.constraint.max_skew.max(1));
            s -= 100 * skew;
        }
        s
    }
}
