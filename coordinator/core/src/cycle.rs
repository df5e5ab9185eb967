//! One scheduling cycle: snapshot in, decisions out.
//!
//! [`schedule`] builds the per-cycle context (queue tree, fair shares, shape mix, capacity
//! index), then runs the actions in order: stale-gang, allocate, consolidate, reclaim, preempt.
//! All of them work through one tentative statement, so a failed gang or victim search rolls
//! back without a trace. What survives becomes [`Decisions`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::actions::Engine;
use crate::model::{Assignment, Fence, QueueUsage, Resource, Snapshot};
use crate::placement::ScoreWeights;
use crate::placement::frag::ShapeMix;
use crate::usage::UsageDecay;

/// Knobs of a cycle. `Default` is the production setting.
#[derive(Clone, Debug)]
pub struct CycleConfig {
    /// Seed for the node tie-break order when `shuffle_ties` is on.
    pub seed: u64,
    /// Break ties between equally good nodes in a seeded random order instead of by name.
    pub shuffle_ties: bool,
    /// Seconds a gang may stay below `minMember` before it is evicted whole.
    pub gang_grace_seconds: u64,
    /// Nodes examined per pod during a victim search (reclaim, preempt, consolidate).
    pub max_victim_candidates: usize,
    /// Jobs per action that may run a victim search (bounds the cycle's time).
    pub max_victim_jobs: usize,
    /// Feasible nodes scored per pod (tightest first); `usize::MAX` scores every feasible node.
    pub nodes_to_score: usize,
    /// Nodes visited per pod before giving up the search for more feasible nodes.
    pub max_nodes_visited: usize,
    /// Topology domains tried per gang.
    pub max_domains_tried: usize,
    /// Placement score weights (NVLink penalties, memory-aware free share).
    pub weights: ScoreWeights,
    /// Share of pods the typical-shape mix covers (FGD uses 0.95).
    pub mix_coverage: f64,
    /// At most this many shapes in the mix (bounds scoring cost).
    pub mix_max_shapes: usize,
    /// Use this mix instead of the one derived from the snapshot (the simulator passes the
    /// trace's mix).
    pub shape_mix: Option<ShapeMix>,
    /// Run reclaim, preempt and consolidate (the fill-only simulator turns them off).
    pub victims_enabled: bool,
    /// How usage history weighs in fair share (off by default).
    pub usage: UsageDecay,
}

impl Default for CycleConfig {
    fn default() -> Self {
        CycleConfig {
            seed: 0,
            shuffle_ties: false,
            gang_grace_seconds: 300,
            max_victim_candidates: 64,
            max_victim_jobs: 256,
            nodes_to_score: 32,
            max_nodes_visited: 4096,
            max_domains_tried: 16,
            weights: ScoreWeights::default(),
            mix_coverage: 0.95,
            mix_max_shapes: 48,
            shape_mix: None,
            victims_enabled: true,
            usage: UsageDecay::default(),
        }
    }
}

/// Bind `pod` to `node` with this GPU assignment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    /// Pod UID.
    pub pod: String,
    /// Node name.
    pub node: String,
    /// The `tessera.dev/assignment` value.
    pub assignment: Assignment,
    /// The node's capacity is only free once this cycle's evictions on it finished: the binder
    /// waits for them (the pod is "pipelined").
    pub after_evictions: bool,
}

/// Why a pod is evicted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EvictionReason {
    /// Queue `by_queue`, below its fair share, reclaims capacity.
    Reclaim {
        /// Leaf queue below its fair share whose pending pod the capacity goes to.
        by_queue: String,
    },
    /// A higher-priority pod of the same queue needs the capacity.
    Preempt {
        /// UID of the preemptor.
        by_pod: String,
    },
    /// Moved to free whole GPUs or nodes for a waiting gang; a new copy fits on `moved_to`.
    Consolidate {
        /// Node where the recreated pod fits.
        moved_to: String,
    },
    /// Its gang stayed below `minMember` past the grace period.
    GangBelowMinMember,
}

/// Evict `pod`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eviction {
    /// Pod UID.
    pub pod: String,
    /// Why.
    pub reason: EvictionReason,
}

/// A machine-readable reason a pod is pending.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// A field of the pod is malformed.
    InvalidInput {
        /// The field (annotation, label or resource name).
        field: String,
        /// What is wrong and the accepted form.
        message: String,
    },
    /// The pod's queue does not exist.
    UnknownQueue {
        /// Queue name.
        queue: String,
    },
    /// The pod's queue has children; only leaf queues take pods.
    NotLeafQueue {
        /// Queue name.
        queue: String,
    },
    /// The group needs more GPUs than the cluster has.
    GroupLargerThanCluster {
        /// Group name.
        group: String,
        /// Milli-GPU the gang needs.
        need_gpu_milli: u64,
        /// Milli-GPU of healthy GPUs in the cluster.
        cluster_gpu_milli: u64,
    },
    /// Fewer pods exist than the gang size.
    WaitingForMembers {
        /// Group name.
        group: String,
        /// Pods that exist.
        present: u32,
        /// Gang size.
        min_member: u32,
    },
    /// The group already runs `maxMember` pods.
    BeyondMaxMember {
        /// Group name.
        group: String,
        /// The group's `maxMember`: pods beyond it stay pending.
        max_member: u32,
    },
    /// The queue (or an ancestor) is at its limit of a GPU model on every node of that model
    /// the pod fits on.
    QueueOverModelLimit {
        /// Queue at its limit.
        queue: String,
        /// The GPU model key.
        model: String,
        /// Limit in GPUs.
        limit: String,
    },
    /// The queue (or an ancestor) would exceed its limit.
    QueueOverLimit {
        /// Queue at its limit.
        queue: String,
        /// Resource.
        resource: Resource,
        /// Limit in display units (GPUs, milli-cores, MiB).
        limit: String,
    },
    /// Not all gang members fit together.
    GangUnschedulable {
        /// Group name.
        group: String,
        /// Members that fit before one did not.
        fitted: u32,
        /// Members needed together.
        needed: u32,
    },
    /// No domain of the required level can hold the gang.
    NoTopologyDomain {
        /// Group name.
        group: String,
        /// Level label key.
        level: String,
    },
    /// The topology level is not one of the cluster's levels.
    UnknownTopologyLevel {
        /// Group name.
        group: String,
        /// The required or preferred level name the group gave (PodGroup spec or the pods'
        /// `tessera.dev/topology-*` annotations) that the cluster's Topology does not define.
        level: String,
    },
    /// The queue is below its fair share, but no preemptible pod (or whole gang) of another
    /// queue could be evicted to make room without taking that queue below its deserved quota,
    /// or, where the reclaimer would pass its own deserved quota, below its fair share.
    NoReclaimVictims {
        /// Leaf queue below its fair share that found nothing to reclaim from.
        queue: String,
    },
    /// Victims that would make room are covered by PodDisruptionBudgets with no disruption
    /// left (or by more than one budget): the Eviction API would refuse them, so they are not
    /// chosen.
    DisruptionBudget {
        /// `namespace/name` of the refusing budgets.
        budgets: Vec<String>,
    },
    /// The pod has scheduling gates; it is not placed until they are removed.
    SchedulingGated {
        /// The gates' names.
        gates: Vec<String>,
    },
    /// A node-level failure; counted across nodes.
    Node(NodeReason),
    /// Fits on some nodes, but the capacity went to pods ahead of it in this cycle or the
    /// bounded search stopped first.
    NotReached,
}

/// Why a node cannot host a pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NodeReason {
    /// Cordoned.
    Unschedulable,
    /// Labels do not match the node selector.
    NodeSelector,
    /// No GPU on the node.
    NoGpus,
    /// GPU model not accepted.
    GpuModel,
    /// Not enough CPU.
    InsufficientCpu,
    /// Not enough memory.
    InsufficientMemory,
    /// Fewer GPUs (of the pod's MIG mode) than the pod asks for, healthy or not.
    TooFewGpus,
    /// Too few healthy GPUs.
    TooFewHealthyGpus,
    /// Enough GPUs only counting fenced ones (the node's account of them is not settled).
    GpusFenced(Fence),
    /// Too few completely free GPUs.
    InsufficientWholeGpus,
    /// No (or too few) GPUs with enough free compute share.
    InsufficientGpuShare,
    /// GPUs with enough share lack memory.
    InsufficientGpuMemory,
    /// A NoSchedule/NoExecute taint the pod does not tolerate (`{key: value}` as
    /// kube-scheduler writes it).
    UntoleratedTaint(String),
    /// A bound PersistentVolume's node affinity excludes the node.
    VolumeNodeAffinity,
    /// The node already runs its allocatable number of pods.
    TooManyPods,
    /// Not enough of a resource other than CPU, memory and GPUs (its name).
    InsufficientResource(String),
    /// A requested host port is taken.
    HostPorts,
    /// The pod's required inter-pod affinity is not met in the node's domain.
    PodAffinity,
    /// The pod's required inter-pod anti-affinity is violated in the node's domain.
    PodAntiAffinity,
    /// A running pod's required anti-affinity forbids this pod in the node's domain.
    ExistingAntiAffinity,
    /// A hard topology spread constraint would be skewed beyond maxSkew.
    TopologySpread,
    /// The node lacks a hard topology spread constraint's topology key.
    TopologySpreadMissingLabel,
    /// The node would fit the pod alone.
    Fits,
}

impl NodeReason {
    /// The kube-scheduler filter plugin that reports the same failure, where one does (GPU
    /// fit is Tessera's own).
    pub fn kube_plugin(&self) -> Option<&'static str> {
        Some(match self {
            NodeReason::Unschedulable => "NodeUnschedulable",
            NodeReason::NodeSelector => "NodeAffinity",
            NodeReason::UntoleratedTaint(_) => "TaintToleration",
            NodeReason::VolumeNodeAffinity => "VolumeBinding",
            NodeReason::InsufficientCpu
            | NodeReason::InsufficientMemory
            | NodeReason::TooManyPods
            | NodeReason::InsufficientResource(_) => "NodeResourcesFit",
            NodeReason::HostPorts => "NodePorts",
            NodeReason::PodAffinity
            | NodeReason::PodAntiAffinity
            | NodeReason::ExistingAntiAffinity => "InterPodAffinity",
            NodeReason::TopologySpread | NodeReason::TopologySpreadMissingLabel => {
                "PodTopologySpread"
            }
            _ => return None,
        })
    }
}

impl NodeReason {
    /// This reason as a pending pod's message counts it, in kube-scheduler's words where one of
    /// its filter plugins reports the same failure, and with the pod's request where the reason
    /// is about GPUs: `gpus` GPUs per pod, `mig` for a pod that needs GPUs in MIG mode ("node(s)
    /// had fewer than 8 free GPUs"). `gpus` 0 gives the words without a count.
    pub fn for_pod(&self, gpus: u32, mig: bool) -> ForPod<'_> {
        ForPod {
            reason: self,
            gpus,
            mig,
        }
    }
}

/// A [`NodeReason`] worded for one pod's request ([`NodeReason::for_pod`]).
pub struct ForPod<'a> {
    reason: &'a NodeReason,
    gpus: u32,
    mig: bool,
}

/// "no {adjective}GPU{rest}" for a one-GPU pod, "fewer than {n} {adjective}GPUs{rest}" for
/// more; `generic` without a count.
fn short_of(
    f: &mut fmt::Formatter<'_>,
    n: u32,
    (adjective, rest): (&str, &str),
    generic: &str,
) -> fmt::Result {
    match n {
        0 => write!(f, "node(s) had {generic}"),
        1 => write!(f, "node(s) had no {adjective}GPU{rest}"),
        n => write!(f, "node(s) had fewer than {n} {adjective}GPUs{rest}"),
    }
}

impl fmt::Display for ForPod<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.gpus;
        f.write_str(match self.reason {
            // kube-scheduler's own words (its filter plugins' reasons at v1.37).
            NodeReason::Unschedulable => "node(s) were unschedulable",
            NodeReason::NodeSelector => "node(s) didn't match Pod's node affinity/selector",
            NodeReason::InsufficientCpu => "Insufficient cpu",
            NodeReason::InsufficientMemory => "Insufficient memory",
            NodeReason::InsufficientResource(r) => return write!(f, "Insufficient {r}"),
            NodeReason::TooManyPods => "Too many pods",
            // kube-scheduler wrote the taint itself until v1.35 ("untolerated taint(s)" since):
            // naming it says which toleration is missing.
            NodeReason::UntoleratedTaint(t) => {
                return write!(f, "node(s) had untolerated taint {t}");
            }
            NodeReason::VolumeNodeAffinity => {
                "node(s) didn't match PersistentVolume's node affinity"
            }
            NodeReason::HostPorts => "node(s) didn't have free ports for the requested pod ports",
            NodeReason::PodAffinity => "node(s) didn't match pod affinity rules",
            NodeReason::PodAntiAffinity => "node(s) didn't match pod anti-affinity rules",
            NodeReason::ExistingAntiAffinity => {
                "node(s) didn't satisfy existing pods anti-affinity rules"
            }
            NodeReason::TopologySpread => "node(s) didn't match pod topology spread constraints",
            NodeReason::TopologySpreadMissingLabel => {
                "node(s) didn't match pod topology spread constraints (missing required label)"
            }
            // Tessera's GPU fit, in the same style.
            NodeReason::NoGpus => "node(s) had no GPUs",
            NodeReason::GpuModel => "node(s) didn't have the GPU model the pod accepts",
            NodeReason::TooFewGpus if self.mig => {
                return short_of(f, n, ("", " in MIG mode"), "fewer GPUs in MIG mode than the pod requests");
            }
            // One GPU short for a pod that is not MIG: every GPU of the node is in MIG mode
            // (a node without GPUs is `NoGpus`).
            NodeReason::TooFewGpus if n == 1 => "node(s) had only GPUs in MIG mode",
            NodeReason::TooFewGpus => {
                return short_of(f, n, ("", ""), "fewer GPUs than the pod requests");
            }
            NodeReason::TooFewHealthyGpus => {
                return short_of(f, n, ("healthy ", ""), "too few healthy GPUs");
            }
            NodeReason::InsufficientWholeGpus => {
                return short_of(f, n, ("free ", ""), "too few free whole GPUs");
            }
            NodeReason::InsufficientGpuShare => {
                return short_of(
                    f,
                    n,
                    ("", " with enough free compute share"),
                    "no GPU with enough free compute share",
                );
            }
            NodeReason::InsufficientGpuMemory => {
                return short_of(
                    f,
                    n,
                    ("", " with enough free GPU memory"),
                    "no GPU with enough free GPU memory",
                );
            }
            NodeReason::GpusFenced(Fence::Unreported) => {
                "node(s) had GPUs another scheduler's pod may hold (not yet reported by the node's agent)"
            }
            NodeReason::GpusFenced(Fence::HeldByUnknownPod) => {
                "node(s) had GPUs still held by a departed pod (not yet released by the node's agent)"
            }
            NodeReason::GpusFenced(Fence::Refused) => {
                "node(s) had GPUs the node refused at admission (until its agent reports them free)"
            }
            NodeReason::Fits => "node(s) would fit the pod alone",
        })
    }
}

impl fmt::Display for NodeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.for_pod(0, false))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::InvalidInput { field, message } => write!(f, "invalid {field}: {message}"),
            Reason::UnknownQueue { queue } => {
                write!(f, "queue {queue} does not exist (label tessera.dev/queue)")
            }
            Reason::NotLeafQueue { queue } => write!(
                f,
                "queue {queue} has child queues; label tessera.dev/queue must name a leaf queue"
            ),
            Reason::GroupLargerThanCluster {
                group,
                need_gpu_milli,
                cluster_gpu_milli,
            } => write!(
                f,
                "pod group {group} needs {} GPUs for minMember but the cluster has {} healthy GPUs",
                fmt_gpus(*need_gpu_milli),
                fmt_gpus(*cluster_gpu_milli)
            ),
            Reason::WaitingForMembers {
                group,
                present,
                min_member,
            } => write!(
                f,
                "pod group {group}: {present} of minMember {min_member} pods exist; waiting for the rest"
            ),
            Reason::BeyondMaxMember { group, max_member } => {
                write!(
                    f,
                    "pod group {group} already runs maxMember={max_member} pods"
                )
            }
            Reason::QueueOverLimit {
                queue,
                resource,
                limit,
            } => {
                write!(f, "queue {queue} over limit {}={limit}", resource.name())
            }
            Reason::QueueOverModelLimit {
                queue,
                model,
                limit,
            } => write!(
                f,
                "queue {queue} over limit gpu={limit} of GPU model {model} (spec.gpu.models)"
            ),
            Reason::GangUnschedulable {
                group,
                fitted,
                needed,
            } => {
                if *fitted == 0 {
                    write!(f, "gang {group}: its {needed} pods do not fit together")
                } else {
                    write!(
                        f,
                        "gang {group}: only {fitted} of {needed} pods fit together"
                    )
                }
            }
            Reason::NoTopologyDomain { group, level } => {
                write!(f, "gang {group}: no {level} domain can hold all its pods")
            }
            Reason::UnknownTopologyLevel { group, level } => write!(
                f,
                "invalid tessera.dev/topology level {level} of group {group}: not a level of the Topology"
            ),
            Reason::NoReclaimVictims { queue } => write!(
                f,
                "queue {queue} is below its fair share, but no preemptible pod of a queue above its own can be evicted for it without taking that queue below its deserved quota, or below its fair share where {queue} would pass its own deserved quota (a gang leaves whole)"
            ),
            Reason::DisruptionBudget { budgets } => write!(
                f,
                "the pods that would make room are protected by PodDisruptionBudget {}: no disruption is allowed now, so the API server would refuse their eviction",
                budgets.join(", ")
            ),
            Reason::SchedulingGated { gates } => write!(
                f,
                "scheduling is blocked by the pod's scheduling gates ({})",
                gates.join(", ")
            ),
            Reason::Node(n) => write!(f, "{n}"),
            Reason::NotReached => f.write_str("capacity taken by pods ahead of it this cycle"),
        }
    }
}

fn fmt_gpus(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        format!("{}", milli / 1000)
    } else {
        format!("{:.3}", milli as f64 / 1000.0)
    }
}

/// Why a pod stays pending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingExplanation {
    /// Pod UID.
    pub pod: String,
    /// Human message: the node-level part first, as kube-scheduler writes it (`0/1213 nodes are
    /// available: 812 node(s) had no GPU with enough free GPU memory, 401 Insufficient cpu.`),
    /// then the job-level reason (gang, queue, fair share).
    pub message: String,
    /// Machine-readable reasons with counts (nodes for node reasons, 1 otherwise).
    pub reasons: Vec<(Reason, u32)>,
}

/// Fair-share status of one queue (accounting units: milli-GPU, milli-cores, MiB).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueShareStatus {
    /// Queue name.
    pub queue: String,
    /// Granted deserved quota.
    pub deserved: [f64; 3],
    /// Fair share.
    pub fair_share: [f64; 3],
    /// Allocated after this cycle's decisions.
    pub allocated: [f64; 3],
    /// Demand (allocated + pending, capped by limit) the fair share was computed from.
    pub requested: [f64; 3],
    /// Per GPU model some queue's settings name (milli-GPU of that model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelShareStatus>,
    /// While usage history is on: the factor per resource its over-quota weight was
    /// multiplied by (1 = no recent usage; see [`crate::usage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_factor: Option<[f64; 3]>,
}

/// Fair-share status of one queue for one GPU model, in milli-GPU of that model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelShareStatus {
    /// The model key.
    pub model: String,
    /// Granted deserved quota of the model.
    pub deserved: f64,
    /// Fair share of the model.
    pub fair_share: f64,
    /// Held after this cycle's decisions.
    pub allocated: f64,
    /// Demand (allocated + pending that may land on the model, capped by limits).
    pub requested: f64,
}

/// Everything a cycle decided.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    /// New bindings, in decision order (gang members together).
    pub bindings: Vec<Binding>,
    /// Evictions.
    pub evictions: Vec<Eviction>,
    /// Explanations for every pod left pending, in snapshot order.
    pub pending: Vec<PendingExplanation>,
    /// Per queue, sorted by name.
    pub fair_shares: Vec<QueueShareStatus>,
    /// Groups (`namespace/name`) that, after these decisions, run some but fewer than
    /// `minMember` pods: the cluster cache stamps `below_min_member_since` for them (and clears
    /// it for groups not listed), which the stale-gang action reads after the grace period.
    pub gangs_below_min: Vec<String>,
    /// While usage history is on: every queue's record advanced to the snapshot's time, with
    /// what it holds after these decisions, sorted by queue (the caller passes it to the next
    /// cycle's snapshot and persists it). Empty while it is off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<QueueUsage>,
}

/// Runs one scheduling cycle.
pub fn schedule(snapshot: &Snapshot, config: &CycleConfig) -> Decisions {
    let mut engine = Engine::new(snapshot, config);
    engine.run();
    engine.decisions()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node reason as a pending pod's message counts it: kube-scheduler's words where
    /// one of its plugins reports the same failure, the pod's GPU count in the GPU reasons.
    #[test]
    fn node_reasons_in_kube_schedulers_words() {
        let rows: Vec<(NodeReason, u32, bool, &str)> = vec![
            (
                NodeReason::Unschedulable,
                0,
                false,
                "node(s) were unschedulable",
            ),
            (
                NodeReason::NodeSelector,
                0,
                false,
                "node(s) didn't match Pod's node affinity/selector",
            ),
            (NodeReason::InsufficientCpu, 0, false, "Insufficient cpu"),
            (
                NodeReason::InsufficientMemory,
                0,
                false,
                "Insufficient memory",
            ),
            (
                NodeReason::InsufficientResource("example.com/foo".into()),
                0,
                false,
                "Insufficient example.com/foo",
            ),
            (NodeReason::TooManyPods, 0, false, "Too many pods"),
            (
                NodeReason::UntoleratedTaint("{dedicated: ml}".into()),
                0,
                false,
                "node(s) had untolerated taint {dedicated: ml}",
            ),
            (
                NodeReason::VolumeNodeAffinity,
                0,
                false,
                "node(s) didn't match PersistentVolume's node affinity",
            ),
            (
                NodeReason::HostPorts,
                0,
                false,
                "node(s) didn't have free ports for the requested pod ports",
            ),
            (
                NodeReason::PodAffinity,
                0,
                false,
                "node(s) didn't match pod affinity rules",
            ),
            (
                NodeReason::PodAntiAffinity,
                0,
                false,
                "node(s) didn't match pod anti-affinity rules",
            ),
            (
                NodeReason::ExistingAntiAffinity,
                0,
                false,
                "node(s) didn't satisfy existing pods anti-affinity rules",
            ),
            (
                NodeReason::TopologySpread,
                0,
                false,
                "node(s) didn't match pod topology spread constraints",
            ),
            (
                NodeReason::TopologySpreadMissingLabel,
                0,
                false,
                "node(s) didn't match pod topology spread constraints (missing required label)",
            ),
            (NodeReason::NoGpus, 8, false, "node(s) had no GPUs"),
            (
                NodeReason::GpuModel,
                1,
                false,
                "node(s) didn't have the GPU model the pod accepts",
            ),
            (
                NodeReason::TooFewGpus,
                8,
                false,
                "node(s) had fewer than 8 GPUs",
            ),
            (
                NodeReason::TooFewGpus,
                1,
                false,
                "node(s) had only GPUs in MIG mode",
            ),
            (
                NodeReason::TooFewGpus,
                2,
                true,
                "node(s) had fewer than 2 GPUs in MIG mode",
            ),
            (
                NodeReason::TooFewGpus,
                1,
                true,
                "node(s) had no GPU in MIG mode",
            ),
            (
                NodeReason::TooFewGpus,
                0,
                false,
                "node(s) had fewer GPUs than the pod requests",
            ),
            (
                NodeReason::TooFewHealthyGpus,
                8,
                false,
                "node(s) had fewer than 8 healthy GPUs",
            ),
            (
                NodeReason::TooFewHealthyGpus,
                1,
                false,
                "node(s) had no healthy GPU",
            ),
            (
                NodeReason::InsufficientWholeGpus,
                8,
                false,
                "node(s) had fewer than 8 free GPUs",
            ),
            (
                NodeReason::InsufficientWholeGpus,
                1,
                false,
                "node(s) had no free GPU",
            ),
            (
                NodeReason::InsufficientGpuShare,
                1,
                false,
                "node(s) had no GPU with enough free compute share",
            ),
            (
                NodeReason::InsufficientGpuShare,
                2,
                false,
                "node(s) had fewer than 2 GPUs with enough free compute share",
            ),
            (
                NodeReason::InsufficientGpuMemory,
                1,
                false,
                "node(s) had no GPU with enough free GPU memory",
            ),
            (
                NodeReason::InsufficientGpuMemory,
                4,
                false,
                "node(s) had fewer than 4 GPUs with enough free GPU memory",
            ),
            (
                NodeReason::GpusFenced(Fence::Unreported),
                1,
                false,
                "node(s) had GPUs another scheduler's pod may hold (not yet reported by the node's agent)",
            ),
            (
                NodeReason::GpusFenced(Fence::HeldByUnknownPod),
                1,
                false,
                "node(s) had GPUs still held by a departed pod (not yet released by the node's agent)",
            ),
            (
                NodeReason::GpusFenced(Fence::Refused),
                1,
                false,
                "node(s) had GPUs the node refused at admission (until its agent reports them free)",
            ),
            (
                NodeReason::Fits,
                1,
                false,
                "node(s) would fit the pod alone",
            ),
        ];
        for (reason, gpus, mig, want) in rows {
            assert_eq!(reason.for_pod(gpus, mig).to_string(), want, "{reason:?}");
        }
        // Without a pod, the words without a count.
        assert_eq!(
            Reason::Node(NodeReason::InsufficientWholeGpus).to_string(),
            "node(s) had too few free whole GPUs"
        );
    }
}
