//! Allocate: jobs in fair-share order onto free capacity; gangs atomically, elastic pods one by
//! one; topology-constrained gangs inside one domain.

use std::collections::BTreeSet;

use crate::constraints::Prepared;
use crate::cycle::Reason;
use crate::placement::{GpuChoice, NodeScore};

use super::engine::{Engine, QueueKey};
use super::statement::Placed;

/// A queue in allocation order: its key, then its index.
#[derive(Clone, Copy, Debug)]
struct Ranked(QueueKey, usize);

impl PartialEq for Ranked {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Ranked {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

/// Where victims may come from while placing a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Free capacity only.
    Allocate,
    /// Other queues above their fair share (the reclaiming leaf queue).
    Reclaim(usize),
    /// Lower-priority pods of the same queue (queue, preemptor priority, preemptor pod).
    Preempt(usize, i32, u32),
    /// Movable pods that can be re-placed elsewhere.
    Consolidate,
}

impl Engine<'_> {
    /// The allocate action: repeatedly the next job of the queue first in [`QueueKey`] order
    /// (ties to the lower queue index).
    ///
    /// A queue's key reads only its own allocation, and placing a job of queue `q` changes
    /// only the allocations on `q`'s path to the root, so only those queues are re-ranked after
    /// each job; the rest keep their place in the ordered set.
    pub(crate) fn allocate(&mut self) {
        let nq = self.ctx.tree.len();
        let mut cursor = vec![0usize; nq];
        let mut keys: Vec<Option<QueueKey>> = vec![None; nq];
        let mut ready: BTreeSet<Ranked> = BTreeSet::new();
        for (q, key) in keys.iter_mut().enumerate() {
            if !self.queue_jobs[q].is_empty() {
                let k = self.queue_key(q);
                *key = Some(k);
                ready.insert(Ranked(k, q));
            }
        }
        let mut path: Vec<usize> = Vec::new();
        while let Some(Ranked(_, q)) = ready.pop_first() {
            keys[q] = None;
            let j = self.queue_jobs[q][cursor[q]];
            cursor[q] += 1;
            self.try_job(j as usize, Mode::Allocate);
            path.clear();
            path.extend(self.ctx.tree.path(q));
            for &a in &path {
                if let Some(old) = keys[a] {
                    ready.remove(&Ranked(old, a));
                    let k = self.queue_key(a);
                    keys[a] = Some(k);
                    ready.insert(Ranked(k, a));
                }
            }
            if cursor[q] < self.queue_jobs[q].len() {
                let k = self.queue_key(q);
                keys[q] = Some(k);
                ready.insert(Ranked(k, q));
            }
        }
    }

    /// Pending (not yet placed) pods of a job. A running pod evicted in this cycle is not
    /// among them: its eviction deletes it, so it cannot also be bound again, and a gang whose
    /// running members were taken this cycle waits for the next one instead of starting with
    /// its new members alone.
    pub(crate) fn job_pending(&self, j: usize) -> Vec<u32> {
        let mut out = Vec::new();
        self.job_pending_into(j, &mut out);
        out
    }

    /// [`Engine::job_pending`] appended to `out`.
    fn job_pending_into(&self, j: usize, out: &mut Vec<u32>) {
        out.extend(self.jobs[j].pods.iter().copied().filter(|&p| {
            self.st.placed[p as usize].is_none()
                && !(self.st.orig_bound[p as usize] && self.st.evicted[p as usize].is_some())
        }));
    }

    /// The missing gang members of job `j` that must go together, out of `pending`; `None`
    /// when fewer are pending than the gang misses (members evicted in this cycle), so no
    /// partial gang can start.
    pub(crate) fn gang_part(&self, j: usize, pending: &[u32]) -> Option<usize> {
        let need = self.gang_need(j);
        (need <= pending.len()).then_some(need)
    }

    /// How many of the job's pending pods must go together (the missing gang members).
    pub(crate) fn gang_need(&self, j: usize) -> usize {
        match self.jobs[j].group {
            None => 1,
            Some(g) => {
                let g = g as usize;
                self.ctx.groups[g]
                    .min_member
                    .saturating_sub(self.st.group_placed[g]) as usize
            }
        }
    }

    /// Sum of the least the `pods` can take (GPU-memory requests on the largest GPU): what
    /// limit pre-checks and capacity prefilters compare, so they never refuse a pod that could
    /// fit. Limits are checked exactly again once the pods are placed.
    pub(crate) fn request_floor_of(&self, pods: &[u32]) -> [u64; 3] {
        let mut r = self.request_of(pods);
        r[0] = pods
            .iter()
            .map(|&p| self.ctx.pods[p as usize].min_gpu_milli)
            .sum();
        r
    }

    /// Sum of what `pods` will take once placed (see `PodInfo::request`).
    pub(crate) fn request_of(&self, pods: &[u32]) -> [u64; 3] {
        let mut r = [0u64; 3];
        for &p in pods {
            let q = self.ctx.pods[p as usize].request;
            r[0] += q.gpu_milli;
            r[1] += q.cpu_milli;
            r[2] += q.memory_mib;
        }
        r
    }

    /// Tries to place job `j` in `mode`; returns whether its gang part went through.
    pub(crate) fn try_job(&mut self, j: usize, mode: Mode) -> bool {
        // One buffer for every job of the cycle (a nested call just starts a fresh one).
        let mut pending = std::mem::take(&mut self.pending_buf);
        pending.clear();
        self.job_pending_into(j, &mut pending);
        let ok = self.try_pending(j, mode, &pending);
        self.pending_buf = pending;
        ok
    }

    /// [`Engine::try_job`] with the job's pending pods already listed.
    fn try_pending(&mut self, j: usize, mode: Mode, pending: &[u32]) -> bool {
        if pending.is_empty() {
            return true;
        }
        let Some(need) = self.gang_part(j, pending) else {
            return false;
        };
        let q = self.jobs[j].queue;
        let mut gang_ok = true;
        self.model_limit_hit = None;
        if need > 0 {
            let gang = &pending[..need];
            if let Some(r) = self.over_limit(q, self.request_floor_of(gang)) {
                self.note_all(gang, r);
                return false;
            }
            let cp = self.st.checkpoint();
            gang_ok = self.place_gang(j, gang, mode);
            if gang_ok && let Some(r) = self.exceeds_limit(q) {
                self.st.rollback(&self.ctx, cp);
                self.note_all(gang, r);
                return false;
            }
            if !gang_ok && let Some((a, m)) = self.model_limit_hit.take() {
                let r = self.model_limit_reason(a, m);
                self.note_all(gang, r);
            }
        }
        if !gang_ok || mode != Mode::Allocate {
            return gang_ok;
        }
        // Elastic members: one by one, from free capacity only.
        for &p in &pending[need..] {
            if let Some(r) = self.over_limit(q, self.request_floor_of(&[p])) {
                self.note(p, r);
                continue;
            }
            let restrict = self.group_domain(j);
            let cp = self.st.checkpoint();
            self.model_limit_hit = None;
            if !self.place_one(p, restrict.as_deref(), None, mode) {
                let r = match self.model_limit_hit.take() {
                    Some((a, m)) => self.model_limit_reason(a, m),
                    None => Reason::NotReached,
                };
                self.note(p, r);
            } else if let Some(r) = self.exceeds_limit(q) {
                self.st.rollback(&self.ctx, cp);
                self.note(p, r);
            }
        }
        true
    }

    pub(crate) fn note(&mut self, p: u32, r: Reason) {
        self.notes[p as usize] = Some(r);
    }

    fn note_all(&mut self, pods: &[u32], r: Reason) {
        for &p in pods {
            self.note(p, r.clone());
        }
    }

    /// For a group with a required level that already has placed pods: the nodes of their domain.
    fn group_domain(&self, j: usize) -> Option<Vec<u32>> {
        let g = self.jobs[j].group? as usize;
        let level = self.ctx.groups[g].required_level?;
        let ld = &self.ctx.domains.levels[level];
        let placed = self.ctx.groups[g]
            .members
            .iter()
            .find_map(|&m| self.st.placed[m as usize].as_ref())?;
        let d = ld.of_node[placed.node as usize]?;
        Some(ld.members[d as usize].clone())
    }

    /// Places the gang part atomically.
    fn place_gang(&mut self, j: usize, gang: &[u32], mode: Mode) -> bool {
        let group = self.jobs[j].group.map(|g| g as usize);
        let uniform = gang
            .iter()
            .all(|&p| self.ctx.pods[p as usize].demand == self.ctx.pods[gang[0] as usize].demand)
            && gang.iter().all(|&p| {
                let info = &self.ctx.pods[p as usize];
                !info.dynamic && !info.model_capped
            });
        let topo = group.map(|g| {
            (
                self.ctx.groups[g].required_level,
                self.ctx.groups[g].preferred_level,
            )
        });
        let constrained = matches!(topo, Some((Some(_), _)) | Some((_, Some(_))));
        let first_demand = self.ctx.pods[gang[0] as usize].demand;
        if self.cache_on && uniform && !constrained && gang.len() > 1 {
            if let Some(&n) = self.failed_gangs.get(&first_demand)
                && gang.len() >= n
            {
                self.note_gang(j, gang, 0);
                return false;
            }
            if !self.capacity_could_fit(gang) {
                self.note_gang(j, gang, 0);
                return false;
            }
        }
        // Candidate restrictions, in order of preference.
        let mut attempts: Vec<Option<Vec<u32>>> = Vec::new();
        let mut required_only = false;
        if let Some(nodes) = self.group_domain(j) {
            attempts.push(Some(nodes));
            required_only = true;
        } else if let Some((req, pref)) = topo {
            if let Some(level) = req {
                for d in self.domains_for(level, gang, mode) {
                    attempts.push(Some(d));
                }
                required_only = true;
            } else if let Some(level) = pref {
                for l in (0..=level).rev() {
                    for d in self.domains_for(l, gang, mode) {
                        attempts.push(Some(d));
                    }
                }
            }
        }
        if !required_only {
            attempts.push(None);
        }
        let cp = self.st.checkpoint();
        self.depth += 1;
        let mut best_fitted = 0u32;
        for restrict in &attempts {
            let mut fitted = 0u32;
            let mut ok = true;
            for &p in gang {
                if self.place_one(p, restrict.as_deref(), None, mode) {
                    fitted += 1;
                } else {
                    ok = false;
                    break;
                }
            }
            if ok {
                self.depth -= 1;
                for &p in gang {
                    self.notes[p as usize] = None;
                }
                return true;
            }
            best_fitted = best_fitted.max(fitted);
            self.st.rollback(&self.ctx, cp);
        }
        self.depth -= 1;
        if self.depth == 0 && self.cache_on && uniform && !constrained && gang.len() > 1 {
            let e = self.failed_gangs.entry(first_demand).or_insert(usize::MAX);
            *e = (*e).min(gang.len());
        }
        if required_only
            && attempts.is_empty()
            && let (Some(g), Some((Some(level), _))) = (group, topo)
        {
            let r = Reason::NoTopologyDomain {
                group: self.ctx.groups[g].name.clone(),
                level: self.ctx.domains.levels[level].key.clone(),
            };
            self.note_all(gang, r);
            return false;
        }
        self.note_gang(j, gang, best_fitted);
        false
    }

    fn note_gang(&mut self, j: usize, gang: &[u32], fitted: u32) {
        match self.jobs[j].group {
            Some(g) if gang.len() > 1 => {
                let r = Reason::GangUnschedulable {
                    group: self.ctx.groups[g as usize].name.clone(),
                    fitted,
                    needed: gang.len() as u32,
                };
                self.note_all(gang, r);
            }
            _ => {}
        }
    }

    /// Cheap necessary condition: enough idle whole GPUs / free GPU share in the cluster.
    fn capacity_could_fit(&self, gang: &[u32]) -> bool {
        let d = self.ctx.pods[gang[0] as usize].demand;
        if d.gpu_count == 0 {
            return true;
        }
        let n = gang.len() as u64 * u64::from(d.gpu_count);
        if d.whole() {
            return self.st.index.idle_gpus() >= n;
        }
        let need: u64 = gang
            .iter()
            .map(|&p| self.ctx.pods[p as usize].min_gpu_milli)
            .sum();
        self.st.index.free_gpu_milli() >= need
    }

    /// Domains of `level` to try for a gang, tightest sufficient first (with victims: roomiest).
    fn domains_for(&self, level: usize, gang: &[u32], mode: Mode) -> Vec<Vec<u32>> {
        let ld = &self.ctx.domains.levels[level];
        let need = self.request_floor_of(gang);
        let mut scored: Vec<(u64, usize)> = Vec::new();
        for (d, &[gpu, cpu]) in self.st.domain_free[level].iter().enumerate() {
            if mode == Mode::Allocate && (gpu < need[0] || cpu < need[1]) {
                continue;
            }
            scored.push((gpu, d));
        }
        if mode == Mode::Allocate {
            scored.sort();
        } else {
            scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        }
        scored.truncate(self.ctx.cfg.max_domains_tried);
        scored
            .into_iter()
            .map(|(_, d)| ld.members[d].clone())
            .collect()
    }

    /// Places one pod: on free capacity, else (victim modes) by evicting.
    pub(crate) fn place_one(
        &mut self,
        p: u32,
        restrict: Option<&[u32]>,
        exclude: Option<u32>,
        mode: Mode,
    ) -> bool {
        if let Some((n, c)) = self.best_node(p, restrict, exclude) {
            self.st.place(
                &self.ctx,
                p,
                Placed {
                    node: n,
                    gpus: c.gpus,
                },
            );
            return true;
        }
        match mode {
            Mode::Allocate => false,
            _ => self.place_with_victims(p, restrict, mode),
        }
    }

    /// The best node for pod `p` on current free capacity.
    pub(crate) fn best_node(
        &mut self,
        p: u32,
        restrict: Option<&[u32]>,
        exclude: Option<u32>,
    ) -> Option<(u32, GpuChoice)> {
        let info = &self.ctx.pods[p as usize];
        let d = info.demand;
        let did = info.demand_id;
        let cacheable = self.cache_on
            && restrict.is_none()
            && exclude.is_none()
            && !info.dynamic
            && !info.model_capped;
        // The queue's per-model limits: milli-GPU a choice may add to each named model.
        let model_room = info
            .queue
            .filter(|_| info.model_capped)
            .map(|q| self.model_room(q));
        let mut limit_hit: Option<(usize, usize)> = None;
        if cacheable && self.failed.contains(&did) {
            return None;
        }
        let ctx = &self.ctx;
        let st = &self.st;
        // Counted once per placement attempt, as kube-scheduler's PreFilter does, but only
        // when some node fits the GPUs: counting is O(nodes + placed pods), and in a full
        // cluster most attempts (victim searches above all) fail on GPUs everywhere.
        let needs_prepared = info.dynamic || info.prefers;
        let mut prepared: Option<Prepared> = None;
        let k_max = ctx.cfg.nodes_to_score.max(1);
        let v_max = ctx.cfg.max_nodes_visited.max(1);
        let choices = &mut self.choices;
        let mut best: Option<((i64, NodeScore), u32, u32)> = None;
        let mut scored = 0usize;
        let mut visited = 0usize;
        let mut consider = |n: u32| -> bool {
            // Nodes the pod may never use do not count against the visit bound, so a narrow
            // affinity still finds its node in a large cluster.
            if Some(n) == exclude || !ctx.static_ok(p, n) {
                return true;
            }
            visited += 1;
            let node = &st.nodes[n as usize];
            let version = st.node_version[n as usize];
            let Ok(c) = choices.place(n, version, node, &d, did, &ctx.mix, &ctx.cfg.weights) else {
                return scored < k_max && visited < v_max;
            };
            if let Some(room) = &model_room
                && let Some(hit) = model_limited(ctx, room, n, &c.gpus)
            {
                limit_hit.get_or_insert(hit);
                return scored < k_max && visited < v_max;
            }
            let score = c.score;
            let pr = if needs_prepared {
                Some(&*prepared.get_or_insert_with(|| {
                    Prepared::new(ctx.snap, p, st, &ctx.anti_pods, &ctx.spread_cache)
                }))
            } else {
                None
            };
            if pr.is_none_or(|pr| !info.dynamic || pr.misfit(n, st).is_none()) {
                scored += 1;
                let r = st.index.rank(n);
                let key = (pr.map_or(0, |pr| pr.preference(n)), score);
                let better = match &best {
                    None => true,
                    Some((bk, br, _)) => key > *bk || (key == *bk && r < *br),
                };
                if better {
                    best = Some((key, r, n));
                }
            }
            scored < k_max && visited < v_max
        };
        match restrict {
            Some(nodes) => {
                for &n in nodes {
                    if !consider(n) {
                        break;
                    }
                }
            }
            // A pod that tolerates cordons may use nodes the capacity index leaves out.
            None if d.tolerates_cordon => {
                for &n in &self.rank_order {
                    if !consider(n) {
                        break;
                    }
                }
            }
            None => st.index.candidates(&d, info.min_share, consider),
        }
        // The winner's choice is still cached under its unchanged state: one more lookup
        // instead of a copy of every better choice met on the way.
        let found = best.and_then(|(_, _, n)| {
            let (node, version) = (&self.st.nodes[n as usize], self.st.node_version[n as usize]);
            self.choices
                .place(
                    n,
                    version,
                    node,
                    &d,
                    did,
                    &self.ctx.mix,
                    &self.ctx.cfg.weights,
                )
                .as_ref()
                .ok()
                .map(|c| (n, c.clone()))
        });
        if found.is_none() && cacheable && self.depth == 0 {
            self.failed.insert(did);
        }
        if found.is_none() && limit_hit.is_some() {
            self.model_limit_hit = limit_hit;
        }
        found
    }

    /// Per queue on `q`'s path that limits some GPU model: per model, the milli-GPU it may
    /// still take (`u64::MAX` where it sets no limit).
    fn model_room(&self, q: usize) -> Vec<(usize, Vec<u64>)> {
        self.ctx
            .tree
            .path(q)
            .filter_map(|a| {
                let node = &self.ctx.tree.nodes[a];
                let room: Vec<u64> = (0..self.ctx.tree.models.len())
                    .map(|m| match node.model_limit(m) {
                        // Limits are whole milli-GPU amounts (GPUs × 1000, three decimals).
                        Some(l) => (l.round() as u64).saturating_sub(self.st.model_alloc[a][m]),
                        None => u64::MAX,
                    })
                    .collect();
                room.iter().any(|&r| r != u64::MAX).then_some((a, room))
            })
            .collect()
    }
}

/// The queue and model whose room (see `Engine::model_room`) `gpus` on node `n` would pass.
fn model_limited(
    ctx: &super::context::Ctx,
    room: &[(usize, Vec<u64>)],
    n: u32,
    gpus: &[(u32, u32, u64)],
) -> Option<(usize, usize)> {
    // Milli-GPU per named model; a pod's GPUs are mostly of one model, so a short list.
    let mut take: Vec<(usize, u64)> = Vec::new();
    for &(g, c, _) in gpus {
        let m = ctx.gpu_model(n, g);
        if m == super::context::NO_MODEL {
            continue;
        }
        match take.iter_mut().find(|(x, _)| *x == m as usize) {
            Some((_, sum)) => *sum += u64::from(c),
            None => take.push((m as usize, u64::from(c))),
        }
    }
    room.iter()
        .find_map(|(a, r)| take.iter().find(|&&(m, c)| c > r[m]).map(|&(m, _)| (*a, m)))
}
