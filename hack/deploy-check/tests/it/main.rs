//! The deployment checks, one binary with a module per area: the chart through the real helm
//! and API server, RBAC, admission, metrics and the examples. `common` is the shared harness.

mod common;

mod admission;
mod chart;
mod examples;
mod metrics;
mod rbac;
