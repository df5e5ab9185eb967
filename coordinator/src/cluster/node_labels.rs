//! Each node's GPUs in GPUs, on the Node, from its agent's inventory.
//!
//! A node's `nvidia.com/gpu` capacity is share slots (80 on an 8-GPU node at the agent's
//! default 10 per GPU), which people, autoscalers and tools read as GPUs. The leader labels
//! every node whose agent reported an inventory with the real count, model and memory under
//! NVIDIA GPU feature discovery's names (`nvidia.com/gpu.count`, `.product`, `.memory`) and
//! with Tessera's own (`tessera.dev/gpu-count`, `tessera.dev/gpu-shares-per-gpu`); the labels
//! follow the inventory (an agent restarted on another machine shape).
//!
//! The coordinator writes them, not the agents: it already holds every agent's inventory, and
//! an agent that may patch nodes may patch every node (RBAC cannot narrow `patch` to one's
//! own). The writes are server-side applies of these labels alone under the field manager
//! [`FIELD_MANAGER`], never forced: where feature discovery already owns one of NVIDIA's
//! labels with another value (its MIG strategy `single` counts MIG devices), the apply
//! conflicts, that label is left to it, and Tessera's own labels still say the count. The
//! chart's admission policy lets the coordinator change nothing else on a Node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tessera_contract::keys;
use tokio::sync::watch;

use super::cache::Cache;
use crate::agents::{AgentNode, AgentRegistry};

/// The field manager of the labels' server-side applies.
pub const FIELD_MANAGER: &str = "tessera-coordinator";

/// Changes arriving together (agents connecting after a restart) are written in one pass.
const SETTLE: Duration = Duration::from_millis(500);
/// Labels someone else removed or changed are written again within this long.
const RESYNC: Duration = Duration::from_secs(30);
/// Longest label value Kubernetes accepts.
const MAX_VALUE: usize = 63;
/// A node without labels.
static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
/// A node where no other writer owns a GPU label.
static NO_KEYS: BTreeSet<String> = BTreeSet::new();

/// The labels `agent`'s inventory gives its node: the count always, model and memory when it
/// has a GPU (of its lowest-index GPU on a node of mixed models, as feature discovery labels
/// one product per node).
pub fn labels_for(agent: &AgentNode) -> BTreeMap<String, String> {
    let count = agent.gpus.len().to_string();
    let mut labels = BTreeMap::from([
        (keys::NODE_GPU_COUNT.to_owned(), count.clone()),
        (keys::NODE_TESSERA_GPU_COUNT.to_owned(), count),
        (
            keys::NODE_GPU_SHARES_PER_GPU.to_owned(),
            agent.shares_per_gpu.to_string(),
        ),
    ]);
    if let Some(first) = agent.gpus.iter().min_by_key(|g| g.index) {
        let product = label_value(&first.model);
        if !product.is_empty() {
            labels.insert(keys::NODE_GPU_PRODUCT.to_owned(), product);
        }
        labels.insert(
            keys::NODE_GPU_MEMORY.to_owned(),
            first.memory_mib.to_string(),
        );
    }
    labels
}

/// `text` as a label value, the way feature discovery writes a product name: whitespace
/// runs become `-`, any other character a label value may not hold becomes `-`, at most 63
/// characters, starting and ending with a letter or digit (empty if none is left).
pub fn label_value(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join("-");
    let cleaned: String = joined
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(MAX_VALUE)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// The labels to apply on a node whose labels are `current`: `desired` without the keys
/// another writer owns (`foreign`), or `None` when there is nothing to write: this replica
/// applied exactly these last (`last`; the cache may not show them yet), or it applied nothing
/// since it began to judge afresh and the node carries them already. A key applied last and
/// no longer wanted is applied away.
pub fn to_apply(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
    foreign: &BTreeSet<String>,
    last: Option<&BTreeMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    let ours: BTreeMap<String, String> = desired
        .iter()
        .filter(|(k, _)| !foreign.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let carried = ours.iter().all(|(k, v)| current.get(k) == Some(v));
    match last {
        Some(l) if *l == ours => None,
        None if carried => None,
        _ => Some(ours),
    }
}

/// The label keys a refused apply names as owned by another field manager (its causes'
/// fields, `.metadata.labels.<key>`).
pub fn conflicting_labels(status: &kube::core::Status) -> BTreeSet<String> {
    status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .filter_map(|c| c.field.strip_prefix(".metadata.labels."))
        .map(str::to_owned)
        .collect()
}

/// Keeps every node's GPU labels as its agent's inventory says (leader only).
pub struct Labeller {
    client: kube::Client,
    cache: Cache,
    registry: AgentRegistry,
    leader: watch::Receiver<bool>,
    /// Node → the labels this replica applied last.
    applied: HashMap<String, BTreeMap<String, String>>,
    /// Node → NVIDIA label keys another writer owns there (kept while this replica leads).
    foreign: HashMap<String, BTreeSet<String>>,
    /// A refusal was logged at WARN (the rest go to debug).
    warned: bool,
}

impl Labeller {
    /// A labeller writing through `client` (gated on leadership by the caller) what
    /// `registry` says of the nodes in `cache`.
    pub fn new(
        client: kube::Client,
        cache: Cache,
        registry: AgentRegistry,
        leader: watch::Receiver<bool>,
    ) -> Self {
        Self {
            client,
            cache,
            registry,
            leader,
            applied: HashMap::new(),
            foreign: HashMap::new(),
            warned: false,
        }
    }

    /// Runs until `shutdown` turns true: a pass whenever the agents change (settled), when
    /// this replica begins to lead or its cache is ready, and every [`RESYNC`].
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut agents = self.registry.changes();
        let mut ready = self.cache.ready();
        let mut leader = self.leader.clone();
        let mut resync = tokio::time::interval(RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.tick().await;
        loop {
            if *shutdown.borrow() {
                break;
            }
            agents.borrow_and_update();
            if *leader.borrow_and_update() && self.cache.is_ready() {
                self.pass().await;
            } else {
                // Another replica may write meanwhile, and another writer's labels may be gone
                // by then: judge afresh from the API next time.
                self.applied.clear();
                self.foreign.clear();
            }
            tokio::select! {
                _ = changed(&mut shutdown) => {}
                _ = changed(&mut leader) => {}
                _ = changed(&mut ready) => {}
                _ = changed(&mut agents) => tokio::time::sleep(SETTLE).await,
                // Judged afresh from the API: labels someone removed are written again.
                _ = resync.tick() => self.applied.clear(),
            }
        }
    }

    /// Applies the labels of every node that lacks them.
    async fn pass(&mut self) {
        let agents = self.registry.all();
        let writes: Vec<(String, BTreeMap<String, String>)> = self.cache.read(|store| {
            agents
                .iter()
                .filter_map(|a| {
                    let node = store.nodes.get(&a.node)?;
                    let current = node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
                    let foreign = self.foreign.get(&a.node).unwrap_or(&NO_KEYS);
                    let labels =
                        to_apply(current, &labels_for(a), foreign, self.applied.get(&a.node))?;
                    Some((a.node.clone(), labels))
                })
                .collect()
        });
        for (node, labels) in writes {
            self.apply(&node, labels).await;
        }
    }

    /// Applies `labels` on `node`; where another writer owns some of them, once more without.
    async fn apply(&mut self, node: &str, mut labels: BTreeMap<String, String>) {
        for _ in 0..2 {
            match self.apply_once(node, &labels).await {
                Ok(()) => {
                    tracing::debug!(%node, ?labels, "GPU labels applied");
                    self.applied.insert(node.to_owned(), labels);
                    return;
                }
                Err(theirs) if !theirs.is_empty() => {
                    // GPU feature discovery owns these with other values: they are its to
                    // keep, Tessera's own labels still say the count.
                    tracing::info!(%node, labels = ?theirs, "another writer owns these GPU labels with other values; left to it");
                    labels.retain(|k, _| !theirs.contains(k));
                    self.foreign
                        .entry(node.to_owned())
                        .or_default()
                        .extend(theirs);
                }
                Err(_) => return,
            }
        }
    }

    /// One apply; `Err` with the NVIDIA label keys another field manager owns, or empty for
    /// any other failure (logged).
    async fn apply_once(
        &mut self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), BTreeSet<String>> {
        let api: Api<Node> = Api::all(self.client.clone());
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": labels},
        });
        let error = match api
            .patch(
                node,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(body),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        if let kube::Error::Api(status) = &error
            && status.code == 409
        {
            let theirs: BTreeSet<String> = conflicting_labels(status)
                .into_iter()
                .filter(|k| k.starts_with("nvidia.com/"))
                .collect();
            if !theirs.is_empty() {
                return Err(theirs);
            }
        }
        if super::gate::NotLeading::is(&error) {
            return Err(BTreeSet::new());
        }
        if std::mem::replace(&mut self.warned, true) {
            tracing::debug!(%node, %error, "could not write the node's GPU labels");
        } else {
            tracing::warn!(
                %node,
                %error,
                "could not write the node's GPU labels (the coordinator's role needs patch on nodes, and the chart's node-labels admission policy lets it change only these labels); further failures are logged at debug level"
            );
        }
        Err(BTreeSet::new())
    }
}

/// Resolves when `rx` changes; never when its sender is gone (nothing will change).
async fn changed<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tessera_core::model::Gpu;

    use super::*;

    fn agent(gpus: &[(&str, u64)], shares: u32) -> AgentNode {
        let gpus = gpus
            .iter()
            .enumerate()
            .map(|(i, (model, mib))| Gpu::new("n", i as u32, model, *mib))
            .collect();
        AgentNode {
            shares_per_gpu: shares,
            ..crate::cluster::test_agent("n", gpus, true, Instant::now())
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn labels_say_the_gpus_in_gpus_with_feature_discoverys_names() {
        let eight = agent(&[("NVIDIA H100 80GB HBM3", 81_559); 8], 10);
        assert_eq!(
            labels_for(&eight),
            map(&[
                ("nvidia.com/gpu.count", "8"),
                ("nvidia.com/gpu.memory", "81559"),
                ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                ("tessera.dev/gpu-count", "8"),
                ("tessera.dev/gpu-shares-per-gpu", "10"),
            ])
        );
        // A node without GPUs says 0 and names no model.
        assert_eq!(
            labels_for(&agent(&[], 4)),
            map(&[
                ("nvidia.com/gpu.count", "0"),
                ("tessera.dev/gpu-count", "0"),
                ("tessera.dev/gpu-shares-per-gpu", "4"),
            ])
        );
    }

    #[test]
    fn label_values_are_what_kubernetes_accepts() {
        let rows = [
            ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
            ("  Tesla  T4 ", "Tesla-T4"),
            ("H100/80GB (PCIe)", "H100-80GB--PCIe"),
            ("***", ""),
        ];
        for (model, want) in rows {
            assert_eq!(label_value(model), want, "{model:?}");
        }
        let long = label_value(&"x".repeat(100));
        assert_eq!(long.len(), 63);
    }

    #[test]
    fn a_node_is_written_only_when_its_labels_differ() {
        let desired = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("tessera.dev/gpu-count", "8"),
        ]);
        let none = BTreeSet::new();
        // Carried already (a restarted leader): nothing to write.
        assert_eq!(to_apply(&desired, &desired, &none, None), None);
        // Missing or different: the whole set.
        let stale = map(&[
            ("nvidia.com/gpu.count", "2"),
            ("tessera.dev/gpu-count", "2"),
        ]);
        assert_eq!(
            to_apply(&stale, &desired, &none, None),
            Some(desired.clone())
        );
        assert_eq!(
            to_apply(&BTreeMap::new(), &desired, &none, None),
            Some(desired.clone())
        );
        // Applied just now, not in the cache yet: not again.
        assert_eq!(
            to_apply(&BTreeMap::new(), &desired, &none, Some(&desired)),
            None
        );
        // The inventory changed since (another shape): the new set.
        let two = map(&[
            ("nvidia.com/gpu.count", "2"),
            ("tessera.dev/gpu-count", "2"),
        ]);
        assert_eq!(
            to_apply(&desired, &two, &none, Some(&desired)),
            Some(two.clone())
        );
        // Feature discovery owns the NVIDIA count with its own value: left out.
        let foreign = BTreeSet::from(["nvidia.com/gpu.count".to_owned()]);
        let theirs = map(&[
            ("nvidia.com/gpu.count", "56"),
            ("tessera.dev/gpu-count", "8"),
        ]);
        assert_eq!(to_apply(&theirs, &desired, &foreign, None), None);
        // A key this replica applied and no longer wants is applied away.
        let last = map(&[
            ("nvidia.com/gpu.product", "A100"),
            ("tessera.dev/gpu-count", "8"),
        ]);
        let now = map(&[("tessera.dev/gpu-count", "8")]);
        assert_eq!(to_apply(&last, &now, &none, Some(&last)), Some(now.clone()));
    }

    #[test]
    fn a_conflict_names_the_labels_another_manager_owns() {
        let status: kube::core::Status = serde_json::from_value(json!({
            "code": 409,
            "reason": "Conflict",
            "message": "Apply failed with 1 conflict: conflict with \"nfd-master\" using v1: .metadata.labels.nvidia.com/gpu.count",
            "details": {"causes": [{
                "reason": "FieldManagerConflict",
                "message": "conflict with \"nfd-master\" using v1",
                "field": ".metadata.labels.nvidia.com/gpu.count",
            }]},
        }))
        .unwrap();
        assert_eq!(
            conflicting_labels(&status),
            BTreeSet::from(["nvidia.com/gpu.count".to_owned()])
        );
    }
}
