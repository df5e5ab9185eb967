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
use tokio::sync::watch;

use tessera_contract::{Assignment, GpuSlice, Isolation};

use crate::ledger::PodRef;
use tessera_contract::PodUid;

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
    /// The pod's UID: what the ledger and the plugin key it by.
    pub uid: PodUid,
    /// Namespace and name of the pod, for messages and for matching pod-resources.
    pub pod: PodRef,
    /// Creation time (ms since epoch): the kubelet admits pods oldest first, so ties
    /// between indistinguishable requests go to the oldest pod.
    pub created_unix_ms: u64,
    /// Its `tessera.dev/isolation` as the source sees it now: read once, when a container is
    /// allocated, and recorded in the ledger then.
    pub isolation: Isolation,
    /// Containers requesting GPUs.
    pub containers: Vec<PendingContainer>,
}

/// What a source says about the pod it lists under some namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedPod {
    /// Its UID.
    pub uid: PodUid,
    /// The coordinator's assignment; `None` for a pod another scheduler placed.
    pub assignment: Option<Assignment>,
    /// Its `tessera.dev/isolation`, the default when absent.
    pub isolation: Isolation,
}

/// Which kind of source an agent takes assignments from; it decides what a request that
/// matches no assignment may get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// No cluster (`--no-kube`): every request gets whole free GPUs.
    None,
    /// Assignments set in memory by a test.
    Static,
    /// The coordinator's stream (the default).
    Coordinator,
    /// A read-only watch on the node's pods (`--assignments kube`).
    Kube,
}

impl SourceKind {
    /// `none`, `static`, `coordinator` or `kube`, as `status` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::None => "none",
            SourceKind::Static => "static",
            SourceKind::Coordinator => "coordinator",
            SourceKind::Kube => "kube",
        }
    }
}

impl std::fmt::Display for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A source of assignments for this node's pods.
pub trait AssignmentSource: Send + Sync + 'static {
    /// Which kind of source it is.
    fn kind(&self) -> SourceKind;

    /// True once the source has its first full list of the node's pods: before that, a pod
    /// missing from it says nothing. The receiver sees every change; the default is a
    /// source that is complete from the start.
    fn synced(&self) -> watch::Receiver<bool> {
        watch::channel(true).1
    }

    /// Pods bound to this node that request `nvidia.com/gpu` and have neither started nor
    /// begun terminating, oldest first: the pods an Allocate can be for. Their containers
    /// already in the ledger are allocated; the others wait for the kubelet.
    fn pending(&self) -> Vec<PendingPod>;

    /// The pod the source lists under `pod`'s namespace and name now, if any: how a
    /// container the kubelet's pod-resources names (it reports names, not UIDs) is tied to
    /// a UID and an assignment when the ledger is re-learned.
    fn listed(&self, pod: &PodRef) -> Option<ListedPod> {
        let _ = pod;
        None
    }

    /// Pods that left this node (deleted, or finished), by UID, as the source learns of
    /// it; the agent releases their ledger shares at once instead of at the next
    /// reconcile, so a pod the coordinator places on the freed share is not refused as an
    /// overcommit. A pod created again under the same name has another UID and keeps its
    /// own shares. `None` when the source cannot tell (the periodic reconcile still frees
    /// them). Taken once; later calls return `None`.
    fn departures(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<PodUid>> {
        None
    }
}

/// `--no-kube`: no cluster, no assignments; every request gets whole free GPUs.
#[derive(Debug, Default)]
pub struct NoAssignments;

impl AssignmentSource for NoAssignments {
    fn kind(&self) -> SourceKind {
        SourceKind::None
    }

    fn pending(&self) -> Vec<PendingPod> {
        Vec::new()
    }
}

/// Assignments held in memory and set by the caller: for tests and demos that play
/// the coordinator without a cluster. Pods are addressed by namespace and name, as a test
/// writes them; each gets the UID `uid-<namespace>-<name>` unless [`StaticAssignments::set_uid`]
/// gives it another (a pod bound again after [`StaticAssignments::unbind`] is a new pod, and
/// a test that wants it told apart gives it a new UID).
#[derive(Debug, Default)]
pub struct StaticAssignments {
    inner: Mutex<Vec<StaticPod>>,
}

#[derive(Debug, Clone)]
struct StaticPod {
    pending: PendingPod,
    assignment: Option<Assignment>,
    started: bool,
}

impl StaticAssignments {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a pod bound to this node whose containers request `slots` each and carry
    /// `assignment` (containers are matched by name; a container missing from it has
    /// no assignment). A pod already bound under that name is replaced.
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
        inner.retain(|p| p.pending.pod != pod);
        inner.push(StaticPod {
            pending: PendingPod {
                uid: PodUid::new(format!("uid-{}-{}", pod.namespace, pod.name)).unwrap(),
                pod,
                created_unix_ms,
                isolation: Isolation::default(),
                containers,
            },
            assignment,
            started: false,
        });
    }

    fn with(&self, pod: &PodRef, change: impl FnOnce(&mut StaticPod)) {
        if let Some(p) = self.inner.lock().iter_mut().find(|p| p.pending.pod == *pod) {
            change(p);
        }
    }

    /// Gives the pod bound as `pod` the UID `uid` (as the API server would in `metadata.uid`).
    pub fn set_uid(&self, pod: PodRef, uid: impl Into<String>) {
        let uid = PodUid::new(uid).unwrap();
        self.with(&pod, |p| p.pending.uid = uid);
    }

    /// Gives the pod bound as `pod` the isolation mode `mode` (as its `tessera.dev/isolation`
    /// annotation would).
    pub fn set_isolation(&self, pod: PodRef, mode: Isolation) {
        self.with(&pod, |p| p.pending.isolation = mode);
    }

    /// Drops `pod`, as when it is deleted.
    pub fn unbind(&self, pod: &PodRef) {
        self.inner.lock().retain(|p| p.pending.pod != *pod);
    }

    /// Marks `pod` started (as its container statuses would): it is no longer pending.
    pub fn set_started(&self, pod: &PodRef) {
        self.with(pod, |p| p.started = true);
    }

    /// The UID of the pod bound as `pod`.
    pub fn uid(&self, pod: &PodRef) -> Option<PodUid> {
        self.inner
            .lock()
            .iter()
            .find(|p| p.pending.pod == *pod)
            .map(|p| p.pending.uid.clone())
    }
}

impl AssignmentSource for StaticAssignments {
    fn kind(&self) -> SourceKind {
        SourceKind::Static
    }

    fn pending(&self) -> Vec<PendingPod> {
        let inner = self.inner.lock();
        let mut pods: Vec<PendingPod> = inner
            .iter()
            .filter(|p| !p.started)
            .map(|p| p.pending.clone())
            .collect();
        pods.sort_by(|a, b| (a.created_unix_ms, &a.uid).cmp(&(b.created_unix_ms, &b.uid)));
        pods
    }

    fn listed(&self, pod: &PodRef) -> Option<ListedPod> {
        self.inner
            .lock()
            .iter()
            .find(|p| p.pending.pod == *pod)
            .map(|p| ListedPod {
                uid: p.pending.uid.clone(),
                assignment: p.assignment.clone(),
                isolation: p.pending.isolation,
            })
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

    #[test]
    fn a_pod_bound_again_under_its_name_is_listed_with_its_new_uid() {
        let s = StaticAssignments::new();
        let pod = PodRef::new("ns", "a");
        s.bind(pod.clone(), 1, &[("c", 1)], None);
        s.set_uid(pod.clone(), "first");
        s.unbind(&pod);
        s.bind(pod.clone(), 2, &[("c", 1)], None);
        s.set_uid(pod.clone(), "second");
        assert_eq!(s.pending().len(), 1);
        assert_eq!(s.listed(&pod).unwrap().uid, PodUid::new("second").unwrap());
    }
}
