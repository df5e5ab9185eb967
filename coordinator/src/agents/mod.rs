//! The coordinator's side of the agent protocol (`tessera.v1.AgentService`, port 7070):
//! authenticated streams from the node agents feed the [`AgentRegistry`], the live GPU
//! inventory, health and occupancy per node that the cluster cache joins into snapshots.
//! Every message is checked against [`limits`] before it is acted on, so the work per
//! message is bounded whatever it says.
//!
//! Never depends on the cluster runtime; the runtime reads the registry.

pub mod auth;
pub mod limits;
mod peer_limit;
pub mod registry;
pub mod service;

#[cfg(test)]
mod fuzz;

pub use auth::{AuthError, Authenticator, DEFAULT_AGENT_USER, Identity, TokenReviewAuth, Validity};
pub use limits::FieldError;
pub use registry::{AgentNode, AgentRegistry, GpuOccupancy, ReportError, ShareInfo};
pub use service::{AgentServer, ServiceOptions, StreamLimits};

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
    let limits = options.limits;
    tracing::info!(
        %addr,
        tls = tls.is_some(),
        max_message_bytes = limits.max_message_bytes,
        max_streams_per_connection = limits.max_streams_per_connection,
        "agent service listening"
    );
    let service = AgentServer::new(registry, auth, options, shutdown.clone());
    let mut stop = shutdown;
    let until = async move {
        stopped(&mut stop).await;
    };
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_streams_per_connection)
        .concurrency_limit_per_connection(service::AUTHENTICATING_PER_CONNECTION)
        .add_service(
            AgentServiceServer::new(service).max_decoding_message_size(limits.max_message_bytes),
        );
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
