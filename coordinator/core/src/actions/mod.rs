//! Scheduling actions (allocate, reclaim, preempt, consolidate, stale-gang), all through one
//! tentative statement so every action composes.
//!
//! Order in a cycle: stale-gang (frees capacity of broken gangs), allocate (free capacity only,
//! fair-share order), consolidate (moves, non-destructive), reclaim (across queues, towards
//! fair share), preempt (inside a queue, by priority).

mod allocate;
mod budgets;
mod context;
mod engine;
mod explain;
mod jobs;
mod stale_gang;
mod statement;
mod victims;

pub use allocate::Mode;
pub use budgets::Budgets;
pub use context::{Ctx, GroupInfo, PodInfo};
pub use engine::{Engine, UsageState};
pub use jobs::Job;
pub use statement::{Placed, State};
