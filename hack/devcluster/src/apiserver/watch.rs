//! Watch streams: newline-delimited JSON `WatchEvent`s over a chunked HTTP response.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::Shared;
use super::error::ApiError;
use super::resources::ResourceType;
use super::respond::{Rendering, render_one};
use super::selectors::Selectors;
use super::store::{Change, ChangeKind, WatchStart};

/// How long a watch lasts when the client names no `timeoutSeconds` (the upstream default
/// minimum request timeout).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Parameters of one watch request.
pub struct WatchRequest {
    /// The watched type.
    pub rt: Arc<ResourceType>,
    /// Version objects are presented in.
    pub version: String,
    /// Namespace filter.
    pub namespace: Option<String>,
    /// Label and field selectors.
    pub selectors: Selectors,
    /// Resume after this resourceVersion; `None` starts from the current state.
    pub from: Option<u64>,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: initial state, then a bookmark marking its end.
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// How objects are rendered (whole, one-row Tables for kubectl, metadata only).
    pub rendering: Rendering,
}

/// Starts the watch and returns the streaming response. A too-old resourceVersion yields a
/// 200 response carrying one ERROR event with a 410 `Status`, as the upstream watch cache does.
pub fn serve(shared: Arc<Shared>, req: WatchRequest) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let start = if req.send_initial_events {
        shared.store.watch(&req.rt, req.namespace.as_deref(), None)
    } else {
        shared
            .store
            .watch(&req.rt, req.namespace.as_deref(), req.from)
    };
    tokio::spawn(run(shared, req, start, tx));
    let stream = tokio_stream_from(rx);
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Bytes, Infallible>>,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn line(event_type: &str, object: Value) -> Result<Bytes, Infallible> {
    let mut bytes =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Ok(Bytes::from(bytes))
}

async fn run(
    shared: Arc<Shared>,
    req: WatchRequest,
    start: Result<WatchStart, ApiError>,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    let start = match start {
        Ok(start) => start,
        Err(err) => {
            let _ = tx.send(line("ERROR", err.status_object())).await;
            return;
        }
    };
    let WatchStart {
        initial,
        replay,
        covered_rv,
        mut live,
    } = start;
    let present = |obj: &Value| render_one(&req.rt, &req.version, obj.clone(), req.rendering);
    let bookmark = |rv: u64, initial_end: bool| {
        let mut md = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            md["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            json!({"kind": req.rt.kind, "apiVersion": req.rt.api_version(&req.version), "metadata": md}),
        )
    };
    for obj in initial.iter().filter(|o| req.selectors.matches(o)) {
        if tx.send(line("ADDED", present(obj))).await.is_err() {
            return;
        }
    }
    if req.send_initial_events
        && req.bookmarks
        && tx.send(bookmark(covered_rv, true)).await.is_err()
    {
        return;
    }
    for change in &replay {
        if let Some(event) = filter(change, &req.selectors)
            && tx.send(line(event, present(&change.object))).await.is_err()
        {
            return;
        }
    }
    let mut last_rv = covered_rv;
    let mut shutdown = shared.shutdown.clone();
    let deadline = tokio::time::sleep(req.timeout.unwrap_or(DEFAULT_TIMEOUT));
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(shared.config.bookmark_interval);
    ticker.tick().await;
    let key = req.rt.key();
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            _ = shutdown.changed() => return,
            _ = tx.closed() => return,
            _ = ticker.tick(), if req.bookmarks => {
                if tx.send(bookmark(last_rv, false)).await.is_err() {
                    return;
                }
            }
            received = live.recv() => match received {
                Ok(change) => {
                    if change.rv <= last_rv {
                        continue;
                    }
                    last_rv = change.rv;
                    let in_scope = change.key == key
                        && req.namespace.as_deref().is_none_or(|ns| ns == change.namespace);
                    if !in_scope {
                        continue;
                    }
                    if let Some(event) = filter(&change, &req.selectors)
                        && tx.send(line(event, present(&change.object))).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let gone = ApiError::gone(format!(
                        "watch fell behind the change stream at resourceVersion {last_rv}; relist"
                    ));
                    let _ = tx.send(line("ERROR", gone.status_object())).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// The event type a watcher with `selectors` sees for `change`, if any: an object that starts
/// matching appears as ADDED and one that stops matching as DELETED, as upstream does.
fn filter(change: &Change, selectors: &Selectors) -> Option<&'static str> {
    let now = selectors.matches(&change.object);
    match change.kind {
        ChangeKind::Modified => {
            let before = change.old.as_ref().is_some_and(|o| selectors.matches(o));
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
        kind => now.then_some(kind.as_str()),
    }
}
