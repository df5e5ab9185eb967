//! Shared test fixtures: a small provider and a plugin running in the background.

use std::path::Path;
use std::time::Duration;

use tessera_device_plugin::{
    DeviceList, DeviceProvider, DeviceWatch, Health, PluginConfig, PluginError, PluginOptions,
    PluginServer, ProviderError, api,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub(crate) const RESOURCE: &str = "example.com/gpu";
pub(crate) const WAIT: Duration = Duration::from_secs(5);

/// Slots `gpu0-0..gpu0-3` and `gpu1-0..gpu1-3`; Allocate hands out env vars naming
/// the devices and refuses unhealthy ones.
pub(crate) struct SlotProvider {
    pub devices: DeviceList,
    pub options: PluginOptions,
}

impl SlotProvider {
    pub(crate) fn new() -> Self {
        let devices = (0..2)
            .flat_map(|gpu| (0..4).map(move |slot| format!("gpu{gpu}-{slot}")))
            .map(|id| tessera_device_plugin::Device::healthy(id).with_numa_node(0))
            .collect();
        Self {
            devices: DeviceList::new(devices),
            options: PluginOptions {
                pre_start_required: true,
                get_preferred_allocation_available: true,
            },
        }
    }
}

#[tonic::async_trait]
impl DeviceProvider for SlotProvider {
    fn devices(&self) -> DeviceWatch {
        self.devices.watch()
    }

    fn options(&self) -> PluginOptions {
        self.options
    }

    async fn preferred_allocation(
        &self,
        request: api::PreferredAllocationRequest,
    ) -> Result<api::PreferredAllocationResponse, ProviderError> {
        let container_responses = request
            .container_requests
            .into_iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let mut chosen = c.must_include_device_i_ds.clone();
                let mut rest = c.available_device_i_ds.clone();
                rest.sort();
                for id in rest {
                    if chosen.len() >= size {
                        break;
                    }
                    if !chosen.contains(&id) {
                        chosen.push(id);
                    }
                }
                api::ContainerPreferredAllocationResponse {
                    device_i_ds: chosen,
                }
            })
            .collect();
        Ok(api::PreferredAllocationResponse {
            container_responses,
        })
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let snapshot = self.devices.snapshot();
        let mut container_responses = Vec::new();
        for container in request.container_requests {
            let sick: Vec<_> = container
                .devices_ids
                .iter()
                .filter(|id| {
                    snapshot
                        .iter()
                        .any(|d| &d.id == *id && d.health == Health::Unhealthy)
                })
                .cloned()
                .collect();
            if !sick.is_empty() {
                return Err(ProviderError::FailedPrecondition(format!(
                    "devices {sick:?} are unhealthy; the kubelet will retry on healthy ones"
                )));
            }
            let mut response = api::ContainerAllocateResponse::default();
            response
                .envs
                .insert("EXAMPLE_DEVICES".into(), container.devices_ids.join(","));
            response.cdi_devices = container
                .devices_ids
                .iter()
                .map(|id| api::CdiDevice {
                    name: format!("example.com/gpu={id}"),
                })
                .collect();
            container_responses.push(response);
        }
        Ok(api::AllocateResponse {
            container_responses,
        })
    }

    async fn pre_start(&self, device_ids: Vec<String>) -> Result<(), ProviderError> {
        if device_ids.is_empty() {
            return Err(ProviderError::InvalidRequest(
                "no devices to prepare".into(),
            ));
        }
        Ok(())
    }
}

/// A plugin server running in a background task until [`RunningPlugin::stop`].
pub(crate) struct RunningPlugin {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), PluginError>>,
}

impl RunningPlugin {
    pub(crate) fn start(server: PluginServer) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        Self {
            stop: Some(stop),
            task,
        }
    }

    pub(crate) async fn stop(mut self) -> Result<(), PluginError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("plugin stops within the bound")
            .expect("plugin task did not panic")
    }
}

pub(crate) fn config(dir: &Path) -> PluginConfig {
    PluginConfig::new(RESOURCE).unwrap().with_socket_dir(dir)
}

/// Starts a [`SlotProvider`] plugin in `dir`, returning the device list to poke at.
pub(crate) fn start_slot_plugin(dir: &Path) -> (RunningPlugin, DeviceList) {
    let provider = SlotProvider::new();
    let devices = provider.devices.clone();
    (
        RunningPlugin::start(PluginServer::new(config(dir), provider)),
        devices,
    )
}
