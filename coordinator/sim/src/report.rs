//! Fill-experiment reports: the human-readable table and the JSON document.

use std::fmt::Write as _;

use serde::Serialize;

use tessera_core::placement::frag::FragCategory;

use super::experiment::{PolicyRun, Prepared};
use super::metrics::{CurvePoint, round2};

/// Fragmentation of the final cluster by category, in milli-GPU.
#[derive(Clone, Debug, Serialize)]
pub struct FragJson {
    /// `q1_lack_both`.
    pub q1_lack_both: f64,
    /// `q2_lack_gpu`.
    pub q2_lack_gpu: f64,
    /// `q3_satisfied` (usable, not a fragment).
    pub q3_satisfied: f64,
    /// `q4_lack_cpu`.
    pub q4_lack_cpu: f64,
    /// `xl_satisfied`.
    pub xl_satisfied: f64,
    /// `xr_lack_cpu`.
    pub xr_lack_cpu: f64,
    /// `no_access`.
    pub no_access: f64,
    /// Idle GPU milli (sum of all categories).
    pub idle_gpu_milli: f64,
    /// Fragment (idle minus `q3_satisfied`).
    pub frag_gpu_milli: f64,
}

/// One policy's numbers (the `"policies"` entries of the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct PolicyJson {
    /// Policy name.
    pub policy: String,
    /// Pods placed.
    pub placed: usize,
    /// Pods dropped.
    pub failed: usize,
    /// Scheduling time only, seconds.
    pub wall_seconds: f64,
    /// Final allocated GPU milli in percent of capacity.
    pub gpu_milli_alloc_ratio: f64,
    /// Allocation curve value at 100% arrived (percent), if reached.
    pub gpu_milli_alloc_at_100: Option<f64>,
    /// GPUs with any allocation, percent of GPUs.
    pub gpu_count_alloc_ratio: f64,
    /// Allocated CPU, percent.
    pub cpu_alloc_ratio: f64,
    /// Allocated memory, percent.
    pub memory_alloc_ratio: f64,
    /// Final fragmentation by category.
    pub frag: FragJson,
    /// Allocation curve: percent allocated vs integer percent arrived.
    pub curve: Vec<CurvePoint>,
    /// Fragment curve: fragment in percent of GPU capacity vs percent arrived.
    pub frag_curve: Vec<CurvePoint>,
}

/// Cluster and workload description.
#[derive(Clone, Debug, Serialize)]
pub struct TraceJson {
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: u64,
    /// Pods in the arrival sequence.
    pub pods: usize,
    /// GPU request of the arrival sequence, percent of capacity.
    pub arrived_pct: f64,
    /// Number of typical shapes.
    pub typical_shapes: usize,
    /// Where the order came from.
    pub order: String,
}

/// The whole JSON document of a fill run.
#[derive(Clone, Debug, Serialize)]
pub struct FillJson {
    /// Workload.
    pub trace: TraceJson,
    /// One object per policy.
    pub policies: Vec<PolicyJson>,
}

fn pct(num: f64, den: f64) -> f64 {
    if den > 0.0 { 100.0 * num / den } else { 0.0 }
}

/// Builds the JSON numbers of one run.
pub fn policy_json(p: &Prepared, run: &PolicyRun) -> PolicyJson {
    let o = &run.outcome;
    let c = &p.cluster;
    let f = &o.frag;
    let g = |cat| f.get(cat);
    PolicyJson {
        policy: o.policy.name().to_string(),
        placed: o.placed,
        failed: o.failed,
        wall_seconds: o.wall.as_secs_f64(),
        gpu_milli_alloc_ratio: pct(o.used_gpu_milli as f64, c.gpu_milli() as f64),
        gpu_milli_alloc_at_100: run.alloc_at(100),
        gpu_count_alloc_ratio: pct(o.used_gpus as f64, c.gpu_count() as f64),
        cpu_alloc_ratio: pct(o.used_cpu_milli as f64, c.cpu_milli() as f64),
        memory_alloc_ratio: pct(o.used_memory_mib as f64, c.memory_mib() as f64),
        frag: FragJson {
            q1_lack_both: g(FragCategory::Q1LackBoth),
            q2_lack_gpu: g(FragCategory::Q2LackGpu),
            q3_satisfied: g(FragCategory::Q3Satisfied),
            q4_lack_cpu: g(FragCategory::Q4LackCpu),
            xl_satisfied: g(FragCategory::XlSatisfied),
            xr_lack_cpu: g(FragCategory::XrLackCpu),
            no_access: g(FragCategory::NoAccess),
            idle_gpu_milli: f.total(),
            frag_gpu_milli: f.fragment(),
        },
        curve: run.curve.clone(),
        frag_curve: run.frag_curve.clone(),
    }
}

/// Builds the whole JSON document.
pub fn fill_json(p: &Prepared, runs: &[PolicyRun]) -> FillJson {
    FillJson {
        trace: TraceJson {
            nodes: p.cluster.nodes.len(),
            gpus: p.cluster.gpu_count(),
            pods: p.arrivals.len(),
            arrived_pct: round2(p.arrived_pct),
            typical_shapes: p.mix.len(),
            order: p.order_source.clone(),
        },
        policies: runs.iter().map(|r| policy_json(p, r)).collect(),
    }
}

/// The human-readable report: one column per policy.
pub fn human(doc: &FillJson) -> String {
    let mut s = String::new();
    let t = &doc.trace;
    let _ = writeln!(
        s,
        "Cluster: {} nodes, {} GPUs. Workload: {} pods requesting {:.1}% of GPU capacity; {} typical shapes.",
        t.nodes, t.gpus, t.pods, t.arrived_pct, t.typical_shapes
    );
    let _ = writeln!(s, "Arrival order: {}", t.order);
    let _ = writeln!(s);
    let w = 11;
    let mut row = |label: &str, f: &dyn Fn(&PolicyJson) -> String| {
        let _ = write!(s, "{label:<30}");
        for p in &doc.policies {
            let _ = write!(s, "{:>w$}", f(p));
        }
        let _ = writeln!(s);
    };
    row("policy", &|p| p.policy.clone());
    row("GPU milli allocated (end) %", &|p| {
        format!("{:.2}", p.gpu_milli_alloc_ratio)
    });
    row("GPU milli allocated @100% %", &|p| {
        p.gpu_milli_alloc_at_100
            .map_or("-".into(), |v| format!("{v:.2}"))
    });
    row("GPUs allocated %", &|p| {
        format!("{:.2}", p.gpu_count_alloc_ratio)
    });
    row("CPU allocated %", &|p| format!("{:.2}", p.cpu_alloc_ratio));
    row("memory allocated %", &|p| {
        format!("{:.2}", p.memory_alloc_ratio)
    });
    row("pods placed", &|p| p.placed.to_string());
    row("pods failed", &|p| p.failed.to_string());
    row("idle GPU (milli)", &|p| {
        format!("{:.0}", p.frag.idle_gpu_milli)
    });
    row("fragment (milli)", &|p| {
        format!("{:.0}", p.frag.frag_gpu_milli)
    });
    row("fragment % of idle", &|p| {
        format!("{:.1}", pct(p.frag.frag_gpu_milli, p.frag.idle_gpu_milli))
    });
    row("  q1_lack_both", &|p| format!("{:.0}", p.frag.q1_lack_both));
    row("  q2_lack_gpu", &|p| format!("{:.0}", p.frag.q2_lack_gpu));
    row("  q3_satisfied (usable)", &|p| {
        format!("{:.0}", p.frag.q3_satisfied)
    });
    row("  q4_lack_cpu", &|p| format!("{:.0}", p.frag.q4_lack_cpu));
    row("  xl_satisfied", &|p| format!("{:.0}", p.frag.xl_satisfied));
    row("  xr_lack_cpu", &|p| format!("{:.0}", p.frag.xr_lack_cpu));
    row("  no_access", &|p| format!("{:.0}", p.frag.no_access));
    row("scheduling wall time (ms)", &|p| {
        format!("{:.1}", p.wall_seconds * 1000.0)
    });
    s
}

/// Averages documents of the same policies over seeds: every number is the mean; curve points
/// are averaged per arrived percent over the seeds that have that point.
pub fn mean_over_seeds(docs: &[FillJson]) -> FillJson {
    let Some(first) = docs.first() else {
        return FillJson {
            trace: TraceJson {
                nodes: 0,
                gpus: 0,
                pods: 0,
                arrived_pct: 0.0,
                typical_shapes: 0,
                order: String::new(),
            },
            policies: Vec::new(),
        };
    };
    let n = docs.len() as f64;
    let mean = |f: &dyn Fn(&FillJson) -> f64| docs.iter().map(f).sum::<f64>() / n;
    let trace = TraceJson {
        pods: mean(&|d| d.trace.pods as f64).round() as usize,
        arrived_pct: round2(mean(&|d| d.trace.arrived_pct)),
        order: format!("mean of {} generated orders", docs.len()),
        ..first.trace.clone()
    };
    let policies = first
        .policies
        .iter()
        .enumerate()
        .map(|(i, p0)| {
            let all: Vec<&PolicyJson> = docs.iter().filter_map(|d| d.policies.get(i)).collect();
            let m = |f: &dyn Fn(&PolicyJson) -> f64| {
                all.iter().map(|p| f(p)).sum::<f64>() / all.len() as f64
            };
            let at100: Vec<f64> = all
                .iter()
                .filter_map(|p| p.gpu_milli_alloc_at_100)
                .collect();
            PolicyJson {
                policy: p0.policy.clone(),
                placed: m(&|p| p.placed as f64).round() as usize,
                failed: m(&|p| p.failed as f64).round() as usize,
                wall_seconds: m(&|p| p.wall_seconds),
                gpu_milli_alloc_ratio: m(&|p| p.gpu_milli_alloc_ratio),
                gpu_milli_alloc_at_100: (!at100.is_empty())
                    .then(|| at100.iter().sum::<f64>() / at100.len() as f64),
                gpu_count_alloc_ratio: m(&|p| p.gpu_count_alloc_ratio),
                cpu_alloc_ratio: m(&|p| p.cpu_alloc_ratio),
                memory_alloc_ratio: m(&|p| p.memory_alloc_ratio),
                frag: FragJson {
                    q1_lack_both: m(&|p| p.frag.q1_lack_both),
                    q2_lack_gpu: m(&|p| p.frag.q2_lack_gpu),
                    q3_satisfied: m(&|p| p.frag.q3_satisfied),
                    q4_lack_cpu: m(&|p| p.frag.q4_lack_cpu),
                    xl_satisfied: m(&|p| p.frag.xl_satisfied),
                    xr_lack_cpu: m(&|p| p.frag.xr_lack_cpu),
                    no_access: m(&|p| p.frag.no_access),
                    idle_gpu_milli: m(&|p| p.frag.idle_gpu_milli),
                    frag_gpu_milli: m(&|p| p.frag.frag_gpu_milli),
                },
                curve: mean_curve(all.iter().map(|p| p.curve.as_slice())),
                frag_curve: mean_curve(all.iter().map(|p| p.frag_curve.as_slice())),
            }
        })
        .collect();
    FillJson { trace, policies }
}

fn mean_curve<'a>(curves: impl Iterator<Item = &'a [CurvePoint]>) -> Vec<CurvePoint> {
    let mut acc: std::collections::BTreeMap<u32, (f64, u32)> = Default::default();
    for c in curves {
        for p in c {
            let e = acc.entry(p.arrived_pct).or_insert((0.0, 0));
            e.0 += p.alloc_pct;
            e.1 += 1;
        }
    }
    acc.into_iter()
        .map(|(x, (s, c))| CurvePoint {
            arrived_pct: x,
            alloc_pct: round2(s / f64::from(c)),
        })
        .collect()
}
