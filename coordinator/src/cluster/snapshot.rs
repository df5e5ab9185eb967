//! One cycle's snapshot: the cache's objects through [`crate::translate`], joined with the
//! agents' live inventory, and overlaid with what this replica decided but the watches have
//! not shown yet.
//!
//! Joins and overlays, in order:
//! - **agents**: a node's GPUs are what its agent reported; a node whose agent is silent past
//!   the timeout (or disconnected) keeps its GPUs but all unhealthy, so nothing new lands there
//!   while the pods already there still count; a node whose agent never connected offers no
//!   GPUs at all.
//! - **assumed bindings**: a pod this replica bound (or decided and is holding for a later
//!   bind) but still unbound in the cache is placed where it was decided, like kube-scheduler's
//!   assume cache, so the next cycle does not place it twice.
//! - **evictions in flight**: a pod this replica evicted but still in the cache is terminating
//!   (holds its resources, is never a victim again).
//! - **agent occupancy**: a bound pod without an assignment (another scheduler's) holds the
//!   GPUs the agent reports it on; the core would otherwise assume the lowest-index free GPUs,
//!   while the agent picks by NVLink topology.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::cache::Store;
use crate::agents::AgentNode;
use crate::translate::{self, Inputs, Translated};
use tessera_core::model::{Assignment, ContainerAssignment, GpuSlice, Placement, Pod};

/// What this replica knows beyond the cache.
#[derive(Clone, Debug, Default)]
pub struct Overlay {
    /// Pods decided or bound by this replica and not yet seen bound: uid → placement.
    pub assumed: BTreeMap<String, Placement>,
    /// Pods evicted by this replica and not yet seen gone.
    pub evicting: BTreeSet<String>,
    /// Per (namespace, group): since when (Unix seconds) it has run fewer than minMember pods.
    pub below_min_member_since: BTreeMap<(String, String), u64>,
}

/// The fixed inputs of a build.
#[derive(Clone, Debug)]
pub struct BuildContext<'a> {
    /// Logical time: Unix seconds (the same clock as pods' creation times, and the same on
    /// every replica, so a new leader continues where the old one stopped).
    pub now: u64,
    /// Monotonic now, for agent liveness.
    pub instant: Instant,
    /// Agents silent longer than this offer no healthy GPU.
    pub agent_timeout: Duration,
    /// This scheduler's name.
    pub scheduler_name: &'a str,
}

/// Builds the snapshot (and the validation problems to report) for one cycle, translating
/// every pod.
pub fn build(
    store: &Store,
    agents: &[AgentNode],
    overlay: &Overlay,
    ctx: &BuildContext<'_>,
) -> Translated {
    build_with(store, agents, overlay, ctx, None)
}

/// Builds one cycle's snapshot after another, remembering each pod's translation until the
/// pod changes (its `resourceVersion` moves): a cycle while pods are being bound translates
/// the few that changed, not the whole store. The same result as [`build`]'s.
#[derive(Default)]
pub struct Builder {
    pods: translate::PodMemo,
}

impl Builder {
    /// The snapshot (and the validation problems to report) for one cycle.
    pub fn build(
        &mut self,
        store: &Store,
        agents: &[AgentNode],
        overlay: &Overlay,
        ctx: &BuildContext<'_>,
    ) -> Translated {
        build_with(store, agents, overlay, ctx, Some(&mut self.pods))
    }
}

fn build_with(
    store: &Store,
    agents: &[AgentNode],
    overlay: &Overlay,
    ctx: &BuildContext<'_>,
    memo: Option<&mut translate::PodMemo>,
) -> Translated {
    let mut agent_gpus = BTreeMap::new();
    for a in agents {
        let mut gpus = a.gpus.clone();
        if !a.is_live(ctx.instant, ctx.agent_timeout) {
            for g in &mut gpus {
                g.healthy = false;
            }
        }
        agent_gpus.insert(a.node.clone(), gpus);
    }
    let inputs = Inputs {
        now: ctx.now,
        scheduler_name: ctx.scheduler_name.to_owned(),
        pods: store.pods.values().map(|p| p.as_ref()).collect(),
        nodes: store.nodes.values().map(|n| n.as_ref()).collect(),
        queues: store.queues.values().map(|q| q.as_ref()).collect(),
        pod_groups: store.pod_groups.values().map(|g| g.as_ref()).collect(),
        topologies: store.topologies.values().map(|t| t.as_ref()).collect(),
        priority_classes: store
            .priority_classes
            .values()
            .map(|p| p.as_ref())
            .collect(),
        agent_gpus,
        below_min_member_since: overlay.below_min_member_since.clone(),
        namespaces: store.namespaces.values().map(|n| n.as_ref()).collect(),
        claims: store.claims.values().map(|c| c.as_ref()).collect(),
        volumes: store.volumes.values().map(|v| v.as_ref()).collect(),
        storage_classes: store.storage_classes.values().map(|c| c.as_ref()).collect(),
        disruption_budgets: store
            .disruption_budgets
            .values()
            .map(|b| b.as_ref())
            .collect(),
    };
    let mut out = match memo {
        Some(memo) => translate::snapshot_with(&inputs, memo),
        None => translate::snapshot(&inputs),
    };
    let by_node: BTreeMap<&str, &AgentNode> = agents.iter().map(|a| (a.node.as_str(), a)).collect();
    for pod in &mut out.snapshot.pods {
        if pod.placement.is_none()
            && let Some(p) = overlay.assumed.get(&pod.uid)
        {
            pod.placement = Some(p.clone());
        }
        if overlay.evicting.contains(&pod.uid) {
            pod.terminating = true;
        }
        fill_from_occupancy(pod, &by_node);
    }
    out
}

/// Gives a bound pod without an assignment the GPUs its node's agent reports it holding.
fn fill_from_occupancy(pod: &mut Pod, agents: &BTreeMap<&str, &AgentNode>) {
    if pod.gpu.count == 0 {
        return;
    }
    let Some(placement) = pod.placement.as_mut() else {
        return;
    };
    if placement.assignment.slices().next().is_some() {
        return;
    }
    let Some(agent) = agents.get(placement.node.as_str()) else {
        return;
    };
    let mut per_container: BTreeMap<String, Vec<GpuSlice>> = BTreeMap::new();
    for gpu in &agent.gpus {
        let Some(occ) = agent.occupancy.get(&gpu.uuid) else {
            continue;
        };
        for share in occ.shares.iter().filter(|s| s.pod_uid == pod.uid) {
            // The agent hands pods without an assignment whole GPUs.
            per_container
                .entry(share.container.clone())
                .or_default()
                .push(GpuSlice {
                    uuid: gpu.uuid.clone(),
                    memory_mib: gpu.memory_mib,
                    compute_milli: 1000,
                });
        }
    }
    if per_container.is_empty() {
        return;
    }
    placement.assignment = Assignment {
        containers: per_container
            .into_iter()
            .map(|(container, mut gpus)| {
                gpus.dedup_by(|a, b| a.uuid == b.uuid);
                ContainerAssignment { container, gpus }
            })
            .collect(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{GpuOccupancy, ShareInfo};
    use tessera_core::model::Gpu;

    fn agent() -> AgentNode {
        let mut occupancy = BTreeMap::new();
        occupancy.insert(
            "GPU-n-2".to_owned(),
            GpuOccupancy {
                healthy: true,
                shares: vec![ShareInfo {
                    pod_uid: "u1".into(),
                    container: "main".into(),
                    ..ShareInfo::default()
                }],
                ..GpuOccupancy::default()
            },
        );
        AgentNode {
            node: "n".into(),
            agent_version: "t".into(),
            protocol_version: 1,
            gpus: (0..4).map(|i| Gpu::new("n", i, "A100", 81920)).collect(),
            shares_per_gpu: 10,
            occupancy,
            health_reasons: BTreeMap::new(),
            allocated_pods: Default::default(),
            connected: true,
            last_seen: Instant::now(),
        }
    }

    #[test]
    fn foreign_pod_gets_the_gpus_the_agent_reports() {
        let a = agent();
        let agents: BTreeMap<&str, &AgentNode> = [("n", &a)].into_iter().collect();
        let mut pod = Pod::new("u1", "default").gpus(1).on_node("n");
        fill_from_occupancy(&mut pod, &agents);
        let slices: Vec<_> = pod
            .placement
            .unwrap()
            .assignment
            .slices()
            .cloned()
            .collect();
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].uuid, "GPU-n-2");
        assert_eq!(slices[0].compute_milli, 1000);

        // Not reported: left to the core's default.
        let mut other = Pod::new("u2", "default").gpus(1).on_node("n");
        fill_from_occupancy(&mut other, &agents);
        assert!(other.placement.unwrap().assignment.containers.is_empty());
    }
}
