//! Tessera's custom resources (`tessera.dev/v1alpha1`), defined once for everything that reads
//! or writes them: `Queue`, `PodGroup`, `Topology` (written by users, status by the
//! coordinator) and `GpuNode` (written by the coordinator only), with their status types.
//! The coordinator renders the CRDs from these types and validates their contents;
//! `kubectl tessera` reads them.

pub mod condition;
pub mod gpunode;
pub mod podgroup;
pub mod queue;
pub mod topology;

pub use condition::Condition;
pub use gpunode::{AgentView, GpuNode, GpuNodeSpec, GpuNodeStatus, GpuView, ShareView};
pub use podgroup::{GroupTopology, PodGroup, PodGroupSpec, PodGroupStatus};
pub use queue::{
    GpuModelAmounts, GpuModelQuota, GpuQuota, NamespaceSelector, QuantityQuota, Queue, QueueSpec,
    QueueStatus, QueueUsage, ResourceAmounts, SelectorRequirement,
};
pub use topology::{Topology, TopologyLevel, TopologySpec, TopologyStatus};

/// API group of every Tessera resource.
pub const GROUP: &str = "tessera.dev";
/// API version of every Tessera resource.
pub const VERSION: &str = "v1alpha1";
