//! Shared test setup: a fresh API server on a free port and a kube-rs client for it.

#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tessera_devcluster::apiserver::{ApiServer, ApiServerConfig, ApiServerHandle};
use tessera_devcluster::kubeconfig;

/// A server with default settings, plus a client.
pub async fn start() -> (ApiServerHandle, kube::Client) {
    start_with(ApiServerConfig::default()).await
}

/// A server with `config`, plus a client (no token).
pub async fn start_with(config: ApiServerConfig) -> (ApiServerHandle, kube::Client) {
    let server = ApiServer::start(config).await.expect("server starts");
    let client = client_for(&server, None);
    (server, client)
}

/// A client for `server` presenting `token`.
pub fn client_for(server: &ApiServerHandle, token: Option<&str>) -> kube::Client {
    let config = kubeconfig::client_config(&server.url(), token).expect("client config");
    kube::Client::try_from(config).expect("client")
}

/// A minimal pod.
pub fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .expect("valid pod")
}

/// Generous upper bound for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(10);

/// The HTTP code of a kube API error.
pub fn api_code(err: &kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}
