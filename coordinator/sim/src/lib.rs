//! The offline simulator: openb and YAML inputs, the fill and replay drivers, the published
//! baseline policies, metrics, reports and plots. It drives `tessera-core`'s pure placement
//! code (and, for replay, the whole scheduling cycle) and never touches a cluster.
//!
//! It is its own crate so the core cannot come to depend on it (the core has no path to
//! trace readers, files or plots) and so the coordinator's binary is the only place the two
//! meet (`tessera-coordinator simulate`).
//!
//! - fill (the FGD paper's arrival-only experiment): [`openb`] reads the trace, [`trace`] builds
//!   the typical-shape mix and the arrival order, [`cluster`] holds the static inputs, [`fill`]
//!   places pods with a [`policy`], [`metrics`] averages the curves, [`experiment`] ties them
//!   together, [`report`] and [`plot`] print them.
//! - replay (time-based, through `cycle::schedule`): [`gpushape`] makes nodes of `hack/gpus` shapes,
//!   [`workload`] reads Tessera workload YAML, [`replay`] advances time, [`sample`] reports.

pub mod cluster;
pub mod experiment;
pub mod fill;
mod fill_index;
pub mod gpushape;
pub mod metrics;
pub mod openb;
pub mod plot;
pub mod policy;
pub mod replay;
pub mod report;
pub mod sample;
pub mod trace;
pub mod workload;
