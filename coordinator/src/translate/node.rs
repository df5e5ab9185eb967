//! Kubernetes Node (+ the GPUs its agent reported) → the core's node: capacity, labels,
//! taints, pod limit and the allocatable resources other than CPU, memory and GPUs.
//!
//! Schedulability is kube-scheduler's: a cordoned node (`spec.unschedulable`) takes only pods
//! that tolerate `node.kubernetes.io/unschedulable:NoSchedule`, and every other exclusion is a
//! taint the pod must tolerate. kube-scheduler does not read the Ready condition; it relies on
//! the node lifecycle controller, which taints a node that is not ready. Where that controller
//! has not (yet) done so, the taint it would add is added here, so a cluster without it (or a
//! node that just turned not ready) behaves as a real one does moments later.

use k8s_openapi::api::core::v1::Node as KubeNode;

use super::requests;
use crate::crd::quantity::{self, Round};
use tessera_core::model::{Gpu, Node, NodeConstraints, Taint, TaintEffect};

/// Taint of a node whose Ready condition is False.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// Taint of a node whose Ready condition is Unknown (or missing).
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Translates `node`. `gpus` are the agent-reported GPUs (`None`: no agent has reported, so the
/// node offers no GPUs). Unreadable allocatable quantities count as 0; a taint with an effect
/// the API does not define (its validation refuses them) is left out.
pub fn translate(node: &KubeNode, gpus: Option<Vec<Gpu>>) -> Node {
    let status = node.status.as_ref();
    let alloc = status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
    let amount = |key: &str, f: fn(&quantity::Parsed) -> Option<i64>| -> Option<u64> {
        alloc
            .and_then(|a| a.get(key))
            .and_then(|q| quantity::parse(&q.0).ok())
            .and_then(|p| f(&p))
            .map(|v| v.max(0) as u64)
    };
    let cpu_milli = amount("cpu", |p| p.milli(Round::Down)).unwrap_or(0);
    let memory_mib = amount("memory", |p| p.mib(Round::Down)).unwrap_or(0);
    // kube-scheduler reads a missing `pods` allocatable as 0 ("Too many pods"); kubelets
    // always report it, so only a node that never posted its status takes no pod.
    let max_pods = Some(
        amount("pods", |p| p.scaled(1, 1, Round::Down))
            .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
    );
    let extended = alloc
        .into_iter()
        .flatten()
        .filter(|(name, _)| requests::is_extended(name))
        .map(|(name, q)| {
            let v = quantity::parse(&q.0)
                .ok()
                .and_then(|p| p.scaled(1, 1, Round::Down))
                .map_or(0, |v| v.max(0) as u64);
            (name.clone(), v)
        })
        .collect();

    let spec = node.spec.as_ref();
    let mut taints: Vec<Taint> = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some(Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: TaintEffect::parse(&t.effect)?,
            })
        })
        .collect();
    if let Some(key) = readiness_taint(node)
        && !taints
            .iter()
            .any(|t| t.key == NOT_READY_TAINT || t.key == UNREACHABLE_TAINT)
    {
        taints.push(Taint {
            key: key.to_string(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        });
    }
    Node {
        name: node.metadata.name.clone().unwrap_or_default(),
        cpu_milli,
        memory_mib,
        labels: node.metadata.labels.clone().unwrap_or_default(),
        gpus: gpus.unwrap_or_default(),
        schedulable: !spec.and_then(|s| s.unschedulable).unwrap_or(false),
        constraints: NodeConstraints {
            taints,
            max_pods,
            extended,
        },
    }
}

/// The taint the node lifecycle controller puts on a node that is not ready: `not-ready`
/// when Ready is False, `unreachable` when it is Unknown or missing; `None` when Ready.
fn readiness_taint(node: &KubeNode) -> Option<&'static str> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready.map(|c| c.status.as_str()) {
        Some("True") => None,
        Some("False") => Some(NOT_READY_TAINT),
        _ => Some(UNREACHABLE_TAINT),
    }
}
