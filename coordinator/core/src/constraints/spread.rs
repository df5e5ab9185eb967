//! Topology spread constraints, as kube-scheduler's PodTopologySpread plugin judges them:
//! matching pods counted per domain over the eligible nodes once per pod, then the skew a
//! node would create.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use crate::cycle::NodeReason;
use crate::model::{
    InclusionPolicy, LabelSelector, Node, NodeSelector, Pod, Snapshot, SpreadConstraint, Toleration,
};

use super::Occupancy;
use super::labels::{required_node_affinity_ok, selector_matches};
use super::taints::first_untolerated;

/// What spread counting needs that stays the same while a cycle places and evicts pods:
/// which nodes count for a constraint (and in which domain), and which pods a selector
/// matches. Counting a pod's domains is then a pass over the eligible nodes' pods with no
/// string comparison, where it was label and selector lookups on every node and pod each
/// time a spread pod was tried. Filled on first use; one per cycle (or per `filter_nodes`).
#[derive(Default)]
pub struct SpreadCache {
    eligible: RefCell<HashMap<EligibilityKey, Rc<Eligibility>>>,
    matches: RefCell<HashMap<SelectorKey, Rc<Vec<bool>>>>,
}

/// A namespace and a selector over its pods.
type SelectorKey = (String, Option<LabelSelector>);

/// What decides a node's eligibility for a constraint of a pod: the topology keys of the
/// pod's constraints of that kind (a node must carry all of them), the constraint's key and
/// inclusion policies, and the pod properties those policies honour.
#[derive(Clone, PartialEq, Eq, Hash)]
struct EligibilityKey {
    group_keys: Vec<String>,
    topology_key: String,
    node_selector: Option<BTreeMap<String, String>>,
    node_affinity: Option<Option<NodeSelector>>,
    tolerations: Option<Vec<Toleration>>,
}

/// The domains of one constraint over the snapshot's nodes.
struct Eligibility {
    /// Every value of the topology key on any node → its domain id.
    ids: BTreeMap<String, u32>,
    /// Per node: its domain id where the node counts, else `None`.
    domain_of: Vec<Option<u32>>,
    /// Domains with at least one counted node.
    present: Vec<bool>,
}

impl SpreadCache {
    fn eligibility(
        &self,
        snap: &Snapshot,
        pod: &Pod,
        group: &[&SpreadConstraint],
        c: &SpreadConstraint,
    ) -> Rc<Eligibility> {
        let honour_affinity = c.node_affinity_policy == InclusionPolicy::Honor;
        let honour_taints = c.node_taints_policy == InclusionPolicy::Honor;
        let key = EligibilityKey {
            group_keys: group.iter().map(|g| g.topology_key.clone()).collect(),
            topology_key: c.topology_key.clone(),
            node_selector: honour_affinity.then(|| pod.node_selector.clone()),
            node_affinity: honour_affinity.then(|| pod.constraints.node_affinity.clone()),
            tolerations: honour_taints.then(|| pod.constraints.tolerations.clone()),
        };
        if let Some(e) = self.eligible.borrow().get(&key) {
            return e.clone();
        }
        let mut ids: BTreeMap<String, u32> = BTreeMap::new();
        for node in &snap.nodes {
            if let Some(v) = node.labels.get(&c.topology_key) {
                let next = ids.len() as u32;
                ids.entry(v.clone()).or_insert(next);
            }
        }
        let mut present = vec![false; ids.len()];
        let domain_of = snap
            .nodes
            .iter()
            .map(|node| {
                // Only nodes carrying every constraint's key take part.
                if !group
                    .iter()
                    .all(|g| node.labels.contains_key(&g.topology_key))
                    || !included(c, pod, node)
                {
                    return None;
                }
                let id = *ids.get(node.labels.get(&c.topology_key)?)?;
                present[id as usize] = true;
                Some(id)
            })
            .collect();
        let e = Rc::new(Eligibility {
            ids,
            domain_of,
            present,
        });
        self.eligible.borrow_mut().insert(key, e.clone());
        e
    }

    /// Per snapshot pod: whether it is in `namespace` and `selector` matches it.
    fn matches(
        &self,
        snap: &Snapshot,
        namespace: &str,
        selector: Option<&LabelSelector>,
    ) -> Rc<Vec<bool>> {
        let key = (namespace.to_string(), selector.cloned());
        if let Some(m) = self.matches.borrow().get(&key) {
            return m.clone();
        }
        let m: Rc<Vec<bool>> = Rc::new(
            snap.pods
                .iter()
                .map(|e| {
                    e.namespace == namespace && selector_matches(selector, &e.constraints.labels)
                })
                .collect(),
        );
        self.matches.borrow_mut().insert(key, m.clone());
        m
    }
}

/// Counts for one constraint.
struct Domains<'a> {
    constraint: &'a SpreadConstraint,
    eligibility: Rc<Eligibility>,
    /// Matching pods per domain id (counted over eligible nodes only).
    counts: Vec<i64>,
    /// The least loaded domain's count (0 below `minDomains`).
    min: i64,
    self_match: bool,
}

impl Domains<'_> {
    /// Matching pods in `node`'s domain; `None` where the node lacks the topology key.
    fn count_at(&self, node: &Node) -> Option<i64> {
        let value = node.labels.get(&self.constraint.topology_key)?;
        Some(
            self.eligibility
                .ids
                .get(value)
                .map_or(0, |&id| self.counts[id as usize]),
        )
    }
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
    cache: &SpreadCache,
    constraints: Vec<&'a SpreadConstraint>,
) -> Vec<Domains<'a>> {
    let pod = &snap.pods[p as usize];
    constraints
        .iter()
        .map(|&c| {
            let eligibility = cache.eligibility(snap, pod, &constraints, c);
            let matches = cache.matches(snap, &pod.namespace, c.selector.as_ref());
            let mut counts = vec![0i64; eligibility.present.len()];
            for (n, dom) in eligibility.domain_of.iter().enumerate() {
                let Some(id) = *dom else { continue };
                counts[id as usize] += occ
                    .pods_on(n as u32)
                    .iter()
                    .filter(|&&q| {
                        q != p && matches[q as usize] && !snap.pods[q as usize].terminating
                    })
                    .count() as i64;
            }
            let present = eligibility.present.iter().filter(|&&x| x).count();
            let few = c
                .min_domains
                .is_some_and(|m| (present as u64) < u64::from(m));
            // With no eligible domain kube-scheduler's minimum stays at its initial maximum, so
            // every node passes.
            let min = if few {
                0
            } else {
                counts
                    .iter()
                    .zip(&eligibility.present)
                    .filter(|(_, here)| **here)
                    .map(|(c, _)| *c)
                    .min()
                    .unwrap_or(i64::from(i32::MAX))
            };
            Domains {
                constraint: c,
                self_match: selector_matches(c.selector.as_ref(), &pod.constraints.labels),
                eligibility,
                counts,
                min,
            }
        })
        .collect()
}

impl<'a> Spread<'a> {
    /// The spread state of pod `p` over the pods placed now.
    pub fn build(snap: &'a Snapshot, p: u32, occ: &impl Occupancy, cache: &SpreadCache) -> Self {
        let all = &snap.pods[p as usize].constraints.spread;
        Spread {
            hard: domains(snap, p, occ, cache, all.iter().filter(|c| c.hard).collect()),
            soft: domains(
                snap,
                p,
                occ,
                cache,
                all.iter().filter(|c| !c.hard).collect(),
            ),
        }
    }

    /// The first hard constraint `node` breaks.
    pub fn misfit(&self, node: &Node) -> Option<NodeReason> {
        for d in &self.hard {
            let Some(here) = d.count_at(node) else {
                return Some(NodeReason::TopologySpreadMissingLabel);
            };
            if here + i64::from(d.self_match) - d.min > i64::from(d.constraint.max_skew) {
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
            let worst = d
                .counts
                .iter()
                .zip(&d.eligibility.present)
                .filter(|(_, here)| **here)
                .map(|(c, _)| *c)
                .max()
                .unwrap_or(0);
            let here = d.count_at(node).unwrap_or(worst + 1);
            let skew = (here - d.min.min(here)) / i64::from(d.constraint.max_skew.max(1));
            s -= 100 * skew;
        }
        s
    }
}
