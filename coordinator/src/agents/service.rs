//! The `tessera.v1.AgentService/Connect` server: authenticate, read Hello, check it,
//! negotiate the protocol revision, Welcome or Reject, then feed the registry until the
//! stream ends: the agent leaves, falls silent, breaks a limit, is replaced by a newer stream
//! of its node, or its token expires.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::Stream;
use tessera_proto::tessera::v1 as pb;
use tessera_proto::tessera::v1::agent_service_server::AgentService;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{AuthError, Authenticator, Identity, Validity};
use super::limits::{self, Steps};
use super::registry::{AgentRegistry, ReportError, Session};

/// Heartbeats missed before a silent agent's stream is closed.
const MISSED_HEARTBEATS: u32 = 3;
/// Outbound messages queued per stream.
const OUTBOUND_QUEUE: usize = 64;
/// Streams being opened (authenticated) at once on one connection: the rest wait their turn.
pub(crate) const AUTHENTICATING_PER_CONNECTION: usize = 4;

/// Settings of the agent service.
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// This replica's identity, sent in Welcome (for the agents' logs).
    pub coordinator_id: String,
    /// Heartbeat interval asked of the agents and used towards them.
    pub heartbeat_interval: Duration,
    /// When set, streams are accepted only while it reads `true` (this replica leads) and
    /// are closed when it turns `false`. Only the leader's registry feeds scheduling, so an
    /// agent that reached a standby through the Service is told to try again; its
    /// reconnect backoff then lands it on the leader.
    pub leadership: Option<watch::Receiver<bool>>,
    /// Serve TLS with this certificate (re-read as it rotates); `None` serves plaintext.
    pub tls: Option<crate::tls::ReloadingCert>,
    /// How much one connection and one message may ask of the service.
    pub limits: StreamLimits,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            coordinator_id: "tessera-coordinator".to_owned(),
            heartbeat_interval: Duration::from_secs(10),
            leadership: None,
            tls: None,
            limits: StreamLimits::default(),
        }
    }
}

/// Bounds on what one client may ask of the agent service, whatever it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// Largest agent message accepted, in bytes (`--agent-max-message-bytes`); a larger
    /// one ends its stream with RESOURCE_EXHAUSTED.
    pub max_message_bytes: usize,
    /// Streams one HTTP/2 connection may have open at once
    /// (`--agent-max-streams-per-connection`); an agent opens one.
    pub max_streams_per_connection: u32,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: limits::DEFAULT_MAX_MESSAGE_BYTES,
            max_streams_per_connection: 16,
        }
    }
}

/// The gRPC service implementation.
#[derive(Clone)]
pub struct AgentServer {
    registry: AgentRegistry,
    auth: Authenticator,
    options: ServiceOptions,
    shutdown: watch::Receiver<bool>,
}

impl AgentServer {
    /// A service feeding `registry`.
    pub fn new(
        registry: AgentRegistry,
        auth: Authenticator,
        options: ServiceOptions,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            registry,
            auth,
            options,
            shutdown,
        }
    }
}

/// Resolves once `leadership` reads `false`; never when there is none or its sender is gone.
async fn lost(leadership: &mut Option<watch::Receiver<bool>>) {
    if let Some(rx) = leadership
        && rx.wait_for(|leading| !*leading).await.is_ok()
    {
        return;
    }
    std::future::pending::<()>().await
}

type Outbound = mpsc::Sender<Result<pb::CoordinatorMessage, Status>>;

fn coordinator_msg(body: pb::coordinator_message::Body) -> pb::CoordinatorMessage {
    pb::CoordinatorMessage { body: Some(body) }
}

#[tonic::async_trait]
impl AgentService for AgentServer {
    type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::CoordinatorMessage, Status>> + Send>>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let peer = request.remote_addr();
        if let Some(leadership) = &self.options.leadership
            && !*leadership.borrow()
        {
            return Err(Status::unavailable(
                "this coordinator replica is a standby; reconnect to reach the leader",
            ));
        }
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Refusals are logged by the authenticator, which can tell a repeat from news.
        let identity = self
            .auth
            .authenticate(authorization.as_deref(), peer.map(|p| p.ip()))
            .await
            .map_err(|error| error.to_status())?;
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let stream = Stream_ {
            server: self.clone(),
            identity,
            authorization,
            peer,
            inbound: request.into_inner(),
            tx,
        };
        // The response must go out before Hello is read: a client may wait for the
        // response headers before it sends anything.
        tokio::spawn(stream.run());
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One agent stream's state.
struct Stream_ {
    server: AgentServer,
    identity: Identity,
    /// The credentials the stream was opened with, to review again when they have no
    /// readable expiry.
    authorization: Option<String>,
    peer: Option<SocketAddr>,
    inbound: Streaming<pb::AgentMessage>,
    tx: Outbound,
}

/// How a stream ended, for the log.
enum End {
    AgentClosed,
    Silent,
    Shutdown,
    Refused(Status),
    Replaced,
    Gone,
}

/// What an inbound error says about the agent: a message over the size limit or one that
/// does not decode is the agent's fault and is answered; anything else (a reset, a closed
/// connection) leaves nobody to answer.
fn inbound_failure(status: &Status, limit: usize) -> Option<Status> {
    match status.code() {
        // tonic refuses a message longer than its limit from the length prefix alone.
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
            Some(Status::resource_exhausted(format!(
                "agent message over the coordinator's limit of {limit} bytes \
                 (--agent-max-message-bytes): {}",
                status.message()
            )))
        }
        tonic::Code::Internal => Some(Status::invalid_argument(format!(
            "agent message could not be decoded as tessera.v1.AgentMessage: {}",
            status.message()
        ))),
        _ => None,
    }
}

/// When a stream's credentials are looked at again.
fn recheck_at(valid: Validity) -> Option<Instant> {
    match valid {
        Validity::Always => None,
        Validity::Until(expiry) => Some(
            Instant::now()
                + expiry
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO),
        ),
        Validity::ReviewAgainAfter(after) => Some(Instant::now() + after),
    }
}

/// Resolves at `at`; never when there is none.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Stream_ {
    async fn run(mut self) {
        let hb = self.server.options.heartbeat_interval;
        let dead_after = hb * MISSED_HEARTBEATS;
        let first = tokio::time::timeout(dead_after, self.inbound.next()).await;
        let hello = match first {
            Ok(Some(Ok(pb::AgentMessage {
                body: Some(pb::agent_message::Body::Hello(hello)),
            }))) => hello,
            Ok(Some(Ok(_))) => {
                return self
                    .refuse(Status::failed_precondition(
                        "the first message of a stream must be Hello",
                    ))
                    .await;
            }
            Ok(Some(Err(status))) => {
                let limit = self.server.options.limits.max_message_bytes;
                return match inbound_failure(&status, limit) {
                    Some(answer) => {
                        tracing::warn!(peer = ?self.peer, status = %answer, "agent stream refused");
                        self.refuse(answer).await
                    }
                    None => tracing::debug!(%status, "agent stream failed before Hello"),
                };
            }
            Ok(None) => return,
            Err(_) => {
                return self
                    .refuse(Status::deadline_exceeded(format!(
                        "no Hello within {dead_after:?}"
                    )))
                    .await;
            }
        };
        // Checked before anything reads it, the log lines below included.
        let Some(inventory) = hello.inventory else {
            return self
                .refuse(Status::invalid_argument(
                    "hello.inventory: required, the node's GPU inventory",
                ))
                .await;
        };
        if let Err(error) =
            limits::check_inventory("hello.inventory", &inventory, &mut Steps::default())
        {
            tracing::warn!(
                peer = ?self.peer,
                user = %self.identity.username,
                %error,
                "agent stream refused"
            );
            return self
                .refuse(Status::invalid_argument(error.to_string()))
                .await;
        }
        let accepted = match pb::negotiate_protocol(pb::PROTOCOL_VERSION, hello.protocol_version) {
            Ok(v) => v,
            Err(reject) => {
                let node = &inventory.node_name;
                tracing::warn!(%node, reason = %reject.reason, "agent protocol rejected");
                let _ = self
                    .tx
                    .send(Ok(coordinator_msg(pb::coordinator_message::Body::Reject(
                        reject,
                    ))))
                    .await;
                return;
            }
        };
        if let Err(error) = self.identity.check_node(&inventory.node_name) {
            tracing::warn!(node = %inventory.node_name, %error, "agent stream refused");
            return self.refuse(error.to_status()).await;
        }
        // The registry's outbound channel carries Resyncs from other tasks.
        let (side_tx, mut side_rx) = mpsc::channel::<pb::CoordinatorMessage>(8);
        let session = match self.server.registry.connect(&inventory, accepted, side_tx) {
            Ok(s) => s,
            Err(error) => {
                return self
                    .refuse(Status::invalid_argument(error.to_string()))
                    .await;
            }
        };
        tracing::info!(
            node = %session.node,
            agent_version = %inventory.agent_version,
            protocol = accepted,
            gpus = inventory.gpus.len(),
            "agent connected"
        );
        let welcome = pb::Welcome {
            accepted_protocol_version: accepted,
            heartbeat_interval_ms: u32::try_from(hb.as_millis()).unwrap_or(u32::MAX),
            coordinator_id: self.server.options.coordinator_id.clone(),
        };
        // Revision 2 agents take their pods from this stream instead of the API.
        let pods = (accepted >= 2).then(|| self.server.registry.node_pods(&session.node));
        let end = if self
            .send(pb::coordinator_message::Body::Welcome(welcome))
            .await
        {
            self.serve(&session, &mut side_rx, pods).await
        } else {
            End::Gone
        };
        self.server.registry.disconnect(&session);
        match end {
            End::Refused(status) => {
                tracing::warn!(node = %session.node, %status, "agent stream closed");
                let _ = self.tx.send(Err(status)).await;
            }
            End::AgentClosed => tracing::info!(node = %session.node, "agent disconnected"),
            End::Silent => tracing::warn!(
                node = %session.node,
                "agent missed {MISSED_HEARTBEATS} heartbeats; stream closed"
            ),
            End::Shutdown => tracing::debug!(node = %session.node, "stream closed for shutdown"),
            End::Replaced => {
                tracing::info!(node = %session.node, "agent stream replaced by a newer one from its node");
                let _ = self
                    .tx
                    .send(Err(Status::aborted(
                        "a newer stream from this node replaced this one",
                    )))
                    .await;
            }
            End::Gone => tracing::info!(node = %session.node, "agent stream ended"),
        }
    }

    async fn refuse(self, status: Status) {
        let _ = self.tx.send(Err(status)).await;
    }

    /// Sends one message; false when the agent is gone.
    async fn send(&self, body: pb::coordinator_message::Body) -> bool {
        self.tx.send(Ok(coordinator_msg(body))).await.is_ok()
    }

    async fn serve(
        &mut self,
        session: &Session,
        side: &mut mpsc::Receiver<pb::CoordinatorMessage>,
        mut pods: Option<watch::Receiver<Option<Arc<pb::NodePods>>>>,
    ) -> End {
        if let Some(rx) = pods.as_mut() {
            let first = rx.borrow_and_update().clone();
            if let Some(snapshot) = first
                && !self
                    .send(pb::coordinator_message::Body::NodePods((*snapshot).clone()))
                    .await
            {
                return End::Gone;
            }
        }
        let hb = self.server.options.heartbeat_interval;
        let dead_after = hb * MISSED_HEARTBEATS;
        let mut shutdown = self.server.shutdown.clone();
        let mut leadership = self.server.options.leadership.clone();
        let mut tick = tokio::time::interval_at(Instant::now() + hb, hb);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        let mut sequence = 0u64;
        let mut recheck = recheck_at(self.identity.valid);
        loop {
            tokio::select! {
                incoming = self.inbound.next() => {
                    let message = match incoming {
                        None => return End::AgentClosed,
                        Some(Err(status)) => {
                            let limit = self.server.options.limits.max_message_bytes;
                            if let Some(answer) = inbound_failure(&status, limit) {
                                return End::Refused(answer);
                            }
                            tracing::debug!(node = %session.node, %status, "agent stream error");
                            return End::AgentClosed;
                        }
                        Some(Ok(m)) => m,
                    };
                    last_heard = Instant::now();
                    if let Some(end) = self.handle(session, message).await {
                        return end;
                    }
                }
                Some(snapshot) = next_pods(&mut pods) => {
                    if !self.send(pb::coordinator_message::Body::NodePods((*snapshot).clone())).await {
                        return End::Gone;
                    }
                }
                message = side.recv() => {
                    // The registry dropped its sender: a newer stream of this node took over.
                    let Some(message) = message else { return End::Replaced };
                    if self.tx.send(Ok(message)).await.is_err() {
                        return End::Gone;
                    }
                }
                () = until(recheck) => {
                    match self.recheck(session).await {
                        Ok(next) => recheck = next,
                        Err(status) => return End::Refused(status),
                    }
                }
                _ = tick.tick() => {
                    if last_heard.elapsed() > dead_after {
                        return End::Silent;
                    }
                    sequence += 1;
                    let beat = pb::Heartbeat { sequence, sent_unix_ms: now_unix_ms() };
                    if !self.send(pb::coordinator_message::Body::Heartbeat(beat)).await {
                        return End::Gone;
                    }
                }
                _ = super::stopped(&mut shutdown) => return End::Shutdown,
                _ = lost(&mut leadership) => {
                    return End::Refused(Status::unavailable(
                        "this coordinator replica lost leadership; reconnect to reach the leader",
                    ));
                }
            }
        }
    }

    /// Looks at the stream's credentials again when they run out: an expired token ends
    /// the stream; one without a readable expiry is reviewed again. The next time to look,
    /// or the status that ends the stream.
    async fn recheck(&mut self, session: &Session) -> Result<Option<Instant>, Status> {
        if let Validity::Until(_) = self.identity.valid {
            tracing::info!(node = %session.node, "agent token expired; stream closed");
            return Err(AuthError::Expired.to_status());
        }
        let identity = self
            .server
            .auth
            .authenticate(self.authorization.as_deref(), self.peer.map(|p| p.ip()))
            .await
            .map_err(|error| error.to_status())?;
        identity
            .check_node(&session.node)
            .map_err(|error| error.to_status())?;
        self.identity = identity;
        Ok(recheck_at(self.identity.valid))
    }

    /// Applies one agent message; `Some` ends the stream.
    async fn handle(&mut self, session: &Session, message: pb::AgentMessage) -> Option<End> {
        use pb::agent_message::Body;
        let registry = &self.server.registry;
        let refused = |error: &dyn std::fmt::Display| {
            Some(End::Refused(Status::invalid_argument(error.to_string())))
        };
        let reported = match message.body {
            Some(Body::Heartbeat(_)) | None => {
                registry.touch(session);
                Ok(())
            }
            Some(Body::Occupancy(o)) => registry.set_occupancy(session, &o),
            Some(Body::HealthChange(h)) => registry.set_health(session, &h),
            Some(Body::Inventory(inv)) => {
                if let Err(error) =
                    limits::check_inventory("inventory", &inv, &mut Steps::default())
                {
                    return refused(&error);
                }
                if inv.node_name != session.node {
                    return Some(End::Refused(Status::invalid_argument(format!(
                        "inventory.node_name: {:?} differs from the stream's node {:?}; \
                         an agent reports only for the node it said Hello for",
                        inv.node_name, session.node
                    ))));
                }
                if let Err(error) = registry.replace_inventory(session, &inv) {
                    return refused(&error);
                }
                Ok(())
            }
            Some(Body::Hello(_)) => {
                return Some(End::Refused(Status::failed_precondition(
                    "Hello is only valid as the first message of a stream; open a new stream to reconnect",
                )));
            }
        };
        let unknown = match reported {
            Ok(()) => None,
            Err(ReportError::Invalid(error)) => return refused(&error),
            Err(ReportError::UnknownGpu(gpu)) => Some(gpu),
        };
        if let Some(gpu) = unknown {
            // The agent knows hardware we do not: ask for the whole picture again.
            let resync = pb::Resync {
                reason: gpu.to_string(),
            };
            if !self
                .send(pb::coordinator_message::Body::Resync(resync))
                .await
            {
                return Some(End::Gone);
            }
        }
        None
    }
}

/// The next published `NodePods` of a revision-2 stream; never for older ones.
async fn next_pods(
    pods: &mut Option<watch::Receiver<Option<Arc<pb::NodePods>>>>,
) -> Option<Arc<pb::NodePods>> {
    let Some(rx) = pods else {
        return std::future::pending().await;
    };
    loop {
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
        if let Some(snapshot) = rx.borrow_and_update().clone() {
            return Some(snapshot);
        }
    }
}

fn now_unix_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
