//! Per-pod measured usage of one GPU: the backend's per-process readings, attributed
//! to pods through their cgroups ([`super::cgroup`]) and summed per pod UID.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::assignments::AssignmentSource;
use crate::gpu::GpuProcess;

/// Where process cgroups are read: `/proc` in the DaemonSet (host PID namespace).
pub const DEFAULT_PROC_ROOT: &str = "/proc";

/// What one pod's processes use on one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// Framebuffer memory, MiB.
    pub memory_used_mib: u64,
    /// SM utilisation, percent of the GPU (summed over processes, capped at 100).
    pub sm_percent: u32,
    /// Number of processes.
    pub processes: u32,
}

/// What the processes on one GPU use, per pod, plus those no pod could be found for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// Keyed by pod UID.
    pub pods: BTreeMap<String, PodUsage>,
    /// Processes whose cgroup names no pod: host processes, vanished ones, unknown
    /// runtimes. Reported, never acted on.
    pub unknown: PodUsage,
}

/// Attributes GPU processes to pods by reading their cgroups under a proc root.
#[derive(Debug, Clone)]
pub struct ProcessAttribution {
    proc_root: PathBuf,
}

impl Default for ProcessAttribution {
    fn default() -> Self {
        Self::new(DEFAULT_PROC_ROOT)
    }
}

impl ProcessAttribution {
    /// Reads cgroups under `proc_root` (a fake tree in tests).
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
        }
    }

    /// The proc root in use.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Sums `processes` (one GPU's list from the backend) per pod.
    pub fn usage(&self, processes: &[GpuProcess]) -> GpuUsage {
        let mut out = GpuUsage::default();
        for p in processes {
            let slot = match super::cgroup::pod_of_pid(&self.proc_root, p.pid) {
                Some(pod) => out.pods.entry(pod.pod_uid).or_default(),
                None => &mut out.unknown,
            };
            // An unavailable figure adds nothing here; the watchdog treats it as unknown.
            slot.memory_used_mib += p.memory_used_mib.unwrap_or(0);
            slot.sm_percent = (slot.sm_percent + p.sm_percent).min(100);
            slot.processes += 1;
        }
        out
    }
}

/// Cgroup attribution (processes → pod UID) together with the pods the assignment source
/// lists as pending, for `status` and the report; the UID of a share comes from the ledger.
#[derive(Clone)]
pub struct PodMeter {
    attribution: ProcessAttribution,
    source: Arc<dyn AssignmentSource>,
}

impl PodMeter {
    /// A meter reading cgroups through `attribution` and pending pods from `source`.
    pub fn new(attribution: ProcessAttribution, source: Arc<dyn AssignmentSource>) -> Self {
        Self {
            attribution,
            source,
        }
    }

    /// Sums one GPU's processes per pod UID.
    pub fn usage(&self, processes: &[GpuProcess]) -> GpuUsage {
        self.attribution.usage(processes)
    }

    /// The pods an Allocate can still be for (see [`AssignmentSource::pending`]).
    pub fn pending_pods(&self) -> Vec<crate::assignments::PendingPod> {
        self.source.pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_per_pod_and_keeps_unknown_apart() {
        let dir = tempfile::tempdir().unwrap();
        let uid = "0b7e6f2a-3c4d-4e5f-8a9b-0c1d2e3f4a5b";
        let id = "a".repeat(64);
        for pid in [10, 11] {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("cgroup"),
                format!("12:memory:/kubepods/burstable/pod{uid}/{id}\n"),
            )
            .unwrap();
        }
        let proc = |pid, memory_used_mib, sm_percent| GpuProcess {
            pid,
            memory_used_mib,
            sm_percent,
        };
        let usage = ProcessAttribution::new(dir.path()).usage(&[
            proc(10, Some(1000), 30),
            proc(11, Some(500), 80),
            proc(99, Some(64), 5),
        ]);
        assert_eq!(
            usage.pods.get(uid),
            Some(&PodUsage {
                memory_used_mib: 1500,
                sm_percent: 100,
                processes: 2
            })
        );
        assert_eq!(
            usage.unknown,
            PodUsage {
                memory_used_mib: 64,
                sm_percent: 5,
                processes: 1
            }
        );
    }
}
