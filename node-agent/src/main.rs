//! `tessera-agent`: the per-node DaemonSet, and the operator CLI that talks to it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use tessera_agent::admin::{self, Response};
use tessera_agent::agent::{Agent, AgentConfig};
use tessera_agent::assignments::{AssignmentSource, NoAssignments};
use tessera_agent::coordinator_pods::CoordinatorPods;
use tessera_agent::enforce::mig::MigConfig;
use tessera_agent::enforce::mps::MpsConfig;
use tessera_agent::enforce::watchdog::WatchdogConfig;
use tessera_agent::events::{EventSink, KubeEvents, LogEvents};
use tessera_agent::gpu::Backend;
use tessera_agent::kube_assignments::KubeAssignments;
use tessera_agent::node::NodeOptions;
use tessera_agent::probe;
use tessera_logs::LogFormat;
use tessera_proto::deviceplugin::DEFAULT_DEVICE_PLUGIN_DIR;
use tessera_proto::podresources::{DEFAULT_POD_RESOURCES_DIR, POD_RESOURCES_SOCKET};

const DEFAULT_ADMIN_SOCKET: &str = "/var/run/tessera/agent.sock";
/// Where Kubernetes mounts the pod's ServiceAccount token.
const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Tessera node agent: the kubelet device plugin for `nvidia.com/gpu`.
#[derive(Parser, Debug)]
#[command(name = "tessera-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the agent (device plugin, ledger, reporting).
    Run(Box<RunArgs>),
    /// Show per-GPU occupancy on this node (asks the running agent).
    Status {
        /// The agent's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN_SOCKET)]
        admin_socket: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the GPU link matrix (asks the running agent).
    Topology {
        /// The agent's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN_SOCKET)]
        admin_socket: PathBuf,
        /// Print JSON instead of the matrix.
        #[arg(long)]
        json: bool,
    },
    /// Read what the GPU backend sees here, without a running agent and without changing
    /// anything: GPUs, links, processes, MIG profiles and instances, XID events. Exits 1
    /// when any backend call fails, naming it.
    Probe {
        /// `nvml`, or `sim:<file.yaml>` for a simulated machine (see hack/gpus/).
        #[arg(long, default_value = "nvml")]
        gpu_backend: String,
        /// Seconds to listen for XID events (0: do not listen).
        #[arg(long, default_value_t = 0.0)]
        events_secs: f64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Simulated backend only: report an XID error on a GPU, as the driver would.
    InjectXid {
        /// The agent's admin socket.
        #[arg(long, default_value = DEFAULT_ADMIN_SOCKET)]
        admin_socket: PathBuf,
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// XID code (e.g. 79, "GPU has fallen off the bus").
        #[arg(long)]
        xid: u64,
    },
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Log line format: human-readable `text` (coloured only on a terminal), or `json`, one
    /// object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// `nvml`, or `sim:<file.yaml>` for a simulated machine (see hack/gpus/).
    #[arg(long, default_value = "nvml")]
    gpu_backend: String,
    /// The kubelet's device-plugin directory.
    #[arg(long, default_value = DEFAULT_DEVICE_PLUGIN_DIR)]
    device_plugin_dir: PathBuf,
    /// The kubelet's pod-resources socket (default: <pod-resources dir>/kubelet.sock).
    #[arg(long)]
    pod_resources_socket: Option<PathBuf>,
    /// Where the ledger checkpoint is kept.
    #[arg(long, default_value = "/var/lib/tessera")]
    state_dir: PathBuf,
    /// The admin socket for `status` and `topology` (mode 0600).
    #[arg(long, default_value = DEFAULT_ADMIN_SOCKET)]
    admin_socket: PathBuf,
    /// Slots advertised per healthy GPU.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    shares_per_gpu: u32,
    /// Answer Allocate with CDI device names (`nvidia.com/gpu=<uuid>`) instead of
    /// NVIDIA_VISIBLE_DEVICES.
    #[arg(long)]
    cdi: bool,
    /// Run without a cluster: no assignments, every request gets whole free GPUs.
    #[arg(long)]
    no_kube: bool,
    /// Where the node's pods and their assignments come from: `coordinator` (its agent
    /// stream; the agent needs no pod access in the API), or `kube` (a read-only watch of
    /// the pods bound to this node; needs list/watch on pods).
    #[arg(long, value_enum, default_value_t = AssignmentsArg::Coordinator)]
    assignments: AssignmentsArg,
    /// Coordinator address (`host:port` or `http://host:port` for plaintext,
    /// `https://host:port` for TLS with --coordinator-ca-file), or `none`.
    #[arg(long, default_value = "none")]
    coordinator: String,
    /// ServiceAccount token presented to the coordinator; `none` to send no token.
    /// A missing file only logs a warning (the agent then connects without a token).
    #[arg(long, default_value = DEFAULT_TOKEN_FILE)]
    coordinator_token_file: String,
    /// PEM CA certificate that signed the coordinator's certificate (for an `https://`
    /// --coordinator); read on every connect.
    #[arg(long)]
    coordinator_ca_file: Option<PathBuf>,
    /// Address for `/metrics` and `/healthz`, or `none`.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: String,
    /// Where process cgroups are read to map GPU processes to pods. NVML reports host
    /// PIDs, so this is the host's /proc (the DaemonSet runs with hostPID).
    #[arg(long, default_value = tessera_agent::enforce::usage::DEFAULT_PROC_ROOT)]
    proc_root: PathBuf,
    /// Seconds between reconciles with the kubelet's pod-resources API.
    #[arg(long, default_value_t = 30)]
    reconcile_interval_secs: u64,
    /// Turn the watchdog off: pods with isolation `watchdog` are then not enforced.
    #[arg(long)]
    no_watchdog: bool,
    /// Milliseconds between watchdog readings of GPU memory and utilisation.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(20..=60_000))]
    watchdog_interval_ms: u64,
    /// Milliseconds a pod may stay over its GPU memory limit before its processes on
    /// that GPU are killed.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    memory_grace_ms: u64,
    /// What to do with a pod that stays over its GPU memory limit: `kill` its processes
    /// on that GPU, or only `warn` (Event and metric).
    #[arg(long, default_value = "kill", value_parser = clap::builder::PossibleValuesParser::new(["kill", "warn"]))]
    memory_action: String,
    /// Milliseconds per duty-cycling period when a pod is throttled to its compute share
    /// (at most half the watchdog interval).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(10..=1000))]
    throttle_period_ms: u64,
    /// The MPS control program for `tessera.dev/isolation: mps` pods: a path, or a name
    /// looked up on PATH.
    #[arg(long, default_value = "nvidia-cuda-mps-control")]
    mps_control: PathBuf,
    /// Where each GPU's MPS daemon gets its `<gpu-uuid>/pipe` and `<gpu-uuid>/log`
    /// directories (the pipe directory is mounted into MPS pods).
    #[arg(long, default_value = "/var/run/tessera/mps")]
    mps_dir: PathBuf,
    /// Seconds a GPU's MPS daemon is kept running without MPS pods before it is told to quit.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    mps_idle_secs: u64,
    /// Create a MIG instance from free capacity for each `tessera.dev/isolation: mig` pod
    /// assigned a GPU in MIG mode, and destroy it when the pod is gone. GPUs in MIG mode
    /// then also get `nvidia.com/gpu` slots. The MIG mode itself is never changed.
    #[arg(long)]
    mig_create: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Status { admin_socket, json } => {
            let Response::Status(report) = admin::request(&admin_socket, "status").await? else {
                bail!("the agent answered something other than a status report");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", admin::render_status(&report));
            }
            Ok(())
        }
        Command::Topology { admin_socket, json } => {
            let Response::Topology(report) = admin::request(&admin_socket, "topology").await?
            else {
                bail!("the agent answered something other than a topology report");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.text);
            }
            Ok(())
        }
        Command::Probe {
            gpu_backend,
            events_secs,
            json,
        } => {
            let listen_for_events = Duration::try_from_secs_f64(events_secs)
                .ok()
                .filter(|d| *d <= Duration::from_secs(3600))
                .with_context(|| {
                    format!("--events-secs {events_secs}: expected seconds from 0 to 3600")
                })?;
            let backend = Backend::open(&gpu_backend)?;
            let report = probe::probe(
                backend.as_dyn().as_ref(),
                probe::ProbeOptions { listen_for_events },
            );
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", probe::render(&report));
            }
            if !report.ok() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::InjectXid {
            admin_socket,
            gpu,
            xid,
        } => {
            admin::request(&admin_socket, &format!("inject-xid {gpu} {xid}")).await?;
            Ok(())
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum AssignmentsArg {
    /// The coordinator's agent stream.
    Coordinator,
    /// A read-only watch of the pods bound to this node.
    Kube,
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    // The coordinator's definition (crate tessera-logs), so one collector parses both.
    let installed = tessera_logs::init(args.log_format);
    installed.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
    let coordinator = match args.coordinator.as_str() {
        "none" => None,
        addr if addr.starts_with("http://") || addr.starts_with("https://") => {
            Some(addr.to_owned())
        }
        addr if addr.contains(':') => Some(format!("http://{addr}")),
        addr => bail!(
            "--coordinator {addr:?}: expected host:port (e.g. tessera-coordinator:7070), an http:// or https:// URL, or none"
        ),
    };
    if coordinator
        .as_deref()
        .is_some_and(|c| c.starts_with("https://"))
        && args.coordinator_ca_file.is_none()
    {
        bail!(
            "--coordinator {}: an https:// coordinator needs --coordinator-ca-file (the CA that signed its certificate)",
            args.coordinator
        );
    }
    let metrics_addr = match args.metrics_addr.as_str() {
        "none" => None,
        addr => Some(addr.parse().with_context(|| {
            format!("--metrics-addr {addr:?}: expected host:port such as 0.0.0.0:9090, or none")
        })?),
    };
    if args.throttle_period_ms * 2 > args.watchdog_interval_ms {
        bail!(
            "--throttle-period-ms {} with --watchdog-interval-ms {}: the throttle period must be at most half the watchdog interval, so each reading averages over whole periods",
            args.throttle_period_ms,
            args.watchdog_interval_ms
        );
    }
    let watchdog = (!args.no_watchdog).then(|| WatchdogConfig {
        interval: Duration::from_millis(args.watchdog_interval_ms),
        memory_grace: Duration::from_millis(args.memory_grace_ms),
        // Validated by clap against the same two words.
        memory_action: args.memory_action.parse().unwrap_or_default(),
        throttle_period: Duration::from_millis(args.throttle_period_ms),
        ..WatchdogConfig::default()
    });
    let backend = Backend::open(&args.gpu_backend)?;
    let mut events: Arc<dyn EventSink> = Arc::new(LogEvents);
    if !args.no_kube && args.assignments == AssignmentsArg::Coordinator && coordinator.is_none() {
        bail!(
            "--assignments coordinator needs --coordinator HOST:PORT (the coordinator streams \
             this node's pods); use --assignments kube to read them from the API, or --no-kube"
        );
    }
    let mut node_pods = None;
    let source: Arc<dyn AssignmentSource> = if args.no_kube {
        Arc::new(NoAssignments)
    } else {
        let client = kube::Client::try_default().await.context(
            "connecting to the Kubernetes API (in-cluster config or KUBECONFIG); \
             use --no-kube to run without a cluster",
        )?;
        events = Arc::new(KubeEvents::new(client.clone(), &args.node_name));
        match args.assignments {
            AssignmentsArg::Kube => {
                let pods = KubeAssignments::start(client, &args.node_name);
                if !pods.wait_synced(Duration::from_secs(30)).await {
                    tracing::warn!(
                        "the pod list has not arrived after 30s; continuing, Allocate will wait for assignments"
                    );
                }
                Arc::new(pods)
            }
            AssignmentsArg::Coordinator => {
                // Filled by the coordinator stream once it connects; Allocate waits for it.
                let pods = Arc::new(CoordinatorPods::new());
                node_pods = Some(Arc::clone(&pods));
                pods
            }
        }
    };
    let config = AgentConfig {
        node_name: args.node_name,
        backend,
        device_plugin_dir: args.device_plugin_dir,
        pod_resources_socket: args
            .pod_resources_socket
            .unwrap_or_else(|| PathBuf::from(DEFAULT_POD_RESOURCES_DIR).join(POD_RESOURCES_SOCKET)),
        state_dir: args.state_dir,
        admin_socket: Some(args.admin_socket),
        options: NodeOptions {
            shares_per_gpu: args.shares_per_gpu,
            cdi: args.cdi,
            mig_slots: args.mig_create,
        },
        source,
        node_pods,
        reconcile_every: Duration::from_secs(args.reconcile_interval_secs.max(1)),
        reconcile_grace: Duration::from_secs(30),
        metrics_addr,
        coordinator,
        coordinator_token_file: match args.coordinator_token_file.as_str() {
            "none" | "" => None,
            path => Some(PathBuf::from(path)),
        },
        coordinator_ca_file: args.coordinator_ca_file,
        proc_root: args.proc_root,
        watchdog,
        events,
        mps: MpsConfig {
            control: args.mps_control,
            base_dir: args.mps_dir,
            idle: Duration::from_secs(args.mps_idle_secs),
            ..MpsConfig::default()
        },
        mig: MigConfig {
            create: args.mig_create,
            ..MigConfig::default()
        },
    };
    let agent = Agent::start(config).await.context("starting the agent")?;
    let stopper = agent.stopper();
    let signal =
        tessera_device_plugin::termination_signal().context("installing signal handlers")?;
    tokio::spawn(async move {
        signal.await;
        let _ = stopper.send(true);
    });
    agent.wait().await.context("agent stopped")?;
    Ok(())
}
