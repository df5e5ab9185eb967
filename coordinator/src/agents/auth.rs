//! Who is on the other end of an agent stream: the agent's ServiceAccount token, checked
//! through a Kubernetes TokenReview, must belong to an allowed user and be bound to the
//! node the agent reports for; the stream lasts no longer than the token.
//!
//! A TokenReview is a request to the API server, so a client must not be able to cause
//! one per stream: verdicts are cached by a SHA-256 of the token (admissions for a short
//! time, never past the token's expiry; refusals briefly), concurrent streams with one
//! token share one review, and each peer address has a budget of reviews a minute. The
//! token itself is never logged; logs name its hash.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::sync::{OnceCell, Semaphore};

use super::peer_limit::{PeerKey, PeerLimits};

/// The username of the agent DaemonSet's ServiceAccount.
pub const DEFAULT_AGENT_USER: &str = "system:serviceaccount:tessera-system:tessera-agent";

/// The TokenReview `user.extra` key naming the node a bound ServiceAccount token's pod
/// runs on.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// How long a positive review is reused before asking the API server again.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(30);

/// How long a refused token stays refused without asking the API server again: long enough
/// that a client repeating a bad token costs one review, short enough that a token refused
/// for a passing reason (its pod not yet in the informer) is soon reviewed again.
pub const DEFAULT_REFUSAL_TTL: Duration = Duration::from_secs(10);

/// TokenReviews each peer address may cause per minute (also its burst): an agent needs
/// one per connection, and its admission is cached for [`DEFAULT_CACHE_TTL`].
pub const DEFAULT_REVIEWS_PER_MINUTE: u32 = 10;

/// Without a readable expiry, how often a stream's token is reviewed again.
pub const DEFAULT_REVIEW_AGAIN: Duration = Duration::from_secs(600);

/// TokenReviews in flight at once, whatever the number of peers.
const REVIEWS_IN_FLIGHT: usize = 8;

/// Cached verdicts beyond this count trigger a sweep of the stale ones.
const CACHE_SWEEP_AT: usize = 1024;

/// How agent streams are authenticated.
#[derive(Clone, Debug, Default)]
pub enum Authenticator {
    /// Anyone may connect and report for any node (development only).
    #[default]
    Disabled,
    /// Bearer tokens are checked with TokenReview.
    TokenReview(TokenReviewAuth),
}

impl Authenticator {
    /// TokenReview authentication accepting `allowed_users` (empty: the default agent
    /// ServiceAccount), with the default cache lifetime.
    pub fn token_review(client: kube::Client, allowed_users: Vec<String>) -> Self {
        Self::TokenReview(TokenReviewAuth::new(
            client,
            allowed_users,
            DEFAULT_CACHE_TTL,
        ))
    }

    /// Accepts only tokens issued for `audience` (a projected ServiceAccount token with that
    /// audience); `None` or empty: the API server's own audience. A token minted for the API
    /// server then cannot be replayed to the coordinator, nor the agent's coordinator token to
    /// the API server.
    pub fn with_audience(self, audience: Option<String>) -> Self {
        match self {
            Self::TokenReview(auth) => Self::TokenReview(auth.audience(audience)),
            other => other,
        }
    }

    /// Caps the TokenReviews each peer address may cause: `per_minute` at once, then
    /// `per_minute` a minute.
    pub fn with_reviews_per_minute(self, per_minute: u32) -> Self {
        match self {
            Self::TokenReview(mut auth) => {
                auth.per_minute = per_minute.max(1);
                auth.shared = Arc::new(Shared::new(auth.per_minute));
                Self::TokenReview(auth)
            }
            other => other,
        }
    }

    /// Checks the `authorization` value of a stream from `peer`.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<Identity, AuthError> {
        match self {
            Self::Disabled => Ok(Identity::anonymous()),
            Self::TokenReview(auth) => auth.authenticate(authorization, peer).await,
        }
    }
}

/// The authenticated caller of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Kubernetes username (empty when authentication is disabled).
    pub username: String,
    /// The node the token is bound to; `None` when authentication is disabled, in which
    /// case any node name is accepted.
    pub node: Option<String>,
    /// How long the credentials hold: the stream ends (or is reviewed again) then.
    pub valid: Validity,
}

/// How long an authenticated stream may go on before its credentials are looked at again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validity {
    /// Authentication is disabled: for ever.
    Always,
    /// Until the token's `exp` claim: then the stream ends, and the agent reconnects with the
    /// token its kubelet has rotated meanwhile.
    Until(SystemTime),
    /// The token has no readable expiry: it is reviewed again after this long.
    ReviewAgainAfter(Duration),
}

impl Identity {
    /// The identity of every caller when authentication is disabled.
    pub fn anonymous() -> Self {
        Self {
            username: String::new(),
            node: None,
            valid: Validity::Always,
        }
    }

    /// Whether an admission of this identity may still be used at `now`.
    fn current(&self, now: SystemTime) -> bool {
        match self.valid {
            Validity::Until(expiry) => expiry > now,
            _ => true,
        }
    }

    /// Whether this caller may report for `node`.
    pub fn check_node(&self, node: &str) -> Result<(), AuthError> {
        match &self.node {
            Some(bound) if bound != node => Err(AuthError::WrongNode {
                user: self.username.clone(),
                bound: bound.clone(),
                claimed: node.to_owned(),
            }),
            _ => Ok(()),
        }
    }
}

/// Why a stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No usable `authorization` metadata.
    #[error(
        "missing credentials: send the agent's ServiceAccount token as `authorization: Bearer <token>` metadata"
    )]
    MissingToken,
    /// The API server did not accept the token.
    #[error("the ServiceAccount token was not accepted by TokenReview: {0}")]
    Rejected(String),
    /// The token is valid but its user may not act as an agent.
    #[error("user {user:?} may not report as a Tessera agent; allowed users: {allowed}")]
    UserNotAllowed {
        /// The username TokenReview returned for the bearer token, e.g.
        /// `system:serviceaccount:tessera-system:tessera-agent`.
        user: String,
        /// The configured allowed users, comma-separated.
        allowed: String,
    },
    /// The token carries no node binding, so the node cannot be checked.
    #[error(
        "the token of {user:?} is not bound to a node (TokenReview user.extra[\"authentication.kubernetes.io/node-name\"] is missing); \
         mount a projected ServiceAccount token in the agent pod"
    )]
    NotNodeBound {
        /// The username TokenReview returned for the bearer token, e.g.
        /// `system:serviceaccount:tessera-system:tessera-agent`.
        user: String,
    },
    /// The agent reports for a node other than its own.
    #[error("{user:?} runs on node {bound:?} and may only report for that node, not {claimed:?}")]
    WrongNode {
        /// The username TokenReview returned for the bearer token, e.g.
        /// `system:serviceaccount:tessera-system:tessera-agent`.
        user: String,
        /// The node the token is bound to.
        bound: String,
        /// The node named in Hello.
        claimed: String,
    },
    /// The TokenReview itself failed.
    #[error("cannot review the token with the Kubernetes API: {0}")]
    Unavailable(String),
    /// The token's `exp` has passed (the stream was open, or the API server still accepted
    /// it within its leeway).
    #[error("token expired; reconnect with a fresh token")]
    Expired,
    /// This peer address caused too many TokenReviews lately.
    #[error(
        "too many TokenReviews for {peer}: at most {per_minute} a minute; retry in {} s",
        retry_after.as_secs().max(1)
    )]
    RateLimited {
        /// The peer (an IPv4 address or an IPv6 /64).
        peer: String,
        /// The configured budget (`--agent-token-reviews-per-minute`).
        per_minute: u32,
        /// When the next review is allowed.
        retry_after: Duration,
    },
}

impl AuthError {
    /// The gRPC status to answer with.
    pub fn to_status(&self) -> tonic::Status {
        match self {
            Self::MissingToken | Self::Rejected(_) | Self::Expired => {
                tonic::Status::unauthenticated(self.to_string())
            }
            Self::Unavailable(_) => tonic::Status::unavailable(self.to_string()),
            Self::RateLimited { .. } => tonic::Status::resource_exhausted(self.to_string()),
            _ => tonic::Status::permission_denied(self.to_string()),
        }
    }

    /// Whether this is the token's verdict (kept for [`DEFAULT_REFUSAL_TTL`]) rather than a
    /// passing state of the API server or of this peer's budget.
    fn is_verdict(&self) -> bool {
        !matches!(
            self,
            Self::Unavailable(_) | Self::RateLimited { .. } | Self::MissingToken
        )
    }
}

/// A SHA-256 of a token: the cache's key, and how logs name the token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct TokenKey([u8; 32]);

impl TokenKey {
    fn of(token: &str) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        Self(key)
    }
}

/// Eight bytes are plenty to tell tokens apart in a log, and say nothing of the token.
impl std::fmt::Display for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("sha256:")?;
        self.0[..8].iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

type Outcome = Result<Identity, AuthError>;

/// A cached verdict and when it was reached.
struct Cached {
    outcome: Outcome,
    at: Instant,
}

/// What the clones of one [`TokenReviewAuth`] share.
struct Shared {
    verdicts: Mutex<HashMap<TokenKey, Cached>>,
    /// Reviews under way, so concurrent streams with one token wait for one review.
    pending: Mutex<HashMap<TokenKey, Arc<OnceCell<Outcome>>>>,
    peers: Mutex<PeerLimits>,
    in_flight: Semaphore,
}

impl Shared {
    fn new(per_minute: u32) -> Self {
        Self {
            verdicts: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            peers: Mutex::new(PeerLimits::new(per_minute)),
            in_flight: Semaphore::new(REVIEWS_IN_FLIGHT),
        }
    }
}

/// TokenReview-backed authentication with a short cache of verdicts and a per-peer budget
/// of reviews.
#[derive(Clone)]
pub struct TokenReviewAuth {
    client: kube::Client,
    allowed_users: Arc<Vec<String>>,
    /// The audience tokens must be issued for; `None`: the API server's.
    audience: Option<String>,
    ttl: Duration,
    refusal_ttl: Duration,
    per_minute: u32,
    review_again: Duration,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TokenReviewAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuth")
            .field("allowed_users", &self.allowed_users)
            .field("audience", &self.audience)
            .field("ttl", &self.ttl)
            .field("refusal_ttl", &self.refusal_ttl)
            .field("per_minute", &self.per_minute)
            .finish()
    }
}

impl TokenReviewAuth {
    /// Reviews through `client`; admissions are reused for `ttl` (never past the token's
    /// expiry), refusals for [`DEFAULT_REFUSAL_TTL`].
    pub fn new(client: kube::Client, allowed_users: Vec<String>, ttl: Duration) -> Self {
        let allowed_users = if allowed_users.is_empty() {
            vec![DEFAULT_AGENT_USER.to_owned()]
        } else {
            allowed_users
        };
        Self {
            client,
            allowed_users: Arc::new(allowed_users),
            audience: None,
            ttl,
            refusal_ttl: DEFAULT_REFUSAL_TTL,
            per_minute: DEFAULT_REVIEWS_PER_MINUTE,
            review_again: DEFAULT_REVIEW_AGAIN,
            shared: Arc::new(Shared::new(DEFAULT_REVIEWS_PER_MINUTE)),
        }
    }

    /// Accepts only tokens for `audience` (see [`Authenticator::with_audience`]).
    pub fn audience(mut self, audience: Option<String>) -> Self {
        self.audience = audience.filter(|a| !a.trim().is_empty());
        self
    }

    /// Checks an `authorization` metadata value (`Bearer <token>`) from `peer`.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<Identity, AuthError> {
        let peer = PeerKey::of(peer);
        let Some(token) = authorization
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
        else {
            let error = AuthError::MissingToken;
            self.log_refusal(peer, None, &error, false);
            return Err(error);
        };
        let key = TokenKey::of(token);
        if let Some(outcome) = self.cached(key) {
            if let Err(error) = &outcome {
                self.log_refusal(peer, Some(key), error, true);
            }
            return outcome;
        }
        // One review per token at a time: the others wait for its verdict.
        let cell = self.shared.pending.lock().entry(key).or_default().clone();
        let outcome = cell
            .get_or_init(|| self.review_once(key, token, peer))
            .await
            .clone();
        {
            let mut pending = self.shared.pending.lock();
            if pending.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                pending.remove(&key);
            }
        }
        outcome
    }

    /// The cached verdict on `key`, if still good.
    fn cached(&self, key: TokenKey) -> Option<Outcome> {
        let verdicts = self.shared.verdicts.lock();
        let cached = verdicts.get(&key)?;
        let fresh = match &cached.outcome {
            Ok(identity) => cached.at.elapsed() < self.ttl && identity.current(SystemTime::now()),
            Err(_) => cached.at.elapsed() < self.refusal_ttl,
        };
        fresh.then(|| cached.outcome.clone())
    }

    /// Reviews `token` unless a verdict arrived meanwhile or `peer`'s budget is spent.
    async fn review_once(&self, key: TokenKey, token: &str, peer: PeerKey) -> Outcome {
        if let Some(outcome) = self.cached(key) {
            return outcome;
        }
        // Bound first: the lock must be released before the refusal is logged (which takes it).
        let budget = self.shared.peers.lock().take(peer, Instant::now());
        if let Err(retry_after) = budget {
            let error = AuthError::RateLimited {
                peer: peer.to_string(),
                per_minute: self.per_minute,
                retry_after,
            };
            self.log_refusal(peer, Some(key), &error, true);
            return Err(error);
        }
        let outcome = {
            // Closed never: the semaphore lives as long as `shared`.
            let _permit = self.shared.in_flight.acquire().await;
            self.review(token).await
        };
        if let Err(error) = &outcome {
            self.log_refusal(peer, Some(key), error, false);
        }
        if outcome.as_ref().err().is_none_or(AuthError::is_verdict) {
            let mut verdicts = self.shared.verdicts.lock();
            if verdicts.len() >= CACHE_SWEEP_AT {
                let (ttl, refusal_ttl, now) = (self.ttl, self.refusal_ttl, SystemTime::now());
                verdicts.retain(|_, c| match &c.outcome {
                    Ok(identity) => c.at.elapsed() < ttl && identity.current(now),
                    Err(_) => c.at.elapsed() < refusal_ttl,
                });
            }
            verdicts.insert(
                key,
                Cached {
                    outcome: outcome.clone(),
                    at: Instant::now(),
                },
            );
        }
        outcome
    }

    /// Logs a refusal: at warning level once a minute per peer, or for a review just made,
    /// else at debug level, so a client repeating itself cannot flood the log.
    fn log_refusal(&self, peer: PeerKey, key: Option<TokenKey>, error: &AuthError, repeat: bool) {
        let warn = !repeat || self.shared.peers.lock().warn(peer, Instant::now());
        let token = key.map(|k| k.to_string()).unwrap_or_default();
        if warn {
            tracing::warn!(%peer, %token, %error, "agent stream refused");
        } else {
            tracing::debug!(%peer, %token, %error, "agent stream refused");
        }
    }

    async fn review(&self, token: &str) -> Outcome {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: self.audience.clone().map(|a| vec![a]),
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let error = status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".to_owned());
            return Err(match &self.audience {
                Some(audience) => AuthError::Rejected(format!(
                    "{error} (the coordinator accepts only tokens for audience {audience:?}: mount a projected ServiceAccount token with that audience in the agent pod and pass it with --coordinator-token-file)"
                )),
                None => AuthError::Rejected(error),
            });
        }
        // The API server answers with the requested audiences the token is valid for.
        if let Some(audience) = &self.audience
            && !status.audiences.iter().flatten().any(|a| a == audience)
        {
            return Err(AuthError::Rejected(format!(
                "the token is not issued for audience {audience:?}"
            )));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        if !self.allowed_users.iter().any(|u| u == &username) {
            return Err(AuthError::UserNotAllowed {
                user: username,
                allowed: self.allowed_users.join(", "),
            });
        }
        let node = user
            .extra
            .as_ref()
            .and_then(|extra| extra.get(NODE_NAME_EXTRA))
            .and_then(|v| v.first())
            .filter(|n| !n.is_empty())
            .cloned()
            .ok_or_else(|| AuthError::NotNodeBound {
                user: username.clone(),
            })?;
        // Reading `exp` without checking the signature is safe here: the API server has just
        // checked this very token (signature, issuer, audience, expiry, bound pod), so its
        // claims are the issuer's; and the claim is only used to end the stream sooner,
        // never to admit anything the review did not.
        let valid = match token_expiry(token) {
            Some(expiry) if expiry <= SystemTime::now() => return Err(AuthError::Expired),
            Some(expiry) => Validity::Until(expiry),
            None => Validity::ReviewAgainAfter(self.review_again),
        };
        Ok(Identity {
            username,
            node: Some(node),
            valid,
        })
    }
}

/// The `exp` claim of a JWT (seconds since the Unix epoch), without verifying it: only for
/// a token TokenReview has just accepted. `None` for anything else.
fn token_expiry(token: &str) -> Option<SystemTime> {
    use base64::Engine;
    #[derive(serde::Deserialize)]
    struct Claims {
        exp: Option<f64>,
    }
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let exp = serde_json::from_slice::<Claims>(&json).ok()?.exp?;
    if !exp.is_finite() || exp < 0.0 {
        return None;
    }
    // Past year 10,000 a claim says "never", which a review again covers.
    (exp < 253_402_300_800.0).then(|| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(exp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn jwt(claims: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.c2lnbmF0dXJl", b64(r#"{"alg":"RS256"}"#), b64(claims))
    }

    #[test]
    fn the_expiry_is_the_exp_claim_of_a_jwt_and_nothing_else() {
        assert_eq!(
            token_expiry(&jwt(r#"{"exp":1700000000,"sub":"x"}"#)),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(token_expiry(&jwt(r#"{"sub":"x"}"#)), None);
        assert_eq!(token_expiry(&jwt(r#"{"exp":"soon"}"#)), None);
        assert_eq!(token_expiry(&jwt(r#"{"exp":-1}"#)), None);
        assert_eq!(token_expiry(&jwt(r#"{"exp":1e300}"#)), None);
        assert_eq!(token_expiry("opaque-token"), None);
        assert_eq!(token_expiry("a.b.c.d"), None);
        assert_eq!(token_expiry("a.!!!.c"), None);
    }

    #[test]
    fn a_token_key_names_no_part_of_the_token() {
        let token = "secret-token-value";
        let key = TokenKey::of(token);
        assert_eq!(key, TokenKey::of(token));
        assert_ne!(key, TokenKey::of("secret-token-valuf"));
        let shown = format!("{key} {key:?}");
        assert!(
            shown.starts_with("sha256:") && !shown.contains("secret"),
            "{shown}"
        );
    }

    #[test]
    fn refusals_map_to_statuses_an_agent_can_act_on() {
        assert_eq!(
            AuthError::Expired.to_status().code(),
            tonic::Code::Unauthenticated
        );
        assert!(
            AuthError::Expired
                .to_string()
                .contains("token expired; reconnect with a fresh token")
        );
        let limited = AuthError::RateLimited {
            peer: "10.0.0.1".into(),
            per_minute: 10,
            retry_after: Duration::from_millis(5500),
        };
        assert_eq!(limited.to_status().code(), tonic::Code::ResourceExhausted);
        assert!(limited.to_string().contains("retry in 5 s"), "{limited}");
        assert!(!limited.is_verdict() && AuthError::Expired.is_verdict());
    }
}
