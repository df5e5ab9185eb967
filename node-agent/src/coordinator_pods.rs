//! The default assignment source: the pods bound to this node as the coordinator streams
//! them (`NodePods` on the agent stream, protocol revision 2). The agent then needs no
//! pod access in the API at all: the coordinator already watches every pod.
//!
//! Each `NodePods` is a full snapshot from a complete cache, so a pod missing from it is
//! gone (deleted or finished) and departs, by UID: the stream releases its shares before the
//! snapshot takes effect ([`CoordinatorPods::receive`]), so a pod that arrives in the same
//! snapshot on a GPU the departed one held is never refused as an overcommit. A pod deleted
//! and created again under the same name is a departure and a new pod.

use std::collections::BTreeSet;
use std::time::Duration;

use parking_lot::RwLock;
use tessera_proto::tessera::v1 as pb;
use tokio::sync::watch;

use crate::assignments::{AssignmentSource, ListedPod, PendingPod, SourceKind};
use crate::ledger::PodRef;
use crate::pod_table::{BoundPod, PodTable, RawPod};
use tessera_contract::PodUid;

/// The protocol revision that brought `NodePods`.
const NODE_PODS_PROTOCOL: u32 = 2;

/// The node's pods from the coordinator: the one owner of the pod list the stream delivers
/// (the report stream hands each message here and sends nothing of its own about it).
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

    /// The pods of the table, by UID, that `message` lacks: gone from the API, to be
    /// released before the snapshot is applied. A pod created again under the same name
    /// is another UID: the old one departs, the new one is a new pod.
    pub fn gone_in(&self, message: &pb::NodePods) -> Vec<PodUid> {
        let present: BTreeSet<&str> = message.pods.iter().map(|p| p.uid.as_str()).collect();
        self.table
            .read()
            .uids()
            .filter(|k| !present.contains(k.as_str()))
            .cloned()
            .collect()
    }

    /// Takes in one snapshot; unreadable pods are logged and get nothing.
    pub fn apply(&self, message: &pb::NodePods) {
        let pods = read_node_pods(message)
            .into_iter()
            .filter_map(|(pod, read)| match read {
                Ok(entry) => entry,
                Err(reason) => {
                    tracing::warn!(%pod, %reason, "ignoring pod with an unreadable GPU request");
                    None
                }
            });
        self.table.write().replace(pods);
        self.synced.send_replace(true);
    }

    /// Takes in one snapshot from the stream: the pods it lacks depart first (their
    /// shares are released on `node`), since a pod arriving in the same snapshot may have
    /// been placed on what they held; then the snapshot takes effect.
    pub fn receive(&self, node: &crate::node::Node, message: &pb::NodePods) {
        for gone in self.gone_in(message) {
            node.release_departed(&gone);
        }
        self.apply(message);
    }

    /// A coordinator that accepted protocol revision `accepted` welcomed this agent: one
    /// before revision 2 streams no pods, so this source would stay empty; said as an error
    /// with what to change.
    pub fn welcomed(&self, accepted: u32) {
        if accepted < NODE_PODS_PROTOCOL {
            tracing::error!(
                protocol = accepted,
                "this coordinator does not stream the node's pods (protocol revision 2): GPU pods \
                 here get no assignment; upgrade the coordinator, or run the agent with \
                 --assignments kube (it then needs list/watch on pods)"
            );
        }
    }

    /// Waits until the first snapshot arrived; false on timeout.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut rx = self.synced.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Reads every pod of `message` as the agent keeps it: `Ok(None)` for a pod without GPU
/// containers, `Err` naming the field that cannot be read. The one reader of `NodePods`.
pub fn read_node_pods(message: &pb::NodePods) -> Vec<(PodRef, Result<Option<BoundPod>, String>)> {
    message
        .pods
        .iter()
        .map(|p| {
            let pod = PodRef::new(&p.namespace, &p.name);
            let raw = RawPod {
                pod: pod.clone(),
                uid: &p.uid,
                // A time before 1970 is as old as can be: such a pod goes first.
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
            (pod, BoundPod::read(raw))
        })
        .collect()
}

impl AssignmentSource for CoordinatorPods {
    fn kind(&self) -> SourceKind {
        SourceKind::Coordinator
    }

    fn synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    fn pending(&self) -> Vec<PendingPod> {
        self.table.read().pending()
    }

    fn listed(&self, pod: &PodRef) -> Option<ListedPod> {
        self.table.read().listed(pod)
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
        assert!(!*source.synced().borrow());
        source.apply(&pb::NodePods {
            pods: vec![bound("b", 2, 1), bound("a", 1, 1)],
        });
        assert!(source.wait_synced(Duration::from_millis(1)).await);
        let names: Vec<String> = source.pending().into_iter().map(|p| p.pod.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            source.listed(&PodRef::new("ml", "a")).map(|l| l.uid),
            Some(PodUid::new("uid-a").unwrap())
        );
        let mut started = bound("a", 1, 1);
        started.started = true;
        let next = pb::NodePods {
            pods: vec![started],
        };
        assert_eq!(source.gone_in(&next), [PodUid::new("uid-b").unwrap()]);
        source.apply(&next);
        assert!(source.pending().is_empty());
        assert!(
            source
                .listed(&PodRef::new("ml", "a"))
                .is_some_and(|l| l.assignment.is_some()),
            "a started pod keeps its assignment for re-learning"
        );
    }

    #[test]
    fn a_pod_created_again_under_its_name_is_a_departure_and_a_new_pod() {
        let source = CoordinatorPods::new();
        source.apply(&pb::NodePods {
            pods: vec![bound("a", 1, 1)],
        });
        let mut again = bound("a", 5, 1);
        again.uid = "uid-a-2".into();
        let next = pb::NodePods { pods: vec![again] };
        assert_eq!(source.gone_in(&next), [PodUid::new("uid-a").unwrap()]);
        source.apply(&next);
        assert_eq!(source.pending()[0].uid, PodUid::new("uid-a-2").unwrap());
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

    mod fuzz {
        //! `NodePods` as the agent reads it, from any bytes on the wire and from any field
        //! values: never a panic; a pod is kept only with a UID, a readable isolation and an
        //! assignment within range, and refused naming the field otherwise.

        use super::*;
        use proptest::prelude::*;
        use prost::Message as _;
        use tessera_contract::assignment::MAX_MEMORY_MIB;
        use tessera_contract::{Assignment, Isolation};

        fn assignment_text() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                "\\PC{0,40}",
                (
                    "[a-z]{0,6}",
                    "[ -~]{0,10}",
                    prop_oneof![any::<u64>(), 0..100_000u64],
                    prop_oneof![any::<u32>(), 0..1500u32]
                )
                    .prop_map(|(container, uuid, mib, milli)| {
                        serde_json::json!({"containers": [{"container": container, "gpus": [
                            {"uuid": uuid, "memory_mib": mib, "compute_milli": milli}]}]})
                        .to_string()
                    }),
            ]
        }

        fn bound_pod() -> impl Strategy<Value = pb::BoundPod> {
            (
                prop_oneof![Just(String::new()), "[a-f0-9-]{1,40}", "x{120,140}"],
                "[a-z]{0,4}",
                "[a-z]{0,4}",
                any::<i64>(),
                prop::collection::vec(("[a-z]{0,4}", prop_oneof![0..3u32, any::<u32>()]), 0..4),
                assignment_text(),
                prop_oneof![Just(String::new()), "(watchdog|mps|mig|none|\\PC{0,12})"],
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(
                    |(
                        uid,
                        namespace,
                        name,
                        created,
                        containers,
                        assignment,
                        isolation,
                        terminating,
                        started,
                    )| {
                        pb::BoundPod {
                            uid,
                            namespace,
                            name,
                            created_unix_ms: created,
                            containers: containers
                                .into_iter()
                                .map(|(name, gpus)| pb::BoundContainer { name, gpus })
                                .collect(),
                            assignment,
                            isolation,
                            terminating,
                            started,
                        }
                    },
                )
        }

        fn check(message: &pb::NodePods) -> Result<(), TestCaseError> {
            for (raw, (pod, read)) in message.pods.iter().zip(read_node_pods(message)) {
                prop_assert_eq!(pod, PodRef::new(&raw.namespace, &raw.name));
                match read {
                    Ok(None) => prop_assert!(raw.containers.iter().all(|c| c.gpus == 0)),
                    Ok(Some(p)) => {
                        prop_assert!(!raw.uid.is_empty() && raw.uid.len() <= 128);
                        prop_assert_eq!(p.uid().as_str(), raw.uid.as_str());
                        if !raw.isolation.is_empty() {
                            prop_assert_eq!(
                                Ok(p.pending.isolation),
                                Isolation::parse(&raw.isolation)
                            );
                        }
                        for g in p.assignment.iter().flat_map(Assignment::slices) {
                            prop_assert!((1..=1000).contains(&g.compute_milli));
                            prop_assert!(g.memory_mib <= MAX_MEMORY_MIB);
                        }
                    }
                    Err(e) => prop_assert!(
                        e.starts_with("uid: ")
                            || e.starts_with("tessera.dev/assignment: ")
                            || e.starts_with("tessera.dev/isolation: "),
                        "{e}"
                    ),
                }
            }
            // Taken in whole: the table answers without panicking.
            let source = CoordinatorPods::new();
            source.apply(message);
            let _ = source.gone_in(&pb::NodePods::default());
            for p in source.pending() {
                prop_assert!(source.listed(&p.pod).is_some());
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn any_node_pods_message_is_read_or_refused_by_field(
                pods in prop::collection::vec(bound_pod(), 0..6)
            ) {
                check(&pb::NodePods { pods })?;
            }

            #[test]
            fn any_bytes_on_the_wire_decode_or_fail_without_a_panic(
                bytes in prop::collection::vec(any::<u8>(), 0..400)
            ) {
                if let Ok(message) = pb::NodePods::decode(bytes.as_slice()) {
                    check(&message)?;
                }
            }
        }
    }
}
