//! The agent's integration tests, one binary with a module per area: the agent through
//! its real sockets (the fake kubelet, kubelet-lite with the kubelet's own device manager,
//! a real API server) and enforcement on real child processes. `common` is the shared
//! harness (`cargo test -p tessera-agent --test it watchdog::` runs one area).

mod common;

mod admin_socket;
mod cli;
mod device_plugin;
mod kube;
mod kubelet_lite;
mod measured;
mod mig;
mod mps;
mod real_behaviour;
mod report;
mod restart;
mod watchdog;
