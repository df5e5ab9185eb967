//! The leader-only scheduling loop: snapshot → [`tessera_core::cycle::schedule`] → binder and status.
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
//! The loop only reads and executes: the planner (`cluster::plan`) holds what this replica
//! decided and turns it into writes (binding waves, evictions, rollbacks), [`Binder`] executes
//! them, and each outcome goes back to the planner, which may answer with a gang rollback to
//! run next. A unit that cannot be bound whole, whatever the cause, goes through the planner's
//! one rollback path, `Planner::fail_unit`, so no partial gang is left bound.
//!
//! Logical time (`Snapshot::now`) is wall-clock Unix seconds, the clock of pods' creation
//! times, so every replica agrees on it. Queues' usage history (when on) goes from each
//! cycle's decisions into the next snapshot; a new leader starts from the Queues' status,
//! where the status writer keeps it at a bounded rate. Stale-gang timing (`below_min_member_since`) is kept
//! in memory: a new leader starts it afresh, which delays a stale-gang eviction by at most one
//! grace period.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::CoordinatorConfig;
use super::agent_gap::AgentWait;
use super::binder::{BindTarget, Binder, EvictTarget};
use super::cache::{Cache, Store};
use super::events::EventWriter;
use super::gate;
use super::plan::{Eviction, Now, Planner, Rollback, Write};
use super::refusals::Refusals;
use super::snapshot::{BuildContext, Builder};
use super::status::StatusWriter;
use super::status_queue::{StatusJob, StatusQueue};
use crate::agents::AgentRegistry;
use crate::ops::{Metrics, QueueSample};
use tessera_core::cycle::{Decisions, schedule};
use tessera_core::model::{QueueUsage, Resource};

/// Changes arriving in a burst (a Job creating its pods) are taken in one cycle.
const SETTLE: Duration = Duration::from_millis(30);

/// The leader's scheduling loop: a snapshot of the cache and the agents' inventory, one
/// core cycle, and the binding planner's writes carried out by the binder.
pub struct Scheduler {
    config: Arc<CoordinatorConfig>,
    cache: Cache,
    registry: AgentRegistry,
    metrics: Arc<Metrics>,
    binder: Binder,
    status: StatusQueue,
    /// Counts leadership terms, so the status writer knows when to forget what it wrote.
    term: u64,
    planner: Planner,
    /// Remembers pods' translations from cycle to cycle.
    snapshots: Builder,
    /// Flushed before bindings are announced (see [`super::node_pods::Publisher::flush`]).
    node_pods: super::node_pods::Publisher,
    /// GPUs the nodes refused at admission, and which pods' refusals are already noted.
    refusals: Refusals,
    /// Which pods changed since the refusals last looked.
    refusal_log: super::pod_log::PodLog,
    /// Each queue's usage history as the last cycle returned it (while usage history is
    /// on); a queue not in it goes on from its status. Cleared when leadership changes: the
    /// Queues' status is then the truth.
    usage: BTreeMap<String, QueueUsage>,
    leader: watch::Receiver<bool>,
    /// Since when each node's agent may be called missing in pending pods' messages.
    agent_wait: AgentWait,
}

impl Scheduler {
    /// A loop over `cache` and `registry`, writing through `client`; `node_pods` publishes
    /// the agents' pod lists, flushed before each batch of announced bindings.
    pub fn new(
        client: kube::Client,
        config: Arc<CoordinatorConfig>,
        cache: Cache,
        registry: AgentRegistry,
        node_pods: super::node_pods::Publisher,
        metrics: Arc<Metrics>,
        leader: watch::Receiver<bool>,
    ) -> Self {
        // Every write of the loop (bindings, evictions, status, events) goes through the gate,
        // so a replica that lost the Lease mid-batch sends nothing more.
        let client = gate::gated(client, leader.clone());
        // Events and status are written beside the loop: a Binding never waits for either.
        let events =
            EventWriter::new(client.clone(), &config.scheduler_name, &config.identity).queued();
        Self {
            binder: Binder::new(client.clone(), events.clone())
                .with_call_timeout(config.bind_call_timeout),
            status: StatusQueue::start(
                StatusWriter::new(client, events).with_usage_interval(config.usage_write_interval),
                config.scheduler_name.clone(),
            ),
            term: 0,
            planner: Planner::new(config.bind_wait_timeout),
            snapshots: Builder::default(),
            node_pods,
            refusals: Refusals::default(),
            refusal_log: cache.pod_log(),
            agent_wait: AgentWait::new(config.agent_grace),
            usage: BTreeMap::new(),
            config,
            cache,
            registry,
            metrics,
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
                self.planner = Planner::new(self.config.bind_wait_timeout);
                self.term += 1;
                self.usage.clear();
                if leading {
                    tracing::info!(identity = %self.config.identity, "leading: scheduling");
                    // Agents connect only to the leader: each has its grace period from now.
                    self.agent_wait.leading(Instant::now());
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

    /// One cycle: forget what the cache now shows and retry rollbacks, bind held decisions
    /// whose node is clear, schedule, evict, bind the new decisions, write status. The planner
    /// plans each step from the store and the outcomes of the step before.
    async fn cycle(&mut self) {
        let store = self.cache.store();
        let mut bound_now = BTreeSet::new();
        let writes = self.planner.begin(&store, now());
        self.execute(&store, writes, &mut bound_now).await;
        let allocated = self.registry.allocated_by_node();
        let writes = self.planner.release_held(&store, &allocated, now());
        self.execute(&store, writes, &mut bound_now).await;

        let agents = self.registry.all();
        self.metrics
            .set_agents_connected(self.registry.connected_count());
        let ask = self
            .cache
            .read_pod_changes(&self.refusal_log, |store, changed| {
                self.refusals.observe(store, changed, &agents)
            });
        for node in ask {
            self.registry
                .request_resync(&node, "a pod was refused at admission");
        }
        self.refusals.settle(&agents);
        let mut overlay = self.planner.overlay(&store);
        overlay.refused = self.refusals.active().clone();
        let at = now();
        let mut translated = self.snapshots.build(
            &store,
            &agents,
            &overlay,
            &BuildContext {
                now: at.unix_seconds(),
                instant: at.instant,
                agent_timeout: self.config.agent_timeout,
                scheduler_name: &self.config.scheduler_name,
            },
        );
        let nominated = self
            .planner
            .hidden_nominations(&store, &self.config.scheduler_name, at);
        translated
            .snapshot
            .pods
            .retain(|p| !nominated.contains(&p.uid));
        if self.config.cycle.usage.is_on() {
            let from_status = store
                .queues
                .values()
                .filter(|q| {
                    q.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| !self.usage.contains_key(n))
                })
                .filter_map(|q| crate::translate::queue::usage_of(q));
            translated.snapshot.usage = self.usage.values().cloned().chain(from_status).collect();
        }
        let started = Instant::now();
        let decisions = schedule(&translated.snapshot, &self.config.cycle);
        self.usage = decisions
            .usage
            .iter()
            .map(|u| (u.queue.clone(), u.clone()))
            .collect();
        self.metrics.observe_cycle(started.elapsed());
        self.planner
            .note_gangs_below_min(&decisions.gangs_below_min, at);

        let writes = self.planner.evictions(
            &translated.snapshot,
            &decisions,
            self.config.cycle.gang_grace_seconds,
            now(),
        );
        self.execute(&store, writes, &mut bound_now).await;
        let allocated = self.registry.allocated_by_node();
        let writes =
            self.planner
                .decide(&store, &translated.snapshot, &decisions, &allocated, now());
        self.execute(&store, writes, &mut bound_now).await;
        if !self.leading() {
            return;
        }
        let waiting = self.planner.waiting_for_victims();
        let mut keep = self.planner.decided();
        keep.extend(nominated);
        self.record(&decisions);
        let overdue = self.agent_wait.overdue(&store, &agents, Instant::now());
        self.status.submit(StatusJob {
            term: self.term,
            store,
            translated,
            decisions,
            bound: bound_now,
            waiting,
            keep,
            overdue,
        });
    }

    /// Executes `writes` in order, each outcome fed back to the planner, its follow-up writes
    /// (a gang rollback) run before the rest. Stops when this replica stops leading.
    async fn execute(
        &mut self,
        store: &Store,
        writes: Vec<Write>,
        bound_now: &mut BTreeSet<String>,
    ) {
        let mut queue = VecDeque::from(writes);
        while let Some(write) = queue.pop_front() {
            if !self.leading() {
                return;
            }
            let follow_up = match write {
                Write::Bind { unit, wave } => {
                    let waves = take_concurrent_binds(
                        &mut queue,
                        (unit, wave),
                        self.config.binds_in_flight,
                    );
                    self.bind_waves(store, &waves, bound_now).await
                }
                Write::RollBack { reason, members } => {
                    self.roll_back(&reason, &members).await;
                    Vec::new()
                }
                Write::Evict(eviction) => {
                    // The evictions next in line are independent of each other: they go out
                    // together, up to the same limit as bindings.
                    let mut evictions = vec![eviction];
                    while evictions.len() < self.config.binds_in_flight.max(1)
                        && matches!(queue.front(), Some(Write::Evict(_)))
                    {
                        if let Some(Write::Evict(next)) = queue.pop_front() {
                            evictions.push(next);
                        }
                    }
                    self.evict_all(&evictions).await;
                    Vec::new()
                }
            };
            for w in follow_up.into_iter().rev() {
                queue.push_front(w);
            }
        }
    }

    /// Binds `waves` (each a unit's, member by member) concurrently, then feeds each outcome
    /// to the planner in order and returns the follow-up writes of all of them.
    async fn bind_waves(
        &mut self,
        store: &Store,
        waves: &[(String, Vec<BindTarget>)],
        bound_now: &mut BTreeSet<String>,
    ) -> Vec<Write> {
        // The agents hear of the bindings before the kubelets can: an Allocate must never
        // find its pod unknown to the agent and be mistaken for another one. What left the
        // nodes first (and made room) goes out before.
        self.node_pods.flush();
        for t in waves.iter().flat_map(|(_, wave)| wave) {
            if let Some(pod) = store.pods.get(&t.uid) {
                let assignment = t.assignment.to_json();
                if let Some((node, bound)) = super::node_pods::as_bound(pod, &t.node, &assignment) {
                    self.registry.announce_binding(&node, bound);
                }
            }
        }
        let binder = &self.binder;
        let outcomes =
            futures::future::join_all(waves.iter().map(|(_, wave)| binder.bind_unit(wave))).await;
        let mut follow_up = Vec::new();
        for ((unit, wave), outcome) in waves.iter().zip(outcomes) {
            for t in wave.iter().filter(|t| !outcome.bound.contains(&t.uid)) {
                self.registry.withdraw_binding(&t.node, &t.uid);
            }
            bound_now.extend(outcome.bound.iter().cloned());
            self.metrics.add_pods_placed(outcome.bound.len() as u64);
            match &outcome.failed {
                Some(failure) if failure.deposed => {
                    tracing::info!(
                        unit,
                        "leadership lost while binding a unit; the new leader takes over"
                    );
                }
                Some(failure) => {
                    self.metrics.inc_bind_errors();
                    tracing::warn!(pod = %failure.uid, error = %failure.error, unit, "bind failed; the unit is not bound");
                }
                None => {}
            }
            follow_up.extend(self.planner.after_bind(unit, wave, &outcome, now()));
        }
        follow_up
    }

    async fn roll_back(&mut self, reason: &str, members: &[Rollback]) {
        let targets: Vec<EvictTarget> = members.iter().map(|r| r.member.evict_target()).collect();
        let outcome = self.binder.roll_back_unit(&targets, reason).await;
        if !outcome.rolled_back.is_empty() {
            self.metrics
                .add_evictions("gang-bind-failed", outcome.rolled_back.len() as u64);
        }
        self.planner.after_rollback(members, &outcome, now());
    }

    /// Evicts `evictions` concurrently, then tells the planner each outcome in order.
    async fn evict_all(&mut self, evictions: &[Eviction]) {
        let binder = &self.binder;
        let results =
            futures::future::join_all(evictions.iter().map(|e| binder.evict(&e.target, &e.text)))
                .await;
        for (eviction, result) in evictions.iter().zip(results) {
            match &result {
                Ok(_) => self.metrics.add_evictions(eviction.label, 1),
                Err(error) => {
                    tracing::warn!(pod = %eviction.target.name, %error, "eviction failed; the next cycle decides again");
                }
            }
            self.planner.after_evict(eviction, result.is_ok(), now());
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

/// `first` and the binding waves after it that may go out together with it: up to `limit`
/// waves in all, no two binding to the same node, taken from the run of binding writes at the
/// front of `queue` (what follows an eviction or a rollback waits for it). Per node the
/// Bindings keep the planner's order, one at a time, as the kubelet's serial admission and the
/// agent's matching of nameless Allocate calls expect; only different nodes' go concurrently.
fn take_concurrent_binds(
    queue: &mut VecDeque<Write>,
    first: (String, Vec<BindTarget>),
    limit: usize,
) -> Vec<(String, Vec<BindTarget>)> {
    let mut nodes: BTreeSet<String> = first.1.iter().map(|t| t.node.clone()).collect();
    let mut waves = vec![first];
    let mut i = 0;
    // A bounded look-ahead: a long queue of one node's bindings is not scanned to its end.
    let horizon = 4 * limit.max(1);
    while waves.len() < limit.max(1) && i < queue.len().min(horizon) {
        let Some(Write::Bind { wave, .. }) = queue.get(i) else {
            break;
        };
        if wave.iter().any(|t| nodes.contains(&t.node)) {
            // This node's earlier wave goes first; so does every later wave to it.
            nodes.extend(wave.iter().map(|t| t.node.clone()));
            i += 1;
            continue;
        }
        nodes.extend(wave.iter().map(|t| t.node.clone()));
        if let Some(Write::Bind { unit, wave }) = queue.remove(i) {
            waves.push((unit, wave));
        }
    }
    waves
}

/// The clock, read here only: the planner is given it.
fn now() -> Now {
    Now {
        instant: Instant::now(),
        wall: jiff::Timestamp::now(),
    }
}

/// A short metric label for why a pod is pending.
fn pending_category(p: &tessera_core::cycle::PendingExplanation) -> &'static str {
    use tessera_core::cycle::Reason;
    let Some((reason, _)) = p.reasons.iter().max_by_key(|(_, n)| *n) else {
        return "unknown";
    };
    match reason {
        Reason::InvalidInput { .. } => "invalid-input",
        Reason::UnknownQueue { .. } | Reason::NotLeafQueue { .. } => "queue",
        Reason::GroupLargerThanCluster { .. } => "group-larger-than-cluster",
        Reason::WaitingForMembers { .. } | Reason::BeyondMaxMember { .. } => "gang-incomplete",
        Reason::QueueOverLimit { .. } | Reason::QueueOverModelLimit { .. } => "queue-limit",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(unit: &str, nodes: &[&str]) -> Write {
        Write::Bind {
            unit: unit.into(),
            wave: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| BindTarget {
                    namespace: "default".into(),
                    name: format!("{unit}-{i}"),
                    uid: format!("{unit}-{i}"),
                    node: (*n).into(),
                    assignment: Default::default(),
                })
                .collect(),
        }
    }

    fn units(waves: &[(String, Vec<BindTarget>)]) -> Vec<&str> {
        waves.iter().map(|(u, _)| u.as_str()).collect()
    }

    fn left(queue: &VecDeque<Write>) -> Vec<String> {
        queue
            .iter()
            .map(|w| match w {
                Write::Bind { unit, .. } => unit.clone(),
                Write::RollBack { .. } => "rollback".into(),
                Write::Evict(_) => "evict".into(),
            })
            .collect()
    }

    fn first(write: Write) -> (String, Vec<BindTarget>) {
        match write {
            Write::Bind { unit, wave } => (unit, wave),
            _ => unreachable!("the tests start with a binding"),
        }
    }

    #[test]
    fn different_nodes_go_together_and_one_nodes_bindings_keep_their_order() {
        let mut queue = VecDeque::from([
            bind("b", &["n2"]),
            bind("c", &["n1"]),
            bind("d", &["n3"]),
            bind("e", &["n1"]),
        ]);
        let waves = take_concurrent_binds(&mut queue, first(bind("a", &["n1"])), 16);
        assert_eq!(units(&waves), ["a", "b", "d"]);
        assert_eq!(
            left(&queue),
            ["c", "e"],
            "n1's later bindings wait, in order"
        );
    }

    #[test]
    fn a_gang_wave_claims_all_its_nodes_and_nothing_passes_a_rollback() {
        let mut queue = VecDeque::from([
            bind("other-on-n2", &["n2"]),
            bind("n4", &["n4"]),
            Write::RollBack {
                reason: "r".into(),
                members: Vec::new(),
            },
            bind("after", &["n5"]),
        ]);
        let waves = take_concurrent_binds(&mut queue, first(bind("gang", &["n1", "n2", "n3"])), 16);
        assert_eq!(units(&waves), ["gang", "n4"]);
        assert_eq!(left(&queue), ["other-on-n2", "rollback", "after"]);
    }

    #[test]
    fn the_limit_bounds_the_waves_in_flight() {
        let mut queue: VecDeque<Write> = (0..10)
            .map(|i| bind(&format!("u{i}"), &[&format!("n{i}")]))
            .collect();
        let waves = take_concurrent_binds(&mut queue, first(bind("a", &["m"])), 3);
        assert_eq!(units(&waves), ["a", "u0", "u1"]);
        assert_eq!(queue.len(), 8);
        let one = take_concurrent_binds(&mut queue, first(bind("b", &["m"])), 1);
        assert_eq!(units(&one), ["b"]);
    }
}
