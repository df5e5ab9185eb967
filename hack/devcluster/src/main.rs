//! `tessera-devcluster`: runs the development cluster.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tessera_devcluster::cluster::DevCluster;
use tessera_devcluster::config::ClusterConfig;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(
    name = "tessera-devcluster",
    about = "Loopback Kubernetes API server and hollow GPU nodes for development and tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the API server and the hollow nodes; Ctrl-C stops everything.
    Up {
        /// Cluster description (YAML); a two-node cluster with 4 GPUs each when absent.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the kubeconfig once the server answers.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Port on 127.0.0.1 (0 picks a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Up {
            config,
            kubeconfig,
            port,
        } => up(config, kubeconfig, port).await,
    }
}

async fn up(
    config_path: Option<PathBuf>,
    kubeconfig_path: PathBuf,
    port: u16,
) -> anyhow::Result<()> {
    // Registered before anything is printed, so a Ctrl-C right after startup is never lost.
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let cluster = match &config_path {
        Some(path) => ClusterConfig::load(path)?,
        None => ClusterConfig::default(),
    };
    let dev = DevCluster::start(&cluster, port).await?;
    let url = dev.url();
    dev.write_kubeconfig(&kubeconfig_path)
        .with_context(|| format!("writing kubeconfig {}", kubeconfig_path.display()))?;
    // Write errors are ignored: whoever started us may stop reading stdout after the address.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "API server: {url}");
    let _ = writeln!(out, "kubeconfig: {}", kubeconfig_path.display());
    let _ = writeln!(
        out,
        "try: kubectl --kubeconfig {} get nodes",
        kubeconfig_path.display()
    );
    let _ = out.flush();

    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("stopping");
    dev.shutdown().await;
    Ok(())
}
