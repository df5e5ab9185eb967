//! Wires the pieces into a running agent: inventory → node state → ledger recovery →
//! device-plugin servers, the XID watcher, the periodic reconcile and the admin socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tessera_device_plugin::{PluginConfig, PluginError, PluginServer, run_all};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::{self, AdminContext, AdminError};
use crate::assignments::AssignmentSource;
use crate::enforce::usage::{PodMeter, ProcessAttribution};
use crate::gpu::{Backend, GpuError};
use crate::ledger::{Ledger, LedgerError};
use crate::node::{Node, NodeOptions, mig_resource};
use crate::plugin::{GpuPlugin, MigPlugin};
use crate::reconcile::reconcile_once;
use tessera_contract::keys::GPU_RESOURCE;

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// GPU discovery failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The checkpoint could not be opened.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The admin socket could not be served.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// A device-plugin server failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The metrics port could not be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        /// The `--metrics-addr` that could not be bound.
        addr: std::net::SocketAddr,
        /// Why binding failed, typically the port being in use.
        source: std::io::Error,
    },
    /// The run task panicked or was cancelled.
    #[error("agent task ended abnormally: {0}")]
    Task(String),
}

/// Everything `tessera-agent run` configures.
pub struct AgentConfig {
    /// This node's name.
    pub node_name: String,
    /// The GPU backend.
    pub backend: Backend,
    /// The kubelet's device-plugin directory.
    pub device_plugin_dir: PathBuf,
    /// The kubelet's pod-resources socket.
    pub pod_resources_socket: PathBuf,
    /// Where the ledger checkpoint lives.
    pub state_dir: PathBuf,
    /// The admin socket, if any.
    pub admin_socket: Option<PathBuf>,
    /// Slots and answer format.
    pub options: NodeOptions,
    /// Where assignments come from.
    pub source: Arc<dyn AssignmentSource>,
    /// Where the coordinator's `NodePods` go: the same object as `source` when the
    /// assignments come from the coordinator (the default), `None` otherwise.
    pub node_pods: Option<Arc<crate::coordinator_pods::CoordinatorPods>>,
    /// How often to reconcile with pod-resources.
    pub reconcile_every: Duration,
    /// How long a fresh allocation may be missing from pod-resources before release.
    pub reconcile_grace: Duration,
    /// Where to serve `/metrics` and `/healthz` (`None`: nowhere).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The coordinator endpoint (`http://host:port`), if reporting.
    pub coordinator: Option<String>,
    /// The ServiceAccount token presented to the coordinator (read on every connect).
    pub coordinator_token_file: Option<PathBuf>,
    /// The CA of the coordinator's certificate, for an `https://` coordinator.
    pub coordinator_ca_file: Option<PathBuf>,
    /// Where process cgroups are read to attribute GPU processes to pods (`/proc`;
    /// the DaemonSet runs with `hostPID`, so NVML's host PIDs are valid there).
    pub proc_root: PathBuf,
    /// The watchdog's settings; `None` turns it off (no pod is enforced).
    pub watchdog: Option<crate::enforce::watchdog::WatchdogConfig>,
    /// Where pod Events go (the API server, or the log without a cluster).
    pub events: Arc<dyn crate::events::EventSink>,
    /// MPS daemons for `isolation: mps` pods (`--mps-control`, `--mps-dir`, `--mps-idle-secs`).
    pub mps: crate::enforce::mps::MpsConfig,
    /// MIG instance creation for `isolation: mig` pods (`--mig-create`).
    pub mig: crate::enforce::mig::MigConfig,
}

/// A running agent.
pub struct Agent {
    node: Arc<Node>,
    stop: watch::Sender<bool>,
    /// Cleared on drop: the XID thread is a blocking task that the runtime would
    /// otherwise wait for forever when it shuts down.
    watching: Arc<AtomicBool>,
    task: Option<JoinHandle<Result<(), AgentError>>>,
    /// MPS and MIG supervision, aborted on drop.
    isolation_tasks: Vec<JoinHandle<()>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        for task in &self.isolation_tasks {
            task.abort();
        }
        self.watching.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
    }
}

impl Agent {
    /// Discovers the GPUs, recovers the ledger and starts serving.
    pub async fn start(config: AgentConfig) -> Result<Self, AgentError> {
        let ledger = Ledger::open(&config.state_dir)?;
        let backend = config.backend.as_dyn();
        // Creating MIG instances needs slots on the GPUs in MIG mode to admit pods on.
        let options = NodeOptions {
            mig_slots: config.options.mig_slots || config.mig.create,
            ..config.options
        };
        let node = Arc::new(Node::new(Arc::clone(&backend), ledger, options)?);
        tracing::info!(
            node = %config.node_name,
            backend = backend.kind(),
            gpus = node.devices().len(),
            recovered = node.ledger.lock().allocations().len(),
            "GPU inventory read"
        );
        let grace_ms = config.reconcile_grace.as_millis() as u64;
        // Whether the source's first list of the node's pods is in before the first
        // reconcile: if not, containers the ledger lacks are adopted the moment it arrives.
        let mut first_list = config.source.synced();
        let listed_at_start = *first_list.borrow_and_update();
        if config.pod_resources_socket.exists() {
            if let Err(error) = reconcile_once(
                &node,
                config.source.as_ref(),
                &config.pod_resources_socket,
                grace_ms,
            )
            .await
            {
                tracing::warn!(%error, "initial reconcile with the kubelet failed; keeping the checkpoint");
            }
        } else {
            tracing::info!(path = %config.pod_resources_socket.display(), "no pod-resources socket; skipping reconcile");
        }

        let metrics_listener = match config.metrics_addr {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| AgentError::Metrics { addr, source })?,
            ),
            None => None,
        };
        let admin_listener = match &config.admin_socket {
            Some(path) => Some(admin::bind(path)?),
            None => None,
        };

        let (mps, mig) = isolation_managers(&config, &node);
        let mut servers = vec![PluginServer::new(
            PluginConfig::new(GPU_RESOURCE)?.with_socket_dir(&config.device_plugin_dir),
            GpuPlugin::new(Arc::clone(&node), Arc::clone(&config.source))
                .with_pod_resources(config.pod_resources_socket.clone())
                .with_enforcement(Some(Arc::clone(&mps)), mig.clone()),
        )];
        for profile in node.mig_lists().keys() {
            servers.push(PluginServer::new(
                PluginConfig::new(mig_resource(profile))?
                    .with_socket_dir(&config.device_plugin_dir),
                MigPlugin::new(Arc::clone(&node), profile.clone()),
            ));
        }

        let enforcers = supervise_isolation(&config, &node, &mps, mig.as_ref());
        let (stop, stop_rx) = watch::channel(false);
        let watching = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(run(
            config,
            Arc::clone(&node),
            servers,
            Listeners {
                admin: admin_listener,
                metrics: metrics_listener,
            },
            (!listed_at_start).then_some(first_list),
            stop_rx,
            Arc::clone(&watching),
        ));
        Ok(Self {
            node,
            stop,
            watching,
            task: Some(task),
            isolation_tasks: enforcers,
        })
    }

    /// The node state (ledger, health, inventory).
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Stops serving (plugin sockets removed) and waits for it.
    pub async fn stop(self) -> Result<(), AgentError> {
        let _ = self.stop.send(true);
        self.wait().await
    }

    /// Runs until a device-plugin server fails or a [`Agent::stopper`] says stop.
    pub async fn wait(mut self) -> Result<(), AgentError> {
        match self.task.take() {
            Some(task) => task.await.map_err(|e| AgentError::Task(e.to_string()))?,
            None => Ok(()),
        }
    }

    /// A handle that makes [`Agent::wait`] return cleanly.
    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }
}

/// How often GPU conditions (lost, NVSwitch fabric) are polled.
const CONDITION_EVERY: Duration = Duration::from_secs(5);

/// The sockets bound before serving, so a bad address fails the start.
struct Listeners {
    admin: Option<tokio::net::UnixListener>,
    metrics: Option<tokio::net::TcpListener>,
}

/// Serves until stopped. `first_list` is the source's `synced` when its first list of the
/// node's pods was not in at the start's reconcile: the reconcile runs again the moment it is.
async fn run(
    config: AgentConfig,
    node: Arc<Node>,
    servers: Vec<PluginServer>,
    listeners: Listeners,
    first_list: Option<watch::Receiver<bool>>,
    mut stop: watch::Receiver<bool>,
    watching: Arc<AtomicBool>,
) -> Result<(), AgentError> {
    let mut background: Vec<JoinHandle<()>> = Vec::new();
    let meter = PodMeter::new(
        ProcessAttribution::new(config.proc_root.clone()),
        Arc::clone(&config.source),
    );

    // Stopped (and every process it paused resumed) before this function returns.
    let watchdog = config.watchdog.and_then(|settings| {
        crate::enforce::watchdog::start_for_node(
            &node,
            config.proc_root.clone(),
            settings,
            Arc::clone(&config.events),
        )
    });

    // XID watcher: the backend's wait blocks, so it gets its own thread.
    let xid_thread = {
        let node = Arc::clone(&node);
        let watching = Arc::clone(&watching);
        tokio::task::spawn_blocking(move || {
            let mut checked = std::time::Instant::now();
            let mut last_error: Option<String> = None;
            while watching.load(Ordering::Relaxed) {
                // Lost GPUs and the NVSwitch fabric are polled: neither sends an event
                // the agent can rely on.
                if checked.elapsed() >= CONDITION_EVERY {
                    node.refresh_conditions();
                    checked = std::time::Instant::now();
                }
                match node.backend().wait_event(Duration::from_millis(200)) {
                    Ok(Some(event)) => {
                        last_error = None;
                        node.on_xid(&event);
                    }
                    Ok(None) => last_error = None,
                    Err(error) => {
                        // Retried every second: the same cause is logged once, then at debug.
                        let text = error.to_string();
                        if last_error.as_deref() == Some(text.as_str()) {
                            tracing::debug!(error = %text, "XID watch failed again; retrying");
                        } else {
                            tracing::warn!(error = %text, "XID watch failed; retrying every second (repeats of this cause are logged at debug level)");
                            last_error = Some(text);
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })
    };

    if let Some(endpoint) = config.coordinator.clone() {
        background.push(tokio::spawn(crate::report::run_authenticated(
            endpoint,
            Arc::clone(&node),
            config.node_name.clone(),
            meter.clone(),
            crate::report::Security {
                token_file: config.coordinator_token_file.clone(),
                ca_file: config.coordinator_ca_file.clone(),
            },
            config.node_pods.clone(),
        )));
    }

    if let Some(listener) = listeners.metrics {
        background.push(tokio::spawn(crate::metrics::serve(
            listener,
            Arc::clone(&node),
        )));
    }

    if let Some(listener) = listeners.admin {
        let ctx = Arc::new(AdminContext {
            node: Arc::clone(&node),
            node_name: config.node_name.clone(),
            assignments: config.source.kind().to_string(),
            sim: config.backend.sim().cloned(),
            meter: meter.clone(),
        });
        background.push(tokio::spawn(admin::serve(listener, ctx)));
    }

    {
        let node = Arc::clone(&node);
        let source = Arc::clone(&config.source);
        let socket = config.pod_resources_socket.clone();
        let every = config.reconcile_every;
        let grace_ms = config.reconcile_grace.as_millis() as u64;
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            // Adoption waits for the source's first list of the node's pods: reconcile the
            // moment it arrives (or at once, if it came before this task ran) rather than a
            // whole period later.
            let mut awaiting = first_list.is_some();
            let mut synced = first_list.unwrap_or_else(|| source.synced());
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = synced.wait_for(|s| *s), if awaiting => awaiting = false,
                }
                if !socket.exists() {
                    continue;
                }
                if let Err(error) = reconcile_once(&node, source.as_ref(), &socket, grace_ms).await
                {
                    tracing::warn!(%error, "periodic reconcile failed");
                }
            }
        }));
    }

    if let Some(mut departures) = config.source.departures() {
        let node = Arc::clone(&node);
        background.push(tokio::spawn(async move {
            while let Some(uid) = departures.recv().await {
                node.release_departed(&uid);
            }
        }));
    }

    let result = run_all(servers, async move {
        let _ = stop.wait_for(|s| *s).await;
    })
    .await;

    watching.store(false, Ordering::Relaxed);
    for task in background {
        task.abort();
    }
    let _ = xid_thread.await;
    if let Some(watchdog) = watchdog {
        let _ = tokio::task::spawn_blocking(move || watchdog.stop()).await;
    }
    node.ledger.lock().flush();
    if let Some(path) = &config.admin_socket {
        let _ = std::fs::remove_file(path);
    }
    result.map_err(AgentError::from)
}

/// Ids of the allocations the ledger holds now.
fn held_ids(node: &Node) -> std::collections::BTreeSet<u64> {
    node.ledger
        .lock()
        .allocations()
        .iter()
        .map(|a| a.id)
        .collect()
}

/// Attaches every MPS allocation of the ledger (recorded `mps` at Allocate, or adopted so)
/// to its GPU's daemon.
fn attach_mps_clients(node: &Node, mps: &crate::enforce::mps::MpsManager) {
    use tessera_contract::Isolation;
    for a in node.ledger.lock().allocations() {
        if a.isolation == Isolation::Mps && a.origin == crate::ledger::Origin::Assigned {
            for g in &a.grants {
                mps.attach(&g.uuid, a.id);
            }
        }
    }
}

/// The MPS manager (re-attached to the recovered MPS allocations, adopting the daemons
/// a previous agent left) and the MIG manager when creation is on.
fn isolation_managers(
    config: &AgentConfig,
    node: &Arc<Node>,
) -> (
    Arc<crate::enforce::mps::MpsManager>,
    Option<Arc<crate::enforce::mig::MigManager>>,
) {
    let mps = Arc::new(crate::enforce::mps::MpsManager::new(config.mps.clone()));
    mps.adopt_running();
    attach_mps_clients(node, &mps);
    let mig = config.mig.create.then(|| {
        let mig = crate::enforce::mig::MigManager::new(
            Arc::clone(node.backend()),
            Some(&config.state_dir),
        );
        mig.rebind(node.ledger.lock().allocations());
        Arc::new(mig)
    });
    (mps, mig)
}

/// The supervision tasks: MPS daemons kept alive or stopped when idle, MIG instances
/// of departed pods destroyed.
fn supervise_isolation(
    config: &AgentConfig,
    node: &Arc<Node>,
    mps: &Arc<crate::enforce::mps::MpsManager>,
    mig: Option<&Arc<crate::enforce::mig::MigManager>>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    {
        let node = Arc::clone(node);
        let clients = Arc::clone(mps);
        tasks.push(tokio::spawn(Arc::clone(mps).supervise(move || {
            // MPS allocations the reconcile adopted after start (a lost checkpoint) are
            // clients too: their daemon is kept alive and restarted like any other's.
            attach_mps_clients(&node, &clients);
            held_ids(&node)
        })));
    }
    if let Some(mig) = mig {
        let (mig, node, every) = (Arc::clone(mig), Arc::clone(node), config.mig.sweep_every);
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (mig, node) = (Arc::clone(&mig), Arc::clone(&node));
                let _ = tokio::task::spawn_blocking(move || mig.sweep(|| held_ids(&node))).await;
            }
        }));
    }
    tasks
}
