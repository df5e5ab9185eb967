//! The webhook's HTTPS server: `POST /mutate-pods` (an `admission.k8s.io/v1` AdmissionReview
//! in, the same kind out) and `GET /healthz`.
//!
//! The API server only calls webhooks over TLS. The certificate and key are PEM files (the
//! chart mounts a Secret it generated, or one cert-manager keeps); they are read again every
//! [`WebhookConfig::reload_every`] ([`RELOAD_EVERY`] by default) and the server switches to them when their content changed, so a rotated
//! Secret takes effect without a restart. A change that does not parse is logged and the old
//! certificate kept.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::route::{self, Routing};

pub use crate::tls::RELOAD_EVERY;
use crate::tls::{CertFiles, ReloadingCert};
/// Largest AdmissionReview accepted: a pod object is at most 1.5 MiB in etcd, and the review
/// carries it once (twice on UPDATE, which is not registered).
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Where and how the webhook serves.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// The scheduler name routed pods get.
    pub scheduler_name: String,
    /// How often the certificate files are read for a rotation ([`RELOAD_EVERY`] in
    /// `tessera-coordinator run`).
    pub reload_every: Duration,
}

/// Why the webhook could not start.
#[derive(Debug, Error)]
pub enum WebhookError {
    /// The certificate or key did not load.
    #[error(
        "--webhook-cert-file {cert} / --webhook-key-file {key}: {source} (expected a PEM certificate chain and its PEM private key)"
    )]
    Certificate {
        /// The `--webhook-cert-file` path, as given on the command line.
        cert: String,
        /// The `--webhook-key-file` path, as given on the command line.
        key: String,
        /// Why reading or parsing the PEM files failed; it does not say which of the two is at
        /// fault.
        source: std::io::Error,
    },
    /// The listen address could not be bound.
    #[error("--webhook-listen {addr}: {source}")]
    Bind {
        /// The `--webhook-listen` address that could not be bound.
        addr: SocketAddr,
        /// Why binding failed, typically the port being in use or below 1024 without privilege.
        source: std::io::Error,
    },
}

/// A running webhook server.
pub struct WebhookHandle {
    addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl WebhookHandle {
    /// Starts serving; returns once the socket is bound and the certificate loaded.
    pub async fn start(config: WebhookConfig) -> Result<WebhookHandle, WebhookError> {
        let files = CertFiles {
            cert_file: config.cert_file.clone(),
            key_file: config.key_file.clone(),
        };
        let (cert, reloading) = ReloadingCert::load(&files, "webhook", config.reload_every)
            .await
            .map_err(|source| certificate_error(&config, source))?;
        let tls = cert.rustls();
        let listener =
            std::net::TcpListener::bind(config.listen).map_err(|source| WebhookError::Bind {
                addr: config.listen,
                source,
            })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| WebhookError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| WebhookError::Bind {
            addr: config.listen,
            source,
        })?;
        let server =
            axum_server::tls_rustls::from_tcp_rustls(listener, tls.clone()).map_err(|source| {
                WebhookError::Bind {
                    addr: config.listen,
                    source,
                }
            })?;
        let handle = axum_server::Handle::new();
        let app = router(config.scheduler_name.clone());
        let serving = {
            let server = server.handle(handle.clone());
            tokio::spawn(async move {
                if let Err(error) = server.serve(app.into_make_service()).await {
                    tracing::error!(%error, "admission webhook server stopped");
                }
            })
        };
        tracing::info!(%addr, "admission webhook listening (POST /mutate-pods)");
        Ok(WebhookHandle {
            addr,
            handle,
            tasks: vec![serving, reloading],
        })
    }

    /// The bound address (the port chosen when the config said 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Runs until `shutdown` turns true (or its sender is dropped), then stops serving after
    /// the requests in flight, at most 5 s.
    pub async fn run_until(self, mut shutdown: watch::Receiver<bool>) {
        let _ = shutdown.wait_for(|s| *s).await;
        self.stop().await;
    }

    /// Stops serving after the requests in flight, at most 5 s.
    pub async fn stop(self) {
        self.handle.graceful_shutdown(Some(Duration::from_secs(5)));
        let mut tasks = self.tasks.into_iter();
        if let Some(serving) = tasks.next() {
            let _ = serving.await;
        }
        for t in tasks {
            t.abort();
        }
    }
}

fn certificate_error(config: &WebhookConfig, source: std::io::Error) -> WebhookError {
    WebhookError::Certificate {
        cert: config.cert_file.display().to_string(),
        key: config.key_file.display().to_string(),
        source,
    }
}

/// The routes, for serving or for tests without TLS.
pub fn router(scheduler_name: String) -> Router {
    Router::new()
        .route("/mutate-pods", post(mutate_pods))
        .route("/healthz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(scheduler_name)
}

/// Answers one AdmissionReview. Every pod is allowed: the webhook routes, it never refuses.
async fn mutate_pods(
    State(scheduler_name): State<String>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(error) => {
            tracing::warn!(%error, "an AdmissionReview without a request");
            return Json(AdmissionResponse::invalid(error.to_string()).into_review());
        }
    };
    let response = AdmissionResponse::from(&request);
    let Some(pod) = request.object.as_ref() else {
        return Json(response.into_review());
    };
    match route::routing(pod, &scheduler_name) {
        Routing::Keep => Json(response.into_review()),
        Routing::ToTessera { why } => {
            let name = pod
                .metadata
                .name
                .as_deref()
                .or(pod.metadata.generate_name.as_deref())
                .unwrap_or("");
            tracing::debug!(namespace = %request.namespace.as_deref().unwrap_or(""), pod = %name, %why, "routing a pod to this scheduler");
            match response.clone().with_patch(route::patch(&scheduler_name)) {
                Ok(mut patched) => {
                    patched.warnings = Some(vec![why]);
                    Json(patched.into_review())
                }
                Err(error) => {
                    // Serialising a one-operation patch cannot fail in practice; if it did,
                    // the pod is admitted unrouted rather than refused.
                    tracing::error!(%error, "could not serialise the routing patch");
                    Json(response.into_review())
                }
            }
        }
    }
}
