//! The snapshot one scheduling cycle reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Node, Pod, PodGroup, Queue, QueueUsage};

/// Ordered topology levels (node label keys), coarse to fine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyLevels {
    /// Label keys, e.g. `topology.kubernetes.io/zone`, `tessera.dev/block`, `kubernetes.io/hostname`.
    pub levels: Vec<String>,
}

/// Everything a cycle reads: cluster, workload and queues at logical time `now`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Logical time in seconds.
    pub now: u64,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Pods: pending ones and bound ones (including other schedulers' pods on these nodes).
    pub pods: Vec<Pod>,
    /// PodGroups.
    pub groups: Vec<PodGroup>,
    /// Queues.
    pub queues: Vec<Queue>,
    /// Topology levels; `None` = only nodes (and NVLink islands inside them).
    pub topology: Option<TopologyLevels>,
    /// Namespace name → labels, for inter-pod terms with a namespace selector.
    #[serde(default)]
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// PodDisruptionBudgets: how many of their pods may be evicted now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disruption_budgets: Vec<DisruptionBudget>,
    /// Each queue's usage history as the last cycle (or the Queue's status) left it; a queue
    /// without a record starts from none. Read only while the cycle's usage decay is on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<QueueUsage>,
}

/// A PodDisruptionBudget as the Eviction API applies it: an eviction of one of `pods` is
/// refused once `disruptions_allowed` of them are evicted, and a pod covered by more than
/// one budget cannot be evicted at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisruptionBudget {
    /// `namespace/name`, as explanations name it.
    pub name: String,
    /// `status.disruptionsAllowed` (0 when the disruption controller has not counted it yet:
    /// the API server then refuses every eviction it covers).
    pub disruptions_allowed: u32,
    /// UIDs of the pods its selector matches.
    pub pods: Vec<String>,
}

impl Snapshot {
    /// An empty snapshot at time `now`.
    pub fn at(now: u64) -> Snapshot {
        Snapshot {
            now,
            ..Snapshot::default()
        }
    }

    /// Adds a node.
    pub fn node(mut self, node: Node) -> Snapshot {
        self.nodes.push(node);
        self
    }

    /// Adds a pod.
    pub fn pod(mut self, pod: Pod) -> Snapshot {
        self.pods.push(pod);
        self
    }

    /// Adds a group.
    pub fn group(mut self, group: PodGroup) -> Snapshot {
        self.groups.push(group);
        self
    }

    /// Adds a queue.
    pub fn queue(mut self, queue: Queue) -> Snapshot {
        self.queues.push(queue);
        self
    }

    /// Sets the topology levels.
    pub fn levels(mut self, levels: &[&str]) -> Snapshot {
        self.topology = Some(TopologyLevels {
            levels: levels.iter().map(|s| s.to_string()).collect(),
        });
        self
    }
}
