//! The coordinator's side of the agent protocol (`tessera.v1.AgentService`, port 7070):
//! authenticated streams from the node agents feed the [`AgentRegistry`], the live GPU
//! inventory, health and occupancy per node that the cluster cache joins into snapshots.
//!
//! Never depends on the cluster runtime; the runtime reads the registry.

pub mod auth;
pub mod registry;
pub mod service;

pub use auth::{AuthError, Authenticator, DEFAULT_AGENT_USER, Identity, TokenReviewAuth};
pub use registry::{AgentNode, AgentRegistry, GpuOccupancy, InventoryError, ShareInfo};
pub use service::{AgentServer, ServiceOptions};

use tessera_proto::tessera::v1::agent_service_server::AgentServiceServer;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;

/// Errors of the agent service.
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    /// The gRPC server failed.
    #[error("agent service on {addr}: {source}")]
    Serve {
        /// The listen address, when known.
        addr: String,
        /// Why tonic stopped serving (the listener failed or a connection could not be
        /// accepted).
        source: tonic::transport::Error,
    },
}

/// Serves `AgentService` on `listener` with default options until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: AgentRegistry,
    auth: Authenticator,
    shutdown: watch::Receiver<bool>,
) -> Result<(), AgentsError> {
    serve_with(
        listener,
        registry,
        auth,
        ServiceOptions::default(),
        shutdown,
    )
    .await
}

/// Serves `AgentService` on `listener` until `shutdown` turns true; open streams are
/// closed then, and their nodes marked disconnected.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    registry: AgentRegistry,
    auth: Authenticator,
    options: ServiceOptions,
    shutdown: watch::Receiver<bool>,
) -> Result<(), AgentsError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let tls = options.tls.clone();
    tracing::info!(%addr, tls = tls.is_some(), "agent service listening");
    let service = AgentServer::new(registry, auth, options, shutdown.clone());
    let mut stop = shutdown;
    let until = async move {
        stopped(&mut stop).await;
    };
    let router = tonic::transport::Server::builder().add_service(AgentServiceServer::new(service));
    let served = match tls {
        Some(cert) => {
            router
                .serve_with_incoming_shutdown(crate::tls::incoming(listener, cert), until)
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), until)
                .await
        }
    };
    served.map_err(|source| AgentsError::Serve { addr, source })
}

/// Resolves once `shutdown` turns true; never when its sender is dropped without that
/// (a dropped sender is not a request to stop).
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}
