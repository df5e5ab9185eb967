//! An in-memory, Kubernetes-compatible API server over plain HTTP on loopback.
//!
//! It serves what Tessera, kube-rs and kubectl use: core pods (binding, eviction, status), nodes,
//! events, namespaces, leases, CRDs and the custom resources they declare, TokenReview, and
//! discovery. Objects are stored as JSON per resource type with one global resourceVersion
//! counter; watches replay retained history and answer 410 Gone beyond it.

pub mod audit;
mod discovery;
pub mod error;
mod events;
mod handlers;
pub mod meta;
mod openapi;
pub mod patch;
pub mod resources;
mod respond;
mod reviews;
pub mod routes;
pub mod selectors;
pub mod store;
mod table;
mod watch;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

use store::Store;

/// A bearer token the server knows, and who it stands for.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct Token {
    /// The bearer token.
    pub token: String,
    /// Username reported by TokenReview.
    pub user: String,
    /// Groups reported by TokenReview.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Extra user attributes reported by TokenReview, e.g.
    /// `authentication.kubernetes.io/node-name` for a node-bound ServiceAccount token.
    #[serde(default)]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Listen address; port 0 picks a free port.
    pub bind: SocketAddr,
    /// Tokens the server knows (for authentication and TokenReview).
    pub tokens: Vec<Token>,
    /// Reject requests without a known bearer token (health endpoints excepted).
    pub require_auth: bool,
    /// Changes retained for watch resumption; older resourceVersions get 410 Gone.
    pub history: usize,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            tokens: Vec::new(),
            require_auth: false,
            history: 10_000,
            bookmark_interval: Duration::from_secs(10),
        }
    }
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Requested address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// State shared by all requests.
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) config: ApiServerConfig,
    pub(crate) address: String,
    pub(crate) shutdown: signal::Receiver<bool>,
    /// The request audit log (off unless a test enables it).
    pub(crate) audit: audit::AuditLog,
}

/// The server entry point.
pub struct ApiServer;

impl ApiServer {
    /// Binds and starts serving in the background on the current tokio runtime.
    pub async fn start(config: ApiServerConfig) -> Result<ApiServerHandle, StartError> {
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.bind,
            source,
        })?;
        let (stop_tx, stop_rx) = signal::channel(false);
        let shared = Arc::new(Shared {
            store: Store::new(config.history),
            config,
            address: format!("http://{addr}"),
            shutdown: stop_rx.clone(),
            audit: audit::AuditLog::default(),
        });
        let app = axum::Router::new()
            .fallback(handlers::handle)
            .with_state(shared.clone());
        let mut stop = stop_rx;
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "API server stopped with an error");
            }
        });
        tracing::info!(%addr, "API server listening");
        Ok(ApiServerHandle {
            addr,
            stop: stop_tx,
            task,
            shared,
        })
    }
}

/// A running server.
pub struct ApiServerHandle {
    addr: SocketAddr,
    stop: signal::Sender<bool>,
    task: JoinHandle<()>,
    shared: Arc<Shared>,
}

impl ApiServerHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.shared.address.clone()
    }

    /// The latest resourceVersion.
    pub fn current_resource_version(&self) -> u64 {
        self.shared.store.current_rv()
    }

    /// The request audit log (off until [`audit::AuditLog::enable`]).
    pub fn audit(&self) -> audit::AuditLog {
        self.shared.audit.clone()
    }

    /// Ends all watches, stops accepting connections and waits for in-flight requests.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
