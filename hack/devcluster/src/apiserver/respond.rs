//! Response helpers: JSON bodies and presenting stored objects in the requested version.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::meta::ensure_map;
use super::resources::ResourceType;

/// A JSON response with `code`.
pub fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Sets `kind` and `apiVersion` so the object reads as `rt` in `version` (objects are stored
/// once and served in every version of their type without conversion).
pub fn present(rt: &ResourceType, version: &str, mut obj: Value) -> Value {
    let map = ensure_map(&mut obj);
    map.insert("kind".into(), Value::String(rt.kind.clone()));
    map.insert("apiVersion".into(), Value::String(rt.api_version(version)));
    obj
}

/// A `<Kind>List` of `items` at resourceVersion `rv`.
pub fn list_object(rt: &ResourceType, version: &str, items: Vec<Value>, rv: u64) -> Value {
    let items: Vec<Value> = items.into_iter().map(|o| present(rt, version, o)).collect();
    json!({
        "kind": format!("{}List", rt.kind),
        "apiVersion": rt.api_version(version),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })
}

/// The form the client asked for in its Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    /// Whole objects.
    Full,
    /// A `meta.k8s.io/v1` Table (kubectl); `include_object` embeds whole objects in rows.
    Table {
        /// `includeObject=Object`.
        include_object: bool,
    },
    /// `PartialObjectMetadata` (metadata-only clients and watchers).
    Metadata,
}

impl Rendering {
    /// Picks the rendering from the Accept header and query; kinds without a server-side
    /// table fall back to whole objects, which kubectl prints itself.
    pub fn negotiate(rt: &ResourceType, accept: &str, include_object: Option<&str>) -> Self {
        if accept.contains("as=PartialObjectMetadata") {
            Self::Metadata
        } else if super::table::wanted(accept) && super::table::supported(rt) {
            Self::Table {
                include_object: include_object == Some("Object"),
            }
        } else {
            Self::Full
        }
    }
}

fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// One stored object in the requested rendering.
pub fn render_one(rt: &ResourceType, version: &str, obj: Value, rendering: Rendering) -> Value {
    let obj = present(rt, version, obj);
    match rendering {
        Rendering::Full => obj,
        Rendering::Metadata => partial(&obj),
        Rendering::Table { include_object } => {
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            super::table::table(rt, &[obj], rv, include_object)
        }
    }
}

/// A list of stored objects at resourceVersion `rv` in the requested rendering.
pub fn render_list(
    rt: &ResourceType,
    version: &str,
    items: Vec<Value>,
    rv: u64,
    rendering: Rendering,
) -> Value {
    match rendering {
        Rendering::Full => list_object(rt, version, items, rv),
        Rendering::Metadata => {
            let items: Vec<Value> = items
                .into_iter()
                .map(|o| partial(&present(rt, version, o)))
                .collect();
            json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": rv.to_string()},
                "items": items,
            })
        }
        Rendering::Table { include_object } => {
            let items: Vec<Value> = items.into_iter().map(|o| present(rt, version, o)).collect();
            super::table::table(rt, &items, rv, include_object)
        }
    }
}
