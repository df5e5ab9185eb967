//! The leader-only scheduling loop: snapshot → [`crate::cycle::schedule`] → binder and status.
//!
//! A cycle runs when the cache or the agents changed, and at least every `cycle_interval`.
//! Only the replica holding the Lease runs cycles; standbys keep their caches warm. Whatever
//! this replica decided but did not yet see in the cache stays in an assume cache (pods bound,
//! pods held for a later bind, pods being evicted) that the next snapshot is overlaid with, so
//! nothing is placed twice and no victim is evicted twice. Leadership changes clear it: the
//! API server's state is then the only truth.
//!
//! A decision is held (not bound yet) while its node still runs the pods evicted for it (the
//! core marks such bindings `after_evictions`), and while the node has a bound pod not yet
//! allocated by its agent that asks for the same number of `nvidia.com/gpu` slots with a
//! different assignment: the kubelet's Allocate call carries no pod identity, so the agent
//! tells such pods apart only by their slot count. Held decisions keep their place in the
//! snapshots meanwhile and are bound as soon as their node is clear.
//!
//! Logical time (`Snapshot::now`) is wall-clock Unix seconds, the clock of pods' creation
//! times, so every replica agrees on it. Stale-gang timing (`below_min_member_since`) is kept
//! in memory: a new leader starts it afresh, which delays a stale-gang eviction by at most one
//! grace period.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod as KubePod;
use tokio::sync::watch;

use super::binder::{BindTarget, Binder, EvictTarget, UnitOutcome};
use super::cache::{Cache, Store};
use super::events::EventWriter;
use super::snapshot::{self, BuildContext, Overlay};
use super::status::StatusWriter;
use super::{ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, CoordinatorConfig, GPU_RESOURCE};
use crate::agents::AgentRegistry;
use crate::cycle::{Decisions, EvictionReason, schedule};
use crate::model::{Assignment, Placement, Resource};
use crate::ops::{Metrics, QueueSample};

/// Evictions not seen in the cache after this long are forgotten (the next cycle decides
/// again).
const EVICTION_MEMORY: Duration = Duration::from_secs(300);
/// Bindings not seen in the cache after this long are forgotten.
const BIND_MEMORY: Duration = Duration::from_secs(300);
/// A unit whose bind failed is not bound again for this long (the API keeps refusing it, or
/// the cache must catch up first).
const BIND_BACKOFF: Duration = Duration::from_secs(1);
/// Changes arriving in a burst (a Job creating its pods) are taken in one cycle.
const SETTLE: Duration = Duration::from_millis(30);

/// A pod this replica decided to place.
#[derive(Clone, Debug)]
struct Decided {
    namespace: String,
    name: String,
    node: String,
    assignment: Assignment,
    since: Instant,
    state: DecidedState,
    /// Its `tessera.dev/assignment` is written; the Binding may follow.
    annotated: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum DecidedState {
    /// Bound; waiting for the watch to show it.
    Bound,
    /// Held until these evicted pods are gone and the node has no same-count conflict.
    Held { victims: BTreeSet<String> },
}

/// The loop's memory; cleared when leadership changes.
#[derive(Default)]
struct State {
    decided: BTreeMap<String, Decided>,
    /// Units with held members: unit → every member uid (bound or held).
    units: BTreeMap<String, BTreeSet<String>>,
    evicting: BTreeMap<String, Instant>,
    /// Pods of units whose bind failed, and until when they are not bound again.
    backoff: BTreeMap<String, Instant>,
    below_min_since: BTreeMap<(String, String), u64>,
}

/// The scheduling loop.
pub struct Scheduler {
    config: Arc<CoordinatorConfig>,
    cache: Cache,
    registry: AgentRegistry,
    metrics: Arc<Metrics>,
    binder: Binder,
    status: StatusWriter,
    state: State,
    leader: watch::Receiver<bool>,
}

impl Scheduler {
    /// A loop over `cache` and `registry`, writing through `client`.
    pub fn new(
        client: kube::Client,
        config: Arc<CoordinatorConfig>,
        cache: Cache,
        registry: AgentRegistry,
        metrics: Arc<Metrics>,
        leader: watch::Receiver<bool>,
    ) -> Self {
        let events = EventWriter::new(client.clone(), &config.scheduler_name, &config.identity);
        Self {
            binder: Binder::new(client.clone(), events.clone()),
            status: StatusWriter::new(client, events),
            config,
            cache,
            registry,
            metrics,
            state: State::default(),
            leader,
        }
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut changes = self.cache.changes();
        let mut agents = self.registry.changes();
        let mut ready = self.cache.ready();
        let mut leader = self.leader.clone();
        let mut was_leader = false;
        loop {
            if *shutdown.borrow() {
                break;
            }
            let leading = *leader.borrow_and_update();
            self.metrics.set_leader(leading);
            if leading != was_leader {
                self.state = State::default();
                self.status.forget();
                if leading {
                    tracing::info!(identity = %self.config.identity, "leading: scheduling");
                    // Occupancy may have changed while another replica led.
                    self.registry.resync_all("a new coordinator leads");
                } else {
                    tracing::info!(identity = %self.config.identity, "not leading: standing by");
                }
                was_leader = leading;
            }
            changes.borrow_and_update();
            agents.borrow_and_update();
            if leading && self.cache.is_ready() {
                self.cycle().await;
            }
            tokio::select! {
                _ = changed(&mut shutdown) => {}
                _ = changed(&mut leader) => {}
                _ = changed(&mut changes) => tokio::time::sleep(SETTLE).await,
                _ = changed(&mut agents) => tokio::time::sleep(SETTLE).await,
                _ = changed(&mut ready) => {}
                _ = tokio::time::sleep(self.config.cycle_interval) => {}
            }
        }
    }

    fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    /// One cycle: forget what the cache now shows, bind held decisions whose node is clear,
    /// schedule, write decisions and status.
    async fn cycle(&mut self) {
        let store = self.cache.store();
        self.expire(&store);
        let mut bound_now = BTreeSet::new();
        self.release_held(&store, &mut bound_now).await;

        let agents = self.registry.all();
        self.metrics
            .set_agents_connected(self.registry.connected_count());
        let overlay = Overlay {
            assumed: self
                .state
                .decided
                .iter()
                .map(|(uid, d)| {
                    (
                        uid.clone(),
                        Placement {
                            node: d.node.clone(),
                            assignment: d.assignment.clone(),
                        },
                    )
                })
                .collect(),
            evicting: self.state.evicting.keys().cloned().collect(),
            below_min_member_since: self.state.below_min_since.clone(),
        };
        let now = jiff::Timestamp::now().as_second().max(0) as u64;
        let translated = snapshot::build(
            &store,
            &agents,
            &overlay,
            &BuildContext {
                now,
                instant: Instant::now(),
                agent_timeout: self.config.agent_timeout,
                scheduler_name: &self.config.scheduler_name,
            },
        );
        let started = Instant::now();
        let decisions = schedule(&translated.snapshot, &self.config.cycle);
        self.metrics.observe_cycle(started.elapsed());

        let mut below = BTreeMap::new();
        for g in &decisions.gangs_below_min {
            if let Some((ns, name)) = g.split_once('/') {
                let key = (ns.to_owned(), name.to_owned());
                let since = self.state.below_min_since.get(&key).copied().unwrap_or(now);
                below.insert(key, since);
            }
        }
        self.state.below_min_since = below;

        let victims = self.evict(&store, &translated.snapshot, &decisions).await;
        self.bind(
            &store,
            &translated.snapshot,
            &decisions,
            &victims,
            &mut bound_now,
        )
        .await;
        if !self.leading() {
            return;
        }
        self.status
            .update(&store, &translated, &decisions, &bound_now)
            .await;
        self.record(&decisions);
    }

    /// Drops what the cache has caught up with.
    fn expire(&mut self, store: &Store) {
        let now = Instant::now();
        self.state.backoff.retain(|_, until| *until > now);
        self.state.evicting.retain(|uid, at| {
            store.pods.contains_key(uid) && now.duration_since(*at) < EVICTION_MEMORY
        });
        self.state.decided.retain(|uid, d| {
            let Some(pod) = store.pods.get(uid) else {
                return false;
            };
            if is_finished(pod) || node_of(pod).is_some() {
                return false;
            }
            d.state != DecidedState::Bound || now.duration_since(d.since) < BIND_MEMORY
        });
        let decided = &self.state.decided;
        self.state.units.retain(|_, members| {
            members.iter().any(|m| {
                decided
                    .get(m)
                    .is_some_and(|d| matches!(d.state, DecidedState::Held { .. }))
            })
        });
    }

    /// Evicts what the core decided; returns the evicted pods per node.
    async fn evict(
        &mut self,
        store: &Store,
        snap: &crate::model::Snapshot,
        decisions: &Decisions,
    ) -> BTreeMap<String, BTreeSet<String>> {
        let mut victims: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        if decisions.evictions.is_empty() {
            return victims;
        }
        let by_uid: BTreeMap<&str, &crate::model::Pod> =
            snap.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        for e in &decisions.evictions {
            if !self.leading() {
                break;
            }
            let Some(pod) = by_uid.get(e.pod.as_str()) else {
                continue;
            };
            // A decision held for a later bind is not bound yet: giving it up is enough (an
            // eviction would delete the pending pod). Its gang cannot be whole any more.
            if self
                .state
                .decided
                .get(&pod.uid)
                .is_some_and(|d| matches!(d.state, DecidedState::Held { .. }))
            {
                let unit = self
                    .state
                    .units
                    .iter()
                    .find(|(_, m)| m.contains(&pod.uid))
                    .map(|(u, _)| u.clone());
                match unit {
                    Some(unit) => {
                        self.fail_unit(
                            store,
                            &unit,
                            "a member waiting for its node was given up",
                            &BTreeSet::new(),
                        )
                        .await;
                    }
                    None => {
                        self.state.decided.remove(&pod.uid);
                    }
                }
                continue;
            }
            let (label, text) = match &e.reason {
                EvictionReason::Reclaim { by_queue } => (
                    "reclaim",
                    format!("reclaimed by queue {by_queue}, which is below its fair share"),
                ),
                EvictionReason::Preempt { by_pod } => {
                    let by = by_uid
                        .get(by_pod.as_str())
                        .map_or_else(|| by_pod.clone(), |p| format!("{}/{}", p.namespace, p.name));
                    (
                        "preemption",
                        format!(
                            "preempted by pod {by}, which has a higher priority in the same queue"
                        ),
                    )
                }
                EvictionReason::Consolidate { moved_to } => (
                    "consolidation",
                    format!(
                        "consolidation: moved to free whole GPUs for a waiting gang (a new copy fits on node {moved_to})"
                    ),
                ),
                EvictionReason::GangBelowMinMember => (
                    "stale-gang",
                    format!(
                        "stale gang: group {} ran fewer than minMember pods for longer than {} s",
                        pod.group.as_deref().unwrap_or("?"),
                        self.config.cycle.gang_grace_seconds
                    ),
                ),
            };
            let target = EvictTarget {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
            };
            match self.binder.evict(&target, &text).await {
                Ok(_) => {
                    self.metrics.add_evictions(label, 1);
                    self.state.evicting.insert(pod.uid.clone(), Instant::now());
                    self.state.decided.remove(&pod.uid);
                    if let Some(pl) = &pod.placement {
                        victims
                            .entry(pl.node.clone())
                            .or_default()
                            .insert(pod.uid.clone());
                    }
                }
                Err(error) => {
                    tracing::warn!(pod = %pod.name, %error, "eviction failed; the next cycle decides again");
                }
            }
        }
        victims
    }

    /// Turns the cycle's bindings into held decisions, unit by unit, and binds what can be
    /// bound now.
    async fn bind(
        &mut self,
        store: &Store,
        snap: &crate::model::Snapshot,
        decisions: &Decisions,
        victims: &BTreeMap<String, BTreeSet<String>>,
        bound_now: &mut BTreeSet<String>,
    ) {
        let by_uid: BTreeMap<&str, &crate::model::Pod> =
            snap.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let mut order: Vec<String> = Vec::new();
        let now = Instant::now();
        let unit_of = |pod: &crate::model::Pod| match &pod.group {
            Some(g) => format!("{}/{}", pod.namespace, g),
            None => format!("pod:{}", pod.uid),
        };
        let backed_off: BTreeSet<String> = decisions
            .bindings
            .iter()
            .filter(|b| self.state.backoff.contains_key(&b.pod))
            .filter_map(|b| by_uid.get(b.pod.as_str()).map(|p| unit_of(p)))
            .collect();
        for b in &decisions.bindings {
            let Some(pod) = by_uid.get(b.pod.as_str()) else {
                continue;
            };
            let unit = unit_of(pod);
            if backed_off.contains(&unit) {
                continue;
            }
            let held_for = if b.after_evictions {
                victims.get(&b.node).cloned().unwrap_or_default()
            } else {
                BTreeSet::new()
            };
            self.state.decided.insert(
                b.pod.clone(),
                Decided {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    node: b.node.clone(),
                    assignment: b.assignment.clone(),
                    since: now,
                    state: DecidedState::Held { victims: held_for },
                    annotated: false,
                },
            );
            let members = self.state.units.entry(unit.clone()).or_default();
            members.insert(b.pod.clone());
            if !order.contains(&unit) {
                order.push(unit);
            }
        }
        for unit in order {
            if !self.leading() {
                return;
            }
            self.release_unit(store, &unit, bound_now).await;
        }
    }

    /// Binds held decisions whose node is clear; fails units held too long.
    async fn release_held(&mut self, store: &Store, bound_now: &mut BTreeSet<String>) {
        let units: Vec<String> = self.state.units.keys().cloned().collect();
        for unit in units {
            if !self.leading() {
                return;
            }
            self.release_unit(store, &unit, bound_now).await;
        }
    }

    async fn release_unit(&mut self, store: &Store, unit: &str, bound_now: &mut BTreeSet<String>) {
        let Some(members) = self.state.units.get(unit).cloned() else {
            return;
        };
        let timeout = self.config.bind_wait_timeout;
        let now = Instant::now();
        let expired = members.iter().any(|m| {
            self.state.decided.get(m).is_some_and(|d| {
                matches!(d.state, DecidedState::Held { .. })
                    && now.duration_since(d.since) > timeout
            })
        });
        if expired {
            self.fail_unit(
                store,
                unit,
                &format!("its node was not clear within {} s", timeout.as_secs()),
                &BTreeSet::new(),
            )
            .await;
            return;
        }
        // Every member's assignment is written before any member is bound, even when the
        // same-count rule binds the unit in several waves.
        let unannotated: Vec<BindTarget> = members
            .iter()
            .filter_map(|uid| {
                let d = self.state.decided.get(uid)?;
                if d.annotated || !matches!(d.state, DecidedState::Held { .. }) {
                    return None;
                }
                let pod = store.pods.get(uid)?;
                Some(BindTarget {
                    namespace: d.namespace.clone(),
                    name: d.name.clone(),
                    uid: uid.clone(),
                    node: d.node.clone(),
                    assignment: d.assignment.clone(),
                    resource_version: pod.metadata.resource_version.clone(),
                    annotated: false,
                })
            })
            .collect();
        if !unannotated.is_empty() {
            if let Err((uid, error)) = self.binder.annotate(&unannotated).await {
                self.metrics.inc_bind_errors();
                tracing::warn!(pod = %uid, %error, unit, "assignment write failed; the unit is not bound");
                self.fail_unit(store, unit, &error, &BTreeSet::new()).await;
                return;
            }
            for t in &unannotated {
                if let Some(d) = self.state.decided.get_mut(&t.uid) {
                    d.annotated = true;
                }
            }
        }
        let mut pending = unallocated_gpu_pods(store, &self.state.decided);
        let mut wave = Vec::new();
        for uid in &members {
            let Some(d) = self.state.decided.get(uid) else {
                continue;
            };
            let DecidedState::Held { victims } = &d.state else {
                continue;
            };
            let Some(pod) = store.pods.get(uid) else {
                continue;
            };
            let victims_gone = victims
                .iter()
                .all(|v| store.pods.get(v).is_none_or(|p| is_finished(p)));
            if !victims_gone {
                continue;
            }
            let count = gpu_slots(pod);
            let on_node = pending.entry(d.node.clone()).or_default();
            if count > 0 {
                let conflict = on_node.iter().any(|(other, c, a)| {
                    other != uid && *c == count && a.as_ref() != Some(&d.assignment)
                });
                if conflict {
                    continue;
                }
                on_node.push((uid.clone(), count, Some(d.assignment.clone())));
            }
            wave.push(BindTarget {
                namespace: d.namespace.clone(),
                name: d.name.clone(),
                uid: uid.clone(),
                node: d.node.clone(),
                assignment: d.assignment.clone(),
                resource_version: pod.metadata.resource_version.clone(),
                annotated: d.annotated,
            });
        }
        if wave.is_empty() {
            return;
        }
        let outcome = self.binder.bind_unit(&wave).await;
        self.after_wave(store, unit, &outcome, bound_now).await;
    }

    async fn after_wave(
        &mut self,
        store: &Store,
        unit: &str,
        outcome: &UnitOutcome,
        bound_now: &mut BTreeSet<String>,
    ) {
        let now = Instant::now();
        for uid in &outcome.bound {
            if let Some(d) = self.state.decided.get_mut(uid) {
                d.state = DecidedState::Bound;
                d.since = now;
            }
            bound_now.insert(uid.clone());
        }
        self.metrics.add_pods_placed(outcome.bound.len() as u64);
        if let Some((uid, error)) = &outcome.failed {
            self.metrics.inc_bind_errors();
            tracing::warn!(pod = %uid, %error, unit, "bind failed; the unit is not bound");
            for r in &outcome.rolled_back {
                self.state.evicting.insert(r.clone(), now);
                self.metrics.add_evictions("gang-bind-failed", 1);
            }
            let done: BTreeSet<String> = outcome.rolled_back.iter().cloned().collect();
            // Members whose rollback the API server kept throttling are still bound, though
            // neither this replica's state nor (yet) the store says so: fail_unit evicts them.
            for uid in &outcome.rollback_throttled {
                if let Some(d) = self.state.decided.get_mut(uid) {
                    d.state = DecidedState::Bound;
                }
            }
            self.fail_unit(store, unit, error, &done).await;
        } else if let Some(members) = self.state.units.get(unit)
            && !members.iter().any(|m| {
                self.state
                    .decided
                    .get(m)
                    .is_some_and(|d| matches!(d.state, DecidedState::Held { .. }))
            })
        {
            self.state.units.remove(unit);
        }
    }

    /// Gives up a unit: forgets its held members and evicts those already bound (except
    /// `done`, already evicted), so no partial gang runs.
    async fn fail_unit(&mut self, store: &Store, unit: &str, why: &str, done: &BTreeSet<String>) {
        let Some(members) = self.state.units.remove(unit) else {
            return;
        };
        let reason = format!(
            "gang {unit} could not be bound whole ({why}); evicting the members already bound so no partial gang runs"
        );
        let until = Instant::now() + BIND_BACKOFF;
        for uid in members {
            self.state.backoff.insert(uid.clone(), until);
            let decided = self.state.decided.remove(&uid);
            if done.contains(&uid) {
                continue;
            }
            let stored = store.pods.get(&uid);
            let bound = decided
                .as_ref()
                .is_some_and(|d| d.state == DecidedState::Bound)
                || stored.is_some_and(|p| node_of(p).is_some());
            if !bound {
                continue;
            }
            let (namespace, name) = match (&decided, stored) {
                (Some(d), _) => (d.namespace.clone(), d.name.clone()),
                (None, Some(p)) => (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                ),
                (None, None) => continue,
            };
            let target = EvictTarget {
                namespace,
                name,
                uid: uid.clone(),
            };
            match self.binder.evict(&target, &reason).await {
                Ok(_) => {
                    self.state.evicting.insert(uid, Instant::now());
                    self.metrics.add_evictions("gang-bind-failed", 1);
                }
                Err(error) => {
                    tracing::warn!(pod = %target.name, %error, "could not evict a member of a failed gang")
                }
            }
        }
    }

    fn record(&self, decisions: &Decisions) {
        let mut pending: BTreeMap<&'static str, u64> = BTreeMap::new();
        for p in &decisions.pending {
            *pending.entry(pending_category(p)).or_default() += 1;
        }
        self.metrics.set_pending(pending);
        let mut samples = Vec::new();
        for q in &decisions.fair_shares {
            for r in Resource::ALL {
                let scale = if r == Resource::Gpu { 1000.0 } else { 1.0 };
                samples.push(QueueSample {
                    queue: q.queue.clone(),
                    resource: r.name().to_owned(),
                    fair_share: q.fair_share[r.index()] / scale,
                    allocated: q.allocated[r.index()] / scale,
                });
            }
        }
        self.metrics.set_queues(samples);
    }
}

/// A short metric label for why a pod is pending.
fn pending_category(p: &crate::cycle::PendingExplanation) -> &'static str {
    use crate::cycle::Reason;
    let Some((reason, _)) = p.reasons.iter().max_by_key(|(_, n)| *n) else {
        return "unknown";
    };
    match reason {
        Reason::InvalidInput { .. } => "invalid-input",
        Reason::UnknownQueue { .. } | Reason::NotLeafQueue { .. } => "queue",
        Reason::GroupLargerThanCluster { .. } => "group-larger-than-cluster",
        Reason::WaitingForMembers { .. } | Reason::BeyondMaxMember { .. } => "gang-incomplete",
        Reason::QueueOverLimit { .. } => "queue-limit",
        Reason::GangUnschedulable { .. } => "gang-unschedulable",
        Reason::NoTopologyDomain { .. } | Reason::UnknownTopologyLevel { .. } => "topology",
        Reason::NoReclaimVictims { .. } => "fair-share",
        Reason::DisruptionBudget { .. } => "disruption-budget",
        Reason::SchedulingGated { .. } => "scheduling-gated",
        Reason::Node(_) => "insufficient-resources",
        Reason::NotReached => "not-reached",
    }
}

/// Resolves when `rx` changes; never when its sender is gone (nothing will change).
async fn changed<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn node_of(pod: &KubePod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn is_finished(pod: &KubePod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// `nvidia.com/gpu` slots the pod asks for (limits, else requests, summed over containers):
/// what the kubelet's Allocate call will carry.
fn gpu_slots(pod: &KubePod) -> u32 {
    let Some(spec) = &pod.spec else { return 0 };
    spec.containers
        .iter()
        .filter_map(|c| {
            let r = c.resources.as_ref()?;
            let q = r
                .limits
                .as_ref()
                .and_then(|l| l.get(GPU_RESOURCE))
                .or_else(|| r.requests.as_ref().and_then(|l| l.get(GPU_RESOURCE)))?;
            q.0.trim().parse::<u32>().ok()
        })
        .sum()
}

/// Per node: the GPU pods bound there (or bound by this replica and not yet seen) that the
/// agent has not allocated yet, with their slot count and assignment.
fn unallocated_gpu_pods(
    store: &Store,
    decided: &BTreeMap<String, Decided>,
) -> BTreeMap<String, Vec<(String, u32, Option<Assignment>)>> {
    let mut out: BTreeMap<String, Vec<(String, u32, Option<Assignment>)>> = BTreeMap::new();
    for (uid, pod) in &store.pods {
        let Some(node) = node_of(pod) else { continue };
        if is_finished(pod) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let annotations = pod.metadata.annotations.as_ref();
        if annotations.is_some_and(|a| a.contains_key(ALLOCATED_ANNOTATION)) {
            continue;
        }
        let count = gpu_slots(pod);
        if count == 0 {
            continue;
        }
        let assignment = annotations
            .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
            .and_then(|t| Assignment::from_json(t).ok());
        out.entry(node.to_owned())
            .or_default()
            .push((uid.clone(), count, assignment));
    }
    for (uid, d) in decided {
        if d.state != DecidedState::Bound {
            continue;
        }
        let Some(pod) = store.pods.get(uid) else {
            continue;
        };
        if node_of(pod).is_some() {
            continue;
        }
        let count = gpu_slots(pod);
        if count > 0 {
            out.entry(d.node.clone()).or_default().push((
                uid.clone(),
                count,
                Some(d.assignment.clone()),
            ));
        }
    }
    out
}
