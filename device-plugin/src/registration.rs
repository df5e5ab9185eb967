//! Registering with the kubelet.

use std::time::Duration;

use tessera_proto::deviceplugin::API_VERSION;

use crate::api::{RegisterRequest, registration_client::RegistrationClient};
use crate::config::PluginConfig;
use crate::provider::PluginOptions;
use crate::uds;

/// Why one Register attempt failed; all of these are retried.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    #[error("cannot connect to the kubelet at {path}: {source}")]
    Connect {
        path: String,
        source: tonic::transport::Error,
    },
    #[error("the kubelet rejected the registration: {0}")]
    Rejected(tonic::Status),
    #[error("the kubelet did not answer Register within {0:?}")]
    Timeout(Duration),
}

/// The request this plugin sends.
pub(crate) fn request(config: &PluginConfig, options: PluginOptions) -> RegisterRequest {
    RegisterRequest {
        version: API_VERSION.to_owned(),
        endpoint: config.endpoint().to_owned(),
        resource_name: config.resource_name().to_owned(),
        options: Some(options.to_api()),
    }
}

/// One Register call on the kubelet's socket, bounded by the configured deadline.
pub(crate) async fn register_once(
    config: &PluginConfig,
    options: PluginOptions,
) -> Result<(), RegisterError> {
    let path = config.kubelet_socket_path();
    let deadline = config.rpc_timeout();
    let attempt = async {
        let channel =
            uds::connect(path.clone())
                .await
                .map_err(|source| RegisterError::Connect {
                    path: path.display().to_string(),
                    source,
                })?;
        RegistrationClient::new(channel)
            .register(request(config, options))
            .await
            .map_err(RegisterError::Rejected)?;
        Ok(())
    };
    tokio::time::timeout(deadline, attempt)
        .await
        .map_err(|_| RegisterError::Timeout(deadline))?
}
