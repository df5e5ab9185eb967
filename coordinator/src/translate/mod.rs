//! Pure translation from Kubernetes objects to the scheduling core's model: pods (labels,
//! annotations and their migration aliases, requests, placement constraints, the node
//! affinity of their volumes), pod groups (objects, shorthand, implied by owner, the Workload
//! API's), queues, topology, nodes (taints, pod limit, extended resources) and namespaces'
//! labels (which also decide which queues a namespace's pods may use). No I/O and no clocks:
//! the caller passes `now`.
//!
//! The cluster cache stores objects and calls [`snapshot_with`] once per cycle, with a
//! [`PodMemo`] that remembers each pod's translation until its `resourceVersion` moves.

pub mod budgets;
pub mod constraints;
pub mod containers;
pub mod group;
pub mod node;
pub mod pod;
pub mod queue;
pub mod requests;
pub mod topology;
pub mod volumes;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Namespace, Node as KubeNode, PersistentVolume, PersistentVolumeClaim, Pod as KubePod,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::scheduling::v1beta1::PodGroup as WorkloadPodGroup;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::crd::validate::{self, Problem};
use crate::crd::{PodGroup as PodGroupCrd, Queue as QueueCrd, Topology};
use tessera_contract::keys;
use tessera_core::model::{Fence, Gpu, InputError, Queue, Snapshot};

pub use group::{GroupContext, groups};
pub use pod::{GroupSource, PodContext, TranslatedPod};

/// Everything one snapshot is built from.
#[derive(Clone, Debug, Default)]
pub struct Inputs<'a> {
    /// Logical time now (Unix seconds; pods' creation times use the same clock).
    pub now: u64,
    /// This scheduler's name (`tessera`).
    pub scheduler_name: String,
    /// All pods (every scheduler, every phase; finished and foreign unbound ones are skipped).
    pub pods: Vec<&'a KubePod>,
    /// All nodes.
    pub nodes: Vec<&'a KubeNode>,
    /// Queue objects.
    pub queues: Vec<&'a QueueCrd>,
    /// PodGroup objects.
    pub pod_groups: Vec<&'a PodGroupCrd>,
    /// The Workload API's PodGroups (`scheduling.k8s.io/v1beta1`), which pods name in
    /// `spec.schedulingGroup`.
    pub workload_pod_groups: Vec<&'a WorkloadPodGroup>,
    /// Topology objects (the one named `default`, else the first by name, is used).
    pub topologies: Vec<&'a Topology>,
    /// PriorityClasses.
    pub priority_classes: Vec<&'a PriorityClass>,
    /// Agent-reported GPUs per node name; a node without an entry offers no GPUs.
    pub agent_gpus: BTreeMap<String, Vec<Gpu>>,
    /// Per (namespace, group): since when the group has had fewer than minMember running pods.
    pub below_min_member_since: BTreeMap<(String, String), u64>,
    /// Namespaces (their labels answer inter-pod terms' namespace selectors).
    pub namespaces: Vec<&'a Namespace>,
    /// PersistentVolumeClaims of every namespace.
    pub claims: Vec<&'a PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub volumes: Vec<&'a PersistentVolume>,
    /// StorageClasses (their binding mode decides whether an unbound claim may wait).
    pub storage_classes: Vec<&'a StorageClass>,
    /// PodDisruptionBudgets (victims they protect are not chosen).
    pub disruption_budgets: Vec<&'a PodDisruptionBudget>,
}

impl Inputs<'_> {
    /// Empty inputs at `now` for scheduler `scheduler_name`.
    pub fn new(now: u64, scheduler_name: &str) -> Self {
        Inputs {
            now,
            scheduler_name: scheduler_name.to_string(),
            ..Inputs::default()
        }
    }
}

/// A snapshot plus what the cluster layer reports back to users.
#[derive(Clone, Debug, Default)]
pub struct Translated {
    /// The core's input.
    pub snapshot: Snapshot,
    /// Per Queue object name: validation problems (write `Valid=False`); absent = valid.
    pub queue_problems: BTreeMap<String, Vec<Problem>>,
    /// Per (namespace, name) of PodGroup objects: validation problems.
    pub group_problems: BTreeMap<(String, String), Vec<Problem>>,
    /// Per Topology object name: validation problems.
    pub topology_problems: BTreeMap<String, Vec<Problem>>,
    /// Per pod UID: problems that do not stop scheduling (e.g. an unreadable assignment).
    pub pod_warnings: BTreeMap<String, Vec<InputError>>,
    /// Why GPUs are fenced, per kind of fence, one line per GPU or pod (filled by the
    /// cluster's join of the agents' reports, not by translation): what a pending pod told
    /// "GPUs … not yet reported" is told in particular.
    pub gpu_fences: BTreeMap<Fence, Vec<String>>,
}

/// The pod context `inputs` imply: priority classes by name, the global default priority.
pub fn pod_context(inputs: &Inputs<'_>) -> PodContext {
    let mut classes = BTreeMap::new();
    let mut default_priority = 0;
    for pc in &inputs.priority_classes {
        let value = pc.value.unwrap_or(0);
        if let Some(name) = &pc.metadata.name {
            classes.insert(name.clone(), value);
        }
        if pc.global_default == Some(true) {
            default_priority = value;
        }
    }
    PodContext {
        scheduler_name: inputs.scheduler_name.clone(),
        priority_classes: classes,
        default_priority,
        now: inputs.now,
    }
}

/// Builds the snapshot: nodes (with agent GPUs), pods (sorted by creation time, then
/// namespace and name), groups, queues (plus an implicit top-level `default` queue when no Queue
/// object has that name, so unlabelled pods schedule on a bare cluster) and the topology.
pub fn snapshot(inputs: &Inputs<'_>) -> Translated {
    assemble(inputs, None)
}

/// Each pod's [`pod::translate`] from an earlier cycle, reused while the pod's
/// `resourceVersion` and the context it was translated in stay the same: the API server
/// moves a pod's `resourceVersion` on every change to it, and the translation reads nothing
/// but the pod and the [`PodContext`]. A pod without a `resourceVersion`, a uid or a
/// creation time (whose translation reads `now`) is translated every time.
#[derive(Default)]
pub struct PodMemo {
    /// The context of the entries, less `now` (which only pods without a creation time read).
    context: Option<(String, BTreeMap<String, i32>, i32)>,
    /// Per pod uid: the resourceVersion translated, the result, and the pass that last used it.
    entries: rustc_hash::FxHashMap<String, (String, Option<TranslatedPod>, u64)>,
    /// Bumped on every pass; entries not used in a pass belong to pods gone from the store.
    pass: u64,
}

impl PodMemo {
    /// Starts a pass in `ctx`: a context that differs from the entries' forgets them all.
    fn begin(&mut self, ctx: &PodContext) {
        let context = (
            ctx.scheduler_name.clone(),
            ctx.priority_classes.clone(),
            ctx.default_priority,
        );
        if self.context.as_ref() != Some(&context) {
            self.entries.clear();
            self.context = Some(context);
        }
        self.pass += 1;
    }

    /// `pod::translate(pod, ctx)`, from the memo when the pod is unchanged.
    fn translate(&mut self, pod: &KubePod, ctx: &PodContext) -> Option<TranslatedPod> {
        let meta = &pod.metadata;
        let (Some(uid), Some(rv), Some(_)) = (
            meta.uid.as_ref(),
            meta.resource_version.as_ref(),
            meta.creation_timestamp.as_ref(),
        ) else {
            return pod::translate(pod, ctx);
        };
        let pass = self.pass;
        if let Some((seen, translated, used)) = self.entries.get_mut(uid)
            && seen == rv
        {
            *used = pass;
            return translated.clone();
        }
        let translated = pod::translate(pod, ctx);
        self.entries
            .insert(uid.clone(), (rv.clone(), translated.clone(), pass));
        translated
    }

    /// Ends a pass: forgets the pods it did not see.
    fn end(&mut self) {
        let pass = self.pass;
        self.entries.retain(|_, (_, _, used)| *used == pass);
    }

    /// How many pods' translations are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no translation is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// [`snapshot`], translating again only the pods `memo` has not seen at their current
/// `resourceVersion`; the result is the same as [`snapshot`]'s.
pub fn snapshot_with(inputs: &Inputs<'_>, memo: &mut PodMemo) -> Translated {
    assemble(inputs, Some(memo))
}

/// Marks each pod Tessera is to place whose namespace may not use its queue with an input
/// error on the queue label, so it stays pending and says why. Judged here, on the
/// translated pods of this pass, not in [`pod::translate`]: the rules are the queues' and the
/// namespaces', which the [`PodMemo`] does not follow.
fn refuse_unadmitted_namespaces(pods: &mut [TranslatedPod], tenancy: &queue::Tenancy<'_>) {
    // Judged once per (queue, namespace) of the pending pods, then written.
    let mut judged: rustc_hash::FxHashMap<(&str, &str), Option<String>> = Default::default();
    let mut refused: Vec<(usize, String)> = Vec::new();
    for (i, p) in pods.iter().enumerate() {
        let pod = &p.pod;
        if pod.owned_by_other_scheduler || pod.placement.is_some() {
            continue;
        }
        let key = (pod.queue.as_str(), pod.namespace.as_str());
        let refusal = judged
            .entry(key)
            .or_insert_with(|| tenancy.refusal(key.0, key.1));
        if let Some(message) = refusal {
            refused.push((i, message.clone()));
        }
    }
    for (i, message) in refused {
        pods[i].pod.input_errors.push(InputError {
            field: keys::QUEUE.to_string(),
            message,
        });
    }
}

fn assemble(inputs: &Inputs<'_>, mut memo: Option<&mut PodMemo>) -> Translated {
    let ctx = pod_context(inputs);
    let volume_objects =
        volumes::VolumeObjects::new(&inputs.claims, &inputs.volumes, &inputs.storage_classes);
    if let Some(memo) = memo.as_deref_mut() {
        memo.begin(&ctx);
    }
    let mut pods: Vec<TranslatedPod> = inputs
        .pods
        .iter()
        .filter_map(|p| {
            let mut t = match memo.as_deref_mut() {
                Some(memo) => memo.translate(p, &ctx),
                None => pod::translate(p, &ctx),
            }?;
            // Volume binding is a scheduling-time check: only pods Tessera is to place.
            if !t.pod.owned_by_other_scheduler && t.pod.placement.is_none() {
                t.pod.constraints.volume_node_affinity =
                    volumes::volume_node_affinity(p, &volume_objects, &mut t.pod.input_errors);
            }
            Some(t)
        })
        .collect();
    if let Some(memo) = memo {
        memo.end();
    }
    pods.sort_by(|a, b| {
        (a.pod.created, &a.pod.namespace, &a.pod.name).cmp(&(
            b.pod.created,
            &b.pod.namespace,
            &b.pod.name,
        ))
    });
    let topo = topology::active(&inputs.topologies);
    let gctx = GroupContext {
        topology: topo,
        priority_classes: &ctx.priority_classes,
        below_min_member_since: &inputs.below_min_member_since,
        workload_groups: &inputs.workload_pod_groups,
    };
    let groups = groups(&mut pods, &inputs.pod_groups, &gctx);
    // After groups: a pod without a queue label takes its PodGroup's queue.
    refuse_unadmitted_namespaces(
        &mut pods,
        &queue::Tenancy::new(&inputs.queues, &inputs.namespaces),
    );

    let mut queues: Vec<Queue> = inputs.queues.iter().map(|q| queue::translate(q)).collect();
    if !queues.iter().any(|q| q.name == keys::DEFAULT_QUEUE) {
        queues.push(Queue::new(keys::DEFAULT_QUEUE));
    }
    let named: BTreeSet<String> = pods
        .iter()
        .filter(|p| !p.pod.owned_by_other_scheduler)
        .map(|p| p.pod.queue.clone())
        .collect();
    let queue_problems = validate::queue_tree(&inputs.queues, &named);

    let mut group_problems = BTreeMap::new();
    for g in &inputs.pod_groups {
        let problems = validate::pod_group(g, topo);
        if !problems.is_empty() {
            group_problems.insert(
                (
                    g.metadata.namespace.clone().unwrap_or_default(),
                    g.metadata.name.clone().unwrap_or_default(),
                ),
                problems,
            );
        }
    }
    let mut topology_problems = BTreeMap::new();
    for t in &inputs.topologies {
        let problems = validate::topology(t);
        if !problems.is_empty() {
            topology_problems.insert(t.metadata.name.clone().unwrap_or_default(), problems);
        }
    }

    let nodes = inputs
        .nodes
        .iter()
        .map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or("");
            node::translate(n, inputs.agent_gpus.get(name).cloned())
        })
        .collect();

    let mut pod_warnings = BTreeMap::new();
    let mut model_pods = Vec::with_capacity(pods.len());
    for p in pods {
        if !p.warnings.is_empty() {
            pod_warnings.insert(p.pod.uid.clone(), p.warnings);
        }
        model_pods.push(p.pod);
    }
    Translated {
        snapshot: Snapshot {
            now: inputs.now,
            nodes,
            pods: model_pods,
            groups,
            queues,
            topology: topo.map(topology::levels),
            namespaces: inputs
                .namespaces
                .iter()
                .filter_map(|ns| {
                    Some((
                        ns.metadata.name.clone()?,
                        ns.metadata.labels.clone().unwrap_or_default(),
                    ))
                })
                .collect(),
            disruption_budgets: budgets::translate(&inputs.disruption_budgets, &inputs.pods),
            // The scheduling loop fills it (what the last cycle returned, else the Queues'
            // status): the translation does not know the previous cycle.
            usage: Vec::new(),
        },
        queue_problems,
        group_problems,
        topology_problems,
        pod_warnings,
        gpu_fences: BTreeMap::new(),
    }
}
