//! Who is on the other end of an agent stream: the agent's ServiceAccount token, checked
//! through a Kubernetes TokenReview, must belong to an allowed user and be bound to the
//! node the agent reports for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;

/// The username of the agent DaemonSet's ServiceAccount.
pub const DEFAULT_AGENT_USER: &str = "system:serviceaccount:tessera-system:tessera-agent";

/// The TokenReview `user.extra` key naming the node a bound ServiceAccount token's pod
/// runs on.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// How long a positive review is reused before asking the API server again.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(30);

/// Cached reviews beyond this count trigger a sweep of the expired ones.
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

    /// Checks the `authorization` value of a stream.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Identity, AuthError> {
        match self {
            Self::Disabled => Ok(Identity::anonymous()),
            Self::TokenReview(auth) => auth.authenticate(authorization).await,
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
}

impl Identity {
    /// The identity of every caller when authentication is disabled.
    pub fn anonymous() -> Self {
        Self {
            username: String::new(),
            node: None,
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
}

impl AuthError {
    /// The gRPC status to answer with.
    pub fn to_status(&self) -> tonic::Status {
        match self {
            Self::MissingToken | Self::Rejected(_) => {
                tonic::Status::unauthenticated(self.to_string())
            }
            Self::Unavailable(_) => tonic::Status::unavailable(self.to_string()),
            _ => tonic::Status::permission_denied(self.to_string()),
        }
    }
}

/// TokenReview-backed authentication with a short cache of positive reviews.
#[derive(Clone)]
pub struct TokenReviewAuth {
    client: kube::Client,
    allowed_users: Arc<Vec<String>>,
    /// The audience tokens must be issued for; `None`: the API server's.
    audience: Option<String>,
    ttl: Duration,
    cache: Arc<Mutex<HashMap<String, (Identity, Instant)>>>,
}

impl std::fmt::Debug for TokenReviewAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuth")
            .field("allowed_users", &self.allowed_users)
            .field("audience", &self.audience)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl TokenReviewAuth {
    /// Reviews through `client`; positive results are reused for `ttl`.
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
            cache: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Accepts only tokens for `audience` (see [`Authenticator::with_audience`]).
    pub fn audience(mut self, audience: Option<String>) -> Self {
        self.audience = audience.filter(|a| !a.trim().is_empty());
        self
    }

    /// Checks an `authorization` metadata value (`Bearer <token>`).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Identity, AuthError> {
        let token = authorization
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::MissingToken)?;
        if let Some((identity, at)) = self.cache.lock().get(token)
            && at.elapsed() < self.ttl
        {
            return Ok(identity.clone());
        }
        let identity = self.review(token).await?;
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_SWEEP_AT {
            let ttl = self.ttl;
            cache.retain(|_, (_, at)| at.elapsed() < ttl);
        }
        cache.insert(token.to_owned(), (identity.clone(), Instant::now()));
        Ok(identity)
    }

    async fn review(&self, token: &str) -> Result<Identity, AuthError> {
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
        Ok(Identity {
            username,
            node: Some(node),
        })
    }
}
