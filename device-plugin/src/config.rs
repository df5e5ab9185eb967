//! Settings of one device-plugin server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tessera_proto::deviceplugin::{DEFAULT_DEVICE_PLUGIN_DIR, KUBELET_SOCKET};

use crate::error::PluginError;

/// Exponential backoff for Register retries while the kubelet is up but not answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First wait.
    pub initial: Duration,
    /// Upper bound of any wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl Backoff {
    /// The wait after `failures` consecutive failures (1 = first failure).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Where and as what one [`crate::PluginServer`] serves.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    resource_name: String,
    socket_dir: PathBuf,
    endpoint: String,
    poll_interval: Duration,
    backoff: Backoff,
    rpc_timeout: Duration,
}

impl PluginConfig {
    /// Settings for `resource_name` (e.g. `nvidia.com/gpu`) with the defaults: the
    /// kubelet's device-plugin dir, endpoint `tessera-<domain>_<name>.sock`, a 200 ms
    /// restart poll and the default [`Backoff`].
    pub fn new(resource_name: impl Into<String>) -> Result<Self, PluginError> {
        let resource_name = resource_name.into();
        validate_resource_name(&resource_name)?;
        let endpoint = format!("tessera-{}.sock", resource_name.replace('/', "_"));
        Ok(Self {
            resource_name,
            socket_dir: PathBuf::from(DEFAULT_DEVICE_PLUGIN_DIR),
            endpoint,
            poll_interval: Duration::from_millis(200),
            backoff: Backoff::default(),
            rpc_timeout: Duration::from_secs(5),
        })
    }

    /// Uses another device-plugin directory (tests, non-default kubelet root dirs).
    pub fn with_socket_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.socket_dir = dir.into();
        self
    }

    /// Uses another socket file name inside the directory.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Result<Self, PluginError> {
        let endpoint = endpoint.into();
        if endpoint.is_empty()
            || endpoint.contains('/')
            || endpoint == "."
            || endpoint == ".."
            || endpoint == KUBELET_SOCKET
        {
            return Err(PluginError::InvalidConfig {
                field: "endpoint",
                value: endpoint,
                expected: "a plain file name such as `tessera-gpu.sock` (no `/`, not `kubelet.sock`)",
            });
        }
        self.endpoint = endpoint;
        Ok(self)
    }

    /// How often to check whether the kubelet restarted.
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Backoff for Register retries.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Deadline of one Register call.
    pub fn with_rpc_timeout(mut self, timeout: Duration) -> Self {
        self.rpc_timeout = timeout;
        self
    }

    /// The extended resource name.
    pub fn resource_name(&self) -> &str {
        &self.resource_name
    }

    /// The device-plugin directory.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The socket file name sent to the kubelet as `endpoint`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Full path of this plugin's socket.
    pub fn socket_path(&self) -> PathBuf {
        self.socket_dir.join(&self.endpoint)
    }

    /// Full path of the kubelet's registration socket.
    pub fn kubelet_socket_path(&self) -> PathBuf {
        self.socket_dir.join(KUBELET_SOCKET)
    }

    /// Restart poll interval.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Register retry backoff.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Register call deadline.
    pub fn rpc_timeout(&self) -> Duration {
        self.rpc_timeout
    }
}

/// Extended resource names are `<domain>/<name>`; the kubelet rejects anything else,
/// so fail early with the accepted form instead of retrying Register forever.
fn validate_resource_name(name: &str) -> Result<(), PluginError> {
    let invalid = || PluginError::InvalidConfig {
        field: "resource name",
        value: name.to_owned(),
        expected: "`<domain>/<name>` such as `nvidia.com/gpu`: a lower-case DNS domain, \
                   then 1-63 letters, digits, `-`, `_` or `.`",
    };
    let (domain, short) = name.split_once('/').ok_or_else(invalid)?;
    let domain_ok = !domain.is_empty()
        && domain.len() <= 253
        && domain
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !domain.starts_with(['-', '.'])
        && !domain.ends_with(['-', '.']);
    let short_ok = !short.is_empty()
        && short.len() <= 63
        && short
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && short.starts_with(|c: char| c.is_ascii_alphanumeric())
        && short.ends_with(|c: char| c.is_ascii_alphanumeric());
    if domain_ok && short_ok {
        Ok(())
    } else {
        Err(invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_derive_endpoint_from_resource() {
        let config = PluginConfig::new("nvidia.com/mig-1g.10gb").unwrap();
        assert_eq!(config.endpoint(), "tessera-nvidia.com_mig-1g.10gb.sock");
        assert_eq!(
            config.kubelet_socket_path(),
            Path::new("/var/lib/kubelet/device-plugins/kubelet.sock")
        );
    }

    #[test]
    fn bad_resource_names_are_rejected_with_the_accepted_form() {
        for bad in [
            "gpu",
            "/gpu",
            "nvidia.com/",
            "Nvidia.com/gpu",
            "nvidia.com/g/pu",
            "a.b/-x",
        ] {
            let error = PluginConfig::new(bad).unwrap_err().to_string();
            assert!(error.contains("nvidia.com/gpu"), "{bad}: {error}");
        }
    }

    #[test]
    fn endpoint_must_be_a_plain_file_name() {
        let config = PluginConfig::new("example.com/foo").unwrap();
        assert!(config.clone().with_endpoint("a/b.sock").is_err());
        assert!(config.clone().with_endpoint("kubelet.sock").is_err());
        assert_eq!(config.with_endpoint("x.sock").unwrap().endpoint(), "x.sock");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(700),
        };
        let delays: Vec<_> = (1..=5).map(|n| backoff.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 700, 700]);
        assert_eq!(backoff.delay(100), Duration::from_millis(700));
    }
}
