//! The Tessera node agent as a library: the binary (`main.rs`) is a thin CLI over it,
//! and the end-to-end tests drive it in-process against a fake kubelet.

#![warn(missing_docs)]

pub mod admin;
pub mod agent;
pub mod assignments;
pub mod coordinator_pods;
pub mod enforce;
pub mod events;
pub mod gpu;
pub mod kube_assignments;
pub mod ledger;
pub mod metrics;
pub mod node;
pub mod plugin;
pub mod pod_table;
pub mod probe;
pub mod reconcile;
pub mod report;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod topology;
