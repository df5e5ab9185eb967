//! The coordinator's integration tests, one binary with a module per area (one link of
//! kube and tonic instead of one per file). `e2e`, `fault_proxy` and `tls` are the shared
//! harnesses; every other module is the tests of one area, named as its file was before
//! (`cargo test -p tessera-coordinator --test it e2e_resilience::` runs one area).

mod e2e;
mod fault_proxy;
mod tls;

mod agents;
mod agents_abuse;
mod agents_real_agent;
mod bind_faults;
mod cluster_runtime;
mod constraints_diff;
mod crd_validate;
mod crd_yaml;
mod e2e_agent_state;
mod e2e_budgets;
mod e2e_constraints;
mod e2e_device_path;
mod e2e_evictions;
mod e2e_kubectl;
mod e2e_kueue;
mod e2e_messages;
mod e2e_node_labels;
mod e2e_queues;
mod e2e_resilience;
mod e2e_scheduling;
mod e2e_tenancy;
mod e2e_webhook;
mod e2e_workloads;
mod fuzz_inputs;
mod leader;
mod log_files;
mod migrate_kai;
mod ops;
mod playground;
mod real_api;
mod sim_cli;
mod translate_cluster;
mod translate_pod;
mod webhook_tls;
