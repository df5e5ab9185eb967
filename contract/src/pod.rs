//! What a pod object says to both sides of the contract: each container's GPU count as the
//! kubelet's device manager reads it, the order the kubelet allocates containers in, and
//! whether the pod has started or finished.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::keys::{ASSIGNED_AT, ASSIGNMENT, GPU_FRACTION, GPU_RESOURCE};

/// A container's `nvidia.com/gpu` quantity that is not a whole number of GPUs. The message
/// leaves out the field, which the caller names ([`SpecContainer::gpu_field`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a whole number of GPUs; use e.g. \"2\" (fractions go in {GPU_FRACTION})")]
pub struct GpuCountError {
    /// `limits` or `requests`: where the quantity was read.
    pub which: &'static str,
    /// The quantity as written.
    pub value: String,
}

/// Where `c`'s `nvidia.com/gpu` quantity is read from (`limits` or `requests`) and the
/// quantity; `None` when it asks for none. The limit is what the kubelet's device manager
/// allocates. The API server refuses an extended resource requested without a limit and
/// defaults the request to the limit, so the request is read only when there is no limit
/// (objects that never passed the API server, such as the simulator's).
pub fn gpu_quantity(c: &Container) -> Option<(&'static str, &Quantity)> {
    let resources = c.resources.as_ref();
    let limit = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|m| m.get(GPU_RESOURCE))
        .map(|q| ("limits", q));
    let request = || {
        resources
            .and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(GPU_RESOURCE))
            .map(|q| ("requests", q))
    };
    limit.or_else(request)
}

/// How many `nvidia.com/gpu` devices the kubelet allocates to `c` ([`gpu_quantity`]); 0
/// when it asks for none.
pub fn container_gpus(c: &Container) -> Result<u32, GpuCountError> {
    let Some((which, quantity)) = gpu_quantity(c) else {
        return Ok(0);
    };
    quantity.0.trim().parse().map_err(|_| GpuCountError {
        which,
        value: quantity.0.clone(),
    })
}

/// One container of a pod spec, with where it sits in the spec.
#[derive(Clone, Copy, Debug)]
pub struct SpecContainer<'a> {
    /// `initContainers` or `containers`.
    pub kind: &'static str,
    /// Its index in that list.
    pub index: usize,
    /// The container spec itself, for its name and resources.
    pub container: &'a Container,
}

impl SpecContainer<'_> {
    /// Whether it is an init container.
    pub fn is_init(&self) -> bool {
        self.kind == "initContainers"
    }

    /// The field path of its GPU quantity, for error messages.
    pub fn gpu_field(&self, which: &str) -> String {
        format!(
            "spec.{}[{}].resources.{which}.{GPU_RESOURCE}",
            self.kind, self.index
        )
    }
}

/// Every container of `spec` in the order the kubelet allocates their devices: init
/// containers first (their devices are handed on to the app containers), then the app
/// containers.
pub fn allocation_order(spec: &PodSpec) -> impl Iterator<Item = SpecContainer<'_>> {
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, container)| SpecContainer {
            kind: "initContainers",
            index,
            container,
        });
    let app = spec
        .containers
        .iter()
        .enumerate()
        .map(|(index, container)| SpecContainer {
            kind: "containers",
            index,
            container,
        });
    init.chain(app)
}

/// Whether the pod's containers are gone for good: it has finished. A pod that is only
/// terminating (`deletionTimestamp`) may still run during its grace period.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The `tessera.dev/assignment` text of a pod bound through Tessera's Binding: read only from a
/// bound pod that also carries `tessera.dev/assigned-at`, which the coordinator writes in the
/// same Binding and nothing else writes (the admission policy refuses both keys from anyone
/// but Tessera). A pod created already bound (`spec.nodeName`) with an assignment of its own
/// making has none, and is treated as any other scheduler's pod.
pub fn bound_assignment(pod: &Pod) -> Option<&str> {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let annotations = pod.metadata.annotations.as_ref()?;
    annotations.get(ASSIGNED_AT)?;
    annotations
        .get(ASSIGNMENT)
        .map(String::as_str)
        .filter(|_| bound)
}

/// Why the kubelet refuses a pod whose device allocation failed (the device manager's or the
/// topology manager's `Allocate` error): the pod's `status.reason` then.
pub const ADMISSION_ERROR_REASON: &str = "UnexpectedAdmissionError";

/// Whether the node refused `pod` at admission because allocating its devices failed: the
/// kubelet marks it `Failed` with reason [`ADMISSION_ERROR_REASON`].
pub fn refused_at_admission(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some(ADMISSION_ERROR_REASON)
    })
}

/// Whether some container of `pod` (init containers included) has started, or it runs:
/// the kubelet allocates every container's devices at admission, before any starts, so a
/// started pod's allocations are over.
pub fn has_started(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    let began = |statuses: &Option<Vec<ContainerStatus>>| {
        statuses.iter().flatten().any(|c| {
            c.state
                .as_ref()
                .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
        })
    };
    status.phase.as_deref() == Some("Running")
        || began(&status.init_container_statuses)
        || began(&status.container_statuses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_limit_counts_and_the_request_only_without_one() {
        let p = pod(serde_json::json!({"spec": {
        "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}},
            {"name": "side"},
            {"name": "sim", "resources": {"requests": {"nvidia.com/gpu": " 3 "}}},
            {"name": "bad", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}},
        ]}}));
        let spec = p.spec.as_ref().unwrap();
        let counts: Vec<(String, Result<u32, GpuCountError>)> = allocation_order(spec)
            .map(|c| (c.container.name.clone(), container_gpus(c.container)))
            .collect();
        assert_eq!(counts[0], ("warm".into(), Ok(1)));
        assert_eq!(counts[1], ("main".into(), Ok(2)));
        assert_eq!(counts[2], ("side".into(), Ok(0)));
        assert_eq!(counts[3], ("sim".into(), Ok(3)));
        let err = counts[4].1.clone().unwrap_err();
        assert_eq!(err.which, "limits");
        assert!(
            err.to_string()
                .contains("fractions go in tessera.dev/gpu-fraction")
        );
        let last = allocation_order(spec).last().unwrap();
        assert_eq!(
            last.gpu_field("limits"),
            "spec.containers[3].resources.limits.nvidia.com/gpu"
        );
    }

    #[test]
    fn started_means_running_or_any_container_ran_and_finished_means_a_final_phase() {
        let running = |state: serde_json::Value, field: &str| {
            pod(
                serde_json::json!({"status": {"phase": "Pending", field: [{"name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": state}]}}),
            )
        };
        assert!(!has_started(&pod(serde_json::json!({}))));
        assert!(!has_started(&running(
            serde_json::json!({"waiting": {}}),
            "containerStatuses"
        )));
        assert!(has_started(&running(
            serde_json::json!({"running": {}}),
            "initContainerStatuses"
        )));
        assert!(has_started(&running(
            serde_json::json!({"terminated": {"exitCode": 0}}),
            "containerStatuses"
        )));
        assert!(has_started(&pod(
            serde_json::json!({"status": {"phase": "Running"}})
        )));
        assert!(is_finished(&pod(
            serde_json::json!({"status": {"phase": "Failed"}})
        )));
        assert!(!is_finished(&pod(
            serde_json::json!({"status": {"phase": "Running"}})
        )));
    }

    #[test]
    fn an_assignment_counts_only_on_a_pod_bound_with_its_binding_time() {
        let bound = |annotations: serde_json::Value, node: &str| {
            pod(
                serde_json::json!({"metadata": {"annotations": annotations}, "spec": {"nodeName": node, "containers": []}}),
            )
        };
        let both = serde_json::json!({ASSIGNMENT: "{}", ASSIGNED_AT: "2026-01-01T00:00:00Z"});
        assert_eq!(bound_assignment(&bound(both.clone(), "n")), Some("{}"));
        // Made by its creator (no binding time), or not bound: none.
        assert_eq!(
            bound_assignment(&bound(serde_json::json!({ASSIGNMENT: "{}"}), "n")),
            None
        );
        assert_eq!(bound_assignment(&bound(both, "")), None);
        let refused = pod(
            serde_json::json!({"status": {"phase": "Failed", "reason": ADMISSION_ERROR_REASON}}),
        );
        assert!(refused_at_admission(&refused));
        let evicted = pod(serde_json::json!({"status": {"phase": "Failed", "reason": "Evicted"}}));
        assert!(!refused_at_admission(&evicted));
    }
}
