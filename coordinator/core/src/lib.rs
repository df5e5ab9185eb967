//! Tessera's scheduling core and offline simulator.
//!
//! The core (`model`, `fairshare`, `placement`, `actions`, `cycle`) is pure: a snapshot
//! goes in, decisions come out; no I/O, no clocks, deterministic for a seed. `sim` drives
//! the core (and the published baseline policies) over traces and sample workloads.
//!
//! It lives in its own crate so that nothing Kubernetes- or network-facing can creep into
//! it (it has no such dependency to reach for), and so that it can be built optimised in
//! tests without paying for optimising the coordinator's Kubernetes code.

pub mod actions;
pub mod constraints;
pub mod cycle;
pub mod fairshare;
pub mod model;
pub mod placement;
pub mod sim;
