//! A fault-injecting HTTP proxy in front of the real API server, on a real TCP socket, for the
//! failures the server will not produce on demand: throttling (429), an answer that never
//! comes in time, a connection broken after the write went through, and races (another
//! writer acting just before a Binding reaches the server).
//!
//! Clients from [`FaultProxy::client`] speak plain HTTP to the proxy; the proxy forwards each
//! request through an admin client (TLS and credentials), streaming answers so watches work.
//! Faults apply to `POST .../pods/<name>/binding`, once each: by pod name, or to the Nth
//! Binding from now on (the order in which a unit's members are bound is not fixed); and
//! throttling to the next evictions (`POST .../pods/<name>/eviction`), whatever their pod.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Something run against the API server, with the admin client and the pod's name, just
/// before that pod's Binding is forwarded.
pub(crate) type Action = Arc<dyn Fn(kube::Client, String) -> BoxFuture<'static, ()> + Send + Sync>;

/// What the proxy does to one Binding.
#[derive(Clone)]
pub(crate) enum Fault {
    /// Answers 429 as API Priority and Fairness does (no causes, a retry-after) and forwards
    /// nothing: the pod is not bound.
    Throttle,
    /// Holds the request for this long, then forwards it: a client that gave up earlier
    /// sees no answer, and the bind lands late.
    Delay(Duration),
    /// Forwards the request (the pod is bound) and closes the connection without an answer.
    DropAnswer,
    /// Closes the connection without forwarding the request or answering it.
    DropRequest,
    /// Runs the action, then forwards: the real server answers the Binding.
    Before(Action),
}

#[derive(Default)]
struct Shared {
    faults: BTreeMap<String, Fault>,
    /// Bindings still to let through before `nth`'s fault applies.
    nth: Option<(usize, Fault)>,
    /// Every Binding's pod name in the order the proxy received them.
    bindings: Vec<String>,
    /// Faults for the next evictions, in order.
    eviction_faults: std::collections::VecDeque<Fault>,
    /// Every eviction's pod name in the order the proxy received them.
    evictions: Vec<String>,
    /// Every request's method and path, in order.
    requests: Vec<(http::Method, String)>,
}

/// The proxy; stops when dropped.
pub(crate) struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    task: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Listens on a free local port and forwards to `upstream`.
    pub(crate) async fn start(upstream: kube::Client) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Mutex::new(Shared::default()));
        let state = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let upstream = upstream.clone();
                let state = state.clone();
                tokio::spawn(async move {
                    let service =
                        service_fn(move |req| handle(upstream.clone(), state.clone(), req));
                    // An injected broken connection ends here with an error; nothing to do.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, shared, task }
    }

    /// A client through the proxy, with the coordinator's settings (no client retries).
    pub(crate) fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("proxy URL");
        let mut config = kube::Config::new(url);
        config.default_namespace = "default".into();
        config.default_retry = false;
        kube::Client::try_from(config).expect("a client for the proxy")
    }

    /// Applies `fault` to the next Binding of pod `name`.
    pub(crate) fn on_binding(&self, name: &str, fault: Fault) {
        self.shared.lock().faults.insert(name.to_owned(), fault);
    }

    /// Applies `fault` to the `n`th Binding (1-based) the proxy receives from now on, whatever
    /// its pod.
    pub(crate) fn on_nth_binding(&self, n: usize, fault: Fault) {
        self.shared.lock().nth = Some((n.saturating_sub(1), fault));
    }

    /// Answers the next `n` evictions, of any pod, with 429 as API Priority and Fairness does.
    pub(crate) fn throttle_evictions(&self, n: usize) {
        self.on_next_evictions(n, Fault::Throttle);
    }

    /// Applies `fault` to each of the next `n` evictions, of any pod.
    pub(crate) fn on_next_evictions(&self, n: usize, fault: Fault) {
        self.shared.lock().eviction_faults = std::iter::repeat_n(fault, n).collect();
    }

    /// The pods whose eviction the proxy received (throttled ones included), in order.
    pub(crate) fn evictions(&self) -> Vec<String> {
        self.shared.lock().evictions.clone()
    }

    /// Every request's method and path the proxy received, in order.
    pub(crate) fn requests(&self) -> Vec<(http::Method, String)> {
        self.shared.lock().requests.clone()
    }

    /// A counter of the requests received so far, for use inside a fault.
    pub(crate) fn request_counter(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.lock().requests.len()
    }

    /// The pods whose Binding the proxy received, in order.
    pub(crate) fn bindings(&self) -> Vec<String> {
        self.shared.lock().bindings.clone()
    }
}

/// The pod name of `POST /api/v1/namespaces/<ns>/pods/<name>/<subresource>`.
fn posted_to(req: &http::Request<Incoming>, subresource: &str) -> Option<String> {
    if req.method() != http::Method::POST {
        return None;
    }
    let rest = req.uri().path().strip_prefix("/api/v1/namespaces/")?;
    let mut parts = rest.split('/');
    let (_, pods, name, sub) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    (pods == "pods" && sub == subresource && parts.next().is_none()).then(|| name.to_owned())
}

async fn handle(
    upstream: kube::Client,
    shared: Arc<Mutex<Shared>>,
    req: http::Request<Incoming>,
) -> Result<http::Response<Body>, std::io::Error> {
    shared
        .lock()
        .requests
        .push((req.method().clone(), req.uri().path().to_owned()));
    let pod = posted_to(&req, "binding");
    let eviction_fault = posted_to(&req, "eviction").and_then(|name| {
        let mut s = shared.lock();
        s.evictions.push(name);
        s.eviction_faults.pop_front()
    });
    let fault = if eviction_fault.is_some() {
        eviction_fault
    } else {
        pod.clone().and_then(|name| {
            let mut s = shared.lock();
            s.bindings.push(name.clone());
            if let Some(fault) = s.faults.remove(&name) {
                return Some(fault);
            }
            match s.nth.take() {
                Some((0, fault)) => Some(fault),
                Some((n, fault)) => {
                    s.nth = Some((n - 1, fault));
                    None
                }
                None => None,
            }
        })
    };
    if let Some(Fault::Throttle) = fault {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "Too many requests, please try again later.",
            "reason": "TooManyRequests", "details": {"retryAfterSeconds": 1}, "code": 429});
        let answer = http::Response::builder()
            .status(429)
            .header("content-type", "application/json")
            .header("retry-after", "1")
            .body(Body::from(
                serde_json::to_vec(&status).expect("a JSON status"),
            ))
            .expect("a response");
        return Ok(answer);
    }
    if let Some(Fault::DropRequest) = fault {
        return Err(std::io::Error::other(
            "injected: connection closed before the request was forwarded",
        ));
    }
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let mut forward = http::Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        if name != http::header::HOST && name != http::header::AUTHORIZATION {
            forward = forward.header(name, value);
        }
    }
    let forward = forward.body(Body::from(bytes)).expect("a request");
    if let Some(Fault::Before(action)) = &fault {
        action(upstream.clone(), pod.unwrap_or_default()).await;
    }
    let delay = match &fault {
        Some(Fault::Delay(d)) => *d,
        _ => Duration::ZERO,
    };
    // On a task of its own: a server goes on with a request whose client hung up, and hyper
    // drops this handler when the connection closes.
    let send = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        upstream.send(forward).await
    });
    let answer = send
        .await
        .map_err(std::io::Error::other)?
        .map_err(std::io::Error::other)?;
    if let Some(Fault::DropAnswer) = fault {
        // Wait until the server's answer is complete (the write went through), then break the
        // connection: hyper closes it when the service fails.
        let _ = answer.into_body().collect().await;
        return Err(std::io::Error::other(
            "injected: connection closed before the answer",
        ));
    }
    Ok(answer)
}
