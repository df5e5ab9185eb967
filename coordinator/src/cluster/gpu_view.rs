//! The `GpuNode` objects: per node, the leader's view of what its agent reports (GPUs, health,
//! who holds which share, measured memory and utilisation), written into the status of a
//! cluster-scoped object named as the node, so `kubectl tessera gpus` — and anyone granted
//! `list` on `gpunodes` — reads the whole cluster's GPUs through the API server with their own
//! RBAC, whichever replica leads and wherever it runs.
//!
//! Writes are bounded whatever the cluster does: only the leader writes (through the write
//! gate), a node is written only when its view changed, a change in measurements alone is
//! written at most once per [`GpuViewConfig::refresh`] per node, and no pass writes more than
//! [`GpuViewConfig::writes_per_pass`] objects (one pass a second), changes in who holds what
//! first. In a large, busy cluster the measurements therefore lag; `observedTime` says when
//! each view was written.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use tokio::sync::watch;

use super::cache::Cache;
use crate::agents::{AgentNode, AgentRegistry};
use crate::crd::{AgentView, GpuNode, GpuNodeSpec, GpuNodeStatus, GpuView, ShareView};

/// How often the view is written.
#[derive(Clone, Debug)]
pub struct GpuViewConfig {
    /// At most this many `GpuNode` writes per pass (a pass a second); 0 writes none.
    pub writes_per_pass: usize,
    /// A view whose only change is in measured memory or utilisation is rewritten at most this
    /// often.
    pub refresh: Duration,
}

impl Default for GpuViewConfig {
    fn default() -> Self {
        Self {
            writes_per_pass: 10,
            refresh: Duration::from_secs(30),
        }
    }
}

/// Time between passes.
const PASS: Duration = Duration::from_secs(1);

/// How long to wait before trying again when the GpuNode CRD is not served.
const CRD_RETRY: Duration = Duration::from_secs(60);

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}

/// One node's view from its agent's latest report (`observedTime` is set when written).
pub fn status_of(node: &AgentNode) -> GpuNodeStatus {
    let gpus: Vec<GpuView> = node
        .gpus
        .iter()
        .map(|g| {
            let occupancy = node.occupancy.get(&g.uuid);
            GpuView {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                memory_mib: g.memory_mib,
                healthy: g.healthy,
                health_reason: if g.healthy {
                    String::new()
                } else {
                    node.health_reasons
                        .get(&g.uuid)
                        .cloned()
                        .unwrap_or_default()
                },
                nvlink_island: g.nvlink_island,
                mig_profiles: g
                    .mig
                    .as_ref()
                    .map(|m| m.iter().map(|i| i.profile.clone()).collect()),
                used_memory_mib: occupancy.map_or(0, |o| o.used_memory_mib),
                utilization_percent: occupancy.map_or(0, |o| o.utilization_percent),
                shares: occupancy
                    .map(|o| {
                        o.shares
                            .iter()
                            .map(|s| ShareView {
                                pod_uid: s.pod_uid.clone(),
                                namespace: s.pod_namespace.clone(),
                                pod: s.pod_name.clone(),
                                container: s.container.clone(),
                                compute_percent: s.compute_percent,
                                memory_mib: s.memory_limit_mib,
                                measured_memory_mib: s.measured_memory_mib,
                                measured_utilization_percent: s.measured_utilization_percent,
                                mig_instance: s.mig_instance_uuid.clone(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    let model = match gpus.first() {
        Some(first) if gpus.iter().all(|g| g.model == first.model) => first.model.clone(),
        Some(_) => "mixed".to_owned(),
        None => String::new(),
    };
    GpuNodeStatus {
        observed_time: None,
        agent: AgentView {
            connected: node.connected,
            version: node.agent_version.clone(),
            shares_per_gpu: node.shares_per_gpu,
        },
        model,
        gpu_count: count(gpus.len()),
        healthy_gpus: count(gpus.iter().filter(|g| g.healthy).count()),
        free_gpus: count(
            gpus.iter()
                .filter(|g| g.healthy && g.shares.is_empty())
                .count(),
        ),
        gpus,
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `status` without what the agents measure: two views equal in this differ only in
/// measurements.
fn without_measurements(status: &GpuNodeStatus) -> GpuNodeStatus {
    let mut s = status.clone();
    s.observed_time = None;
    for g in &mut s.gpus {
        g.used_memory_mib = 0;
        g.utilization_percent = 0;
        for share in &mut g.shares {
            share.measured_memory_mib = 0;
            share.measured_utilization_percent = 0;
        }
    }
    s
}

/// What was last written for a node, and when.
#[derive(Clone, Debug)]
pub struct Written {
    /// The status written (without `observedTime`).
    pub status: GpuNodeStatus,
    /// When.
    pub at: Instant,
}

/// The nodes to write in this pass, at most `budget`: first every node whose view changed in
/// more than measurements (by name), then those whose measurements changed and were last
/// written `refresh` or longer ago (the longest ago first).
pub fn plan(
    desired: &BTreeMap<String, GpuNodeStatus>,
    written: &BTreeMap<String, Written>,
    now: Instant,
    refresh: Duration,
    budget: usize,
) -> Vec<String> {
    let mut changed = Vec::new();
    let mut stale: Vec<(Instant, &String)> = Vec::new();
    for (node, status) in desired {
        match written.get(node) {
            None => changed.push(node.clone()),
            Some(w) if &w.status == status => {}
            Some(w) if without_measurements(&w.status) != without_measurements(status) => {
                changed.push(node.clone());
            }
            Some(w) if now.saturating_duration_since(w.at) >= refresh => stale.push((w.at, node)),
            Some(_) => {}
        }
    }
    stale.sort();
    changed
        .into_iter()
        .chain(stale.into_iter().map(|(_, n)| n.clone()))
        .take(budget)
        .collect()
}

/// Writes the views while this replica leads, until `shutdown`. `client` is the leader's
/// gated client; `agent_timeout` is how long after taking the lead a node whose agent has not
/// reconnected is shown disconnected (its object may be left from an earlier leader).
pub async fn run(
    client: kube::Client,
    cache: Cache,
    registry: AgentRegistry,
    mut leading: watch::Receiver<bool>,
    config: GpuViewConfig,
    agent_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    if config.writes_per_pass == 0 {
        return;
    }
    let api: Api<GpuNode> = Api::all(client);
    loop {
        tokio::select! {
            _ = super::super::agents::stopped(&mut shutdown) => return,
            led = leading.wait_for(|l| *l) => if led.is_err() { return },
        }
        let since = Instant::now();
        // Views an earlier leader wrote: the baseline, so unchanged nodes are not rewritten
        // and nodes whose agent never comes back are shown disconnected.
        // Per node, the Node uid its view is owned by: a Node deleted and created again under
        // its name gets a new view (the old one goes with the old Node).
        let mut owned_by: BTreeMap<String, String> = BTreeMap::new();
        let mut written: BTreeMap<String, Written> = match api.list(&ListParams::default()).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|o| {
                    let name = o.metadata.name.clone()?;
                    owned_by.insert(name.clone(), owner_uid(&o));
                    let mut status = o.status?;
                    status.observed_time = None;
                    // Measurements from before this leader are refreshed on its first passes.
                    let at = since.checked_sub(config.refresh).unwrap_or(since);
                    Some((name, Written { status, at }))
                })
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "listing GpuNode objects; every node's view is rewritten");
                BTreeMap::new()
            }
        };
        let mut tick = tokio::time::interval(PASS);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Set while the API server does not serve gpunodes (the CRD is not installed): said
        // once, then tried again now and then rather than every pass.
        let mut missing_until: Option<Instant> = None;
        while *leading.borrow() {
            tokio::select! {
                _ = super::super::agents::stopped(&mut shutdown) => return,
                _ = leading.changed() => continue,
                _ = tick.tick() => {}
            }
            if !cache.is_ready() {
                continue;
            }
            let now = Instant::now();
            if missing_until.is_some_and(|until| now < until) {
                continue;
            }
            let mut desired: BTreeMap<String, GpuNodeStatus> = registry
                .all()
                .iter()
                .map(|n| (n.node.clone(), status_of(n)))
                .collect();
            if now.saturating_duration_since(since) >= agent_timeout {
                for (node, w) in &written {
                    if !desired.contains_key(node) && w.status.agent.connected {
                        let mut status = w.status.clone();
                        status.agent.connected = false;
                        desired.insert(node.clone(), status);
                    }
                }
            }
            let owners: BTreeMap<String, String> = cache.read(|s| {
                desired
                    .keys()
                    .filter_map(|n| {
                        let uid = s.nodes.get(n)?.metadata.uid.clone()?;
                        Some((n.clone(), uid))
                    })
                    .collect()
            });
            // A view is written only for a Node that exists: it is the view's owner.
            desired.retain(|n, _| owners.contains_key(n));
            written.retain(|n, _| {
                owners
                    .get(n)
                    .is_none_or(|uid| owned_by.get(n).is_none_or(|o| o == uid))
            });
            for node in plan(
                &desired,
                &written,
                now,
                config.refresh,
                config.writes_per_pass,
            ) {
                // `plan` names only nodes of `desired`, which keeps only nodes with an owner.
                let (Some(status), Some(owner)) = (desired.get(&node), owners.get(&node)) else {
                    continue;
                };
                match write(&api, &node, owner, status).await {
                    Ok(owner) => {
                        missing_until = None;
                        owned_by.insert(node.clone(), owner);
                        written.insert(
                            node,
                            Written {
                                status: status.clone(),
                                at: now,
                            },
                        );
                    }
                    Err(error) if super::gate::NotLeading::is(&error) => break,
                    Err(error) if is_not_found(&error) => {
                        if missing_until.is_none() {
                            tracing::warn!(
                                %error,
                                "the API server does not serve gpunodes.tessera.dev: install the \
                                 GpuNode CRD (deploy/crds/gpunodes.yaml, or upgrade the chart) for \
                                 `kubectl tessera gpus`; trying again every minute"
                            );
                        }
                        missing_until = Some(now + CRD_RETRY);
                        break;
                    }
                    Err(error) => tracing::warn!(%node, %error, "writing the node's GpuNode view"),
                }
            }
        }
    }
}

/// The uid of the Node that owns `view`.
fn owner_uid(view: &GpuNode) -> String {
    view.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Node")
        .map(|o| o.uid.clone())
        .unwrap_or_default()
}

/// Writes `status` as node `name`'s view, creating its object (owned by the Node, so it goes
/// with it) when there is none; returns the uid of the Node the object written is owned by.
async fn write(
    api: &Api<GpuNode>,
    name: &str,
    node_uid: &str,
    status: &GpuNodeStatus,
) -> Result<String, kube::Error> {
    let mut status = status.clone();
    status.observed_time = Some(jiff::Timestamp::now().to_string());
    let mut body = serde_json::to_value(&status).map_err(kube::Error::SerdeError)?;
    // A merge patch keeps fields it leaves out: an emptied GPU list must be said.
    if let Some(map) = body.as_object_mut() {
        map.entry("gpus").or_insert_with(|| serde_json::json!([]));
    }
    let patch = serde_json::json!({ "status": body });
    let params = PatchParams::default();
    // A 404 here is either no object yet or no such resource; the create tells which (its
    // 404 means the CRD is not served, and is returned).
    match api.patch_status(name, &params, &Patch::Merge(&patch)).await {
        Ok(view) => return Ok(owner_uid(&view)),
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(e),
    }
    let mut object = GpuNode::new(name, GpuNodeSpec {});
    object.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: name.to_owned(),
        uid: node_uid.to_owned(),
        ..OwnerReference::default()
    }]);
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    api.patch_status(name, &params, &Patch::Merge(&patch))
        .await
        .map(|view| owner_uid(&view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{GpuOccupancy, ShareInfo};
    use std::collections::{BTreeMap, BTreeSet};
    use tessera_core::model::Gpu;

    fn node(shares: &[(&str, u32)], util: u32) -> AgentNode {
        let gpus = vec![
            Gpu::new("n", 0, "A100", 81920),
            Gpu::new("n", 1, "A100", 81920),
        ];
        let mut occupancy = BTreeMap::new();
        occupancy.insert(
            gpus[0].uuid.clone(),
            GpuOccupancy {
                healthy: true,
                shares: shares
                    .iter()
                    .map(|(pod, pct)| ShareInfo {
                        pod_uid: format!("uid-{pod}"),
                        pod_namespace: "default".into(),
                        pod_name: (*pod).into(),
                        container: "main".into(),
                        memory_limit_mib: 81920 * u64::from(*pct) / 100,
                        compute_percent: *pct,
                        measured_memory_mib: 100,
                        measured_utilization_percent: util,
                        mig_instance_uuid: String::new(),
                    })
                    .collect(),
                used_memory_mib: 100,
                utilization_percent: util,
            },
        );
        AgentNode {
            node: "n".into(),
            agent_version: "0.1.0".into(),
            protocol_version: 2,
            gpus,
            shares_per_gpu: 10,
            occupancy,
            health_reasons: BTreeMap::new(),
            allocated_pods: BTreeSet::new(),
            occupancy_reports: 1,
            connected: true,
            last_seen: Instant::now(),
        }
    }

    #[test]
    fn a_view_shows_each_share_on_its_gpu_and_counts_free_gpus() {
        let mut n = node(&[("nb", 25)], 40);
        n.gpus[1].healthy = false;
        n.health_reasons
            .insert(n.gpus[1].uuid.clone(), "XID 79".into());
        let s = status_of(&n);
        assert_eq!(
            (s.model.as_str(), s.gpu_count, s.healthy_gpus),
            ("A100", 2, 1)
        );
        // GPU 0 holds the notebook; GPU 1 is unhealthy: nothing is free.
        assert_eq!(s.free_gpus, 0);
        assert_eq!(s.gpus[0].shares.len(), 1);
        let share = &s.gpus[0].shares[0];
        assert_eq!((share.pod.as_str(), share.compute_percent), ("nb", 25));
        assert_eq!(share.memory_mib, 20480);
        assert_eq!(s.gpus[1].health_reason, "XID 79");
        assert!(s.gpus[1].shares.is_empty());
    }

    #[test]
    fn the_plan_writes_changes_first_and_measurements_at_most_once_per_refresh() {
        let refresh = Duration::from_secs(30);
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let much_later = t0 + Duration::from_secs(40);
        let written_at = |status: GpuNodeStatus, at| Written { status, at };
        let a = status_of(&node(&[("nb", 25)], 40));
        let a_busier = status_of(&node(&[("nb", 25)], 90));
        let a_more = status_of(&node(&[("nb", 25), ("other", 50)], 40));
        let desired = |s: &GpuNodeStatus| BTreeMap::from([("a".to_owned(), s.clone())]);
        let cases = [
            // (what is wanted, what was written, now, expected)
            ("never written", desired(&a), BTreeMap::new(), t0, vec!["a"]),
            (
                "unchanged",
                desired(&a),
                BTreeMap::from([("a".to_owned(), written_at(a.clone(), t0))]),
                much_later,
                vec![],
            ),
            (
                "measurements only, too soon",
                desired(&a_busier),
                BTreeMap::from([("a".to_owned(), written_at(a.clone(), t0))]),
                later,
                vec![],
            ),
            (
                "measurements only, refresh passed",
                desired(&a_busier),
                BTreeMap::from([("a".to_owned(), written_at(a.clone(), t0))]),
                much_later,
                vec!["a"],
            ),
            (
                "a new share, at once",
                desired(&a_more),
                BTreeMap::from([("a".to_owned(), written_at(a.clone(), t0))]),
                later,
                vec!["a"],
            ),
        ];
        for (what, desired, written, now, want) in cases {
            assert_eq!(plan(&desired, &written, now, refresh, 10), want, "{what}");
        }
        // The budget: changed nodes before stale ones, stale ones the longest ago first.
        let desired: BTreeMap<String, GpuNodeStatus> = [
            ("stale-new", a_busier.clone()),
            ("stale-old", a_busier.clone()),
            ("changed", a_more.clone()),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_owned(), s))
        .collect();
        let written = BTreeMap::from([
            (
                "stale-new".to_owned(),
                written_at(a.clone(), t0 + Duration::from_secs(5)),
            ),
            ("stale-old".to_owned(), written_at(a.clone(), t0)),
            ("changed".to_owned(), written_at(a.clone(), t0)),
        ]);
        let now = t0 + Duration::from_secs(60);
        assert_eq!(
            plan(&desired, &written, now, refresh, 2),
            ["changed", "stale-old"]
        );
        assert_eq!(
            plan(&desired, &written, now, refresh, 10),
            ["changed", "stale-old", "stale-new"]
        );
        assert!(plan(&desired, &written, now, refresh, 0).is_empty());
    }
}
