//! `kubectl tessera gpus`: every GPU node's GPUs from the coordinator's `GpuNode` views — one
//! row per GPU and per share held on it.

use std::collections::BTreeSet;

use kube::api::{Api, ListParams};
use serde::Serialize;
use tessera_contract::crd::{GpuNode, GpuNodeStatus, GpuView, ShareView};

use crate::client::crd_read;
use crate::format::{columns, gib};

/// Every `GpuNode` view, by node name.
pub(crate) async fn fetch(client: &kube::Client) -> anyhow::Result<Vec<GpuNode>> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let mut nodes = crd_read(api.list(&ListParams::default()).await, "gpunodes")?.items;
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(nodes)
}

fn name(node: &GpuNode) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// Who holds a share, as `namespace/pod (container)`.
pub(crate) fn holder(share: &ShareView) -> String {
    let pod = if share.pod.is_empty() {
        format!("pod uid {}", short(&share.pod_uid))
    } else {
        format!("{}/{}", share.namespace, share.pod)
    };
    if share.container.is_empty() {
        pod
    } else {
        format!("{pod} ({})", share.container)
    }
}

fn short(uid: &str) -> &str {
    if uid.is_empty() {
        "unknown"
    } else {
        uid.get(..8).unwrap_or(uid)
    }
}

fn health(g: &GpuView) -> String {
    match (g.healthy, g.health_reason.is_empty()) {
        (true, _) => "healthy".to_owned(),
        (false, true) => "unhealthy".to_owned(),
        (false, false) => format!("unhealthy ({})", g.health_reason),
    }
}

fn model(g: &GpuView) -> String {
    match &g.mig_profiles {
        Some(p) if !p.is_empty() => format!("{} MIG {}", g.model, p.join(",")),
        Some(_) => format!("{} MIG", g.model),
        None => g.model.clone(),
    }
}

/// The table: a row per GPU (its first share on the same row) and a row per further share.
pub(crate) fn table(nodes: &[GpuNode]) -> String {
    if nodes.is_empty() {
        return "No GpuNode views: no tessera-agent has reported to the coordinator yet (or the \
                coordinator runs with --gpu-view-writes-per-sec 0).\n"
            .to_owned();
    }
    let mut rows = Vec::new();
    let mut offline = Vec::new();
    let mut waiting = Vec::new();
    for node in nodes {
        let Some(status) = &node.status else {
            waiting.push(name(node).to_owned());
            continue;
        };
        if !status.agent.connected {
            offline.push(name(node).to_owned());
        }
        for g in &status.gpus {
            let gpu_cells = vec![
                name(node).to_owned(),
                g.index.to_string(),
                model(g),
                format!("{}/{}", gib(g.used_memory_mib), gib(g.memory_mib)),
                format!("{}%", g.utilization_percent),
                health(g),
            ];
            if g.shares.is_empty() {
                let mut row = gpu_cells.clone();
                row.extend(["-".to_owned(), String::new(), String::new(), String::new()]);
                rows.push(row);
            }
            for (i, s) in g.shares.iter().enumerate() {
                let mut row = if i == 0 {
                    gpu_cells.clone()
                } else {
                    vec![String::new(); gpu_cells.len()]
                };
                row.extend([
                    holder(s),
                    format!("{}%", s.compute_percent),
                    gib(s.memory_mib),
                    format!(
                        "{} {}%",
                        gib(s.measured_memory_mib),
                        s.measured_utilization_percent
                    ),
                ]);
                rows.push(row);
            }
        }
    }
    let mut out = columns(
        &[
            "NODE",
            "GPU",
            "MODEL",
            "MEMORY USED/TOTAL",
            "UTIL",
            "HEALTH",
            "HELD BY",
            "COMPUTE",
            "MEMORY",
            "MEASURED",
        ],
        &rows,
    );
    out.push_str(&summary(nodes));
    if !offline.is_empty() {
        out.push_str(&format!(
            "Agents not connected to the coordinator: {} (their GPUs as last reported).\n",
            offline.join(", ")
        ));
    }
    if !waiting.is_empty() {
        out.push_str(&format!("Not reported yet: {}.\n", waiting.join(", ")));
    }
    out
}

/// One line of totals.
pub(crate) fn summary(nodes: &[GpuNode]) -> String {
    let statuses: Vec<&GpuNodeStatus> = nodes.iter().filter_map(|n| n.status.as_ref()).collect();
    let gpus: u32 = statuses.iter().map(|s| s.gpu_count).sum();
    let healthy: u32 = statuses.iter().map(|s| s.healthy_gpus).sum();
    let free: u32 = statuses.iter().map(|s| s.free_gpus).sum();
    let pods: BTreeSet<(&str, &str, &str)> = statuses
        .iter()
        .flat_map(|s| s.gpus.iter())
        .flat_map(|g| g.shares.iter())
        .map(|s| (s.namespace.as_str(), s.pod.as_str(), s.pod_uid.as_str()))
        .collect();
    format!(
        "{} nodes, {gpus} GPUs: {healthy} healthy, {free} free (no share held); {} pods hold shares.\n",
        nodes.len(),
        pods.len()
    )
}

/// One node's view in the JSON output.
#[derive(Serialize)]
struct NodeJson<'a> {
    node: &'a str,
    #[serde(flatten)]
    status: Option<&'a GpuNodeStatus>,
}

/// `{"nodes": [{"node": NAME, …its GpuNode status}]}`.
pub(crate) fn json(nodes: &[GpuNode]) -> serde_json::Value {
    let nodes: Vec<NodeJson<'_>> = nodes
        .iter()
        .map(|n| NodeJson {
            node: name(n),
            status: n.status.as_ref(),
        })
        .collect();
    serde_json::json!({ "nodes": nodes })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tessera_contract::crd::{AgentView, GpuNodeSpec};

    pub(crate) fn gpu(index: u32, shares: Vec<ShareView>) -> GpuView {
        GpuView {
            index,
            uuid: format!("GPU-{index}"),
            model: "L40S".into(),
            memory_mib: 46068,
            healthy: true,
            used_memory_mib: shares.iter().map(|s| s.measured_memory_mib).sum(),
            utilization_percent: shares.iter().map(|s| s.measured_utilization_percent).sum(),
            shares,
            ..GpuView::default()
        }
    }

    pub(crate) fn share(pod: &str, compute_percent: u32, memory_mib: u64) -> ShareView {
        ShareView {
            pod_uid: format!("uid-{pod}"),
            namespace: "default".into(),
            pod: pod.into(),
            container: "main".into(),
            compute_percent,
            memory_mib,
            measured_memory_mib: 1024,
            measured_utilization_percent: 10,
            mig_instance: String::new(),
        }
    }

    pub(crate) fn node(name: &str, connected: bool, gpus: Vec<GpuView>) -> GpuNode {
        let mut n = GpuNode::new(name, GpuNodeSpec {});
        n.status = Some(GpuNodeStatus {
            observed_time: Some("2026-01-01T12:00:00Z".into()),
            agent: AgentView {
                connected,
                version: "0.1.0".into(),
                shares_per_gpu: 10,
            },
            model: "L40S".into(),
            gpu_count: gpus.len() as u32,
            healthy_gpus: gpus.iter().filter(|g| g.healthy).count() as u32,
            free_gpus: gpus
                .iter()
                .filter(|g| g.healthy && g.shares.is_empty())
                .count() as u32,
            gpus,
        });
        n
    }

    #[test]
    fn the_table_has_a_row_per_gpu_and_per_share() {
        let mut bad = gpu(2, vec![]);
        bad.healthy = false;
        bad.health_reason = "XID 79".into();
        let nodes = vec![
            node(
                "l40s-0",
                true,
                vec![
                    gpu(
                        0,
                        vec![share("notebook", 25, 11517), share("serve", 50, 23034)],
                    ),
                    gpu(1, vec![]),
                    bad,
                ],
            ),
            node("old", false, vec![gpu(0, vec![share("train", 100, 46068)])]),
        ];
        let want = "\
NODE    GPU  MODEL  MEMORY USED/TOTAL  UTIL  HEALTH              HELD BY                  COMPUTE  MEMORY  MEASURED
l40s-0  0    L40S   2.0Gi/45.0Gi       20%   healthy             default/notebook (main)  25%      11.2Gi  1.0Gi 10%
                                                                 default/serve (main)     50%      22.5Gi  1.0Gi 10%
l40s-0  1    L40S   0.0Gi/45.0Gi       0%    healthy             -
l40s-0  2    L40S   0.0Gi/45.0Gi       0%    unhealthy (XID 79)  -
old     0    L40S   1.0Gi/45.0Gi       10%   healthy             default/train (main)     100%     45.0Gi  1.0Gi 10%
2 nodes, 4 GPUs: 3 healthy, 1 free (no share held); 3 pods hold shares.
Agents not connected to the coordinator: old (their GPUs as last reported).
";
        assert_eq!(table(&nodes), want);
        assert!(table(&[]).starts_with("No GpuNode views"));
    }

    #[test]
    fn the_json_is_each_nodes_status_under_its_name() {
        let nodes = vec![node(
            "l40s-0",
            true,
            vec![gpu(0, vec![share("nb", 25, 11517)])],
        )];
        let v = json(&nodes);
        assert_eq!(v["nodes"][0]["node"], "l40s-0");
        assert_eq!(v["nodes"][0]["gpus"][0]["uuid"], "GPU-0");
        assert_eq!(v["nodes"][0]["gpus"][0]["shares"][0]["pod"], "nb");
        assert_eq!(v["nodes"][0]["gpus"][0]["shares"][0]["computePercent"], 25);
        assert_eq!(v["nodes"][0]["agent"]["connected"], true);
    }
}
