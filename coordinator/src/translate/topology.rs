//! Topology CRD → the core's ordered label keys, and level name → label key resolution.

use crate::crd::Topology;
use tessera_core::model::TopologyLevels;

/// The Topology in force: the object named `default` when there is one, else the first by name.
/// (The cluster is expected to hold one; the choice just has to be stable.)
pub fn active<'a>(topologies: &[&'a Topology]) -> Option<&'a Topology> {
    topologies
        .iter()
        .find(|t| t.metadata.name.as_deref() == Some("default"))
        .or_else(|| topologies.iter().min_by_key(|t| t.metadata.name.clone()))
        .copied()
}

/// The core's levels: node label keys, coarse to fine (empty names and labels skipped).
pub fn levels(t: &Topology) -> TopologyLevels {
    TopologyLevels {
        levels: t
            .spec
            .levels
            .iter()
            .filter(|l| !l.node_label.trim().is_empty())
            .map(|l| l.node_label.clone())
            .collect(),
    }
}

/// The label key a group's topology field names: a level `name` of the topology (`rack`), or a
/// level's label key itself. Unknown names pass through unchanged, so the core reports them as
/// an unknown level on the group.
pub fn resolve(level: &str, topology: Option<&Topology>) -> String {
    topology
        .and_then(|t| {
            t.spec
                .levels
                .iter()
                .find(|l| l.name == level)
                .map(|l| l.node_label.clone())
        })
        .unwrap_or_else(|| level.to_string())
}
