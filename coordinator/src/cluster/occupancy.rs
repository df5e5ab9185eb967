//! What the agents (and the nodes' refusals) say about GPUs that the cache cannot: joined
//! into the snapshot after translation, so the core never assigns a GPU the node would
//! refuse.
//!
//! Per bound GPU pod, in order:
//! - an assignment that does not fit its node's inventory (a GPU the agent does not report,
//!   more memory than the GPU has, more GPUs than the container asks for) is ignored with a
//!   warning: it was not a decision of ours;
//! - a pod without an assignment (another scheduler's, or one whose assignment was ignored)
//!   holds the GPUs its agent reports it on. The agent hands such pods whole free GPUs of its
//!   own choosing, so until it has reported all of them the core cannot know which: every
//!   idle GPU of the node is **fenced** (`Fence::Unreported`) meanwhile — the pod is charged
//!   on them, and no other pod gets one that may turn out to be the pod's.
//!
//! Per node, from its agent's latest report:
//! - a GPU the agent reports held by a pod the snapshot does not place there (deleted, or
//!   unknown to the agent by UID) is fenced (`Fence::HeldByUnknownPod`) until the agent
//!   releases it: the kubelet would refuse anything assigned on it;
//! - a GPU the node refused at admission ([`super::refusals`]) is fenced (`Fence::Refused`)
//!   until a later report shows it free.
//!
//! Fenced GPUs stay healthy in the core's capacity (they exist and count for fair share);
//! they only take nothing new, and a pending pod is told which fence held it up.

use std::collections::{BTreeMap, HashSet};

use rustc_hash::FxHashMap;

use super::refusals::Refusal;
use crate::agents::AgentNode;
use crate::translate::Translated;
use tessera_contract::keys;
use tessera_core::model::{
    Assignment, ContainerAssignment, Fence, Gpu, GpuSlice, InputError, Node,
};

/// How many of a fence kind's notes a snapshot keeps (a pending pod's message shows fewer).
const NOTES_KEPT: usize = 16;

/// Joins what `agents` report and what the nodes `refused` into `out`'s snapshot: ignores
/// assignments that do not fit, gives assignment-less pods their reported GPUs, fences GPUs
/// whose account is not settled, and notes why in `out.gpu_fences`.
pub fn join(
    out: &mut Translated,
    agents: &[AgentNode],
    refused: &BTreeMap<(String, String), Refusal>,
) {
    let by_node: FxHashMap<&str, &AgentNode> =
        agents.iter().map(|a| (a.node.as_str(), a)).collect();
    let node_at: FxHashMap<String, usize> = out
        .snapshot
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let mut fences: Vec<(usize, String, Fence, String)> = Vec::new();

    // Pods: trust, reported GPUs, and the nodes where some pod's GPUs are not all reported.
    let mut unreported: BTreeMap<usize, String> = BTreeMap::new();
    for pod in &mut out.snapshot.pods {
        if pod.gpu.count == 0 {
            continue;
        }
        let Some(placement) = pod.placement.as_mut() else {
            continue;
        };
        let Some(&n) = node_at.get(&placement.node) else {
            continue;
        };
        let node = &out.snapshot.nodes[n];
        if placement.assignment.slices().next().is_some() {
            match fits(&placement.assignment, node) {
                Ok(()) => continue,
                Err(why) => {
                    out.pod_warnings
                        .entry(pod.uid.clone())
                        .or_default()
                        .push(InputError {
                            field: keys::ASSIGNMENT.to_owned(),
                            message: format!(
                                "ignored: {why}; the pod counts as holding what the node's agent reports"
                            ),
                        });
                    placement.assignment = Assignment::default();
                }
            }
        }
        let Some(agent) = by_node.get(placement.node.as_str()) else {
            continue;
        };
        placement.assignment = reported(agent, &pod.uid);
        let distinct: HashSet<&str> = placement
            .assignment
            .slices()
            .map(|s| s.uuid.as_str())
            .collect();
        if (distinct.len() as u64) < u64::from(pod.gpu.count) {
            unreported
                .entry(n)
                .or_insert_with(|| format!("{}/{}", pod.namespace, pod.name));
        }
    }

    // Nodes: shares of pods the snapshot does not place there, and the unreported pods' fences.
    let placed: FxHashMap<&str, &str> = out
        .snapshot
        .pods
        .iter()
        .filter_map(|p| Some((p.uid.as_str(), p.placement.as_ref()?.node.as_str())))
        .collect();
    for agent in agents {
        let Some(&n) = node_at.get(&agent.node) else {
            continue;
        };
        for (uuid, occupancy) in &agent.occupancy {
            let stranger = occupancy
                .shares
                .iter()
                .find(|s| placed.get(s.pod_uid.as_str()) != Some(&agent.node.as_str()));
            if let Some(share) = stranger {
                let who = if share.pod_name.is_empty() {
                    "an unnamed pod".to_owned()
                } else {
                    format!("{}/{}", share.pod_namespace, share.pod_name)
                };
                fences.push((
                    n,
                    uuid.clone(),
                    Fence::HeldByUnknownPod,
                    format!(
                        "{}: {uuid} still held by {who}, which is no longer bound there",
                        agent.node
                    ),
                ));
            }
        }
    }
    for (&n, pod) in &unreported {
        let node = &out.snapshot.nodes[n];
        let held: HashSet<&str> = out
            .snapshot
            .pods
            .iter()
            .filter_map(|p| p.placement.as_ref().filter(|pl| pl.node == node.name))
            .flat_map(|pl| pl.assignment.slices().map(|s| s.uuid.as_str()))
            .collect();
        let reported_held = |uuid: &str| {
            by_node
                .get(node.name.as_str())
                .and_then(|a| a.occupancy.get(uuid))
                .is_some_and(|o| !o.shares.is_empty())
        };
        for g in &node.gpus {
            if !held.contains(g.uuid.as_str()) && !reported_held(&g.uuid) {
                fences.push((
                    n,
                    g.uuid.clone(),
                    Fence::Unreported,
                    format!(
                        "{}: its agent has not yet reported which GPUs {pod} holds",
                        node.name
                    ),
                ));
            }
        }
    }
    for ((node, uuid), refusal) in refused {
        if let Some(&n) = node_at.get(node) {
            fences.push((
                n,
                uuid.clone(),
                Fence::Refused,
                format!(
                    "{node} refused {uuid} for {} at admission ({}); it is assigned again once the node's agent reports it free",
                    refusal.pod, refusal.message
                ),
            ));
        }
    }

    for (n, uuid, fence, note) in fences {
        let Some(gpu) = out.snapshot.nodes[n]
            .gpus
            .iter_mut()
            .find(|g| g.uuid == uuid)
        else {
            continue;
        };
        // A refusal says most, then a stranger's share; one per GPU.
        if gpu.fence.is_none_or(|f| fence > f) {
            gpu.fence = Some(fence);
        }
        let notes = out.gpu_fences.entry(fence).or_default();
        if notes.len() < NOTES_KEPT && !notes.contains(&note) {
            notes.push(note);
        }
    }
}

/// Whether `assignment` could be a decision for `node`: every GPU on the node, at most its
/// memory, each at most once per container.
fn fits(assignment: &Assignment, node: &Node) -> Result<(), String> {
    for c in &assignment.containers {
        let mut seen = HashSet::new();
        for s in &c.gpus {
            let Some(gpu) = node.gpus.iter().find(|g| g.uuid == s.uuid) else {
                return Err(format!("GPU {} is not on node {}", s.uuid, node.name));
            };
            if !seen.insert(s.uuid.as_str()) {
                return Err(format!(
                    "GPU {} is named twice for container {}",
                    s.uuid, c.container
                ));
            }
            if s.memory_mib > gpu.memory_mib {
                return Err(format!(
                    "{} MiB on GPU {}, which has {} MiB",
                    s.memory_mib, s.uuid, gpu.memory_mib
                ));
            }
        }
    }
    Ok(())
}

/// The GPUs `agent` reports pod `uid` holding, as whole GPUs per container (the agent hands
/// pods without an assignment whole GPUs).
fn reported(agent: &AgentNode, uid: &str) -> Assignment {
    let mut per_container: BTreeMap<String, Vec<GpuSlice>> = BTreeMap::new();
    for gpu in &agent.gpus {
        let Some(occ) = agent.occupancy.get(&gpu.uuid) else {
            continue;
        };
        for share in occ.shares.iter().filter(|s| s.pod_uid == uid) {
            let slices = per_container.entry(share.container.clone()).or_default();
            if !slices.iter().any(|s| s.uuid == gpu.uuid) {
                slices.push(whole(gpu));
            }
        }
    }
    Assignment {
        containers: per_container
            .into_iter()
            .map(|(container, gpus)| ContainerAssignment { container, gpus })
            .collect(),
    }
}

fn whole(gpu: &Gpu) -> GpuSlice {
    GpuSlice {
        uuid: gpu.uuid.clone(),
        memory_mib: gpu.memory_mib,
        compute_milli: 1000,
    }
}

/// The fence notes `pod` is told about, at most `shown` per kind the core named.
pub fn notes_for(
    notes: &BTreeMap<Fence, Vec<String>>,
    fences: impl Iterator<Item = Fence>,
    shown: usize,
) -> Vec<&str> {
    let mut out = Vec::new();
    for f in fences {
        let Some(lines) = notes.get(&f) else { continue };
        out.extend(lines.iter().take(shown).map(String::as_str));
        if lines.len() > shown {
            out.push(match f {
                Fence::Unreported => "and more nodes whose agents have not reported yet",
                Fence::HeldByUnknownPod => "and more GPUs not yet released",
                Fence::Refused => "and more refused GPUs",
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{GpuOccupancy, ShareInfo};
    use std::time::Instant;
    use tessera_core::model::{Pod, Snapshot};

    fn agent(held: &[(&str, &str)]) -> AgentNode {
        let mut occupancy: BTreeMap<String, GpuOccupancy> = BTreeMap::new();
        for (uuid, uid) in held {
            occupancy
                .entry((*uuid).to_owned())
                .or_default()
                .shares
                .push(ShareInfo {
                    pod_uid: (*uid).to_owned(),
                    pod_namespace: "ml".into(),
                    pod_name: format!("pod-{uid}"),
                    container: "main".into(),
                    ..ShareInfo::default()
                });
        }
        AgentNode {
            node: "n".into(),
            agent_version: "t".into(),
            protocol_version: 2,
            gpus: (0..4).map(|i| Gpu::new("n", i, "A100", 81920)).collect(),
            shares_per_gpu: 10,
            occupancy,
            health_reasons: BTreeMap::new(),
            allocated_pods: Default::default(),
            occupancy_reports: 1,
            connected: true,
            last_seen: Instant::now(),
        }
    }

    fn translated(pods: Vec<Pod>) -> Translated {
        Translated {
            snapshot: Snapshot {
                nodes: vec![Node::gpu_node("n", 4, "A100", 81920)],
                pods,
                ..Snapshot::default()
            },
            ..Translated::default()
        }
    }

    fn fences(out: &Translated) -> Vec<Option<Fence>> {
        out.snapshot.nodes[0].gpus.iter().map(|g| g.fence).collect()
    }

    fn slice(uuid: &str, milli: u32) -> GpuSlice {
        GpuSlice {
            uuid: uuid.into(),
            memory_mib: 81920 * u64::from(milli) / 1000,
            compute_milli: milli,
        }
    }

    fn assigned(uid: &str, slices: Vec<GpuSlice>) -> Pod {
        Pod::new(uid, "default").gpus(1).bound(
            "n",
            Assignment {
                containers: vec![ContainerAssignment {
                    container: "main".into(),
                    gpus: slices,
                }],
            },
        )
    }

    #[test]
    fn a_foreign_pod_gets_the_gpus_its_agent_reports() {
        let mut out = translated(vec![Pod::new("u1", "default").gpus(1).on_node("n")]);
        join(&mut out, &[agent(&[("GPU-n-2", "u1")])], &BTreeMap::new());
        let slices: Vec<GpuSlice> = out.snapshot.pods[0]
            .placement
            .as_ref()
            .unwrap()
            .assignment
            .slices()
            .cloned()
            .collect();
        assert_eq!(slices, [slice("GPU-n-2", 1000)]);
        assert_eq!(fences(&out), [None; 4], "everything is known");
    }

    #[test]
    fn until_a_foreign_pods_gpus_are_reported_every_idle_gpu_may_be_one_of_them() {
        let pods = vec![
            Pod::new("foreign", "default").gpus(1).on_node("n"),
            assigned("ours", vec![slice("GPU-n-0", 500)]),
        ];
        let mut out = translated(pods);
        join(&mut out, &[agent(&[("GPU-n-0", "ours")])], &BTreeMap::new());
        let u = Some(Fence::Unreported);
        assert_eq!(fences(&out), [None, u, u, u]);
        let note = &out.gpu_fences[&Fence::Unreported][0];
        assert!(note.contains("default/foreign"), "{note}");
    }

    #[test]
    fn a_share_of_a_pod_no_longer_bound_there_fences_its_gpu() {
        let mut out = translated(vec![assigned("ours", vec![slice("GPU-n-0", 500)])]);
        let reports = agent(&[("GPU-n-0", "ours"), ("GPU-n-1", "gone"), ("GPU-n-3", "")]);
        join(&mut out, &[reports], &BTreeMap::new());
        let h = Some(Fence::HeldByUnknownPod);
        assert_eq!(fences(&out), [None, h, None, h]);
        assert!(out.gpu_fences[&Fence::HeldByUnknownPod][0].contains("ml/pod-gone"));
    }

    #[test]
    fn an_assignment_that_does_not_fit_the_node_is_ignored_with_a_warning() {
        let mut out = translated(vec![
            assigned("elsewhere", vec![slice("GPU-m-0", 1000)]),
            assigned("too-big", vec![slice("GPU-n-1", 1000)]),
        ]);
        if let Some(pl) = out.snapshot.pods[1].placement.as_mut() {
            pl.assignment.containers[0].gpus[0].memory_mib = 1 << 40;
        }
        join(
            &mut out,
            &[agent(&[("GPU-n-2", "too-big")])],
            &BTreeMap::new(),
        );
        let warned: Vec<&str> = out
            .pod_warnings
            .values()
            .flatten()
            .map(|w| w.message.as_str())
            .collect();
        assert!(warned[0].contains("GPU-m-0 is not on node n"), "{warned:?}");
        assert!(warned[1].contains("which has 81920 MiB"), "{warned:?}");
        // The second is accounted by what the agent reports; the first is not reported at all,
        // so the node's idle GPUs wait for the agent.
        let second = out.snapshot.pods[1].placement.as_ref().unwrap();
        assert_eq!(second.assignment.slices().next().unwrap().uuid, "GPU-n-2");
        assert_eq!(fences(&out)[0], Some(Fence::Unreported));
    }

    #[test]
    fn a_refused_gpu_is_fenced_and_said_why() {
        let mut out = translated(Vec::new());
        let refused = BTreeMap::from([(
            ("n".to_owned(), "GPU-n-1".to_owned()),
            Refusal {
                pod: "ml/web-1".into(),
                message: "Allocate failed".into(),
                after_report: 1,
            },
        )]);
        join(&mut out, &[agent(&[])], &refused);
        assert_eq!(fences(&out)[1], Some(Fence::Refused));
        let notes = notes_for(&out.gpu_fences, [Fence::Refused].into_iter(), 3);
        assert!(
            notes[0].contains("n refused GPU-n-1 for ml/web-1"),
            "{notes:?}"
        );
    }
}
