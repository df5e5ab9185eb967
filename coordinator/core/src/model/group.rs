//! PodGroups: gangs and elastic jobs.

use serde::{Deserialize, Serialize};

/// A PodGroup: its first `min_member` pods start together or not at all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodGroup {
    /// Name (unique within the namespace).
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Leaf queue.
    pub queue: String,
    /// Gang size.
    pub min_member: u32,
    /// Elastic upper bound (`None` = no bound beyond the pods that exist).
    pub max_member: Option<u32>,
    /// Topology level all pods must share (a key of the Topology CRD's levels).
    pub topology_required: Option<String>,
    /// Topology level all pods should share.
    pub topology_preferred: Option<String>,
    /// Priority of the group (used for ordering jobs in the queue).
    pub priority: i32,
    /// Logical time since which fewer than `min_member` pods have been running, as tracked by
    /// the cluster cache; the stale-gang action evicts the group once the grace period passed.
    pub below_min_member_since: Option<u64>,
}

impl PodGroup {
    /// A group `name` in namespace `default`, queue `queue`, gang size `min_member`.
    pub fn new(name: &str, queue: &str, min_member: u32) -> PodGroup {
        PodGroup {
            name: name.to_string(),
            namespace: "default".to_string(),
            queue: queue.to_string(),
            min_member,
            max_member: None,
            topology_required: None,
            topology_preferred: None,
            priority: 0,
            below_min_member_since: None,
        }
    }

    /// Sets the elastic upper bound.
    pub fn max(mut self, max_member: u32) -> PodGroup {
        self.max_member = Some(max_member);
        self
    }

    /// Requires all pods inside one domain of `level`.
    pub fn required(mut self, level: &str) -> PodGroup {
        self.topology_required = Some(level.to_string());
        self
    }

    /// Prefers all pods inside one domain of `level`.
    pub fn preferred(mut self, level: &str) -> PodGroup {
        self.topology_preferred = Some(level.to_string());
        self
    }
}
