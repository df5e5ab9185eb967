//! The pods bound to this node that ask for GPUs, as an assignment source last saw them.
//!
//! Shared by the coordinator's stream ([`crate::coordinator_pods`]) and the pod watch
//! ([`crate::kube_assignments`]): the one reader of the `tessera.dev/assignment` and
//! `tessera.dev/isolation` values on the agent, and the one definition of which pods an
//! Allocate can be for (bound here, neither started nor terminating). Pods are keyed by
//! UID; the namespace and name index only serves the kubelet's pod-resources, which
//! names pods.

use std::collections::BTreeMap;

use tessera_contract::{Assignment, Isolation, keys};

use crate::assignments::{ListedPod, PendingContainer, PendingPod};
use crate::ledger::PodRef;
use tessera_contract::PodUid;

/// One GPU pod bound to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    /// The pod, its UID, creation time, isolation and GPU containers with their assigned GPUs.
    pub pending: PendingPod,
    /// The coordinator's assignment; `None` for pods another scheduler placed.
    pub assignment: Option<Assignment>,
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
    /// `metadata.uid`; a pod without one is refused.
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
    /// field or annotation that cannot be read (such a pod gets nothing: no share can be
    /// derived, and whole GPUs would contradict the coordinator).
    pub fn read(raw: RawPod<'_>) -> Result<Option<Self>, String> {
        let containers: Vec<(String, u32)> =
            raw.containers.into_iter().filter(|(_, n)| *n > 0).collect();
        if containers.is_empty() {
            return Ok(None);
        }
        // The UID is how a pod is told from one created again under its name.
        let uid = PodUid::new(raw.uid).map_err(|e| format!("uid: {e}"))?;
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
                uid,
                pod: raw.pod,
                created_unix_ms: raw.created_unix_ms,
                isolation: isolation.unwrap_or_default(),
                containers,
            },
            assignment,
            terminating: raw.terminating,
            started: raw.started,
        }))
    }

    /// The pod's UID.
    pub fn uid(&self) -> &PodUid {
        &self.pending.uid
    }
}

/// The node's GPU pods by UID, with an index by namespace and name.
#[derive(Debug, Default)]
pub struct PodTable {
    pods: BTreeMap<PodUid, BoundPod>,
    /// The newest pod under each name (an API server has one at a time; a list that
    /// claims two gets the newest, the one the kubelet would be admitting).
    names: BTreeMap<PodRef, PodUid>,
}

impl PodTable {
    /// Adds or replaces one pod.
    pub fn insert(&mut self, pod: BoundPod) {
        let uid = pod.uid().clone();
        self.pods.insert(uid, pod);
        self.reindex();
    }

    /// Drops one pod.
    pub fn remove(&mut self, uid: &PodUid) {
        if self.pods.remove(uid).is_some() {
            self.reindex();
        }
    }

    /// Replaces the whole table.
    pub fn replace(&mut self, pods: impl IntoIterator<Item = BoundPod>) {
        self.pods = pods.into_iter().map(|p| (p.uid().clone(), p)).collect();
        self.reindex();
    }

    fn reindex(&mut self) {
        self.names.clear();
        for p in self.pods.values() {
            let newer = match self
                .names
                .get(&p.pending.pod)
                .and_then(|u| self.pods.get(u))
            {
                Some(other) => {
                    (p.pending.created_unix_ms, p.uid())
                        > (other.pending.created_unix_ms, other.uid())
                }
                None => true,
            };
            if newer {
                self.names.insert(p.pending.pod.clone(), p.uid().clone());
            }
        }
    }

    /// The pods an Allocate can be for, oldest first (the kubelet admits in that order).
    pub fn pending(&self) -> Vec<PendingPod> {
        let mut pods: Vec<PendingPod> = self
            .pods
            .values()
            .filter(|p| !p.started && !p.terminating)
            .map(|p| p.pending.clone())
            .collect();
        pods.sort_by(|a, b| (a.created_unix_ms, &a.uid).cmp(&(b.created_unix_ms, &b.uid)));
        pods
    }

    /// The pod with UID `uid`, if bound here.
    pub fn get(&self, uid: &PodUid) -> Option<&BoundPod> {
        self.pods.get(uid)
    }

    /// Every pod's UID.
    pub fn uids(&self) -> impl Iterator<Item = &PodUid> {
        self.pods.keys()
    }

    /// The pod listed under `pod`'s namespace and name.
    pub fn listed(&self, pod: &PodRef) -> Option<ListedPod> {
        let p = self.pods.get(self.names.get(pod)?)?;
        Some(ListedPod {
            uid: p.uid().clone(),
            assignment: p.assignment.clone(),
            isolation: p.pending.isolation,
        })
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
        assert_eq!(p.uid(), &PodUid::new("uid-1").unwrap());
        assert_eq!(p.pending.isolation, Isolation::Watchdog);
    }

    #[test]
    fn bad_annotations_and_a_missing_uid_name_themselves() {
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
        let mut r = raw("a", 1);
        r.uid = "";
        assert!(
            BoundPod::read(r)
                .unwrap_err()
                .starts_with("uid: empty; expected the pod's metadata.uid")
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
            let uid = format!("uid-{name}");
            let mut r = raw(name, created);
            r.uid = &uid;
            r.started = started;
            r.terminating = terminating;
            t.insert(BoundPod::read(r).unwrap().unwrap());
        }
        let order: Vec<String> = t.pending().into_iter().map(|p| p.pod.name).collect();
        assert_eq!(order, ["a", "b"]);
        assert!(
            t.get(&PodUid::new("uid-d").unwrap()).is_some(),
            "a terminating pod keeps its entry"
        );
    }

    #[test]
    fn a_name_listed_twice_is_the_newest_pod_and_each_uid_keeps_its_entry() {
        let mut t = PodTable::default();
        let mut old = raw("a", 1);
        old.uid = "old";
        old.terminating = true;
        let mut new = raw("a", 2);
        new.uid = "new";
        t.replace([
            BoundPod::read(old).unwrap().unwrap(),
            BoundPod::read(new).unwrap().unwrap(),
        ]);
        assert_eq!(
            t.listed(&PodRef::new("ns", "a")).unwrap().uid,
            PodUid::new("new").unwrap()
        );
        assert_eq!(t.uids().count(), 2);
        t.remove(&PodUid::new("new").unwrap());
        assert_eq!(
            t.listed(&PodRef::new("ns", "a")).unwrap().uid,
            PodUid::new("old").unwrap()
        );
    }
}
