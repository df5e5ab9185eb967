//! kube-scheduler's placement constraints, judged the way its filter plugins judge them, so a
//! pod Tessera places lands only where kube-scheduler could have put it.
//!
//! Two kinds, kept apart because they cost differently:
//! - **static** ones depend only on the pod and the node (cordon, taints, node selector and
//!   affinity, volume node affinity): [`static_misfit`];
//! - **dynamic** ones depend on what else runs (pod count and extended resources, host ports,
//!   inter-pod affinity, topology spread): [`Prepared`] counts what it needs once per pod being
//!   placed (one pass over the placed pods, as kube-scheduler's PreFilter does), then judges
//!   each node with lookups. Pods with none of them never pay for it.
//!
//! Preferences (preferred node and inter-pod affinity, soft spread, PreferNoSchedule taints)
//! become one score ([`Prepared::preference`]) that ranks nodes ahead of the GPU-fit score.
//! CPU, memory and GPUs are the placement module's.

pub mod affinity;
pub mod labels;
pub mod ports;
pub mod spread;
pub mod taints;

use crate::cycle::NodeReason;
use crate::model::{Node, Pod, Snapshot};

/// Where placed pods are: the cycle's tentative state, or a snapshot's bound pods.
pub trait Occupancy {
    /// Pods on node `n` now.
    fn pods_on(&self, n: u32) -> &[u32];
    /// The node pod `p` is on now.
    fn node_of(&self, p: u32) -> Option<u32>;
}

/// The first static constraint `node` breaks for `pod`, in kube-scheduler's plugin order
/// (NodeUnschedulable, TaintToleration, NodeAffinity, VolumeBinding).
pub fn static_misfit(pod: &Pod, node: &Node) -> Option<NodeReason> {
    let tolerations = &pod.constraints.tolerations;
    if !node.schedulable && !taints::tolerates_cordon(tolerations) {
        return Some(NodeReason::Unschedulable);
    }
    if let Some(t) = taints::first_untolerated(&node.constraints.taints, tolerations) {
        return Some(NodeReason::UntoleratedTaint(taints::describe(t)));
    }
    if !labels::required_node_affinity_ok(pod, node) {
        return Some(NodeReason::NodeSelector);
    }
    if !pod
        .constraints
        .volume_node_affinity
        .iter()
        .all(|s| labels::node_selector_matches(s, node))
    {
        return Some(NodeReason::VolumeNodeAffinity);
    }
    None
}

/// NodeResourcesFit's pod count, with `others` the pods on the node. The cycle applies the
/// same rule in `placement::gpu_fit`; this is `filter_nodes`'s copy of it.
fn pod_count_misfit(node: &Node, others: &[u32]) -> Option<NodeReason> {
    node.constraints
        .max_pods
        .is_some_and(|max| others.len() as u64 + 1 > u64::from(max))
        .then_some(NodeReason::TooManyPods)
}

/// Resources other than CPU, memory and GPUs, with `others` the pods on the node.
pub fn extended_misfit(
    snap: &Snapshot,
    pod: &Pod,
    node: &Node,
    others: &[u32],
) -> Option<NodeReason> {
    for (name, &want) in &pod.constraints.extended {
        if want == 0 {
            continue;
        }
        let used: u64 = others
            .iter()
            .filter_map(|&q| snap.pods[q as usize].constraints.extended.get(name))
            .sum();
        let have = node.constraints.extended.get(name).copied().unwrap_or(0);
        if have < want.saturating_add(used) {
            return Some(NodeReason::InsufficientResource(name.clone()));
        }
    }
    None
}

/// Whether the pod's fit depends on what else runs (see the module docs). Pods that some
/// other pod's required anti-affinity could reject are dynamic too: the caller knows that.
pub fn is_dynamic(pod: &Pod) -> bool {
    let c = &pod.constraints;
    !c.pod_affinity.is_empty()
        || !c.pod_anti_affinity.is_empty()
        || !c.spread.is_empty()
        || !c.host_ports.is_empty()
        || !c.extended.is_empty()
        || !c.preferred_pod_affinity.is_empty()
        || !c.preferred_pod_anti_affinity.is_empty()
}

/// Whether the pod has preferences that rank nodes.
pub fn has_preferences(pod: &Pod) -> bool {
    let c = &pod.constraints;
    !c.preferred_node_affinity.is_empty()
        || !c.preferred_pod_affinity.is_empty()
        || !c.preferred_pod_anti_affinity.is_empty()
        || c.spread.iter().any(|s| !s.hard)
}

/// The dynamic constraints of one pod against the pods placed now.
pub struct Prepared<'a> {
    snap: &'a Snapshot,
    pod: &'a Pod,
    inter: affinity::InterPod<'a>,
    spread: spread::Spread<'a>,
    preferred: affinity::Preferred<'a>,
}

impl<'a> Prepared<'a> {
    /// Counts what pod `p` needs; `anti_pods` lists the snapshot's pods with required
    /// anti-affinity terms; `spread_cache` is the cycle's (see [`spread::SpreadCache`]).
    pub fn new(
        snap: &'a Snapshot,
        p: u32,
        occ: &impl Occupancy,
        anti_pods: &[u32],
        spread_cache: &spread::SpreadCache,
    ) -> Self {
        Prepared {
            snap,
            pod: &snap.pods[p as usize],
            inter: affinity::InterPod::build(snap, p, occ, anti_pods),
            spread: spread::Spread::build(snap, p, occ, spread_cache),
            preferred: affinity::Preferred::build(snap, p, occ),
        }
    }

    /// The first dynamic constraint node `n` breaks (NodeResourcesFit's pod count and extended
    /// resources, NodePorts, InterPodAffinity, PodTopologySpread).
    pub fn misfit(&self, n: u32, occ: &impl Occupancy) -> Option<NodeReason> {
        let node = &self.snap.nodes[n as usize];
        let others = occ.pods_on(n);
        // The pod count is the placement module's (it is cheap and every pod has it).
        if let Some(r) = extended_misfit(self.snap, self.pod, node, others) {
            return Some(r);
        }
        if ports::conflict(self.snap, self.pod, others) {
            return Some(NodeReason::HostPorts);
        }
        self.inter
            .misfit(self.pod, node)
            .or_else(|| self.spread.misfit(node))
    }

    /// How much the pod prefers node `n` (higher is better; 0 without preferences): preferred
    /// node-affinity weights met, minus 100 per untolerated PreferNoSchedule taint, plus the
    /// preferred inter-pod weights of matching pods in the node's domains, minus 100 per
    /// matching pod of soft spread skew.
    pub fn preference(&self, n: u32) -> i64 {
        let node = &self.snap.nodes[n as usize];
        node_preference(self.pod, node) + self.preferred.score(node) + self.spread.score(node)
    }
}

/// The static part of the preference score (preferred node affinity and soft taints).
pub fn node_preference(pod: &Pod, node: &Node) -> i64 {
    let c = &pod.constraints;
    let affinity: i64 = c
        .preferred_node_affinity
        .iter()
        .filter(|t| labels::term_matches(&t.term, node))
        .map(|t| i64::from(t.weight))
        .sum();
    let soft = taints::untolerated_soft(&node.constraints.taints, &c.tolerations) as i64;
    affinity - 100 * soft
}

/// Placed pods of a snapshot: its bound pods where they are bound.
struct Bound {
    on: Vec<Vec<u32>>,
    at: Vec<Option<u32>>,
}

impl Bound {
    fn of(snap: &Snapshot) -> Bound {
        let by_name: std::collections::BTreeMap<&str, u32> = snap
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i as u32))
            .collect();
        let mut on = vec![Vec::new(); snap.nodes.len()];
        let mut at = vec![None; snap.pods.len()];
        for (i, p) in snap.pods.iter().enumerate() {
            if let Some(&n) = p
                .placement
                .as_ref()
                .and_then(|pl| by_name.get(pl.node.as_str()))
            {
                on[n as usize].push(i as u32);
                at[i] = Some(n);
            }
        }
        Bound { on, at }
    }
}

impl Occupancy for Bound {
    fn pods_on(&self, n: u32) -> &[u32] {
        &self.on[n as usize]
    }

    fn node_of(&self, p: u32) -> Option<u32> {
        self.at[p as usize]
    }
}

/// kube-scheduler's filters (NodeUnschedulable, TaintToleration, NodeAffinity, VolumeBinding's
/// node affinity, NodeResourcesFit without GPUs, NodePorts, InterPodAffinity,
/// PodTopologySpread) for pod `pod` of `snap` on every node, with the snapshot's bound pods as
/// what runs: `None` where the node passes, else the first failure. GPU fit is not checked.
/// The cycle applies the same rules through the same functions; this entry point is how they
/// are compared with kube-scheduler's own plugins.
pub fn filter_nodes(snap: &Snapshot, pod: usize) -> Vec<Option<NodeReason>> {
    let occ = Bound::of(snap);
    let anti_pods: Vec<u32> = (0..snap.pods.len() as u32)
        .filter(|&q| {
            !snap.pods[q as usize]
                .constraints
                .pod_anti_affinity
                .is_empty()
        })
        .collect();
    let p = &snap.pods[pod];
    let prepared = Prepared::new(
        snap,
        pod as u32,
        &occ,
        &anti_pods,
        &spread::SpreadCache::default(),
    );
    (0..snap.nodes.len() as u32)
        .map(|n| {
            let node = &snap.nodes[n as usize];
            static_misfit(p, node)
                .or_else(|| pod_count_misfit(node, occ.pods_on(n)))
                .or_else(|| cpu_memory_misfit(snap, p, node, occ.pods_on(n)))
                .or_else(|| prepared.misfit(n, &occ))
        })
        .collect()
}

/// NodeResourcesFit's CPU and memory check against the requests of `others`.
fn cpu_memory_misfit(
    snap: &Snapshot,
    pod: &Pod,
    node: &Node,
    others: &[u32],
) -> Option<NodeReason> {
    let (cpu, mem) = others.iter().fold((0u64, 0u64), |(c, m), &q| {
        let e = &snap.pods[q as usize];
        (c + e.cpu_milli, m + e.memory_mib)
    });
    if pod.cpu_milli > 0 && pod.cpu_milli > node.cpu_milli.saturating_sub(cpu) {
        return Some(NodeReason::InsufficientCpu);
    }
    if pod.memory_mib > 0 && pod.memory_mib > node.memory_mib.saturating_sub(mem) {
        return Some(NodeReason::InsufficientMemory);
    }
    None
}
