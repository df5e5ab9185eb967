//! Tessera's scheduling core.
//!
//! The core (`model`, `fairshare`, `usage`, `placement`, `constraints`, `actions`, `cycle`) is
//! pure:
//! a snapshot goes in, decisions come out; no I/O, no clocks, deterministic for a seed. The
//! offline simulator that drives it over traces is the `tessera-sim` crate, which depends
//! on this one and never the other way round.
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
pub mod usage;
