//! An optional request audit log: who asked for what (user, verb, API group, resource,
//! subresource, namespace, name) and what the answer was. Off by default so a long-running
//! `up` does not grow; tests turn it on to derive the RBAC rules each component needs from
//! the requests it really makes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::{HeaderMap, Method, Uri};
use parking_lot::Mutex;

use super::Shared;
use super::handlers::bearer_token;
use super::routes::Route;

/// One request, in the terms RBAC rules are written in.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    /// The user the bearer token stands for; `system:anonymous` without a known token.
    pub user: String,
    /// The Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// API group ("" for core); empty for non-resource paths.
    pub api_group: String,
    /// Resource plural; empty for non-resource paths (discovery, `/version`, health).
    pub resource: String,
    /// Subresource (`status`, `binding`, `eviction`), if any.
    pub subresource: Option<String>,
    /// Namespace of the request, if namespaced.
    pub namespace: Option<String>,
    /// Object name, if the request names one.
    pub name: Option<String>,
    /// The URL path, for non-resource requests and messages.
    pub path: String,
    /// HTTP status of the answer.
    pub status: u16,
}

#[derive(Default)]
struct Inner {
    enabled: AtomicBool,
    records: Mutex<Vec<AuditRecord>>,
}

/// The log; clones share it.
#[derive(Clone, Default)]
pub struct AuditLog(Arc<Inner>);

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("enabled", &self.is_enabled())
            .field("records", &self.0.records.lock().len())
            .finish()
    }
}

impl AuditLog {
    /// Starts recording requests.
    pub fn enable(&self) {
        self.0.enabled.store(true, Ordering::SeqCst);
    }

    /// Stops recording (what was recorded stays).
    pub fn disable(&self) {
        self.0.enabled.store(false, Ordering::SeqCst);
    }

    /// Whether requests are being recorded.
    pub fn is_enabled(&self) -> bool {
        self.0.enabled.load(Ordering::SeqCst)
    }

    /// Everything recorded so far, in arrival order of the answers.
    pub fn records(&self) -> Vec<AuditRecord> {
        self.0.records.lock().clone()
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        self.0.records.lock().clear();
    }

    pub(super) fn push(&self, record: AuditRecord) {
        if self.is_enabled() {
            self.0.records.lock().push(record);
        }
    }
}

/// Describes a request before it is answered (`None` when the log is off); the status is
/// filled in by [`finish`].
pub(super) fn describe(
    shared: &Shared,
    method: &Method,
    uri: &Uri,
    route: &Route,
    headers: &HeaderMap,
) -> Option<AuditRecord> {
    if !shared.audit.is_enabled() {
        return None;
    }
    let token = bearer_token(headers);
    let user = shared
        .config
        .tokens
        .iter()
        .find(|t| Some(t.token.as_str()) == token)
        .map_or_else(|| "system:anonymous".to_string(), |t| t.user.clone());
    let watching = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let mut record = AuditRecord {
        user,
        verb: String::new(),
        api_group: String::new(),
        resource: String::new(),
        subresource: None,
        namespace: None,
        name: None,
        path: uri.path().to_string(),
        status: 0,
    };
    let named = match route {
        Route::Resource(p) => {
            record.api_group = p.group.clone();
            record.resource = p.plural.clone();
            record.subresource = p.sub.clone();
            record.namespace = p.namespace.clone();
            record.name = p.name.clone();
            p.name.is_some()
        }
        _ => true,
    };
    let is_watch = watching || matches!(route, Route::Resource(p) if p.watch_prefix);
    record.verb = match *method {
        Method::GET if is_watch => "watch",
        Method::GET | Method::HEAD if named => "get",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
    .to_string();
    Some(record)
}

/// Records the request with the status it was answered with.
pub(super) fn finish(shared: &Shared, record: Option<AuditRecord>, status: u16) {
    if let Some(mut record) = record {
        record.status = status;
        shared.audit.push(record);
    }
}
