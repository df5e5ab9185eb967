//! `kubectl tessera why POD`: the pod's pending reason as the coordinator wrote it (its
//! PodScheduled condition and FailedScheduling events), each GPU node judged against its
//! request (`fit`), and what would make it fit, saying what could not be read or checked.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;
use tessera_contract::crd::{GpuNode, GpuNodeStatus, PodGroup, Queue};
use tessera_contract::keys;

use crate::client::{VIEWER_ROLE, is_forbidden, is_not_found};
use crate::fit::{self, Demand, Verdict};
use crate::format::{ago, columns, gpus, timestamp};

/// Everything `why` found out.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    /// Pod namespace.
    pub(crate) namespace: String,
    /// Pod name.
    pub(crate) pod: String,
    /// Pod UID.
    pub(crate) uid: String,
    /// `status.phase`.
    pub(crate) phase: String,
    /// The node it is bound to, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) node: Option<String>,
    /// `spec.schedulerName`.
    pub(crate) scheduler: String,
    /// Its queue (label, PodGroup, or `default`).
    pub(crate) queue: String,
    /// Its pod group, if it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<Group>,
    /// What it asks of GPUs, or why that cannot be read.
    pub(crate) asks: String,
    /// The PodScheduled condition, when it is False.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) condition: Option<Said>,
    /// Its FailedScheduling events, the most recent first.
    pub(crate) events: Vec<Said>,
    /// Each GPU node judged for it.
    pub(crate) nodes: Vec<NodeVerdict>,
    /// What would make it fit.
    pub(crate) would_fit: Vec<String>,
    /// What could not be read or is not checked here.
    pub(crate) notes: Vec<String>,
}

/// The pod's gang.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Group {
    /// PodGroup name.
    pub(crate) name: String,
    /// Pods placed together (the PodGroup's `minMember`, or the annotation's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_member: Option<i32>,
    /// The PodGroup's phase, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) phase: Option<String>,
}

/// A message the cluster wrote about the pod.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Said {
    /// Reason (`Unschedulable`, `FailedScheduling`).
    pub(crate) reason: String,
    /// Message.
    pub(crate) message: String,
    /// How many times (events aggregate).
    pub(crate) count: i32,
    /// When last (RFC 3339), if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) at: Option<String>,
}

/// One GPU node's verdict.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeVerdict {
    /// Node name.
    pub(crate) node: String,
    /// GPUs, healthy and free (no share held), by its agent's report.
    pub(crate) gpus: u32,
    /// Healthy GPUs.
    pub(crate) healthy: u32,
    /// Free GPUs.
    pub(crate) free: u32,
    /// Whether it fits there now by the agent's report (and the checks made here).
    pub(crate) fits_now: bool,
    /// Whether freeing capacity there would make it fit.
    pub(crate) could_fit: bool,
    /// How many pods like it (whole GPUs) its idle GPUs hold now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) room: Option<u32>,
    /// The verdict in words.
    pub(crate) verdict: String,
}

/// What was read for the pod; each read may have failed (then a note says so).
pub(crate) struct Inputs {
    /// The pod.
    pub(crate) pod: Pod,
    /// Its events.
    pub(crate) events: Result<Vec<Event>, String>,
    /// The GPU nodes' views.
    pub(crate) views: Result<Vec<GpuNode>, String>,
    /// The Nodes.
    pub(crate) nodes: Result<Vec<Node>, String>,
    /// Its queue's object, if read.
    pub(crate) queue: Result<Option<Queue>, String>,
    /// Its PodGroup, if it names one and it was read.
    pub(crate) group: Result<Option<PodGroup>, String>,
}

fn label<'a>(pod: &'a Pod, keys: &[&str]) -> Option<&'a str> {
    let l = pod.metadata.labels.as_ref()?;
    keys.iter().find_map(|k| l.get(*k).map(String::as_str))
}

fn annotation<'a>(pod: &'a Pod, keys: &[&str]) -> Option<&'a str> {
    let a = pod.metadata.annotations.as_ref()?;
    keys.iter().find_map(|k| a.get(*k).map(String::as_str))
}

/// The pod group the pod names.
fn group_name(pod: &Pod) -> Option<&str> {
    annotation(pod, &[keys::POD_GROUP, keys::POD_GROUP_ALIAS])
}

/// A read's failure in words; a refusal says which role grants it.
fn failed(what: &str, error: &kube::Error) -> String {
    if is_forbidden(error) {
        format!("cannot read {what}: permission denied (the ClusterRole {VIEWER_ROLE} grants it)")
    } else {
        format!("cannot read {what}: {error}")
    }
}

/// Which pod `why` explains.
#[derive(Clone, Debug)]
pub(crate) enum Which {
    /// By name.
    Name(String),
    /// The first pod a label selector matches that is not bound yet (else the first match).
    Selector(String),
}

/// Reads the pod and everything about it the user may read.
pub(crate) async fn explain(
    client: &kube::Client,
    namespace: &str,
    which: &Which,
) -> anyhow::Result<Report> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = match which {
        Which::Name(name) => match pods.get(name).await {
            Ok(p) => p,
            Err(e) if is_not_found(&e) => {
                anyhow::bail!("pod {namespace}/{name} not found (is -n right?)")
            }
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(format!("reading pod {namespace}/{name}"))
                );
            }
        },
        Which::Selector(selector) => {
            let mut matched = pods
                .list(&ListParams::default().labels(selector))
                .await
                .map_err(|e| {
                    anyhow::Error::new(e)
                        .context(format!("listing pods in {namespace} with -l {selector}"))
                })?
                .items;
            matched.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let unbound = matched
                .iter()
                .position(|p| p.spec.as_ref().is_none_or(|s| s.node_name.is_none()));
            match unbound.or((!matched.is_empty()).then_some(0)) {
                Some(i) => matched.swap_remove(i),
                None => anyhow::bail!("no pod in namespace {namespace} matches -l {selector}"),
            }
        }
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let events = events
        .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
        .await
        .map(|l| l.items)
        .map_err(|e| failed(&format!("events in {namespace}"), &e));
    let views = Api::<GpuNode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| failed("gpunodes.tessera.dev", &e));
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| failed("nodes", &e));
    let group = match group_name(&pod) {
        Some(g) => match Api::<PodGroup>::namespaced(client.clone(), namespace)
            .get(g)
            .await
        {
            Ok(g) => Ok(Some(g)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(failed(&format!("PodGroup {g}"), &e)),
        },
        None => Ok(None),
    };
    let queue_name = queue_of(&pod, group.as_ref().ok().and_then(Option::as_ref));
    let queue = match Api::<Queue>::all(client.clone()).get(&queue_name).await {
        Ok(q) => Ok(Some(q)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(failed(&format!("queue {queue_name}"), &e)),
    };
    Ok(report(Inputs {
        pod,
        events,
        views,
        nodes,
        queue,
        group,
    }))
}

fn queue_of(pod: &Pod, group: Option<&PodGroup>) -> String {
    label(pod, &[keys::QUEUE, keys::QUEUE_ALIAS])
        .map(str::to_owned)
        .or_else(|| group.and_then(|g| g.spec.queue.clone()))
        .unwrap_or_else(|| keys::DEFAULT_QUEUE.to_owned())
}

/// The report from what was read: pure, so every message is table-tested.
pub(crate) fn report(inputs: Inputs) -> Report {
    let Inputs {
        pod,
        events,
        views,
        nodes,
        queue,
        group,
    } = inputs;
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let mut r = Report {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        phase: status.phase.clone().unwrap_or_else(|| "Unknown".into()),
        node: spec.node_name.clone(),
        scheduler: spec
            .scheduler_name
            .clone()
            .unwrap_or_else(|| keys::DEFAULT_SCHEDULER.into()),
        ..Report::default()
    };
    let group_obj = match group {
        Ok(g) => g,
        Err(note) => {
            r.notes.push(note);
            None
        }
    };
    r.queue = queue_of(&pod, group_obj.as_ref());
    if let Some(name) = group_name(&pod) {
        r.group = Some(Group {
            name: name.to_owned(),
            min_member: group_obj.as_ref().map(|g| g.spec.min_member).or_else(|| {
                annotation(&pod, &[keys::MIN_MEMBER]).and_then(|m| m.trim().parse().ok())
            }),
            phase: group_obj
                .as_ref()
                .and_then(|g| g.status.as_ref())
                .and_then(|s| s.phase.clone()),
        });
    }
    let demand = fit::demand(&pod);
    r.asks = match &demand {
        Ok(d) => d.to_string(),
        Err(e) => format!("cannot be read: {e}"),
    };
    if let Some(node) = &r.node {
        r.would_fit.push(format!(
            "nothing: it is bound to node {node} (phase {}); `kubectl describe pod` tells the rest",
            r.phase
        ));
        return r;
    }
    if r.scheduler == keys::DEFAULT_SCHEDULER {
        r.notes.push(format!(
            "its schedulerName is {}: kube-scheduler, not Tessera, places it",
            keys::DEFAULT_SCHEDULER
        ));
    }
    r.condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| Said {
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            count: 1,
            at: c.last_transition_time.as_ref().map(|t| t.0.to_string()),
        });
    match events {
        Ok(mut list) => {
            list.retain(|e| e.reason.as_deref() == Some("FailedScheduling"));
            let when = |e: &Event| {
                e.last_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .or_else(|| e.event_time.as_ref().map(|t| t.0))
                    .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
            };
            list.sort_by_key(|e| std::cmp::Reverse(when(e)));
            r.events = list
                .iter()
                .take(3)
                .map(|e| Said {
                    reason: e.reason.clone().unwrap_or_default(),
                    message: e.message.clone().unwrap_or_default(),
                    count: e.count.unwrap_or(1),
                    at: when(e).map(|t| t.to_string()),
                })
                .collect();
        }
        Err(note) => r.notes.push(note),
    }
    let nodes_by_name: BTreeMap<String, Node> = match nodes {
        Ok(list) => list
            .into_iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, n)))
            .collect(),
        Err(note) => {
            r.notes
                .push(format!("{note}; cordons, taints and labels not checked"));
            BTreeMap::new()
        }
    };
    let views = match views {
        Ok(v) => v,
        Err(note) => {
            r.notes.push(format!("{note}; no per-node breakdown"));
            Vec::new()
        }
    };
    let Ok(demand) = demand else {
        r.would_fit.push(format!(
            "a request Tessera can read: its GPU request {} (the condition above names the field)",
            r.asks
        ));
        return r;
    };
    judge_nodes(&mut r, &pod, &demand, &nodes_by_name, &views);
    let queue = match queue {
        Ok(q) => q,
        Err(note) => {
            r.notes.push(note);
            None
        }
    };
    suggest(&mut r, &demand, queue.as_ref());
    if r.condition.is_none() && r.events.is_empty() {
        r.notes.push(format!(
            "the coordinator has written no reason for it yet (its scheduler is {}); a new pod gets one within a cycle",
            r.scheduler
        ));
    }
    if !r.nodes.is_empty() {
        r.notes.push(
            "checked here: GPUs by the agents' last reports, cordons, taints, nodeSelector and \
             required node affinity; inter-pod affinity, topology spread, CPU, memory, ports, \
             volumes, gangs and queues only in the coordinator's message"
                .to_owned(),
        );
    }
    r
}

fn judge_nodes(
    r: &mut Report,
    pod: &Pod,
    demand: &Demand,
    nodes: &BTreeMap<String, Node>,
    views: &[GpuNode],
) {
    for view in views {
        let Some(name) = view.metadata.name.clone() else {
            continue;
        };
        let status: Option<&GpuNodeStatus> = view.status.as_ref();
        let verdict: Verdict = fit::judge(pod, demand, nodes.get(&name), status);
        r.nodes.push(NodeVerdict {
            node: name,
            gpus: status.map_or(0, |s| s.gpu_count),
            healthy: status.map_or(0, |s| s.healthy_gpus),
            free: status.map_or(0, |s| s.free_gpus),
            fits_now: verdict == Verdict::FitsNow,
            could_fit: verdict.could_fit(),
            room: status.and_then(|s| fit::room(demand, &verdict, &s.gpus)),
            verdict: verdict.text(demand),
        });
    }
    if !views.is_empty() {
        let without = nodes.len().saturating_sub(
            nodes
                .keys()
                .filter(|n| views.iter().any(|v| v.metadata.name.as_ref() == Some(n)))
                .count(),
        );
        if without > 0 && demand.count > 0 {
            r.notes.push(format!(
                "{without} nodes have no tessera-agent view (no GPUs of Tessera's there)"
            ));
        }
    }
}

fn suggest(r: &mut Report, demand: &Demand, queue: Option<&Queue>) {
    let now: Vec<&NodeVerdict> = r.nodes.iter().filter(|n| n.fits_now).collect();
    if !now.is_empty() {
        let names: Vec<&str> = now.iter().take(5).map(|n| n.node.as_str()).collect();
        r.would_fit.push(format!(
            "its GPUs are free now on {}{}: what holds it is in the coordinator's message above \
             (its gang, its queue, or a constraint checked only there)",
            names.join(", "),
            if now.len() > 5 {
                format!(" and {} more", now.len() - 5)
            } else {
                String::new()
            }
        ));
    } else {
        let mut freeing: Vec<&NodeVerdict> = r.nodes.iter().filter(|n| n.could_fit).collect();
        freeing.sort_by_key(|n| std::cmp::Reverse(n.free));
        for n in freeing.iter().take(3) {
            r.would_fit.push(format!("node {}: {}", n.node, n.verdict));
        }
        if freeing.is_empty() && !r.nodes.is_empty() {
            let most = r.nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
            r.would_fit.push(if demand.count > most {
                format!(
                    "no node has {} GPUs (the largest has {most}): ask for at most {most} per pod, \
                     or add a larger node",
                    demand.count
                )
            } else {
                "no node passes the checks above: see each node's verdict".to_owned()
            });
        }
    }
    if let Some(group) = &r.group
        && let Some(min) = group.min_member
        && min > 1
    {
        let room = (demand.per_gpu == fit::PerGpu::Whole && !r.nodes.is_empty())
            .then(|| r.nodes.iter().filter_map(|n| n.room).sum::<u32>());
        r.would_fit.push(match room {
            Some(room) => format!(
                "its gang {} places {min} pods at once or none: room for all {min} is needed \
                 together; the GPU nodes' idle GPUs hold {room} such pods now",
                group.name
            ),
            None => format!(
                "its gang {} places {min} pods at once or none: room for all {min} is needed together",
                group.name
            ),
        });
    }
    let Some(q) = queue else {
        r.notes
            .push(format!("queue {} not found or not readable", r.queue));
        return;
    };
    let status = q.status.as_ref();
    let allocated = status.and_then(|s| s.allocated.as_ref()).map(|a| a.gpu);
    let fair = status.and_then(|s| s.fair_share.as_ref()).map(|a| a.gpu);
    let limit = q.spec.gpu.as_ref().map_or(-1.0, |g| g.limit);
    let asks = f64::from(demand.count)
        * match demand.per_gpu {
            fit::PerGpu::Whole => 1.0,
            fit::PerGpu::Fraction(m) => f64::from(m) / 1000.0,
            // A memory share is charged as the share of the GPU it takes, unknown here.
            fit::PerGpu::Memory(_) => 0.0,
        };
    // The pod counts in the queue's demand (and so in its fair share) only when the
    // coordinator took it for a job it can place; a gang larger than the cluster is not.
    let requested = status.and_then(|s| s.requested.as_ref()).map(|a| a.gpu);
    let counted = matches!((requested, allocated), (Some(r), Some(a)) if r - a + 1e-9 >= asks);
    if let Some(a) = allocated
        && limit >= 0.0
        && a + asks > limit + 1e-9
    {
        r.would_fit.push(format!(
            "queue {} holds {} of its limit {} GPUs: it fits once the queue holds at most {}",
            r.queue,
            gpus(a),
            gpus(limit),
            gpus((limit - asks).max(0.0))
        ));
    } else if let (Some(a), Some(f)) = (allocated, fair)
        && counted
        && a + asks > f + 1e-9
    {
        r.would_fit.push(format!(
            "queue {} holds {} GPUs against a fair share of {}: beyond it the pod waits for idle \
             GPUs and cannot reclaim",
            r.queue,
            gpus(a),
            gpus(f)
        ));
    }
}

/// The report for people.
pub(crate) fn text(r: &Report) -> String {
    text_at(r, jiff::Timestamp::now())
}

/// [`text`] with the time ages are counted from.
pub(crate) fn text_at(r: &Report, now: jiff::Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Pod {}/{} ({}), uid {}",
        r.namespace,
        r.pod,
        match &r.node {
            Some(n) => format!("{} on node {n}", r.phase),
            None => format!("{}, not bound", r.phase),
        },
        r.uid
    );
    let _ = write!(
        out,
        "Asks: {}   queue: {}   scheduler: {}",
        r.asks, r.queue, r.scheduler
    );
    if let Some(g) = &r.group {
        let _ = write!(out, "   gang: {}", g.name);
        if let Some(m) = g.min_member {
            let _ = write!(out, " (minMember {m})");
        }
        if let Some(p) = &g.phase {
            let _ = write!(out, " {p}");
        }
    }
    out.push('\n');
    if let Some(c) = &r.condition {
        let _ = writeln!(
            out,
            "\nThe coordinator says ({}, {} ago):\n  {}",
            c.reason,
            ago(timestamp(c.at.as_deref()), now),
            c.message
        );
    }
    if !r.events.is_empty() {
        let _ = writeln!(out, "\nRecent FailedScheduling events:");
        for e in &r.events {
            let _ = writeln!(
                out,
                "  {} ago (x{}): {}",
                ago(timestamp(e.at.as_deref()), now),
                e.count,
                e.message
            );
        }
    }
    if !r.nodes.is_empty() {
        let _ = writeln!(out, "\nGPU nodes (by the agents' last reports):");
        let rows: Vec<Vec<String>> = r
            .nodes
            .iter()
            .map(|n| {
                vec![
                    format!("  {}", n.node),
                    n.gpus.to_string(),
                    n.healthy.to_string(),
                    n.free.to_string(),
                    n.verdict.clone(),
                ]
            })
            .collect();
        out.push_str(&columns(
            &["  NODE", "GPUS", "HEALTHY", "FREE", "VERDICT"],
            &rows,
        ));
    }
    if !r.would_fit.is_empty() {
        let _ = writeln!(out, "\nWhat would make it fit:");
        for s in &r.would_fit {
            let _ = writeln!(out, "  - {s}");
        }
    }
    if !r.notes.is_empty() {
        let _ = writeln!(out, "\nNotes:");
        for n in &r.notes {
            let _ = writeln!(out, "  - {n}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::tests::{gpu, node as view, share};
    use crate::queues::tests::queue;
    use k8s_openapi::api::core::v1::{
        Container, ObjectReference, PodCondition, PodSpec, PodStatus, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn pending(gpus: u32) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("train-0".into());
        p.metadata.namespace = Some("ml".into());
        p.metadata.uid = Some("uid-1".into());
        p.metadata.labels = Some(BTreeMap::from([(
            keys::QUEUE.to_owned(),
            "research".to_owned(),
        )]));
        p.spec = Some(PodSpec {
            scheduler_name: Some("tessera".into()),
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        keys::GPU_RESOURCE.to_owned(),
                        Quantity(gpus.to_string()),
                    )])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        });
        p.status = Some(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/2 nodes are available: 2 have fewer than 4 free GPUs.".into()),
                last_transition_time: Some(Time(t("2026-01-01T11:59:30Z"))),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        p
    }

    fn event(message: &str, count: i32, at: &str) -> Event {
        Event {
            reason: Some("FailedScheduling".into()),
            message: Some(message.into()),
            count: Some(count),
            last_timestamp: Some(Time(t(at))),
            involved_object: ObjectReference::default(),
            ..Event::default()
        }
    }

    fn inputs(pod: Pod) -> Inputs {
        Inputs {
            pod,
            events: Ok(vec![
                event("older", 1, "2026-01-01T11:59:00Z"),
                event(
                    "0/2 nodes are available: 2 have fewer than 4 free GPUs.",
                    7,
                    "2026-01-01T11:59:55Z",
                ),
            ]),
            views: Ok(vec![
                view(
                    "a",
                    true,
                    vec![
                        gpu(0, vec![share("x", 100, 46068)]),
                        gpu(1, vec![share("y", 50, 23034)]),
                        gpu(2, vec![]),
                        gpu(3, vec![]),
                    ],
                ),
                view("b", true, vec![gpu(0, vec![]), gpu(1, vec![])]),
            ]),
            nodes: Ok(Vec::new()),
            queue: Ok(Some(queue("research", None, 8.0, Some((8.0, 6.0, 10.0))))),
            group: Ok(None),
        }
    }

    #[test]
    fn a_pending_pod_gets_the_coordinators_reason_and_each_nodes_verdict() {
        let r = report(inputs(pending(4)));
        let text = text_at(&r, t("2026-01-01T12:00:00Z"));
        let want = "\
Pod ml/train-0 (Pending, not bound), uid uid-1
Asks: 4 whole GPUs   queue: research   scheduler: tessera

The coordinator says (Unschedulable, 30s ago):
  0/2 nodes are available: 2 have fewer than 4 free GPUs.

Recent FailedScheduling events:
  5s ago (x7): 0/2 nodes are available: 2 have fewer than 4 free GPUs.
  60s ago (x1): older

GPU nodes (by the agents' last reports):
  NODE  GPUS  HEALTHY  FREE  VERDICT
  a     4     4        2     fits once 2 more GPUs are free — held by default/x (main), default/y (main)
  b     2     2        2     has 2 GPUs of the kind asked, the pod asks 4 on one node

What would make it fit:
  - node a: fits once 2 more GPUs are free — held by default/x (main), default/y (main)
  - queue research holds 6 GPUs against a fair share of 8: beyond it the pod waits for idle GPUs and cannot reclaim

Notes:
  - checked here: GPUs by the agents' last reports, cordons, taints, nodeSelector and required node affinity; inter-pod affinity, topology spread, CPU, memory, ports, volumes, gangs and queues only in the coordinator's message
";
        assert_eq!(text, want);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["nodes"][0]["couldFit"], true);
        assert_eq!(v["nodes"][1]["couldFit"], false);
    }

    #[test]
    fn what_cannot_be_read_or_told_is_said() {
        // Too big for every node; the user may not read the views.
        let mut i = inputs(pending(9));
        let r = report(Inputs {
            views: Ok(i.views.as_ref().unwrap().clone()),
            ..inputs(pending(9))
        });
        assert!(
            r.would_fit.iter().any(|s| s == "no node has 9 GPUs (the largest has 4): ask for at most 4 per pod, or add a larger node"),
            "{:?}",
            r.would_fit
        );
        i.views = Err("cannot read gpunodes.tessera.dev: permission denied (the ClusterRole tessera-viewer grants it)".into());
        i.nodes = Err(
            "cannot read nodes: permission denied (the ClusterRole tessera-viewer grants it)"
                .into(),
        );
        let r = report(i);
        assert!(r.nodes.is_empty());
        assert!(
            r.notes
                .iter()
                .any(|n| n.starts_with("cannot read gpunodes")
                    && n.ends_with("; no per-node breakdown")),
            "{:?}",
            r.notes
        );
        assert!(
            r.notes
                .iter()
                .any(|n| n.ends_with("cordons, taints and labels not checked")),
            "{:?}",
            r.notes
        );

        // Bound: nothing to explain.
        let mut bound = pending(1);
        bound.spec.as_mut().unwrap().node_name = Some("a".into());
        bound.status.as_mut().unwrap().phase = Some("Running".into());
        let r = report(inputs(bound));
        assert_eq!(r.would_fit.len(), 1);
        assert!(r.would_fit[0].starts_with("nothing: it is bound to node a (phase Running)"));

        // A GPU share it free now: the coordinator's reason is the answer.
        let mut frac = pending(1);
        frac.metadata.annotations = Some(BTreeMap::from([(
            keys::GPU_FRACTION.to_owned(),
            "0.25".to_owned(),
        )]));
        let r = report(inputs(frac));
        assert!(
            r.would_fit[0].starts_with("its GPUs are free now on a, b: what holds it"),
            "{:?}",
            r.would_fit
        );

        // A bad request.
        let mut bad = pending(1);
        bad.metadata.annotations = Some(BTreeMap::from([(
            keys::GPU_FRACTION.to_owned(),
            "1.5".to_owned(),
        )]));
        let r = report(inputs(bad));
        assert!(
            r.asks
                .starts_with("cannot be read: tessera.dev/gpu-fraction"),
            "{}",
            r.asks
        );
        assert!(r.nodes.is_empty());
    }

    #[test]
    fn a_queue_at_its_limit_and_a_gang_are_named() {
        // Four whole GPUs: node a could hold one once two more GPUs free, node b never.
        let mut i = inputs(pending(4));
        let mut q = queue("research", None, 8.0, Some((8.0, 7.0, 11.0)));
        q.spec.gpu.as_mut().unwrap().limit = 8.0;
        i.queue = Ok(Some(q));
        i.pod.metadata.annotations = Some(BTreeMap::from([
            (keys::POD_GROUP.to_owned(), "train".to_owned()),
            (keys::MIN_MEMBER.to_owned(), "4".to_owned()),
        ]));
        let r = report(i);
        assert!(r.would_fit.iter().any(|s| s == "queue research holds 7 of its limit 8 GPUs: it fits once the queue holds at most 4"), "{:?}", r.would_fit);
        assert!(
            r.would_fit.iter().any(|s| s == "its gang train places 4 pods at once or none: room for all 4 is needed together; the GPU nodes' idle GPUs hold 0 such pods now"),
            "{:?}",
            r.would_fit
        );

        // A pod the coordinator does not count in its queue's demand (a gang larger than the
        // cluster): the queue's fair share says nothing about it.
        let mut i = inputs(pending(4));
        i.queue = Ok(Some(queue("research", None, 8.0, Some((6.0, 6.0, 6.0)))));
        let r = report(i);
        assert!(
            !r.would_fit.iter().any(|s| s.starts_with("queue ")),
            "{:?}",
            r.would_fit
        );
        let mut i = inputs(pending(4));
        i.queue = Ok(Some(queue("research", None, 8.0, Some((6.0, 6.0, 10.0)))));
        let r = report(i);
        assert!(
            r.would_fit
                .iter()
                .any(|s| s.starts_with("queue research holds 6 GPUs against a fair share of 6")),
            "{:?}",
            r.would_fit
        );
    }
}
