//! The stream to the coordinator (`tessera.v1.AgentService/Connect`): inventory and
//! topology in `Hello`, occupancy and health changes as they happen, heartbeats at the
//! interval the coordinator asks for, a full resend on `Resync`, and reconnects with
//! exponential backoff when the stream breaks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tessera_proto::tessera::v1 as pb;
use tessera_proto::tessera::v1::agent_service_client::AgentServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};

use crate::assignments::allocated;
use crate::coordinator_pods::CoordinatorPods;
use crate::enforce::usage::PodMeter;
use crate::gpu::PcieRelation;
use crate::ledger::now_unix_ms;
use crate::node::Node;

/// Heartbeat interval when the coordinator does not say.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The node's inventory and link matrix.
pub fn inventory(node: &Node, node_name: &str) -> pb::NodeInventory {
    let t = node.topology();
    let mut links = Vec::new();
    for i in 0..t.len() {
        for j in i + 1..t.len() {
            let p = t.pair(i, j);
            links.push(pb::GpuLink {
                gpu_a: t.gpus()[i].uuid.clone(),
                gpu_b: t.gpus()[j].uuid.clone(),
                nvlink_count: p.nvlinks,
                nvswitch: p.nvswitch,
                pcie: pcie(p.pcie) as i32,
            });
        }
    }
    pb::NodeInventory {
        node_name: node_name.to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        gpus: node
            .devices()
            .iter()
            .map(|d| pb::Gpu {
                uuid: d.uuid.clone(),
                index: d.index,
                model: d.model.clone(),
                memory_mib: d.memory_total_mib,
                numa_node: d.numa_node.map_or(-1, |n| n as i32),
                pci_bus_id: d.pci_bus_id.clone(),
                mig_enabled: d.mig.is_some(),
                mig_instances: d
                    .mig
                    .iter()
                    .flatten()
                    .map(|m| pb::MigInstance {
                        profile: m.profile.clone(),
                        uuid: m.uuid.clone(),
                        placement_start: 0,
                        placement_size: 0,
                        memory_mib: m.memory_total_mib,
                        compute_slices: m.compute_slices,
                        gpu_compute_slices: if m.compute_slices > 0 {
                            crate::gpu::mig::COMPUTE_SLICES
                        } else {
                            0
                        },
                    })
                    .collect(),
            })
            .collect(),
        links: Some(pb::LinkMatrix { links }),
        shares_per_gpu: node.options().shares_per_gpu,
    }
}

fn pcie(r: PcieRelation) -> pb::PcieRelation {
    match r {
        PcieRelation::SameBoard => pb::PcieRelation::SameBoard,
        PcieRelation::SingleSwitch => pb::PcieRelation::SameSwitch,
        PcieRelation::MultipleSwitches => pb::PcieRelation::MultipleSwitches,
        PcieRelation::HostBridge => pb::PcieRelation::SameHostBridge,
        PcieRelation::NumaNode => pb::PcieRelation::SameNuma,
        PcieRelation::System => pb::PcieRelation::CrossSocket,
    }
}

fn health(healthy: bool) -> pb::Health {
    if healthy {
        pb::Health::Healthy
    } else {
        pb::Health::Unhealthy
    }
}

/// Who holds what on every GPU, with live readings (per share: measured through
/// `meter`, zero with an empty `pod_uid` when the pod's UID is unknown), and the pending
/// pods, by UID, whose every GPU container the ledger holds.
pub fn occupancy(node: &Node, meter: &PodMeter) -> pb::Occupancy {
    // Sampled and attributed before taking the ledger lock: reading cgroup files must
    // not hold up Allocate.
    let readings: Vec<_> = node
        .devices()
        .iter()
        .map(|d| {
            let sample = node.backend().sample(&d.uuid).unwrap_or_default();
            let usage = meter.usage(&sample.processes);
            (sample, usage)
        })
        .collect();
    let pending = meter.pending_pods();
    let ledger = node.ledger.lock();
    // The coordinator holds other pods of the same request size off this node until then.
    let allocated_pod_uids = allocated(&pending, &ledger)
        .map(|uid| uid.as_str().to_owned())
        .collect();
    let gpus = node
        .devices()
        .iter()
        .zip(readings)
        .map(|(d, (sample, usage))| {
            let h = node.health(&d.uuid);
            let mig: Vec<&str> = d.mig.iter().flatten().map(|m| m.uuid.as_str()).collect();
            let shares = ledger
                .allocations()
                .iter()
                .flat_map(|a| {
                    a.grants
                        .iter()
                        .filter(|g| g.uuid == d.uuid || mig.contains(&g.uuid.as_str()))
                        .map(move |g| (a, g))
                })
                .map(|(a, g)| {
                    let uid = a.pod_uid.as_ref().map(|u| u.as_str().to_owned());
                    let measured = uid
                        .as_ref()
                        .and_then(|u| usage.pods.get(u).copied())
                        .unwrap_or_default();
                    let enforcement = node.metrics.enforcement.state(uid.as_deref(), &g.uuid);
                    // As recorded at Allocate, never as the pod's annotation says now.
                    let isolation = if mig.contains(&g.uuid.as_str()) {
                        pb::Isolation::Mig
                    } else {
                        pb::Isolation::from(a.isolation)
                    };
                    // How this share is enforced, and its state.
                    let how = (enforcement, isolation);
                    (a, g, uid.unwrap_or_default(), measured, how)
                })
                .map(|(a, g, pod_uid, measured, how)| pb::Share {
                    pod_uid,
                    pod_namespace: a
                        .pod
                        .as_ref()
                        .map(|p| p.namespace.clone())
                        .unwrap_or_default(),
                    pod_name: a.pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
                    container: a.container.clone().unwrap_or_default(),
                    memory_limit_mib: g.memory_mib,
                    compute_percent: g.compute_milli.div_ceil(10),
                    measured_memory_mib: measured.memory_used_mib,
                    measured_utilization_percent: measured.sm_percent,
                    isolation: how.1 as i32,
                    enforcement: how.0.to_proto() as i32,
                    mig_instance_uuid: if mig.contains(&g.uuid.as_str()) {
                        g.uuid.clone()
                    } else {
                        String::new()
                    },
                })
                .collect();
            pb::GpuOccupancy {
                gpu_uuid: d.uuid.clone(),
                health: health(h.healthy) as i32,
                health_reason: h
                    .xid
                    .map(|x| format!("XID {x}"))
                    .or_else(|| h.reason.clone())
                    .unwrap_or_default(),
                shares,
                // tessera.v1 has no "unknown" for these yet: 0 until it does.
                used_memory_mib: sample.memory_used_mib.unwrap_or(0),
                utilization_percent: sample.utilization_percent.unwrap_or(0),
            }
        })
        .collect();
    pb::Occupancy {
        gpus,
        observed_unix_ms: now_unix_ms() as i64,
        allocated_pod_uids,
    }
}

fn msg(body: pb::agent_message::Body) -> pb::AgentMessage {
    pb::AgentMessage { body: Some(body) }
}

/// Why one session with the coordinator ended.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("stream failed: {0}")]
    Stream(#[from] tonic::Status),
    #[error("coordinator closed the stream")]
    Closed,
    #[error("TLS: {0}")]
    Tls(String),
    #[error("coordinator rejected protocol {ours}: {reason}")]
    Rejected { ours: u32, reason: String },
}

impl SessionEnd {
    /// The coordinator is not there (yet) rather than refusing: nothing listens, a standby
    /// replica answered, or the stream was closed or cut. An agent started before its
    /// coordinator sees these until the coordinator leads.
    fn coordinator_absent(&self) -> bool {
        match self {
            SessionEnd::Connect(_) | SessionEnd::Closed => true,
            SessionEnd::Stream(s) => s.code() == tonic::Code::Unavailable,
            SessionEnd::Tls(_) | SessionEnd::Rejected { .. } => false,
        }
    }

    /// What an operator can change, for the causes that have a fix on this side.
    fn hint(&self) -> &'static str {
        match self {
            SessionEnd::Stream(s) if s.code() == tonic::Code::Unauthenticated => {
                "the coordinator did not accept this agent's token: mount a projected ServiceAccount token and pass its path with --coordinator-token-file, or run the coordinator with --agent-auth none on a trusted network"
            }
            SessionEnd::Stream(s) if s.code() == tonic::Code::PermissionDenied => {
                "the coordinator knows this agent's identity but does not allow it: its message names the user; add it to the coordinator's --agent-users, or run the agent under the ServiceAccount listed there"
            }
            SessionEnd::Connect(_) => {
                "check --coordinator (the coordinator Service's address) and that the coordinator runs"
            }
            SessionEnd::Rejected { .. } => "run an agent and a coordinator of the same release",
            SessionEnd::Tls(_) => {
                "give --coordinator-ca-file the CA that signed the coordinator's --agent-tls-cert-file (the chart mounts ca.crt of the coordinator's TLS Secret)"
            }
            _ => "",
        }
    }
}

/// Reports to the coordinator at `endpoint` (`http://host:port`) until dropped.
pub async fn run(endpoint: String, node: Arc<Node>, node_name: String, meter: PodMeter) {
    run_authenticated(endpoint, node, node_name, meter, Security::default(), None).await
}

/// How the agent proves who it is and checks whom it talks to.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// The ServiceAccount token presented to the coordinator, read on every connect.
    pub token_file: Option<PathBuf>,
    /// The CA that signed the coordinator's certificate, for `https://` endpoints; read on
    /// every connect, so a rotated CA is picked up.
    pub ca_file: Option<PathBuf>,
}

/// Like [`run`], presenting the ServiceAccount token read from `token_file` as
/// `authorization: Bearer <token>` metadata. The file is read again on every connect,
/// because the kubelet rotates projected tokens; while it is missing or unreadable the
/// agent connects without a token (a coordinator that checks tokens will refuse it).
/// An `https://` endpoint is verified against `security.ca_file`. The coordinator's
/// `NodePods` snapshots go to `pods` when given.
pub async fn run_authenticated(
    endpoint: String,
    node: Arc<Node>,
    node_name: String,
    meter: PodMeter,
    security: Security,
    pods: Option<Arc<CoordinatorPods>>,
) {
    let mut failures: u32 = 0;
    let mut token = TokenSource::new(security.token_file.clone());
    let mut said = EndLog::default();
    loop {
        let bearer = token.read();
        let before = failures;
        let peer = Peer {
            node: &node,
            node_name: &node_name,
            meter: &meter,
            pods: pods.as_deref(),
        };
        match session(
            &endpoint,
            security.ca_file.as_deref(),
            &peer,
            &mut failures,
            bearer,
        )
        .await
        {
            Ok(()) => return,
            Err(error) => {
                // A session that got as far as Welcome reset `failures`: its end is news.
                if failures < before {
                    said.welcomed();
                }
                match said.ended(&error) {
                    Say::Waiting => tracing::warn!(
                        %endpoint,
                        %error,
                        hint = error.hint(),
                        "waiting for the coordinator: it does not answer yet (normal while it starts); \
                         retrying with backoff, each further attempt logged at debug level until it answers"
                    ),
                    Say::Ended => tracing::warn!(
                        %endpoint,
                        %error,
                        hint = error.hint(),
                        "coordinator stream ended; reconnecting with backoff (the same cause again is logged at debug level)"
                    ),
                    Say::Again => {
                        tracing::debug!(%endpoint, %error, "coordinator not reached again; retrying")
                    }
                }
            }
        }
        failures = failures.saturating_add(1);
        let delay = BACKOFF_MIN
            .saturating_mul(1u32 << failures.min(8).saturating_sub(1))
            .min(BACKOFF_MAX);
        tokio::time::sleep(delay).await;
    }
}

/// What the log says when a session with the coordinator ends: a coordinator that is not
/// there yet (an agent started before it, the normal order in a rollout) or went away is said
/// once at WARN and then at debug on every retry until a session is welcomed again; any other
/// cause (a refusal, a TLS problem) at WARN each time it changes.
#[derive(Debug, Default)]
struct EndLog {
    /// A session was welcomed since the last one that ended.
    welcomed: bool,
    /// An absent coordinator was said since the last welcome.
    absence_said: bool,
    /// The last cause said.
    last_cause: Option<String>,
}

/// How [`EndLog`] says one session's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Say {
    /// WARN: the coordinator does not answer yet.
    Waiting,
    /// WARN: a new cause (or the stream of a welcomed session broke).
    Ended,
    /// debug: nothing new.
    Again,
}

impl EndLog {
    /// The session that just ended had been welcomed.
    fn welcomed(&mut self) {
        *self = EndLog {
            welcomed: true,
            ..EndLog::default()
        };
    }

    /// How to say that a session ended with `error`.
    fn ended(&mut self, error: &SessionEnd) -> Say {
        let was_welcomed = std::mem::take(&mut self.welcomed);
        if error.coordinator_absent() {
            if self.absence_said {
                return Say::Again;
            }
            self.absence_said = true;
            self.last_cause = Some(error.to_string());
            return if was_welcomed {
                Say::Ended
            } else {
                Say::Waiting
            };
        }
        let cause = error.to_string();
        if !was_welcomed && self.last_cause.as_deref() == Some(cause.as_str()) {
            return Say::Again;
        }
        self.last_cause = Some(cause);
        Say::Ended
    }
}

/// Reads the coordinator token file, warning once per kind of failure.
struct TokenSource {
    path: Option<PathBuf>,
    warned: bool,
}

impl TokenSource {
    fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            warned: false,
        }
    }

    /// The `authorization` value to send, if a token is available.
    fn read(&mut self) -> Option<MetadataValue<Ascii>> {
        let path = self.path.as_ref()?;
        let value = match std::fs::read_to_string(path) {
            Ok(text) => MetadataValue::try_from(format!("Bearer {}", text.trim()))
                .map_err(|_| "it holds characters not allowed in gRPC metadata".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        match value {
            Ok(v) => {
                self.warned = false;
                Some(v)
            }
            Err(error) => {
                if !self.warned {
                    tracing::warn!(
                        path = %path.display(),
                        %error,
                        "cannot use the coordinator token file; connecting without a token"
                    );
                    self.warned = true;
                }
                None
            }
        }
    }
}

/// What one session reports from and delivers to.
struct Peer<'a> {
    node: &'a Node,
    node_name: &'a str,
    meter: &'a PodMeter,
    pods: Option<&'a CoordinatorPods>,
}

/// The channel to `endpoint`: TLS verified against the CA in `ca_file` for `https://`.
async fn channel(
    endpoint: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<tonic::transport::Channel, SessionEnd> {
    let mut target = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| SessionEnd::Connect(e.to_string()))?
        .connect_timeout(Duration::from_secs(5));
    if endpoint.starts_with("https://") {
        let Some(path) = ca_file else {
            return Err(SessionEnd::Tls(
                "an https:// coordinator needs --coordinator-ca-file".into(),
            ));
        };
        let pem = std::fs::read(path)
            .map_err(|e| SessionEnd::Tls(format!("reading the CA file {}: {e}", path.display())))?;
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem));
        target = target
            .tls_config(tls)
            .map_err(|e| SessionEnd::Tls(e.to_string()))?;
    }
    target.connect().await.map_err(|e| {
        // The transport error's own text is "transport error"; its source says what failed.
        let detail = std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
        SessionEnd::Connect(format!("{e}{detail}"))
    })
}

async fn session(
    endpoint: &str,
    ca_file: Option<&std::path::Path>,
    peer: &Peer<'_>,
    failures: &mut u32,
    bearer: Option<MetadataValue<Ascii>>,
) -> Result<(), SessionEnd> {
    let (node, node_name, meter) = (peer.node, peer.node_name, peer.meter);
    let channel = channel(endpoint, ca_file).await?;
    let (tx, rx) = mpsc::channel::<pb::AgentMessage>(256);
    // Sending into our own fresh channel only fails if the stream is gone.
    let send = |m| tx.try_send(m).map_err(|_| SessionEnd::Closed);
    send(msg(pb::agent_message::Body::Hello(pb::Hello {
        protocol_version: pb::PROTOCOL_VERSION,
        inventory: Some(inventory(node, node_name)),
    })))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(bearer) = bearer {
        request.metadata_mut().insert("authorization", bearer);
    }
    let mut inbound = AgentServiceClient::new(channel)
        .connect(request)
        .await?
        .into_inner();
    let mut heartbeat = DEFAULT_HEARTBEAT;
    let mut changes = node.changes();
    let mut last_health: HashMap<String, bool> = node
        .devices()
        .iter()
        .map(|d| (d.uuid.clone(), node.health(&d.uuid).healthy))
        .collect();
    let mut sequence = 0u64;
    let mut welcomed = false;
    let mut tick = tokio::time::interval(heartbeat);
    tick.tick().await;
    loop {
        tokio::select! {
            incoming = inbound.message() => {
                let Some(message) = incoming? else { return Err(SessionEnd::Closed) };
                match message.body {
                    Some(pb::coordinator_message::Body::Welcome(w)) => {
                        welcomed = true;
                        *failures = 0;
                        if w.heartbeat_interval_ms > 0 {
                            heartbeat = Duration::from_millis(u64::from(w.heartbeat_interval_ms));
                            tick = tokio::time::interval(heartbeat);
                            tick.tick().await;
                        }
                        tracing::info!(coordinator = %w.coordinator_id, protocol = w.accepted_protocol_version, "connected to the coordinator");
                        if let Some(pods) = peer.pods {
                            pods.welcomed(w.accepted_protocol_version);
                        }
                        send(msg(pb::agent_message::Body::Occupancy(occupancy(node, meter))))?;
                    }
                    Some(pb::coordinator_message::Body::Reject(r)) => {
                        return Err(SessionEnd::Rejected { ours: pb::PROTOCOL_VERSION, reason: r.reason });
                    }
                    Some(pb::coordinator_message::Body::Resync(_)) => {
                        send(msg(pb::agent_message::Body::Inventory(inventory(node, node_name))))?;
                        send(msg(pb::agent_message::Body::Occupancy(occupancy(node, meter))))?;
                    }
                    Some(pb::coordinator_message::Body::NodePods(list)) => {
                        if let Some(pods) = peer.pods {
                            pods.receive(node, &list);
                            // Occupancy lists which of them are allocated; it may have changed.
                            send(msg(pb::agent_message::Body::Occupancy(occupancy(node, meter))))?;
                        }
                    }
                    Some(pb::coordinator_message::Body::Heartbeat(_)) | None => {}
                }
            }
            _ = tick.tick() => {
                sequence += 1;
                send(msg(pb::agent_message::Body::Heartbeat(pb::Heartbeat {
                    sequence,
                    sent_unix_ms: now_unix_ms() as i64,
                })))?;
            }
            changed = changes.changed(), if welcomed => {
                if changed.is_err() {
                    return Ok(());
                }
                for d in node.devices() {
                    let h = node.health(&d.uuid);
                    if last_health.insert(d.uuid.clone(), h.healthy) != Some(h.healthy) {
                        send(msg(pb::agent_message::Body::HealthChange(pb::HealthChange {
                            gpu_uuid: d.uuid.clone(),
                            health: health(h.healthy) as i32,
                            reason: h.xid.map(|x| format!("XID {x}")).or_else(|| h.reason.clone()).unwrap_or_default(),
                            xid: h.xid.map_or(0, |x| x as u32),
                            observed_unix_ms: now_unix_ms() as i64,
                        })))?;
                    }
                }
                send(msg(pb::agent_message::Body::Occupancy(occupancy(node, meter))))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_flag_to_change() {
        let unauthenticated = SessionEnd::Stream(tonic::Status::unauthenticated("no token"));
        assert!(unauthenticated.hint().contains("--coordinator-token-file"));
        let denied = SessionEnd::Stream(tonic::Status::permission_denied("user x"));
        assert!(denied.hint().contains("--agent-users"));
        assert!(
            SessionEnd::Connect("refused".into())
                .hint()
                .contains("--coordinator")
        );
        assert_eq!(SessionEnd::Closed.hint(), "");
    }

    /// How each session end is said, in order: a coordinator that is not there yet once at
    /// WARN then at debug, a refusal whenever its cause changes, a broken stream once.
    #[test]
    fn an_absent_coordinator_is_said_once_and_refusals_when_they_change() {
        let refused = || SessionEnd::Connect("transport error: tcp connect error".into());
        let standby = || SessionEnd::Stream(tonic::Status::unavailable("standby"));
        let denied = || SessionEnd::Stream(tonic::Status::unauthenticated("no token"));
        let mut said = EndLog::default();
        let mut rows: Vec<(&str, Say)> = Vec::new();
        let mut end = |what, error: SessionEnd| rows.push((what, said.ended(&error)));
        end("nothing listens yet", refused());
        end("still nothing", refused());
        end("a standby answers", standby());
        end("nothing again", refused());
        end("refused: news", denied());
        end("refused again", denied());
        assert_eq!(
            rows,
            [
                ("nothing listens yet", Say::Waiting),
                ("still nothing", Say::Again),
                ("a standby answers", Say::Again),
                ("nothing again", Say::Again),
                ("refused: news", Say::Ended),
                ("refused again", Say::Again),
            ]
        );
        // Welcomed, then the leader went away: said once, then quiet until welcomed again.
        said.welcomed();
        assert_eq!(said.ended(&standby()), Say::Ended);
        assert_eq!(said.ended(&refused()), Say::Again);
        said.welcomed();
        assert_eq!(said.ended(&SessionEnd::Closed), Say::Ended);
    }

    /// An agent started 30 s before its coordinator (on tokio's paused clock: the backoff's
    /// sleeps pass at once) warns once about it, and retries at debug level.
    #[tokio::test(start_paused = true)]
    async fn an_agent_started_before_its_coordinator_warns_once() {
        let lines = tessera_logs::Captured::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let shape =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/gpus/l40s-4x-pcie.yaml");
        let sim =
            Arc::new(crate::gpu::sim::SimBackend::from_file(shape).expect("the shape parses"));
        let node = Arc::new(
            Node::new(
                sim,
                crate::ledger::Ledger::in_memory(),
                crate::node::NodeOptions::default(),
            )
            .expect("the node starts"),
        );
        let meter = PodMeter::new(
            crate::enforce::usage::ProcessAttribution::new("/nonexistent"),
            Arc::new(crate::assignments::NoAssignments),
        );
        // A port nothing listens on: bound, then let go.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let endpoint = format!("http://{closed}");
        let reporting = run(endpoint, node, "node-a".into(), meter);
        let waited = tokio::time::timeout(Duration::from_secs(30), reporting).await;
        assert!(waited.is_err(), "the loop keeps trying");
        let text = lines.text();
        let warns: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ")).collect();
        let retries = text
            .lines()
            .filter(|l| l.contains("DEBUG") && l.contains("coordinator not reached again"))
            .count();
        assert_eq!(warns.len(), 1, "{text}");
        assert!(warns[0].contains("waiting for the coordinator"), "{text}");
        assert!(
            warns[0].contains(&closed.to_string()),
            "it names what it waits for: {text}"
        );
        // The backoff doubles from 200 ms to 30 s: seven retries in the first 30 s.
        assert!(
            retries >= 5,
            "{retries} retries logged at debug level:\n{text}"
        );
    }
}
