//! The scheduler's binding state machine as plain data and pure functions: what this replica
//! decided and has not seen in the cache yet, and the writes that follow from it.
//!
//! [`Planner`] is driven by the scheduling loop in steps. Each planning step reads the cache's
//! [`Store`] (never written), this cycle's [`Decisions`] where it needs them and an explicit
//! [`Now`], changes the planner's state and returns [`Write`]s; the loop hands each write to
//! the binder and feeds what became of it back ([`Planner::after_bind`],
//! [`Planner::after_rollback`], [`Planner::after_evict`]), which may return follow-up writes (a
//! gang rollback) to run next. Nothing here awaits, reads a clock or talks to the API server.
//!
//! A pod is in one of these states here: *held* (decided, waiting for the pods evicted for it
//! to be gone and for the same-count rule), *bound* (its Binding went through, the cache does
//! not show it yet), *to roll back* (its unit failed after it was bound, or its Binding went
//! unanswered and may still land), *rolled back* (evicted for its unit, still terminating),
//! *evicting* (a victim this replica evicted). Held members keep their unit, a gang or a
//! single pod, in `units`.
//!
//! The invariant **no partial gang is left bound** is kept by [`Planner::fail_unit`], the one
//! path every failure of a unit takes, whatever its kind: a held member waited too long or was
//! given up, or a Binding was refused (any 4xx: 409 conflict, 404, 429 Too Many Requests), went
//! unanswered (maybe bound) or was not sent because this replica lost the Lease. Members not
//! bound stay unbound (their decisions are forgotten and backed off); members bound are
//! evicted, and what the API server would not evict yet, or a Binding that got no answer and
//! may still land, is rolled back in a later cycle once the cache shows the pod bound. Until
//! every rolled-back member is gone no other member of its unit is bound: the core counts a
//! terminating member towards its gang, and completing the gang around it would leave it
//! partial. A deposed replica writes nothing more: the new leader sees the members bound so far
//! and completes the gang from the API's state.

mod hold;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::binder::{BindFailure, BindTarget, EvictTarget, RollbackOutcome, UnitOutcome};
use super::cache::Store;
use super::snapshot::Overlay;
use hold::{Unallocated, held_too_long, is_finished, node_of, victims_gone};
use tessera_core::cycle::{Decisions, EvictionReason};
use tessera_core::model::{Placement, Snapshot};

/// Evictions not seen in the cache after this long are forgotten (the next cycle decides
/// again).
const EVICTION_MEMORY: Duration = Duration::from_secs(300);
/// Bindings not seen in the cache after this long are forgotten.
const BIND_MEMORY: Duration = Duration::from_secs(300);
/// A unit whose bind failed is not bound again for this long (the API keeps refusing it, or
/// the cache must catch up first).
const BIND_BACKOFF: Duration = Duration::from_secs(1);
/// How long a bound GPU pod deleted before its kubelet allocated it still holds its node for
/// the same-count rule. The kubelet may admit such a pod for a moment after the API server
/// deleted it (its informer has not delivered the deletion yet); its nameless Allocate must
/// not meet another unallocated pod of the same size, or the agent answers it with that pod's
/// share. The delay between the deletion and the kubelet hearing of it is the informer's
/// watch latency: well under a second, a few seconds on a saturated machine.
const DEPARTED_HOLD: Duration = Duration::from_secs(5);
/// A pending rollback whose pod the cache has not shown bound for this long is dropped: an
/// unanswered Binding that the server was going to apply has been applied by then.
const ROLLBACK_WATCH: Duration = Duration::from_secs(60);

/// The time a step runs at, read by the caller: monotonic for this replica's own timers,
/// wall-clock for what the API server stamps (`deletionTimestamp`) and logical time.
#[derive(Clone, Copy, Debug)]
pub(super) struct Now {
    /// For holds, backoffs and memories.
    pub instant: Instant,
    /// For victims' `deletionTimestamp`s.
    pub wall: jiff::Timestamp,
}

impl Now {
    /// Logical time: Unix seconds, the clock of pods' creation times, so every replica agrees.
    pub(super) fn unix_seconds(&self) -> u64 {
        self.wall.as_second().max(0) as u64
    }
}

/// A write for the binder, in the order returned.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Write {
    /// Bind one wave of `unit`, member by member, stopping at the first failure; the outcome
    /// goes to [`Planner::after_bind`].
    Bind {
        /// `namespace/group`, or `pod:<uid>` for a pod without a gang.
        unit: String,
        /// One Binding per member, in order.
        wave: Vec<BindTarget>,
    },
    /// Roll back members of failed units, all for `reason`; the outcome goes to
    /// [`Planner::after_rollback`].
    RollBack {
        /// The text of the eviction events.
        reason: String,
        /// Each member already bound or being bound, with what undoing its binding takes.
        members: Vec<Rollback>,
    },
    /// Evict a pod the core chose as a victim; the outcome goes to [`Planner::after_evict`].
    Evict(Eviction),
}

/// A victim to evict, with why.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Eviction {
    /// The victim as the binder deletes it (namespace, name, and the UID that guards
    /// against deleting a newer pod of the same name).
    pub target: EvictTarget,
    /// Where it runs: the decisions held for that node wait for it.
    pub node: Option<String>,
    /// Metric label.
    pub label: &'static str,
    /// Event text.
    pub text: String,
}

/// A member to roll back because its unit could not be bound whole.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Rollback {
    /// The Binding this replica made (or asked for): it is rolled back only while the cache
    /// shows the pod bound to that node.
    pub member: BindTarget,
    /// Its unit.
    pub unit: String,
    /// Why, for the eviction event; empty until the unit fails.
    pub reason: String,
    /// When the unit failed (or the member was bound, until then).
    pub since: Instant,
}

/// A pod this replica decided to place.
#[derive(Clone, Debug)]
struct Decided {
    /// The Binding to write, assignment split per container.
    target: BindTarget,
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
#[derive(Clone, Debug, Default)]
struct Unit {
    /// Every member's uid (bound or held).
    members: BTreeSet<String>,
    /// The members this replica bound in earlier waves, which a failure must roll back: once
    /// the cache shows them bound they are no longer in `decided`.
    bound: BTreeMap<String, Rollback>,
}

/// How a unit failed.
enum Failure<'a> {
    /// Not bound in time, or a held member given up: nothing is in flight.
    GivenUp(String),
    /// A Binding of `wave` failed.
    Bind(&'a BindFailure, &'a [BindTarget]),
}

/// The loop's memory; a new one when leadership changes (the API server's state is then the
/// only truth).
#[derive(Debug)]
pub(super) struct Planner {
    /// How long a decision may be held when no victim's grace period bounds the wait.
    bind_wait_timeout: Duration,
    decided: BTreeMap<String, Decided>,
    /// Units with held members.
    units: BTreeMap<String, Unit>,
    evicting: BTreeMap<String, Instant>,
    /// Members of failed units still to be rolled back: evictions the API server throttled
    /// or did not answer, and Bindings that went unanswered (the server may apply them late).
    /// Each is evicted once the cache shows it bound to the node it was meant for.
    rollbacks: BTreeMap<String, Rollback>,
    /// Members a rollback evicted that are still in the API (terminating), with their unit.
    rolled_back: BTreeMap<String, String>,
    /// Pods of units whose bind failed, and until when they are not bound again.
    backoff: BTreeMap<String, Instant>,
    below_min_since: BTreeMap<(String, String), u64>,
    /// This cycle's victims the API server accepted, per node, for [`Planner::decide`].
    victims: BTreeMap<String, BTreeSet<String>>,
    /// The unallocated GPU pods of the last pass, to notice those deleted before allocation.
    last_unallocated: BTreeMap<String, (String, BTreeSet<u32>)>,
    /// Pods deleted before their kubelet allocated them: still holding their node's request
    /// sizes until [`DEPARTED_HOLD`] after the deletion was noticed.
    departed: BTreeMap<String, (String, BTreeSet<u32>, Instant)>,
}

impl Planner {
    /// Empty memory; a held decision not bound within `bind_wait_timeout` fails its unit
    /// (unless it waits for victims whose grace period bounds the wait).
    pub(super) fn new(bind_wait_timeout: Duration) -> Self {
        Self {
            bind_wait_timeout,
            decided: BTreeMap::new(),
            units: BTreeMap::new(),
            evicting: BTreeMap::new(),
            rollbacks: BTreeMap::new(),
            rolled_back: BTreeMap::new(),
            backoff: BTreeMap::new(),
            below_min_since: BTreeMap::new(),
            victims: BTreeMap::new(),
            last_unallocated: BTreeMap::new(),
            departed: BTreeMap::new(),
        }
    }

    /// The first step of a cycle: forgets what the cache caught up with, and rolls back the
    /// pending rollbacks whose pod the cache now shows bound where it was meant to be (one
    /// gone, or replaced under its name, is dropped, and so is one still unbound after
    /// [`ROLLBACK_WATCH`]).
    pub(super) fn begin(&mut self, store: &Store, now: Now) -> Vec<Write> {
        self.expire(store, now);
        let mut due = Vec::new();
        self.rollbacks.retain(|uid, r| match store.pods.get(uid) {
            None => false,
            Some(pod) if node_of(pod) == Some(r.member.node.as_str()) && !is_finished(pod) => {
                due.push(r.clone());
                true
            }
            Some(_) => now.instant.duration_since(r.since) < ROLLBACK_WATCH,
        });
        rollback_writes(due)
    }

    fn expire(&mut self, store: &Store, now: Now) {
        self.backoff.retain(|_, until| *until > now.instant);
        self.evicting.retain(|uid, at| {
            store.pods.contains_key(uid) && now.instant.duration_since(*at) < EVICTION_MEMORY
        });
        self.rolled_back
            .retain(|uid, _| store.pods.get(uid).is_some_and(|p| !is_finished(p)));
        self.decided.retain(|uid, d| {
            let Some(pod) = store.pods.get(uid) else {
                return false;
            };
            if is_finished(pod) || node_of(pod).is_some() {
                return false;
            }
            d.state != DecidedState::Bound || now.instant.duration_since(d.since) < BIND_MEMORY
        });
        let decided = &self.decided;
        self.units
            .retain(|_, unit| unit.members.iter().any(|m| is_held(decided, m)));
    }

    /// Binds held decisions whose node is clear, and fails units held too long. `allocated`:
    /// per node, the pods its agent reports allocated.
    pub(super) fn release_held(
        &mut self,
        store: &Store,
        allocated: &BTreeMap<String, BTreeSet<String>>,
        now: Now,
    ) -> Vec<Write> {
        let units: Vec<String> = self.units.keys().cloned().collect();
        self.release(store, units, allocated, now)
    }

    /// Releases `units` in order. The unallocated pods are computed once per pass over the
    /// units (each release adds what it binds), not once per unit.
    fn release(
        &mut self,
        store: &Store,
        units: Vec<String>,
        allocated: &BTreeMap<String, BTreeSet<String>>,
        now: Now,
    ) -> Vec<Write> {
        let mut pending = hold::unallocated_gpu_pods(store, &self.decided, allocated);
        self.note_departed(store, &mut pending, now);
        let mut writes = Vec::new();
        for unit in units {
            writes.extend(self.release_unit(store, &unit, &mut pending, now));
        }
        writes
    }

    /// Notices the unallocated pods of the last pass that were deleted since (gone, or
    /// deleting), and adds every pod deleted within [`DEPARTED_HOLD`] to `pending`: the
    /// kubelet may still admit it.
    fn note_departed(
        &mut self,
        store: &Store,
        pending: &mut BTreeMap<String, Vec<Unallocated>>,
        now: Now,
    ) {
        for (uid, (node, sizes)) in std::mem::take(&mut self.last_unallocated) {
            let deleted = store
                .pods
                .get(&uid)
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some() && !is_finished(p));
            if deleted {
                self.departed
                    .entry(uid)
                    .or_insert((node, sizes, now.instant));
            }
        }
        self.departed
            .retain(|_, (_, _, at)| now.instant.duration_since(*at) < DEPARTED_HOLD);
        self.last_unallocated = pending
            .iter()
            .flat_map(|(node, pods)| {
                pods.iter()
                    .map(move |(uid, sizes, _)| (uid.clone(), (node.clone(), sizes.clone())))
            })
            .collect();
        for (uid, (node, sizes, _)) in &self.departed {
            pending
                .entry(node.clone())
                .or_default()
                .push((uid.clone(), sizes.clone(), None));
        }
    }

    fn release_unit(
        &mut self,
        store: &Store,
        unit: &str,
        pending: &mut BTreeMap<String, Vec<Unallocated>>,
        now: Now,
    ) -> Vec<Write> {
        let Some(members) = self.units.get(unit).map(|u| u.members.clone()) else {
            return Vec::new();
        };
        // Victims all gone: from here on the decision waits only for the same-count rule,
        // timed from now.
        for uid in &members {
            if let Some(d) = self.decided.get_mut(uid)
                && let DecidedState::Held { victims } = &mut d.state
                && !victims.is_empty()
                && victims_gone(store, victims)
            {
                victims.clear();
                d.since = now.instant;
            }
        }
        let expired = members.iter().find_map(|m| {
            let d = self.decided.get(m)?;
            let DecidedState::Held { victims } = &d.state else {
                return None;
            };
            held_too_long(store, victims, d.since, now, self.bind_wait_timeout)
        });
        if let Some(why) = expired {
            return self.fail_unit(unit, Failure::GivenUp(why), now);
        }
        let mut wave = Vec::new();
        for uid in &members {
            let Some(d) = self.decided.get(uid) else {
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
            let count = hold::gpu_sizes(pod);
            let on_node = pending.entry(d.target.node.clone()).or_default();
            if !count.is_empty() {
                let conflict = on_node.iter().any(|(other, c, a)| {
                    other != uid
                        && !c.is_disjoint(&count)
                        && a.as_ref() != Some(&d.target.assignment)
                });
                if conflict {
                    continue;
                }
                on_node.push((uid.clone(), count, Some(d.target.assignment.clone())));
            }
            wave.push(d.target.clone());
        }
        if wave.is_empty() {
            return Vec::new();
        }
        vec![Write::Bind {
            unit: unit.to_owned(),
            wave,
        }]
    }

    /// What became of a [`Write::Bind`]: the members bound are bound (and not rolled back
    /// for an earlier unanswered Binding any more); a failure of any kind fails the unit
    /// through [`Planner::fail_unit`], whose rollback writes come back to run next.
    pub(super) fn after_bind(
        &mut self,
        unit: &str,
        wave: &[BindTarget],
        outcome: &UnitOutcome,
        now: Now,
    ) -> Vec<Write> {
        for t in wave.iter().filter(|t| outcome.bound.contains(&t.uid)) {
            if let Some(d) = self.decided.get_mut(&t.uid) {
                d.state = DecidedState::Bound;
                d.since = now.instant;
            }
            // Bound again after an unanswered Binding was given up: this binding is the one
            // that counts, and it must not be rolled back.
            self.rollbacks.remove(&t.uid);
            if let Some(u) = self.units.get_mut(unit) {
                u.bound.insert(
                    t.uid.clone(),
                    Rollback {
                        member: t.clone(),
                        unit: unit.to_owned(),
                        reason: String::new(),
                        since: now.instant,
                    },
                );
            }
        }
        if let Some(failure) = &outcome.failed {
            return self.fail_unit(unit, Failure::Bind(failure, wave), now);
        }
        let decided = &self.decided;
        if self
            .units
            .get(unit)
            .is_some_and(|u| !u.members.iter().any(|m| is_held(decided, m)))
        {
            self.units.remove(unit);
        }
        Vec::new()
    }

    /// Gives up a unit: the one rollback path, so no partial gang is left bound (see the
    /// module documentation). Returns the rollback writes; none when this replica was deposed
    /// (the write gate would send nothing, and the new leader completes the gang).
    fn fail_unit(&mut self, unit: &str, failure: Failure<'_>, now: Now) -> Vec<Write> {
        let Some(state) = self.units.remove(unit) else {
            return Vec::new();
        };
        let until = now.instant + BIND_BACKOFF;
        for uid in &state.members {
            self.backoff.insert(uid.clone(), until);
            self.decided.remove(uid);
        }
        let (why, unanswered) = match failure {
            Failure::GivenUp(why) => (why, None),
            Failure::Bind(f, _) if f.deposed => return Vec::new(),
            Failure::Bind(f, wave) => (
                f.error.clone(),
                wave.iter().find(|t| f.maybe_bound && t.uid == f.uid),
            ),
        };
        let reason = format!(
            "gang {unit} could not be bound whole ({why}); evicting the members already bound so no partial gang runs"
        );
        let bound: Vec<Rollback> = state
            .bound
            .into_values()
            .map(|r| Rollback {
                reason: reason.clone(),
                since: now.instant,
                ..r
            })
            .collect();
        if let Some(t) = unanswered {
            self.rollbacks.insert(
                t.uid.clone(),
                Rollback {
                    member: t.clone(),
                    unit: unit.to_owned(),
                    reason,
                    since: now.instant,
                },
            );
        }
        rollback_writes(bound)
    }

    /// What became of a [`Write::RollBack`] of `members`: the ones evicted are evicting and
    /// keep their unit from binding until gone; the ones the API server did not remove are
    /// tried again in later cycles.
    pub(super) fn after_rollback(
        &mut self,
        members: &[Rollback],
        outcome: &RollbackOutcome,
        now: Now,
    ) {
        for uid in &outcome.rolled_back {
            self.rollbacks.remove(uid);
            self.evicting.insert(uid.clone(), now.instant);
        }
        for r in members {
            if outcome.retry.contains(&r.member.uid) {
                self.rollbacks.insert(r.member.uid.clone(), r.clone());
            } else {
                self.rolled_back
                    .insert(r.member.uid.clone(), r.unit.clone());
            }
        }
    }

    /// What the snapshot is overlaid with: this replica's decisions and evictions the cache
    /// does not show yet, and the stale-gang timing.
    pub(super) fn overlay(&self, store: &Store) -> Overlay {
        Overlay {
            assumed: self
                .decided
                .iter()
                .map(|(uid, d)| {
                    (
                        uid.clone(),
                        Placement {
                            node: d.target.node.clone(),
                            // Each GPU once, as translate reads a bound pod's assignment.
                            assignment: crate::translate::containers::merged(&d.target.assignment),
                        },
                    )
                })
                .collect(),
            // A bound member waiting for its rollback is leaving: nothing is built on it. One
            // whose Binding went unanswered and that is still unbound may be placed again.
            evicting: self
                .evicting
                .keys()
                .chain(self.rollbacks.iter().filter_map(|(uid, r)| {
                    let pod = store.pods.get(uid)?;
                    (node_of(pod) == Some(r.member.node.as_str())).then_some(uid)
                }))
                .cloned()
                .collect(),
            below_min_member_since: self.below_min_since.clone(),
            // The scheduler adds what the nodes refused; the planner does not track it.
            refused: BTreeMap::new(),
        }
    }

    /// Pods an earlier leader nominated while their victims terminate, to be left out of the
    /// snapshot until those are gone (or past their grace period): the victims keep their
    /// GPUs, so a new decision would take further victims.
    pub(super) fn hidden_nominations(
        &self,
        store: &Store,
        scheduler_name: &str,
        now: Now,
    ) -> BTreeSet<String> {
        hold::nominated_to_terminating(store, &self.decided, scheduler_name, now)
    }

    /// Starts or keeps the below-`minMember` time of the groups the core lists (`ns/name`),
    /// and forgets the others.
    pub(super) fn note_gangs_below_min(&mut self, gangs: &[String], now: Now) {
        let mut below = BTreeMap::new();
        for g in gangs {
            if let Some((ns, name)) = g.split_once('/') {
                let key = (ns.to_owned(), name.to_owned());
                let since = self
                    .below_min_since
                    .get(&key)
                    .copied()
                    .unwrap_or(now.unix_seconds());
                below.insert(key, since);
            }
        }
        self.below_min_since = below;
    }

    /// The core's evictions as writes. A victim that is a decision held for a later bind is
    /// not bound yet: giving it up is enough (an eviction would delete the pending pod), and
    /// its gang cannot be whole any more, so its unit fails.
    pub(super) fn evictions(
        &mut self,
        snap: &Snapshot,
        decisions: &Decisions,
        gang_grace_seconds: u64,
        now: Now,
    ) -> Vec<Write> {
        self.victims.clear();
        let by_uid: BTreeMap<&str, &tessera_core::model::Pod> =
            snap.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let mut writes = Vec::new();
        for e in &decisions.evictions {
            let Some(pod) = by_uid.get(e.pod.as_str()) else {
                continue;
            };
            if is_held(&self.decided, &pod.uid) {
                let unit = self
                    .units
                    .iter()
                    .find(|(_, u)| u.members.contains(&pod.uid))
                    .map(|(u, _)| u.clone());
                match unit {
                    Some(unit) => {
                        let why = "a member waiting for its node was given up".to_owned();
                        writes.extend(self.fail_unit(&unit, Failure::GivenUp(why), now));
                    }
                    None => {
                        self.decided.remove(&pod.uid);
                    }
                }
                continue;
            }
            let (label, text) = eviction_text(&e.reason, pod, &by_uid, gang_grace_seconds);
            writes.push(Write::Evict(Eviction {
                target: EvictTarget {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                },
                node: pod.placement.as_ref().map(|pl| pl.node.clone()),
                label,
                text,
            }));
        }
        writes
    }

    /// What became of a [`Write::Evict`]: `accepted` when the API server evicted the pod (or
    /// it was gone already). A refused eviction is forgotten: the next cycle decides again.
    pub(super) fn after_evict(&mut self, eviction: &Eviction, accepted: bool, now: Now) {
        if !accepted {
            return;
        }
        let uid = &eviction.target.uid;
        self.evicting.insert(uid.clone(), now.instant);
        self.decided.remove(uid);
        if let Some(node) = &eviction.node {
            self.victims
                .entry(node.clone())
                .or_default()
                .insert(uid.clone());
        }
    }

    /// Turns the cycle's bindings into held decisions, unit by unit (a binding marked
    /// `after_evictions` waits for this cycle's victims on its node), and binds what can be
    /// bound now. Units backed off after a failure, or with members still being rolled back,
    /// are skipped.
    pub(super) fn decide(
        &mut self,
        store: &Store,
        snap: &Snapshot,
        decisions: &Decisions,
        allocated: &BTreeMap<String, BTreeSet<String>>,
        now: Now,
    ) -> Vec<Write> {
        let victims = std::mem::take(&mut self.victims);
        let by_uid: BTreeMap<&str, &tessera_core::model::Pod> =
            snap.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let unit_of = |pod: &tessera_core::model::Pod| match &pod.group {
            Some(g) => format!("{}/{}", pod.namespace, g),
            None => format!("pod:{}", pod.uid),
        };
        let mut backed_off: BTreeSet<String> = decisions
            .bindings
            .iter()
            .filter(|b| self.backoff.contains_key(&b.pod))
            .filter_map(|b| by_uid.get(b.pod.as_str()).map(|p| unit_of(p)))
            .collect();
        backed_off.extend(self.rolled_back.values().cloned());
        backed_off.extend(self.rollbacks.values().map(|r| r.unit.clone()));
        let mut order: Vec<String> = Vec::new();
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
            self.decided.insert(
                b.pod.clone(),
                Decided {
                    target: BindTarget {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        uid: b.pod.clone(),
                        node: b.node.clone(),
                        assignment,
                    },
                    since: now.instant,
                    state: DecidedState::Held { victims: held_for },
                },
            );
            self.units
                .entry(unit.clone())
                .or_default()
                .members
                .insert(b.pod.clone());
            if !order.contains(&unit) {
                order.push(unit);
            }
        }
        self.release(store, order, allocated, now)
    }

    /// Held decisions waiting for victims, uid → node: their pods' `nominatedNodeName`.
    pub(super) fn waiting_for_victims(&self) -> BTreeMap<String, String> {
        self.decided
            .iter()
            .filter(
                |(_, d)| matches!(&d.state, DecidedState::Held { victims } if !victims.is_empty()),
            )
            .map(|(uid, d)| (uid.clone(), d.target.node.clone()))
            .collect()
    }

    /// Every pod with a decision of this replica not yet seen in the cache.
    pub(super) fn decided(&self) -> BTreeSet<String> {
        self.decided.keys().cloned().collect()
    }
}

fn is_held(decided: &BTreeMap<String, Decided>, uid: &str) -> bool {
    decided
        .get(uid)
        .is_some_and(|d| matches!(d.state, DecidedState::Held { .. }))
}

/// One [`Write::RollBack`] per reason (one event text per batch).
fn rollback_writes(members: Vec<Rollback>) -> Vec<Write> {
    let mut by_reason: BTreeMap<String, Vec<Rollback>> = BTreeMap::new();
    for r in members {
        by_reason.entry(r.reason.clone()).or_default().push(r);
    }
    by_reason
        .into_iter()
        .map(|(reason, members)| Write::RollBack { reason, members })
        .collect()
}

/// A victim's metric label and event text: why, and what happens to the pod next (its
/// controller recreates it, or nothing does).
fn eviction_text(
    reason: &EvictionReason,
    pod: &tessera_core::model::Pod,
    by_uid: &BTreeMap<&str, &tessera_core::model::Pod>,
    gang_grace_seconds: u64,
) -> (&'static str, String) {
    let next = match &pod.controller {
        Some(c) => format!("{c} recreates it"),
        None => "nothing recreates it (the pod has no controller)".to_owned(),
    };
    match reason {
        EvictionReason::Reclaim { by_queue } => (
            "reclaim",
            format!("reclaimed by queue {by_queue}, which is below its fair share; {next}"),
        ),
        EvictionReason::Preempt { by_pod } => {
            let by = by_uid
                .get(by_pod.as_str())
                .map_or_else(|| by_pod.clone(), |p| format!("{}/{}", p.namespace, p.name));
            (
                "preemption",
                format!(
                    "preempted by pod {by}, which has a higher priority in the same queue; {next}"
                ),
            )
        }
        // The core moves only pods with a controller; a copy it recreates may land elsewhere.
        EvictionReason::Consolidate { moved_to } => (
            "consolidation",
            format!(
                "consolidation: evicted to free whole GPUs for a waiting gang; {next} (a new copy fits on node {moved_to})"
            ),
        ),
        EvictionReason::GangBelowMinMember => (
            "stale-gang",
            format!(
                "stale gang: group {} ran fewer than minMember pods for longer than {} s; {next}",
                pod.group.as_deref().unwrap_or("?"),
                gang_grace_seconds
            ),
        ),
    }
}
