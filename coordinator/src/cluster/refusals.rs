//! What the nodes refused, so that a refused decision is not repeated blindly.
//!
//! A pod bound with Tessera's assignment that the kubelet then refuses at admission (its
//! agent would not hand out the assigned share: the GPU is held by something the coordinator
//! did not know of) names GPUs the node will not give. A ReplicaSet replaces such a pod at
//! once; without a memory of the refusal the replacement gets the same GPU, fails the same
//! way, and the loop goes on. So each refused GPU takes nothing new on its node until the
//! node's agent, in a report sent after the refusal, shows it free (the coordinator asks the
//! agent for that report when it notes the refusal).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;

use super::cache::Store;
use super::pod_log::Changed;
use crate::agents::AgentNode;
use tessera_contract::Assignment;
use tessera_contract::pod::{bound_assignment, refused_at_admission};

/// One refused GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The refused pod, `namespace/name`, for the messages that say why the GPU waits.
    pub pod: String,
    /// What the kubelet said (`status.message`), cut to a readable length.
    pub message: String,
    /// The node agent's report count when the refusal was noted: only a later report can
    /// show the GPU free.
    pub after_report: u64,
}

/// Longest part of the kubelet's message kept in a [`Refusal`]: enough to say why, short
/// enough to sit inside a pending pod's condition.
const MESSAGE_KEPT: usize = 200;

/// The refused GPUs still waiting for their agent's report, by (node, GPU UUID).
#[derive(Debug, Default)]
pub struct Refusals {
    active: BTreeMap<(String, String), Refusal>,
    /// Refused pods already noted: a refused pod stays in the cache (its later changes must
    /// not fence its GPUs again once they were reported free).
    noted: HashSet<String>,
}

impl Refusals {
    /// Notes the refusals among the pods that `changed` names in `store`; returns the nodes
    /// whose agents should report again (their refusal waits for a report).
    pub fn observe(
        &mut self,
        store: &Store,
        changed: Changed,
        agents: &[AgentNode],
    ) -> Vec<String> {
        let mut ask = Vec::new();
        let mut look = |uid: &str, pod: &Pod, this: &mut Self| {
            if this.noted.contains(uid) || !refused_at_admission(pod) {
                return;
            }
            this.noted.insert(uid.to_owned());
            let Some((node, assignment)) = refused_gpus(pod) else {
                return;
            };
            let after_report = agents
                .iter()
                .find(|a| a.node == node)
                .map_or(0, |a| a.occupancy_reports);
            let name = format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            );
            let message = pod
                .status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .unwrap_or_default();
            let message: String = message.chars().take(MESSAGE_KEPT).collect();
            for slice in assignment.slices() {
                this.active.insert(
                    (node.clone(), slice.uuid.clone()),
                    Refusal {
                        pod: name.clone(),
                        message: message.clone(),
                        after_report,
                    },
                );
            }
            tracing::warn!(pod = %name, %node, %message, "the node refused the pod's assignment at admission; its GPUs take nothing new until the node's agent reports them free");
            ask.push(node);
        };
        match changed {
            Changed::All => {
                for (uid, pod) in &store.pods {
                    look(uid, pod, self);
                }
            }
            Changed::Pods(uids) => {
                for uid in uids {
                    if let Some(pod) = store.pods.get(&uid) {
                        look(&uid, pod, self);
                    }
                }
            }
        }
        self.noted.retain(|uid| store.pods.contains_key(uid));
        ask.sort();
        ask.dedup();
        ask
    }

    /// Lifts each refusal whose agent has reported since it was noted and shows the GPU
    /// holding no share (or no longer has it).
    pub fn settle(&mut self, agents: &[AgentNode]) {
        self.active.retain(|(node, uuid), refusal| {
            let Some(agent) = agents.iter().find(|a| &a.node == node) else {
                return true;
            };
            if agent.occupancy_reports <= refusal.after_report {
                return true;
            }
            if !agent.gpus.iter().any(|g| &g.uuid == uuid) {
                return false;
            }
            agent
                .occupancy
                .get(uuid)
                .is_some_and(|o| !o.shares.is_empty())
        });
    }

    /// The refused GPUs still waiting, by (node, GPU UUID).
    pub fn active(&self) -> &BTreeMap<(String, String), Refusal> {
        &self.active
    }
}

/// The node and assignment of a pod refused at admission, if Tessera bound it.
fn refused_gpus(pod: &Pod) -> Option<(String, Assignment)> {
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let assignment = Assignment::from_json(bound_assignment(pod)?).ok()?;
    Some((node, assignment))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{GpuOccupancy, ShareInfo};
    use std::sync::Arc;
    use std::time::Instant;
    use tessera_contract::keys;
    use tessera_core::model::Gpu;

    fn agent(reports: u64, held: &[&str]) -> AgentNode {
        AgentNode {
            node: "n".into(),
            agent_version: "t".into(),
            protocol_version: 2,
            gpus: (0..2).map(|i| Gpu::new("n", i, "A100", 81920)).collect(),
            shares_per_gpu: 10,
            occupancy: held
                .iter()
                .map(|uuid| {
                    (
                        (*uuid).to_owned(),
                        GpuOccupancy {
                            healthy: true,
                            shares: vec![ShareInfo::default()],
                            ..GpuOccupancy::default()
                        },
                    )
                })
                .collect(),
            health_reasons: BTreeMap::new(),
            allocated_pods: Default::default(),
            occupancy_reports: reports,
            connected: true,
            last_seen: Instant::now(),
        }
    }

    fn refused(name: &str, reason: &str) -> Arc<Pod> {
        let assignment = r#"{"containers":[{"container":"main","gpus":[{"uuid":"GPU-n-1","memory_mib":81920,"compute_milli":1000}]}]}"#;
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "ml", "uid": name,
                    "annotations": {keys::ASSIGNMENT: assignment, keys::ASSIGNED_AT: "2026-01-01T00:00:00Z"}},
                "spec": {"nodeName": "n", "containers": []},
                "status": {"phase": "Failed", "reason": reason, "message": "Allocate failed: assignment would overcommit GPU GPU-n-1"},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_refused_gpu_waits_for_a_later_report_that_shows_it_free() {
        let mut store = Store::default();
        store
            .pods
            .insert("a".into(), refused("a", "UnexpectedAdmissionError"));
        store.pods.insert("b".into(), refused("b", "Evicted"));
        let mut refusals = Refusals::default();
        let ask = refusals.observe(&store, Changed::All, &[agent(3, &[])]);
        assert_eq!(ask, ["n"]);
        let key = ("n".to_owned(), "GPU-n-1".to_owned());
        assert_eq!(refusals.active()[&key].pod, "ml/a");
        assert_eq!(refusals.active().len(), 1, "an eviction is not a refusal");

        // The report it was noted at, even showing the GPU free, is not enough.
        refusals.settle(&[agent(3, &[])]);
        assert!(refusals.active().contains_key(&key));
        // A later report still showing it held keeps the fence.
        refusals.settle(&[agent(4, &["GPU-n-1"])]);
        assert!(refusals.active().contains_key(&key));
        // Free in a later report: lifted, and the same pod seen again does not fence anew.
        refusals.settle(&[agent(5, &[])]);
        assert!(refusals.active().is_empty());
        let again = refusals.observe(
            &store,
            Changed::Pods(["a".to_owned()].into()),
            &[agent(5, &[])],
        );
        assert!(again.is_empty() && refusals.active().is_empty());
    }
}
