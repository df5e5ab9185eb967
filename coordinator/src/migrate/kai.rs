//! KAI Scheduler's objects as Tessera's: pure translation, no I/O. A KAI `Queue`
//! (`scheduling.run.ai/v2`) becomes a Tessera Queue, a KAI `PodGroup`
//! (`scheduling.run.ai/v2alpha2`) a Tessera PodGroup (or nothing, when KAI's pod grouper made
//! it for an owner whose pods Tessera groups by itself), and every pod or pod template in a
//! document (a Pod, a Job's or Deployment's template, a PyTorchJob's replica templates ...)
//! is rewritten to Tessera's names: `schedulerName: tessera`, `tessera.dev/` labels and
//! annotations, and the `nvidia.com/gpu` limit a fractional container needs. Every object
//! carries notes: what changed in meaning and what does not carry over.
//!
//! KAI's field names and units are from its published CRDs and documentation: queue
//! resources `gpu` (GPUs, fractions allowed), `cpu` (millicores) and `memory` (megabytes,
//! 10^6 bytes), each with `quota` (-1 = unlimited), `overQuotaWeight` and `limit` (-1 = none);
//! a queue's `priority` defaults to 100.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::crd::{GpuQuota, GroupTopology, PodGroupSpec, QuantityQuota, QuantityValue, QueueSpec};
use tessera_contract::keys;

/// KAI's API group.
pub const KAI_GROUP: &str = "scheduling.run.ai";
/// KAI's Queue version.
pub const KAI_QUEUE_VERSION: &str = "v2";
/// KAI's PodGroup version.
pub const KAI_POD_GROUP_VERSION: &str = "v2alpha2";
/// The scheduler name KAI's pods carry.
pub const KAI_SCHEDULER: &str = "kai-scheduler";
/// KAI's annotation naming the container a fraction is for (else the first).
const KAI_FRACTION_CONTAINER: &str = "gpu-fraction-container-name";
/// KAI reads a pod's (or its top owner's) priority class from this label too.
const KAI_PRIORITY_LABEL: &str = "priorityClassName";
/// KAI's label placing a pod in a PodGroup's subgroup.
const KAI_SUBGROUP_LABEL: &str = "kai.scheduler/subgroup-name";
/// KAI's default queue priority.
const KAI_DEFAULT_PRIORITY: i64 = 100;

/// One input document and where it came from (`file.yaml#2`, `cluster`).
#[derive(Clone, Debug)]
pub struct Document {
    /// Where the document came from, for notes.
    pub origin: String,
    /// The object.
    pub value: Value,
    /// A live object that cannot be changed in place (a running pod): say what would change,
    /// print nothing.
    pub notes_only: bool,
}

/// One object of the output: what it is, its notes, and the Tessera object (none when
/// nothing is to be created, e.g. a PodGroup Tessera implies from the pods' owner).
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// `Queue research-team`, `PodGroup ml/train`, `Pod default/gpu-sharing`.
    pub what: String,
    /// Where it came from.
    pub origin: String,
    /// What changed in meaning, or does not carry over.
    pub notes: Vec<String>,
    /// The object to apply.
    pub object: Option<Value>,
}

/// The whole translation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Migration {
    /// One per input document, in input order.
    pub outputs: Vec<Output>,
}

impl Migration {
    /// The Tessera objects as multi-document YAML, each after its notes as `#` comments, so
    /// the text can be read and then applied as it is (`kubectl apply -f`).
    pub fn to_yaml(&self) -> Result<String, serde_yaml_ng::Error> {
        let mut out = String::new();
        let made = self.outputs.iter().filter(|o| o.object.is_some()).count();
        let _ = writeln!(
            out,
            "# tessera-coordinator migrate kai: {} KAI document(s) read, {made} Tessera object(s) written.",
            self.outputs.len()
        );
        let _ = writeln!(
            out,
            "# Notes above each object say what changed in meaning or does not carry over."
        );
        for o in &self.outputs {
            out.push_str("---\n");
            let _ = writeln!(out, "# {} (from {})", o.what, o.origin);
            for n in &o.notes {
                let _ = writeln!(out, "#   - {}", n.replace('\n', " "));
            }
            if let Some(object) = &o.object {
                out.push_str(&serde_yaml_ng::to_string(object)?);
            }
        }
        Ok(out)
    }
}

/// Translates every document, in order.
pub fn migrate(documents: &[Document]) -> Migration {
    let mut outputs: Vec<Output> = documents.iter().map(translate).collect();
    // Tessera sends pods without a queue label to the queue named `default`, which must then
    // be a leaf; KAI's own examples make `default` a parent.
    let parents: Vec<String> = outputs
        .iter()
        .filter_map(|o| {
            o.object
                .as_ref()?
                .pointer("/spec/parent")?
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    for o in &mut outputs {
        let is_default_parent = o.object.as_ref().is_some_and(|v| {
            v.get("kind").and_then(Value::as_str) == Some("Queue")
                && v.pointer("/metadata/name").and_then(Value::as_str) == Some(keys::DEFAULT_QUEUE)
        }) && parents.iter().any(|p| p == keys::DEFAULT_QUEUE);
        if is_default_parent {
            o.notes.push(format!(
                "Tessera sends pods without a queue label to the queue named {0}, and here {0} is a parent: every pod must then name its leaf queue ({1})",
                keys::DEFAULT_QUEUE,
                keys::QUEUE
            ));
        }
    }
    Migration { outputs }
}

fn translate(doc: &Document) -> Output {
    let mut out = translate_object(doc);
    if doc.notes_only && out.object.take().is_some() {
        let owner = doc.value.pointer("/metadata/ownerReferences/0").map(|o| {
            format!(
                "{} {}",
                o.get("kind").and_then(Value::as_str).unwrap_or("?"),
                o.get("name").and_then(Value::as_str).unwrap_or("?")
            )
        });
        out.notes.push(match owner {
            Some(owner) => format!("a running object is not rewritten: make these changes in {owner}'s pod template"),
            None => "a running object is not rewritten: make these changes in its manifest and create it again".to_owned(),
        });
    }
    out
}

fn translate_object(doc: &Document) -> Output {
    let api_version = doc.value.get("apiVersion").and_then(Value::as_str);
    let kind = doc.value.get("kind").and_then(Value::as_str).unwrap_or("");
    let group = api_version.and_then(|v| v.split_once('/')).map(|(g, _)| g);
    match (group, kind) {
        (Some(KAI_GROUP), "Queue") => queue(doc),
        (Some(KAI_GROUP), "PodGroup") => pod_group(doc),
        (Some(KAI_GROUP), other) => Output {
            what: format!("{other} {}", name_of(&doc.value)),
            origin: doc.origin.clone(),
            notes: vec![format!(
                "KAI's {other} has no Tessera counterpart; left out (Tessera reads Queue {KAI_GROUP}/{KAI_QUEUE_VERSION} and PodGroup {KAI_GROUP}/{KAI_POD_GROUP_VERSION})"
            )],
            object: None,
        },
        _ => workload(doc, kind),
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
fn name_of(value: &Value) -> String {
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<no name>");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

/// What of `metadata` a new object keeps: name, namespace, labels and annotations.
fn kept_metadata(value: &Value) -> Value {
    let mut meta = Map::new();
    if let Some(m) = value.get("metadata").and_then(Value::as_object) {
        for key in ["name", "namespace", "labels", "annotations"] {
            if let Some(v) = m.get(key) {
                meta.insert(key.to_owned(), v.clone());
            }
        }
    }
    Value::Object(meta)
}

/// Reads `spec` as `T`, or says which field is wrong and how.
fn spec_of<T: for<'de> Deserialize<'de> + Default>(value: &Value) -> Result<T, String> {
    let Some(spec) = value.get("spec") else {
        return Ok(T::default());
    };
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        format!("spec.{path}: {}", e.inner())
    })
}

/// A KAI queue resource (`spec.resources.gpu|cpu|memory`); absent fields stay `None`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KaiResource {
    quota: Option<f64>,
    over_quota_weight: Option<f64>,
    limit: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
struct KaiResources {
    gpu: Option<KaiResource>,
    cpu: Option<KaiResource>,
    memory: Option<KaiResource>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KaiQueueSpec {
    display_name: Option<String>,
    parent_queue: Option<String>,
    priority: Option<i64>,
    preempt_min_runtime: Option<String>,
    reclaim_min_runtime: Option<String>,
    resources: Option<KaiResources>,
}

/// A KAI amount: -1 (unlimited) or a finite number of at least 0.
fn amount(field: &str, v: f64) -> Result<f64, String> {
    if v == -1.0 || (v.is_finite() && v >= 0.0) {
        Ok(v)
    } else {
        Err(format!(
            "{field}: {v} is not -1 (unlimited) or a number of at least 0"
        ))
    }
}

/// One KAI resource as Tessera's (quota, weight, limit) in KAI's units, with notes; `None`
/// when KAI gives nothing for it.
struct Carried {
    quota: f64,
    weight: f64,
    /// `None` = no limit.
    limit: Option<f64>,
}

fn carry(
    resource: &str,
    given: Option<&KaiResource>,
    notes: &mut Vec<String>,
) -> Result<Option<Carried>, String> {
    let Some(r) = given else {
        notes.push(format!(
            "{resource}: not given; Tessera reads that as quota 0, overQuotaWeight 1, no limit (KAI's zero values may differ: give it explicitly if the queue must not use {resource})"
        ));
        return Ok(None);
    };
    let field = |f: &str| format!("spec.resources.{resource}.{f}");
    let mut quota = match r.quota {
        Some(q) => amount(&field("quota"), q)?,
        None => 0.0,
    };
    if quota == -1.0 {
        notes.push(format!(
            "{resource}.quota -1 (unlimited) has no Tessera counterpart: the queue deserves nothing of its own and shares what is over quota by weight"
        ));
        quota = 0.0;
    }
    let weight = match r.over_quota_weight {
        Some(w) if w.is_finite() && w >= 0.0 => w,
        Some(w) => {
            return Err(format!(
                "{}: {w} is not a number of at least 0",
                field("overQuotaWeight")
            ));
        }
        None => {
            notes.push(format!(
                "{resource}.overQuotaWeight not given: written as Tessera's default 1 (KAI reads 0: no share over quota)"
            ));
            1.0
        }
    };
    let limit = match r.limit {
        None => {
            notes.push(format!(
                "{resource}.limit not given: written as no limit (KAI documents an unset limit as no resources beyond the quota; set limit to the quota for that)"
            ));
            None
        }
        Some(l) => match amount(&field("limit"), l)? {
            -1.0 => None,
            0.0 => {
                notes.push(format!(
                    "{resource}.limit 0 (KAI: nothing beyond the quota) written as limit = quota"
                ));
                Some(quota)
            }
            l if l < quota => {
                notes.push(format!(
                    "{resource}.limit {l} is below its quota {quota}; Tessera requires limit >= quota, so the limit is the quota"
                ));
                Some(quota)
            }
            l => Some(l),
        },
    };
    Ok(Some(Carried {
        quota,
        weight,
        limit,
    }))
}

/// KAI millicores as a quantity: whole cores when exact, else millicores.
fn cpu_quantity(milli: f64) -> String {
    let m = milli.round() as u64;
    if m.is_multiple_of(1000) {
        (m / 1000).to_string()
    } else {
        format!("{m}m")
    }
}

/// KAI megabytes (10^6 bytes) as a quantity.
fn memory_quantity(mb: f64) -> String {
    if mb.fract() == 0.0 {
        format!("{}M", mb as u64)
    } else {
        ((mb * 1e6).round() as u64).to_string()
    }
}

fn quantity_quota(c: Carried, unit: fn(f64) -> String) -> QuantityQuota {
    QuantityQuota {
        quota: (c.quota > 0.0).then(|| QuantityValue(unit(c.quota))),
        over_quota_weight: c.weight,
        limit: c.limit.map(|l| QuantityValue(unit(l))),
    }
}

fn queue(doc: &Document) -> Output {
    let name = name_of(&doc.value);
    let mut out = Output {
        what: format!("Queue {name}"),
        origin: doc.origin.clone(),
        notes: Vec::new(),
        object: None,
    };
    let spec = queue_spec(&doc.value, &mut out.notes);
    set_object(&mut out, doc, "Queue", spec);
    out
}

/// Gives `out` the Tessera object of `kind` with `spec` and the KAI object's name, namespace,
/// labels and annotations (less KAI's own), or the note of why it is not translated.
fn set_object<S: serde::Serialize>(
    out: &mut Output,
    doc: &Document,
    kind: &str,
    spec: Result<S, String>,
) {
    match spec {
        Ok(spec) => {
            let mut object = json!({
                "apiVersion": "tessera.dev/v1alpha1",
                "kind": kind,
                "metadata": kept_metadata(&doc.value),
                "spec": spec,
            });
            drop_kai_keys(&mut object);
            out.object = Some(object);
        }
        Err(e) => out.notes.push(format!("not translated: {e}")),
    }
}

fn queue_spec(value: &Value, notes: &mut Vec<String>) -> Result<QueueSpec, String> {
    let kai: KaiQueueSpec = spec_of(value)?;
    if let Some(d) = kai.display_name.as_deref().filter(|d| !d.is_empty()) {
        notes.push(format!(
            "displayName {d:?} does not carry over (a Tessera Queue is known by its name)"
        ));
    }
    for (field, v) in [
        ("preemptMinRuntime", &kai.preempt_min_runtime),
        ("reclaimMinRuntime", &kai.reclaim_min_runtime),
    ] {
        if let Some(v) = v {
            notes.push(format!(
                "{field} {v} does not carry over: Tessera has no minimum runtime before preemption or reclaim"
            ));
        }
    }
    let priority = kai.priority.unwrap_or(KAI_DEFAULT_PRIORITY);
    if kai.priority.is_none() {
        notes.push(format!(
            "priority not given: written as KAI's default {KAI_DEFAULT_PRIORITY}, so siblings keep their order"
        ));
    }
    let priority = i32::try_from(priority)
        .map_err(|_| format!("spec.priority: {priority} is not a 32-bit whole number"))?;
    let resources = kai.resources.unwrap_or_default();
    let gpu = carry("gpu", resources.gpu.as_ref(), notes)?.map(|c| GpuQuota {
        quota: c.quota,
        over_quota_weight: c.weight,
        limit: c.limit.unwrap_or(-1.0),
        // KAI has no per-model quota.
        models: Vec::new(),
    });
    let cpu = carry("cpu", resources.cpu.as_ref(), notes)?.map(|c| quantity_quota(c, cpu_quantity));
    let memory = carry("memory", resources.memory.as_ref(), notes)?
        .map(|c| quantity_quota(c, memory_quantity));
    Ok(QueueSpec {
        parent: kai.parent_queue.filter(|p| !p.is_empty()),
        priority,
        gpu,
        cpu,
        memory,
        ..QueueSpec::default()
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KaiTopology {
    topology: Option<String>,
    required_topology_level: Option<String>,
    preferred_topology_level: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KaiSubGroup {
    name: String,
    min_member: Option<i64>,
    parent: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KaiPodGroupSpec {
    min_member: Option<i64>,
    queue: Option<String>,
    priority_class_name: Option<String>,
    preemptibility: Option<String>,
    parallelism: Option<i64>,
    completions: Option<i64>,
    backoff_limit: Option<i64>,
    mark_unschedulable: Option<bool>,
    scheduling_backoff: Option<i64>,
    topology_constraint: Option<KaiTopology>,
    // KAI's CRD spells it `subGroups`; its documentation's examples `subgroups`.
    #[serde(alias = "subgroups")]
    sub_groups: Option<Vec<KaiSubGroup>>,
}

fn pod_group(doc: &Document) -> Output {
    let name = name_of(&doc.value);
    let mut out = Output {
        what: format!("PodGroup {name}"),
        origin: doc.origin.clone(),
        notes: Vec::new(),
        object: None,
    };
    let owner = doc
        .value
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|o| {
            o.iter()
                .find(|r| r.get("controller") == Some(&Value::Bool(true)))
        })
        .map(|r| {
            (
                r.get("kind").and_then(Value::as_str).unwrap_or("?"),
                r.get("name").and_then(Value::as_str).unwrap_or("?"),
            )
        });
    if let Some((kind, owner)) = owner {
        out.notes.push(format!(
            "made by KAI's pod grouper for {kind} {owner}: not written; Tessera groups that owner's pods itself (all pods of a Job, JobSet or *Job start together) or, for other kinds, places them one by one; give the pods tessera.dev/pod-group and a Tessera PodGroup for a different gang"
        ));
        return out;
    }
    let spec = pod_group_spec(&doc.value, &mut out.notes);
    set_object(&mut out, doc, "PodGroup", spec);
    out
}

fn pod_group_spec(value: &Value, notes: &mut Vec<String>) -> Result<PodGroupSpec, String> {
    let kai: KaiPodGroupSpec = spec_of(value)?;
    let subgroups = kai.sub_groups.unwrap_or_default();
    let parents: std::collections::HashSet<&str> = subgroups
        .iter()
        .filter_map(|s| s.parent.as_deref())
        .collect();
    let leaf_sum = subgroups
        .iter()
        .filter(|s| !parents.contains(s.name.as_str()))
        .map(|s| s.min_member.unwrap_or(1).max(1))
        .fold(0i64, i64::saturating_add);
    let min_member = match kai.min_member {
        Some(m) if m >= 1 => m,
        Some(m) => {
            return Err(format!(
                "spec.minMember: {m} is not a whole number of at least 1"
            ));
        }
        None if !subgroups.is_empty() => leaf_sum,
        None => 1,
    };
    if !subgroups.is_empty() {
        let names: Vec<&str> = subgroups.iter().map(|s| s.name.as_str()).collect();
        notes.push(format!(
            "subGroups {names:?} do not carry over: a Tessera gang is one level, so minMember is {min_member} for the whole group (the leaf subgroups' minMember summed when the group gives none) and per-subgroup topology is dropped; pods' {KAI_SUBGROUP_LABEL} labels are ignored"
        ));
    }
    let min_member = i32::try_from(min_member)
        .map_err(|_| format!("spec.minMember: {min_member} is too large"))?;
    if let Some(p) = &kai.preemptibility {
        match p.as_str() {
            "preemptible" | "non-preemptible" => notes.push(format!(
                "preemptibility {p}: label the group's pods {}: \"{}\" (a Tessera PodGroup has no such field; without the label, priority below {} is preemptible)",
                keys::PREEMPTIBLE,
                p == "preemptible",
                keys::PREEMPTIBLE_BELOW_PRIORITY
            )),
            other => {
                return Err(format!(
                    "spec.preemptibility: {other:?} is not \"preemptible\" or \"non-preemptible\""
                ));
            }
        }
    }
    for (field, set) in [
        ("parallelism", kai.parallelism.is_some()),
        ("completions", kai.completions.is_some()),
        ("backoffLimit", kai.backoff_limit.is_some()),
        ("markUnschedulable", kai.mark_unschedulable.is_some()),
        ("schedulingBackoff", kai.scheduling_backoff.is_some()),
    ] {
        if set {
            notes.push(format!("{field} does not carry over (Tessera keeps retrying a gang that does not fit, and reports why on its pods)"));
        }
    }
    let topology = kai.topology_constraint.unwrap_or_default();
    if let Some(t) = topology.topology.as_deref().filter(|t| !t.is_empty()) {
        notes.push(format!(
            "topology {t:?}: Tessera uses one Topology object (named default); its levels must list the node labels below"
        ));
    }
    let required = topology.required_topology_level.filter(|l| !l.is_empty());
    let preferred = topology.preferred_topology_level.filter(|l| !l.is_empty());
    for level in required.iter().chain(preferred.iter()) {
        notes.push(format!(
            "topology level {level:?} is KAI's node label: Tessera accepts a label key of a level of its Topology, or the level's name"
        ));
    }
    Ok(PodGroupSpec {
        min_member,
        queue: kai.queue.filter(|q| !q.is_empty()),
        priority_class_name: kai.priority_class_name.filter(|p| !p.is_empty()),
        topology: (required.is_some() || preferred.is_some()).then_some(GroupTopology {
            required,
            preferred,
        }),
        ..PodGroupSpec::default()
    })
}

/// Removes KAI's own bookkeeping from a translated object's metadata (labels and
/// annotations under `scheduling.run.ai/` and `kai.scheduler/`).
fn drop_kai_keys(object: &mut Value) {
    for field in ["labels", "annotations"] {
        if let Some(map) = object
            .pointer_mut(&format!("/metadata/{field}"))
            .and_then(Value::as_object_mut)
        {
            map.retain(|k, _| {
                !k.starts_with("scheduling.run.ai/") && !k.starts_with("kai.scheduler/")
            });
        }
    }
}

/// Any other document: its pods and pod templates rewritten to Tessera's names; returned
/// unchanged (with a note) when nothing in it is KAI's.
fn workload(doc: &Document, kind: &str) -> Output {
    let kind = if kind.is_empty() { "object" } else { kind };
    let name = name_of(&doc.value);
    let mut object = doc.value.clone();
    // The top owner's queue and priority labels: KAI reads them from the owner, Tessera from
    // each pod.
    let top_labels: BTreeMap<String, String> = doc
        .value
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let mut notes = Vec::new();
    let mut templates = 0;
    rewrite_templates(&mut object, &top_labels, "", &mut notes, &mut templates);
    let is_template_owner = kind != "Pod" && templates > 0;
    if is_template_owner {
        relabel_owner(&mut object, &mut notes);
        if keys_implied_gang(kind) {
            notes.push(format!(
                "the {kind}'s pods form one gang without any object (Tessera implies the group from the owner)"
            ));
        }
    }
    if notes.is_empty() {
        notes.push("nothing of KAI's in it: unchanged".to_owned());
    }
    Output {
        what: format!("{kind} {name}"),
        origin: doc.origin.clone(),
        notes,
        object: Some(object),
    }
}

fn keys_implied_gang(kind: &str) -> bool {
    crate::translate::pod::is_gang_owner_kind(kind)
}

/// The owner's own KAI queue label, renamed.
fn relabel_owner(object: &mut Value, notes: &mut Vec<String>) {
    if let Some(labels) = object
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
        && let Some(q) = labels.remove(keys::QUEUE_ALIAS)
    {
        labels.entry(keys::QUEUE.to_owned()).or_insert(q);
        notes.push(format!(
            "{} on the owner renamed {} (and copied onto its pod templates, where Tessera reads it)",
            keys::QUEUE_ALIAS,
            keys::QUEUE
        ));
    }
}

/// Finds every pod (`spec.containers`) under `value` and rewrites it; `path` names where.
fn rewrite_templates(
    value: &mut Value,
    top_labels: &BTreeMap<String, String>,
    path: &str,
    notes: &mut Vec<String>,
    found: &mut usize,
) {
    let Some(map) = value.as_object_mut() else {
        if let Some(items) = value.as_array_mut() {
            for (i, item) in items.iter_mut().enumerate() {
                rewrite_templates(item, top_labels, &format!("{path}[{i}]"), notes, found);
            }
        }
        return;
    };
    let is_pod = map
        .get("spec")
        .and_then(|s| s.get("containers"))
        .is_some_and(Value::is_array);
    if is_pod {
        *found += 1;
        let at = if path.is_empty() {
            String::new()
        } else {
            format!("{}: ", path.trim_start_matches('.'))
        };
        rewrite_pod(map, top_labels, &at, notes);
        return;
    }
    for (k, v) in map.iter_mut() {
        if k == "metadata" || k == "status" {
            continue;
        }
        rewrite_templates(v, top_labels, &format!("{path}.{k}"), notes, found);
    }
}

/// What a pod's metadata says about its spec.
#[derive(Default)]
struct FromMetadata {
    /// KAI's `priorityClassName` label (the pod's, else its owner's).
    priority: Option<Value>,
    /// Whether the pod asks for a GPU share (fraction or memory).
    share: bool,
    /// `gpu-fraction-num-devices`.
    devices: Option<Value>,
    /// `gpu-fraction-container-name`.
    container: Option<String>,
}

/// Rewrites one pod (or pod template): scheduler name, queue label, priority label, share
/// annotations, pod group annotation, and the `nvidia.com/gpu` limit a fraction needs.
fn rewrite_pod(
    pod: &mut Map<String, Value>,
    top_labels: &BTreeMap<String, String>,
    at: &str,
    notes: &mut Vec<String>,
) {
    let from = match pod
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        Some(meta) => rewrite_metadata(meta, top_labels, at, notes),
        None => FromMetadata::default(),
    };
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("schedulerName").and_then(Value::as_str) == Some(KAI_SCHEDULER) {
        spec.insert("schedulerName".into(), json!("tessera"));
        notes.push(format!("{at}schedulerName {KAI_SCHEDULER} → tessera"));
    }
    if let Some(p) = from.priority {
        if spec.get("priorityClassName").is_none() {
            spec.insert("priorityClassName".into(), p.clone());
        }
        notes.push(format!(
            "{at}label {KAI_PRIORITY_LABEL} {p} → spec.priorityClassName (Tessera reads the pod's field)"
        ));
    }
    if from.share {
        add_gpu_limit(spec, from.devices, from.container.as_deref(), at, notes);
    }
}

fn rewrite_metadata(
    meta: &mut Map<String, Value>,
    top_labels: &BTreeMap<String, String>,
    at: &str,
    notes: &mut Vec<String>,
) -> FromMetadata {
    let mut from = FromMetadata::default();
    if let Some(labels) = meta
        .entry("labels")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        if let Some(q) = labels.remove(keys::QUEUE_ALIAS) {
            labels.entry(keys::QUEUE.to_owned()).or_insert(q);
            notes.push(format!("{at}label {} → {}", keys::QUEUE_ALIAS, keys::QUEUE));
        } else if !labels.contains_key(keys::QUEUE)
            && let Some(q) = top_labels.get(keys::QUEUE_ALIAS)
        {
            labels.insert(keys::QUEUE.to_owned(), json!(q));
        }
        from.priority = labels
            .remove(KAI_PRIORITY_LABEL)
            .or_else(|| top_labels.get(KAI_PRIORITY_LABEL).map(|p| json!(p)));
        labels.remove(KAI_SUBGROUP_LABEL);
    }
    if let Some(a) = meta
        .entry("annotations")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        for (alias, key) in [
            (keys::GPU_FRACTION_ALIAS, keys::GPU_FRACTION),
            (keys::POD_GROUP_ALIAS, keys::POD_GROUP),
        ] {
            if let Some(v) = a.remove(alias) {
                notes.push(format!("{at}annotation {alias} → {key}"));
                a.entry(key.to_owned()).or_insert(v);
            }
        }
        if let Some(v) = a.remove(keys::GPU_MEMORY_ALIAS) {
            // KAI's gpu-memory is MiB; Tessera reads a plain number the same way, and the
            // unit is written so the value says what it is.
            let text = v.as_str().map(str::trim).unwrap_or("");
            let new = if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
                json!(format!("{text}Mi"))
            } else {
                v
            };
            notes.push(format!(
                "{at}annotation {} → {}",
                keys::GPU_MEMORY_ALIAS,
                keys::GPU_MEMORY
            ));
            a.entry(keys::GPU_MEMORY.to_owned()).or_insert(new);
        }
        from.share = a.contains_key(keys::GPU_FRACTION) || a.contains_key(keys::GPU_MEMORY);
        from.devices = a.remove(keys::GPU_FRACTION_NUM_DEVICES_ALIAS);
        from.container = a
            .remove(KAI_FRACTION_CONTAINER)
            .and_then(|v| v.as_str().map(str::to_owned));
    }
    for field in ["labels", "annotations"] {
        if meta
            .get(field)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            meta.remove(field);
        }
    }
    from
}

/// Gives a fractional pod's container the `nvidia.com/gpu` limit the kubelet needs to call
/// the device plugin (KAI gives a fraction to a container without one).
fn add_gpu_limit(
    spec: &mut Map<String, Value>,
    devices: Option<Value>,
    container: Option<&str>,
    at: &str,
    notes: &mut Vec<String>,
) {
    let count = devices
        .as_ref()
        .and_then(|d| match d {
            Value::String(s) => s.trim().parse::<u32>().ok(),
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        })
        .filter(|n| *n >= 1)
        .unwrap_or(1);
    let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) else {
        return;
    };
    let has_limit = |c: &Value| {
        c.pointer(&format!(
            "/resources/limits/{}",
            keys::GPU_RESOURCE.replace('/', "~1")
        ))
        .is_some()
    };
    if containers.iter().any(has_limit) {
        return;
    }
    let index = container
        .and_then(|n| {
            containers
                .iter()
                .position(|c| c.get("name").and_then(Value::as_str) == Some(n))
        })
        .unwrap_or(0);
    let Some(c) = containers.get_mut(index).and_then(Value::as_object_mut) else {
        return;
    };
    let cname = c
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let resources = c.entry("resources").or_insert_with(|| json!({}));
    if let Some(r) = resources.as_object_mut() {
        let limits = r.entry("limits").or_insert_with(|| json!({}));
        if let Some(l) = limits.as_object_mut() {
            l.insert(keys::GPU_RESOURCE.to_owned(), json!(count.to_string()));
            notes.push(format!(
                "{at}container {cname}: {}: \"{count}\" added; Tessera's GPUs reach a container through the device plugin, which the kubelet calls only for containers that ask for {}",
                keys::GPU_RESOURCE,
                keys::GPU_RESOURCE
            ));
        }
    }
}
