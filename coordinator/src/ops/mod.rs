//! Operations: the Prometheus [`Metrics`] the runtime records into, the HTTP server
//! (`/metrics`, `/healthz`, `/readyz`, port 9090 by default) and structured logs.
//!
//! Depends on nothing else of the coordinator; the runtime feeds it.

pub mod http;
pub mod logs;
pub mod metrics;

pub use http::serve;
pub use metrics::{Metrics, QueueSample};
