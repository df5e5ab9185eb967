//! The scheduling core's integration tests, one binary with a module per area: property
//! tests of its invariants (`core_props`, `core_constraint_props`), scenario tables
//! (`core_scenarios`, `core_constraints`), pending pods' messages (`core_messages`), fair-share
//! convergence (`core_fairness`), usage history (`core_usage`) and quotas per GPU model
//! (`core_gpu_models`).

mod core_constraint_props;
mod core_constraints;
mod core_fairness;
mod core_gpu_models;
mod core_messages;
mod core_props;
mod core_scenarios;
mod core_usage;
