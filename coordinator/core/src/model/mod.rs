//! Snapshot types: nodes, GPUs, pods, groups, queues and resource vectors. No I/O.
//!
//! A [`Snapshot`] is everything one scheduling cycle reads. The cluster layer (or the simulator)
//! builds it; the core never mutates it.

mod constraints;
mod group;
mod node;
mod pod;
mod queue;
mod resources;
mod snapshot;
pub mod synthetic;

pub use constraints::{
    HostPort, InclusionPolicy, LabelSelector, NamespaceScope, NodeConstraints, NodeSelector,
    NodeSelectorTerm, PodAffinityTerm, PodConstraints, PreferredNodeTerm, Requirement, SelectorOp,
    SpreadConstraint, Taint, TaintEffect, Toleration, TolerationOp, WeightedPodTerm,
};
pub use group::PodGroup;
pub use node::{Fence, Gpu, MigInstance, Node};
pub use pod::{
    Assignment, ContainerAssignment, GpuRequest, GpuShare, GpuSlice, InputError, Isolation,
    Placement, Pod,
};
pub use queue::{ModelQuota, Queue, QueueResource, QueueUsage};
pub use resources::{Resource, Resources};
pub use snapshot::{DisruptionBudget, Snapshot, TopologyLevels};
