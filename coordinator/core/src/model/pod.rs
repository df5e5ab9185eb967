//! Pods: requests, GPU shares, isolation, and their current placement.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::constraints::PodConstraints;

/// How much of each requested GPU a pod wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuShare {
    /// Whole, exclusive GPUs.
    Whole,
    /// That share (milli-GPU, 1..=1000) of memory and compute of each GPU.
    Fraction(u32),
    /// That much memory (MiB) of each GPU; compute share proportional to memory.
    MemoryMib(u64),
}

/// The GPU part of a pod's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuRequest {
    /// Number of GPUs (0 = CPU-only pod).
    pub count: u32,
    /// Share of each GPU.
    pub per_gpu: GpuShare,
}

impl GpuRequest {
    /// No GPU.
    pub const NONE: GpuRequest = GpuRequest {
        count: 0,
        per_gpu: GpuShare::Whole,
    };
}

pub use tessera_contract::{Assignment, ContainerAssignment, GpuSlice, Isolation};

/// A malformed user input the cluster layer found while reading the pod; the core reports it as
/// the pending reason instead of scheduling the pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputError {
    /// The offending field (e.g. `tessera.dev/gpu-fraction`).
    pub field: String,
    /// What is wrong and which form is accepted.
    pub message: String,
}

/// Where a bound or running pod is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Node name.
    pub node: String,
    /// GPU assignment; empty for pods of other schedulers (then the core assumes whole free
    /// GPUs, lowest index first, as the agent hands them out).
    pub assignment: Assignment,
}

/// A pod as the scheduler sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pod {
    /// Kubernetes UID (unique).
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Leaf queue name.
    pub queue: String,
    /// PodGroup name (in the pod's namespace), if any.
    pub group: Option<String>,
    /// `tessera.dev/min-member` shorthand when no PodGroup object exists.
    pub min_member: Option<u32>,
    /// Priority (from the priority class).
    pub priority: i32,
    /// Whether the pod may be evicted by reclaim, preemption or consolidation.
    pub preemptible: bool,
    /// CPU request in milli-cores.
    pub cpu_milli: u64,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// GPU request.
    pub gpu: GpuRequest,
    /// Acceptable GPU models (empty = any).
    pub gpu_models: Vec<String>,
    /// Node selector: labels a node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// Enforcement mode.
    pub isolation: Isolation,
    /// Name of the container that receives the GPUs.
    pub gpu_container: String,
    /// Current placement: `Some` once bound (running or starting).
    pub placement: Option<Placement>,
    /// Creation time (seconds, logical clock of the snapshot).
    pub created: u64,
    /// Being deleted: still holds its resources, is never a victim.
    pub terminating: bool,
    /// Scheduled by another scheduler: consumes capacity, is never moved or evicted.
    pub owned_by_other_scheduler: bool,
    /// What recreates the pod once it is evicted (`ReplicaSet web-5d8f`: its controller owner
    /// reference); `None` for a bare pod, which nothing recreates and which is therefore never
    /// evicted to be "moved" (consolidation), only reclaimed or preempted, and told so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
    /// Malformed inputs found while reading the pod.
    pub input_errors: Vec<InputError>,
    /// Taints tolerated, affinities, spread, ports, extended resources, gates.
    #[serde(default)]
    pub constraints: PodConstraints,
}

impl Pod {
    /// A pending CPU-less, GPU-less pod `uid` in queue `queue`, namespace `default`, priority 0
    /// (preemptible, as the spec's default below 100); refine with the builder methods.
    pub fn new(uid: &str, queue: &str) -> Pod {
        Pod {
            uid: uid.to_string(),
            namespace: "default".to_string(),
            name: uid.to_string(),
            queue: queue.to_string(),
            group: None,
            min_member: None,
            priority: 0,
            preemptible: true,
            cpu_milli: 0,
            memory_mib: 0,
            gpu: GpuRequest::NONE,
            gpu_models: Vec::new(),
            node_selector: BTreeMap::new(),
            isolation: Isolation::Watchdog,
            gpu_container: "main".to_string(),
            placement: None,
            created: 0,
            terminating: false,
            owned_by_other_scheduler: false,
            controller: None,
            input_errors: Vec::new(),
            constraints: PodConstraints::default(),
        }
    }

    /// Requests `count` whole GPUs.
    pub fn gpus(mut self, count: u32) -> Pod {
        self.gpu = GpuRequest {
            count,
            per_gpu: GpuShare::Whole,
        };
        self
    }

    /// Requests `milli`/1000 of one GPU.
    pub fn fraction(mut self, milli: u32) -> Pod {
        self.gpu = GpuRequest {
            count: 1,
            per_gpu: GpuShare::Fraction(milli),
        };
        self
    }

    /// Requests `mib` of memory on each of `count` GPUs.
    pub fn gpu_memory(mut self, count: u32, mib: u64) -> Pod {
        self.gpu = GpuRequest {
            count,
            per_gpu: GpuShare::MemoryMib(mib),
        };
        self
    }

    /// Sets CPU (milli-cores) and memory (MiB) requests.
    pub fn cpu(mut self, cpu_milli: u64, memory_mib: u64) -> Pod {
        self.cpu_milli = cpu_milli;
        self.memory_mib = memory_mib;
        self
    }

    /// Gives the pod a controller that recreates it when evicted (`kind name`, e.g.
    /// `ReplicaSet web`).
    pub fn controlled_by(mut self, controller: &str) -> Pod {
        self.controller = Some(controller.to_string());
        self
    }

    /// Puts the pod in PodGroup `group`.
    pub fn group(mut self, group: &str) -> Pod {
        self.group = Some(group.to_string());
        self
    }

    /// Sets priority and derives preemptibility the way the spec defaults it (below 100).
    pub fn priority(mut self, priority: i32) -> Pod {
        self.priority = priority;
        self.preemptible = priority < 100;
        self
    }

    /// Overrides preemptibility.
    pub fn preemptible(mut self, preemptible: bool) -> Pod {
        self.preemptible = preemptible;
        self
    }

    /// Sets the creation time.
    pub fn created(mut self, at: u64) -> Pod {
        self.created = at;
        self
    }

    /// Marks the pod bound to `node` with no explicit assignment (the core assigns the GPUs the
    /// agent would: lowest-index fitting ones).
    pub fn on_node(mut self, node: &str) -> Pod {
        self.placement = Some(Placement {
            node: node.to_string(),
            assignment: Assignment::default(),
        });
        self
    }

    /// Marks the pod bound to `node` with an explicit assignment.
    pub fn bound(mut self, node: &str, assignment: Assignment) -> Pod {
        self.placement = Some(Placement {
            node: node.to_string(),
            assignment,
        });
        self
    }

    /// Requires one of these GPU models.
    pub fn models(mut self, models: &[&str]) -> Pod {
        self.gpu_models = models.iter().map(|m| m.to_string()).collect();
        self
    }

    /// Whether the pod is bound to a node.
    pub fn is_bound(&self) -> bool {
        self.placement.is_some()
    }
}
