//! Test pods and what the tests read off them.
//!
//! The user contract's names (`tessera.dev/...`, SPEC.md) are spelled out here on purpose
//! rather than taken from `tessera-contract`: the tests check the contract, not the constants
//! of the code under test.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use serde_json::{Map, Value, json};

/// `tessera.dev/gpu-fraction`: the share of one GPU a pod asks for.
pub const FRACTION: &str = "tessera.dev/gpu-fraction";
/// `tessera.dev/pod-group`: the PodGroup (gang) a pod belongs to.
pub const POD_GROUP: &str = "tessera.dev/pod-group";
/// `tessera.dev/queue`: the label naming a pod's leaf queue.
pub const QUEUE_LABEL: &str = "tessera.dev/queue";
/// `tessera.dev/assignment`: written by the coordinator, the exact GPUs, memory and compute
/// of each container; the agent allocates from it.
pub const ASSIGNMENT: &str = "tessera.dev/assignment";
/// The scheduler name Tessera's pods ask for.
pub const SCHEDULER: &str = "tessera";
/// The name of the GPU container of every pod built here.
pub const CONTAINER: &str = "main";

/// A pod for the tessera scheduler with one container (`main`), built up field by field.
#[derive(Clone, Debug)]
pub struct PodBuilder {
    name: String,
    namespace: String,
    gpus: u32,
    annotations: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    spec: Map<String, Value>,
}

/// A pod `name` in `default` for the tessera scheduler, asking for 100m CPU, 128 MiB and no
/// GPU yet.
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder {
        name: name.into(),
        namespace: "default".into(),
        gpus: 0,
        annotations: BTreeMap::new(),
        labels: BTreeMap::new(),
        spec: Map::new(),
    }
}

impl PodBuilder {
    /// The pod's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// In namespace `namespace` instead of `default`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// `nvidia.com/gpu: n` on the container (as a limit, which the API server copies to the
    /// request).
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus = n;
        self
    }

    /// One GPU, with `tessera.dev/gpu-fraction: <fraction>`.
    pub fn fraction(self, fraction: &str) -> Self {
        self.gpus(1).annotation(FRACTION, fraction)
    }

    /// Member of PodGroup `group`.
    pub fn group(self, group: &str) -> Self {
        self.annotation(POD_GROUP, group)
    }

    /// In leaf queue `queue`.
    pub fn queue(self, queue: &str) -> Self {
        self.label(QUEUE_LABEL, queue)
    }

    /// `spec.priorityClassName`.
    pub fn priority_class(self, class: &str) -> Self {
        self.spec_field("priorityClassName", json!(class))
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets a field of the pod's spec as the API spells it (`affinity`, `tolerations`,
    /// `schedulingGates`, `topologySpreadConstraints`, `schedulerName`, ...).
    pub fn spec_field(mut self, key: &str, value: Value) -> Self {
        self.spec.insert(key.into(), value);
        self
    }

    /// The pod as the API accepts it, with the builder's spec fields over the defaults.
    pub fn build(&self) -> Pod {
        let mut resources = json!({"requests": {"cpu": "100m", "memory": "128Mi"}});
        if self.gpus > 0 {
            resources["limits"] = json!({"nvidia.com/gpu": self.gpus.to_string()});
        }
        let mut spec = json!({
            "schedulerName": SCHEDULER,
            "containers": [{"name": CONTAINER, "image": "cuda", "resources": resources}],
        });
        if let Some(fields) = spec.as_object_mut() {
            fields.extend(self.spec.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": self.name, "namespace": self.namespace,
                "annotations": self.annotations, "labels": self.labels,
            },
            "spec": spec,
        }))
        .expect("a valid pod")
    }
}

/// `prefix-0` .. `prefix-{n-1}`.
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The node a pod is bound to, if it is.
pub fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// Whether the pod is bound to a node.
pub fn is_bound(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
}

/// Whether the pod runs: its kubelet admitted it, which for a GPU pod needs its device
/// plugin's Allocate.
pub fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The annotation `key` of the pod, if set.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// `(uuid, memory MiB, compute milli)` of each GPU in the pod's `tessera.dev/assignment`,
/// read from the JSON as the contract spells it. Panics when the pod has none.
pub fn slices(pod: &Pod) -> Vec<(String, u64, u64)> {
    let text = annotation(pod, ASSIGNMENT)
        .unwrap_or_else(|| panic!("{:?} has no assignment", pod.metadata.name));
    let a: Value = serde_json::from_str(text).expect("assignment JSON");
    a["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .flat_map(|c| c["gpus"].as_array().cloned().unwrap_or_default())
        .map(|g| {
            (
                g["uuid"].as_str().unwrap_or_default().to_owned(),
                g["memory_mib"].as_u64().unwrap_or(0),
                g["compute_milli"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// The message of a `PodScheduled=False, reason=Unschedulable` condition.
pub fn unschedulable_message(pod: &Pod) -> Option<String> {
    pod_scheduled_false(pod, "Unschedulable")
}

/// The message of a `PodScheduled=False` condition with `reason`.
pub fn pod_scheduled_false(pod: &Pod, reason: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some(reason)
        })
        .map(|c| c.message.clone().unwrap_or_default())
}

/// Events about pod `namespace/name`, as (reason, message); empty when they cannot be listed.
pub async fn events_of(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Vec<(String, String)> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// One line per pod in `namespace` (node, phase, scheduling condition, assignment), for
/// failure messages.
pub async fn describe_pods(client: &kube::Client, namespace: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = match pods.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => return format!("  (pods could not be listed: {e})\n"),
    };
    let mut out = String::new();
    for pod in list {
        let status = pod.status.clone().unwrap_or_default();
        let condition = status
            .conditions
            .clone()
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")
            .map(|c| {
                format!(
                    "{} {}",
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default()
                )
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "  pod {}: node={:?} phase={:?} {} {} scheduled={condition:?} assignment={}\n",
            pod.metadata.name.clone().unwrap_or_default(),
            node_of(&pod),
            status.phase,
            status.reason.unwrap_or_default(),
            status.message.unwrap_or_default(),
            annotation(&pod, ASSIGNMENT).unwrap_or_default(),
        ));
    }
    out
}
