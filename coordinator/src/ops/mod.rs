//! Operations: the Prometheus [`Metrics`] the runtime records into and the HTTP server
//! (`/metrics`, `/healthz`, `/readyz`, port 9090 by default). Logs are crate `tessera-logs`'s,
//! shared with the agent.
//!
//! Depends on nothing else of the coordinator; the runtime feeds it.

pub mod http;
pub mod metrics;

pub use http::serve;
pub use metrics::{Metrics, QueueSample};
