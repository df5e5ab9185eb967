//! Every change of every pod in a namespace, in the order the API server made them: the
//! record the binding invariants are checked on ("bound at most once", "bound with its
//! assignment in one write").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::DEADLINE;
use crate::pods::{ASSIGNMENT, annotation, node_of};

/// One pod as one watch event showed it.
#[derive(Clone, Debug)]
pub struct PodSeen {
    /// The pod's name.
    pub name: String,
    /// The node it was bound to at that moment, if any.
    pub node: Option<String>,
    /// Its `tessera.dev/assignment` at that moment, as written.
    pub assignment: Option<String>,
    /// Its phase at that moment.
    pub phase: Option<String>,
    /// The event was its deletion.
    pub deleted: bool,
}

/// A pod watch recording into memory until dropped.
pub struct PodHistory {
    seen: Arc<Mutex<Vec<PodSeen>>>,
    task: JoinHandle<()>,
}

impl PodHistory {
    /// Starts watching pods in `namespace` and returns once the watch has listed, so a pod
    /// created after this call is seen from its creation on, in resourceVersion order (an
    /// initial list would show it in name order instead).
    pub async fn start(client: kube::Client, namespace: &str) -> PodHistory {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let mut listed_tx = Some(listed_tx);
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let task = tokio::spawn(async move {
            let stream = watcher(pods, watcher::Config::default());
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let (pod, deleted) = match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                    Ok(watcher::Event::Delete(p)) => (p, true),
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    Ok(_) => continue,
                    Err(_) => {
                        // The watcher re-lists by itself; back off so a dead server does not spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                sink.lock().push(PodSeen {
                    name: pod.metadata.name.clone().unwrap_or_default(),
                    node: node_of(&pod),
                    assignment: annotation(&pod, ASSIGNMENT).map(str::to_owned),
                    phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
                    deleted,
                });
            }
        });
        tokio::time::timeout(DEADLINE, listed)
            .await
            .expect("the pod watch listed in time")
            .expect("the pod watch task runs");
        PodHistory { seen, task }
    }

    /// Everything seen so far, in order.
    pub fn seen(&self) -> Vec<PodSeen> {
        self.seen.lock().clone()
    }

    /// Whether some change seen so far satisfies `check` (cheap enough to poll every few
    /// milliseconds, for tests that act in the middle of a binding).
    pub fn any(&self, check: impl Fn(&PodSeen) -> bool) -> bool {
        self.seen.lock().iter().any(check)
    }

    /// Checks that no pod ever moved to another node and that no pod's assignment changed
    /// once it was bound (the agent allocates from the annotation, so a changed one means
    /// two decisions for one pod). A deleted pod may come back under its name.
    pub fn assert_bound_at_most_once(&self) {
        let mut bound: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
        for seen in self.seen() {
            if seen.deleted {
                bound.remove(&seen.name);
                continue;
            }
            let Some(node) = &seen.node else { continue };
            match bound.get(&seen.name) {
                None => {
                    bound.insert(seen.name.clone(), (node.clone(), seen.assignment.clone()));
                }
                Some((first_node, first_assignment)) => {
                    assert_eq!(
                        first_node, node,
                        "pod {} was bound to {first_node} and later to {node}",
                        seen.name
                    );
                    assert_eq!(
                        first_assignment, &seen.assignment,
                        "pod {}'s assignment changed after it was bound to {node}",
                        seen.name
                    );
                }
            }
        }
    }

    /// Checks that every pod of `names` was bound, and that none was ever seen bound without
    /// its assignment or with an assignment before it was bound: the Binding carries the
    /// assignment onto the pod in the same write.
    pub fn assert_bound_with_assignment_in_one_write(&self, names: &[String]) {
        let history = self.seen();
        for name in names {
            let seen: Vec<_> = history.iter().filter(|s| &s.name == name).collect();
            assert!(
                seen.iter().any(|s| s.node.is_some()),
                "{name} was never bound"
            );
            for s in seen {
                assert_eq!(
                    s.node.is_some(),
                    s.assignment.is_some(),
                    "{name} was seen with node {:?} and assignment {:?}",
                    s.node,
                    s.assignment
                );
            }
        }
    }
}

impl Drop for PodHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}
