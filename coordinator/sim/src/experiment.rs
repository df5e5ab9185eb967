//! One fill experiment end to end: load the openb trace, build (or replay) the arrival order,
//! run the requested policies, and summarise each run.

use std::path::{Path, PathBuf};

use thiserror::Error;

use tessera_core::placement::frag::ShapeMix;

use super::cluster::{Cluster, SimPod};
use super::fill::{FillOutcome, run_fill};
use super::metrics::{CurvePoint, alloc_curve, at, frag_curve};
use super::openb::{self, CsvError};
use super::policy::Policy;
use super::trace::{TYPICAL_COVERAGE, generate, typical_mix};

/// Failure to set up an experiment.
#[derive(Debug, Error)]
pub enum ExperimentError {
    /// An input file is unreadable or malformed.
    #[error(transparent)]
    Csv(#[from] CsvError),
    /// Inputs are inconsistent.
    #[error("{0}")]
    Invalid(String),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct FillSpec {
    /// Node list CSV.
    pub nodes: PathBuf,
    /// Pod list CSV (the original trace; defines the typical shapes).
    pub pods: PathBuf,
    /// Exact arrival order file (`events/*_order.csv[.gz]`); else generated from `seed`.
    pub events: Option<PathBuf>,
    /// Node tie-break prefixes; defaults to the `_nodes` file beside `events`.
    pub prefixes: Option<PathBuf>,
    /// Workload tuning ratio (total GPU request / cluster GPU capacity).
    pub inflate: f64,
    /// Seed of the generated order (and of the Random policy).
    pub seed: u64,
}

/// The loaded, ready-to-run workload.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The cluster with its tie-break keys.
    pub cluster: Cluster,
    /// Typical-shape mix of the original trace.
    pub mix: ShapeMix,
    /// Pods in arrival order.
    pub arrivals: Vec<SimPod>,
    /// Where the order came from (file or seed), for the report.
    pub order_source: String,
    /// Percent of GPU capacity the whole arrival sequence requests.
    pub arrived_pct: f64,
}

/// Summary of one policy's run.
#[derive(Clone, Debug)]
pub struct PolicyRun {
    /// The fill run itself (placements, per-arrival totals, scheduling time) that the curves
    /// are computed from.
    pub outcome: FillOutcome,
    /// GPU allocation curve (percent of capacity vs arrived percent).
    pub curve: Vec<CurvePoint>,
    /// Fragment curve (percent of capacity vs arrived percent).
    pub frag_curve: Vec<CurvePoint>,
}

impl PolicyRun {
    /// Curve value at `x` percent arrived.
    pub fn alloc_at(&self, x: u32) -> Option<f64> {
        at(&self.curve, x)
    }
}

/// Loads the inputs and builds the arrival order.
pub fn prepare(spec: &FillSpec) -> Result<Prepared, ExperimentError> {
    let nodes = openb::read_nodes(&spec.nodes)?;
    let original = openb::read_pods(&spec.pods)?;
    if nodes.is_empty() {
        return Err(ExperimentError::Invalid(format!(
            "{}: no nodes",
            spec.nodes.display()
        )));
    }
    let (mut cluster, order, source) = match &spec.events {
        Some(events) => {
            let prefix_path = spec
                .prefixes
                .clone()
                .or_else(|| openb::prefixes_beside(events).filter(|p| p.exists()));
            let prefixes = match &prefix_path {
                Some(p) => Some(openb::read_prefixes(p)?),
                None => None,
            };
            let cluster = Cluster::from_openb(&nodes, prefixes.as_deref());
            let order = openb::read_pods(events)?;
            let src = match prefix_path {
                Some(p) => format!("{} (ties: {})", events.display(), p.display()),
                None => format!("{} (ties: node names)", events.display()),
            };
            (cluster, order, src)
        }
        None => {
            let mut cluster = Cluster::from_openb(&nodes, None);
            let gen_ = generate(
                &original,
                cluster.gpu_milli(),
                nodes.len(),
                spec.inflate,
                spec.seed,
            );
            cluster.apply_permutation(&gen_.node_perm);
            let src = format!("generated: seed {}, inflate {}", spec.seed, spec.inflate);
            (cluster, gen_.pods, src)
        }
    };
    // Model names that only pods mention still need ids so specs resolve consistently.
    for p in original.iter().chain(&order) {
        for m in p
            .gpu_spec
            .split('|')
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            if cluster.models.get(m).is_none() {
                cluster.models.intern(m);
            }
        }
    }
    let mix = typical_mix(&cluster, &original, TYPICAL_COVERAGE);
    let arrivals: Vec<SimPod> = order.iter().map(|p| cluster.pod(p)).collect();
    let requested: u64 = arrivals.iter().map(|p| p.shape.gpu_total()).sum();
    let cap = cluster.gpu_milli().max(1);
    Ok(Prepared {
        arrived_pct: 100.0 * requested as f64 / cap as f64,
        cluster,
        mix,
        arrivals,
        order_source: source,
    })
}

/// Runs one policy over a prepared workload.
pub fn run_policy(
    p: &Prepared,
    policy: Policy,
    seed: u64,
    progress: &mut dyn FnMut(usize, usize),
) -> PolicyRun {
    let outcome = run_fill(&p.cluster, &p.mix, &p.arrivals, policy, seed, progress);
    let gpus = p.cluster.gpu_count();
    let max_pct = p.arrived_pct.ceil().max(0.0) as u32;
    PolicyRun {
        curve: alloc_curve(&outcome.events, gpus, max_pct),
        frag_curve: frag_curve(&outcome.events, gpus, max_pct),
        outcome,
    }
}

/// The openb data in `shared/data/openb` beside the repository, found from any directory
/// inside it (a crate's manifest directory, say), if present.
pub fn default_data_dir(inside_repo: &Path) -> Option<PathBuf> {
    inside_repo
        .ancestors()
        .map(|a| a.join("shared/data/openb"))
        .find(|d| d.join("openb_node_list_gpu_node.csv").exists())
}
