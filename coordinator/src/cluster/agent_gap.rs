//! What a pending GPU pod's message says about nodes whose agent reports nothing.
//!
//! The core sees only the GPUs agents report, so a node whose agent is missing, crashed or
//! refused looks to it like a node without GPUs, and its explanation ("the largest node has 0
//! healthy GPUs") hides the cause. A *GPU node* is a node the cluster itself says has GPUs:
//! labelled `nvidia.com/gpu.present=true` (NVIDIA's feature discovery; the agent DaemonSet's
//! default node selector) or advertising `nvidia.com/gpu` in its allocatable (a device plugin
//! registered with its kubelet). A GPU node from which no agent reports GPUs is named.

use k8s_openapi::api::core::v1::Node as KubeNode;
use tessera_core::model::Node;

use super::cache::Store;
use tessera_contract::keys::GPU_RESOURCE;

/// The label NVIDIA's GPU feature discovery puts on GPU nodes.
pub const GPU_PRESENT_LABEL: &str = "nvidia.com/gpu.present";

/// How many node names a message lists before it says "and N more".
const NAMES_SHOWN: usize = 5;

/// The missing-agent part of GPU pods' pending messages this cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentGap {
    /// Every agent reports: the core's explanation is the whole story.
    None,
    /// No node reports GPUs: that is the cause of every GPU pod's wait, said first.
    Everywhere(String),
    /// Some GPU nodes report no GPUs: their GPUs are missing from the core's count, said after
    /// its reason.
    Nodes(String),
}

impl AgentGap {
    /// The gap between what the cluster says has GPUs (`store`) and what agents report (the
    /// snapshot's `nodes`).
    pub fn of(store: &Store, nodes: &[Node]) -> AgentGap {
        if nodes.iter().all(|n| n.gpus.is_empty()) {
            return AgentGap::Everywhere(format!(
                "no tessera-agent is reporting GPUs from any of the {} nodes, so no GPU pod can be placed: check that the tessera-agent DaemonSet runs on the GPU nodes and reaches the coordinator (a refused agent logs why)",
                nodes.len()
            ));
        }
        let silent: Vec<&str> = nodes
            .iter()
            .filter(|n| n.gpus.is_empty())
            .filter(|n| store.nodes.get(&n.name).is_some_and(|k| is_gpu_node(k)))
            .map(|n| n.name.as_str())
            .collect();
        if silent.is_empty() {
            return AgentGap::None;
        }
        let mut names = silent
            .iter()
            .take(NAMES_SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if silent.len() > NAMES_SHOWN {
            names.push_str(&format!(" and {} more", silent.len() - NAMES_SHOWN));
        }
        let (count, verb) = match silent.len() {
            1 => ("1 GPU node".to_owned(), "its"),
            n => (format!("{n} GPU nodes"), "their"),
        };
        AgentGap::Nodes(format!(
            "no tessera-agent is reporting from {count} ({names}), so {verb} GPUs are not counted: check the tessera-agent pod there and its log"
        ))
    }

    /// `message` (the core's explanation for a pod asking for GPUs) with the gap said.
    pub fn explain(&self, message: &str) -> String {
        match self {
            AgentGap::None => message.to_owned(),
            AgentGap::Everywhere(hint) => format!("{hint} (scheduler: {message})"),
            AgentGap::Nodes(hint) => format!("{message}; {hint}"),
        }
    }
}

/// Whether the cluster says `node` has NVIDIA GPUs, whoever reports them.
fn is_gpu_node(node: &KubeNode) -> bool {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(GPU_PRESENT_LABEL))
        .is_some_and(|v| v == "true");
    let advertised = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(GPU_RESOURCE))
        .is_some_and(|q| q.0.trim() != "0");
    labelled || advertised
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;
    use tessera_core::model::Node;

    use super::*;

    fn kube_node(name: &str, labels: serde_json::Value, gpus: Option<&str>) -> Arc<KubeNode> {
        let mut node: KubeNode = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
        }))
        .unwrap();
        if let Some(n) = gpus {
            node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                allocatable: Some([(GPU_RESOURCE.to_owned(), Quantity(n.to_owned()))].into()),
                ..Default::default()
            });
        }
        Arc::new(node)
    }

    fn core_node(name: &str, gpus: u32) -> Node {
        Node::gpu_node(name, gpus, "H100-80GB", 81920)
    }

    fn store(nodes: Vec<Arc<KubeNode>>) -> Store {
        let mut store = Store::default();
        for n in nodes {
            store.nodes.insert(n.metadata.name.clone().unwrap(), n);
        }
        store
    }

    #[test]
    fn no_reporting_node_is_the_cause_said_first() {
        let store = store(vec![kube_node("a", json!({}), None)]);
        let gap = AgentGap::of(&store, &[core_node("a", 0)]);
        let message = gap.explain("0 of 1 nodes have a free GPU");
        assert!(
            message.starts_with("no tessera-agent is reporting GPUs from any of the 1 nodes"),
            "{message}"
        );
        assert!(message.ends_with("(scheduler: 0 of 1 nodes have a free GPU)"));
    }

    #[test]
    fn silent_gpu_nodes_are_named_after_the_reason() {
        let store = store(vec![
            kube_node("reports", json!({GPU_PRESENT_LABEL: "true"}), Some("80")),
            kube_node("labelled", json!({GPU_PRESENT_LABEL: "true"}), None),
            kube_node("advertises", json!({}), Some("80")),
            kube_node("cpu-only", json!({}), None),
            kube_node("zero", json!({}), Some("0")),
        ]);
        let nodes = [
            core_node("reports", 8),
            core_node("labelled", 0),
            core_node("advertises", 0),
            core_node("cpu-only", 0),
            core_node("zero", 0),
        ];
        let gap = AgentGap::of(&store, &nodes);
        assert_eq!(
            gap.explain("no node has 8 free GPUs"),
            "no node has 8 free GPUs; no tessera-agent is reporting from 2 GPU nodes (labelled, advertises), so their GPUs are not counted: check the tessera-agent pod there and its log"
        );
    }

    #[test]
    fn every_agent_reporting_leaves_the_reason_alone() {
        let store = store(vec![kube_node(
            "a",
            json!({GPU_PRESENT_LABEL: "true"}),
            Some("80"),
        )]);
        let gap = AgentGap::of(&store, &[core_node("a", 8), core_node("b", 0)]);
        assert_eq!(gap, AgentGap::None);
        assert_eq!(gap.explain("why"), "why");
    }

    #[test]
    fn a_long_list_is_cut_with_a_count() {
        let kube: Vec<_> = (0..8)
            .map(|i| kube_node(&format!("g{i}"), json!({GPU_PRESENT_LABEL: "true"}), None))
            .collect();
        let mut nodes: Vec<Node> = (0..8).map(|i| core_node(&format!("g{i}"), 0)).collect();
        nodes.push(core_node("reports", 1));
        let AgentGap::Nodes(hint) = AgentGap::of(&store(kube), &nodes) else {
            panic!("silent nodes named");
        };
        assert!(
            hint.contains("8 GPU nodes (g0, g1, g2, g3, g4 and 3 more)"),
            "{hint}"
        );
    }
}
