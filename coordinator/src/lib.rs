//! Tessera coordinator library: the pure scheduling core and the offline simulator.
//!
//! The scheduling core (`model`, `fairshare`, `placement`, `actions`, `cycle`) is pure:
//! a snapshot goes in, decisions come out; no I/O, no clocks, deterministic for a seed.
//! `sim` drives the core (and the published baseline policies) over traces.

pub mod actions;
pub mod agents;
pub mod cluster;
pub mod crd;
pub mod cycle;
pub mod fairshare;
pub mod model;
pub mod ops;
pub mod placement;
pub mod sim;
pub mod translate;
