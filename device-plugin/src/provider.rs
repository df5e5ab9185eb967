//! The trait a resource implements; the library does everything kubelet-facing.

use crate::api;
use crate::devices::DeviceWatch;
use crate::error::ProviderError;

/// Options announced to the kubelet at registration and by `GetDevicePluginOptions`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginOptions {
    /// The kubelet must call [`DeviceProvider::pre_start`] before each container start.
    pub pre_start_required: bool,
    /// The kubelet may call [`DeviceProvider::preferred_allocation`].
    pub get_preferred_allocation_available: bool,
}

impl PluginOptions {
    /// These options as the kubelet API message, sent in `Register` and
    /// `GetDevicePluginOptions`.
    pub fn to_api(self) -> api::DevicePluginOptions {
        api::DevicePluginOptions {
            pre_start_required: self.pre_start_required,
            get_preferred_allocation_available: self.get_preferred_allocation_available,
        }
    }
}

/// The logic behind one extended resource.
///
/// The library checks before every call that all device ids in the request were
/// advertised (answering `InvalidArgument` naming the others), and checks that the
/// answer has one entry per container request.
#[tonic::async_trait]
pub trait DeviceProvider: Send + Sync + 'static {
    /// The advertised devices: the current value is the initial list every new
    /// `ListAndWatch` stream gets, each later change is broadcast to all streams.
    fn devices(&self) -> DeviceWatch;

    /// Options announced to the kubelet.
    fn options(&self) -> PluginOptions {
        PluginOptions::default()
    }

    /// Chooses, per container, `allocation_size` devices out of the available ones
    /// (always including the must-include ones). Only called when
    /// [`PluginOptions::get_preferred_allocation_available`] is set.
    async fn preferred_allocation(
        &self,
        request: api::PreferredAllocationRequest,
    ) -> Result<api::PreferredAllocationResponse, ProviderError> {
        let _ = request;
        Err(ProviderError::Unimplemented("GetPreferredAllocation"))
    }

    /// Returns, per container request and in the same order, what the runtime must
    /// inject for the given devices.
    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError>;

    /// Called before each Register attempt: the first, and again after every kubelet
    /// restart, while no Allocate of the (new) kubelet can be in flight. A restarted
    /// kubelet knows only the allocations it had checkpointed; one it was answered but had
    /// not yet written down, it asks for again.
    fn registering(&self) {}

    /// Prepares devices right before a container starts. Only called when
    /// [`PluginOptions::pre_start_required`] is set.
    async fn pre_start(&self, device_ids: Vec<String>) -> Result<(), ProviderError> {
        let _ = device_ids;
        Ok(())
    }
}
