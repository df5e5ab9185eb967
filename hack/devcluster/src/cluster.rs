//! A whole development cluster in one handle: the API server, a client for it, and the hollow
//! nodes of a [`ClusterConfig`]. What `tessera-devcluster up` runs, and what integration tests
//! of the agent and coordinator start in one line.

use std::net::SocketAddr;
use std::path::Path;

use crate::apiserver::{ApiServer, ApiServerConfig, ApiServerHandle, StartError, Token};
use crate::config::ClusterConfig;
use crate::hollow::{HollowError, HollowNode, HollowNodeConfig, HollowNodeHandle};
use crate::kubeconfig;

/// User name the cluster token stands for (TokenReview, SelfSubjectReview).
pub const ADMIN_USER: &str = "devcluster-admin";

/// Failures starting a development cluster.
#[derive(Debug, thiserror::Error)]
pub enum DevClusterError {
    /// The API server could not start.
    #[error(transparent)]
    Server(#[from] StartError),
    /// The client could not be built or the server did not answer it.
    #[error("API client: {0}")]
    Client(String),
    /// A hollow node could not start.
    #[error(transparent)]
    Node(#[from] HollowError),
}

/// A running development cluster.
pub struct DevCluster {
    server: ApiServerHandle,
    client: kube::Client,
    token: Option<String>,
    nodes: Vec<HollowNodeHandle>,
}

impl DevCluster {
    /// Starts the API server on `127.0.0.1:port` (0 = any free port), waits until it answers,
    /// and starts every node of `config`.
    pub async fn start(config: &ClusterConfig, port: u16) -> Result<Self, DevClusterError> {
        let tokens = config
            .token
            .iter()
            .map(|t| Token {
                token: t.clone(),
                user: ADMIN_USER.into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                extra: Default::default(),
            })
            .collect();
        let server = ApiServer::start(ApiServerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], port)),
            require_auth: config.token.is_some(),
            tokens,
            ..ApiServerConfig::default()
        })
        .await?;
        let client_config = kubeconfig::client_config(&server.url(), config.token.as_deref())
            .map_err(DevClusterError::Client)?;
        let client = kube::Client::try_from(client_config)
            .map_err(|e| DevClusterError::Client(e.to_string()))?;
        client
            .apiserver_version()
            .await
            .map_err(|e| DevClusterError::Client(format!("the API server does not answer: {e}")))?;
        let mut nodes = Vec::new();
        for (name, node) in config.expanded_nodes() {
            let started = HollowNode::start(
                client.clone(),
                HollowNodeConfig::from_description(&name, node),
            )
            .await;
            match started {
                Ok(handle) => nodes.push(handle),
                Err(e) => {
                    for node in nodes {
                        node.shutdown().await;
                    }
                    server.shutdown().await;
                    return Err(e.into());
                }
            }
        }
        Ok(Self {
            server,
            client,
            token: config.token.clone(),
            nodes,
        })
    }

    /// A client for the cluster (presenting the token, if any).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The API server's request audit log (off until enabled).
    pub fn audit(&self) -> crate::apiserver::audit::AuditLog {
        self.server.audit()
    }

    /// The hollow nodes, in description order.
    pub fn nodes(&self) -> &[HollowNodeHandle] {
        &self.nodes
    }

    /// One hollow node by name.
    pub fn node(&self, name: &str) -> Option<&HollowNodeHandle> {
        self.nodes.iter().find(|n| n.name() == name)
    }

    /// Writes a kubeconfig for this cluster (mode 0600).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        kubeconfig::write(path, &self.server.url(), self.token.as_deref())
    }

    /// Stops the hollow nodes, then the server.
    pub async fn shutdown(self) {
        for node in self.nodes {
            node.shutdown().await;
        }
        self.server.shutdown().await;
    }
}
