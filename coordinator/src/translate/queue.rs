//! Queue CRD → the core's queue, in accounting units: GPUs, milli-cores, MiB (per GPU model
//! too); its usage history to and from its status; and which namespaces may submit to each
//! queue ([`Tenancy`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector as KubeSelector, LabelSelectorRequirement as KubeRequirement,
};

use crate::crd::quantity::{QuantityValue, Round};
use crate::crd::{
    NamespaceSelector, QuantityQuota, Queue as QueueCrd, QueueSpec, QueueUsage as UsageStatus,
};
use tessera_contract::gpu_model;
use tessera_core::constraints::labels;
use tessera_core::model::{LabelSelector, ModelQuota, Queue, QueueResource, QueueUsage};

/// Translates a Queue object. Malformed values (negative quota or weight, unreadable
/// quantities) are reported by [`crate::crd::validate::queue`]; here they fall back to the safe
/// reading: negative → 0, unreadable quota → 0, unreadable or negative limit → none.
pub fn translate(q: &QueueCrd) -> Queue {
    let s = &q.spec;
    let gpu = s
        .gpu
        .as_ref()
        .map(|g| QueueResource {
            quota: non_negative(g.quota),
            over_quota_weight: non_negative(g.over_quota_weight),
            limit: if g.limit.is_finite() && g.limit >= 0.0 {
                g.limit
            } else {
                -1.0
            },
        })
        .unwrap_or_default();
    let gpu_models = s
        .gpu
        .as_ref()
        .map(|g| {
            g.models
                .iter()
                // A malformed key (refused by the CRD's schema, reported by validation) names
                // no GPU's model: it is left out rather than matched by accident.
                .filter(|m| gpu_model::is_valid_key(&m.model))
                .map(|m| ModelQuota {
                    model: m.model.clone(),
                    quota: non_negative(m.quota),
                    over_quota_weight: m.over_quota_weight.filter(|w| w.is_finite() && *w >= 0.0),
                    limit: if m.limit.is_finite() && m.limit >= 0.0 {
                        m.limit
                    } else {
                        -1.0
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    Queue {
        name: q.metadata.name.clone().unwrap_or_default(),
        parent: s.parent.clone().filter(|p| !p.is_empty()),
        priority: s.priority,
        gpu,
        cpu: quantities(s.cpu.as_ref(), |v| v.milli(Round::Down)),
        memory: quantities(s.memory.as_ref(), |v| v.mib(Round::Down)),
        gpu_models,
    }
}

/// A queue's usage history as its status keeps it (`status.usage`), in the core's units
/// (milli-GPU·s, milli-core·s, MiB·s); `None` without one, or with an `updatedAt` that is not
/// an RFC 3339 time. The core takes what the queue holds now as what it held since.
pub fn usage_of(q: &QueueCrd) -> Option<QueueUsage> {
    let u = q.status.as_ref()?.usage.as_ref()?;
    let at: jiff::Timestamp = u.updated_at.parse().ok()?;
    Some(QueueUsage {
        queue: q.metadata.name.clone()?,
        at: u64::try_from(at.as_second()).ok()?,
        used: [
            u.gpu_seconds * 1000.0,
            u.cpu_seconds * 1000.0,
            u.memory_gib_seconds * 1024.0,
        ],
        holding: None,
    })
}

/// The core's usage record as a Queue's `status.usage` ([`usage_of`]'s inverse, up to the
/// recorded holding, which the status does not keep).
pub fn usage_status(u: &QueueUsage) -> UsageStatus {
    let at = jiff::Timestamp::from_second(i64::try_from(u.at).unwrap_or(i64::MAX))
        .unwrap_or(jiff::Timestamp::MAX);
    UsageStatus {
        gpu_seconds: u.used[0] / 1000.0,
        cpu_seconds: u.used[1] / 1000.0,
        memory_gib_seconds: u.used[2] / 1024.0,
        updated_at: at.to_string(),
    }
}

fn non_negative(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 { v } else { 0.0 }
}

fn quantities(
    q: Option<&QuantityQuota>,
    unit: impl Fn(&crate::crd::quantity::Parsed) -> Option<i64>,
) -> QueueResource {
    let Some(q) = q else {
        return QueueResource::default();
    };
    let amount = |v: Option<&QuantityValue>| -> Option<i64> { unit(&v?.parse().ok()?) };
    QueueResource {
        quota: amount(q.quota.as_ref()).map_or(0.0, |v| v.max(0) as f64),
        over_quota_weight: non_negative(q.over_quota_weight),
        limit: match amount(q.limit.as_ref()) {
            Some(v) if v >= 0 => v as f64,
            _ => -1.0,
        },
    }
}

/// Which namespaces may submit pods to which queue (`spec.namespaces` and
/// `spec.namespaceSelector`, see [`crate::crd::QueueSpec`]): a namespace may use a queue when
/// the queue admits it and so does every queue above it. A queue with neither field admits
/// every namespace; so does a queue with no object (the implicit `default`). Built once per
/// snapshot from the queue objects and the cache's namespaces, so a pod's translation (and
/// the [`super::PodMemo`]) never depends on it.
pub struct Tenancy<'a> {
    queues: BTreeMap<&'a str, &'a QueueCrd>,
    /// Each namespace's labels; a namespace the cache has not seen has only the name label
    /// the API server gives every namespace.
    namespaces: BTreeMap<&'a str, &'a BTreeMap<String, String>>,
}

/// The label the API server sets on every namespace to its name.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

impl<'a> Tenancy<'a> {
    /// The rules of `queues`, judged on the labels of `namespaces`.
    pub fn new(queues: &[&'a QueueCrd], namespaces: &[&'a Namespace]) -> Tenancy<'a> {
        Tenancy {
            queues: queues
                .iter()
                .filter_map(|q| Some((q.metadata.name.as_deref()?, *q)))
                .collect(),
            namespaces: namespaces
                .iter()
                .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref()?)))
                .collect(),
        }
    }

    /// `None` when pods of `namespace` may use `queue`; otherwise why not, naming the queue,
    /// the namespace and the rule that leaves it out (the leaf's own, or an ancestor's).
    pub fn refusal(&self, queue: &str, namespace: &str) -> Option<String> {
        let fallback;
        let labels = match self.namespaces.get(namespace) {
            Some(l) => *l,
            None => {
                fallback = BTreeMap::from([(NAME_LABEL.to_string(), namespace.to_string())]);
                &fallback
            }
        };
        let mut current = queue;
        // A parent cycle (reported by validation) ends the walk after every queue once.
        for _ in 0..=self.queues.len() {
            // A queue without an object (the implicit default, or an unknown one the core
            // reports) admits everyone, and so ends the walk.
            let q = self.queues.get(current)?;
            if !admits(&q.spec, namespace, labels) {
                let rule = describe_rule(&q.spec);
                return Some(if current == queue {
                    format!(
                        "queue {queue:?} does not admit pods of namespace {namespace:?} (it admits {rule}); name a queue that admits namespace {namespace:?}"
                    )
                } else {
                    format!(
                        "queue {queue:?} does not admit pods of namespace {namespace:?}: its ancestor queue {current:?} admits only {rule}, and a queue takes pods only from namespaces every queue above it admits"
                    )
                });
            }
            match q.spec.parent.as_deref().filter(|p| !p.is_empty()) {
                Some(parent) => current = parent,
                None => return None,
            }
        }
        None
    }
}

/// Whether a queue's own rule admits namespace `name` with `labels`: no rule admits all;
/// otherwise the list or the selector must (a malformed selector matches nothing, as
/// Kubernetes treats one it cannot parse).
pub fn admits(spec: &QueueSpec, name: &str, labels: &BTreeMap<String, String>) -> bool {
    if spec.namespaces.is_none() && spec.namespace_selector.is_none() {
        return true;
    }
    let listed = spec
        .namespaces
        .as_ref()
        .is_some_and(|list| list.iter().any(|n| n == name));
    let selected = spec
        .namespace_selector
        .as_ref()
        .is_some_and(|sel| labels::selector_matches(model_selector(sel).as_ref(), labels));
    listed || selected
}

/// The core's form of a namespace selector, read as a pod's label selectors are
/// ([`super::constraints::label_selector`]); `None` (matches nothing) where it is malformed.
/// Its problems are `validate::queue`'s to report, so they are dropped here.
fn model_selector(sel: &NamespaceSelector) -> Option<LabelSelector> {
    let kube = KubeSelector {
        match_labels: Some(sel.match_labels.clone()),
        match_expressions: Some(
            sel.match_expressions
                .iter()
                .map(|r| KubeRequirement {
                    key: r.key.clone(),
                    operator: r.operator.clone(),
                    values: Some(r.values.clone()),
                })
                .collect(),
        ),
    };
    let mut reported_elsewhere = Vec::new();
    super::constraints::label_selector(
        Some(&kube),
        "spec.namespaceSelector",
        &mut reported_elsewhere,
    )
}

/// A queue's rule in words: `namespaces [a, b]`, `namespaces matching "team=ml"`, both joined
/// by "or", or `no namespace` for an empty list alone.
fn describe_rule(spec: &QueueSpec) -> String {
    let mut parts = Vec::new();
    if let Some(list) = spec.namespaces.as_ref().filter(|l| !l.is_empty()) {
        parts.push(format!("namespaces [{}]", list.join(", ")));
    }
    if let Some(sel) = &spec.namespace_selector {
        parts.push(format!("namespaces matching {:?}", selector_text(sel)));
    }
    if parts.is_empty() {
        return "no namespace".to_string();
    }
    parts.join(" or ")
}

/// A selector as `kubectl get -l` writes one: `team=ml,tier in (a,b),!gone`.
pub fn selector_text(sel: &NamespaceSelector) -> String {
    let mut terms: Vec<String> = sel
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for r in &sel.match_expressions {
        terms.push(match r.operator.as_str() {
            "In" => format!("{} in ({})", r.key, r.values.join(",")),
            "NotIn" => format!("{} notin ({})", r.key, r.values.join(",")),
            "Exists" => r.key.clone(),
            "DoesNotExist" => format!("!{}", r.key),
            other => format!("{} {other} ({})", r.key, r.values.join(",")),
        });
    }
    if terms.is_empty() {
        return "(every namespace)".to_string();
    }
    terms.join(",")
}
