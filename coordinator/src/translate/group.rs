//! Pod groups: explicit PodGroup objects, the `tessera.dev/min-member` shorthand, groups
//! implied by a pod's top controller owner, and the Workload API's `scheduling.k8s.io`
//! PodGroups.
//!
//! Rules (documented for users in `docs/gangs-and-topology.md`):
//! - A pod whose `spec.schedulingGroup.podGroupName` names a `scheduling.k8s.io/v1beta1`
//!   PodGroup belongs to it, as kube-scheduler reads it: a `gang` policy's `minCount` is the
//!   gang size, a `basic` policy leaves each pod to be placed on its own, and a PodGroup that
//!   does not exist (yet) keeps its pods waiting. Its priority is the object's `priority`
//!   (else its `priorityClassName`'s, else the highest member's), its queue the first queue
//!   label among its pods (unlabelled members take it), its topology the node label of
//!   `schedulingConstraints.topology`. A pod that also names a Tessera PodGroup is refused,
//!   naming both. The core knows such a group as `scheduling.k8s.io/<name>`, so it never
//!   meets a Tessera PodGroup of the same name.
//! - A pod named into a group (annotation, or implied by its owner) whose PodGroup object exists
//!   gets that object's settings; the object's `queue` applies to member pods without a queue label.
//! - Without an object, the group is implied: gang size = the largest `tessera.dev/min-member`
//!   among its pods, else the number of its pods that exist and have not finished (so all pods
//!   of a Job, JobSet or PyTorchJob start together); queue = the first pod's; priority = the
//!   highest member's; topology from the first pod carrying the annotations.
//! - A pod with neither is a group of one (no group).

use std::collections::BTreeMap;

use k8s_openapi::api::scheduling::v1beta1::PodGroup as WorkloadPodGroup;

use crate::crd::{PodGroup as PodGroupCrd, Topology};
use tessera_core::model::{InputError, PodGroup};

use super::pod::{GroupSource, TranslatedPod};
use super::topology::resolve;
use tessera_contract::keys;

/// The pod field that names a `scheduling.k8s.io` PodGroup, as input errors name it.
pub const SCHEDULING_GROUP_FIELD: &str = "spec.schedulingGroup.podGroupName";

/// How the core names a group from a `scheduling.k8s.io` PodGroup: a Kubernetes name holds no
/// `/`, so this never equals a Tessera PodGroup's or an owner's group name.
pub const WORKLOAD_GROUP_PREFIX: &str = "scheduling.k8s.io/";

/// The core's name for the `scheduling.k8s.io` PodGroup `name`.
pub fn workload_group_name(name: &str) -> String {
    format!("{WORKLOAD_GROUP_PREFIX}{name}")
}

/// What group derivation needs besides pods and objects.
#[derive(Clone, Copy, Debug)]
pub struct GroupContext<'a> {
    /// The Topology in force (level names → label keys).
    pub topology: Option<&'a Topology>,
    /// PriorityClass name → value.
    pub priority_classes: &'a BTreeMap<String, i32>,
    /// Per (namespace, group name): since when (logical seconds) the group has had fewer than
    /// `minMember` running pods, as the cluster cache tracks it.
    pub below_min_member_since: &'a BTreeMap<(String, String), u64>,
    /// The Workload API's PodGroups (`scheduling.k8s.io/v1beta1`).
    pub workload_groups: &'a [&'a WorkloadPodGroup],
}

/// Builds every group: one per PodGroup object, plus one per implied group name that has pods.
/// Pods without a queue label take their group object's queue (hence `&mut`).
pub fn groups(
    pods: &mut [TranslatedPod],
    objects: &[&PodGroupCrd],
    ctx: &GroupContext<'_>,
) -> Vec<PodGroup> {
    let mut members: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        if let Some(g) = &p.pod.group {
            members
                .entry((p.pod.namespace.clone(), g.clone()))
                .or_default()
                .push(i);
        }
    }
    let mut out: BTreeMap<(String, String), PodGroup> = BTreeMap::new();
    workload_groups(pods, &members, ctx, &mut out);
    for obj in objects {
        let key = (
            obj.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_string()),
            obj.metadata.name.clone().unwrap_or_default(),
        );
        let mine = members.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        let s = &obj.spec;
        let queue = s
            .queue
            .clone()
            .filter(|q| !q.is_empty())
            .or_else(|| {
                mine.iter()
                    .map(|&i| &pods[i])
                    .find(|p| p.queue_labelled)
                    .map(|p| p.pod.queue.clone())
            })
            .unwrap_or_else(|| keys::DEFAULT_QUEUE.to_string());
        for &i in mine {
            if !pods[i].queue_labelled {
                pods[i].pod.queue = queue.clone();
            }
        }
        let priority = s
            .priority_class_name
            .as_ref()
            .and_then(|c| ctx.priority_classes.get(c).copied())
            .unwrap_or_else(|| max_priority(pods, mine));
        let topo = s.topology.clone().unwrap_or_default();
        let min_member = s.min_member.max(1) as u32;
        let group = PodGroup {
            name: key.1.clone(),
            namespace: key.0.clone(),
            queue,
            min_member,
            // A bound below minMember is reported by validation; read it as "exactly minMember".
            max_member: s.max_member.map(|m| (m.max(1) as u32).max(min_member)),
            topology_required: topo.required.as_deref().map(|l| resolve(l, ctx.topology)),
            topology_preferred: topo.preferred.as_deref().map(|l| resolve(l, ctx.topology)),
            priority,
            below_min_member_since: ctx.below_min_member_since.get(&key).copied(),
        };
        out.insert(key, group);
    }
    for (key, mine) in &members {
        // A Workload API group was built above, or its pods are placed one by one.
        if out.contains_key(key) || key.1.starts_with(WORKLOAD_GROUP_PREFIX) {
            continue;
        }
        // A PodGroup named by annotation that does not exist (yet: the cache may see the
        // pods before the object) gives no gang size; guessing one from the pods present
        // would start a gang part way. Such pods wait, and say why.
        let named_only = mine.iter().all(|&i| {
            matches!(pods[i].group_source, Some(GroupSource::Annotation(_)))
                && pods[i].pod.min_member.is_none()
        });
        if named_only {
            for &i in mine {
                pods[i].pod.input_errors.push(InputError {
                    field: keys::POD_GROUP.to_owned(),
                    message: format!(
                        "PodGroup {}/{} does not exist; create it, or give {} for a gang without one",
                        key.0,
                        key.1,
                        keys::MIN_MEMBER
                    ),
                });
            }
        }
        let first = &pods[mine[0]];
        let min_member = mine
            .iter()
            .filter_map(|&i| pods[i].pod.min_member)
            .max()
            .unwrap_or(mine.len() as u32);
        let required = mine.iter().find_map(|&i| pods[i].topology_required.clone());
        let preferred = mine
            .iter()
            .find_map(|&i| pods[i].topology_preferred.clone());
        out.insert(
            key.clone(),
            PodGroup {
                name: key.1.clone(),
                namespace: key.0.clone(),
                queue: first.pod.queue.clone(),
                min_member: min_member.max(1),
                max_member: None,
                topology_required: required.as_deref().map(|l| resolve(l, ctx.topology)),
                topology_preferred: preferred.as_deref().map(|l| resolve(l, ctx.topology)),
                priority: max_priority(pods, mine),
                below_min_member_since: ctx.below_min_member_since.get(key).copied(),
            },
        );
    }
    out.into_values().collect()
}

fn max_priority(pods: &[TranslatedPod], members: &[usize]) -> i32 {
    members
        .iter()
        .map(|&i| pods[i].pod.priority)
        .max()
        .unwrap_or(0)
}

/// The groups of pods whose `spec.schedulingGroup` names a `scheduling.k8s.io` PodGroup, into
/// `out`; the members of a `basic` group leave their group (each is placed on its own).
fn workload_groups(
    pods: &mut [TranslatedPod],
    members: &BTreeMap<(String, String), Vec<usize>>,
    ctx: &GroupContext<'_>,
    out: &mut BTreeMap<(String, String), PodGroup>,
) {
    let objects: BTreeMap<(&str, &str), &WorkloadPodGroup> = ctx
        .workload_groups
        .iter()
        .filter_map(|g| {
            let m = &g.metadata;
            Some(((m.namespace.as_deref()?, m.name.as_deref()?), *g))
        })
        .collect();
    for (key, mine) in members {
        let Some(object_name) = key.1.strip_prefix(WORKLOAD_GROUP_PREFIX) else {
            continue;
        };
        let object = objects.get(&(key.0.as_str(), object_name));
        let queue = mine
            .iter()
            .map(|&i| &pods[i])
            .find(|p| p.queue_labelled)
            .map(|p| p.pod.queue.clone())
            .unwrap_or_else(|| keys::DEFAULT_QUEUE.to_string());
        let (min_member, priority, topology) = match object {
            // kube-scheduler keeps such pods out of its queue until the PodGroup appears.
            None => {
                for &i in mine {
                    pods[i].pod.input_errors.push(InputError {
                        field: SCHEDULING_GROUP_FIELD.to_owned(),
                        message: format!(
                            "PodGroup {}/{object_name} (scheduling.k8s.io/v1beta1) does not exist; the pod waits until it does",
                            key.0
                        ),
                    });
                }
                (mine.len() as u32, max_priority(pods, mine), None)
            }
            Some(object) => {
                let spec = &object.spec;
                let Some(gang) = &spec.scheduling_policy.gang else {
                    for &i in mine {
                        pods[i].pod.group = None;
                        pods[i].pod.min_member = None;
                    }
                    continue;
                };
                let priority = spec
                    .priority
                    .or_else(|| {
                        spec.priority_class_name
                            .as_ref()
                            .and_then(|c| ctx.priority_classes.get(c).copied())
                    })
                    .unwrap_or_else(|| max_priority(pods, mine));
                let topology = spec
                    .scheduling_constraints
                    .as_ref()
                    .and_then(|c| c.topology.as_ref())
                    .and_then(|t| t.first())
                    .map(|t| t.key.clone());
                (gang.min_count.max(1) as u32, priority, topology)
            }
        };
        for &i in mine {
            if !pods[i].queue_labelled {
                pods[i].pod.queue = queue.clone();
            }
        }
        out.insert(
            key.clone(),
            PodGroup {
                name: key.1.clone(),
                namespace: key.0.clone(),
                queue,
                min_member: min_member.max(1),
                max_member: None,
                topology_required: topology.as_deref().map(|l| resolve(l, ctx.topology)),
                topology_preferred: None,
                priority,
                below_min_member_since: ctx.below_min_member_since.get(key).copied(),
            },
        );
    }
}
