//! Errors of the library and of device providers, and how provider errors reach the
//! kubelet as gRPC statuses.

use std::io;
use std::path::PathBuf;

/// Why a [`crate::DeviceProvider`] call failed. Each variant maps to one gRPC code; the
/// message reaches the kubelet (and from there the pod's events), so it should tell a
/// person what to do.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ProviderError {
    /// The request named devices this plugin never advertised.
    #[error(
        "unknown device ids {ids:?}: only ids advertised through ListAndWatch can be allocated"
    )]
    UnknownDevices {
        /// The requested device ids that are not in the advertised list.
        ids: Vec<String>,
    },
    /// The request is malformed (wrong count, contradictory fields).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request is valid but cannot be served in the current state (e.g. no
    /// placement decision exists yet for the pod). Retrying later may succeed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A dependency is temporarily unreachable (GPU driver, coordinator, API server).
    #[error("{0}")]
    Unavailable(String),
    /// The provider does not implement this call.
    #[error("{0} is not implemented by this device plugin")]
    Unimplemented(&'static str),
    /// A bug or an unexpected failure inside the provider.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProviderError {
    /// The gRPC status for this error, prefixed with the resource name so that a
    /// kubelet log line or pod event says which plugin failed.
    pub fn to_status(&self, resource_name: &str) -> tonic::Status {
        let message = format!("{resource_name}: {self}");
        match self {
            ProviderError::UnknownDevices { .. } | ProviderError::InvalidRequest(_) => {
                tonic::Status::invalid_argument(message)
            }
            ProviderError::FailedPrecondition(_) => tonic::Status::failed_precondition(message),
            ProviderError::Unavailable(_) => tonic::Status::unavailable(message),
            ProviderError::Unimplemented(_) => tonic::Status::unimplemented(message),
            ProviderError::Internal(_) => tonic::Status::internal(message),
        }
    }
}

/// Why a [`crate::PluginServer`] could not be configured or run.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A configuration value is not acceptable.
    #[error("invalid {field} {value:?}: {expected}")]
    InvalidConfig {
        /// Name of the setting.
        field: &'static str,
        /// The value as the caller passed it, for the message.
        value: String,
        /// What the setting accepts, with an example.
        expected: &'static str,
    },
    /// The plugin socket could not be prepared or bound.
    #[error("cannot serve on {path}: {source}")]
    Bind {
        /// The plugin's socket in the device-plugin directory (`<dir>/<endpoint>`).
        path: PathBuf,
        /// Why removing a stale socket or binding failed.
        source: io::Error,
    },
    /// Something in the device-plugin directory is in the way.
    #[error("cannot use {path}: {reason}")]
    Path {
        /// The device-plugin directory (the kubelet's, mounted into the agent pod) that is missing.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The gRPC server stopped with an error.
    #[error("device-plugin server for {resource} failed: {source}")]
    Serve {
        /// Resource the server was for.
        resource: String,
        /// Why tonic stopped serving the socket.
        source: tonic::transport::Error,
    },
    /// Installing a signal handler failed.
    #[error("cannot install signal handler: {0}")]
    Signal(io::Error),
    /// A server task panicked or was cancelled.
    #[error("device-plugin task for {resource} ended abnormally: {reason}")]
    Task {
        /// Resource the task was for.
        resource: String,
        /// Panic or cancellation text.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_devices_are_invalid_argument_and_named() {
        let status = ProviderError::UnknownDevices {
            ids: vec!["gpu-9".into()],
        }
        .to_status("nvidia.com/gpu");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("nvidia.com/gpu: unknown device ids")
        );
        assert!(status.message().contains("gpu-9"));
    }

    #[test]
    fn each_variant_has_its_code() {
        let cases = [
            (
                ProviderError::InvalidRequest("x".into()),
                tonic::Code::InvalidArgument,
            ),
            (
                ProviderError::FailedPrecondition("x".into()),
                tonic::Code::FailedPrecondition,
            ),
            (
                ProviderError::Unavailable("x".into()),
                tonic::Code::Unavailable,
            ),
            (
                ProviderError::Unimplemented("Allocate"),
                tonic::Code::Unimplemented,
            ),
            (ProviderError::Internal("x".into()), tonic::Code::Internal),
        ];
        for (error, code) in cases {
            assert_eq!(error.to_status("r").code(), code, "{error}");
        }
    }
}
