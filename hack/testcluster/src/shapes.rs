//! Simulated GPU machines for the cluster tests, in the `hack/gpus` format that both the
//! agent's simulated backend and the simulator read (`tessera-gpushape`).
//!
//! A shape made here has no `name`: the agent then names the machine after the file (the
//! node name), which gives every node its own GPU UUIDs, as distinct physical cards have.

use std::fmt::Write as _;

/// A machine of identical 80 GB A100s, built up and written out as YAML.
#[derive(Clone, Debug)]
pub struct A100s {
    gpus: u32,
    nvlink_pairs: bool,
    numa_split: bool,
    cpu_milli: u64,
    memory_mib: u64,
}

impl A100s {
    /// `gpus` cards on NUMA node 0 and no NVLink, in a host of 32 cores per card (at most
    /// 256) and 256 GiB of memory per card (at most 2 TiB): enough that CPU and memory never
    /// decide a GPU test.
    pub fn new(gpus: u32) -> A100s {
        A100s {
            gpus,
            nvlink_pairs: false,
            numa_split: false,
            cpu_milli: u64::from(gpus.clamp(1, 8)) * 32_000,
            memory_mib: u64::from(gpus.clamp(1, 8)) * 262_144,
        }
    }

    /// NVLink bridges in pairs (0-1, 2-3, ...) and nothing else, so a two-GPU pod is
    /// NVLink-connected only when it lands on a pair.
    pub fn nvlink_pairs(mut self) -> A100s {
        self.nvlink_pairs = true;
        self
    }

    /// The first half of the cards on NUMA node 0, the rest on node 1.
    pub fn numa_split(mut self) -> A100s {
        self.numa_split = true;
        self
    }

    /// The host's CPU (millicores) and memory (MiB) as the simulator sees them.
    pub fn host(mut self, cpu_milli: u64, memory_mib: u64) -> A100s {
        self.cpu_milli = cpu_milli;
        self.memory_mib = memory_mib;
        self
    }

    /// The shape file's text.
    pub fn yaml(&self) -> String {
        let mut s = format!(
            "cpu_milli: {}\nmemory_mib: {}\n",
            self.cpu_milli, self.memory_mib
        );
        if self.nvlink_pairs && self.gpus > 1 {
            s.push_str("nvlinks:\n");
            for a in (0..self.gpus - 1).step_by(2) {
                let _ = writeln!(s, "  - {{a: {a}, b: {}, links: 12}}", a + 1);
            }
        }
        s.push_str("gpus:\n");
        for i in 0..self.gpus {
            let numa = u32::from(self.numa_split && i >= self.gpus / 2);
            let _ = writeln!(
                s,
                "  - {{model: A100-80GB, memory_mib: 81920, numa: {numa}, pci_bus_id: \"0000:{:02x}:00.0\"}}",
                i + 1
            );
        }
        s
    }
}
