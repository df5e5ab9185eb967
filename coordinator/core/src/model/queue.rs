//! Queues: a hierarchy with deserved quota, over-quota weight and limit per resource.

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
        }
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
