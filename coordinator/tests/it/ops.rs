//! The operations HTTP server over real TCP: `/healthz`, `/readyz` following the ready
//! signal, `/metrics` in the Prometheus text format, and a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tessera_coordinator::ops::{self, Metrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(20);

/// One HTTP/1.1 GET; returns (status code, headers and body as text).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .expect("no HTTP response")
        .unwrap();
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    (code, response)
}

#[tokio::test]
async fn health_readiness_and_metrics_over_http() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (ready, ready_rx) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let server = tokio::spawn(ops::serve(
        listener,
        Arc::clone(&metrics),
        ready_rx,
        stop_rx,
    ));

    let (code, _) = get(addr, "/healthz").await;
    assert_eq!(code, 200);
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503);
    assert!(body.contains("not synced"), "{body}");
    ready.send(true).unwrap();
    assert_eq!(get(addr, "/readyz").await.0, 200);

    metrics.add_pods_placed(2);
    metrics.set_leader(true);
    metrics.observe_cycle(Duration::from_millis(5));
    metrics.add_evictions("reclaim", 1);
    metrics.set_pending([("insufficient-gpu", 3)]);
    metrics.set_queues([ops::QueueSample {
        queue: "team-a".into(),
        resource: "gpu".into(),
        fair_share: 2.0,
        allocated: 1.0,
    }]);
    let (code, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        body.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{body}"
    );
    for needle in [
        "tessera_pods_placed_total 2",
        "tessera_is_leader 1",
        "tessera_cycle_duration_seconds_count 1",
        "tessera_evictions_total{reason=\"reclaim\"} 1",
        "tessera_pods_pending{reason=\"insufficient-gpu\"} 3",
        "tessera_queue_fair_share{queue=\"team-a\",resource=\"gpu\"}",
        "tessera_queue_allocated{queue=\"team-a\",resource=\"gpu\"}",
        "tessera_bind_errors_total 0",
        "tessera_agents_connected 0",
    ] {
        assert!(body.contains(needle), "missing {needle:?} in:\n{body}");
    }
    assert_eq!(get(addr, "/nothing-here").await.0, 404);

    stop.send(true).unwrap();
    tokio::time::timeout(WAIT, server)
        .await
        .expect("the server did not stop")
        .unwrap()
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
