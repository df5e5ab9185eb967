//! The pods bound to this node that ask for GPUs, as an assignment source last saw them.
//!
//! Shared by the coordinator's stream ([`crate::coordinator_pods`]) and the pod watch
//! ([`crate::kube_assignments`]): the one reader of the `tessera.dev/assignment` and
//! `tessera.dev/isolation` values on the agent, and the one definition of which pods an
//! Allocate can be for (bound here, neither started nor terminating).

use std::collections::BTreeMap;

use tessera_contract::{Assignment, Isolation, keys};

use crate::assignments::{PendingContainer, PendingPod};
use crate::ledger::PodRef;

/// One GPU pod bound to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    /// The pod, its creation time and its GPU containers with their assigned GPUs.
    pub pending: PendingPod,
    /// `metadata.uid`: how the pod's processes are recognised by their cgroups.
    pub uid: Option<String>,
    /// The coordinator's assignment; `None` for pods another scheduler placed.
    pub assignment: Option<Assignment>,
    /// `tessera.dev/isolation`; `None` when absent (the default, the watchdog).
    pub isolation: Option<Isolation>,
    /// `deletionTimestamp` is set: it keeps its shares but gets no new ones.
    pub terminating: bool,
    /// Some container has started: every Allocate for the pod is over.
    pub started: bool,
}

/// A pod's fields as they come from the API or the coordinator, before validation.
#[derive(Debug, Clone, Default)]
pub struct RawPod<'a> {
    /// Namespace and name.
    pub pod: PodRef,
    /// `metadata.uid`, empty when unknown.
    pub uid: &'a str,
    /// `metadata.creationTimestamp` in Unix milliseconds.
    pub created_unix_ms: u64,
    /// GPU containers in the kubelet's allocation order (init containers first) and the
    /// slot count each asks for.
    pub containers: Vec<(String, u32)>,
    /// The assignment annotation's text, if any.
    pub assignment: Option<&'a str>,
    /// The isolation annotation's text, if any.
    pub isolation: Option<&'a str>,
    /// Terminating.
    pub terminating: bool,
    /// Started.
    pub started: bool,
}

impl BoundPod {
    /// Validates `raw`; `Ok(None)` for a pod without GPU containers, `Err` naming the
    /// annotation that cannot be read (such a pod gets nothing: no share can be derived,
    /// and whole GPUs would contradict the coordinator).
    pub fn read(raw: RawPod<'_>) -> Result<Option<Self>, String> {
        let containers: Vec<(String, u32)> =
            raw.containers.into_iter().filter(|(_, n)| *n > 0).collect();
        if containers.is_empty() {
            return Ok(None);
        }
        let assignment = raw
            .assignment
            .map(Assignment::from_json)
            .transpose()
            .map_err(|e| format!("{}: {e}", keys::ASSIGNMENT))?;
        let isolation = raw
            .isolation
            .map(Isolation::parse)
            .transpose()
            .map_err(|e| format!("{}: {e}", keys::ISOLATION))?;
        let containers = containers
            .into_iter()
            .map(|(name, slots)| PendingContainer {
                gpus: assignment.as_ref().map(|a| {
                    a.containers
                        .iter()
                        .find(|c| c.container == name)
                        .map(|c| c.gpus.clone())
                        .unwrap_or_default()
                }),
                name,
                slots,
            })
            .collect();
        Ok(Some(Self {
            pending: PendingPod {
                pod: raw.pod,
                created_unix_ms: raw.created_unix_ms,
                containers,
            },
            uid: (!raw.uid.is_empty()).then(|| raw.uid.to_owned()),
            assignment,
            isolation,
            terminating: raw.terminating,
            started: raw.started,
        }))
    }
}

/// The node's GPU pods by pod.
#[derive(Debug, Default)]
pub struct PodTable {
    pods: BTreeMap<PodRef, BoundPod>,
}

impl PodTable {
    /// Adds or replaces one pod.
    pub fn insert(&mut self, pod: BoundPod) {
        self.pods.insert(pod.pending.pod.clone(), pod);
    }

    /// Drops one pod.
    pub fn remove(&mut self, pod: &PodRef) {
        self.pods.remove(pod);
    }

    /// Replaces the whole table.
    pub fn replace(&mut self, pods: impl IntoIterator<Item = BoundPod>) {
        self.pods = pods
            .into_iter()
            .map(|p| (p.pending.pod.clone(), p))
            .collect();
    }

    /// The pods an Allocate can be for, oldest first (the kubelet admits in that order).
    pub fn pending(&self) -> Vec<PendingPod> {
        let mut pods: Vec<PendingPod> = self
            .pods
            .values()
            .filter(|p| !p.started && !p.terminating)
            .map(|p| p.pending.clone())
            .collect();
        pods.sort_by(|a, b| (a.created_unix_ms, &a.pod).cmp(&(b.created_unix_ms, &b.pod)));
        pods
    }

    /// The pod, if bound here.
    pub fn get(&self, pod: &PodRef) -> Option<&BoundPod> {
        self.pods.get(pod)
    }

    /// Every pod in the table.
    pub fn keys(&self) -> impl Iterator<Item = &PodRef> {
        self.pods.keys()
    }

    /// The pod's assignment, if it is here and has one.
    pub fn assignment_of(&self, pod: &PodRef) -> Option<Assignment> {
        self.get(pod).and_then(|e| e.assignment.clone())
    }

    /// The pod's UID, if it is here and has one.
    pub fn pod_uid(&self, pod: &PodRef) -> Option<String> {
        self.get(pod).and_then(|e| e.uid.clone())
    }

    /// The pod's isolation annotation, if it is here and has one.
    pub fn isolation(&self, pod: &PodRef) -> Option<Isolation> {
        self.get(pod).and_then(|e| e.isolation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &str, created: u64) -> RawPod<'static> {
        RawPod {
            pod: PodRef::new("ns", name),
            uid: "uid-1",
            created_unix_ms: created,
            containers: vec![("init".into(), 1), ("main".into(), 1), ("side".into(), 0)],
            ..RawPod::default()
        }
    }

    #[test]
    fn pods_without_gpu_containers_are_not_kept() {
        let mut r = raw("a", 1);
        r.containers = vec![("main".into(), 0)];
        assert_eq!(BoundPod::read(r), Ok(None));
    }

    #[test]
    fn assignment_is_spread_over_the_containers_by_name() {
        let mut r = raw("a", 1);
        r.assignment = Some(
            r#"{"containers":[{"container":"main","gpus":[{"uuid":"GPU-a","memory_mib":10,"compute_milli":500}]}]}"#,
        );
        let p = BoundPod::read(r).unwrap().unwrap();
        let names: Vec<&str> = p
            .pending
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["init", "main"]);
        assert_eq!(p.pending.containers[0].gpus, Some(vec![]));
        assert_eq!(
            p.pending.containers[1].gpus.as_ref().unwrap()[0].uuid,
            "GPU-a"
        );
        assert_eq!(p.uid.as_deref(), Some("uid-1"));
    }

    #[test]
    fn bad_annotations_name_themselves() {
        let mut r = raw("a", 1);
        r.isolation = Some("fast");
        assert!(
            BoundPod::read(r)
                .unwrap_err()
                .starts_with("tessera.dev/isolation")
        );
        let mut r = raw("a", 1);
        r.assignment = Some("{");
        assert!(
            BoundPod::read(r)
                .unwrap_err()
                .starts_with("tessera.dev/assignment")
        );
    }

    #[test]
    fn started_and_terminating_pods_are_not_pending() {
        let mut t = PodTable::default();
        for (name, created, started, terminating) in [
            ("b", 2, false, false),
            ("a", 1, false, false),
            ("c", 0, true, false),
            ("d", 0, false, true),
        ] {
            let mut r = raw(name, created);
            r.started = started;
            r.terminating = terminating;
            t.insert(BoundPod::read(r).unwrap().unwrap());
        }
        let order: Vec<String> = t.pending().into_iter().map(|p| p.pod.name).collect();
        assert_eq!(order, ["a", "b"]);
        assert!(
            t.get(&PodRef::new("ns", "d")).is_some(),
            "a terminating pod keeps its entry"
        );
    }
}
