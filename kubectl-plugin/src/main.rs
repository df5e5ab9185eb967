//! `kubectl tessera` (the krew-style binary `kubectl-tessera`): the cluster's GPUs, queues and
//! why a pod waits, read through the API server with the user's own kubeconfig and RBAC.
//!
//! Everything it shows is what the user may read: the coordinator's `GpuNode` views (one per
//! GPU node, written by the leading coordinator from its agents' reports), `Queue` and
//! `PodGroup` status, Nodes, and the user's own pods and their events. It writes nothing.
//! `tessera-viewer` (a ClusterRole the chart installs) grants exactly the cluster-wide reads.

mod client;
mod fit;
mod format;
mod gpus;
mod queues;
mod top;
mod why;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// kubectl tessera: the cluster's GPUs, queues and why a pod waits.
#[derive(Parser, Debug)]
#[command(name = "kubectl tessera", version, about, long_about = None)]
struct Cli {
    /// The kubeconfig file to use (default: KUBECONFIG, else ~/.kube/config, else the
    /// in-cluster ServiceAccount).
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// Namespace of the pod `why` explains (default: the context's namespace, else `default`).
    #[arg(short, long, global = true, value_name = "NAMESPACE")]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// Output format of `gpus`, `queues` and `why`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    /// Aligned columns for people.
    Table,
    /// One JSON document for programs.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every node's GPUs: model, memory, health, who holds which share, measured memory and
    /// utilisation (the coordinator's view of its agents).
    Gpus {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// The queue hierarchy as a tree: deserved quota, fair share, allocated, pending and limit,
    /// in GPUs.
    Queues {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Why a pod waits: the coordinator's reason, recent FailedScheduling events, each GPU node
    /// judged against the pod's request, and what would make it fit.
    Why {
        /// The pod's name (in `-n NAMESPACE`).
        #[arg(required_unless_present = "selector", conflicts_with = "selector")]
        pod: Option<String>,
        /// Instead of a name, a label selector (`job-name=train`): the first matching pod
        /// that is not bound yet, by name (else the first match).
        #[arg(short = 'l', long, value_name = "SELECTOR")]
        selector: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// GPUs and queues, redrawn every few seconds until q or ctrl-c.
    Top {
        /// Seconds between redraws.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
        interval: u64,
        /// Draw once and exit (for scripts and tests).
        #[arg(long)]
        once: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", client::explain(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let target = client::Target {
        kubeconfig: cli.kubeconfig,
        context: cli.context,
        namespace: cli.namespace,
    };
    let (client, namespace) = client::connect(&target).await?;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Gpus { output } => {
            let nodes = gpus::fetch(&client).await?;
            print(
                &mut out,
                output,
                || gpus::table(&nodes),
                || gpus::json(&nodes),
            )
        }
        Command::Queues { output } => {
            let queues = queues::fetch(&client).await?;
            print(
                &mut out,
                output,
                || queues::table(&queues),
                || queues::json(&queues),
            )
        }
        Command::Why {
            pod,
            selector,
            output,
        } => {
            let pod = match (pod, selector) {
                (Some(name), _) => why::Which::Name(name),
                (None, Some(selector)) => why::Which::Selector(selector),
                // clap requires one of the two.
                (None, None) => anyhow::bail!("why needs a pod name or -l SELECTOR"),
            };
            let report = why::explain(&client, &namespace, &pod).await?;
            print(
                &mut out,
                output,
                || why::text(&report),
                || serde_json::to_value(&report).unwrap_or_default(),
            )
        }
        Command::Top { interval, once } => {
            drop(out);
            top::run(&client, Duration::from_secs(interval), once).await
        }
    }
}

fn print(
    out: &mut impl std::io::Write,
    output: Output,
    table: impl FnOnce() -> String,
    json: impl FnOnce() -> serde_json::Value,
) -> anyhow::Result<()> {
    let text = match output {
        Output::Table => table(),
        Output::Json => format!("{:#}\n", json()),
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}
