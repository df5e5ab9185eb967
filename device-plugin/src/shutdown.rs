//! Process signals that end a plugin cleanly.

use std::future::Future;
use std::io;

use tokio::signal::unix::{SignalKind, signal};

/// A future that completes on the first SIGTERM (what the kubelet and container
/// runtimes send to stop a DaemonSet pod) or SIGINT (Ctrl-C).
///
/// The handlers are installed when this function is called, not when the future is
/// first polled, so a signal that arrives in between is not lost.
pub fn termination_signal() -> io::Result<impl Future<Output = ()> + Send + 'static> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
        }
    })
}
