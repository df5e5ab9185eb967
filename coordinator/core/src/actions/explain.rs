//! Explanations for pending pods, in kube-scheduler's order and words: node-level failure
//! counts on the final state first (`0/1213 nodes are available: 812 node(s) had no GPU with
//! enough free GPU memory, 401 Insufficient cpu.`), then the job-level reason (gang, queue,
//! fair share). Node counts are computed once per distinct demand.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::constraints::Prepared;
use crate::cycle::{NodeReason, PendingExplanation, Reason};
use rustc_hash::FxHashMap;

use crate::placement::{Misfit, NodeCapacity, PodDemand, check_fit};

use super::engine::Engine;

/// Node counts are shared by pods with the same demand (which carries the static constraint
/// class); pods with dynamic constraints are counted one by one.
type CountKey = PodDemand;

fn node_reason(m: Misfit) -> NodeReason {
    match m {
        Misfit::Unschedulable => NodeReason::Unschedulable,
        Misfit::NodeSelector => NodeReason::NodeSelector,
        Misfit::TooManyPods => NodeReason::TooManyPods,
        Misfit::NoGpus => NodeReason::NoGpus,
        Misfit::ModelMismatch => NodeReason::GpuModel,
        Misfit::Cpu => NodeReason::InsufficientCpu,
        Misfit::Memory => NodeReason::InsufficientMemory,
        Misfit::TooFewGpus => NodeReason::TooFewGpus,
        Misfit::HealthyGpus => NodeReason::TooFewHealthyGpus,
        Misfit::Fenced(f) => NodeReason::GpusFenced(f),
        Misfit::WholeGpus => NodeReason::InsufficientWholeGpus,
        Misfit::GpuShare => NodeReason::InsufficientGpuShare,
        Misfit::GpuMemory => NodeReason::InsufficientGpuMemory,
    }
}

/// Room for `Reason::NotReached`'s text (only sizes a buffer; longer text still fits).
const NOT_REACHED_LEN: usize = 48;

/// Counts by reason, most frequent first (ties by reason).
fn sorted_counts(counts: BTreeMap<NodeReason, u32>) -> Vec<(NodeReason, u32)> {
    let mut v: Vec<(NodeReason, u32)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// The nodes grouped by identical free capacity (at the end of the cycle).
struct NodeClasses {
    /// Class of each node.
    of: Vec<u32>,
    /// A node of each class.
    first: Vec<u32>,
}

impl NodeClasses {
    fn of(nodes: &[NodeCapacity]) -> NodeClasses {
        let mut ids: FxHashMap<&NodeCapacity, u32> = FxHashMap::default();
        let mut first = Vec::new();
        let of = nodes
            .iter()
            .enumerate()
            .map(|(n, cap)| {
                *ids.entry(cap).or_insert_with(|| {
                    first.push(n as u32);
                    first.len() as u32 - 1
                })
            })
            .collect();
        NodeClasses { of, first }
    }
}

impl Engine<'_> {
    fn node_counts(&self, p: u32) -> Vec<(NodeReason, u32)> {
        let info = &self.ctx.pods[p as usize];
        let d = info.demand;
        // Built on the first node that fits the GPUs (see `best_node`).
        let mut prepared: Option<Prepared> = None;
        let mut counts: BTreeMap<NodeReason, u32> = BTreeMap::new();
        for n in 0..self.st.nodes.len() as u32 {
            let r = match self.ctx.static_misfit(p, n) {
                Some(r) => r,
                None => match check_fit(&self.st.nodes[n as usize], &d) {
                    Err(m) => node_reason(m),
                    Ok(()) if info.dynamic => prepared
                        .get_or_insert_with(|| {
                            Prepared::new(
                                self.ctx.snap,
                                p,
                                &self.st,
                                &self.ctx.anti_pods,
                                &self.ctx.spread_cache,
                            )
                        })
                        .misfit(n, &self.st)
                        .unwrap_or(NodeReason::Fits),
                    Ok(()) => NodeReason::Fits,
                },
            };
            *counts.entry(r).or_insert(0) += 1;
        }
        sorted_counts(counts)
    }

    /// [`Engine::node_counts`] for a pod without dynamic constraints: the capacity check runs
    /// once per class of identical node states instead of once per node (its result depends
    /// on the node's capacity and the demand alone); static constraints stay per node.
    fn static_node_counts(&self, p: u32, classes: &NodeClasses) -> Vec<(NodeReason, u32)> {
        let d = self.ctx.pods[p as usize].demand;
        let mut counts: BTreeMap<NodeReason, u32> = BTreeMap::new();
        let mut per_class = vec![0u32; classes.first.len()];
        for n in 0..self.st.nodes.len() as u32 {
            match self.ctx.static_misfit(p, n) {
                Some(r) => *counts.entry(r).or_insert(0) += 1,
                None => per_class[classes.of[n as usize] as usize] += 1,
            }
        }
        for (c, &k) in per_class.iter().enumerate().filter(|(_, k)| **k > 0) {
            let r = match check_fit(&self.st.nodes[classes.first[c] as usize], &d) {
                Err(m) => node_reason(m),
                Ok(()) => NodeReason::Fits,
            };
            *counts.entry(r).or_insert(0) += k;
        }
        sorted_counts(counts)
    }

    /// The node-level part of the explanation for counts `counts` over `total` nodes, for pods
    /// of demand `d`: as kube-scheduler's FitError writes it ("0/4 nodes are available: 3
    /// Insufficient cpu, 1 node(s) didn't match Pod's node affinity/selector."), the failures
    /// most frequent first.
    fn node_part(counts: Vec<(NodeReason, u32)>, total: usize, d: &PodDemand) -> NodePart {
        let fit = counts
            .iter()
            .find(|c| c.0 == NodeReason::Fits)
            .map_or(0, |c| c.1);
        let mut fails = counts.iter().filter(|c| c.0 != NodeReason::Fits).peekable();
        let any_fail = fails.peek().is_some();
        let text = (fit == 0 || any_fail).then(|| {
            if total == 0 {
                // kube-scheduler's words for a cluster without nodes.
                return "no nodes available to schedule pods.".to_owned();
            }
            let mut t = format!("{fit}/{total} nodes are available: ");
            for (k, (r, c)) in fails.enumerate() {
                if k > 0 {
                    t.push_str(", ");
                }
                let _ = write!(t, "{c} {}", r.for_pod(d.gpu_count, d.mig));
            }
            t.push('.');
            t
        });
        NodePart {
            fit,
            text,
            reasons: counts
                .into_iter()
                .map(|(r, c)| (Reason::Node(r), c))
                .collect(),
        }
    }

    /// Explanations for every pod still pending, in snapshot order.
    pub(crate) fn explain(&self) -> Vec<PendingExplanation> {
        let snap = self.ctx.snap;
        let total = snap.nodes.len();
        // Pods of one demand share the node-level text and counts: formatted once.
        let mut cache: BTreeMap<CountKey, NodePart> = BTreeMap::new();
        let mut classes: Option<NodeClasses> = None;
        // Gang members and pods of one queue share notes: each distinct run formatted once.
        let mut last_note: Option<(&Reason, String)> = None;
        let mut out = Vec::new();
        for (i, pod) in snap.pods.iter().enumerate() {
            if self.st.orig_bound[i] || self.st.placed[i].is_some() || pod.placement.is_some() {
                continue;
            }
            let info = &self.ctx.pods[i];
            // A pod larger than every node is explained by the node counts alone.
            if let Some(r) = info
                .invalid
                .as_ref()
                .filter(|r| !matches!(r, Reason::Node(_)))
            {
                out.push(PendingExplanation {
                    pod: pod.uid.clone(),
                    message: r.to_string(),
                    reasons: vec![(r.clone(), 1)],
                });
                continue;
            }
            let own;
            let part = if info.dynamic {
                own = Self::node_part(self.node_counts(i as u32), total, &info.demand);
                &own
            } else {
                cache.entry(info.demand).or_insert_with(|| {
                    let classes = classes.get_or_insert_with(|| NodeClasses::of(&self.st.nodes));
                    Self::node_part(
                        self.static_node_counts(i as u32, classes),
                        total,
                        &info.demand,
                    )
                })
            };
            let note = self.notes[i].as_ref();
            let not_reached = part.fit > 0 && note.is_none();
            let mut reasons: Vec<(Reason, u32)> = Vec::with_capacity(part.reasons.len() + 1);
            if let Some(n) = note
                && last_note.as_ref().is_none_or(|(r, _)| *r != n)
            {
                last_note = Some((n, n.to_string()));
            }
            let note_text = note.and(last_note.as_ref()).map(|(_, t)| t.as_str());
            let mut message = String::with_capacity(
                note_text.map_or(0, str::len)
                    + part.text.as_ref().map_or(0, String::len)
                    + if not_reached { NOT_REACHED_LEN } else { 0 }
                    + 4,
            );
            // kube-scheduler's order: the node-level filter reasons first (its FitError), then
            // what the job and its queue wait for (as its PostFilter's message follows), so a
            // pod no node accepts says so before it says anything about fair share.
            if let Some(t) = &part.text {
                message.push_str(t);
            }
            if let (Some(n), Some(t)) = (note, note_text) {
                if !message.is_empty() {
                    message.push(' ');
                }
                message.push_str(t);
                reasons.push((n.clone(), 1));
            }
            if not_reached {
                if !message.is_empty() {
                    message.push(' ');
                }
                let _ = write!(message, "{}", Reason::NotReached);
                reasons.push((Reason::NotReached, 1));
            }
            reasons.extend(part.reasons.iter().cloned());
            out.push(PendingExplanation {
                pod: pod.uid.clone(),
                message,
                reasons,
            });
        }
        out
    }
}

/// The node-level part of one demand's explanation.
struct NodePart {
    /// Nodes where the pod would fit alone.
    fit: u32,
    /// `fit/total nodes: ...`, when some node fails or none fits.
    text: Option<String>,
    /// The counts as reasons.
    reasons: Vec<(Reason, u32)>,
}
