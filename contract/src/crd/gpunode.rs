//! The `GpuNode` custom resource (cluster-scoped, one per GPU node, named as the node): the
//! coordinator's read-only view of what the node's agent reports — each GPU's model, memory,
//! health, who holds which share of it, and the measured memory and utilisation. Written only by
//! the leading coordinator (status, at a bounded rate); read by `kubectl tessera` and by
//! `kubectl get gpunodes` with nothing more than `list` on this resource.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Spec of a GpuNode: empty. The object exists to carry its status; it is owned by its Node,
/// so the garbage collector removes it with the Node.
#[allow(clippy::duplicated_attributes)] // kube-derive repeats `type_` per printer column by design.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuNode",
    plural = "gpunodes",
    shortname = "tgn",
    category = "tessera",
    status = "GpuNodeStatus",
    derive = "PartialEq",
    doc = "The Tessera coordinator's view of one GPU node, as its agent reports it: GPUs, health, who holds which share, measured memory and utilisation. Written by the coordinator; read-only for everyone else.",
    printcolumn(name = "Model", type_ = "string", json_path = ".status.model"),
    printcolumn(name = "GPUs", type_ = "integer", json_path = ".status.gpuCount"),
    printcolumn(name = "Healthy", type_ = "integer", json_path = ".status.healthyGpus"),
    printcolumn(name = "Free", type_ = "integer", json_path = ".status.freeGpus"),
    printcolumn(
        name = "Agent",
        type_ = "boolean",
        json_path = ".status.agent.connected"
    ),
    printcolumn(name = "Observed", type_ = "date", json_path = ".status.observedTime")
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeSpec {}

/// What the coordinator last heard from one node's agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// When the coordinator wrote this view (RFC 3339). Measurements may be this old or
    /// older: the coordinator bounds how often it writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_time: Option<String>,
    /// The node's agent.
    #[serde(default)]
    pub agent: AgentView,
    /// The GPUs' model (the first GPU's; `mixed` when they differ).
    #[serde(default)]
    pub model: String,
    /// Number of GPUs the agent reports.
    #[serde(default)]
    pub gpu_count: u32,
    /// Number of those that are healthy.
    #[serde(default)]
    pub healthy_gpus: u32,
    /// Healthy GPUs no share is held on, as the agent last reported.
    #[serde(default)]
    pub free_gpus: u32,
    /// Every GPU in index order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuView>,
}

/// The node's agent as the coordinator sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    /// A stream from the agent is open on the leading coordinator now.
    #[serde(default)]
    pub connected: bool,
    /// The agent's build version.
    #[serde(default)]
    pub version: String,
    /// `nvidia.com/gpu` slots the agent advertises per healthy GPU (the node's capacity is
    /// this times its GPUs).
    #[serde(default)]
    pub shares_per_gpu: u32,
}

/// One GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    /// Device index on the node.
    pub index: u32,
    /// Device UUID (`GPU-…`), the name assignments use.
    pub uuid: String,
    /// Model name.
    pub model: String,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// False once the agent reported the GPU unhealthy.
    pub healthy: bool,
    /// Why it is unhealthy (`XID 79`, …); empty when healthy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_reason: String,
    /// GPUs with the same island are NVLink-connected; absent for PCIe only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_island: Option<u32>,
    /// MIG instances' profiles when the GPU is in MIG mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profiles: Option<Vec<String>>,
    /// Memory in use on the whole GPU (every process, a pod's or not), in MiB.
    #[serde(default)]
    pub used_memory_mib: u64,
    /// Utilisation of the whole GPU, percent.
    #[serde(default)]
    pub utilization_percent: u32,
    /// Every share held on the GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareView>,
}

/// One container's share of a GPU, as the agent granted and measured it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShareView {
    /// Pod UID (empty when the agent could not tell).
    #[serde(default)]
    pub pod_uid: String,
    /// Pod namespace.
    #[serde(default)]
    pub namespace: String,
    /// Pod name.
    #[serde(default)]
    pub pod: String,
    /// Container name.
    #[serde(default)]
    pub container: String,
    /// Granted compute, percent of the GPU (100 = the whole GPU).
    #[serde(default)]
    pub compute_percent: u32,
    /// Granted memory in MiB (the GPU's whole memory for a whole GPU).
    #[serde(default)]
    pub memory_mib: u64,
    /// Memory the pod's processes use on this GPU, as last measured, in MiB.
    #[serde(default)]
    pub measured_memory_mib: u64,
    /// The pod's processes' utilisation of this GPU, as last measured, percent.
    #[serde(default)]
    pub measured_utilization_percent: u32,
    /// The MIG instance's UUID when the share is one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mig_instance: String,
}
