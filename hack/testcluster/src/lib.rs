//! Real Kubernetes as a test peer.
//!
//! The Go program in `hack/k8s` (`kube-peer`) is the upstream code of one pinned Kubernetes
//! release: an embedded etcd with the real kube-apiserver (RBAC, Node authorization,
//! ServiceAccount tokens, admission webhooks, CRDs), optionally the real kube-scheduler and
//! kube-controller-manager, kubelet-lite nodes that admit pods through the kubelet's own device
//! manager and Topology Manager, helm, and promtool's metrics linter. This crate builds it once
//! per machine and gives tests typed handles:
//!
//! - [`Cluster`]: one control plane per call, in a temporary directory; an admin
//!   [`kube::Client`] and clients for named ServiceAccounts (their own RBAC applies).
//! - [`LiteNode`]: one kubelet-lite process; a real `tessera-agent` registers on its
//!   `kubelet.sock`; [`LiteNode::containers`] shows what each container was given;
//!   [`LiteNode::restart`] is a kubelet restart (sockets recreated, checkpoint kept).
//! - [`helm`] and [`promlint`]: the real helm CLI and the exposition linter.
//! - [`wait_for`]: the polling loop, failing with the peers' picture of what happened.
//!
//! Every child process dies with the test: the cluster and the nodes stop when their
//! standard input closes, which happens when the handle is dropped or the test process exits.

mod binary;
mod cluster;
mod node;
mod tools;
mod wait;

pub use binary::{KubePeerError, kube_peer};
pub use cluster::{AuditRecord, Cluster, ClusterOptions, pod_bound_token};
pub use node::{ContainerRecord, LiteNode, NodeOptions};
pub use tools::{HelmOutput, helm, promlint};
pub use wait::{eventually, until, wait_for};

/// A correctness bound for waits on the real components, not a speed target: generous because
/// CI runs several clusters at once on two cores.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
