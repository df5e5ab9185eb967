//! Queues: a hierarchy with deserved quota, over-quota weight and limit per resource (and per
//! GPU model), and each queue's decayed usage.

use serde::{Deserialize, Serialize};

/// Quota settings of one resource of one queue. Units: GPU in GPUs (may be fractional), CPU in
/// milli-cores, memory in MiB.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueResource {
    /// Deserved amount, granted before any over-quota share.
    pub quota: f64,
    /// Weight for sharing what remains after every queue's deserved quota.
    pub over_quota_weight: f64,
    /// Hard cap; negative (-1) = none.
    pub limit: f64,
}

impl Default for QueueResource {
    fn default() -> Self {
        QueueResource {
            quota: 0.0,
            over_quota_weight: 1.0,
            limit: -1.0,
        }
    }
}

/// A queue (any depth; only leaves take pods).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Queue {
    /// Name (unique, cluster-scoped).
    pub name: String,
    /// Parent queue; `None` = top level.
    pub parent: Option<String>,
    /// Higher-priority siblings receive quota and over-quota share first.
    pub priority: i32,
    /// GPU settings (GPUs).
    pub gpu: QueueResource,
    /// CPU settings (milli-cores).
    pub cpu: QueueResource,
    /// Memory settings (MiB).
    pub memory: QueueResource,
    /// GPU settings per GPU model (GPUs of that model), besides the total in `gpu`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<ModelQuota>,
}

/// A queue's GPU settings for one GPU model (numbers of GPUs of that model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelQuota {
    /// The model key, as [`tessera_contract::gpu_model::key_of`] makes it of a GPU's model.
    pub model: String,
    /// Deserved GPUs of the model.
    pub quota: f64,
    /// Weight for the model's GPUs beyond every queue's quota of them; `None`: the queue's
    /// GPU over-quota weight.
    pub over_quota_weight: Option<f64>,
    /// Hard cap in GPUs of the model; negative (-1) = none.
    pub limit: f64,
}

/// A queue's usage history: resource-seconds decayed with the cycle's half-life, as of `at`.
/// An input of the snapshot and an output of the cycle (`Decisions::usage`), so the core
/// never reads a clock: the caller keeps the record from cycle to cycle (and across
/// restarts, in the Queue's status).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueUsage {
    /// Queue name.
    pub queue: String,
    /// Logical time (seconds) the amounts are as of.
    pub at: u64,
    /// Decayed resource-seconds in accounting units: milli-GPU·s, milli-core·s, MiB·s.
    pub used: [f64; 3],
    /// What the queue held from `at` on, as the cycle that wrote the record left it
    /// (accounting units). `None` (a record read back from a Queue's status): the cycle
    /// takes what the queue holds in its snapshot instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding: Option<[f64; 3]>,
}

impl Queue {
    /// A top-level queue with no quota, weight 1 and no limit on every resource.
    pub fn new(name: &str) -> Queue {
        Queue {
            name: name.to_string(),
            parent: None,
            priority: 0,
            gpu: QueueResource::default(),
            cpu: QueueResource::default(),
            memory: QueueResource::default(),
            gpu_models: Vec::new(),
        }
    }

    /// Sets the quota (GPUs), weight (`None`: the GPU weight) and limit (GPUs, -1 = none) of
    /// GPU model `model` (a model key).
    pub fn gpu_model(mut self, model: &str, quota: f64, weight: Option<f64>, limit: f64) -> Queue {
        self.gpu_models.retain(|m| m.model != model);
        self.gpu_models.push(ModelQuota {
            model: model.to_string(),
            quota,
            over_quota_weight: weight,
            limit,
        });
        self
    }

    /// Sets the parent.
    pub fn parent(mut self, parent: &str) -> Queue {
        self.parent = Some(parent.to_string());
        self
    }

    /// Sets GPU quota (GPUs), over-quota weight and limit (GPUs, -1 = none).
    pub fn gpu(mut self, quota: f64, weight: f64, limit: f64) -> Queue {
        self.gpu = QueueResource {
            quota,
            over_quota_weight: weight,
            limit,
        };
        self
    }

    /// Sets CPU quota, weight and limit (milli-cores).
    pub fn cpu(mut self, quota: f64, weight: f64, limit: f64) -> Queue {
        self.cpu = QueueResource {
            quota,
            over_quota_weight: weight,
            limit,
        };
        self
    }

    /// Sets memory quota, weight and limit (MiB).
    pub fn memory(mut self, quota: f64, weight: f64, limit: f64) -> Queue {
        self.memory = QueueResource {
            quota,
            over_quota_weight: weight,
            limit,
        };
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Queue {
        self.priority = priority;
        self
    }

    /// Settings of resource `r` in accounting units (GPU converted to milli-GPU).
    pub fn settings(&self, r: super::Resource) -> QueueResource {
        match r {
            super::Resource::Gpu => QueueResource {
                quota: self.gpu.quota * 1000.0,
                over_quota_weight: self.gpu.over_quota_weight,
                limit: if self.gpu.limit < 0.0 {
                    -1.0
                } else {
                    self.gpu.limit * 1000.0
                },
            },
            super::Resource::Cpu => self.cpu,
            super::Resource::Memory => self.memory,
        }
    }
}
