//! Tessera coordinator library: the coordinator in the cluster around the scheduling core.
//!
//! The pure core is `tessera-core` and the simulator `tessera-sim`, used here under their
//! own names (`tessera_core::cycle`, ...) so the crate boundary shows at every use.
//! This crate adds what talks to the world: the CRDs (`crd`), the translation of
//! Kubernetes objects into a core snapshot (`translate`), the agents' gRPC service
//! (`agents`), the running scheduler (`cluster`), its operations surface (`ops`), the
//! admission webhook that routes GPU pods to it (`webhook`) and `migrate`, which prints
//! another scheduler's objects as Tessera's.

pub mod agents;
pub mod cluster;
pub mod crd;
pub mod migrate;
pub mod ops;
pub mod tls;
pub mod translate;
pub mod webhook;
