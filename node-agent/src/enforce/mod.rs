//! Enforcement building blocks. So far: finding which pod a GPU process belongs to
//! ([`cgroup`]) and summing the backend's per-process readings per pod ([`usage`]).
//! Nothing here acts on a process yet; the watchdog that will is a later piece.

pub mod cgroup;
pub mod usage;
