//! The device-plugin library's integration tests, one binary with a module per area, against
//! the fake kubelet over real Unix sockets. `common` is the shared harness.

mod common;

mod allocate;
mod list_and_watch;
mod pod_resources;
mod registration;
mod restart;
mod sigterm;
