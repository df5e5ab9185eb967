//! The leader's write gate: a client whose writes reach the API server only while this
//! replica holds the Lease.
//!
//! The scheduling loop checks leadership before each batch of writes, but a batch (a gang's
//! Bindings, a cycle's status patches) takes time, and the Lease can be lost in the middle.
//! Every request through [`gated`] that is not a read is checked against the leadership
//! signal right before it is sent and refused locally, with [`NotLeading`], once this replica
//! no longer leads: a deposed leader issues no further writes, whichever writer it was in. The
//! elector has its own, ungated client (it must write the Lease to become leader).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use kube::client::Body;
use tokio::sync::watch;

/// A write refused because this replica does not hold the Lease; never sent.
#[derive(Debug, thiserror::Error)]
#[error("this replica no longer leads: {method} {path} not sent")]
pub struct NotLeading {
    /// The request's method.
    pub method: http::Method,
    /// The request's path.
    pub path: String,
}

impl NotLeading {
    /// Whether `error` is this refusal (as the kube client wraps it).
    pub fn is(error: &kube::Error) -> bool {
        match error {
            kube::Error::Service(e) => e.downcast_ref::<NotLeading>().is_some(),
            _ => false,
        }
    }
}

/// `client`, with its writes sent only while `leading` says true.
pub fn gated(client: kube::Client, leading: watch::Receiver<bool>) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    kube::Client::new(
        Gate {
            inner: client,
            leading,
        },
        namespace,
    )
}

#[derive(Clone)]
struct Gate {
    inner: kube::Client,
    leading: watch::Receiver<bool>,
}

impl tower::Service<http::Request<Body>> for Gate {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner client is made ready in `send`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let read = matches!(
            *req.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if !read && !*self.leading.borrow() {
            let refused = NotLeading {
                method: req.method().clone(),
                path: req.uri().path().to_owned(),
            };
            return Box::pin(async move { Err(kube::Error::Service(Box::new(refused))) });
        }
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(req).await })
    }
}
