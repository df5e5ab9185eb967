//! The fake kubelet's Registration server and its connections back to plugins.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_proto::deviceplugin::{API_VERSION, KUBELET_SOCKET};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

use super::{DeviceFollower, FakeKubeletError};
use crate::api;
use crate::api::device_plugin_client::DevicePluginClient;
use crate::api::registration_server::{Registration, RegistrationServer};
use crate::uds;

/// State shared between the fake kubelet handle and its Registration service.
#[derive(Default)]
struct Shared {
    registrations: Mutex<Vec<api::RegisterRequest>>,
    plugins: Mutex<HashMap<String, Arc<PluginConnection>>>,
    reject_with: Mutex<Option<(Code, String)>>,
    /// Bumped on every registration and every established plugin connection.
    events: watch::Sender<u64>,
}

impl Shared {
    fn bump(&self) {
        self.events.send_modify(|n| *n += 1);
    }
}

/// A kubelet stand-in serving `Registration` on `<dir>/kubelet.sock`.
pub struct FakeKubelet {
    dir: PathBuf,
    shared: Arc<Shared>,
    server: Option<Running>,
}

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl FakeKubelet {
    /// Starts serving in `dir` (which must exist).
    pub async fn start(dir: &Path) -> Result<Self, FakeKubeletError> {
        let mut kubelet = Self {
            dir: dir.to_path_buf(),
            shared: Arc::new(Shared::default()),
            server: None,
        };
        kubelet.serve()?;
        Ok(kubelet)
    }

    fn serve(&mut self) -> Result<(), FakeKubeletError> {
        let path = self.socket_path();
        let listener = uds::bind_replacing_stale(&path).map_err(|source| FakeKubeletError::Io {
            path: path.clone(),
            source,
        })?;
        let (stop, mut stop_rx) = watch::channel(false);
        let service = RegistrationService {
            dir: self.dir.clone(),
            shared: Arc::clone(&self.shared),
        };
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            });
        let task = tokio::spawn(async move {
            if let Err(error) = server.await {
                tracing::warn!(%error, "fake kubelet server failed");
            }
        });
        self.server = Some(Running { stop, task });
        Ok(())
    }

    async fn stop_serving(&mut self) {
        if let Some(running) = self.server.take() {
            let _ = running.stop.send(true);
            let mut task = running.task;
            if tokio::time::timeout(Duration::from_secs(1), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
        let _ = std::fs::remove_file(self.socket_path());
    }

    /// The device-plugin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the fake `kubelet.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(KUBELET_SOCKET)
    }

    /// Every registration received since start (or the last restart), in order.
    pub fn registrations(&self) -> Vec<api::RegisterRequest> {
        self.shared.registrations.lock().clone()
    }

    /// Makes every later Register call fail with `code` and `message` (`None` to
    /// accept again), e.g. to exercise a plugin's retry.
    pub fn reject_registrations(&self, reject: Option<(Code, &str)>) {
        *self.shared.reject_with.lock() = reject.map(|(code, msg)| (code, msg.to_owned()));
    }

    /// Waits until at least `count` registrations were received and returns them all.
    pub async fn wait_for_registrations(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<api::RegisterRequest>, FakeKubeletError> {
        let mut events = self.shared.events.subscribe();
        let wait = async {
            loop {
                let seen = self.registrations();
                if seen.len() >= count {
                    return seen;
                }
                if events.changed().await.is_err() {
                    // Unreachable while `self` holds the sender; park instead of spinning.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| FakeKubeletError::Timeout {
                what: format!(
                    "{count} registration(s) (have {})",
                    self.registrations().len()
                ),
                after: timeout,
            })
    }

    /// Waits until `resource` registered and the fake kubelet connected back to it
    /// (its ListAndWatch stream is open), and returns that connection.
    pub async fn wait_for_plugin(
        &self,
        resource: &str,
        timeout: Duration,
    ) -> Result<Arc<PluginConnection>, FakeKubeletError> {
        let mut events = self.shared.events.subscribe();
        let wait = async {
            loop {
                if let Some(plugin) = self.plugin(resource) {
                    return plugin;
                }
                if events.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| FakeKubeletError::Timeout {
                what: format!("plugin {resource} to register and accept a connection"),
                after: timeout,
            })
    }

    /// The current connection to `resource`'s plugin, if it registered.
    pub fn plugin(&self, resource: &str) -> Option<Arc<PluginConnection>> {
        self.shared.plugins.lock().get(resource).cloned()
    }

    /// Simulates a kubelet restart the way a real one looks from the plugin's side:
    /// the registration socket goes away, every socket in the directory is deleted
    /// (the kubelet clears its device-plugin dir on start), registrations and plugin
    /// connections are forgotten, and a new `kubelet.sock` appears.
    pub async fn restart(&mut self) -> Result<(), FakeKubeletError> {
        self.restart_with(true).await
    }

    /// Like [`FakeKubelet::restart`] but leaves plugin sockets in place, so only the
    /// re-created `kubelet.sock` tells the plugin about the restart.
    pub async fn restart_keeping_plugin_sockets(&mut self) -> Result<(), FakeKubeletError> {
        self.restart_with(false).await
    }

    async fn restart_with(&mut self, clear_dir: bool) -> Result<(), FakeKubeletError> {
        self.stop_serving().await;
        self.shared.registrations.lock().clear();
        self.shared.plugins.lock().clear();
        if clear_dir {
            remove_sockets(&self.dir)?;
        }
        // A real restart takes far longer; this pause only guarantees the new socket
        // gets a later change time than the old one on coarse file-system clocks.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.serve()
    }

    /// Stops serving and removes `kubelet.sock`, as when the kubelet goes down.
    pub async fn stop(mut self) {
        self.stop_serving().await;
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(running) = self.server.take() {
            let _ = running.stop.send(true);
            running.task.abort();
        }
    }
}

fn remove_sockets(dir: &Path) -> Result<(), FakeKubeletError> {
    use std::os::unix::fs::FileTypeExt;

    let io = |source| FakeKubeletError::Io {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        if entry.file_type().map_err(io)?.is_socket() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

struct RegistrationService {
    dir: PathBuf,
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let request = request.into_inner();
        if let Some((code, message)) = self.shared.reject_with.lock().clone() {
            return Err(Status::new(code, message));
        }
        if request.version != API_VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}; this kubelet speaks {API_VERSION}",
                request.version
            )));
        }
        self.shared.registrations.lock().push(request.clone());
        self.shared.bump();
        // Like the kubelet, answer first and dial the plugin afterwards.
        let shared = Arc::clone(&self.shared);
        let socket = self.dir.join(&request.endpoint);
        tokio::spawn(async move {
            match PluginConnection::open(request.clone(), socket).await {
                Ok(plugin) => {
                    shared
                        .plugins
                        .lock()
                        .insert(request.resource_name.clone(), Arc::new(plugin));
                    shared.bump();
                }
                Err(error) => tracing::warn!(%error, "fake kubelet could not reach the plugin"),
            }
        });
        Ok(Response::new(api::Empty {}))
    }
}

/// The fake kubelet's connection to one registered plugin.
pub struct PluginConnection {
    registration: api::RegisterRequest,
    socket: PathBuf,
    client: DevicePluginClient<tonic::transport::Channel>,
    devices: DeviceFollower,
}

impl PluginConnection {
    async fn open(
        registration: api::RegisterRequest,
        socket: PathBuf,
    ) -> Result<Self, FakeKubeletError> {
        let channel =
            uds::connect(socket.clone())
                .await
                .map_err(|source| FakeKubeletError::Connect {
                    path: socket.clone(),
                    source,
                })?;
        let client = DevicePluginClient::new(channel);
        let devices = DeviceFollower::open(client.clone()).await?;
        Ok(Self {
            registration,
            socket,
            client,
            devices,
        })
    }

    /// The registration this connection came from.
    pub fn registration(&self) -> &api::RegisterRequest {
        &self.registration
    }

    /// The plugin's socket path.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The `ListAndWatch` stream the fake kubelet opened right after registration.
    pub fn devices(&self) -> &DeviceFollower {
        &self.devices
    }

    /// Opens one more, independent `ListAndWatch` stream.
    pub async fn open_list_and_watch(&self) -> Result<DeviceFollower, FakeKubeletError> {
        DeviceFollower::open(self.client.clone()).await
    }

    /// `GetDevicePluginOptions`.
    pub async fn options(&self) -> Result<api::DevicePluginOptions, Status> {
        Ok(self
            .client
            .clone()
            .get_device_plugin_options(api::Empty {})
            .await?
            .into_inner())
    }

    /// `GetPreferredAllocation` for one container.
    pub async fn preferred_allocation(
        &self,
        available: &[&str],
        must_include: &[&str],
        size: i32,
    ) -> Result<Vec<String>, Status> {
        let request = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: strings(available),
                must_include_device_i_ds: strings(must_include),
                allocation_size: size,
            }],
        };
        let mut response = self
            .client
            .clone()
            .get_preferred_allocation(request)
            .await?
            .into_inner();
        Ok(response
            .container_responses
            .pop()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    /// `Allocate` with an arbitrary request.
    pub async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, Status> {
        Ok(self.client.clone().allocate(request).await?.into_inner())
    }

    /// `Allocate` for one container holding `device_ids`.
    pub async fn allocate_one(
        &self,
        device_ids: &[&str],
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: strings(device_ids),
            }],
        };
        self.allocate(request)
            .await?
            .container_responses
            .pop()
            .ok_or_else(|| Status::internal("plugin returned no container response"))
    }

    /// `PreStartContainer`.
    pub async fn pre_start(&self, device_ids: &[&str]) -> Result<(), Status> {
        let request = api::PreStartContainerRequest {
            devices_ids: strings(device_ids),
        };
        self.client.clone().pre_start_container(request).await?;
        Ok(())
    }
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}
