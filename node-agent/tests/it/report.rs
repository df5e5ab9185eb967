//! The reporting stream against a small in-test coordinator (`tessera.v1` over real
//! TCP): inventory on connect, occupancy and health changes as they happen,
//! heartbeats, and a reconnect after the coordinator drops the stream.

use crate::common;

use std::pin::Pin;
use std::sync::Arc;

use common::{Harness, WAIT};
use futures::Stream;
use parking_lot::Mutex;
use tessera_agent::assignments::NoAssignments;
use tessera_proto::tessera::v1 as pb;
use tessera_proto::tessera::v1::agent_service_server::{AgentService, AgentServiceServer};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

type Outbound = mpsc::Sender<Result<pb::CoordinatorMessage, Status>>;

#[derive(Clone, Default)]
struct Coordinator {
    seen: Arc<Mutex<Vec<pb::agent_message::Body>>>,
    /// Bumped on every received message.
    events: Arc<watch::Sender<u64>>,
    /// The sender of the current stream, dropped to end it.
    current: Arc<Mutex<Option<Outbound>>>,
}

#[tonic::async_trait]
impl AgentService for Coordinator {
    type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::CoordinatorMessage, Status>> + Send>>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        // Only `current` keeps the outbound stream open, so the test can end it.
        *self.current.lock() = Some(tx);
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let Some(body) = m.body else { continue };
                if matches!(body, pb::agent_message::Body::Hello(_)) {
                    let welcome = pb::CoordinatorMessage {
                        body: Some(pb::coordinator_message::Body::Welcome(pb::Welcome {
                            accepted_protocol_version: pb::PROTOCOL_VERSION,
                            heartbeat_interval_ms: 50,
                            coordinator_id: "test".into(),
                        })),
                    };
                    let tx = me.current.lock().clone();
                    if let Some(tx) = tx {
                        let _ = tx.send(Ok(welcome)).await;
                    }
                }
                me.seen.lock().push(body);
                me.events.send_modify(|n| *n += 1);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl Coordinator {
    /// Serves `tessera.v1` on `listener` in the background.
    fn serve(&self, listener: tokio::net::TcpListener) {
        let server = self.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(AgentServiceServer::new(server))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    }

    async fn wait_for(&self, what: &str, f: impl Fn(&[pb::agent_message::Body]) -> bool) {
        let mut rx = self.events.subscribe();
        let ok = tokio::time::timeout(WAIT, async {
            loop {
                if f(&self.seen.lock()) {
                    return;
                }
                let _ = rx.changed().await;
            }
        })
        .await;
        assert!(ok.is_ok(), "coordinator never saw {what}");
    }
}

fn hellos(seen: &[pb::agent_message::Body]) -> Vec<&pb::Hello> {
    seen.iter()
        .filter_map(|b| match b {
            pb::agent_message::Body::Hello(h) => Some(h),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn reports_inventory_occupancy_health_and_reconnects() {
    let coordinator = Coordinator::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    coordinator.serve(listener);

    let mut h = Harness::start("a100-8x-mig.yaml", Arc::new(NoAssignments)).await;
    h.stop_agent().await;
    let mut config = h.config(Arc::new(NoAssignments));
    config.coordinator = Some(format!("http://{addr}"));
    h.agent = Some(tessera_agent::agent::Agent::start(config).await.unwrap());

    coordinator
        .wait_for("a Hello", |s| !hellos(s).is_empty())
        .await;
    {
        let seen = coordinator.seen.lock();
        let hello = hellos(&seen)[0];
        assert_eq!(hello.protocol_version, pb::PROTOCOL_VERSION);
        let inv = hello.inventory.as_ref().unwrap();
        assert_eq!(inv.node_name, "node-a");
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.gpus[7].mig_instances.len(), 4);
        assert_eq!(inv.shares_per_gpu, 10);
        let links = &inv.links.as_ref().unwrap().links;
        assert_eq!(links.len(), 28);
        let pair = links
            .iter()
            .find(|l| l.gpu_a == h.uuid(0) && l.gpu_b == h.uuid(1))
            .unwrap();
        assert_eq!(pair.nvlink_count, 12);
    }

    // An allocation shows up as occupancy.
    let plugin = h.gpu_plugin().await;
    let g2 = h.uuid(2);
    plugin.allocate_one(&[&format!("{g2}-0")]).await.unwrap();
    coordinator
        .wait_for("occupancy with the new share", |s| {
            s.iter().any(|b| match b {
                pb::agent_message::Body::Occupancy(o) => o.gpus.iter().any(|g| {
                    g.gpu_uuid == g2 && g.shares.len() == 1 && g.shares[0].memory_limit_mib == 40960
                }),
                _ => false,
            })
        })
        .await;

    // A fatal XID is reported as a health change.
    h.sim.inject_xid(&h.uuid(5), 79).unwrap();
    let g5 = h.uuid(5);
    coordinator
        .wait_for("a health change", |s| {
            s.iter().any(|b| {
                matches!(b, pb::agent_message::Body::HealthChange(c)
                    if c.gpu_uuid == g5 && c.xid == 79 && c.health == pb::Health::Unhealthy as i32)
            })
        })
        .await;
    coordinator
        .wait_for("heartbeats", |s| {
            s.iter()
                .filter(|b| matches!(b, pb::agent_message::Body::Heartbeat(_)))
                .count()
                >= 2
        })
        .await;

    // The coordinator ends the stream: the agent reconnects and says Hello again.
    coordinator.current.lock().take();
    coordinator
        .wait_for("a second Hello", |s| hellos(s).len() >= 2)
        .await;
}

/// Lines of `captured` that `f` accepts.
fn count(captured: &tessera_logs::Captured, f: impl Fn(&str) -> bool) -> usize {
    captured.text().lines().filter(|l| f(l)).count()
}

/// An agent started before its coordinator (the normal order of a rollout) says once at WARN
/// what it waits for, retries quietly (debug) with backoff, and connects when the coordinator
/// appears. The current-thread runtime keeps every task of the agent under this test's logs.
#[tokio::test]
async fn an_agent_started_before_its_coordinator_warns_once_and_connects_when_it_appears() {
    let lines = tessera_logs::Captured::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_env_filter("tessera_agent=debug")
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // A port nothing listens on yet.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let mut h = Harness::start("l40s-4x-pcie.yaml", Arc::new(NoAssignments)).await;
    h.stop_agent().await;
    let mut config = h.config(Arc::new(NoAssignments));
    config.coordinator = Some(format!("http://{addr}"));
    h.agent = Some(tessera_agent::agent::Agent::start(config).await.unwrap());

    let retries = |l: &str| l.contains("DEBUG") && l.contains("coordinator not reached again");
    let waited = tokio::time::timeout(WAIT, async {
        while count(&lines, retries) < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "three quiet retries:\n{}", lines.text());

    // The coordinator appears on that address.
    let coordinator = Coordinator::default();
    coordinator.serve(tokio::net::TcpListener::bind(addr).await.unwrap());
    coordinator
        .wait_for("a Hello", |s| !hellos(s).is_empty())
        .await;
    let text = lines.text();
    let warns: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("tessera_agent::report"))
        .collect();
    assert_eq!(warns.len(), 1, "{text}");
    assert!(
        warns[0].contains("waiting for the coordinator") && warns[0].contains(&addr.to_string()),
        "{text}"
    );
}
