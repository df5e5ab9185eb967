//! The serve → register → watch loop of one resource, and running several at once.
//!
//! Each pass of the loop is a *generation*: bind the socket (replacing a stale one),
//! serve `DevicePlugin`, register with the kubelet (waiting while it is absent,
//! backing off while it fails), then poll until the kubelet restarts (its socket is
//! re-created) or our socket disappears, tear the generation down and start again.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::wrappers::UnixListenerStream;

use crate::api::device_plugin_server::DevicePluginServer;
use crate::config::PluginConfig;
use crate::error::PluginError;
use crate::provider::DeviceProvider;
use crate::registration;
use crate::service::PluginService;
use crate::socket_watch::FileIdentity;

/// How long a torn-down generation may take to finish its open calls before its
/// server task is aborted; short, because a kubelet restart waits on it.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// Serves one extended resource to the kubelet.
pub struct PluginServer {
    config: PluginConfig,
    provider: Arc<dyn DeviceProvider>,
}

/// How a generation ended.
enum Outcome {
    /// Shutdown was requested.
    Stop,
    /// The kubelet restarted or our socket vanished: serve and register again.
    Restart,
}

impl PluginServer {
    /// A server for `provider` with `config`.
    pub fn new(config: PluginConfig, provider: impl DeviceProvider) -> Self {
        Self::from_arc(config, Arc::new(provider))
    }

    /// A server for a provider shared with other parts of the program.
    pub fn from_arc(config: PluginConfig, provider: Arc<dyn DeviceProvider>) -> Self {
        Self { config, provider }
    }

    /// The resource name, socket and directory paths, and timings this server was built with.
    pub fn config(&self) -> &PluginConfig {
        &self.config
    }

    /// Runs until `shutdown` completes, then stops serving and removes the socket.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), PluginError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let work = self.run_with(stop_rx);
        tokio::pin!(work);
        tokio::select! {
            result = &mut work => return result,
            () = shutdown => {}
        }
        // The receiver lives inside `work`, which is still pending here.
        let _ = stop_tx.send(true);
        work.await
    }

    /// Runs until SIGTERM or SIGINT.
    pub async fn run_until_signal(self) -> Result<(), PluginError> {
        let signal = crate::termination_signal().map_err(PluginError::Signal)?;
        self.run(signal).await
    }

    async fn run_with(self, mut stop: watch::Receiver<bool>) -> Result<(), PluginError> {
        let resource = self.config.resource_name().to_owned();
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let mut generation = Generation::start(&self.config, &self.provider)?;
            let outcome = self.register_and_watch(&mut generation, &mut stop).await;
            generation.tear_down().await;
            match outcome? {
                Outcome::Stop => {
                    tracing::info!(%resource, "device plugin stopped");
                    return Ok(());
                }
                Outcome::Restart => continue,
            }
        }
    }

    async fn register_and_watch(
        &self,
        generation: &mut Generation,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Outcome, PluginError> {
        let config = &self.config;
        let resource = config.resource_name();
        let kubelet_socket = config.kubelet_socket_path();
        let mut failures = 0u32;
        let mut logged_absent = false;
        let mut last_error: Option<String> = None;

        let kubelet = loop {
            if let Some(outcome) = generation.check()? {
                return Ok(outcome);
            }
            let Some(kubelet) = FileIdentity::of(&kubelet_socket).ok().flatten() else {
                if !logged_absent {
                    tracing::info!(%resource, path = %kubelet_socket.display(),
                        "waiting for the kubelet socket to appear");
                    logged_absent = true;
                }
                if wait_or_stop(stop, config.poll_interval()).await {
                    return Ok(Outcome::Stop);
                }
                continue;
            };
            self.provider.registering();
            let attempt = tokio::select! {
                result = registration::register_once(config, self.provider.options()) => result,
                // A hung kubelet must not hold up shutdown for the whole call deadline.
                Ok(_) = stop.wait_for(|stopped| *stopped) => return Ok(Outcome::Stop),
            };
            match attempt {
                Ok(()) => break kubelet,
                Err(error) => {
                    failures = failures.saturating_add(1);
                    let delay = config.backoff().delay(failures);
                    // Retried with backoff: a cause is logged once, its repeats at debug level.
                    let text = error.to_string();
                    if last_error.as_deref() == Some(text.as_str()) {
                        tracing::debug!(%resource, error = %text, retry_in = ?delay, "Register failed again");
                    } else {
                        tracing::warn!(%resource, error = %text, retry_in = ?delay,
                            "Register failed; retrying with backoff (repeats of this cause are logged at debug level)");
                        last_error = Some(text);
                    }
                    if self.back_off(stop, delay, kubelet).await {
                        return Ok(Outcome::Stop);
                    }
                }
            }
        };
        tracing::info!(%resource, endpoint = config.endpoint(), "registered with the kubelet");

        loop {
            if wait_or_stop(stop, config.poll_interval()).await {
                return Ok(Outcome::Stop);
            }
            if !kubelet.still_at(&kubelet_socket) {
                tracing::info!(%resource, "kubelet socket re-created (kubelet restart); re-registering");
                return Ok(Outcome::Restart);
            }
            if let Some(outcome) = generation.check()? {
                return Ok(outcome);
            }
        }
    }
}

impl PluginServer {
    /// Waits `delay` before the next Register attempt, but cuts the wait short when a
    /// new kubelet socket appears (a restarted kubelet should not wait out a backoff
    /// earned by its dead predecessor). Returns true when shutdown was requested.
    async fn back_off(
        &self,
        stop: &mut watch::Receiver<bool>,
        delay: Duration,
        kubelet: FileIdentity,
    ) -> bool {
        let socket = self.config.kubelet_socket_path();
        let deadline = tokio::time::Instant::now() + delay;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            if wait_or_stop(stop, left.min(self.config.poll_interval())).await {
                return true;
            }
            if !kubelet.still_at(&socket) {
                return false;
            }
        }
    }
}

/// Sleeps for `delay`; returns true when shutdown was requested meanwhile.
async fn wait_or_stop(stop: &mut watch::Receiver<bool>, delay: Duration) -> bool {
    let stopped = tokio::select! {
        result = stop.wait_for(|stopped| *stopped) => result.is_ok(),
        () = tokio::time::sleep(delay) => return false,
    };
    if !stopped {
        // The sender is gone, so nobody can ask for shutdown any more: just wait.
        tokio::time::sleep(delay).await;
    }
    stopped
}

/// One bound socket and the gRPC server on it.
struct Generation {
    resource: String,
    socket: PathBuf,
    identity: Option<FileIdentity>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Generation {
    fn start(
        config: &PluginConfig,
        provider: &Arc<dyn DeviceProvider>,
    ) -> Result<Self, PluginError> {
        let socket = config.socket_path();
        let dir = config.socket_dir();
        if !dir.is_dir() {
            return Err(PluginError::Path {
                path: dir.to_path_buf(),
                reason: "the device-plugin directory does not exist (is the kubelet's \
                         device-plugins dir mounted into the pod?)"
                    .to_owned(),
            });
        }
        let listener =
            crate::uds::bind_replacing_stale(&socket).map_err(|source| PluginError::Bind {
                path: socket.clone(),
                source,
            })?;
        let identity = FileIdentity::of(&socket).ok().flatten();
        let (stop, stop_rx) = watch::channel(false);
        let service = PluginService::new(
            Arc::from(config.resource_name()),
            Arc::clone(provider),
            stop_rx.clone(),
        );
        let mut shutdown = stop_rx;
        let server = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = shutdown.wait_for(|stopped| *stopped).await;
            });
        tracing::debug!(resource = config.resource_name(), path = %socket.display(), "serving");
        Ok(Self {
            resource: config.resource_name().to_owned(),
            socket,
            identity,
            stop,
            task: Some(tokio::spawn(server)),
        })
    }

    /// `Some(Restart)` when our socket was deleted or replaced; an error when the
    /// server itself died.
    fn check(&mut self) -> Result<Option<Outcome>, PluginError> {
        if let Some(task) = &self.task
            && task.is_finished()
        {
            let task = self.task.take();
            // `is_finished` is true, so polling the handle once yields its result.
            let result = task.and_then(futures::FutureExt::now_or_never);
            return match result {
                Some(Ok(Err(source))) => Err(PluginError::Serve {
                    resource: self.resource.clone(),
                    source,
                }),
                Some(Err(join)) => Err(PluginError::Task {
                    resource: self.resource.clone(),
                    reason: join.to_string(),
                }),
                // The server returned without being asked to; serve again.
                _ => Ok(Some(Outcome::Restart)),
            };
        }
        let intact = self.identity.is_some_and(|id| id.still_at(&self.socket));
        if !intact {
            tracing::info!(resource = %self.resource, path = %self.socket.display(),
                "plugin socket removed (kubelet restart?); serving again");
            return Ok(Some(Outcome::Restart));
        }
        Ok(None)
    }

    async fn tear_down(mut self) {
        let _ = self.stop.send(true);
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(DRAIN_TIMEOUT, &mut task)
                .await
                .is_err()
        {
            tracing::debug!(resource = %self.resource, "open calls did not drain; aborting");
            task.abort();
        }
        // Remove the socket only if it is still the one we bound: after a kubelet
        // restart the path may already be gone, or belong to our next generation.
        if self.identity.is_some_and(|id| id.still_at(&self.socket)) {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

/// Runs several servers (one per resource, e.g. `nvidia.com/gpu` and
/// `nvidia.com/mig-1g.10gb`) until `shutdown` completes. If one fails, the others are
/// stopped too and the first error is returned.
pub async fn run_all(
    servers: Vec<PluginServer>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PluginError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut names = Vec::new();
    for server in servers {
        names.push(server.config.resource_name().to_owned());
        tasks.spawn(server.run_with(stop_rx.clone()));
    }
    tokio::pin!(shutdown);
    let mut first_error = None;
    let mut stopping = false;
    while !tasks.is_empty() {
        tokio::select! {
            () = &mut shutdown, if !stopping => {
                stopping = true;
                let _ = stop_tx.send(true);
            }
            Some(joined) = tasks.join_next() => {
                let error = match joined {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) => Some(error),
                    Err(join) => Some(PluginError::Task {
                        resource: names.join(", "),
                        reason: join.to_string(),
                    }),
                };
                if let Some(error) = error {
                    tracing::error!(%error, "device plugin failed; stopping the others");
                    first_error.get_or_insert(error);
                    stopping = true;
                    let _ = stop_tx.send(true);
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// [`run_all`] until SIGTERM or SIGINT.
pub async fn run_all_until_signal(servers: Vec<PluginServer>) -> Result<(), PluginError> {
    let signal = crate::termination_signal().map_err(PluginError::Signal)?;
    run_all(servers, signal).await
}
