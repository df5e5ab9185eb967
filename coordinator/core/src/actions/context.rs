//! The read-only part of a cycle: indexed snapshot, validated pods and groups, fair shares.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use tessera_contract::keys;

use crate::constraints;
use crate::cycle::{CycleConfig, NodeReason, Reason};
use crate::fairshare::{QueueTree, Share};
use crate::model::{GpuShare, Isolation, Pod, Resources, Snapshot};
use crate::placement::frag::ShapeMix;
use crate::placement::{Domains, GPU_MILLI_U64, ModelIds, PodDemand, demand_on_gpu, shape_mix_of};

/// A pod as the actions see it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    /// Placement demand.
    pub demand: PodDemand,
    /// Leaf queue index (None when unknown / not a leaf; then `invalid` is set).
    pub queue: Option<usize>,
    /// Group index.
    pub group: Option<u32>,
    /// What the pod will take once placed, for queue accounting while it is pending (demand,
    /// fair share, reclaim). A GPU-memory request is the compute share it takes on the GPU it
    /// lands on, which depends on that GPU's memory: it is counted on the smallest GPU of the
    /// cluster that can hold it (see [`Ctx::landing_gpu_mib`]), so it is never under-counted.
    pub request: Resources,
    /// The least GPU (milli) the pod can take anywhere: a memory request counted on the largest
    /// GPU. Used where a lower bound is needed (limit pre-checks, capacity prefilters), so no
    /// pod is refused for an amount it might not take.
    pub min_gpu_milli: u64,
    /// Smallest free compute share (milli) a GPU must have for this pod.
    pub min_share: u32,
    /// Why the pod cannot be scheduled at all.
    pub invalid: Option<Reason>,
    /// Its fit depends on what else is placed (inter-pod rules, spread, ports, extended
    /// resources, or another pod's anti-affinity that matches it): judged through
    /// `constraints::Prepared` and kept out of failure caches.
    pub dynamic: bool,
    /// It ranks nodes by preference (preferred affinities, soft spread, soft taints).
    pub prefers: bool,
    /// Dense id of `demand`: pods with equal demands share it (the placement cache's key).
    pub demand_id: u32,
    /// A queue on its path has a per-model GPU limit: where it may go depends on what its
    /// queue holds, so its failures are kept out of the caches keyed by demand.
    pub model_capped: bool,
}

/// [`Ctx::gpu_model`] of a GPU whose model no queue names.
pub(crate) const NO_MODEL: u32 = u32::MAX;

/// A pod group (explicit or implied by pods' `tessera.dev/pod-group` + `min-member`).
#[derive(Clone, Debug)]
pub struct GroupInfo {
    /// Namespace/name.
    pub name: String,
    /// Gang size (at least 1).
    pub min_member: u32,
    /// Elastic bound.
    pub max_member: Option<u32>,
    /// Required topology level index.
    pub required_level: Option<usize>,
    /// Preferred topology level index.
    pub preferred_level: Option<usize>,
    /// Priority.
    pub priority: i32,
    /// Since when below minMember.
    pub below_min_since: Option<u64>,
    /// Member pods, in snapshot order.
    pub members: Vec<u32>,
    /// Why the whole group cannot be scheduled.
    pub invalid: Option<Reason>,
}

/// Immutable per-cycle context.
pub struct Ctx<'a> {
    /// The cluster as the cycle was given it; never changed during the cycle.
    pub snap: &'a Snapshot,
    /// The cycle's knobs (search bounds, score weights, mix settings) shared by every action.
    pub cfg: &'a CycleConfig,
    /// Queue tree.
    pub tree: QueueTree,
    /// GPU model ids.
    pub models: ModelIds,
    /// Recent mix of shapes.
    pub mix: ShapeMix,
    /// Topology domains.
    pub domains: Domains,
    /// Node index by name.
    pub node_by_name: BTreeMap<&'a str, u32>,
    /// Per pod.
    pub pods: Vec<PodInfo>,
    /// Per group.
    pub groups: Vec<GroupInfo>,
    /// Largest GPU memory in the cluster (MiB).
    pub max_gpu_mib: u64,
    /// Distinct `(memory MiB, node GPU model id, MIG mode)` of healthy GPUs on schedulable
    /// nodes, smallest memory first: where a GPU-memory request can land.
    pub gpu_kinds: Vec<(u64, u32, bool)>,
    /// Most GPUs on one node.
    pub max_node_gpus: u32,
    /// Cluster capacity (healthy GPUs, schedulable nodes) in accounting units.
    pub capacity: Resources,
    /// Pods with required anti-affinity terms (they restrict where every matching pod goes).
    pub anti_pods: Vec<u32>,
    /// Spread facts that placements do not change, filled on first use.
    pub spread_cache: crate::constraints::spread::SpreadCache,
    /// Some node has a PreferNoSchedule taint (then every pod ranks nodes by it).
    pub soft_taints: bool,
    /// PodDisruptionBudgets covering the pods.
    pub budgets: super::Budgets,
    /// Per node and GPU: the index in `tree.models` of the GPU's model, or [`NO_MODEL`];
    /// empty while no queue names a model.
    pub gpu_model: Vec<Vec<u32>>,
    /// Per model of `tree.models`: the ids (of `models`) of the GPU model names whose key it
    /// is, for matching pods' accepted models.
    pub model_names: Vec<crate::placement::frag::ModelSet>,
    /// Per model of `tree.models`: milli-GPU of its healthy GPUs on schedulable nodes.
    pub model_capacity: Vec<f64>,
}

/// What a pod's static constraints are made of; pods with equal keys pass the same nodes.
type StaticKey<'a> = (
    &'a BTreeMap<String, String>,
    &'a [crate::model::Toleration],
    &'a Option<crate::model::NodeSelector>,
    &'a [crate::model::NodeSelector],
);

impl<'a> Ctx<'a> {
    /// Indexes and validates the snapshot.
    pub fn build(snap: &'a Snapshot, cfg: &'a CycleConfig) -> Ctx<'a> {
        let tree = QueueTree::build(&snap.queues);
        let models = ModelIds::of(snap);
        let max_gpu_mib = snap
            .nodes
            .iter()
            .flat_map(|n| n.gpus.iter().map(|g| g.memory_mib))
            .max()
            .unwrap_or(0);
        let max_node_gpus = snap
            .nodes
            .iter()
            .map(|n| n.gpus.iter().filter(|g| g.healthy).count() as u32)
            .max()
            .unwrap_or(0);
        let mut gpu_kinds: Vec<(u64, u32, bool)> = snap
            .nodes
            .iter()
            .filter(|n| n.schedulable)
            .flat_map(|n| {
                // Placement matches a pod's models against the node's first GPU model.
                let model = n
                    .gpus
                    .first()
                    .and_then(|g| models.id(&g.model))
                    .unwrap_or(0);
                n.gpus
                    .iter()
                    .filter(|g| g.healthy)
                    .map(move |g| (g.memory_mib, model, g.mig.is_some()))
            })
            .collect();
        gpu_kinds.sort_unstable();
        gpu_kinds.dedup();
        let mut capacity = Resources::default();
        for n in snap.nodes.iter().filter(|n| n.schedulable) {
            capacity.cpu_milli += n.cpu_milli;
            capacity.memory_mib += n.memory_mib;
            capacity.gpu_milli +=
                n.gpus.iter().filter(|g| g.healthy).count() as u64 * GPU_MILLI_U64;
        }
        let typical = if max_gpu_mib == 0 { 1 } else { max_gpu_mib };
        let mix = match &cfg.shape_mix {
            Some(m) => m.clone(),
            None => shape_mix_of(snap, &models, typical, cfg.mix_coverage, cfg.mix_max_shapes),
        };
        let levels = snap
            .topology
            .as_ref()
            .map(|t| t.levels.clone())
            .unwrap_or_default();
        let domains = Domains::build(&levels, &snap.nodes);
        let node_by_name = snap
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i as u32))
            .collect();
        let mut ctx = Ctx {
            snap,
            cfg,
            tree,
            models,
            mix,
            domains,
            node_by_name,
            pods: Vec::with_capacity(snap.pods.len()),
            groups: Vec::new(),
            max_gpu_mib,
            gpu_kinds,
            max_node_gpus,
            capacity,
            anti_pods: (0..snap.pods.len() as u32)
                .filter(|&p| {
                    !snap.pods[p as usize]
                        .constraints
                        .pod_anti_affinity
                        .is_empty()
                })
                .collect(),
            spread_cache: Default::default(),
            soft_taints: snap.nodes.iter().any(|n| {
                n.constraints
                    .taints
                    .iter()
                    .any(|t| t.effect == crate::model::TaintEffect::PreferNoSchedule)
            }),
            budgets: super::Budgets::build(snap),
            gpu_model: Vec::new(),
            model_names: Vec::new(),
            model_capacity: Vec::new(),
        };
        ctx.index_models();
        let mut classes: BTreeMap<StaticKey, u32> = BTreeMap::new();
        let any_static = snap
            .nodes
            .iter()
            .any(|n| !n.schedulable || !n.constraints.taints.is_empty());
        ctx.pods = snap
            .pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let c = &p.constraints;
                let key: StaticKey = (
                    &p.node_selector,
                    // Tolerations matter only where some node is tainted or cordoned.
                    if any_static { &c.tolerations } else { &[] },
                    &c.node_affinity,
                    &c.volume_node_affinity,
                );
                let empty =
                    key.0.is_empty() && key.1.is_empty() && key.2.is_none() && key.3.is_empty();
                let next = classes.len() as u32 + 1;
                let class = if empty {
                    0
                } else {
                    *classes.entry(key).or_insert(next)
                };
                ctx.pod_info(i as u32, p, class)
            })
            .collect();
        let mut demand_ids: FxHashMap<PodDemand, u32> = FxHashMap::default();
        for info in &mut ctx.pods {
            let next = demand_ids.len() as u32;
            info.demand_id = *demand_ids.entry(info.demand).or_insert(next);
        }
        ctx.build_groups();
        ctx
    }

    fn pod_info(&self, i: u32, p: &Pod, class: u32) -> PodInfo {
        let count = p.gpu.count;
        let share = p.gpu.per_gpu;
        let demand = PodDemand {
            cpu_milli: p.cpu_milli,
            memory_mib: p.memory_mib,
            gpu_count: count,
            share,
            models: self.models.set_of(&p.gpu_models),
            mig: p.isolation == Isolation::Mig,
            tolerates_cordon: constraints::taints::tolerates_cordon(&p.constraints.tolerations),
            class,
        };
        let exposed = self.anti_pods.iter().any(|&q| {
            q != i && {
                let own = constraints::affinity::namespace_labels(self.snap, &p.namespace);
                self.snap.pods[q as usize]
                    .constraints
                    .pod_anti_affinity
                    .iter()
                    .any(|t| constraints::affinity::term_matches(t, p, own))
            }
        });
        let (per_gpu, landing) = if count == 0 {
            (0, 0)
        } else {
            let landing = match share {
                GpuShare::MemoryMib(mib) => self.landing_gpu_mib(&demand, mib),
                _ => self.max_gpu_mib,
            };
            (
                demand_on_gpu(share, self.max_gpu_mib.max(1)).0,
                demand_on_gpu(share, landing.max(1)).0,
            )
        };
        let request = Resources::new(
            u64::from(count) * u64::from(landing),
            p.cpu_milli,
            p.memory_mib,
        );
        let queue = self.tree.index(&p.queue);
        let invalid = self.validate(p, queue);
        PodInfo {
            demand,
            queue,
            group: None,
            request,
            min_gpu_milli: u64::from(count) * u64::from(per_gpu),
            min_share: per_gpu,
            invalid,
            dynamic: exposed || constraints::is_dynamic(p),
            prefers: self.soft_taints || constraints::has_preferences(p),
            demand_id: 0,
            model_capped: queue.is_some_and(|q| {
                self.tree.path(q).any(|a| {
                    (0..self.tree.models.len()).any(|m| self.tree.nodes[a].model_limit(m).is_some())
                })
            }),
        }
    }

    /// Fills the per-model indexes (only when some queue names a GPU model).
    fn index_models(&mut self) {
        let dims = self.tree.models.len();
        if dims == 0 {
            return;
        }
        let mut dim_of: FxHashMap<&str, u32> = FxHashMap::default();
        let mut names = vec![crate::placement::frag::ModelSet(0); dims];
        let mut capacity = vec![0.0; dims];
        let tree = &self.tree;
        let models = &self.models;
        self.gpu_model = self
            .snap
            .nodes
            .iter()
            .map(|n| {
                n.gpus
                    .iter()
                    .map(|g| {
                        let dim = *dim_of.entry(g.model.as_str()).or_insert_with(|| {
                            let key = tessera_contract::gpu_model::key_of(&g.model);
                            let dim = tree.model(&key).map_or(NO_MODEL, |d| d as u32);
                            if let (Some(set), Some(id)) =
                                (names.get_mut(dim as usize), models.id(&g.model))
                            {
                                set.0 |= crate::placement::frag::ModelSet::single(id).0;
                            }
                            dim
                        });
                        if dim != NO_MODEL && n.schedulable && g.healthy {
                            capacity[dim as usize] += GPU_MILLI_U64 as f64;
                        }
                        dim
                    })
                    .collect()
            })
            .collect();
        self.model_names = names;
        self.model_capacity = capacity;
    }

    /// The model index (of `tree.models`) of GPU `g` of node `n`, or [`NO_MODEL`].
    pub fn gpu_model(&self, n: u32, g: u32) -> u32 {
        self.gpu_model
            .get(n as usize)
            .and_then(|gs| gs.get(g as usize))
            .copied()
            .unwrap_or(NO_MODEL)
    }

    /// Whether pod `p` (asking for GPUs) may land on GPUs of model `m`.
    pub fn may_use_model(&self, p: u32, m: usize) -> bool {
        let d = &self.pods[p as usize].demand;
        d.gpu_count > 0
            && self
                .model_names
                .get(m)
                .is_some_and(|s| d.models.0 & s.0 != 0)
    }

    /// Memory (MiB) of the GPU a request of `mib` per GPU lands on: the smallest healthy GPU of
    /// the pod's accepted models and MIG mode that can hold it. Tight placement puts a memory
    /// request there (a larger GPU is kept for larger requests), and it is the most the request
    /// can take, so a queue's demand is never under-counted. Without such a GPU, the largest
    /// GPU (the pod is then explained as not fitting anyway).
    pub fn landing_gpu_mib(&self, d: &PodDemand, mib: u64) -> u64 {
        self.gpu_kinds
            .iter()
            .find(|&&(mem, model, mig)| mem >= mib && mig == d.mig && d.models.contains(model))
            .map_or(self.max_gpu_mib, |k| k.0)
    }

    fn validate(&self, p: &Pod, queue: Option<usize>) -> Option<Reason> {
        if !p.constraints.scheduling_gates.is_empty() {
            return Some(Reason::SchedulingGated {
                gates: p.constraints.scheduling_gates.clone(),
            });
        }
        if p.terminating {
            return Some(Reason::InvalidInput {
                field: "metadata.deletionTimestamp".into(),
                message: "the pod is being deleted; it is not placed".into(),
            });
        }
        if let Some(e) = p.input_errors.first() {
            return Some(Reason::InvalidInput {
                field: e.field.clone(),
                message: e.message.clone(),
            });
        }
        if p.gpu.count > 0 {
            match p.gpu.per_gpu {
                GpuShare::Fraction(m) if m == 0 || m > 1000 => {
                    return Some(Reason::InvalidInput {
                        field: keys::GPU_FRACTION.into(),
                        message: format!(
                            "{} is outside (0, 1]; give a decimal such as 0.5",
                            m as f64 / 1000.0
                        ),
                    });
                }
                GpuShare::MemoryMib(0) => {
                    return Some(Reason::InvalidInput {
                        field: keys::GPU_MEMORY.into(),
                        message: "0 is not a memory amount; give a quantity such as 10Gi or 4096Mi"
                            .into(),
                    });
                }
                GpuShare::MemoryMib(m) if m > self.max_gpu_mib => {
                    return Some(Reason::InvalidInput {
                        field: keys::GPU_MEMORY.into(),
                        message: format!(
                            "{m}Mi is larger than any GPU in the cluster (largest {}Mi)",
                            self.max_gpu_mib
                        ),
                    });
                }
                _ => {}
            }
            // More GPUs than any node has healthy: nothing can place the pod now, so it takes
            // no part in the cycle. It is no input error (a larger node may join, or a GPU
            // heal): its message counts the nodes as for any pod (`explain`).
            if p.gpu.count > self.max_node_gpus {
                return Some(Reason::Node(NodeReason::TooFewGpus));
            }
        }
        match queue {
            None => Some(Reason::UnknownQueue {
                queue: p.queue.clone(),
            }),
            Some(q) if !self.tree.nodes[q].is_leaf() => Some(Reason::NotLeafQueue {
                queue: p.queue.clone(),
            }),
            Some(_) => None,
        }
    }

    fn build_groups(&mut self) {
        let snap = self.snap;
        let mut by_key: FxHashMap<(&str, &str), u32> = FxHashMap::default();
        for g in &snap.groups {
            let key = (g.namespace.as_str(), g.name.as_str());
            if by_key.contains_key(&key) {
                continue;
            }
            let level = |l: &Option<String>| l.as_ref().map(|l| (l.clone(), self.domains.level(l)));
            let req = level(&g.topology_required);
            let pref = level(&g.topology_preferred);
            let name = format!("{}/{}", g.namespace, g.name);
            let mut invalid = None;
            for (l, idx) in req.iter().chain(pref.iter()) {
                if idx.is_none() {
                    invalid = Some(Reason::UnknownTopologyLevel {
                        group: name.clone(),
                        level: l.clone(),
                    });
                }
            }
            by_key.insert(key, self.groups.len() as u32);
            self.groups.push(GroupInfo {
                name,
                min_member: g.min_member.max(1),
                max_member: g.max_member,
                required_level: req.and_then(|r| r.1),
                preferred_level: pref.and_then(|r| r.1),
                priority: g.priority,
                below_min_since: g.below_min_member_since,
                members: Vec::new(),
                invalid,
            });
        }
        for (i, p) in snap.pods.iter().enumerate() {
            let Some(gname) = &p.group else { continue };
            let key = (p.namespace.as_str(), gname.as_str());
            let gi = match by_key.get(&key) {
                Some(&gi) => gi,
                None => {
                    let gi = self.groups.len() as u32;
                    by_key.insert(key, gi);
                    self.groups.push(GroupInfo {
                        name: format!("{}/{}", p.namespace, gname),
                        min_member: p.min_member.unwrap_or(1).max(1),
                        max_member: None,
                        required_level: None,
                        preferred_level: None,
                        priority: p.priority,
                        below_min_since: None,
                        members: Vec::new(),
                        invalid: None,
                    });
                    gi
                }
            };
            self.groups[gi as usize].members.push(i as u32);
            self.pods[i].group = Some(gi);
        }
        // A gang needing more GPU than the cluster has can never start.
        for g in &mut self.groups {
            if g.invalid.is_some() {
                continue;
            }
            let mut per_pod: Vec<u64> = g
                .members
                .iter()
                .map(|&m| self.pods[m as usize].min_gpu_milli)
                .collect();
            per_pod.sort_unstable();
            let need: u64 = per_pod.iter().take(g.min_member as usize).sum();
            if need > self.capacity.gpu_milli {
                g.invalid = Some(Reason::GroupLargerThanCluster {
                    group: g.name.clone(),
                    need_gpu_milli: need,
                    cluster_gpu_milli: self.capacity.gpu_milli,
                });
            }
        }
    }

    /// The first static constraint (cordon, taints, node selector and affinity, volume node
    /// affinity) node `n` breaks for pod `p`.
    pub fn static_misfit(&self, p: u32, n: u32) -> Option<NodeReason> {
        let node = &self.snap.nodes[n as usize];
        if self.pods[p as usize].demand.class == 0
            && node.schedulable
            && node.constraints.taints.is_empty()
        {
            return None;
        }
        constraints::static_misfit(&self.snap.pods[p as usize], &self.snap.nodes[n as usize])
    }

    /// Whether pod `p` passes node `n`'s static constraints.
    pub fn static_ok(&self, p: u32, n: u32) -> bool {
        self.static_misfit(p, n).is_none()
    }

    /// Leaf fair shares are computed by the engine; this converts a share array to display.
    pub fn share_of(shares: &[Share], q: usize) -> [f64; 3] {
        shares.get(q).map(|s| s.fair).unwrap_or([0.0; 3])
    }
}
