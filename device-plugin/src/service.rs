//! The `DevicePlugin` gRPC service: validates kubelet requests against the advertised
//! devices, delegates to the provider and turns its errors into statuses.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::api;
use crate::api::device_plugin_server::DevicePlugin;
use crate::devices::DeviceWatch;
use crate::provider::DeviceProvider;

/// One serving generation of a plugin: lives until its server is torn down (shutdown
/// or kubelet restart), at which point `stop` ends its ListAndWatch streams so the
/// server's graceful shutdown does not wait on them forever.
pub(crate) struct PluginService {
    resource_name: Arc<str>,
    provider: Arc<dyn DeviceProvider>,
    stop: watch::Receiver<bool>,
}

impl PluginService {
    pub(crate) fn new(
        resource_name: Arc<str>,
        provider: Arc<dyn DeviceProvider>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            resource_name,
            provider,
            stop,
        }
    }

    /// Rejects requests naming devices this plugin never advertised, naming them.
    fn check_known<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> Result<(), Status> {
        let devices = self.provider.devices().peek();
        let known: HashSet<&str> = devices.iter().map(|d| d.id.as_str()).collect();
        let unknown: Vec<String> = ids
            .into_iter()
            .filter(|id| !known.contains(id.as_str()))
            .cloned()
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(crate::ProviderError::UnknownDevices { ids: unknown }
                .to_status(&self.resource_name))
        }
    }

    fn count_mismatch(&self, call: &str, asked: usize, answered: usize) -> Status {
        Status::internal(format!(
            "{}: provider answered {call} with {answered} container responses for {asked} \
             container requests (a bug in the device plugin)",
            self.resource_name
        ))
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

fn response(devices: &[crate::Device]) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devices.iter().map(crate::Device::to_api).collect(),
    }
}

/// The full list first, then the full list after each change, until the serving
/// generation stops or the provider's list is dropped.
fn device_stream(watch: DeviceWatch, stop: watch::Receiver<bool>) -> DeviceStream {
    let state = (watch, stop, true);
    Box::pin(futures::stream::unfold(
        state,
        |(mut watch, mut stop, first)| async move {
            if first {
                let list = watch.current();
                return Some((Ok(response(&list)), (watch, stop, false)));
            }
            if *stop.borrow() {
                return None;
            }
            let next = tokio::select! {
                changed = watch.changed() => changed,
                // Either a stop or a dropped sender ends the stream.
                _ = stop.wait_for(|stopped| *stopped) => None,
            };
            let list = next?;
            Some((Ok(response(&list)), (watch, stop, false)))
        },
    ))
}

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(self.provider.options().to_api()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        tracing::debug!(resource = %self.resource_name, "kubelet opened ListAndWatch");
        Ok(Response::new(device_stream(
            self.provider.devices(),
            self.stop.clone(),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let request = request.into_inner();
        self.check_known(request.container_requests.iter().flat_map(|c| {
            c.available_device_i_ds
                .iter()
                .chain(&c.must_include_device_i_ds)
        }))?;
        let asked = request.container_requests.len();
        let answer = self
            .provider
            .preferred_allocation(request)
            .await
            .map_err(|e| e.to_status(&self.resource_name))?;
        if answer.container_responses.len() != asked {
            return Err(self.count_mismatch(
                "GetPreferredAllocation",
                asked,
                answer.container_responses.len(),
            ));
        }
        Ok(Response::new(answer))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let request = request.into_inner();
        self.check_known(
            request
                .container_requests
                .iter()
                .flat_map(|c| &c.devices_ids),
        )?;
        let asked = request.container_requests.len();
        let answer = self.provider.allocate(request).await.map_err(|e| {
            tracing::warn!(resource = %self.resource_name, error = %e, "Allocate failed");
            e.to_status(&self.resource_name)
        })?;
        if answer.container_responses.len() != asked {
            return Err(self.count_mismatch("Allocate", asked, answer.container_responses.len()));
        }
        Ok(Response::new(answer))
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let request = request.into_inner();
        self.check_known(&request.devices_ids)?;
        self.provider
            .pre_start(request.devices_ids)
            .await
            .map_err(|e| e.to_status(&self.resource_name))?;
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
