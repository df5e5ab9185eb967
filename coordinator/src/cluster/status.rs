//! What users see: pending pods' `PodScheduled=False` condition with the core's explanation
//! (reason `Unschedulable`, or `SchedulingGated` for a pod whose scheduling gates hold it, as
//! kube-scheduler writes them), Events for bad input, PodGroup / Queue / Topology status, and
//! the Workload API's PodGroups' `PodGroupInitiallyScheduled` condition as kube-scheduler
//! writes it.
//!
//! Every write happens only when its content changed: the object's current status is compared
//! first (so a new leader does not rewrite what the old one wrote), then what this replica
//! wrote last (so a write whose watch echo has not arrived is not repeated).
//!
//! The writer runs beside the scheduling loop, not in it (`cluster::status_queue`), so what it
//! writes about a pod may be a cycle old. A pod status patch therefore carries the
//! `resourceVersion` the cycle saw as its precondition: a pod bound (or otherwise changed)
//! since is refused with 409 and left alone, never marked `PodScheduled=False` after its
//! Binding set it `True`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::scheduling::v1beta1::PodGroup as WorkloadPodGroup;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::agent_gap::{self, AgentGap, Overdue};
use super::cache::Store;
use super::events::{self, EventKind, EventWriter};
use super::occupancy;
use crate::crd::validate::{self, Problem};
use crate::crd::{
    Condition, GpuModelAmounts, PodGroup, PodGroupStatus, Queue, QueueStatus, QueueUsage,
    ResourceAmounts, Topology, TopologyStatus,
};
use crate::translate::{self, Translated};
use tessera_core::cycle::{Decisions, NodeReason, Reason};

/// How many fenced GPUs (or nodes) of one kind a pending pod's message names.
const FENCE_NOTES_SHOWN: usize = 3;

/// `PodScheduled` condition reason for a pod that cannot be placed.
pub const UNSCHEDULABLE: &str = "Unschedulable";
/// `PodScheduled` condition reason for a pod held by its scheduling gates (no
/// FailedScheduling event: it was not tried).
pub const SCHEDULING_GATED: &str = "SchedulingGated";
/// PodGroup condition type telling whether the gang is bound.
pub const SCHEDULED_CONDITION: &str = "Scheduled";
/// The condition kube-scheduler writes on a `scheduling.k8s.io` PodGroup: `True` (reason
/// `Scheduled`) once the group's pods are placed, and never back to `False` after.
pub const INITIALLY_SCHEDULED_CONDITION: &str = "PodGroupInitiallyScheduled";

/// Writes conditions, status and input events.
pub struct StatusWriter {
    client: kube::Client,
    events: EventWriter,
    /// Pod uid → the PodScheduled reason and message last written.
    pod_messages: HashMap<String, (&'static str, String)>,
    /// Pod uid → the warnings last reported as an event.
    pod_warnings: HashMap<String, String>,
    /// Status last written per custom object (`kind/namespace/name`), as JSON.
    written: HashMap<String, serde_json::Value>,
    /// Pod uid → the `status.nominatedNodeName` last written (`None`: cleared).
    nominated: HashMap<String, Option<String>>,
    /// At most this long between writes of a queue's usage history alone (see
    /// [`usage_due`]).
    usage_interval: std::time::Duration,
}

impl StatusWriter {
    /// A writer through `client`.
    pub fn new(client: kube::Client, events: EventWriter) -> Self {
        Self {
            client,
            events,
            pod_messages: HashMap::new(),
            pod_warnings: HashMap::new(),
            written: HashMap::new(),
            nominated: HashMap::new(),
            usage_interval: std::time::Duration::from_secs(60),
        }
    }

    /// Writes a queue's usage history alone at most every `interval` (sooner when it moved by
    /// more than a tenth, but never more often than a tenth of `interval`).
    pub fn with_usage_interval(mut self, interval: std::time::Duration) -> Self {
        self.usage_interval = interval;
        self
    }

    /// Forgets what was written (leadership changed: the API's state is the truth again).
    pub fn forget(&mut self) {
        self.pod_messages.clear();
        self.pod_warnings.clear();
        self.written.clear();
        self.nominated.clear();
    }

    /// Makes `status.nominatedNodeName` say where each pod of `waiting` (uid → node) will be
    /// bound once the pods evicted for it are gone, as kube-scheduler does for a preemptor,
    /// and clears it on this scheduler's other pending pods (a decision given up, or one an
    /// earlier leader nominated). Bound pods, and pods in `keep` (decided, about to be bound
    /// or bound since the store was read), are left alone.
    pub async fn nominations(
        &mut self,
        store: &Store,
        scheduler_name: &str,
        waiting: &BTreeMap<String, String>,
        keep: &BTreeSet<String>,
    ) {
        self.nominated.retain(|uid, _| store.pods.contains_key(uid));
        for (uid, pod) in &store.pods {
            let spec = pod.spec.as_ref();
            let ours = spec.and_then(|s| s.scheduler_name.as_deref()) == Some(scheduler_name);
            let bound = spec
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty());
            if !ours || bound || (keep.contains(uid) && !waiting.contains_key(uid)) {
                continue;
            }
            let want = waiting.get(uid).cloned();
            let current = pod
                .status
                .as_ref()
                .and_then(|s| s.nominated_node_name.clone())
                .filter(|n| !n.is_empty());
            if current == want || self.nominated.get(uid) == Some(&want) {
                continue;
            }
            let patch = json!({"status": {"nominatedNodeName": want}});
            match self.patch_pod_status(pod, &Patch::Merge(patch)).await {
                Ok(_) => {
                    self.nominated.insert(uid.clone(), want);
                }
                Err(error) if is_conflict(&error) => {
                    tracing::debug!(pod = %pod.name_any(), "the pod changed since this cycle read it; its nomination is looked at again")
                }
                Err(error) => {
                    tracing::warn!(pod = %pod.name_any(), %error, "could not write the pod's nominatedNodeName")
                }
            }
        }
    }

    /// Writes everything that changed after one cycle. `bound` holds the pods bound (or held
    /// for binding) by this cycle, which count as scheduled in PodGroup status; `overdue` the
    /// nodes whose missing agent messages may name (their grace period is over).
    pub async fn update(
        &mut self,
        store: &Store,
        translated: &Translated,
        decisions: &Decisions,
        bound: &BTreeSet<String>,
        overdue: &Overdue,
    ) {
        self.pod_messages
            .retain(|uid, _| store.pods.contains_key(uid));
        self.pod_warnings
            .retain(|uid, _| store.pods.contains_key(uid));
        let gap = AgentGap::of(store, &translated.snapshot.nodes, overdue);
        // Only a cycle with a gap to explain pays for the set of GPU pods.
        let asks_gpus: BTreeSet<&str> = if gap == AgentGap::None {
            BTreeSet::new()
        } else {
            translated
                .snapshot
                .pods
                .iter()
                .filter(|p| p.gpu.count > 0)
                .map(|p| p.uid.as_str())
                .collect()
        };
        for p in &decisions.pending {
            if bound.contains(&p.pod) {
                continue;
            }
            if let Some(pod) = store.pods.get(&p.pod) {
                // The core cannot see agents that report nothing: a GPU pod's message says so.
                let mut message = if asks_gpus.contains(p.pod.as_str()) {
                    gap.explain(&p.message)
                } else {
                    p.message.clone()
                };
                // Fenced GPUs are named: the node and what it waits for.
                let fenced = p.reasons.iter().filter_map(|(r, _)| match r {
                    Reason::Node(NodeReason::GpusFenced(f)) => Some(*f),
                    _ => None,
                });
                let notes = occupancy::notes_for(&translated.gpu_fences, fenced, FENCE_NOTES_SHOWN);
                if !notes.is_empty() {
                    message = agent_gap::then(&message, &notes.join("; "));
                }
                let gated = p
                    .reasons
                    .iter()
                    .any(|(r, _)| matches!(r, Reason::SchedulingGated { .. }));
                let reason = if gated {
                    SCHEDULING_GATED
                } else {
                    UNSCHEDULABLE
                };
                self.pod_unschedulable(pod, reason, &message).await;
            }
        }
        for (uid, warnings) in &translated.pod_warnings {
            let Some(pod) = store.pods.get(uid) else {
                continue;
            };
            let text: Vec<String> = warnings
                .iter()
                .map(|w| format!("{}: {}", w.field, w.message))
                .collect();
            let text = text.join("; ");
            if self.pod_warnings.get(uid) != Some(&text) {
                self.events
                    .publish(
                        &pod_object(pod),
                        EventKind::Warning,
                        "InvalidAnnotation",
                        &text,
                    )
                    .await;
                self.pod_warnings.insert(uid.clone(), text);
            }
        }
        let now = jiff::Timestamp::now().to_string();
        self.pod_groups(store, translated, decisions, bound, &now)
            .await;
        self.workload_pod_groups(store, translated, decisions, bound, &now)
            .await;
        self.queues(store, translated, decisions, &now).await;
        self.topologies(store, translated, &now).await;
    }

    /// Patches the pod's status on condition that the pod is still the version `pod` is (see
    /// the module doc); a 409 means it changed since and the next cycle looks again.
    async fn patch_pod_status(
        &self,
        pod: &Pod,
        patch: &Patch<serde_json::Value>,
    ) -> kube::Result<Pod> {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch = match (patch, &pod.metadata.resource_version) {
            (Patch::Merge(body), Some(rv)) => Patch::Merge(with_resource_version(body, rv)),
            (Patch::Strategic(body), Some(rv)) => Patch::Strategic(with_resource_version(body, rv)),
            (other, _) => other.clone(),
        };
        api.patch_status(&pod.name_any(), &PatchParams::default(), &patch)
            .await
    }

    /// Writes `PodScheduled=False` with `reason` and `message` (and, unless gated, the
    /// FailedScheduling event) when either changed.
    async fn pod_unschedulable(&mut self, pod: &Pod, reason: &'static str, message: &str) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let current = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
        let already = current.is_some_and(|c| {
            c.status == "False"
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message)
        });
        let written = self
            .pod_messages
            .get(&uid)
            .is_some_and(|(r, m)| *r == reason && m == message);
        if already || written {
            self.pod_messages.insert(uid, (reason, message.to_owned()));
            return;
        }
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": jiff::Timestamp::now().to_string(),
        }]}});
        match self.patch_pod_status(pod, &Patch::Strategic(patch)).await {
            Ok(_) => {
                if reason != SCHEDULING_GATED {
                    self.events
                        .publish(
                            &pod_object(pod),
                            EventKind::Warning,
                            events::FAILED_SCHEDULING,
                            message,
                        )
                        .await;
                }
                self.pod_messages.insert(uid, (reason, message.to_owned()));
            }
            Err(error) if is_conflict(&error) => {
                tracing::debug!(pod = %pod.name_any(), "the pod changed since this cycle read it; its condition is looked at again");
            }
            Err(error) => {
                tracing::warn!(pod = %pod.name_any(), %error, reason, "could not write the pod's PodScheduled condition")
            }
        }
    }

    async fn pod_groups(
        &mut self,
        store: &Store,
        translated: &Translated,
        decisions: &Decisions,
        bound: &BTreeSet<String>,
        now: &str,
    ) {
        let pending: BTreeMap<&str, &str> = decisions
            .pending
            .iter()
            .map(|p| (p.pod.as_str(), p.message.as_str()))
            .collect();
        for g in store.pod_groups.values() {
            let ns = g.namespace().unwrap_or_default();
            let name = g.name_any();
            let problems = translated
                .group_problems
                .get(&(ns.clone(), name.clone()))
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let members: Vec<_> = translated
                .snapshot
                .pods
                .iter()
                .filter(|p| p.namespace == ns && p.group.as_deref() == Some(name.as_str()))
                .collect();
            let scheduled = members
                .iter()
                .filter(|p| p.placement.is_some() || bound.contains(&p.uid))
                .count() as i32;
            let running = members
                .iter()
                .filter(|p| {
                    store
                        .pods
                        .get(&p.uid)
                        .and_then(|k| k.status.as_ref())
                        .and_then(|s| s.phase.as_deref())
                        == Some("Running")
                })
                .count() as i32;
            let min = g.spec.min_member.max(1);
            let why = members
                .iter()
                .find_map(|p| pending.get(p.uid.as_str()).copied());
            let phase = if !problems.is_empty() {
                "Invalid"
            } else if running >= min {
                "Running"
            } else if scheduled >= min {
                "Scheduled"
            } else if why.is_some() {
                "Unschedulable"
            } else {
                "Pending"
            };
            let old = g.status.clone().unwrap_or_default();
            let valid = validate::condition(problems, g.metadata.generation, now);
            let sched = if scheduled >= min {
                Condition {
                    type_: SCHEDULED_CONDITION.to_owned(),
                    status: "True".to_owned(),
                    reason: "Scheduled".to_owned(),
                    message: format!("{scheduled} pods bound (minMember {min})"),
                    last_transition_time: Some(now.to_owned()),
                    observed_generation: g.metadata.generation,
                }
            } else {
                Condition {
                    type_: SCHEDULED_CONDITION.to_owned(),
                    status: "False".to_owned(),
                    reason: UNSCHEDULABLE.to_owned(),
                    message: why.map_or_else(
                        || format!("{} of minMember {min} pods exist", members.len()),
                        str::to_owned,
                    ),
                    last_transition_time: Some(now.to_owned()),
                    observed_generation: g.metadata.generation,
                }
            };
            let desired = PodGroupStatus {
                phase: Some(phase.to_owned()),
                scheduled,
                running,
                conditions: keep_times(&old.conditions, vec![valid, sched]),
            };
            if desired != old {
                let api: Api<PodGroup> = Api::namespaced(self.client.clone(), &ns);
                self.write_status(api, g.as_ref(), &desired).await;
            }
        }
    }

    /// The `PodGroupInitiallyScheduled` condition of each `scheduling.k8s.io` PodGroup with
    /// pods of this scheduler, as kube-scheduler writes it after a scheduling attempt of the
    /// group: `True`/`Scheduled` once at least its `minCount` pods (1 for a `basic` policy)
    /// are placed, `False`/`Unschedulable` with the reason while they cannot be; nothing while
    /// fewer than `minCount` pods exist (kube-scheduler does not try such a group), and never
    /// `False` again once `True`. Patched as a strategic merge of that one condition, so other
    /// writers' conditions stay.
    async fn workload_pod_groups(
        &mut self,
        store: &Store,
        translated: &Translated,
        decisions: &Decisions,
        bound: &BTreeSet<String>,
        now: &str,
    ) {
        if store.workload_pod_groups.is_empty() {
            return;
        }
        let pending: BTreeMap<&str, &str> = decisions
            .pending
            .iter()
            .map(|p| (p.pod.as_str(), p.message.as_str()))
            .collect();
        // (namespace, PodGroup name) → (members, members placed), this scheduler's pods only.
        let mut groups: BTreeMap<(&str, &str), (Vec<&str>, i32)> = BTreeMap::new();
        for p in &translated.snapshot.pods {
            if p.owned_by_other_scheduler {
                continue;
            }
            let Some(name) = store
                .pods
                .get(&p.uid)
                .and_then(|k| k.spec.as_ref())
                .and_then(|s| s.scheduling_group.as_ref())
                .and_then(|g| g.pod_group_name.as_deref())
            else {
                continue;
            };
            let entry = groups.entry((p.namespace.as_str(), name)).or_default();
            entry.0.push(p.uid.as_str());
            if p.placement.is_some() || bound.contains(&p.uid) {
                entry.1 += 1;
            }
        }
        for ((ns, name), (members, scheduled)) in groups {
            let Some(group) = store.workload_pod_groups.get(&format!("{ns}/{name}")) else {
                continue;
            };
            let min = group
                .spec
                .scheduling_policy
                .gang
                .as_ref()
                .map_or(1, |g| g.min_count.max(1));
            let old = group
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == INITIALLY_SCHEDULED_CONDITION));
            if old.is_some_and(|c| c.status == "True") {
                continue;
            }
            let (status, reason, message) = if scheduled >= min {
                (
                    "True",
                    "Scheduled",
                    format!("{scheduled} pods placed (minCount {min})"),
                )
            } else if members.len() as i32 >= min
                && let Some(why) = members.iter().find_map(|uid| pending.get(uid).copied())
            {
                ("False", UNSCHEDULABLE, why.to_owned())
            } else {
                continue;
            };
            let generation = group.metadata.generation;
            if old.is_some_and(|c| {
                c.status == status
                    && c.reason == reason
                    && c.message == message
                    && c.observed_generation == generation
            }) {
                continue;
            }
            let transition = old
                .filter(|c| c.status == status)
                .map_or_else(|| now.to_owned(), |c| c.last_transition_time.0.to_string());
            let status = json!({"conditions": [{
                "type": INITIALLY_SCHEDULED_CONDITION,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": transition,
                "observedGeneration": generation,
            }]});
            let api: Api<WorkloadPodGroup> = Api::namespaced(self.client.clone(), ns);
            self.write_status_patch(api, group.as_ref(), status, true)
                .await;
        }
    }

    async fn queues(
        &mut self,
        store: &Store,
        translated: &Translated,
        decisions: &Decisions,
        now: &str,
    ) {
        for q in store.queues.values() {
            let name = q.name_any();
            let problems = translated
                .queue_problems
                .get(&name)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let old = q.status.clone().unwrap_or_default();
            let share = decisions.fair_shares.iter().find(|s| s.queue == name);
            let amounts = |v: &[f64; 3]| {
                ResourceAmounts::from_units(
                    v[0],
                    v[1].max(0.0).round() as u64,
                    v[2].max(0.0).round() as u64,
                )
            };
            let gpus = |milli: f64| milli.round() / 1000.0;
            let mut desired = QueueStatus {
                allocated: share.map(|s| amounts(&s.allocated)),
                requested: share.map(|s| amounts(&s.requested)),
                fair_share: share.map(|s| amounts(&s.fair_share)),
                gpu_models: share
                    .map(|s| {
                        s.models
                            .iter()
                            .map(|m| GpuModelAmounts {
                                model: m.model.clone(),
                                allocated: gpus(m.allocated),
                                requested: gpus(m.requested),
                                fair_share: gpus(m.fair_share),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                // Kept as it is unless due (below): usage moves every cycle.
                usage: old.usage.clone(),
                conditions: keep_times(
                    &old.conditions,
                    vec![validate::condition(problems, q.metadata.generation, now)],
                ),
            };
            if let Some(u) = decisions.usage.iter().find(|u| u.queue == name) {
                let fresh = translate::queue::usage_status(u);
                if desired != old || usage_due(old.usage.as_ref(), &fresh, self.usage_interval) {
                    desired.usage = Some(fresh);
                }
            }
            if desired != old {
                let api: Api<Queue> = Api::all(self.client.clone());
                self.write_status(api, q.as_ref(), &desired).await;
            }
        }
    }

    async fn topologies(&mut self, store: &Store, translated: &Translated, now: &str) {
        for t in store.topologies.values() {
            let name = t.name_any();
            let problems = translated
                .topology_problems
                .get(&name)
                .map(Vec::as_slice)
                .unwrap_or(&[] as &[Problem]);
            let old = t.status.clone().unwrap_or_default();
            let desired = TopologyStatus {
                conditions: keep_times(
                    &old.conditions,
                    vec![validate::condition(problems, t.metadata.generation, now)],
                ),
            };
            if desired != old {
                let api: Api<Topology> = Api::all(self.client.clone());
                self.write_status(api, t.as_ref(), &desired).await;
            }
        }
    }

    /// Merge-patches `status` of a custom object, unless this replica wrote the same status
    /// to the same resourceVersion of it already (its watch echo is still on the way).
    async fn write_status<K, S>(&mut self, api: Api<K>, object: &K, status: &S)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
        S: Serialize,
    {
        let status = json!(status);
        self.write_status_patch(api, object, status, false).await;
    }

    /// Patches `status` of an object (a strategic merge when `strategic`, for built-in kinds
    /// whose lists merge by key; a JSON merge otherwise), unless this replica wrote the same
    /// status to the same resourceVersion of it already.
    async fn write_status_patch<K>(
        &mut self,
        api: Api<K>,
        object: &K,
        status: serde_json::Value,
        strategic: bool,
    ) where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let name = object.name_any();
        let key = format!(
            "{}/{}/{}/{}",
            K::group(&()),
            K::kind(&()),
            object.namespace().unwrap_or_default(),
            name
        );
        let value = json!({
            "rv": object.resource_version(),
            "status": status,
        });
        if self.written.get(&key) == Some(&value) {
            return;
        }
        let body = json!({ "status": status });
        let patch = if strategic {
            Patch::Strategic(&body)
        } else {
            Patch::Merge(&body)
        };
        match api
            .patch_status(&name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {
                self.written.insert(key, value);
            }
            Err(error) => tracing::warn!(object = %key, %error, "could not write status"),
        }
    }
}

/// Whether a queue's usage history `fresh` is due to be written over `written` (what its
/// status holds): when there is none, when `interval` has passed since it was written, or when
/// a tenth of `interval` has and some amount moved by more than a tenth (and more than one
/// unit-second). Bounds the writes to at most ten per queue per interval, however often
/// cycles run, while a new leader loses at most `interval` of history.
pub fn usage_due(
    written: Option<&QueueUsage>,
    fresh: &QueueUsage,
    interval: std::time::Duration,
) -> bool {
    let Some(old) = written else {
        return true;
    };
    let time = |t: &str| t.parse::<jiff::Timestamp>().ok().map(|t| t.as_second());
    let (Some(then), Some(now)) = (time(&old.updated_at), time(&fresh.updated_at)) else {
        return true;
    };
    let elapsed = now.saturating_sub(then).max(0) as u64;
    let interval = interval.as_secs().max(1);
    if elapsed >= interval {
        return true;
    }
    let moved = |a: f64, b: f64| (a - b).abs() > 1.0 && (a - b).abs() > 0.1 * a.abs().max(b.abs());
    elapsed * 10 >= interval
        && (moved(old.gpu_seconds, fresh.gpu_seconds)
            || moved(old.cpu_seconds, fresh.cpu_seconds)
            || moved(old.memory_gib_seconds, fresh.memory_gib_seconds))
}

/// Keeps each condition's old transition time when its status did not change.
fn keep_times(old: &[Condition], mut new: Vec<Condition>) -> Vec<Condition> {
    for c in &mut new {
        if let Some(o) = old
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
        {
            c.last_transition_time.clone_from(&o.last_transition_time);
        }
    }
    new
}

fn pod_object(pod: &Pod) -> ObjectReference {
    events::pod_ref(
        &pod.namespace().unwrap_or_default(),
        &pod.name_any(),
        pod.metadata.uid.as_deref().unwrap_or(""),
    )
}

/// `body` with `metadata.resourceVersion: rv`, the server's precondition for a patch.
fn with_resource_version(body: &serde_json::Value, rv: &str) -> serde_json::Value {
    let mut body = body.clone();
    if let Some(fields) = body.as_object_mut() {
        fields.insert("metadata".into(), json!({ "resourceVersion": rv }));
    }
    body
}

/// A 409: the object changed since the store showed it.
fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 409)
}
