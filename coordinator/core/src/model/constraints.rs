//! The Kubernetes placement constraints a pod carries and a node offers, in the core's own
//! terms: taints and tolerations, node affinity, inter-pod (anti-)affinity, topology spread,
//! host ports, extended resources, scheduling gates and volume node affinity.
//!
//! The types mirror the Kubernetes API fields closely, because their semantics are
//! kube-scheduler's (see `crate::constraints`); the cluster layer fills them from Pod, Node,
//! Namespace, PersistentVolumeClaim and PersistentVolume objects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A taint's effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    /// New pods that do not tolerate it are not placed.
    NoSchedule,
    /// A soft NoSchedule: placement prefers nodes without such taints.
    PreferNoSchedule,
    /// As NoSchedule for placement (the kubelet also evicts running pods).
    NoExecute,
}

impl TaintEffect {
    /// The Kubernetes spelling (`NoSchedule`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }

    /// Parses the Kubernetes spelling.
    pub fn parse(s: &str) -> Option<TaintEffect> {
        match s {
            "NoSchedule" => Some(TaintEffect::NoSchedule),
            "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
            "NoExecute" => Some(TaintEffect::NoExecute),
            _ => None,
        }
    }
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// How a toleration compares values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TolerationOp {
    /// Key present, any value.
    Exists,
    /// Key and value equal (the API's default).
    Equal,
}

/// A pod toleration.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Toleration {
    /// Key; empty with `Exists` tolerates every taint.
    pub key: String,
    /// Operator.
    pub operator: TolerationOp,
    /// Value (for `Equal`).
    pub value: String,
    /// Effect; `None` tolerates every effect.
    pub effect: Option<TaintEffect>,
}

/// Operator of one label requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SelectorOp {
    /// Label present with one of the values.
    In,
    /// Label absent or not one of the values.
    NotIn,
    /// Label present.
    Exists,
    /// Label absent.
    DoesNotExist,
    /// Label present and, read as an integer, greater than the single value (node selectors only).
    Gt,
    /// Label present and, read as an integer, less than the single value (node selectors only).
    Lt,
}

/// One requirement of a selector (`key operator values`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Requirement {
    /// Label key (or, in a node selector term's fields, `metadata.name`).
    pub key: String,
    /// Operator.
    pub operator: SelectorOp,
    /// Values.
    pub values: Vec<String>,
}

/// A label selector (`matchLabels` + `matchExpressions`, all ANDed). An empty selector matches
/// everything; where the API field is absent the model holds `None`, which matches nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LabelSelector {
    /// Requirements, `matchLabels` entries included as `In [value]`.
    pub requirements: Vec<Requirement>,
}

/// One term of a node selector: expressions on labels and on fields, ANDed. A term with
/// neither matches no node.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeSelectorTerm {
    /// Requirements on node labels.
    pub match_expressions: Vec<Requirement>,
    /// Requirements on node fields (only `metadata.name` exists).
    pub match_fields: Vec<Requirement>,
}

/// A node selector: its terms are ORed.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeSelector {
    /// Alternatives, ORed: a node matching any one term passes; no terms matches no node.
    pub terms: Vec<NodeSelectorTerm>,
}

/// A weighted preferred node-affinity term.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PreferredNodeTerm {
    /// Weight (1–100).
    pub weight: i32,
    /// The node requirements whose match adds `weight` to the node's score.
    pub term: NodeSelectorTerm,
}

/// Which namespaces an inter-pod affinity term looks at.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NamespaceScope {
    /// Listed namespaces. With neither this nor a selector, the pod's own namespace (the cluster
    /// layer fills it in, so the core never guesses).
    pub names: Vec<String>,
    /// Namespaces whose labels match; `None` = no namespace by labels, `Some(empty)` = all.
    pub selector: Option<LabelSelector>,
}

/// One inter-pod affinity or anti-affinity term.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodAffinityTerm {
    /// Pods it is about; `None` matches no pod.
    pub selector: Option<LabelSelector>,
    /// Namespaces of those pods.
    pub namespaces: NamespaceScope,
    /// Node label whose value defines "the same place".
    pub topology_key: String,
}

/// A weighted preferred inter-pod term.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WeightedPodTerm {
    /// Weight (1–100).
    pub weight: i32,
    /// The pods whose presence in the same topology domain adds (affinity) or subtracts
    /// (anti-affinity) `weight`.
    pub term: PodAffinityTerm,
}

/// Whether a spread constraint's node inclusion honours a pod property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum InclusionPolicy {
    /// Only nodes that pass the property's filter are counted.
    Honor,
    /// Every node with the topology key is counted.
    Ignore,
}

/// A topology spread constraint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SpreadConstraint {
    /// Largest allowed difference between a domain's matching pods and the least loaded domain's.
    pub max_skew: u32,
    /// Node label that defines the domains.
    pub topology_key: String,
    /// `true` = `DoNotSchedule` (a filter), `false` = `ScheduleAnyway` (a score).
    pub hard: bool,
    /// Pods counted (in the pod's namespace), `matchLabelKeys` already merged in; `None`
    /// matches no pod.
    pub selector: Option<LabelSelector>,
    /// Fewer eligible domains than this count the global minimum as 0.
    pub min_domains: Option<u32>,
    /// Whether node affinity and the node selector limit the counted nodes (default Honor).
    pub node_affinity_policy: InclusionPolicy,
    /// Whether taints limit the counted nodes (default Ignore).
    pub node_taints_policy: InclusionPolicy,
}

/// A host port a container asks for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HostPort {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// Host IP; empty or `0.0.0.0` = every address.
    pub ip: String,
    /// Port number.
    pub port: u16,
}

/// Everything a pod asks of its node besides CPU, memory and GPUs. `Default` asks nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodConstraints {
    /// Pod labels (what other pods' selectors match).
    pub labels: BTreeMap<String, String>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Required node affinity; `None` = none.
    pub node_affinity: Option<NodeSelector>,
    /// Preferred node affinity (a score).
    pub preferred_node_affinity: Vec<PreferredNodeTerm>,
    /// Required node affinity of the PersistentVolumes bound to the pod's claims (each must hold).
    pub volume_node_affinity: Vec<NodeSelector>,
    /// Required inter-pod affinity terms.
    pub pod_affinity: Vec<PodAffinityTerm>,
    /// Required inter-pod anti-affinity terms.
    pub pod_anti_affinity: Vec<PodAffinityTerm>,
    /// Preferred inter-pod affinity terms (a score).
    pub preferred_pod_affinity: Vec<WeightedPodTerm>,
    /// Preferred inter-pod anti-affinity terms (a score).
    pub preferred_pod_anti_affinity: Vec<WeightedPodTerm>,
    /// Topology spread constraints.
    pub spread: Vec<SpreadConstraint>,
    /// Host ports of all containers.
    pub host_ports: Vec<HostPort>,
    /// Requests of resources other than CPU, memory and GPUs, in the resource's base unit
    /// (bytes for `ephemeral-storage` and hugepages; a count for extended resources).
    pub extended: BTreeMap<String, u64>,
    /// Names of the pod's scheduling gates; a gated pod is not placed.
    pub scheduling_gates: Vec<String>,
}

impl PodConstraints {
    /// Whether the pod carries no constraint beyond what every pod has (labels and
    /// tolerations do not count: they only matter against other pods' and nodes' rules).
    pub fn is_plain(&self) -> bool {
        self.node_affinity.is_none()
            && self.preferred_node_affinity.is_empty()
            && self.volume_node_affinity.is_empty()
            && self.pod_affinity.is_empty()
            && self.pod_anti_affinity.is_empty()
            && self.preferred_pod_affinity.is_empty()
            && self.preferred_pod_anti_affinity.is_empty()
            && self.spread.is_empty()
            && self.host_ports.is_empty()
            && self.extended.is_empty()
            && self.scheduling_gates.is_empty()
    }
}

/// What a node offers besides CPU, memory and GPUs. `Default` offers nothing extra and has no
/// taint and no pod limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeConstraints {
    /// Taints.
    pub taints: Vec<Taint>,
    /// Allocatable pod count; `None` = unlimited (simulated clusters).
    pub max_pods: Option<u32>,
    /// Allocatable resources other than CPU, memory and GPUs, in base units (see
    /// [`PodConstraints::extended`]).
    pub extended: BTreeMap<String, u64>,
}
