//! The `Queue` custom resource (cluster-scoped): one node of the hierarchical fair-share tree,
//! and which namespaces may submit pods to it.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::Condition;
use crate::quantity::{QuantityValue, format_mib, format_milli};

/// Spec of a Queue: its place in the hierarchy and its share of each resource.
#[allow(clippy::duplicated_attributes)] // kube-derive repeats `type_` per printer column by design.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "Queue",
    plural = "queues",
    shortname = "tq",
    category = "tessera",
    status = "QueueStatus",
    derive = "PartialEq",
    doc = "A Tessera queue: deserved quota, over-quota weight and limit per resource; any depth of hierarchy, only leaves take pods.",
    printcolumn(name = "Parent", type_ = "string", json_path = ".spec.parent"),
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(name = "GPU-Quota", type_ = "number", json_path = ".spec.gpu.quota"),
    printcolumn(
        name = "GPU-Allocated",
        type_ = "number",
        json_path = ".status.allocated.gpu"
    ),
    printcolumn(
        name = "GPU-FairShare",
        type_ = "number",
        json_path = ".status.fairShare.gpu"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// Parent queue name; absent = a top-level queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Higher-priority siblings receive quota and over-quota share first.
    #[serde(default)]
    pub priority: i32,
    /// GPU settings, in GPUs (fractions allowed, e.g. 0.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuQuota>,
    /// CPU settings, as quantities (`32`, `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<QuantityQuota>,
    /// Memory settings, as quantities (`64Gi`, `4096Mi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<QuantityQuota>,
    /// Namespaces whose pods may use this queue, by name. A namespace this list or
    /// `namespaceSelector` admits may submit; a queue with neither admits every namespace,
    /// an empty list alone admits none. A parent's rule also binds its descendants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 1024),
        inner(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    )]
    pub namespaces: Option<Vec<String>>,
    /// Namespaces whose labels match may use this queue (as `metav1.LabelSelector`: `{}`
    /// matches every namespace). See `namespaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
}

/// A label selector on namespaces, spelt as `metav1.LabelSelector`: every `matchLabels` entry
/// and every `matchExpressions` requirement must hold; an empty selector matches every
/// namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelector {
    /// Label key → value a namespace must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    // Keys and values are checked by `validate::queue`, not here: a CEL rule on a map's keys
    // cannot be bounded in cost (a key has no maxLength), so the API server refuses one.
    #[schemars(extend("maxProperties" = 64))]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on a namespace's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One requirement of a namespace selector, as `metav1.LabelSelectorRequirement`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.operator in ['In', 'NotIn'] ? size(self.values) > 0 : size(self.values) == 0",
    "message": "values must list at least one value for operator In or NotIn, and none for Exists or DoesNotExist"
}]))]
pub struct SelectorRequirement {
    /// The label key (`team`, `example.com/tier`).
    #[schemars(length(min = 1, max = 317), pattern(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"))]
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    #[schemars(extend("enum" = ["In", "NotIn", "Exists", "DoesNotExist"]))]
    pub operator: String,
    /// The values `In` and `NotIn` compare with; empty for `Exists` and `DoesNotExist`.
    #[serde(default)]
    #[schemars(
        length(max = 256),
        inner(
            length(max = 63),
            pattern(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
        )
    )]
    pub values: Vec<String>,
}

fn one() -> f64 {
    1.0
}

fn minus_one() -> f64 {
    -1.0
}

/// GPU quota settings (numbers of GPUs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.limit) || !has(self.quota) || self.limit < 0.0 || self.limit >= self.quota",
    "message": "gpu.limit must be -1 (no limit) or at least gpu.quota"
}]))]
pub struct GpuQuota {
    /// Deserved GPUs, granted before any over-quota share (0 or more).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub quota: f64,
    /// Weight for sharing what remains after every queue's deserved quota (0 or more).
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub over_quota_weight: f64,
    /// Hard cap in GPUs; -1 = no limit.
    #[serde(default = "minus_one")]
    #[schemars(range(min = -1))]
    pub limit: f64,
    /// Quota, over-quota weight and limit per GPU model, besides the totals above: fair
    /// share and reclaim respect both. A model not listed has quota 0, this queue's
    /// `overQuotaWeight` and no limit of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["model"]))]
    pub models: Vec<GpuModelQuota>,
}

impl Default for GpuQuota {
    fn default() -> Self {
        GpuQuota {
            quota: 0.0,
            over_quota_weight: 1.0,
            limit: -1.0,
            models: Vec::new(),
        }
    }
}

/// GPU quota settings of one GPU model (numbers of GPUs of that model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.limit) || !has(self.quota) || self.limit < 0.0 || self.limit >= self.quota",
    "message": "gpu.models[].limit must be -1 (no limit) or at least the model's quota"
}]))]
pub struct GpuModelQuota {
    /// The GPU model: the node agent's model name with every character a label value cannot
    /// hold replaced by `-`, as `nvidia.com/gpu.product` spells it (`NVIDIA-H100-80GB-HBM3`).
    #[schemars(
        length(min = 1, max = 63),
        extend("x-kubernetes-validations" = [{
            "rule": "self.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')",
            "message": "must be a GPU model as nvidia.com/gpu.product spells it: 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, e.g. NVIDIA-H100-80GB-HBM3"
        }])
    )]
    pub model: String,
    /// Deserved GPUs of this model, granted before any over-quota share (0 or more).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub quota: f64,
    /// Weight for sharing this model's GPUs beyond every queue's quota of it (0 or more);
    /// absent: the queue's `gpu.overQuotaWeight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub over_quota_weight: Option<f64>,
    /// Hard cap in GPUs of this model; -1 = no limit.
    #[serde(default = "minus_one")]
    #[schemars(range(min = -1))]
    pub limit: f64,
}

impl Default for GpuModelQuota {
    fn default() -> Self {
        GpuModelQuota {
            model: String::new(),
            quota: 0.0,
            over_quota_weight: None,
            limit: -1.0,
        }
    }
}

/// CPU or memory quota settings (Kubernetes quantities).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuantityQuota {
    /// Deserved amount (`32`, `500m`, `64Gi`); absent = 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuantityValue>,
    /// Weight for sharing what remains after every queue's deserved quota (0 or more).
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub over_quota_weight: f64,
    /// Hard cap as a quantity; -1 or absent = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<QuantityValue>,
}

impl Default for QuantityQuota {
    fn default() -> Self {
        QuantityQuota {
            quota: None,
            over_quota_weight: 1.0,
            limit: None,
        }
    }
}

/// Amounts of each resource, as the status reports them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceAmounts {
    /// GPUs (fractional).
    #[serde(default)]
    pub gpu: f64,
    /// CPU as a quantity (`1500m`).
    #[serde(default)]
    pub cpu: String,
    /// Memory as a quantity (`64Gi`).
    #[serde(default)]
    pub memory: String,
}

impl ResourceAmounts {
    /// From the scheduler's accounting units: milli-GPU, milli-cores, MiB.
    pub fn from_units(gpu_milli: f64, cpu_milli: u64, memory_mib: u64) -> ResourceAmounts {
        ResourceAmounts {
            // Three decimals are all the precision milli-GPU accounting has.
            gpu: (gpu_milli).round() / 1000.0,
            cpu: format_milli(cpu_milli),
            memory: format_mib(memory_mib),
        }
    }
}

/// What the coordinator observed about a queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Resources held by the queue's running pods (this queue and its descendants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<ResourceAmounts>,
    /// Resources the queue's pods ask for (running plus pending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<ResourceAmounts>,
    /// The fair share the scheduler computed in the last cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<ResourceAmounts>,
    /// Per GPU model the queue's quotas name: GPUs allocated, requested and the fair share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub gpu_models: Vec<GpuModelAmounts>,
    /// Recent usage, decayed with the coordinator's half-life (`--usage-half-life-secs`);
    /// absent while usage history is off. Kept here so a restarted or new leader goes on
    /// from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<QueueUsage>,
    /// Conditions (`Valid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One GPU model's amounts of a queue, in GPUs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuModelAmounts {
    /// The model key (`spec.gpu.models[].model`).
    pub model: String,
    /// GPUs of this model held by the queue's running pods.
    #[serde(default)]
    pub allocated: f64,
    /// GPUs of this model the queue's pods could use (running plus pending that may land on
    /// it), capped by the limits.
    #[serde(default)]
    pub requested: f64,
    /// The queue's fair share of this model.
    #[serde(default)]
    pub fair_share: f64,
}

/// A queue's decayed usage: resource-seconds, each second weighted by one half per half-life
/// since, as of `updatedAt`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueUsage {
    /// Decayed GPU-seconds.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub gpu_seconds: f64,
    /// Decayed CPU core-seconds.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub cpu_seconds: f64,
    /// Decayed memory GiB-seconds.
    #[serde(default, rename = "memoryGiBSeconds")]
    #[schemars(range(min = 0))]
    pub memory_gib_seconds: f64,
    /// When the amounts were last advanced (RFC 3339).
    pub updated_at: String,
}
