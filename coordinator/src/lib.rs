//! Tessera coordinator library: the coordinator in the cluster around the scheduling core.
//!
//! The pure core and the simulator live in `tessera-core` and are re-exported here under
//! their usual names, so `tessera_coordinator::model` and `crate::model` keep working.
//! This crate adds what talks to the world: the CRDs (`crd`), the translation of
//! Kubernetes objects into a core snapshot (`translate`), the agents' gRPC service
//! (`agents`), the running scheduler (`cluster`), its operations surface (`ops`) and the
//! admission webhook that routes GPU pods to it (`webhook`).

pub use tessera_core::{actions, cycle, fairshare, model, placement, sim};

pub mod agents;
pub mod cluster;
pub mod crd;
pub mod ops;
pub mod tls;
pub mod translate;
pub mod webhook;
