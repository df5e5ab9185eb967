//! The coordinator in a cluster: watches → cache → snapshot → scheduling cycle → binder, with
//! status and events, behind leader election.
//!
//! [`Coordinator::start`] wires the pieces: the [`cache::Cache`] (kube-runtime watchers), the
//! agent registry and its gRPC service, the Lease-based [`leader`] elector, the operations HTTP
//! server, the leader-only [`scheduler`] loop and the nodes' GPU labels ([`node_labels`]). The scheduling core never depends on this
//! module; this module only reads the core's decisions and writes them to the API server.

pub mod agent_gap;
pub mod binder;
pub mod cache;
pub mod events;
pub mod gate;
pub mod gpu_view;
pub mod leader;
pub mod node_labels;
pub mod node_pods;
pub mod occupancy;
mod plan;
pub mod pod_log;
pub mod refusals;
pub mod scheduler;
pub mod snapshot;
pub mod status;
mod status_queue;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::agents::{AgentRegistry, Authenticator};
use crate::ops::Metrics;
use tessera_core::cycle::CycleConfig;

/// Failures starting the coordinator.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A listen address could not be bound.
    #[error("cannot listen for {what} on {addr}: {source}")]
    Listen {
        /// `agents` or `metrics`.
        what: &'static str,
        /// The address from `--agent-listen` or `--metrics-listen`.
        addr: SocketAddr,
        /// Why binding failed, typically the port being in use.
        source: std::io::Error,
    },
    /// The agent service's certificate did not load.
    #[error(
        "--agent-tls-cert-file {cert}: {source} (expected a PEM certificate chain and its PEM private key)"
    )]
    AgentCertificate {
        /// The `--agent-tls-cert-file` path as given; only this one is named, though the key file
        /// may be the one at fault.
        cert: String,
        /// Why reading or parsing the PEM certificate chain or private key failed.
        source: std::io::Error,
    },
    /// Leader election is misconfigured.
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
}

/// How the coordinator runs. `Default` suits a test cluster; `main.rs` fills it from flags.
#[derive(Clone)]
pub struct CoordinatorConfig {
    /// Pods with this `spec.schedulerName` are scheduled (`tessera`).
    pub scheduler_name: String,
    /// This replica's identity (pod name or hostname) for the Lease and events.
    pub identity: String,
    /// Leader election.
    pub lease: leader::LeaseConfig,
    /// Where agents connect (`0.0.0.0:7070`); `None` = no agent service.
    pub agent_listen: Option<SocketAddr>,
    /// The agent service's certificate (TLS); `None` serves plaintext.
    pub agent_tls: Option<crate::tls::CertFiles>,
    /// What one agent connection and message may ask of the agent service.
    pub agent_limits: crate::agents::StreamLimits,
    /// Where `/metrics`, `/healthz`, `/readyz` are served (`0.0.0.0:9090`); `None` = none.
    pub metrics_listen: Option<SocketAddr>,
    /// How agents prove who they are.
    pub authenticator: Authenticator,
    /// A node whose agent is silent this long (or never connected, or disconnected) gets no
    /// new GPU pods: its GPUs count as unhealthy; pods already there still count.
    pub agent_timeout: Duration,
    /// How long a node's agent may be missing (after this replica began to lead, the node
    /// appeared, or the agent's stream closed) before pending GPU pods' messages say so.
    pub agent_grace: Duration,
    /// A cycle runs at least this often, and whenever the cache or the agents changed.
    pub cycle_interval: Duration,
    /// Scheduling core settings.
    pub cycle: CycleConfig,
    /// How long a decided pod may wait for its node (victims still terminating, or another
    /// pod with the same GPU count not yet allocated there) before the decision is dropped
    /// (and a partly bound gang evicted).
    pub bind_wait_timeout: Duration,
    /// How long one Binding may go unanswered before its unit counts as failed (the API
    /// client itself has no read timeout). The pod is then looked up, and watched for a
    /// late bind that would have to be rolled back.
    pub bind_call_timeout: Duration,
    /// How many units' Bindings may be in flight at once (each unit's members still go one
    /// after the other, so a refused member stops its gang). kube-scheduler's default binding
    /// parallelism is 16 too.
    pub binds_in_flight: usize,
    /// How often the leader writes each node's `GpuNode` view (`kubectl tessera gpus`).
    pub gpu_view: gpu_view::GpuViewConfig,
    /// At most this long between writes of a queue's usage history into its status (while
    /// usage history is on, `cycle.usage`); sooner when it moved by more than a tenth, but
    /// never more often than a tenth of this.
    pub usage_write_interval: Duration,
    /// The agent registry to use; `None` = a fresh one. Tests pass their own to simulate
    /// agents without a gRPC stream.
    pub registry: Option<AgentRegistry>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            scheduler_name: "tessera".to_owned(),
            identity: default_identity(),
            lease: leader::LeaseConfig::default(),
            agent_listen: None,
            agent_tls: None,
            agent_limits: crate::agents::StreamLimits::default(),
            metrics_listen: None,
            authenticator: Authenticator::Disabled,
            agent_timeout: Duration::from_secs(30),
            agent_grace: agent_gap::DEFAULT_AGENT_GRACE,
            cycle_interval: Duration::from_secs(1),
            cycle: CycleConfig::default(),
            bind_wait_timeout: Duration::from_secs(120),
            bind_call_timeout: Duration::from_secs(10),
            binds_in_flight: 16,
            gpu_view: gpu_view::GpuViewConfig::default(),
            usage_write_interval: Duration::from_secs(60),
            registry: None,
        }
    }
}

fn default_identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("tessera-coordinator-{}", std::process::id()))
}

/// Entry point.
pub struct Coordinator;

impl Coordinator {
    /// Starts everything in the background on the current tokio runtime and returns at once;
    /// the scheduling loop waits for leadership and for the cache's initial lists.
    pub async fn start(
        client: kube::Client,
        config: CoordinatorConfig,
    ) -> Result<CoordinatorHandle, ClusterError> {
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let metrics = Arc::new(Metrics::new());
        let registry = config.registry.clone().unwrap_or_default();
        let mut tasks = Vec::new();

        let agent_listener = match config.agent_listen {
            Some(addr) => Some(bind(addr, "agents").await?),
            None => None,
        };
        let metrics_listener = match config.metrics_listen {
            Some(addr) => Some(bind(addr, "metrics").await?),
            None => None,
        };
        let agent_addr = agent_listener.as_ref().and_then(|l| l.local_addr().ok());
        let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());

        let elector =
            leader::LeaderElector::start(client.clone(), &config.identity, config.lease.clone())?;
        let is_leader = elector.is_leader();
        let cache = cache::Cache::start(&client);

        if let Some(listener) = agent_listener {
            let registry = registry.clone();
            let auth = config.authenticator.clone();
            let stop = shutdown_rx.clone();
            let tls = match &config.agent_tls {
                Some(files) => {
                    let (cert, reloading) = crate::tls::ReloadingCert::load(
                        files,
                        "agent service",
                        crate::tls::RELOAD_EVERY,
                    )
                    .await
                    .map_err(|source| ClusterError::AgentCertificate {
                        cert: files.cert_file.display().to_string(),
                        source,
                    })?;
                    tasks.push(reloading);
                    Some(cert)
                }
                None => None,
            };
            let options = crate::agents::ServiceOptions {
                coordinator_id: config.identity.clone(),
                leadership: Some(is_leader.clone()),
                tls,
                limits: config.agent_limits,
                ..Default::default()
            };
            tasks.push(tokio::spawn(async move {
                if let Err(error) =
                    crate::agents::serve_with(listener, registry, auth, options, stop).await
                {
                    tracing::error!(%error, "agent service stopped");
                }
            }));
        }
        if let Some(listener) = metrics_listener {
            let metrics = Arc::clone(&metrics);
            let ready = cache.ready();
            let stop = shutdown_rx.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(error) = crate::ops::serve(listener, metrics, ready, stop).await {
                    tracing::error!(%error, "metrics server stopped");
                }
            }));
        }

        // Nodes' GPU labels, written by the leader only (through the write gate).
        let labeller = node_labels::Labeller::new(
            gate::gated(client.clone(), is_leader.clone()),
            cache.clone(),
            registry.clone(),
            is_leader.clone(),
        );
        tasks.push(tokio::spawn(labeller.run(shutdown_rx.clone())));
        tasks.push(tokio::spawn(gpu_view::run(
            gate::gated(client.clone(), is_leader.clone()),
            cache.clone(),
            registry.clone(),
            is_leader.clone(),
            config.gpu_view.clone(),
            config.agent_timeout,
            shutdown_rx.clone(),
        )));
        let node_pods = node_pods::Publisher::new(cache.clone(), registry.clone());
        tasks.push(tokio::spawn(node_pods.clone().run(shutdown_rx.clone())));
        let scheduler = scheduler::Scheduler::new(
            client,
            Arc::new(config),
            cache.clone(),
            registry.clone(),
            node_pods,
            Arc::clone(&metrics),
            is_leader.clone(),
        );
        let loop_task = tokio::spawn(scheduler.run(shutdown_rx));

        Ok(CoordinatorHandle {
            agent_addr,
            metrics_addr,
            is_leader,
            registry,
            metrics,
            cache,
            elector,
            shutdown: shutdown_tx,
            loop_task,
            tasks,
        })
    }
}

async fn bind(
    addr: SocketAddr,
    what: &'static str,
) -> Result<tokio::net::TcpListener, ClusterError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ClusterError::Listen { what, addr, source })
}

/// A running coordinator: the addresses it bound, whether it leads now, and `shutdown`.
pub struct CoordinatorHandle {
    agent_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    is_leader: watch::Receiver<bool>,
    registry: AgentRegistry,
    metrics: Arc<Metrics>,
    cache: cache::Cache,
    elector: leader::LeaderElector,
    shutdown: watch::Sender<bool>,
    loop_task: JoinHandle<()>,
    tasks: Vec<JoinHandle<()>>,
}

impl CoordinatorHandle {
    /// The agent service's bound address (port 0 in the config resolves here).
    pub fn agent_addr(&self) -> Option<SocketAddr> {
        self.agent_addr
    }

    /// The operations server's bound address.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Whether this replica holds the lease now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// Changes of leadership.
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.is_leader.clone()
    }

    /// The live agent inventory (tests simulate agents through it).
    pub fn agents(&self) -> AgentRegistry {
        self.registry.clone()
    }

    /// The metrics this replica records.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// True once every watcher finished its initial list.
    pub fn is_ready(&self) -> bool {
        self.cache.is_ready()
    }

    /// Graceful stop: finishes the cycle in progress, stops the servers, releases the lease.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.loop_task.await;
        self.elector.release().await;
        self.cache.stop();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Abrupt stop, as if the process died: aborts every task and keeps the lease (the
    /// standby takes over when it expires).
    pub fn kill(self) {
        self.loop_task.abort();
        self.elector.abort();
        self.cache.stop();
        for t in self.tasks {
            t.abort();
        }
    }
}

/// An agent's record as the registry keeps it, for tests of what the cluster layer makes of
/// agents: `gpus` reported, the stream open or not, last heard from at `last_seen`.
#[cfg(test)]
pub(crate) fn test_agent(
    node: &str,
    gpus: Vec<tessera_core::model::Gpu>,
    connected: bool,
    last_seen: std::time::Instant,
) -> crate::agents::AgentNode {
    crate::agents::AgentNode {
        node: node.into(),
        agent_version: String::new(),
        protocol_version: 2,
        gpus,
        shares_per_gpu: 10,
        occupancy: Default::default(),
        health_reasons: Default::default(),
        allocated_pods: Default::default(),
        occupancy_reports: 0,
        connected,
        last_seen,
    }
}
