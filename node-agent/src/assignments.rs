//! Where the coordinator's decisions come from.
//!
//! The coordinator writes `tessera.dev/assignment` on each pod it binds: per container,
//! the GPU UUIDs and the memory / compute share on each ([`tessera_contract::Assignment`],
//! the one definition both sides compile). An [`AssignmentSource`] lists the pods
//! bound to this node that have not started, so the device plugin can steer the kubelet
//! to their slots and answer `Allocate` with exactly their share; which of their
//! containers are already allocated is the ledger's to say, never the source's.
//! The sources: the coordinator's stream ([`crate::coordinator_pods`], the default), a
//! read-only pod watch ([`crate::kube_assignments`]), `testing::StaticAssignments` for tests
//! (feature `testing`), and [`NoAssignments`] (`--no-kube`): every request then gets whole
//! free GPUs.

use tokio::sync::watch;

use tessera_contract::{Assignment, GpuSlice, Isolation};

use crate::ledger::{Ledger, PodRef};
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

/// The `pending` pods whose every GPU container `ledger` holds: allocated, not started yet.
pub fn allocated<'a>(
    pending: &'a [PendingPod],
    ledger: &'a Ledger,
) -> impl Iterator<Item = &'a PodUid> + 'a {
    pending
        .iter()
        .filter(|p| {
            p.containers
                .iter()
                .all(|c| ledger.has_container(&p.uid, &c.name))
        })
        .map(|p| &p.uid)
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
