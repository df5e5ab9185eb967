//! The webhook's HTTPS server over a real TLS connection: it serves the certificate from its
//! files, switches to a rotated one without a restart, keeps the old one when the new files do
//! not load; and its AdmissionReview endpoint answers a malformed review without refusing to
//! serve.

use crate::tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_coordinator::webhook::{WebhookConfig, WebhookHandle, server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tower::ServiceExt;

/// `GET /healthz` over TLS, trusting only `ca_pem`: the body, or why the handshake failed.
async fn healthz(addr: SocketAddr, ca_pem: &str) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    let der = rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes())
        .map_err(|e| e.to_string())?;
    roots.add(der).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    tls.read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    Ok(response)
}

async fn eventually_ok(addr: SocketAddr, ca: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match healthz(addr, ca).await {
            Ok(body) if body.ends_with("ok") => return,
            other => assert!(
                Instant::now() < deadline,
                "{what}: still {other:?} after 20 s"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = tls::write_pair(dir.path());
    let webhook = WebhookHandle::start(WebhookConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_file: dir.path().join("tls.crt"),
        key_file: dir.path().join("tls.key"),
        scheduler_name: "tessera".into(),
        reload_every: Duration::from_millis(100),
    })
    .await
    .unwrap();
    let addr = webhook.addr();
    let body = healthz(addr, &first).await.expect("the first certificate");
    assert!(
        body.starts_with("HTTP/1.0 200") && body.ends_with("ok"),
        "{body}"
    );

    // Rotation: a new CA and certificate in the same files.
    let second = tls::write_pair(dir.path());
    assert!(healthz(addr, &second).await.is_err() || second == first);
    eventually_ok(addr, &second, "the rotated certificate").await;
    assert!(
        healthz(addr, &first).await.is_err(),
        "the old CA is no longer served"
    );

    // A broken rotation keeps the working certificate.
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    eventually_ok(addr, &second, "the certificate kept after a bad rotation").await;
    webhook.stop().await;
}

#[tokio::test]
async fn missing_certificate_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let error = WebhookHandle::start(WebhookConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_file: dir.path().join("absent.crt"),
        key_file: dir.path().join("absent.key"),
        scheduler_name: "tessera".into(),
        reload_every: server::RELOAD_EVERY,
    })
    .await
    .err()
    .expect("no certificate, no server");
    let text = error.to_string();
    assert!(
        text.contains("--webhook-cert-file") && text.contains("absent.crt") && text.contains("PEM"),
        "{text}"
    );
}

#[tokio::test]
async fn a_review_without_a_request_is_answered_not_dropped() {
    let app = server::router("tessera".into());
    let request = |body: &'static str| {
        http::Request::post("/mutate-pods")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap()
    };
    let review = r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#;
    let response = app.clone().oneshot(request(review)).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    // Not JSON at all: axum's own 4xx, the server keeps serving.
    let response = app.oneshot(request("{")).await.unwrap();
    assert!(response.status().is_client_error());
}
