//! A fake kubelet pod-resources endpoint (`PodResourcesLister`) over a Unix socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::FakeKubeletError;
use crate::uds;

#[derive(Default)]
struct Content {
    pods: Vec<pr::PodResources>,
    allocatable: pr::AllocatableResourcesResponse,
}

/// Serves `PodResourcesLister` at a socket path with content the test sets, the way
/// the kubelet reports which device ids each container holds.
pub struct FakePodResources {
    path: PathBuf,
    content: Arc<Mutex<Content>>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl FakePodResources {
    /// Starts serving at `path` (its directory must exist).
    pub async fn start(path: &Path) -> Result<Self, FakeKubeletError> {
        let listener = uds::bind_replacing_stale(path).map_err(|source| FakeKubeletError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = Arc::new(Mutex::new(Content::default()));
        let (stop, mut stop_rx) = watch::channel(false);
        let service = Lister {
            content: Arc::clone(&content),
        };
        let server = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            });
        let task = tokio::spawn(async move {
            if let Err(error) = server.await {
                tracing::warn!(%error, "fake pod-resources server failed");
            }
        });
        Ok(Self {
            path: path.to_path_buf(),
            content,
            stop,
            task: Some(task),
        })
    }

    /// Where it serves, to point the code under test at (as the kubelet's `kubelet.sock`).
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Replaces the pods `List` and `Get` report.
    pub fn set_pods(&self, pods: Vec<pr::PodResources>) {
        self.content.lock().pods = pods;
    }

    /// Replaces what `GetAllocatableResources` reports.
    pub fn set_allocatable(&self, allocatable: pr::AllocatableResourcesResponse) {
        self.content.lock().allocatable = allocatable;
    }

    /// Stops serving and removes the socket.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(1), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for FakePodResources {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A pod holding `device_ids` of `resource` in one container, for building content.
pub fn pod_with_devices(
    namespace: &str,
    name: &str,
    container: &str,
    resource: &str,
    device_ids: &[&str],
) -> pr::PodResources {
    pr::PodResources {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        containers: vec![pr::ContainerResources {
            name: container.to_owned(),
            devices: vec![pr::ContainerDevices {
                resource_name: resource.to_owned(),
                device_ids: device_ids.iter().map(|s| (*s).to_owned()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

struct Lister {
    content: Arc<Mutex<Content>>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let pod_resources = self.content.lock().pods.clone();
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(self.content.lock().allocatable.clone()))
    }

    async fn get(
        &self,
        request: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let request = request.into_inner();
        let content = self.content.lock();
        let pod = content
            .pods
            .iter()
            .find(|p| p.name == request.pod_name && p.namespace == request.pod_namespace)
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!(
                    "pod {}/{} not found on this node",
                    request.pod_namespace, request.pod_name
                ))
            })?;
        Ok(Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}
