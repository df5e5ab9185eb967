//! Victim search shared by reclaim, preempt and consolidate, and those three actions.
//!
//! The search is bounded: at most `max_victim_candidates` nodes per pod, at most
//! `max_victim_jobs` jobs per action. On each node, victims are taken greedily in preference
//! order (elastic pods first, then lowest priority, then youngest) until the pod fits; the node
//! needing the fewest victims wins. Every trial runs inside the statement and is rolled back.

use std::collections::BTreeMap;

use crate::cycle::{EvictionReason, Reason};
use crate::placement::PodDemand;

/// Demand, action kind, queue and priority of a single-pod victim search.
pub(crate) type SearchKey = (PodDemand, u8, usize, i32);

use super::allocate::Mode;

/// How full a queue is relative to its fair share (`alloc / fair`; anything held over a zero
/// fair share is infinitely full).
fn saturation(alloc: f64, fair: f64) -> f64 {
    if alloc <= SHARE_EPS {
        0.0
    } else if fair <= SHARE_EPS {
        f64::INFINITY
    } else {
        alloc / fair
    }
}
use super::engine::{Engine, SHARE_EPS};

impl Engine<'_> {
    /// Whether pod `v` may be a victim for pod `p` at all (mode-independent part).
    fn victim_static_ok(&self, p: u32, v: u32) -> bool {
        let pod = &self.ctx.snap.pods[v as usize];
        self.st.orig_bound[v as usize]
            && pod.preemptible
            && !pod.terminating
            && !pod.owned_by_other_scheduler
            && (self.ctx.pods[v as usize].group.is_none()
                || self.ctx.pods[v as usize].group != self.ctx.pods[p as usize].group)
    }

    /// Whether `v` is an elastic member (its group keeps `minMember` without it).
    fn is_elastic(&self, v: u32) -> bool {
        match self.ctx.pods[v as usize].group {
            None => false,
            Some(g) => self.st.group_placed[g as usize] > self.ctx.groups[g as usize].min_member,
        }
    }

    /// The pods that leave together with `v`: its whole gang if `v` is a core member.
    fn victim_set(&self, v: u32) -> Vec<u32> {
        match self.ctx.pods[v as usize].group {
            Some(g) if !self.is_elastic(v) => self.ctx.groups[g as usize]
                .members
                .iter()
                .copied()
                .filter(|&m| self.st.placed[m as usize].is_some())
                .collect(),
            _ => vec![v],
        }
    }

    /// Mode-specific check of a victim set on node `n` (where `p` is to go) against the
    /// current state.
    fn victims_ok(&mut self, p: u32, n: u32, set: &[u32], mode: Mode) -> bool {
        if set.iter().any(|&v| !self.victim_static_ok(p, v)) {
            return false;
        }
        // A move is an eviction plus a new copy from the pod's controller: a bare pod would
        // simply be gone.
        if mode == Mode::Consolidate
            && set
                .iter()
                .any(|&v| self.ctx.snap.pods[v as usize].controller.is_none())
        {
            return false;
        }
        let allowed = match mode {
            Mode::Allocate => false,
            Mode::Preempt(q, prio, _) => set.iter().all(|&v| {
                self.ctx.pods[v as usize].queue == Some(q)
                    && self.ctx.snap.pods[v as usize].priority < prio
            }),
            Mode::Consolidate => {
                set.len() == 1 && self.ctx.pods[set[0] as usize].demand.gpu_count > 0
            }
            Mode::Reclaim(q) => self.reclaim_victims_ok(p, q, n, set),
        };
        // A set the other rules allow is still refused by the Eviction API where a disruption
        // budget has no disruption left: such victims are not chosen, and the waiting pods say
        // which budgets stopped them.
        if allowed {
            let refusing = self.ctx.budgets.refusing(&self.st.budget_evicted, set);
            if !refusing.is_empty() {
                self.budget_blocked.extend(refusing);
                return false;
            }
        }
        allowed
    }

    /// The reason for `gang`'s failed victim search when disruption budgets refused victims
    /// the other rules allowed (noted on its pods); clears the record for the next search.
    fn note_budget_block(&mut self, gang: &[u32]) {
        if self.budget_blocked.is_empty() {
            return;
        }
        let budgets: Vec<String> = std::mem::take(&mut self.budget_blocked)
            .into_iter()
            .map(|b| self.ctx.budgets.names[b as usize].clone())
            .collect();
        let reason = Reason::DisruptionBudget { budgets };
        gang.iter().for_each(|&p| self.note(p, reason.clone()));
    }

    /// The reclaim rules, per resource. A queue loses (it is on the victims' path but not on
    /// the reclaimer's) or gains (the other way round); shared ancestors do neither.
    ///
    /// - Rule (a), the guarantee: where every gaining queue stays within its deserved quota
    ///   after the whole waiting gang is placed, a losing queue may go down to its own deserved
    ///   quota, even below its fair share. A queue inside its quota always gets in.
    /// - Rule (b), fairness: otherwise every gaining queue must stay within its fair share, and a
    ///   losing queue must keep its fair share wherever it is contended for it (fair share below
    ///   demand). A resource a queue gets all it asks for (typically CPU and memory next to
    ///   scarce GPUs) does not protect it: evicting a GPU pod also returns that pod's CPU, and
    ///   holding that CPU is no claim on the GPU. But where the reclaimer needs that resource
    ///   from the victim (GPU, or CPU/memory the node `n` is short of), the victim, if it goes
    ///   below its fair share, must stay at least as full relative to it as the reclaimer.
    ///
    /// No losing queue ever goes below its deserved quota. Neither rule lets the victim take
    /// back what it lost in the next cycle: after (a) the reclaimer is within its deserved
    /// quota, which no reclaim can touch; after (b) it is within its fair share, and the victim
    /// keeps its own.
    fn reclaim_victims_ok(&self, p: u32, q: usize, n: u32, set: &[u32]) -> bool {
        let mut loss: Vec<(usize, [u64; 3])> = Vec::new();
        for &v in set {
            let Some(vq) = self.ctx.pods[v as usize].queue else {
                return false;
            };
            let used = self.used_by(v);
            for a in self.ctx.tree.path(vq) {
                if self.ctx.tree.path(q).any(|b| b == a) {
                    continue;
                }
                match loss.iter_mut().find(|(x, _)| *x == a) {
                    Some((_, l)) => (0..3).for_each(|k| l[k] += used[k]),
                    None => loss.push((a, used)),
                }
            }
        }
        if loss.is_empty() {
            return false; // same queue: that is preemption, not reclaim
        }
        let victim_paths: Vec<usize> = set
            .iter()
            .filter_map(|&v| self.ctx.pods[v as usize].queue)
            .flat_map(|vq| self.ctx.tree.path(vq).collect::<Vec<_>>())
            .collect();
        let gainers: Vec<usize> = self
            .ctx
            .tree
            .path(q)
            .filter(|a| !victim_paths.contains(a))
            .collect();
        let remaining = self.reclaim_remaining(p);
        let mut guaranteed = self.guaranteed(&gainers, remaining);
        // A queue within its deserved quota of the node's GPU model is guaranteed it as it is
        // its total quota: its losers may go down to their deserved quotas.
        let model = self.node_model(n).filter(|_| remaining[0] > 0);
        let model_guaranteed =
            model.is_some_and(|m| self.model_guaranteed(&gainers, m, remaining[0]));
        guaranteed[0] |= model_guaranteed;
        // The gainers gain what the reclaiming pod requests, not what the victims held (the
        // rest of that stays free).
        let req = self.ctx.pods[p as usize].request;
        let moved = [req.gpu_milli, req.cpu_milli, req.memory_mib];
        let gain_ok = gainers.iter().all(|&a| {
            (0..3).all(|k| {
                moved[k] == 0
                    || guaranteed[k]
                    || (self.st.queue_alloc[a][k] + moved[k]) as f64
                        <= self.shares[a].fair[k] + SHARE_EPS
            })
        });
        // What the pod cannot have on node `n` without evicting: GPU (that is what reclaims
        // are for), and CPU or memory when the node is short of them. Only there does the
        // victim give the reclaimer something it competes for.
        let node = &self.st.nodes[n as usize];
        let pod = &self.ctx.snap.pods[p as usize];
        let scarce = [
            true,
            node.cpu_free < pod.cpu_milli,
            node.mem_free < pod.memory_mib,
        ];
        // Where the two sides compete: the children of their lowest common ancestor.
        let (Some(&top_gainer), Some(&(top_loser, _))) = (gainers.last(), loss.last()) else {
            return false;
        };
        gain_ok
            && self.model_reclaim_ok(p, set, model, model_guaranteed, &gainers, &loss)
            && loss.iter().all(|&(a, l)| {
                let share = &self.shares[a];
                (0..3).all(|k| {
                    let left = self.st.queue_alloc[a][k] as f64 - l[k] as f64;
                    let contended = share.fair[k] + SHARE_EPS < share.demand[k];
                    if l[k] == 0 || guaranteed[k] {
                        return l[k] == 0 || left >= share.deserved[k] - SHARE_EPS;
                    }
                    if left < share.deserved[k] - SHARE_EPS
                        || (contended && left < share.fair[k] - SHARE_EPS)
                    {
                        return false;
                    }
                    // Uncontended (the queue could have all it asks for, had placement not
                    // left it short) and going below its fair share in something the
                    // reclaimer needs from it: it yields only to a queue that stays
                    // relatively further below its own fair share, else the two would take
                    // the capacity back and forth cycle after cycle.
                    a != top_loser
                        || moved[k] == 0
                        || !scarce[k]
                        || left >= share.fair[k] - SHARE_EPS
                        || saturation(
                            (self.st.queue_alloc[top_gainer][k] + moved[k]) as f64,
                            self.shares[top_gainer].fair[k],
                        ) <= saturation(left, share.fair[k]) + SHARE_EPS
                })
            })
    }

    /// The GPU model (of the queue tree's models) of node `n`'s GPUs, as placement reads a
    /// node's model: its first GPU's.
    fn node_model(&self, n: u32) -> Option<usize> {
        let m = self.ctx.gpu_model(n, 0);
        (m != super::context::NO_MODEL).then_some(m as usize)
    }

    /// Rule (a) for GPU model `m`: every queue of `gainers` stays within its deserved quota of
    /// the model after taking `need` milli-GPU of it.
    fn model_guaranteed(&self, gainers: &[usize], m: usize, need: u64) -> bool {
        need > 0
            && gainers.iter().all(|&a| {
                (self.st.model_alloc[a][m] + need) as f64
                    <= self.model_shares[m][a].deserved + SHARE_EPS
            })
    }

    /// The reclaim rules per named GPU model: the gainers take the pod's GPUs of the node's
    /// model `model` within their fair share of it (unless `guaranteed`, rule (a)), and no
    /// losing queue goes below its deserved quota of any model, nor below its fair share of a
    /// model it is contended for unless rule (a) holds for that model.
    fn model_reclaim_ok(
        &self,
        p: u32,
        set: &[u32],
        model: Option<usize>,
        guaranteed: bool,
        gainers: &[usize],
        loss: &[(usize, [u64; 3])],
    ) -> bool {
        let dims = self.ctx.tree.models.len();
        if dims == 0 {
            return true;
        }
        let moved = self.ctx.pods[p as usize].request.gpu_milli;
        if let Some(m) = model
            && moved > 0
            && !guaranteed
            && !gainers.iter().all(|&a| {
                (self.st.model_alloc[a][m] + moved) as f64
                    <= self.model_shares[m][a].fair + SHARE_EPS
            })
        {
            return false;
        }
        loss.iter().all(|&(a, _)| {
            // What the victims below this losing queue hold of each model.
            let mut lost = vec![0u64; dims];
            for &v in set {
                let on_path = self.ctx.pods[v as usize]
                    .queue
                    .is_some_and(|vq| self.ctx.tree.path(vq).any(|x| x == a));
                let Some(pl) = self.st.placed[v as usize].as_ref().filter(|_| on_path) else {
                    continue;
                };
                for &(g, c, _) in &pl.gpus {
                    let d = self.ctx.gpu_model(pl.node, g);
                    if d != super::context::NO_MODEL {
                        lost[d as usize] += u64::from(c);
                    }
                }
            }
            (0..dims).all(|d| {
                if lost[d] == 0 {
                    return true;
                }
                let s = &self.model_shares[d][a];
                let left = self.st.model_alloc[a][d] as f64 - lost[d] as f64;
                let contended = s.fair + SHARE_EPS < s.demand;
                left >= s.deserved - SHARE_EPS
                    && (!contended
                        || (guaranteed && model == Some(d))
                        || left >= s.fair - SHARE_EPS)
            })
        })
    }

    /// Per resource: whether rule (a) applies, i.e. every queue of `gainers` stays within its
    /// deserved quota after taking `need` (a resource not needed gets rule (b)).
    fn guaranteed(&self, gainers: &[usize], need: [u64; 3]) -> [bool; 3] {
        std::array::from_fn(|k| {
            need[k] > 0
                && gainers.iter().all(|&a| {
                    (self.st.queue_alloc[a][k] + need[k]) as f64
                        <= self.shares[a].deserved[k] + SHARE_EPS
                })
        })
    }

    /// What the gang being reclaimed for still needs, pod `p` included (its members are placed
    /// one by one; the rule is decided for the gang as a whole).
    fn reclaim_remaining(&self, p: u32) -> [u64; 3] {
        let rest: Vec<u32> = self
            .reclaim_gang
            .iter()
            .copied()
            .filter(|&m| m != p && self.st.placed[m as usize].is_none())
            .chain(std::iter::once(p))
            .collect();
        self.request_of(&rest)
    }

    /// The allocation queue `vq` may be reclaimed down to, per resource: its deserved quota
    /// where rule (a) may apply (`g`, from [`Self::guaranteed`] of the reclaiming leaf alone),
    /// else its fair share. A relaxation for prefilters; the exact check is
    /// [`Self::reclaim_victims_ok`].
    fn reclaim_floor(&self, g: [bool; 3], vq: usize) -> [f64; 3] {
        let s = &self.shares[vq];
        std::array::from_fn(|k| if g[k] { s.deserved[k] } else { s.fair[k] })
    }

    /// Resources pod `v` holds now.
    fn used_by(&self, v: u32) -> [u64; 3] {
        let pod = &self.ctx.snap.pods[v as usize];
        let gpu = self.st.placed[v as usize]
            .as_ref()
            .map(|pl| pl.gpus.iter().map(|g| u64::from(g.1)).sum())
            .unwrap_or(0);
        [gpu, pod.cpu_milli, pod.memory_mib]
    }

    fn reason_for(&self, mode: Mode) -> EvictionReason {
        match mode {
            Mode::Reclaim(q) => EvictionReason::Reclaim {
                by_queue: self.ctx.tree.nodes[q].name.clone(),
            },
            Mode::Preempt(_, _, by) => EvictionReason::Preempt {
                by_pod: self.ctx.snap.pods[by as usize].uid.clone(),
            },
            _ => EvictionReason::Consolidate {
                moved_to: String::new(),
            },
        }
    }

    /// Evicts victims on node `n` until `p` fits there, then places `p` (and, when
    /// consolidating, re-places every moved pod elsewhere). Returns the number of pods evicted,
    /// or `None` (state then needs a rollback by the caller).
    fn evict_for(&mut self, p: u32, n: u32, mode: Mode) -> Option<usize> {
        if !self.ctx.static_ok(p, n) {
            return None;
        }
        let mut cands: Vec<u32> = self.st.node_pods[n as usize]
            .iter()
            .copied()
            .filter(|&v| self.victim_static_ok(p, v))
            .collect();
        if cands.is_empty() {
            return None;
        }
        let snap = self.ctx.snap;
        cands.sort_by(|&a, &b| {
            let (pa, pb) = (&snap.pods[a as usize], &snap.pods[b as usize]);
            (!self.is_elastic(a))
                .cmp(&!self.is_elastic(b))
                .then(pa.priority.cmp(&pb.priority))
                .then(pb.created.cmp(&pa.created))
                .then(pa.uid.cmp(&pb.uid))
        });
        let reason = self.reason_for(mode);
        let mut moved: Vec<u32> = Vec::new();
        let mut fits = false;
        for v in cands {
            if self.st.placed[v as usize].is_none() {
                continue;
            }
            let set = self.victim_set(v);
            if !self.victims_ok(p, n, &set, mode) {
                continue;
            }
            for &x in &set {
                self.st.evict(&self.ctx, x, reason.clone());
            }
            moved.extend_from_slice(&set);
            if self.st.fits(&self.ctx, p, n) {
                fits = true;
                break;
            }
        }
        if !fits {
            return None;
        }
        let (node, choice) = self.best_node(p, Some(&[n]), None)?;
        self.st.place(
            &self.ctx,
            p,
            super::statement::Placed {
                node,
                gpus: choice.gpus,
            },
        );
        if mode == Mode::Consolidate {
            for &v in &moved {
                let (node, choice) = self.best_node(v, None, Some(n))?;
                self.st.place(
                    &self.ctx,
                    v,
                    super::statement::Placed {
                        node,
                        gpus: choice.gpus,
                    },
                );
            }
        }
        Some(moved.len())
    }

    /// Cheap upper bound: would `p` fit on `n` if every victim allowed by the mode's static
    /// rules were gone? Prunes nodes before the (rolled-back) trial evictions.
    fn could_fit_after_evictions(&self, p: u32, n: u32, mode: Mode) -> bool {
        let snap = self.ctx.snap;
        let mut cap: Option<crate::placement::NodeCapacity> = None;
        let guaranteed = match mode {
            Mode::Reclaim(q) => {
                let need = self.reclaim_remaining(p);
                let mut g = self.guaranteed(&[q], need);
                g[0] |= self
                    .node_model(n)
                    .is_some_and(|m| self.model_guaranteed(&[q], m, need[0]));
                g
            }
            _ => [false; 3],
        };
        for &v in &self.st.node_pods[n as usize] {
            if !self.victim_static_ok(p, v) {
                continue;
            }
            let info = &self.ctx.pods[v as usize];
            let ok = match mode {
                Mode::Allocate => false,
                // Only queues above their floor (deserved quota or fair share) can give back.
                Mode::Reclaim(q) => info.queue.is_some_and(|vq| {
                    let floor = self.reclaim_floor(guaranteed, vq);
                    vq != q && (0..3).any(|k| self.alloc_of(vq)[k] > floor[k] + SHARE_EPS)
                }),
                Mode::Preempt(q, prio, _) => {
                    info.queue == Some(q) && snap.pods[v as usize].priority < prio
                }
                Mode::Consolidate => {
                    info.demand.gpu_count > 0 && (info.group.is_none() || self.is_elastic(v))
                }
            };
            if !ok {
                continue;
            }
            let Some(pl) = &self.st.placed[v as usize] else {
                continue;
            };
            let c = cap.get_or_insert_with(|| self.st.nodes[n as usize].clone());
            let pod = &snap.pods[v as usize];
            c.cpu_free += pod.cpu_milli;
            c.mem_free += pod.memory_mib;
            for &(g, comp, mem) in &pl.gpus {
                let gpu = &mut c.gpus[g as usize];
                gpu.compute_free += comp;
                gpu.mem_free += mem;
                gpu.holders = gpu.holders.saturating_sub(1);
            }
        }
        match cap {
            None => false,
            Some(c) => {
                self.ctx.static_ok(p, n)
                    && crate::placement::check_fit(&c, &self.ctx.pods[p as usize].demand).is_ok()
            }
        }
    }

    /// Places `p` by evicting the fewest victims on one node.
    pub(crate) fn place_with_victims(
        &mut self,
        p: u32,
        restrict: Option<&[u32]>,
        mode: Mode,
    ) -> bool {
        let nodes: Vec<u32> = match restrict {
            Some(r) => r.to_vec(),
            None => self.rank_order.clone(),
        };
        let mut best: Option<(usize, u32)> = None;
        let mut examined = 0usize;
        for n in nodes {
            if !self.could_fit_after_evictions(p, n, mode) {
                continue;
            }
            examined += 1;
            let cp = self.st.checkpoint();
            self.depth += 1;
            let got = self.evict_for(p, n, mode);
            self.depth -= 1;
            self.st.rollback(&self.ctx, cp);
            if let Some(cost) = got
                && best.is_none_or(|(bc, _)| cost < bc)
            {
                best = Some((cost, n));
                if cost <= 1 {
                    break;
                }
            }
            if examined >= self.ctx.cfg.max_victim_candidates {
                break;
            }
        }
        let Some((_, n)) = best else { return false };
        let cp = self.st.checkpoint();
        if self.evict_for(p, n, mode).is_some() {
            return true;
        }
        self.st.rollback(&self.ctx, cp);
        false
    }

    /// Leaf queues in reclaim order: furthest below fair share first.
    fn leaves_by_deficit(&self) -> Vec<usize> {
        let mut qs: Vec<usize> = (0..self.ctx.tree.len())
            .filter(|&q| !self.queue_jobs[q].is_empty())
            .collect();
        qs.sort_by(|&a, &b| {
            let (ka, kb) = (self.queue_key(a), self.queue_key(b));
            ka.cmp(&kb).then(a.cmp(&b))
        });
        qs
    }

    /// Whether leaf queue `q` stays within its fair share after taking `req` (its ancestors
    /// are checked per victim, where it is known which of them gain).
    fn within_fair(&self, q: usize, req: [u64; 3]) -> bool {
        (0..3).all(|k| {
            req[k] == 0
                || (self.st.queue_alloc[q][k] + req[k]) as f64 <= self.shares[q].fair[k] + SHARE_EPS
        })
    }

    /// Whether leaf `q` is within its deserved quota of some named GPU model after taking
    /// `need` milli-GPU of it (rule (a) may then apply on a node of that model).
    fn any_model_guaranteed(&self, q: usize, need: u64) -> bool {
        (0..self.ctx.tree.models.len()).any(|m| self.model_guaranteed(&[q], m, need))
    }

    /// The gang part of job `j` that still waits, if any.
    fn waiting_gang(&self, j: usize) -> Option<Vec<u32>> {
        let pending = self.job_pending(j);
        let need = self.gang_part(j, &pending)?;
        (need > 0).then(|| pending[..need].to_vec())
    }

    /// Reclaim: queues below fair share evict from queues above theirs.
    pub(crate) fn reclaim(&mut self) {
        let mut tried = 0;
        for q in self.leaves_by_deficit() {
            for j in self.queue_jobs[q].clone() {
                let Some(gang) = self.waiting_gang(j as usize) else {
                    continue;
                };
                let req = self.request_of(&gang);
                let floor = self.request_floor_of(&gang);
                let reclaimable = if floor[0] > 0 {
                    self.reclaimable_gpu(q, req)
                } else {
                    0
                };
                if !(self.within_fair(q, req) || self.any_model_guaranteed(q, req[0]))
                    || self.over_limit(q, floor).is_some()
                    || (floor[0] > 0 && reclaimable + self.st.index.free_gpu_milli() < floor[0])
                {
                    continue;
                }
                // Said only where another queue holds GPUs it could give back: with nothing
                // to reclaim, fair share is not why the pod waits, and the message would send
                // its reader to the wrong cause.
                let blocked =
                    (floor[0] == 0 || reclaimable > 0).then(|| Reason::NoReclaimVictims {
                        queue: self.ctx.tree.nodes[q].name.clone(),
                    });
                if self.victim_search_failed(&gang, Mode::Reclaim(q)) {
                    if let Some(blocked) = &blocked {
                        gang.iter().for_each(|&p| self.note_blocked(p, blocked));
                    }
                    continue;
                }
                tried += 1;
                if tried > self.ctx.cfg.max_victim_jobs {
                    return;
                }
                self.reclaim_gang = gang.clone();
                self.budget_blocked.clear();
                let ok = self.try_job(j as usize, Mode::Reclaim(q));
                self.reclaim_gang.clear();
                self.record_victim_search(&gang, Mode::Reclaim(q), ok);
                if !ok {
                    if let Some(blocked) = &blocked {
                        gang.iter().for_each(|&p| self.note_blocked(p, blocked));
                    }
                    self.note_budget_block(&gang);
                }
                self.budget_blocked.clear();
            }
        }
    }

    /// Notes a failed reclaim for `p`, unless a limit of its queue on a GPU model already
    /// explains it: that names why the idle GPUs of the model are not its to take, which the
    /// victim search cannot change.
    fn note_blocked(&mut self, p: u32, blocked: &Reason) {
        if !matches!(
            self.notes[p as usize],
            Some(Reason::QueueOverModelLimit { .. })
        ) {
            self.note(p, blocked.clone());
        }
    }

    /// Preempt: inside a queue, higher priority evicts lower-priority preemptible pods.
    pub(crate) fn preempt(&mut self) {
        let mut tried = 0;
        // GPU held by possible victims per queue and priority: an upper bound of what a
        // preemptor can free (only shrinks as the action evicts), used as a prefilter.
        let mut held: Vec<BTreeMap<i32, (u64, u64)>> = vec![BTreeMap::new(); self.ctx.tree.len()];
        for (i, v) in self.ctx.snap.pods.iter().enumerate() {
            if let Some(q) = self.ctx.pods[i].queue
                && self.st.placed[i].is_some()
                && self.st.orig_bound[i]
                && v.preemptible
                && !v.terminating
                && !v.owned_by_other_scheduler
            {
                let e = held[q].entry(v.priority).or_default();
                e.0 += self.used_by(i as u32)[0];
                e.1 += 1;
            }
        }
        for q in self.leaves_by_deficit() {
            for j in self.queue_jobs[q].clone() {
                let Some(gang) = self.waiting_gang(j as usize) else {
                    continue;
                };
                let prio = self.jobs[j as usize].priority;
                let (gpu, pods) = held[q]
                    .range(..prio)
                    .fold((0, 0), |a, (_, b)| (a.0 + b.0, a.1 + b.1));
                let req = self.request_floor_of(&gang);
                if pods == 0
                    || gpu + self.st.index.free_gpu_milli() < req[0]
                    || self.over_limit(q, req).is_some()
                {
                    continue;
                }
                let mode = Mode::Preempt(q, prio, gang[0]);
                if self.victim_search_failed(&gang, mode) {
                    continue;
                }
                tried += 1;
                if tried > self.ctx.cfg.max_victim_jobs {
                    return;
                }
                self.budget_blocked.clear();
                let ok = self.try_job(j as usize, mode);
                self.record_victim_search(&gang, mode, ok);
                if !ok {
                    self.note_budget_block(&gang);
                }
                self.budget_blocked.clear();
            }
        }
    }

    /// Key of a victim search for the failure cache: single-pod jobs only (a gang's outcome
    /// depends on its size and topology).
    fn search_key(&self, gang: &[u32], mode: Mode) -> Option<SearchKey> {
        let [p] = gang else { return None };
        let info = &self.ctx.pods[*p as usize];
        if info.dynamic || info.model_capped {
            return None;
        }
        let d = self.ctx.pods[*p as usize].demand;
        Some(match mode {
            Mode::Preempt(q, prio, _) => (d, 1, q, prio),
            Mode::Reclaim(q) => (d, 2, q, 0),
            Mode::Consolidate => (d, 3, 0, 0),
            Mode::Allocate => (d, 0, 0, 0),
        })
    }

    /// Whether the same search already failed since the last successful one (nothing that
    /// would make it succeed has changed).
    fn victim_search_failed(&self, gang: &[u32], mode: Mode) -> bool {
        self.search_key(gang, mode)
            .is_some_and(|k| self.failed_searches.contains(&k))
    }

    fn record_victim_search(&mut self, gang: &[u32], mode: Mode, ok: bool) {
        if ok {
            self.failed_searches.clear();
        } else if let Some(k) = self.search_key(gang, mode) {
            self.failed_searches.insert(k);
        }
    }

    /// GPU (milli) other leaf queues hold above their reclaim floor: an upper bound of what
    /// queue `q` can reclaim for a gang needing `need`.
    fn reclaimable_gpu(&self, q: usize, need: [u64; 3]) -> u64 {
        let mut g = self.guaranteed(&[q], need);
        g[0] |= self.any_model_guaranteed(q, need[0]);
        (0..self.ctx.tree.len())
            .filter(|&v| v != q && self.ctx.tree.nodes[v].is_leaf())
            .map(|v| (self.alloc_of(v)[0] - self.reclaim_floor(g, v)[0]).max(0.0) as u64)
            .sum()
    }

    /// Consolidate: move preemptible pods to make room for waiting GPU jobs when the cluster
    /// has enough free GPU in total, only if every moved pod fits elsewhere.
    pub(crate) fn consolidate(&mut self) {
        let mut tried = 0;
        for q in self.leaves_by_deficit() {
            for j in self.queue_jobs[q].clone() {
                let Some(gang) = self.waiting_gang(j as usize) else {
                    continue;
                };
                let req = self.request_floor_of(&gang);
                if req[0] == 0
                    || self.st.index.free_gpu_milli() < req[0]
                    || self.over_limit(q, req).is_some()
                    || self.victim_search_failed(&gang, Mode::Consolidate)
                {
                    continue;
                }
                tried += 1;
                if tried > self.ctx.cfg.max_victim_jobs {
                    return;
                }
                let ok = self.try_job(j as usize, Mode::Consolidate);
                self.record_victim_search(&gang, Mode::Consolidate, ok);
            }
        }
    }
}
