//! `tessera-coordinator`: the cluster scheduler and its offline simulator.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tessera_logs::LogFormat;

use tessera_sim::experiment::{FillSpec, PolicyRun, prepare, run_policy};
use tessera_sim::policy::{Policy, parse_policies};
use tessera_sim::{plot, report, sample};

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
    Run(Box<RunArgs>),
    /// Run the scheduling core offline over a workload (no arguments: the bundled sample).
    Simulate(SimulateArgs),
    /// Print the CustomResourceDefinitions (Queue, PodGroup, Topology) as multi-document YAML.
    Crds(CrdsArgs),
    /// Print another scheduler's objects as Tessera's, with what does not carry over.
    Migrate(MigrateArgs),
}

#[derive(Args, Debug)]
struct MigrateArgs {
    #[command(subcommand)]
    from: MigrateFrom,
}

#[derive(Subcommand, Debug)]
enum MigrateFrom {
    /// KAI Scheduler: its Queues (scheduling.run.ai/v2) and PodGroups (v2alpha2) as Tessera
    /// Queues and PodGroups, and pods or workloads naming kai-scheduler rewritten to Tessera's
    /// names; notes beside each say what changed in meaning. Reads the cluster (KUBECONFIG or
    /// --kubeconfig) unless given files. Prints multi-document YAML for `kubectl apply -f`.
    Kai(KaiArgs),
}

#[derive(Args, Debug)]
struct KaiArgs {
    /// Read KAI's objects (and workloads) from this YAML file instead of the cluster
    /// (repeatable; `-` is standard input; a directory: its .yaml, .yml and .json files).
    #[arg(short = 'f', long = "filename")]
    files: Vec<PathBuf>,
    /// The kubeconfig of the cluster to read (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct CrdsArgs {
    /// Write one file per CRD (`queues.yaml`, `podgroups.yaml`, `topologies.yaml`) into this
    /// directory instead of printing them (e.g. `--out deploy/crds`).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Pods whose `spec.schedulerName` is this are scheduled by this coordinator.
    #[arg(long, default_value = "tessera")]
    scheduler_name: String,
    /// This replica's identity in the leader Lease (default: the pod name from the
    /// POD_NAME environment variable, else the host name).
    #[arg(long)]
    identity: Option<String>,
    /// Namespace of the leader Lease.
    #[arg(long, default_value = "tessera-system")]
    lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "tessera-coordinator")]
    lease_name: String,
    /// Seconds a Lease stays valid after its last renewal; a standby takes over this long
    /// after the leader dies.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_duration_secs: u64,
    /// Seconds between renewals by the leader (and polls by standbys); less than two thirds
    /// of the lease duration.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
    renew_secs: u64,
    /// Address of the agent gRPC service (`host:port`), or `none`.
    #[arg(long, default_value = "0.0.0.0:7070")]
    agent_listen: String,
    /// The agent service's PEM certificate chain: with it (and --agent-tls-key-file) agents
    /// connect over TLS (`--coordinator https://…` and `--coordinator-ca-file` on the agent).
    /// Re-read every 10 s, so a rotated Secret takes effect without a restart.
    #[arg(long)]
    agent_tls_cert_file: Option<PathBuf>,
    /// The agent service's PEM private key.
    #[arg(long)]
    agent_tls_key_file: Option<PathBuf>,
    /// Address of `/metrics`, `/healthz` and `/readyz` (`host:port`), or `none`.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_listen: String,
    /// Address of the mutating admission webhook (HTTPS, `POST /mutate-pods`) that routes
    /// default-scheduler pods asking for `nvidia.com/gpu` to this scheduler, or `none`.
    /// Needs --webhook-cert-file and --webhook-key-file.
    #[arg(long, default_value = "none")]
    webhook_listen: String,
    /// The webhook's PEM certificate chain; re-read every 10 s, so a rotated Secret takes
    /// effect without a restart.
    #[arg(long)]
    webhook_cert_file: Option<PathBuf>,
    /// The webhook's PEM private key.
    #[arg(long)]
    webhook_key_file: Option<PathBuf>,
    /// How agents authenticate: `tokenreview` (their ServiceAccount token, checked with a
    /// TokenReview) or `none` (development only: any client may report for any node).
    #[arg(long, value_enum, default_value_t = AgentAuth::Tokenreview)]
    agent_auth: AgentAuth,
    /// Audience agents' tokens must be issued for (a projected ServiceAccount token); empty:
    /// the API server's own audience, i.e. the agent's ordinary ServiceAccount token.
    #[arg(long, default_value = "tessera")]
    agent_token_audience: String,
    /// Usernames allowed to report as agents, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = tessera_coordinator::agents::DEFAULT_AGENT_USER
    )]
    agent_users: Vec<String>,
    /// Largest message an agent may send, in bytes; a larger one ends its stream with
    /// RESOURCE_EXHAUSTED. A 16-GPU node's messages are under 1 MB.
    #[arg(long, default_value_t = tessera_coordinator::agents::limits::DEFAULT_MAX_MESSAGE_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(65_536..=268_435_456))]
    agent_max_message_bytes: u64,
    /// HTTP/2 streams one agent connection may have open at once (an agent opens one; raise
    /// it when a proxy carries many agents over one connection).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    agent_max_streams_per_connection: u32,
    /// TokenReviews one peer address may cause per minute (also its burst); streams beyond
    /// are refused with RESOURCE_EXHAUSTED. Admissions are cached for 30 s and refusals for
    /// 10 s, so an agent needs about one per connection.
    #[arg(long, default_value_t = tessera_coordinator::agents::auth::DEFAULT_REVIEWS_PER_MINUTE,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    agent_token_reviews_per_minute: u32,
    /// Seconds without word from a node's agent after which the node gets no new GPU pods.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    agent_timeout_secs: u64,
    /// Seconds a node's agent may be missing (after this replica begins to lead, the node
    /// appears, or the agent's stream closes) before pending GPU pods' messages say so: agents
    /// take a moment to reconnect after a restart or a failover.
    #[arg(long, default_value_t = 60)]
    agent_grace_secs: u64,
    /// Milliseconds between scheduling cycles when nothing changes.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    cycle_interval_ms: u64,
    /// Units (a gang, or a pod on its own) whose Bindings may be in flight at once; each
    /// unit's members still go one after another.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    binds_in_flight: u64,
    /// At most this many GpuNode views (what `kubectl tessera gpus` reads) written per second,
    /// changes in who holds what first; 0 writes none.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=1000))]
    gpu_view_writes_per_sec: u64,
    /// Seconds between rewrites of a node's GpuNode view whose only change is in measured
    /// memory or utilisation.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    gpu_view_refresh_secs: u64,
    #[command(flatten)]
    usage: UsageArgs,
    /// Seconds between writes of a queue's usage history into its status (sooner when it
    /// moved by more than a tenth, but never more often than a tenth of this): what a new
    /// leader goes on from.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    usage_write_interval_secs: u64,
    /// Log line format: human-readable `text` (coloured only on a terminal), or `json`, one
    /// object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Usage history in fair share (`run` and `simulate replay`).
#[derive(Args, Debug, Clone, Copy)]
struct UsageArgs {
    /// Half-life in seconds of each queue's usage history, which scales down the over-quota
    /// weight of queues that used more than their share recently (deserved quotas stay
    /// guaranteed); 0 = off, fair share looks only at the present.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    usage_half_life_secs: u64,
    /// Usage history is forgotten at every multiple of this many seconds (a tumbling window,
    /// aligned to Unix time); 0 = never.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    usage_window_secs: u64,
}

impl UsageArgs {
    fn decay(self) -> anyhow::Result<tessera_core::usage::UsageDecay> {
        anyhow::ensure!(
            self.usage_window_secs == 0 || self.usage_half_life_secs > 0,
            "--usage-window-secs {}: usage history is off without --usage-half-life-secs; give a half-life in seconds (such as 86400) or drop the window",
            self.usage_window_secs
        );
        Ok(tessera_core::usage::UsageDecay {
            half_life_seconds: self.usage_half_life_secs,
            window_seconds: self.usage_window_secs,
        })
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum AgentAuth {
    /// Check ServiceAccount tokens with TokenReview.
    Tokenreview,
    /// No authentication (development only).
    None,
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
    /// Also say why each job waited, cycle by cycle, in the words of the pod's Unschedulable
    /// message in a cluster; list every eviction and parent queues' shares.
    #[arg(long)]
    explain: bool,
    /// With usage history on, the workload also runs without it: the report adds what
    /// changed for each queue, and the plot shows both runs.
    #[command(flatten)]
    usage: UsageArgs,
}

/// Each cycle builds and drops a snapshot of every pod (tens of thousands of small
/// allocations): mimalloc halves what the system allocator costs there (the `snapshot`
/// benchmark, README).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => match args.mode {
            None => sample_cmd(),
            Some(SimMode::Fill(f)) => fill_cmd(&f),
            Some(SimMode::Replay(r)) => replay_cmd(&r),
        },
        Command::Crds(args) => crds_cmd(&args),
        Command::Run(args) => run_cmd(*args),
        Command::Migrate(args) => match args.from {
            MigrateFrom::Kai(k) => migrate_kai_cmd(&k),
        },
    }
}

fn migrate_kai_cmd(args: &KaiArgs) -> anyhow::Result<()> {
    use tessera_coordinator::migrate::{kai, source};
    let mut documents = Vec::new();
    let mut absent = Vec::new();
    if args.files.is_empty() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        documents = runtime.block_on(async {
            let config = match &args.kubeconfig {
                Some(path) => {
                    let file = kube::config::Kubeconfig::read_from(path)
                        .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
                    kube::Config::from_custom_kubeconfig(file, &Default::default())
                        .await
                        .with_context(|| format!("using --kubeconfig {}", path.display()))?
                }
                None => kube::Config::infer()
                    .await
                    .context("connecting to the Kubernetes API (KUBECONFIG or --kubeconfig)")?,
            };
            let client =
                kube::Client::try_from(config).context("building the Kubernetes client")?;
            source::read_cluster(&client, &mut absent)
                .await
                .context("reading KAI's objects from the cluster")
        })?;
    } else {
        for path in &args.files {
            documents.extend(source::read_file(path)?);
        }
    }
    for a in &absent {
        eprintln!("note: {a}");
    }
    print!("{}", kai::migrate(&documents).to_yaml()?);
    Ok(())
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

fn crds_cmd(args: &CrdsArgs) -> anyhow::Result<()> {
    match &args.out {
        None => print!("{}", tessera_coordinator::crd::all_yaml()?),
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, text) in tessera_coordinator::crd::files()? {
                let path = dir.join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

/// `host:port` or `none` for a listen flag.
fn parse_listen(flag: &str, value: &str) -> anyhow::Result<Option<std::net::SocketAddr>> {
    if value.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    value.parse().map(Some).with_context(|| {
        format!("{flag} {value:?}: expected host:port such as 0.0.0.0:7070, or none")
    })
}

/// The pod name, else the host name.
fn default_identity() -> anyhow::Result<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()));
    host.context("--identity: not given, POD_NAME is unset and the host name is unknown; pass --identity <unique replica name>")
}

fn run_cmd(args: RunArgs) -> anyhow::Result<()> {
    use tessera_coordinator::agents::Authenticator;
    use tessera_coordinator::cluster::leader::LeaseConfig;
    use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig};
    tessera_logs::init(args.log_format)
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
    let identity = args
        .identity
        .or_else(|| std::env::var("POD_NAME").ok())
        .filter(|i| !i.is_empty());
    let identity = match identity {
        Some(identity) => identity,
        None => default_identity()?,
    };
    let lease = LeaseConfig {
        namespace: args.lease_namespace,
        name: args.lease_name,
        duration: Duration::from_secs(args.lease_duration_secs),
        renew_every: Duration::from_secs(args.renew_secs),
    };
    lease
        .validate()
        .context("--lease-duration-secs / --renew-secs")?;
    let agent_listen = parse_listen("--agent-listen", &args.agent_listen)?;
    let metrics_listen = parse_listen("--metrics-listen", &args.metrics_listen)?;
    let agent_tls = match (args.agent_tls_cert_file, args.agent_tls_key_file) {
        (Some(cert_file), Some(key_file)) => Some(tessera_coordinator::tls::CertFiles {
            cert_file,
            key_file,
        }),
        (None, None) => None,
        _ => anyhow::bail!(
            "--agent-tls-cert-file and --agent-tls-key-file: give both (PEM files; the chart mounts them from a Secret) or neither"
        ),
    };
    let webhook = match parse_listen("--webhook-listen", &args.webhook_listen)? {
        None => None,
        Some(listen) => {
            let (Some(cert_file), Some(key_file)) = (args.webhook_cert_file, args.webhook_key_file)
            else {
                anyhow::bail!(
                    "--webhook-listen {listen}: also give --webhook-cert-file and --webhook-key-file (PEM files; the chart mounts them from a Secret)"
                );
            };
            Some(tessera_coordinator::webhook::WebhookConfig {
                listen,
                cert_file,
                key_file,
                scheduler_name: args.scheduler_name.clone(),
                reload_every: tessera_coordinator::webhook::server::RELOAD_EVERY,
            })
        }
    };
    let agent_users: Vec<String> = args
        .agent_users
        .iter()
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect();
    anyhow::ensure!(
        args.agent_auth == AgentAuth::None || !agent_users.is_empty(),
        "--agent-users: expected at least one username such as {}",
        tessera_coordinator::agents::DEFAULT_AGENT_USER
    );

    let usage = args.usage.decay()?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut kube_config = kube::Config::infer()
            .await
            .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
        // Every write path judges a 429 itself (a disruption budget's refusal is an answer,
        // API priority and fairness asks for a retry) and every loop retries on its next round;
        // the client's own retries would hold a budget-refused eviction for minutes.
        kube_config.default_retry = false;
        let client = kube::Client::try_from(kube_config)
            .context("building the Kubernetes client (in-cluster config or KUBECONFIG)")?;
        let authenticator = match args.agent_auth {
            AgentAuth::Tokenreview => Authenticator::token_review(client.clone(), agent_users)
                .with_audience(Some(args.agent_token_audience.clone()))
                .with_reviews_per_minute(args.agent_token_reviews_per_minute),
            AgentAuth::None => {
                tracing::warn!("agent authentication is off: any client may report for any node");
                Authenticator::Disabled
            }
        };
        let config = CoordinatorConfig {
            scheduler_name: args.scheduler_name,
            identity: identity.clone(),
            lease,
            agent_listen,
            agent_tls,
            agent_limits: tessera_coordinator::agents::StreamLimits {
                max_message_bytes: usize::try_from(args.agent_max_message_bytes)
                    .context("--agent-max-message-bytes: too large for this machine")?,
                max_streams_per_connection: args.agent_max_streams_per_connection,
            },
            metrics_listen,
            authenticator,
            agent_timeout: Duration::from_secs(args.agent_timeout_secs),
            agent_grace: Duration::from_secs(args.agent_grace_secs),
            cycle_interval: Duration::from_millis(args.cycle_interval_ms),
            binds_in_flight: args.binds_in_flight as usize,
            gpu_view: tessera_coordinator::cluster::gpu_view::GpuViewConfig {
                writes_per_pass: args.gpu_view_writes_per_sec as usize,
                refresh: Duration::from_secs(args.gpu_view_refresh_secs),
            },
            cycle: tessera_core::cycle::CycleConfig {
                usage,
                ..Default::default()
            },
            usage_write_interval: Duration::from_secs(args.usage_write_interval_secs),
            ..CoordinatorConfig::default()
        };
        let signal = termination_signal().context("installing signal handlers")?;
        // Every replica serves the webhook, leader or not: admission must not wait for an
        // election.
        let webhook = match webhook {
            Some(config) => Some(
                tessera_coordinator::webhook::WebhookHandle::start(config)
                    .await
                    .context("starting the admission webhook")?,
            ),
            None => None,
        };
        let handle = Coordinator::start(client, config)
            .await
            .context("starting the coordinator")?;
        tracing::info!(
            %identity,
            agents = ?handle.agent_addr(),
            metrics = ?handle.metrics_addr(),
            "coordinator started"
        );
        signal.await;
        tracing::info!("stopping: finishing the cycle, releasing the lease");
        handle.shutdown().await;
        if let Some(webhook) = webhook {
            webhook.stop().await;
        }
        tracing::info!("stopped");
        Ok(())
    })
}

/// Resolves on the first SIGTERM or SIGINT.
fn termination_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

fn sample_cmd() -> anyhow::Result<()> {
    let path = sample::default_workload_path();
    let text = sample::run_sample(&path)?;
    print!("{text}");
    Ok(())
}

fn replay_cmd(r: &ReplayArgs) -> anyhow::Result<()> {
    let policy: Policy = r.policy.parse()?;
    let text = sample::run_workload(
        &r.workload,
        policy,
        &sample::Outputs {
            json: r.json.as_deref(),
            plot: r.plot.as_deref(),
            explain: r.explain,
        },
        r.usage.decay()?,
    )?;
    print!("{text}");
    Ok(())
}
