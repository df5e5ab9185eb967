//! Test support (feature `testing`, and this crate's own unit tests): an assignment source
//! the test fills, playing the coordinator without a cluster. Never used by the agent itself.

use parking_lot::Mutex;
use tessera_contract::{Assignment, Isolation, PodUid};

use crate::assignments::{AssignmentSource, ListedPod, PendingContainer, PendingPod, SourceKind};
use crate::ledger::PodRef;

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
                uid: PodUid::new(format!("uid-{}-{}", pod.namespace, pod.name))
                    .expect("a test pod's name makes a UID of at most 128 bytes"),
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
        let uid = PodUid::new(uid).expect("a test gives a UID of 1..=128 bytes");
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
