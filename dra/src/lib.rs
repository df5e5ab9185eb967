//! Dynamic Resource Allocation (`resource.k8s.io/v1`) for Tessera, pure: no I/O, no clocks, no
//! Kubernetes client. The scheduling core, the coordinator and the simulator share it.
//!
//! - [`api`]: the subset of the API objects the allocator reads, decoded from the API's JSON;
//! - [`quantity`]: exact Kubernetes quantities;
//! - [`pools`]: ResourceSlices assembled into the pools one node can use;
//! - [`selector`]: CEL device selectors, compiled once per expression and evaluated once per
//!   device and slice generation;
//! - [`allocator`]: finds devices for one or more claims on one node, or says why not.
//!
//! Feasibility follows `k8s.io/dynamic-resource-allocation/structured` of Kubernetes v1.37
//! with every feature of that release on (prioritized lists, partitionable devices, consumable
//! capacity with fractional ranges, device taints, admin access); device choice among
//! equivalent answers may differ.

pub mod allocator;
pub mod api;
mod capacity;
pub mod pools;
pub mod quantity;
pub mod selector;

pub use capacity::CapacityError;
pub use quantity::{Quantity, QuantityError};
