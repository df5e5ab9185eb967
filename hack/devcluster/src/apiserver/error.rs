//! API errors rendered as Kubernetes `metav1.Status` objects.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A failed API request: the HTTP code, the machine-readable `reason` and a human message.
///
/// Rendered as a `Status` object so kube-rs and kubectl show the message and branch on the reason
/// exactly as they would against a real API server.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `Conflict`.
    pub reason: &'static str,
    /// Human-readable explanation.
    pub message: String,
    /// `Status.details`: name, group and kind of the object concerned, when known.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 404: the object `name` of `resource` (plural, e.g. `pods`) in `group` does not exist.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(name, group, resource)
    }

    /// 404 for a URL that names no known resource or endpoint.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource (path {path})"),
        )
    }

    /// 409: an object with this name already exists.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(name, group, resource)
    }

    /// 409: optimistic-concurrency failure or another conflicting state.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        )
        .with_details(name, group, resource)
    }

    /// 400: malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422: a well-formed object that fails validation.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 403: the request is understood but refused (e.g. an unknown PriorityClass).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 410: the requested resourceVersion is older than the retained history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 401: missing or unknown bearer token.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 405: the verb is not supported on this path.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({method} {path})"
            ),
        )
    }

    /// 415: unsupported patch or body content type.
    pub fn unsupported_media_type(content_type: &str, accepted: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type}); accepted media types include: {accepted}"
            ),
        )
    }

    /// 500: a server-side bug; never expected.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    fn with_details(mut self, name: &str, group: &str, resource: &str) -> Self {
        self.details = Some(json!({"name": name, "group": group, "kind": resource}));
        self
    }

    /// The `metav1.Status` body for this error.
    pub fn status_object(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        super::respond::json_response(code, &self.status_object())
    }
}

/// The `Status` object the server returns for a successful operation without an object body.
pub fn success_status(code: u16) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    })
}
