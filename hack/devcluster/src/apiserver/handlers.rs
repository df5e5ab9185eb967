//! Request dispatch: authentication, routing, and the verbs on resources and subresources.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::Shared;
use super::audit;
use super::discovery;
use super::error::{ApiError, success_status};
use super::meta;
use super::openapi;
use super::resources::{ResourceType, Special};
use super::respond::{Rendering, json_response, list_object, present, render_list, render_one};
use super::reviews::{self_subject_review, token_review};
use super::routes::{self, ResourcePath, Route};
use super::selectors::{FieldSelector, LabelSelector, Selectors};
use super::store::Preconditions;
use super::watch::{self, WatchRequest};
use super::writes::Ctx;

/// Largest accepted request body.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// The one axum handler: every path goes through here.
pub async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let headers = req.headers().clone();
    let route = routes::parse(uri.path());
    let audited = audit::describe(&shared, &method, &uri, &route, &headers);
    let response = dispatch(shared.clone(), method, uri, headers, route, req).await;
    audit::finish(&shared, audited, response.status().as_u16());
    response
}

async fn dispatch(
    shared: Arc<Shared>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    route: Route,
    req: Request,
) -> Response {
    if route != Route::Health
        && let Err(err) = authenticate(&shared, &headers)
    {
        return err.into_response();
    }
    let query: HashMap<String, String> = match Query::try_from_uri(&uri) {
        Ok(Query(q)) => q,
        Err(e) => {
            return ApiError::bad_request(format!("invalid query string: {e}")).into_response();
        }
    };
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(e) => {
            return ApiError::bad_request(format!("cannot read request body: {e}")).into_response();
        }
    };
    // Only JSON bodies (and YAML for apply patches) are understood; protobuf and CBOR get a
    // clear 415 instead of a JSON parse error.
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !body.is_empty() && (content_type.contains("protobuf") || content_type.contains("cbor")) {
        return ApiError::unsupported_media_type(
            content_type,
            "application/json (the development API server speaks JSON only: use `kubectl apply -f` or `kubectl create -f` rather than kubectl's typed generators such as `kubectl create namespace`)",
        )
        .into_response();
    }
    let result = match route {
        Route::Resource(path) => resource(&shared, &method, path, &query, &headers, &body).await,
        other if method != Method::GET => {
            let _ = other;
            Err(ApiError::method_not_allowed(method.as_str(), uri.path()))
        }
        Route::Health => Ok(plain_ok()),
        Route::Version => Ok(ok(discovery::version())),
        Route::CoreVersions => {
            let address = shared.address.trim_start_matches("http://").to_string();
            Ok(ok(discovery::core_versions(&address)))
        }
        Route::Groups => Ok(ok(discovery::group_list(&shared.store.registry()))),
        Route::Group(group) => discovery::group(&shared.store.registry(), &group)
            .map(ok)
            .ok_or_else(|| ApiError::no_route(uri.path())),
        Route::Resources { group, version } => {
            discovery::resource_list(&shared.store.registry(), &group, &version)
                .map(ok)
                .ok_or_else(|| ApiError::no_route(uri.path()))
        }
        Route::OpenApiIndex => Ok(ok(openapi::index(&shared.store.registry()))),
        Route::OpenApiGroupVersion { group, version } => {
            openapi::group_version(&shared.store.registry(), &group, &version)
                .map(ok)
                .ok_or_else(|| ApiError::no_route(uri.path()))
        }
        Route::Unknown => Err(ApiError::no_route(uri.path())),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

pub(super) fn ok(body: Value) -> Response {
    json_response(StatusCode::OK, &body)
}

pub(super) fn created(body: Value) -> Response {
    json_response(StatusCode::CREATED, &body)
}

fn plain_ok() -> Response {
    Response::new(axum::body::Body::from("ok"))
}

fn authenticate(shared: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    if !shared.config.require_auth {
        return Ok(());
    }
    match bearer_token(headers) {
        Some(token) if shared.config.tokens.iter().any(|t| t.token == token) => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

pub(super) fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

pub(super) fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn selectors(query: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    Ok(Selectors { labels, fields })
}

fn flag(query: &HashMap<String, String>, name: &str) -> bool {
    matches!(query.get(name).map(String::as_str), Some("true" | "1"))
}

/// Everything under a group version: the resource verbs.
async fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    path: ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let full_path = format!("{}/{}", path.group, path.plural);
    let rt = shared
        .store
        .lookup(&path.group, &path.version, &path.plural)
        .ok_or_else(|| ApiError::no_route(&full_path))?;
    if !rt.namespaced && path.namespace.is_some() {
        return Err(ApiError::no_route(&full_path));
    }
    if query.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the development API server; drop --dry-run=server",
        ));
    }
    let ns = path.namespace.clone().unwrap_or_default();
    let version = path.version.as_str();
    let ctx = Ctx {
        shared,
        rt: &rt,
        version,
        ns: &ns,
    };
    let Some(name) = path.name.as_deref() else {
        return match *method {
            Method::GET if path.watch_prefix || flag(query, "watch") => watch_collection(
                shared,
                &rt,
                version,
                path.namespace,
                query,
                rendering(&rt, headers, query),
            ),
            Method::GET => {
                let (items, rv) =
                    shared
                        .store
                        .list(&rt, path.namespace.as_deref(), &selectors(query)?);
                let rendering = rendering(&rt, headers, query);
                Ok(ok(render_list(&rt, version, items, rv, rendering)))
            }
            Method::POST if rt.special == Special::SelfSubjectReview => {
                Ok(created(self_subject_review(shared, headers)))
            }
            Method::POST if rt.special == Special::TokenReview => {
                Ok(created(token_review(shared, parse_json(body)?)))
            }
            Method::POST if rt.namespaced && path.namespace.is_none() => {
                Err(ApiError::method_not_allowed("POST", &full_path))
            }
            Method::POST => ctx.create(parse_json(body)?).map(created),
            Method::DELETE => {
                let sel = selectors(query)?;
                let (items, rv) = shared.store.list(&rt, path.namespace.as_deref(), &sel);
                let mut deleted = Vec::new();
                for item in items {
                    let item_ns = meta::meta_str(&item, "namespace").to_string();
                    let item_name = meta::meta_str(&item, "name").to_string();
                    if let Ok(gone) =
                        shared
                            .store
                            .delete(&rt, &item_ns, &item_name, &Preconditions::default())
                    {
                        deleted.push(gone);
                    }
                }
                Ok(ok(list_object(&rt, version, deleted, rv)))
            }
            _ => Err(ApiError::method_not_allowed(method.as_str(), &full_path)),
        };
    };
    if rt.namespaced && path.namespace.is_none() {
        return Err(ApiError::no_route(&format!("{full_path}/{name}")));
    }
    let sub = path.sub.as_deref();
    if *method == Method::GET && sub.is_none() && (path.watch_prefix || flag(query, "watch")) {
        // Watching one object is watching the collection narrowed to its name.
        let mut narrowed = query.clone();
        let by_name = format!("metadata.name={name}");
        let fields = match query.get("fieldSelector").filter(|f| !f.is_empty()) {
            Some(existing) => format!("{existing},{by_name}"),
            None => by_name,
        };
        narrowed.insert("fieldSelector".into(), fields);
        let rendering = rendering(&rt, headers, query);
        return watch_collection(shared, &rt, version, path.namespace, &narrowed, rendering);
    }
    let is_pod = rt.special == Special::Pod;
    match (method.clone(), sub) {
        (Method::GET, None) => {
            let obj = shared.store.get(&rt, &ns, name)?;
            Ok(ok(render_one(
                &rt,
                version,
                obj,
                rendering(&rt, headers, query),
            )))
        }
        (Method::GET, Some("status")) if rt.status_subresource => {
            Ok(ok(present(&rt, version, shared.store.get(&rt, &ns, name)?)))
        }
        (Method::PUT, None) => ctx.replace(name, parse_json(body)?, false).map(ok),
        (Method::PUT, Some("status")) if rt.status_subresource => {
            ctx.replace(name, parse_json(body)?, true).map(ok)
        }
        (Method::PATCH, None) => ctx.patch(name, headers, body, false),
        (Method::PATCH, Some("status")) if rt.status_subresource => {
            ctx.patch(name, headers, body, true)
        }
        (Method::DELETE, None) => {
            let pre = preconditions(body)?;
            Ok(ok(present(
                &rt,
                version,
                shared.store.delete(&rt, &ns, name, &pre)?,
            )))
        }
        (Method::POST, Some("binding")) if is_pod => ctx.bind(name, parse_json(body)?),
        (Method::POST, Some("eviction")) if is_pod => {
            shared
                .store
                .delete(&rt, &ns, name, &Preconditions::default())?;
            Ok(created(success_status(201)))
        }
        (_, None) | (_, Some("status" | "binding" | "eviction")) if known_sub(&rt, sub) => Err(
            ApiError::method_not_allowed(method.as_str(), &format!("{full_path}/{name}")),
        ),
        _ => Err(ApiError::no_route(&format!(
            "{full_path}/{name}/{}",
            sub.unwrap_or("")
        ))),
    }
}

fn known_sub(rt: &ResourceType, sub: Option<&str>) -> bool {
    match sub {
        None => true,
        Some("status") => rt.status_subresource,
        Some("binding" | "eviction") => rt.special == Special::Pod,
        Some(_) => false,
    }
}

fn watch_collection(
    shared: &Arc<Shared>,
    rt: &Arc<ResourceType>,
    version: &str,
    namespace: Option<String>,
    query: &HashMap<String, String>,
    rendering: Rendering,
) -> Result<Response, ApiError> {
    let from = meta::parse_rv(query.get("resourceVersion").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?
        .filter(|rv| *rv != 0);
    let timeout = match query.get("timeoutSeconds") {
        None => None,
        Some(s) => Some(Duration::from_secs(s.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "timeoutSeconds {s:?} must be a whole number of seconds"
            ))
        })?)),
    };
    Ok(watch::serve(
        shared.clone(),
        WatchRequest {
            rt: rt.clone(),
            version: version.to_string(),
            namespace,
            selectors: selectors(query)?,
            from,
            bookmarks: flag(query, "allowWatchBookmarks"),
            send_initial_events: flag(query, "sendInitialEvents"),
            timeout,
            rendering,
        },
    ))
}

fn preconditions(body: &[u8]) -> Result<Preconditions, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Preconditions::default());
    }
    let options = parse_json(body)?;
    let text = |p: &str| {
        options
            .pointer(p)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(Preconditions {
        uid: text("/preconditions/uid"),
        resource_version: text("/preconditions/resourceVersion"),
    })
}

/// The rendering the client asked for.
fn rendering(rt: &ResourceType, headers: &HeaderMap, query: &HashMap<String, String>) -> Rendering {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    Rendering::negotiate(rt, accept, query.get("includeObject").map(String::as_str))
}
