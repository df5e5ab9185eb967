//! Which pods go to Tessera, and the JSON patch that sends them.
//!
//! A pod is routed when nothing else claimed it — no `spec.nodeName` (a pod bound at creation
//! bypasses every scheduler) and `spec.schedulerName` unset or `default-scheduler` — and it
//! either asks for `nvidia.com/gpu` in any container or init container, or carries a label
//! or annotation of Tessera's user contract (`tessera.dev/…`) or of KAI Scheduler's that
//! Tessera reads (`kai.scheduler/queue`, `gpu-fraction`, `gpu-memory`,
//! `gpu-fraction-num-devices`, `pod-group-name`). A pod naming another scheduler is left to
//! it: overriding an explicit choice would surprise its owner more than a Pending pod.

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use tessera_contract::keys;
use tessera_contract::pod::{allocation_order, container_gpus};

/// KAI Scheduler's annotations that Tessera reads as its own.
const KAI_ANNOTATIONS: [&str; 4] = [
    keys::GPU_FRACTION_ALIAS,
    keys::GPU_MEMORY_ALIAS,
    keys::GPU_FRACTION_NUM_DEVICES_ALIAS,
    keys::POD_GROUP_ALIAS,
];

/// What the webhook does with one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Left as it is.
    Keep,
    /// `spec.schedulerName` set to Tessera's; `why` is told to the client as a warning.
    ToTessera {
        /// Why, in the words `kubectl` prints after "Warning:".
        why: String,
    },
}

/// Whether `pod` goes to the scheduler named `scheduler_name`.
pub fn routing(pod: &Pod, scheduler_name: &str) -> Routing {
    let Some(spec) = pod.spec.as_ref() else {
        return Routing::Keep;
    };
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Routing::Keep;
    }
    match spec.scheduler_name.as_deref() {
        None | Some("") | Some(keys::DEFAULT_SCHEDULER) => {}
        Some(_) => return Routing::Keep,
    }
    let reason = gpu_container(spec).or_else(|| contract_key(pod));
    match reason {
        Some(reason) => Routing::ToTessera {
            why: format!(
                "spec.schedulerName set to {scheduler_name:?}: the pod {reason}, and on this cluster GPUs are shared by Tessera (label the namespace tessera.dev/webhook=disabled to opt out)"
            ),
        },
        None => Routing::Keep,
    }
}

/// The JSON patch (RFC 6902) that routes a pod to `scheduler_name`. `add` replaces an
/// existing member, so it holds whether the field is set or not.
pub fn patch(scheduler_name: &str) -> json_patch::Patch {
    json_patch::Patch(vec![json_patch::PatchOperation::Add(
        json_patch::AddOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["spec", "schedulerName"]),
            value: serde_json::Value::String(scheduler_name.to_owned()),
        },
    )])
}

/// "asks for nvidia.com/gpu in init container \"x\"" (or "container") for the first
/// container, in the kubelet's allocation order, that asks for GPUs as the contract counts them
/// (`container_gpus`: the limit, else the request). A count that is not a whole number also
/// routes the pod: Tessera then says what is wrong with it, where the default scheduler would
/// place it.
fn gpu_container(spec: &PodSpec) -> Option<String> {
    allocation_order(spec)
        .find(|c| container_gpus(c.container) != Ok(0))
        .map(|c| {
            let kind = if c.is_init() {
                "init container"
            } else {
                "container"
            };
            format!(
                "asks for {} in {kind} {:?}",
                keys::GPU_RESOURCE,
                c.container.name
            )
        })
}

/// "carries label …" or "carries annotation …" for the first contract key on the pod.
fn contract_key(pod: &Pod) -> Option<String> {
    let meta = &pod.metadata;
    let label = meta
        .labels
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .find(|k| k.starts_with(keys::PREFIX) || k.as_str() == keys::QUEUE_ALIAS)
        .map(|k| format!("carries label {k}"));
    label.or_else(|| {
        meta.annotations
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .find(|k| k.starts_with(keys::PREFIX) || KAI_ANNOTATIONS.contains(&k.as_str()))
            .map(|k| format!("carries annotation {k}"))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        let mut base = json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "x"}]},
        });
        json_patch::merge(&mut base, &value);
        serde_json::from_value(base).unwrap()
    }

    fn gpus(n: &str) -> serde_json::Value {
        json!({"resources": {"limits": {"nvidia.com/gpu": n}}})
    }

    fn routed(p: &Pod) -> bool {
        matches!(routing(p, "tessera"), Routing::ToTessera { .. })
    }

    #[test]
    fn a_default_scheduler_gpu_pod_is_routed() {
        let p = pod(json!({"spec": {"containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        ]}}));
        let Routing::ToTessera { why } = routing(&p, "tessera") else {
            panic!("routed");
        };
        assert!(
            why.starts_with(
                "spec.schedulerName set to \"tessera\": the pod asks for nvidia.com/gpu in container \"main\""
            ),
            "{why}"
        );
        let explicit = pod(
            json!({"spec": {"schedulerName": "default-scheduler", "containers": [
                {"name": "main", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "2"}}},
            ]}}),
        );
        assert!(routed(&explicit));
    }

    #[test]
    fn an_init_container_asking_for_gpus_routes_the_pod() {
        let mut init = json!({"name": "warmup", "image": "x"});
        json_patch::merge(&mut init, &gpus("1"));
        let p = pod(json!({"spec": {"initContainers": [init]}}));
        let Routing::ToTessera { why } = routing(&p, "tessera") else {
            panic!("routed");
        };
        assert!(why.contains("in init container \"warmup\""), "{why}");
    }

    /// The count is read as the contract reads it for both sides (the limit, else the
    /// request); one that is not a whole number still routes the pod, so that Tessera says
    /// what is wrong with it.
    #[test]
    fn gpus_are_counted_as_the_contract_counts_them() {
        let half = pod(json!({"spec": {"containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}},
        ]}}));
        assert!(routed(&half));
        let init_zero = pod(json!({"spec": {
            "initContainers": [{"name": "warmup", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "0"}}}],
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        }}));
        let Routing::ToTessera { why } = routing(&init_zero, "tessera") else {
            panic!("routed");
        };
        assert!(why.contains("in container \"main\""), "{why}");
    }

    #[test]
    fn contract_labels_and_kai_annotations_route_the_pod() {
        for meta in [
            json!({"labels": {"tessera.dev/queue": "team-a"}}),
            json!({"labels": {"kai.scheduler/queue": "team-a"}}),
            json!({"annotations": {"gpu-fraction": "0.5"}}),
            json!({"annotations": {"tessera.dev/gpu-memory": "20Gi"}}),
        ] {
            assert!(routed(&pod(json!({ "metadata": meta }))), "{meta}");
        }
    }

    #[test]
    fn other_pods_are_kept() {
        // No GPU, no contract key.
        assert_eq!(routing(&pod(json!({})), "tessera"), Routing::Keep);
        // A zero GPU limit asks for nothing.
        let zero = pod(json!({"spec": {"containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "0"}}},
        ]}}));
        assert_eq!(routing(&zero, "tessera"), Routing::Keep);
        // Another scheduler's choice stands, and a pod bound at creation has none to make.
        let gpu = json!([{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
        let volcano = pod(json!({"spec": {"schedulerName": "volcano", "containers": gpu}}));
        assert_eq!(routing(&volcano, "tessera"), Routing::Keep);
        let bound = pod(json!({"spec": {"nodeName": "n1", "containers": gpu}}));
        assert_eq!(routing(&bound, "tessera"), Routing::Keep);
        // Already Tessera's.
        let ours = pod(json!({"spec": {"schedulerName": "tessera", "containers": gpu}}));
        assert_eq!(routing(&ours, "tessera"), Routing::Keep);
        // Unrelated labels that merely look alike.
        let lookalike = pod(json!({"metadata": {"labels": {"example.com/tessera.dev": "x"}}}));
        assert_eq!(routing(&lookalike, "tessera"), Routing::Keep);
    }

    #[test]
    fn the_patch_sets_the_scheduler_name_whether_or_not_it_is_set() {
        for spec in [
            json!({"containers": []}),
            json!({"schedulerName": "default-scheduler", "containers": []}),
        ] {
            let mut doc = json!({ "spec": spec });
            json_patch::patch(&mut doc, &patch("tessera")).unwrap();
            assert_eq!(doc["spec"]["schedulerName"], "tessera");
        }
    }
}
