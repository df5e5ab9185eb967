//! The tentative statement: the mutable cluster state of a cycle plus an undo log.
//!
//! Every action changes the state only through [`State::place`] and [`State::evict`]. A
//! checkpoint is the log length; rolling back undoes the ops after it in reverse order; what is
//! never rolled back is committed. Capacity index, per-queue allocation and per-group running
//! counts are kept in step, so every action sees the effect of the ones before it.

use crate::cycle::EvictionReason;
use crate::model::{GpuShare, Snapshot};
use crate::placement::frag::ShapeMix;
use crate::placement::{
    CapacityIndex, GPU_MILLI, NodeCapacity, ScoreWeights, check_fit, demand_on_gpu, place_on_node,
};

use super::context::Ctx;

impl crate::constraints::Occupancy for State {
    fn pods_on(&self, n: u32) -> &[u32] {
        &self.node_pods[n as usize]
    }

    fn node_of(&self, p: u32) -> Option<u32> {
        self.placed[p as usize].as_ref().map(|pl| pl.node)
    }
}

/// Where a pod sits: node and `(gpu index, compute milli, memory MiB)` per GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Node index.
    pub node: u32,
    /// GPU slices.
    pub gpus: Vec<(u32, u32, u64)>,
}

#[derive(Clone, Debug)]
enum Op {
    Place(u32),
    Evict {
        pod: u32,
        was: Placed,
        prev_reason: Option<EvictionReason>,
    },
}

/// Mutable state of a cycle.
pub struct State {
    /// Free capacity per node.
    pub nodes: Vec<NodeCapacity>,
    /// Bucketed index over `nodes`.
    pub index: CapacityIndex,
    /// Pods currently on each node.
    pub node_pods: Vec<Vec<u32>>,
    /// Current placement per pod.
    pub placed: Vec<Option<Placed>>,
    /// Eviction reason per pod (set while evicted in this cycle).
    pub evicted: Vec<Option<EvictionReason>>,
    /// Whether the pod was bound when the cycle started.
    pub orig_bound: Vec<bool>,
    /// Allocated per queue (including descendants) in accounting units.
    pub queue_alloc: Vec<[u64; 3]>,
    /// Allocated per queue (including descendants) and GPU model of the queue tree's models,
    /// in milli-GPU; empty rows while no queue names a model.
    pub model_alloc: Vec<Vec<u64>>,
    /// Placed members per group.
    pub group_placed: Vec<u32>,
    /// Nodes that lost a pod to an eviction in this cycle (count).
    pub node_evictions: Vec<u32>,
    /// Pods bound at the start of the cycle evicted so far, per disruption budget.
    pub budget_evicted: Vec<u32>,
    /// Per node, how many times its free capacity changed: equal counts mean an unchanged
    /// `nodes[n]` (what the placement cache keys its per-node state on).
    pub node_version: Vec<u32>,
    /// Per topology level and domain: `[free GPU milli, free CPU milli]` summed over its
    /// schedulable nodes (healthy GPUs only), kept in step with `nodes` so that ranking a
    /// level's domains for a gang does not walk every node.
    pub domain_free: Vec<Vec<[u64; 2]>>,
    log: Vec<Op>,
}

/// What one node adds to its domains' `[free GPU milli, free CPU milli]`.
fn domain_share(node: &NodeCapacity) -> [u64; 2] {
    if !node.schedulable {
        return [0, 0];
    }
    let gpu = node
        .gpus
        .iter()
        .filter(|g| g.healthy)
        .map(|g| u64::from(g.compute_free))
        .sum();
    [gpu, node.cpu_free]
}

fn free_of(ctx: &Ctx, n: usize) -> NodeCapacity {
    let node = &ctx.snap.nodes[n];
    let model = node
        .gpus
        .first()
        .and_then(|g| ctx.models.id(&g.model))
        .unwrap_or(0);
    NodeCapacity::from_node(node, model)
}

impl State {
    /// Builds the state from the snapshot: capacity minus every bound pod.
    pub fn build(ctx: &Ctx) -> State {
        let snap: &Snapshot = ctx.snap;
        let nodes: Vec<NodeCapacity> = (0..snap.nodes.len()).map(|n| free_of(ctx, n)).collect();
        let mut rank: Vec<u32> = (0..nodes.len() as u32).collect();
        if ctx.cfg.shuffle_ties {
            use rand::SeedableRng;
            use rand::seq::SliceRandom;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(ctx.cfg.seed);
            let mut order: Vec<u32> = (0..nodes.len() as u32).collect();
            order.shuffle(&mut rng);
            for (pos, &n) in order.iter().enumerate() {
                rank[n as usize] = pos as u32;
            }
        } else {
            let mut order: Vec<u32> = (0..nodes.len() as u32).collect();
            order.sort_by(|&a, &b| {
                snap.nodes[a as usize]
                    .name
                    .cmp(&snap.nodes[b as usize].name)
            });
            for (pos, &n) in order.iter().enumerate() {
                rank[n as usize] = pos as u32;
            }
        }
        let index = CapacityIndex::new(&nodes, rank);
        let domain_free = ctx
            .domains
            .levels
            .iter()
            .map(|ld| {
                ld.members
                    .iter()
                    .map(|m| {
                        m.iter().fold([0u64; 2], |acc, &n| {
                            let f = domain_share(&nodes[n as usize]);
                            [acc[0] + f[0], acc[1] + f[1]]
                        })
                    })
                    .collect()
            })
            .collect();
        let np = snap.pods.len();
        let mut st = State {
            node_pods: vec![Vec::new(); nodes.len()],
            nodes,
            index,
            placed: vec![None; np],
            evicted: vec![None; np],
            orig_bound: vec![false; np],
            queue_alloc: vec![[0; 3]; ctx.tree.len()],
            model_alloc: vec![vec![0; ctx.tree.models.len()]; ctx.tree.len()],
            group_placed: vec![0; ctx.groups.len()],
            node_evictions: vec![0; snap.nodes.len()],
            budget_evicted: vec![0; ctx.budgets.len()],
            node_version: vec![0; snap.nodes.len()],
            domain_free,
            log: Vec::new(),
        };
        for (i, p) in snap.pods.iter().enumerate() {
            let Some(pl) = &p.placement else { continue };
            let Some(&n) = ctx.node_by_name.get(pl.node.as_str()) else {
                continue;
            };
            let gpus = st.existing_slices(ctx, i as u32, n);
            st.orig_bound[i] = true;
            st.apply_place(ctx, i as u32, Placed { node: n, gpus });
        }
        st.log.clear();
        st
    }

    /// The GPU slices a bound pod holds: from its assignment, or, without one, the GPUs the
    /// agent would hand out (lowest-index fitting ones; the cluster fences the node's idle
    /// GPUs while it cannot say which, so the guess never decides a placement).
    fn existing_slices(&self, ctx: &Ctx, p: u32, n: u32) -> Vec<(u32, u32, u64)> {
        let pod = &ctx.snap.pods[p as usize];
        let node = &ctx.snap.nodes[n as usize];
        let mut out = Vec::new();
        for s in pod.placement.iter().flat_map(|pl| pl.assignment.slices()) {
            if let Some(g) = node.gpus.iter().position(|g| g.uuid == s.uuid) {
                out.push((g as u32, s.compute_milli.min(GPU_MILLI), s.memory_mib));
            }
        }
        if !out.is_empty() || pod.gpu.count == 0 {
            return out;
        }
        // A fenced GPU takes nothing new, but the pod whose unreported GPUs fenced it may well
        // hold it: the pod is charged on fenced GPUs as readily as on open ones.
        let mut cap = NodeCapacity {
            schedulable: true,
            ..self.nodes[n as usize].clone()
        };
        for g in &mut cap.gpus {
            g.healthy |= g.fence.is_some();
        }
        let share = if pod.owned_by_other_scheduler {
            GpuShare::Whole
        } else {
            pod.gpu.per_gpu
        };
        let mut d = ctx.pods[p as usize].demand;
        d.share = share;
        d.cpu_milli = 0;
        d.memory_mib = 0;
        let quiet = ScoreWeights {
            use_fragmentation: false,
            ..ScoreWeights::default()
        };
        if let Ok(c) = place_on_node(&cap, &d, &ShapeMix::default(), &quiet) {
            return c.gpus;
        }
        // Reality over-commits the node (e.g. a GPU went away): charge the lowest GPUs anyway.
        (0..cap.gpus.len().min(pod.gpu.count as usize))
            .map(|g| {
                let (c, m) = demand_on_gpu(share, cap.gpus[g].mem_total);
                (g as u32, c, m)
            })
            .collect()
    }

    /// Current log position.
    pub fn checkpoint(&self) -> usize {
        self.log.len()
    }

    /// Undoes every op after `cp`.
    pub fn rollback(&mut self, ctx: &Ctx, cp: usize) {
        while self.log.len() > cp {
            let Some(op) = self.log.pop() else { break };
            match op {
                Op::Place(p) => {
                    self.apply_remove(ctx, p);
                }
                Op::Evict {
                    pod,
                    was,
                    prev_reason,
                } => {
                    self.apply_place(ctx, pod, was);
                    self.evicted[pod as usize] = prev_reason;
                    self.count_budgets(ctx, pod, false);
                }
            }
        }
    }

    /// Whether any op was logged (anything decided).
    pub fn has_ops(&self) -> bool {
        !self.log.is_empty()
    }

    /// Pods placed by committed ops, in order (a pod may appear more than once if moved).
    pub fn placed_in_order(&self) -> impl Iterator<Item = u32> + '_ {
        self.log.iter().filter_map(|op| match op {
            Op::Place(p) => Some(*p),
            Op::Evict { .. } => None,
        })
    }

    /// Pods evicted by committed ops, in order.
    pub fn evicted_in_order(&self) -> impl Iterator<Item = u32> + '_ {
        self.log.iter().filter_map(|op| match op {
            Op::Evict { pod, .. } => Some(*pod),
            Op::Place(_) => None,
        })
    }

    /// Places pod `p` on node `n` with the given slices.
    pub fn place(&mut self, ctx: &Ctx, p: u32, placed: Placed) {
        self.apply_place(ctx, p, placed);
        self.log.push(Op::Place(p));
    }

    /// Evicts pod `p` (which must be placed) for `reason`.
    pub fn evict(&mut self, ctx: &Ctx, p: u32, reason: EvictionReason) {
        let Some(was) = self.apply_remove(ctx, p) else {
            return;
        };
        let prev_reason = self.evicted[p as usize].replace(reason);
        self.node_evictions[was.node as usize] += 1;
        self.count_budgets(ctx, p, true);
        self.log.push(Op::Evict {
            pod: p,
            was,
            prev_reason,
        });
    }

    /// Counts an eviction of `p` (or its undoing) against its disruption budgets. Only a pod
    /// bound when the cycle started is evicted through the API; moving one placed in this
    /// cycle costs no disruption.
    fn count_budgets(&mut self, ctx: &Ctx, p: u32, evicted: bool) {
        if !self.orig_bound[p as usize] {
            return;
        }
        for &b in ctx.budgets.of(p) {
            let n = &mut self.budget_evicted[b as usize];
            *n = if evicted { *n + 1 } else { n.saturating_sub(1) };
        }
    }

    fn apply_place(&mut self, ctx: &Ctx, p: u32, placed: Placed) {
        let pod = &ctx.snap.pods[p as usize];
        let n = placed.node as usize;
        let before = domain_share(&self.nodes[n]);
        let node = &mut self.nodes[n];
        node.cpu_free = node.cpu_free.saturating_sub(pod.cpu_milli);
        node.mem_free = node.mem_free.saturating_sub(pod.memory_mib);
        let mut gpu_milli = 0u64;
        for &(g, c, m) in &placed.gpus {
            let gpu = &mut node.gpus[g as usize];
            gpu.compute_free = gpu.compute_free.saturating_sub(c);
            gpu.mem_free = gpu.mem_free.saturating_sub(m);
            gpu.holders += 1;
            gpu_milli += u64::from(c);
        }
        node.pods += 1;
        self.node_version[n] = self.node_version[n].wrapping_add(1);
        self.move_domain_share(ctx, n, before);
        self.index.update(placed.node, &self.nodes[n]);
        self.node_pods[n].push(p);
        if let Some(q) = ctx.pods[p as usize]
            .queue
            .filter(|_| !pod.owned_by_other_scheduler)
        {
            let add = [gpu_milli, pod.cpu_milli, pod.memory_mib];
            for a in ctx.tree.path(q) {
                for (slot, v) in self.queue_alloc[a].iter_mut().zip(add) {
                    *slot += v;
                }
            }
            if !ctx.tree.models.is_empty() {
                self.count_models(ctx, q, &placed, true);
            }
        }
        if let Some(g) = ctx.pods[p as usize].group {
            self.group_placed[g as usize] += 1;
        }
        self.placed[p as usize] = Some(placed);
    }

    fn apply_remove(&mut self, ctx: &Ctx, p: u32) -> Option<Placed> {
        let placed = self.placed[p as usize].take()?;
        let pod = &ctx.snap.pods[p as usize];
        let n = placed.node as usize;
        let total_cpu = ctx.snap.nodes[n].cpu_milli;
        let total_mem = ctx.snap.nodes[n].memory_mib;
        let before = domain_share(&self.nodes[n]);
        let node = &mut self.nodes[n];
        node.cpu_free = (node.cpu_free + pod.cpu_milli).min(total_cpu);
        node.mem_free = (node.mem_free + pod.memory_mib).min(total_mem);
        let mut gpu_milli = 0u64;
        for &(g, c, m) in &placed.gpus {
            let gpu = &mut node.gpus[g as usize];
            gpu.compute_free = (gpu.compute_free + c).min(GPU_MILLI);
            gpu.mem_free = (gpu.mem_free + m).min(gpu.mem_total);
            gpu.holders = gpu.holders.saturating_sub(1);
            gpu_milli += u64::from(c);
        }
        node.pods = node.pods.saturating_sub(1);
        self.node_version[n] = self.node_version[n].wrapping_add(1);
        self.move_domain_share(ctx, n, before);
        self.index.update(placed.node, &self.nodes[n]);
        if let Some(pos) = self.node_pods[n].iter().rposition(|&x| x == p) {
            self.node_pods[n].swap_remove(pos);
        }
        if let Some(q) = ctx.pods[p as usize]
            .queue
            .filter(|_| !pod.owned_by_other_scheduler)
        {
            let sub = [gpu_milli, pod.cpu_milli, pod.memory_mib];
            for a in ctx.tree.path(q) {
                for (slot, v) in self.queue_alloc[a].iter_mut().zip(sub) {
                    *slot = slot.saturating_sub(v);
                }
            }
            if !ctx.tree.models.is_empty() {
                self.count_models(ctx, q, &placed, false);
            }
        }
        if let Some(g) = ctx.pods[p as usize].group {
            self.group_placed[g as usize] = self.group_placed[g as usize].saturating_sub(1);
        }
        Some(placed)
    }

    /// Adds (or removes) what `placed` holds of each named GPU model to queue `q`'s path.
    fn count_models(&mut self, ctx: &Ctx, q: usize, placed: &Placed, add: bool) {
        for &(g, c, _) in &placed.gpus {
            let m = ctx.gpu_model(placed.node, g);
            if m == super::context::NO_MODEL {
                continue;
            }
            for a in ctx.tree.path(q) {
                let slot = &mut self.model_alloc[a][m as usize];
                *slot = if add {
                    *slot + u64::from(c)
                } else {
                    slot.saturating_sub(u64::from(c))
                };
            }
        }
    }

    /// Replaces node `n`'s old share `before` of its domains' free totals by its current one.
    fn move_domain_share(&mut self, ctx: &Ctx, n: usize, before: [u64; 2]) {
        let after = domain_share(&self.nodes[n]);
        if after == before {
            return;
        }
        for (ld, free) in ctx.domains.levels.iter().zip(&mut self.domain_free) {
            if let Some(d) = ld.of_node[n] {
                let f = &mut free[d as usize];
                // `before` is part of the sum, so the subtraction cannot underflow.
                *f = [f[0] - before[0] + after[0], f[1] - before[1] + after[1]];
            }
        }
    }

    /// Checks pod `p` on node `n` including its static constraints (the dynamic ones are
    /// judged where the pod is placed).
    pub fn fits(&self, ctx: &Ctx, p: u32, n: u32) -> bool {
        ctx.static_ok(p, n)
            && check_fit(&self.nodes[n as usize], &ctx.pods[p as usize].demand).is_ok()
    }
}
