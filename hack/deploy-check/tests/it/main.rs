//! The deployment checks, one binary with a module per area: the chart through the real helm
//! and API server, RBAC, admission (Pod Security, the protected keys), metrics and the
//! examples. `common` is the shared harness.

mod common;

mod admission;
mod chart;
mod examples;
mod metrics;
mod protected_keys;
mod rbac;
