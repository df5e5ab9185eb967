//! Table tests of the planner: holds, victims gone, and a gang rollback for each way a unit
//! fails. Pods are a few hand-built objects; time is a fixed [`Now`] moved by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, Pod as KubePod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::hold::{held_too_long, victims_gone};
use super::*;
use tessera_core::cycle::{Binding, Eviction as CoreEviction};
use tessera_core::model::Pod;

const TIMEOUT: Duration = Duration::from_secs(2);
const NODE: &str = "n1";

fn t0() -> Now {
    Now {
        instant: Instant::now(),
        wall: jiff::Timestamp::from_second(1_700_000_000).unwrap_or_default(),
    }
}

fn later(now: Now, secs: u64) -> Now {
    Now {
        instant: now.instant + Duration::from_secs(secs),
        wall: now.wall + jiff::SignedDuration::from_secs(secs as i64),
    }
}

/// A pod in the API: `gpus` whole-GPU slots in one container, bound to `node` when given.
fn kpod(uid: &str, gpus: u32, node: Option<&str>) -> Arc<KubePod> {
    let mut limits = BTreeMap::new();
    if gpus > 0 {
        limits.insert("nvidia.com/gpu".to_owned(), Quantity(gpus.to_string()));
    }
    let mut pod = KubePod::default();
    pod.metadata.uid = Some(uid.into());
    pod.metadata.name = Some(uid.into());
    pod.metadata.namespace = Some("ns".into());
    pod.spec = Some(PodSpec {
        node_name: node.map(str::to_owned),
        containers: vec![Container {
            name: "main".into(),
            resources: Some(ResourceRequirements {
                limits: Some(limits),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }],
        ..PodSpec::default()
    });
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        ..PodStatus::default()
    });
    Arc::new(pod)
}

/// A victim whose deletion, if any, ends `ends_in_secs` after `now`.
fn victim(uid: &str, now: Now, ends_in_secs: Option<i64>, phase: &str) -> Arc<KubePod> {
    let mut pod = (*kpod(uid, 0, Some(NODE))).clone();
    pod.metadata.deletion_timestamp =
        ends_in_secs.map(|s| Time(now.wall + jiff::SignedDuration::from_secs(s)));
    pod.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..PodStatus::default()
    });
    Arc::new(pod)
}

fn store(pods: Vec<Arc<KubePod>>) -> Store {
    Store {
        pods: pods
            .into_iter()
            .map(|p| (p.metadata.uid.clone().unwrap_or_default(), p))
            .collect(),
        ..Store::default()
    }
}

fn set(uids: &[&str]) -> BTreeSet<String> {
    uids.iter().map(|u| (*u).to_owned()).collect()
}

/// The core's view of the members of gang `g` (a lone pod when `group` is `None`).
fn snap(uids: &[&str], group: Option<&str>) -> Snapshot {
    Snapshot {
        pods: uids
            .iter()
            .map(|u| Pod {
                namespace: "ns".into(),
                name: (*u).into(),
                group: group.map(str::to_owned),
                ..Pod::new(u, "q")
            })
            .collect(),
        ..Snapshot::default()
    }
}

fn bindings(uids: &[&str], after_evictions: bool) -> Decisions {
    Decisions {
        bindings: uids
            .iter()
            .map(|u| Binding {
                pod: (*u).into(),
                node: NODE.into(),
                assignment: Default::default(),
                after_evictions,
            })
            .collect(),
        ..Decisions::default()
    }
}

fn none_allocated() -> BTreeMap<String, BTreeSet<String>> {
    BTreeMap::new()
}

/// The uids of each bind wave in `writes`.
fn waves(writes: &[Write]) -> Vec<Vec<String>> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::Bind { wave, .. } => Some(wave.iter().map(|t| t.uid.clone()).collect()),
            _ => None,
        })
        .collect()
}

/// The uids of each rollback in `writes`.
fn rollbacks(writes: &[Write]) -> Vec<Vec<String>> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::RollBack { members, .. } => {
                Some(members.iter().map(|r| r.member.uid.clone()).collect())
            }
            _ => None,
        })
        .collect()
}

fn refused(uid: &str, code: u16) -> BindFailure {
    BindFailure {
        uid: uid.into(),
        error: format!("binding to {NODE} refused ({code})"),
        maybe_bound: false,
        deposed: false,
    }
}

/// A gang `ns/g` of `a`, `b`, `c` decided and planned as one wave.
fn gang(now: Now) -> (Planner, Store, Vec<BindTarget>) {
    let uids = ["a", "b", "c"];
    let s = store(uids.iter().map(|u| kpod(u, 0, None)).collect());
    let mut p = Planner::new(TIMEOUT);
    let writes = p.decide(
        &s,
        &snap(&uids, Some("g")),
        &bindings(&uids, false),
        &none_allocated(),
        now,
    );
    let Some(Write::Bind { unit, wave }) = writes.into_iter().next() else {
        panic!("one wave expected");
    };
    assert_eq!(unit, "ns/g");
    (p, s, wave)
}

#[test]
fn a_successful_unit_is_one_write_per_pod() {
    let now = t0();
    let (mut p, s, wave) = gang(now);
    let uids: Vec<&str> = wave.iter().map(|t| t.uid.as_str()).collect();
    assert_eq!(uids, ["a", "b", "c"]);
    assert!(wave.iter().all(|t| t.node == NODE));
    let outcome = UnitOutcome {
        bound: vec!["a".into(), "b".into(), "c".into()],
        failed: None,
    };
    assert!(p.after_bind("ns/g", &wave, &outcome, now).is_empty());
    // Bound and not yet in the cache: assumed, never bound again.
    assert_eq!(p.overlay(&s).assumed.len(), 3);
    assert!(p.begin(&s, later(now, 1)).is_empty());
    assert!(
        p.release_held(&s, &none_allocated(), later(now, 1))
            .is_empty()
    );
    // The cache shows them bound: forgotten.
    let bound = store(["a", "b", "c"].map(|u| kpod(u, 0, Some(NODE))).to_vec());
    assert!(p.begin(&bound, later(now, 2)).is_empty());
    assert!(p.decided().is_empty());
}

/// Every way a wave can fail, and what the planner must answer: the members bound roll back
/// now, an unanswered Binding is watched, nothing is written for a deposed replica.
#[test]
fn a_gang_rolls_back_through_one_path_for_each_failure() {
    struct Case {
        name: &'static str,
        bound: &'static [&'static str],
        failure: BindFailure,
        rolled_back_now: &'static [&'static str],
        watched: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "first member refused",
            bound: &[],
            failure: refused("a", 409),
            rolled_back_now: &[],
            watched: None,
        },
        Case {
            name: "middle member refused (conflict)",
            bound: &["a"],
            failure: refused("b", 409),
            rolled_back_now: &["a"],
            watched: None,
        },
        Case {
            name: "last member throttled (429)",
            bound: &["a", "b"],
            failure: refused("c", 429),
            rolled_back_now: &["a", "b"],
            watched: None,
        },
        Case {
            name: "middle member unanswered (maybe bound)",
            bound: &["a"],
            failure: BindFailure {
                maybe_bound: true,
                ..refused("b", 0)
            },
            rolled_back_now: &["a"],
            watched: Some("b"),
        },
        Case {
            name: "deposed",
            bound: &["a"],
            failure: BindFailure {
                deposed: true,
                ..refused("b", 0)
            },
            rolled_back_now: &[],
            watched: None,
        },
    ];
    for case in cases {
        let now = t0();
        let (mut p, s, wave) = gang(now);
        let outcome = UnitOutcome {
            bound: case.bound.iter().map(|u| (*u).to_owned()).collect(),
            failed: Some(case.failure.clone()),
        };
        let writes = p.after_bind("ns/g", &wave, &outcome, now);
        let expected: Vec<Vec<String>> = if case.rolled_back_now.is_empty() {
            Vec::new()
        } else {
            vec![
                case.rolled_back_now
                    .iter()
                    .map(|u| (*u).to_owned())
                    .collect(),
            ]
        };
        assert_eq!(rollbacks(&writes), expected, "{}", case.name);
        if let Some(Write::RollBack { reason, .. }) = writes.first() {
            assert!(
                reason.contains("gang ns/g could not be bound whole"),
                "{}",
                case.name
            );
        }
        // The unit is given up: no member is decided or bound again right away.
        assert!(p.decided().is_empty(), "{}", case.name);
        let again = p.decide(
            &s,
            &snap(&["a", "b", "c"], Some("g")),
            &bindings(&["a", "b", "c"], false),
            &none_allocated(),
            now,
        );
        assert!(waves(&again).is_empty(), "{}: backed off", case.name);
        // An unanswered Binding that lands later is rolled back then.
        let landed = store(vec![kpod("b", 0, Some(NODE))]);
        let due = p.begin(&landed, later(now, 1));
        match case.watched {
            Some(uid) => assert_eq!(rollbacks(&due), vec![vec![uid.to_owned()]], "{}", case.name),
            None => assert!(due.is_empty(), "{}", case.name),
        }
    }
}

#[test]
fn rolled_back_members_keep_their_gang_unbound_until_gone() {
    let now = t0();
    let (mut p, _, wave) = gang(now);
    let outcome = UnitOutcome {
        bound: vec!["a".into()],
        failed: Some(refused("b", 429)),
    };
    let writes = p.after_bind("ns/g", &wave, &outcome, now);
    let Some(Write::RollBack { members, .. }) = writes.first() else {
        panic!("a rollback expected");
    };
    // The eviction of `a` is throttled: it is tried again while the cache shows it bound.
    let throttled = RollbackOutcome {
        rolled_back: Vec::new(),
        retry: vec!["a".into()],
    };
    p.after_rollback(members, &throttled, now);
    let a_bound = store(vec![
        kpod("a", 0, Some(NODE)),
        kpod("b", 0, None),
        kpod("c", 0, None),
    ]);
    let due = p.begin(&a_bound, later(now, 2));
    assert_eq!(rollbacks(&due), vec![vec!["a".to_owned()]]);
    assert!(p.overlay(&a_bound).evicting.contains("a"));
    let Some(Write::RollBack { members, .. }) = due.first() else {
        panic!("a rollback expected");
    };
    p.after_rollback(
        members,
        &RollbackOutcome {
            rolled_back: vec!["a".into()],
            retry: Vec::new(),
        },
        later(now, 2),
    );
    // `a` terminates: past the backoff, b and c are still not bound.
    let again = |p: &mut Planner, s: &Store, at| {
        p.decide(
            s,
            &snap(&["b", "c"], Some("g")),
            &bindings(&["b", "c"], false),
            &none_allocated(),
            at,
        )
    };
    let at = later(now, 4);
    assert!(p.begin(&a_bound, at).is_empty());
    assert!(waves(&again(&mut p, &a_bound, at)).is_empty());
    // Gone: the gang is decided again from scratch.
    let at = later(now, 5);
    let gone = store(vec![kpod("b", 0, None), kpod("c", 0, None)]);
    assert!(p.begin(&gone, at).is_empty());
    assert_eq!(
        waves(&again(&mut p, &gone, at)),
        vec![vec!["b".to_owned(), "c".to_owned()]]
    );
}

#[test]
fn an_unanswered_binding_that_never_lands_is_dropped_after_the_watch() {
    let now = t0();
    let (mut p, s, wave) = gang(now);
    let outcome = UnitOutcome {
        bound: Vec::new(),
        failed: Some(BindFailure {
            maybe_bound: true,
            ..refused("a", 0)
        }),
    };
    assert!(p.after_bind("ns/g", &wave, &outcome, now).is_empty());
    // Still unbound: not a victim in the snapshot, and watched until ROLLBACK_WATCH.
    assert!(!p.overlay(&s).evicting.contains("a"));
    assert!(p.begin(&s, later(now, 30)).is_empty());
    assert_eq!(p.rollbacks.len(), 1);
    assert!(p.begin(&s, later(now, 61)).is_empty());
    assert!(p.rollbacks.is_empty());
}

#[test]
fn a_member_given_up_while_held_rolls_back_its_bound_members() {
    let now = t0();
    let s = store(vec![kpod("a", 1, None), kpod("b", 1, None)]);
    let mut p = Planner::new(TIMEOUT);
    // `b` asks for the same count as `a` on the same node under another assignment (two
    // different GPUs): it is held until the agent reports `a` allocated.
    let mut decisions = bindings(&["a", "b"], false);
    decisions.bindings[1].assignment.containers = vec![tessera_core::model::ContainerAssignment {
        container: "main".into(),
        gpus: vec![tessera_core::model::GpuSlice {
            uuid: "GPU-b".into(),
            memory_mib: 1,
            compute_milli: 1000,
        }],
    }];
    let writes = p.decide(
        &s,
        &snap(&["a", "b"], Some("g")),
        &decisions,
        &none_allocated(),
        now,
    );
    assert_eq!(waves(&writes), vec![vec!["a".to_owned()]]);
    let Some(Write::Bind { wave, .. }) = writes.first() else {
        panic!("a wave expected");
    };
    let ok = UnitOutcome {
        bound: vec!["a".into()],
        failed: None,
    };
    assert!(p.after_bind("ns/g", wave, &ok, now).is_empty());
    // The core evicts the held member: the unit fails, `a` is rolled back.
    let evict = Decisions {
        evictions: vec![CoreEviction {
            pod: "b".into(),
            reason: EvictionReason::GangBelowMinMember,
        }],
        ..Decisions::default()
    };
    let writes = p.evictions(&snap(&["a", "b"], Some("g")), &evict, 300, now);
    assert_eq!(rollbacks(&writes), vec![vec!["a".to_owned()]]);
    assert!(p.decided().is_empty());
}

/// The same-count rule: a pod waits while its node has an unallocated pod of its request size
/// under another assignment, is bound once the agent reports that pod allocated, and fails
/// its unit when that takes longer than the timeout.
#[test]
fn a_same_count_hold_lasts_until_allocation_or_the_timeout() {
    let now = t0();
    let s = store(vec![kpod("x", 1, Some(NODE)), kpod("p", 1, None)]);
    let one = || bindings(&["p"], false);
    let mut p = Planner::new(TIMEOUT);
    let writes = p.decide(&s, &snap(&["p"], None), &one(), &none_allocated(), now);
    assert!(writes.is_empty(), "held beside unallocated x");
    assert_eq!(p.decided(), set(&["p"]));
    assert!(
        p.release_held(&s, &none_allocated(), later(now, 1))
            .is_empty()
    );
    let allocated = BTreeMap::from([(NODE.to_owned(), set(&["x"]))]);
    assert_eq!(
        waves(&p.release_held(&s, &allocated, later(now, 1))),
        vec![vec!["p".to_owned()]]
    );

    // Never allocated: given up after the timeout, backed off, nothing to roll back.
    let mut p = Planner::new(TIMEOUT);
    assert!(
        p.decide(&s, &snap(&["p"], None), &one(), &none_allocated(), now)
            .is_empty()
    );
    assert!(
        p.release_held(&s, &none_allocated(), later(now, 3))
            .is_empty()
    );
    assert!(p.decided().is_empty());
    assert!(
        p.decide(
            &s,
            &snap(&["p"], None),
            &one(),
            &none_allocated(),
            later(now, 3)
        )
        .is_empty()
    );
    assert!(p.decided().is_empty(), "backed off");
}

/// A pod deleted before its kubelet allocated it still holds its node for a moment: the
/// kubelet may admit it before it hears of the deletion, and its nameless Allocate must not
/// meet the next pod of the same size. (Seen under load: the agent answered a deleted pod's
/// Allocate with the next pod's share.)
#[test]
fn a_pod_deleted_before_allocation_holds_its_node_for_a_moment() {
    let now = t0();
    let before = store(vec![kpod("x", 1, Some(NODE)), kpod("p", 1, None)]);
    let mut p = Planner::new(Duration::from_secs(60));
    let one = || bindings(&["p"], false);
    assert!(
        p.decide(&before, &snap(&["p"], None), &one(), &none_allocated(), now)
            .is_empty(),
        "held beside unallocated x"
    );
    // x is deleted (gone from the API): p still waits, until the hold has passed.
    let after = store(vec![kpod("p", 1, None)]);
    assert!(
        p.release_held(&after, &none_allocated(), later(now, 1))
            .is_empty()
    );
    assert!(
        p.release_held(&after, &none_allocated(), later(now, 4))
            .is_empty()
    );
    assert_eq!(
        waves(&p.release_held(&after, &none_allocated(), later(now, 7))),
        vec![vec!["p".to_owned()]]
    );

    // Allocated, then gone: nothing to wait for.
    let mut p = Planner::new(Duration::from_secs(60));
    assert!(
        p.decide(&before, &snap(&["p"], None), &one(), &none_allocated(), now)
            .is_empty()
    );
    let allocated = BTreeMap::from([(NODE.to_owned(), set(&["x"]))]);
    assert_eq!(
        waves(&p.release_held(&before, &allocated, later(now, 1))),
        vec![vec!["p".to_owned()]]
    );
}

/// A decision after evictions waits for its victims through their grace period (not the
/// timeout), is nominated meanwhile, and is bound once they are gone.
#[test]
fn a_decision_waits_for_its_victims_then_binds() {
    let now = t0();
    let mut p = Planner::new(TIMEOUT);
    let mut view = snap(&["p"], None);
    view.pods.push(Pod {
        namespace: "ns".into(),
        name: "v".into(),
        placement: Some(Placement {
            node: NODE.into(),
            assignment: Default::default(),
        }),
        ..Pod::new("v", "q")
    });
    let mut decisions = bindings(&["p"], true);
    decisions.evictions = vec![CoreEviction {
        pod: "v".into(),
        reason: EvictionReason::Preempt { by_pod: "p".into() },
    }];
    let writes = p.evictions(&view, &decisions, 300, now);
    let [Write::Evict(e)] = writes.as_slice() else {
        panic!("one eviction expected: {writes:?}");
    };
    assert_eq!(e.label, "preemption");
    assert!(e.text.contains("preempted by pod ns/p"));
    // A bare victim is told nothing brings it back.
    assert!(
        e.text
            .ends_with("nothing recreates it (the pod has no controller)"),
        "{}",
        e.text
    );
    p.after_evict(e, true, now);
    let deleting = store(vec![
        kpod("p", 0, None),
        victim("v", now, Some(20), "Running"),
    ]);
    assert!(
        p.decide(&deleting, &view, &decisions, &none_allocated(), now)
            .is_empty()
    );
    assert_eq!(
        p.waiting_for_victims(),
        BTreeMap::from([("p".to_owned(), NODE.to_owned())])
    );
    // Past the timeout, inside the grace period: still waiting.
    assert!(
        p.release_held(&deleting, &none_allocated(), later(now, 10))
            .is_empty()
    );
    assert_eq!(p.decided(), set(&["p"]));
    // Gone: bound.
    let gone = store(vec![kpod("p", 0, None)]);
    assert_eq!(
        waves(&p.release_held(&gone, &none_allocated(), later(now, 11))),
        vec![vec!["p".to_owned()]]
    );
}

#[test]
fn a_wait_for_victims_follows_their_grace_period_not_the_timeout() {
    let now = t0();
    let long_ago = now.instant;
    let now = later(now, 60);
    // Deleting, grace period still running: waits although the timeout has passed.
    let s = store(vec![victim("v", now, Some(20), "Running")]);
    assert_eq!(
        held_too_long(&s, &set(&["v"]), long_ago, now, TIMEOUT),
        None
    );
    // Within the margin after the grace period: still waits.
    let s = store(vec![victim("v", now, Some(-10), "Running")]);
    assert_eq!(
        held_too_long(&s, &set(&["v"]), long_ago, now, TIMEOUT),
        None
    );
    // Past grace period and margin: given up, saying why.
    let s = store(vec![
        victim("v", now, Some(-40), "Running"),
        victim("w", now, Some(5), "Running"),
    ]);
    assert_eq!(
        held_too_long(&s, &set(&["v"]), now.instant, now, TIMEOUT)
            .map(|w| w.contains("grace period")),
        Some(true)
    );
    // The latest victim counts.
    assert_eq!(
        held_too_long(&s, &set(&["v", "w"]), now.instant, now, TIMEOUT),
        None
    );
}

#[test]
fn without_a_deletion_to_follow_the_timeout_applies() {
    let now = t0();
    let long_ago = now.instant;
    let now = later(now, 60);
    // A victim whose deletion the cache does not show yet.
    let s = store(vec![
        victim("v", now, None, "Running"),
        victim("w", now, Some(20), "Running"),
    ]);
    assert!(held_too_long(&s, &set(&["v", "w"]), now.instant, now, TIMEOUT).is_none());
    let why = held_too_long(&s, &set(&["v", "w"]), long_ago, now, TIMEOUT);
    assert!(why.is_some_and(|w| w.contains("within 2 s")));
    // No victims left (the same-count rule), or only finished ones.
    let s = store(vec![victim("done", now, Some(-100), "Failed")]);
    assert!(held_too_long(&s, &set(&["done"]), long_ago, now, TIMEOUT).is_some());
    assert!(held_too_long(&s, &set(&[]), now.instant, now, TIMEOUT).is_none());
    assert!(victims_gone(&s, &set(&["done", "deleted"])));
    assert!(!victims_gone(
        &store(vec![victim("v", now, Some(20), "Running")]),
        &set(&["v"])
    ));
}
