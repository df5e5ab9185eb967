//! What each node's agent is told about its pods (`NodePods`, protocol revision 2): every
//! pod bound there that asks for `nvidia.com/gpu` and has not finished, with its
//! assignment, so the agent needs no pod access in the API.
//!
//! Published from the pod cache only once it is complete: a pod absent from a snapshot
//! is gone, and the agent releases its shares. Any scheduler's pods are included; the
//! agent gives whole free GPUs to those without an assignment.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tessera_proto::tessera::v1 as pb;
use tokio::sync::watch;

use super::cache::{Cache, Store};
use super::pod_log::{Changed, PodLog};
use crate::agents::AgentRegistry;
use crate::agents::stopped;
use tessera_contract::keys;
use tessera_contract::pod::{
    allocation_order, bound_assignment, container_gpus, has_started, is_finished,
};

/// `pod` as its agent will see it once bound to `node` with `assignment` (JSON), for the
/// announcement made right before the Binding is sent.
pub fn as_bound(pod: &Pod, node: &str, assignment: &str) -> Option<(String, pb::BoundPod)> {
    let (_, mut bound) = describe(pod, node)?;
    bound.assignment = assignment.to_owned();
    Some((node.to_owned(), bound))
}

/// The pod as its node's agent needs it; `None` when it is not bound, has finished, or
/// asks for no GPU.
fn bound_pod(pod: &Pod) -> Option<(String, pb::BoundPod)> {
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.as_deref().filter(|n| !n.is_empty())?;
    describe(pod, node)
}

fn describe(pod: &Pod, node: &str) -> Option<(String, pb::BoundPod)> {
    let spec = pod.spec.as_ref()?;
    if is_finished(pod) {
        return None;
    }
    let containers: Vec<pb::BoundContainer> = allocation_order(spec)
        .map(|c| c.container)
        .filter_map(|c| {
            let gpus = container_gpus(c).ok().filter(|&n| n > 0)?;
            Some(pb::BoundContainer {
                name: c.name.clone(),
                gpus,
            })
        })
        .collect();
    if containers.is_empty() {
        return None;
    }
    let meta = &pod.metadata;
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
            .unwrap_or_default()
    };
    Some((
        node.to_owned(),
        pb::BoundPod {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            created_unix_ms: meta
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_millisecond()),
            containers,
            // Only what Tessera's Binding wrote: the agent gives a pod without one whole free
            // GPUs and reports which, as for any other scheduler's pod.
            assignment: bound_assignment(pod).unwrap_or_default().to_owned(),
            isolation: annotation(keys::ISOLATION),
            terminating: meta.deletion_timestamp.is_some(),
            started: has_started(pod),
        },
    ))
}

/// Every node's GPU pods, by node name (pods in uid order within a node), built from
/// scratch: the reference the [`Tracker`] is tested against.
#[cfg(test)]
fn by_node(store: &Store) -> BTreeMap<String, pb::NodePods> {
    let mut out: BTreeMap<String, pb::NodePods> = BTreeMap::new();
    for pod in store.pods.values() {
        if let Some((node, bound)) = bound_pod(pod) {
            out.entry(node).or_default().pods.push(bound);
        }
    }
    out
}

/// Changes arriving together (a burst of bindings and their status updates) are published
/// once: the agents learn of a binding from its announcement, not from this.
const SETTLE: Duration = Duration::from_millis(20);

/// Every node's GPU pods as last published, kept up to date change by change: a pod's
/// entry is described again only when its `resourceVersion` moved, and only the nodes whose
/// list changed are published again. The first [`Tracker::update`] returns every node.
#[derive(Default)]
pub struct Tracker {
    /// Per pod uid: the resourceVersion last looked at and where it was listed.
    seen: HashMap<String, (Option<String>, Option<String>)>,
    /// Per node, its pods by uid (the order `NodePods` lists them in).
    nodes: BTreeMap<String, BTreeMap<String, pb::BoundPod>>,
    /// Pods seen finished or gone since [`Tracker::take_ended`]: their announcements end
    /// even if no snapshot ever listed them (bound and failed between two updates).
    ended: BTreeSet<String>,
}

impl Tracker {
    /// Brings the lists up to `store`, comparing every pod, and returns the complete list of
    /// every node whose list changed (empty for a node whose pods all left).
    pub fn update(&mut self, store: &Store) -> BTreeMap<String, pb::NodePods> {
        self.update_changed(store, Changed::All)
    }

    /// Like [`Tracker::update`], looking only at the pods in `changed` (from the cache's
    /// [`super::pod_log::PodLog`]): proportional to the changes, not to the store.
    pub fn update_changed(
        &mut self,
        store: &Store,
        changed: Changed,
    ) -> BTreeMap<String, pb::NodePods> {
        let mut dirty = BTreeSet::new();
        match changed {
            Changed::All => {
                for (uid, pod) in &store.pods {
                    self.look_at(uid, pod, &mut dirty);
                }
                let gone: Vec<String> = self
                    .seen
                    .keys()
                    .filter(|uid| !store.pods.contains_key(*uid))
                    .cloned()
                    .collect();
                for uid in gone {
                    self.left(&uid, &mut dirty);
                }
            }
            Changed::Pods(uids) => {
                for uid in uids {
                    match store.pods.get(&uid) {
                        Some(pod) => self.look_at(&uid, pod, &mut dirty),
                        None => self.left(&uid, &mut dirty),
                    }
                }
            }
        }
        dirty
            .into_iter()
            .map(|node| {
                let pods = self
                    .nodes
                    .get(&node)
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default();
                if self.nodes.get(&node).is_some_and(BTreeMap::is_empty) {
                    self.nodes.remove(&node);
                }
                (node, pb::NodePods { pods })
            })
            .collect()
    }

    /// Describes `pod` again if its resourceVersion moved, marking the nodes it left or
    /// joined (or whose entry for it changed) dirty.
    fn look_at(&mut self, uid: &str, pod: &Pod, dirty: &mut BTreeSet<String>) {
        let rv = pod.metadata.resource_version.as_ref();
        let before = self.seen.get(uid);
        if rv.is_some() && before.is_some_and(|(seen, _)| seen.as_ref() == rv) {
            return;
        }
        let old_node = before.and_then(|(_, node)| node.clone());
        let now = bound_pod(pod);
        if now.is_none() && is_finished(pod) {
            self.ended.insert(uid.to_owned());
        }
        let same = match (&old_node, &now) {
            (Some(old), Some((node, bound))) => {
                old == node && self.nodes.get(old).and_then(|m| m.get(uid)) == Some(bound)
            }
            (None, None) => true,
            _ => false,
        };
        let new_node = now.as_ref().map(|(node, _)| node.clone());
        self.seen.insert(uid.to_owned(), (rv.cloned(), new_node));
        if same {
            return;
        }
        if let Some(old) = old_node {
            if let Some(m) = self.nodes.get_mut(&old) {
                m.remove(uid);
            }
            dirty.insert(old);
        }
        if let Some((node, bound)) = now {
            self.nodes
                .entry(node.clone())
                .or_default()
                .insert(uid.to_owned(), bound);
            dirty.insert(node);
        }
    }

    /// Forgets a pod gone from the store; its announcement ends (also when no update saw
    /// it: created, bound and deleted between two).
    fn left(&mut self, uid: &str, dirty: &mut BTreeSet<String>) {
        self.ended.insert(uid.to_owned());
        if let Some((_, Some(node))) = self.seen.remove(uid) {
            if let Some(m) = self.nodes.get_mut(&node) {
                m.remove(uid);
            }
            dirty.insert(node);
        }
    }

    /// The pods seen finished or gone since the last call.
    pub fn take_ended(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.ended)
    }
}

/// Publishes the nodes' pods into the registry from the cache: [`Publisher::run`] on every
/// change (settled for [`SETTLE`]), and [`Publisher::flush`] when the scheduler is about to
/// announce bindings. Cheap to clone; the clones share one [`Tracker`].
#[derive(Clone)]
pub struct Publisher {
    cache: Cache,
    registry: AgentRegistry,
    /// `None` until the first complete publish (never before the cache is complete); the
    /// log says which pods changed since the tracker last looked.
    tracker: Arc<Mutex<Option<(Tracker, PodLog)>>>,
}

impl Publisher {
    /// A publisher of `cache`'s pods into `registry`; nothing is published before [`Publisher::run`].
    pub fn new(cache: Cache, registry: AgentRegistry) -> Self {
        Self {
            cache,
            registry,
            tracker: Arc::new(Mutex::new(None)),
        }
    }

    /// Publishes what changed in the cache since the last publish, now. The scheduler calls
    /// it before announcing bindings: a pod that failed or left a moment ago (what made room
    /// for the new one) must be off the agent's list before the new pod is on it, or the
    /// agent sees two pending pods of one shape and may answer the kubelet for the wrong one.
    pub fn flush(&self) {
        let mut tracker = self.tracker.lock();
        if let Some((tracker, log)) = tracker.as_mut() {
            let changed = self
                .cache
                .read_pod_changes(log, |store, pods| tracker.update_changed(store, pods));
            self.registry
                .publish_changed_node_pods(changed, &tracker.take_ended());
        }
    }

    /// Publishes every node once the cache is complete, then the nodes whose pods changed,
    /// until `shutdown`.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut ready = self.cache.ready();
        tokio::select! {
            _ = ready.wait_for(|r| *r) => {}
            _ = stopped(&mut shutdown) => return,
        }
        let mut changes = self.cache.changes();
        changes.borrow_and_update();
        {
            let mut tracker = Tracker::default();
            let log = self.cache.pod_log();
            let all = self
                .cache
                .read_pod_changes(&log, |store, pods| tracker.update_changed(store, pods));
            tracker.take_ended();
            let mut slot = self.tracker.lock();
            self.registry.publish_node_pods(all);
            *slot = Some((tracker, log));
        }
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = stopped(&mut shutdown) => return,
            }
            tokio::time::sleep(SETTLE).await;
            changes.borrow_and_update();
            self.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pod(value: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn bound_unfinished_gpu_pods_are_told_to_their_node() {
        let gpu = |name: &str, node: &str, phase: &str| {
            pod(serde_json::json!({
                "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
                             "annotations": {keys::ASSIGNMENT: "{}", keys::ASSIGNED_AT: "2026-01-01T00:00:02Z", keys::ISOLATION: "mps"},
                             "creationTimestamp": "2026-01-01T00:00:01Z"},
                "spec": {"nodeName": node,
                         "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                         "containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": "2"}}},
                                        {"name": "log"}]},
                "status": {"phase": phase}
            }))
        };
        let mut store = Store::default();
        for (uid, p) in [
            ("1", gpu("a", "n1", "Pending")),
            ("2", gpu("b", "n1", "Succeeded")),
            ("3", gpu("c", "", "Pending")),
            ("4", gpu("d", "n2", "Running")),
            (
                "5",
                pod(serde_json::json!({"metadata": {"name": "cpu"},
                    "spec": {"nodeName": "n1", "containers": [{"name": "main"}]}})),
            ),
        ] {
            store.pods.insert(uid.into(), p);
        }
        let out = by_node(&store);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        let a = &out["n1"].pods[0];
        assert_eq!(out["n1"].pods.len(), 1);
        assert_eq!((a.name.as_str(), a.uid.as_str()), ("a", "u-a"));
        let containers: Vec<(&str, u32)> = a
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.gpus))
            .collect();
        assert_eq!(containers, [("warm", 1), ("main", 2)]);
        assert_eq!((a.assignment.as_str(), a.isolation.as_str()), ("{}", "mps"));
        assert_eq!(a.created_unix_ms, 1_767_225_601_000);
        assert!(!a.started && !a.terminating);
        assert!(out["n2"].pods[0].started);

        // An assignment the pod was created with, without Tessera's binding time, is not
        // passed on: the agent treats the pod as any other scheduler's.
        let mut forged = (*gpu("e", "n3", "Pending")).clone();
        if let Some(a) = forged.metadata.annotations.as_mut() {
            a.remove(keys::ASSIGNED_AT);
        }
        store.pods.insert("6".into(), Arc::new(forged));
        assert_eq!(by_node(&store)["n3"].pods[0].assignment, "");
    }

    #[test]
    fn publishing_sends_only_changes_and_empties_nodes_whose_pods_left() {
        let registry = AgentRegistry::new();
        let mut rx = registry.node_pods("n1");
        assert!(
            rx.borrow().is_none(),
            "nothing before the cache is complete"
        );
        let one = pb::NodePods {
            pods: vec![pb::BoundPod {
                name: "a".into(),
                ..Default::default()
            }],
        };
        registry.publish_node_pods(BTreeMap::from([("n1".to_owned(), one.clone())]));
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().as_deref(), Some(&one));
        registry.publish_node_pods(BTreeMap::from([("n1".to_owned(), one)]));
        assert!(
            !rx.has_changed().unwrap(),
            "the same snapshot is not sent again"
        );
        registry.publish_node_pods(BTreeMap::new());
        assert_eq!(
            rx.borrow_and_update().as_deref(),
            Some(&pb::NodePods::default())
        );
    }

    fn gpu_pod(name: &str, node: &str, rv: &str, phase: &str) -> Arc<Pod> {
        pod(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml", "uid": name, "resourceVersion": rv},
            "spec": {"nodeName": node,
                     "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": phase}
        }))
    }

    /// Puts GPU pod `name` (its uid too) bound to `node` into `store`.
    fn put(store: &mut Store, name: &str, node: &str, rv: &str, phase: &str) {
        store
            .pods
            .insert(name.into(), gpu_pod(name, node, rv, phase));
    }

    fn names(pods: &pb::NodePods) -> Vec<&str> {
        pods.pods.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn the_tracker_returns_only_the_nodes_whose_pods_changed() {
        let mut store = Store::default();
        put(&mut store, "a", "n1", "1", "Pending");
        put(&mut store, "b", "n2", "1", "Pending");
        let mut tracker = Tracker::default();
        let first = tracker.update(&store);
        assert_eq!(first.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        assert_eq!(first, by_node(&store), "the first update is every node");
        assert!(tracker.update(&store).is_empty(), "nothing changed");

        // A status change that the agent does not see (new resourceVersion, same entry).
        put(&mut store, "b", "n2", "2", "Pending");
        assert!(tracker.update(&store).is_empty());

        // Started (the agent sees that), a new pod elsewhere, and one finished.
        put(&mut store, "b", "n2", "3", "Running");
        put(&mut store, "c", "n3", "1", "Pending");
        put(&mut store, "a", "n1", "2", "Succeeded");
        let changed = tracker.update(&store);
        assert_eq!(changed.keys().collect::<Vec<_>>(), ["n1", "n2", "n3"]);
        assert_eq!(tracker.take_ended(), BTreeSet::from(["a".to_owned()]));
        assert!(changed["n1"].pods.is_empty(), "n1's pod finished");
        assert!(changed["n2"].pods[0].started);
        assert_eq!(names(&changed["n3"]), ["c"]);

        // Deleted from the cache: its node is told.
        store.pods.remove("c");
        let changed = tracker.update(&store);
        assert_eq!(tracker.take_ended(), BTreeSet::from(["c".to_owned()]));
        assert_eq!(changed.keys().collect::<Vec<_>>(), ["n3"]);
        assert!(changed["n3"].pods.is_empty());
        assert_eq!(
            {
                let mut all = tracker.update(&store);
                all.retain(|_, p| !p.pods.is_empty());
                all
            },
            BTreeMap::new()
        );
        // Whatever happened in between, the lists equal a rebuild from scratch.
        let mut fresh = Tracker::default();
        assert_eq!(fresh.update(&store), by_node(&store));
    }

    /// Random changes noted in a pod log: looking only at the noted pods gives, step by step,
    /// what comparing every pod gives.
    #[test]
    fn looking_at_the_changed_pods_gives_what_comparing_every_pod_gives() {
        use super::super::pod_log::Logs;
        use rand::{Rng, SeedableRng};
        for seed in 0..20 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let logs = Logs::default();
            let log = logs.open();
            let (mut every, mut changed) = (Tracker::default(), Tracker::default());
            let mut store = Store::default();
            for step in 0..300u32 {
                for _ in 0..rng.random_range(1..6) {
                    let name = format!("p{}", rng.random_range(0..40));
                    if rng.random_bool(0.2) {
                        store.pods.remove(&name);
                    } else {
                        let node = ["", "n1", "n2", "n3"][rng.random_range(0..4)];
                        let phase = ["Pending", "Running", "Succeeded"][rng.random_range(0..3)];
                        put(&mut store, &name, node, &step.to_string(), phase);
                    }
                    logs.changed(&name);
                }
                if rng.random_bool(0.05) {
                    logs.relisted();
                }
                let want = every.update(&store);
                assert_eq!(
                    changed.update_changed(&store, log.take()),
                    want,
                    "seed {seed} step {step}"
                );
                let ended = every.take_ended();
                assert!(
                    changed.take_ended().is_superset(&ended),
                    "seed {seed} step {step}"
                );
            }
            assert_eq!(changed.nodes, every.nodes);
        }
    }

    #[test]
    fn publishing_changes_leaves_other_nodes_alone_and_a_late_node_starts_empty() {
        let registry = AgentRegistry::new();
        let mut n1 = registry.node_pods("n1");
        let one = |name: &str| pb::NodePods {
            pods: vec![pb::BoundPod {
                uid: name.into(),
                name: name.into(),
                ..Default::default()
            }],
        };
        registry.publish_node_pods(BTreeMap::from([
            ("n1".to_owned(), one("a")),
            ("n2".to_owned(), one("b")),
        ]));
        assert_eq!(names(n1.borrow_and_update().as_deref().unwrap()), ["a"]);
        let mut n2 = registry.node_pods("n2");
        n2.borrow_and_update();
        registry.publish_changed_node_pods(
            BTreeMap::from([("n2".to_owned(), one("c"))]),
            &BTreeSet::new(),
        );
        assert!(!n1.has_changed().unwrap(), "n1 did not change");
        assert_eq!(names(n2.borrow_and_update().as_deref().unwrap()), ["c"]);

        // A node that never had pods gets a complete, empty list at once, with what is
        // being bound there.
        let late = registry.node_pods("n9");
        assert_eq!(late.borrow().as_deref(), Some(&pb::NodePods::default()));
        registry.announce_binding("n9", one("d").pods.remove(0));
        registry.publish_changed_node_pods(BTreeMap::new(), &BTreeSet::new());
        assert_eq!(
            names(late.borrow().as_deref().unwrap()),
            ["d"],
            "announcements stay"
        );
        // Bound and failed between two updates: never listed, but ended all the same.
        registry.publish_changed_node_pods(BTreeMap::new(), &BTreeSet::from(["d".to_owned()]));
        assert_eq!(late.borrow().as_deref(), Some(&pb::NodePods::default()));

        // On a node with pods, left out of later publishes: announcements come and go
        // around its list, which stays.
        let pod = |name: &str| one(name).pods.remove(0);
        registry.announce_binding("n2", pod("e"));
        registry.announce_binding("n2", pod("f"));
        registry.withdraw_binding("n2", "f");
        assert_eq!(
            names(n2.borrow_and_update().as_deref().unwrap()),
            ["c", "e"]
        );
        registry.publish_changed_node_pods(BTreeMap::new(), &BTreeSet::new());
        assert_eq!(
            names(n2.borrow_and_update().as_deref().unwrap()),
            ["c", "e"],
            "a withdrawn announcement does not come back"
        );
        registry.publish_changed_node_pods(BTreeMap::new(), &BTreeSet::from(["e".to_owned()]));
        assert_eq!(names(n2.borrow_and_update().as_deref().unwrap()), ["c"]);
        // Landed: listed, its announcement ends, and later ends of others leave it.
        registry.announce_binding("n2", pod("g"));
        let mut landed = one("c");
        landed.pods.push(pod("g"));
        registry.publish_changed_node_pods(
            BTreeMap::from([("n2".to_owned(), landed)]),
            &BTreeSet::new(),
        );
        registry.publish_changed_node_pods(BTreeMap::new(), &BTreeSet::from(["x".to_owned()]));
        assert_eq!(
            names(n2.borrow_and_update().as_deref().unwrap()),
            ["c", "g"]
        );
    }
}
