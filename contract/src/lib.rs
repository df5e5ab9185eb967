//! The contract between Tessera's coordinator and its node agents, and the names users
//! write: one definition, compiled into both sides (and the test harnesses), so the
//! coordinator cannot write an assignment the agent reads differently.
//!
//! - [`keys`]: label, annotation and resource names (SPEC.md's user contract).
//! - [`assignment`]: the `tessera.dev/assignment` JSON and its validation.
//! - [`isolation`]: the `tessera.dev/isolation` modes.
//! - [`pod`] (feature `k8s`): what a pod object says to both sides: each container's
//!   `nvidia.com/gpu` count as the kubelet's device manager reads it, and whether the pod
//!   has started or finished.
//!
//! Serde only by default: the scheduling core depends on this crate and must stay free of
//! Kubernetes and I/O.

pub mod assignment;
pub mod isolation;
pub mod keys;
#[cfg(feature = "k8s")]
pub mod pod;

pub use assignment::{Assignment, AssignmentError, ContainerAssignment, GpuSlice};
pub use isolation::{Isolation, IsolationError};
