//! The limits the watchdog holds pods to: per pod and GPU, the memory limit and compute
//! share granted to its containers, with the pod's UID (which names its cgroups) and its
//! isolation mode — all as the ledger recorded them at Allocate. Nothing here reads the
//! assignment source: a pod's owner editing its annotations later changes none of it.

use std::collections::BTreeMap;

use crate::ledger::{Ledger, PodRef};
use tessera_contract::Isolation;
use tessera_contract::PodUid;

/// What one pod may use of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLimit {
    /// Namespace and name of the pod, as the ledger records it (for Events and `status`).
    pub pod: PodRef,
    /// Its UID, which names its cgroups (how the watchdog finds its processes).
    pub pod_uid: String,
    /// UUID of the GPU these limits are on.
    pub gpu_uuid: String,
    /// Memory limit, MiB (summed over the pod's containers on this GPU).
    pub memory_mib: u64,
    /// Compute share, milli-GPU (summed likewise, at most 1000).
    pub compute_milli: u32,
    /// How the limits are enforced: the strictest its containers were allocated with, so
    /// that one container recorded `watchdog` keeps the pod watched.
    pub isolation: Isolation,
}

/// Which of two recorded modes a pod's limit on one GPU is enforced in: the watchdog wins,
/// so a pod is never less enforced than any of its containers was allocated.
fn stricter(a: Isolation, b: Isolation) -> Isolation {
    if a == Isolation::Watchdog || b == Isolation::Watchdog {
        Isolation::Watchdog
    } else if a == Isolation::None {
        b
    } else {
        a
    }
}

/// The limits of every pod holding a share of one of `gpus`, from the ledger alone.
/// Allocations whose pod or UID is not known yet are left out: their processes cannot be
/// attributed, so they are shown as not enforced.
pub fn pod_limits(ledger: &Ledger, gpus: &[&str]) -> Vec<PodLimit> {
    let mut out: BTreeMap<(PodUid, String), PodLimit> = BTreeMap::new();
    for a in ledger.allocations() {
        let (Some(pod), Some(uid)) = (&a.pod, &a.pod_uid) else {
            continue;
        };
        for g in a.grants.iter().filter(|g| gpus.contains(&g.uuid.as_str())) {
            let entry = out
                .entry((uid.clone(), g.uuid.clone()))
                .or_insert_with(|| PodLimit {
                    pod: pod.clone(),
                    pod_uid: uid.as_str().to_owned(),
                    gpu_uuid: g.uuid.clone(),
                    memory_mib: 0,
                    compute_milli: 0,
                    isolation: a.isolation,
                });
            entry.memory_mib = entry.memory_mib.saturating_add(g.memory_mib);
            entry.compute_milli = entry
                .compute_milli
                .saturating_add(g.compute_milli)
                .min(1000);
            entry.isolation = stricter(entry.isolation, a.isolation);
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Allocation, Grant, Origin};

    /// One container's allocation: (pod name, UID; `None` for no pod, `""` for an unknown
    /// UID), container, GPU, MiB, milli, isolation.
    type Row<'a> = (
        Option<(&'a str, &'a str)>,
        &'a str,
        &'a str,
        u64,
        u32,
        Isolation,
    );

    fn ledger_of(rows: &[Row<'_>]) -> Ledger {
        let mut ledger = Ledger::in_memory();
        for &(pod, container, uuid, mib, milli, isolation) in rows {
            ledger
                .insert(Allocation {
                    id: 0,
                    resource: "nvidia.com/gpu".into(),
                    slots: vec![format!("{uuid}-{container}")],
                    grants: vec![Grant {
                        uuid: uuid.into(),
                        memory_mib: mib,
                        compute_milli: milli,
                    }],
                    pod: pod.map(|(name, _)| PodRef::new("ml", name)),
                    pod_uid: pod.and_then(|(_, uid)| PodUid::new(uid).ok()),
                    container: Some(container.into()),
                    isolation,
                    origin: Origin::Assigned,
                    at_unix_ms: 0,
                })
                .unwrap();
        }
        ledger
    }

    #[test]
    fn sums_containers_and_skips_what_cannot_be_attributed() {
        let a = Some(("a", "uid-a"));
        let ledger = ledger_of(&[
            (a, "c1", "GPU-0", 1000, 300, Isolation::Mps),
            (a, "c2", "GPU-0", 500, 200, Isolation::Mps),
            (a, "c3", "MIG-x", 500, 200, Isolation::Mps),
            (
                Some(("b", "")),
                "c1",
                "GPU-0",
                100,
                100,
                Isolation::Watchdog,
            ),
            (None, "c1", "GPU-0", 100, 100, Isolation::Watchdog),
        ]);
        let limits = pod_limits(&ledger, &["GPU-0", "GPU-1"]);
        assert_eq!(
            limits,
            vec![PodLimit {
                pod: PodRef::new("ml", "a"),
                pod_uid: "uid-a".into(),
                gpu_uuid: "GPU-0".into(),
                memory_mib: 1500,
                compute_milli: 500,
                isolation: Isolation::Mps,
            }]
        );
    }

    #[test]
    fn a_pod_is_as_enforced_as_its_most_enforced_container_and_pods_of_one_name_stay_apart() {
        let (a, again) = (Some(("a", "uid-a")), Some(("a", "uid-a2")));
        let ledger = ledger_of(&[
            (a, "c1", "GPU-0", 100, 100, Isolation::None),
            (a, "c2", "GPU-0", 100, 100, Isolation::Watchdog),
            // The same name, another pod (created again): its own limit.
            (again, "c1", "GPU-0", 100, 100, Isolation::None),
        ]);
        let limits = pod_limits(&ledger, &["GPU-0"]);
        let got: Vec<(&str, Isolation, u64)> = limits
            .iter()
            .map(|l| (l.pod_uid.as_str(), l.isolation, l.memory_mib))
            .collect();
        assert_eq!(
            got,
            [
                ("uid-a", Isolation::Watchdog, 200),
                ("uid-a2", Isolation::None, 100)
            ]
        );
    }
}
