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
//! core marks such bindings `after_evictions`): those keep their GPUs until they are gone from
//! the API or finished, grace period included. Meanwhile the pod's `status.nominatedNodeName`
//! names the node, and the wait is bounded by the victims' `deletionTimestamp` (the end of
//! their grace period) plus a margin, not by `bind_wait_timeout`; a held decision is never
//! decided again (the core sees it placed) and so takes no further victims. A new leader,
//! which does not know the decision, leaves a pod nominated to a node with pods still
//! terminating there out of its snapshots until they are gone (or that bound has passed), for
//! the same reason. Also held while the node has a bound pod not yet
//! allocated by its agent with a GPU container (init containers included) asking for as many
//! `nvidia.com/gpu` slots as one of this pod's, under a different assignment: the kubelet's
//! Allocate call carries no pod identity, so the agent tells such requests apart only by
//! their size. Held decisions keep their place in the
//! snapshots meanwhile and are bound as soon as their node is clear.
//!
//! A unit that cannot be bound whole goes through one path, `fail_unit`, whatever
//! the cause (a Binding refused, throttled or unanswered, a node not clear in time, a held
//! member given up): members not bound stay unbound, members bound are evicted, and what the
//! API server would not evict yet, or a Binding that got no answer and may still land, is
//! rolled back in a later cycle once the cache shows the pod bound. Until every rolled-back
//! member is gone no other member of its unit is bound: the core counts a terminating member
//! towards its gang, and completing the gang around it would leave it partial.
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

use super::CoordinatorConfig;
use super::binder::{BindTarget, Binder, EvictTarget, UnitOutcome};
use super::cache::{Cache, Store};
use super::events::EventWriter;
use super::gate;
use super::snapshot::{self, BuildContext, Overlay};
use super::status::StatusWriter;
use crate::agents::AgentRegistry;
use crate::cycle::{Decisions, EvictionReason, schedule};
use crate::model::{Assignment, Placement, Resource};
use crate::ops::{Metrics, QueueSample};
use tessera_contract::keys::{
    ALLOCATED as ALLOCATED_ANNOTATION, ASSIGNMENT as ASSIGNMENT_ANNOTATION,
};

/// Evictions not seen in the cache after this long are forgotten (the next cycle decides
/// again).
const EVICTION_MEMORY: Duration = Duration::from_secs(300);
/// Bindings not seen in the cache after this long are forgotten.
const BIND_MEMORY: Duration = Duration::from_secs(300);
/// A unit whose bind failed is not bound again for this long (the API keeps refusing it, or
/// the cache must catch up first).
const BIND_BACKOFF: Duration = Duration::from_secs(1);
/// A pending rollback whose pod the cache has not shown bound for this long is dropped: an
/// unanswered Binding that the server was going to apply has been applied by then.
const ROLLBACK_WATCH: Duration = Duration::from_secs(60);
/// How long past its victims' `deletionTimestamp` a decision keeps waiting for them. The API
/// server sets that time to the deletion request plus the grace period; the kubelet then still
/// has to report the containers stopped and delete the pod.
const VICTIM_MARGIN: Duration = Duration::from_secs(30);
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
}

#[derive(Clone, Debug, PartialEq)]
enum DecidedState {
    /// Bound; waiting for the watch to show it.
    Bound,
    /// Held until these evicted pods are gone and the node has no same-count conflict.
    Held { victims: BTreeSet<String> },
}

/// A unit with members still held.
#[derive(Default)]
struct Unit {
    /// Every member's uid (bound or held).
    members: BTreeSet<String>,
    /// The members this replica bound in earlier waves, which a failure must roll back: once
    /// the cache shows them bound they are no longer in `decided`. Their `reason` and `since`
    /// are set when the unit fails.
    bound: BTreeMap<String, Rollback>,
}

/// A pod to roll back because its unit could not be bound whole.
#[derive(Clone, Debug)]
struct Rollback {
    target: EvictTarget,
    /// The node this replica bound it (or asked to bind it) to.
    node: String,
    /// Its unit (`namespace/group`).
    unit: String,
    reason: String,
    since: Instant,
}

/// The loop's memory; cleared when leadership changes.
#[derive(Default)]
struct State {
    decided: BTreeMap<String, Decided>,
    /// Units with held members.
    units: BTreeMap<String, Unit>,
    evicting: BTreeMap<String, Instant>,
    /// Members of failed units still to be rolled back: evictions the API server throttled
    /// or did not answer, and Bindings that went unanswered (the server may apply them late).
    /// Each is evicted once the cache shows it bound to the node it was meant for.
    rollbacks: BTreeMap<String, Rollback>,
    /// Members a rollback evicted that are still in the API (terminating), with their unit.
    /// The core still counts a terminating member towards its gang, so no other member of
    /// that unit is bound until they are gone: the gang could not stay whole.
    rolled_back: BTreeMap<String, String>,
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
        // Every write of the loop (bindings, evictions, status, events) goes through the gate,
        // so a replica that lost the Lease mid-batch sends nothing more.
        let client = gate::gated(client, leader.clone());
        let events = EventWriter::new(client.clone(), &config.scheduler_name, &config.identity);
        Self {
            binder: Binder::new(client.clone(), events.clone())
                .with_call_timeout(config.bind_call_timeout),
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
        self.retry_rollbacks(&store).await;
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
                            // Each GPU once, as translate reads a bound pod's assignment.
                            assignment: crate::translate::containers::merged(&d.assignment),
                        },
                    )
                })
                .collect(),
            // A bound member waiting for its rollback is leaving: nothing is built on it. One
            // whose Binding went unanswered and that is still unbound may be placed again.
            evicting: self
                .state
                .evicting
                .keys()
                .chain(self.state.rollbacks.iter().filter_map(|(uid, r)| {
                    let pod = store.pods.get(uid)?;
                    (node_of(pod) == Some(r.node.as_str())).then_some(uid)
                }))
                .cloned()
                .collect(),
            below_min_member_since: self.state.below_min_since.clone(),
        };
        let now = jiff::Timestamp::now().as_second().max(0) as u64;
        let mut translated = snapshot::build(
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
        // Pods an earlier leader nominated while their victims terminate are not decided again
        // until those are gone (or past their grace period): the victims keep their GPUs, so a
        // new decision would take further victims.
        let nominated =
            nominated_to_terminating(&store, &self.state.decided, &self.config.scheduler_name);
        translated
            .snapshot
            .pods
            .retain(|p| !nominated.contains(&p.uid));
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

        let victims = self.evict(&translated.snapshot, &decisions).await;
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
        let waiting: BTreeMap<String, String> = self
            .state
            .decided
            .iter()
            .filter(
                |(_, d)| matches!(&d.state, DecidedState::Held { victims } if !victims.is_empty()),
            )
            .map(|(uid, d)| (uid.clone(), d.node.clone()))
            .collect();
        let mut keep: BTreeSet<String> = self.state.decided.keys().cloned().collect();
        keep.extend(nominated);
        self.status
            .nominations(&store, &self.config.scheduler_name, &waiting, &keep)
            .await;
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
        self.state
            .rolled_back
            .retain(|uid, _| store.pods.get(uid).is_some_and(|p| !is_finished(p)));
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
        self.state.units.retain(|_, unit| {
            unit.members.iter().any(|m| {
                decided
                    .get(m)
                    .is_some_and(|d| matches!(d.state, DecidedState::Held { .. }))
            })
        });
    }

    /// Evicts what the core decided; returns the evicted pods per node.
    async fn evict(
        &mut self,
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
                    .find(|(_, u)| u.members.contains(&pod.uid))
                    .map(|(u, _)| u.clone());
                match unit {
                    Some(unit) => {
                        self.fail_unit(&unit, "a member waiting for its node was given up", None)
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
        let mut backed_off: BTreeSet<String> = decisions
            .bindings
            .iter()
            .filter(|b| self.state.backoff.contains_key(&b.pod))
            .filter_map(|b| by_uid.get(b.pod.as_str()).map(|p| unit_of(p)))
            .collect();
        // Units with members still being rolled back.
        backed_off.extend(self.state.rolled_back.values().cloned());
        backed_off.extend(self.state.rollbacks.values().map(|r| r.unit.clone()));
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
            // The core places the pod's GPUs as one set; each GPU container's Allocate asks
            // for its own part of it, in the device manager's order.
            let assignment = match store.pods.get(&b.pod).and_then(|p| p.spec.as_ref()) {
                Some(spec) => crate::translate::containers::split(spec, &b.assignment),
                None => b.assignment.clone(),
            };
            self.state.decided.insert(
                b.pod.clone(),
                Decided {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    node: b.node.clone(),
                    assignment,
                    since: now,
                    state: DecidedState::Held { victims: held_for },
                },
            );
            let entry = self.state.units.entry(unit.clone()).or_default();
            entry.members.insert(b.pod.clone());
            if !order.contains(&unit) {
                order.push(unit);
            }
        }
        let mut pending = self.unallocated(store);
        for unit in order {
            if !self.leading() {
                return;
            }
            self.release_unit(store, &unit, &mut pending, bound_now)
                .await;
        }
    }

    /// Per node, the bound GPU pods the kubelet has not allocated yet: computed once per
    /// pass over the units (each release adds what it binds), not once per unit.
    fn unallocated(&self, store: &Store) -> BTreeMap<String, Vec<Unallocated>> {
        unallocated_gpu_pods(
            store,
            &self.state.decided,
            &self.registry.allocated_by_node(),
        )
    }

    /// Binds held decisions whose node is clear; fails units held too long.
    async fn release_held(&mut self, store: &Store, bound_now: &mut BTreeSet<String>) {
        let units: Vec<String> = self.state.units.keys().cloned().collect();
        let mut pending = self.unallocated(store);
        for unit in units {
            if !self.leading() {
                return;
            }
            self.release_unit(store, &unit, &mut pending, bound_now)
                .await;
        }
    }

    async fn release_unit(
        &mut self,
        store: &Store,
        unit: &str,
        pending: &mut BTreeMap<String, Vec<Unallocated>>,
        bound_now: &mut BTreeSet<String>,
    ) {
        let Some(members) = self.state.units.get(unit).map(|u| u.members.clone()) else {
            return;
        };
        let now = Instant::now();
        // Victims all gone: from here on the decision waits only for the same-count rule,
        // timed from now.
        for uid in &members {
            if let Some(d) = self.state.decided.get_mut(uid)
                && let DecidedState::Held { victims } = &mut d.state
                && !victims.is_empty()
                && victims_gone(store, victims)
            {
                victims.clear();
                d.since = now;
            }
        }
        let expired = members.iter().find_map(|m| {
            let d = self.state.decided.get(m)?;
            let DecidedState::Held { victims } = &d.state else {
                return None;
            };
            held_too_long(store, victims, d.since, now, self.config.bind_wait_timeout)
        });
        if let Some(why) = expired {
            self.fail_unit(unit, &why, None).await;
            return;
        }
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
            if !victims_gone(store, victims) {
                continue;
            }
            let count = gpu_sizes(pod);
            let on_node = pending.entry(d.node.clone()).or_default();
            if !count.is_empty() {
                let conflict = on_node.iter().any(|(other, c, a)| {
                    other != uid && !c.is_disjoint(&count) && a.as_ref() != Some(&d.assignment)
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
            });
        }
        if wave.is_empty() {
            return;
        }
        // The agents hear of the bindings before the kubelets can: an Allocate must never
        // find its pod unknown to the agent and be mistaken for another one.
        for t in &wave {
            if let Some(pod) = store.pods.get(&t.uid) {
                let assignment = t.assignment.to_json();
                if let Some((node, bound)) = super::node_pods::as_bound(pod, &t.node, &assignment) {
                    self.registry.announce_binding(&node, bound);
                }
            }
        }
        let outcome = self.binder.bind_unit(&wave).await;
        for t in wave.iter().filter(|t| !outcome.bound.contains(&t.uid)) {
            self.registry.withdraw_binding(&t.node, &t.uid);
        }
        self.after_wave(unit, &wave, &outcome, bound_now).await;
    }

    async fn after_wave(
        &mut self,
        unit: &str,
        wave: &[BindTarget],
        outcome: &UnitOutcome,
        bound_now: &mut BTreeSet<String>,
    ) {
        let now = Instant::now();
        for t in wave.iter().filter(|t| outcome.bound.contains(&t.uid)) {
            if let Some(d) = self.state.decided.get_mut(&t.uid) {
                d.state = DecidedState::Bound;
                d.since = now;
            }
            // Bound again after an unanswered Binding was given up: this binding is the one
            // that counts, and it must not be rolled back.
            self.state.rollbacks.remove(&t.uid);
            if let Some(u) = self.state.units.get_mut(unit) {
                u.bound.insert(
                    t.uid.clone(),
                    Rollback {
                        target: t.evict_target(),
                        node: t.node.clone(),
                        unit: unit.to_owned(),
                        reason: String::new(),
                        since: now,
                    },
                );
            }
            bound_now.insert(t.uid.clone());
        }
        self.metrics.add_pods_placed(outcome.bound.len() as u64);
        if let Some(failure) = &outcome.failed {
            if failure.deposed {
                // Nothing more may be written; the loop forgets this state as it stands by.
                tracing::info!(
                    unit,
                    "leadership lost while binding a unit; the new leader takes over"
                );
                return;
            }
            self.metrics.inc_bind_errors();
            tracing::warn!(pod = %failure.uid, error = %failure.error, unit, "bind failed; the unit is not bound");
            let unanswered = wave
                .iter()
                .find(|t| failure.maybe_bound && t.uid == failure.uid);
            self.fail_unit(unit, &failure.error, unanswered).await;
        } else if let Some(u) = self.state.units.get(unit)
            && !u.members.iter().any(|m| {
                self.state
                    .decided
                    .get(m)
                    .is_some_and(|d| matches!(d.state, DecidedState::Held { .. }))
            })
        {
            self.state.units.remove(unit);
        }
    }

    /// Gives up a unit, whatever the cause (a refused or unanswered Binding, a node not clear
    /// in time, a held member given up): the one rollback path, so no partial gang runs.
    /// Members not bound stay unbound (their decisions are forgotten and backed off); members
    /// this replica bound are rolled back through [`Binder::roll_back_unit`], and those it
    /// could not remove yet, with `unanswered` (a Binding that got no answer and may land),
    /// are kept in `rollbacks` for the next cycles.
    async fn fail_unit(&mut self, unit: &str, why: &str, unanswered: Option<&BindTarget>) {
        let Some(state) = self.state.units.remove(unit) else {
            return;
        };
        let reason = format!(
            "gang {unit} could not be bound whole ({why}); evicting the members already bound so no partial gang runs"
        );
        let now = Instant::now();
        let until = now + BIND_BACKOFF;
        for uid in &state.members {
            self.state.backoff.insert(uid.clone(), until);
            self.state.decided.remove(uid);
        }
        let bound: Vec<Rollback> = state
            .bound
            .into_values()
            .map(|r| Rollback {
                reason: reason.clone(),
                since: now,
                ..r
            })
            .collect();
        if let Some(t) = unanswered {
            self.state.rollbacks.insert(
                t.uid.clone(),
                Rollback {
                    target: t.evict_target(),
                    node: t.node.clone(),
                    unit: unit.to_owned(),
                    reason: reason.clone(),
                    since: now,
                },
            );
        }
        self.roll_back(bound).await;
    }

    /// Rolls back `members` and remembers the ones to try again.
    async fn roll_back(&mut self, members: Vec<Rollback>) {
        let mut by_reason: BTreeMap<String, Vec<Rollback>> = BTreeMap::new();
        for r in members {
            by_reason.entry(r.reason.clone()).or_default().push(r);
        }
        for (reason, members) in by_reason {
            let targets: Vec<EvictTarget> = members.iter().map(|r| r.target.clone()).collect();
            let outcome = self.binder.roll_back_unit(&targets, &reason).await;
            let now = Instant::now();
            for uid in &outcome.rolled_back {
                self.state.rollbacks.remove(uid);
                self.state.evicting.insert(uid.clone(), now);
                self.metrics.add_evictions("gang-bind-failed", 1);
            }
            for r in members {
                if outcome.retry.contains(&r.target.uid) {
                    self.state.rollbacks.insert(r.target.uid.clone(), r);
                } else {
                    self.state.rolled_back.insert(r.target.uid, r.unit);
                }
            }
        }
    }

    /// Tries the pending rollbacks again: each pod the cache shows bound to the node it was
    /// meant for is rolled back; one that is gone (or replaced under its name) is dropped, and
    /// so is one still unbound after [`ROLLBACK_WATCH`].
    async fn retry_rollbacks(&mut self, store: &Store) {
        if self.state.rollbacks.is_empty() || !self.leading() {
            return;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        self.state
            .rollbacks
            .retain(|uid, r| match store.pods.get(uid) {
                None => false,
                Some(pod) if node_of(pod) == Some(r.node.as_str()) && !is_finished(pod) => {
                    due.push(r.clone());
                    true
                }
                Some(_) => now.duration_since(r.since) < ROLLBACK_WATCH,
            });
        if !due.is_empty() {
            self.roll_back(due).await;
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

/// Whether every pod evicted for a decision is gone from the API or finished (its containers
/// stopped): until then it keeps its GPUs, through its whole grace period.
fn victims_gone(store: &Store, victims: &BTreeSet<String>) -> bool {
    victims
        .iter()
        .all(|v| store.pods.get(v).is_none_or(|p| is_finished(p)))
}

/// This scheduler's pending pods without a decision of this replica whose
/// `status.nominatedNodeName` (written by an earlier leader) names a node where evicted pods
/// are still terminating within their grace period plus [`VICTIM_MARGIN`].
fn nominated_to_terminating(
    store: &Store,
    decided: &BTreeMap<String, Decided>,
    scheduler_name: &str,
) -> BTreeSet<String> {
    let now = jiff::Timestamp::now();
    let margin = jiff::SignedDuration::try_from(VICTIM_MARGIN).unwrap_or_default();
    let terminating: BTreeSet<&str> = store
        .pods
        .values()
        .filter(|p| !is_finished(p))
        .filter(|p| {
            p.metadata
                .deletion_timestamp
                .as_ref()
                .is_some_and(|t| now.duration_since(t.0) <= margin)
        })
        .filter_map(|p| node_of(p))
        .collect();
    if terminating.is_empty() {
        return BTreeSet::new();
    }
    store
        .pods
        .iter()
        .filter(|(uid, p)| {
            let spec = p.spec.as_ref();
            !decided.contains_key(*uid)
                && node_of(p).is_none()
                && p.metadata.deletion_timestamp.is_none()
                && spec.and_then(|s| s.scheduler_name.as_deref()) == Some(scheduler_name)
                && p.status
                    .as_ref()
                    .and_then(|s| s.nominated_node_name.as_deref())
                    .is_some_and(|n| terminating.contains(n))
        })
        .map(|(uid, _)| uid.clone())
        .collect()
}

/// Why a held decision has waited too long, if it has. While victims remain: once the latest
/// victim's `deletionTimestamp` (the end of its grace period) is [`VICTIM_MARGIN`] past, or
/// after `timeout` while a victim does not show its deletion yet. Otherwise (the same-count
/// rule) after `timeout` since `since`.
fn held_too_long(
    store: &Store,
    victims: &BTreeSet<String>,
    since: Instant,
    now: Instant,
    timeout: Duration,
) -> Option<String> {
    let mut latest: Option<jiff::Timestamp> = None;
    let mut all_deleting = true;
    for v in victims {
        let Some(pod) = store.pods.get(v).filter(|p| !is_finished(p)) else {
            continue;
        };
        match &pod.metadata.deletion_timestamp {
            Some(t) => latest = latest.max(Some(t.0)),
            None => all_deleting = false,
        }
    }
    match latest {
        Some(end) if all_deleting => {
            let past = jiff::Timestamp::now().duration_since(end);
            (past > jiff::SignedDuration::try_from(VICTIM_MARGIN).unwrap_or_default()).then(|| {
                format!(
                    "the pods evicted for it were still there {} s after their grace period ended",
                    past.as_secs()
                )
            })
        }
        _ => (now.duration_since(since) > timeout)
            .then(|| format!("its node was not clear within {} s", timeout.as_secs())),
    }
}

/// The `nvidia.com/gpu` slot counts the kubelet's Allocate calls for `pod` will ask for, one
/// per GPU container (init containers included): the agent tells requests apart only by
/// their size, so two unallocated pods on a node with a size in common can be confused.
fn gpu_sizes(pod: &KubePod) -> BTreeSet<u32> {
    let Some(spec) = &pod.spec else {
        return BTreeSet::new();
    };
    tessera_contract::pod::allocation_order(spec)
        .filter_map(|c| tessera_contract::pod::container_gpus(c.container).ok())
        .filter(|&n| n > 0)
        .collect()
}

/// A bound GPU pod its agent has not allocated yet: uid, its containers' slot counts, its
/// assignment.
type Unallocated = (String, BTreeSet<u32>, Option<Assignment>);

/// Per node: the GPU pods bound there (or bound by this replica and not yet seen) that the
/// kubelet has not allocated yet, with their slot count and assignment. Allocated means:
/// some container started, or the node's agent lists the pod in `allocated` (revision 2),
/// or a revision-1 agent wrote `tessera.dev/allocated` on it.
fn unallocated_gpu_pods(
    store: &Store,
    decided: &BTreeMap<String, Decided>,
    allocated: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, Vec<Unallocated>> {
    let mut out: BTreeMap<String, Vec<Unallocated>> = BTreeMap::new();
    for (uid, pod) in &store.pods {
        let Some(node) = node_of(pod) else { continue };
        if is_finished(pod) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if tessera_contract::pod::has_started(pod)
            || allocated.get(node).is_some_and(|a| a.contains(uid))
        {
            continue;
        }
        let annotations = pod.metadata.annotations.as_ref();
        if annotations.is_some_and(|a| a.contains_key(ALLOCATED_ANNOTATION)) {
            continue;
        }
        let count = gpu_sizes(pod);
        if count.is_empty() {
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
        let count = gpu_sizes(pod);
        if !count.is_empty() {
            out.entry(d.node.clone()).or_default().push((
                uid.clone(),
                count,
                Some(d.assignment.clone()),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// A running victim whose deletion, if any, ends `ends_in_secs` from now.
    fn victim(uid: &str, ends_in_secs: Option<i64>, phase: &str) -> (String, Arc<KubePod>) {
        let mut pod = KubePod::default();
        pod.metadata.uid = Some(uid.into());
        pod.metadata.deletion_timestamp =
            ends_in_secs.map(|s| Time(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(s)));
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        (uid.to_owned(), Arc::new(pod))
    }

    fn store(pods: Vec<(String, Arc<KubePod>)>) -> Store {
        Store {
            pods: pods.into_iter().collect(),
            ..Store::default()
        }
    }

    fn set(uids: &[&str]) -> BTreeSet<String> {
        uids.iter().map(|u| (*u).to_owned()).collect()
    }

    #[test]
    fn a_wait_for_victims_follows_their_grace_period_not_the_timeout() {
        let timeout = Duration::from_secs(2);
        let now = Instant::now();
        let long_ago = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
        // Deleting, grace period still running: waits although the timeout has passed.
        let s = store(vec![victim("v", Some(20), "Running")]);
        assert_eq!(
            held_too_long(&s, &set(&["v"]), long_ago, now, timeout),
            None
        );
        // Within the margin after the grace period: still waits.
        let s = store(vec![victim("v", Some(-10), "Running")]);
        assert_eq!(
            held_too_long(&s, &set(&["v"]), long_ago, now, timeout),
            None
        );
        // Past grace period and margin: given up, saying why.
        let s = store(vec![
            victim("v", Some(-40), "Running"),
            victim("w", Some(5), "Running"),
        ]);
        assert_eq!(
            held_too_long(&s, &set(&["v"]), now, now, timeout).map(|w| w.contains("grace period")),
            Some(true)
        );
        // The latest victim counts.
        assert_eq!(
            held_too_long(&s, &set(&["v", "w"]), now, now, timeout),
            None
        );
    }

    #[test]
    fn without_a_deletion_to_follow_the_timeout_applies() {
        let timeout = Duration::from_secs(2);
        let now = Instant::now();
        let long_ago = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
        // A victim whose deletion the cache does not show yet.
        let s = store(vec![
            victim("v", None, "Running"),
            victim("w", Some(20), "Running"),
        ]);
        assert!(held_too_long(&s, &set(&["v", "w"]), now, now, timeout).is_none());
        let why = held_too_long(&s, &set(&["v", "w"]), long_ago, now, timeout);
        assert!(why.is_some_and(|w| w.contains("within 2 s")));
        // No victims left (the same-count rule), or only finished ones.
        let s = store(vec![victim("done", Some(-100), "Failed")]);
        assert!(held_too_long(&s, &set(&["done"]), long_ago, now, timeout).is_some());
        assert!(held_too_long(&s, &set(&[]), now, now, timeout).is_none());
        assert!(victims_gone(&s, &set(&["done", "deleted"])));
        assert!(!victims_gone(
            &store(vec![victim("v", Some(20), "Running")]),
            &set(&["v"])
        ));
    }
}
