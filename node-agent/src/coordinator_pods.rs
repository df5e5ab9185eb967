//! The default assignment source: the pods bound to this node as the coordinator streams
//! them (`NodePods` on the agent stream, protocol revision 2). The agent then needs no
//! pod access in the API at all: the coordinator already watches every pod.
//!
//! Each `NodePods` is a full snapshot from a complete cache, so a pod missing from it is
//! gone (deleted or finished) and departs: the stream releases its shares before the
//! snapshot takes effect ([`CoordinatorPods::gone_in`], then [`CoordinatorPods::apply`]), so a
//! pod that arrives in the same snapshot on a GPU the departed one held is never refused as
//! an overcommit.

use std::collections::BTreeSet;
use std::time::Duration;

use parking_lot::RwLock;
use tessera_proto::tessera::v1 as pb;
use tokio::sync::watch;

use crate::assignments::{AssignmentSource, PendingPod};
use crate::ledger::PodRef;
use crate::pod_table::{BoundPod, PodTable, RawPod};
use tessera_contract::Assignment;
use tessera_contract::Isolation;

/// The node's pods from the coordinator.
pub struct CoordinatorPods {
    table: RwLock<PodTable>,
    synced: watch::Sender<bool>,
}

impl Default for CoordinatorPods {
    fn default() -> Self {
        Self::new()
    }
}

impl CoordinatorPods {
    /// An empty source; it fills when the first `NodePods` arrives.
    pub fn new() -> Self {
        let (synced, _) = watch::channel(false);
        Self {
            table: RwLock::new(PodTable::default()),
            synced,
        }
    }

    /// The pods of the table that `message` lacks: gone from the API, to be released
    /// before the snapshot is applied.
    pub fn gone_in(&self, message: &pb::NodePods) -> Vec<PodRef> {
        let present: BTreeSet<PodRef> = message
            .pods
            .iter()
            .map(|p| PodRef::new(&p.namespace, &p.name))
            .collect();
        self.table
            .read()
            .keys()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect()
    }

    /// Takes in one snapshot; unreadable pods are logged and get nothing.
    pub fn apply(&self, message: &pb::NodePods) {
        let mut pods = Vec::new();
        for p in &message.pods {
            let pod = PodRef::new(&p.namespace, &p.name);
            let raw = RawPod {
                pod: pod.clone(),
                uid: &p.uid,
                created_unix_ms: u64::try_from(p.created_unix_ms).unwrap_or(0),
                containers: p
                    .containers
                    .iter()
                    .map(|c| (c.name.clone(), c.gpus))
                    .collect(),
                assignment: (!p.assignment.is_empty()).then_some(p.assignment.as_str()),
                isolation: (!p.isolation.is_empty()).then_some(p.isolation.as_str()),
                terminating: p.terminating,
                started: p.started,
            };
            match BoundPod::read(raw) {
                Ok(Some(entry)) => pods.push(entry),
                Ok(None) => {}
                Err(reason) => {
                    tracing::warn!(%pod, %reason, "ignoring pod with an unreadable GPU request")
                }
            }
        }
        self.table.write().replace(pods);
        self.synced.send_replace(true);
    }

    /// Waits until the first snapshot arrived; false on timeout.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut rx = self.synced.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl AssignmentSource for CoordinatorPods {
    fn kind(&self) -> &'static str {
        "coordinator"
    }

    fn pending(&self) -> Vec<PendingPod> {
        self.table.read().pending()
    }

    fn assignment_of(&self, pod: &PodRef) -> Option<Assignment> {
        self.table.read().assignment_of(pod)
    }

    fn pod_uid(&self, pod: &PodRef) -> Option<String> {
        self.table.read().pod_uid(pod)
    }

    fn isolation(&self, pod: &PodRef) -> Option<Isolation> {
        self.table.read().isolation(pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(name: &str, created: i64, gpus: u32) -> pb::BoundPod {
        pb::BoundPod {
            uid: format!("uid-{name}"),
            namespace: "ml".into(),
            name: name.into(),
            created_unix_ms: created,
            containers: vec![pb::BoundContainer {
                name: "main".into(),
                gpus,
            }],
            assignment: r#"{"containers":[{"container":"main","gpus":[{"uuid":"GPU-a","memory_mib":100,"compute_milli":250}]}]}"#.into(),
            ..pb::BoundPod::default()
        }
    }

    #[tokio::test]
    async fn snapshots_replace_the_table_and_missing_pods_depart() {
        let source = CoordinatorPods::new();
        assert!(!source.wait_synced(Duration::from_millis(1)).await);
        source.apply(&pb::NodePods {
            pods: vec![bound("b", 2, 1), bound("a", 1, 1)],
        });
        assert!(source.wait_synced(Duration::from_millis(1)).await);
        let names: Vec<String> = source.pending().into_iter().map(|p| p.pod.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            source.pod_uid(&PodRef::new("ml", "a")).as_deref(),
            Some("uid-a")
        );
        let mut started = bound("a", 1, 1);
        started.started = true;
        let next = pb::NodePods {
            pods: vec![started],
        };
        assert_eq!(source.gone_in(&next), [PodRef::new("ml", "b")]);
        source.apply(&next);
        assert!(source.pending().is_empty());
        assert!(
            source.assignment_of(&PodRef::new("ml", "a")).is_some(),
            "a started pod keeps its assignment for re-learning"
        );
    }

    #[test]
    fn unreadable_pods_get_nothing_and_do_not_depart() {
        let source = CoordinatorPods::new();
        source.apply(&pb::NodePods {
            pods: vec![bound("a", 1, 1)],
        });
        let mut bad = bound("a", 1, 1);
        bad.isolation = "fast".into();
        let bad = pb::NodePods { pods: vec![bad] };
        assert!(source.gone_in(&bad).is_empty());
        source.apply(&bad);
        assert!(source.pending().is_empty());
    }
}
