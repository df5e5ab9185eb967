//! The contract between Tessera's coordinator and its node agents, and the names users
//! write: one definition, compiled into both sides (and the test harnesses), so the
//! coordinator cannot write an assignment the agent reads differently.
//!
//! - [`keys`]: label, annotation and resource names (SPEC.md's user contract).
//! - [`assignment`]: the `tessera.dev/assignment` JSON and its validation.
//! - [`isolation`]: the `tessera.dev/isolation` modes.
//! - [`gpu_model`]: the key naming a GPU model in a Queue's per-model quotas.
//! - [`identity`]: pods by UID ([`PodUid`]) and nodes by name ([`NodeName`]), as types.
//! - [`pod`] (feature `k8s`): what a pod object says to both sides: each container's
//!   `nvidia.com/gpu` count as the kubelet's device manager reads it, and whether the pod
//!   has started or finished.
//! - [`quantity`], [`share`]: Kubernetes quantities read exactly, and the GPU share
//!   annotations' values.
//! - [`crd`] (feature `crd`): the `tessera.dev` custom resources, which the coordinator
//!   writes and renders and `kubectl tessera` reads.
//!
//! Serde only by default: the scheduling core depends on this crate and must stay free of
//! Kubernetes and I/O.

pub mod assignment;
#[cfg(feature = "crd")]
pub mod crd;
pub mod gpu_model;
pub mod identity;
pub mod isolation;
pub mod keys;
#[cfg(feature = "k8s")]
pub mod pod;
pub mod quantity;
pub mod share;

pub use assignment::{Assignment, AssignmentError, ContainerAssignment, GpuSlice};
pub use identity::{IdentityError, NodeName, PodUid};
pub use isolation::{Isolation, IsolationError};
