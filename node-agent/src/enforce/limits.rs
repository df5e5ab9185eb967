//! The limits the watchdog holds pods to: per pod and GPU, the memory limit and compute
//! share granted to its containers (from the ledger), with the pod's UID (which names
//! its cgroups) and its isolation mode (from the assignment source).

use std::collections::BTreeMap;

use crate::assignments::AssignmentSource;
use crate::ledger::{Ledger, PodRef};
use tessera_contract::Isolation;

/// What one pod may use of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLimit {
    /// Namespace and name of the pod, as the ledger records it.
    pub pod: PodRef,
    /// Its UID, which names its cgroups (how the watchdog finds its processes).
    pub pod_uid: String,
    /// UUID of the GPU these limits are on.
    pub gpu_uuid: String,
    /// Memory limit, MiB (summed over the pod's containers on this GPU).
    pub memory_mib: u64,
    /// Compute share, milli-GPU (summed likewise, at most 1000).
    pub compute_milli: u32,
    /// How the limits are enforced.
    pub isolation: Isolation,
}

/// The limits of every pod holding a share of one of `gpus`. Allocations whose pod or
/// UID is not known yet are left out: their processes cannot be attributed, so they
/// are shown as not enforced.
pub fn pod_limits(ledger: &Ledger, source: &dyn AssignmentSource, gpus: &[&str]) -> Vec<PodLimit> {
    let mut out: BTreeMap<(String, String), PodLimit> = BTreeMap::new();
    for a in ledger.allocations() {
        let Some(pod) = &a.pod else { continue };
        let Some(uid) = source.pod_uid(pod) else {
            continue;
        };
        let isolation = source.isolation(pod).unwrap_or_default();
        for g in a.grants.iter().filter(|g| gpus.contains(&g.uuid.as_str())) {
            let entry = out
                .entry((uid.clone(), g.uuid.clone()))
                .or_insert_with(|| PodLimit {
                    pod: pod.clone(),
                    pod_uid: uid.clone(),
                    gpu_uuid: g.uuid.clone(),
                    memory_mib: 0,
                    compute_milli: 0,
                    isolation,
                });
            entry.memory_mib += g.memory_mib;
            entry.compute_milli = (entry.compute_milli + g.compute_milli).min(1000);
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignments::StaticAssignments;
    use crate::ledger::{Allocation, Grant, Origin};

    fn alloc(pod: Option<PodRef>, container: &str, uuid: &str, mib: u64, milli: u32) -> Allocation {
        Allocation {
            id: 0,
            resource: "nvidia.com/gpu".into(),
            slots: vec![format!("{uuid}-{container}")],
            grants: vec![Grant {
                uuid: uuid.into(),
                memory_mib: mib,
                compute_milli: milli,
            }],
            pod,
            container: Some(container.into()),
            origin: Origin::Assigned,
            at_unix_ms: 0,
        }
    }

    #[test]
    fn sums_containers_and_skips_what_cannot_be_attributed() {
        let a = PodRef::new("ml", "a");
        let b = PodRef::new("ml", "b");
        let source = StaticAssignments::new();
        source.set_uid(a.clone(), "uid-a");
        source.set_isolation(a.clone(), Isolation::Mps);
        let mut ledger = Ledger::in_memory();
        for x in [
            alloc(Some(a.clone()), "c1", "GPU-0", 1000, 300),
            alloc(Some(a.clone()), "c2", "GPU-0", 500, 200),
            alloc(Some(a.clone()), "c3", "MIG-x", 500, 200),
            alloc(Some(b.clone()), "c1", "GPU-0", 100, 100),
            alloc(None, "c1", "GPU-0", 100, 100),
        ] {
            ledger.insert(x).unwrap();
        }
        let limits = pod_limits(&ledger, &source, &["GPU-0", "GPU-1"]);
        assert_eq!(
            limits,
            vec![PodLimit {
                pod: a,
                pod_uid: "uid-a".into(),
                gpu_uuid: "GPU-0".into(),
                memory_mib: 1500,
                compute_milli: 500,
                isolation: Isolation::Mps,
            }]
        );
    }
}
