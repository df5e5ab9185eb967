//! `tessera-coordinator`: the cluster scheduler and its offline simulator.

use clap::{Parser, Subcommand};

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
    /// Run the scheduling core offline over a workload.
    Simulate,
    /// Print the CustomResourceDefinitions.
    Crds,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run | Command::Simulate | Command::Crds => {
            anyhow::bail!("not implemented yet")
        }
    }
}
