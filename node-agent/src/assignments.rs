//! Where the coordinator's decisions come from.
//!
//! The coordinator writes `tessera.dev/assignment` on each pod it binds: per container,
//! the GPU UUIDs and the memory / compute share on each ([`tessera_contract::Assignment`],
//! the one definition both sides compile). An [`AssignmentSource`] lists the pods
//! bound to this node that have not started, so the device plugin can steer the kubelet
//! to their slots and answer `Allocate` with exactly their share; which of their
//! containers are already allocated is the ledger's to say, never the source's.
//! The sources: the coordinator's stream ([`crate::coordinator_pods`], the default), a
//! read-only pod watch ([`crate::kube_assignments`]), [`StaticAssignments`] for tests,
//! and [`NoAssignments`] (`--no-kube`): every request then gets whole free GPUs.

use parking_lot::Mutex;

use tessera_contract::{Assignment, GpuSlice};

use crate::ledger::PodRef;

/// A container of a pending pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingContainer {
    /// Container name.
    pub name: String,
    /// How many `nvidia.com/gpu` slots it requests (its limit).
    pub slots: u32,
    /// Its assigned GPUs; `None` for pods without a Tessera assignment.
    pub gpus: Option<Vec<GpuSlice>>,
}

/// A pod bound to this node that requests `nvidia.com/gpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPod {
    /// Namespace and name of the pod, as assignments and the ledger key it.
    pub pod: PodRef,
    /// Creation time (ms since epoch): the kubelet admits pods oldest first, so ties
    /// between indistinguishable requests go to the oldest pod.
    pub created_unix_ms: u64,
    /// Containers requesting GPUs.
    pub containers: Vec<PendingContainer>,
}

/// A source of assignments for this node's pods.
pub trait AssignmentSource: Send + Sync + 'static {
    /// `none`, `static`, `kube`.
    fn kind(&self) -> &'static str;

    /// Pods bound to this node that request `nvidia.com/gpu` and have neither started nor
    /// begun terminating, oldest first: the pods an Allocate can be for. Their containers
    /// already in the ledger are allocated; the others wait for the kubelet.
    fn pending(&self) -> Vec<PendingPod>;

    /// The assignment of `pod`, if it has one (used when re-learning allocations).
    fn assignment_of(&self, pod: &PodRef) -> Option<Assignment> {
        let _ = pod;
        None
    }

    /// The UID of `pod` (`metadata.uid`), which names its cgroups; `None` when unknown,
    /// and then its processes cannot be told apart from unknown ones.
    fn pod_uid(&self, pod: &PodRef) -> Option<String> {
        let _ = pod;
        None
    }

    /// How `pod`'s limits are enforced (`tessera.dev/isolation`); `None` when the
    /// source does not know, which means the default, the watchdog.
    fn isolation(&self, pod: &PodRef) -> Option<tessera_contract::Isolation> {
        let _ = pod;
        None
    }

    /// Pods that left this node (deleted, or finished) as the source learns of it; the
    /// agent releases their ledger shares at once instead of at the next reconcile, so a
    /// pod the coordinator places on the freed share is not refused as an overcommit.
    /// `None` when the source cannot tell (the periodic reconcile still frees them).
    /// Taken once; later calls return `None`.
    fn departures(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<PodRef>> {
        None
    }
}

/// `--no-kube`: no cluster, no assignments; every request gets whole free GPUs.
#[derive(Debug, Default)]
pub struct NoAssignments;

impl AssignmentSource for NoAssignments {
    fn kind(&self) -> &'static str {
        "none"
    }

    fn pending(&self) -> Vec<PendingPod> {
        Vec::new()
    }
}

/// Assignments held in memory and set by the caller: for tests and demos that play
/// the coordinator without a cluster.
#[derive(Debug, Default)]
pub struct StaticAssignments {
    inner: Mutex<StaticInner>,
}

#[derive(Debug, Default)]
struct StaticInner {
    pods: Vec<PendingPod>,
    assignments: Vec<(PodRef, Assignment)>,
    started: Vec<PodRef>,
    uids: Vec<(PodRef, String)>,
    isolation: Vec<(PodRef, tessera_contract::Isolation)>,
}

impl StaticAssignments {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a pod bound to this node whose containers request `slots` each and carry
    /// `assignment` (containers are matched by name; a container missing from it has
    /// no assignment).
    pub fn bind(
        &self,
        pod: PodRef,
        created_unix_ms: u64,
        slots: &[(&str, u32)],
        assignment: Option<Assignment>,
    ) {
        let containers = slots
            .iter()
            .map(|(name, n)| PendingContainer {
                name: (*name).to_owned(),
                slots: *n,
                gpus: assignment.as_ref().and_then(|a| {
                    a.containers
                        .iter()
                        .find(|c| c.container == *name)
                        .map(|c| c.gpus.clone())
                }),
            })
            .collect();
        let mut inner = self.inner.lock();
        if let Some(a) = assignment {
            inner.assignments.push((pod.clone(), a));
        }
        inner.pods.push(PendingPod {
            pod,
            created_unix_ms,
            containers,
        });
    }

    /// Gives `pod` the UID `uid` (as the API server would in `metadata.uid`).
    pub fn set_uid(&self, pod: PodRef, uid: impl Into<String>) {
        let mut inner = self.inner.lock();
        inner.uids.retain(|(p, _)| *p != pod);
        inner.uids.push((pod, uid.into()));
    }

    /// Gives `pod` the isolation mode `mode` (as its `tessera.dev/isolation` annotation would).
    pub fn set_isolation(&self, pod: PodRef, mode: tessera_contract::Isolation) {
        let mut inner = self.inner.lock();
        inner.isolation.retain(|(p, _)| *p != pod);
        inner.isolation.push((pod, mode));
    }

    /// Drops `pod`, as when it is deleted.
    pub fn unbind(&self, pod: &PodRef) {
        let mut inner = self.inner.lock();
        inner.pods.retain(|p| p.pod != *pod);
        inner.assignments.retain(|(p, _)| p != pod);
    }

    /// Marks `pod` started (as its container statuses would): it is no longer pending.
    pub fn set_started(&self, pod: &PodRef) {
        self.inner.lock().started.push(pod.clone());
    }
}

impl AssignmentSource for StaticAssignments {
    fn kind(&self) -> &'static str {
        "static"
    }

    fn pending(&self) -> Vec<PendingPod> {
        let inner = self.inner.lock();
        let mut pods: Vec<PendingPod> = inner
            .pods
            .iter()
            .filter(|p| !inner.started.contains(&p.pod))
            .cloned()
            .collect();
        pods.sort_by(|a, b| (a.created_unix_ms, &a.pod).cmp(&(b.created_unix_ms, &b.pod)));
        pods
    }

    fn assignment_of(&self, pod: &PodRef) -> Option<Assignment> {
        self.inner
            .lock()
            .assignments
            .iter()
            .find(|(p, _)| p == pod)
            .map(|(_, a)| a.clone())
    }

    fn pod_uid(&self, pod: &PodRef) -> Option<String> {
        self.inner
            .lock()
            .uids
            .iter()
            .find(|(p, _)| p == pod)
            .map(|(_, u)| u.clone())
    }

    fn isolation(&self, pod: &PodRef) -> Option<tessera_contract::Isolation> {
        self.inner
            .lock()
            .isolation
            .iter()
            .find(|(p, _)| p == pod)
            .map(|(_, m)| *m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_source_lists_pods_oldest_first_until_they_start() {
        let s = StaticAssignments::new();
        s.bind(PodRef::new("ns", "b"), 2, &[("c", 1)], None);
        s.bind(PodRef::new("ns", "a"), 1, &[("c", 1), ("d", 2)], None);
        assert_eq!(s.pending()[0].pod.name, "a");
        assert_eq!(s.pending()[0].containers.len(), 2);
        s.set_started(&PodRef::new("ns", "a"));
        assert_eq!(s.pending().len(), 1);
        assert_eq!(s.pending()[0].pod.name, "b");
    }
}
