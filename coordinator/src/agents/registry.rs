//! The live inventory the agents report: per node its GPUs (as the core's `model::Gpu`,
//! NVLink islands derived from the link matrix), health, occupancy, and whether its
//! agent is connected. Every change that matters to scheduling bumps a watch counter.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_proto::tessera::v1 as pb;
use tokio::sync::{mpsc, watch};

use tessera_core::model::{Gpu, MigInstance};

use super::limits::{self, FieldError, Steps};

/// What one node's agent last reported.
#[derive(Clone, Debug)]
pub struct AgentNode {
    /// Kubernetes node name.
    pub node: String,
    /// Agent build version from its inventory.
    pub agent_version: String,
    /// The `tessera.v1` revision spoken on the current (or last) stream.
    pub protocol_version: u32,
    /// GPUs in index order, health and NVLink islands filled in.
    pub gpus: Vec<Gpu>,
    /// Slots the agent advertises per healthy GPU.
    pub shares_per_gpu: u32,
    /// Occupancy per GPU UUID from the latest snapshot (empty until the first one).
    pub occupancy: BTreeMap<String, GpuOccupancy>,
    /// Why each unhealthy GPU is unhealthy (UUID -> reason).
    pub health_reasons: BTreeMap<String, String>,
    /// UIDs of the pods the agent reports allocated but not started (revision 2): the
    /// kubelet has every device of theirs, so another pod with a request of the same size
    /// can no longer be mistaken for them.
    pub allocated_pods: BTreeSet<String>,
    /// Occupancy reports received from this node's agents, changed or not: what is decided
    /// from "the agent's next report" waits until this count moves past the decision's.
    pub occupancy_reports: u64,
    /// A stream from this node's agent is open now.
    pub connected: bool,
    /// When the agent last sent anything (heartbeats included).
    pub last_seen: Instant,
}

impl AgentNode {
    /// True when the agent is connected and has spoken within `timeout`: only such nodes
    /// should receive new GPU pods.
    pub fn is_live(&self, now: Instant, timeout: Duration) -> bool {
        self.connected && now.saturating_duration_since(self.last_seen) <= timeout
    }
}

/// One GPU's occupancy as last reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuOccupancy {
    /// Healthy per the snapshot.
    pub healthy: bool,
    /// Every share held on the GPU.
    pub shares: Vec<ShareInfo>,
    /// Whole-GPU memory in use, including processes no pod owns.
    pub used_memory_mib: u64,
    /// Whole-GPU utilisation.
    pub utilization_percent: u32,
}

/// One container's share of a GPU as the agent sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareInfo {
    /// Pod UID (empty when the agent could not tell).
    pub pod_uid: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Container name.
    pub container: String,
    /// Granted memory limit (0 = whole GPU).
    pub memory_limit_mib: u64,
    /// Granted compute percent (0 = no limit).
    pub compute_percent: u32,
    /// Measured memory of the pod's processes.
    pub measured_memory_mib: u64,
    /// Measured utilisation of the pod's processes.
    pub measured_utilization_percent: u32,
    /// MIG device UUID when the share is a MIG instance.
    pub mig_instance_uuid: String,
}

/// A report about a GPU the node's inventory does not list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU {0} is not in the node's inventory")]
pub struct UnknownGpu(pub String);

/// Why an occupancy or health report was not (wholly) applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The report breaks a limit or is malformed; nothing of it was applied.
    #[error(transparent)]
    Invalid(#[from] FieldError),
    /// It names a GPU the inventory does not list (the rest was applied): the agent knows
    /// hardware the coordinator does not, and is asked for a resync.
    #[error(transparent)]
    UnknownGpu(#[from] UnknownGpu),
}

/// A node's GPUs (sorted by index) with the position of each by UUID, so a report about
/// one GPU is one map lookup whatever the node's size.
#[derive(Clone, Debug, Default)]
struct Gpus {
    list: Vec<Gpu>,
    by_uuid: HashMap<String, usize>,
}

impl Gpus {
    /// Converts and checks an inventory (outside any lock: linear, but not free).
    fn from_inventory(inventory: &pb::NodeInventory, prefix: &str) -> Result<Self, FieldError> {
        let list = gpus_from_inventory_at(prefix, inventory, &mut Steps::default())?;
        let by_uuid = list
            .iter()
            .enumerate()
            .map(|(i, g)| (g.uuid.clone(), i))
            .collect();
        Ok(Self { list, by_uuid })
    }
}

struct Entry {
    view: AgentNode,
    /// Position of each of `view.gpus` by UUID.
    by_uuid: HashMap<String, usize>,
    /// Distinguishes streams: a stale stream ending must not disconnect a newer one.
    session: u64,
    /// The open stream's outbound side, for Resync.
    outbound: Option<mpsc::Sender<pb::CoordinatorMessage>>,
}

/// How long a pod announced by [`AgentRegistry::announce_binding`] stays in its node's
/// snapshots without the cache showing it bound there.
const ANNOUNCED_FOR: Duration = Duration::from_secs(30);

/// One node's announced pods by uid, with when each was announced.
type Announced = BTreeMap<String, (pb::BoundPod, Instant)>;

/// The latest `NodePods` of one node; `None` until the pod cache is complete.
type PodsCell = watch::Sender<Option<Arc<pb::NodePods>>>;

struct Inner {
    nodes: Mutex<BTreeMap<String, Entry>>,
    /// Per node, what its agent's stream sends as `NodePods` (kept apart from `nodes`:
    /// pods are published for nodes whose agent has not connected yet).
    pods: Mutex<BTreeMap<String, PodsCell>>,
    /// Pods this replica is binding, by node then uid, with when: included in the node's
    /// snapshots until the cache shows them there, or [`ANNOUNCED_FOR`] passed (the
    /// Binding failed and the cache never will).
    announced: Mutex<BTreeMap<String, Announced>>,
    /// Whether a complete snapshot was published: from then on a node without a cell has
    /// no pods (every publish makes a cell for each node it names).
    pods_published: std::sync::atomic::AtomicBool,
    changes: watch::Sender<u64>,
    next_session: Mutex<u64>,
}

/// Live inventory of every node whose agent has connected; cheap to clone.
#[derive(Clone)]
pub struct AgentRegistry {
    inner: Arc<Inner>,
}

impl Default for AgentRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for AgentRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRegistry")
            .field("nodes", &self.inner.nodes.lock().len())
            .finish()
    }
}

/// Handle of one accepted stream, returned by [`AgentRegistry::connect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Node name.
    pub node: String,
    id: u64,
}

impl AgentRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        let (changes, _) = watch::channel(0);
        Self {
            inner: Arc::new(Inner {
                nodes: Mutex::new(BTreeMap::new()),
                pods: Mutex::new(BTreeMap::new()),
                announced: Mutex::new(BTreeMap::new()),
                pods_published: std::sync::atomic::AtomicBool::new(false),
                changes,
                next_session: Mutex::new(0),
            }),
        }
    }

    /// The node's latest report, if its agent ever connected.
    pub fn get(&self, node: &str) -> Option<AgentNode> {
        self.inner.nodes.lock().get(node).map(|e| e.view.clone())
    }

    /// Every node's latest report, by node name.
    pub fn all(&self) -> Vec<AgentNode> {
        self.inner
            .nodes
            .lock()
            .values()
            .map(|e| e.view.clone())
            .collect()
    }

    /// Per node, the pods its agent reports allocated but not started.
    pub fn allocated_by_node(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.inner
            .nodes
            .lock()
            .iter()
            .filter(|(_, e)| !e.view.allocated_pods.is_empty())
            .map(|(n, e)| (n.clone(), e.view.allocated_pods.clone()))
            .collect()
    }

    /// Number of nodes whose agent is connected now.
    pub fn connected_count(&self) -> usize {
        self.inner
            .nodes
            .lock()
            .values()
            .filter(|e| e.view.connected)
            .count()
    }

    /// A receiver whose value is bumped on every inventory, health, occupancy or
    /// connection change (not on heartbeats).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    fn bump(&self) {
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Records a new stream for `inventory.node_name`, replacing any older one.
    pub fn connect(
        &self,
        inventory: &pb::NodeInventory,
        protocol_version: u32,
        outbound: mpsc::Sender<pb::CoordinatorMessage>,
    ) -> Result<Session, FieldError> {
        let Gpus {
            list: gpus,
            by_uuid,
        } = Gpus::from_inventory(inventory, "hello.inventory")?;
        let id = {
            let mut next = self.inner.next_session.lock();
            *next += 1;
            *next
        };
        let node = inventory.node_name.clone();
        {
            let mut nodes = self.inner.nodes.lock();
            let previous = nodes.remove(&node);
            let mut view = AgentNode {
                node: node.clone(),
                agent_version: inventory.agent_version.clone(),
                protocol_version,
                gpus,
                shares_per_gpu: inventory.shares_per_gpu,
                occupancy: BTreeMap::new(),
                health_reasons: BTreeMap::new(),
                allocated_pods: BTreeSet::new(),
                occupancy_reports: 0,
                connected: true,
                last_seen: Instant::now(),
            };
            // Health is not part of the inventory; keep what we knew until the agent's
            // first occupancy snapshot says otherwise.
            if let Some(prev) = &previous {
                // Counted per node, not per stream: a wait for "the next report" survives a
                // reconnect.
                view.occupancy_reports = prev.view.occupancy_reports;
                carry_health(&prev.view, &prev.by_uuid, &mut view);
            }
            // Dropping the previous entry drops its stream's side channel: that stream
            // learns it was replaced and ends (one live stream per node).
            drop(previous);
            nodes.insert(
                node.clone(),
                Entry {
                    view,
                    by_uuid,
                    session: id,
                    outbound: Some(outbound),
                },
            );
        }
        self.bump();
        Ok(Session { node, id })
    }

    /// Runs `f` on the entry of `session` if it is still the node's current stream.
    fn with_current<R>(&self, session: &Session, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let mut nodes = self.inner.nodes.lock();
        let entry = nodes.get_mut(&session.node)?;
        (entry.session == session.id).then(|| f(entry))
    }

    /// The agent said something (any message): refresh `last_seen`.
    pub fn touch(&self, session: &Session) {
        self.with_current(session, |e| e.view.last_seen = Instant::now());
    }

    /// Replaces the node's inventory (the agent's hardware changed, or a Resync).
    pub fn replace_inventory(
        &self,
        session: &Session,
        inventory: &pb::NodeInventory,
    ) -> Result<(), FieldError> {
        let Gpus {
            list: gpus,
            by_uuid,
        } = Gpus::from_inventory(inventory, "inventory")?;
        let changed = self.with_current(session, |e| {
            let old_gpus = std::mem::replace(&mut e.view.gpus, gpus);
            let old_index = std::mem::replace(&mut e.by_uuid, by_uuid);
            let old_shares = e.view.shares_per_gpu;
            let old_reasons = std::mem::take(&mut e.view.health_reasons);
            e.view.agent_version = inventory.agent_version.clone();
            e.view.shares_per_gpu = inventory.shares_per_gpu;
            e.view.last_seen = Instant::now();
            carry_health_from(&old_gpus, &old_index, &old_reasons, &mut e.view);
            let index = &e.by_uuid;
            e.view.occupancy.retain(|uuid, _| index.contains_key(uuid));
            old_gpus != e.view.gpus || old_shares != e.view.shares_per_gpu
        });
        if changed == Some(true) {
            self.bump();
        }
        Ok(())
    }

    /// Stores a full occupancy snapshot (health included). Unknown GPUs are reported
    /// back so the caller can ask for a resync; the known ones are still applied. A
    /// snapshot over a limit is refused whole.
    pub fn set_occupancy(
        &self,
        session: &Session,
        occupancy: &pb::Occupancy,
    ) -> Result<(), ReportError> {
        limits::check_occupancy(occupancy, &mut Steps::default())?;
        // Converted before the lock is taken: under it, one map lookup per GPU.
        let reported: Vec<(&str, Option<bool>, GpuOccupancy)> = occupancy
            .gpus
            .iter()
            .map(|o| {
                let healthy = match pb::Health::try_from(o.health) {
                    Ok(pb::Health::Healthy) => Some(true),
                    Ok(pb::Health::Unhealthy) => Some(false),
                    // An unspecified health keeps what we knew.
                    _ => None,
                };
                let next = GpuOccupancy {
                    healthy: false,
                    shares: o.shares.iter().map(share).collect(),
                    used_memory_mib: o.used_memory_mib,
                    utilization_percent: o.utilization_percent,
                };
                (o.gpu_uuid.as_str(), healthy, next)
            })
            .collect();
        let allocated: BTreeSet<String> = occupancy.allocated_pod_uids.iter().cloned().collect();
        let mut unknown = None;
        let changed = self.with_current(session, |e| {
            e.view.last_seen = Instant::now();
            e.view.occupancy_reports += 1;
            let mut changed = false;
            for ((uuid, healthy, mut next), o) in reported.into_iter().zip(&occupancy.gpus) {
                let Some(&at) = e.by_uuid.get(uuid) else {
                    if unknown.is_none() {
                        unknown = Some(UnknownGpu(uuid.to_owned()));
                    }
                    continue;
                };
                let gpu = &mut e.view.gpus[at];
                let healthy = healthy.unwrap_or(gpu.healthy);
                changed |= apply_health(gpu, &mut e.view.health_reasons, healthy, &o.health_reason);
                next.healthy = healthy;
                if e.view.occupancy.get(uuid) != Some(&next) {
                    e.view.occupancy.insert(uuid.to_owned(), next);
                    changed = true;
                }
            }
            if e.view.allocated_pods != allocated {
                e.view.allocated_pods = allocated;
                changed = true;
            }
            changed
        });
        if changed == Some(true) {
            self.bump();
        }
        unknown.map_or(Ok(()), |u| Err(u.into()))
    }

    /// Applies one GPU's health change.
    pub fn set_health(
        &self,
        session: &Session,
        change: &pb::HealthChange,
    ) -> Result<(), ReportError> {
        limits::check_health_change(change, &mut Steps::default())?;
        let healthy = match pb::Health::try_from(change.health) {
            Ok(pb::Health::Healthy) => true,
            Ok(pb::Health::Unhealthy) => false,
            // Nothing to learn from an unspecified health.
            _ => {
                self.touch(session);
                return Ok(());
            }
        };
        let reason = if change.reason.is_empty() && change.xid != 0 {
            format!("XID {}", change.xid)
        } else {
            change.reason.clone()
        };
        let outcome = self.with_current(session, |e| {
            e.view.last_seen = Instant::now();
            let Some(&at) = e.by_uuid.get(&change.gpu_uuid) else {
                return Err(UnknownGpu(change.gpu_uuid.clone()));
            };
            let gpu = &mut e.view.gpus[at];
            let changed = apply_health(gpu, &mut e.view.health_reasons, healthy, &reason);
            if let Some(o) = e.view.occupancy.get_mut(&change.gpu_uuid) {
                o.healthy = healthy;
            }
            Ok(changed)
        });
        match outcome {
            Some(Ok(true)) => {
                self.bump();
                Ok(())
            }
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// The stream of `session` ended: the node is disconnected unless a newer stream
    /// took its place.
    pub fn disconnect(&self, session: &Session) {
        let changed = self.with_current(session, |e| {
            e.outbound = None;
            std::mem::replace(&mut e.view.connected, false)
        });
        if changed == Some(true) {
            self.bump();
        }
    }

    /// Publishes every node's pods (from a complete pod cache): each node's stream sends
    /// its snapshot when it differs from the last one; nodes missing from `pods` get an
    /// empty one (their pods are all gone).
    pub fn publish_node_pods(&self, pods: BTreeMap<String, pb::NodePods>) {
        self.publish(pods, &BTreeSet::new(), true);
    }

    /// Publishes the pods of the nodes in `changed` only (each node's complete list, empty
    /// when its pods all left), after one complete [`AgentRegistry::publish_node_pods`]:
    /// the other nodes' snapshots stay as they are, but for their announcements, which are
    /// kept up to date on every call. What a large cluster's pod cache publishes on each
    /// change, instead of every node's pods. `ended`: pods the cache showed finished or gone
    /// since the last call, whose announcements end although no list may have shown them
    /// (bound and failed between two calls); otherwise the agent would take a later pod of
    /// the same shape for one that no longer runs.
    pub fn publish_changed_node_pods(
        &self,
        changed: BTreeMap<String, pb::NodePods>,
        ended: &BTreeSet<String>,
    ) {
        self.publish(changed, ended, false);
    }

    fn publish(
        &self,
        mut pods: BTreeMap<String, pb::NodePods>,
        ended: &BTreeSet<String>,
        complete: bool,
    ) {
        // Held until the cells are updated: an announcement made meanwhile then either is in
        // the lists sent here or reaches its cell after them, never under them.
        let mut announced = self.inner.announced.lock();
        // Per node left out of a partial publish: the announcements that end, to take out of
        // its cell. (Its cell is its last list plus the announcements standing since, and
        // an announcement still standing after a publish is not in its node's list: once
        // listed it ends there.)
        let mut ending: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (node, by_uid) in announced.iter_mut() {
            let over =
                |uid: &String, at: &Instant| ended.contains(uid) || at.elapsed() > ANNOUNCED_FOR;
            let list = if complete {
                Some(pods.entry(node.clone()).or_default())
            } else {
                pods.get_mut(node)
            };
            match list {
                Some(list) => {
                    let listed: std::collections::HashSet<&str> =
                        list.pods.iter().map(|p| p.uid.as_str()).collect();
                    let mut add = Vec::new();
                    by_uid.retain(|uid, (pod, at)| {
                        if listed.contains(uid.as_str()) || over(uid, at) {
                            return false;
                        }
                        add.push(pod.clone());
                        true
                    });
                    list.pods.extend(add);
                }
                None => by_uid.retain(|uid, (_, at)| {
                    if over(uid, at) {
                        ending.entry(node.clone()).or_default().push(uid.clone());
                        return false;
                    }
                    true
                }),
            }
        }
        let mut cells = self.inner.pods.lock();
        for (node, cell) in cells.iter() {
            let next = match pods.remove(node) {
                Some(next) => next,
                None if complete => pb::NodePods::default(),
                None => {
                    if let Some(uids) = ending.get(node) {
                        cell.send_if_modified(|current| {
                            let Some(snapshot) = current else {
                                return false;
                            };
                            let mut next = (**snapshot).clone();
                            next.pods.retain(|p| !uids.contains(&p.uid));
                            let changed = next.pods.len() != snapshot.pods.len();
                            if changed {
                                *current = Some(Arc::new(next));
                            }
                            changed
                        });
                    }
                    continue;
                }
            };
            cell.send_if_modified(|current| {
                if current.as_deref() == Some(&next) {
                    return false;
                }
                *current = Some(Arc::new(next));
                true
            });
        }
        for (node, next) in pods {
            let (cell, _) = watch::channel(Some(Arc::new(next)));
            cells.insert(node, cell);
        }
        announced.retain(|_, by_uid| !by_uid.is_empty());
        if complete {
            self.inner
                .pods_published
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Adds `pod`, about to be bound to `node`, to that node's snapshot at once (and to every
    /// later one until the cache shows it): the agent must know a pod before its kubelet can.
    /// Nothing is sent before the first complete snapshot.
    pub fn announce_binding(&self, node: &str, pod: pb::BoundPod) {
        self.inner
            .announced
            .lock()
            .entry(node.to_owned())
            .or_default()
            .insert(pod.uid.clone(), (pod.clone(), Instant::now()));
        if let Some(cell) = self.inner.pods.lock().get(node) {
            cell.send_if_modified(|current| {
                let Some(snapshot) = current else {
                    return false;
                };
                let mut next = (**snapshot).clone();
                next.pods.retain(|p| p.uid != pod.uid);
                next.pods.push(pod);
                *current = Some(Arc::new(next));
                true
            });
        }
    }

    /// Takes back an announcement whose Binding failed.
    pub fn withdraw_binding(&self, node: &str, uid: &str) {
        let mut announced = self.inner.announced.lock();
        let Some(by_uid) = announced.get_mut(node) else {
            return;
        };
        if by_uid.remove(uid).is_none() {
            return;
        }
        drop(announced);
        if let Some(cell) = self.inner.pods.lock().get(node) {
            cell.send_if_modified(|current| {
                let Some(snapshot) = current else {
                    return false;
                };
                let mut next = (**snapshot).clone();
                let before = next.pods.len();
                next.pods.retain(|p| p.uid != uid);
                let changed = next.pods.len() != before;
                if changed {
                    *current = Some(Arc::new(next));
                }
                changed
            });
        }
    }

    /// The `NodePods` of `node` as they change; `None` until first published.
    pub fn node_pods(&self, node: &str) -> watch::Receiver<Option<Arc<pb::NodePods>>> {
        let published = self
            .inner
            .pods_published
            .load(std::sync::atomic::Ordering::Acquire);
        // After a complete publish, a node without a cell had no pods in any snapshot since.
        // (Read before the cells are locked: `publish` takes the two locks in this order.)
        let first = published.then(|| {
            let announced = self.inner.announced.lock();
            Arc::new(pb::NodePods {
                pods: announced
                    .get(node)
                    .map(|by_uid| by_uid.values().map(|(p, _)| p.clone()).collect())
                    .unwrap_or_default(),
            })
        });
        self.inner
            .pods
            .lock()
            .entry(node.to_owned())
            .or_insert_with(|| watch::channel(first).0)
            .subscribe()
    }

    /// Asks `node`'s agent to send its inventory and occupancy again. False when the
    /// node has no open stream (or its outbound queue is full).
    pub fn request_resync(&self, node: &str, reason: &str) -> bool {
        let outbound = self
            .inner
            .nodes
            .lock()
            .get(node)
            .and_then(|e| e.outbound.clone());
        outbound.is_some_and(|tx| tx.try_send(resync(reason)).is_ok())
    }

    /// Asks every connected agent to resync (e.g. after this replica became leader).
    pub fn resync_all(&self, reason: &str) -> usize {
        let senders: Vec<_> = self
            .inner
            .nodes
            .lock()
            .values()
            .filter_map(|e| e.outbound.clone())
            .collect();
        senders
            .into_iter()
            .filter(|tx| tx.try_send(resync(reason)).is_ok())
            .count()
    }
}

fn resync(reason: &str) -> pb::CoordinatorMessage {
    pb::CoordinatorMessage {
        body: Some(pb::coordinator_message::Body::Resync(pb::Resync {
            reason: reason.to_owned(),
        })),
    }
}

/// Sets a GPU's health and reason; true when anything changed.
fn apply_health(
    gpu: &mut Gpu,
    reasons: &mut BTreeMap<String, String>,
    healthy: bool,
    reason: &str,
) -> bool {
    let old_reason = if healthy {
        reasons.remove(&gpu.uuid)
    } else {
        reasons.insert(gpu.uuid.clone(), reason.to_owned())
    };
    let changed = gpu.healthy != healthy || (!healthy && old_reason.as_deref() != Some(reason));
    gpu.healthy = healthy;
    changed
}

/// Keeps each GPU's known health (and reason) across a new inventory of the same node.
fn carry_health(old: &AgentNode, old_index: &HashMap<String, usize>, new: &mut AgentNode) {
    carry_health_from(&old.gpus, old_index, &old.health_reasons, new);
}

fn carry_health_from(
    old_gpus: &[Gpu],
    old_index: &HashMap<String, usize>,
    old_reasons: &BTreeMap<String, String>,
    new: &mut AgentNode,
) {
    for gpu in &mut new.gpus {
        if let Some(prev) = old_index.get(&gpu.uuid).and_then(|&i| old_gpus.get(i)) {
            gpu.healthy = prev.healthy;
            if let Some(r) = old_reasons.get(&gpu.uuid) {
                new.health_reasons.insert(gpu.uuid.clone(), r.clone());
            }
        }
    }
}

fn share(s: &pb::Share) -> ShareInfo {
    ShareInfo {
        pod_uid: s.pod_uid.clone(),
        pod_namespace: s.pod_namespace.clone(),
        pod_name: s.pod_name.clone(),
        container: s.container.clone(),
        memory_limit_mib: s.memory_limit_mib,
        compute_percent: s.compute_percent,
        measured_memory_mib: s.measured_memory_mib,
        measured_utilization_percent: s.measured_utilization_percent,
        mig_instance_uuid: s.mig_instance_uuid.clone(),
    }
}

/// Converts and checks an inventory ([`limits::check_inventory`]: caps, node name present,
/// GPU UUIDs unique and non-empty, links between listed GPUs only). GPUs come back sorted
/// by index, all healthy. Linear in the inventory.
pub fn gpus_from_inventory(inv: &pb::NodeInventory) -> Result<Vec<Gpu>, FieldError> {
    gpus_from_inventory_at("inventory", inv, &mut Steps::default())
}

/// [`gpus_from_inventory`] for the inventory at `prefix` in its message, counting `steps`.
pub(crate) fn gpus_from_inventory_at(
    prefix: &str,
    inv: &pb::NodeInventory,
    steps: &mut Steps,
) -> Result<Vec<Gpu>, FieldError> {
    limits::check_inventory(prefix, inv, steps)?;
    let mut position: HashMap<&str, usize> = HashMap::with_capacity(inv.gpus.len());
    let mut gpus: Vec<Gpu> = Vec::with_capacity(inv.gpus.len());
    for (i, g) in inv.gpus.iter().enumerate() {
        steps.0 += 1 + g.mig_instances.len() as u64;
        position.insert(g.uuid.as_str(), i);
        let mig = g.mig_enabled.then(|| {
            g.mig_instances
                .iter()
                .map(|m| MigInstance {
                    profile: m.profile.clone(),
                    memory_mib: m.memory_mib,
                    compute_milli: mig_compute_milli(m, g.memory_mib),
                })
                .collect()
        });
        gpus.push(Gpu {
            uuid: g.uuid.clone(),
            index: g.index,
            model: g.model.clone(),
            memory_mib: g.memory_mib,
            nvlink_island: None,
            healthy: true,
            mig,
            fence: None,
        });
    }
    let links = inv.links.as_ref().map_or(&[][..], |l| l.links.as_slice());
    let mut edges = Vec::new();
    for l in links {
        steps.tick();
        // Both ends are listed: `check_inventory` refused the inventory otherwise.
        if let (Some(&a), Some(&b)) = (
            position.get(l.gpu_a.as_str()),
            position.get(l.gpu_b.as_str()),
        ) && a != b
            && (l.nvlink_count > 0 || l.nvswitch)
        {
            edges.push((a, b));
        }
    }
    steps.0 += (gpus.len() + edges.len()) as u64;
    let islands = nvlink_islands(gpus.len(), &edges);
    for (gpu, island) in gpus.iter_mut().zip(islands) {
        gpu.nvlink_island = island;
    }
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
}

/// Connected components of the NVLink/NVSwitch graph over `n` GPUs. A GPU with no NVLink
/// peer gets `None`; components are numbered from 0 in order of their first GPU.
pub fn nvlink_islands(n: usize, edges: &[(usize, usize)]) -> Vec<Option<u32>> {
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let mut linked = vec![false; n];
    for &(a, b) in edges {
        if a >= n || b >= n {
            continue;
        }
        linked[a] = true;
        linked[b] = true;
        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
        if ra != rb {
            parent[ra.max(rb)] = ra.min(rb);
        }
    }
    let mut ids: BTreeMap<usize, u32> = BTreeMap::new();
    (0..n)
        .map(|i| {
            if !linked[i] {
                return None;
            }
            let r = root(&mut parent, i);
            let next = ids.len() as u32;
            Some(*ids.entry(r).or_insert(next))
        })
        .collect()
}

/// Compute share of a MIG instance: the compute slices it holds of the GPU's, as its agent
/// reports them; from an agent that does not, its share of the GPU's memory.
/// Computed wide, so no reported value can overflow; the result is at most 1000.
fn mig_compute_milli(m: &pb::MigInstance, gpu_memory_mib: u64) -> u32 {
    let milli = if m.compute_slices > 0 && m.gpu_compute_slices >= m.compute_slices {
        u64::from(m.compute_slices) * 1000 / u64::from(m.gpu_compute_slices)
    } else if gpu_memory_mib == 0 {
        0
    } else {
        let share =
            u128::from(m.memory_mib.min(gpu_memory_mib)) * 1000 / u128::from(gpu_memory_mib);
        share as u64
    };
    // At most 1000 by construction (a part over its whole, in thousandths).
    u32::try_from(milli).unwrap_or(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(a: &str, b: &str, nvlink: u32, nvswitch: bool) -> pb::GpuLink {
        pb::GpuLink {
            gpu_a: a.into(),
            gpu_b: b.into(),
            nvlink_count: nvlink,
            nvswitch,
            pcie: pb::PcieRelation::CrossSocket as i32,
        }
    }

    fn inventory(n: u32, links: Vec<pb::GpuLink>) -> pb::NodeInventory {
        pb::NodeInventory {
            node_name: "n1".into(),
            agent_version: "0.1.0".into(),
            gpus: (0..n)
                .map(|i| pb::Gpu {
                    uuid: format!("GPU-{i}"),
                    index: i,
                    model: "H100".into(),
                    memory_mib: 81920,
                    ..Default::default()
                })
                .collect(),
            links: Some(pb::LinkMatrix { links }),
            shares_per_gpu: 10,
        }
    }

    #[test]
    fn islands_are_connected_components_of_nvlink_and_nvswitch() {
        // 0-1 NVLink, 1-2 NVLink (so 0,1,2 one island), 3-4 NVSwitch, 5 alone.
        let inv = inventory(
            6,
            vec![
                link("GPU-0", "GPU-1", 4, false),
                link("GPU-1", "GPU-2", 2, false),
                link("GPU-0", "GPU-5", 0, false),
                link("GPU-3", "GPU-4", 0, true),
            ],
        );
        let gpus = gpus_from_inventory(&inv).unwrap();
        let islands: Vec<_> = gpus.iter().map(|g| g.nvlink_island).collect();
        assert_eq!(
            islands,
            vec![Some(0), Some(0), Some(0), Some(1), Some(1), None]
        );
    }

    #[test]
    fn links_to_unknown_gpus_and_duplicates_are_rejected_naming_the_field() {
        let inv = inventory(2, vec![link("GPU-0", "GPU-9", 1, false)]);
        let e = gpus_from_inventory(&inv).unwrap_err();
        assert_eq!(e.field, "inventory.links.links[0]");
        let mut inv = inventory(2, vec![]);
        inv.gpus[1].uuid = "GPU-0".into();
        let e = gpus_from_inventory(&inv).unwrap_err();
        assert_eq!(e.field, "inventory.gpus[1].uuid");
        let mut inv = inventory(1, vec![]);
        inv.node_name.clear();
        assert_eq!(
            gpus_from_inventory(&inv).unwrap_err().field,
            "inventory.node_name"
        );
    }

    #[test]
    fn mig_compute_share_is_the_reported_slices_else_the_memory_share() {
        let mig = |compute_slices, gpu_compute_slices, memory_mib| pb::MigInstance {
            profile: "any name".into(),
            compute_slices,
            gpu_compute_slices,
            memory_mib,
            ..Default::default()
        };
        assert_eq!(mig_compute_milli(&mig(1, 7, 9856), 81920), 142);
        assert_eq!(mig_compute_milli(&mig(7, 7, 81920), 81920), 1000);
        assert_eq!(mig_compute_milli(&mig(0, 0, 40960), 81920), 500);
        assert_eq!(mig_compute_milli(&mig(3, 0, 40960), 81920), 500);
    }

    #[test]
    fn a_stale_session_does_not_disconnect_a_newer_one() {
        let reg = AgentRegistry::new();
        let (tx, _rx) = mpsc::channel(4);
        let inv = inventory(2, vec![]);
        let old = reg.connect(&inv, 1, tx.clone()).unwrap();
        let new = reg.connect(&inv, 1, tx).unwrap();
        reg.disconnect(&old);
        assert!(reg.get("n1").unwrap().connected);
        reg.disconnect(&new);
        assert!(!reg.get("n1").unwrap().connected);
    }

    #[test]
    fn health_changes_bump_and_survive_a_reconnect() {
        let reg = AgentRegistry::new();
        let mut changes = reg.changes();
        let (tx, _rx) = mpsc::channel(4);
        let inv = inventory(2, vec![]);
        let s = reg.connect(&inv, 1, tx.clone()).unwrap();
        changes.mark_unchanged();
        reg.set_health(
            &s,
            &pb::HealthChange {
                gpu_uuid: "GPU-1".into(),
                health: pb::Health::Unhealthy as i32,
                xid: 79,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(changes.has_changed().unwrap());
        let n = reg.get("n1").unwrap();
        assert!(!n.gpus[1].healthy);
        assert_eq!(n.health_reasons["GPU-1"], "XID 79");
        let s2 = reg.connect(&inv, 1, tx).unwrap();
        assert!(!reg.get("n1").unwrap().gpus[1].healthy);
        let unknown = reg.set_health(
            &s2,
            &pb::HealthChange {
                gpu_uuid: "GPU-7".into(),
                health: pb::Health::Healthy as i32,
                ..Default::default()
            },
        );
        assert_eq!(
            unknown,
            Err(ReportError::UnknownGpu(UnknownGpu("GPU-7".into())))
        );
    }
}
