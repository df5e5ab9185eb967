//! A reusable kubelet device-plugin server.
//!
//! The resource logic (which devices exist, what a container gets) lives behind
//! [`DeviceProvider`]; the device list and its changes live in a [`DeviceList`].
//! [`PluginServer`] does the kubelet plumbing: it serves `DevicePlugin` on a Unix
//! socket in the device-plugin directory, registers with the kubelet (retrying while
//! the kubelet is absent), broadcasts every device-list change to all open
//! `ListAndWatch` streams, re-serves and re-registers when the kubelet restarts, and
//! removes its socket on shutdown. One process may run several servers, one per
//! extended resource ([`run_all`]).
//!
//! With the `testing` feature, `testing::FakeKubelet` plays the kubelet's side over
//! real Unix sockets for other crates' tests.

#![warn(missing_docs)]

mod config;
mod devices;
mod error;
mod provider;
mod registration;
mod server;
mod service;
mod shutdown;
mod socket_watch;
pub mod uds;

#[cfg(feature = "testing")]
pub mod testing;

pub use config::{Backoff, PluginConfig};
pub use devices::{Device, DeviceList, DeviceWatch, Health};
pub use error::{PluginError, ProviderError};
pub use provider::{DeviceProvider, PluginOptions};
pub use server::{PluginServer, run_all, run_all_until_signal};
pub use shutdown::termination_signal;

/// Re-export of the generated device-plugin API types used in the trait signatures.
pub use tessera_proto::deviceplugin::v1beta1 as api;
