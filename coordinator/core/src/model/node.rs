//! Nodes and their GPUs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::constraints::NodeConstraints;

/// A GPU as the node agent reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// Stable device UUID (`GPU-...`).
    pub uuid: String,
    /// Device index on the node.
    pub index: u32,
    /// Model name (e.g. `H100`, `T4`).
    pub model: String,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// NVLink island: GPUs with the same island id are NVLink-connected; `None` = PCIe only.
    pub nvlink_island: Option<u32>,
    /// False once the agent reported the device unhealthy (XID); nothing new lands on it.
    pub healthy: bool,
    /// MIG instances when the GPU is in MIG mode; such a GPU only hosts `isolation: mig` pods.
    pub mig: Option<Vec<MigInstance>>,
    /// Set while a healthy GPU must take nothing new because the node's own account of it is
    /// not settled yet (see [`Fence`]); pods already on it keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
}

/// Why a healthy GPU takes nothing new for now. The cluster layer sets these from what the
/// node's agent reports and what the node refused; the core only keeps new pods off the GPU
/// and says why in explanations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Fence {
    /// A pod bound to the node without a Tessera assignment (another scheduler's) holds GPUs
    /// the agent has not reported yet, and this idle GPU may be one of them: the agent hands
    /// such pods whole free GPUs of its own choosing.
    Unreported,
    /// The agent reports the GPU held by a pod the API server no longer shows on the node (the
    /// agent has not released it yet).
    HeldByUnknownPod,
    /// The node refused a pod assigned this GPU at admission; fenced until the agent reports the
    /// GPU free again, so the refused decision is not repeated blindly.
    Refused,
}

/// One MIG instance of a GPU in MIG mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MigInstance {
    /// Profile name (e.g. `1g.10gb`).
    pub profile: String,
    /// Memory of the instance in MiB.
    pub memory_mib: u64,
    /// Compute share of the instance in milli-GPU.
    pub compute_milli: u32,
}

impl Gpu {
    /// A healthy PCIe GPU with the given index, model and memory; the UUID is derived from
    /// `node` and `index` so tests and synthetic clusters get unique, readable ids.
    pub fn new(node: &str, index: u32, model: &str, memory_mib: u64) -> Gpu {
        Gpu {
            uuid: format!("GPU-{node}-{index}"),
            index,
            model: model.to_string(),
            memory_mib,
            nvlink_island: None,
            healthy: true,
            mig: None,
            fence: None,
        }
    }
}

/// A node of the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Node name (unique).
    pub name: String,
    /// Allocatable CPU in milli-cores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
    /// Node labels (topology levels are read from here).
    pub labels: BTreeMap<String, String>,
    /// GPUs in index order.
    pub gpus: Vec<Gpu>,
    /// False when cordoned (`spec.unschedulable`): existing pods stay, nothing new is placed
    /// unless it tolerates `node.kubernetes.io/unschedulable:NoSchedule`.
    pub schedulable: bool,
    /// Taints, pod limit and extended resources.
    #[serde(default)]
    pub constraints: NodeConstraints,
}

impl Node {
    /// A CPU-only node.
    pub fn cpu_node(name: &str, cpu_milli: u64, memory_mib: u64) -> Node {
        Node {
            name: name.to_string(),
            cpu_milli,
            memory_mib,
            labels: BTreeMap::new(),
            gpus: Vec::new(),
            schedulable: true,
            constraints: NodeConstraints::default(),
        }
    }

    /// A node with `count` identical GPUs (no NVLink), 16 cores and 256 GiB per 2 GPUs minimum
    /// 64 cores / 512 GiB, which keeps CPU from binding in GPU-focused tests; override with
    /// [`Node::with_cpu`].
    pub fn gpu_node(name: &str, count: u32, model: &str, gpu_memory_mib: u64) -> Node {
        let gpus = (0..count)
            .map(|i| Gpu::new(name, i, model, gpu_memory_mib))
            .collect();
        Node {
            gpus,
            ..Node::cpu_node(name, 128_000, 1_048_576)
        }
    }

    /// Sets CPU and memory.
    pub fn with_cpu(mut self, cpu_milli: u64, memory_mib: u64) -> Node {
        self.cpu_milli = cpu_milli;
        self.memory_mib = memory_mib;
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Node {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Groups the GPUs into NVLink islands of `size` consecutive devices (e.g. 2 = pairs,
    /// 8 = one NVSwitch domain).
    pub fn nvlink_islands(mut self, size: u32) -> Node {
        let size = size.max(1);
        for g in &mut self.gpus {
            g.nvlink_island = Some(g.index / size);
        }
        self
    }

    /// Marks GPU `index` unhealthy.
    pub fn unhealthy_gpu(mut self, index: u32) -> Node {
        if let Some(g) = self.gpus.iter_mut().find(|g| g.index == index) {
            g.healthy = false;
        }
        self
    }
}
