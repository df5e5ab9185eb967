//! MIG isolation: the profile tables ([`profiles`]), where a new instance goes
//! ([`planner`], pure) and the instances made for and removed after MIG pods
//! ([`manager`]).

pub mod manager;
pub mod planner;
pub mod profiles;

pub use manager::{MigConfig, MigError, MigManager};
