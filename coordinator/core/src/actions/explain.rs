//! Explanations for pending pods: the job-level reason, then node-level failure counts on the
//! final state (`0/1213 nodes: 812 insufficient GPU memory on any single GPU, 401 insufficient
//! CPU`). Node counts are computed once per distinct demand.

use std::collections::BTreeMap;

use crate::constraints::Prepared;
use crate::cycle::{NodeReason, PendingExplanation, Reason};
use crate::placement::{Misfit, PodDemand, check_fit};

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
        Misfit::HealthyGpus => NodeReason::TooFewHealthyGpus,
        Misfit::WholeGpus => NodeReason::InsufficientWholeGpus,
        Misfit::GpuShare => NodeReason::InsufficientGpuShare,
        Misfit::GpuMemory => NodeReason::InsufficientGpuMemory,
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
        let mut v: Vec<(NodeReason, u32)> = counts.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Explanations for every pod still pending, in snapshot order.
    pub(crate) fn explain(&self) -> Vec<PendingExplanation> {
        let snap = self.ctx.snap;
        let total = snap.nodes.len();
        let mut cache: BTreeMap<CountKey, Vec<(NodeReason, u32)>> = BTreeMap::new();
        let mut out = Vec::new();
        for (i, pod) in snap.pods.iter().enumerate() {
            if self.st.orig_bound[i] || self.st.placed[i].is_some() || pod.placement.is_some() {
                continue;
            }
            let info = &self.ctx.pods[i];
            if let Some(r) = &info.invalid {
                out.push(PendingExplanation {
                    pod: pod.uid.clone(),
                    message: r.to_string(),
                    reasons: vec![(r.clone(), 1)],
                });
                continue;
            }
            let mut reasons: Vec<(Reason, u32)> = Vec::new();
            let mut parts: Vec<String> = Vec::new();
            if let Some(n) = &self.notes[i] {
                parts.push(n.to_string());
                reasons.push((n.clone(), 1));
            }
            let own;
            let counts = if info.dynamic {
                own = self.node_counts(i as u32);
                &own
            } else {
                cache
                    .entry(info.demand)
                    .or_insert_with(|| self.node_counts(i as u32))
            };
            let fit = counts
                .iter()
                .find(|c| c.0 == NodeReason::Fits)
                .map_or(0, |c| c.1);
            let fails: Vec<String> = counts
                .iter()
                .filter(|c| c.0 != NodeReason::Fits)
                .map(|(r, c)| format!("{c} {r}"))
                .collect();
            if fit == 0 || !fails.is_empty() {
                let list = if fails.is_empty() {
                    "no nodes".to_string()
                } else {
                    fails.join(", ")
                };
                parts.push(format!("{fit}/{total} nodes: {list}"));
            }
            if fit > 0 && self.notes[i].is_none() {
                parts.push(Reason::NotReached.to_string());
                reasons.push((Reason::NotReached, 1));
            }
            for (r, c) in counts.iter() {
                reasons.push((Reason::Node(r.clone()), *c));
            }
            out.push(PendingExplanation {
                pod: pod.uid.clone(),
                message: parts.join("; "),
                reasons,
            });
        }
        out
    }
}
