//! Following one `ListAndWatch` stream the way the kubelet does.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::FakeKubeletError;
use crate::api;
use crate::api::device_plugin_client::DevicePluginClient;

/// What a follower has seen so far.
#[derive(Debug, Clone, Default)]
struct Seen {
    devices: Option<Vec<api::Device>>,
    updates: u64,
    ended: bool,
}

/// One open `ListAndWatch` stream and the latest list it delivered. Dropping it
/// closes the stream.
#[derive(Debug)]
pub struct DeviceFollower {
    rx: watch::Receiver<Seen>,
    task: JoinHandle<()>,
}

impl Drop for DeviceFollower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DeviceFollower {
    /// Opens a new stream on `client` and starts following it in the background.
    pub(crate) async fn open(
        mut client: DevicePluginClient<tonic::transport::Channel>,
    ) -> Result<Self, FakeKubeletError> {
        let mut stream = client.list_and_watch(api::Empty {}).await?.into_inner();
        let (tx, rx) = watch::channel(Seen::default());
        let task = tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                tx.send_modify(|seen| {
                    seen.devices = Some(message.devices);
                    seen.updates += 1;
                });
            }
            tx.send_modify(|seen| seen.ended = true);
        });
        Ok(Self { rx, task })
    }

    /// The latest list, `None` before the first message.
    pub fn latest(&self) -> Option<Vec<api::Device>> {
        self.rx.borrow().devices.clone()
    }

    /// How many lists the stream delivered so far.
    pub fn updates(&self) -> u64 {
        self.rx.borrow().updates
    }

    /// Whether the plugin closed the stream.
    pub fn ended(&self) -> bool {
        self.rx.borrow().ended
    }

    /// Waits until the latest list satisfies `accept` and returns it.
    pub async fn wait_until(
        &self,
        accept: impl Fn(&[api::Device]) -> bool,
        timeout: Duration,
    ) -> Result<Vec<api::Device>, FakeKubeletError> {
        let mut rx = self.rx.clone();
        let wait = rx.wait_for(|seen| seen.devices.as_deref().is_some_and(&accept));
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(seen)) => Ok(seen.devices.clone().unwrap_or_default()),
            _ => Err(FakeKubeletError::Timeout {
                what: format!(
                    "a matching device list (latest: {:?})",
                    self.latest().map(|d| summary(&d))
                ),
                after: timeout,
            }),
        }
    }

    /// Waits until the stream is closed by the plugin.
    pub async fn wait_ended(&self, timeout: Duration) -> Result<(), FakeKubeletError> {
        let mut rx = self.rx.clone();
        match tokio::time::timeout(timeout, rx.wait_for(|seen| seen.ended)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(FakeKubeletError::Timeout {
                what: "the ListAndWatch stream to end".to_owned(),
                after: timeout,
            }),
        }
    }
}

/// `id=health` pairs, for readable timeout messages.
fn summary(devices: &[api::Device]) -> Vec<String> {
    devices
        .iter()
        .map(|d| format!("{}={}", d.id, d.health))
        .collect()
}
