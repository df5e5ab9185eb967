//! The operations HTTP server: `/metrics` (OpenMetrics text), `/healthz` (the process
//! answers) and `/readyz` (the caches have synced).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use super::Metrics;

/// Content type of the exposition `prometheus-client` writes (OpenMetrics text, which
/// Prometheus scrapes natively).
const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
}

/// The routes, for embedding or testing without a listener.
pub fn router(metrics: Arc<Metrics>, ready: watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, ready })
}

/// Serves the routes on `listener` until `shutdown` turns true, then finishes the
/// requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics and health server listening");
    }
    let mut stop = shutdown;
    axum::serve(listener, router(metrics, ready))
        .with_graceful_shutdown(async move {
            // A dropped sender is not a request to stop.
            if stop.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
        .await
}

async fn metrics_page(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_TEXT)],
        state.metrics.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if *state.ready.borrow() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the Kubernetes caches have not synced yet\n",
        )
    }
}
