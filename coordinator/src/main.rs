//! `tessera-coordinator`: the cluster scheduler and its offline simulator.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use tessera_coordinator::sim::experiment::{FillSpec, PolicyRun, prepare, run_policy};
use tessera_coordinator::sim::policy::{Policy, parse_policies};
use tessera_coordinator::sim::{plot, report, sample};

/// Tessera coordinator: gang, fair-share and fragmentation-aware GPU scheduling.
#[derive(Parser, Debug)]
#[command(name = "tessera-coordinator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run as the cluster's scheduler.
    Run,
    /// Run the scheduling core offline over a workload (no arguments: the bundled sample).
    Simulate(SimulateArgs),
    /// Print the CustomResourceDefinitions.
    Crds,
}

#[derive(Args, Debug)]
struct SimulateArgs {
    #[command(subcommand)]
    mode: Option<SimMode>,
}

#[derive(Subcommand, Debug)]
enum SimMode {
    /// Arrival-only fill-up experiment over an openb trace (the FGD paper's protocol).
    Fill(Box<FillArgs>),
    /// Time-based replay of a Tessera workload YAML (arrivals, durations, departures).
    Replay(ReplayArgs),
}

#[derive(Args, Debug)]
struct FillArgs {
    /// Node list CSV (openb_node_list_gpu_node.csv).
    #[arg(long)]
    openb_nodes: PathBuf,
    /// Pod list CSV (openb_pod_list_<variant>.csv).
    #[arg(long)]
    openb_pods: PathBuf,
    /// Total GPU request of the generated order, as a multiple of cluster GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    inflate: f64,
    /// Seed of the generated arrival order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Run every seed of an inclusive range (e.g. `42-51`) and report means.
    #[arg(long, conflicts_with = "events")]
    seeds: Option<String>,
    /// Policy name (tessera = the scheduling core's own placement, alias core; fgd, bestfit,
    /// packing, clustering, dotprod, random), comma-separated names, or `all`.
    #[arg(long, default_value = "tessera")]
    policy: String,
    /// Exact arrival order file (events/<trace>_s<seed>_order.csv.gz).
    #[arg(long)]
    events: Option<PathBuf>,
    /// Node tie-break prefixes (default: the `_nodes` file beside --events).
    #[arg(long, requires = "events")]
    event_nodes: Option<PathBuf>,
    /// Write the numbers as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the allocation curves as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// Tessera workload YAML (cluster, queues, jobs).
    #[arg(long)]
    workload: PathBuf,
    /// Policy name.
    #[arg(long, default_value = "tessera")]
    policy: String,
    /// Write the numbers as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the plot as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => match args.mode {
            None => sample_cmd(),
            Some(SimMode::Fill(f)) => fill_cmd(&f),
            Some(SimMode::Replay(r)) => replay_cmd(&r),
        },
        Command::Run | Command::Crds => anyhow::bail!("not implemented yet"),
    }
}

/// A progress bar on stderr that appears only once a run has lasted a second, and never when
/// stderr is not a terminal.
struct Progress {
    bar: ProgressBar,
    start: Instant,
    shown: bool,
}

impl Progress {
    fn new(label: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} pods") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(label.to_string());
        Progress {
            bar,
            start: Instant::now(),
            shown: false,
        }
    }

    fn tick(&mut self, done: usize, total: usize) {
        if !self.shown
            && self.start.elapsed() > Duration::from_secs(1)
            && std::io::stderr().is_terminal()
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown = true;
        }
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

fn parse_seeds(s: &str) -> anyhow::Result<Vec<u64>> {
    let bad = || format!("--seeds `{s}`: expected FIRST-LAST (e.g. 42-51) or a comma list");
    if let Some((a, b)) = s.split_once('-') {
        let a: u64 = a.trim().parse().with_context(bad)?;
        let b: u64 = b.trim().parse().with_context(bad)?;
        anyhow::ensure!(a <= b, bad());
        Ok((a..=b).collect())
    } else {
        s.split(',')
            .map(|x| x.trim().parse::<u64>().with_context(bad))
            .collect()
    }
}

fn fill_cmd(a: &FillArgs) -> anyhow::Result<()> {
    let policies = parse_policies(&a.policy)?;
    anyhow::ensure!(
        a.inflate.is_finite() && a.inflate > 0.0,
        "--inflate {}: expected a positive number such as 1.3",
        a.inflate
    );
    let seeds = match &a.seeds {
        Some(s) => parse_seeds(s)?,
        None => vec![a.seed],
    };
    let mut per_seed = Vec::new();
    for &seed in &seeds {
        let spec = FillSpec {
            nodes: a.openb_nodes.clone(),
            pods: a.openb_pods.clone(),
            events: a.events.clone(),
            prefixes: a.event_nodes.clone(),
            inflate: a.inflate,
            seed,
        };
        let prepared = prepare(&spec)?;
        let runs: Vec<PolicyRun> = policies
            .iter()
            .map(|&p| {
                let mut progress = Progress::new(p.name());
                run_policy(&prepared, p, seed, &mut |d, t| progress.tick(d, t))
            })
            .collect();
        let doc = report::fill_json(&prepared, &runs);
        if seeds.len() == 1 {
            print!("{}", report::human(&doc));
        } else {
            eprintln!("seed {seed} done");
        }
        per_seed.push(doc);
    }
    let doc = if per_seed.len() == 1 {
        per_seed.remove(0)
    } else {
        let mean = report::mean_over_seeds(&per_seed);
        print!("{}", report::human(&mean));
        mean
    };
    if let Some(kib) = peak_rss_kib() {
        println!(
            "peak memory (VmHWM, whole process)  {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.plot {
        let svg = plot::fill_svg(&doc);
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Peak resident set size of this process in KiB (Linux `/proc/self/status` VmHWM).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn sample_cmd() -> anyhow::Result<()> {
    let path = sample::default_workload_path();
    let text = sample::run_sample(&path)?;
    print!("{text}");
    Ok(())
}

fn replay_cmd(r: &ReplayArgs) -> anyhow::Result<()> {
    let policy: Policy = r.policy.parse()?;
    let text = sample::run_workload(&r.workload, policy, r.json.as_deref(), r.plot.as_deref())?;
    print!("{text}");
    Ok(())
}
