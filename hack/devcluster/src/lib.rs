//! Tessera's development cluster: a loopback Kubernetes-compatible API server and hollow GPU
//! nodes, so the agent and coordinator are tested against real HTTP, real watches and real
//! protocol peers. Never shipped in product images.

pub mod apiserver;
pub mod cluster;
pub mod config;
pub mod hollow;
pub mod kubeconfig;
pub mod shape;
