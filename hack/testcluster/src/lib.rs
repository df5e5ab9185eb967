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
//! - [`GpuNode`]: a kubelet-lite with the directories and shape file of a `tessera-agent` on a
//!   simulated GPU machine ([`shapes`]); [`AgentProcess`] runs the agent binary on it.
//! - [`pods`]: test pods ([`pods::PodBuilder`]) and what tests read off them, with the user
//!   contract's names spelled out; [`PodHistory`]: every pod change, in the server's order,
//!   and the binding invariants checked on it.
//! - [`apply`] (any object, as `kubectl create -f`), [`wait_crd_established`],
//!   [`wait_service_account`].
//! - [`Kueue`]: Kueue's controller (`kueue-peer`, hack/kueue) in front of a cluster, with its
//!   batch/Job integration and Job webhook.
//! - [`helm`], [`promlint`] and [`scrape`]: the real helm CLI, the exposition linter, and a
//!   Prometheus-style scrape.
//! - [`wait_for`]: the polling loop, failing with the peers' picture of what happened.
//!
//! Every child process dies with the test: the cluster and the nodes stop when their
//! standard input closes, which happens when the handle is dropped or the test process exits.

mod binary;
mod cluster;
mod gpu_node;
mod history;
mod kueue;
mod node;
mod objects;
pub mod pods;
pub mod shapes;
mod tools;
mod wait;

pub use binary::{KubePeerError, kube_peer, kueue_peer};
pub use cluster::{AuditRecord, Cluster, ClusterOptions, pod_bound_token};
pub use gpu_node::{AgentProcess, GpuNode, free_port};
pub use history::{PodHistory, PodSeen};
pub use kueue::Kueue;
pub use node::{ContainerRecord, LiteNode, NodeOptions};
pub use objects::{apply, wait_crd_established, wait_service_account};
pub use tools::{HelmOutput, helm, promlint, scrape};
pub use wait::{eventually, until, wait_for};

/// A correctness bound for waits on the real components, not a speed target: generous because
/// CI runs several clusters at once on two cores.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
