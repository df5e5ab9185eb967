//! What a pending GPU pod's message says about nodes whose agent reports nothing.
//!
//! The core sees only the GPUs agents report, so a node whose agent is missing, crashed or
//! refused looks to it like a node without GPUs, and its explanation ("the largest node has 0
//! healthy GPUs") hides the cause. A *GPU node* is a node the cluster itself says has GPUs:
//! labelled `nvidia.com/gpu.present=true` (NVIDIA's feature discovery; the agent DaemonSet's
//! default node selector) or advertising `nvidia.com/gpu` in its allocatable (a device plugin
//! registered with its kubelet). A GPU node from which no agent reports GPUs is named.
//!
//! Only after a grace period ([`AgentWait`]): agents connect to the leading replica alone, so
//! right after a coordinator starts (or takes over), after a node joins, or after its agent's
//! stream broke, agents are missing for the seconds they take to (re)connect, and saying so
//! to every pending GPU pod would send people looking for a problem that is not there.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use tessera_core::model::Node;

use super::cache::Store;
use crate::agents::AgentNode;
use tessera_contract::keys::GPU_RESOURCE;

/// How long a node's agent may be missing before pending pods' messages name it.
pub const DEFAULT_AGENT_GRACE: Duration = Duration::from_secs(60);

/// When each node's agent may first be called missing: the grace period runs from the latest
/// of this replica's start as leader, the node's first appearance in its cache, and the last
/// word from the node's agent when its stream is closed.
#[derive(Clone, Debug)]
pub struct AgentWait {
    grace: Duration,
    leading_since: Option<Instant>,
    first_seen: HashMap<String, Instant>,
}

impl AgentWait {
    /// A wait of `grace` per node.
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            leading_since: None,
            first_seen: HashMap::new(),
        }
    }

    /// This replica began (or began again) to lead at `now`: agents connect from now on.
    pub fn leading(&mut self, now: Instant) {
        self.leading_since = Some(now);
    }

    /// The nodes of `store` whose agent has had its grace period by `now`, given what the
    /// `agents` said last.
    pub fn overdue(&mut self, store: &Store, agents: &[AgentNode], now: Instant) -> Overdue {
        self.first_seen.retain(|n, _| store.nodes.contains_key(n));
        for name in store.nodes.keys() {
            self.first_seen.entry(name.clone()).or_insert(now);
        }
        let Some(leading_since) = self.leading_since else {
            return Overdue::default();
        };
        let mut nodes = BTreeSet::new();
        for (name, &seen) in &self.first_seen {
            let mut since = leading_since.max(seen);
            if let Some(a) = agents.iter().find(|a| &a.node == name)
                && !a.connected
            {
                since = since.max(a.last_seen);
            }
            if now.saturating_duration_since(since) >= self.grace {
                nodes.insert(name.clone());
            }
        }
        Overdue { nodes }
    }
}

/// The nodes whose agent, if missing, is named in pending pods' messages (its grace period
/// is over).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overdue {
    /// Node names.
    pub nodes: BTreeSet<String>,
}

impl Overdue {
    /// Every node of `names` is overdue (tests, and a wait of zero).
    pub fn all<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            nodes: names.into_iter().map(str::to_owned).collect(),
        }
    }
}

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
    /// snapshot's `nodes`), counting only nodes whose agent's grace period is over.
    pub fn of(store: &Store, nodes: &[Node], overdue: &Overdue) -> AgentGap {
        let is_overdue = |n: &Node| overdue.nodes.contains(&n.name);
        if nodes.iter().all(|n| n.gpus.is_empty()) {
            // While every node may still be waiting for its agent, the cause is not known yet.
            if !nodes.iter().any(is_overdue) {
                return AgentGap::None;
            }
            return AgentGap::Everywhere(format!(
                "no tessera-agent is reporting GPUs from any of the {} nodes, so no GPU pod can be placed: check that the tessera-agent DaemonSet runs on the GPU nodes and reaches the coordinator (a refused agent logs why)",
                nodes.len()
            ));
        }
        let silent: Vec<&str> = nodes
            .iter()
            .filter(|n| n.gpus.is_empty() && is_overdue(n))
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
            AgentGap::Nodes(hint) => then(message, hint),
        }
    }
}

/// `message` followed by `more`: after a sentence (kube-scheduler's node counts end with a
/// period) with a space, after a clause with "; ".
pub fn then(message: &str, more: &str) -> String {
    if message.is_empty() {
        more.to_owned()
    } else if message.ends_with('.') {
        format!("{message} {more}")
    } else {
        format!("{message}; {more}")
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
        let gap = AgentGap::of(&store, &[core_node("a", 0)], &Overdue::all(["a"]));
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
        let all = Overdue::all(nodes.iter().map(|n| n.name.as_str()));
        let gap = AgentGap::of(&store, &nodes, &all);
        assert_eq!(
            gap.explain("0/5 nodes are available: 5 node(s) had no GPUs."),
            "0/5 nodes are available: 5 node(s) had no GPUs. no tessera-agent is reporting from 2 GPU nodes (labelled, advertises), so their GPUs are not counted: check the tessera-agent pod there and its log"
        );
    }

    #[test]
    fn every_agent_reporting_leaves_the_reason_alone() {
        let store = store(vec![kube_node(
            "a",
            json!({GPU_PRESENT_LABEL: "true"}),
            Some("80"),
        )]);
        let gap = AgentGap::of(
            &store,
            &[core_node("a", 8), core_node("b", 0)],
            &Overdue::all(["a", "b"]),
        );
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
        let all = Overdue::all(nodes.iter().map(|n| n.name.as_str()));
        let AgentGap::Nodes(hint) = AgentGap::of(&store(kube), &nodes, &all) else {
            panic!("silent nodes named");
        };
        assert!(
            hint.contains("8 GPU nodes (g0, g1, g2, g3, g4 and 3 more)"),
            "{hint}"
        );
    }

    fn agent(node: &str, connected: bool, last_seen: Instant) -> AgentNode {
        crate::cluster::test_agent(node, Vec::new(), connected, last_seen)
    }

    const GRACE: Duration = Duration::from_secs(60);

    /// One row per moment a node's agent may be missing: is it overdue `at` seconds after
    /// this replica began to lead?
    #[test]
    fn the_grace_period_runs_from_leading_from_a_node_joining_and_from_a_disconnect() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut wait = AgentWait::new(GRACE);
        let old = store(vec![kube_node("old", json!({}), None)]);
        assert_eq!(
            wait.overdue(&old, &[], at(0)),
            Overdue::default(),
            "not leading: nothing is said"
        );
        wait.leading(at(0));
        assert!(
            wait.overdue(&old, &[], at(1)).nodes.is_empty(),
            "just leading"
        );
        assert!(wait.overdue(&old, &[], at(59)).nodes.is_empty());
        assert_eq!(wait.overdue(&old, &[], at(60)), Overdue::all(["old"]));
        // A node that joins at 100 s waits its own minute; the old one stays overdue.
        let both = store(vec![
            kube_node("old", json!({}), None),
            kube_node("new", json!({}), None),
        ]);
        assert_eq!(wait.overdue(&both, &[], at(100)), Overdue::all(["old"]));
        assert_eq!(wait.overdue(&both, &[], at(159)), Overdue::all(["old"]));
        assert_eq!(
            wait.overdue(&both, &[], at(160)),
            Overdue::all(["new", "old"])
        );
        // The old node's agent last spoke at 200 s, then its stream closed: a minute from then.
        let gone = [agent("old", false, at(200))];
        assert_eq!(wait.overdue(&both, &gone, at(230)), Overdue::all(["new"]));
        assert_eq!(
            wait.overdue(&both, &gone, at(260)),
            Overdue::all(["new", "old"])
        );
        // A connected agent is not waited for (its node has its GPUs or none to report).
        let live = [agent("old", true, at(200))];
        assert_eq!(
            wait.overdue(&both, &live, at(230)),
            Overdue::all(["new", "old"])
        );
        // Leading again (a failover back to this replica) starts every wait again.
        wait.leading(at(300));
        assert!(wait.overdue(&both, &[], at(330)).nodes.is_empty());
    }

    #[test]
    fn agents_still_in_their_grace_period_are_not_named() {
        let store = store(vec![
            kube_node("a", json!({GPU_PRESENT_LABEL: "true"}), None),
            kube_node("b", json!({GPU_PRESENT_LABEL: "true"}), None),
            kube_node("reports", json!({GPU_PRESENT_LABEL: "true"}), Some("80")),
        ]);
        let silent = [core_node("a", 0), core_node("b", 0)];
        // Right after a restart nothing reports and nobody is overdue: the core's reason alone.
        let gap = AgentGap::of(&store, &silent, &Overdue::default());
        assert_eq!(gap, AgentGap::None);
        assert_eq!(gap.explain("why."), "why.");
        // One node overdue: nothing reports anywhere, and that is said.
        let gap = AgentGap::of(&store, &silent, &Overdue::all(["a"]));
        assert!(matches!(gap, AgentGap::Everywhere(_)), "{gap:?}");
        // Some nodes report: only the overdue silent one is named.
        let mixed = [
            core_node("a", 0),
            core_node("b", 0),
            core_node("reports", 8),
        ];
        let AgentGap::Nodes(hint) = AgentGap::of(&store, &mixed, &Overdue::all(["b", "reports"]))
        else {
            panic!("b is named");
        };
        assert!(hint.contains("1 GPU node (b)"), "{hint}");
    }

    #[test]
    fn hints_follow_a_sentence_with_a_space_and_a_clause_with_a_semicolon() {
        assert_eq!(
            then("0/1 nodes are available: 1 Too many pods.", "x"),
            "0/1 nodes are available: 1 Too many pods. x"
        );
        assert_eq!(
            then("gang g: its 2 pods do not fit together", "x"),
            "gang g: its 2 pods do not fit together; x"
        );
        assert_eq!(then("", "x"), "x");
    }
}
