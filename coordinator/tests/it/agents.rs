//! The agent service over real gRPC on loopback TCP: a scripted agent says Hello, reports
//! occupancy and health, and the registry follows; protocol negotiation; TokenReview
//! authentication against a real kube-apiserver (hack/k8s) with tokens its issuer minted.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use prost::Message;
use tessera_coordinator::agents::{
    self, AgentRegistry, Authenticator, ServiceOptions, StreamLimits,
};
use tessera_proto::tessera::v1 as pb;
use tessera_proto::tessera::v1::agent_service_client::AgentServiceClient;
use tessera_testcluster::{Cluster, ClusterOptions, pod_bound_token};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// Deadline for "eventually" conditions.
const WAIT: Duration = Duration::from_secs(20);
/// Coordinator heartbeat in most tests: slow enough that a loaded machine never misses
/// three of the fake agent's beats.
const SLOW_BEAT: Duration = Duration::from_secs(1);

/// The agent service on loopback TCP, with its registry (shared with the other `agents*`
/// modules).
pub(crate) struct Service {
    pub(crate) addr: SocketAddr,
    pub(crate) registry: AgentRegistry,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), agents::AgentsError>>,
}

impl Service {
    /// The service with heartbeats every `heartbeat` (an agent silent for three is dropped).
    pub(crate) async fn start(auth: Authenticator, heartbeat: Duration) -> Service {
        Service::start_with(auth, heartbeat, None, StreamLimits::default()).await
    }

    /// Like [`Service::start`], accepting streams only while `leadership` reads true, within
    /// `limits`.
    async fn start_with(
        auth: Authenticator,
        heartbeat: Duration,
        leadership: Option<watch::Receiver<bool>>,
        limits: StreamLimits,
    ) -> Service {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let registry = AgentRegistry::new();
        let (stop, stop_rx) = watch::channel(false);
        let options = ServiceOptions {
            coordinator_id: "coordinator-test".into(),
            heartbeat_interval: heartbeat,
            leadership,
            limits,
            ..ServiceOptions::default()
        };
        let task = tokio::spawn(agents::serve_with(
            listener,
            registry.clone(),
            auth,
            options,
            stop_rx,
        ));
        Service {
            addr,
            registry,
            stop,
            task,
        }
    }

    pub(crate) async fn shutdown(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the agent service did not stop")
            .unwrap()
            .unwrap();
    }

    /// Waits until `f` holds for the registry.
    pub(crate) async fn wait_for(&self, what: &str, f: impl Fn(&AgentRegistry) -> bool) {
        let mut changes = self.registry.changes();
        let ok = tokio::time::timeout(WAIT, async {
            while !f(&self.registry) {
                let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
            }
        })
        .await;
        assert!(ok.is_ok(), "registry never showed {what}");
    }
}

/// A scripted agent: the sending half and the coordinator's replies.
pub(crate) struct FakeAgent {
    tx: mpsc::Sender<pb::AgentMessage>,
    inbound: Streaming<pb::CoordinatorMessage>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        // The beating task holds a sender; stop it so the stream really ends.
        if let Some(task) = self.heartbeat.take() {
            task.abort();
        }
    }
}

impl FakeAgent {
    /// Opens a stream on a connection of its own with `hello` already queued, as the real
    /// agent does.
    pub(crate) async fn connect(
        addr: SocketAddr,
        token: Option<&str>,
        hello: pb::Hello,
    ) -> Result<FakeAgent, Status> {
        FakeAgent::connect_on(channel(addr).await, token, hello).await
    }

    /// Like [`FakeAgent::connect`], on `channel` (one HTTP/2 connection, shared by its clones).
    pub(crate) async fn connect_on(
        channel: Channel,
        token: Option<&str>,
        hello: pb::Hello,
    ) -> Result<FakeAgent, Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(msg(pb::agent_message::Body::Hello(hello)))
            .await
            .unwrap();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let inbound = AgentServiceClient::new(channel)
            .connect(request)
            .await?
            .into_inner();
        Ok(FakeAgent {
            tx,
            inbound,
            heartbeat: None,
        })
    }

    /// Sends a heartbeat every 100 ms from now on, as a live agent does.
    pub(crate) fn beat(mut self) -> Self {
        let tx = self.tx.clone();
        self.heartbeat = Some(tokio::spawn(async move {
            for sequence in 1.. {
                let beat = pb::Heartbeat {
                    sequence,
                    sent_unix_ms: 0,
                };
                if tx
                    .send(msg(pb::agent_message::Body::Heartbeat(beat)))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
        self
    }

    async fn send(&self, body: pb::agent_message::Body) {
        self.tx.send(msg(body)).await.unwrap();
    }

    /// The next message that is not a heartbeat, or the status that ended the stream.
    pub(crate) async fn next(&mut self) -> Result<Option<pb::coordinator_message::Body>, Status> {
        loop {
            let m = tokio::time::timeout(WAIT, self.inbound.message())
                .await
                .expect("no message from the coordinator")?;
            match m.and_then(|m| m.body) {
                Some(pb::coordinator_message::Body::Heartbeat(_)) => continue,
                other => return Ok(other),
            }
        }
    }

    pub(crate) async fn expect_welcome(&mut self) -> pb::Welcome {
        match self.next().await {
            Ok(Some(pb::coordinator_message::Body::Welcome(w))) => w,
            other => panic!("expected Welcome, got {other:?}"),
        }
    }
}

/// One connection to the agent service at `addr`.
pub(crate) async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn msg(body: pb::agent_message::Body) -> pb::AgentMessage {
    pb::AgentMessage { body: Some(body) }
}

fn uuid(i: u32) -> String {
    format!("GPU-{i:04}")
}

/// Four GPUs: 0-1 joined by NVLink, 2-3 by NVSwitch, the pairs only over PCIe.
pub(crate) fn hello(node: &str, protocol_version: u32) -> pb::Hello {
    let gpus = (0..4)
        .map(|i| pb::Gpu {
            uuid: uuid(i),
            index: i,
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81559,
            numa_node: 0,
            ..Default::default()
        })
        .collect();
    let mut links = Vec::new();
    for a in 0..4u32 {
        for b in a + 1..4 {
            links.push(pb::GpuLink {
                gpu_a: uuid(a),
                gpu_b: uuid(b),
                nvlink_count: if (a, b) == (0, 1) { 18 } else { 0 },
                nvswitch: (a, b) == (2, 3),
                pcie: pb::PcieRelation::CrossSocket as i32,
            });
        }
    }
    pb::Hello {
        protocol_version,
        inventory: Some(pb::NodeInventory {
            node_name: node.into(),
            agent_version: "0.1.0".into(),
            gpus,
            links: Some(pb::LinkMatrix { links }),
            shares_per_gpu: 10,
        }),
    }
}

fn occupancy(unhealthy: &[u32]) -> pb::agent_message::Body {
    pb::agent_message::Body::Occupancy(pb::Occupancy {
        gpus: (0..4)
            .map(|i| pb::GpuOccupancy {
                gpu_uuid: uuid(i),
                health: if unhealthy.contains(&i) {
                    pb::Health::Unhealthy
                } else {
                    pb::Health::Healthy
                } as i32,
                health_reason: if unhealthy.contains(&i) {
                    "XID 79".into()
                } else {
                    String::new()
                },
                shares: if i == 0 {
                    vec![pb::Share {
                        pod_uid: "uid-1".into(),
                        pod_namespace: "team-a".into(),
                        pod_name: "trainer-0".into(),
                        container: "main".into(),
                        memory_limit_mib: 40000,
                        compute_percent: 50,
                        ..Default::default()
                    }]
                } else {
                    Vec::new()
                },
                used_memory_mib: 1000 * u64::from(i),
                utilization_percent: 10,
            })
            .collect(),
        observed_unix_ms: 1,
        allocated_pod_uids: vec!["uid-1".into()],
    })
}

#[tokio::test]
async fn inventory_occupancy_and_health_reach_the_registry() {
    let service = Service::start(Authenticator::Disabled, SLOW_BEAT).await;
    let mut agent = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    let welcome = agent.expect_welcome().await;
    assert_eq!(welcome.accepted_protocol_version, pb::PROTOCOL_VERSION);
    assert_eq!(welcome.heartbeat_interval_ms, 1000);
    assert_eq!(welcome.coordinator_id, "coordinator-test");

    let node = service.registry.get("node-a").expect("node-a registered");
    assert!(node.connected);
    assert_eq!(node.shares_per_gpu, 10);
    let islands: Vec<_> = node.gpus.iter().map(|g| g.nvlink_island).collect();
    assert_eq!(islands, vec![Some(0), Some(0), Some(1), Some(1)]);
    assert!(node.gpus.iter().all(|g| g.healthy));

    agent.send(occupancy(&[2])).await;
    service
        .wait_for("GPU 2 unhealthy after the occupancy snapshot", |r| {
            r.get("node-a").is_some_and(|n| !n.gpus[2].healthy)
        })
        .await;
    let node = service.registry.get("node-a").unwrap();
    assert_eq!(node.health_reasons[&uuid(2)], "XID 79");
    let share = &node.occupancy[&uuid(0)].shares[0];
    assert_eq!(
        (
            share.pod_name.as_str(),
            share.memory_limit_mib,
            share.compute_percent
        ),
        ("trainer-0", 40000, 50)
    );
    assert_eq!(node.occupancy[&uuid(3)].used_memory_mib, 3000);

    agent
        .send(pb::agent_message::Body::HealthChange(pb::HealthChange {
            gpu_uuid: uuid(2),
            health: pb::Health::Healthy as i32,
            ..Default::default()
        }))
        .await;
    agent
        .send(pb::agent_message::Body::HealthChange(pb::HealthChange {
            gpu_uuid: uuid(3),
            health: pb::Health::Unhealthy as i32,
            xid: 48,
            ..Default::default()
        }))
        .await;
    service
        .wait_for("GPU 2 healthy and GPU 3 unhealthy", |r| {
            r.get("node-a")
                .is_some_and(|n| n.gpus[2].healthy && !n.gpus[3].healthy)
        })
        .await;
    assert_eq!(
        service.registry.get("node-a").unwrap().health_reasons[&uuid(3)],
        "XID 48"
    );

    // The coordinator heartbeats on its own.
    let beat = tokio::time::timeout(WAIT, agent.inbound.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(
        beat.body,
        Some(pb::coordinator_message::Body::Heartbeat(pb::Heartbeat {
            sequence: 1..,
            ..
        }))
    ));

    // A GPU the inventory does not list: the coordinator asks for everything again.
    agent
        .send(pb::agent_message::Body::HealthChange(pb::HealthChange {
            gpu_uuid: "GPU-unknown".into(),
            health: pb::Health::Unhealthy as i32,
            ..Default::default()
        }))
        .await;
    match agent.next().await {
        Ok(Some(pb::coordinator_message::Body::Resync(r))) => {
            assert!(r.reason.contains("GPU-unknown"), "{}", r.reason)
        }
        other => panic!("expected Resync, got {other:?}"),
    }

    // A new inventory (a GPU lost) replaces the old one and recomputes islands.
    let mut inv = hello("node-a", 1).inventory.unwrap();
    inv.gpus.retain(|g| g.index != 1);
    inv.links
        .as_mut()
        .unwrap()
        .links
        .retain(|l| l.gpu_a != uuid(1) && l.gpu_b != uuid(1));
    agent.send(pb::agent_message::Body::Inventory(inv)).await;
    service
        .wait_for("three GPUs after the new inventory", |r| {
            r.get("node-a").is_some_and(|n| n.gpus.len() == 3)
        })
        .await;
    let node = service.registry.get("node-a").unwrap();
    let islands: Vec<_> = node.gpus.iter().map(|g| g.nvlink_island).collect();
    assert_eq!(islands, vec![None, Some(0), Some(0)]);

    // The runtime can ask for a resync, e.g. after winning leadership.
    assert!(service.registry.request_resync("node-a", "new leader"));
    match agent.next().await {
        Ok(Some(pb::coordinator_message::Body::Resync(r))) => assert_eq!(r.reason, "new leader"),
        other => panic!("expected Resync, got {other:?}"),
    }

    drop(agent);
    service
        .wait_for("node-a disconnected after its stream ended", |r| {
            r.get("node-a").is_some_and(|n| !n.connected)
        })
        .await;
    service.shutdown().await;
}

#[tokio::test]
async fn protocol_outside_the_window_gets_a_reject() {
    let service = Service::start(Authenticator::Disabled, SLOW_BEAT).await;
    let mut agent = FakeAgent::connect(
        service.addr,
        None,
        hello("node-a", pb::PROTOCOL_VERSION + 1),
    )
    .await
    .unwrap();
    match agent.next().await {
        Ok(Some(pb::coordinator_message::Body::Reject(r))) => {
            assert_eq!(r.max_protocol_version, pb::PROTOCOL_VERSION);
            assert_eq!(r.min_protocol_version, pb::MIN_ACCEPTED_PROTOCOL_VERSION);
            assert!(r.reason.contains("upgrade the coordinator"), "{}", r.reason);
        }
        other => panic!("expected Reject, got {other:?}"),
    }
    // The stream ends after the Reject, and the node never registers.
    assert!(matches!(agent.next().await, Ok(None)));
    assert!(service.registry.get("node-a").is_none());
    service.shutdown().await;
}

#[tokio::test]
async fn first_message_must_be_hello_and_inventory_must_be_consistent() {
    let service = Service::start(Authenticator::Disabled, SLOW_BEAT).await;
    let mut bad = hello("node-a", pb::PROTOCOL_VERSION);
    let inv = bad.inventory.as_mut().unwrap();
    inv.links.as_mut().unwrap().links[0].gpu_b = "GPU-elsewhere".into();
    let mut agent = FakeAgent::connect(service.addr, None, bad).await.unwrap();
    let status = agent.next().await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("inventory.links.links[0]"),
        "{}",
        status.message()
    );
    service.shutdown().await;
}

#[tokio::test]
async fn only_the_leader_keeps_agent_streams() {
    let (leading, leadership) = watch::channel(false);
    let service = Service::start_with(
        Authenticator::Disabled,
        SLOW_BEAT,
        Some(leadership),
        StreamLimits::default(),
    )
    .await;
    let refused = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .err()
        .expect("a standby must refuse the stream");
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(refused.message().contains("standby"), "{refused}");

    leading.send_replace(true);
    let mut agent = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    agent.expect_welcome().await;
    service
        .wait_for("node-a connected", |r| {
            r.get("node-a").is_some_and(|n| n.connected)
        })
        .await;

    // Losing leadership closes the stream so the agent goes looking for the new leader.
    leading.send_replace(false);
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match agent.next().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream stayed open after leadership was lost");
    let status = end.expect_err("the stream must end with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    service
        .wait_for("node-a disconnected", |r| {
            r.get("node-a").is_some_and(|n| !n.connected)
        })
        .await;
    drop(agent);
    service.shutdown().await;
}

/// The status a stream ends with, skipping the messages before it.
pub(crate) async fn end_status(agent: &mut FakeAgent) -> Status {
    loop {
        match agent.next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended with OK and no message"),
            Err(status) => return status,
        }
    }
}

/// A report over a cap, and a message over the size limit, end the stream with a status
/// that names the cause, never with OK. Fails on the code before #33: there were no caps,
/// and an oversized message ended the stream with status OK.
#[tokio::test]
async fn a_report_over_a_limit_ends_its_stream_naming_the_cause() {
    let limits = StreamLimits {
        max_message_bytes: 64 * 1024,
        ..StreamLimits::default()
    };
    let service = Service::start_with(Authenticator::Disabled, SLOW_BEAT, None, limits).await;
    // `n` shares on GPU 0, each naming a pod of `name` bytes.
    let shares = |n: usize, name: usize| {
        let pb::agent_message::Body::Occupancy(mut o) = occupancy(&[]) else {
            unreachable!("occupancy() builds an occupancy")
        };
        let mut share = o.gpus[0].shares[0].clone();
        share.pod_name = "p".repeat(name);
        o.gpus[0].shares = vec![share; n];
        pb::agent_message::Body::Occupancy(o)
    };

    let mut agent = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    agent.expect_welcome().await;
    agent.send(shares(1025, 1)).await;
    let status = end_status(&mut agent).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("occupancy.gpus[0].shares")
            && status.message().contains("at most 1024 shares per GPU"),
        "{}",
        status.message()
    );

    let mut agent = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    agent.expect_welcome().await;
    // Within the caps, over 64 KiB.
    let over = shares(1000, 100);
    assert!(msg(over.clone()).encoded_len() > 64 * 1024);
    agent.send(over).await;
    let status = end_status(&mut agent).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("65536 bytes (--agent-max-message-bytes)"),
        "{}",
        status.message()
    );
    service.shutdown().await;
}

/// One live stream per node: a newer stream of the node ends the older one, so a token
/// cannot hold many streams of one node open. Fails on the code before #33: the older
/// stream stayed open, fed by nothing.
#[tokio::test]
async fn a_newer_stream_of_a_node_ends_the_older_one() {
    let service = Service::start(Authenticator::Disabled, SLOW_BEAT).await;
    let mut old = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    old.expect_welcome().await;
    let mut new = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    new.expect_welcome().await;
    let status = end_status(&mut old).await;
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("newer stream"), "{status:?}");
    assert!(service.registry.get("node-a").unwrap().connected);
    assert!(service.registry.request_resync("node-a", "still here"));
    assert!(matches!(
        new.next().await,
        Ok(Some(pb::coordinator_message::Body::Resync(_)))
    ));
    service.shutdown().await;
}

#[tokio::test]
async fn a_silent_agent_is_disconnected() {
    let service = Service::start(Authenticator::Disabled, Duration::from_millis(100)).await;
    let mut agent = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap();
    agent.expect_welcome().await;
    // The agent keeps the stream open but never sends a heartbeat.
    service
        .wait_for("the silent node-a disconnected", |r| {
            r.get("node-a").is_some_and(|n| !n.connected)
        })
        .await;
    assert_eq!(service.registry.connected_count(), 0);
    drop(agent);
    service.shutdown().await;
}

// ------------------------------------------------------------------ TokenReview

/// A real API server with node-a, and tokens as the real token issuer mints them: the
/// agent's ServiceAccount bound to an agent pod on node-a (so TokenReview says node-a), the
/// same account unbound, and another account's pod-bound token.
struct Tokens {
    node_a: String,
    unbound: String,
    someone: String,
}

async fn api_server() -> (Cluster, kube::Client, Tokens) {
    let server = Cluster::start(ClusterOptions::default());
    let client = server.admin().await;
    // The agent ServiceAccount and a builder account, created by the credentials helper.
    let unbound = server.token("tessera-system", "tessera-agent", &[]);
    let _ = server.token("default", "builder", &[]);
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    for (ns, sa, pod) in [
        ("tessera-system", "tessera-agent", "agent-a"),
        ("default", "builder", "builder-a"),
    ] {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns},
            "spec": {"nodeName": "node-a", "serviceAccountName": sa,
                     "containers": [{"name": "main", "image": "agent"}]},
        }))
        .unwrap();
        Api::<Pod>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &p)
            .await
            .unwrap();
    }
    let tokens = Tokens {
        node_a: pod_bound_token(&client, "tessera-system", "tessera-agent", "agent-a", &[]).await,
        unbound,
        someone: pod_bound_token(&client, "default", "builder", "builder-a", &[]).await,
    };
    (server, client, tokens)
}

#[tokio::test]
async fn tokenreview_admits_an_agent_only_for_its_own_node() {
    let (api, client, tokens) = api_server().await;
    let service = Service::start(Authenticator::token_review(client, Vec::new()), SLOW_BEAT).await;
    let hello_a = || hello("node-a", pb::PROTOCOL_VERSION);

    // The node's own token: welcomed, twice (the second from the cache).
    for _ in 0..2 {
        let mut agent = FakeAgent::connect(service.addr, Some(tokens.node_a.as_str()), hello_a())
            .await
            .unwrap();
        agent.expect_welcome().await;
    }
    assert!(service.registry.get("node-a").is_some());

    // Unknown token, no token: unauthenticated.
    let status = FakeAgent::connect(service.addr, Some("made-up"), hello_a())
        .await
        .err()
        .expect("an unknown token must be refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("TokenReview"),
        "{}",
        status.message()
    );
    let status = FakeAgent::connect(service.addr, None, hello_a())
        .await
        .err()
        .expect("a stream without a token must be refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("Bearer"), "{}", status.message());

    // A valid token of a user that is not the agent: denied.
    let status = FakeAgent::connect(service.addr, Some(tokens.someone.as_str()), hello_a())
        .await
        .err()
        .expect("another user's token must be refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("builder"), "{}", status.message());

    // node-a's token reporting as node-b: denied once Hello names node-b.
    let mut agent = FakeAgent::connect(
        service.addr,
        Some(tokens.node_a.as_str()),
        hello("node-b", pb::PROTOCOL_VERSION),
    )
    .await
    .unwrap();
    let status = agent.next().await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("\"node-a\"") && status.message().contains("\"node-b\""),
        "{}",
        status.message()
    );
    assert!(service.registry.get("node-b").is_none());

    // A token without a node binding cannot prove which node it reports for.
    let mut agent =
        FakeAgent::connect(service.addr, Some(tokens.unbound.as_str()), hello_a()).await;
    let status = match &mut agent {
        Err(status) => status.clone(),
        Ok(agent) => agent.next().await.unwrap_err(),
    };
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("node-name"),
        "{}",
        status.message()
    );

    service.shutdown().await;
    drop(api);
}

fn node_pods(names: &[&str]) -> pb::NodePods {
    pb::NodePods {
        pods: names
            .iter()
            .map(|n| pb::BoundPod {
                uid: format!("uid-{n}"),
                namespace: "team-a".into(),
                name: (*n).into(),
                ..Default::default()
            })
            .collect(),
    }
}

async fn expect_node_pods(agent: &mut FakeAgent) -> pb::NodePods {
    match agent.next().await.unwrap() {
        Some(pb::coordinator_message::Body::NodePods(p)) => p,
        other => panic!("expected NodePods, got {other:?}"),
    }
}

#[tokio::test]
async fn revision_two_agents_get_their_nodes_pods_and_report_allocations() {
    let service = Service::start(Authenticator::Disabled, SLOW_BEAT).await;
    // Published before the agent connects: it gets them right after Welcome.
    service
        .registry
        .publish_node_pods(std::collections::BTreeMap::from([
            ("node-a".to_owned(), node_pods(&["p1"])),
            ("node-b".to_owned(), node_pods(&["other"])),
        ]));
    let mut agent = FakeAgent::connect(service.addr, None, hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    agent.expect_welcome().await;
    assert_eq!(expect_node_pods(&mut agent).await, node_pods(&["p1"]));
    // Every change is a full snapshot, and only this node's.
    service
        .registry
        .publish_node_pods(std::collections::BTreeMap::from([
            ("node-a".to_owned(), node_pods(&["p1", "p2"])),
            ("node-b".to_owned(), node_pods(&[])),
        ]));
    assert_eq!(expect_node_pods(&mut agent).await, node_pods(&["p1", "p2"]));
    service
        .registry
        .publish_node_pods(std::collections::BTreeMap::new());
    assert_eq!(expect_node_pods(&mut agent).await, node_pods(&[]));
    // Allocations travel back in the occupancy snapshot.
    agent.send(occupancy(&[])).await;
    service
        .wait_for("uid-1 reported allocated", |r| {
            r.get("node-a")
                .is_some_and(|n| n.allocated_pods.contains("uid-1"))
        })
        .await;
}

#[tokio::test]
async fn revision_one_agents_get_no_pods() {
    let service = Service::start(Authenticator::Disabled, SLOW_BEAT).await;
    service
        .registry
        .publish_node_pods(std::collections::BTreeMap::from([(
            "node-a".to_owned(),
            node_pods(&["p1"]),
        )]));
    let mut agent = FakeAgent::connect(service.addr, None, hello("node-a", 1))
        .await
        .unwrap()
        .beat();
    assert_eq!(agent.expect_welcome().await.accepted_protocol_version, 1);
    // The next message is the coordinator's heartbeat (skipped by `next`), never NodePods:
    // ask for a resync to see that the stream carries on without them.
    assert!(service.registry.request_resync("node-a", "test"));
    match agent.next().await.unwrap() {
        Some(pb::coordinator_message::Body::Resync(_)) => {}
        other => panic!("a revision-1 agent got {other:?}"),
    }
}
