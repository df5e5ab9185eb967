//! The engine of one cycle: context, statement, jobs and the order the actions run in.

use std::collections::BTreeMap;

use crate::cycle::{
    Binding, CycleConfig, Decisions, Eviction, EvictionReason, ModelShareStatus, QueueShareStatus,
    Reason,
};
use crate::fairshare::{
    DimShare, Share, dominant_share, fair_shares, fair_shares_weighted, model_fair_shares,
};
use crate::model::{Assignment, ContainerAssignment, GpuSlice, QueueUsage, Resource, Snapshot};
use rustc_hash::FxHashSet;

use crate::placement::{ChoiceCache, PodDemand};

use super::context::Ctx;
use super::jobs::{Job, build_jobs};
use super::statement::State;

/// Tolerance when comparing allocations with fair shares (accounting is in milli-units).
pub(crate) const SHARE_EPS: f64 = 1e-6;

/// Order of queues for allocation and victim search (smaller first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct QueueKey {
    /// Negated queue priority.
    pub priority: i32,
    /// At or above deserved quota in every resource.
    pub satisfied: bool,
    /// Dominant share of fair share.
    pub share: f64,
}

impl QueueKey {
    /// Total order: priority, starvation, dominant share.
    pub(crate) fn cmp(&self, o: &QueueKey) -> std::cmp::Ordering {
        self.priority
            .cmp(&o.priority)
            .then(self.satisfied.cmp(&o.satisfied))
            .then(self.share.total_cmp(&o.share))
    }
}

/// Each queue's usage history in one cycle (indexed like the queue tree).
pub struct UsageState {
    /// Decayed resource-seconds at the snapshot's time.
    pub used: Vec<[f64; 3]>,
    /// The factor on the queue's over-quota weight, per resource.
    pub factors: Vec<[f64; 3]>,
}

/// Runs the actions of one cycle over a snapshot.
pub struct Engine<'a> {
    /// Read-only context.
    pub ctx: Ctx<'a>,
    /// The cluster state as the actions so far changed it, with the undo log that lets a failed
    /// attempt roll back.
    pub st: State,
    /// Fair share per queue.
    pub shares: Vec<Share>,
    /// Fair share per GPU model of the queue tree's models and queue (`[model][queue]`).
    pub model_shares: Vec<Vec<DimShare>>,
    /// While usage history is on: per queue, its decayed usage at the snapshot's time and
    /// the factor on its over-quota weights.
    pub usage: Option<UsageState>,
    /// The queue and GPU model whose limit kept the current job off some node.
    pub(crate) model_limit_hit: Option<(usize, usize)>,
    /// Jobs.
    pub jobs: Vec<Job>,
    /// Job indices per queue, in queue order (priority desc, oldest first).
    pub queue_jobs: Vec<Vec<u32>>,
    /// Job-level note per pod (why its job did not go through).
    pub notes: Vec<Option<Reason>>,
    /// Demand ids (see `PodInfo::demand_id`) that found no node while capacity only shrank
    /// (allocate phase).
    pub(crate) failed: FxHashSet<u32>,
    /// Gangs (uniform demand, size) that failed the same way.
    pub(crate) failed_gangs: BTreeMap<PodDemand, usize>,
    /// Single-pod victim searches that failed since the last success.
    pub(crate) failed_searches: std::collections::BTreeSet<super::victims::SearchKey>,
    /// Open tentative attempts (failures inside them are not cached).
    pub(crate) depth: u32,
    /// Failure caches are valid (only the allocate action, where capacity only shrinks).
    pub(crate) cache_on: bool,
    /// Node indices in tie-break order.
    pub(crate) rank_order: Vec<u32>,
    /// The gang a reclaim is placing (its reclaim rule is decided for the whole gang).
    pub(crate) reclaim_gang: Vec<u32>,
    /// Disruption budgets that refused a victim set in the current victim search.
    pub(crate) budget_blocked: std::collections::BTreeSet<u32>,
    /// `place_on_node` results by node state and demand (this cycle's mix and weights).
    pub(crate) choices: ChoiceCache,
    /// Reused list of a job's pending pods (see `try_job`).
    pub(crate) pending_buf: Vec<u32>,
}

impl<'a> Engine<'a> {
    /// Prepares a cycle.
    pub fn new(snapshot: &'a Snapshot, config: &'a CycleConfig) -> Engine<'a> {
        let ctx = Ctx::build(snapshot, config);
        let st = State::build(&ctx);
        let mut notes = vec![None; snapshot.pods.len()];
        let jobs = build_jobs(&ctx, &st, &mut notes);
        // Leaf demand: allocated plus valid pending requests.
        let mut demand = vec![[0.0; 3]; ctx.tree.len()];
        for (q, d) in demand.iter_mut().enumerate() {
            if ctx.tree.nodes[q].is_leaf() {
                *d = st.queue_alloc[q].map(|x| x as f64);
            }
        }
        for j in &jobs {
            for &p in &j.pods {
                let r = ctx.pods[p as usize].request.as_f64();
                for k in 0..3 {
                    demand[j.queue][k] += r[k];
                }
            }
        }
        let usage = config.usage.is_on().then(|| usage_history(&ctx, config));
        let factors = usage.as_ref().map(|u| u.factors.as_slice());
        let shares = fair_shares_weighted(&ctx.tree, ctx.capacity.as_f64(), &demand, factors);
        let model_shares = if ctx.tree.models.is_empty() {
            Vec::new()
        } else {
            let dims = ctx.tree.models.len();
            let mut model_demand = vec![vec![0.0; dims]; ctx.tree.len()];
            for (q, d) in model_demand.iter_mut().enumerate() {
                if ctx.tree.nodes[q].is_leaf() {
                    for (slot, &a) in d.iter_mut().zip(&st.model_alloc[q]) {
                        *slot = a as f64;
                    }
                }
            }
            for j in &jobs {
                for &p in &j.pods {
                    let gpu = ctx.pods[p as usize].request.gpu_milli as f64;
                    for m in (0..dims).filter(|&m| ctx.may_use_model(p, m)) {
                        model_demand[j.queue][m] += gpu;
                    }
                }
            }
            model_fair_shares(&ctx.tree, &ctx.model_capacity, &model_demand, factors)
        };
        let mut queue_jobs = vec![Vec::new(); ctx.tree.len()];
        for (i, j) in jobs.iter().enumerate() {
            queue_jobs[j.queue].push(i as u32);
        }
        for list in &mut queue_jobs {
            list.sort_by(|&a, &b| {
                let (ja, jb) = (&jobs[a as usize], &jobs[b as usize]);
                jb.priority
                    .cmp(&ja.priority)
                    .then(ja.created.cmp(&jb.created))
                    .then(a.cmp(&b))
            });
        }
        let mut rank_order: Vec<u32> = (0..snapshot.nodes.len() as u32).collect();
        rank_order.sort_by_key(|&n| st.index.rank(n));
        Engine {
            ctx,
            st,
            shares,
            model_shares,
            usage,
            model_limit_hit: None,
            jobs,
            queue_jobs,
            notes,
            failed: FxHashSet::default(),
            failed_gangs: BTreeMap::new(),
            depth: 0,
            failed_searches: std::collections::BTreeSet::new(),
            cache_on: false,
            rank_order,
            reclaim_gang: Vec::new(),
            budget_blocked: std::collections::BTreeSet::new(),
            choices: ChoiceCache::new(snapshot.nodes.len()),
            pending_buf: Vec::new(),
        }
    }

    /// Runs every action in order.
    pub fn run(&mut self) {
        self.stale_gangs();
        self.cache_on = true;
        self.allocate();
        self.cache_on = false;
        if self.ctx.cfg.victims_enabled && self.any_victim_candidates() {
            self.consolidate();
            self.reclaim();
            self.preempt();
        }
    }

    /// Allocation of queue `q` as floats.
    pub(crate) fn alloc_of(&self, q: usize) -> [f64; 3] {
        self.st.queue_alloc[q].map(|x| x as f64)
    }

    /// Queue order key: higher priority first, then lower dominant share of fair share.
    /// Queues below their deserved quota in some resource (or named GPU model) come before the
    /// rest (starvation first), then DRF: the lowest dominant share of fair share, GPU models
    /// counted as resources of their own.
    pub(crate) fn queue_key(&self, q: usize) -> QueueKey {
        let alloc = self.alloc_of(q);
        let share = &self.shares[q];
        let mut starved = (0..3)
            .any(|k| share.deserved[k] > SHARE_EPS && alloc[k] + SHARE_EPS < share.deserved[k]);
        let mut ds = dominant_share(alloc, share.fair);
        for (m, shares) in self.model_shares.iter().enumerate() {
            let (a, s) = (self.st.model_alloc[q][m] as f64, &shares[q]);
            starved |= s.deserved > SHARE_EPS && a + SHARE_EPS < s.deserved;
            ds = ds.max(dominant_share([a, 0.0, 0.0], [s.fair, 0.0, 0.0]));
        }
        QueueKey {
            priority: -self.ctx.tree.nodes[q].priority,
            satisfied: !starved,
            share: ds,
        }
    }

    /// The first queue on `q`'s path whose limit `extra` would break, with the resource.
    pub(crate) fn over_limit(&self, q: usize, extra: [u64; 3]) -> Option<Reason> {
        self.limit_check(q, extra, false)
    }

    /// The first queue on `q`'s path that is over a limit right now (placements of memory
    /// requests can take more compute share than estimated, so actions recheck after placing).
    pub(crate) fn exceeds_limit(&self, q: usize) -> Option<Reason> {
        self.limit_check(q, [0; 3], true)
    }

    fn limit_check(&self, q: usize, extra: [u64; 3], check_current: bool) -> Option<Reason> {
        for a in self.ctx.tree.path(q) {
            let node = &self.ctx.tree.nodes[a];
            if check_current && let Some(m) = self.over_model_limit(a, &[]) {
                return Some(self.model_limit_reason(a, m));
            }
            for r in Resource::ALL {
                let k = r.index();
                if extra[k] == 0 && !check_current {
                    continue;
                }
                if let Some(l) = node.limit(r)
                    && (self.st.queue_alloc[a][k] + extra[k]) as f64 > l + SHARE_EPS
                {
                    let shown = match r {
                        Resource::Gpu => format!("{}", l / 1000.0),
                        _ => format!("{l}"),
                    };
                    return Some(Reason::QueueOverLimit {
                        queue: node.name.clone(),
                        resource: r,
                        limit: shown,
                    });
                }
            }
        }
        None
    }

    /// The first GPU model whose limit queue `a` passes holding what it holds plus `extra`
    /// (milli-GPU per model of the tree's models; shorter slices count nothing more).
    pub(crate) fn over_model_limit(&self, a: usize, extra: &[u64]) -> Option<usize> {
        let node = &self.ctx.tree.nodes[a];
        (0..self.ctx.tree.models.len()).find(|&m| {
            node.model_limit(m).is_some_and(|l| {
                let add = extra.get(m).copied().unwrap_or(0);
                (self.st.model_alloc[a][m] + add) as f64 > l + SHARE_EPS
            })
        })
    }

    /// The pending reason for queue `a` at its limit of GPU model `m`.
    pub(crate) fn model_limit_reason(&self, a: usize, m: usize) -> Reason {
        let node = &self.ctx.tree.nodes[a];
        Reason::QueueOverModelLimit {
            queue: node.name.clone(),
            model: self.ctx.tree.models[m].clone(),
            limit: format!("{}", node.model_limit(m).unwrap_or(0.0) / 1000.0),
        }
    }

    /// Whether any bound pod could ever be a victim (skip victim actions otherwise).
    fn any_victim_candidates(&self) -> bool {
        self.ctx.snap.pods.iter().enumerate().any(|(i, p)| {
            self.st.orig_bound[i] && p.preemptible && !p.terminating && !p.owned_by_other_scheduler
        })
    }

    /// Turns the committed statement into decisions.
    pub fn decisions(&self) -> Decisions {
        let snap = self.ctx.snap;
        let mut out = Decisions::default();
        let mut seen = vec![false; snap.pods.len()];
        for p in self.st.placed_in_order() {
            let i = p as usize;
            if self.st.orig_bound[i] || seen[i] {
                continue;
            }
            let Some(pl) = &self.st.placed[i] else {
                continue;
            };
            seen[i] = true;
            let node = &snap.nodes[pl.node as usize];
            let gpus = pl
                .gpus
                .iter()
                .map(|&(g, c, m)| GpuSlice {
                    uuid: node.gpus[g as usize].uuid.clone(),
                    memory_mib: m,
                    compute_milli: c,
                })
                .collect();
            let assignment = Assignment {
                containers: vec![ContainerAssignment {
                    container: snap.pods[i].gpu_container.clone(),
                    gpus,
                }],
            };
            out.bindings.push(Binding {
                pod: snap.pods[i].uid.clone(),
                node: node.name.clone(),
                assignment,
                after_evictions: self.st.node_evictions[pl.node as usize] > 0,
            });
        }
        let mut evicted_seen = vec![false; snap.pods.len()];
        for p in self.st.evicted_in_order() {
            let i = p as usize;
            if evicted_seen[i] || !self.st.orig_bound[i] {
                continue;
            }
            evicted_seen[i] = true;
            let Some(reason) = &self.st.evicted[i] else {
                continue;
            };
            let reason = match reason {
                EvictionReason::Consolidate { .. } => match &self.st.placed[i] {
                    Some(pl) => EvictionReason::Consolidate {
                        moved_to: snap.nodes[pl.node as usize].name.clone(),
                    },
                    None => continue,
                },
                r => {
                    if self.st.placed[i].is_some() {
                        continue; // put back by a later op: not evicted after all
                    }
                    r.clone()
                }
            };
            out.evictions.push(Eviction {
                pod: snap.pods[i].uid.clone(),
                reason,
            });
        }
        out.pending = self.explain();
        let mut shares: Vec<QueueShareStatus> = self
            .ctx
            .tree
            .nodes
            .iter()
            .enumerate()
            .map(|(q, n)| QueueShareStatus {
                queue: n.name.clone(),
                deserved: self.shares[q].deserved,
                fair_share: self.shares[q].fair,
                allocated: self.alloc_of(q),
                requested: self.shares[q].demand,
                models: self
                    .model_shares
                    .iter()
                    .enumerate()
                    .map(|(m, s)| ModelShareStatus {
                        model: self.ctx.tree.models[m].clone(),
                        deserved: s[q].deserved,
                        fair_share: s[q].fair,
                        allocated: self.st.model_alloc[q][m] as f64,
                        requested: s[q].demand,
                    })
                    .collect(),
                usage_factor: self.usage.as_ref().map(|u| u.factors[q]),
            })
            .collect();
        shares.sort_by(|a, b| a.queue.cmp(&b.queue));
        out.fair_shares = shares;
        if let Some(UsageState { used, .. }) = &self.usage {
            let holding = held_by_queues(&self.ctx, |i| {
                let evicted = self.st.orig_bound[i] && self.st.placed[i].is_none();
                if snap.pods[i].placement.is_some() {
                    (!evicted).then_some(None)
                } else {
                    self.st.placed[i].as_ref().map(Some)
                }
            });
            let mut usage: Vec<QueueUsage> = self
                .ctx
                .tree
                .nodes
                .iter()
                .enumerate()
                .map(|(q, n)| QueueUsage {
                    queue: n.name.clone(),
                    at: snap.now,
                    used: used[q],
                    holding: Some(holding[q]),
                })
                .collect();
            usage.sort_by(|a, b| a.queue.cmp(&b.queue));
            out.usage = usage;
        }
        let mut below: Vec<String> = self
            .ctx
            .groups
            .iter()
            .enumerate()
            .filter(|(g, info)| {
                let n = self.st.group_placed[*g];
                n > 0 && n < info.min_member
            })
            .map(|(_, info)| info.name.clone())
            .collect();
        below.sort();
        out.gangs_below_min = below;
        out
    }
}

/// Each queue's usage advanced to the snapshot's time (from its record in the snapshot, the
/// last one of its name winning), and the factors on its over-quota weights, read against its
/// nominal share: its fair share were every leaf to ask for the whole cluster.
fn usage_history(ctx: &Ctx, config: &CycleConfig) -> UsageState {
    // What the queues hold as their bound pods say, not as the nodes' known GPUs do: right
    // after a failover the agents may not have reported yet, and the history must not count
    // their queues idle meanwhile.
    let holding = held_by_queues(ctx, |i| {
        ctx.snap.pods[i].placement.is_some().then_some(None)
    });
    let records: BTreeMap<&str, &QueueUsage> = ctx
        .snap
        .usage
        .iter()
        .map(|u| (u.queue.as_str(), u))
        .collect();
    let used: Vec<[f64; 3]> = ctx
        .tree
        .nodes
        .iter()
        .enumerate()
        .map(|(q, n)| {
            config.usage.advance(
                records.get(n.name.as_str()).copied(),
                holding[q],
                ctx.snap.now,
            )
        })
        .collect();
    let capacity = ctx.capacity.as_f64();
    let nominal = fair_shares(&ctx.tree, capacity, &vec![capacity; ctx.tree.len()]);
    let factors = config.usage.weight_factors(&used, &nominal);
    UsageState { used, factors }
}

/// What each queue (with its descendants) holds, in accounting units, of the pods `which`
/// picks: `Some(None)` for a bound pod, counted by its assignment (its request where it has
/// none), `Some(Some(placed))` for one this cycle placed, counted by its slices.
fn held_by_queues<'p>(
    ctx: &Ctx,
    which: impl Fn(usize) -> Option<Option<&'p super::statement::Placed>>,
) -> Vec<[f64; 3]> {
    let mut out = vec![[0.0; 3]; ctx.tree.len()];
    for (i, pod) in ctx.snap.pods.iter().enumerate() {
        let Some(q) = ctx.pods[i].queue.filter(|_| !pod.owned_by_other_scheduler) else {
            continue;
        };
        let Some(placed) = which(i) else { continue };
        let gpu: u64 = match placed {
            Some(pl) => pl.gpus.iter().map(|g| u64::from(g.1)).sum(),
            None => {
                let slices: u64 = pod
                    .placement
                    .iter()
                    .flat_map(|pl| pl.assignment.slices())
                    .map(|s| u64::from(s.compute_milli))
                    .sum();
                if slices > 0 {
                    slices
                } else {
                    ctx.pods[i].request.gpu_milli
                }
            }
        };
        let add = [gpu as f64, pod.cpu_milli as f64, pod.memory_mib as f64];
        for a in ctx.tree.path(q) {
            for (slot, v) in out[a].iter_mut().zip(add) {
                *slot += v;
            }
        }
    }
    out
}
