//! The `PodGroup` custom resource (namespaced): a gang of pods with an elastic upper bound.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::Condition;

/// Spec of a PodGroup: gang size, elastic bound, queue, priority and topology constraints.
#[allow(clippy::duplicated_attributes)] // kube-derive repeats `type_` per printer column by design.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "PodGroup",
    plural = "podgroups",
    shortname = "pg",
    category = "tessera",
    namespaced,
    status = "PodGroupStatus",
    derive = "PartialEq",
    doc = "A Tessera PodGroup: its first minMember pods start together or not at all; pods up to maxMember are placed one by one.",
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.minMember"),
    printcolumn(name = "Max", type_ = "integer", json_path = ".spec.maxMember"),
    printcolumn(name = "Queue", type_ = "string", json_path = ".spec.queue"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Running", type_ = "integer", json_path = ".status.running"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.maxMember) || !has(self.minMember) || self.maxMember >= self.minMember",
    "message": "maxMember must be at least minMember"
}]))]
pub struct PodGroupSpec {
    /// Gang size: this many pods are bound together or none is (at least 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_member: i32,
    /// Elastic upper bound; absent = no bound beyond the pods that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_member: Option<i32>,
    /// Leaf queue of the group; absent = the pods' own queue label (or `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// PriorityClass giving the group's priority; absent = the pods' priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Topology constraints (level names of the Topology object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<GroupTopology>,
}

fn one() -> i32 {
    1
}

/// Topology levels all pods of the group must / should share.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupTopology {
    /// All pods land inside one domain of this level (a level `name` of the Topology object,
    /// e.g. `rack`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<String>,
    /// All pods are packed as tightly as possible within one domain of this level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred: Option<String>,
}

/// What the coordinator observed about a group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// `Pending`, `Scheduled`, `Running`, `Unschedulable` or `Invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Pods bound to a node.
    #[serde(default)]
    pub scheduled: i32,
    /// Pods running.
    #[serde(default)]
    pub running: i32,
    /// Conditions (`Valid`, `Scheduled`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
