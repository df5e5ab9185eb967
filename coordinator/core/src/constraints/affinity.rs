//! Inter-pod affinity and anti-affinity, as kube-scheduler's InterPodAffinity plugin judges
//! them: counts of matching pods per `(topology key, value)` pair, computed once per pod being
//! placed, then a lookup per node.

use std::collections::BTreeMap;

use crate::cycle::NodeReason;
use crate::model::{Node, Pod, PodAffinityTerm, Snapshot, WeightedPodTerm};

use super::Occupancy;
use super::labels::selector_matches;

/// A `(topology key, value)` pair.
type Pair<'a> = (&'a str, &'a str);

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Labels of namespace `ns` (none when the namespace is unknown, as kube-scheduler reads it).
pub fn namespace_labels<'a>(snap: &'a Snapshot, ns: &str) -> &'a BTreeMap<String, String> {
    snap.namespaces.get(ns).unwrap_or(&NO_LABELS)
}

/// Every placed pod other than `p`, with its node and its namespace's labels.
fn placed_others<'a, O: Occupancy>(
    snap: &'a Snapshot,
    occ: &O,
    p: u32,
) -> impl Iterator<Item = (&'a Node, &'a Pod, &'a BTreeMap<String, String>)> {
    snap.nodes.iter().enumerate().flat_map(move |(n, node)| {
        occ.pods_on(n as u32)
            .iter()
            .filter(move |&&q| q != p)
            .map(move |&q| {
                let e = &snap.pods[q as usize];
                (node, e, namespace_labels(snap, &e.namespace))
            })
    })
}

/// Whether `target` (in a namespace labelled `ns_labels`) is one of the pods `term` is about.
pub fn term_matches(
    term: &PodAffinityTerm,
    target: &Pod,
    ns_labels: &BTreeMap<String, String>,
) -> bool {
    let ns_ok = term.namespaces.names.contains(&target.namespace)
        || selector_matches(term.namespaces.selector.as_ref(), ns_labels);
    ns_ok && selector_matches(term.selector.as_ref(), &target.constraints.labels)
}

/// What the filter needs about the pods already placed, for one pod.
pub struct InterPod<'a> {
    affinity: BTreeMap<Pair<'a>, u32>,
    anti: BTreeMap<Pair<'a>, u32>,
    existing_anti: BTreeMap<Pair<'a>, u32>,
    /// The pod matches all its own affinity terms (it may start a self-affine series).
    self_match: bool,
}

impl<'a> InterPod<'a> {
    /// Counts for pod `p`; `anti_pods` lists every pod of the snapshot with a required
    /// anti-affinity term (where they are comes from `occ`).
    pub fn build(snap: &'a Snapshot, p: u32, occ: &impl Occupancy, anti_pods: &[u32]) -> Self {
        let pod = &snap.pods[p as usize];
        let c = &pod.constraints;
        let mut s = InterPod {
            affinity: BTreeMap::new(),
            anti: BTreeMap::new(),
            existing_anti: BTreeMap::new(),
            self_match: false,
        };
        if !c.pod_affinity.is_empty() || !c.pod_anti_affinity.is_empty() {
            for (node, e, ns) in placed_others(snap, occ, p) {
                // kube counts a pod for affinity only when it matches every term.
                if !c.pod_affinity.is_empty()
                    && c.pod_affinity.iter().all(|t| term_matches(t, e, ns))
                {
                    for t in &c.pod_affinity {
                        bump(&mut s.affinity, node, &t.topology_key);
                    }
                }
                for t in c
                    .pod_anti_affinity
                    .iter()
                    .filter(|t| term_matches(t, e, ns))
                {
                    bump(&mut s.anti, node, &t.topology_key);
                }
            }
            let own = namespace_labels(snap, &pod.namespace);
            s.self_match = c.pod_affinity.iter().all(|t| term_matches(t, pod, own));
        }
        let own = namespace_labels(snap, &pod.namespace);
        for &q in anti_pods {
            if q == p {
                continue;
            }
            let Some(n) = occ.node_of(q) else { continue };
            let node = &snap.nodes[n as usize];
            for t in &snap.pods[q as usize].constraints.pod_anti_affinity {
                if term_matches(t, pod, own) {
                    bump(&mut s.existing_anti, node, &t.topology_key);
                }
            }
        }
        s
    }

    /// The first inter-pod rule `node` breaks for `pod`, in kube-scheduler's order.
    pub fn misfit(&self, pod: &Pod, node: &Node) -> Option<NodeReason> {
        let c = &pod.constraints;
        if !self.existing_anti.is_empty()
            && node
                .labels
                .iter()
                .any(|(k, v)| count(&self.existing_anti, k, v) > 0)
        {
            return Some(NodeReason::ExistingAntiAffinity);
        }
        if !self.anti.is_empty()
            && c.pod_anti_affinity.iter().any(|t| {
                node.labels
                    .get(&t.topology_key)
                    .is_some_and(|v| count(&self.anti, &t.topology_key, v) > 0)
            })
        {
            return Some(NodeReason::PodAntiAffinity);
        }
        if !c.pod_affinity.is_empty() {
            let mut all_present = true;
            for t in &c.pod_affinity {
                match node.labels.get(&t.topology_key) {
                    // Every term's topology key must be on the node.
                    None => return Some(NodeReason::PodAffinity),
                    Some(v) => all_present &= count(&self.affinity, &t.topology_key, v) > 0,
                }
            }
            // The first pod of a series affine to itself may go anywhere when no other pod
            // matches yet, or it would wait forever.
            if !(all_present || self.affinity.is_empty() && self.self_match) {
                return Some(NodeReason::PodAffinity);
            }
        }
        None
    }
}

fn bump<'a>(m: &mut BTreeMap<Pair<'a>, u32>, node: &'a Node, key: &'a str) {
    if let Some(v) = node.labels.get(key) {
        *m.entry((key, v.as_str())).or_insert(0) += 1;
    }
}

fn count(m: &BTreeMap<Pair<'_>, u32>, key: &str, value: &str) -> u32 {
    m.get(&(key, value)).copied().unwrap_or(0)
}

/// Weighted counts for a pod's preferred inter-pod terms: per term, topology value → weight
/// times matching pods (negative for anti-affinity).
pub struct Preferred<'a> {
    terms: Vec<(&'a str, BTreeMap<&'a str, i64>)>,
}

impl<'a> Preferred<'a> {
    /// Counts for pod `p` over the pods placed now.
    pub fn build(snap: &'a Snapshot, p: u32, occ: &impl Occupancy) -> Self {
        let c = &snap.pods[p as usize].constraints;
        let weighted: Vec<(&WeightedPodTerm, i64)> = c
            .preferred_pod_affinity
            .iter()
            .map(|w| (w, 1))
            .chain(c.preferred_pod_anti_affinity.iter().map(|w| (w, -1)))
            .collect();
        let mut terms: Vec<(&str, BTreeMap<&str, i64>)> = weighted
            .iter()
            .map(|(w, _)| (w.term.topology_key.as_str(), BTreeMap::new()))
            .collect();
        if weighted.is_empty() {
            return Preferred { terms };
        }
        for (node, e, ns) in placed_others(snap, occ, p) {
            for (i, (w, sign)) in weighted.iter().enumerate() {
                if let Some(v) = node.labels.get(&w.term.topology_key)
                    && term_matches(&w.term, e, ns)
                {
                    *terms[i].1.entry(v.as_str()).or_insert(0) += sign * i64::from(w.weight);
                }
            }
        }
        Preferred { terms }
    }

    /// The node's preferred inter-pod score (higher is better).
    pub fn score(&self, node: &Node) -> i64 {
        self.terms
            .iter()
            .filter_map(|(key, m)| node.labels.get(*key).and_then(|v| m.get(v.as_str())))
            .sum()
    }
}
