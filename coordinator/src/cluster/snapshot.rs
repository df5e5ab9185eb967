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
//! - **what the agents and nodes say of the GPUs** ([`super::occupancy`]): an assignment
//!   that does not fit its node's inventory is ignored; a bound pod without one (another
//!   scheduler's) holds the GPUs its agent reports it on; GPUs whose account is not settled
//!   (a pod's GPUs not reported yet, a departed pod's share not released yet, an assignment
//!   the node refused) are fenced: they take nothing new until the agent's report settles them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::cache::Store;
use super::refusals::Refusal;
use crate::agents::AgentNode;
use crate::translate::{self, Inputs, Translated};
use tessera_core::model::Placement;

/// What this replica knows beyond the cache.
#[derive(Clone, Debug, Default)]
pub struct Overlay {
    /// Pods decided or bound by this replica and not yet seen bound: uid → placement.
    pub assumed: BTreeMap<String, Placement>,
    /// Pods evicted by this replica and not yet seen gone.
    pub evicting: BTreeSet<String>,
    /// Per (namespace, group): since when (Unix seconds) it has run fewer than minMember pods.
    pub below_min_member_since: BTreeMap<(String, String), u64>,
    /// GPUs their nodes refused at admission, still waiting for their agent's report.
    pub refused: BTreeMap<(String, String), Refusal>,
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
        workload_pod_groups: store
            .workload_pod_groups
            .values()
            .map(|g| g.as_ref())
            .collect(),
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
    for pod in &mut out.snapshot.pods {
        if pod.placement.is_none()
            && let Some(p) = overlay.assumed.get(&pod.uid)
        {
            pod.placement = Some(p.clone());
        }
        if overlay.evicting.contains(&pod.uid) {
            pod.terminating = true;
        }
    }
    super::occupancy::join(&mut out, agents, &overlay.refused);
    out
}
