//! A Kubernetes Pod as the scheduling core sees it: labels, annotations (and their migration
//! aliases), requests (summed as kube-scheduler sums them, see [`super::requests`]), placement
//! constraints (see [`super::constraints`]), priority and placement. Pods being deleted that
//! are not bound yet are left out, as kube-scheduler skips them. Malformed user input becomes
//! an [`InputError`] naming the field and the accepted form; nothing here panics on input.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod as KubePod};

use tessera_core::model::{
    Assignment, GpuRequest, GpuShare, InputError, Isolation, Placement, Pod as ModelPod,
};

use super::{constraints, requests};
use tessera_contract::keys;
use tessera_contract::pod::{bound_assignment, container_gpus, gpu_quantity};
/// The share annotations' readers live in the contract, which `kubectl tessera why` shares.
pub use tessera_contract::share::{parse_fraction, parse_gpu_memory};

/// What pod translation needs besides the pod.
#[derive(Clone, Debug, Default)]
pub struct PodContext {
    /// This scheduler's name (`tessera`).
    pub scheduler_name: String,
    /// PriorityClass name → value.
    pub priority_classes: BTreeMap<String, i32>,
    /// Priority of pods that name no class (the `globalDefault` class's value, else 0).
    pub default_priority: i32,
    /// Logical time now (seconds); the creation time of pods that carry none.
    pub now: u64,
}

/// Where a pod's group comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupSource {
    /// `tessera.dev/pod-group` (or `pod-group-name`) names it.
    Annotation(String),
    /// `spec.schedulingGroup.podGroupName` names a `scheduling.k8s.io` PodGroup (the Workload
    /// API), the way kube-scheduler finds a pod's group.
    Workload(String),
    /// Implied by the pod's top controller owner (a Job, JobSet, PyTorchJob, ...).
    Owner {
        /// Owner kind (`Job`, `JobSet`, `PyTorchJob`, ...).
        kind: String,
        /// Owner name.
        name: String,
    },
}

/// A translated pod plus what group derivation needs and what the model has no place for.
#[derive(Clone, Debug, PartialEq)]
pub struct TranslatedPod {
    /// The core's pod (`group` and `min_member` already set from the pod's own inputs).
    pub pod: ModelPod,
    /// Whether the queue came from a label (else it is `default` and a PodGroup's queue wins).
    pub queue_labelled: bool,
    /// Where the pod's group comes from; `None` = a group of one.
    pub group_source: Option<GroupSource>,
    /// `tessera.dev/topology-required` as written (a level name).
    pub topology_required: Option<String>,
    /// `tessera.dev/topology-preferred` as written (a level name).
    pub topology_preferred: Option<String>,
    /// Problems that do not stop scheduling (e.g. an unreadable assignment on a bound pod).
    pub warnings: Vec<InputError>,
}

fn err(field: &str, message: impl Into<String>) -> InputError {
    InputError {
        field: field.to_string(),
        message: message.into(),
    }
}

/// The value of the first of `keys` present in `map`, with the key that held it.
fn lookup<'a>(
    map: Option<&'a BTreeMap<String, String>>,
    keys: &[&'static str],
) -> Option<(&'static str, &'a str)> {
    let map = map?;
    keys.iter()
        .find_map(|k| map.get(*k).map(|v| (*k, v.as_str())))
}

/// Translates `pod`. `None` for pods the scheduler ignores: finished ones (Succeeded/Failed)
/// and unbound pods of other schedulers.
pub fn translate(pod: &KubePod, ctx: &PodContext) -> Option<TranslatedPod> {
    let spec = pod.spec.as_ref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let scheduler = spec
        .scheduler_name
        .as_deref()
        .unwrap_or(keys::DEFAULT_SCHEDULER);
    let ours = scheduler == ctx.scheduler_name;
    let node = spec.node_name.as_deref().filter(|n| !n.is_empty());
    if !ours && node.is_none() {
        return None;
    }
    // kube-scheduler skips pods being deleted; unbound, they hold nothing either.
    if node.is_none() && pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let meta = &pod.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let uid = meta
        .uid
        .clone()
        .unwrap_or_else(|| format!("{namespace}/{name}"));
    let labels = meta.labels.as_ref();
    let annotations = meta.annotations.as_ref();
    let mut errors = Vec::new();
    let mut warnings = Vec::new();

    let (queue, queue_labelled) = match lookup(labels, &[keys::QUEUE, keys::QUEUE_ALIAS]) {
        Some((key, v)) if v.trim().is_empty() => {
            errors.push(err(
                key,
                "is empty; give the name of a leaf Queue, or remove the label for queue \"default\"",
            ));
            (keys::DEFAULT_QUEUE.to_string(), false)
        }
        Some((_, v)) => (v.trim().to_string(), true),
        None => (keys::DEFAULT_QUEUE.to_string(), false),
    };

    let (priority, prio_err) = priority_of(spec.priority, spec.priority_class_name.as_deref(), ctx);
    errors.extend(prio_err);
    let preemptible = match lookup(labels, &[keys::PREEMPTIBLE]) {
        None => priority < keys::PREEMPTIBLE_BELOW_PRIORITY,
        Some((_, v)) => match v.trim().to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            _ => {
                errors.push(err(
                    keys::PREEMPTIBLE,
                    format!("{v:?} is not a boolean; use \"true\" or \"false\""),
                ));
                priority < keys::PREEMPTIBLE_BELOW_PRIORITY
            }
        },
    };

    let requested = requests::pod_requests(spec, &mut errors);
    let cpu_milli = requested.get("cpu").copied().unwrap_or(0);
    let memory_mib = requests::mib(requested.get("memory").copied().unwrap_or(0));
    let (gpu, gpu_container) = if ours {
        gpu_request(spec, &requested, annotations, &mut errors)
    } else {
        // Another scheduler's pod holds whole GPUs (our annotations are not for it), as many
        // as the kubelet's device manager gives it: the app containers' sum, or the largest
        // init container's if more (app containers reuse the init containers' devices), with
        // sidecars on top — the effective request `pod_requests` computes.
        let whole = requested
            .get(keys::GPU_RESOURCE)
            .map_or(0, |milli| milli.div_ceil(1000));
        let mut ignored = Vec::new();
        let (_, container, _) = gpu_count("containers", spec.containers.as_slice(), &mut ignored);
        (
            GpuRequest {
                count: u32::try_from(whole).unwrap_or(u32::MAX),
                per_gpu: GpuShare::Whole,
            },
            container,
        )
    };

    let isolation = match lookup(annotations, &[keys::ISOLATION]) {
        None => Isolation::Watchdog,
        Some((_, v)) => Isolation::parse(v).unwrap_or_else(|e| {
            errors.push(err(keys::ISOLATION, e.to_string()));
            Isolation::Watchdog
        }),
    };

    let min_member = match lookup(annotations, &[keys::MIN_MEMBER]) {
        None => None,
        Some((_, v)) => match v.trim().parse::<u32>() {
            Ok(n) if n >= 1 => Some(n),
            _ => {
                errors.push(err(
                    keys::MIN_MEMBER,
                    format!("{v:?} is not a whole number of at least 1; use e.g. \"4\""),
                ));
                None
            }
        },
    };
    let annotated = match lookup(annotations, &[keys::POD_GROUP, keys::POD_GROUP_ALIAS]) {
        Some((key, v)) if v.trim().is_empty() => {
            errors.push(err(
                key,
                "is empty; give the name of the pod's PodGroup, or remove the annotation",
            ));
            None
        }
        // An object name never holds a `/`; refusing it keeps the annotation's groups apart
        // from the Workload API's, whose names in the core carry a `/`.
        Some((key, v)) if v.contains('/') => {
            errors.push(err(
                key,
                format!("{v:?} is not a PodGroup name; give the name of a PodGroup in the pod's namespace (no \"/\")"),
            ));
            None
        }
        Some((key, v)) => Some((key, v.trim().to_string())),
        None => None,
    };
    let workload = spec
        .scheduling_group
        .as_ref()
        .and_then(|g| g.pod_group_name.as_deref())
        .map(str::trim)
        .filter(|n| !n.is_empty());
    let group_source = match (workload, annotated) {
        (Some(w), Some((key, a))) => {
            errors.push(err(
                super::group::SCHEDULING_GROUP_FIELD,
                format!(
                    "the pod is in two groups: scheduling.k8s.io PodGroup {namespace}/{w} \
                     ({}) and Tessera PodGroup {namespace}/{a} ({key}); a pod belongs to one \
                     gang: remove the {key} annotation, or create the pod without \
                     spec.schedulingGroup",
                    super::group::SCHEDULING_GROUP_FIELD
                ),
            ));
            Some(GroupSource::Workload(w.to_owned()))
        }
        (Some(w), None) => Some(GroupSource::Workload(w.to_owned())),
        (None, Some((_, a))) => Some(GroupSource::Annotation(a)),
        // An explicit group of either kind wins over the one the owner implies.
        (None, None) => owner_group(pod),
    };
    // Another scheduler's pods are counted, never grouped.
    let group_source = group_source.filter(|_| ours);
    if group_source.is_none()
        && let Some(n) = min_member
        && n > 1
    {
        errors.push(err(
            keys::MIN_MEMBER,
            format!(
                "gang size {n} but the pod has no group; add {} naming the group its {n} pods share",
                keys::POD_GROUP
            ),
        ));
    }
    let group = group_source.as_ref().map(group_name);
    let level = |key: &'static str, errors: &mut Vec<InputError>| match lookup(annotations, &[key])
    {
        Some((_, v)) if v.trim().is_empty() => {
            errors.push(err(
                key,
                "is empty; give a level name of the Topology object, e.g. \"rack\"",
            ));
            None
        }
        Some((_, v)) => Some(v.trim().to_string()),
        None => None,
    };
    let topology_required = level(keys::TOPOLOGY_REQUIRED, &mut errors);
    let topology_preferred = level(keys::TOPOLOGY_PREFERRED, &mut errors);

    let placement = node.map(|node| {
        // Only an assignment Tessera's Binding wrote counts: one the pod was created with (or
        // another scheduler's pod carries) is not a decision, and the pod is accounted by what
        // its agent reports, as any other scheduler's.
        let written = bound_assignment(pod).filter(|_| ours);
        if ours && written.is_none() && lookup(annotations, &[keys::ASSIGNMENT]).is_some() {
            warnings.push(err(
                keys::ASSIGNMENT,
                format!(
                    "ignored: not written by Tessera's Binding (no {}); the pod counts as holding what its node's agent reports",
                    keys::ASSIGNED_AT
                ),
            ));
        }
        let assignment = match written {
            None => Assignment::default(),
            // Each GPU once: containers reusing an init container's GPU name it again.
            Some(text) => Assignment::from_json(text)
                .map(|a| super::containers::merged(&a))
                .unwrap_or_else(|e| {
                    warnings.push(err(
                        keys::ASSIGNMENT,
                        format!("unreadable ({e}); treating the pod as holding whole GPUs"),
                    ));
                    Assignment::default()
                }),
        };
        Placement {
            node: node.to_string(),
            assignment,
        }
    });

    let mut constraints = constraints::pod_constraints(pod, spec, &requested, &mut errors);
    if ours && gpu.count > 0 {
        constraints
            .tolerations
            .extend(constraints::gpu_tolerations());
    }

    let created = meta
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second().max(0) as u64)
        .unwrap_or(ctx.now);

    let model = ModelPod {
        uid,
        namespace,
        name,
        queue,
        group,
        min_member,
        priority,
        preemptible,
        cpu_milli,
        memory_mib,
        gpu,
        gpu_models: Vec::new(),
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        isolation,
        gpu_container,
        placement,
        created,
        terminating: meta.deletion_timestamp.is_some(),
        owned_by_other_scheduler: !ours,
        controller: controller_of(pod),
        // Other schedulers' pods are never validated: they are only counted.
        input_errors: if ours { errors } else { Vec::new() },
        constraints,
    };
    Some(TranslatedPod {
        pod: model,
        queue_labelled,
        group_source,
        topology_required,
        topology_preferred,
        warnings,
    })
}

/// What recreates `pod` when it is evicted: its controller owner reference as `Kind name`
/// (`ReplicaSet web-5d8f`, `Job train`); `None` for a bare pod, and for a static pod's mirror
/// (owned by its Node), which an eviction does not bring back either.
fn controller_of(pod: &KubePod) -> Option<String> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind != "Node")
        .map(|o| format!("{} {}", o.kind, o.name))
}

/// The group name a source implies: the annotation's name, `scheduling.k8s.io/<name>` for a
/// Workload API PodGroup, or `<kind>-<name>` of the owner in lower case (`job-train`,
/// `pytorchjob-bert`).
pub fn group_name(source: &GroupSource) -> String {
    match source {
        GroupSource::Annotation(n) => n.clone(),
        GroupSource::Workload(n) => super::group::workload_group_name(n),
        GroupSource::Owner { kind, name } => format!("{}-{name}", kind.to_ascii_lowercase()),
    }
}

/// Whether pods of a controller of this kind form a gang: batch `Job`, `JobSet`, and the
/// training-operator style kinds (`PyTorchJob`, `MPIJob`, `TFJob`, `XGBoostJob`, `PaddleJob`,
/// `JAXJob`, `TrainJob`, ...: any kind ending in `Job` except `CronJob`, which owns Jobs, not
/// pods). ReplicaSets, StatefulSets and DaemonSets do not: their pods are independent.
pub fn is_gang_owner_kind(kind: &str) -> bool {
    kind == "JobSet" || (kind.ends_with("Job") && kind != "CronJob")
}

/// The group implied by the pod's top controller owner. A JobSet's pods are owned by its Jobs;
/// the JobSet controller's label names the top owner, so all of them form one group.
fn owner_group(pod: &KubePod) -> Option<GroupSource> {
    let meta = &pod.metadata;
    if let Some((_, js)) = lookup(meta.labels.as_ref(), &[keys::JOBSET_NAME_LABEL])
        && !js.is_empty()
    {
        return Some(GroupSource::Owner {
            kind: "JobSet".to_string(),
            name: js.to_string(),
        });
    }
    let owner = meta
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    is_gang_owner_kind(&owner.kind).then(|| GroupSource::Owner {
        kind: owner.kind.clone(),
        name: owner.name.clone(),
    })
}

fn priority_of(
    explicit: Option<i32>,
    class: Option<&str>,
    ctx: &PodContext,
) -> (i32, Option<InputError>) {
    if let Some(p) = explicit {
        return (p, None);
    }
    match class.filter(|c| !c.is_empty()) {
        None => (ctx.default_priority, None),
        Some(c) => match ctx.priority_classes.get(c) {
            Some(&v) => (v, None),
            None => (
                ctx.default_priority,
                Some(err(
                    "spec.priorityClassName",
                    format!("PriorityClass {c:?} does not exist; name an existing PriorityClass"),
                )),
            ),
        },
    }
}

/// Whole-GPU count of the first container asking for `nvidia.com/gpu`, that container (the
/// first container when none asks), and every container asking, in order.
fn gpu_count(
    kind: &str,
    containers: &[Container],
    errors: &mut Vec<InputError>,
) -> (u32, String, Vec<(String, String)>) {
    let mut count = 0u32;
    let mut asking: Vec<(String, String)> = Vec::new();
    for (i, c) in containers.iter().enumerate() {
        let Some((which, _)) = gpu_quantity(c) else {
            continue;
        };
        let field = format!("spec.{kind}[{i}].resources.{which}.{}", keys::GPU_RESOURCE);
        match container_gpus(c) {
            Ok(0) => {}
            Ok(n) => {
                if asking.is_empty() {
                    count = n;
                }
                asking.push((c.name.clone(), field));
            }
            Err(e) => errors.push(err(&field, e.to_string())),
        }
    }
    let receiver = asking
        .first()
        .map(|(name, _)| name.clone())
        .or_else(|| containers.first().map(|c| c.name.clone()))
        .unwrap_or_default();
    (count, receiver, asking)
}

/// The GPU request of one of our pods: the count, and the per-GPU share from the fraction or
/// memory annotation.
fn gpu_request(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    requested: &requests::MilliAmounts,
    annotations: Option<&BTreeMap<String, String>>,
    errors: &mut Vec<InputError>,
) -> (GpuRequest, String) {
    let (mut count, container, mut asking) =
        gpu_count("containers", spec.containers.as_slice(), errors);
    let (_, _, init_asking) = gpu_count(
        "initContainers",
        spec.init_containers.as_deref().unwrap_or_default(),
        errors,
    );
    asking.extend(init_asking);
    let fraction = lookup(annotations, &[keys::GPU_FRACTION, keys::GPU_FRACTION_ALIAS]);
    let memory = lookup(annotations, &[keys::GPU_MEMORY, keys::GPU_MEMORY_ALIAS]);
    let devices = lookup(annotations, &[keys::GPU_FRACTION_NUM_DEVICES_ALIAS]);
    let per_gpu = match (fraction, memory) {
        (Some((fk, _)), Some((mk, _))) => {
            errors.push(err(
                fk,
                format!("both {fk} and {mk} are set; give only one: a share of each GPU or an amount of its memory"),
            ));
            return (GpuRequest::NONE, container);
        }
        (Some((key, v)), None) => match parse_fraction(v) {
            Some(milli) => GpuShare::Fraction(milli),
            None => {
                errors.push(err(
                    key,
                    format!("{v:?} is not a decimal in (0, 1]; use e.g. \"0.25\""),
                ));
                return (GpuRequest::NONE, container);
            }
        },
        (None, Some((key, v))) => match parse_gpu_memory(v) {
            Ok(mib) => GpuShare::MemoryMib(mib),
            Err(why) => {
                errors.push(err(
                    key,
                    format!("{v:?} {why}; use a quantity such as \"10Gi\" or \"4096Mi\", or plain MiB such as \"4096\""),
                ));
                return (GpuRequest::NONE, container);
            }
        },
        (None, None) => {
            // Whole GPUs: as many as the kubelet's device manager takes for the pod, however
            // its containers split them (`containers::split` writes who gets which).
            count = requested.get(keys::GPU_RESOURCE).map_or(count, |milli| {
                u32::try_from(milli.div_ceil(1000)).unwrap_or(u32::MAX)
            });
            if let Some((key, _)) = devices {
                errors.push(err(
                    key,
                    format!(
                        "is set without {} or {}; give the share of each GPU too",
                        keys::GPU_FRACTION,
                        keys::GPU_MEMORY
                    ),
                ));
            }
            return (
                GpuRequest {
                    count,
                    per_gpu: GpuShare::Whole,
                },
                container,
            );
        }
    };
    // A share of a GPU is one container's.
    if let [(first, _), (second, field), ..] = asking.as_slice() {
        errors.push(err(
            field,
            format!(
                "containers {first:?} and {second:?} both request GPUs, but a GPU share ({} or {}) goes to one container; request nvidia.com/gpu in one, or ask for whole GPUs",
                keys::GPU_FRACTION,
                keys::GPU_MEMORY
            ),
        ));
    }
    if let Some((key, v)) = devices {
        match v.trim().parse::<u32>() {
            Ok(n) if n >= 1 => {
                if count != 0 && count != n {
                    errors.push(err(
                        key,
                        format!(
                            "{n} differs from the {count} GPUs of {}; give one count",
                            keys::GPU_RESOURCE
                        ),
                    ));
                }
                count = n;
            }
            _ => errors.push(err(
                key,
                format!("{v:?} is not a whole number of at least 1; use e.g. \"2\""),
            )),
        }
    }
    // A fraction without `nvidia.com/gpu` (the KAI convention) shares one GPU.
    let count = count.max(1);
    (GpuRequest { count, per_gpu }, container)
}
