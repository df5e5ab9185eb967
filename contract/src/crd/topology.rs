//! The `Topology` custom resource (cluster-scoped): ordered levels of node labels.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::Condition;

/// Spec of a Topology: its levels, coarse to fine.
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "Topology",
    plural = "topologies",
    shortname = "ttopo",
    category = "tessera",
    status = "TopologyStatus",
    derive = "PartialEq",
    doc = "Tessera topology: ordered levels of node label keys, coarse to fine (zone, block, rack, hostname). Groups name a level in tessera.dev/topology-required / -preferred.",
    printcolumn(name = "Levels", type_ = "string", json_path = ".spec.levels[*].name"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpec {
    /// Levels, coarse to fine. Inside a node, NVLink islands are an implicit finest level.
    #[schemars(length(min = 1))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub levels: Vec<TopologyLevel>,
}

/// One level: the name groups use, and the node label whose value names a domain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyLevel {
    /// Name used by `tessera.dev/topology-required: <name>` and PodGroup `topology` (e.g. `rack`).
    #[schemars(length(min = 1))]
    pub name: String,
    /// Node label key (e.g. `topology.kubernetes.io/zone`, `kubernetes.io/hostname`).
    #[schemars(length(min = 1))]
    pub node_label: String,
}

/// What the coordinator observed about a topology.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyStatus {
    /// Conditions (`Valid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
