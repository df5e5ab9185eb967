//! `tessera-agent`: the per-node DaemonSet.

use clap::{Parser, Subcommand};

/// Tessera node agent: the kubelet device plugin for `nvidia.com/gpu`.
#[derive(Parser, Debug)]
#[command(name = "tessera-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the agent (device plugin, enforcement, reporting).
    Run,
    /// Show per-GPU occupancy on this node.
    Status,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None | Some(Command::Run) | Some(Command::Status) => {
            anyhow::bail!("not implemented yet: the node agent lands with its own issue")
        }
    }
}
