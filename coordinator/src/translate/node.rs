//! Kubernetes Node (+ the GPUs its agent reported) → the core's node.

use k8s_openapi::api::core::v1::Node as KubeNode;

use crate::crd::quantity::{self, Round};
use crate::model::{Gpu, Node};

/// Taint keys that do not make a node unschedulable for Tessera: GPU nodes are commonly tainted
/// `nvidia.com/gpu:NoSchedule` so only GPU pods (which tolerate it) land there.
pub const DEFAULT_TOLERATED_TAINTS: &[&str] = &["nvidia.com/gpu"];

/// Translates `node`. `gpus` are the agent-reported GPUs (`None`: no agent has reported, so the
/// node offers no GPUs). A node is schedulable when it is not cordoned, its `Ready` condition is
/// `True`, and it has no `NoSchedule`/`NoExecute` taint other than `tolerated_taints`.
/// Unreadable allocatable quantities count as 0.
pub fn translate(node: &KubeNode, gpus: Option<Vec<Gpu>>, tolerated_taints: &[String]) -> Node {
    let status = node.status.as_ref();
    let alloc = status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
    let amount = |key: &str, f: fn(&quantity::Parsed) -> Option<i64>| -> u64 {
        alloc
            .and_then(|a| a.get(key))
            .and_then(|q| quantity::parse(&q.0).ok())
            .and_then(|p| f(&p))
            .map_or(0, |v| v.max(0) as u64)
    };
    let cpu_milli = amount("cpu", |p| p.milli(Round::Down));
    let memory_mib = amount("memory", |p| p.mib(Round::Down));
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter().any(|t| {
            (t.effect == "NoSchedule" || t.effect == "NoExecute")
                && !tolerated_taints.iter().any(|k| k == &t.key)
        })
    });
    Node {
        name: node.metadata.name.clone().unwrap_or_default(),
        cpu_milli,
        memory_mib,
        labels: node.metadata.labels.clone().unwrap_or_default(),
        gpus: gpus.unwrap_or_default(),
        schedulable: !cordoned && ready && !tainted,
        constraints: Default::default(),
    }
}
