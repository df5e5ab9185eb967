//! TokenReview and SelfSubjectReview: create-only kinds answered from the configured tokens
//! and never stored.

use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::Shared;
use super::handlers::bearer_token;
use super::meta::{self, ensure_map};

/// Answers a TokenReview from the configured tokens.
pub(super) fn token_review(shared: &Shared, mut review: Value) -> Value {
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("");
    let status = match shared.config.tokens.iter().find(|t| t.token == token) {
        Some(t) => json!({
            "authenticated": true,
            "user": {"username": t.user, "uid": t.user, "groups": t.groups, "extra": t.extra},
        }),
        None => json!({"authenticated": false, "error": "token not recognised"}),
    };
    let map = ensure_map(&mut review);
    map.insert("kind".into(), json!("TokenReview"));
    map.insert("apiVersion".into(), json!("authentication.k8s.io/v1"));
    map.insert("status".into(), status);
    review
}

/// Tells the caller who the server thinks it is (`kubectl auth whoami`).
pub(super) fn self_subject_review(shared: &Shared, headers: &HeaderMap) -> Value {
    let token = bearer_token(headers);
    let (user, groups) = match shared
        .config
        .tokens
        .iter()
        .find(|t| Some(t.token.as_str()) == token)
    {
        Some(t) => (t.user.clone(), t.groups.clone()),
        None => (
            "system:anonymous".to_string(),
            vec!["system:unauthenticated".to_string()],
        ),
    };
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
        "metadata": {"creationTimestamp": meta::now_rfc3339()},
        "status": {"userInfo": {"username": user, "groups": groups}},
    })
}
