//! MIG isolation: where a new instance goes ([`planner`], pure; the profile tables and
//! placement geometry are hardware facts in [`crate::gpu::mig`]) and the instances made for
//! and removed after MIG pods ([`manager`]).

pub mod manager;
pub mod planner;

pub use manager::{MigConfig, MigError, MigManager};
