//! Resource vectors in the units the scheduler accounts in.

use serde::{Deserialize, Serialize};

/// One schedulable resource dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Resource {
    /// GPU, accounted in milli-GPU (1000 = one whole GPU).
    Gpu,
    /// CPU in milli-cores.
    Cpu,
    /// Host memory in MiB.
    Memory,
}

impl Resource {
    /// All resources in index order.
    pub const ALL: [Resource; 3] = [Resource::Gpu, Resource::Cpu, Resource::Memory];

    /// Position in a `[_; 3]` array.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name as used in the Queue CRD (`gpu`, `cpu`, `memory`).
    pub fn name(self) -> &'static str {
        match self {
            Resource::Gpu => "gpu",
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        }
    }
}

/// An amount of every resource: GPU in milli-GPU, CPU in milli-cores, memory in MiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// Milli-GPU (1000 = one GPU).
    pub gpu_milli: u64,
    /// Milli-cores.
    pub cpu_milli: u64,
    /// MiB.
    pub memory_mib: u64,
}

impl Resources {
    /// Builds a vector from its three amounts.
    pub fn new(gpu_milli: u64, cpu_milli: u64, memory_mib: u64) -> Resources {
        Resources {
            gpu_milli,
            cpu_milli,
            memory_mib,
        }
    }

    /// Amount of one resource.
    pub fn get(&self, r: Resource) -> u64 {
        match r {
            Resource::Gpu => self.gpu_milli,
            Resource::Cpu => self.cpu_milli,
            Resource::Memory => self.memory_mib,
        }
    }

    /// The three amounts as floating point, in index order.
    pub fn as_f64(&self) -> [f64; 3] {
        [
            self.gpu_milli as f64,
            self.cpu_milli as f64,
            self.memory_mib as f64,
        ]
    }

    /// Component-wise sum.
    pub fn add(&mut self, o: &Resources) {
        self.gpu_milli += o.gpu_milli;
        self.cpu_milli += o.cpu_milli;
        self.memory_mib += o.memory_mib;
    }

    /// Component-wise difference, saturating at zero (the cluster may report more in use than
    /// exists, e.g. after a node shrank; accounting must not wrap).
    pub fn sub(&mut self, o: &Resources) {
        self.gpu_milli = self.gpu_milli.saturating_sub(o.gpu_milli);
        self.cpu_milli = self.cpu_milli.saturating_sub(o.cpu_milli);
        self.memory_mib = self.memory_mib.saturating_sub(o.memory_mib);
    }

    /// Whether every component is zero.
    pub fn is_zero(&self) -> bool {
        self.gpu_milli == 0 && self.cpu_milli == 0 && self.memory_mib == 0
    }
}
