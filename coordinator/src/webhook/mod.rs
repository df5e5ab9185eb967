//! The mutating admission webhook that keeps default-scheduler GPU pods off the GPUs the
//! agent cannot give them.
//!
//! The agent advertises `nvidia.com/gpu` as GPUs × `sharesPerGpu` slots, so kube-scheduler
//! and the kubelet admit far more one-GPU pods onto a node than it has GPUs; the agent hands a
//! pod without an assignment a whole free GPU, and the pod after the last one fails admission
//! (`UnexpectedAdmissionError`) and is recreated by its controller forever. The webhook routes
//! such pods to this scheduler instead (`spec.schedulerName`), which places them on whole
//! GPUs or leaves them Pending with a reason.
//!
//! - [`route`]: the decision and the patch (pure, unit-tested).
//! - [`server`]: HTTPS on rustls, the certificate reloaded when its files change (a Secret
//!   rotated by the chart or cert-manager), served by every replica (not only the leader).

pub mod route;
pub mod server;

pub use route::{Routing, routing};
pub use server::{WebhookConfig, WebhookError, WebhookHandle};
