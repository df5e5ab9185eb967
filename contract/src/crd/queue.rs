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
}

impl Default for GpuQuota {
    fn default() -> Self {
        GpuQuota {
            quota: 0.0,
            over_quota_weight: 1.0,
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
    /// Conditions (`Valid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
