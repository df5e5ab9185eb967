//! A fake kubelet for tests, over real Unix sockets (feature `testing`).
//!
//! [`FakeKubelet`] serves `Registration` on `<dir>/kubelet.sock`, records every
//! registration, and, like the real kubelet, dials each registered plugin back and
//! follows its `ListAndWatch` stream. Tests then drive the plugin through
//! [`PluginConnection`] and can simulate a kubelet restart. [`FakePodResources`] serves
//! the kubelet's pod-resources API with content the test sets.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tessera_device_plugin::testing::FakeKubelet;
//!
//! let dir = tempfile::tempdir()?;
//! let kubelet = FakeKubelet::start(dir.path()).await?;
//! // ... start a PluginServer with `.with_socket_dir(dir.path())` ...
//! let plugin = kubelet.wait_for_plugin("nvidia.com/gpu", Duration::from_secs(5)).await?;
//! let devices = plugin.devices().wait_until(|d| !d.is_empty(), Duration::from_secs(1)).await?;
//! # Ok(()) }
//! ```

mod follower;
mod kubelet;
mod pod_resources;

pub use follower::DeviceFollower;
pub use kubelet::{FakeKubelet, PluginConnection};
pub use pod_resources::{FakePodResources, pod_with_devices};

use std::time::Duration;

/// Failures of the fake kubelet.
#[derive(Debug, thiserror::Error)]
pub enum FakeKubeletError {
    /// Socket or directory handling failed.
    #[error("fake kubelet I/O on {path}: {source}")]
    Io {
        /// The fake kubelet's socket, or the directory it was clearing of sockets.
        path: std::path::PathBuf,
        /// Why binding the socket or reading the directory failed.
        source: std::io::Error,
    },
    /// Dialling the plugin failed.
    #[error("cannot connect to plugin socket {path}: {source}")]
    Connect {
        /// The plugin's socket in the device-plugin directory, from its Register call.
        path: std::path::PathBuf,
        /// Why dialling it failed (no listener, refused).
        source: tonic::transport::Error,
    },
    /// A call to the plugin failed.
    #[error("plugin call failed: {0}")]
    Call(#[from] tonic::Status),
    /// Something expected did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// The condition that did not happen, with what was seen instead where known.
        what: String,
        /// How long the test waited before giving up.
        after: Duration,
    },
}
