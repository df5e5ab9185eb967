//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! One replica holds the Lease and renews it every `renew_every`; the others poll it and
//! take it over once it has expired or was released (empty `holderIdentity`). Expiry is
//! judged as client-go judges it, on this replica's monotonic clock: the Lease has expired
//! when its record has not changed for `leaseDurationSeconds` since this replica last saw it
//! change. The holder's `renewTime` is never compared with the local wall clock, so clock
//! skew between replicas (or a wall clock that jumps) cannot hand the Lease to a second
//! leader. Every write carries the resourceVersion it was based
//! on, so two candidates racing for an expired Lease cannot both win: the API server
//! answers the loser with 409 Conflict. A leader that cannot renew steps down after
//! two thirds of the lease duration, before anyone else may consider the Lease expired,
//! so there is never a moment with two leaders.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Where the Lease lives and how it is timed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// How long a Lease stays valid after its last renewal (`leaseDurationSeconds`);
    /// whole seconds, at least one.
    pub duration: Duration,
    /// How often the leader renews and standbys poll.
    pub renew_every: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            namespace: "tessera-system".to_owned(),
            name: "tessera-coordinator".to_owned(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(2),
        }
    }
}

impl LeaseConfig {
    /// How long a leader may fail to renew before it steps down: two thirds of the
    /// duration, leaving a margin before others may take the Lease.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// Checks the timing: a whole number of seconds of at least one for the duration, and
    /// a renewal interval short enough to renew at least once before the deadline.
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.namespace.is_empty() || self.name.is_empty() {
            return Err(LeaderError::Config(
                "lease namespace and name: required, e.g. tessera-system/tessera-coordinator"
                    .to_owned(),
            ));
        }
        if self.duration < Duration::from_secs(1) || self.duration.subsec_nanos() != 0 {
            return Err(LeaderError::Config(format!(
                "lease duration {:?}: expected a whole number of seconds, at least 1",
                self.duration
            )));
        }
        if self.renew_every.is_zero() || self.renew_every >= self.renew_deadline() {
            return Err(LeaderError::Config(format!(
                "renew interval {:?}: expected more than 0 and less than two thirds of the lease \
                 duration ({:?})",
                self.renew_every,
                self.renew_deadline()
            )));
        }
        Ok(())
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The configuration is unusable.
    #[error("leader election: {0}")]
    Config(String),
    /// The Lease's namespace does not exist, so the Lease cannot be created.
    #[error(
        "namespace {namespace:?} does not exist, so the leader Lease cannot be created there: create it (the chart and deploy/manifests do) or pass an existing namespace with --lease-namespace"
    )]
    NoNamespace {
        /// The Lease namespace asked for (`--lease-namespace`, default `tessera-system`).
        namespace: String,
    },
    /// A Lease call failed.
    #[error("lease {lease}: {source}")]
    Api {
        /// `namespace/name`.
        lease: String,
        /// The API server's answer or the transport failure; RBAC refusals show up here.
        source: kube::Error,
    },
}

/// A running election: the candidate loop and its `is_leader` signal.
pub struct LeaderElector {
    identity: String,
    config: LeaseConfig,
    api: Api<Lease>,
    leader: Arc<watch::Sender<bool>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("identity", &self.identity)
            .field("config", &self.config)
            .field("leader", &*self.leader.borrow())
            .finish()
    }
}

/// What one round found.
enum Round {
    /// We hold the Lease (acquired or renewed).
    Leading,
    /// Someone else holds a valid Lease, or won the race for it.
    Following,
}

impl LeaderElector {
    /// Starts campaigning as `identity` on the current tokio runtime.
    pub fn start(
        client: kube::Client,
        identity: impl Into<String>,
        config: LeaseConfig,
    ) -> Result<Self, LeaderError> {
        config.validate()?;
        let identity = identity.into();
        if identity.is_empty() {
            return Err(LeaderError::Config(
                "identity: required, a name unique to this replica such as the pod name".to_owned(),
            ));
        }
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let (leader, _) = watch::channel(false);
        let leader = Arc::new(leader);
        let (stop, stop_rx) = watch::channel(false);
        let candidate = Candidate {
            identity: identity.clone(),
            config: config.clone(),
            api: api.clone(),
            leader: Arc::clone(&leader),
            observed: parking_lot::Mutex::new(None),
        };
        let task = tokio::spawn(candidate.run(stop_rx));
        Ok(Self {
            identity,
            config,
            api,
            leader,
            stop,
            task,
        })
    }

    /// True while this replica leads; changes as leadership is won and lost.
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    /// This replica's identity in the Lease.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Graceful stop: stops campaigning, reports `false`, then clears `holderIdentity` if
    /// this replica holds the Lease, so a standby takes over at its next poll instead
    /// of waiting for the Lease to expire.
    pub async fn release(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let was_leader = self.leader.send_replace(false);
        if !was_leader {
            return;
        }
        let candidate = Candidate {
            identity: self.identity,
            config: self.config,
            api: self.api,
            leader: self.leader,
            observed: parking_lot::Mutex::new(None),
        };
        match tokio::time::timeout(candidate.config.renew_deadline(), candidate.release()).await {
            Ok(Ok(true)) => tracing::info!(identity = %candidate.identity, "leader lease released"),
            Ok(Ok(false)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "releasing the leader lease failed"),
            Err(_) => tracing::warn!("releasing the leader lease timed out"),
        }
    }

    /// Abrupt stop, as if the process died: the loop ends without touching the Lease,
    /// which others take over once it expires. Reports `false` to local observers.
    pub fn abort(self) {
        self.task.abort();
        self.leader.send_replace(false);
    }
}

/// The campaigning loop's state.
struct Candidate {
    identity: String,
    config: LeaseConfig,
    api: Api<Lease>,
    leader: Arc<watch::Sender<bool>>,
    /// The Lease record last seen and when (local monotonic clock) it was first seen so.
    observed: parking_lot::Mutex<Option<(LeaseSpec, Instant)>>,
}

impl Candidate {
    fn lease_name(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    fn api_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            lease: self.lease_name(),
            source,
        }
    }

    fn set_leader(&self, leading: bool) {
        let was = self.leader.send_replace(leading);
        if was != leading {
            if leading {
                tracing::info!(identity = %self.identity, lease = %self.lease_name(), "became leader");
            } else {
                tracing::warn!(identity = %self.identity, lease = %self.lease_name(), "lost leadership");
            }
        }
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        // When the last successful renewal started; `Some` only while leading.
        let mut renewed_at: Option<Instant> = None;
        // The last failure logged: a cause is logged once when it appears, not every round.
        let mut last_failure: Option<String> = None;
        loop {
            let started = Instant::now();
            let deadline = match renewed_at {
                Some(at) => at + self.config.renew_deadline(),
                None => started + self.config.duration,
            };
            match tokio::time::timeout_at(deadline, self.round()).await {
                Ok(Ok(round)) => {
                    if last_failure.take().is_some() {
                        tracing::info!(identity = %self.identity, "lease rounds succeed again");
                    }
                    match round {
                        Round::Leading => {
                            renewed_at = Some(started);
                            self.set_leader(true);
                        }
                        Round::Following => {
                            renewed_at = None;
                            self.set_leader(false);
                        }
                    }
                }
                Ok(Err(error)) => self.note_failure(&mut last_failure, error.to_string()),
                Err(_) => self.note_failure(&mut last_failure, "lease round timed out".to_owned()),
            }
            if let Some(at) = renewed_at
                && Instant::now() >= at + self.config.renew_deadline()
            {
                // Step down before anyone else may consider the Lease expired.
                renewed_at = None;
                self.set_leader(false);
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.renew_every) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Logs a failed round: a warning when the cause is new, quietly at debug level while
    /// the same cause repeats (the loop keeps retrying every `renew_every`).
    fn note_failure(&self, last: &mut Option<String>, cause: String) {
        if last.as_deref() == Some(cause.as_str()) {
            tracing::debug!(error = %cause, identity = %self.identity, "lease round failed again");
        } else {
            tracing::warn!(error = %cause, identity = %self.identity, "lease round failed; retrying every renew interval");
            *last = Some(cause);
        }
    }

    /// One acquire-or-renew attempt.
    async fn round(&self) -> Result<Round, LeaderError> {
        let now = jiff::Timestamp::now();
        let current = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error(e))?;
        let Some(current) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.config.duration_secs()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Round::Leading),
                // Another candidate created it first.
                Err(e) if is_conflict(&e) => Ok(Round::Following),
                Err(kube::Error::Api(s)) if s.code == 404 => Err(LeaderError::NoNamespace {
                    namespace: self.config.namespace.clone(),
                }),
                Err(e) => Err(self.api_error(e)),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.identity.as_str());
        if !mine && holder.is_some() && !self.expired(&spec, Instant::now()) {
            return Ok(Round::Following);
        }
        let mut next = current;
        let s = next.spec.get_or_insert_with(LeaseSpec::default);
        if !mine {
            s.acquire_time = Some(MicroTime(now));
            s.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        s.holder_identity = Some(self.identity.clone());
        s.renew_time = Some(MicroTime(now));
        s.lease_duration_seconds = Some(self.config.duration_secs());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(Round::Leading),
            // A rival wrote first. For a renewal that is not yet a loss (it may have been an
            // unrelated write); the next round reads the Lease again.
            Err(e) if is_conflict(&e) && mine => Err(self.api_error(e)),
            Err(e) if is_conflict(&e) => Ok(Round::Following),
            Err(e) => Err(self.api_error(e)),
        }
    }

    /// Whether the Lease `spec` has gone unchanged for its duration, as seen from here: a
    /// record seen for the first time (or changed since last seen) starts the clock again.
    fn expired(&self, spec: &LeaseSpec, now: Instant) -> bool {
        let secs = spec
            .lease_duration_seconds
            .unwrap_or_else(|| self.config.duration_secs());
        let valid_for = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        let mut observed = self.observed.lock();
        let since = match observed.as_ref() {
            Some((seen, at)) if seen == spec => *at,
            _ => {
                *observed = Some((spec.clone(), now));
                now
            }
        };
        now >= since + valid_for
    }

    /// Clears `holderIdentity` if we still hold the Lease; true when released.
    async fn release(&self) -> Result<bool, LeaderError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            return Ok(false);
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(1);
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(self.api_error(e)),
        }
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}
