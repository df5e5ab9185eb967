//! What the cache says about a held decision: are its victims gone, has it waited too long,
//! which bound pods its node has not allocated yet (the same-count rule), and which pods an
//! earlier leader nominated to a node still clearing. Reads of the store only; the time is
//! always the caller's [`Now`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod as KubePod;

use super::super::cache::Store;
use super::{Decided, DecidedState, Now};
use tessera_contract::keys::{
    ALLOCATED as ALLOCATED_ANNOTATION, ASSIGNMENT as ASSIGNMENT_ANNOTATION,
};
pub(super) use tessera_contract::pod::is_finished;
use tessera_core::model::Assignment;

/// How long past its victims' `deletionTimestamp` a decision keeps waiting for them. The API
/// server sets that time to the deletion request plus the grace period; the kubelet then still
/// has to report the containers stopped and delete the pod.
pub(super) const VICTIM_MARGIN: Duration = Duration::from_secs(30);

pub(super) fn node_of(pod: &KubePod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn margin() -> jiff::SignedDuration {
    jiff::SignedDuration::try_from(VICTIM_MARGIN).unwrap_or_default()
}

/// Whether every pod evicted for a decision is gone from the API or finished (its containers
/// stopped): until then it keeps its GPUs, through its whole grace period.
pub(super) fn victims_gone(store: &Store, victims: &BTreeSet<String>) -> bool {
    victims
        .iter()
        .all(|v| store.pods.get(v).is_none_or(|p| is_finished(p)))
}

/// This scheduler's pending pods without a decision of this replica whose
/// `status.nominatedNodeName` (written by an earlier leader) names a node where evicted pods
/// are still terminating within their grace period plus [`VICTIM_MARGIN`].
pub(super) fn nominated_to_terminating(
    store: &Store,
    decided: &BTreeMap<String, Decided>,
    scheduler_name: &str,
    now: Now,
) -> BTreeSet<String> {
    let terminating: BTreeSet<&str> = store
        .pods
        .values()
        .filter(|p| !is_finished(p))
        .filter(|p| {
            p.metadata
                .deletion_timestamp
                .as_ref()
                .is_some_and(|t| now.wall.duration_since(t.0) <= margin())
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
pub(super) fn held_too_long(
    store: &Store,
    victims: &BTreeSet<String>,
    since: std::time::Instant,
    now: Now,
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
            let past = now.wall.duration_since(end);
            (past > margin()).then(|| {
                format!(
                    "the pods evicted for it were still there {} s after their grace period ended",
                    past.as_secs()
                )
            })
        }
        _ => (now.instant.duration_since(since) > timeout)
            .then(|| format!("its node was not clear within {} s", timeout.as_secs())),
    }
}

/// The `nvidia.com/gpu` slot counts the kubelet's Allocate calls for `pod` will ask for, one
/// per GPU container (init containers included): the agent tells requests apart only by
/// their size, so two unallocated pods on a node with a size in common can be confused.
pub(super) fn gpu_sizes(pod: &KubePod) -> BTreeSet<u32> {
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
pub(super) type Unallocated = (String, BTreeSet<u32>, Option<Assignment>);

/// Per node: the GPU pods bound there (or bound by this replica and not yet seen) that the
/// kubelet has not allocated yet, with their slot count and assignment. Allocated means:
/// some container started, or the node's agent lists the pod in `allocated` (revision 2),
/// or a revision-1 agent wrote `tessera.dev/allocated` on it.
pub(super) fn unallocated_gpu_pods(
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
            out.entry(d.target.node.clone()).or_default().push((
                uid.clone(),
                count,
                Some(d.target.assignment.clone()),
            ));
        }
    }
    out
}
