//! `kubectl tessera queues`: the queue hierarchy as a tree, in GPUs, from the Queue objects'
//! spec and the status the coordinator writes (allocated, requested, fair share).
//!
//! Queue status carries no usage history yet, so none is shown; `pending` is what the queue's
//! waiting pods ask for (requested − allocated: the demand the coordinator computed the fair
//! share from, which leaves out a gang it refuses outright).

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Api, ListParams};
use serde::Serialize;
use tessera_contract::crd::Queue;

use crate::client::crd_read;
use crate::format::{columns, gpus};

/// Every Queue object, by name.
pub(crate) async fn fetch(client: &kube::Client) -> anyhow::Result<Vec<Queue>> {
    let api: Api<Queue> = Api::all(client.clone());
    let mut queues = crd_read(api.list(&ListParams::default()).await, "queues")?.items;
    queues.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(queues)
}

/// One queue's GPU figures, and its children.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QueueNode {
    /// Queue name.
    pub(crate) name: String,
    /// Parent as the spec names it (absent for a top-level queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<String>,
    /// Priority among siblings.
    pub(crate) priority: i32,
    /// Deserved GPUs (`spec.gpu.quota`).
    pub(crate) deserved: f64,
    /// Over-quota weight.
    pub(crate) weight: f64,
    /// Hard cap in GPUs; `None` = no limit.
    pub(crate) limit: Option<f64>,
    /// Fair share the coordinator computed last (`None` until it has written status).
    pub(crate) fair_share: Option<f64>,
    /// GPUs held by the queue's running pods (its subtree's).
    pub(crate) allocated: Option<f64>,
    /// GPUs its pods ask for and do not hold yet.
    pub(crate) pending: Option<f64>,
    /// The coordinator's `Valid` condition message when the queue is invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) invalid: Option<String>,
    /// Child queues.
    pub(crate) children: Vec<QueueNode>,
}

fn node(q: &Queue) -> QueueNode {
    let gpu = q.spec.gpu.clone().unwrap_or_default();
    let status = q.status.as_ref();
    let allocated = status.and_then(|s| s.allocated.as_ref()).map(|a| a.gpu);
    let requested = status.and_then(|s| s.requested.as_ref()).map(|a| a.gpu);
    QueueNode {
        name: q.metadata.name.clone().unwrap_or_default(),
        parent: q.spec.parent.clone(),
        priority: q.spec.priority,
        deserved: gpu.quota,
        weight: gpu.over_quota_weight,
        limit: (gpu.limit >= 0.0).then_some(gpu.limit),
        fair_share: status.and_then(|s| s.fair_share.as_ref()).map(|a| a.gpu),
        allocated,
        pending: requested.map(|r| (r - allocated.unwrap_or(0.0)).max(0.0)),
        invalid: status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Valid" && c.status == "False")
                .map(|c| c.message.clone())
        }),
        children: Vec::new(),
    }
}

/// The forest: top-level queues (and queues whose parent does not exist) as roots, children
/// by name. A queue in a parent cycle (which the API server lets through and the coordinator
/// marks invalid) is shown once, as a root.
pub(crate) fn tree(queues: &[Queue]) -> Vec<QueueNode> {
    let names: BTreeSet<&str> = queues
        .iter()
        .filter_map(|q| q.metadata.name.as_deref())
        .collect();
    let mut children: BTreeMap<&str, Vec<&Queue>> = BTreeMap::new();
    let mut roots = Vec::new();
    for q in queues {
        match q.spec.parent.as_deref() {
            Some(p) if names.contains(p) => children.entry(p).or_default().push(q),
            _ => roots.push(q),
        }
    }
    let mut placed: BTreeSet<String> = BTreeSet::new();
    fn build<'a>(
        q: &'a Queue,
        children: &BTreeMap<&str, Vec<&'a Queue>>,
        placed: &mut BTreeSet<String>,
    ) -> QueueNode {
        let mut n = node(q);
        placed.insert(n.name.clone());
        for c in children.get(n.name.as_str()).into_iter().flatten() {
            let name = c.metadata.name.clone().unwrap_or_default();
            if !placed.contains(&name) {
                let child = build(c, children, placed);
                n.children.push(child);
            }
        }
        n
    }
    let mut forest: Vec<QueueNode> = roots
        .into_iter()
        .map(|q| build(q, &children, &mut placed))
        .collect();
    // Queues only reachable through a cycle.
    for q in queues {
        let name = q.metadata.name.clone().unwrap_or_default();
        if !placed.contains(&name) {
            let n = build(q, &children, &mut placed);
            forest.push(n);
        }
    }
    forest
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), gpus)
}

/// The tree as aligned columns, children indented under their parent.
pub(crate) fn table(queues: &[Queue]) -> String {
    if queues.is_empty() {
        return "No queues: create Queue objects (docs/queues.md); pods without a queue label use \
                the queue `default`.\n"
            .to_owned();
    }
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    fn walk(
        n: &QueueNode,
        prefix: &str,
        branch: &str,
        rows: &mut Vec<Vec<String>>,
        notes: &mut Vec<String>,
    ) {
        let mut label = format!("{prefix}{branch}{}", n.name);
        if let Some(p) = &n.parent
            && branch.is_empty()
        {
            label.push_str(&format!(" (parent {p} missing or in a cycle)"));
        }
        if let Some(why) = &n.invalid {
            notes.push(format!("{}: invalid: {why}", n.name));
            label.push_str(" !");
        }
        rows.push(vec![
            label,
            gpus(n.deserved),
            opt(n.fair_share),
            opt(n.allocated),
            opt(n.pending),
            opt(n.limit),
            gpus(n.weight),
            n.priority.to_string(),
        ]);
        let child_prefix = match branch {
            "" => prefix.to_owned(),
            "├─ " => format!("{prefix}│  "),
            _ => format!("{prefix}   "),
        };
        for (i, c) in n.children.iter().enumerate() {
            let last = i + 1 == n.children.len();
            walk(
                c,
                &child_prefix,
                if last { "└─ " } else { "├─ " },
                rows,
                notes,
            );
        }
    }
    for root in tree(queues) {
        walk(&root, "", "", &mut rows, &mut notes);
    }
    let mut out = columns(
        &[
            "QUEUE",
            "DESERVED",
            "FAIR SHARE",
            "ALLOCATED",
            "PENDING",
            "LIMIT",
            "WEIGHT",
            "PRIORITY",
        ],
        &rows,
    );
    out.push_str(
        "GPUs. Allocated and pending count a queue's whole subtree; - = not reported yet.\n",
    );
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

/// `{"queues": [tree]}`.
pub(crate) fn json(queues: &[Queue]) -> serde_json::Value {
    serde_json::json!({ "queues": tree(queues) })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tessera_contract::crd::{Condition, GpuQuota, QueueSpec, QueueStatus, ResourceAmounts};

    fn amounts(gpu: f64) -> Option<ResourceAmounts> {
        Some(ResourceAmounts {
            gpu,
            ..ResourceAmounts::default()
        })
    }

    pub(crate) fn queue(
        name: &str,
        parent: Option<&str>,
        quota: f64,
        status: Option<(f64, f64, f64)>,
    ) -> Queue {
        let mut q = Queue::new(
            name,
            QueueSpec {
                parent: parent.map(str::to_owned),
                gpu: Some(GpuQuota {
                    quota,
                    ..GpuQuota::default()
                }),
                ..QueueSpec::default()
            },
        );
        q.status = status.map(|(fair, allocated, requested)| QueueStatus {
            fair_share: amounts(fair),
            allocated: amounts(allocated),
            requested: amounts(requested),
            ..QueueStatus::default()
        });
        q
    }

    #[test]
    fn the_tree_nests_children_under_parents() {
        let mut capped = queue("vision", Some("research"), 4.0, Some((4.5, 2.0, 4.0)));
        capped.spec.gpu.as_mut().unwrap().limit = 6.0;
        let mut broken = queue("loop-a", Some("loop-b"), 0.0, None);
        broken.status = Some(QueueStatus {
            conditions: vec![Condition {
                type_: "Valid".into(),
                status: "False".into(),
                message: "spec.parent: a cycle".into(),
                ..Condition::default()
            }],
            ..QueueStatus::default()
        });
        let queues = vec![
            queue("default", None, 0.0, Some((0.0, 0.25, 0.25))),
            broken,
            queue("loop-b", Some("loop-a"), 0.0, None),
            queue("llm", Some("research"), 4.0, Some((8.0, 8.0, 8.0))),
            queue("orphan", Some("gone"), 1.0, None),
            queue("research", None, 8.0, Some((12.5, 10.0, 12.0))),
            capped,
        ];
        let want = "\
QUEUE                                           DESERVED  FAIR SHARE  ALLOCATED  PENDING  LIMIT  WEIGHT  PRIORITY
default                                         0         0           0.25       0        -      1       0
orphan (parent gone missing or in a cycle)      1         -           -          -        -      1       0
research                                        8         12.5        10         2        -      1       0
├─ llm                                          4         8           8          0        -      1       0
└─ vision                                       4         4.5         2          2        6      1       0
loop-a (parent loop-b missing or in a cycle) !  0         -           -          -        -      1       0
└─ loop-b                                       0         -           -          -        -      1       0
GPUs. Allocated and pending count a queue's whole subtree; - = not reported yet.
loop-a: invalid: spec.parent: a cycle
";
        assert_eq!(table(&queues), want);
        let v = json(&queues);
        let research = &v["queues"][2];
        assert_eq!(research["name"], "research");
        assert_eq!(research["children"][1]["name"], "vision");
        assert_eq!(research["children"][1]["limit"], 6.0);
        assert_eq!(research["pending"], 2.0);
    }
}
