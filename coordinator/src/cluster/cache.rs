//! The coordinator's copy of the cluster: kube-runtime watchers on pods (of every scheduler, so
//! what others run is counted), nodes, queues, pod groups (Tessera's, and the Workload API's
//! `scheduling.k8s.io/v1beta1` ones, which pods name in `spec.schedulingGroup`; kube-scheduler
//! reads no Workload object, and neither does Tessera), topologies, priority classes,
//! namespaces (labels for inter-pod terms' namespace selectors), and the claims, volumes and
//! storage classes that give pending pods their volumes' node affinity, each feeding one table
//! of an incremental store keyed by uid or name.
//!
//! Every event bumps a change counter the scheduling loop waits on, and each pod event is
//! noted in the readers' [`PodLog`]s. The cache is ready once
//! every watcher finished its initial list; a custom resource whose CRD is not installed
//! (404 on list) counts as an empty, listed table so a cluster without Topology objects is
//! still schedulable; so does the Workload API's group on a cluster that does not serve it
//! (its feature gate is off by default).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::scheduling::v1beta1::PodGroup as WorkloadPodGroup;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::pod_log::{Changed, Logs, PodLog};
use crate::crd::{PodGroup, Queue, Topology};

/// Everything the watchers know, by key. Cloning is cheap (objects are shared).
#[derive(Clone, Debug, Default)]
pub struct Store {
    /// Pods of every scheduler, by uid (finished pods included; the snapshot skips them).
    pub pods: BTreeMap<String, Arc<Pod>>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Arc<Node>>,
    /// Queues by name.
    pub queues: BTreeMap<String, Arc<Queue>>,
    /// PodGroups by `namespace/name`.
    pub pod_groups: BTreeMap<String, Arc<PodGroup>>,
    /// The Workload API's PodGroups (`scheduling.k8s.io/v1beta1`) by `namespace/name`.
    pub workload_pod_groups: BTreeMap<String, Arc<WorkloadPodGroup>>,
    /// Topologies by name.
    pub topologies: BTreeMap<String, Arc<Topology>>,
    /// PriorityClasses by name.
    pub priority_classes: BTreeMap<String, Arc<PriorityClass>>,
    /// Namespaces by name.
    pub namespaces: BTreeMap<String, Arc<Namespace>>,
    /// PersistentVolumeClaims by `namespace/name`.
    pub claims: BTreeMap<String, Arc<PersistentVolumeClaim>>,
    /// PersistentVolumes by name.
    pub volumes: BTreeMap<String, Arc<PersistentVolume>>,
    /// StorageClasses by name.
    pub storage_classes: BTreeMap<String, Arc<StorageClass>>,
    /// PodDisruptionBudgets by `namespace/name`.
    pub disruption_budgets: BTreeMap<String, Arc<PodDisruptionBudget>>,
}

/// An object type the cache keeps, and where.
trait Cached: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static {
    /// Display name for logs.
    const KIND: &'static str;
    /// Its key, `None` for objects the store cannot index.
    fn key(&self) -> Option<String>;
    /// Its table.
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>>;
    /// Whether changes to it are noted in the [`PodLog`]s (pods only).
    const LOGGED: bool = false;
    /// Drops what the coordinator never reads (managed fields are most of a pod's size).
    fn trim(&mut self) {
        self.meta_mut().managed_fields = None;
    }
}

impl Cached for Pod {
    const KIND: &'static str = "pods";
    const LOGGED: bool = true;
    fn key(&self) -> Option<String> {
        self.metadata.uid.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.pods
    }
}

impl Cached for Node {
    const KIND: &'static str = "nodes";
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.nodes
    }
    fn trim(&mut self) {
        self.metadata.managed_fields = None;
        // Image lists can be large and are never read.
        if let Some(s) = self.status.as_mut() {
            s.images = None;
        }
    }
}

impl Cached for Queue {
    const KIND: &'static str = "queues";
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.queues
    }
}

impl Cached for PodGroup {
    const KIND: &'static str = "podgroups";
    fn key(&self) -> Option<String> {
        namespaced_key(self)
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.pod_groups
    }
}

impl Cached for WorkloadPodGroup {
    const KIND: &'static str = "podgroups.scheduling.k8s.io";
    fn key(&self) -> Option<String> {
        namespaced_key(self)
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.workload_pod_groups
    }
}

impl Cached for Topology {
    const KIND: &'static str = "topologies";
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.topologies
    }
}

impl Cached for PriorityClass {
    const KIND: &'static str = "priorityclasses";
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.priority_classes
    }
}

impl Cached for Namespace {
    const KIND: &'static str = "namespaces";
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.namespaces
    }
}

impl Cached for PersistentVolumeClaim {
    const KIND: &'static str = "persistentvolumeclaims";
    fn key(&self) -> Option<String> {
        namespaced_key(self)
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.claims
    }
}

impl Cached for PersistentVolume {
    const KIND: &'static str = "persistentvolumes";
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.volumes
    }
}

impl Cached for StorageClass {
    const KIND: &'static str = "storageclasses";
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.storage_classes
    }
}

impl Cached for PodDisruptionBudget {
    const KIND: &'static str = "poddisruptionbudgets";
    fn key(&self) -> Option<String> {
        namespaced_key(self)
    }
    fn table(store: &mut Store) -> &mut BTreeMap<String, Arc<Self>> {
        &mut store.disruption_budgets
    }
}

/// `namespace/name`, the key of namespaced tables.
fn namespaced_key<K: Resource>(object: &K) -> Option<String> {
    Some(format!(
        "{}/{}",
        object.meta().namespace.as_deref()?,
        object.meta().name.as_deref()?
    ))
}

/// Number of watchers (one per table).
const WATCHERS: usize = 12;

struct Inner {
    store: RwLock<Store>,
    /// Noted under the store's write lock, taken under its read lock.
    pod_logs: Logs,
    changes: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    listed: Mutex<[bool; WATCHERS]>,
}

impl Inner {
    fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn mark_listed(&self, slot: usize) {
        let all = {
            let mut listed = self.listed.lock();
            listed[slot] = true;
            listed.iter().all(|l| *l)
        };
        if all {
            self.ready.send_if_modified(|r| !std::mem::replace(r, true));
        }
        self.bump();
    }
}

/// The watchers and their store; cheap to clone.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Cache {
    /// Starts every watcher on `client`.
    pub fn start(client: &kube::Client) -> Self {
        let (changes, _) = watch::channel(0);
        let (ready, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            store: RwLock::new(Store::default()),
            pod_logs: Logs::default(),
            changes,
            ready,
            listed: Mutex::new([false; WATCHERS]),
        });
        let tasks = vec![
            spawn_watcher::<Pod>(Api::all(client.clone()), Arc::clone(&inner), 0),
            spawn_watcher::<Node>(Api::all(client.clone()), Arc::clone(&inner), 1),
            spawn_watcher::<Queue>(Api::all(client.clone()), Arc::clone(&inner), 2),
            spawn_watcher::<PodGroup>(Api::all(client.clone()), Arc::clone(&inner), 3),
            spawn_watcher::<Topology>(Api::all(client.clone()), Arc::clone(&inner), 4),
            spawn_watcher::<PriorityClass>(Api::all(client.clone()), Arc::clone(&inner), 5),
            spawn_watcher::<Namespace>(Api::all(client.clone()), Arc::clone(&inner), 6),
            spawn_watcher::<PersistentVolumeClaim>(Api::all(client.clone()), Arc::clone(&inner), 7),
            spawn_watcher::<PersistentVolume>(Api::all(client.clone()), Arc::clone(&inner), 8),
            spawn_watcher::<StorageClass>(Api::all(client.clone()), Arc::clone(&inner), 9),
            spawn_watcher::<PodDisruptionBudget>(Api::all(client.clone()), Arc::clone(&inner), 10),
            spawn_watcher::<WorkloadPodGroup>(Api::all(client.clone()), Arc::clone(&inner), 11),
        ];
        Self {
            inner,
            tasks: Arc::new(Mutex::new(tasks)),
        }
    }

    /// A consistent copy of the store (objects shared, not copied).
    pub fn store(&self) -> Store {
        self.inner.store.read().clone()
    }

    /// Runs `f` on the store under the read lock (for small lookups).
    pub fn read<R>(&self, f: impl FnOnce(&Store) -> R) -> R {
        f(&self.inner.store.read())
    }

    /// A new reader's record of which pods change; its first take is [`Changed::All`].
    pub fn pod_log(&self) -> PodLog {
        self.inner.pod_logs.open()
    }

    /// Runs `f` on the store under the read lock with what changed in its pods since `log`
    /// was last taken (taken now, under the same lock, so the two agree).
    pub fn read_pod_changes<R>(&self, log: &PodLog, f: impl FnOnce(&Store, Changed) -> R) -> R {
        let store = self.inner.store.read();
        f(&store, log.take())
    }

    /// Bumped on every change to any table.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// True once every watcher finished its initial list.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.inner.ready.subscribe()
    }

    /// Whether every watcher finished its initial list.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// Stops every watcher.
    pub fn stop(&self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

fn spawn_watcher<K: Cached>(api: Api<K>, inner: Arc<Inner>, slot: usize) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut fresh: Option<BTreeMap<String, Arc<K>>> = None;
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut last_error: Option<String> = None;
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(e) => e,
                Err(error) => {
                    // A custom resource whose CRD is absent: empty, and listed.
                    if let watcher::Error::InitialListFailed(kube::Error::Api(s)) = &error
                        && s.code == 404
                    {
                        {
                            let mut store = inner.store.write();
                            K::table(&mut store).clear();
                        }
                        inner.mark_listed(slot);
                    }
                    let text = error.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(kind = K::KIND, error = %text, "watch failed; retrying");
                        last_error = Some(text);
                    }
                    continue;
                }
            };
            last_error = None;
            match event {
                watcher::Event::Init => fresh = Some(BTreeMap::new()),
                watcher::Event::InitApply(mut obj) => {
                    obj.trim();
                    if let (Some(map), Some(key)) = (fresh.as_mut(), obj.key()) {
                        map.insert(key, Arc::new(obj));
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(map) = fresh.take() {
                        let mut store = inner.store.write();
                        *K::table(&mut store) = map;
                        if K::LOGGED {
                            inner.pod_logs.relisted();
                        }
                    }
                    inner.mark_listed(slot);
                }
                watcher::Event::Apply(mut obj) => {
                    obj.trim();
                    if let Some(key) = obj.key() {
                        let mut store = inner.store.write();
                        if K::LOGGED {
                            inner.pod_logs.changed(&key);
                        }
                        K::table(&mut store).insert(key, Arc::new(obj));
                        drop(store);
                        inner.bump();
                    }
                }
                watcher::Event::Delete(obj) => {
                    if let Some(key) = obj.key() {
                        let mut store = inner.store.write();
                        K::table(&mut store).remove(&key);
                        if K::LOGGED {
                            inner.pod_logs.changed(&key);
                        }
                        drop(store);
                        inner.bump();
                    }
                }
            }
        }
    })
}
