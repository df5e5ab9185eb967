//! Would a pending pod fit a node, judged from what a user can read: the pod's GPU request, the
//! node's agent view (`GpuNode`: GPUs, health, shares held) and the Node's cordon, taints and
//! labels. This is a reading aid for `why`, not the scheduler: the coordinator's condition
//! message is the verdict, and the constraints checked only there (inter-pod affinity,
//! topology spread, CPU and memory, ports, volumes, gangs and queues) are named as such.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, Taint, Toleration};
use tessera_contract::crd::{GpuNodeStatus, GpuView};
use tessera_contract::keys;
use tessera_contract::pod::{container_gpus, gpu_quantity};
use tessera_contract::share::{parse_fraction, parse_gpu_memory};

use crate::format::gib;
use crate::gpus::holder;

/// What the pod asks of each GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PerGpu {
    /// Whole GPUs.
    Whole,
    /// That share of each GPU (milli-GPU), compute and memory.
    Fraction(u32),
    /// That much memory of each GPU (MiB).
    Memory(u64),
}

/// A pod's GPU request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Demand {
    /// GPUs on one node.
    pub(crate) count: u32,
    /// What of each.
    pub(crate) per_gpu: PerGpu,
}

impl std::fmt::Display for Demand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.count;
        let s = if n == 1 { "" } else { "s" };
        match self.per_gpu {
            _ if n == 0 => write!(f, "no GPU"),
            PerGpu::Whole => write!(f, "{n} whole GPU{s}"),
            PerGpu::Fraction(m) => write!(f, "{}% of {n} GPU{s}", f64::from(m) / 10.0),
            PerGpu::Memory(mib) => write!(f, "{} of {n} GPU{s}", gib(mib)),
        }
    }
}

fn annotation<'a>(pod: &'a Pod, keys: &[&'a str]) -> Option<(&'a str, &'a str)> {
    let a = pod.metadata.annotations.as_ref()?;
    keys.iter()
        .find_map(|k| a.get(*k).map(|v| (*k, v.as_str())))
}

/// The pod's GPU request as the kubelet counts `nvidia.com/gpu` (app containers summed, an init
/// container's as a floor) with the share annotations; an error names the field at fault.
pub(crate) fn demand(pod: &Pod) -> Result<Demand, String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let mut apps = 0u32;
    for (i, c) in spec.containers.iter().enumerate() {
        if gpu_quantity(c).is_some() {
            apps = apps.saturating_add(
                container_gpus(c).map_err(|e| format!("spec.containers[{i}]: {e}"))?,
            );
        }
    }
    let mut init = 0u32;
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        if gpu_quantity(c).is_some() {
            init =
                init.max(container_gpus(c).map_err(|e| format!("spec.initContainers[{i}]: {e}"))?);
        }
    }
    let mut count = apps.max(init);
    let fraction = annotation(pod, &[keys::GPU_FRACTION, keys::GPU_FRACTION_ALIAS]);
    let memory = annotation(pod, &[keys::GPU_MEMORY, keys::GPU_MEMORY_ALIAS]);
    let per_gpu = match (fraction, memory) {
        (Some((f, _)), Some((m, _))) => return Err(format!("both {f} and {m} are set")),
        (Some((k, v)), None) => PerGpu::Fraction(
            parse_fraction(v).ok_or_else(|| format!("{k}: {v:?} is not a decimal in (0, 1]"))?,
        ),
        (None, Some((k, v))) => {
            PerGpu::Memory(parse_gpu_memory(v).map_err(|why| format!("{k}: {v:?} {why}"))?)
        }
        (None, None) => PerGpu::Whole,
    };
    if per_gpu != PerGpu::Whole {
        if let Some((_, v)) = annotation(pod, &[keys::GPU_FRACTION_NUM_DEVICES_ALIAS])
            && let Ok(n) = v.trim().parse::<u32>()
        {
            count = n;
        }
        // A share without nvidia.com/gpu shares one GPU.
        count = count.max(1);
    }
    Ok(Demand { count, per_gpu })
}

/// One node judged for the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Fits by the agent's last report.
    FitsNow,
    /// Would fit once this many more whole GPUs are free; the pods holding the busy ones.
    FreeGpus(u32, Vec<String>),
    /// Would fit once a GPU has this share free (percent, MiB); the best GPU now (index, free
    /// percent, free MiB) and who holds it.
    FreeShare {
        /// Percent of compute asked.
        percent: u32,
        /// MiB asked.
        mib: u64,
        /// Index, free percent and free MiB of the GPU closest to it.
        best: (u32, u32, u64),
        /// Who holds that GPU.
        holders: Vec<String>,
    },
    /// Fewer GPUs than asked (of the pod's kind: MIG GPUs do not count for others).
    TooFewGpus(u32),
    /// Enough GPUs, too few healthy.
    TooFewHealthy(u32),
    /// Its GPUs are smaller than the memory asked of each.
    GpusTooSmall(u64),
    /// Its agent is not connected.
    AgentOffline,
    /// No report from its agent yet.
    NoReport,
    /// `spec.unschedulable`.
    Cordoned,
    /// A NoSchedule/NoExecute taint the pod does not tolerate (`key=value:Effect`).
    Taint(String),
    /// A nodeSelector label that does not match (`key=value`).
    NodeSelector(String),
    /// The required node affinity matches none of its terms.
    NodeAffinity,
}

impl Verdict {
    /// The verdict for people, for a pod asking `demand`.
    pub(crate) fn text(&self, demand: &Demand) -> String {
        let asks = demand.count;
        match self {
            Verdict::FitsNow => "fits now by its agent's last report".to_owned(),
            Verdict::FreeGpus(n, holders) => format!(
                "fits once {n} more GPU{} free{}",
                if *n == 1 { " is" } else { "s are" },
                held_by(holders)
            ),
            Verdict::FreeShare {
                percent,
                mib,
                best: (i, p, m),
                holders,
            } => format!(
                "fits once a GPU has {percent}% and {} free (best now: GPU {i}, {p}% and {} free{})",
                gib(*mib),
                gib(*m),
                held_by(holders)
            ),
            Verdict::TooFewGpus(has) => {
                format!("has {has} GPUs of the kind asked, the pod asks {asks} on one node")
            }
            Verdict::TooFewHealthy(healthy) => {
                format!("{healthy} healthy GPUs, the pod asks {asks}")
            }
            Verdict::GpusTooSmall(mib) => match demand.per_gpu {
                PerGpu::Memory(asked) => {
                    format!(
                        "its GPUs have {}, the pod asks {} of one",
                        gib(*mib),
                        gib(asked)
                    )
                }
                _ => format!("its GPUs have {}", gib(*mib)),
            },
            Verdict::AgentOffline => {
                "its tessera-agent is not connected: no new GPU pods until it reports".to_owned()
            }
            Verdict::NoReport => "its tessera-agent has not reported yet".to_owned(),
            Verdict::Cordoned => "cordoned (spec.unschedulable)".to_owned(),
            Verdict::Taint(t) => format!("untolerated taint {t}"),
            Verdict::NodeSelector(l) => format!("nodeSelector {l} does not match"),
            Verdict::NodeAffinity => "required node affinity does not match".to_owned(),
        }
    }

    /// Whether freeing capacity on the node would make the pod fit there.
    pub(crate) fn could_fit(&self) -> bool {
        matches!(
            self,
            Verdict::FitsNow | Verdict::FreeGpus(..) | Verdict::FreeShare { .. }
        )
    }
}

fn held_by(holders: &[String]) -> String {
    match holders.len() {
        0 => String::new(),
        1..=3 => format!(" — held by {}", holders.join(", ")),
        n => format!(" — held by {} and {} more", holders[..3].join(", "), n - 3),
    }
}

/// How many pods of `demand` asking whole GPUs the node's idle GPUs hold now, when it passed
/// the other checks (`None` for shares, whose packing only the coordinator knows).
pub(crate) fn room(demand: &Demand, verdict: &Verdict, gpus: &[GpuView]) -> Option<u32> {
    if demand.per_gpu != PerGpu::Whole || demand.count == 0 || !verdict.could_fit() {
        return None;
    }
    let idle = gpus
        .iter()
        .filter(|g| g.mig_profiles.is_none() && g.healthy && g.shares.is_empty())
        .count() as u32;
    Some(idle / demand.count)
}

/// Judges one node: its Node object's cordon, taints and labels first (as kube-scheduler's
/// filters come before resources), then its GPUs.
pub(crate) fn judge(
    pod: &Pod,
    demand: &Demand,
    node: Option<&Node>,
    view: Option<&GpuNodeStatus>,
) -> Verdict {
    if let Some(node) = node
        && let Some(v) = node_misfit(pod, node)
    {
        return v;
    }
    match view {
        None => Verdict::NoReport,
        Some(v) if !v.agent.connected => Verdict::AgentOffline,
        Some(v) => gpu_fit(demand, &v.gpus),
    }
}

/// The pods holding `g`'s shares.
fn holders<'a>(gpus: impl Iterator<Item = &'a GpuView>) -> Vec<String> {
    let mut out: Vec<String> = gpus.flat_map(|g| g.shares.iter().map(holder)).collect();
    out.sort();
    out.dedup();
    out
}

/// The GPU part of the judgement.
pub(crate) fn gpu_fit(demand: &Demand, gpus: &[GpuView]) -> Verdict {
    if demand.count == 0 {
        return Verdict::FitsNow;
    }
    // MIG GPUs take only MIG requests, which this does not judge.
    let usable: Vec<&GpuView> = gpus.iter().filter(|g| g.mig_profiles.is_none()).collect();
    let n = demand.count as usize;
    if usable.len() < n {
        return Verdict::TooFewGpus(usable.len() as u32);
    }
    let healthy: Vec<&GpuView> = usable.iter().copied().filter(|g| g.healthy).collect();
    if healthy.len() < n {
        return Verdict::TooFewHealthy(healthy.len() as u32);
    }
    let free = |g: &GpuView| -> (u32, u64) {
        let percent: u32 = g.shares.iter().map(|s| s.compute_percent).sum();
        let mib: u64 = g.shares.iter().map(|s| s.memory_mib).sum();
        (
            100u32.saturating_sub(percent),
            g.memory_mib.saturating_sub(mib),
        )
    };
    match demand.per_gpu {
        PerGpu::Whole => {
            let idle = healthy.iter().filter(|g| g.shares.is_empty()).count();
            if idle >= n {
                Verdict::FitsNow
            } else {
                let busy = healthy.iter().copied().filter(|g| !g.shares.is_empty());
                Verdict::FreeGpus((n - idle) as u32, holders(busy))
            }
        }
        per_gpu => {
            let ask = |g: &GpuView| -> (u32, u64) {
                match per_gpu {
                    PerGpu::Fraction(milli) => {
                        (milli.div_ceil(10), g.memory_mib * u64::from(milli) / 1000)
                    }
                    PerGpu::Memory(mib) => (0, mib),
                    PerGpu::Whole => (100, g.memory_mib),
                }
            };
            if let PerGpu::Memory(mib) = per_gpu
                && healthy.iter().all(|g| g.memory_mib < mib)
            {
                let largest = healthy.iter().map(|g| g.memory_mib).max().unwrap_or(0);
                return Verdict::GpusTooSmall(largest);
            }
            let fits = |g: &GpuView| {
                let (p, m) = free(g);
                let (ap, am) = ask(g);
                p >= ap && m >= am
            };
            if healthy.iter().filter(|g| fits(g)).count() >= n {
                return Verdict::FitsNow;
            }
            // The GPU that lacks the least, by the share of it missing.
            let best = healthy
                .iter()
                .filter(|g| !fits(g))
                .min_by_key(|g| {
                    let (p, m) = free(g);
                    let (ap, am) = ask(g);
                    let missing_p = ap.saturating_sub(p);
                    let missing_m = am.saturating_sub(m) * 100 / g.memory_mib.max(1);
                    (missing_p.max(missing_m as u32), g.index)
                })
                .copied();
            let Some(best) = best else {
                return Verdict::FitsNow;
            };
            let (p, m) = free(best);
            let (ap, am) = ask(best);
            Verdict::FreeShare {
                percent: ap,
                mib: am,
                best: (best.index, p, m),
                holders: holders(std::iter::once(best)),
            }
        }
    }
}

/// The Node's own misfit: cordon, an untolerated NoSchedule/NoExecute taint, nodeSelector,
/// required node affinity.
pub(crate) fn node_misfit(pod: &Pod, node: &Node) -> Option<Verdict> {
    let spec = pod.spec.as_ref()?;
    let node_spec = node.spec.as_ref();
    if node_spec.and_then(|s| s.unschedulable) == Some(true) {
        // A pod tolerating the cordon's taint may still go there; kube-scheduler checks the
        // field unless the pod tolerates node.kubernetes.io/unschedulable.
        let tolerated = spec.tolerations.iter().flatten().any(|t| {
            tolerates(
                t,
                &Taint {
                    key: "node.kubernetes.io/unschedulable".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                },
            )
        });
        if !tolerated {
            return Some(Verdict::Cordoned);
        }
    }
    for taint in node_spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
    {
        if !matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute") {
            continue;
        }
        if !spec
            .tolerations
            .iter()
            .flatten()
            .any(|t| tolerates(t, taint))
        {
            let value = taint.value.as_deref().unwrap_or("");
            let shown = if value.is_empty() {
                format!("{}:{}", taint.key, taint.effect)
            } else {
                format!("{}={value}:{}", taint.key, taint.effect)
            };
            return Some(Verdict::Taint(shown));
        }
    }
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    for (k, v) in spec.node_selector.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Some(Verdict::NodeSelector(format!("{k}={v}")));
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(required) = required {
        let name = node.metadata.name.as_deref().unwrap_or("");
        let any = required.node_selector_terms.iter().any(|term| {
            let exprs = term.match_expressions.as_deref().unwrap_or_default();
            let fields = term.match_fields.as_deref().unwrap_or_default();
            // An empty term matches no node.
            (!exprs.is_empty() || !fields.is_empty())
                && exprs
                    .iter()
                    .all(|r| matches(r, labels.get(&r.key).map(String::as_str)))
                && fields
                    .iter()
                    .all(|r| r.key == "metadata.name" && matches(r, Some(name)))
        });
        if !any {
            return Some(Verdict::NodeAffinity);
        }
    }
    None
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let exists = t.operator.as_deref() == Some("Exists");
    match t.key.as_deref().unwrap_or("") {
        "" => exists,
        key if key != taint.key => false,
        _ => exists || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
    }
}

fn matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::tests::{gpu, share};
    use k8s_openapi::api::core::v1::{
        Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorTerm, NodeSpec, PodSpec,
        ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod(gpus: u32, annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        let limits = (gpus > 0)
            .then(|| BTreeMap::from([(keys::GPU_RESOURCE.to_owned(), Quantity(gpus.to_string()))]));
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    limits,
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        });
        p
    }

    #[test]
    fn the_request_is_read_as_the_coordinator_reads_it() {
        let d = |p: &Pod| demand(p).map(|d| d.to_string());
        assert_eq!(d(&pod(8, &[])), Ok("8 whole GPUs".into()));
        assert_eq!(
            d(&pod(1, &[(keys::GPU_FRACTION, "0.25")])),
            Ok("25% of 1 GPU".into())
        );
        assert_eq!(
            d(&pod(0, &[(keys::GPU_FRACTION_ALIAS, "0.5")])),
            Ok("50% of 1 GPU".into())
        );
        assert_eq!(
            d(&pod(2, &[(keys::GPU_MEMORY, "20Gi")])),
            Ok("20.0Gi of 2 GPUs".into())
        );
        assert_eq!(d(&pod(0, &[])), Ok("no GPU".into()));
        assert!(
            d(&pod(1, &[(keys::GPU_FRACTION, "1.5")]))
                .unwrap_err()
                .contains("tessera.dev/gpu-fraction: \"1.5\"")
        );
        assert!(
            d(&pod(
                1,
                &[(keys::GPU_FRACTION, "0.5"), (keys::GPU_MEMORY, "1Gi")]
            ))
            .unwrap_err()
            .contains("both")
        );
    }

    #[test]
    fn gpu_fit_says_what_would_free_room() {
        let whole = Demand {
            count: 2,
            per_gpu: PerGpu::Whole,
        };
        let quarter = Demand {
            count: 1,
            per_gpu: PerGpu::Fraction(250),
        };
        let big = Demand {
            count: 1,
            per_gpu: PerGpu::Memory(100 * 1024),
        };
        let mut sick = gpu(3, vec![]);
        sick.healthy = false;
        let node = vec![
            gpu(0, vec![share("a", 100, 46068)]),
            gpu(1, vec![share("b", 80, 36854)]),
            gpu(2, vec![]),
            sick,
        ];
        let cases: Vec<(&str, &Demand, Vec<GpuView>, &str)> = vec![
            (
                "two whole GPUs, one idle",
                &whole,
                node.clone(),
                "fits once 1 more GPU is free — held by default/a (main), default/b (main)",
            ),
            (
                "a quarter, the idle GPU takes it",
                &quarter,
                node.clone(),
                "fits now by its agent's last report",
            ),
            (
                "a quarter, only busy GPUs",
                &quarter,
                node[..2].to_vec(),
                "fits once a GPU has 25% and 11.2Gi free (best now: GPU 1, 20% and 9.0Gi free — held by default/b (main))",
            ),
            (
                "too big for any GPU",
                &big,
                node.clone(),
                "its GPUs have 45.0Gi, the pod asks 100.0Gi of one",
            ),
            (
                "four asked, three healthy",
                &Demand {
                    count: 4,
                    per_gpu: PerGpu::Whole,
                },
                node.clone(),
                "3 healthy GPUs, the pod asks 4",
            ),
            (
                "nine asked",
                &Demand {
                    count: 9,
                    per_gpu: PerGpu::Whole,
                },
                node.clone(),
                "has 4 GPUs of the kind asked, the pod asks 9 on one node",
            ),
        ];
        for (what, demand, gpus, want) in cases {
            assert_eq!(gpu_fit(demand, &gpus).text(demand), want, "{what}");
        }
    }

    #[test]
    fn node_constraints_come_first() {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.labels = Some(BTreeMap::from([("zone".to_owned(), "a".to_owned())]));
        let base = pod(1, &[]);
        assert_eq!(node_misfit(&base, &node), None);

        let mut cordoned = node.clone();
        cordoned.spec = Some(NodeSpec {
            unschedulable: Some(true),
            ..NodeSpec::default()
        });
        assert_eq!(node_misfit(&base, &cordoned), Some(Verdict::Cordoned));

        let mut tainted = node.clone();
        tainted.spec = Some(NodeSpec {
            taints: Some(vec![
                Taint {
                    key: "soft".into(),
                    effect: "PreferNoSchedule".into(),
                    ..Taint::default()
                },
                Taint {
                    key: "gpu".into(),
                    value: Some("h100".into()),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                },
            ]),
            ..NodeSpec::default()
        });
        assert_eq!(
            node_misfit(&base, &tainted),
            Some(Verdict::Taint("gpu=h100:NoSchedule".into()))
        );
        let mut tolerant = base.clone();
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("gpu".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]);
        assert_eq!(node_misfit(&tolerant, &tainted), None);

        let mut picky = base.clone();
        picky.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("zone".to_owned(), "b".to_owned())]));
        assert_eq!(
            node_misfit(&picky, &node),
            Some(Verdict::NodeSelector("zone=b".into()))
        );

        let affinity = |op: &str, values: &[&str]| {
            let mut p = base.clone();
            p.spec.as_mut().unwrap().affinity = Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "zone".into(),
                                operator: op.into(),
                                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
                            }]),
                            match_fields: None,
                        }],
                    }),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            });
            node_misfit(&p, &node)
        };
        assert_eq!(affinity("In", &["a", "c"]), None);
        assert_eq!(affinity("In", &["b"]), Some(Verdict::NodeAffinity));
        assert_eq!(affinity("NotIn", &["a"]), Some(Verdict::NodeAffinity));
        assert_eq!(affinity("Exists", &[]), None);
        assert_eq!(affinity("DoesNotExist", &[]), Some(Verdict::NodeAffinity));
    }
}
