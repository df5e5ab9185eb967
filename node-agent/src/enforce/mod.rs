//! Enforcement: finding which pod a GPU process belongs to ([`cgroup`]), summing the
//! backend's per-process readings per pod ([`usage`]), and the watchdog that holds pods
//! to their limits ([`watchdog`]): memory through [`memory`] (warn, then kill), compute
//! through [`controller`] (targets and feedback) and [`throttle`] (duty-cycling with
//! [`signals`]); what it decided per pod is published on the [`state`] board. A pod's
//! limits come from the ledger ([`limits`]), its mode from [`isolation`].

pub mod cgroup;
pub mod controller;
pub mod limits;
pub mod memory;
pub mod mig;
pub mod mps;
pub mod signals;
pub mod state;
pub mod throttle;
pub mod usage;
pub mod watchdog;
